"""GPU probe: spec 13's Ulysses gather_out as a box and with the destination's inner axes as one flat run.

bench_unseen_specs.py's spec 13 gathers the attention output from wire [peer, head, dim, seq] into local
[seq, dim, (peer, head)] (48% of the copy ceiling; 77% at the tuner's best, a 1 KiB box).  Its box keeps
peer and head apart, so Triton sees runs of H / N heads in the destination (16 bytes of bf16 at N 4,
H 32) although a local row holds dim x peer x head contiguously: the DCP pack's problem with peer innermost
(probe_peer_pack.py).  This times, hand-written and at that point (N 4, S_local 4096, H 32, D 128, bf16):

* `box`: seq x dim x peer x head, each its own index vector (the generated form);
* `heads`: seq x dim x a flat run of global heads (head g is head g % (H / N) of peer g // (H / N));
* `row`: seq x a flat run of the row's (dim, peer, head) elements.

CUDA-graph replay medians (`triton.testing.do_bench_cudagraph`, L2-resident inputs) against a copy of the
same bytes, every variant checked against torch first.  Results: `<out>/probe_ulysses_pairs.json`; the best
four boxes of each form are printed.  On the H200 (2026-12-04, `results/archive/probe_ulysses_pairs_H200.json`):
box 77%, heads 95%, row 96% of the copy at their best; the heads form is what `layout.global_heads` generates.

Usage (GPU): python benchmarks/probe_ulysses_pairs.py --out DIR
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


@triton.jit
def _box(wire_ptr, local_ptr, SEQ: tl.constexpr, NUM_PEERS: tl.constexpr, HEADS_PER_PEER: tl.constexpr,
         HEAD_DIM: tl.constexpr, BLOCK_SEQ: tl.constexpr, BLOCK_DIM: tl.constexpr, BLOCK_PEER: tl.constexpr,
         BLOCK_HEAD: tl.constexpr):  # fmt: skip
    seq_block = tl.program_id(0)
    dim_block = tl.program_id(1)
    seq = (seq_block * BLOCK_SEQ + tl.arange(0, BLOCK_SEQ))[:, None, None, None]
    dim = (dim_block * BLOCK_DIM + tl.arange(0, BLOCK_DIM))[None, :, None, None]
    peer = tl.arange(0, BLOCK_PEER)[None, None, :, None]
    head = tl.arange(0, BLOCK_HEAD)[None, None, None, :]
    mask = (peer < NUM_PEERS) & (head < HEADS_PER_PEER)
    source = wire_ptr + ((peer * HEADS_PER_PEER + head) * HEAD_DIM + dim) * SEQ + seq
    values = tl.load(source, mask=mask)
    destination = local_ptr + (seq * HEAD_DIM + dim) * (NUM_PEERS * HEADS_PER_PEER) + peer * HEADS_PER_PEER + head
    tl.store(destination, values, mask=mask)


@triton.jit
def _heads(wire_ptr, local_ptr, SEQ: tl.constexpr, NUM_PEERS: tl.constexpr, HEADS_PER_PEER: tl.constexpr,
           HEAD_DIM: tl.constexpr, BLOCK_SEQ: tl.constexpr, BLOCK_DIM: tl.constexpr, BLOCK_HEADS: tl.constexpr):  # fmt: skip
    seq_block = tl.program_id(0)
    dim_block = tl.program_id(1)
    seq = (seq_block * BLOCK_SEQ + tl.arange(0, BLOCK_SEQ))[:, None, None]
    dim = (dim_block * BLOCK_DIM + tl.arange(0, BLOCK_DIM))[None, :, None]
    heads = tl.arange(0, BLOCK_HEADS)[None, None, :]
    mask = heads < NUM_PEERS * HEADS_PER_PEER
    # Global head g = peer * HEADS_PER_PEER + head: the wire's (peer, head) index is g itself.
    source = wire_ptr + (heads * HEAD_DIM + dim) * SEQ + seq
    values = tl.load(source, mask=mask)
    destination = local_ptr + (seq * HEAD_DIM + dim) * (NUM_PEERS * HEADS_PER_PEER) + heads
    tl.store(destination, values, mask=mask)


@triton.jit
def _row(wire_ptr, local_ptr, SEQ: tl.constexpr, NUM_PEERS: tl.constexpr, HEADS_PER_PEER: tl.constexpr,
         HEAD_DIM: tl.constexpr, BLOCK_SEQ: tl.constexpr, BLOCK_ROW: tl.constexpr):  # fmt: skip
    seq_block = tl.program_id(0)
    row_block = tl.program_id(1)
    seq = (seq_block * BLOCK_SEQ + tl.arange(0, BLOCK_SEQ))[:, None]
    element = (row_block * BLOCK_ROW + tl.arange(0, BLOCK_ROW))[None, :]
    heads = element % (NUM_PEERS * HEADS_PER_PEER)
    dim = element // (NUM_PEERS * HEADS_PER_PEER)
    source = wire_ptr + (heads * HEAD_DIM + dim) * SEQ + seq
    values = tl.load(source)
    tl.store(local_ptr + seq * (HEAD_DIM * NUM_PEERS * HEADS_PER_PEER) + element, values)


def timed(
    kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], local: Any, expected: Any, **constexprs: Any
) -> tuple[float, bool]:
    """(µs, exact) of one launch: the destination canary-filled, launched once and compared, then timed."""
    launch = functools.partial(kernel[grid], *args, **constexprs)
    local.fill_(7)
    launch()
    exact = bool(torch.equal(local, expected))
    return 1000 * triton.testing.do_bench_cudagraph(launch), exact


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    N, S, H, D = 4, 4096, 32, 128
    Hl = H // N
    wire = torch.randn(N, Hl, D, S, device="cuda", dtype=torch.bfloat16)
    local = torch.empty(S, D, H, device="cuda", dtype=torch.bfloat16)
    expected = wire.permute(3, 2, 0, 1).reshape(S, D, H)
    copy_source = torch.randn(wire.numel(), device="cuda", dtype=torch.bfloat16)
    copy_target = torch.empty_like(copy_source)
    copy_us = 1000 * triton.testing.do_bench_cudagraph(functools.partial(copy_target.copy_, copy_source))
    rows: list[dict[str, Any]] = []
    shape = {"SEQ": S, "NUM_PEERS": N, "HEADS_PER_PEER": Hl, "HEAD_DIM": D}
    for BS, BD, W in itertools.product((16, 32, 64, 128), (1, 2, 4, 8), (1, 2, 4, 8)):
        if BS * BD * H > 8192:
            continue
        grid = (S // BS, D // BD)
        for name, kernel, blocks in (
            ("box", _box, {"BLOCK_PEER": N, "BLOCK_HEAD": Hl}),
            ("heads", _heads, {"BLOCK_HEADS": H}),
        ):
            us, exact = timed(kernel, grid, (wire, local), local, expected, **shape, BLOCK_SEQ=BS, BLOCK_DIM=BD,
                              **blocks, num_warps=W)  # fmt: skip
            rows.append({"variant": name, "seq": BS, "dim": BD, "warps": W, "us": us, "exact": exact})
    for BS, BR, W in itertools.product((16, 32, 64, 128), (32, 64, 128, 256), (1, 2, 4, 8)):
        if BS * BR > 8192:
            continue
        grid = (S // BS, D * H // BR)
        us, exact = timed(_row, grid, (wire, local), local, expected, **shape, BLOCK_SEQ=BS, BLOCK_ROW=BR, num_warps=W)
        rows.append({"variant": "row", "seq": BS, "row": BR, "warps": W, "us": us, "exact": exact})
    for row in rows:
        row["of_copy"] = copy_us / row["us"]
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"copy_us": copy_us, "point": {"N": N, "S_local": S, "H": H, "D": D}, "rows": rows}
    (args.out / "probe_ulysses_pairs.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print("copy", round(copy_us, 2))
    for variant in ("box", "heads", "row"):
        best = sorted((r for r in rows if r["variant"] == variant), key=lambda r: r["us"])[:4]
        print(variant, [(r["seq"], r.get("dim", r.get("row")), r["warps"], round(r["us"], 2), f"{r['of_copy']:.0%}",
                         r["exact"]) for r in best])  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
