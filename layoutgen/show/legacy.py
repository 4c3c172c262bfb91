"""Byte maps of a layout: which peer, batch row, head and element owns every byte of every buffer.

The map is read off the strided views that the reference packs through
(`LayoutBuffers.payload_view` / `lse_view`): the byte offset of every logical
element is the view's storage offset plus index * stride, so the map is right
by construction for any valid spec and nothing here re-derives a layout.

Three renderings share one model: rich text for the terminal (`render`), a
matplotlib picture (`write_png`, matplotlib imported lazily: `layoutgen[plot]`)
and JSON for tools (`to_json`).  `diff_layouts` answers the porting question:
where does the same logical element land in two layouts.
"""

from __future__ import annotations

import io
import json
import math
import os
import textwrap
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console, Group, RenderableType
from rich.text import Text

from layoutgen.layout import LayoutBuffers
from layoutgen.spec import LayoutSpec, Transport

#: Kinds of bytes, in the order of their codes.
KINDS: tuple[str, ...] = ("payload", "lse", "padding", "unused")
_PAYLOAD, _LSE, _PADDING, _UNUSED = range(4)
#: The widest store a GPU thread issues (one 128-bit vector).
WIDEST_STORE_BYTES = 16
#: Row alignment is judged against a base aligned to this many bytes: cudaMalloc guarantees 256, and
#: torch's caching allocator hands out blocks at multiples of 512.
ASSUMED_BASE_ALIGN = 256
#: A drawing is for reading; larger maps would take seconds to build and pages to print.
MAX_MAP_BYTES = 1 << 20
#: Fixed text width so that the output does not depend on the terminal (golden files compare it).
TEXT_WIDTH = 120
#: A printed line is one row of the innermost axis, or several when rows are shorter than this many bytes ...
MIN_LINE_BYTES = 16
#: ... as long as a line keeps at most this many cells (which fit in TEXT_WIDTH).
MAX_CELLS_PER_LINE = 8
DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_AXIS_LETTER = {"peer": "p", "batch": "b", "head": "h", "dim": "d", "slot": "s"}
_RANGE_AXES = ("peer", "batch", "head", "dim", "slot")


@dataclass(frozen=True)
class Problem:
    """The shape a map is drawn at. The batch capacity is one more than the live batch so that an unused row shows."""

    N: int
    B: int
    H: int
    D: int
    dtype: torch.dtype

    @property
    def B_max(self) -> int:
        return self.B + 1

    @property
    def heads_per_peer(self) -> int:
        return self.H // self.N

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def describe(self) -> str:
        return (
            f"N={self.N} peers, B={self.B} live rows (B_max={self.B_max}), H={self.H} heads "
            f"({self.heads_per_peer} per peer), D={self.D}, out in {self.dtype_name}"
        )


@dataclass(frozen=True)
class BufferInfo:
    name: str
    axes: tuple[str, ...]
    extents: tuple[int, ...]
    dtype: str
    elem_bytes: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.extents) * self.elem_bytes

    def describe(self) -> str:
        dims = ", ".join(f"{axis} {extent}" for axis, extent in zip(self.axes, self.extents, strict=True))
        return f"{self.name} [{dims}] {self.dtype}, {self.nbytes} bytes"


Range = tuple[int, int]  # half-open [start, stop)


@dataclass(frozen=True)
class Run:
    """Consecutive bytes of one buffer with one kind, along which only the buffer's innermost index moves.

    Each axis is a half-open index range along that axis of the buffer (`dim` counts row positions in
    wire elements, so the row tail of a row_tail layout sits at dim >= D), or None where the buffer
    has no such axis.
    """

    buffer: str
    offset: int
    length: int
    kind: str
    peer: Range | None
    batch: Range | None
    head: Range | None
    dim: Range | None
    slot: Range | None

    def label(self, live_batch: int) -> str:
        """Short text for a cell, e.g. `p1 b0 h3 d0..15`, `p1 b0 h3 lse`, `pad 12B`, `s1 unused`."""
        if self.kind == "padding":
            return f"pad {self.length}B"
        if self.kind == "unused" and self.slot is not None and self.batch is not None and self.batch[0] < live_batch:
            return f"{_format_axis('slot', self.slot)} unused"
        shown = _RANGE_AXES if self.kind == "payload" else ("peer", "batch", "head")
        parts = [_format_axis(axis, index) for axis in shown if (index := getattr(self, axis)) is not None]
        return " ".join(parts if self.kind == "payload" else [*parts, self.kind])

    def as_dict(self) -> dict[str, Any]:
        ranges = {axis: None if getattr(self, axis) is None else list(getattr(self, axis)) for axis in _RANGE_AXES}
        return {"buffer": self.buffer, "offset": self.offset, "length": self.length, "kind": self.kind, **ranges}


def _format_axis(axis: str, index: Range) -> str:
    start, stop = index
    return f"{_AXIS_LETTER[axis]}{start}" if stop == start + 1 else f"{_AXIS_LETTER[axis]}{start}..{stop - 1}"


@dataclass(frozen=True)
class ByteMap:
    spec: LayoutSpec
    problem: Problem
    buffers: tuple[BufferInfo, ...]
    runs: tuple[Run, ...]

    def buffer(self, name: str) -> BufferInfo:
        return next(info for info in self.buffers if info.name == name)

    def runs_of(self, buffer: str) -> list[Run]:
        return [run for run in self.runs if run.buffer == buffer]


@dataclass(frozen=True)
class _Placement:
    """Where every logical element of one kind lives: one buffer, byte offsets shaped like the logical view."""

    buffer: str
    offsets: torch.Tensor  # int64, [N, B, H/N, D] for the payload, [N, B, H/N] for the LSE
    elem_bytes: int


def allocate(spec: LayoutSpec, problem: Problem) -> LayoutBuffers:
    """CPU buffers of `spec` at `problem` (raises ValueError/TypeError naming a bad argument)."""
    return LayoutBuffers.allocate(spec, problem.N, problem.B_max, problem.H, problem.D, problem.dtype, "cpu")


def _view_placement(view: torch.Tensor, tensors: dict[str, torch.Tensor]) -> _Placement:
    """Byte offset, from its buffer's start, of every element of a strided view into one of `tensors`."""
    storage = view.untyped_storage().data_ptr()
    owners = [name for name, tensor in tensors.items() if tensor.untyped_storage().data_ptr() == storage]
    if len(owners) != 1:
        raise RuntimeError(f"a layout view belongs to {len(owners)} buffers, expected exactly one")
    base = tensors[owners[0]]
    index = torch.full(view.shape, int(view.storage_offset()), dtype=torch.int64)
    for axis, (extent, stride) in enumerate(zip(view.shape, view.stride(), strict=True)):
        steps = torch.arange(extent, dtype=torch.int64) * stride
        index = index + steps.view([extent if a == axis else 1 for a in range(view.dim())])
    offsets = index * view.element_size() - int(base.storage_offset()) * base.element_size()
    return _Placement(owners[0], offsets, view.element_size())


def logical_placements(bufs: LayoutBuffers, B: int) -> dict[str, _Placement]:
    """`payload` and `lse` placements of the first B rows, from the views the reference packs through."""
    return {
        "payload": _view_placement(bufs.payload_view(B), bufs.tensors),
        "lse": _view_placement(bufs.lse_view(B), bufs.tensors),
    }


def check_size(spec: LayoutSpec, problem: Problem) -> LayoutBuffers:
    bufs = allocate(spec, problem)
    total = sum(t.numel() * t.element_size() for t in bufs.tensors.values())
    if total > MAX_MAP_BYTES:
        raise ValueError(
            f"the buffers of '{spec.name}' at {problem.describe()} hold {total} bytes; a drawing is limited to "
            f"{MAX_MAP_BYTES} bytes. Use smaller --batch/--heads/--D: the pattern is the same at any size"
        )
    return bufs


def _buffer_infos(bufs: LayoutBuffers) -> tuple[BufferInfo, ...]:
    """Name, axes (the spec's), extents and element type of every buffer, in `tensors` order."""
    infos = []
    for name, tensor in bufs.tensors.items():
        axes = bufs.spec.payload.axes if name == "payload" else bufs.spec.stats.axes
        if axes is None:  # a stats buffer exists only for placement: separate, whose axes are required
            raise RuntimeError(f"buffer {name} of spec {bufs.spec.name} has no axes")
        dtype = str(tensor.dtype).removeprefix("torch.")
        infos.append(BufferInfo(name, tuple(axes), tuple(tensor.shape), dtype, tensor.element_size()))
    return tuple(infos)


def byte_map(spec: LayoutSpec, problem: Problem) -> ByteMap:
    """Owner of every byte of every buffer of `spec` at `problem`, as runs in memory order."""
    bufs = check_size(spec, problem)
    placements = logical_placements(bufs, problem.B)
    live_batch = problem.B
    infos = _buffer_infos(bufs)
    runs: list[Run] = []
    for info in infos:
        name = info.name
        kinds = torch.full((info.nbytes,), -1, dtype=torch.int8)
        for kind_code, kind in ((_PAYLOAD, "payload"), (_LSE, "lse")):
            placement = placements[kind]
            if placement.buffer != name:
                continue
            byte_index = (placement.offsets.reshape(-1, 1) + torch.arange(placement.elem_bytes)).reshape(-1)
            if bool((kinds[byte_index] != -1).any()) or byte_index.unique().numel() != byte_index.numel():
                raise RuntimeError(f"spec {spec.name}: two logical elements share bytes of buffer {name}")
            kinds[byte_index] = kind_code
        element_kinds = kinds.view(-1, info.elem_bytes)
        if bool((element_kinds != element_kinds[:, :1]).any()):
            raise RuntimeError(f"spec {spec.name}: a {info.dtype} element of {name} is only partly assigned")
        element_kind = element_kinds[:, 0].clone()
        coords = torch.stack(torch.unravel_index(torch.arange(math.prod(info.extents)), info.extents), dim=1)
        _check_view_indices(spec, info, coords, placements, name)
        unassigned = element_kind == -1
        beyond_batch = coords[:, info.axes.index("batch")] >= live_batch
        # Bytes no view covers: rows past the live batch are unused, and so are the other slots of a stats
        # buffer; what remains lies in the payload rows themselves (the tail rounded up to align_bytes).
        element_kind[unassigned & beyond_batch if name == "payload" else unassigned] = _UNUSED
        element_kind[element_kind == -1] = _PADDING
        runs += _runs_of(info, element_kind, coords)
    return ByteMap(spec, problem, infos, tuple(runs))


def _check_view_indices(
    spec: LayoutSpec, info: BufferInfo, coords: torch.Tensor, placements: dict[str, _Placement], name: str
) -> None:
    """The element a view index lands on has the same peer/batch/head (and dim) in the buffer's own axes."""
    for kind, axes in (("payload", ("peer", "batch", "head", "dim")), ("lse", ("peer", "batch", "head"))):
        placement = placements[kind]
        if placement.buffer != name or placement.offsets.numel() == 0:
            continue
        landed = coords[(placement.offsets // info.elem_bytes).reshape(-1)]
        grids = torch.meshgrid(*[torch.arange(n) for n in placement.offsets.shape], indexing="ij")
        for axis, grid in zip(axes, grids, strict=True):
            if not torch.equal(landed[:, info.axes.index(axis)], grid.reshape(-1)):
                raise RuntimeError(f"spec {spec.name}: the {kind} view's {axis} index disagrees with buffer {name}")


def _runs_of(info: BufferInfo, element_kind: torch.Tensor, coords: torch.Tensor) -> list[Run]:
    count = element_kind.numel()
    starts_run = torch.ones(count, dtype=torch.bool)
    starts_run[1:] = (
        (element_kind[1:] != element_kind[:-1])
        | (coords[1:, :-1] != coords[:-1, :-1]).any(dim=1)
        | (coords[1:, -1] != coords[:-1, -1] + 1)
    )
    starts = torch.nonzero(starts_run).flatten().tolist()
    stops = [*starts[1:], count]
    kinds, coord_rows = element_kind.tolist(), coords.tolist()
    runs = []
    for start, stop in zip(starts, stops, strict=True):
        first, last = coord_rows[start], coord_rows[stop - 1]
        ranges = {axis: (first[i], last[i] + 1) for i, axis in enumerate(info.axes)}
        runs.append(
            Run(
                buffer=info.name,
                offset=start * info.elem_bytes,
                length=(stop - start) * info.elem_bytes,
                kind=KINDS[kinds[start]],
                **{axis: ranges.get(axis) for axis in _RANGE_AXES},
            )
        )
    return runs


# --------------------------------------------------------------------------------------------- facts


def _pow2_dividing(value: int, cap: int) -> int:
    """Largest power of two that divides `value`, at most `cap` (0 is divisible by everything)."""
    return cap if value == 0 else min(cap, value & -value)


@dataclass(frozen=True)
class BufferFacts:
    name: str
    row_axis: str
    row_bytes: int
    row_align: int
    peer_outermost: bool
    peer_block_bytes: int  # contiguous bytes of one peer (the whole chunk when peer is outermost)
    peer_block_every: int  # distance between two blocks of the same peer, 0 when there is one block

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Facts:
    buffers: tuple[BufferFacts, ...]
    payload_store_bytes: int  # widest aligned store that covers every payload run exactly
    lse_buffer: str
    lse_offsets_in_row: tuple[int, ...]  # row_tail with dim innermost: byte offset of the LSE word in its row
    lse_slots: tuple[int, ...]  # separate: the stats slots that hold the LSE
    padding_bytes: int
    unused_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "buffers": [b.as_dict() for b in self.buffers],
            "payload_store_bytes": self.payload_store_bytes,
            "lse_buffer": self.lse_buffer,
            "lse_offsets_in_row": list(self.lse_offsets_in_row),
            "lse_slots": list(self.lse_slots),
            "padding_bytes": self.padding_bytes,
            "unused_bytes": self.unused_bytes,
        }


def facts(bmap: ByteMap) -> Facts:
    buffer_facts = []
    for info in bmap.buffers:
        row_bytes = info.extents[-1] * info.elem_bytes
        peer_axis = info.axes.index("peer")
        block = math.prod(info.extents[peer_axis + 1 :]) * info.elem_bytes
        buffer_facts.append(
            BufferFacts(
                name=info.name,
                row_axis=info.axes[-1],
                row_bytes=row_bytes,
                row_align=_pow2_dividing(row_bytes, ASSUMED_BASE_ALIGN),
                peer_outermost=peer_axis == 0,
                peer_block_bytes=block,
                peer_block_every=0 if peer_axis == 0 else block * bmap.problem.N,
            )
        )
    payload_runs = [run for run in bmap.runs if run.kind == "payload"]
    store = WIDEST_STORE_BYTES
    for run in payload_runs:
        store = min(store, _pow2_dividing(run.offset, store), _pow2_dividing(run.length, store))
    lse_runs = [run for run in bmap.runs if run.kind == "lse"]
    lse_buffer = lse_runs[0].buffer if lse_runs else ""
    row_stride = {f.name: f.row_bytes for f in buffer_facts}
    tail_in_rows = bmap.spec.row_tail and bmap.spec.payload.axes[-1] == "dim"
    in_row = sorted({run.offset % row_stride[run.buffer] for run in lse_runs}) if tail_in_rows else []
    slots = sorted({i for run in lse_runs if run.slot is not None for i in range(*run.slot)})
    return Facts(
        buffers=tuple(buffer_facts),
        payload_store_bytes=store,
        lse_buffer=lse_buffer,
        lse_offsets_in_row=tuple(in_row),
        lse_slots=tuple(slots),
        padding_bytes=sum(run.length for run in bmap.runs if run.kind == "padding"),
        unused_bytes=sum(run.length for run in bmap.runs if run.kind == "unused"),
    )


def summary(bmap: ByteMap) -> str:
    """One paragraph: buffers, shapes, bytes per peer, row alignment, store width, LSE, transport."""
    spec, problem, found = bmap.spec, bmap.problem, facts(bmap)
    dim_innermost = spec.payload.axes[-1] == "dim"
    sentences = [
        f"{spec.name} at {problem.describe()}: "
        + ("one buffer, " if len(bmap.buffers) == 1 else f"{len(bmap.buffers)} buffers, ")
        + "; ".join(info.describe() for info in bmap.buffers)
        + "."
    ]
    per_peer = []
    for buffer in found.buffers:
        if buffer.peer_outermost:
            per_peer.append(f"{buffer.name} chunk of {buffer.peer_block_bytes} contiguous bytes")
        else:
            blocks = bmap.buffer(buffer.name).nbytes // buffer.peer_block_every
            per_peer.append(
                f"{buffer.name}: {blocks} blocks of {buffer.peer_block_bytes} bytes, {buffer.peer_block_every} apart"
            )
    sentences.append("Per peer: " + "; ".join(per_peer) + ".")
    rows = [
        f"{b.name} rows ({b.row_axis} axis) are {b.row_bytes} bytes apart, so {b.row_align}-byte aligned"
        for b in found.buffers
    ]
    sentences.append(
        "Rows: "
        + "; ".join(rows)
        + f" (largest power of two dividing the row stride and a {ASSUMED_BASE_ALIGN}-byte base)."
    )
    store = found.payload_store_bytes
    payload_rows = next(b for b in found.buffers if b.name == "payload")
    if store >= WIDEST_STORE_BYTES:
        verdict = "16-byte stores: yes"
    else:
        verdict = f"16-byte stores: no, at most {store}-byte stores cover every payload run exactly"
        if dim_innermost and spec.row_tail and payload_rows.row_align < WIDEST_STORE_BYTES:
            verdict += (
                " (align_bytes: 32 pads rows to fix that; 16 would leave two partly written 32-byte sectors per row)"
            )
        elif dim_innermost:
            row_payload = problem.D * bmap.buffer("payload").elem_bytes
            verdict += f" (a row's D elements are {row_payload} bytes, not a multiple of 16)"
    sentences.append(f"Payload runs start and end on {store}-byte boundaries: {verdict}.")
    if spec.row_tail and dim_innermost:
        where = ", ".join(str(offset) for offset in found.lse_offsets_in_row)
        sentences.append(f"LSE: a float32 word at byte {where} of every {found.lse_buffer} row (after the D elements).")
    elif spec.row_tail:
        sentences.append(
            f"LSE: the float32 element at index D={problem.D} of the dim axis, one more element of each "
            f"(peer, batch, head) entry."
        )
    else:
        slots = bmap.buffer(found.lse_buffer).extents[bmap.buffer(found.lse_buffer).axes.index("slot")]
        where = ", ".join(str(slot) for slot in found.lse_slots)
        sentences.append(f"LSE: slot {where} of {slots} float32 word(s) per entry of {found.lse_buffer}.")
    sentences.append(
        f"Never written by pack nor read by combine: {found.padding_bytes} bytes of padding, "
        f"{found.unused_bytes} bytes of unused rows (b >= {problem.B}) or slots."
    )
    if spec.transport is Transport.ALL_TO_ALL_SINGLE:
        sentences.append(
            "Transport all_to_all_single: one torch.distributed.all_to_all_single per buffer moves each peer's chunk."
        )
    else:
        sentences.append("Transport external: the caller's transport moves these buffers (no exchange() is generated).")
    return " ".join(sentences)


# ------------------------------------------------------------------------------------------ terminal

_PEER_STYLES = ("white on dark_blue", "white on dark_green", "white on dark_red", "white on purple4",
                "white on dark_cyan", "black on orange3", "white on grey35", "black on gold3")  # fmt: skip
_LSE_STYLE = "bold black on bright_yellow"
_PADDING_STYLE = "grey50"
_UNUSED_STYLE = "grey42 italic"


def _line_bytes(bmap: ByteMap, info: BufferInfo) -> tuple[int, int]:
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


def _run_style(run: Run) -> str:
    if run.kind == "padding":
        return _PADDING_STYLE
    if run.kind == "unused":
        return _UNUSED_STYLE
    peer_style = _PEER_STYLES[(run.peer or (0, 0))[0] % len(_PEER_STYLES)]
    return _LSE_STYLE if run.kind == "lse" else peer_style


def _buffer_lines(bmap: ByteMap, info: BufferInfo) -> list[Text]:
    first_axis, line_bytes = _line_bytes(bmap, info)
    width = len(str(info.nbytes))
    outer_block = info.nbytes // info.extents[0]
    lines = [
        Text(f"{info.describe()}; one line per {line_bytes} bytes ({' x '.join(info.axes[first_axis:])})", style="bold")
    ]
    current_line, current_outer = -1, -1
    for run in bmap.runs_of(info.name):
        line = run.offset // line_bytes
        if first_axis > 0 and run.offset // outer_block != current_outer:
            current_outer = run.offset // outer_block
            start = current_outer * outer_block
            lines.append(
                Text(f"── {info.axes[0]} {current_outer} · bytes {start}..{start + outer_block - 1} ──", style="dim")
            )
        if line != current_line:
            current_line = line
            lines.append(Text(f"{line * line_bytes:>{width}} │", style="dim"))
        lines[-1].append(f" {run.label(bmap.problem.B)} ", style=_run_style(run))
        lines[-1].append("│", style="dim")
    return lines


def _legend(bmap: ByteMap) -> Text:
    legend = Text("peers: ")
    for peer in range(bmap.problem.N):
        legend.append(f" p{peer} ", style=_PEER_STYLES[peer % len(_PEER_STYLES)])
        legend.append(" ")
    legend.append(" lse ", style=_LSE_STYLE)
    legend.append(" float32 LSE word  ")
    legend.append("pad", style=_PADDING_STYLE)
    legend.append(" alignment padding  ")
    legend.append("unused", style=_UNUSED_STYLE)
    legend.append(f" rows b >= B={bmap.problem.B} or other stats slots\n")
    legend.append(
        "p peer, b batch row, h head of the peer's block, d position in the row (wire elements), s stats slot"
    )
    return legend


def _paragraph(text: str) -> Text:
    """Wrapped here rather than by rich, so that no line ends in a space."""
    return Text("\n".join(textwrap.wrap(text, TEXT_WIDTH)))


def renderable(bmap: ByteMap) -> RenderableType:
    parts: list[RenderableType] = [Text(f"layoutgen show {bmap.spec.name}", style="bold"), _legend(bmap), Text("")]
    for info in bmap.buffers:
        parts += _buffer_lines(bmap, info)
        parts.append(Text(""))
    parts.append(_paragraph(summary(bmap)))
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


# ---------------------------------------------------------------------------------------------- json


def to_json(bmap: ByteMap) -> str:
    """The byte map for tools: one run per line. Axis ranges are half-open [start, stop) or null."""
    problem = bmap.problem
    head = {
        "spec": bmap.spec.name,
        "layout_hash": bmap.spec.layout_hash(),
        "transport": bmap.spec.transport.value,
        "shape": {
            "N": problem.N,
            "B": problem.B,
            "B_max": problem.B_max,
            "H": problem.H,
            "heads_per_peer": problem.heads_per_peer,
            "D": problem.D,
            "dtype": problem.dtype_name,
        },
        "buffers": [
            {
                "name": info.name,
                "axes": list(info.axes),
                "extents": list(info.extents),
                "dtype": info.dtype,
                "elem_bytes": info.elem_bytes,
                "bytes": info.nbytes,
            }
            for info in bmap.buffers
        ],
        "facts": facts(bmap).as_dict(),
    }
    lines = ["{"] + [f"  {json.dumps(key)}: {json.dumps(value)}," for key, value in head.items()]
    runs = [f"    {json.dumps(run.as_dict())}" for run in bmap.runs]
    return "\n".join([*lines, '  "runs": [', ",\n".join(runs), "  ]", "}"]) + "\n"


# ----------------------------------------------------------------------------------------------- png


def write_png(bmap: ByteMap, path: Path) -> int:
    """Draw the byte map with matplotlib (Agg) into `path`, atomically; return the file's size in bytes."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch, Rectangle
    except ImportError as error:
        raise ImportError("--png needs matplotlib: pip install 'layoutgen[plot]'") from error

    layouts = [(info, *_line_bytes(bmap, info)) for info in bmap.buffers]
    line_counts = [info.nbytes // line_bytes for info, _, line_bytes in layouts]
    fig_width, line_height = 11.0, 0.24
    heights = [max(count, 2) * line_height + 0.6 for count in line_counts]
    fig, axes = plt.subplots(
        len(layouts), 1, figsize=(fig_width, sum(heights) + 1.4), gridspec_kw={"height_ratios": heights}, squeeze=False
    )
    peer_colors = [tuple(rgba[:3]) for rgba in plt.get_cmap("tab10")(range(10))]
    for ax, (info, first_axis, line_bytes), count in zip(axes[:, 0], layouts, line_counts, strict=True):
        points_per_byte = (fig_width * 0.86 * 72) / line_bytes
        for run in bmap.runs_of(info.name):
            line, x = divmod(run.offset, line_bytes)
            peer_color = peer_colors[(run.peer or (0, 0))[0] % len(peer_colors)]
            style: dict[str, Any] = {"edgecolor": "black", "linewidth": 0.4}
            if run.kind == "payload":
                style.update(facecolor=(*peer_color, 0.55))
            elif run.kind == "lse":
                style.update(facecolor=peer_color, hatch="////", edgecolor="black", linewidth=0.8)
            elif run.kind == "padding":
                style.update(facecolor="0.85")
            else:
                style.update(facecolor="white", hatch="xx", edgecolor="0.6")
            ax.add_patch(Rectangle((x, line), run.length, 0.9, **style))
            label = run.label(bmap.problem.B)
            if len(label) * 0.62 * 6 < run.length * points_per_byte:
                weight = "bold" if run.kind == "lse" else "normal"
                bbox = (
                    {"facecolor": "white", "alpha": 0.85, "pad": 0.6, "linewidth": 0}
                    if run.kind in ("lse", "unused")
                    else None
                )
                ax.text(x + run.length / 2, line + 0.45, label, ha="center", va="center", fontsize=6,
                        fontweight=weight, bbox=bbox)  # fmt: skip
        ax.set_xlim(0, line_bytes)
        ax.set_ylim(count, 0)
        ticks = list(range(0, count, max(1, count // 24)))
        ax.set_yticks([t + 0.45 for t in ticks], [str(t * line_bytes) for t in ticks], fontsize=6)
        ax.tick_params(axis="x", labelsize=6)
        ax.set_xlabel(f"byte within the line ({line_bytes} bytes: {' x '.join(info.axes[first_axis:])})", fontsize=7)
        ax.set_ylabel("byte offset", fontsize=7)
        ax.set_title(info.describe(), fontsize=8, loc="left")
    handles = [
        Patch(facecolor=(*peer_colors[p % 10], 0.55), edgecolor="black", label=f"peer {p}")
        for p in range(bmap.problem.N)
    ]
    handles += [
        Patch(facecolor="0.5", hatch="////", edgecolor="black", label="LSE (float32)"),
        Patch(facecolor="0.85", edgecolor="black", label="padding"),
        Patch(facecolor="white", hatch="xx", edgecolor="0.6", label=f"unused (b >= {bmap.problem.B}, other slots)"),
    ]
    fig.legend(
        handles=handles, loc="lower center", ncol=min(len(handles), 8), fontsize=7, frameon=False, borderaxespad=0.3
    )
    fig.suptitle(f"{bmap.spec.name}: {bmap.problem.describe()}", fontsize=9)
    fig.tight_layout(rect=(0, 0.3 / (sum(heights) + 1.4), 1, 1))
    image = io.BytesIO()
    try:
        fig.savefig(image, format="png", dpi=110)
    finally:
        plt.close(fig)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed over it: a reader never sees half a picture.
    partial = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        partial.write_bytes(image.getvalue())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path.stat().st_size


# ---------------------------------------------------------------------------------------------- diff


@dataclass(frozen=True)
class DiffRun:
    """Consecutive logical elements (in logical order) that are consecutive in both layouts."""

    kind: str  # payload | lse
    first: tuple[int, ...]  # (peer, batch, head, d) for payload, (peer, batch, head) for lse
    last: tuple[int, ...]
    count: int
    a_buffer: str
    a_offset: int
    a_length: int
    b_buffer: str
    b_offset: int
    b_length: int

    def label(self) -> str:
        letters = "pbhd"
        tail = " lse" if self.kind == "lse" else ""
        if self.first[:-1] == self.last[:-1]:
            fixed = [f"{letters[i]}{v}" for i, v in enumerate(self.first[:-1])]
            last_axis = len(self.first) - 1
            span = _format_axis(("peer", "batch", "head", "dim")[last_axis], (self.first[-1], self.last[-1] + 1))
            return " ".join([*fixed, span]) + tail
        start = " ".join(f"{letters[i]}{v}" for i, v in enumerate(self.first))
        stop = " ".join(f"{letters[i]}{v}" for i, v in enumerate(self.last))
        return f"{start} … {stop}{tail}"

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
    spec_a: LayoutSpec
    spec_b: LayoutSpec
    problem: Problem
    buffers_a: tuple[BufferInfo, ...]
    buffers_b: tuple[BufferInfo, ...]
    runs: tuple[DiffRun, ...]
    same_place: int  # logical elements whose bytes are the same buffer and offsets in both layouts

    @property
    def identical(self) -> bool:
        return self.buffers_a == self.buffers_b and all(run.same_place() for run in self.runs)


def diff_layouts(spec_a: LayoutSpec, spec_b: LayoutSpec, problem: Problem) -> LayoutDiff:
    """Where each logical element (peer, batch, head, d or lse) lands in `spec_a` and in `spec_b`."""
    bufs_a, bufs_b = check_size(spec_a, problem), check_size(spec_b, problem)
    places_a, places_b = logical_placements(bufs_a, problem.B), logical_placements(bufs_b, problem.B)
    runs: list[DiffRun] = []
    same_place = 0
    for kind in ("payload", "lse"):
        a, b = places_a[kind], places_b[kind]
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
                    kind=kind,
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
    return LayoutDiff(spec_a, spec_b, problem, _buffer_infos(bufs_a), _buffer_infos(bufs_b), tuple(runs), same_place)


def diff_renderable(diff: LayoutDiff) -> RenderableType:
    name_a, name_b = diff.spec_a.name, diff.spec_b.name
    parts: list[RenderableType] = [
        Text(f"layoutgen diff {name_a} {name_b}", style="bold"),
        Text(diff.problem.describe()),
    ]
    for letter, name, infos in (("A", name_a, diff.buffers_a), ("B", name_b, diff.buffers_b)):
        prefix = f"{letter} {name}: "
        for index, info in enumerate(infos):
            parts.append(Text((prefix if index == 0 else " " * len(prefix)) + info.describe()))
    rows = [
        (
            run.label(),
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

    parts += [Text(""), line(header, ("bold",) * 4)]
    for run, row in zip(diff.runs, rows, strict=True):
        place_style = "dim" if run.same_place() else ""
        parts.append(line(row, ("bold yellow" if run.kind == "lse" else "", "", place_style, place_style)))
    parts += [Text(""), _paragraph(diff_summary(diff))]
    return Group(*parts)


def diff_summary(diff: LayoutDiff) -> str:
    payload = sum(run.count for run in diff.runs if run.kind == "payload")
    lse = sum(run.count for run in diff.runs if run.kind == "lse")
    if diff.identical:
        verdict = "The two layouts place every byte identically: a port needs no kernel change."
    else:
        verdict = (
            f"{diff.same_place} of {payload + lse} logical elements land at the same buffer and byte offsets in both. "
            "Each row of the table is a run of logical elements that are consecutive in both layouts."
        )
    return (
        f"{payload} payload elements and {lse} LSE words of the first B={diff.problem.B} rows in "
        f"{len(diff.runs)} runs. {verdict}"
    )


def diff_to_json(diff: LayoutDiff) -> str:
    head = {
        "a": diff.spec_a.name,
        "b": diff.spec_b.name,
        "shape": {
            "N": diff.problem.N,
            "B": diff.problem.B,
            "B_max": diff.problem.B_max,
            "H": diff.problem.H,
            "D": diff.problem.D,
            "dtype": diff.problem.dtype_name,
        },
        "identical": diff.identical,
        "same_place": diff.same_place,
    }
    lines = ["{"] + [f"  {json.dumps(key)}: {json.dumps(value)}," for key, value in head.items()]
    runs = [f"    {json.dumps(run.as_dict())}" for run in diff.runs]
    return "\n".join([*lines, '  "runs": [', ",\n".join(runs), "  ]", "}"]) + "\n"


def problem_from(N: int, batch: int, heads: int, head_dim: int, dtype: str | torch.dtype) -> Problem:
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        dtype = DTYPES[dtype]
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    return Problem(N, batch, heads, head_dim, dtype)


__all__: Sequence[str] = (
    "ByteMap",
    "LayoutDiff",
    "Problem",
    "Run",
    "byte_map",
    "diff_layouts",
    "problem_from",
    "summary",
    "to_json",
    "write_png",
)
