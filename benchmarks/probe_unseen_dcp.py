"""GPU probe: what the DCP kernels of `bench_unseen_specs.py`'s random specs reach over the tuner's space.

`bench_unseen_specs.py` times every drawn spec with its default config only.  Where a kernel runs far from
the copy ceiling, this times its default beside a seeded sample of the tuner's search space (`--sample`
configs, compiled ahead on the tuner's process pool) at the same point and under the same rotation, each
config checked against `layoutgen.dcp.reference` first (`bench_unseen_specs.dcp_kernel`): how far the
default is from what the kernel can do, and which boxes get there.

Results: `<out>/probe_unseen_dcp_<label>_<device>.json` (every config's time) and `.md` (per kernel: the
default, the best and the five after it), both rewritten after every kernel.

Usage (GPU): python benchmarks/probe_unseen_dcp.py --out DIR [--label L] [--seed 0] [--specs 1,7,9]
             [--bundled pynccl_a2a,vllm_a2a] [--spec-file SPEC.yaml ...] [--batches 1,8,64,1024]
             [--kernel combine] [--kernel pack] [--sample 60] [--heads 32]
             [--grid 32,64,128:1:8,16,32:1,2,4[:1,2,8]]

`--heads` replaces the point's H (heads of `out`; H / N per peer), e.g. to see short runs of heads.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from bench_dcp_v2 import Bench, environment
from bench_unseen_specs import DCP_POINT, CopyCeiling, dcp_kernel, dcp_layout, render, sample_specs
from probe_combine import space_configs


def grid_configs(kernel: str, grid: str, N: int, Hl: int, D: int, heads_limit: int | None = None) -> list[Any]:
    """The boxes of `--grid BATCH:HEAD:DIM:WARPS[:PEER]` (comma-separated lists; PEER, pack only, defaults to 1)
    that fit the point and the tile limit; `heads_limit` replaces Hl as the head block's bound (a pack of
    (head, peer) pairs: Hl x N)."""
    from layoutgen.dcp.config import CONFIG_TYPES

    Hl = Hl if heads_limit is None else heads_limit

    parts = [[int(v) for v in part.split(",")] for part in grid.split(":")]
    batches, heads, dims, warps = parts[:4]
    peers = parts[4] if len(parts) > 4 else [1]
    configs = []
    for b, h, d, w, p in itertools.product(batches, heads, dims, warps, peers):
        if h > Hl or d > D or p > N:
            continue
        extra = {"block_peer": p} if kernel == "pack" else {}
        try:
            configs.append(CONFIG_TYPES[kernel](block_batch=b, block_head=h, block_dim=d, num_warps=w, **extra))
        except ValueError:  # a box over the tile limit: the grid is a product, not every point of it is a config
            continue
    return list(dict.fromkeys(configs))


def probe_kernel(
    bench: Bench,
    ceiling: CopyCeiling,
    module: Any,
    kernel: str,
    sample: int,
    pool: Any,
    grid: str | None,
    B: int,
    heads: int = DCP_POINT["H"],
) -> list[dict[str, Any]]:
    """The default, `sample` configs of the tuner's space and the `grid`'s boxes, each checked and timed at
    DCP_POINT with batch B and `heads` heads."""
    point = {**DCP_POINT, "B": B, "H": heads}
    N, H, D = point["N"], point["H"], point["D"]
    configs: dict[str, Any] = {"default": None}
    if sample:
        configs.update(space_configs(module, N, B, H, D, pool, kernel=kernel, sample=sample))
    if grid:
        from layoutgen.dcp.config import pack_pairs_axis  # not in trees before the eighteenth pass: grids only

        pairs_head = kernel == "pack" and pack_pairs_axis(module.SPEC) == "head"
        boxes = grid_configs(kernel, grid, N, H // N, D, H if pairs_head else None)
        configs.update(space_configs(module, N, B, H, D, pool, kernel=kernel, configs=boxes))
    rows = []
    for name, config in configs.items():
        try:
            row = dcp_kernel(bench, ceiling, module, kernel, point, config)
        except Exception as error:  # a config the launcher refuses, or one that fails its check: say so
            rows.append({"name": name, "error": f"{type(error).__name__}: {error}"})
            continue
        rows.append({"name": name, "config": row["config"], "us": row["us"], "of_copy": row["of_copy"]})
        torch.cuda.empty_cache()
    return rows


def markdown(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [
        f"# Unseen DCP specs over the tuner's space ({results['label']}) on {env.get('device', 'cpu')}",
        "",
        f"{results['date']}; torch {env.get('torch')}, triton {env.get('triton')}; seed {results['seed']}, point "
        f"{', '.join(f'{k} {v}' for k, v in results['point'].items())} (B as the row says), bf16 `out`; {results['sample']} configs of each "
        "kernel's space and its default, CUDA-graph replay medians, rotated inputs; % of copy = a plain copy of "
        "the same bytes, same rotation.",
        "",
        "| spec | layout | kernel | B | default | % | best | % | next five (% of copy) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in results["kernels"]:
        timed = sorted((r for r in entry["rows"] if "us" in r), key=lambda r: r["us"])
        default = next((r for r in entry["rows"] if r["name"] == "default" and "us" in r), None)
        if not timed or default is None:
            lines.append(f"| {entry['spec']} | {entry['layout']} | {entry['kernel']} | {entry['B']} | failed | | | | |")
            continue
        best = timed[0]
        following = ", ".join(f"{config_name_of(r)} ({r['of_copy']:.0%})" for r in timed[1:6])
        lines.append(
            f"| {entry['spec']} | {entry['layout']} | {entry['kernel']} | {entry['B']} | {config_name_of(default)}: "
            f"{default['us']:.2f} µs | {default['of_copy']:.0%} | {config_name_of(best)}: {best['us']:.2f} µs | "
            f"{best['of_copy']:.0%} | {following} |"
        )
    lines += ["", "Configs: " + "batch x head x dim x warps (pack: peer x batch x head x dim x warps).", ""]
    return "\n".join(lines)


def config_name_of(row: dict[str, Any]) -> str:
    config = row["config"]
    axes = [config[k] for k in ("block_peer", "block_batch", "block_head", "block_dim") if k in config]
    return "x".join(str(value) for value in [*axes, config["num_warps"]])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--label", default="committed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--specs", default="1,7,9", help="indices of the seed's DCP specs (0-11); '' for none")
    parser.add_argument("--bundled", default="", help="bundled DCP spec names besides them, comma-separated")
    parser.add_argument("--spec-file", action="append", default=[], type=Path, help="a DCP spec YAML besides them")
    parser.add_argument("--batches", default=str(DCP_POINT["B"]), help="batch sizes, comma-separated")
    parser.add_argument("--kernel", action="append", choices=("pack", "combine"))
    parser.add_argument("--sample", type=int, default=60, help="configs of the tuner's space (0: none)")
    parser.add_argument("--heads", type=int, default=DCP_POINT["H"], help="H, the heads of `out` (default 128)")
    parser.add_argument("--grid", help="BATCH:HEAD:DIM:WARPS[:PEER], comma-separated lists: boxes beside the space's")
    args = parser.parse_args()
    from layoutgen.spec import bundled_specs, load_spec
    from layoutgen.tuning.compile import CompilePool, default_compile_workers

    specs = sample_specs(12, 0, args.seed)
    bench = Bench(False, None)
    ceiling = CopyCeiling(bench)
    pool = CompilePool(default_compile_workers(1))
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(),
        "label": args.label,
        "seed": args.seed,
        "sample": args.sample,
        "point": {**DCP_POINT, "H": args.heads},
        "kernels": [],
    }
    stem = f"probe_unseen_dcp_{args.label}_{torch.cuda.get_device_name().replace(' ', '_')}"
    chosen = [(str(index), specs[index][1]) for index in (int(value) for value in args.specs.split(",") if value)]
    bundled = bundled_specs()
    chosen += [(name, bundled[name]) for name in args.bundled.split(",") if name]
    chosen += [(path.stem, load_spec(path)) for path in args.spec_file]
    with tempfile.TemporaryDirectory() as directory:
        for label, spec in chosen:
            module = render(spec, Path(directory))
            for kernel, B in itertools.product(args.kernel or ["combine"], (int(b) for b in args.batches.split(","))):
                rows = probe_kernel(bench, ceiling, module, kernel, args.sample, pool, args.grid, B, args.heads)
                results["kernels"].append(
                    {"spec": label, "layout": dcp_layout(spec), "kernel": kernel, "B": B, "rows": rows}
                )
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
                (args.out / f"{stem}.md").write_text(markdown(results), encoding="utf-8")
                print(markdown(results).splitlines()[-3], flush=True)
    pool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
