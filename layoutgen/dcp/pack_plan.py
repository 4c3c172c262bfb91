"""A DCP dispatcher's pack planning: the plan key, validation and config choice, and the launch.

`plan_pack` runs once per plan key (every argument validated, `config=None` resolved, the plan stored on
the buffers object); `launch` records the kernel launch the first time on a GPU and replays it after.
The eager hot path (`Dispatcher.pack`) inlines the key and only calls in here on a miss.
"""

from __future__ import annotations

import functools
from typing import Any, cast

from layoutgen.dcp import checks
from layoutgen.dcp.config import PackConfig, check_pack_tile, default_pack_config, pack_pairs_axis
from layoutgen.dcp.plans import PackPlan, fit_grid
from layoutgen.runtime.launch import is_jit_function, record_launches
from layoutgen.runtime.plans import PLANS, plans_of
from layoutgen.runtime.tensors import OverlapGuard, check_config, check_runnable, needs_int64


def pack_key(owner: Any, out: Any, lse: Any, config: Any) -> tuple[Any, ...]:
    """What a pack plan depends on besides the buffers (whose dict holds the plans); `pack` inlines it.
    A tensor's negation bit is in the key: a `x.conj().imag` view has a plain tensor's geometry, and a hit
    skips the check that refuses it."""
    return (owner, out.shape, out.stride(), out.dtype, out.device, out.is_neg(), lse.shape, lse.stride(),
            lse.dtype, lse.device, lse.is_neg(), config)  # fmt: skip


def pack_v2_key(owner: Any, out: Any, first: Any, sums: Any, empty: Any, config: Any) -> tuple[Any, ...]:
    """`pack_key` for a call with an empty mask or (max, sum) inputs."""
    return (owner, out.shape, out.stride(), out.dtype, out.device, out.is_neg(), first.shape, first.stride(),
            first.dtype, first.device, first.is_neg(),
            None if sums is None else (sums.shape, sums.stride(), sums.dtype, sums.device, sums.is_neg()),
            None if empty is None else (empty.shape, empty.stride(), empty.dtype, empty.device), config)  # fmt: skip


def key_of(owner: Any, out: Any, lse: Any, config: Any, empty: Any, max_sum: Any) -> tuple[Any, ...]:
    if empty is None and max_sum is None:
        return pack_key(owner, out, lse, config)
    if max_sum is not None and lse is not None:
        return ("lse and max_sum",)  # never planned: plan_pack refuses the pair on every call
    first, sums = (lse, None) if max_sum is None else max_sum
    return pack_v2_key(owner, out, first, sums, empty, config)


def plan_pack(
    owner: Any, out: Any, lse: Any, bufs: Any, config: Any, empty: Any = None, max_sum: Any = None
) -> PackPlan:
    """Validate a pack's arguments, choose its config and store the plan on `bufs`."""
    spec = owner.spec
    batch = checks.check_pack_args(spec, out, lse, bufs, empty, max_sum)
    inputs = [out, *([lse] if max_sum is None else list(max_sum)), *([] if empty is None else [empty])]
    check_runnable(owner.pack_kernel, *inputs, *bufs.tensors.values())
    if config is None:
        elem_size = bufs.tensors["payload"].element_size()
        args = (spec, bufs.N, bufs.H // bufs.N, bufs.D, max(batch, 1), elem_size)
        peers = bufs.N if pack_pairs_axis(spec) == "batch" else None
        resolved = fit_grid(owner.resolve("pack", bufs, batch, lambda: default_pack_config(*args)), batch, peers)
    else:
        check_config(config, PackConfig)
        resolved = config
    # Raises for an explicit config (and would for a wrong default).  `resolve` held a forced or tuned config to
    # the same rule (PackConfig.check_problem): it raised for a forced one, warned and took the default for a
    # tuned one, since the database must not break a call.
    check_pack_tile(spec, bufs.D, resolved)
    plan = PackPlan(batch, cast(PackConfig, resolved), needs_int64(*inputs, *bufs.tensors.values()))
    plan.guard = OverlapGuard.of(bufs.tensors.values(), inputs, disjoint=False)
    plans_of(bufs)[key_of(owner, out, lse, config, empty, max_sum)] = plan
    return plan


def launch(owner: Any, plan: PackPlan, out: Any, lse: Any, bufs: Any) -> None:
    """A plain pack (lse in, no mask): replay the recorded launch, recording it the first time on a GPU."""
    args = (out, lse, bufs, plan.batch, plan.config, plan.index_64)
    if not plan.recorded and out.is_cuda and is_jit_function(owner.pack_kernel):
        plan.recorded = True
        tensors = (out, lse, *bufs.tensors.values())
        plan.direct = record_launches(owner.pack_kernel, owner.launch_pack, args, tensors, (0, 1))
        if plan.direct is not None:
            plan.direct(tensors)
            return
    owner.launch_pack(*args)


def pack_v2(owner: Any, out: Any, lse: Any, bufs: Any, config: Any, empty: Any, max_sum: Any) -> None:
    """pack with an `empty` mask and/or (max, sum) inputs: the call's tensors are (out, lse or max, sum or
    lse, empty or lse, *buffers); unused kernel pointers get the first statistics tensor."""
    try:
        # Only a (max, sum) pair has a plan (plan_pack refuses anything else); lse and max_sum together are
        # refused on every call too.
        first, sums = (lse, None) if max_sum is None else checks.max_sum_pair(max_sum) or (None, None)
        plan = (
            None
            if (max_sum is not None and lse is not None) or first is None
            else bufs.__dict__[PLANS][pack_v2_key(owner, out, first, sums, empty, config)]
        )
    except (AttributeError, KeyError, TypeError, ValueError):
        plan = None
    if plan is None or plan.may_overlap(
        (out, first, *(() if sums is None else (sums,)), *(() if empty is None else (empty,)))
    ):
        # Planned outside the handler: a refusal does not read "during handling of KeyError".
        plan = plan_pack(owner, out, lse, bufs, config, empty, max_sum)
        first, sums = (lse, None) if max_sum is None else max_sum
    tensors = (out, first, first if sums is None else sums, first if empty is None else empty, *bufs.tensors.values())
    direct = plan.direct
    if direct is not None:
        direct(tensors)
        return
    launcher = functools.partial(owner.launch_pack, sums=sums, empty=empty)
    args = (out, first, bufs, plan.batch, plan.config, plan.index_64)
    if not plan.recorded and out.is_cuda and is_jit_function(owner.pack_kernel):
        plan.recorded = True
        plan.direct = record_launches(owner.pack_kernel, launcher, args, tensors, (0, 1, 2, 3))
        if plan.direct is not None:
            plan.direct(tensors)
            return
    launcher(*args)
