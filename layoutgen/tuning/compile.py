"""Compile candidate kernels ahead of timing, in parallel, into Triton's on-disk cache.

A pool of spawned processes each imports the generated module and runs its
launcher with `meta` tensors while the module's `@triton.jit` kernel is
swapped for a warm-up proxy: Triton binds the arguments exactly as a real
launch would (meta tensors specialise like 16-byte aligned pointers), compiles,
and writes the binary to its cache without launching anything.  The tuner's
own launch of the same (config, specialisation) then loads it from the cache
in milliseconds.  The live batch is a run-time argument the kernels do not
specialise on, so one compile serves every batch bucket whose buffers have the
same capacity class (B_max == 1, B_max % 16 == 0, other).

Under the Triton interpreter nothing compiles; the pool is not started.
"""

from __future__ import annotations

import inspect
import multiprocessing
import os
import signal
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

INT32_LIMIT = 2**31


def batch_class(batch: int) -> str:
    """Triton's specialisation of an integer argument: 1 is a constant, multiples of 16 are aligned."""
    if batch == 1:
        return "one"
    return "div16" if batch % 16 == 0 else "plain"


@dataclass(frozen=True)
class CompileJob:
    """One kernel variant: what the launcher sees, in plain picklable values."""

    module_path: str
    kernel: str
    N: int
    H: int
    D: int
    dtype: str
    capacity: int
    batch: int
    config: tuple[tuple[str, int], ...]

    @property
    def variant(self) -> tuple[Any, ...]:
        # Only the capacity's integer specialisation reaches the compiled code (the kernels do not specialise
        # on the live batch).
        return (self.module_path, self.kernel, self.N, self.H, self.D, self.dtype,
                batch_class(self.capacity), self.config)  # fmt: skip


def needs_int64(*tensors: Any) -> bool:
    """The runtime's rule for 64-bit indexing: an offset or a size reaches 2**31 elements."""
    for tensor in tensors:
        offset = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True) if size)
        if offset >= INT32_LIMIT or tensor.numel() >= INT32_LIMIT:
            return True
    return False


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
    import torch
    from triton.errors import TritonError

    from layoutgen.config import CONFIG_TYPES
    from layoutgen.layout import LayoutBuffers
    from layoutgen.loader import load_path

    try:
        module = _modules.get(job.module_path)
        if module is None:
            module = _modules[job.module_path] = load_path(Path(job.module_path))
        dtype = getattr(torch, job.dtype)
        config = CONFIG_TYPES[job.kernel].from_dict(dict(job.config))
        bufs = LayoutBuffers.allocate(module.SPEC, job.N, job.capacity, job.H, job.D, dtype, "meta")
        name = "_pack_kernel" if job.kernel == "pack" else "_combine_kernel"
        warm = _WarmupOnly(getattr(module, name))
        if job.kernel == "pack":
            out = torch.empty(job.batch, job.H, job.D, dtype=dtype, device="meta")
            lse = torch.empty(job.batch, job.H, dtype=torch.float32, device="meta")
            args: tuple[Any, ...] = (out, lse, bufs, job.batch, config, needs_int64(out, lse, *bufs.tensors.values()))
            launcher = module._launch_pack
        else:
            out = torch.empty(job.batch, job.H // job.N, job.D, dtype=dtype, device="meta")
            args = (bufs, job.batch, out, None, False, config, needs_int64(out, *bufs.tensors.values()))
            launcher = module._launch_combine
        if "kernel" in inspect.signature(launcher).parameters:
            launcher(*args, kernel=warm)
        else:  # launchers that read the module global
            setattr(module, name, warm)
            try:
                launcher(*args)
            finally:
                setattr(module, name, warm.kernel)
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
