"""Pure-torch oracle for ANY valid spec: pack, an in-process exchange, and a float64 combine.

This module is the definition of correct: the tests, `layoutgen build`'s
verification and the tuner's correctness gate all compare against it.  It reads
the layout only through `LayoutBuffers` views, which are derived from the spec.

The contract (docs/design.md §4.1-§4.3; the project brief's §8.3):

* pack takes `out [B, H, D]` or `[R, T, H, D]` (row r*T + t) and either `lse`
  (`[B, H]` / `[R, T, H]`, float32) or `max_sum=(max, sum)` of that shape.  An
  `lse`-form spec stores the LSE (from `max_sum`: `max + log(sum)`, -inf where
  `sum <= 0` or NaN); a `max_sum` spec stores max and sum (from `lse`: max = lse,
  sum = 1).  `empty [R]` (bool) marks requests with nothing on this rank: all
  their rows get +0.0 payload and LSE -inf (max -inf, sum 0).
* combine merges the N partials in float64: an entry whose LSE (or max) is NaN
  or +inf, or whose sum is NaN, <= 0 or +inf, is empty; `w_i = s_i * exp(m_i - M)`
  (`exp2` in base 2, s_i = 1 for the lse form); an empty partial contributes
  nothing whatever its payload, and so does one whose share `w_i / Σ w`
  underflows to 0 in float32, the kernels' arithmetic (a stat about 104 or
  more below the largest, base e); all empty gives 0 and LSE -inf; `scale`
  multiplies the merged output.
* fp8 specs (`layoutgen.dcp.quant`): pack quantises each row's payload per block of
  `scale_block` elements (the rows of empty requests as +0.0: scale 1, zero codes) and
  stores one float32 scale per block; combine dequantises (`q * scale`, float32)
  before the float64 merge.
"""

from __future__ import annotations

import torch

from layoutgen.dcp import quant
from layoutgen.dcp.layout import LayoutBuffers, buffer_shapes

LSE_BASES = ("e", "2")
INF = float("inf")


def rows(tensor: torch.Tensor, trailing: int) -> torch.Tensor:
    """`tensor` with its leading (request, token) dims merged into rows: `[R, T, *rest] -> [R*T, *rest]`
    (a copy when the strides do not allow a view); `trailing` is len(rest)."""
    if tensor.dim() == trailing + 1:
        return tensor
    return tensor.reshape(-1, *tensor.shape[tensor.dim() - trailing :])


def row_flags(empty: torch.Tensor | None, count: int, tokens: int) -> torch.Tensor:
    """Per row (r*T + t) whether its request is empty: `empty [R]` repeated T times (all False when None)."""
    if empty is None:
        return torch.zeros(count, dtype=torch.bool)
    return empty.to(torch.bool).cpu().repeat_interleave(tokens)


def lse_from_max_sum(maximum: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """float32 `max + log(sum)` computed in float64 (-inf where `sum` is NaN or <= 0): what pack stores when an
    `lse`-form spec is packed from `max_sum`."""
    lse = maximum.to(torch.float64) + torch.log(total.to(torch.float64))
    return torch.where(total > 0, lse, -INF).to(torch.float32)


def pack(
    out: torch.Tensor,
    lse: torch.Tensor | None,
    bufs: LayoutBuffers,
    *,
    empty: torch.Tensor | None = None,
    max_sum: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Scatter `out` and its statistics into the bytes the layout assigns, and no others (see the module doc)."""
    if (lse is None) == (max_sum is None):
        raise ValueError("pass exactly one of lse and max_sum")
    tokens = out.shape[1] if out.dim() == 4 else 1
    flat_out = rows(out, 2)
    B = flat_out.shape[0]
    N, heads_per_peer, D = bufs.N, bufs.H // bufs.N, bufs.D
    masked = row_flags(empty, B, tokens).to(out.device)

    def per_peer(stat: torch.Tensor) -> torch.Tensor:  # [B, H] -> [N, B, H/N]
        return rows(stat, 1).reshape(B, N, heads_per_peer).permute(1, 0, 2).to(torch.float32)

    payload = bufs.payload_view(B)
    if bufs.spec.fp8:
        values = flat_out.reshape(B, N, heads_per_peer, D).permute(1, 0, 2, 3).to(torch.float32)
        values = torch.where(masked[None, :, None, None], 0.0, values)
        codes, scales = quant.quantise(values, bufs.spec.scale_block_of(D), payload.dtype)
        payload.copy_(codes)
        bufs.scale_view(B).copy_(scales)
    else:
        per_peer_out = flat_out.reshape(B, N, heads_per_peer, D).permute(1, 0, 2, 3).to(payload.dtype)
        payload.copy_(torch.where(masked[None, :, None, None], torch.zeros((), dtype=payload.dtype), per_peer_out))
    row_masked = masked[None, :, None]
    if bufs.spec.max_sum:
        if max_sum is not None:
            maximum, total = per_peer(max_sum[0]), per_peer(max_sum[1])
        else:
            assert lse is not None
            maximum = per_peer(lse)
            total = torch.ones_like(maximum)
        bufs.max_view(B).copy_(torch.where(row_masked, -INF, maximum))
        bufs.sum_view(B).copy_(torch.where(row_masked, 0.0, total))
        return
    if max_sum is not None:
        words = per_peer(lse_from_max_sum(rows(max_sum[0], 1), rows(max_sum[1], 1)))
    else:
        assert lse is not None
        words = per_peer(lse)
    bufs.lse_view(B).copy_(torch.where(row_masked, -INF, words))


def exchange(send: list[LayoutBuffers]) -> list[LayoutBuffers]:
    """What an all-to-all over the peer axis delivers: rank r receives, at peer index p, what rank p
    packed for peer r.  Every byte moves, padding included, as a transport would move it."""
    world = len(send)
    recv = [LayoutBuffers(b.spec, b.shape, {k: torch.empty_like(t) for k, t in b.tensors.items()}) for b in send]
    layout = buffer_shapes(send[0].spec, send[0].shape)
    for name, tensor in send[0].tensors.items():
        peer_dim = layout[name][0].index("peer")  # each buffer's own axes: payload, stats, fp8 scales
        if tensor.shape[peer_dim] != world:
            raise ValueError(f"{world} ranks exchange buffers sized for N={tensor.shape[peer_dim]} peers")
        for dst in range(world):
            for src in range(world):
                recv[dst].tensors[name].select(peer_dim, src).copy_(send[src].tensors[name].select(peer_dim, dst))
    return recv


def _merge(
    partial_out: torch.Tensor,
    maximum: torch.Tensor,
    total: torch.Tensor,
    lse_base: str,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The merge of N partials `[N, B, h, D]` with float64 (max, sum) `[N, B, h]` whose empty entries are
    already (-inf, 0)."""
    if lse_base not in LSE_BASES:
        raise ValueError(f"lse_base must be 'e' or '2', got {lse_base!r}")
    top = maximum.amax(dim=0)
    all_empty = top == -INF
    shifted = maximum - torch.where(all_empty, 0.0, top)
    weight = total * (torch.exp2(shifted) if lse_base == "2" else torch.exp(shifted))
    values = torch.where(_float32_share(shifted, total, lse_base)[..., None] > 0, partial_out.to(torch.float64), 0.0)
    weight_sum = weight.sum(dim=0)
    merged = (weight[..., None] * values).sum(dim=0) / torch.where(all_empty, 1.0, weight_sum)[..., None]
    log_sum = torch.log2(weight_sum) if lse_base == "2" else torch.log(weight_sum)
    merged_lse = torch.where(all_empty, -INF, top + log_sum)
    return torch.where(all_empty[..., None], 0.0, merged) * scale, merged_lse


def _float32_share(shifted: torch.Tensor, total: torch.Tensor, lse_base: str) -> torch.Tensor:
    """Each partial's share `w_i / Σ w` in float32, as the kernels compute it (`w_i = s_i * exp(m_i - M)`,
    a row whose Σ w is below 2^-64 lifted by 2^64, then times `1 / Σ w`): a partial whose share underflows to
    0 (its stat about 104 or more below M in base e, 149 in base 2) contributes nothing, like an empty one,
    whatever its payload."""
    shifted32, total32 = shifted.to(torch.float32), total.to(torch.float32)
    weight = total32 * (torch.exp2(shifted32) if lse_base == "2" else torch.exp(shifted32))
    weight_sum = weight.sum(dim=0)
    lift = torch.where(weight_sum < 2.0**-64, 2.0**64, 1.0)
    return (weight * lift) * (1.0 / torch.where(weight_sum > 0, weight_sum * lift, 1.0))


def merge_partials(
    partial_out: torch.Tensor, partial_lse: torch.Tensor, lse_base: str = "e", scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge N partials `[N, B, h, D]` with LSEs `[N, B, h]` in float64 (docs/design.md §4).

    NaN and +inf LSEs count as empty (-inf); an empty partial contributes nothing, even when its
    payload is NaN; when every partial is empty the output is 0 and the LSE -inf.  `scale` multiplies
    the merged output (not the LSE).
    """
    lse = partial_lse.to(torch.float64)
    lse = torch.where(torch.isnan(lse) | (lse == INF), -INF, lse)
    return _merge(partial_out, lse, torch.ones_like(lse), lse_base, scale)


def sanitize_max_sum(maximum: torch.Tensor, total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (max, sum) with every empty entry as (-inf, 0): a NaN or +inf max, or a NaN, non-positive or
    +inf sum, makes an entry empty (an infinite sum, like an infinite LSE, carries no usable weight)."""
    maximum, total = maximum.to(torch.float64), total.to(torch.float64)
    empty = torch.isnan(maximum) | (maximum == INF) | ~(total > 0) | (total == INF)
    return torch.where(empty, -INF, maximum), torch.where(empty, 0.0, total)


def merge_max_sum(
    partial_out: torch.Tensor,
    partial_max: torch.Tensor,
    partial_sum: torch.Tensor,
    lse_base: str = "e",
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge N normalised partials `[N, B, h, D]` with (max, sum) stats `[N, B, h]` in float64 (§8.3):
    `M = max m_i` over the non-empty entries, `w_i = s_i * exp(m_i - M)` (base 2: `s_i * 2^(m_i - M)`),
    `out = scale * Σ w_i o_i / Σ w_i` and `lse = M + log(Σ w_i)` in the same base."""
    maximum, total = sanitize_max_sum(partial_max, partial_sum)
    return _merge(partial_out, maximum, total, lse_base, scale)


def received_partials(recv: LayoutBuffers, B: int) -> torch.Tensor:
    """The N partials `[N, B, H/N, D]` of a receive buffer as combine reads them: the payload, dequantised
    (`q * scale`, float32) for an fp8 spec."""
    if recv.spec.fp8:
        return quant.dequantise(recv.payload_view(B), recv.scale_view(B))
    return recv.payload_view(B)


def combine(
    recv: LayoutBuffers, B: int, lse_base: str = "e", return_lse: bool = False, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float64 `[B, H/N, D]` (and `[B, H/N]` LSE) from a receive buffer, whichever stats form its spec has."""
    partials = received_partials(recv, B)
    if recv.spec.max_sum:
        merged, merged_lse = merge_max_sum(partials, recv.max_view(B), recv.sum_view(B), lse_base, scale)
    else:
        merged, merged_lse = merge_partials(partials, recv.lse_view(B), lse_base, scale)
    return merged, (merged_lse if return_lse else None)


def merge_shards(
    outs: list[torch.Tensor], lses: list[torch.Tensor], rank: int, lse_base: str = "e", scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """What rank `rank` should end with, computed from every rank's unexchanged `out [B, H, D]` (or
    `[R, T, H, D]`) and `lse [B, H]` (or `[R, T, H]`) directly: the float64 merge of its own head block,
    `[rows, H/N, D]`."""
    N = len(outs)
    outs, lses = [rows(o, 2) for o in outs], [rows(lse, 1) for lse in lses]
    heads_per_peer = outs[0].shape[1] // N
    block = slice(rank * heads_per_peer, (rank + 1) * heads_per_peer)
    return merge_partials(
        torch.stack([o[:, block] for o in outs]), torch.stack([lse[:, block] for lse in lses]), lse_base, scale
    )


def merge_shards_max_sum(
    outs: list[torch.Tensor],
    maxes: list[torch.Tensor],
    sums: list[torch.Tensor],
    rank: int,
    lse_base: str = "e",
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`merge_shards` for ranks that hold (max, sum) statistics."""
    N = len(outs)
    outs, maxes, sums = [rows(o, 2) for o in outs], [rows(m, 1) for m in maxes], [rows(s, 1) for s in sums]
    heads_per_peer = outs[0].shape[1] // N
    block = slice(rank * heads_per_peer, (rank + 1) * heads_per_peer)
    return merge_max_sum(
        torch.stack([o[:, block] for o in outs]),
        torch.stack([m[:, block] for m in maxes]),
        torch.stack([s[:, block] for s in sums]),
        lse_base,
        scale,
    )


def masked_inputs(
    out: torch.Tensor, stats: list[torch.Tensor], empty: torch.Tensor | None
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """What a pack with `empty` stands for, as plain inputs: the rows of empty requests with a +0.0 payload
    and their stats -inf (for (max, sum): `stats` = [max, sum] -> (-inf, 0)); flattened to rows."""
    tokens = out.shape[1] if out.dim() == 4 else 1
    flat_out = rows(out, 2)
    masked = row_flags(empty, flat_out.shape[0], tokens).to(out.device)
    new_out = torch.where(masked[:, None, None], torch.zeros((), dtype=out.dtype), flat_out)
    fills = (-INF, 0.0)
    new_stats = [torch.where(masked[:, None], fills[i], rows(stat, 1)) for i, stat in enumerate(stats)]
    return new_out, new_stats
