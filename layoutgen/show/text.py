"""The byte map as rich text: a legend, one block of lines per buffer, and the family's summary paragraph.

Each printed line is one row of a buffer's innermost axis (or several short rows), and each cell one run,
labelled by the family (`ByteLayout.label`) and styled by its kind's `Look` and, for coloured kinds, by its
index along the colouring axis.  The width is fixed so that the output does not depend on the terminal.
"""

from __future__ import annotations

import io
import textwrap
from collections import Counter
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.text import Text

from layoutgen.show.facts import facts
from layoutgen.show.model import BufferInfo, ByteMap, Look, Run

#: Fixed text width so that the output does not depend on the terminal (golden files compare it).
TEXT_WIDTH = 120
#: A printed line is one row of the innermost axis, or several when rows are shorter than this many bytes ...
MIN_LINE_BYTES = 16
#: ... as long as a line keeps at most this many cells (which fit in TEXT_WIDTH).
MAX_CELLS_PER_LINE = 8

#: One style per index of the colouring axis (cycled).
COLOUR_STYLES = ("white on dark_blue", "white on dark_green", "white on dark_red", "white on purple4",
                 "white on dark_cyan", "black on orange3", "white on grey35", "black on gold3")  # fmt: skip
#: rich's short name of its faint attribute: offsets, rules and separators.
FAINT = "d"
LOOK_STYLES = {
    Look.MARKED: "bold black on bright_yellow",
    Look.FILLER: "grey50",
    Look.VOID: "grey42 italic",
}


def colour_index(bmap: ByteMap, run: Run) -> int:
    """The run's first index along the colouring axis (0 where its buffer has none)."""
    return (run.range(bmap.layout.colour_axis) or (0, 0))[0]


def line_bytes(bmap: ByteMap, info: BufferInfo) -> tuple[int, int]:
    """(first axis a line covers, bytes per line): one row of the innermost axis, widened to the next axes
    while a line is shorter than MIN_LINE_BYTES and would hold at most MAX_CELLS_PER_LINE runs."""
    first, size = len(info.axes) - 1, info.extents[-1] * info.elem_bytes
    offsets = [run.offset for run in bmap.runs_of(info.name)]
    while first > 0 and size < MIN_LINE_BYTES:
        wider = size * info.extents[first - 1]
        per_line = Counter(offset // wider for offset in offsets)
        if max(per_line.values()) > MAX_CELLS_PER_LINE:
            break
        first, size = first - 1, wider
    return first, size


def kind_style(bmap: ByteMap, kind: str, colour: int) -> str:
    look = bmap.layout.kind(kind).look
    if look is Look.COLOURED:
        return COLOUR_STYLES[colour % len(COLOUR_STYLES)]
    return LOOK_STYLES[look]


def _buffer_lines(bmap: ByteMap, info: BufferInfo) -> list[Text]:
    first_axis, size = line_bytes(bmap, info)
    width = len(str(info.nbytes))
    outer_block = info.nbytes // info.extents[0]
    lines = [Text(f"{info.describe()}; one line per {size} bytes ({' x '.join(info.axes[first_axis:])})", style="bold")]
    current_line, current_outer = -1, -1
    for run in bmap.runs_of(info.name):
        line = run.offset // size
        if first_axis > 0 and run.offset // outer_block != current_outer:
            current_outer = run.offset // outer_block
            start = current_outer * outer_block
            lines.append(
                Text(f"── {info.axes[0]} {current_outer} · bytes {start}..{start + outer_block - 1} ──", style=FAINT)
            )
        if line != current_line:
            current_line = line
            lines.append(Text(f"{line * size:>{width}} │", style=FAINT))
        lines[-1].append(f" {bmap.layout.label(run)} ", style=kind_style(bmap, run.kind, colour_index(bmap, run)))
        lines[-1].append("│", style=FAINT)
    return lines


def _legend(bmap: ByteMap) -> Text:
    legend_data, letter = bmap.layout.legend, bmap.layout.axis_letters[bmap.layout.colour_axis]
    legend = Text(f"{legend_data.colour_title}: ")
    for index in range(bmap.colour_count):
        legend.append(f" {letter}{index} ", style=COLOUR_STYLES[index % len(COLOUR_STYLES)])
        legend.append(" ")
    for position, entry in enumerate(legend_data.entries):
        if position:
            legend.append("  ")
        legend.append(entry.swatch, style=kind_style(bmap, entry.kind, 0))
        legend.append(f" {entry.text}")
    legend.append(f"\n{legend_data.key}")
    return legend


def paragraph(text: str) -> Text:
    """Wrapped here rather than by rich, so that no line ends in a space."""
    return Text("\n".join(textwrap.wrap(text, TEXT_WIDTH)))


def renderable(bmap: ByteMap) -> RenderableType:
    """Title, legend, every buffer line by line, and the family's summary paragraph."""
    parts: list[RenderableType] = [Text(f"layoutgen show {bmap.layout.name}", style="bold"), _legend(bmap), Text("")]
    for info in bmap.buffers:
        parts += _buffer_lines(bmap, info)
        parts.append(Text(""))
    parts.append(paragraph(bmap.layout.summary(bmap, facts(bmap))))
    return Group(*parts)


def text_console(file: Any = None, color: bool | None = None) -> Console:
    """The console the CLI prints with: fixed width; colour only on a terminal unless `color` says otherwise."""
    if color is None:
        return Console(file=file, width=TEXT_WIDTH, highlight=False)
    return Console(
        file=file,
        width=TEXT_WIDTH,
        highlight=False,
        color_system="truecolor" if color else None,
        force_terminal=color,
        legacy_windows=False,
    )


def render_text(renderable_: RenderableType) -> str:
    """Plain text of a renderable at the fixed width (what the golden files hold)."""
    buffer = io.StringIO()
    text_console(buffer, color=False).print(renderable_)
    return buffer.getvalue()
