"""One DCP decode step end to end: sharded attention, exchange, merge, checked against full attention.

    python examples/dcp_decode_step.py                          # 2 CPU ranks (gloo, Triton interpreter)
    python examples/dcp_decode_step.py --world-size 4 --spec vllm_a2a
    python examples/dcp_decode_step.py --device cuda            # NCCL, one GPU per rank

Every rank holds the keys and values of positions t with t % N == rank (round-robin, as DCP shards
the KV cache) and computes, for all H heads, softmax attention of the queries over its shard in
float32: the partial output, cast to the activation dtype, and its float32 LSE. `DcpExchange` moves each
head block to its owner and merges the N partials; the result must match attention over the whole
cache computed in float64. Sequences shorter than N leave some ranks without keys (LSE -inf).
Exits non-zero when any rank's result is off.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def make_problem(batch: int, heads: int, head_dim: int, seed: int) -> tuple[torch.Tensor, list[tuple]]:
    """Queries [B, H, D] and, per sequence, keys and values [L, H, D] (float64, the same on every rank).

    Lengths cover the awkward cases: 1 key (every rank but 0 empty), fewer keys than ranks, and longer.
    """
    generator = torch.Generator().manual_seed(seed)
    queries = torch.randn(batch, heads, head_dim, generator=generator, dtype=torch.float64)
    lengths = [1, 2, 3, 37, 64, 5, 100, 8][:batch] + [16] * max(0, batch - 8)
    cache = [
        (
            torch.randn(length, heads, head_dim, generator=generator, dtype=torch.float64),
            torch.randn(length, heads, head_dim, generator=generator, dtype=torch.float64),
        )
        for length in lengths
    ]
    return queries, cache


def shard_attention(
    queries: torch.Tensor, cache: list[tuple], rank: int, world_size: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's partial `out [B, H, D]` (dtype) and natural-log `lse [B, H]` (float32) over its keys."""
    batch, heads, head_dim = queries.shape
    scale = 1.0 / math.sqrt(head_dim)
    out = torch.zeros(batch, heads, head_dim, dtype=torch.float32)
    lse = torch.full((batch, heads), float("-inf"), dtype=torch.float32)
    for sequence, (keys, values) in enumerate(cache):
        mine_keys = keys[rank::world_size].float()
        if mine_keys.shape[0] == 0:
            continue  # no keys here: LSE -inf, and the payload is never read
        mine_values = values[rank::world_size].float()
        scores = torch.einsum("hd,thd->ht", queries[sequence].float(), mine_keys) * scale
        lse[sequence] = torch.logsumexp(scores, dim=-1)
        out[sequence] = torch.einsum("ht,thd->hd", torch.softmax(scores, dim=-1), mine_values)
    return out.to(dtype), lse


def full_attention(queries: torch.Tensor, cache: list[tuple]) -> tuple[torch.Tensor, torch.Tensor]:
    """Unsharded attention in float64: out [B, H, D], lse [B, H]."""
    scale = 1.0 / math.sqrt(queries.shape[-1])
    outs, lses = [], []
    for sequence, (keys, values) in enumerate(cache):
        scores = torch.einsum("hd,thd->ht", queries[sequence], keys) * scale
        lses.append(torch.logsumexp(scores, dim=-1))
        outs.append(torch.einsum("ht,thd->hd", torch.softmax(scores, dim=-1), values))
    return torch.stack(outs), torch.stack(lses)


def worker(rank: int, args: argparse.Namespace, store: str) -> None:
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before the generated module's kernels are defined
        torch.set_num_threads(1)
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    backend = "gloo" if args.device == "cpu" else "nccl"
    dist.init_process_group(
        backend, init_method=f"file://{store}", rank=rank, world_size=args.world_size, timeout=timedelta(seconds=300)
    )
    from layoutgen import DcpExchange
    from layoutgen.dcp.layout import wire_dtype
    from layoutgen.dcp.quant import fp8_max
    from layoutgen.dcp.tolerances import COMBINE_RTOL

    try:
        world_size, dtype = args.world_size, DTYPES[args.dtype]
        queries, cache = make_problem(args.batch, args.heads, args.head_dim, args.seed)
        out, lse = shard_attention(queries, cache, rank, world_size, dtype)
        exchange = DcpExchange(
            args.spec, None, B_max=args.batch, H=args.heads, D=args.head_dim, dtype=dtype, device=device
        )
        merged, merged_lse = exchange(out.to(device), lse.to(device), return_lse=True)

        ref_out, ref_lse = full_attention(queries, cache)
        heads = args.heads // world_size
        block = slice(rank * heads, (rank + 1) * heads)
        ref_out, ref_lse = ref_out[:, block], ref_lse[:, block]
        # Each partial is rounded to `dtype` once and the merge rounds once more; the float32 softmax and
        # LSE add far less. The merge is a convex combination, so both errors are bounded by dtype rounding
        # of the largest value involved.
        rtol = COMBINE_RTOL[dtype]
        allowed = rtol * (ref_out.abs() + ref_out.abs().max())
        if exchange.spec.fp8:
            # An fp8 wire adds its codes' rounding (README, "fp8 on the wire"): 2^-4 (e4m3fn; 2^-3 e5m2) of
            # the merged partials' magnitudes, here bounded by the largest partial of any rank, plus 2^-10
            # (2^-17) of the largest block scale (that partial over the fp8 maximum).
            largest = out.float().abs().amax().to(device)
            dist.all_reduce(largest, op=dist.ReduceOp.MAX)
            wire = wire_dtype(exchange.spec, dtype)
            code_rtol, subnormal = (2.0**-4, 2.0**-10) if wire == torch.float8_e4m3fn else (2.0**-3, 2.0**-17)
            largest_value = float(largest)
            allowed = allowed + code_rtol * largest_value + subnormal * largest_value / fp8_max(wire)
        out_error = ((merged.cpu().double() - ref_out).abs() / allowed).max()
        lse_error = ((merged_lse.cpu().double() - ref_lse).abs() / (1e-5 * (1 + ref_lse.abs()))).max()
        finite = bool(torch.isfinite(merged).all())
        ok = finite and float(out_error) <= 1 and float(lse_error) <= 1
        empty = sum(keys[rank::world_size].shape[0] == 0 for keys, _ in cache)
        line = (
            f"rank {rank}/{world_size} {args.spec} {backend}: merged {list(merged.shape)} {str(dtype)[6:]}, "
            f"{empty} of {args.batch} sequences without keys here, out error {float(out_error):.2f}x tolerance, "
            f"lse error {float(lse_error):.2f}x tolerance: {'OK' if ok else 'MISMATCH'}"
        )
        # Ranks printing at once interleave their writes; rank 0 prints every rank's line, in rank order.
        lines: list[str | None] = [None] * world_size
        dist.all_gather_object(lines, line)
        if rank == 0:
            print("\n".join(str(text) for text in lines), flush=True)
    finally:
        dist.destroy_process_group()
    if not ok:
        sys.exit(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2, help="ranks (KV shards); default 2")
    parser.add_argument(
        "--spec", default="pynccl_a2a", help="an all_to_all_single DCP spec name (fp8 ones too) or generated .py"
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda if enough GPUs")
    parser.add_argument("--batch", type=int, default=6, help="sequences (query rows)")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.device_count() >= args.world_size else "cpu"
    if args.device == "cuda" and torch.cuda.device_count() < args.world_size:
        parser.error(f"--device cuda needs {args.world_size} GPUs, found {torch.cuda.device_count()}")
    import layoutgen

    try:
        spec = layoutgen.load(args.spec).SPEC
    except (OSError, TypeError, ValueError) as error:
        parser.error(f"--spec {args.spec}: {error}")
    if spec.family != "dcp":
        parser.error(
            f"--spec {args.spec} is a {spec.family} spec; this example runs DCP specs "
            "(examples/ulysses_attention.py runs Ulysses ones)"
        )
    if spec.transport.value != "all_to_all_single":
        parser.error(f"--spec {args.spec} leaves the exchange to the caller; pick an all_to_all_single spec")
    if args.heads % args.world_size:
        parser.error(f"--heads {args.heads} must be divisible by --world-size {args.world_size}")
    with tempfile.TemporaryDirectory() as directory:
        try:
            mp.spawn(worker, args=(args, os.path.join(directory, "store")), nprocs=args.world_size, join=True)
        except mp.ProcessExitedException as error:
            print(f"mismatch: {error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
