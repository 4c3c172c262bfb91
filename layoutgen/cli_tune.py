"""`layoutgen tune`: search launch configs per GPU with Optuna and record the winners.

Registered on the main app by `layoutgen.cli` (see `register`).  The work is in `layoutgen.tuning`.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, NoReturn

import typer


class KernelName(str, Enum):
    pack = "pack"
    combine = "combine"


class DtypeName(str, Enum):
    bfloat16 = "bfloat16"
    float16 = "float16"
    float32 = "float32"


def default_db_dir(interpret: bool) -> Path:
    """Where winners go without --db: the checkout's tuning_db/ (what dispatch reads) for a GPU; the cache
    for the interpreter, whose timings must not land in the repository."""
    from layoutgen.loader import source_root
    from layoutgen.tuning.storage import cache_dir

    root = source_root()
    if interpret or root is None:
        return cache_dir() / "tuning_db"
    return root / "tuning_db"


def tune(
    spec: Annotated[
        list[str] | None,
        typer.Option(
            "--spec", help="Bundled spec name, spec YAML or generated .py (repeatable). Default: all bundled."
        ),
    ] = None,
    kernel: Annotated[list[KernelName] | None, typer.Option("--kernel", help="pack or combine (repeatable).")] = None,
    peers: Annotated[list[int] | None, typer.Option("--N", min=1, help="Peers N (repeatable).")] = None,
    heads: Annotated[list[int] | None, typer.Option("--heads", min=1, help="Total heads H (repeatable).")] = None,
    dims: Annotated[list[int] | None, typer.Option("--D", min=1, help="Head dim D (repeatable).")] = None,
    dtype: Annotated[list[DtypeName] | None, typer.Option("--dtype", help="Activation dtype (repeatable).")] = None,
    batch: Annotated[
        list[int] | None, typer.Option("--batch", min=1, help="Batch buckets (repeatable). Default: 1 ... 4096.")
    ] = None,
    trials: Annotated[
        int | None, typer.Option("--trials", min=1, help="Measured TPE trials per study (default 24).")
    ] = None,
    time_budget: Annotated[
        float | None,
        typer.Option("--time-budget", min=1.0, help="Seconds of search for the whole run, split over families."),
    ] = None,
    exhaustive_limit: Annotated[
        int | None, typer.Option("--exhaustive-limit", min=0, help="Search spaces this small exhaustively (64).")
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option("--storage", help="Optuna storage URL (postgresql://...) or journal file. Default: user cache."),
    ] = None,
    workers: Annotated[
        str, typer.Option("--workers", help="'auto' (one process per visible GPU) or a count.")
    ] = "auto",
    db: Annotated[
        Path | None, typer.Option("--db", help="Tuning database directory. Default: the checkout's tuning_db/.")
    ] = None,
    interpret: Annotated[
        bool, typer.Option("--interpret", help="Run the pipeline on CPU (Triton interpreter, tiny shapes).")
    ] = False,
    report: Annotated[Path | None, typer.Option("--report", help="Also write the result tables as markdown.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Sampler seed (studies derive their own from it).")] = 0,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the studies and their search plans; tune nothing.")
    ] = False,
    retune: Annotated[
        bool,
        typer.Option("--retune", help="Tune again the studies the database already holds a current decision for."),
    ] = False,
) -> None:
    """Tune pack/combine launch configs per (spec, kernel, N, H/N, D, dtype, batch bucket) into the tuning database.

    Without --N/--heads/--D the grid is MLA decode (H 16 and 128 with D 512) plus plain attention (H 32, D 128),
    N in 2, 4, 8.  Re-running the same command resumes: finished trials are not repeated, and studies whose
    decision the database already holds (for the current spec and kernel source) are skipped, also on a
    machine without the study storage; --retune tunes them again.
    """
    from layoutgen.cli import CommandFailed, console, errors
    from layoutgen.tuning import plan
    from layoutgen.tuning.runner import resolve_workers, run

    if trials is not None and time_budget is not None:
        raise CommandFailed("give --trials or --time-budget, not both", code=2)
    try:
        options = plan.TuneOptions(
            specs=tuple(spec or ()),
            kernels=tuple(k.value for k in kernel) if kernel else plan.KERNELS,
            shapes=plan.grid_shapes(peers, heads, dims, interpret),
            dtypes=tuple(d.value for d in dtype) if dtype else plan.DEFAULT_DTYPES,
            buckets=tuple(sorted(set(batch)))
            if batch
            else (plan.INTERPRET_BUCKETS if interpret else plan.DEFAULT_BUCKETS),
            trials=trials or (plan.INTERPRET_TPE_TRIALS if interpret else plan.DEFAULT_TPE_TRIALS)
            if time_budget is None
            else 10**6,
            time_budget_s=time_budget,
            exhaustive_limit=exhaustive_limit
            if exhaustive_limit is not None
            else (plan.INTERPRET_EXHAUSTIVE_LIMIT if interpret else plan.DEFAULT_EXHAUSTIVE_LIMIT),
            storage=storage,
            db_dir=str(db if db is not None else default_db_dir(interpret)),
            interpret=interpret,
            workers=resolve_workers(workers, interpret),
            lookahead=1 if interpret else 3,
            seed=seed,
            report=str(report) if report else None,
            retune=retune,
        )
    except ValueError as error:
        raise CommandFailed(str(error), code=2) from None
    if dry_run:
        _print_plan(options)
        return
    try:
        summary = run(options, console)
        if summary.db_path is not None:
            decided = sum(1 for row in summary.rows if row.chosen)
            console.print(f"{decided} decision(s) recorded in {summary.db_path}")
            if interpret:
                console.print(f"dispatch on CPU reads it with LAYOUTGEN_TUNING_DB={summary.db_path.parent}")
    except (ValueError, RuntimeError) as error:
        raise CommandFailed(str(error), code=2) from None
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
        errors.print(f"{summary.unfinished} studies have no decision yet; re-run the same command to continue")


def _print_plan(options: object) -> None:
    from rich.table import Table

    from layoutgen.cli import console
    from layoutgen.tuning.plan import TuneOptions, make_targets, search_plan

    assert isinstance(options, TuneOptions)
    table = Table(title="layoutgen tune --dry-run")
    for column in ("family", *(f"B={b}" for b in options.buckets)):
        table.add_column(column)
    studies = trials = 0
    for target in make_targets(options):
        cells = [target.problem.label]
        for batch in options.buckets:
            planned = search_plan(target.problem, batch, options)
            studies += 1
            trials += planned.budget
            cells.append(f"{'ex' if planned.mode == 'exhaustive' else 'tpe'} {planned.budget}/{planned.space_size}")
        table.add_row(*cells)
    console.print(table)
    console.print(f"{studies} studies, {trials} measured trials planned (ex: exhaustive; budget/feasible points)")


#: Options that take several values: `--N 2 4 8` is read as `--N 2 --N 4 --N 8` (typer takes one value per flag).
LIST_OPTIONS = frozenset({"--spec", "--kernel", "--N", "--heads", "--D", "--dtype", "--batch"})


def expand_list_options(args: list[str]) -> list[str]:
    """`tune --N 2 4 8 --batch 1 64` -> `tune --N 2 --N 4 --N 8 --batch 1 --batch 64`.  `tune` takes no
    positional argument, so every bare word after a list option is one of its values; other commands'
    arguments are left as they are."""
    command = next((index for index, arg in enumerate(args) if not arg.startswith("-")), None)
    if command is None or args[command] != "tune":
        return args
    expanded = args[: command + 1]
    option = None
    for arg in args[command + 1 :]:
        if arg.startswith("-"):
            option = arg if arg in LIST_OPTIONS else None
            expanded.append(arg)
        elif option is not None and expanded[-1] != option:
            expanded += [option, arg]
        else:
            expanded.append(arg)
    return expanded


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)


def _exit_resumable() -> NoReturn:
    from layoutgen.cli import errors

    errors.print("[red]interrupted[/red]: decided studies were recorded; re-run the same command to resume")
    sys.exit(130)
