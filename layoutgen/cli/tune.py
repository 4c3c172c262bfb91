"""`layoutgen tune`: search launch configs per GPU with Optuna and record the winners; the work is in
`layoutgen.tuning`."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from layoutgen.cli.common import CommandFailed, bad_input, check_writable_dir, console, errors, parse_shape, say
from layoutgen.spec import SpecError


def default_db_dir(interpret: bool) -> Path:
    """Where winners go without --db: the checkout's tuning_db/ (what dispatch reads) for a GPU; the cache
    for the interpreter, whose timings must not land in the repository."""
    from layoutgen.loader import source_root
    from layoutgen.tuning.storage import cache_dir

    root = source_root()
    if interpret or root is None:
        return cache_dir() / "tuning_db"
    return root / "tuning_db"


def check_spec_source(source: str) -> None:
    """A `--spec` value is a bundled name, or a spec YAML or generated .py that is a regular file."""
    from layoutgen.files import regular_file_problem
    from layoutgen.spec import NAME_PATTERN, bundled_spec_paths, load_spec

    path = Path(source)
    if re.fullmatch(NAME_PATTERN, source) and not path.exists():
        known = [p.stem for p in bundled_spec_paths()]
        if source not in known:
            raise bad_input(
                f"--spec {source}: no bundled spec of that name and no such file; bundled: {', '.join(known)}"
            )
        return
    problem = regular_file_problem(path)
    if problem is not None:
        raise bad_input(f"--spec {source}: {problem}; pass a bundled spec name, a spec .yaml or a generated .py")
    if path.suffix in (".yaml", ".yml"):
        load_spec(path)  # a SpecError is the usual report (exit 2)
    elif path.suffix != ".py":
        raise bad_input(f"--spec {source}: not a .yaml spec or a generated .py module")


def tune(
    spec: Annotated[
        list[str] | None,
        typer.Option(
            "--spec",
            metavar="NAME|FILE",
            help="Bundled spec name, spec YAML or generated .py (repeatable). Default: all bundled.",
        ),
    ] = None,
    kernel: Annotated[
        list[str] | None,
        typer.Option("--kernel", metavar="NAME", help="Kernel name, e.g. pack (repeatable). Default: all."),
    ] = None,
    shape: Annotated[
        list[str] | None,
        typer.Option(
            "--shape",
            metavar="NAME=V[,V...]",
            help="Grid values of one axis, NAME=V[,V...] (repeatable), e.g. --shape N=4,8; axes not given take "
            "their family's defaults. Families' aliases work too (DCP: --N, --heads, --D). See `layoutgen families`.",
        ),
    ] = None,
    dtype: Annotated[
        list[str] | None, typer.Option("--dtype", metavar="DTYPE", help="Activation dtype (repeatable).")
    ] = None,
    bucket: Annotated[
        list[int] | None,
        typer.Option(
            "--bucket",
            min=1,
            metavar="SIZE",
            help="Size buckets (repeatable; DCP alias --batch). Default: the family's.",
        ),
    ] = None,
    trials: Annotated[
        int | None,
        typer.Option(
            "--trials",
            min=1,
            metavar="N",
            help="Measured trials per TPE study (default 24). Not a cap: spaces of at most --exhaustive-limit "
            "points are searched exhaustively (every point, plus the final re-timing) whatever this says.",
        ),
    ] = None,
    time_budget: Annotated[
        float | None,
        typer.Option(
            "--time-budget",
            min=1.0,
            metavar="SECONDS",
            help="Seconds of search for the whole run, split over families.",
        ),
    ] = None,
    exhaustive_limit: Annotated[
        int | None,
        typer.Option("--exhaustive-limit", min=0, metavar="POINTS", help="Search spaces this small exhaustively (64)."),
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage",
            metavar="URL|FILE",
            help="Optuna storage URL (postgresql://...) or journal file. Default: user cache.",
        ),
    ] = None,
    workers: Annotated[
        str, typer.Option("--workers", metavar="auto|K", help="'auto' (one process per visible GPU) or a count.")
    ] = "auto",
    db: Annotated[
        Path | None,
        typer.Option("--db", metavar="DIR", help="Tuning database directory. Default: the checkout's tuning_db/."),
    ] = None,
    interpret: Annotated[
        bool,
        typer.Option(
            "--interpret",
            help="Run the pipeline on CPU (Triton interpreter, tiny shapes); its times are not kernel timings.",
        ),
    ] = False,
    report: Annotated[
        Path | None, typer.Option("--report", metavar="FILE", help="Also write the result tables as markdown.")
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", metavar="N", help="Sampler seed (studies derive their own from it).")
    ] = 0,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the studies and their search plans; tune nothing.")
    ] = False,
    retune: Annotated[
        bool,
        typer.Option("--retune", help="Tune again the studies the database already holds a current decision for."),
    ] = False,
) -> None:
    """Tune launch configs per (spec, kernel, shape, dtype, size bucket) into the tuning database.

    Each family declares its default grid (`layoutgen families`). Re-running the same command resumes:
    finished trials are not repeated, and studies whose decision the database already holds (current for the
    spec, kernel source, search space, timing procedure, triton and torch) are skipped, also on a machine
    without the study storage; --retune tunes them again.
    """
    from layoutgen.tuning import plan
    from layoutgen.tuning.runner import resolve_workers, run

    if trials is not None and time_budget is not None:
        raise bad_input("give --trials or --time-budget, not both")
    grid = parse_shape(shape or [])
    for source in spec or ():
        check_spec_source(source)
    db_dir = db if db is not None else default_db_dir(interpret)
    # Found now (a dry run too), not after the whole search: where the studies, the decisions and the report
    # go must take them.
    check_writable_dir(db_dir, f"--db {db_dir}" if db is not None else f"the tuning database directory {db_dir}")
    if storage is not None and "://" not in storage:
        check_writable_dir(Path(storage).expanduser().parent, f"--storage {storage}")
    if report is not None:
        from layoutgen.tuning.runner import check_report_path
        from layoutgen.tuning.storage import default_journal_path

        journal = default_journal_path() if storage is None else Path(storage).expanduser()
        target = report.resolve()
        if target.parent == db_dir.resolve() and target.suffix == ".json":
            raise bad_input(f"--report {report} would replace a tuning database file in {db_dir}; name a markdown file")
        if (storage is None or "://" not in storage) and target == journal.resolve():
            raise bad_input(f"--report {report} is the study journal; name a markdown file of its own")
        check_writable_dir(report.parent, f"--report {report}")  # names a regular file in the way
        try:
            check_report_path(report)
        except ValueError as error:
            raise bad_input(str(error)) from None
    try:
        options = plan.TuneOptions(
            specs=tuple(spec or ()),
            kernels=tuple(kernel or ()),
            grid=tuple((name, tuple(values)) for name, values in grid.items()),
            dtypes=tuple(dtype or ()),
            buckets=tuple(sorted(set(bucket or ()))),
            trials=trials or (plan.INTERPRET_TPE_TRIALS if interpret else plan.DEFAULT_TPE_TRIALS)
            if time_budget is None
            else 10**6,
            time_budget_s=time_budget,
            exhaustive_limit=exhaustive_limit
            if exhaustive_limit is not None
            else (plan.INTERPRET_EXHAUSTIVE_LIMIT if interpret else plan.DEFAULT_EXHAUSTIVE_LIMIT),
            storage=storage,
            db_dir=str(db_dir),
            interpret=interpret,
            workers=resolve_workers(workers, interpret),
            lookahead=1 if interpret else 3,
            seed=seed,
            report=str(report) if report else None,
            retune=retune,
        )
    except ValueError as error:
        raise bad_input(str(error)) from None
    if interpret:
        # The generated kernels are defined when their module is imported: the interpreter must be on first.
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        plan.make_targets(options)  # every spec loads, no two share a name, every kernel and axis exists
    except SpecError:
        raise
    except ValueError as error:
        raise bad_input(str(error)) from None
    if dry_run:
        _print_plan(options)
        return
    try:
        summary = run(options, console)
        if summary.db_path is not None:
            decided = sum(1 for row in summary.rows if row.chosen)
            say(f"{decided} decision(s) recorded in {summary.db_path}", wrap=False)
            if interpret:
                # The directory given, not the file's: a symlinked database is read through its link there.
                say(f"dispatch on CPU reads it with LAYOUTGEN_TUNING_DB={Path(db_dir).absolute()}", wrap=False)
    except (ValueError, RuntimeError) as error:
        raise bad_input(str(error)) from None
    except KeyboardInterrupt:
        # Past the search (collecting, recording, printing): every family searched was recorded already.
        _exit_resumable()
    if summary.interrupted:
        _exit_resumable()
    if summary.worker_errors:
        raise CommandFailed("; ".join(summary.worker_errors), code=1)
    if summary.gate_failures:
        raise CommandFailed(
            f"{summary.gate_failures} config(s) failed the correctness gate: a kernel bug (see the errors above)",
            code=1,
        )
    if summary.unfinished:
        say(f"{summary.unfinished} studies have no decision yet; re-run the same command to continue", err=True)


def _print_plan(options: object) -> None:
    """A line per compiled family, then its studies as aligned cells, as many to a line as fit the console
    (80 columns through a pipe): nothing wraps or is cut, and `| head` shows whole lines."""
    from layoutgen.tuning.plan import TuneOptions, make_targets, search_plan, study_name, target_buckets

    if not isinstance(options, TuneOptions):
        raise TypeError(f"expected TuneOptions, got {type(options).__name__}")
    targets = make_targets(options)
    device_name, skipped = _decided_studies(options, targets)
    studies = trials = 0
    for target in targets:
        say(target.problem.label, "bold", wrap=False)
        cells = []
        for bucket in target_buckets(options, target):
            name = f"{target.problem.family.bucket.name}={bucket}"
            if device_name is not None and study_name(device_name, target, bucket) in skipped:
                cells.append(f"{name}: decided")
                continue
            planned = search_plan(target.problem, bucket, options)
            studies += 1
            trials += planned.budget
            mode = "ex" if planned.mode == "exhaustive" else "tpe"
            cells.append(f"{name}: {mode} {planned.budget}/{planned.space_size}")
        width = max(len(cell) for cell in cells) if cells else 0
        per_line = max(1, (console.width - 2 + 3) // (width + 3))
        for start in range(0, len(cells), per_line):
            say("  " + "   ".join(cell.ljust(width) for cell in cells[start : start + per_line]).rstrip(), wrap=False)
    say(f"{studies} studies, {trials} measured trials planned" + (f", {len(skipped)} decided" if skipped else ""))
    say("(ex: exhaustive, tpe: Optuna TPE; trials planned / feasible points)")
    if device_name is None:
        say("(no GPU here: what the database decides was not read; a run skips it)")
    elif skipped:
        say("(decided: the database holds a current decision; skipped unless --retune)")


def _decided_studies(options: Any, targets: list[Any]) -> tuple[str | None, set[str]]:
    """(device name, the studies whose current decision `--db` holds: a run skips them), as the run decides
    it; (None, empty) where no device can be named (a dry run on a machine without a GPU) or with --retune."""
    from layoutgen.tuning.context import device_identity
    from layoutgen.tuning.plan import database_entries
    from layoutgen.tuning.runner import held_decisions
    from layoutgen.tuning_db import DatabaseError

    try:
        device_name, _ = device_identity(options)
    except RuntimeError:
        return None, set()
    if options.retune or options.db_dir is None:
        return device_name, set()
    try:
        held = database_entries(options.db_dir, device_name, targets, options)
    except DatabaseError as error:
        raise bad_input(str(error)) from None
    return device_name, set(held_decisions(held, options)[0])


def _exit_resumable() -> NoReturn:
    from layoutgen.signals import terminated_by_sigterm

    terminated = terminated_by_sigterm()
    errors.print("terminated" if terminated else "interrupted", style="red", end="", markup=False)
    say(": decided studies were recorded; re-run the same command to resume", err=True)
    sys.exit(143 if terminated else 130)
