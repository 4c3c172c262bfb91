"""What one trial does, for any family: compile -> correctness gate against the reference -> timing.

A `Workload` (one per problem and size bucket on one device, built by the family) holds the gate's
buffers and the rotating timing inputs; every trial of that bucket reuses them.  The family's gate
draws fresh random inputs for every trial and compares the candidate with its torch reference (pure
data movement byte for byte in canary-filled buffers; arithmetic within the family's tolerance, with
NaN in every byte it must not read).  A config that fails the gate is a kernel bug, not a slow config.

Timing inputs rotate over several sets (`layoutgen.tuning.timing.rotating_sets`, the rule the GPU
benchmarks use too): a large problem reads DRAM as in serving, a small one stays L2-resident as it
does right after the kernel before it wrote it.
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from layoutgen.config import LaunchConfig
from layoutgen.tuning.compile import CompileError, CompileJob
from layoutgen.tuning.problem import Problem
from layoutgen.tuning.procedure import CAPACITY_ROUNDING
from layoutgen.tuning.timing import Timing, cache_states, rotating_sets, time_states

#: The byte a gate fills outputs with before the candidate runs: any byte still holding it was not written.
CANARY = 0xA5
#: All-ones bytes are NaN in every float dtype: what a kernel must never read.
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

    def default_config(self, bucket: int) -> LaunchConfig:
        return self.problem.family.default_config(self.problem, bucket)

    def bytes_moved(self, bucket: int) -> int:
        return self.problem.family.bytes_moved(self.problem, bucket)


def capacity_for(size: int, device: Any) -> int:
    """The capacity buffers are timed with: a multiple of CAPACITY_ROUNDING on GPUs (as serving allocates,
    and one integer specialisation for every bucket), one spare row under the interpreter."""
    return -(-size // CAPACITY_ROUNDING) * CAPACITY_ROUNDING if device.type == "cuda" else size + 1


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


class Workload(ABC):
    """Gate buffers and rotating timing inputs of one (target, size bucket) on one device; a family
    subclasses it (its `Family.workload` returns one) and implements the three abstract methods:

    * `compile_job(config) -> CompileJob`: the variant the compile pool builds ahead of the gate.  `args` is
      what the family's `compile_variant` reads to build `meta` tensors; `variant_args` decides which jobs
      share one compile (the pool compiles once per module, kernel, variant_args and config), so it holds
      what reaches the compiled code: dtypes and each integer's specialisation class
      (`tuning.compile.integer_class`).  Too little there and two binaries share one compile (the second
      compiles at its first launch); raw sizes there compile the same binary again for every size.
    * `gate(config, seed) -> str | None`: fresh random inputs from `seed`, outputs pre-filled with `CANARY`
      bytes and bytes it must never read set to `NAN_BYTE`, the candidate run and compared with the
      reference; None when it matches, else what differs.
    * `timing_launch(config) -> Callable[[int], None]`: a launch on rotating input set `index` in
      `range(self.sets)`, built once per config.

    `__init__` sets, for them to use: `target` (its `module` is the generated module), `problem`, `bucket`,
    `device`, `capacity` (the buffers' capacity at this bucket), `bytes_moved`, `sets` (how many rotating input
    sets to build: together they exceed the L2), `states` and `estimated_us`."""

    def __init__(self, target: Target, bucket: int, device: Any, l2_bytes: int) -> None:
        self.target = target
        self.problem = target.problem
        self.bucket = bucket
        self.device = device
        self.capacity = capacity_for(bucket, device)
        self.bytes_moved = target.bytes_moved(bucket)
        self.sets = rotating_sets(self.bytes_moved, l2_bytes)
        #: The input-set counts every candidate is timed with (`layoutgen.tuning.timing.cache_states`).
        self.states = cache_states(self.sets, self.bytes_moved, l2_bytes, self.problem.decl.resident_timing)
        self.estimated_us = ASSUMED_LAUNCH_US + self.bytes_moved / ASSUMED_BYTES_PER_US

    @abstractmethod
    def compile_job(self, config: LaunchConfig) -> CompileJob:
        """The kernel variant `config` compiles to here (the compile pool deduplicates on its `variant`)."""

    @abstractmethod
    def gate(self, config: LaunchConfig, seed: int) -> str | None:
        """Run `config` on fresh random inputs; None when it matches the reference, else what differs."""

    @abstractmethod
    def timing_launch(self, config: LaunchConfig) -> Callable[[int], None]:
        """Launch `config` on rotating input set `index` (the kernel and its grid exactly as the public API
        runs them, without the dispatch layer, whose host cost a CUDA graph does not see anyway)."""


def _describe_error(error: BaseException) -> str:
    """The error's type and last line, or its repr where it has no message (a reason is never empty)."""
    text = str(error).strip().splitlines()
    return (f"{type(error).__name__}: {text[-1]}" if text else repr(error))[:500]


class SizeTooLarge(RuntimeError):
    """A size bucket whose buffers the device cannot allocate; the message names the bucket and the fix."""


@contextlib.contextmanager
def naming_the_size(problem: Problem, bucket: int) -> Iterator[None]:
    """Raise an allocation failure as SizeTooLarge naming the bucket: it is no candidate's fault, and every
    config of that size would fail alike."""
    import torch

    try:
        yield
    except (MemoryError, RuntimeError) as error:
        if not isinstance(error, (MemoryError, torch.OutOfMemoryError)) and "can't allocate memory" not in str(error):
            raise
        raise SizeTooLarge(
            f"{problem.label} {problem.family.bucket.name}={bucket}: its buffers cannot be allocated "
            f"({_describe_error(error)[:200]}); --bucket {bucket} is too large for this device's memory: tune "
            "smaller sizes"
        ) from error


def _is_candidate_error(error: BaseException) -> bool:
    """Errors that belong to the candidate config (a failed trial) rather than to the machine."""
    from triton.errors import TritonError

    return isinstance(error, (TritonError, ValueError, TypeError))


def evaluate(
    workload: Workload,
    config: LaunchConfig,
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
        timing = time_states(timer, workload.timing_launch(config), workload.states, workload.estimated_us, give_up_us)
    except Exception as error:
        if not _is_candidate_error(error):
            raise
        return Measurement("launch_failed", reason=_describe_error(error), gate_seconds=gate_seconds,
                           compile_wait_seconds=compile_wait)  # fmt: skip
    return Measurement("ok", timing=timing, gate_seconds=gate_seconds, compile_wait_seconds=compile_wait,
                       timing_seconds=time.perf_counter() - started)  # fmt: skip
