"""GPU probe: where the masked pack's small-batch cost comes from.

At B 8 the masked pack took 1.13-1.14x the plain pack in `dispatch_overhead.py`'s CUDA graph (64 calls on
the same inputs, default config 2 heads x 512 x 4 warps, H100), against 1.02-1.05x in `bench_dcp_v2.py`'s
condition (tuned configs, rotated inputs, H200).  Every program of the call reads its rows' flags, and at
B 8 all flags sit in one 32-byte sector: a few thousand warp loads of one L2 line at the start of the call.
This times, per spec, point and config (one box at 1, 2, 4 and 8 warps), the plain pack and the masked pack
(every 4th request empty) in both conditions, and the masked pack once more with each request's flag in a
line of its own (`empty` a view of stride 128 bytes: the same values, spread over B lines).  If the cost is
that one hot line, it grows with the warps and the spread flags remove it.

Every form is checked byte for byte against `layoutgen.dcp.reference` first.

Usage (GPU): python benchmarks/probe_mask_warps.py --out /tmp/probe_mask_warps.json [--spec S ...] [--point N:B:H:D ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import layoutgen
from layoutgen.dcp import reference
from layoutgen.dcp.config import PackConfig

#: Bytes between two requests' flags in the spread form: one L2 line each.
SPREAD_BYTES = 128


def measure(bench: Any, module: Any, N: int, B: int, H: int, D: int, config: PackConfig) -> dict[str, Any]:
    from bench_dcp_v2 import _filled, _same, pack_inputs
    from dispatch_overhead import graph_gpu_us as back_to_back_us  # 64 calls on the same inputs in one graph

    nbytes, sets, outs, lses, empty = pack_inputs(bench, module, N, B, H, D)
    spread = torch.zeros(B * SPREAD_BYTES, dtype=torch.bool, device=bench.device)[::SPREAD_BYTES]
    spread.copy_(empty)
    forms = {"plain": None, "masked": empty, "masked_spread": spread}
    runs = {}
    for label, mask in forms.items():
        sends = [module.alloc(N, B, H, D, torch.bfloat16, bench.device) for _ in range(sets)]
        expected = _filled(module.alloc(N, B, H, D, torch.bfloat16, bench.device))
        _filled(sends[0])

        def run(i: int, sends: list[Any] = sends, mask: Any = mask) -> None:
            module._launch_pack(outs[i], lses[i], sends[i], B, config, False, empty=mask)

        reference.pack(outs[0], lses[0], expected, empty=mask)
        run(0)
        if not _same(sends[0], expected):
            raise AssertionError(f"{module.SPEC_NAME} {label} pack differs from the reference at {N} {B} {H} {D}")
        runs[label] = run
    rotated = bench.timer.time_interleaved(list(runs.values()), sets, max(1.0, nbytes / 3.5e6))
    row: dict[str, Any] = {"spec": module.SPEC_NAME, "N": N, "B": B, "H": H, "D": D, "config": config.as_dict()}
    row["rotated_us"] = {label: timing.median_us for label, timing in zip(runs, rotated, strict=True)}
    row["back_to_back_us"] = {label: back_to_back_us(lambda run=run: run(0)) for label, run in runs.items()}
    # The same two packs through the public call (its recorded direct launch), back to back as
    # `dispatch_overhead.py` times them: there the plain pack took 1.59 µs where `_launch_pack` here takes 1.78.
    for label, mask in (("plain_public", None), ("masked_public", empty)):
        sends = module.alloc(N, B, H, D, torch.bfloat16, bench.device)
        expected = _filled(module.alloc(N, B, H, D, torch.bfloat16, bench.device))
        _filled(sends)
        reference.pack(outs[0], lses[0], expected, empty=mask)
        module.pack(outs[0], lses[0], sends, empty=mask, config=config)
        if not _same(sends, expected):
            raise AssertionError(f"{module.SPEC_NAME} {label} differs from the reference at {N} {B} {H} {D}")
        row["back_to_back_us"][label] = back_to_back_us(
            lambda sends=sends, mask=mask: module.pack(outs[0], lses[0], sends, empty=mask, config=config)
        )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write (after every row)")
    parser.add_argument("--spec", action="append", help="a bundled DCP spec (repeatable)")
    parser.add_argument("--point", action="append", default=[], metavar="N:B:H:D", help="a point (repeatable)")
    parser.add_argument("--box", default="1:2:512", metavar="BATCH:HEAD:DIM", help="the box timed at each warp count")
    args = parser.parse_args()
    from bench_dcp_v2 import Bench
    from probe_pack_mask import write_rows

    bench = Bench(False, None)
    block_batch, block_head, block_dim = (int(value) for value in args.box.split(":"))
    points = [tuple(int(v) for v in point.split(":")) for point in args.point] or [(4, 8, 128, 512)]
    rows = []
    for name in args.spec or ["pynccl_a2a", "trtllm_helix_native_v2"]:
        module = layoutgen.load(name)
        for N, B, H, D in points:
            for warps in (1, 2, 4, 8):
                config = PackConfig(
                    block_batch=block_batch, block_head=block_head, block_dim=block_dim, num_warps=warps
                )
                row = measure(bench, module, N, B, H, D, config)
                rows.append(row)
                line = "  ".join(
                    f"{cond} " + " / ".join(f"{us:.3f}" for us in row[f"{cond}_us"].values())
                    for cond in ("rotated", "back_to_back")
                )
                print(
                    f"{name} N{N} B{B} H{H} D{D} {warps} warps (plain / masked / spread [/ public plain / masked]): {line}",
                    flush=True,
                )
                write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
