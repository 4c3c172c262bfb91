"""A whole `layoutgen tune` run: prepare the studies, search (here or in one worker process per GPU),
then write the decisions into the tuning database and print the tables."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from layoutgen.files import directories_for, nearest_existing, regular_file_problem, replace_atomically
from layoutgen.signals import sigterm_interrupts, terminated_by_sigterm
from layoutgen.tuning.compile import child_environment
from layoutgen.tuning.plan import (
    TuneOptions,
    database_entries,
    decided,
    make_targets,
    search_plan,
    study_name,
    target_buckets,
)
from layoutgen.tuning.procedure import MAX_ROTATING_SETS
from layoutgen.tuning.report import ProgressReporter, ResultRow, markdown, result_lines, summary_lines
from layoutgen.tuning.results import collect, study_state
from layoutgen.tuning.storage import describe_storage, open_storage
from layoutgen.tuning.worker import GATE_FAILURE_EXIT, SETUP_FAILURE_EXIT

POLL_INTERVAL_S = 3.0


@dataclass
class RunSummary:
    rows: list[ResultRow]
    device_name: str
    db_path: Path | None
    gate_failures: int
    unfinished: int
    worker_errors: list[str] = field(default_factory=list)
    interrupted: bool = False
    #: "label: reason" of every study decided with no config that ran (no entry written).
    undecidable: list[str] = field(default_factory=list)
    #: "label: reason" of every study whose kernel computed a wrong result for a config (no entry written).
    wrong_results: list[str] = field(default_factory=list)


def visible_gpus() -> list[str]:
    """The CUDA devices this process may use, as CUDA_VISIBLE_DEVICES entries."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    listed = [item.strip() for item in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if item.strip()]
    return listed[:count] if listed else [str(index) for index in range(count)]


def resolve_workers(value: str, interpret: bool) -> int:
    """`--workers auto` is one per visible GPU (1 under the interpreter); otherwise a positive int."""
    if value == "auto":
        return 1 if interpret else max(1, len(visible_gpus()))
    try:
        workers = int(value)
    except ValueError:
        raise ValueError(f"--workers must be 'auto' or a positive integer, got {value!r}") from None
    if workers < 1:
        raise ValueError(f"--workers must be 'auto' or a positive integer, got {value!r}")
    return workers


def device_l2(options: TuneOptions) -> int:
    """The L2 size the workers' timing rotation is sized by (0 under the interpreter: one input set)."""
    if options.interpret:
        return 0
    import torch

    from layoutgen.tuning.timing import device_l2_bytes

    return device_l2_bytes(torch.cuda.current_device())


def held_decisions(held: dict[str, Any], options: TuneOptions) -> tuple[list[str], int, int]:
    """Of the database's entries for a run's studies (`plan.database_entries`): the names of the studies they
    decide (sorted: the run skips them), how many were tuned under other conditions (tuned again), and how
    many were decided on fewer trials than the run asks for (searched further, resumed where the study
    storage still holds them)."""
    l2_bytes = device_l2(options)
    current: list[str] = []
    retimed = searched_less = 0
    for name, (target, bucket, entry) in held.items():
        if not decided(entry, target, bucket, l2_bytes):
            if (entry.spec_hash, entry.source_hash) == (target.spec_hash, target.source_hash):
                retimed += 1  # the same kernel, timed or searched under other conditions
        elif entry.trials < search_plan(target.problem, bucket, options).budget:
            searched_less += 1  # a --time-budget that ran out, or a smaller --trials
        else:
            current.append(name)
    return sorted(current), retimed, searched_less


def check_report_path(report: Path) -> None:
    """Refuse a `--report` path that cannot be written before the search, not after it (ValueError): anything
    there but a regular file, and a directory that does not take a temporary file (tried in the nearest one
    that exists: the report's own directories are created when it is written, so a dry run or a refused run
    leaves none behind)."""
    if report.is_dir():
        raise ValueError(f"--report {report} is a directory; pass the path of a markdown file to write")
    problem = regular_file_problem(report) if os.path.lexists(report) else "no such file"
    if problem is not None and problem != "no such file":
        raise ValueError(f"--report {report} {problem}; pass the path of a markdown file to write")
    existing = nearest_existing(report.parent)
    try:
        if problem is None:
            # Opened for appending and closed: nothing is truncated before the run has a report to write.
            os.close(os.open(report, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NONBLOCK", 0)))
        else:
            with tempfile.NamedTemporaryFile(dir=existing, prefix=f".{report.name}.", suffix=".tmp"):
                pass
    except OSError as error:
        raise ValueError(
            f"--report {report} cannot be written ({error.strerror or error}); pass a writable path"
        ) from None


def run(options: TuneOptions, console: Console) -> RunSummary:
    """Tune everything `options` covers; writes the database (after every family, and at the end also what
    an interrupted family decided) and returns what the tables show."""
    import optuna

    from layoutgen.tuning.context import device_identity
    from layoutgen.tuning.prepare import end_retune, latest_decided_study, prepare_study, retune_study
    from layoutgen.tuning.worker import run_worker

    if options.report:
        check_report_path(Path(options.report))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if options.interpret:
        # Kernels are defined when their module is imported; the interpreter must be on before that.
        os.environ["TRITON_INTERPRET"] = "1"
    device_name, capability = device_identity(options)
    targets = make_targets(options)

    def buckets_of(target: Any) -> list[int]:
        return target_buckets(options, target)

    total = sum(len(buckets_of(target)) for target in targets)
    held = database_entries(options.db_dir, device_name, targets, options) if options.db_dir is not None else {}
    current, retimed, searched_less = held_decisions(held, options)
    if not options.retune:
        if current:
            options = dataclasses.replace(options, skip=tuple(current))
            console.print(
                f"{len(current)} of {total} studies already have a current decision in "
                f"{options.db_dir}: skipped (--retune tunes them again)",
                markup=False,
                soft_wrap=True,  # a path is never folded
            )
        if retimed:
            console.print(
                f"{retimed} database entries were tuned under other conditions than this tuner's (another "
                "search space, timing procedure, number of rotating input sets, triton or torch): tuned again",
                markup=False,
            )
        if searched_less:
            console.print(
                f"{searched_less} database entries were decided on fewer trials than this run's budget (a "
                "--time-budget that ran out, or a smaller --trials): searched further",
                markup=False,
            )
    storage = open_storage(options.storage)
    renamed = []
    for target in targets:
        for bucket in buckets_of(target):
            name = study_name(device_name, target, bucket)
            # A --retune searches a fresh study (or resumes its own); a plain run reads the newest decision.
            fresh = (
                retune_study(storage, name, name in current) if options.retune else latest_decided_study(storage, name)
            )
            if fresh != name:
                renamed.append((name, fresh))
    options = dataclasses.replace(options, renamed=tuple(renamed))
    names = []
    skip = set(options.skip)
    with console.status(f"preparing {total} studies in {escape(describe_storage(options.storage))}"):
        for target in targets:
            for bucket in buckets_of(target):
                name = study_name(device_name, target, bucket)
                if name in skip:
                    continue
                recorded = held[name][2].config if name in held else None
                names.append(prepare_study(storage, options, device_name, target, bucket, recorded)[0])
    if not names:
        console.print("nothing to tune: every study of this run is decided in the database", markup=False)
        return RunSummary([], device_name, None, 0, 0)
    console.print(
        f"tuning {len(names)} studies ({len(targets)} compiled families and their size buckets"
        + (f", less {len(skip)} decided" if skip else "")
        + f") on {device_name}, {options.workers} worker(s)",
        markup=False,
    )
    # A line of its own, never folded: a path.
    console.print(f"studies in {describe_storage(options.storage)}", markup=False, soft_wrap=True)
    gate_failures = 0
    worker_errors: list[str] = []
    interrupted = False
    timed = not options.interpret
    reporter = ProgressReporter(console, total=len(names), timed=timed)
    try:
        with reporter, sigterm_interrupts():
            if options.workers <= 1:
                gate_failures = run_worker(options, 0, reporter, storage)
            else:
                gate_failures, worker_errors = _run_workers(options, storage, names, reporter)
    except KeyboardInterrupt:
        interrupted = True
    if options.retune and not interrupted:
        end_retune(storage, names)
    rows, entries = collect(storage, names, targets, options, device_name, buckets_of)
    db_path = None
    if entries and options.db_dir is not None:
        from layoutgen.tuning.recorded import smallest_buckets
        from layoutgen.tuning_db import read_database, record

        db_path = record(Path(options.db_dir), device_name, capability, entries)
        held = read_database(db_path).entries
        recorded = held.values()
        for entry in entries:
            kept = held.get(entry.key.as_str())
            if kept is not None and kept != entry:  # a later measured_at won the merge (a writer, or a clock ahead)
                console.print(
                    f"note: {entry.key.as_str()}: the database keeps its entry measured at {kept.measured_at}, later "
                    f"than this run's {entry.measured_at}; a date in the future (a clock ahead, an edit) keeps it "
                    "over every tuning until then: `layoutgen db check` names such entries",
                    markup=False,
                    highlight=False,
                    soft_wrap=True,
                )
        for key, smallest in smallest_buckets(recorded, [entry.key for entry in entries]).items():
            # Dispatch's rule (`pick_bucket`) says nothing at run time; say it where the buckets are chosen.
            console.print(
                f"note: {key.shape_text()}: {key.bucket_name} < {smallest} runs the config of {key.bucket_name}="
                f"{smallest}, the smallest tuned, which can lose to the default there: tune the sizes you serve",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
    if rows and not interrupted:
        copy = next((r.copy_tbps for r in rows if r.copy_tbps), None)
        suffix = f" ({device_name}" + (f", copy {copy:.2f} TB/s)" if copy else ")")
        # Rows are whole lines (grep, `| head`); the tables fit the console, or fall back to a line per study.
        for line in result_lines(rows, suffix, timed=timed, width=console.width):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        for line in summary_lines(rows, timed=timed):
            console.print(line, markup=False, highlight=False)
    if options.report and rows:
        from layoutgen.tuning_db import software_versions, utc_now

        copy = next((r.copy_tbps for r in rows if r.copy_tbps), None)
        header = [
            f"# layoutgen tune: {device_name}",
            "",
            f"{utc_now()}; {', '.join(f'{k} {v}' for k, v in software_versions().items())}; "
            f"{len(rows)} studies; device copy bandwidth "
            + (f"{copy:.2f} TB/s (read + write)." if copy else "not measured."),
        ]
        if timed:
            header += [
                "",
                f"Timing: CUDA-graph replays, median per call; inputs rotate over up to {MAX_ROTATING_SETS} sets "
                "while one call's bytes fit in twice the L2 cache; a kernel declared with `resident_timing` "
                "is also timed from one L2-resident set where a call fits in the L2, and its µs there are "
                'the geometric mean of the two states. "tuned µs" is the recorded config\'s median from '
                'the final interleaved re-timing with the default; "kept" says which config the database holds.',
            ]
        write_report(Path(options.report), markdown(rows, header, timed=timed) + "\n")
    unfinished = sum(1 for row in rows if not row.finished)
    undecided = [row for row in rows if row.finished and row.chosen is None]
    wrong_results = [f"{row.label}: {row.reason}" for row in undecided if row.wrong_results]
    undecidable = [f"{row.label}: {row.reason}" for row in undecided if not row.wrong_results]
    return RunSummary(
        rows, device_name, db_path, gate_failures, unfinished, worker_errors, interrupted, undecidable, wrong_results
    )


def write_report(path: Path, text: str) -> None:
    """Write the markdown report whole (beside it, then renamed over it), creating its directories."""
    with directories_for(path):
        replace_atomically(path, text)


def _run_workers(options: TuneOptions, storage: Any, names: list[str], reporter: Any) -> tuple[int, list[str]]:
    """One `python -m layoutgen.tuning.worker` per GPU (CUDA_VISIBLE_DEVICES each), sharing the studies;
    this process only polls the storage for progress."""
    gpus = [] if options.interpret else visible_gpus()
    if not options.interpret and len(gpus) < options.workers:
        raise ValueError(f"--workers {options.workers} needs as many visible GPUs; found {len(gpus)}")
    processes = []
    # The workers load the run's specs: they need the families registered here (`register` too).
    environment = {**os.environ, **child_environment()}
    for index in range(options.workers):
        env = dict(environment)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[index]
        command = [sys.executable, "-m", "layoutgen.tuning.worker", str(index), options.to_json()]
        processes.append(subprocess.Popen(command, env=env))
    pending = set(names)
    try:
        while any(process.poll() is None for process in processes):
            pending = _poll(storage, pending, reporter)
            time.sleep(POLL_INTERVAL_S)
    except KeyboardInterrupt:
        # Pass the signal on: a Ctrl-C at a terminal reached the workers too (they ignore a second one), but a
        # SIGTERM or SIGINT sent to this process alone did not.  Then give them time to mark their trials
        # interrupted.
        signum = signal.SIGTERM if terminated_by_sigterm() else signal.SIGINT
        for process in processes:
            if process.poll() is None:
                process.send_signal(signum)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        raise
    _poll(storage, pending, reporter)
    gate_failures, problems = 0, []
    for index, process in enumerate(processes):
        if process.returncode == GATE_FAILURE_EXIT:
            gate_failures += 1
        elif process.returncode == SETUP_FAILURE_EXIT:
            problems.append(f"worker {index} could not load the run's families or specs (its error is above)")
        elif process.returncode != 0:
            problems.append(f"worker {index} exited with status {process.returncode}")
    return gate_failures, problems


def _poll(storage: Any, pending: set[str], reporter: Any) -> set[str]:
    still = set()
    for name in sorted(pending):
        meta, final, evaluated, best = study_state(storage, name)
        shape = " ".join(f"{k}={v}" for k, v in meta["extents"].items())
        label = f"{meta['spec']} {meta['kernel']} {shape} {meta['dtype']} {meta['bucket_name']}={meta['bucket']}"
        reporter.update(name, label, evaluated, int(meta["budget"]), best, bool(final))
        if not final:
            still.add(name)
    return still
