"""Facts any byte map states, whatever its family: row strides and their alignment, how the bytes of one
index of the colouring axis lie in each buffer, the widest store that covers every run of a kind, and the
bytes of each kind.  A family's summary paragraph is written from these (plus its own facts)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from layoutgen.show.model import ByteMap

#: The widest store a GPU thread issues (one 128-bit vector).
WIDEST_STORE_BYTES = 16
#: Row alignment is judged against a base aligned to this many bytes: cudaMalloc guarantees 256, and
#: torch's caching allocator hands out blocks at multiples of 512.
ASSUMED_BASE_ALIGN = 256


def pow2_dividing(value: int, cap: int) -> int:
    """Largest power of two that divides `value`, at most `cap` (0 is divisible by everything)."""
    return cap if value == 0 else min(cap, value & -value)


@dataclass(frozen=True)
class BufferFacts:
    """Rows (the innermost axis) of one buffer, and how the bytes of one colouring-axis index lie in it."""

    name: str
    row_axis: str
    row_bytes: int
    row_align: int
    colour_axis: str
    #: The colouring axis is the buffer's outermost, so each of its indices owns one contiguous block (a
    #: buffer without that axis counts as one block).
    colour_outermost: bool
    #: Contiguous bytes of one index of the colouring axis (the whole chunk when it is outermost) ...
    colour_block_bytes: int
    #: ... and the distance between two blocks of the same index, 0 when there is one block.
    colour_block_every: int

    def as_dict(self) -> dict[str, Any]:
        colour = self.colour_axis
        return {
            "name": self.name,
            "row_axis": self.row_axis,
            "row_bytes": self.row_bytes,
            "row_align": self.row_align,
            f"{colour}_outermost": self.colour_outermost,
            f"{colour}_block_bytes": self.colour_block_bytes,
            f"{colour}_block_every": self.colour_block_every,
        }


@dataclass(frozen=True)
class Facts:
    """What any layout's map says about stores and contiguity, whatever its family."""

    buffers: tuple[BufferFacts, ...]
    #: Kind -> widest aligned store (at most WIDEST_STORE_BYTES) that covers every run of it exactly, for
    #: each kind declared with `store_fact`.
    store_bytes: Mapping[str, int]
    #: Kind -> bytes of that kind over all buffers, for every kind.
    kind_bytes: Mapping[str, int]

    def buffer(self, name: str) -> BufferFacts:
        return next(found for found in self.buffers if found.name == name)


def facts(bmap: ByteMap) -> Facts:
    layout = bmap.layout
    buffer_facts = []
    for info in bmap.buffers:
        row_bytes = info.extents[-1] * info.elem_bytes
        if layout.colour_axis in info.axes:
            colour_at = info.axes.index(layout.colour_axis)
            block = math.prod(info.extents[colour_at + 1 :]) * info.elem_bytes
            every = 0 if colour_at == 0 else block * info.extents[colour_at]
        else:
            colour_at, block, every = 0, info.nbytes, 0
        buffer_facts.append(
            BufferFacts(
                name=info.name,
                row_axis=info.axes[-1],
                row_bytes=row_bytes,
                row_align=pow2_dividing(row_bytes, ASSUMED_BASE_ALIGN),
                colour_axis=layout.colour_axis,
                colour_outermost=colour_at == 0,
                colour_block_bytes=block,
                colour_block_every=every,
            )
        )
    stores = {}
    for kind in layout.kinds:
        if kind.store_fact:
            store = WIDEST_STORE_BYTES
            for run in bmap.runs:
                if run.kind == kind.name:
                    store = min(store, pow2_dividing(run.offset, store), pow2_dividing(run.length, store))
            stores[kind.name] = store
    totals = {kind.name: sum(run.length for run in bmap.runs if run.kind == kind.name) for kind in layout.kinds}
    return Facts(tuple(buffer_facts), stores, totals)


def facts_as_dict(bmap: ByteMap) -> dict[str, Any]:
    """The facts as JSON reports them: buffers, store widths, the family's facts, then the byte totals."""
    found = facts(bmap)
    layout = bmap.layout
    return {
        "buffers": [buffer.as_dict() for buffer in found.buffers],
        **{f"{kind}_store_bytes": store for kind, store in found.store_bytes.items()},
        **layout.extra_facts(bmap, found),
        **{f"{kind.name}_bytes": found.kind_bytes[kind.name] for kind in layout.kinds if kind.byte_total},
    }
