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
import sys
import threading
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any


def child_environment() -> dict[str, str]:
    """The environment variables a child process needs to load the specs this process loads: every family
    registered here beyond the built-in ones (by `LAYOUTGEN_FAMILIES` or by `layoutgen.family.register`, which
    a child never sees), named as the variable names them, and this process's import path as PYTHONPATH (a
    family's package may be importable only from an entry added to `sys.path` here)."""
    from layoutgen.family import registered_outside
    from layoutgen.settings import FAMILIES

    environment = {"PYTHONPATH": os.pathsep.join(entry for entry in sys.path if entry)}
    outside = registered_outside()
    if outside:
        environment[FAMILIES.name] = ",".join(f"{name}={module}" for name, module in outside.items())
    return environment


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

    @property
    def variant_job(self) -> dict[str, Any]:
        """The job dict the family's `compile_variant` reads."""
        return {"kernel": self.kernel, "config": dict(self.config), **dict(self.args)}


class _WarmupOnly:
    """Stands in for a `@triton.jit` kernel: `kernel[grid](...)` compiles and does not launch."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: self.kernel.run(*args, grid=grid, warmup=True, **kwargs)


_modules: dict[str, ModuleType] = {}


@dataclass(frozen=True)
class CompileError:
    """Why a variant did not compile; `from_triton` separates the kernel's fault from the pool's, and `setup`
    says the pool process could not even load the module or its family (no variant compiles there)."""

    message: str
    from_triton: bool
    setup: bool = False


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
    except Exception as error:  # the pool's fault, not the variant's: `CompilePool` reports it
        return CompileError(f"{type(error).__name__}: {error}", from_triton=False, setup=True)
    try:
        warm = _WarmupOnly(getattr(module, f"_{job.kernel}_kernel"))
        family.compile_variant(module, job.variant_job, warm)
    except Exception as error:  # reported as the trial's failure reason, never raised across the pool
        return CompileError(f"{type(error).__name__}: {error}", isinstance(error, TritonError))
    return None


def _initialize_worker(environment: dict[str, str]) -> None:
    # The families registered in the tuner's process, and where their packages are (`child_environment`).
    os.environ.update(environment)
    sys.path.extend(entry for entry in environment["PYTHONPATH"].split(os.pathsep) if entry not in sys.path)
    # Compiles are independent; one thread per process keeps 16 processes from oversubscribing 16 cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Ctrl-C is the tuner's to handle (it shuts the pool down), not a traceback from every compile process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class CompilePool:
    """Deduplicated ahead-of-time compiles on `workers` processes (0: compile lazily at first launch).

    A compile the pool itself could not do (its process could not load the module or its family, or died) costs
    only the head start, since the variant then compiles at its first launch; it is counted in `setup_failures`
    with the first reason in `setup_problem`, for the worker to report."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._futures: dict[tuple[Any, ...], Future[CompileError | None]] = {}
        self._executor: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self.setup_failures = 0
        self.setup_problem: str | None = None
        if workers > 0:
            self._executor = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_initialize_worker,
                initargs=(child_environment(),),
            )

    def submit(self, job: CompileJob) -> Future[CompileError | None] | None:
        """A future for the compile of `job`'s variant (shared with earlier identical requests), or None."""
        if self._executor is None:
            return None
        future = self._futures.get(job.variant)
        if future is None:
            try:
                future = self._executor.submit(compile_variant, job)
            except BrokenProcessPool as error:  # a process died: compile lazily from now on, and say so once
                self._note_problem(f"the compile processes died ({error}); later variants compile at first launch")
                self.close()
                return None
            self._futures[job.variant] = future
            future.add_done_callback(self._note_setup_failure)
        return future

    def _note_setup_failure(self, future: Future[CompileError | None]) -> None:
        try:
            result = future.result()
        except CancelledError:
            return
        except Exception as error:  # the process died (a broken pool): every later compile fails alike
            problem = f"the compile process failed ({type(error).__name__}: {error})"
        else:
            if result is None or not result.setup:
                return
            problem = result.message
        self._note_problem(problem)

    def _note_problem(self, problem: str) -> None:
        with self._lock:
            self.setup_failures += 1
            if self.setup_problem is None:
                self.setup_problem = problem

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
