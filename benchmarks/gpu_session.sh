#!/usr/bin/env bash
# The device runs of this release, as they were made (two calls of at most 10 minutes on one lent H200).
#   bash benchmarks/gpu_session.sh tune OUT     GPU tests, then the re-tune of the DCP and Ulysses grids below
#   bash benchmarks/gpu_session.sh bench OUT    the benchmarks, with the database the first call wrote
#   bash benchmarks/gpu_session.sh fp8 OUT      what the fp8 wire still needs: its GPU tests, its pack's tune, its benchmark
# OUT: a folder for logs and results. The lent machine has torch and Triton but not pydantic or optuna:
# `.whl/` carries them as wheels (see /work/.library/device/README.md), installed first.
set -uo pipefail
step=$1
out=$2
mkdir -p "$out"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
    [ -f .whl/sglang_dcp_kernels.py ] && export LAYOUTGEN_SGLANG_DCP_KERNELS=$PWD/.whl/sglang_dcp_kernels.py
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee "$out/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/device.txt"
dcp_specs=$(python3 -c "from layoutgen.spec import bundled_specs; print(' '.join(n for n, s in bundled_specs().items() if s.family == 'dcp'))")
ulysses_specs=$(python3 -c "from layoutgen.spec import bundled_specs; print(' '.join(n for n, s in bundled_specs().items() if s.family == 'ulysses'))")
case "$step" in
tune)
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu tests/ulysses/test_ulysses_gpu.py 2>&1 | tee "$out/gpu_tests.log" | tail -5
    # DCP: every bundled spec (the kernels changed: every entry is stale) at MLA decode H 128, D 512.
    timeout 300 python3 -m layoutgen.cli tune --spec $dcp_specs --shape N=2,4,8 --shape H=128 --shape D=512 \
        --bucket 1 8 64 256 1024 4096 --db tuning_db --report "$out/tune_dcp.md" 2>&1 | tail -3
    # Ulysses: N 2 and 8, H 64 (H_kv 16), D 128, three sequence lengths per rank.
    timeout 150 python3 -m layoutgen.cli tune --spec $ulysses_specs --shape N=2,8 --shape H=64 --shape D=128 \
        --bucket 16 1024 16384 --db tuning_db --report "$out/tune_ulysses.md" 2>&1 | tail -3
    cp tuning_db/NVIDIA_H200.json "$out/"
    ;;
bench)
    timeout 200 python3 benchmarks/bench_dcp_v2.py --quick --out "$out" 2>&1 | tail -4
    timeout 200 python3 benchmarks/bench_dcp.py --quick --warm --out "$out" 2>&1 | tail -4
    timeout 150 python3 benchmarks/bench_ulysses.py --quick --out "$out" 2>&1 | tail -4
    ;;
fp8)
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_dcp_fp8_gpu.py 2>&1 | tee "$out/gpu_tests_fp8.log" | tail -5
    fp8_specs=$(python3 -c "from layoutgen.spec import bundled_specs; print(' '.join(n for n, s in bundled_specs().items() if s.family == 'dcp' and s.fp8))")
    timeout 240 python3 -m layoutgen.cli tune --spec $fp8_specs --kernel pack --shape N=2,4,8 --shape H=128 --shape D=512 \
        --bucket 1 64 1024 4096 --db tuning_db --report "$out/tune_dcp_fp8.md" 2>&1 | tail -3
    cp tuning_db/NVIDIA_H200.json "$out/"
    timeout 200 python3 benchmarks/bench_dcp_v2.py --quick --out "$out" 2>&1 | tail -4
    ;;
esac
