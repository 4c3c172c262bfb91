"""The hot path of a Ulysses generated module's `scatter` / `gather` / `scatter_out` / `gather_out`.

A `Dispatcher` per generated module turns a call into a cached plan (`layoutgen.runtime.plans`): the
first call for a (kernel, shapes, strides, dtypes, devices, config) key validates every argument, resolves
`config=None` (`layoutgen.runtime.configs`: forced / tuned / default) and records the kernel launch
(`layoutgen.runtime.launch`); later calls with that key do one dict lookup on the buffers object and
launch.  Under `torch.compile` the calls become the `layoutgen::ulysses_*` custom ops (`layoutgen.ulysses.ops`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

from layoutgen.config import config_values
from layoutgen.family import get_family
from layoutgen.runtime import configs
from layoutgen.runtime.launch import is_jit_function, record_launches
from layoutgen.runtime.plans import PLANS as _PLANS
from layoutgen.runtime.plans import plans_of, remember, remembered
from layoutgen.runtime.tensors import OverlapGuard, check_config, check_runnable, needs_int64
from layoutgen.ulysses import checks
from layoutgen.ulysses.config import CONFIG_TYPES, TileConfig, fit_to_shape, runtime_default
from layoutgen.ulysses.layout import (
    DTYPE_NAMES,
    KERNEL_DIRECTION,
    KERNEL_SIDES,
    Shape,
    UlyssesBuffers,
    check_shape,
    key_extents,
    tensor_shape,
    wire_buffers,
)
from layoutgen.ulysses.spec import UlyssesSpec

_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_increment_version = torch._C._increment_version  # what torch.autograd.graph.increment_version calls
_dispatchers: dict[str, Dispatcher] = {}
#: The custom ops' `shape` argument, in order.
SHAPE_FIELDS = ("N", "S_local", "B", "H", "H_kv", "D")

LaunchFunction = Callable[..., None]


@dataclass
class Plan:
    """One validated call: its config, 64-bit indexing, and (gather) the shapes of the tensors it returns."""

    config: TileConfig
    index_64: bool
    out_shapes: tuple[tuple[int, ...], ...] = ()
    # The overlap checks, kept for later calls at other addresses: a scatter's sources against the buffers it
    # writes, a gather's given outputs against its buffers and one another (None: new outputs, nothing to check).
    guard: OverlapGuard | None = None
    # Replays the recorded launch with a call's tensors; None until recorded or when it can't be.
    direct: Callable[[tuple[Any, ...]], None] | None = None
    recorded: bool = False


def remember_buffers(bufs: UlyssesBuffers) -> UlyssesBuffers:
    remember(bufs, next(iter(bufs.tensors.values())))
    return bufs


def buffers_from_tensors(
    spec: UlyssesSpec, direction: str, tensors: list[torch.Tensor], shape: Shape
) -> UlyssesBuffers:
    """The buffers object holding exactly `tensors` (alloc()'s, while it is alive), else a new one over them."""
    if tensors:
        bufs = remembered(tensors[0])
        if (
            isinstance(bufs, UlyssesBuffers)
            and bufs.layout_hash == spec.layout_hash()
            and bufs.direction == direction
            and bufs.shape == shape
            and len(bufs.tensors) == len(tensors)
            and all(mine is given for mine, given in zip(bufs.tensors.values(), tensors, strict=True))
        ):
            return bufs
    try:
        check_shape(spec, shape)
    except (TypeError, ValueError) as error:  # the custom ops' `shape` argument: name it
        raise type(error)(f"shape [{', '.join(SHAPE_FIELDS)}] = {shape_list(shape)}: {error}") from None
    names = [buffer.name for buffer in wire_buffers(spec, direction, shape)]
    if len(tensors) != len(names):
        raise ValueError(f"buffers must be the {len(names)} tensors {names} of spec '{spec.name}'; got {len(tensors)}")
    return UlyssesBuffers(spec, direction, shape, dict(zip(names, tensors, strict=True)))


def dispatcher(name: str) -> Dispatcher:
    """The dispatcher of the generated module registered under `name` (the custom ops use this)."""
    try:
        return _dispatchers[name]
    except KeyError:
        raise ValueError(f"no generated layoutgen module named {name!r} has been imported in this process") from None


def shape_values(bufs: UlyssesBuffers) -> list[int]:
    """A buffers object's shape as the custom ops take it (the dtype travels with the tensors)."""
    return shape_list(bufs.shape)


def shape_list(shape: Shape) -> list[int]:
    return [shape.N, shape.S_local, shape.B, shape.H, shape.H_kv, shape.D]


def shape_from_values(values: list[int], dtype: torch.dtype) -> Shape:
    if not isinstance(values, list | tuple) or len(values) != len(SHAPE_FIELDS):
        given = f"{len(values)} values {list(values)}" if isinstance(values, list | tuple) else type(values).__name__
        raise ValueError(
            f"shape must list the buffers' [{', '.join(SHAPE_FIELDS)}] ({len(SHAPE_FIELDS)} ints); got {given}"
        )
    N, S_local, B, H, H_kv, D = values
    return Shape(N=N, S_local=S_local, H=H, H_kv=H_kv, D=D, dtype=dtype, B=B)


def op_buffers(spec: UlyssesSpec, direction: str, buffers: list[torch.Tensor], values: list[int]) -> UlyssesBuffers:
    """The buffers object of a custom op's `buffers` (bufs.tensors.values(), in order) and `shape` arguments."""
    if not buffers:
        names = ["wire"] if spec.direction(direction).shared else [t.name for t in spec.direction(direction).tensors]
        raise ValueError(
            f"buffers must be the {len(names)} tensor(s) {names} of the {direction} buffers of spec '{spec.name}' "
            "(bufs.tensors.values(), in order); got none"
        )
    return buffers_from_tensors(spec, direction, buffers, shape_from_values(values, buffers[0].dtype))


class Dispatcher:
    """Validation, config choice and launch for one generated module."""

    def __init__(
        self,
        name: str,
        spec: UlyssesSpec,
        spec_hash: str,
        source_hashes: dict[str, str],
        kernels: dict[str, tuple[Any, LaunchFunction]],
    ) -> None:
        if spec_hash != spec.layout_hash():
            raise ValueError(f"generated module {name} is stale: SPEC_HASH does not match its SPEC; rebuild it")
        if sorted(kernels) != sorted(KERNEL_DIRECTION):
            raise ValueError(f"generated module {name} must define the kernels {sorted(KERNEL_DIRECTION)}")
        self.name = name
        self.spec = spec
        self.spec_hash = spec_hash
        self.source_hashes = source_hashes
        self.kernels = kernels
        _dispatchers[name] = self

    def __repr__(self) -> str:
        return f"Dispatcher({self.name!r}, spec={self.spec.name!r})"

    # scatter / scatter_out -------------------------------------------------------------------------------

    def scatter(self, kernel: str, tensors: tuple[Any, ...], bufs: Any, config: TileConfig | None = None) -> None:
        """Write `tensors` (the direction's, in order) into the send buffers `bufs`."""
        if _grad_enabled():  # traced calls too: the custom op would drop the gradient as silently
            self._refuse_gradients(kernel, tensors)
        if _is_compiling():
            # Checked while tracing: a wrong bufs would otherwise fail inside dynamo on its attributes.
            checks.check_buffers(self.spec, bufs, KERNEL_DIRECTION[kernel])
            getattr(torch.ops.layoutgen, f"ulysses_{kernel}")(
                list(tensors), list(bufs.tensors.values()), self.name, shape_values(bufs), config_values(config)
            )
            return
        try:
            plan = bufs.__dict__[_PLANS][self._scatter_key(kernel, config, tensors)]
        except (AttributeError, KeyError, TypeError):
            plan = None
        if plan is None or (plan.guard is not None and plan.guard.may_overlap(tensors)):
            # planned outside the handler: a refusal does not read "during handling of KeyError"
            plan = self._plan_scatter(kernel, tensors, bufs, config)
        call = (*tensors, *bufs.tensors.values())
        direct = plan.direct
        if direct is not None:
            direct(call)
            return
        launch_args = (*tensors, bufs, plan.config, plan.index_64)
        self._launch(kernel, plan, launch_args, call, tuple(range(len(tensors))))

    def _refuse_gradients(self, kernel: str, tensors: tuple[Any, ...]) -> None:
        """The copies do not record themselves for autograd: a source that requires grad, in grad mode, would
        lose its gradient without a word (DeepSpeed's all-to-all is an autograd Function; ours is not)."""
        for position, tensor in enumerate(tensors):
            if getattr(tensor, "requires_grad", False):  # the names are looked up only for the refusal
                tensor_spec = self.spec.direction(KERNEL_DIRECTION[kernel]).tensors[position]
                raise RuntimeError(
                    f"{kernel}: {tensor_spec.name} requires grad, and layoutgen's kernels do not propagate gradients "
                    f"(inference only): call under torch.no_grad() or torch.inference_mode(), or pass "
                    f"{tensor_spec.name}.detach()"
                )

    def _plan_scatter(self, kernel: str, tensors: Any, bufs: Any, config: Any) -> Plan:
        bufs = checks.check_sources(self.spec, kernel, tensors, bufs)
        check_runnable(self.kernels[kernel][0], *tensors, *bufs.tensors.values())
        plan = Plan(self._config(kernel, bufs, config), needs_int64(*tensors, *bufs.tensors.values()))
        plan.guard = OverlapGuard.of(bufs.tensors.values(), tensors, disjoint=False)
        plans_of(bufs)[self._scatter_key(kernel, config, tensors)] = plan
        return plan

    def _scatter_key(self, kernel: str, config: Any, tensors: Any) -> tuple[Any, ...]:
        # The negation bit too: a `x.conj().imag` view has a plain tensor's geometry, and a hit skips its check.
        return (self, kernel, config, *[(t.shape, t.stride(), t.dtype, t.device, t.is_neg()) for t in tensors])

    # gather / gather_out --------------------------------------------------------------------------------

    def gather(
        self, kernel: str, bufs: Any, out: Any = None, config: TileConfig | None = None
    ) -> tuple[torch.Tensor, ...]:
        """Read the receive buffers `bufs` into the direction's tensors (new ones, or those of `out`)."""
        # An out that requires grad is refused in grad mode, as torch's out= functions do.  Inference (no_grad /
        # inference_mode) pays one call, nothing when out is None; grad mode one attribute read per tensor.
        # With the version bump below, a cached gather(out=3) went from 3.45 to 3.7 us in inference and to 3.9
        # in grad mode (CPU, Python 3.11, launch stubbed, medians of 50k calls).
        if out is not None and _grad_enabled():  # traced calls too, as in scatter
            try:
                for tensor in out:
                    if tensor.requires_grad:
                        self._refuse_gradient_outputs(kernel, out)
            except (AttributeError, TypeError):  # not tensors: the argument checks name them
                pass
        if _is_compiling():
            return self._gather_traced(kernel, bufs, out, config)
        try:
            plan = bufs.__dict__[_PLANS][self._gather_key(kernel, config, out)]
        except (AttributeError, KeyError, TypeError):
            plan = None
        if plan is None or (plan.guard is not None and plan.guard.may_overlap(out)):
            plan = self._plan_gather(kernel, bufs, out, config)
        if out is None:
            out = tuple(torch.empty(shape, dtype=bufs.dtype, device=bufs.device) for shape in plan.out_shapes)
            given = False
        else:
            out = tuple(out)
            given = True
        call = (*bufs.tensors.values(), *out)
        direct = plan.direct
        if direct is not None:
            direct(call)
        else:
            launch_args = (bufs, *out, plan.config, plan.index_64)
            buffers = len(bufs.tensors)
            self._launch(kernel, plan, launch_args, call, tuple(range(buffers, buffers + len(out))))
        if given:
            # The kernel writes through raw pointers: tell autograd, as torch's in-place ops do, so that a graph
            # which saved one of these tensors refuses its backward instead of using the new values (0.18 us
            # for three tensors; inference-mode tensors have no counter and are skipped).
            _increment_version(out)
        return out

    def _refuse_gradient_outputs(self, kernel: str, out: Any) -> None:
        """torch's out= functions refuse an out that requires grad in grad mode: the write is not recorded, so
        its gradient would be wrong without a word."""
        if not isinstance(out, tuple | list):  # e.g. one tensor where a tuple is due: the argument checks say so
            return
        for position, tensor in enumerate(out):
            if getattr(tensor, "requires_grad", False):
                tensor_specs = self.spec.direction(KERNEL_DIRECTION[kernel]).tensors
                name = tensor_specs[position].name if position < len(tensor_specs) else "it"
                label = "out" if len(tensor_specs) == 1 else f"out[{position}] ({name})"
                raise RuntimeError(
                    f"{kernel}: {label} requires grad, and layoutgen's kernels write out= tensors without "
                    "recording the write for autograd (functions with out= arguments don't support automatic "
                    f"differentiation): pass {name}.detach() instead, or call under torch.no_grad() or "
                    "torch.inference_mode()"
                )

    def _out_shapes(self, kernel: str, bufs: UlyssesBuffers) -> tuple[tuple[int, ...], ...]:
        side = KERNEL_SIDES[kernel][1]
        return tuple(tensor_shape(self.spec, bufs.shape, t, side) for t in bufs.tensor_specs)

    def _plan_gather(self, kernel: str, bufs: Any, out: Any, config: Any) -> Plan:
        bufs = checks.check_destinations(self.spec, kernel, bufs, out)
        given = () if out is None else tuple(out)
        check_runnable(self.kernels[kernel][0], *bufs.tensors.values(), *given)
        out_shapes = self._out_shapes(kernel, bufs)
        # New outputs are dense: as large as given ones would be when they are.
        sizes = [torch.empty(shape, device="meta") for shape in out_shapes] if out is None else list(given)
        plan = Plan(self._config(kernel, bufs, config), needs_int64(*bufs.tensors.values(), *sizes), out_shapes)
        if out is not None:
            plan.guard = OverlapGuard.of(bufs.tensors.values(), given, disjoint=True)
        plans_of(bufs)[self._gather_key(kernel, config, out)] = plan
        return plan

    def _gather_key(self, kernel: str, config: Any, out: Any) -> tuple[Any, ...]:
        given = None if out is None else tuple((t.shape, t.stride(), t.dtype, t.device, t.is_neg()) for t in out)
        return (self, kernel, config, given)

    def _gather_traced(self, kernel: str, bufs: Any, out: Any, config: Any) -> tuple[torch.Tensor, ...]:
        # Checked while tracing: a wrong bufs would otherwise fail inside dynamo on its attributes.
        bufs = checks.check_buffers(self.spec, bufs, KERNEL_DIRECTION[kernel])
        # Allocation stays in the traced graph; the op only writes.
        if out is None:
            out = tuple(
                torch.empty(shape, dtype=bufs.dtype, device=bufs.device) for shape in self._out_shapes(kernel, bufs)
            )
        getattr(torch.ops.layoutgen, f"ulysses_{kernel}")(
            list(bufs.tensors.values()), list(out), self.name, shape_values(bufs), config_values(config)
        )
        return tuple(out)

    # shared ------------------------------------------------------------------------------------------------

    def plan(self, kernel: str, *args: Any, config: TileConfig | None = None) -> Plan:
        """The cached plan of a call (validating it the first time): shows the config in use.
        Arguments as the public function takes them: (tensors, bufs) or (bufs, out)."""
        if kernel in ("scatter", "scatter_out"):
            tensors, bufs = args
            found = bufs.__dict__.get(_PLANS, {}).get(self._scatter_key(kernel, config, tensors))
            return cast(Plan, found) if found is not None else self._plan_scatter(kernel, tensors, bufs, config)
        bufs, out = args
        found = bufs.__dict__.get(_PLANS, {}).get(self._gather_key(kernel, config, out))
        return cast(Plan, found) if found is not None else self._plan_gather(kernel, bufs, out, config)

    def _config(self, kernel: str, bufs: UlyssesBuffers, config: Any) -> TileConfig:
        if config is not None:
            check_config(config, CONFIG_TYPES[kernel])
            return cast(TileConfig, config)
        resolved = configs.resolve_config(
            "ulysses",
            self.spec.name,
            get_family("ulysses").kernel(kernel),
            bufs.device,
            key_extents(self.spec, kernel, bufs.shape),
            DTYPE_NAMES[bufs.dtype],
            bufs.B * bufs.S_local,
            self.spec_hash,
            self.source_hashes[kernel],
            lambda: runtime_default(self.spec, kernel, bufs.shape),
        )
        # A tuned or forced config was chosen at another size: fitted as the default is, so a batch whose
        # blocks pass CUDA's grid limits gets larger blocks instead of the launcher's error.
        return fit_to_shape(self.spec, kernel, bufs.shape, cast(TileConfig, resolved))

    def _launch(
        self, kernel: str, plan: Plan, launch_args: tuple[Any, ...], call: tuple[Any, ...], varying: tuple[int, ...]
    ) -> None:
        jit_kernel, launch = self.kernels[kernel]
        if not plan.recorded and call[0].is_cuda and is_jit_function(jit_kernel):
            plan.recorded = True
            plan.direct = record_launches(jit_kernel, launch, launch_args, call, varying)
            if plan.direct is not None:
                plan.direct(call)
                return
        launch(*launch_args)
