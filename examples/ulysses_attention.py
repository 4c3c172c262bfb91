"""Ulysses sequence parallelism end to end: sharded q, k, v -> attention per head block -> shards again.

    python examples/ulysses_attention.py                        # 2 CPU ranks (gloo, Triton interpreter)
    python examples/ulysses_attention.py --world-size 4 --spec yunchang_ulysses_head_major
    python examples/ulysses_attention.py --device cuda          # NCCL, one GPU per rank

Every rank holds rows rank * S_local ... (rank + 1) * S_local - 1 of q, k and v (all heads, the spec's
local layout). `UlyssesExchange.to_attention` hands each rank the whole sequence for its block of heads
(in the spec's attention layout), the rank runs causal softmax attention over it (GQA: each k/v head
serves H / H_kv query heads), and `from_attention` sends the output back, so each rank ends with its own
rows of the attention output, all heads. That must match attention over the unsharded sequence.
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
LOGICAL = ("batch", "seq", "head", "dim")


def make_problem(args: argparse.Namespace, has_batch: bool) -> dict[str, torch.Tensor]:
    """q [B, S, H, D], k and v [B, S, H_kv, D] in `dtype` (the same on every rank: same seed)."""
    generator = torch.Generator().manual_seed(args.seed)
    batch = args.batch if has_batch else 1
    S = args.world_size * args.seq_per_rank
    shapes = {"q": args.heads, "k": args.kv_heads, "v": args.kv_heads}
    return {
        name: torch.randn(batch, S, heads, args.head_dim, generator=generator).to(DTYPES[args.dtype])
        for name, heads in shapes.items()
    }


def to_layout(tensor: torch.Tensor, axes: tuple[str, ...]) -> torch.Tensor:
    """A logical [B, S, H, D] tensor laid out in `axes` (dropping the batch axis when the layout has none)."""
    if "batch" not in axes:
        tensor = tensor[0]
        logical = LOGICAL[1:]
    else:
        logical = LOGICAL
    return tensor.permute([logical.index(axis) for axis in axes])


def from_layout(tensor: torch.Tensor, axes: tuple[str, ...]) -> torch.Tensor:
    """The inverse of `to_layout`: [B, S, H, D] (B = 1 without a batch axis)."""
    logical = LOGICAL if "batch" in axes else LOGICAL[1:]
    logical_view = tensor.permute([axes.index(axis) for axis in logical])
    return logical_view if "batch" in axes else logical_view.unsqueeze(0)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention in float32 over [B, S, heads, D]; k/v head j serves q heads j*G ... (j+1)*G-1."""
    group = q.shape[2] // k.shape[2]
    q32, k32, v32 = (t.float().transpose(1, 2) for t in (q, k, v))  # [B, heads, S, D]
    k32, v32 = k32.repeat_interleave(group, dim=1), v32.repeat_interleave(group, dim=1)
    scores = q32 @ k32.transpose(-1, -2) / math.sqrt(q.shape[-1])
    causal = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
    weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    return (weights @ v32).transpose(1, 2).to(q.dtype)  # [B, S, heads, D]


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
    import layoutgen
    from layoutgen.ulysses.distributed import UlyssesExchange

    try:
        module = layoutgen.load(args.spec)
        spec = module.SPEC
        problem = make_problem(args, spec.has_batch)
        rows = slice(rank * args.seq_per_rank, (rank + 1) * args.seq_per_rank)
        names = [t.name for t in spec.to_attention.tensors]
        shards = [to_layout(problem[name][:, rows], spec.local).to(device) for name in names]

        exchange = UlyssesExchange(
            spec.name, None, S_max=args.seq_per_rank, H=args.heads, H_kv=args.kv_heads, D=args.head_dim,
            dtype=DTYPES[args.dtype], device=device, B=args.batch if spec.has_batch else 1,
        )  # fmt: skip
        q, k, v = (from_layout(t, spec.attention) for t in exchange.to_attention(*shards))
        out = to_layout(attention(q.cpu(), k.cpu(), v.cpu()), spec.attention).contiguous().to(device)
        mine = from_layout(exchange.from_attention(out), spec.local).cpu()

        want = attention(problem["q"], problem["k"], problem["v"])[:, rows]
        tolerance = 2 * torch.finfo(DTYPES[args.dtype]).eps * float(want.float().abs().max())
        error = float((mine.float() - want.float()).abs().max())
        ok = error <= tolerance
        print(
            f"rank {rank}/{args.world_size} {args.spec} {backend}: rows {rows.start}..{rows.stop - 1} of "
            f"{args.world_size * args.seq_per_rank}, q heads {rank * args.heads // args.world_size}.."
            f"{(rank + 1) * args.heads // args.world_size - 1} attended here, max error {error:.3g} "
            f"(tolerance {tolerance:.3g}): {'OK' if ok else 'MISMATCH'}",
            flush=True,
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if not ok:
        sys.exit(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2, help="ranks (sequence shards); default 2")
    parser.add_argument("--spec", default="ulysses_qkv_gqa", help="a ulysses spec with tensors q, k, v")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda if enough GPUs")
    parser.add_argument("--seq-per-rank", type=int, default=3, help="S_local: rows of each rank's shard")
    parser.add_argument("--batch", type=int, default=2, help="sequences, for specs with a batch axis")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=16)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.device_count() >= args.world_size else "cpu"
    if args.device == "cuda" and torch.cuda.device_count() < args.world_size:
        parser.error(f"--device cuda needs {args.world_size} GPUs, found {torch.cuda.device_count()}")
    for name in ("world_size", "seq_per_rank", "batch", "heads", "kv_heads", "head_dim"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    import layoutgen

    try:
        spec = layoutgen.load(args.spec).SPEC
    except ValueError as error:
        parser.error(f"--spec {args.spec}: {error}")
    if spec.family != "ulysses" or spec.transport.value != "all_to_all_single":
        parser.error(f"--spec {args.spec}: pick a ulysses spec with transport all_to_all_single")
    heads = {t.name: t.heads.value for t in spec.to_attention.tensors}
    if list(heads) != ["q", "k", "v"] or heads["q"] != "H" or heads["k"] != heads["v"]:
        parser.error(f"--spec {args.spec}: this example needs the tensors q (H heads), k and v; got {heads}")
    if heads["k"] == "H":
        args.kv_heads = args.heads  # the spec's k and v have as many heads as q
    if args.heads % args.world_size or args.kv_heads % args.world_size or args.heads % args.kv_heads:
        parser.error("--heads and --kv-heads must be divisible by --world-size, and --heads by --kv-heads")
    with tempfile.TemporaryDirectory() as directory:
        try:
            mp.spawn(worker, args=(args, os.path.join(directory, "store")), nprocs=args.world_size, join=True)
        except mp.ProcessExitedException as error:
            print(f"mismatch: {error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
