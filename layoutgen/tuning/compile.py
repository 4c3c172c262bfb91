"""Compile candidate kernels ahead of timing, in parallel, into Triton's on-disk cache.

A pool of spawned processes each imports the generated module and runs its
launcher with `meta` tensors while the module's `@triton.jit` kernel is
swapped for a warm-up proxy: Triton binds the arguments exactly as a real
launch would (meta tensors specialise like 16-byte aligned pointers), compiles,
and writes the binary to its cache without launching anything.  The tuner's
own launch of the same (config, specialisation) then loads it from the cache
in milliseconds.  Generated kernels do not specialise on the live size, so one
compile serves every bucket whose buffers have the same capacity class
(== 1, % 16 == 0, other).  A generated module names each kernel `_<kernel>_kernel`
and its launcher `_launch_<kernel>`, which takes the kernel as `kernel=`; the
family's `compile_variant` builds the `meta` arguments and calls the launcher.

Under the Triton interpreter nothing compiles; the pool is not started.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any


def integer_class(value: int) -> str:
    """Triton's specialisation of an integer argument: 1 is a constant, multiples of 16 are aligned."""
    if value == 1:
        return "one"
    return "div16" if value % 16 == 0 else "plain"


@dataclass(frozen=True)
class CompileJob:
    """One kernel variant, in plain picklable values: the family's `compile_variant` reads `args`."""

    module_path: str
    kernel: str
    #: What the launcher sees, as the family's workload describes it (shapes, dtypes, capacities).
    args: tuple[tuple[str, Any], ...]
    config: tuple[tuple[str, int], ...]
    #: What reaches the compiled code (e.g. a capacity's integer class, not the capacity): one compile
    #: serves every job with the same variant.
    variant_args: tuple[Any, ...]

    @property
    def variant(self) -> tuple[Any, ...]:
        return (self.module_path, self.kernel, self.variant_args, self.config)


class _WarmupOnly:
    """Stands in for a `@triton.jit` kernel: `kernel[grid](...)` compiles and does not launch."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: self.kernel.run(*args, grid=grid, warmup=True, **kwargs)


_modules: dict[str, ModuleType] = {}


@dataclass(frozen=True)
class CompileError:
    """Why a variant did not compile; `from_triton` separates the kernel's fault from the pool's."""

    message: str
    from_triton: bool


def compile_variant(job: CompileJob) -> CompileError | None:
    """Compile one variant in this process (a pool worker); None on success."""
    from triton.errors import TritonError

    from layoutgen.family import get_family
    from layoutgen.loader import load_path

    try:
        module = _modules.get(job.module_path)
        if module is None:
            module = _modules[job.module_path] = load_path(Path(job.module_path))
        family = get_family(module.SPEC.family)
        warm = _WarmupOnly(getattr(module, f"_{job.kernel}_kernel"))
        family.compile_variant(module, {"kernel": job.kernel, "config": dict(job.config), **dict(job.args)}, warm)
    except Exception as error:  # reported as the trial's failure reason, never raised across the pool
        return CompileError(f"{type(error).__name__}: {error}", isinstance(error, TritonError))
    return None


def _initialize_worker() -> None:
    # Compiles are independent; one thread per process keeps 16 processes from oversubscribing 16 cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Ctrl-C is the tuner's to handle (it shuts the pool down), not a traceback from every compile process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class CompilePool:
    """Deduplicated ahead-of-time compiles on `workers` processes (0: compile lazily at first launch)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._futures: dict[tuple[Any, ...], Future[CompileError | None]] = {}
        self._executor: ProcessPoolExecutor | None = None
        if workers > 0:
            self._executor = ProcessPoolExecutor(
                max_workers=workers, mp_context=multiprocessing.get_context("spawn"), initializer=_initialize_worker
            )

    def submit(self, job: CompileJob) -> Future[CompileError | None] | None:
        """A future for the compile of `job`'s variant (shared with earlier identical requests), or None."""
        if self._executor is None:
            return None
        future = self._futures.get(job.variant)
        if future is None:
            future = self._futures[job.variant] = self._executor.submit(compile_variant, job)
        return future

    @property
    def submitted(self) -> int:
        return len(self._futures)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def default_compile_workers(tuning_workers: int) -> int:
    """CPU cores per tuning worker, one left for the worker itself."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, tuning_workers) - 1)
