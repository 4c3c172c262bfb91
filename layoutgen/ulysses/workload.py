"""The Ulysses family's tuning workload: gate buffers and rotating timing inputs of one problem and bucket.

A problem is tuned at B = 1 and S_local = the bucket.  The gate draws fresh random inputs for every trial
and compares the candidate's output with `layoutgen.ulysses.reference` byte for byte: scatter kernels
write canary-filled send buffers, gather kernels canary-filled outputs, so a kernel that skips an
element or writes a wrong one is caught.  Each rotating timing set has its own inputs, and every set
writes one output (the scatters one set of send buffers, the gathers one set of tensors), as in
serving: one static set of send buffers serves every layer, and under CUDA graphs the attention-side
tensors come from one block of the graph's pool, reused call after call.  `bench_ulysses.py` times
by the same rule: with an output per set every call's writes went to DRAM where serving's go to the
L2 (at 16-24 MiB our scatters then took 8.0 µs against torch.compile's 7.1, which writes one output).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import torch

from layoutgen.config import LaunchConfig
from layoutgen.runtime.tensors import needs_int64
from layoutgen.tuning.compile import CompileJob, integer_class
from layoutgen.tuning.objective import CANARY, Target, Workload
from layoutgen.ulysses import reference
from layoutgen.ulysses.layout import KERNEL_DIRECTION, KERNEL_SIDES, Shape, UlyssesBuffers, tensor_shape
from layoutgen.ulysses.spec import UlyssesSpec

_SHAPE_FIELDS = ("N", "S_local", "B", "H", "H_kv", "D")


def _user_tensors(spec: UlyssesSpec, kernel: str, shape: Shape, device: Any,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """The kernel's user-side tensors, dense in the spec's layout: random values (the scatter kernels'
    inputs) when `generator` is given, else uninitialised (the gather kernels' outputs)."""
    side = KERNEL_SIDES[kernel][0 if kernel.startswith("scatter") else 1]
    tensors = []
    for tensor in spec.direction(KERNEL_DIRECTION[kernel]).tensors:
        extents = tensor_shape(spec, shape, tensor, side)
        if generator is None:
            tensors.append(torch.empty(extents, dtype=shape.dtype, device=device))
        else:
            tensors.append(torch.randn(extents, generator=generator, device=device).to(shape.dtype))
    return tuple(tensors)


def _launcher(module: ModuleType, kernel: str, tensors: tuple[torch.Tensor, ...], bufs: UlyssesBuffers,
              config: LaunchConfig, kernel_proxy: Any = None) -> Callable[[], None]:  # fmt: skip
    """One launch through the module's `_launch_<kernel>` (looked up per call, so a test can swap it): the
    kernel and its grid exactly as the public API runs them, without the dispatch layer."""
    launch = getattr(module, f"_launch_{kernel}")
    index_64 = needs_int64(*tensors, *bufs.tensors.values())
    extra = {} if kernel_proxy is None else {"kernel": kernel_proxy}
    if kernel.startswith("scatter"):
        return lambda: launch(*tensors, bufs, config, index_64, **extra)
    return lambda: launch(bufs, *tensors, config, index_64, **extra)


def launch_on_meta(module: ModuleType, job: Mapping[str, Any], kernel_proxy: Any) -> None:
    """The tuner's compile pool: run the launcher of `job` on `meta` tensors with `kernel_proxy`."""
    spec, kernel = module.SPEC, job["kernel"]
    from layoutgen.ulysses.config import CONFIG_TYPES

    shape = Shape(**{name: job[name] for name in _SHAPE_FIELDS}, dtype=getattr(torch, job["dtype"]))
    bufs = UlyssesBuffers.allocate(spec, KERNEL_DIRECTION[kernel], shape, "meta")
    tensors = _user_tensors(spec, kernel, shape, "meta")
    _launcher(module, kernel, tensors, bufs, CONFIG_TYPES[kernel].from_dict(job["config"]), kernel_proxy)()


class UlyssesWorkload(Workload):
    """One (target, S_local bucket) of a Ulysses kernel on one device."""

    def __init__(self, target: Target, bucket: int, device: Any, l2_bytes: int) -> None:
        super().__init__(target, bucket, device, l2_bytes)
        problem = target.problem
        N = problem.extent("N")
        self.kernel = problem.kernel
        self.spec: UlyssesSpec = problem.spec
        self.shape = Shape(N=N, S_local=bucket, H=N * problem.extent("Hl"), H_kv=N * problem.extent("Hl_kv"),
                           D=problem.extent("D"), dtype=getattr(torch, problem.dtype))  # fmt: skip
        self.direction = KERNEL_DIRECTION[self.kernel]
        self._gate: dict[str, Any] | None = None
        self._timing_sets: list[tuple[tuple[torch.Tensor, ...], UlyssesBuffers]] | None = None

    @property
    def scatters(self) -> bool:
        return self.kernel.startswith("scatter")

    def _alloc(self) -> UlyssesBuffers:
        return UlyssesBuffers.allocate(self.spec, self.direction, self.shape, self.device)

    def compile_job(self, config: LaunchConfig) -> CompileJob:
        shape = tuple((name, getattr(self.shape, name)) for name in _SHAPE_FIELDS)
        dtype = (("dtype", self.problem.dtype),)
        # What reaches the compiled code: S_local is not specialised, the user tensors' strides are (== 1,
        # % 16 == 0), and they may depend on S_local.
        tensors = _user_tensors(self.spec, self.kernel, self.shape, "meta")
        strides = tuple(integer_class(stride) for tensor in tensors for stride in tensor.stride()[:-1])
        variant = tuple(item for item in shape if item[0] != "S_local") + dtype + (strides,)
        return CompileJob(self.target.module_path, self.kernel, shape + dtype,
                          tuple(sorted(config.as_dict().items())), variant)  # fmt: skip

    # -- gate ------------------------------------------------------------------------------------
    def gate(self, config: LaunchConfig, seed: int) -> str | None:
        """Run `config` on fresh random inputs; None when its bytes match the reference, else what differs."""
        generator = torch.Generator(device=self.device).manual_seed(seed)
        if self._gate is None:
            self._gate = {"candidate": self._alloc(), "reference": self._alloc()}
        candidate: UlyssesBuffers = self._gate["candidate"]
        expected: UlyssesBuffers = self._gate["reference"]
        names = [t.name for t in candidate.tensor_specs]
        if self.scatters:
            inputs = _user_tensors(self.spec, self.kernel, self.shape, self.device, generator)
            for bufs in (candidate, expected):
                for tensor in bufs.tensors.values():
                    tensor.view(torch.uint8).fill_(CANARY)
            _launcher(self.target.module, self.kernel, inputs, candidate, config)()
            (reference.scatter if self.kernel == "scatter" else reference.scatter_out)(
                dict(zip(names, inputs, strict=True)), expected
            )
            pairs = [
                (f"buffer {name!r}", candidate.tensors[name], expected.tensors[name]) for name in candidate.tensors
            ]
        else:
            for name in names:
                view = candidate.wire_view(name)
                view.copy_(torch.randn(view.shape, generator=generator, device=self.device).to(view.dtype))
            outputs = _user_tensors(self.spec, self.kernel, self.shape, self.device)
            for tensor in outputs:
                tensor.view(torch.uint8).fill_(CANARY)
            _launcher(self.target.module, self.kernel, outputs, candidate, config)()
            wanted = (reference.gather if self.kernel == "gather" else reference.gather_out)(candidate)
            pairs = [(f"tensor {name!r}", got, wanted[name]) for name, got in zip(names, outputs, strict=True)]
        for what, got, want in pairs:
            got_bytes, want_bytes = got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)
            if not torch.equal(got_bytes, want_bytes):
                differing = (got_bytes != want_bytes).nonzero().flatten()
                return (
                    f"{self.kernel} wrote different bytes than the reference into {what}: {differing.numel()} of "
                    f"{got_bytes.numel()} bytes differ, first at byte {int(differing[0])}"
                )
        return None

    # -- timing ----------------------------------------------------------------------------------
    def timing_launch(self, config: LaunchConfig) -> Callable[[int], None]:
        """Launch `config` on rotating set `index`."""
        if self._timing_sets is None:
            self._timing_sets = self._make_timing_sets()
        launchers = [
            _launcher(self.target.module, self.kernel, tensors, bufs, config) for tensors, bufs in self._timing_sets
        ]
        return lambda index: launchers[index]()

    def _make_timing_sets(self) -> list[tuple[tuple[torch.Tensor, ...], UlyssesBuffers]]:
        """(user tensors, buffers) per rotating set: each set its own inputs, one output written by every set."""
        sets: list[tuple[tuple[torch.Tensor, ...], UlyssesBuffers]] = []
        if self.scatters:
            send = self._alloc()
            for index in range(self.sets):
                generator = torch.Generator(device=self.device).manual_seed(1000 + index)
                sets.append((_user_tensors(self.spec, self.kernel, self.shape, self.device, generator), send))
            return sets
        outputs = _user_tensors(self.spec, self.kernel, self.shape, self.device)
        for index in range(self.sets):
            generator = torch.Generator(device=self.device).manual_seed(1000 + index)
            bufs = self._alloc()
            for tensor in bufs.tensors.values():
                tensor.copy_(torch.randn(tensor.shape, generator=generator, device=self.device).to(tensor.dtype))
            sets.append((outputs, bufs))
        return sets
