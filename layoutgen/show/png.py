"""The byte map as a picture (matplotlib, imported only here and only when asked: `layoutgen[plot]`).

One panel per buffer, one horizontal band per printed line of the text rendering, one rectangle per run:
coloured kinds in the colour of their index along the colouring axis, marked kinds hatched in it, filler
grey and void bytes white and hatched.  The file is written atomically.
"""

from __future__ import annotations

import importlib.util
import io
import math
from pathlib import Path
from typing import Any

from layoutgen.files import directories_for, replace_atomically
from layoutgen.show.model import ByteMap, Look
from layoutgen.show.text import colour_index, line_bytes

MISSING_MATPLOTLIB = "--png needs matplotlib: pip install 'layoutgen[plot]'"


def require_matplotlib() -> None:
    """Raise ImportError (saying what to install) when matplotlib is missing: callers check before they print
    anything, so that a missing optional dependency never leaves half an output behind."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ImportError(MISSING_MATPLOTLIB, name="matplotlib")


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(MISSING_MATPLOTLIB, name="matplotlib") from error
    return plt


def _run_style(look: Look, colour: tuple[float, ...]) -> dict[str, Any]:
    style: dict[str, Any] = {"edgecolor": "black", "linewidth": 0.4}
    if look is Look.COLOURED:
        style.update(facecolor=(*colour, 0.55))
    elif look is Look.MARKED:
        style.update(facecolor=colour, hatch="////", edgecolor="black", linewidth=0.8)
    elif look is Look.FILLER:
        style.update(facecolor="0.85")
    else:
        style.update(facecolor="white", hatch="xx", edgecolor="0.6")
    return style


def _legend_style(look: Look, colour: tuple[float, ...]) -> dict[str, Any]:
    """A legend patch: marked kinds in neutral grey (their colour varies with the colouring axis)."""
    if look is Look.COLOURED:
        return {"facecolor": (*colour, 0.55), "edgecolor": "black"}
    if look is Look.MARKED:
        return {"facecolor": "0.5", "hatch": "////", "edgecolor": "black"}
    if look is Look.FILLER:
        return {"facecolor": "0.85", "edgecolor": "black"}
    return {"facecolor": "white", "hatch": "xx", "edgecolor": "0.6"}


#: The most lines (all panels together) a PNG draws, 0.24 inch each: the bundled specs' drawings take 6 to 36.
#: 512 (deepspeed_ulysses --seq 64) took 9.4 s and 0.47 GB for 1210 x 13934 pixels, 3200 (--seq 400) 2 minutes
#: and 1.2 GB for 1210 x 84898, both under the text drawing's byte limit (CI-like CPU, matplotlib Agg).
MAX_PNG_LINES = 512
#: Legend entries per row under the panels, and the height one row of them takes.
LEGEND_COLUMNS = 8
LEGEND_ROW_INCHES = 0.22
PNG_DPI = 110


def png_lines(bmap: ByteMap) -> int:
    """How many lines the PNG of `bmap` draws."""
    return sum(info.nbytes // line_bytes(bmap, info)[1] for info in bmap.buffers)


def check_png_size(bmap: ByteMap, hint: str) -> None:
    """Refuse a PNG of more than MAX_PNG_LINES lines (ValueError) before matplotlib draws it."""
    lines = png_lines(bmap)
    if lines > MAX_PNG_LINES:
        raise ValueError(f"the PNG would draw {lines} lines of bytes; it is limited to {MAX_PNG_LINES}. {hint}")


def write_png(bmap: ByteMap, path: Path) -> int:
    """Draw the byte map with matplotlib (Agg) into `path`, atomically; return the file's size in bytes."""
    plt = _pyplot()
    fig = draw(bmap)
    image = io.BytesIO()
    try:
        fig.savefig(image, format="png", dpi=PNG_DPI)
    finally:
        plt.close(fig)
    with directories_for(Path(path)):
        replace_atomically(Path(path), image.getvalue())
    return Path(path).stat().st_size


def draw(bmap: ByteMap) -> Any:
    """The byte map's matplotlib figure (Agg); the caller closes it."""
    plt = _pyplot()
    from matplotlib.patches import Patch, Rectangle

    layout = bmap.layout
    panels = [(info, *line_bytes(bmap, info)) for info in bmap.buffers]
    line_counts = [info.nbytes // size for info, _, size in panels]
    fig_width, line_height = 11.0, 0.24
    heights = [max(count, 2) * line_height + 0.6 for count in line_counts]
    legend_rows = math.ceil((bmap.colour_count + len(layout.legend.entries)) / LEGEND_COLUMNS)
    # Constrained layout places the title and the legend outside the panels (tight_layout left a legend of
    # more than one row over the last panel's axis label, and the title over the first panel's).
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(fig_width, sum(heights) + 0.8 + LEGEND_ROW_INCHES * legend_rows),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
        layout="constrained",
    )
    colours = [tuple(rgba[:3]) for rgba in plt.get_cmap("tab10")(range(10))]
    for ax, (info, first_axis, size), count in zip(axes[:, 0], panels, line_counts, strict=True):
        points_per_byte = (fig_width * 0.86 * 72) / size
        for run in bmap.runs_of(info.name):
            line, x = divmod(run.offset, size)
            look = layout.kind(run.kind).look
            ax.add_patch(
                Rectangle(
                    (x, line), run.length, 0.9, **_run_style(look, colours[colour_index(bmap, run) % len(colours)])
                )
            )
            label = layout.label(run)
            if len(label) * 0.62 * 6 < run.length * points_per_byte:
                weight = "bold" if look is Look.MARKED else "normal"
                bbox = (
                    {"facecolor": "white", "alpha": 0.85, "pad": 0.6, "linewidth": 0}
                    if look in (Look.MARKED, Look.VOID)
                    else None
                )
                ax.text(x + run.length / 2, line + 0.45, label, ha="center", va="center", fontsize=6,
                        fontweight=weight, bbox=bbox)  # fmt: skip
        ax.set_xlim(0, size)
        ax.set_ylim(count, 0)
        ticks = list(range(0, count, max(1, count // 24)))
        ax.set_yticks([t + 0.45 for t in ticks], [str(t * size) for t in ticks], fontsize=6)
        ax.tick_params(axis="x", labelsize=6)
        ax.set_xlabel(f"byte within the line ({size} bytes: {' x '.join(info.axes[first_axis:])})", fontsize=7)
        ax.set_ylabel("byte offset", fontsize=7)
        ax.set_title(info.describe(), fontsize=8, loc="left")
    handles = [
        Patch(**_legend_style(Look.COLOURED, colours[index % len(colours)]), label=f"{layout.colour_axis} {index}")
        for index in range(bmap.colour_count)
    ]
    handles += [
        Patch(**_legend_style(layout.kind(entry.kind).look, colours[0]), label=entry.picture_label)
        for entry in layout.legend.entries
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), LEGEND_COLUMNS), fontsize=7,
               frameon=False)  # fmt: skip
    fig.suptitle(f"{layout.name}: {layout.shape_text}", fontsize=9)
    return fig
