"""GPU probe: the fp8 packs that transpose, over an explicit grid of boxes, beside their bf16 counterparts.

`bench_unseen_specs.py`'s seed-0 specs 1 (`[batch, dim, peer, head]`, one scale per row) and 7
(`[peer, head, dim, batch]`, blocks of 16) pack at 54% and 70% of the copy ceiling with their defaults.  The
tuner's 24 TPE trials cover a small part of their spaces; this times every box of a hand-made grid (whole
scale blocks in one pass, and chunks of a block in two passes), each checked byte for byte against
`layoutgen.dcp.reference` first, as CUDA-graph replay medians with the tuner's rotation, against a copy of the
same bytes (`bench_unseen_specs.CopyCeiling`).  The same layouts with a bf16 wire (`dtype: input`) are timed
too: what a transposing store costs without the quantisation.

The modules are rendered by whichever `layoutgen` is first on the path, so a template variant is timed by
running this again with `PYTHONPATH=<variant>:$PYTHONPATH` and another `--label`.

`--ncu SPEC:B:peer,batch,head,dim,warps` launches that one config three times and exits (for `ncu -k
regex:_pack_kernel`).

`--maxnreg auto,0,64` times every box under ptxas's register caps (Triton's `maxnreg` launch option): `auto` is
the launcher's own choice, 0 no cap, a number that cap, overriding the launcher's.

`--draw SEED:INDEX,...` adds the transposing fp8 specs of other seeds' samples (named
`unseen_dcp_s<SEED>_<INDEX>`), timed with their default box and the `--box`es named for them.

Usage (GPU): python benchmarks/probe_fp8_transpose.py --out DIR [--label committed] [--points 64,1024]
             [--only SPEC,...] [--box SPEC:PEER,BATCH,HEAD,DIM,WARPS ...] [--maxnreg auto,0,64,...]
             [--draw SEED:INDEX,...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from bench_dcp_v2 import Bench, _filled, _same, environment
from bench_unseen_specs import CopyCeiling, render, sample_specs

from layoutgen.dcp import reference
from layoutgen.dcp.config import PackConfig
from layoutgen.spec import parse_spec

N, H, D = 8, 128, 512
#: (spec index in the seed-0 sample, boxes as (peer, batch, head, dim, warps)).
GRIDS: dict[int, list[tuple[int, int, int, int, int]]] = {
    # Innermost run: a batch row's heads over all peers (128 bytes at H 128); one scale per row of 512 dims.
    1: [
        *[(1, 1, 16, 512, w) for w in (4, 8, 16)],
        *[(2, 1, 16, 512, w) for w in (8, 16)],
        (4, 1, 16, 512, 16),
        *[(1, 1, 16, d, w) for d in (64, 128, 256) for w in (2, 4, 8)],
        *[(2, 1, 16, d, w) for d in (32, 64, 128, 256) for w in (4, 8)],
        *[(4, 1, 16, d, w) for d in (16, 32, 64, 128) for w in (4, 8)],
        *[(8, 1, 16, d, w) for d in (16, 32, 64) for w in (4, 8)],
    ],
    # Innermost run: a (peer, head, dim)'s batch rows; blocks of 16 dims, scales [peer, head, batch, block].
    7: [
        *[
            (1, rows, 1, dims, w)
            for rows, dims in ((16, 256), (16, 512), (32, 64), (32, 128), (32, 256), (32, 512))
            for w in (4, 8)
        ],
        *[(1, 64, 1, dims, w) for dims in (16, 32, 64, 128, 256) for w in (2, 4, 8)],
        *[(1, 128, 1, dims, w) for dims in (16, 32, 64, 128) for w in (4, 8)],
        *[(1, 256, 1, dims, w) for dims in (16, 32, 64) for w in (4, 8)],
        *[(1, 64, 2, dims, w) for dims in (32, 64) for w in (4, 8)],
    ],
}


def drawn_specs(draws: str) -> dict[str, Any]:
    """`SEED:INDEX,...`: those specs of bench_unseen_specs.py's samples, renamed `unseen_dcp_s<SEED>_<INDEX>`."""
    parsed = {}
    for draw in draws.split(","):
        seed, index = (int(value) for value in draw.split(":"))
        data = json.loads(json.dumps(sample_specs(12, 0, seed)[index][0]))
        data["name"] = f"unseen_dcp_s{seed}_{index:02d}"
        parsed[data["name"]] = parse_spec(data, f"{data['name']}.yaml")
    return parsed


def specs() -> dict[str, Any]:
    """The two fp8 specs and their bf16-wire twins (`<name>_bf16`), parsed."""
    sample = sample_specs(12, 0, 0)
    parsed = {}
    for index in GRIDS:
        data = sample[index][0]
        parsed[data["name"]] = sample[index][1]
        twin = json.loads(json.dumps(data))
        twin["name"] = f"{data['name']}_bf16"
        twin["payload"]["dtype"] = "input"
        for field in ("scale_block", "scale_axes"):
            twin["payload"].pop(field, None)
        parsed[twin["name"]] = parse_spec(twin, f"{twin['name']}.yaml")
    return parsed


class WithMaxnreg:
    """Stands in for the module's pack kernel: `kernel[grid](...)` with Triton's `maxnreg` launch option
    replaced (ptxas's register cap; None: no cap)."""

    def __init__(self, kernel: Any, maxnreg: int | None) -> None:
        self.kernel, self.maxnreg = kernel, maxnreg

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: self.kernel[grid](*args, **{**kwargs, "maxnreg": self.maxnreg})


def config_of(box: tuple[int, int, int, int, int]) -> PackConfig:
    peer, batch, head, dim, warps = box
    return PackConfig(block_peer=peer, block_batch=batch, block_head=head, block_dim=dim, num_warps=warps)


def measure(
    bench: Bench,
    ceiling: CopyCeiling,
    module: Any,
    B: int,
    configs: list[PackConfig],
    check: bool = True,
    maxnregs: tuple[int | None, ...] = (None,),
) -> list[dict]:
    """`maxnregs`: None for the launcher's own register cap, 0 for none, or the cap to force."""
    nbytes = bench.bytes_moved(module, "pack", N, H, D, B)
    sets = bench.sets(nbytes)
    outs = [torch.randn(B, H, D, dtype=torch.bfloat16, device=bench.device) for _ in range(sets)]
    lses = [torch.randn(B, H, device=bench.device) * 4 for _ in range(sets)]
    bufs = [_filled(module.alloc(N, B, H, D, torch.bfloat16, bench.device)) for _ in range(sets)]
    expected = _filled(module.alloc(N, B, H, D, torch.bfloat16, bench.device))
    reference.pack(outs[0], lses[0], expected)
    copy_us = ceiling.us(nbytes, sets)
    rows = []
    for config in configs:
        for maxnreg in maxnregs:
            row: dict[str, Any] = {"B": B, "config": config.as_dict(), "bytes": nbytes, "copy_us": copy_us}
            if maxnreg is not None:
                row["maxnreg"] = maxnreg
            kernel = None if maxnreg is None else WithMaxnreg(module._pack_kernel, maxnreg or None)

            def pack(i: int, config: PackConfig = config, kernel: Any = kernel) -> None:
                if kernel is None:
                    module.pack(outs[i], lses[i], bufs[i], config=config)
                else:
                    module._launch_pack(outs[i], lses[i], bufs[i], B, config, False, kernel=kernel)

            label = f"B {B} {config.as_dict()}{'' if maxnreg is None else f' maxnreg {maxnreg}'}"
            try:
                _filled(bufs[0])
                pack(0)
                if check and not _same(bufs[0], expected):
                    raise AssertionError("differs from the reference")
                row["us"] = bench.time(pack, sets, nbytes)["us"]
                row["of_copy"] = copy_us / row["us"]
                print(f"  {label}: {row['us']:.2f} µs, {row['of_copy']:.0%} of copy", flush=True)
            except Exception as error:  # a box the launcher refuses or a wrong result: reported, never timed
                row["error"] = f"{type(error).__name__}: {error}"
                print(f"  {label}: {row['error']}", flush=True)
            rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--label", default="committed")
    parser.add_argument("--points", default="64,1024")
    parser.add_argument("--only", default=None, help="comma-separated spec names to time (default: all four)")
    parser.add_argument("--modules", type=Path, default=None, help="load <spec>.py from here instead of rendering")
    parser.add_argument("--no-check", action="store_true", help="time without the byte check (a probe's variant)")
    parser.add_argument(
        "--maxnreg", default="auto", help="comma-separated register caps per box (auto: the launcher's; 0: none)"
    )
    parser.add_argument("--draw", default=None, help="SEED:INDEX,... transposing fp8 specs of other samples")
    parser.add_argument(
        "--box",
        action="append",
        default=None,
        metavar="SPEC:PEER,BATCH,HEAD,DIM,WARPS",
        help="time these boxes (beside the default) instead of SPEC's grid (repeatable)",
    )
    parser.add_argument("--ncu", default=None)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from layoutgen.dcp import FAMILY
    from layoutgen.tuning.problem import Problem

    parsed = specs()
    if args.draw:
        parsed.update(drawn_specs(args.draw))
    if args.modules:
        from layoutgen.loader import load_path

        modules = {
            name: load_path(args.modules / f"{name}.py") for name in parsed if (args.modules / f"{name}.py").is_file()
        }
    else:
        modules = {name: render(spec, args.out / f"modules_{args.label}") for name, spec in parsed.items()}
    if args.ncu:
        name, B, box = args.ncu.split(":")
        module = modules[name]
        config = config_of(tuple(int(v) for v in box.split(",")))  # type: ignore[arg-type]
        out = torch.randn(int(B), H, D, dtype=torch.bfloat16, device="cuda")
        lse = torch.randn(int(B), H, device="cuda")
        bufs = module.alloc(N, int(B), H, D, torch.bfloat16, out.device)
        for _ in range(3):
            module.pack(out, lse, bufs, config=config)
        torch.cuda.synchronize()
        return 0
    bench = Bench(False, None)
    ceiling = CopyCeiling(bench)
    results: dict[str, Any] = {"environment": environment(), "label": args.label, "point": [N, H, D], "specs": {}}
    results["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes")
    names = [(sample_specs(12, 0, 0)[index][0]["name"], grid) for index, grid in GRIDS.items()]
    named = [(name, list(grid)) for base, grid in names for name in (base, f"{base}_bf16")]
    named += [(name, []) for name in parsed if name.startswith("unseen_dcp_s")]
    for name, grid in named:
        if (args.only and name not in args.only.split(",")) or name not in modules:
            continue
        module = modules[name]
        print(f"{name} ({args.label})", flush=True)
        rows = []
        for B in (int(b) for b in args.points.split(",")):
            default = FAMILY.default_config(
                Problem(module.SPEC, "pack", (("N", N), ("Hl", H // N), ("D", D)), "bfloat16"), B
            )
            # The bf16 twins: their default only (the transposing store's cost without the quantisation).
            boxes = grid if module.SPEC.fp8 else []
            if args.box:
                boxes = [
                    tuple(int(v) for v in box.split(":")[1].split(",")) for box in args.box if box.split(":")[0] == name
                ]
            configs = [default] + [config_of(box) for box in boxes if config_of(box) != default]
            maxnregs = tuple(None if value == "auto" else int(value) for value in args.maxnreg.split(","))
            measured = measure(bench, ceiling, module, B, configs, check=not args.no_check, maxnregs=maxnregs)
            measured[0]["default"] = True
            rows += measured
            torch.cuda.empty_cache()
            results["specs"][name] = rows  # written after every point: a run cut short keeps what it timed
            (args.out / f"probe_fp8_transpose_{args.label}.json").write_text(json.dumps(results, indent=1))
    for name, rows in results["specs"].items():
        for B in sorted({row["B"] for row in rows}):
            timed = [row for row in rows if row["B"] == B and "us" in row]
            if timed:
                best = min(timed, key=lambda row: row["us"])
                default = next(row for row in rows if row["B"] == B and row.get("default"))
                print(
                    f"{name} B {B}: best {best['us']:.2f} µs {best['of_copy']:.0%} {best['config']}; "
                    f"default {default.get('us', float('nan')):.2f} µs"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
