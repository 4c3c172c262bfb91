"""A DCP dispatcher's combine planning: the plan key, validation and config choice, and the launch.

`plan_combine` runs once per plan key; `launch` records the kernel launch the first time on a GPU and
replays it after.  The eager hot path (`Dispatcher.combine`) inlines the key.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import torch

from layoutgen.dcp import checks
from layoutgen.dcp.config import CombineConfig, default_combine_config
from layoutgen.dcp.plans import CombinePlan
from layoutgen.runtime.launch import is_jit_function, record_launches
from layoutgen.runtime.plans import plans_of
from layoutgen.runtime.tensors import OverlapGuard, check_config, check_runnable, needs_int64


def combine_key(
    owner: Any, B: Any, lse_base: Any, out: Any, return_lse: Any, config: Any, scale: Any = 1.0
) -> tuple[Any, ...]:
    """What a combine plan depends on besides the buffers; `combine` inlines it."""
    out_key = None if out is None else (out.shape, out.stride(), out.dtype, out.device)
    return (owner, B, B.__class__, lse_base, out_key, return_lse, return_lse.__class__, config, scale,
            scale.__class__)  # fmt: skip


def plan_combine(
    owner: Any, bufs: Any, B: Any, lse_base: Any, out: Any, return_lse: Any, config: Any, scale: Any = 1.0
) -> CombinePlan:
    """Validate a combine's arguments, choose its config and store the plan on `bufs`."""
    checks.check_combine_args(owner.spec, bufs, B, lse_base, out, return_lse)
    scale_value = checks.check_scale(scale)
    tensors = list(bufs.tensors.values()) + ([out] if out is not None else [])
    check_runnable(owner.combine_kernel, *tensors)
    heads_per_peer = bufs.H // bufs.N
    if config is None:
        elem_size = bufs.tensors["payload"].element_size()
        args = (owner.spec, bufs.N, heads_per_peer, bufs.D, max(B, 1), elem_size)
        resolved = owner.resolve("combine", bufs, B, lambda: default_combine_config(*args))
    else:
        check_config(config, CombineConfig)
        resolved = config
    plan = CombinePlan(
        cast(CombineConfig, resolved),
        needs_int64(*tensors),
        lse_base == "2",
        (B, heads_per_peer, bufs.D),
        bufs.dtype,
        bufs.device,
        scale_value,
        None if out is None else OverlapGuard.of(bufs.tensors.values(), (out,), disjoint=False),
    )
    plans_of(bufs)[combine_key(owner, B, lse_base, out, return_lse, config, scale)] = plan
    return plan


def launch(owner: Any, plan: CombinePlan, bufs: Any, out: torch.Tensor, out_lse: torch.Tensor | None) -> None:
    """Replay the recorded launch, recording it the first time on a GPU."""
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
