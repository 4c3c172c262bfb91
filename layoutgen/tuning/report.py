"""Progress bars while tuning and the result tables at the end (terminal and markdown)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table


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

    @property
    def shape(self) -> str:
        return " ".join(f"{name}={value}" for name, value in self.extents)

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
        )


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


def _number(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def row_cells(row: ResultRow) -> list[str]:
    fraction = row.copy_fraction
    return [
        row.kernel,
        row.shape,
        row.dtype,
        f"{row.bucket_name}={row.bucket}",
        f"{row.mode} {row.trials}",
        _number(row.default_us),
        _number(row.median_us),
        _number(row.speedup, 2, "x"),
        _number(row.tbps, 2),
        "-" if fraction is None else f"{100 * fraction:.0f}%",
        row.chosen or "nothing",
    ]


def by_spec(rows: list[ResultRow]) -> dict[str, list[ResultRow]]:
    grouped: dict[str, list[ResultRow]] = defaultdict(list)
    for row in rows:
        grouped[row.spec].append(row)
    for spec_rows in grouped.values():
        spec_rows.sort(key=lambda r: (r.kernel, r.extents, r.dtype, r.bucket))
    return dict(sorted(grouped.items()))


def result_tables(rows: list[ResultRow], title_suffix: str = "") -> list[Table]:
    tables = []
    for spec, spec_rows in by_spec(rows).items():
        table = Table(title=f"{spec}{title_suffix}")
        for column in COLUMNS:
            table.add_column(column, justify="left" if column in ("kernel", "dtype", "search", "kept") else "right")
        for row in spec_rows:
            cells = row_cells(row)
            if row.chosen is None:
                cells[-1] = "[red]nothing[/red]"
            table.add_row(*cells)
        tables.append(table)
    return tables


def summary_lines(rows: list[ResultRow]) -> list[str]:
    """Per spec and kernel: geometric-mean speed-up over the default and how often the tuned config won."""
    lines = []
    for spec, spec_rows in by_spec(rows).items():
        for kernel in dict.fromkeys(r.kernel for r in spec_rows):
            ratios = [r.speedup for r in spec_rows if r.kernel == kernel and r.speedup]
            if not ratios:
                continue
            geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            tuned = sum(1 for r in spec_rows if r.kernel == kernel and r.chosen == "tuned")
            lines.append(
                f"{spec} {kernel}: geomean speed-up {geomean:.3f}x over the default in {len(ratios)} studies; "
                f"tuned config kept in {tuned}"
            )
    return lines


def markdown(rows: list[ResultRow], header: list[str]) -> str:
    lines = [*header, "", *(f"* {line}" for line in summary_lines(rows)), ""]
    for spec, spec_rows in by_spec(rows).items():
        lines += [f"## {spec}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(row_cells(row)) + " |" for row in spec_rows]
        lines.append("")
    return "\n".join(lines)


class ProgressReporter:
    """An overall bar plus one bar per study in progress (rich); errors print above the bars."""

    def __init__(self, console: Console, total: int) -> None:
        self.console = console
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
        best = "" if best_us is None else f"best {best_us:.2f} µs"
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
                self.console.print(
                    f"[{len(self.done)}/{total:g}] {escape(label)}: {evaluated} trials, {best or 'no result'}"
                )
            return
        task = self.tasks.get(name)
        if task is None:
            task = self.tasks[name] = self.progress.add_task(escape(label), total=max(budget, 1), best=best)
        self.progress.update(task, completed=min(evaluated, budget), total=max(budget, 1), best=best)

    def error(self, message: str) -> None:
        self.progress.console.print(f"[red]error:[/red] {escape(message)}")

    def info(self, message: str) -> None:
        self.progress.console.print(escape(message))
