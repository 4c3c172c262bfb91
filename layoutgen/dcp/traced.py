"""A DCP dispatcher under `torch.compile`: calls become the `layoutgen::pack` / `layoutgen::combine`
custom ops (`layoutgen.dcp.ops`), which take tensors and ints rather than the buffers object."""

from __future__ import annotations

from typing import Any

import torch

from layoutgen.config import config_values
from layoutgen.dcp import checks


def pack_traced(owner: Any, out: Any, lse: Any, bufs: Any, config: Any, empty: Any = None, max_sum: Any = None) -> None:
    # Checked while tracing, before the lines below read them (a bad one would fail in Dynamo's or the op
    # schema's words, and a stacked [2, B, H] tensor would unpack as a pair); the op checks the tensors when it
    # runs.
    bufs = checks.check_pack_buffers(owner.spec, lse, bufs)
    pair = checks.check_max_sum_pair(max_sum)
    checks.check_pack_types(out, lse, empty, pair)
    maximum, total = pair or (None, None)
    tensors = list(bufs.tensors.values())
    shape = (owner.name, bufs.N, bufs.B_max, bufs.H, bufs.D, config_values(config))
    torch.ops.layoutgen.pack(out, lse, tensors, *shape, empty, maximum, total)


def combine_traced(
    owner: Any,
    bufs: Any,
    B: Any,
    lse_base: Any,
    out: Any,
    return_lse: Any,
    config: Any,
    scale: Any = 1.0,
    out_lse: Any = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    # Checked while tracing, before the allocation below fails on them in torch's words. scale's value is
    # checked by the op, on the number: under dynamic shapes the tracer holds a symbol, not a float.
    bufs = checks.check_buffers(owner.spec, bufs)
    B = checks.check_combine_scalars(B, bufs.B_max, lse_base, return_lse)
    checks.check_scale_type(scale)
    for name, given in (("out", out), ("out_lse", out_lse)):
        if given is not None and not isinstance(given, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(given).__name__}")
    # Allocation stays in the traced graph; the op only writes.
    heads_per_peer = bufs.H // bufs.N
    device = bufs.tensors["payload"].device
    if out is None:
        out = torch.empty((B, heads_per_peer, bufs.D), dtype=bufs.dtype, device=device)
    if out_lse is None and return_lse:
        out_lse = torch.empty((B, heads_per_peer), dtype=torch.float32, device=device)
    torch.ops.layoutgen.combine(
        list(bufs.tensors.values()),
        out,
        out_lse,
        owner.name,
        bufs.N,
        bufs.B_max,
        bufs.H,
        bufs.D,
        B,
        lse_base,
        config_values(config),
        scale,
    )
    return out, out_lse
