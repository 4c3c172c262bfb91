"""A DCP dispatcher's combine planning: the plan key, validation and config choice, and the launch.

`plan_combine` runs once per plan key; `launch` records the kernel launch the first time on a GPU and
replays it after.  The eager hot path (`Dispatcher.combine`) inlines the key.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, cast

import torch

from layoutgen.dcp import checks
from layoutgen.dcp.config import CombineConfig, default_combine_config
from layoutgen.dcp.plans import CombinePlan
from layoutgen.runtime.launch import is_jit_function, record_launches
from layoutgen.runtime.plans import plans_of
from layoutgen.runtime.tensors import OverlapGuard, check_config, check_plain, check_runnable, describe, needs_int64


def combine_key(
    owner: Any, B: Any, lse_base: Any, out: Any, return_lse: Any, config: Any, scale: Any = 1.0
) -> tuple[Any, ...]:
    """What a combine plan depends on besides the buffers; `combine` inlines it."""
    out_key = None if out is None else (out.shape, out.stride(), out.dtype, out.device, out.is_neg())
    return (owner, B, B.__class__, lse_base, out_key, return_lse, return_lse.__class__, config, scale,
            scale.__class__)  # fmt: skip


def plan_combine(
    owner: Any, bufs: Any, B: Any, lse_base: Any, out: Any, return_lse: Any, config: Any, scale: Any = 1.0
) -> CombinePlan:
    """Validate a combine's arguments, choose its config and store the plan on `bufs`."""
    batch = checks.check_combine_args(owner.spec, bufs, B, lse_base, out, return_lse)  # an int (B may be NumPy's)
    scale_value = checks.check_scale(scale)
    tensors = list(bufs.tensors.values()) + ([out] if out is not None else [])
    check_runnable(owner.combine_kernel, *tensors)
    heads_per_peer = bufs.H // bufs.N
    if config is None:
        elem_size = bufs.tensors["payload"].element_size()
        args = (owner.spec, bufs.N, heads_per_peer, bufs.D, max(batch, 1), elem_size)
        resolved = owner.resolve("combine", bufs, batch, lambda: default_combine_config(*args))
    else:
        check_config(config, CombineConfig)
        resolved = config
    plan = CombinePlan(
        cast(CombineConfig, resolved),
        needs_int64(*tensors),
        lse_base == "2",
        (batch, heads_per_peer, bufs.D),
        bufs.dtype,
        bufs.device,
        scale_value,
        staged=out is not None and checks.wide_out_offsets(out),
        guard=None if out is None else OverlapGuard.of(bufs.tensors.values(), (out,), disjoint=False),
    )
    plans_of(bufs)[combine_key(owner, B, lse_base, out, return_lse, config, scale)] = plan
    return plan


def launch(owner: Any, plan: CombinePlan, bufs: Any, out: torch.Tensor, out_lse: torch.Tensor | None) -> None:
    """Replay the recorded launch, recording it the first time on a GPU."""
    if plan.staged:
        # Widening the kernel's head and dim offsets to 64 bits would change its source hash, and with it every
        # tuned combine entry on every card; a view that needs it (over 8 GiB of bf16 between its first and last
        # head) pays one copy instead.
        stage = torch.empty(plan.out_shape, dtype=plan.dtype, device=plan.device)
        _launch(owner, plan, bufs, stage, out_lse)
        out.copy_(stage)
        return
    _launch(owner, plan, bufs, out, out_lse)


def _launch(owner: Any, plan: CombinePlan, bufs: Any, out: torch.Tensor, out_lse: torch.Tensor | None) -> None:
    direct = plan.direct
    if direct is not None:
        direct((*bufs.tensors.values(), out, out_lse))
        return
    args = (bufs, plan.out_shape[0], out, out_lse, plan.lse_base_2, plan.config, plan.index_64)
    launcher = owner.launch_combine if plan.scale == 1.0 else functools.partial(owner.launch_combine, scale=plan.scale)
    if not plan.recorded and out.is_cuda and is_jit_function(owner.combine_kernel):
        plan.recorded = True
        tensors = (*bufs.tensors.values(), out, out_lse)
        varying = (len(bufs.tensors), len(bufs.tensors) + 1)  # out and out_lse
        plan.direct = record_launches(owner.combine_kernel, launcher, args, tensors, varying)
        if plan.direct is not None:
            plan.direct(tensors)
            return
    launcher(*args)


def check_out_lse(plan: CombinePlan, buffers: Iterable[torch.Tensor], out: torch.Tensor, out_lse: Any) -> None:
    """A caller's `out_lse`: a contiguous float32 [B, H/N] tensor on the plan's device that shares memory with
    neither `out` nor the buffers combine reads.  Its geometry is fixed by the plan (checked first), so the
    plan keeps the overlap check: 0.7 us a call, against 5 us for measuring every span again (CI-like CPU)."""
    if isinstance(out_lse, torch.Tensor) and out_lse.is_neg():
        check_plain("out_lse", out_lse)  # raises: the kernel would write the bytes under a negated view
    if (
        not isinstance(out_lse, torch.Tensor)
        or tuple(out_lse.shape) != plan.out_shape[:2]
        or out_lse.dtype != torch.float32
        or not out_lse.is_contiguous()
        or out_lse.device != plan.device
    ):
        given = describe(out_lse) if isinstance(out_lse, torch.Tensor) else type(out_lse).__name__
        raise ValueError(
            f"out_lse must be a contiguous float32 tensor of shape {list(plan.out_shape[:2])} on {plan.device}; "
            f"got {given}"
        )
    if plan.lse_guard is None:
        plan.lse_guard = OverlapGuard.of(buffers, (out, out_lse), disjoint=True)
    if plan.lse_guard.may_overlap((out, out_lse)):
        raise ValueError(
            "out_lse must not share memory with out or the buffers combine reads; pass a tensor of its own "
            f"(e.g. torch.empty); got {describe(out_lse)}"
        )
