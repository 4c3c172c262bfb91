"""The hot path of a DCP generated module's `pack` / `combine`.

A `Dispatcher` per generated module turns a call into a cached plan (`layoutgen.runtime.plans`): the
first call for a (shapes, strides, dtypes, devices, config) key validates every argument, resolves
`config=None` (`layoutgen.runtime.configs`: forced / tuned / default) and records the kernel launch
(`layoutgen.runtime.launch`); later calls with that key do one dict lookup on the buffers object and
launch.

Under `torch.compile` the dispatcher routes through the `layoutgen::pack` / `layoutgen::combine` custom
ops instead (`layoutgen.dcp.ops`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

from layoutgen.dcp import checks
from layoutgen.dcp.config import CombineConfig, PackConfig, default_combine_config, default_pack_config
from layoutgen.dcp.layout import LayoutBuffers, Shape, buffer_shapes, check_shape
from layoutgen.dcp.spec import DcpSpec
from layoutgen.runtime import configs
from layoutgen.runtime.launch import is_jit_function, record_launches
from layoutgen.runtime.plans import PLANS as _PLANS
from layoutgen.runtime.plans import plans_of, remember, remembered
from layoutgen.runtime.tensors import check_config, check_runnable, needs_int64

_is_compiling = torch.compiler.is_compiling
_dispatchers: dict[str, Dispatcher] = {}
#: CUDA's limit on a grid's y dimension, along which pack runs its batch blocks (the generated launcher
#: refuses a config that needs more).
MAX_GRID_Y = 65535
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}

LaunchFunction = Callable[..., None]


@dataclass
class PackPlan:
    batch: int
    config: PackConfig
    index_64: bool
    # Replays the recorded launch with a call's (out, lse, *buffers); None until recorded or when it can't be.
    direct: Callable[[tuple[Any, ...]], None] | None = None
    recorded: bool = False


@dataclass
class CombinePlan:
    config: CombineConfig
    index_64: bool
    lse_base_2: bool
    out_shape: tuple[int, int, int]
    dtype: torch.dtype
    device: torch.device
    scale: float = 1.0
    # Replays the recorded launch with a call's (*buffers, out, out_lse); None until recorded or when it can't be.
    direct: Callable[[tuple[Any, ...]], None] | None = None
    recorded: bool = False


def remember_buffers(bufs: LayoutBuffers) -> LayoutBuffers:
    remember(bufs, bufs.tensors["payload"])
    return bufs


def buffers_from_tensors(
    spec: DcpSpec, tensors: list[torch.Tensor], N: int, B_max: int, H: int, D: int, dtype: torch.dtype
) -> LayoutBuffers:
    """The buffers object holding exactly `tensors` (alloc()'s, when it is alive), else a new one over them."""
    if tensors:
        bufs = remembered(tensors[0])
        if (
            isinstance(bufs, LayoutBuffers)
            and bufs.layout_hash == spec.layout_hash()
            and bufs.shape == Shape(N, B_max, H, D, dtype)
            and len(bufs.tensors) == len(tensors)
            and all(mine is given for mine, given in zip(bufs.tensors.values(), tensors, strict=True))
        ):
            return bufs
    shape = Shape(N, B_max, H, D, dtype)
    check_shape(spec, shape)
    names = list(buffer_shapes(spec, shape))
    if len(tensors) != len(names):
        raise ValueError(f"buffers must be the {len(names)} tensors {names} of spec '{spec.name}'; got {len(tensors)}")
    return LayoutBuffers(spec, shape, dict(zip(names, tensors, strict=True)))


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
        if _is_compiling():
            self._pack_traced(out, lse, bufs, config, empty, max_sum)
            return
        if empty is not None or max_sum is not None:
            self._pack_v2(out, lse, bufs, config, empty, max_sum)
            return
        # The same lookup as pack_plan() (_pack_key inlined): the eager hot path is one dict hit, no extra call.
        try:
            plan = bufs.__dict__[_PLANS][
                (
                    self,
                    out.shape,
                    out.stride(),
                    out.dtype,
                    out.device,
                    lse.shape,
                    lse.stride(),
                    lse.dtype,
                    lse.device,
                    config,
                )
            ]
        except (AttributeError, KeyError, TypeError):
            plan = self._plan_pack(out, lse, bufs, config)
        direct = plan.direct
        if direct is not None:
            direct((out, lse, *bufs.tensors.values()))
        else:
            self._launch_pack(plan, out, lse, bufs)

    def _pack_v2(self, out: Any, lse: Any, bufs: Any, config: Any, empty: Any, max_sum: Any) -> None:
        """pack with an `empty` mask and/or (max, sum) inputs: the call's tensors are (out, lse or max, sum or
        lse, empty or lse, *buffers); unused kernel pointers get the first statistics tensor."""
        try:
            first, sums = (lse, None) if max_sum is None else max_sum
            plan = bufs.__dict__[_PLANS][self._pack_v2_key(out, first, sums, empty, config)]
        except (AttributeError, KeyError, TypeError, ValueError):
            plan = self._plan_pack(out, lse, bufs, config, empty, max_sum)
            first, sums = (lse, None) if max_sum is None else max_sum
        tensors = (
            out,
            first,
            first if sums is None else sums,
            first if empty is None else empty,
            *bufs.tensors.values(),
        )
        direct = plan.direct
        if direct is not None:
            direct(tensors)
            return
        launch = functools.partial(self.launch_pack, sums=sums, empty=empty)
        args = (out, first, bufs, plan.batch, plan.config, plan.index_64)
        if not plan.recorded and out.is_cuda and is_jit_function(self.pack_kernel):
            plan.recorded = True
            plan.direct = record_launches(self.pack_kernel, launch, args, tensors, (0, 1, 2, 3))
            if plan.direct is not None:
                plan.direct(tensors)
                return
        launch(*args)

    def _pack_v2_key(self, out: Any, first: Any, sums: Any, empty: Any, config: Any) -> tuple[Any, ...]:
        """`_pack_key` for a call with an empty mask or (max, sum) inputs."""
        optional = tuple(None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in (sums, empty))
        return (*self._pack_key(out, first, None)[:-1], *optional, config)

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
            if empty is None and max_sum is None:
                return bufs.__dict__[_PLANS][self._pack_key(out, lse, config)]
            first, sums = (lse, None) if max_sum is None else max_sum
            return bufs.__dict__[_PLANS][self._pack_v2_key(out, first, sums, empty, config)]
        except (AttributeError, KeyError, TypeError, ValueError):
            return self._plan_pack(out, lse, bufs, config, empty, max_sum)

    def _pack_key(self, out: Any, lse: Any, config: Any) -> tuple[Any, ...]:
        """What a pack plan depends on besides the buffers (whose dict holds the plans); `pack` inlines it."""
        return (self, out.shape, out.stride(), out.dtype, out.device, lse.shape, lse.stride(), lse.dtype,
                lse.device, config)  # fmt: skip

    def _resolve(self, kernel: str, bufs: LayoutBuffers, size: int, default: Callable[[], Any]) -> Any:
        """`config=None`: forced, tuned for this shape and device, or the heuristic default."""
        from layoutgen.dcp import FAMILY

        return configs.resolve_config(
            FAMILY.name,
            self.spec.name,
            FAMILY.kernel(kernel),
            bufs.device,
            {"N": bufs.N, "Hl": bufs.H // bufs.N, "D": bufs.D},
            _DTYPE_NAMES[bufs.dtype],
            size,
            self.spec_hash,
            self.source_hashes[kernel],
            default,
        )

    def _plan_pack(
        self,
        out: Any,
        lse: Any,
        bufs: Any,
        config: Any,
        empty: Any = None,
        max_sum: Any = None,
    ) -> PackPlan:
        batch = checks.check_pack_args(self.spec, out, lse, bufs, empty, max_sum)
        inputs = [out, *([lse] if max_sum is None else list(max_sum)), *([] if empty is None else [empty])]
        check_runnable(self.pack_kernel, *inputs, *bufs.tensors.values())
        if config is None:
            elem_size = bufs.tensors["payload"].element_size()
            args = (self.spec, bufs.N, bufs.H // bufs.N, bufs.D, max(batch, 1), elem_size)
            resolved = fit_grid(self._resolve("pack", bufs, batch, lambda: default_pack_config(*args)), batch)
        else:
            check_config(config, PackConfig)
            resolved = config
        plan = PackPlan(batch, cast(PackConfig, resolved), needs_int64(*inputs, *bufs.tensors.values()))
        if empty is None and max_sum is None:
            key = self._pack_key(out, lse, config)
        else:
            first, sums = (lse, None) if max_sum is None else max_sum
            key = self._pack_v2_key(out, first, sums, empty, config)
        plans_of(bufs)[key] = plan
        return plan

    def _launch_pack(self, plan: PackPlan, out: torch.Tensor, lse: torch.Tensor, bufs: LayoutBuffers) -> None:
        args = (out, lse, bufs, plan.batch, plan.config, plan.index_64)
        if not plan.recorded and out.is_cuda and is_jit_function(self.pack_kernel):
            plan.recorded = True
            plan.direct = record_launches(
                self.pack_kernel, self.launch_pack, args, (out, lse, *bufs.tensors.values()), (0, 1)
            )
            if plan.direct is not None:
                plan.direct((out, lse, *bufs.tensors.values()))
                return
        self.launch_pack(*args)

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
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if _is_compiling():
            return self._combine_traced(bufs, B, lse_base, out, return_lse, config, scale)
        # The same lookup as combine_plan() (_combine_key inlined), as in pack.
        try:
            plan = bufs.__dict__[_PLANS][
                (
                    self,
                    B,
                    B.__class__,  # B=True must not hit B=1's plan: it is validated (and refused) as a new key
                    lse_base,
                    None if out is None else (out.shape, out.stride(), out.dtype, out.device),
                    return_lse,
                    return_lse.__class__,
                    config,
                    scale,
                    scale.__class__,  # likewise scale=True
                )
            ]
        except (AttributeError, KeyError, TypeError):
            plan = self._plan_combine(bufs, B, lse_base, out, return_lse, config, scale)
        if out is None:
            out = torch.empty(plan.out_shape, dtype=plan.dtype, device=plan.device)
        out_lse = torch.empty(plan.out_shape[:2], dtype=torch.float32, device=plan.device) if return_lse else None
        if B:
            self.combine_into(plan, bufs, out, out_lse)
        return out, out_lse

    def combine_into(self, plan: CombinePlan, bufs: Any, out: torch.Tensor, out_lse: torch.Tensor | None) -> None:
        direct = plan.direct
        if direct is not None:
            direct((*bufs.tensors.values(), out, out_lse))
            return
        args = (bufs, plan.out_shape[0], out, out_lse, plan.lse_base_2, plan.config, plan.index_64)
        launch = self.launch_combine if plan.scale == 1.0 else functools.partial(self.launch_combine, scale=plan.scale)
        if not plan.recorded and out.is_cuda and is_jit_function(self.combine_kernel):
            plan.recorded = True
            tensors = (*bufs.tensors.values(), out, out_lse)
            varying = (len(bufs.tensors), len(bufs.tensors) + 1)  # out and out_lse
            plan.direct = record_launches(self.combine_kernel, launch, args, tensors, varying)
            if plan.direct is not None:
                plan.direct(tensors)
                return
        launch(*args)

    def _plan_combine(
        self, bufs: Any, B: Any, lse_base: Any, out: Any, return_lse: Any, config: Any, scale: Any = 1.0
    ) -> CombinePlan:
        checks.check_combine_args(self.spec, bufs, B, lse_base, out, return_lse)
        scale_value = checks.check_scale(scale)
        tensors = list(bufs.tensors.values()) + ([out] if out is not None else [])
        check_runnable(self.combine_kernel, *tensors)
        heads_per_peer = bufs.H // bufs.N
        if config is None:
            elem_size = bufs.tensors["payload"].element_size()
            args = (self.spec, bufs.N, heads_per_peer, bufs.D, max(B, 1), elem_size)
            resolved = self._resolve("combine", bufs, B, lambda: default_combine_config(*args))
        else:
            check_config(config, CombineConfig)
            resolved = config
        out_shape = (B, heads_per_peer, bufs.D)
        plan = CombinePlan(
            cast(CombineConfig, resolved),
            needs_int64(*tensors),
            lse_base == "2",
            out_shape,
            bufs.dtype,
            bufs.device,
            scale_value,
        )
        plans_of(bufs)[self._combine_key(B, lse_base, out, return_lse, config, scale)] = plan
        return plan

    def _combine_key(
        self, B: Any, lse_base: Any, out: Any, return_lse: Any, config: Any, scale: Any = 1.0
    ) -> tuple[Any, ...]:
        """What a combine plan depends on besides the buffers; `combine` inlines it."""
        out_key = None if out is None else (out.shape, out.stride(), out.dtype, out.device)
        return (self, B, B.__class__, lse_base, out_key, return_lse, return_lse.__class__, config, scale,
                scale.__class__)  # fmt: skip

    # torch.compile ---------------------------------------------------------------------------------------------

    def _pack_traced(self, out: Any, lse: Any, bufs: Any, config: Any, empty: Any = None, max_sum: Any = None) -> None:
        maximum, total = (None, None) if max_sum is None else max_sum
        tensors = list(bufs.tensors.values())
        shape = (self.name, bufs.N, bufs.B_max, bufs.H, bufs.D, config_values(config))
        torch.ops.layoutgen.pack(out, lse, tensors, *shape, empty, maximum, total)

    def _combine_traced(
        self, bufs: Any, B: Any, lse_base: Any, out: Any, return_lse: Any, config: Any, scale: Any = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # Allocation stays in the traced graph; the op only writes.
        heads_per_peer = bufs.H // bufs.N
        device = bufs.tensors["payload"].device
        if out is None:
            out = torch.empty((B, heads_per_peer, bufs.D), dtype=bufs.dtype, device=device)
        out_lse = torch.empty((B, heads_per_peer), dtype=torch.float32, device=device) if return_lse else None
        torch.ops.layoutgen.combine(
            list(bufs.tensors.values()),
            out,
            out_lse,
            self.name,
            bufs.N,
            bufs.B_max,
            bufs.H,
            bufs.D,
            B,
            lse_base,
            config_values(config),
            checks.check_scale(scale),
        )
        return out, out_lse

    def combine_plan(
        self, bufs: Any, B: Any, lse_base: Any, out: Any, return_lse: Any, config: Any, scale: Any = 1.0
    ) -> CombinePlan:
        """The cached plan for these arguments (validating them the first time)."""
        try:
            return bufs.__dict__[_PLANS][self._combine_key(B, lse_base, out, return_lse, config, scale)]
        except (AttributeError, KeyError, TypeError):
            return self._plan_combine(bufs, B, lse_base, out, return_lse, config, scale)


def config_values(config: Any) -> list[int]:
    """A config as the custom ops take it: its fields in declaration order, [] for None."""
    return [] if config is None else list(config.values())


def fit_grid(config: PackConfig, batch: int) -> PackConfig:
    """A pack config whose batch blocks fit the grid's y axis: past MAX_GRID_Y x block_batch rows (a batch
    no decode step reaches, but dispatch must not fail on it) the rows per program double until they fit."""
    block_batch = config.block_batch
    while -(-batch // block_batch) > MAX_GRID_Y:
        block_batch *= 2
    return config if block_batch == config.block_batch else dataclasses.replace(config, block_batch=block_batch)
