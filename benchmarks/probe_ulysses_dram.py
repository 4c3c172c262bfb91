"""GPU probe: one DRAM-bound Ulysses point, where torch.compile ran faster than the copy of the same bytes.

`bench_ulysses.py` found the compiled torch path 0.3-3.6% faster than our kernels at N 4, S_local 4096
(64-96 MiB moved), and at ulysses_qkv_gqa scatter faster than its copy floor too (26.1 against 27.0 µs),
which a copy floor should not allow.  At one point this times, side by side under `bench_ulysses.py`'s
rules (inputs rotating by `rotating_sets`, one output, CUDA-graph replay medians):

* the copy floor in each of the copy kernel's (elements per program, warps) shapes (`bench_ulysses.copy_times`);
* the compiled torch path, and inductor's generated code for it (written beside the JSON);
* ours with the database's config and over `--sample K` configs of the tuner's space (seeded), for every
  `--module LABEL=PATH` given (e.g. one rendered from a changed template) on the same configs, the
  database's among them.

Every variant is checked byte for byte against the reference first (`bench_ulysses.Case.check`).  The
builds run interleaved per config, so drift cancels; a build that changes the cache policy (`evict_last`)
leaves lines in the L2 that speed up the next build's timing: time such builds in separate runs
(notes_H200.md, fifth pass: 25.69 µs here that the whole space timed alone did not reproduce).

Usage (GPU):
    python benchmarks/probe_ulysses_dram.py --spec ulysses_qkv_gqa --kernel scatter --point 4:4096:32:8:128 \\
        --sample 40 --out /tmp/probe_ulysses_dram.json
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
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ulysses import KERNELS, Case, bytes_moved, copy_times, shape_for

import layoutgen
from layoutgen.tuning.timing import CudaGraphTimer, device_l2_bytes, rotating_sets


def space_configs(module: Any, kernel: str, shape: Any, sample: int) -> dict[str, Any]:
    from layoutgen.tuning.problem import Problem
    from layoutgen.tuning.space import bind

    extents = (("N", shape.N), ("Hl", shape.H // shape.N), ("Hl_kv", shape.H_kv // shape.N), ("D", shape.D))
    problem = Problem(module.SPEC, kernel, extents, "bfloat16")
    feasible = bind(problem, shape.S_local).feasible()
    if sample and len(feasible) > sample:
        feasible = random.Random(f"{module.SPEC_NAME} {kernel} {extents} {shape.S_local}").sample(feasible, sample)
    return {"x".join(str(value) for value in config.as_dict().values()): config for config in feasible}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", required=True, help="a bundled ulysses spec (its generated module is `cur`)")
    parser.add_argument("--module", action="append", default=[], help="LABEL=PATH of another build of its module")
    parser.add_argument("--kernel", required=True, choices=KERNELS)
    parser.add_argument("--point", required=True, metavar="N:S_LOCAL:H:H_KV:D")
    parser.add_argument("--sample", type=int, default=40, metavar="K", help="configs of the space to time")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write (inductor's code beside it)")
    args = parser.parse_args()
    from torch._inductor.utils import run_and_get_code

    N, S_local, H, H_kv, D = (int(value) for value in args.point.split(":"))
    module = layoutgen.load(args.spec)
    shape = shape_for(module.SPEC, (N, S_local, 1, H, H_kv, D))
    nbytes = bytes_moved(module.SPEC, shape, args.kernel)
    sets = rotating_sets(nbytes, device_l2_bytes(torch.device("cuda")))
    case = Case(module, shape, args.kernel, sets)
    timer = CudaGraphTimer()
    estimate = nbytes / 3.0e6

    compiled = case.naive(True)
    _, code = run_and_get_code(compiled, 0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".inductor.py").write_text("\n\n".join(code), encoding="utf-8")
    case.check("compiled", compiled)
    row: dict[str, Any] = {"compiled": timer.time(compiled, sets, estimate).median_us}
    row["copy"] = copy_times(timer, nbytes, sets)

    ours = case.ours()
    case.check("ours", ours)
    row["ours_database"] = timer.time(ours, sets, estimate).median_us
    modules = {"cur": module}
    for item in args.module:
        label, _, path = item.partition("=")
        modules[label] = layoutgen.load(path)
    # The database's config first (every build times it too), then the sample.
    database = module._dispatch._config(args.kernel, case.sets[0]["bufs"], None)
    configs = {"database": database} | space_configs(module, args.kernel, shape, args.sample)
    results: dict[str, dict[str, float]] = {label: {} for label in modules}
    for name, config in configs.items():
        for label, build in modules.items():  # the builds interleaved per config, so drift cancels
            run = case.ours(build, config)
            case.check(f"{label} {name}", run)
            results[label][name] = timer.time(run, sets, estimate).median_us
    for label, times in results.items():
        row[f"{label}_space"] = dict(sorted(times.items(), key=lambda item: item[1]))
    best_copy = min(row["copy"], key=lambda name: row["copy"][name])
    line = "  ".join(
        f"{label} best {min(row[f'{label}_space'].values()):.2f} ({next(iter(row[f'{label}_space']))})"
        for label in modules
    )
    print(
        f"{args.spec} {args.kernel} {args.point} ({nbytes / 2**20:.1f} MiB, {sets} sets): compiled "
        f"{row['compiled']:.2f}  copy best {row['copy'][best_copy]:.2f} ({best_copy}), 4096x8 "
        f"{row['copy']['4096x8']:.2f}  database {row['ours_database']:.2f}  {line}",
        flush=True,
    )
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "spec": args.spec,
        "kernel": args.kernel,
        "point": args.point,
        "bytes": nbytes,
        "sets": sets,
        "modules": {"cur": "generated"} | dict(item.split("=", 1) for item in args.module),
        "row": row,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
