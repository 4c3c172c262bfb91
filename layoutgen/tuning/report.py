"""Progress bars while tuning and the result tables at the end (terminal and markdown)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text


@dataclass(frozen=True)
class ResultRow:
    """One study's outcome, as the tables show it."""

    spec: str
    kernel: str
    #: The key extents, e.g. (("N", 2), ("Hl", 16), ("D", 512)).
    extents: tuple[tuple[str, int], ...]
    dtype: str
    bucket_name: str
    bucket: int
    mode: str
    trials: int
    chosen: str | None
    median_us: float | None
    default_us: float | None
    bytes_moved: int | None
    copy_tbps: float | None
    reason: str
    #: Whether the study holds its decision (False: its search is not finished); decided with `chosen` None,
    #: no config of it ran.
    finished: bool = True
    #: How many configs computed a wrong result: a kernel wrong for any config has nothing recorded.
    wrong_results: int = 0
    #: The trials the study would have measured (its space's size when exhaustive).
    budget: int = 0
    #: Whether the run's --time-budget ran out before `budget` trials were measured.
    cut_short: bool = False

    @property
    def shape(self) -> str:
        return " ".join(f"{name}={value}" for name, value in self.extents)

    @property
    def label(self) -> str:
        return f"{self.spec} {self.kernel} {self.shape} {self.dtype} {self.bucket_name}={self.bucket}"

    @property
    def speedup(self) -> float | None:
        # default_us 0: the default config could not run, so there is no ratio.
        if self.median_us is None or not self.default_us or self.median_us <= 0:
            return None
        return self.default_us / self.median_us

    @property
    def tbps(self) -> float | None:
        if self.median_us is None or self.bytes_moved is None or self.median_us <= 0:
            return None
        return self.bytes_moved / (self.median_us * 1e-6) / 1e12

    @property
    def copy_fraction(self) -> float | None:
        tbps = self.tbps
        return None if tbps is None or not self.copy_tbps else tbps / self.copy_tbps

    @classmethod
    def from_study(cls, meta: dict[str, Any], final: dict[str, Any] | None, evaluated: int) -> ResultRow:
        finished = bool(final)
        final = final or {}
        return cls(
            spec=meta["spec"],
            kernel=meta["kernel"],
            extents=tuple(meta["extents"].items()),
            dtype=meta["dtype"],
            bucket_name=meta["bucket_name"],
            bucket=meta["bucket"],
            mode=meta["mode"],
            trials=int(final.get("trials", evaluated)),
            chosen=final.get("chosen"),
            median_us=final.get("median_us"),
            default_us=final.get("default_us"),
            bytes_moved=final.get("bytes_moved"),
            copy_tbps=final.get("copy_tbps"),
            reason=str(final.get("reason", "not finished: re-run the same command to resume")),
            finished=finished,
            wrong_results=int(final.get("gate_failed") or 0),
            budget=int(meta["budget"]),
            cut_short=bool(final.get("cut_short")),
        )


#: The markdown report's columns, one row per study (a file has no width to fit).
COLUMNS = (
    "kernel",
    "shape",
    "dtype",
    "size",
    "search",
    "default µs",
    "tuned µs",
    "speed-up",
    "TB/s",
    "% copy",
    "kept",
)
#: What the interpreter's tables keep: its wall-clock times measure the interpreter, not a kernel.
UNTIMED_COLUMNS = ("kernel", "shape", "dtype", "size", "search", "kept")
#: The terminal table's columns under each (kernel, shape, dtype) line.
STUDY_COLUMNS = ("size", "search", "default µs", "tuned µs", "speed-up", "TB/s", "% copy", "kept")
UNTIMED_STUDY_COLUMNS = ("size", "search", "kept")
#: What the interpreter's results say instead of timings (lines that fit 80 columns).
INTERPRETER_NOTE = (
    "Triton interpreter: its wall-clock times are not kernel timings; none are shown.",
    "The run tried the pipeline (compile, gate, search, decision), not what is fast.",
)
SEARCH_LEGEND = "search: ex = exhaustive, tpe = Optuna TPE, then the trials measured"
#: Added to the legend where a study's search was cut short (`ResultRow.cut_short`).
CUT_SHORT_LEGEND = "n/m*: the --time-budget ran out after n of m trials; run again to search further"


def _number(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def row_cells(row: ResultRow) -> dict[str, str]:
    fraction = row.copy_fraction
    return {
        "kernel": row.kernel,
        "shape": row.shape,
        "dtype": row.dtype,
        "size": f"{row.bucket_name}={row.bucket}",
        "search": f"{'ex' if row.mode == 'exhaustive' else row.mode} {row.trials}"
        + (f"/{row.budget}*" if row.cut_short else ""),
        "default µs": _number(row.default_us),
        "tuned µs": _number(row.median_us),
        "speed-up": _number(row.speedup, 2, "x"),
        "TB/s": _number(row.tbps, 2),
        "% copy": "-" if fraction is None else f"{100 * fraction:.0f}%",
        "kept": row.chosen or _nothing_kept(row),
    }


def _nothing_kept(row: ResultRow) -> str:
    if row.wrong_results:
        return "gate failed"
    return "none ran" if row.finished else "nothing"


def by_spec(rows: list[ResultRow]) -> dict[str, list[ResultRow]]:
    grouped: dict[str, list[ResultRow]] = defaultdict(list)
    for row in rows:
        grouped[row.spec].append(row)
    for spec_rows in grouped.values():
        spec_rows.sort(key=lambda r: (r.kernel, r.extents, r.dtype, r.bucket))
    return dict(sorted(grouped.items()))


def _aligned(table: list[list[str]], left: set[int]) -> list[str]:
    widths = [max(len(row[column]) for row in table) for column in range(len(table[0]))]
    return [
        "  ".join(cell.ljust(widths[i]) if i in left else cell.rjust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in table
    ]


def result_lines(rows: list[ResultRow], title_suffix: str = "", *, timed: bool = True, width: int = 80) -> list[str]:
    """The terminal's result tables: per spec a title, per (kernel, shape, dtype) a line, and under it one
    row per size bucket, all within `width` columns.  When the rows cannot fit `width` (a very narrow
    terminal), one self-contained line per study instead, which the terminal wraps."""
    columns = STUDY_COLUMNS if timed else UNTIMED_STUDY_COLUMNS
    lines = [] if timed else list(INTERPRETER_NOTE)
    for spec, spec_rows in by_spec(rows).items():
        cells = [row_cells(row) for row in spec_rows]
        # One family per spec, so one size name: it heads the column, the rows hold the numbers.
        header = [spec_rows[0].bucket_name if name == "size" else name for name in columns]
        sizes = [{**cell, "size": str(row.bucket)} for cell, row in zip(cells, spec_rows, strict=True)]
        table = [header] + [[cell[name] for name in columns] for cell in sizes]
        body = ["    " + line for line in _aligned(table, left={1, len(columns) - 1})]
        if max(len(line) for line in body) > width:
            lines.append(f"{spec}{title_suffix}")
            lines += [
                f"  {cell['kernel']} {cell['shape']} {cell['dtype']} "
                + ", ".join(f"{name} {cell[name]}" for name in columns)
                for cell in cells
            ]
            continue
        lines += [f"{spec}{title_suffix}", body[0]]
        heading = None
        for row, line in zip(spec_rows, body[1:], strict=True):
            group = f"  {row.kernel} {row.shape} {row.dtype}"
            if group != heading:
                lines.append(group)
                heading = group
            lines.append(line)
    if rows:
        lines.append(SEARCH_LEGEND)
    if any(row.cut_short for row in rows):
        lines.append(CUT_SHORT_LEGEND)
    return lines


def summary_lines(rows: list[ResultRow], *, timed: bool = True) -> list[str]:
    """Per spec and kernel: geometric-mean speed-up over the default (timed runs only) and how often the tuned
    config was kept."""
    lines = []
    for spec, spec_rows in by_spec(rows).items():
        for kernel in dict.fromkeys(r.kernel for r in spec_rows):
            mine = [r for r in spec_rows if r.kernel == kernel]
            tuned = sum(1 for r in mine if r.chosen == "tuned")
            ratios = [r.speedup for r in mine if r.speedup]
            if not timed:
                decided = sum(1 for r in mine if r.chosen)
                lines.append(f"{spec} {kernel}: {decided} of {len(mine)} studies decided; tuned config kept in {tuned}")
                continue
            if not ratios:
                continue
            geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            lines.append(
                f"{spec} {kernel}: geomean speed-up {geomean:.3f}x over the default in {len(ratios)} studies; "
                f"tuned config kept in {tuned}"
            )
    return lines


def markdown(rows: list[ResultRow], header: list[str], *, timed: bool = True) -> str:
    columns = COLUMNS if timed else UNTIMED_COLUMNS
    notes = [] if timed else [" ".join(INTERPRETER_NOTE), ""]
    legend = [f"{CUT_SHORT_LEGEND}.", ""] if any(row.cut_short for row in rows) else []
    lines = [*header, "", *notes, *(f"* {line}" for line in summary_lines(rows, timed=timed)), "", *legend]
    for spec, spec_rows in by_spec(rows).items():
        lines += [f"## {spec}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(row_cells(row)[name] for name in columns) + " |" for row in spec_rows]
        lines.append("")
    return "\n".join(lines)


class ProgressReporter:
    """An overall bar plus one bar per study in progress (rich); errors print above the bars."""

    def __init__(self, console: Console, total: int, *, timed: bool = True) -> None:
        self.console = console
        #: Under the interpreter the best time is no kernel timing: the bars show trials only.
        self.timed = timed
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[best]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.overall = self.progress.add_task("studies", total=total, best="")
        self.tasks: dict[str, TaskID] = {}
        self.done: set[str] = set()

    def __enter__(self) -> ProgressReporter:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, name: str, label: str, evaluated: int, budget: int, best_us: float | None, done: bool) -> None:
        best = "" if best_us is None or not self.timed else f"best {best_us:.2f} µs"
        if done:
            if name in self.done:
                return
            self.done.add(name)
            task = self.tasks.pop(name, None)
            if task is not None:
                self.progress.remove_task(task)
            self.progress.advance(self.overall)
            if not self.console.is_terminal:  # a log file gets one line per finished study instead of bars
                total = self.progress.tasks[0].total
                outcome = f", {best or 'no result'}" if self.timed else ""
                self.console.print(f"[{len(self.done)}/{total:g}] {label}: {evaluated} trials{outcome}", markup=False)
            return
        task = self.tasks.get(name)
        if task is None:
            # A task's description is rendered as markup: the label (a spec's name) is escaped.
            task = self.tasks[name] = self.progress.add_task(escape(label), total=max(budget, 1), best=best)
        self.progress.update(task, completed=min(evaluated, budget), total=max(budget, 1), best=best)

    def error(self, message: str) -> None:
        self.progress.console.print(Text.assemble(("error:", "red"), " ", message))

    def info(self, message: str) -> None:
        self.progress.console.print(message, markup=False)
