"""One tuning worker (one GPU) of a run: `python -m layoutgen.tuning.worker INDEX OPTIONS_JSON`, or
`run_worker` in the run's own process."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import optuna

from layoutgen.tuning.context import Context, QuietReporter, Reporter, make_context, phase_summary
from layoutgen.tuning.objective import Target
from layoutgen.tuning.plan import TuneOptions, run_study_name, study_name
from layoutgen.tuning.search import SLOW_FIRST_LAUNCH_S, search_family

#: Exit code of a worker that found a config failing the correctness gate.
GATE_FAILURE_EXIT = 3
#: Exit code of a worker that could not load the run's families or specs (its one-line error is on stderr).
SETUP_FAILURE_EXIT = 2


def record_family(ctx: Context, target: Target, buckets: list[int]) -> None:
    """Write a family's decisions as soon as it is searched: a run that dies later (a lent GPU host taken
    back, SIGKILL) keeps them, and a re-run skips them even without the study storage."""
    if ctx.options.db_dir is None:
        return
    from pathlib import Path

    from layoutgen.tuning.results import collect
    from layoutgen.tuning_db import record

    names = [run_study_name(ctx.options, ctx.device_name, target, bucket) for bucket in buckets]
    _, entries = collect(ctx.storage, names, [target], ctx.options, ctx.device_name, lambda _: buckets)
    if entries:
        record(Path(ctx.options.db_dir), ctx.device_name, ctx.compute_capability, entries)


def run_worker(options: TuneOptions, worker_index: int, reporter: Reporter, storage: Any = None) -> int:
    """Search every family of the run (starting at this worker's share); returns the gate failures."""
    from layoutgen.tuning.plan import make_targets, target_buckets
    from layoutgen.tuning.storage import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage if storage is not None else open_storage(options.storage)
    ctx = make_context(options, storage, reporter)
    skip = set(options.skip)
    families = [
        (target, [b for b in target_buckets(options, target) if study_name(ctx.device_name, target, b) not in skip])
        for target in make_targets(options)
    ]
    families = [(target, buckets) for target, buckets in families if buckets]  # all decided: nothing to compile
    start = (worker_index * len(families)) // max(1, options.workers)
    ordered = families[start:] + families[:start]
    budget_per_family = None if options.time_budget_s is None else options.time_budget_s / max(1, len(families))
    started = time.perf_counter()
    try:
        for target, buckets in ordered:
            deadline = None if budget_per_family is None else time.monotonic() + budget_per_family
            search_family(ctx, target, buckets, deadline)
            record_family(ctx, target, buckets)
            if ctx.device.type == "cuda":
                import torch

                torch.cuda.empty_cache()
    finally:
        ctx.pool.close()
        if ctx.pool.setup_failures:
            reporter.error(
                f"compile pool: {ctx.pool.setup_failures} of {ctx.pool.submitted} kernel variants could not be "
                f"compiled ahead ({ctx.pool.setup_problem}); each compiled at its first launch instead, slower: a "
                "family registered in the tuner's process must be importable from its sys.path"
            )
    if ctx.trials_evaluated:
        reporter.info(phase_summary(ctx, time.perf_counter() - started))
    if ctx.pool.workers and ctx.variants_seen:
        reporter.info(
            f"compile pool: {ctx.pool.submitted} kernel variants compiled ahead; {ctx.slow_first_launches} of "
            f"{len(ctx.variants_seen)} first launches took over {SLOW_FIRST_LAUNCH_S} s (compiled in this process)"
        )
    return ctx.gate_failures


def worker_main(argv: list[str]) -> int:
    """Entry of a worker process: `python -m layoutgen.tuning.worker INDEX OPTIONS_JSON`."""
    from layoutgen.settings import SettingError
    from layoutgen.signals import interrupted_once
    from layoutgen.spec import SpecError

    index, options = int(argv[0]), TuneOptions.from_json(argv[1])
    if options.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        with interrupted_once():
            gate_failures = run_worker(options, index, QuietReporter())
    except KeyboardInterrupt:
        return 130
    except (SpecError, SettingError) as error:
        print(f"error: worker {index}: {error}", file=sys.stderr, flush=True)
        return SETUP_FAILURE_EXIT
    return GATE_FAILURE_EXIT if gate_failures else 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
