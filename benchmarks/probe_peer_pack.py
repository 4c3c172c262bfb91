"""GPU probe: the pack of a `peer`-innermost layout with batch outside it, as a 4-D box and as a flat run.

payload [head, dim, batch, peer] (benchmarks/specs/probe_bf16_peer_inner_batch.yaml without its stats): the
generated pack tiles peer x batch x dim and stores runs of NUM_PEERS elements (16 bytes of bf16 at N 8), the
best box at 59% of the copy ceiling (probe_unseen_dcp.py, eighteenth pass).  Batch and peer are adjacent
innermost axes of the destination, so one flat axis of (batch, peer) pairs -- row r of a program is peer
r % N of batch r // N -- makes every run of the destination one contiguous vector of the tile.  This times
both forms, hand-written here, at N 8, H 128, D 512, B 64 and 1024, against a copy of the same bytes
(CUDA-graph replay medians, `triton.testing.do_bench_cudagraph`, L2-resident inputs).  Results:
`<out>/probe_peer_pack.json` (archive/probe_peer_pack_H200.json); the best four of each form are printed.

Usage (GPU): python benchmarks/probe_peer_pack.py --out DIR
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["batch_size"])
def _box_pack(out_ptr, payload_ptr, batch_size, batch_capacity, out_stride_batch, out_stride_head,
              NUM_PEERS: tl.constexpr, HEADS_PER_PEER: tl.constexpr, HEAD_DIM: tl.constexpr,
              BLOCK_PEER: tl.constexpr, BLOCK_BATCH: tl.constexpr, BLOCK_DIM: tl.constexpr):  # fmt: skip
    batch_block = tl.program_id(1)
    program = tl.program_id(2)
    dim_block = program % (HEAD_DIM // BLOCK_DIM)
    head = program // (HEAD_DIM // BLOCK_DIM)
    dim = (dim_block * BLOCK_DIM + tl.arange(0, BLOCK_DIM))[:, None, None]
    batch = (batch_block * BLOCK_BATCH + tl.arange(0, BLOCK_BATCH))[None, :, None]
    peer = tl.arange(0, BLOCK_PEER)[None, None, :]
    mask = (batch < batch_size) & (peer < NUM_PEERS)
    source = out_ptr + batch * out_stride_batch + (peer * HEADS_PER_PEER + head) * out_stride_head + dim
    values = tl.load(source, mask=mask)
    destination = payload_ptr + ((head * HEAD_DIM + dim) * batch_capacity + batch) * NUM_PEERS + peer
    tl.store(destination, values, mask=mask)


@triton.jit(do_not_specialize=["batch_size"])
def _flat_pack(out_ptr, payload_ptr, batch_size, batch_capacity, out_stride_batch, out_stride_head,
               NUM_PEERS: tl.constexpr, HEADS_PER_PEER: tl.constexpr, HEAD_DIM: tl.constexpr,
               BLOCK_ROWS: tl.constexpr, BLOCK_DIM: tl.constexpr, WHOLE: tl.constexpr):  # fmt: skip
    row_block = tl.program_id(1)
    program = tl.program_id(2)
    dim_block = program % (HEAD_DIM // BLOCK_DIM)
    head = program // (HEAD_DIM // BLOCK_DIM)
    dim = (dim_block * BLOCK_DIM + tl.arange(0, BLOCK_DIM))[:, None]
    row = row_block * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[None, :]
    batch = row // NUM_PEERS
    peer = row % NUM_PEERS
    source = out_ptr + batch * out_stride_batch + (peer * HEADS_PER_PEER + head) * out_stride_head + dim
    destination = payload_ptr + (head * HEAD_DIM + dim) * (batch_capacity * NUM_PEERS) + row
    if WHOLE:
        values = tl.load(source)
        tl.store(destination, values)
    else:
        mask = row < batch_size * NUM_PEERS
        values = tl.load(source, mask=mask)
        tl.store(destination, values, mask=mask)


def timed(
    kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], payload: Any, expected: Any, **constexprs: Any
) -> tuple[float, bool]:
    """(µs, exact) of one launch: the payload canary-filled, launched once and compared, then timed."""
    launch = functools.partial(kernel[grid], *args, **constexprs)
    payload.fill_(7)
    launch()
    exact = bool(torch.equal(payload, expected))
    return 1000 * triton.testing.do_bench_cudagraph(launch), exact


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    N, H, D = 8, 128, 512
    Hl = H // N
    rows: list[dict[str, Any]] = []
    for B in (1024, 64):
        out = torch.randn(B, H, D, device="cuda", dtype=torch.bfloat16)
        payload = torch.empty(Hl, D, B, N, device="cuda", dtype=torch.bfloat16)
        expected = out.view(B, N, Hl, D).permute(2, 3, 0, 1)
        copy_source = torch.randn(out.numel(), device="cuda", dtype=torch.bfloat16)
        copy_target = torch.empty_like(copy_source)
        copy_us = 1000 * triton.testing.do_bench_cudagraph(functools.partial(copy_target.copy_, copy_source))
        rows.append({"B": B, "variant": "copy", "us": copy_us})
        launch_args = (out, payload, B, B, out.stride(0), out.stride(1))
        shape = {"NUM_PEERS": N, "HEADS_PER_PEER": Hl, "HEAD_DIM": D}
        for BB, BD, W in itertools.product((2, 4, 8, 16), (32, 64, 128), (4, 8)):
            grid = (1, triton.cdiv(B, BB), Hl * D // BD)
            us, exact = timed(_box_pack, grid, launch_args, payload, expected, **shape, BLOCK_PEER=N, BLOCK_BATCH=BB,
                              BLOCK_DIM=BD, num_warps=W)  # fmt: skip
            rows.append({"B": B, "variant": "box", "rows": BB * N, "dim": BD, "warps": W, "us": us, "exact": exact})
        for R, BD, W, whole in itertools.product((32, 64, 128, 256), (32, 64, 128), (4, 8), (False, True)):
            if R * BD > 16384:
                continue
            grid = (1, triton.cdiv(B * N, R), Hl * D // BD)
            us, exact = timed(_flat_pack, grid, launch_args, payload, expected, **shape, BLOCK_ROWS=R, BLOCK_DIM=BD,
                              WHOLE=whole, num_warps=W)  # fmt: skip
            name = "flat_whole" if whole else "flat"
            rows.append({"B": B, "variant": name, "rows": R, "dim": BD, "warps": W, "us": us, "exact": exact})
    for row in rows:
        copy = next(r["us"] for r in rows if r["B"] == row["B"] and r["variant"] == "copy")
        row["of_copy"] = copy / row["us"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_peer_pack.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    for B in (1024, 64):
        for variant in ("box", "flat", "flat_whole"):
            best = sorted((r for r in rows if r["B"] == B and r["variant"] == variant), key=lambda r: r["us"])[:4]
            print(B, variant, [(r["rows"], r["dim"], r["warps"], round(r["us"], 2), f"{r['of_copy']:.0%}",
                                r["exact"]) for r in best])  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
