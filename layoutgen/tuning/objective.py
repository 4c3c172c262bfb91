"""What one trial does: compile -> correctness gate against the reference -> timing.

A `Workload` holds, for one problem and batch bucket on one device, the gate's
buffers and the rotating timing inputs; every trial of that bucket reuses them.

The gate draws fresh random inputs for every trial (special LSE values and a
NaN payload behind an empty shard included) and compares the candidate with
`layoutgen.reference`: pack byte for byte over the whole buffers (canary-filled,
so a byte the layout does not own must stay untouched), combine within
`layoutgen.tolerances` against the float64 merge (unowned bytes hold NaN, so a
combine that reads them is caught).  A config that fails the gate is a kernel
bug, not a slow config.

Timing inputs rotate over several sets (`layoutgen.tuning.timing.rotating_sets`,
the rule the GPU benchmark uses too; rows of `sets` in the results): a large
problem reads DRAM as in serving, a small one stays L2-resident as it does right
after attention or the exchange wrote it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import torch

from layoutgen import reference
from layoutgen.config import KernelConfig, default_combine_config, default_pack_config
from layoutgen.layout import LSE_BYTES, LayoutBuffers
from layoutgen.tolerances import combine_error
from layoutgen.tuning.compile import CompileError, CompileJob, needs_int64
from layoutgen.tuning.space import Problem
from layoutgen.tuning.timing import Timing, rotating_sets

CANARY = 0xA5
#: All-ones bytes are NaN in every float dtype: what a combine must never read.
NAN_BYTE = 0xFF
#: Bandwidth assumed when sizing a graph before anything is measured (bytes per µs).
ASSUMED_BYTES_PER_US = 3.0e6
ASSUMED_LAUNCH_US = 2.0
#: A candidate whose compile takes longer than this is a failed trial (ptxas can stall on huge tiles).
COMPILE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Target:
    """A problem and the generated module whose kernels solve it."""

    problem: Problem
    module: ModuleType

    @property
    def spec_hash(self) -> str:
        return str(self.module.SPEC_HASH)

    @property
    def source_hash(self) -> str:
        return str(self.module.SOURCE_HASHES[self.problem.kernel])

    @property
    def module_path(self) -> str:
        return str(self.module.__file__)

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype: torch.dtype = getattr(torch, self.problem.dtype)
        return dtype

    def default_config(self, batch: int) -> KernelConfig:
        p = self.problem
        make = default_pack_config if p.kernel == "pack" else default_combine_config
        return make(p.spec, p.N, p.heads_per_peer, p.D, batch, p.wire_elem_size)


def capacity_for(batch: int, device: torch.device) -> int:
    """B_max of the buffers a bucket is timed with: a multiple of 16 on GPUs (as serving allocates, and
    one integer specialisation for every bucket), one spare row under the interpreter (rows >= B exist)."""
    return -(-batch // 16) * 16 if device.type == "cuda" else batch + 1


def bytes_moved(problem: Problem, batch: int) -> int:
    """DRAM bytes one call must move: pack reads out + lse and writes the payload and LSE bytes it owns;
    combine reads N partials and their LSEs and writes out."""
    rows = batch * problem.H if problem.kernel == "pack" else batch * problem.heads_per_peer
    if problem.kernel == "pack":
        return rows * (problem.D * (problem.elem_size + problem.wire_elem_size) + 2 * LSE_BYTES)
    return rows * (problem.N * (problem.D * problem.wire_elem_size + LSE_BYTES) + problem.D * problem.elem_size)


class GateFailure(Exception):
    """A candidate's output differs from the reference: a kernel bug."""


@dataclass(frozen=True)
class Measurement:
    """The outcome of one trial."""

    status: Literal["ok", "compile_failed", "launch_failed", "gate_failed"]
    timing: Timing | None = None
    reason: str | None = None
    #: Wall time of the gate, whose first launch of a kernel variant loads (or, on a cache miss, compiles) it.
    gate_seconds: float = 0.0
    #: Wall time spent waiting for the compile pool, and timing (capture and replays).
    compile_wait_seconds: float = 0.0
    timing_seconds: float = 0.0


def _describe_error(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[-1] if text else ''}"[:500]


class Workload:
    """Gate buffers and rotating timing inputs of one (target, batch bucket) on one device."""

    def __init__(self, target: Target, batch: int, device: torch.device, l2_bytes: int) -> None:
        self.target = target
        self.problem = target.problem
        self.batch = batch
        self.device = device
        self.capacity = capacity_for(batch, device)
        self.bytes_moved = bytes_moved(self.problem, batch)
        self.sets = rotating_sets(self.bytes_moved, l2_bytes)
        self.estimated_us = ASSUMED_LAUNCH_US + self.bytes_moved / ASSUMED_BYTES_PER_US
        self._gate_buffers: dict[str, Any] | None = None
        self._timing_sets: list[dict[str, Any]] | None = None
        self._timing_result: torch.Tensor | None = None

    # -- shared pieces ---------------------------------------------------------------------------
    def _alloc(self) -> LayoutBuffers:
        p = self.problem
        return LayoutBuffers.allocate(p.spec, p.N, self.capacity, p.H, p.D, self.target.torch_dtype, self.device)

    def compile_job(self, config: KernelConfig) -> CompileJob:
        p = self.problem
        return CompileJob(self.target.module_path, p.kernel, p.N, p.H, p.D, p.dtype, self.capacity, self.batch,
                          tuple(sorted(config.as_dict().items())))  # fmt: skip

    def _random_inputs(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.problem
        out = torch.randn(self.batch, p.H, p.D, generator=generator, device=self.device).to(self.target.torch_dtype)
        lse = torch.randn(self.batch, p.H, generator=generator, device=self.device) * 4
        return out, lse

    def _launcher(self, config: KernelConfig, tensors: dict[str, Any]) -> Callable[[], None]:
        """One launch through the module's `_launch_*` function (looked up per call, so a test can swap it):
        the kernel and its grid exactly as the public API runs them, without the dispatch layer, whose
        host-side cost a CUDA graph does not see anyway.  Combine: natural-log LSEs, no merged LSE out."""
        module = self.target.module
        batch = self.batch
        if self.problem.kernel == "pack":
            out, lse, bufs = tensors["out"], tensors["lse"], tensors["bufs"]
            index_64 = needs_int64(out, lse, *bufs.tensors.values())
            return lambda: module._launch_pack(out, lse, bufs, batch, config, index_64)
        bufs, result = tensors["bufs"], tensors["result"]
        index_64 = needs_int64(result, *bufs.tensors.values())
        return lambda: module._launch_combine(bufs, batch, result, None, False, config, index_64)

    # -- gate ------------------------------------------------------------------------------------
    def gate(self, config: KernelConfig, seed: int) -> str | None:
        """Run `config` on fresh random inputs; None when it matches the reference, else what differs."""
        generator = torch.Generator(device=self.device).manual_seed(seed)
        if self.problem.kernel == "pack":
            return self._gate_pack(config, generator)
        return self._gate_combine(config, generator)

    def _gate_pack(self, config: KernelConfig, generator: torch.Generator) -> str | None:
        if self._gate_buffers is None:
            self._gate_buffers = {"candidate": self._alloc(), "reference": self._alloc()}
        candidate, expected = self._gate_buffers["candidate"], self._gate_buffers["reference"]
        out, lse = self._random_inputs(generator)
        lse[0, 0] = float("-inf")
        lse[-1, -1] = float("inf")
        lse[self.batch // 2, self.problem.H // 2] = float("nan")
        for bufs in (candidate, expected):
            for tensor in bufs.tensors.values():
                tensor.view(torch.uint8).fill_(CANARY)
        self._launcher(config, {"out": out, "lse": lse, "bufs": candidate})()
        reference.pack(out, lse, expected)
        for name, tensor in candidate.tensors.items():
            got, want = tensor.reshape(-1).view(torch.uint8), expected.tensors[name].reshape(-1).view(torch.uint8)
            if not torch.equal(got, want):
                differing = (got != want).nonzero().flatten()
                return (
                    f"pack wrote different bytes than the reference into {name!r}: {differing.numel()} of "
                    f"{got.numel()} bytes differ, first at byte {int(differing[0])}"
                )
        return None

    def _gate_combine(self, config: KernelConfig, generator: torch.Generator) -> str | None:
        if self._gate_buffers is None:
            p = self.problem
            self._gate_buffers = {
                "received": self._alloc(),
                "result": torch.empty(
                    self.batch, p.heads_per_peer, p.D, dtype=self.target.torch_dtype, device=self.device
                ),
            }
        received, result = self._gate_buffers["received"], self._gate_buffers["result"]
        for tensor in received.tensors.values():
            tensor.view(torch.uint8).fill_(NAN_BYTE)
        payload, lse = received.payload_view(self.batch), received.lse_view(self.batch)
        payload.copy_(torch.randn(payload.shape, generator=generator, device=self.device))
        lse.copy_(torch.randn(lse.shape, generator=generator, device=self.device) * 4)
        # Empty shards: one partial (garbage payload), a whole row, and the NaN / +inf LSEs that count as empty.
        lse[0, 0, 0] = float("-inf")
        payload[0, 0, 0].fill_(float("nan"))
        lse[:, -1, -1] = float("-inf")
        lse[-1, self.batch // 2, 0] = float("nan")
        lse[0, -1, 0] = float("inf")
        result.view(torch.uint8).fill_(NAN_BYTE)
        self._launcher(config, {"bufs": received, "result": result})()
        want, _ = reference.combine(received, self.batch, "e")
        valid = lse.isfinite().unsqueeze(-1).expand_as(payload)
        scale = float(payload.float().abs().where(valid, 0.0).max())
        ratio = combine_error(result, want, scale)
        if not ratio <= 1.0:
            return f"combine outside the tolerance of layoutgen.tolerances: {ratio:.3g}x the allowed error"
        return None

    # -- timing ----------------------------------------------------------------------------------
    def timing_launch(self, config: KernelConfig) -> Callable[[int], None]:
        """Launch `config` on rotating set `index`."""
        if self._timing_sets is None:
            self._timing_sets = [self._timing_set(index) for index in range(self.sets)]
        launchers = [self._launcher(config, tensors) for tensors in self._timing_sets]
        return lambda index: launchers[index]()

    def _timing_set(self, index: int) -> dict[str, Any]:
        generator = torch.Generator(device=self.device).manual_seed(1000 + index)
        bufs = self._alloc()
        if self.problem.kernel == "pack":
            out, lse = self._random_inputs(generator)
            return {"out": out, "lse": lse, "bufs": bufs}
        payload = bufs.payload_view(self.batch)
        payload.copy_(torch.randn(payload.shape, generator=generator, device=self.device))
        lse = bufs.lse_view(self.batch)
        lse.copy_(torch.randn(lse.shape, generator=generator, device=self.device) * 4)
        if self._timing_result is None:  # one output for every set (TIMING_RULES["combine"])
            p = self.problem
            shape = (self.batch, p.heads_per_peer, p.D)
            self._timing_result = torch.empty(shape, dtype=self.target.torch_dtype, device=self.device)
        return {"bufs": bufs, "result": self._timing_result}


def _is_candidate_error(error: BaseException) -> bool:
    """Errors that belong to the candidate config (a failed trial) rather than to the machine."""
    from triton.errors import TritonError

    return isinstance(error, (TritonError, ValueError, TypeError))


def evaluate(
    workload: Workload,
    config: KernelConfig,
    compiled: Future[CompileError | None] | None,
    timer: Any,
    seed: int,
    give_up_us: float | None = None,
) -> Measurement:
    """Compile (wait for the pool's compile), gate, time.  Machine errors (CUDA faults) propagate."""
    started = time.perf_counter()
    if compiled is not None:
        try:
            problem = compiled.result(timeout=COMPILE_TIMEOUT_S)
        except FutureTimeout:
            return Measurement("compile_failed", reason=f"the compile took over {COMPILE_TIMEOUT_S:.0f} s")
        except Exception:  # a broken pool only loses the head start; the launch below compiles
            problem = None
        if problem is not None and problem.from_triton:
            return Measurement("compile_failed", reason=problem.message)
    compile_wait = time.perf_counter() - started
    started = time.perf_counter()
    try:
        mismatch = workload.gate(config, seed)
    except Exception as error:
        if not _is_candidate_error(error):
            raise
        return Measurement("launch_failed", reason=_describe_error(error))
    gate_seconds = time.perf_counter() - started
    if mismatch is not None:
        return Measurement("gate_failed", reason=mismatch, gate_seconds=gate_seconds, compile_wait_seconds=compile_wait)
    started = time.perf_counter()
    try:
        timing = timer.time(workload.timing_launch(config), workload.sets, workload.estimated_us, give_up_us)
    except Exception as error:
        if not _is_candidate_error(error):
            raise
        return Measurement("launch_failed", reason=_describe_error(error), gate_seconds=gate_seconds,
                           compile_wait_seconds=compile_wait)  # fmt: skip
    return Measurement("ok", timing=timing, gate_seconds=gate_seconds, compile_wait_seconds=compile_wait,
                       timing_seconds=time.perf_counter() - started)  # fmt: skip
