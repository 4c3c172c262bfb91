"""`layoutgen db show`, `layoutgen db check` and `layoutgen db prune`: read, validate and tidy the tuning database.

`show` prints a summary by default (one line per spec and kernel: how many entries, over how many shapes
and sizes, whether they are current) and with `--entries` one line per entry under a line per shape; both
fit 80 columns without shortening a name.  `--spec`, `--kernel` and `--shape` select entries.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from layoutgen.cli.common import CommandFailed, bad_input, console, parse_shape, printable
from layoutgen.cli.db_state import INVALID, bundled, entry_state, prunable, spec_names

if TYPE_CHECKING:
    from layoutgen.tuning_db import TuningEntry, TuningKey

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
        metavar="DIR",
        help="A database directory (repeatable). Default: $LAYOUTGEN_TUNING_DB, then the packaged tuning_db/.",
    ),
]


def say(text: str, style: str | None = None, *, wrap: bool = True) -> None:
    """`layoutgen.cli.common.say` through this module's console (tests give it another width)."""
    console.print(printable(text), style=style, markup=False, highlight=False, soft_wrap=not wrap or None)


def _dirs(db: list[Path] | None) -> list[Path]:
    """The directories to read: the given ones, each of which must be a directory, else the defaults; each
    once (`--db D --db D/`, or the variable naming the packaged one, would report and prune a file twice)."""
    from layoutgen.cli.environment import database_dirs

    unique: dict[Path, Path] = {}
    for directory in database_dirs(db):
        unique.setdefault(directory.resolve(), directory)
    return list(unique.values())


def _files(directories: list[Path], device: str | None) -> list[Path]:
    """The database files in `directories`, each once: a file linked into two of them is read by the first."""
    from layoutgen.tuning_db import device_file_name

    found: dict[Path, Path] = {}
    for directory in directories:
        if device is not None:
            candidates = [path for path in [directory / device_file_name(device)] if path.is_file()]
        else:  # whatever else is named *.json there is reported by the reader
            candidates = sorted(directory.glob("*.json")) if directory.is_dir() else []
        for candidate in candidates:
            found.setdefault(candidate.resolve(), candidate)
    return list(found.values())


def _selected(key: TuningKey, specs: set[str], kernels: set[str], shape: dict[str, list[int]]) -> bool:
    if specs and key.spec not in specs:
        return False
    if kernels and key.kernel not in kernels:
        return False
    values = {**dict(key.extents), key.bucket_name: key.bucket}
    return all(values.get(name) in wanted for name, wanted in shape.items())


def _config_text(key: TuningKey, config: dict[str, int]) -> str:
    """`block_head=4 block_dim=128 block_batch=1 num_warps=4 num_stages=1` as `head4 dim128 w4`: blocks by
    axis in the kernel's declaration order, blocks of 1 and one stage left out (the legend says so)."""
    order = list(config)
    try:
        from layoutgen.family import get_family

        declared = get_family(key.family).kernel(key.kernel).config_type.field_names()
        order = [name for name in declared if name in config] + [name for name in config if name not in declared]
        order.sort(key=lambda name: not name.startswith("block_"))  # stable: blocks first, in declared order
    except ValueError:  # an entry of a family or kernel this installation lacks: the file's order
        pass
    parts = []
    for name in order:
        value = config[name]
        if name.startswith("block_"):
            if value != 1:
                parts.append(f"{name.removeprefix('block_')}{value}")
        elif name == "num_warps":
            parts.append(f"w{value}")
        elif name != "num_stages" or value != 1:
            parts.append(f"s{value}" if name == "num_stages" else f"{name}={value}")
    return " ".join(parts) or "all blocks 1"


def _state_counts(states: list[str]) -> str:
    counts = Counter(states)
    if len(counts) == 1:
        return states[0]
    return ", ".join(f"{count} {state}" for state, count in sorted(counts.items()))


def _table(rows: Sequence[tuple[str, ...]], right: set[int], indent: str = "  ") -> list[str]:
    """Rows as lines of padded columns (two spaces apart); the last column is not padded."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = []
    for row in rows:
        last = len(row) - 1
        padded = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(row[:last])]
        lines.append(indent + "  ".join([*padded, row[last]]).rstrip())
    return lines


def _print_summary(entries: list[tuple[TuningEntry, str]]) -> None:
    """One line per (spec, kernel): entries, over how many shapes and sizes, and their state."""
    groups: dict[tuple[str, str, str], list[tuple[TuningEntry, str]]] = defaultdict(list)
    for entry, state in entries:
        groups[(entry.key.family, entry.key.spec, entry.key.kernel)].append((entry, state))
    rows = [("spec", "kernel", "entries", "shapes", "sizes", "state")]
    for (_, spec, kernel), members in sorted(groups.items()):
        shapes = {entry.key.shape_text() for entry, _ in members}
        sizes = {entry.key.bucket for entry, _ in members}
        state = _state_counts([state for _, state in members])
        rows.append((spec, kernel, str(len(members)), str(len(shapes)), str(len(sizes)), state))
    for line in _table(rows, right={2, 3, 4}):
        say(line, wrap=False)


def _print_entries(entries: list[tuple[TuningEntry, str]], timed: bool = True) -> None:
    """A line per shape (spec, kernel, key extents, dtype), then a line per entry: size, timings, config.  An
    entry whose line would not fit the console (a config of many large blocks) puts its config on a second,
    indented line, so that nothing is cut or wrapped mid-word.  `timed=False` (a `--interpret` database: the
    interpreter's wall clock is no kernel timing) shows "-" for the times and speed-ups, as `tune` does."""
    groups: dict[tuple[str, ...], list[tuple[TuningEntry, str]]] = defaultdict(list)
    for entry, state in entries:
        key = entry.key
        extents = " ".join(f"{name}={value}" for name, value in key.extents)
        groups[(key.spec, key.kernel, extents, key.dtype)].append((entry, state))
    if timed:
        say("  µs: the tuned config's median (p20-p80); speed-up over the default config")
    else:
        say("  µs, speed-up: not shown for the Triton interpreter, whose wall clock is no kernel timing")
    say("  config: blocks per axis (1s left out), w num_warps, s num_stages (1 left out)")
    rows: list[tuple[str, ...]] = [("size", "µs", "p20-p80", "speed-up", "trials", "config")]
    headings = {}
    for shape, members in sorted(groups.items()):
        members.sort(key=lambda item: item[0].key.bucket)
        states = [state for _, state in members]
        label = " ".join(shape)
        headings[len(rows)] = label if set(states) == {"current"} else f"{label}  ({_state_counts(states)})"
        mixed = len(set(states)) > 1
        for entry, state in members:
            config = _config_text(entry.key, entry.config)
            rows.append(
                (
                    f"{entry.key.bucket_name}={entry.key.bucket}",
                    f"{entry.median_us:.2f}" if timed else "-",
                    f"{entry.p20_us:.2f}-{entry.p80_us:.2f}" if timed else "-",
                    f"{entry.default_us / entry.median_us:.2f}x" if timed and entry.median_us > 0 else "-",
                    str(entry.trials),
                    f"{config}  ({state})" if mixed else config,
                )
            )
    lines = _table(rows, right={0, 1, 2, 3, 4})
    config_at = len(lines[0]) - len(rows[0][-1])
    for index, (line, row) in enumerate(zip(lines, rows, strict=True)):
        if index in headings:
            say(headings[index], "bold")  # words: a narrow terminal wraps it between them
        if len(line) > console.width and index:
            say(line[:config_at].rstrip(), wrap=False)
            say(" " * 6 + row[-1], wrap=False)
        else:
            say(line, wrap=False)


def _explain_empty(
    held: Iterable[TuningEntry], specs: set[str], kernels: set[str], shape: dict[str, list[int]]
) -> None:
    """Which filter matched nothing in this file, and what the file has instead."""
    keys = [entry.key for entry in held]
    # Extents are looked for in the entries the spec and kernel filters keep (a Ulysses entry's size is S_local,
    # not a DCP entry's B), unless those filters keep none.
    kept = [key for key in keys if _selected(key, specs, kernels, {})] or keys
    found = {
        "spec": {key.spec for key in keys},
        "kernel": {key.kernel for key in keys},
        "extent": {name for key in kept for name, _ in (*key.extents, (key.bucket_name, key.bucket))},
    }
    asked = {"spec": specs, "kernel": kernels, "extent": set(shape)}
    for what, names in asked.items():
        missing = sorted(names - found[what])
        whose = "the --spec/--kernel selection's" if what == "extent" and len(kept) < len(keys) else "the file's"
        if missing:
            say(f"  no entry has the {what} {', '.join(missing)}; {whose}: {', '.join(sorted(found[what]))}")
    grid_only = _grid_axes_not_keyed({key.family for key in keys}) & (set(shape) - found["extent"])
    if grid_only:
        say(
            f"  {', '.join(sorted(grid_only))}: an axis of `layoutgen tune`'s grid, not of the keys, which hold"
            " one rank's extents (e.g. Hl = H/N local heads: --shape N=8 --shape Hl=16 for H=128)"
        )


def _grid_axes_not_keyed(family_names: set[str]) -> set[str]:
    """The tuning grid axes of these families that their keys hold in another form (H as Hl = H/N)."""
    from layoutgen.family import get_family

    axes: set[str] = set()
    for name in family_names:
        try:
            family = get_family(name)
        except ValueError:
            continue
        axes |= {axis.name for axis in family.grid_axes} - set(family.key_extents)
    return axes


@app.command("show")
def show(
    device: Annotated[
        str | None,
        typer.Option(
            "--device",
            metavar="NAME",
            help='Device name, e.g. "NVIDIA H200". Default: the current GPU, else every file.',
        ),
    ] = None,
    db: DbOption = None,
    spec: Annotated[
        list[str] | None,
        typer.Option(
            "--spec", metavar="NAME|FILE", help="Only entries of this spec: a name or a spec YAML (repeatable)."
        ),
    ] = None,
    kernel: Annotated[
        list[str] | None, typer.Option("--kernel", metavar="NAME", help="Only entries of this kernel (repeatable).")
    ] = None,
    shape: Annotated[
        list[str] | None,
        typer.Option(
            "--shape",
            metavar="NAME=V[,V...]",
            help="Only entries with these key extents or sizes (repeatable), e.g. --shape N=4,8 --shape B=64.",
        ),
    ] = None,
    entries: Annotated[
        bool, typer.Option("--entries", help="One line per entry (config, timings) instead of the summary.")
    ] = False,
) -> None:
    """Summarise the tuned entries per spec and kernel (whether they are current); --entries lists each."""
    from layoutgen.tuning_db import (
        CPU_INTERPRETER_DEVICE,
        DatabaseError,
        current_device,
        device_file_name,
        read_database,
    )

    if device is not None:
        try:
            device_file_name(device)
        except ValueError as error:
            raise bad_input(f"--device: {error}") from None
    directories = _dirs(db)
    wanted_shape = parse_shape(shape or [])
    wanted_specs = spec_names(spec or [])
    if device is None:
        live = current_device()
        device = live[0] if live is not None else None
    files = _files(directories, device)
    if not files:
        where = ", ".join(str(d) for d in directories)
        what = f"for device {device!r}" if device else "(*.json)"
        say(f"no tuning database {what} in {where}; dispatch uses heuristic defaults")
        return
    specs = bundled()
    broken = 0
    for path in files:
        try:
            database = read_database(path)
        except DatabaseError as error:
            say(str(error), "red", wrap=False)
            broken += 1
            continue
        chosen = [
            entry
            for entry in database.entries.values()
            if _selected(entry.key, wanted_specs, set(kernel or ()), wanted_shape)
        ]
        selection = "" if len(chosen) == len(database.entries) else f", {len(chosen)} selected"
        say(str(path), "bold", wrap=False)  # a path is printed whole, on its own line
        if path.name != device_file_name(database.device_name):
            say(
                f"  holds device {database.device_name!r}, which belongs in {device_file_name(database.device_name)}: "
                "dispatch does not read it here (`layoutgen db check` fails on it)",
                "red",
            )
        say(f"  {database.device_name} (sm {database.compute_capability}), {len(database.entries)} entries{selection}")
        if database.versions:
            say("  last written with " + ", ".join(f"{k} {v}" for k, v in sorted(database.versions.items())))
        if not chosen:
            _explain_empty(database.entries.values(), wanted_specs, set(kernel or ()), wanted_shape)
        states = [(entry, *entry_state(entry, specs)) for entry in chosen]
        if chosen:
            pairs = [(entry, state) for entry, state, _ in states]
            if entries:
                _print_entries(pairs, timed=database.device_name != CPU_INTERPRETER_DEVICE)
            else:
                _print_summary(pairs)
        reasons = {state: why for _, state, why in states if why}
        for state, why in sorted(reasons.items()):
            say(f"  {state}: e.g. {why}")
        if any(state.startswith("stale") for state in reasons):
            say("  dispatch ignores stale entries; `layoutgen tune` tunes them again")
        if INVALID in reasons:
            say("  dispatch uses no invalid entry (`layoutgen db check` names each): correct or delete them")
    if not entries and broken < len(files):
        say("one line per entry: add --entries (select with --spec, --kernel, --shape N=4)")
    if broken:
        raise CommandFailed(f"{broken} tuning database file(s) cannot be read", code=1)


@app.command("check")
def check(db: DbOption = None) -> None:
    """Validate every database file (schema, names, file name vs device, each entry's key and config); count the
    entries per state. Fails on an invalid file or entry."""
    from layoutgen.tuning.recorded import future_entries
    from layoutgen.tuning_db import DatabaseError, device_file_name, read_database

    directories = _dirs(db)
    files = _files(directories, None)
    specs = bundled()
    problems = 0
    for path in files:
        try:
            database = read_database(path)
        except DatabaseError as error:
            say(f"invalid {error}", "red", wrap=False)
            problems += 1
            continue
        expected = device_file_name(database.device_name)
        if path.name != expected:
            say(
                f"invalid {path}: holds device {database.device_name!r}, which belongs in {expected}", "red", wrap=False
            )
            problems += 1
            continue
        states = {name: entry_state(entry, specs) for name, entry in database.entries.items()}
        counts = Counter(state for state, _ in states.values())
        summary = ", ".join(f"{count} {state}" for state, count in sorted(counts.items())) or "no entries"
        if INVALID in counts:
            say(
                f"invalid {path}: {summary} (dispatch uses no invalid entry: correct or delete them)", "red", wrap=False
            )
            for name, (state, why) in states.items():
                if state == INVALID:
                    say(f"  {name}: {why}", wrap=False)
            problems += 1
            continue
        future = future_entries(database.entries.values())
        if future:
            say(f"invalid {path}: {len(future)} entries measured more than an hour from now (a clock ahead, or an "
                "edit): the merge keeps them over every later tuning until then; correct measured_at", "red")  # fmt: skip
            for entry in future:
                say(f"  {entry.key.as_str()}: measured_at {entry.measured_at}", wrap=False)
            problems += 1
            continue
        say(f"ok {path}: {summary}", wrap=False)  # a path is never folded
    if not files:
        say(f"no database files in {', '.join(str(d) for d in directories)} (an empty database is valid)")
    if problems:
        raise CommandFailed(f"{problems} invalid tuning database file(s)", code=1)


@app.command("prune")
def prune(
    db: DbOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be removed; change nothing.")] = False,
) -> None:
    """Remove the entries of bundled specs that can never be current again: tuned for another spec, kernel
    source, search space or timing procedure (never for another triton or torch: those are the machine's)."""
    from layoutgen.tuning_db import DatabaseError, read_database, remove

    directories = _dirs(db)
    specs = bundled()
    total = 0
    files = _files(directories, None)
    if not files:
        say(f"nothing to prune: no database files in {', '.join(str(d) for d in directories)}")
        return
    plans = []
    for path in files:
        try:
            database = read_database(path)
        except DatabaseError as error:
            raise CommandFailed(str(error), code=1) from None
        doomed = {name: entry for name, entry in database.entries.items() if prunable(entry, specs)}
        plans.append((path, doomed, len(database.entries)))
    if not dry_run:
        # Every folder to change takes the lock file and the new file before any file changes: a read-only
        # one is bad input naming it, not a PermissionError after other folders were pruned.
        for folder in dict.fromkeys(path.parent for path, doomed, _ in plans if doomed):
            _check_prunable(folder)
    for path, doomed, held in plans:
        if dry_run:
            say(f"{path}: would remove {len(doomed)} of {held} entries", wrap=False)
            total += len(doomed)
            continue
        try:
            # Removes an entry only while it is the one judged here: a tuner may have replaced it since.
            removed = remove(path, doomed) if doomed else 0
        except OSError as error:  # the folder changed since it was checked
            raise bad_input(_unprunable(path.parent, error)) from None
        except DatabaseError as error:  # rewritten since it was read, into something unreadable
            raise CommandFailed(str(error), code=1) from None
        kept = f" ({len(doomed) - removed} replaced since read: kept)" if removed < len(doomed) else ""
        say(f"{path}: removed {removed} of {held} entries{kept}", wrap=False)
        total += removed
    if not total:
        say("nothing to prune: every entry of a bundled spec is current for its spec, kernels, spaces and timing")


def _unprunable(folder: Path, error: OSError) -> str:
    return (
        f"cannot prune the database folder {folder} ({error.strerror or error}): make it writable (prune writes "
        "a lock file and each database anew there), or list what would go with --dry-run"
    )


def _check_prunable(folder: Path) -> None:
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".layoutgen-probe-"):
            pass
    except OSError as error:
        raise bad_input(_unprunable(folder, error)) from None
