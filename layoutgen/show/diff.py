"""Where the same logical element lands in two layouts of one family: the porting question.

Both layouts are drawn at the same shape, so each placed kind has views of the same shape in both; walking
the elements in logical (row-major view) order, a `DiffRun` is a stretch of elements that are consecutive
in both layouts' bytes.  The text form prints a summary, and every run when asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from rich.console import Group, RenderableType
from rich.text import Text

from layoutgen.show.json import one_item_per_line
from layoutgen.show.model import BufferInfo, ByteLayout, Look, buffer_infos, format_range, locate_all
from layoutgen.show.text import FAINT, paragraph


@dataclass(frozen=True)
class DiffRun:
    """Consecutive logical elements (in logical order) that are consecutive in both layouts."""

    kind: str
    #: The first and last element's index along each axis of the kind's view.
    first: tuple[int, ...]
    last: tuple[int, ...]
    count: int
    a_buffer: str
    a_offset: int
    a_length: int
    b_buffer: str
    b_offset: int
    b_length: int

    def same_place(self) -> bool:
        return (self.a_buffer, self.a_offset, self.a_length) == (self.b_buffer, self.b_offset, self.b_length)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "first": list(self.first),
            "last": list(self.last),
            "count": self.count,
            "a": {"buffer": self.a_buffer, "offset": self.a_offset, "length": self.a_length},
            "b": {"buffer": self.b_buffer, "offset": self.b_offset, "length": self.b_length},
        }


@dataclass(frozen=True)
class LayoutDiff:
    layout_a: ByteLayout
    layout_b: ByteLayout
    buffers_a: tuple[BufferInfo, ...]
    buffers_b: tuple[BufferInfo, ...]
    runs: tuple[DiffRun, ...]
    #: Logical elements whose bytes are the same buffer and offsets in both layouts.
    same_place: int
    #: The placed kinds compared (those both layouts hold with the same axes and extents), in A's order.
    compared: tuple[str, ...]
    #: The kinds not compared, in words ("" when every kind is): kinds only one layout holds, or holds with
    #: other axes or extents.
    not_compared: str = ""
    #: The spec fields (dotted, name and summary aside) whose values differ: layouts identical at this shape can
    #: still differ at another shape or dtype (a scale block, a row alignment, a wire dtype).
    differing_fields: tuple[str, ...] = ()
    #: The differing spec fields that describe only the caller's tensors (`ByteLayout.user_side_fields`).
    user_side_fields: tuple[str, ...] = ()

    @property
    def identical(self) -> bool:
        return not self.not_compared and self.buffers_a == self.buffers_b and all(run.same_place() for run in self.runs)

    def counts(self) -> dict[str, int]:
        """Compared kind -> how many of its elements the runs hold."""
        return {kind: sum(run.count for run in self.runs if run.kind == kind) for kind in self.compared}


def _element_difference(name_a: str, shapes_a: dict[str, Any], name_b: str, shapes_b: dict[str, Any]) -> str:
    """What differs between two layouts' placed kinds, in words: kinds only one holds, then kinds of other
    axes or extents."""
    parts = []
    for name, mine, theirs in ((name_a, shapes_a, shapes_b), (name_b, shapes_b, shapes_a)):
        only = [kind for kind in mine if kind not in theirs]
        if only:
            parts.append(f"only {name} holds {', '.join(only)}")
    for kind in (kind for kind in shapes_a if kind in shapes_b and shapes_a[kind] != shapes_b[kind]):
        (axes_a, extents_a), (axes_b, extents_b) = shapes_a[kind], shapes_b[kind]
        parts.append(
            f"{kind} is {' x '.join(f'{a} {e}' for a, e in zip(axes_a, extents_a, strict=True))} in {name_a}, "
            f"{' x '.join(f'{a} {e}' for a, e in zip(axes_b, extents_b, strict=True))} in {name_b}"
        )
    return "; ".join(parts)


def diff_byte_layouts(layout_a: ByteLayout, layout_b: ByteLayout) -> LayoutDiff:
    """Where each logical element of each placed kind lands in `layout_a` and in `layout_b`."""
    layout_a.check()
    layout_b.check()
    shapes_a = {p.kind: (p.axes, tuple(p.view.shape)) for p in layout_a.placements}
    shapes_b = {p.kind: (p.axes, tuple(p.view.shape)) for p in layout_b.placements}
    difference = _element_difference(layout_a.name, shapes_a, layout_b.name, shapes_b)
    compared = [p for p in layout_a.placements if shapes_b.get(p.kind) == shapes_a[p.kind]]
    if not compared:
        raise ValueError(
            f"layouts {layout_a.name} and {layout_b.name} hold no logical elements in common, so they cannot be "
            f"compared element by element: {difference}. Compare two layouts of one family whose buffers hold "
            "the same kinds of elements"
        )
    places_a, places_b = locate_all(layout_a), locate_all(layout_b)
    runs: list[DiffRun] = []
    same_place = 0
    for placement in compared:
        a, b = places_a[placement.kind], places_b[placement.kind]
        a_off, b_off = a.offsets.reshape(-1), b.offsets.reshape(-1)
        count = a_off.numel()
        if count == 0:
            continue
        if (a.buffer, a.elem_bytes) == (b.buffer, b.elem_bytes):
            same_place += int((a_off == b_off).sum())
        starts_run = torch.ones(count, dtype=torch.bool)
        starts_run[1:] = (a_off[1:] != a_off[:-1] + a.elem_bytes) | (b_off[1:] != b_off[:-1] + b.elem_bytes)
        starts = torch.nonzero(starts_run).flatten().tolist()
        stops = [*starts[1:], count]
        shape = tuple(a.offsets.shape)
        a_list, b_list = a_off.tolist(), b_off.tolist()
        for start, stop in zip(starts, stops, strict=True):
            n = stop - start
            runs.append(
                DiffRun(
                    kind=placement.kind,
                    first=tuple(int(i) for i in torch.unravel_index(torch.tensor(start), shape)),
                    last=tuple(int(i) for i in torch.unravel_index(torch.tensor(stop - 1), shape)),
                    count=n,
                    a_buffer=a.buffer,
                    a_offset=a_list[start],
                    a_length=n * a.elem_bytes,
                    b_buffer=b.buffer,
                    b_offset=b_list[start],
                    b_length=n * b.elem_bytes,
                )
            )
    return LayoutDiff(
        layout_a,
        layout_b,
        buffer_infos(layout_a),
        buffer_infos(layout_b),
        tuple(runs),
        same_place,
        tuple(p.kind for p in compared),
        difference,
    )


def run_label(run: DiffRun, layout: ByteLayout) -> str:
    """`x0 y1 z0..15` when only the last index moves, `x0 y1 z15 … x0 y2 z3` otherwise, then the kind's tag."""
    placement = layout.placement(run.kind)
    letters = [layout.axis_letters[axis] for axis in placement.axes]
    tail = f" {placement.tag}" if placement.tag else ""
    if run.first[:-1] == run.last[:-1]:
        fixed = [f"{letters[i]}{value}" for i, value in enumerate(run.first[:-1])]
        span = format_range(letters[-1], (run.first[-1], run.last[-1] + 1))
        return " ".join([*fixed, span]) + tail
    start = " ".join(f"{letters[i]}{value}" for i, value in enumerate(run.first))
    stop = " ".join(f"{letters[i]}{value}" for i, value in enumerate(run.last))
    return f"{start} … {stop}{tail}"


def _runs_table(diff: LayoutDiff) -> list[RenderableType]:
    name_a, name_b = diff.layout_a.name, diff.layout_b.name
    rows = [
        (
            run_label(run, diff.layout_a),
            str(run.count),
            f"{run.a_buffer}[{run.a_offset}:{run.a_offset + run.a_length}]",
            f"{run.b_buffer}[{run.b_offset}:{run.b_offset + run.b_length}]",
        )
        for run in diff.runs
    ]
    header = ("logical element(s)", "count", f"A {name_a} buffer[bytes]", f"B {name_b} buffer[bytes]")
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(4)]

    def line(cells: tuple[str, str, str, str], styles: tuple[str, str, str, str]) -> Text:
        text = Text()
        for column, (cell, style) in enumerate(zip(cells, styles, strict=True)):
            padded = cell.rjust(widths[column]) if column == 1 else cell.ljust(widths[column])
            text.append(padded if column < 3 else cell, style=style)
            if column < 3:
                text.append("  ")
        return text

    table: list[RenderableType] = [Text(""), line(header, ("bold",) * 4)]
    for run, row in zip(diff.runs, rows, strict=True):
        place_style = FAINT if run.same_place() else ""
        marked = diff.layout_a.kind(run.kind).look is Look.MARKED
        table.append(line(row, ("bold yellow" if marked else "", "", place_style, place_style)))
    return table


def diff_renderable(diff: LayoutDiff, runs: bool = False) -> RenderableType:
    """Title, shape, both layouts' buffers and the summary paragraph; with `runs`, the table of every run too."""
    name_a, name_b = diff.layout_a.name, diff.layout_b.name
    parts: list[RenderableType] = [
        Text(f"layoutgen diff {name_a} {name_b}", style="bold"),
        Text(diff.layout_a.shape_text),
    ]
    for letter, name, infos in (("A", name_a, diff.buffers_a), ("B", name_b, diff.buffers_b)):
        prefix = f"{letter} {name}: "
        for index, info in enumerate(infos):
            parts.append(Text((prefix if index == 0 else " " * len(prefix)) + info.describe()))
    if runs:
        parts += _runs_table(diff)
    parts += [Text(""), paragraph(diff_summary(diff, runs))]
    return Group(*parts)


def diff_summary(diff: LayoutDiff, runs: bool = True) -> str:
    counts = diff.counts()
    if diff.identical and diff.differing_fields:
        verdict = (
            "At this shape and dtype the two layouts place every byte identically, but the specs differ in "
            f"{', '.join(diff.differing_fields)}: other shapes or dtypes can place bytes differently (try another "
            "--shape or --dtype)."
        )
    elif diff.identical and diff.user_side_fields:
        verdict = (
            "The two layouts place every buffer byte identically, at every shape: the specs differ only in "
            f"{', '.join(diff.user_side_fields)}, the layout of the tensors the kernels read and write on the "
            "caller's side, so the buffers are exchanged alike and only those kernels differ."
        )
    elif diff.identical:
        verdict = "The two layouts place every byte identically: a port needs no kernel change."
    else:
        where = (
            "Each row of the table is a run of logical elements that are consecutive in both layouts."
            if runs
            else "--runs lists every run of logical elements that are consecutive in both layouts."
        )
        verdict = (
            f"{diff.same_place} of {sum(counts.values())} logical elements land at the same buffer and byte offsets "
            f"in both. {where}"
        )
        if diff.differing_fields and diff.same_place == sum(counts.values()):
            # Every element compared in place, yet not identical: the buffers differ (one element dtype against
            # another of its width), or are alike but hold other kinds beside the compared ones.
            if diff.buffers_a != diff.buffers_b:
                consequence = "and the buffers' dtypes or sizes with them"
            else:
                consequence = (
                    "and what the buffers hold beside the elements compared (their dtypes and sizes are the same)"
                )
            verdict += (
                f" Yet the specs differ in {', '.join(diff.differing_fields)}, {consequence}: a port changes "
                "the kernels."
            )
    not_compared = f" Not compared: {diff.not_compared}." if diff.not_compared else ""
    return f"{diff.layout_a.elements_phrase(counts)} in {len(diff.runs)} runs. {verdict}{not_compared}"


def diff_to_json(diff: LayoutDiff) -> str:
    header = {
        "a": diff.layout_a.name,
        "b": diff.layout_b.name,
        "shape": dict(diff.layout_a.shape_json),
        "identical": diff.identical,
        "differing_fields": list(diff.differing_fields),
        "user_side_fields": list(diff.user_side_fields),
        "same_place": diff.same_place,
        "not_compared": diff.not_compared,
    }
    return one_item_per_line(header, [run.as_dict() for run in diff.runs], "runs")
