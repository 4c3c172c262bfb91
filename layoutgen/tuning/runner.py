"""A whole `layoutgen tune` run: prepare the studies, search (here or in one worker process per GPU),
then write the decisions into the tuning database and print the tables."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from layoutgen.tuning.plan import TuneOptions, database_entries, decided, make_targets, study_name, tuning_key
from layoutgen.tuning.report import ProgressReporter, ResultRow, markdown, result_tables, summary_lines
from layoutgen.tuning.storage import describe_storage, open_storage
from layoutgen.tuning.timing import MAX_ROTATING_SETS

#: Exit code of a worker that found a config failing the correctness gate.
GATE_FAILURE_EXIT = 3
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


def _study_state(storage: Any, name: str) -> tuple[dict[str, Any], dict[str, Any] | None, int, float | None]:
    from layoutgen.tuning.study import EVALUATED

    study_id = storage.get_study_id_from_name(name)
    attrs = storage.get_study_user_attrs(study_id)
    trials = storage.get_all_trials(study_id, deepcopy=False)
    results = [t.user_attrs.get("result") or {} for t in trials]
    evaluated = sum(1 for r in results if r.get("outcome") in EVALUATED)
    # A worker records a trial's result before it tells optuna the value: skip those not told yet.
    measured = (t.value for t, r in zip(trials, results, strict=True) if r.get("outcome") == "measured")
    best = min((value for value in measured if value is not None), default=None)
    return attrs["layoutgen"], attrs.get("final"), evaluated, best


def device_l2(options: TuneOptions) -> int:
    """The L2 size the workers' timing rotation is sized by (0 under the interpreter: one input set)."""
    if options.interpret:
        return 0
    import torch

    from layoutgen.tuning.timing import device_l2_bytes

    return device_l2_bytes(torch.cuda.current_device())


def run(options: TuneOptions, console: Console) -> RunSummary:
    """Tune everything `options` covers; writes the database (after every family, and at the end also what
    an interrupted family decided) and returns what the tables show."""
    import optuna

    from layoutgen.tuning.study import device_identity, prepare_study, run_worker

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if options.interpret:
        # Kernels are defined when their module is imported; the interpreter must be on before that.
        os.environ["TRITON_INTERPRET"] = "1"
    device_name, capability = device_identity(options)
    targets = make_targets(options)
    buckets = sorted(set(options.buckets))
    held = database_entries(options.db_dir, device_name, targets, buckets) if options.db_dir is not None else {}
    if not options.retune:
        l2_bytes = device_l2(options)
        current: list[str] = []
        retimed = 0
        for name, (target, batch, entry) in held.items():
            if decided(entry, target, batch, l2_bytes):
                current.append(name)
            elif (entry.spec_hash, entry.source_hash) == (target.spec_hash, target.source_hash):
                retimed += 1  # the same kernel, timed under other conditions
        current.sort()
        if current:
            options = dataclasses.replace(options, skip=tuple(current))
            console.print(
                f"{len(current)} of {len(targets) * len(buckets)} studies already have a current decision in "
                f"{options.db_dir}: skipped (--retune tunes them again)"
            )
        if retimed:
            console.print(
                f"{retimed} database entries were timed under other conditions than this tuner's (another "
                "number of rotating input sets or another timing rule, or not recorded): tuned again"
            )
    storage = open_storage(options.storage)
    names = []
    skip = set(options.skip)
    with console.status(f"preparing {len(targets) * len(buckets)} studies in {describe_storage(options.storage)}"):
        for target in targets:
            for batch in buckets:
                name = study_name(device_name, target, batch)
                if name in skip:
                    continue
                recorded = held[name][2].config if name in held else None
                prepare_study(storage, options, device_name, target, batch, recorded)
                names.append(name)
    if not names:
        console.print("nothing to tune: every study of this run is decided in the database")
        return RunSummary([], device_name, None, 0, 0)
    console.print(
        f"tuning {len(names)} studies ({len(targets)} compiled families x {len(buckets)} batch buckets"
        + (f", less {len(skip)} decided" if skip else "")
        + ") on "
        f"{device_name}; studies in {describe_storage(options.storage)}; {options.workers} worker(s)"
    )
    gate_failures = 0
    worker_errors: list[str] = []
    interrupted = False
    reporter = ProgressReporter(console, total=len(names))
    try:
        with reporter, _sigterm_interrupts():
            if options.workers <= 1:
                gate_failures = run_worker(options, 0, reporter, storage)
            else:
                gate_failures, worker_errors = _run_workers(options, storage, names, reporter)
    except KeyboardInterrupt:
        interrupted = True
    rows, entries = collect(storage, names, targets, buckets, device_name)
    db_path = None
    if entries and options.db_dir is not None:
        from layoutgen.tuning_db import record

        db_path = record(Path(options.db_dir), device_name, capability, entries)
    if rows and not interrupted:
        copy = next((r.copy_tbps for r in rows if r.copy_tbps), None)
        suffix = f" ({device_name}" + (f", copy {copy:.2f} TB/s)" if copy else ")")
        # A log file (no terminal) gets the tables at full width rather than squeezed into 80 columns.
        wide = console if console.is_terminal else Console(file=console.file, width=max(console.width, 150))
        for table in result_tables(rows, suffix):
            wide.print(table)
        for line in summary_lines(rows):
            console.print(line)
    if options.report and rows:
        from layoutgen.tuning_db import software_versions, utc_now

        copy = next((r.copy_tbps for r in rows if r.copy_tbps), None)
        timer = "wall clock under the Triton interpreter" if options.interpret else "CUDA-graph replays"
        header = [
            f"# layoutgen tune: {device_name}",
            "",
            f"{utc_now()}; {', '.join(f'{k} {v}' for k, v in software_versions().items())}; "
            f"{len(rows)} studies; device copy bandwidth "
            + (f"{copy:.2f} TB/s (read + write)." if copy else "not measured."),
            "",
            f"Timing: {timer}, median per call; inputs rotate over up to {MAX_ROTATING_SETS} sets while one call's "
            'bytes fit in twice the L2 cache. "tuned µs" is the recorded config\'s median from the final interleaved '
            're-timing with the default; "kept" says which config the database holds.',
        ]
        Path(options.report).write_text(markdown(rows, header) + "\n", encoding="utf-8")
    unfinished = sum(1 for row in rows if row.chosen is None)
    return RunSummary(rows, device_name, db_path, gate_failures, unfinished, worker_errors, interrupted)


def collect(
    storage: Any, names: list[str], targets: list[Any], buckets: list[int], device_name: str
) -> tuple[list[ResultRow], list[Any]]:
    """Result rows for every study and database entries for every decided one."""
    from layoutgen.tuning_db import TuningEntry

    rows, entries = [], []
    for target in targets:
        for batch in buckets:
            name = study_name(device_name, target, batch)
            if name not in names:
                continue
            meta, final, evaluated, _ = _study_state(storage, name)
            rows.append(ResultRow.from_study(meta, final, evaluated))
            if not final or not final.get("chosen"):
                continue
            entries.append(
                TuningEntry(
                    key=tuning_key(target, batch),
                    config=final["config"],
                    median_us=final["median_us"],
                    p20_us=final["p20_us"],
                    p80_us=final["p80_us"],
                    default_us=final["default_us"],
                    trials=final["trials"],
                    spec_hash=target.spec_hash,
                    source_hash=target.source_hash,
                    measured_at=final["measured_at"],
                    rotating_sets=final["sets"],
                    timing_rule=final["timing_rule"],
                )
            )
    return rows, entries


def _run_workers(options: TuneOptions, storage: Any, names: list[str], reporter: Any) -> tuple[int, list[str]]:
    """One `python -m layoutgen.tuning.worker` per GPU (CUDA_VISIBLE_DEVICES each), sharing the studies;
    this process only polls the storage for progress."""
    gpus = [] if options.interpret else visible_gpus()
    if not options.interpret and len(gpus) < options.workers:
        raise ValueError(f"--workers {options.workers} needs as many visible GPUs; found {len(gpus)}")
    processes = []
    for index in range(options.workers):
        env = dict(os.environ)
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
        # The workers got the same SIGINT; give them time to mark their trials interrupted.
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
        elif process.returncode != 0:
            problems.append(f"worker {index} exited with status {process.returncode}")
    return gate_failures, problems


def _poll(storage: Any, pending: set[str], reporter: Any) -> set[str]:
    still = set()
    for name in sorted(pending):
        meta, final, evaluated, best = _study_state(storage, name)
        label = f"{meta['spec']} {meta['kernel']} N={meta['N']} H/N={meta['heads_per_peer']} D={meta['D']} B={meta['batch']}"
        reporter.update(name, label, evaluated, int(meta["budget"]), best, bool(final))
        if not final:
            still.add(name)
    return still


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a job limit, `timeout`) stops the search like Ctrl-C: in-flight trials are marked
    interrupted and what was decided is still written."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def worker_main(argv: list[str]) -> int:
    """Entry of a worker process: `python -m layoutgen.tuning.worker INDEX OPTIONS_JSON`."""
    from layoutgen.tuning.study import QuietReporter, run_worker

    index, options = int(argv[0]), TuneOptions.from_json(argv[1])
    if options.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        with _sigterm_interrupts():
            gate_failures = run_worker(options, index, QuietReporter())
    except KeyboardInterrupt:
        return 130
    return GATE_FAILURE_EXIT if gate_failures else 0
