"""`layoutgen db show` and `layoutgen db check`: read and validate the tuning database."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from layoutgen.cli.common import CommandFailed, bad_input, console

if TYPE_CHECKING:
    from layoutgen.tuning_db import Expected, TuningEntry

app = typer.Typer(
    name="db",
    help="Inspect and validate the tuning database (tuning_db/<device>.json).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)

DbOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--db",
        help="A database directory (repeatable). Default: $LAYOUTGEN_TUNING_DB, then the packaged tuning_db/.",
    ),
]


def _dirs(db: list[Path] | None) -> list[Path]:
    if db:
        return list(db)
    from layoutgen.runtime.configs import database_dirs

    return database_dirs()


def _expectations() -> dict[tuple[str, str], Expected]:
    """(bundled spec, kernel) -> what a current entry must record, computed as `layoutgen build` renders."""
    from layoutgen.codegen import source_hashes
    from layoutgen.family import get_family
    from layoutgen.spec import bundled_specs
    from layoutgen.tuning.procedure import space_hash, timing_hash
    from layoutgen.tuning_db import Expected, entry_versions

    versions = entry_versions()
    expected = {}
    for name, spec in bundled_specs().items():
        family = get_family(spec.family)
        for kernel, source in source_hashes(spec).items():
            decl = family.kernel(kernel)
            expected[(name, kernel)] = Expected(
                spec.layout_hash(), source, space_hash(decl), timing_hash(decl), versions
            )
    return expected


def _entry_state(entry: TuningEntry, expected: dict[tuple[str, str], Expected]) -> str:
    from layoutgen.tuning_db import current_problems

    wanted = expected.get((entry.key.spec, entry.key.kernel))
    if wanted is None:
        return "not bundled"
    problems = current_problems(entry, wanted)
    return "current" if not problems else f"stale {problems[0][0]}"


def _files(directories: list[Path], device: str | None) -> list[Path]:
    from layoutgen.tuning_db import device_file_name

    found = []
    for directory in directories:
        if device is not None:
            candidate = directory / device_file_name(device)
            if candidate.is_file():
                found.append(candidate)
        elif directory.is_dir():
            found += sorted(directory.glob("*.json"))
    return found


@app.command("show")
def show(
    device: Annotated[
        str | None,
        typer.Option("--device", help='Device name, e.g. "NVIDIA H200". Default: the current GPU, else every file.'),
    ] = None,
    db: DbOption = None,
) -> None:
    """List the tuned entries: config, timings against the default config, and whether they are current."""
    from layoutgen.tuning_db import DatabaseError, current_device, read_database

    directories = _dirs(db)
    if device is None:
        live = current_device()
        device = live[0] if live is not None else None
    files = _files(directories, device)
    if not files:
        where = ", ".join(str(d) for d in directories)
        what = f"for device {device!r}" if device else "(*.json)"
        console.print(f"no tuning database {what} in {where}; dispatch uses heuristic defaults")
        return
    hashes = _expectations()
    broken = 0
    for path in files:
        try:
            database = read_database(path)
        except DatabaseError as error:
            console.print(f"[red]{escape(str(error))}[/red]")
            broken += 1
            continue
        versions = ", ".join(f"{k} {v}" for k, v in sorted(database.versions.items()))
        table = Table(
            title=f"{path}: {database.device_name} (sm {database.compute_capability}); {versions}",
            title_justify="left",
        )
        for column in ("key", "config", "median µs", "p20-p80 µs", "default µs", "speedup", "trials", "state"):
            table.add_column(column)
        for name, entry in database.entries.items():
            state = _entry_state(entry, hashes)
            speedup = entry.default_us / entry.median_us if entry.median_us > 0 else float("nan")
            table.add_row(
                escape(name),
                escape(" ".join(f"{k}={v}" for k, v in sorted(entry.config.items()))),
                f"{entry.median_us:.2f}",
                f"{entry.p20_us:.2f}-{entry.p80_us:.2f}",
                f"{entry.default_us:.2f}",
                f"{speedup:.2f}x",
                str(entry.trials),
                state if state == "current" else f"[yellow]{state}[/yellow]",
            )
        console.print(table)
    if broken:
        raise CommandFailed(f"{broken} tuning database file(s) cannot be read", code=1)


@app.command("check")
def check(db: DbOption = None) -> None:
    """Validate every database file (schema, names, file name vs device); list stale entries. Fails on invalid."""
    from layoutgen.tuning_db import DatabaseError, device_file_name, read_database

    directories = _dirs(db)
    missing = [str(d) for d in (db or []) if not Path(d).is_dir()]
    if missing:
        raise bad_input(f"no such database directory: {', '.join(missing)}; check --db")
    files = _files(directories, None)
    hashes = _expectations()
    problems = 0
    for path in files:
        try:
            database = read_database(path)
        except DatabaseError as error:
            console.print(f"[red]invalid[/red] {escape(str(error))}")
            problems += 1
            continue
        expected = device_file_name(database.device_name)
        if path.name != expected:
            console.print(
                f"[red]invalid[/red] {path}: holds device {database.device_name!r}, which belongs in {expected}"
            )
            problems += 1
            continue
        states: dict[str, int] = {}
        for entry in database.entries.values():
            state = _entry_state(entry, hashes)
            states[state] = states.get(state, 0) + 1
        summary = ", ".join(f"{count} {state}" for state, count in sorted(states.items())) or "no entries"
        console.print(f"[green]ok[/green] {escape(str(path))}: {escape(summary)}")
    if not files:
        console.print(f"no database files in {', '.join(str(d) for d in directories)} (an empty database is valid)")
    if problems:
        raise CommandFailed(f"{problems} invalid tuning database file(s)", code=1)
