"""The hot path of a DCP generated module's `pack` / `combine`.

A `Dispatcher` per generated module turns a call into a cached plan (`layoutgen.runtime.plans`): the
first call for a (shapes, strides, dtypes, devices, config) key validates every argument, resolves
`config=None` (`layoutgen.runtime.configs`: forced / tuned / default) and records the kernel launch
(`layoutgen.runtime.launch`); later calls with that key do one dict lookup on the buffers object and
launch.  The planning lives in `layoutgen.dcp.pack_plan` and `layoutgen.dcp.combine_plan`, the plans in
`layoutgen.dcp.plans`.

Under `torch.compile` the dispatcher routes through the `layoutgen::pack` / `layoutgen::combine` custom
ops instead (`layoutgen.dcp.traced`, `layoutgen.dcp.ops`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from layoutgen.dcp import checks, combine_plan, pack_plan, traced
from layoutgen.dcp.config import CombineConfig, PackConfig
from layoutgen.dcp.layout import LayoutBuffers
from layoutgen.dcp.plans import (
    DTYPE_NAMES,
    MAX_GRID_Y,
    CombinePlan,
    LaunchFunction,
    PackPlan,
    buffers_from_tensors,
    fit_grid,
    remember_buffers,
)
from layoutgen.dcp.spec import DcpSpec
from layoutgen.runtime import configs
from layoutgen.runtime.plans import PLANS as _PLANS

__all__ = [
    "MAX_GRID_Y",
    "CombinePlan",
    "Dispatcher",
    "PackPlan",
    "buffers_from_tensors",
    "dispatcher",
    "fit_grid",
    "remember_buffers",
]

_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_increment_version = torch._C._increment_version  # torch.autograd.graph.increment_version, without its wrapper
_dispatchers: dict[str, Dispatcher] = {}


def dispatcher(name: str) -> Dispatcher:
    """The dispatcher of the generated module registered under `name` (the custom ops use this)."""
    try:
        return _dispatchers[name]
    except KeyError:
        raise ValueError(f"no generated layoutgen module named {name!r} has been imported in this process") from None


class Dispatcher:
    """Validation, config choice and launch for one generated module."""

    def __init__(
        self,
        name: str,
        spec: DcpSpec,
        spec_hash: str,
        source_hashes: dict[str, str],
        pack_kernel: Any,
        launch_pack: LaunchFunction,
        combine_kernel: Any,
        launch_combine: LaunchFunction,
    ) -> None:
        if spec_hash != spec.layout_hash():
            raise ValueError(f"generated module {name} is stale: SPEC_HASH does not match its SPEC; rebuild it")
        self.name = name
        self.spec = spec
        self.spec_hash = spec_hash
        self.source_hashes = source_hashes
        self.pack_kernel = pack_kernel
        self.launch_pack = launch_pack
        self.combine_kernel = combine_kernel
        self.launch_combine = launch_combine
        _dispatchers[name] = self

    def __repr__(self) -> str:
        return f"Dispatcher({self.name!r}, spec={self.spec.name!r})"

    def resolve(self, kernel: str, bufs: LayoutBuffers, size: int, default: Callable[[], Any]) -> Any:
        """`config=None`: forced, tuned for this shape and device, or the heuristic default."""
        from layoutgen.dcp import FAMILY

        return configs.resolve_config(
            FAMILY.name,
            self.spec.name,
            FAMILY.kernel(kernel),
            bufs.device,
            {"N": bufs.N, "Hl": bufs.H // bufs.N, "D": bufs.D},
            DTYPE_NAMES[bufs.dtype],
            size,
            self.spec_hash,
            self.source_hashes[kernel],
            default,
            self.spec,
        )

    # pack ----------------------------------------------------------------------------------------------------

    def pack(
        self,
        out: Any,
        lse: Any,
        bufs: Any,
        config: PackConfig | None = None,
        empty: Any = None,
        max_sum: Any = None,
    ) -> None:
        # Inference (no_grad / inference_mode) pays one call; in grad mode a plain pack pays two attribute reads
        # (timed on the CI-like CPU, Python 3.11: 2.1 us for a call of refuse_gradients each time, 0.6 for these).
        if _grad_enabled():
            try:
                refuse = max_sum is not None or out.requires_grad or lse.requires_grad
            except AttributeError:  # not tensors: the argument checks name them
                refuse = False
            if refuse:
                checks.refuse_gradients(out, lse, max_sum)
        if _is_compiling():
            traced.pack_traced(self, out, lse, bufs, config, empty, max_sum)
            return
        if empty is not None or max_sum is not None:
            pack_plan.pack_v2(self, out, lse, bufs, config, empty, max_sum)
            return
        # The same lookup as pack_plan() (pack_plan.pack_key inlined): the eager hot path is one dict hit.
        try:
            plan = bufs.__dict__[_PLANS][
                (
                    self,
                    out.shape,
                    out.stride(),
                    out.dtype,
                    out.device,
                    out.is_neg(),
                    lse.shape,
                    lse.stride(),
                    lse.dtype,
                    lse.device,
                    lse.is_neg(),
                    config,
                )
            ]
        except (AttributeError, KeyError, TypeError):
            plan = None
        if plan is None or plan.may_overlap((out, lse)):  # planned outside the handler, not "during handling of"
            plan = pack_plan.plan_pack(self, out, lse, bufs, config)
        direct = plan.direct
        if direct is not None:
            direct((out, lse, *bufs.tensors.values()))
        else:
            pack_plan.launch(self, plan, out, lse, bufs)

    def pack_plan(
        self,
        out: Any,
        lse: Any,
        bufs: Any,
        config: PackConfig | None = None,
        empty: Any = None,
        max_sum: Any = None,
    ) -> PackPlan:
        """The cached plan for these arguments (validating them the first time): shows the config in use."""
        try:
            plan: PackPlan | None = bufs.__dict__[_PLANS][pack_plan.key_of(self, out, lse, config, empty, max_sum)]
        except (AttributeError, KeyError, TypeError, ValueError):
            plan = None
        return pack_plan.plan_pack(self, out, lse, bufs, config, empty, max_sum) if plan is None else plan

    # combine -------------------------------------------------------------------------------------------------

    def combine(
        self,
        bufs: Any,
        B: Any,
        lse_base: Any = "e",
        out: Any = None,
        return_lse: Any = False,
        config: CombineConfig | None = None,
        scale: Any = 1.0,
        out_lse: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # The kernel writes `out` through its pointer, out of autograd's sight: in grad mode an `out` that
        # requires grad is refused (as torch's out= functions do), and, below, a written `out` gets its version
        # counter bumped, so that a graph which saved it fails in backward instead of using the new values.
        # Together 0.2 us a call with out= (cached path, launch stubbed, median of 50k calls, CI-like CPU, Python
        # 3.11: 1.63 -> 1.85 us in grad mode, -> 1.79 under no_grad); a call without out= pays one comparison.
        # Under torch.compile the custom op bumps the counter itself (mutates_args).  `out_lse` likewise.
        if out is not None and _grad_enabled() and getattr(out, "requires_grad", False) is True:
            checks.refuse_out_gradient("combine", "out")
        if out_lse is not None:
            if return_lse is False:  # out_lse asks for the LSE (any other value is validated as return_lse)
                return_lse = True
            if _grad_enabled() and getattr(out_lse, "requires_grad", False) is True:
                checks.refuse_out_gradient("combine", "out_lse")
        if _is_compiling():
            return traced.combine_traced(self, bufs, B, lse_base, out, return_lse, config, scale, out_lse)
        # The same lookup as combine_plan() (combine_plan.combine_key inlined), as in pack.
        try:
            plan = bufs.__dict__[_PLANS][
                (
                    self,
                    B,
                    B.__class__,  # B=True must not hit B=1's plan: it is validated (and refused) as a new key
                    lse_base,
                    None if out is None else (out.shape, out.stride(), out.dtype, out.device, out.is_neg()),
                    return_lse,
                    return_lse.__class__,
                    config,
                    scale,
                    scale.__class__,  # likewise scale=True
                )
            ]
        except (AttributeError, KeyError, TypeError):
            plan = None
        if plan is None or (out is not None and plan.may_overlap(out)):  # planned outside the handler, as in pack
            plan = combine_plan.plan_combine(self, bufs, B, lse_base, out, return_lse, config, scale)
        if out_lse is not None:
            return self._combine_into_lse(plan, bufs, out, out_lse)
        out_lse = torch.empty(plan.out_shape[:2], dtype=torch.float32, device=plan.device) if return_lse else None
        if out is None:
            out = torch.empty(plan.out_shape, dtype=plan.dtype, device=plan.device)
            if B:
                combine_plan.launch(self, plan, bufs, out, out_lse)
        elif B:
            combine_plan.launch(self, plan, bufs, out, out_lse)
            _increment_version((out,))  # a tuple: a bare tensor would be iterated, bumping once per row view
        return out, out_lse

    def _combine_into_lse(
        self, plan: CombinePlan, bufs: Any, out: Any, out_lse: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """combine with a caller's `out_lse` (and `out`, or a new one): checked against the plan, then written."""
        given_out = out is not None
        if out is None:
            out = torch.empty(plan.out_shape, dtype=plan.dtype, device=plan.device)
        combine_plan.check_out_lse(plan, bufs.tensors.values(), out, out_lse)
        if plan.out_shape[0]:
            combine_plan.launch(self, plan, bufs, out, out_lse)
            _increment_version((out, out_lse) if given_out else (out_lse,))
        return out, out_lse

    def combine_into(self, plan: CombinePlan, bufs: Any, out: torch.Tensor, out_lse: torch.Tensor | None) -> None:
        combine_plan.launch(self, plan, bufs, out, out_lse)

    def combine_plan(
        self, bufs: Any, B: Any, lse_base: Any, out: Any, return_lse: Any, config: Any, scale: Any = 1.0
    ) -> CombinePlan:
        """The cached plan for these arguments (validating them the first time)."""
        try:
            key = combine_plan.combine_key(self, B, lse_base, out, return_lse, config, scale)
            plan: CombinePlan | None = bufs.__dict__[_PLANS][key]
        except (AttributeError, KeyError, TypeError):
            plan = None
        if plan is None or (out is not None and plan.may_overlap(out)):
            plan = combine_plan.plan_combine(self, bufs, B, lse_base, out, return_lse, config, scale)
        return plan
