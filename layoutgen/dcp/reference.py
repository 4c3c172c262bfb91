"""Pure-torch oracle for ANY valid spec: pack, an in-process exchange, and a float64 combine.

This module is the definition of correct: the tests, `layoutgen build`'s
verification and the tuner's correctness gate all compare against it.  It reads
the layout only through `LayoutBuffers` views, which are derived from the spec.
"""

from __future__ import annotations

import torch

from layoutgen.dcp.layout import LayoutBuffers

LSE_BASES = ("e", "2")


def pack(out: torch.Tensor, lse: torch.Tensor, bufs: LayoutBuffers) -> None:
    """Scatter `out [B, H, D]` and `lse [B, H]` into the bytes the layout assigns, and no others."""
    B = out.shape[0]
    N, heads_per_peer, D = bufs.N, bufs.H // bufs.N, bufs.D
    payload = bufs.payload_view(B)
    per_peer_out = out.reshape(B, N, heads_per_peer, D).permute(1, 0, 2, 3)
    payload.copy_(per_peer_out.to(payload.dtype))
    bufs.lse_view(B).copy_(lse.reshape(B, N, heads_per_peer).permute(1, 0, 2).to(torch.float32))


def exchange(send: list[LayoutBuffers]) -> list[LayoutBuffers]:
    """What an all-to-all over the peer axis delivers: rank r receives, at peer index p, what rank p
    packed for peer r.  Every byte moves, padding included, as a transport would move it."""
    world = len(send)
    recv = [LayoutBuffers(b.spec, b.shape, {k: torch.empty_like(t) for k, t in b.tensors.items()}) for b in send]
    for name, tensor in send[0].tensors.items():
        axes = send[0].spec.payload.axes if name == "payload" else send[0].spec.stats.axes
        peer_dim = (axes or ()).index("peer")
        if tensor.shape[peer_dim] != world:
            raise ValueError(f"{world} ranks exchange buffers sized for N={tensor.shape[peer_dim]} peers")
        for dst in range(world):
            for src in range(world):
                recv[dst].tensors[name].select(peer_dim, src).copy_(send[src].tensors[name].select(peer_dim, dst))
    return recv


def merge_partials(
    partial_out: torch.Tensor, partial_lse: torch.Tensor, lse_base: str = "e"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge N partials `[N, B, h, D]` with LSEs `[N, B, h]` in float64 (docs/design.md §4).

    NaN and +inf LSEs count as empty (-inf); an empty partial contributes nothing, even when its
    payload is NaN; when every partial is empty the output is 0 and the LSE -inf.
    """
    if lse_base not in LSE_BASES:
        raise ValueError(f"lse_base must be 'e' or '2', got {lse_base!r}")
    lse = partial_lse.to(torch.float64)
    lse = torch.where(torch.isnan(lse) | (lse == float("inf")), float("-inf"), lse)
    lse_max = lse.amax(dim=0)
    all_empty = lse_max == float("-inf")
    shifted = lse - torch.where(all_empty, 0.0, lse_max)
    weight = torch.exp2(shifted) if lse_base == "2" else torch.exp(shifted)
    values = torch.where(weight[..., None] > 0, partial_out.to(torch.float64), 0.0)
    weight_sum = weight.sum(dim=0)
    merged = (weight[..., None] * values).sum(dim=0) / torch.where(all_empty, 1.0, weight_sum)[..., None]
    log_sum = torch.log2(weight_sum) if lse_base == "2" else torch.log(weight_sum)
    merged_lse = torch.where(all_empty, float("-inf"), lse_max + log_sum)
    return torch.where(all_empty[..., None], 0.0, merged), merged_lse


def combine(
    recv: LayoutBuffers, B: int, lse_base: str = "e", return_lse: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float64 `[B, H/N, D]` (and `[B, H/N]` LSE) from a receive buffer."""
    merged, merged_lse = merge_partials(recv.payload_view(B), recv.lse_view(B), lse_base)
    return merged, (merged_lse if return_lse else None)


def merge_shards(
    outs: list[torch.Tensor], lses: list[torch.Tensor], rank: int, lse_base: str = "e"
) -> tuple[torch.Tensor, torch.Tensor]:
    """What rank `rank` should end with, computed from every rank's unexchanged `out [B, H, D]` and
    `lse [B, H]` directly: the float64 merge of its own head block."""
    N = len(outs)
    heads_per_peer = outs[0].shape[1] // N
    block = slice(rank * heads_per_peer, (rank + 1) * heads_per_peer)
    return merge_partials(torch.stack([o[:, block] for o in outs]), torch.stack([l[:, block] for l in lses]), lse_base)
