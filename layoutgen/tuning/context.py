"""What every study of one worker process shares: options, storage, device, timer, compile pool, reporter."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from layoutgen.tuning.claims import worker_id
from layoutgen.tuning.compile import CompilePool
from layoutgen.tuning.plan import TuneOptions


class Reporter(Protocol):
    def update(self, name: str, label: str, evaluated: int, budget: int, best_us: float | None, done: bool) -> None: ...

    def error(self, message: str) -> None: ...

    def info(self, message: str) -> None: ...


class QuietReporter:
    def update(self, name: str, label: str, evaluated: int, budget: int, best_us: float | None, done: bool) -> None:
        return None

    def error(self, message: str) -> None:
        import sys

        print(f"error: {message}", file=sys.stderr, flush=True)

    def info(self, message: str) -> None:
        return None


@dataclass
class Context:
    """What every study of one worker process shares."""

    options: TuneOptions
    storage: Any
    device: Any  # torch.device
    device_name: str
    compute_capability: str
    timer: Any
    pool: CompilePool
    l2_bytes: int
    copy_tbps: float | None
    reporter: Reporter
    worker: str = field(default_factory=worker_id)
    gate_failures: int = 0
    #: Kernel variants launched here for the first time, and how many of those took long enough to have
    #: been compiled in this process (the compile pool missed them: a diagnostic for the pool).
    variants_seen: set[tuple[Any, ...]] = field(default_factory=set)
    slow_first_launches: int = 0
    #: Where the evaluated trials' wall time went (seconds): compile wait, gate, timing; and their count.
    phase_seconds: dict[str, float] = field(
        default_factory=lambda: {"compile wait": 0.0, "gate and first launch": 0.0, "timing": 0.0}
    )
    trials_evaluated: int = 0


def make_context(options: TuneOptions, storage: Any, reporter: Reporter) -> Context:
    import torch

    from layoutgen.tuning.compile import default_compile_workers
    from layoutgen.tuning.timing import CudaGraphTimer, WallClockTimer, copy_bandwidth_tbps, device_l2_bytes
    from layoutgen.tuning_db import CPU_INTERPRETER_DEVICE, current_device

    if options.interpret:
        return Context(options, storage, torch.device("cpu"), CPU_INTERPRETER_DEVICE, "none", WallClockTimer(),
                       CompilePool(0), 0, None, reporter)  # fmt: skip
    found = current_device()
    if found is None:
        raise RuntimeError("no CUDA device is visible; tune on a GPU, or run the pipeline on CPU with --interpret")
    name, capability = found
    device = torch.device("cuda", torch.cuda.current_device())
    l2_bytes = device_l2_bytes(device)
    workers = (
        options.compile_workers if options.compile_workers is not None else default_compile_workers(options.workers)
    )
    pool = CompilePool(workers)
    copy_tbps = copy_bandwidth_tbps(device)
    return Context(options, storage, device, name, capability, CudaGraphTimer(), pool, l2_bytes, copy_tbps, reporter)


def phase_summary(ctx: Context, seconds: float) -> str:
    """Where the search's wall time went, per evaluated trial: what to shorten when a grid takes too long."""
    per_trial = {name: 1e3 * value / ctx.trials_evaluated for name, value in ctx.phase_seconds.items()}
    rest = 1e3 * seconds / ctx.trials_evaluated - sum(per_trial.values())
    parts = ", ".join(f"{name} {value:.1f}" for name, value in per_trial.items())
    return (
        f"{ctx.trials_evaluated} trials in {seconds:.0f} s; ms per trial: {parts}, the rest (sampler, storage, "
        f"final re-timing) {rest:.1f}"
    )


def device_identity(options: TuneOptions) -> tuple[str, str]:
    from layoutgen.tuning_db import CPU_INTERPRETER_DEVICE, current_device

    if options.interpret:
        return CPU_INTERPRETER_DEVICE, "none"
    found = current_device()
    if found is None:
        raise RuntimeError("no CUDA device is visible; tune on a GPU, or run the pipeline on CPU with --interpret")
    return found
