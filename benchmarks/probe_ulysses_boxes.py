"""GPU probe: Ulysses kernels of `bench_unseen_specs.py`'s sample over boxes of the default rule's family.

For each chosen spec (its index in the seed's whole sample, as `bench_unseen_specs.py` numbers it) and kernel,
the probe times the family's default config, then the boxes `layoutgen.ulysses.config.default_config` builds
with other runs (`run_bytes`: the bytes taken along each side's contiguous axes) and other sizes (`tile_bytes`),
the box the destination's run alone gives, the default box at other warp counts, and with `--space K` K
configs drawn from the tuner's search space.  Each is checked byte for
byte against `layoutgen.ulysses.reference` first and timed as CUDA-graph replay medians with rotated inputs,
against a copy of the same bytes (`bench_unseen_specs.ulysses_kernel`, `CopyCeiling`).

The modules are rendered by whichever `layoutgen` is first on the path (a template variant: run again with
`PYTHONPATH=<variant>:$PYTHONPATH` and another `--label`).  Results: `<out>/probe_ulysses_boxes_<label>.json`
and `.md`, rewritten after every kernel.

Usage (GPU): python benchmarks/probe_ulysses_boxes.py --out DIR [--seed 0] [--specs 13,15,17]
             [--kernels scatter,gather,scatter_out,gather_out] [--label committed] [--space 12]
             [--runs 64,128,256,512] [--tiles 8192,16384,32768] [--warps 2,8,16] [--h-kv 8]

`--h-kv` sets the point's H_kv (32, H itself: GQA tensors with q's head count, so no box is masked for them).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from bench_dcp_v2 import Bench, environment
from bench_unseen_specs import (
    DTYPE,
    ULYSSES_KERNELS,
    ULYSSES_POINT,
    CopyCeiling,
    render,
    sample_specs,
    ulysses_kernel,
    ulysses_orders,
)

from layoutgen.tuning.problem import Problem
from layoutgen.tuning.space import bind
from layoutgen.ulysses import config as ulysses_config
from layoutgen.ulysses.layout import (
    DTYPE_NAMES,
    KERNEL_DIRECTION,
    KERNEL_SIDES,
    Shape,
    contiguous_axes,
    key_extents,
    tile_axes,
)
from layoutgen.ulysses.spec import HeadCount

RUNS = (64, 128, 256, 512)
TILES = (8192, 16384, 32768)
WARPS = (2, 8, 16)


def candidates(
    spec: Any,
    kernel: str,
    shape: Shape,
    space: int = 0,
    seed: int = 0,
    runs: tuple[int, ...] = RUNS,
    tiles: tuple[int, ...] = TILES,
    warps: tuple[int, ...] = WARPS,
) -> list[tuple[str, Any]]:
    """(label, config) of one kernel, the default first, each box once (the first label that built it): the
    default rule's boxes with each of `runs` x `tiles`, the destination's run alone, the default at each of
    `warps`; then `space` configs drawn at random from the tuner's search space
    (`layoutgen.tuning.space.bind`)."""
    tensors = spec.direction(KERNEL_DIRECTION[kernel]).tensors
    extents = ulysses_config.box_extents(spec, kernel, shape)
    axes = tile_axes(spec, kernel)
    source, destination = (contiguous_axes(spec, kernel, side) for side in KERNEL_SIDES[kernel])

    def box(source_axes: list[str], run: int, tile: int) -> Any:
        config = ulysses_config.default_config(
            kernel, axes, extents, shape.dtype.itemsize, source_axes, destination, run_bytes=run, tile_bytes=tile
        )
        return ulysses_config.fit_grid(config, axes, extents, len(tensors))

    default = ulysses_config.runtime_default(spec, kernel, shape)
    listed: list[tuple[str, Any]] = [("default", default)]
    listed += [(f"run {run} tile {tile}", box(source, run, tile)) for run in runs for tile in tiles]
    listed.append(("destination run alone", box([], ulysses_config.RUN_BYTES, ulysses_config.DEFAULT_TILE_BYTES)))
    listed += [(f"default, {count} warps", dataclasses.replace(default, num_warps=count)) for count in warps]
    if space:
        problem = Problem(spec, kernel, tuple(key_extents(spec, kernel, shape).items()), DTYPE_NAMES[shape.dtype])
        feasible = bind(problem, shape.S_local).feasible()
        drawn = random.Random(f"{seed}:{spec.name}:{kernel}").sample(feasible, min(space, len(feasible)))
        listed += [(f"space #{feasible.index(config)}", config) for config in drawn]
    seen: set[str] = set()
    unique = []
    for label, config in listed:
        key = json.dumps(config.as_dict(), sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append((label, config))
    return unique


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(size) for size in text.split(",") if size)


def markdown(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [
        f"# Ulysses boxes of the default rule ({results['label']}) on {env.get('device', 'cpu')}",
        "",
        f"{env.get('date')}; torch {env.get('torch')}, triton {env.get('triton')}; seed {results['seed']}, "
        f"N {ULYSSES_POINT['N']}, S_local {ULYSSES_POINT['S_local']}, H {ULYSSES_POINT['H']}, "
        f"H_kv {results['h_kv']}, D {ULYSSES_POINT['D']}, bf16; CUDA-graph replay medians, rotated inputs.",
        "",
        "| spec | kernel | box | peer x batch x seq x head x dim, warps | µs | % of copy |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        c = row["config"]
        blocks = f"{c['block_peer']} x {c['block_batch']} x {c['block_seq']} x {c['block_head']} x {c['block_dim']}"
        timing = f"{row['us']:.2f} | {100 * row['of_copy']:.0f}%" if "us" in row else f"FAILED: {row['error']} |"
        lines.append(f"| {row['spec']} | {row['kernel']} | {row['label']} | {blocks}, {c['num_warps']} | {timing} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--specs", default="13,15,17", help="indices in the seed's sample (12 DCP specs first)")
    parser.add_argument("--kernels", default=",".join(ULYSSES_KERNELS))
    parser.add_argument("--label", default="committed")
    parser.add_argument("--space", type=int, default=0, help="also time this many configs of the tuner's space")
    parser.add_argument("--runs", type=_sizes, default=RUNS, help="bytes along each side's contiguous axes")
    parser.add_argument("--tiles", type=_sizes, default=TILES, help="bytes a box holds")
    parser.add_argument("--warps", type=_sizes, default=WARPS, help="warp counts for the default box")
    parser.add_argument("--h-kv", type=int, default=ULYSSES_POINT["H_kv"], help="the point's H_kv")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    wanted = {int(index) for index in args.specs.split(",")}
    kernels = args.kernels.split(",")
    bench = Bench(False, None)
    ceiling = CopyCeiling(bench)
    point = {**ULYSSES_POINT, "H_kv": args.h_kv}
    results: dict[str, Any] = {
        "environment": environment(),
        "label": args.label,
        "seed": args.seed,
        "h_kv": args.h_kv,
        "rows": [],
    }
    failed = False
    with tempfile.TemporaryDirectory(prefix="layoutgen-boxes-") as directory:
        for index, (_, spec) in enumerate(sample_specs(12, 8, args.seed)):
            if index not in wanted:
                continue
            module = render(spec, Path(directory))
            kv = point["H_kv"] if spec.uses(HeadCount.H_KV) else point["H"]
            shape = Shape(N=point["N"], S_local=point["S_local"], H=point["H"], H_kv=kv, D=point["D"], dtype=DTYPE)
            for kernel in kernels:
                source, destination = ulysses_orders(spec, kernel)
                for label, config in candidates(
                    spec, kernel, shape, args.space, args.seed, args.runs, args.tiles, args.warps
                ):
                    row: dict[str, Any] = {
                        "spec": index,
                        "kernel": kernel,
                        "source": source,
                        "destination": destination,
                        "label": label,
                        "config": config.as_dict(),
                    }
                    try:
                        row.update(ulysses_kernel(bench, ceiling, module, kernel, point, config))
                        print(
                            f"[{index}] {kernel} {label}: {row['us']:.2f} µs, {100 * row['of_copy']:.0f}%", flush=True
                        )
                    except Exception as error:  # a box that fails its check is reported, never timed
                        row["error"] = f"{type(error).__name__}: {error}"
                        failed = True
                        print(f"[{index}] {kernel} {label}: FAILED {row['error']}", flush=True)
                    results["rows"].append(row)
                    torch.cuda.empty_cache()
                args.out.mkdir(parents=True, exist_ok=True)
                stem = args.out / f"probe_ulysses_boxes_{args.label}"
                stem.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
                stem.with_suffix(".md").write_text(markdown(results))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
