"""Does a small kernel's graph-replay time depend on what the GPU did just before?  With clocks.

Two observations motivate it (notes_H200.md): one combine config measured 1.31 µs in a space probe and
1.49 µs in the tuner and the benchmark (pynccl_a2a, N 4, B 8), and the first compiled family of every
tune run timed 10-12% faster in its search (the GPU idle between trials, waiting on compiles) than in
its final re-timing (one continuous burst).  This probe times the same launches, in the same process,
after different preparations, and reads the SM clock, memory clock, power and temperature over each
measurement (`clocks.py`):

* `idle`: after two seconds with nothing on the GPU;
* `copies`: right after a second of large device-to-device copies (DRAM streaming at full power);
* `small`: right after a second of back-to-back small kernels (the tuner's and benchmark's own load);
* `again`: immediately after the previous measurement (a steady state).

Each launch is our tuned config (from the tuning database), the default, and sglang's kernel at the same
point.  Rounds repeat the four preparations in turn.  First of all, `freshness` times one config several
times in a row in the fresh process, then on fresh buffers and after an idle pause.

Usage (GPU): python benchmarks/probe_timing_state.py --out /tmp/probe_timing_state.json
(the run the notes cite: benchmarks/results/archive/probe_timing_state_H200.json)
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import layoutgen
from layoutgen.dcp import reference
from layoutgen.dcp.config import CombineConfig, PackConfig, default_combine_config, default_pack_config
from layoutgen.tuning.timing import CudaGraphTimer, device_l2_bytes, rotating_sets

#: (spec, kernel, N, B) at H 128, D 512: the two points of the observations and a DRAM-bound one.
POINTS = (("pynccl_a2a", "combine", 4, 8), ("pynccl_a2a", "pack", 2, 1), ("vllm_a2a", "combine", 8, 64))
PREPARATIONS = ("idle", "copies", "small", "again")
PREPARE_S = 1.0
IDLE_S = 2.0
LONG_IDLE_S = 10.0
#: Samples per measurement: ~100 replays of ~200 µs, long enough for several 20 ms clock samples.
REPEATS = 100


def launches_for(
    module: Any, sglang: Any, entries: dict[str, Any], kernel: str, N: int, B: int
) -> tuple[int, dict[str, Any]]:
    """Rotating sets, and label -> launch(set index) for our tuned and default configs and sglang's kernel,
    each checked first."""
    from bench_dcp import pick_tuned, same_bytes

    from layoutgen.dcp.tolerances import combine_error

    H, D, Hl = 128, 512, 128 // N
    sets = rotating_sets(B * H * D * 2 * 2, device_l2_bytes(0))
    outs = [torch.randn(B, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(sets)]
    lses = [torch.randn(B, H, device="cuda") * 4 for _ in range(sets)]
    sends = [module.alloc(N, B, H, D, torch.bfloat16, "cuda") for _ in range(sets)]
    expected = module.alloc(N, B, H, D, torch.bfloat16, "cuda")
    reference.pack(outs[0], lses[0], expected)
    tuned = pick_tuned(entries, module.SPEC.name, kernel, N, H, D, B)
    launches: dict[str, Any] = {}
    if kernel == "pack":
        default = default_pack_config(module.SPEC, N, Hl, D, B, 2)
        for label, config in (("tuned", PackConfig.from_dict(tuned) if tuned else default), ("default", default)):
            launches[label] = lambda i, c=config: module.pack(outs[i], lses[i], sends[i], config=c)
        launches["sglang"] = lambda i: sglang.dcp_pack_a2a_send(
            outs[i], lses[i], sends[i].payload_view(B), sends[i].lse_view(B)
        )
        for label, launch in launches.items():
            for tensor in sends[0].tensors.values():
                tensor.view(torch.uint8).fill_(0xA5)
            launch(0)
            if not same_bytes(sends[0], expected, B):
                raise AssertionError(f"{label} pack differs from the reference")
    else:
        for bufs, out, lse in zip(sends, outs, lses, strict=True):
            reference.pack(out, lse, bufs)
        want, _ = reference.combine(expected, B)
        merged = torch.empty(B, Hl, D, dtype=torch.bfloat16, device="cuda")
        default = default_combine_config(module.SPEC, N, Hl, D, B, 2)
        for label, config in (("tuned", CombineConfig.from_dict(tuned) if tuned else default), ("default", default)):
            launches[label] = lambda i, c=config: module.combine(sends[i], B, out=merged, config=c)
            launches[label](0)
            if combine_error(merged.cpu(), want.cpu(), float(outs[0].abs().max())) > 1.0:
                raise AssertionError(f"{label} combine outside tolerance")
        launches["sglang"] = lambda i: sglang.dcp_lse_combine_triton(sends[i].payload_view(B), sends[i].lse_view(B))
    return sets, launches


def freshness(timer: CudaGraphTimer, sglang: Any, entries: dict[str, Any]) -> list[dict[str, Any]]:
    """Run first in the process: which step, if any, brings back a fast first timing?  Times the tuned
    pynccl_a2a combine (N 4, B 8) five times in a row, after other kernels, on freshly allocated and
    written buffers (the first set kept alive, so the addresses are new), and after two and ten idle seconds."""
    module = layoutgen.load("pynccl_a2a")
    steps: list[dict[str, Any]] = []

    def measure(step: str, point: tuple[int, dict[str, Any]], times: int, label: str = "tuned") -> None:
        sets, launches = point
        for _ in range(times):
            timing = timer.time(launches[label], sets, estimated_us=1.0)
            steps.append({"step": step, "label": label, "median_us": timing.median_us})
            print(json.dumps(steps[-1]), flush=True)

    first = launches_for(module, sglang, entries, "combine", 4, 8)
    measure("first timings of the process", first, 5)
    measure("the default", first, 1, "default")
    measure("sglang", first, 1, "sglang")
    measure("after other kernels", first, 2)
    fresh = launches_for(module, sglang, entries, "combine", 4, 8)
    measure("fresh buffers", fresh, 3)
    measure("the first buffers again", first, 2)
    torch.cuda.synchronize()
    time.sleep(IDLE_S)
    measure("after two idle seconds", first, 2)
    torch.cuda.synchronize()
    time.sleep(LONG_IDLE_S)
    measure("after ten idle seconds", first, 3)
    return steps


def keep_busy(graph: torch.cuda.CUDAGraph, seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            graph.replay()
        torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--db", type=Path, default=Path(__file__).resolve().parent.parent / "tuning_db")
    args = parser.parse_args()
    from baselines import load_sglang_dcp_kernels
    from bench_dcp import tuned_configs
    from clocks import ClockSampler

    sglang = load_sglang_dcp_kernels()
    entries, db_path = tuned_configs(args.db)
    timer = CudaGraphTimer(repeats=REPEATS, min_repeats=REPEATS)
    torch.manual_seed(0)
    fresh_steps = freshness(timer, sglang, entries)
    points = []
    for spec, kernel, N, B in POINTS:
        sets, launches = launches_for(layoutgen.load(spec), sglang, entries, kernel, N, B)
        points.append(((spec, kernel, N, B), sets, launches))
    source = torch.ones(1 << 28, dtype=torch.int32, device="cuda")
    destination = torch.empty_like(source)
    copies = torch.cuda.CUDAGraph()
    with torch.cuda.graph(copies):
        destination.copy_(source)
    small = torch.cuda.CUDAGraph()
    _, first_sets, first_launches = points[0]
    with torch.cuda.graph(small):
        for call in range(64):
            first_launches["sglang"](call % first_sets)
    records: list[dict[str, Any]] = []
    with ClockSampler() as clocks:
        time.sleep(0.5)
        for round_index in range(args.rounds):
            for preparation in PREPARATIONS:
                if preparation == "idle":
                    torch.cuda.synchronize()
                    time.sleep(IDLE_S)
                elif preparation == "copies":
                    keep_busy(copies, PREPARE_S)
                elif preparation == "small":
                    keep_busy(small, PREPARE_S)
                for (spec, kernel, N, B), sets, launches in points:
                    for label, launch in launches.items():
                        start = time.time()
                        timing = timer.time(launch, sets, estimated_us=1.0)
                        end = time.time()
                        record = dict(spec=spec, kernel=kernel, N=N, B=B, label=label, round=round_index)
                        record.update(preparation=preparation, median_us=timing.median_us, p20_us=timing.p20_us)
                        record.update(p80_us=timing.p80_us, seconds=end - start, **clocks.window(start, end))
                        records.append(record)
                        print(json.dumps(record), flush=True)
        clock_problem = clocks.problem
    summary = []
    for (spec, kernel, N, B), _, launches in points:
        for label in launches:
            for preparation in PREPARATIONS:
                chosen = [
                    r
                    for r in records
                    if (r["spec"], r["kernel"], r["N"], r["B"], r["label"], r["preparation"])
                    == (spec, kernel, N, B, label, preparation)
                ]
                row = dict(spec=spec, kernel=kernel, N=N, B=B, label=label, preparation=preparation)
                row["median_us"] = statistics.median(r["median_us"] for r in chosen)
                row["us_by_round"] = [round(r["median_us"], 3) for r in chosen]
                row["sm_mhz_by_round"] = [r.get("sm_mhz") for r in chosen]
                summary.append(row)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "tuning_db": db_path,
        "clock_problem": clock_problem,
        "freshness": fresh_steps,
        "summary": summary,
        "records": records,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for row in summary:
        print(
            f"{row['spec']:12s} {row['kernel']:8s} N={row['N']} B={row['B']:3d} {row['label']:8s} "
            f"{row['preparation']:7s} {row['median_us']:6.3f} µs  rounds {row['us_by_round']}  SM MHz {row['sm_mhz_by_round']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
