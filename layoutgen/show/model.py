"""The byte map of a layout: which logical element owns every byte of every buffer, for any family.

A family describes one layout at one drawing shape as a `ByteLayout` (`Family.byte_layout`): its buffers
as real tensors, and where each kind of logical element lives as a strided view into one of them -- the
very views its reference copies through, so the map is right by construction and nothing here re-derives
a layout.  `build_byte_map` reads the byte offset of every element off those views (storage offset plus
index * stride), checks that no two elements share a byte and that each view's indices agree with its
buffer's own axes, lets the family classify the bytes no view covers, and cuts every buffer into `Run`s.

This module, like the renderings (`text`, `png`, `json`) and `diff`, knows no family's words: axis names,
kind names, labels, the legend and the summary paragraph all come from the `ByteLayout`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from layoutgen.show.facts import Facts

#: A drawing is for reading; larger maps would take seconds to build and pages to print.
MAX_MAP_BYTES = 1 << 20

Range = tuple[int, int]  # half-open [start, stop)


class Look(enum.Enum):
    """How a kind of byte is drawn; the renderings pick colours and hatching from the look alone."""

    #: In the colour of its index along the colouring axis (e.g. the bulk data of each destination).
    COLOURED = "coloured"
    #: Highlighted: one accent style in text, the colouring axis's colour hatched (and labels bold) in the picture.
    MARKED = "marked"
    #: Grey: bytes that exist only to align what follows.
    FILLER = "filler"
    #: Faint and hatched: bytes of the buffer that nothing uses at this shape.
    VOID = "void"


@dataclass(frozen=True)
class Kind:
    """One kind of byte: a kind of logical element (placed by a `Placement`) or a kind of unassigned byte."""

    name: str
    look: Look
    #: Report, as the fact `<name>_store_bytes`, the widest aligned store that covers every run of this kind.
    store_fact: bool = False
    #: Report, as the fact `<name>_bytes`, how many bytes of the buffers are of this kind.
    byte_total: bool = False


@dataclass(frozen=True)
class Buffer:
    """One buffer of the layout: a dense tensor (CPU is enough) and the names of its axes, outer to inner."""

    name: str
    tensor: torch.Tensor
    axes: tuple[str, ...]


@dataclass(frozen=True)
class Placement:
    """Where every logical element of one kind lives: a strided view into exactly one of the buffers.

    `axes` names the view's dimensions (the logical axes).  Where a logical axis has the name of an axis of
    the buffer the view lands in, the two must index the same thing: `build_byte_map` checks that element
    [..., i, ...] of the view sits at index i of the buffer's axis of that name.
    """

    kind: str
    view: torch.Tensor
    axes: tuple[str, ...]
    #: A word that follows the indices in labels of these elements (e.g. a word naming a statistic).
    tag: str = ""


@dataclass(frozen=True)
class LegendEntry:
    """One kind in the legend: `swatch` is printed in the kind's style, then `text` says what it is."""

    kind: str
    swatch: str
    text: str
    #: The entry's label in the picture's legend.
    picture_label: str


@dataclass(frozen=True)
class Legend:
    """The legend: one chip per index of the colouring axis after `colour_title`, then the entries, then a
    line (`key`) saying what each axis letter of the labels means."""

    colour_title: str
    entries: tuple[LegendEntry, ...]
    key: str


@dataclass(frozen=True)
class ByteLayout:
    """Everything a family hands over to draw one layout at one shape (what `Family.byte_layout` returns).

    The data: `buffers` (tensors with axis names) and `placements` (one strided view per kind of logical
    element).  The vocabulary: `kinds` (every kind of byte, placed ones and the kinds `unassigned` gives),
    `axis_letters` (every axis of every buffer, with the letter labels use for it, in the order JSON lists
    the axes of each run), `colour_axis` (the axis whose index colours the drawing).  The words: `label`
    (the text of one run's cell), `legend`, `summary` (the paragraph under the drawing), `elements_phrase`
    (what a diff counted), `shape_text` and the JSON fields.

    A family builds one from its own buffers and views (layoutgen/dcp/show.py is a complete one).  A wire
    buffer [rank, token, lane] of which a view [rank, token < T, lane] holds "q", the rest "spare":

        wire = torch.empty(ranks, tokens, lanes, dtype=torch.bfloat16)
        letters = {"rank": "r", "token": "t", "lane": "l"}
        ByteLayout(
            name=spec.name, shape_text=f"{ranks} ranks, {T} of {tokens} tokens",
            buffers=(Buffer("wire", wire, ("rank", "token", "lane")),),
            placements=(Placement("q", wire[:, :T], ("rank", "token", "lane")),),
            kinds=(Kind("q", Look.COLOURED, store_fact=True), Kind("spare", Look.VOID, byte_total=True)),
            axis_letters=letters, colour_axis="rank",
            label=lambda run: " ".join([*axes_label(run, tuple(letters), letters), run.kind]),
            legend=Legend("ranks", (LegendEntry("spare", "spare", "tokens >= T", "spare"),), "r rank, t token"),
            summary=lambda bmap, found: f"{found.kind_bytes['spare']} bytes are spare.",
            elements_phrase=lambda counts: f"{counts['q']} q elements",
            json_header={"spec": spec.name}, shape_json={"ranks": ranks, "T": T},
            unassigned=lambda info, coords: torch.ones(len(coords), dtype=torch.int64),  # kinds[1]: spare
        )
    """

    #: The layout's name (the spec's), for titles.
    name: str
    #: The drawing shape in words, e.g. "N=4 ..., D=16, in bfloat16": under titles, in the summary.
    shape_text: str
    buffers: tuple[Buffer, ...]
    placements: tuple[Placement, ...]
    kinds: tuple[Kind, ...]
    axis_letters: Mapping[str, str]
    colour_axis: str
    #: The text of a run's cell, e.g. "x1 y0..3"; see `format_range` and `axes_label`.
    label: Callable[[Run], str]
    legend: Legend
    #: The paragraph under the drawing, from the map and its generic facts.
    summary: Callable[[ByteMap, Facts], str]
    #: What a diff counted, from the number of elements of each placed kind, e.g. "12 x elements and 3 y words".
    elements_phrase: Callable[[Mapping[str, int]], str]
    #: The leading fields of `to_json` (before "buffers", "facts" and "runs"): name, hashes, shape ...
    json_header: Mapping[str, Any]
    #: The drawing shape as `diff_to_json` reports it.
    shape_json: Mapping[str, Any]
    #: Kind (an index into `kinds`) of each element no placement covers: called per buffer with the buffer
    #: and the coordinates [count, len(axes)] of those elements; returns an int64 tensor [count].  None when
    #: every element of every buffer is placed.
    unassigned: Callable[[BufferInfo, torch.Tensor], torch.Tensor] | None = None
    #: Family facts for JSON, placed after the store widths and before the byte totals.
    extra_facts: Callable[[ByteMap, Facts], Mapping[str, Any]] = lambda bmap, found: {}
    #: Top-level spec fields that describe the caller's tensors, never the buffers' bytes (Ulysses: `local`,
    #: `attention`): a diff that finds only these differing says the buffers match at every shape.
    user_side_fields: tuple[str, ...] = ()

    def kind(self, name: str) -> Kind:
        return next(kind for kind in self.kinds if kind.name == name)

    def placement(self, kind: str) -> Placement:
        return next(placement for placement in self.placements if placement.kind == kind)

    def check(self) -> None:
        """Raise ValueError when the description contradicts itself (a family bug, named)."""
        names = [kind.name for kind in self.kinds]
        placed = [placement.kind for placement in self.placements]
        if len(set(names)) != len(names) or len(set(placed)) != len(placed) or not set(placed) <= set(names):
            raise ValueError(f"layout {self.name}: kinds {names} must be distinct and include each placed kind once")
        if not {entry.kind for entry in self.legend.entries} <= set(names):
            raise ValueError(f"layout {self.name}: a legend entry names a kind not among {names}")
        if self.colour_axis not in self.axis_letters:
            raise ValueError(f"layout {self.name}: colouring axis {self.colour_axis!r} has no letter")
        for buffer in self.buffers:
            if len(buffer.axes) != buffer.tensor.ndim or not set(buffer.axes) <= set(self.axis_letters):
                raise ValueError(f"layout {self.name}: buffer {buffer.name} axes {buffer.axes} mismatch its tensor")
        for placement in self.placements:
            if len(placement.axes) != placement.view.ndim or not set(placement.axes) <= set(self.axis_letters):
                raise ValueError(f"layout {self.name}: the {placement.kind} view's axes {placement.axes} mismatch it")


def check_drawing_size(total_bytes: int, what: str, hint: str) -> None:
    """Refuse a drawing of more than MAX_MAP_BYTES; families call it with byte counts computed from the shape
    before allocating anything, so that a shape larger than memory gets this message, not a MemoryError."""
    if total_bytes > MAX_MAP_BYTES:
        raise ValueError(f"{what} hold {total_bytes} bytes; a drawing is limited to {MAX_MAP_BYTES} bytes. {hint}")


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
        extents = ", ".join(f"{axis} {extent}" for axis, extent in zip(self.axes, self.extents, strict=True))
        return f"{self.name} [{extents}] {self.dtype}, {self.nbytes} bytes"


@dataclass(frozen=True)
class Run:
    """Consecutive bytes of one buffer with one kind, along which only the buffer's innermost index moves.

    `ranges` holds, for each axis of the buffer, the half-open index range the run spans along it.
    """

    buffer: str
    offset: int
    length: int
    kind: str
    ranges: Mapping[str, Range]

    def range(self, axis: str) -> Range | None:
        """The run's index range along `axis`, or None where its buffer has no such axis."""
        return self.ranges.get(axis)


def format_range(letter: str, index: Range) -> str:
    """`x3` for one index, `x0..15` for several (the range's stop is exclusive, the text's last inclusive)."""
    start, stop = index
    return f"{letter}{start}" if stop == start + 1 else f"{letter}{start}..{stop - 1}"


def axes_label(run: Run, axes: tuple[str, ...], letters: Mapping[str, str]) -> list[str]:
    """The ranges of `run` along `axes` (those its buffer has), each as `format_range` writes it."""
    return [format_range(letters[axis], index) for axis in axes if (index := run.range(axis)) is not None]


@dataclass(frozen=True)
class ByteMap:
    layout: ByteLayout
    buffers: tuple[BufferInfo, ...]
    runs: tuple[Run, ...]

    def buffer(self, name: str) -> BufferInfo:
        return next(info for info in self.buffers if info.name == name)

    def runs_of(self, buffer: str) -> list[Run]:
        return [run for run in self.runs if run.buffer == buffer]

    @property
    def colour_count(self) -> int:
        """How many indices the colouring axis has (its largest extent over the buffers that have it)."""
        axis = self.layout.colour_axis
        return max((info.extents[info.axes.index(axis)] for info in self.buffers if axis in info.axes), default=1)


@dataclass(frozen=True)
class Located:
    """The byte offset, from its buffer's start, of every element of one placement's view."""

    buffer: str
    offsets: torch.Tensor  # int64, shaped like the view
    elem_bytes: int


def locate(view: torch.Tensor, tensors: Mapping[str, torch.Tensor]) -> Located:
    """Byte offset of every element of a strided view into exactly one of `tensors`."""
    storage = view.untyped_storage().data_ptr()
    owners = [name for name, tensor in tensors.items() if tensor.untyped_storage().data_ptr() == storage]
    if len(owners) != 1:
        raise RuntimeError(f"a layout view belongs to {len(owners)} buffers, expected exactly one")
    base = tensors[owners[0]]
    index = torch.full(view.shape, int(view.storage_offset()), dtype=torch.int64)
    for axis, (extent, stride) in enumerate(zip(view.shape, view.stride(), strict=True)):
        steps = torch.arange(extent, dtype=torch.int64) * stride
        index = index + steps.view([extent if other == axis else 1 for other in range(view.ndim)])
    offsets = index * view.element_size() - int(base.storage_offset()) * base.element_size()
    return Located(owners[0], offsets, view.element_size())


def locate_all(layout: ByteLayout) -> dict[str, Located]:
    """Kind -> where its elements are, for every placement of `layout`."""
    tensors = {buffer.name: buffer.tensor for buffer in layout.buffers}
    return {placement.kind: locate(placement.view, tensors) for placement in layout.placements}


def buffer_infos(layout: ByteLayout) -> tuple[BufferInfo, ...]:
    """Name, axes, extents and element type of every buffer, in the layout's order."""
    return tuple(
        BufferInfo(
            buffer.name,
            tuple(buffer.axes),
            tuple(buffer.tensor.shape),
            str(buffer.tensor.dtype).removeprefix("torch."),
            buffer.tensor.element_size(),
        )
        for buffer in layout.buffers
    )


def build_byte_map(layout: ByteLayout) -> ByteMap:
    """Owner of every byte of every buffer of `layout`, as runs in memory order."""
    layout.check()
    located = locate_all(layout)
    codes = {kind.name: code for code, kind in enumerate(layout.kinds)}
    infos = buffer_infos(layout)
    runs: list[Run] = []
    for info in infos:
        byte_kind = torch.full((info.nbytes,), -1, dtype=torch.int8)
        for kind, where in located.items():
            if where.buffer != info.name:
                continue
            byte_index = (where.offsets.reshape(-1, 1) + torch.arange(where.elem_bytes)).reshape(-1)
            if bool((byte_kind[byte_index] != -1).any()) or byte_index.unique().numel() != byte_index.numel():
                raise RuntimeError(f"layout {layout.name}: two logical elements share bytes of buffer {info.name}")
            byte_kind[byte_index] = codes[kind]
        element_bytes = byte_kind.view(-1, info.elem_bytes)
        if bool((element_bytes != element_bytes[:, :1]).any()):
            raise RuntimeError(f"layout {layout.name}: a {info.dtype} element of {info.name} is only partly assigned")
        element_kind = element_bytes[:, 0].clone()
        coords = torch.stack(torch.unravel_index(torch.arange(math.prod(info.extents)), info.extents), 1)
        _check_view_indices(layout, info, coords, located)
        unassigned = element_kind == -1
        if bool(unassigned.any()):
            element_kind[unassigned] = _classify(layout, info, coords[unassigned])
        runs += _runs_of(layout, info, element_kind, coords)
    return ByteMap(layout, infos, tuple(runs))


def _classify(layout: ByteLayout, info: BufferInfo, coords: torch.Tensor) -> torch.Tensor:
    placed = {placement.kind for placement in layout.placements}
    if layout.unassigned is None:
        raise RuntimeError(f"layout {layout.name}: buffer {info.name} has bytes no placement covers")
    classified = layout.unassigned(info, coords)
    unplaced = [code for code, kind in enumerate(layout.kinds) if kind.name not in placed]
    if classified.shape != coords.shape[:1] or not bool(
        torch.isin(classified, torch.tensor(unplaced, dtype=torch.int64)).all()
    ):
        raise RuntimeError(f"layout {layout.name}: unassigned bytes of {info.name} must get kinds no view places")
    return classified.to(torch.int8)


def _check_view_indices(
    layout: ByteLayout, info: BufferInfo, coords: torch.Tensor, located: dict[str, Located]
) -> None:
    """The element a view index lands on has the same index along each axis the view and buffer both name."""
    for placement in layout.placements:
        where = located[placement.kind]
        if where.buffer != info.name or where.offsets.numel() == 0:
            continue
        landed = coords[(where.offsets // info.elem_bytes).reshape(-1)]
        grids = torch.meshgrid(*[torch.arange(n) for n in where.offsets.shape], indexing="ij")
        for axis, grid in zip(placement.axes, grids, strict=True):
            if axis in info.axes and not torch.equal(landed[:, info.axes.index(axis)], grid.reshape(-1)):
                raise RuntimeError(
                    f"layout {layout.name}: the {placement.kind} view's {axis} index disagrees with buffer {info.name}"
                )


def _runs_of(layout: ByteLayout, info: BufferInfo, element_kind: torch.Tensor, coords: torch.Tensor) -> list[Run]:
    count = element_kind.numel()
    starts_run = torch.ones(count, dtype=torch.bool)
    starts_run[1:] = (
        (element_kind[1:] != element_kind[:-1])
        | (coords[1:, :-1] != coords[:-1, :-1]).any(1)
        | (coords[1:, -1] != coords[:-1, -1] + 1)
    )
    starts = torch.nonzero(starts_run).flatten().tolist()
    stops = [*starts[1:], count]
    kinds, coord_rows = element_kind.tolist(), coords.tolist()
    runs = []
    for start, stop in zip(starts, stops, strict=True):
        first, last = coord_rows[start], coord_rows[stop - 1]
        runs.append(
            Run(
                buffer=info.name,
                offset=start * info.elem_bytes,
                length=(stop - start) * info.elem_bytes,
                kind=layout.kinds[kinds[start]].name,
                ranges={axis: (first[i], last[i] + 1) for i, axis in enumerate(info.axes)},
            )
        )
    return runs
