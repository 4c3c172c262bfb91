"""GPU probe: combine on receive buffers an exchange has just written, the condition a combine meets in an engine.

`bench_dcp.py` times combine from rotated inputs (read from DRAM) and from one L2-resident set (left in the L2
by the call before); an engine's combine reads static receive buffers that the all-to-all has just written,
once.  Here every iteration of the CUDA graph copies one of the rotating "arrived" sets into the static
receive buffers (as the exchange writes them: where they fit, the writes leave them in the L2), then runs the
combine; the copy alone is timed the same way, and the combine's time is the difference.  Modules are given
as in `probe_combine.py` (e.g. the committed one and a copy whose partial loads carry a cache hint), timed over
that probe's tiles and the default, each checked against `layoutgen.dcp.reference` first; sglang's combine
reads the same receive buffers.

Usage (GPU):
    python benchmarks/probe_fresh_combine.py --module committed=generated/vllm_a2a.py \
        --module evict_first=/tmp/chints/evict_first.py --point 8:64:128:512 --out /tmp/fresh.json
"""

from __future__ import annotations

import argparse
import datetime
import json
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


def measure_point(modules: dict[str, Any], sglang: Any, timer: CudaGraphTimer, N: int, B: int, H: int, D: int) -> dict:
    from probe_combine import CONFIGS

    first = next(iter(modules.values()))
    Hl = H // N
    combine_bytes = B * H * D * 2 + B * H * 4 + B * Hl * D * 2
    sets = rotating_sets(combine_bytes, device_l2_bytes(0))
    outs = [torch.randn(B, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(sets)]
    lses = [torch.randn(B, H, device="cuda") * 4 for _ in range(sets)]
    merged = torch.empty(B, Hl, D, dtype=torch.bfloat16, device="cuda")
    estimate = max(1.0, 2 * combine_bytes / 3.5e6)
    row: dict[str, Any] = {"spec": first.SPEC_NAME, "N": N, "B": B, "H": H, "D": D, "sets": sets}
    configs = {f"{h}x{d}x{w}": CombineConfig(1, h, d, w) for h, d, w in CONFIGS if h <= Hl and d <= D}
    configs["default"] = default_combine_config(first.SPEC, N, Hl, D, B, 2)
    for label, module in modules.items():
        arrived = []
        for out, lse in zip(outs, lses, strict=True):
            bufs = module.alloc(N, B, H, D, torch.bfloat16, "cuda")
            reference.pack(out, lse, bufs)
            arrived.append(bufs)
        recv = module.alloc(N, B, H, D, torch.bfloat16, "cuda")
        want, _ = reference.combine(arrived[0], B)
        scale = float(outs[0].abs().max())

        def land(i: int, recv: Any = recv, arrived: list[Any] = arrived) -> None:
            for name, tensor in recv.tensors.items():
                tensor.copy_(arrived[i].tensors[name])

        copy_us = timer.time(land, sets, estimated_us=estimate).median_us
        results = {}
        for name, config in configs.items():

            def run(
                i: int, module: Any = module, config: CombineConfig = config, land: Any = land, recv: Any = recv
            ) -> None:
                land(i)
                module.combine(recv, B, out=merged, config=config)

            run(0)
            if combine_error(merged.cpu(), want.cpu(), scale) > 1.0:
                raise AssertionError(f"{label} {name} outside tolerance at N={N} B={B} H={H} D={D}")
            results[name] = timer.time(run, sets, estimated_us=estimate).median_us - copy_us
        row[label] = results
        row[f"{label}_copy_us"] = copy_us
        row[f"{label}_best"] = min(results.values())
        row[f"{label}_best_config"] = min(results, key=lambda k: results[k])
        if label == next(iter(modules)) and not first.SPEC.fp8 and first.SPEC.stats.stats_form.value == "lse":

            def run_sglang(i: int, land: Any = land, recv: Any = recv) -> None:
                land(i)
                sglang.dcp_lse_combine_triton(recv.payload_view(B), recv.lse_view(B))

            row["sglang"] = timer.time(run_sglang, sets, estimated_us=estimate).median_us - copy_us
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--module", action="append", required=True, help="LABEL=PATH of a generated module")
    parser.add_argument("--point", action="append", required=True, metavar="N:B:H:D", help="a point (repeatable)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write (after every point)")
    args = parser.parse_args()
    from baselines import load_sglang_dcp_kernels

    modules = {label: layoutgen.load(path) for label, _, path in (item.partition("=") for item in args.module)}
    sglang = load_sglang_dcp_kernels()
    timer = CudaGraphTimer()
    points = [tuple(int(v) for v in point.split(":")) for point in args.point]
    measure_point(modules, sglang, timer, *points[0])  # the first timings of a process run fast: thrown away
    rows = []
    for N, B, H, D in points:
        row = measure_point(modules, sglang, timer, N, B, H, D)
        rows.append(row)
        line = "  ".join(f"{label} {row[f'{label}_best']:.2f} ({row[f'{label}_best_config']})" for label in modules)
        print(f"N={N} B={B} H={H} D={D} (copy {row[f'{next(iter(modules))}_copy_us']:.2f}): {line}  "
              f"sglang {row.get('sglang', float('nan')):.2f}", flush=True)  # fmt: skip
        result = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "modules": {label: path for label, _, path in (item.partition("=") for item in args.module)},
            "rows": rows,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
