"""GPU probe: two builds of a generated module's combine kernel, side by side, at small and mid batch.

Compares the combine kernels of generated modules given by path (e.g. the committed module and one
rendered from a changed template) over the same small config grid per point, with sglang's combine as
the reference line.  Every config is checked against `layoutgen.reference` before it is timed; times are
CUDA-graph replay medians with rotated inputs (`layoutgen.tuning.timing.CudaGraphTimer`).

`--resident` times one input set instead (L2-resident, as `bench_dcp.py --warm` does at B <= 64).
`--space` times every feasible config of the tuner's search space instead (compiled ahead on the tuner's
process pool), under the benchmark's input rotation: what the tuner would choose under `bench_dcp.py`'s
cache conditions, next to sglang; `--sample K` times K of them (the same K for every module) and the small
grid.  `--point N:B:H:D` (repeatable) picks the points.

Usage (GPU):
    python benchmarks/probe_combine.py --module old=/path/old_vllm_a2a.py --module new=generated/vllm_a2a.py \
        --out /tmp/probe_combine_vllm_a2a.json
    python benchmarks/probe_combine.py --module cur=generated/pynccl_a2a.py --space --point 4:8:128:512 \
        --out /tmp/space.json

Earlier runs: benchmarks/results/archive/probe_combine_*_H200.json, probe_space_*_H200.json and
probe_two_pass_n2_H200.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import layoutgen
from layoutgen.dcp import reference
from layoutgen.dcp.config import CombineConfig, default_combine_config
from layoutgen.dcp.tolerances import combine_error
from layoutgen.tuning.timing import CudaGraphTimer, device_l2_bytes, rotating_sets

#: (block_head, block_dim, num_warps): one-warp small tiles up to whole-row tiles (1 x 512 x 4: sglang's;
#: 1 x 512 x 1: the database's at vllm_a2a N 8, B 64), and four warps on small tiles (the H200 database's
#: picks at B 1: 17 of 21 bf16 combines there hold 4 warps; 2 x 128 x 1 the one-warp default under a wave).
CONFIGS = (
    (1, 128, 1),
    (2, 128, 1),
    (2, 256, 2),
    (1, 512, 1),
    (1, 512, 2),
    (1, 512, 4),
    (2, 512, 4),
    (1, 128, 4),
    (2, 128, 4),
    (4, 128, 4),
    (2, 256, 4),
    (8, 128, 4),
)
POINTS = [(N, B, 128, 512) for N in (2, 8) for B in (1, 8, 64, 256)] + [(4, 8, 128, 512), (8, 8, 32, 128)]


def config_name(config: Any) -> str:
    """A config's label in this probe's rows: its fields' values joined by "x" (block_batch first)."""
    return "x".join(str(value) for value in config.as_dict().values())


def space_configs(
    module: Any,
    N: int,
    B: int,
    H: int,
    D: int,
    pool: Any,
    kernel: str = "combine",
    sample: int = 0,
    configs: list[Any] | None = None,
) -> dict[str, Any]:
    """Every feasible config of the tuner's `kernel` space at this point, compiled ahead on `pool` (pack: the
    masked variant too, as the workload's compile job holds both forms); `sample` of them at random, seeded
    by the point, when there are more.  Given `configs`, those instead of the space's."""
    from layoutgen.dcp import FAMILY
    from layoutgen.tuning.objective import Target
    from layoutgen.tuning.problem import Problem
    from layoutgen.tuning.space import bind

    problem = Problem(module.SPEC, kernel, (("N", N), ("Hl", H // N), ("D", D)), "bfloat16")
    feasible = bind(problem, B).feasible() if configs is None else configs
    if sample and len(feasible) > sample:
        feasible = random.Random(f"{module.SPEC_NAME} {N} {B} {H} {D}").sample(feasible, sample)
    workload = FAMILY.workload(Target(problem, module), B, torch.device("cuda"), device_l2_bytes(0))
    workload.capacity = B  # the variants launched here: buffers of B rows (the tuner rounds up to 16)
    for future in [pool.submit(workload.compile_job(config)) for config in feasible]:
        if future is not None:
            future.result()
    return {config_name(config): config for config in feasible}


def measure_point(
    modules: dict[str, Any],
    sglang: Any,
    timer: CudaGraphTimer,
    N: int,
    B: int,
    H: int,
    D: int,
    pool: Any = None,
    resident: bool = False,
    sample: int = 0,
) -> dict[str, Any]:
    first = next(iter(modules.values()))
    Hl = H // N
    combine_bytes = B * H * D * 2 + B * H * 4 + B * Hl * D * 2
    sets = 1 if resident else rotating_sets(combine_bytes, device_l2_bytes(0))
    outs = [torch.randn(B, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(sets)]
    lses = [torch.randn(B, H, device="cuda") * 4 for _ in range(sets)]
    row: dict[str, Any] = {"spec": first.SPEC_NAME, "N": N, "B": B, "H": H, "D": D}
    sends: dict[str, list[Any]] = {label: [] for label in modules}
    for label, module in modules.items():
        for out, lse in zip(outs, lses, strict=True):
            bufs = module.alloc(N, B, H, D, torch.bfloat16, "cuda")
            reference.pack(out, lse, bufs)
            sends[label].append(bufs)
    want, _ = reference.combine(sends[next(iter(modules))][0], B)
    scale = float(outs[0].abs().max())
    merged = torch.empty(B, Hl, D, dtype=torch.bfloat16, device="cuda")
    estimate = max(1.0, combine_bytes / 3.5e6)
    default = default_combine_config(first.SPEC, N, Hl, D, B, 2)
    for label, module in modules.items():
        configs = {}
        if pool is not None:
            configs = space_configs(module, N, B, H, D, pool, sample=sample)
        if pool is None or sample:
            configs.update({f"{h}x{d}x{w}": CombineConfig(1, h, d, w) for h, d, w in CONFIGS if h <= Hl and d <= D})
        configs["default"] = default
        results = {}
        for name, config in configs.items():

            def run(i: int, module: Any = module, config: CombineConfig = config, label: str = label) -> None:
                module.combine(sends[label][i], B, out=merged, config=config)

            run(0)
            ratio = combine_error(merged.cpu(), want.cpu(), scale)
            if ratio > 1.0:
                raise AssertionError(f"{label} {name} outside tolerance at {row}")
            results[name] = timer.time(run, sets, estimated_us=estimate).median_us
        row[label] = results
        row[f"{label}_best"] = min(results.values())
        row[f"{label}_best_config"] = min(results, key=lambda k: results[k])

    def run_sglang(i: int) -> None:
        bufs = sends[next(iter(modules))][i]
        sglang.dcp_lse_combine_triton(bufs.payload_view(B), bufs.lse_view(B))

    # sglang's combine reads bf16 partials and an LSE: no reference line for fp8 or (max, sum) wires.
    sglang_reads_it = not first.SPEC.fp8 and first.SPEC.stats.stats_form.value == "lse"
    row["sglang"] = timer.time(run_sglang, sets, estimated_us=estimate).median_us if sglang_reads_it else float("nan")
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--module", action="append", required=True, help="LABEL=PATH of a generated module")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--space", action="store_true", help="every feasible config of the tuner's space")
    parser.add_argument(
        "--resident", action="store_true", help="one input set (L2-resident), as bench_dcp.py --warm times B <= 64"
    )
    parser.add_argument("--point", action="append", default=[], metavar="N:B:H:D", help="a point (repeatable)")
    parser.add_argument(
        "--sample", type=int, default=0, metavar="K", help="with --space: K configs of it, the same K for every module"
    )
    args = parser.parse_args()
    from baselines import load_sglang_dcp_kernels

    modules = {}
    for item in args.module:
        label, _, path = item.partition("=")
        modules[label] = layoutgen.load(path)
    sglang = load_sglang_dcp_kernels()
    timer = CudaGraphTimer()
    points = [tuple(int(v) for v in point.split(":")) for point in args.point] or POINTS
    pool = None
    if args.space:
        from layoutgen.tuning.compile import CompilePool, default_compile_workers

        pool = CompilePool(default_compile_workers(1))
    # The first timings of a process run fast (notes_H200.md: 1.31 against 1.48 µs for the same config, for
    # about 35 ms), which once made one pass look 14% faster than two at N 2, B 1: time the first point once
    # and throw it away.
    measure_point(modules, sglang, timer, *points[0], pool, args.resident, args.sample)
    rows: list[dict[str, Any]] = []
    for N, B, H, D in points:
        row = measure_point(modules, sglang, timer, N, B, H, D, pool, args.resident, args.sample)
        rows.append(row)
        line = "  ".join(
            f"{label} best {row[f'{label}_best']:.2f} ({row[f'{label}_best_config']}) default {row[label]['default']:.2f}"
            for label in modules
        )
        print(f"N={N} B={B} H={H} D={D}: {line}  sglang {row['sglang']:.2f}", flush=True)
        result = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "modules": {label: str(path) for label, path in (item.split("=", 1) for item in args.module)},
            "space": args.space,
            "resident": args.resident,
            "sample": args.sample,
            "rows": rows,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")  # after every point
    if pool is not None:
        pool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
