"""The hot path of a generated module's `pack` / `combine`.

A `Dispatcher` per generated module turns a call into a cached plan: the first
call for a (shapes, strides, dtypes, devices, config) key validates every
argument, resolves `config=None` (forced / tuned / default) and records the
kernel launch; later calls with that key do one dict lookup on the buffers
object and launch.  Plans live on the buffers object, so they die with it.

Under `torch.compile` the dispatcher routes through the `layoutgen::pack` /
`layoutgen::combine` custom ops instead (`layoutgen.ops`).
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

from layoutgen.config import CombineConfig, KernelConfig, PackConfig
from layoutgen.layout import LayoutBuffers, Shape, buffer_shapes, check_shape
from layoutgen.runtime import checks, configs
from layoutgen.runtime.launch import is_jit_function, record_launches
from layoutgen.spec import LayoutSpec

_PLANS = "_layoutgen_plans"
_is_compiling = torch.compiler.is_compiling
_lock = threading.Lock()
_owners: weakref.WeakSet[LayoutBuffers] = weakref.WeakSet()
_dispatchers: dict[str, Dispatcher] = {}
# alloc()'s buffers by the id of their payload tensor, so that the custom ops, which see only tensors, find the
# object that holds the cached plans.  Weak: an entry lives as long as the buffers object.
_buffers_by_payload: weakref.WeakValueDictionary[int, LayoutBuffers] = weakref.WeakValueDictionary()

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
    # Replays the recorded launch with a call's (*buffers, out, out_lse); None until recorded or when it can't be.
    direct: Callable[[tuple[Any, ...]], None] | None = None
    recorded: bool = False


def _plans_of(bufs: LayoutBuffers) -> dict[tuple[Any, ...], Any]:
    plans = bufs.__dict__.get(_PLANS)
    if plans is None:
        plans = bufs.__dict__.setdefault(_PLANS, {})
        with _lock:
            _owners.add(bufs)
    return plans


def remember_buffers(bufs: LayoutBuffers) -> LayoutBuffers:
    _buffers_by_payload[id(bufs.tensors["payload"])] = bufs
    return bufs


def buffers_from_tensors(
    spec: LayoutSpec, tensors: list[torch.Tensor], N: int, B_max: int, H: int, D: int, dtype: torch.dtype
) -> LayoutBuffers:
    """The buffers object holding exactly `tensors` (alloc()'s, when it is alive), else a new one over them."""
    if tensors:
        bufs = _buffers_by_payload.get(id(tensors[0]))
        if (
            bufs is not None
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


def reset_caches() -> None:
    """Drop every cached plan, loaded tuning database and given warning (tests; after changing the DB or env)."""
    with _lock:
        owners = list(_owners)
    for bufs in owners:
        bufs.__dict__.pop(_PLANS, None)
    configs.reset()


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
        spec: LayoutSpec,
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

    def pack(self, out: Any, lse: Any, bufs: Any, config: PackConfig | None = None) -> None:
        if _is_compiling():
            self._pack_traced(out, lse, bufs, config)
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

    def pack_plan(self, out: Any, lse: Any, bufs: Any, config: PackConfig | None = None) -> PackPlan:
        """The cached plan for these arguments (validating them the first time): shows the config in use."""
        try:
            return bufs.__dict__[_PLANS][self._pack_key(out, lse, config)]
        except (AttributeError, KeyError, TypeError):
            return self._plan_pack(out, lse, bufs, config)

    def _pack_key(self, out: Any, lse: Any, config: Any) -> tuple[Any, ...]:
        """What a pack plan depends on besides the buffers (whose dict holds the plans); `pack` inlines it."""
        return (self, out.shape, out.stride(), out.dtype, out.device, lse.shape, lse.stride(), lse.dtype,
                lse.device, config)  # fmt: skip

    def _plan_pack(self, out: Any, lse: Any, bufs: Any, config: Any) -> PackPlan:
        batch = checks.check_pack_args(self.spec, out, lse, bufs)
        if config is None:
            resolved = configs.resolve_config(
                self.spec,
                "pack",
                bufs.device,
                bufs.N,
                bufs.H // bufs.N,
                bufs.D,
                bufs.dtype,
                batch,
                bufs.tensors["payload"].element_size(),
                self.spec_hash,
                self.source_hashes["pack"],
            )
        else:
            checks.check_config(config, PackConfig)
            resolved = config
        plan = PackPlan(batch, cast(PackConfig, resolved), checks.needs_int64(out, lse, *bufs.tensors.values()))
        _plans_of(bufs)[self._pack_key(out, lse, config)] = plan
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
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if _is_compiling():
            return self._combine_traced(bufs, B, lse_base, out, return_lse, config)
        # The same lookup as combine_plan() (_combine_key inlined), as in pack.
        try:
            plan = bufs.__dict__[_PLANS][
                (
                    self,
                    B,
                    lse_base,
                    None if out is None else (out.shape, out.stride(), out.dtype, out.device),
                    return_lse,
                    config,
                )
            ]
        except (AttributeError, KeyError, TypeError):
            plan = self._plan_combine(bufs, B, lse_base, out, return_lse, config)
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
        if not plan.recorded and out.is_cuda and is_jit_function(self.combine_kernel):
            plan.recorded = True
            tensors = (*bufs.tensors.values(), out, out_lse)
            varying = (len(bufs.tensors), len(bufs.tensors) + 1)  # out and out_lse
            plan.direct = record_launches(self.combine_kernel, self.launch_combine, args, tensors, varying)
            if plan.direct is not None:
                plan.direct(tensors)
                return
        self.launch_combine(*args)

    def _plan_combine(self, bufs: Any, B: Any, lse_base: Any, out: Any, return_lse: Any, config: Any) -> CombinePlan:
        checks.check_combine_args(self.spec, bufs, B, lse_base, out, return_lse)
        heads_per_peer = bufs.H // bufs.N
        if config is None:
            resolved = configs.resolve_config(
                self.spec,
                "combine",
                bufs.device,
                bufs.N,
                heads_per_peer,
                bufs.D,
                bufs.dtype,
                B,
                bufs.tensors["payload"].element_size(),
                self.spec_hash,
                self.source_hashes["combine"],
            )
        else:
            checks.check_config(config, CombineConfig)
            resolved = config
        out_shape = (B, heads_per_peer, bufs.D)
        tensors = list(bufs.tensors.values()) + ([out] if out is not None else [])
        plan = CombinePlan(
            cast(CombineConfig, resolved),
            checks.needs_int64(*tensors),
            lse_base == "2",
            out_shape,
            bufs.dtype,
            bufs.device,
        )
        _plans_of(bufs)[self._combine_key(B, lse_base, out, return_lse, config)] = plan
        return plan

    def _combine_key(self, B: Any, lse_base: Any, out: Any, return_lse: Any, config: Any) -> tuple[Any, ...]:
        """What a combine plan depends on besides the buffers; `combine` inlines it."""
        out_key = None if out is None else (out.shape, out.stride(), out.dtype, out.device)
        return (self, B, lse_base, out_key, return_lse, config)

    # torch.compile ---------------------------------------------------------------------------------------------

    def _pack_traced(self, out: Any, lse: Any, bufs: Any, config: Any) -> None:
        torch.ops.layoutgen.pack(
            out, lse, list(bufs.tensors.values()), self.name, bufs.N, bufs.B_max, bufs.H, bufs.D, config_values(config)
        )

    def _combine_traced(
        self, bufs: Any, B: Any, lse_base: Any, out: Any, return_lse: Any, config: Any
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
        )
        return out, out_lse

    def combine_plan(self, bufs: Any, B: Any, lse_base: Any, out: Any, return_lse: Any, config: Any) -> CombinePlan:
        """The cached plan for these arguments (validating them the first time)."""
        try:
            return bufs.__dict__[_PLANS][self._combine_key(B, lse_base, out, return_lse, config)]
        except (AttributeError, KeyError, TypeError):
            return self._plan_combine(bufs, B, lse_base, out, return_lse, config)


def config_values(config: KernelConfig | None) -> list[int]:
    """A config as the custom ops take it: its fields in declaration order, [] for None."""
    if config is None:
        return []
    return [getattr(config, field.name) for field in dataclasses.fields(config)]
