"""The argument checks of a `DcpExchange` call (`layoutgen.dcp.distributed`): once per shape, stride, dtype
and device of the inputs; every error names the argument, what was expected and what was given."""

from __future__ import annotations

import math
from typing import Any

import torch

from layoutgen.dcp.checks import max_sum_pair
from layoutgen.runtime.tensors import describe, overlaps_itself


def check_call_inputs(
    exchange: Any, out: Any, lse: Any, empty: Any, max_sum: Any, merged_out: Any = None, merged_lse_out: Any = None
) -> tuple[int, tuple[int, ...]]:
    """Validate a call's inputs (once per shape, stride, dtype and device); (rows, out's leading shape)."""
    # A (max, sum) pair only (`max_sum_pair`): a non-pair gets no key, and the checks below name it.
    pair = max_sum is None or max_sum_pair(max_sum) is not None
    try:
        stats = [lse] if max_sum is None else list(max_sum)
        key = (
            None
            if not pair
            else (
                out.shape,
                out.stride(),
                out.dtype,
                out.device,
                *((t.shape, t.stride(), t.dtype, t.device) for t in stats),
                None if empty is None else (empty.shape, empty.stride(), empty.dtype, empty.device),
                lse is None,
                max_sum is None,
                None
                if merged_out is None
                else (merged_out.shape, merged_out.stride(), merged_out.dtype, merged_out.device),
                None
                if merged_lse_out is None
                else (merged_lse_out.shape, merged_lse_out.stride(), merged_lse_out.dtype, merged_lse_out.device),
            )
        )
    except (AttributeError, TypeError):
        key = None
    if key is not None and key in exchange._checked_inputs:
        return math.prod(out.shape[:-2]), tuple(out.shape[:-2])
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor [B, H={exchange.H}, D={exchange.D}], got {type(out).__name__}")
    if out.dim() not in (3, 4) or out.shape[-2] != exchange.H or out.shape[-1] != exchange.D:
        raise ValueError(
            f"out must have shape [B, H={exchange.H}, D={exchange.D}] or [R, T, H={exchange.H}, D={exchange.D}]; got {describe(out)}"
        )
    lead = tuple(out.shape[:-2])
    batch = math.prod(lead)
    if batch > exchange.B_max:
        raise ValueError(
            f"out has B={batch} rows{'' if len(lead) == 1 else f' ({lead[0]} x {lead[1]})'} but this DcpExchange "
            f"was built for B_max={exchange.B_max}; build it with a larger B_max"
        )
    if out.dtype != exchange.dtype:
        raise TypeError(f"out must be {exchange.dtype} (the dtype this DcpExchange was built for); got {describe(out)}")
    if out.device != exchange.device:
        raise ValueError(
            f"out must be on {exchange.device} (the device this DcpExchange was built for); got {describe(out)}"
        )
    if (lse is None) == (max_sum is None):
        raise TypeError("pass exactly one of lse and max_sum=(max, sum)")
    if max_sum is not None and max_sum_pair(max_sum) is None:
        raise TypeError(f"max_sum must be a (max, sum) pair of float32 tensors; got {type(max_sum).__name__}")
    if max_sum is not None and exchange.lse_base == "2" and not exchange.spec.max_sum:
        raise ValueError(
            f"spec '{exchange.spec.name}' keeps LSEs, and pack turns (max, sum) into max + ln(sum) (natural log): "
            "with lse_base '2' pass lse (or use a max_sum spec, whose combine works in base 2)"
        )
    names = ("lse",) if max_sum is None else ("max_sum[0] (max)", "max_sum[1] (sum)")
    want = f"[B={lead[0]}, H={exchange.H}]" if len(lead) == 1 else f"[R={lead[0]}, T={lead[1]}, H={exchange.H}]"
    for label, tensor in zip(names, [lse] if max_sum is None else list(max_sum), strict=True):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{label} must be a float32 torch.Tensor {want}, got {type(tensor).__name__}")
        if tuple(tensor.shape) != (*lead, exchange.H):
            raise ValueError(f"{label} must have shape {want}; got {describe(tensor)}")
        if tensor.dtype != torch.float32:
            raise TypeError(f"{label} must be float32; got {describe(tensor)}")
        if tensor.device != exchange.device:
            raise ValueError(
                f"{label} must be on {exchange.device} (the device this DcpExchange was built for); got {describe(tensor)}"
            )
    if empty is not None and (
        not isinstance(empty, torch.Tensor) or empty.dtype != torch.bool or tuple(empty.shape) != lead[:1]
    ):
        # The module's pack's exception types: TypeError for what it is, ValueError for its shape.
        wrong_type = not isinstance(empty, torch.Tensor) or empty.dtype != torch.bool
        got = describe(empty) if isinstance(empty, torch.Tensor) else type(empty).__name__
        raise (TypeError if wrong_type else ValueError)(
            f"empty must be None or a torch.bool tensor [R={lead[0]}] (one flag per request); got {got}"
        )
    if empty is not None and empty.device != exchange.device:
        raise ValueError(
            f"empty must be on {exchange.device} (the device this DcpExchange was built for); got {describe(empty)}"
        )
    if merged_out is not None:
        check_merged_out(exchange, merged_out, lead)
    if merged_lse_out is not None:
        check_merged_lse_out(exchange, merged_lse_out, lead)
    if key is not None:
        exchange._checked_inputs.add(key)
    return int(batch), lead


def check_merged_out(exchange: Any, merged_out: Any, lead: tuple[int, ...]) -> None:
    """`merged_out` must be a tensor of the result's shape, `out`'s dtype and device, that combine can write
    as [B, H/N, D] rows."""
    h, D = exchange.heads_per_rank, exchange.D
    want = f"[{', '.join(str(n) for n in (*lead, h, D))}] ({'B' if len(lead) == 1 else 'R, T'}, H/N={h}, D={D})"
    if not isinstance(merged_out, torch.Tensor):
        raise TypeError(f"merged_out must be None or a torch.Tensor {want}, got {type(merged_out).__name__}")
    if tuple(merged_out.shape) != (*lead, h, D):
        raise ValueError(f"merged_out must have shape {want}; got {describe(merged_out)}")
    if merged_out.dtype != exchange.dtype or merged_out.device != exchange.device:
        raise TypeError(
            f"merged_out must be {exchange.dtype} on {exchange.device} (out's dtype and device); got {describe(merged_out)}"
        )
    if overlaps_itself(merged_out):
        raise ValueError(
            "merged_out must not overlap itself (e.g. an expand()ed view: programs would race to write one "
            f"element); got {describe(merged_out)}"
        )
    if len(lead) == 2 and not _views_as_rows(merged_out, math.prod(lead), h, D):
        raise ValueError(
            f"merged_out [R, T, H/N, D] must be viewable as [R*T={math.prod(lead)}, {h}, {D}] (its R and T axes "
            f"one stride apart, e.g. contiguous); got {describe(merged_out)}"
        )


def check_merged_lse_out(exchange: Any, merged_lse_out: Any, lead: tuple[int, ...]) -> None:
    """`merged_lse_out` must be a contiguous float32 tensor of the LSE's shape on the exchange's device (combine
    writes it as [B, H/N] words)."""
    h = exchange.heads_per_rank
    want = f"[{', '.join(str(n) for n in (*lead, h))}] ({'B' if len(lead) == 1 else 'R, T'}, H/N={h})"
    if not isinstance(merged_lse_out, torch.Tensor):
        raise TypeError(
            f"merged_lse_out must be None or a float32 torch.Tensor {want}, got {type(merged_lse_out).__name__}"
        )
    if (
        tuple(merged_lse_out.shape) != (*lead, h)
        or merged_lse_out.dtype != torch.float32
        or not merged_lse_out.is_contiguous()
        or merged_lse_out.device != exchange.device
    ):
        raise ValueError(
            f"merged_lse_out must be a contiguous float32 tensor {want} on {exchange.device}; got {describe(merged_lse_out)}"
        )


def _views_as_rows(tensor: torch.Tensor, rows: int, h: int, D: int) -> bool:
    try:
        tensor.view(rows, h, D)
    except RuntimeError:
        return False
    return True
