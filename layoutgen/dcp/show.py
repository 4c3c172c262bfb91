"""The DCP family's words for `layoutgen show` / `layoutgen diff`: a spec's buffers as a `ByteLayout`.

The buffers are the ones `LayoutBuffers` allocates, and the placements are the strided views the
reference packs through (`payload_view(B)` [peer, batch, head, dim] and `lse_view(B)` [peer, batch,
head]), so the map is right by construction.  The batch capacity is one more than the live batch so that
an unused row shows.  Bytes no view covers are "unused" in rows b >= B and in every other stats slot, and
"padding" where they lie in a live payload row (its tail rounded up to align_bytes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from layoutgen.dcp.layout import LayoutBuffers, Shape, buffer_shapes, check_shape
from layoutgen.dcp.spec import PAYLOAD_AXES, DcpSpec, Transport
from layoutgen.show.facts import ASSUMED_BASE_ALIGN, WIDEST_STORE_BYTES, Facts
from layoutgen.show.model import (
    Buffer,
    BufferInfo,
    ByteLayout,
    ByteMap,
    Kind,
    Legend,
    LegendEntry,
    Look,
    Placement,
    Run,
    axes_label,
    check_drawing_size,
    format_range,
)

#: Every axis of a DCP buffer with its label letter, in the order JSON lists a run's ranges.
AXIS_LETTERS: dict[str, str] = {"peer": "p", "batch": "b", "head": "h", "dim": "d", "slot": "s"}
#: The LSE view's axes: one float32 word per (peer, batch, head).
LSE_AXES: tuple[str, ...] = PAYLOAD_AXES[:-1]
KINDS: tuple[Kind, ...] = (
    Kind("payload", Look.COLOURED, store_fact=True),
    Kind("lse", Look.MARKED),
    Kind("padding", Look.FILLER, byte_total=True),
    Kind("unused", Look.VOID, byte_total=True),
)
PADDING, UNUSED = 2, 3
DTYPES = ("bfloat16", "float16", "float32")
SIZE_HINT = "Use smaller --batch/--heads/--D: the pattern is the same at any size"


def drawing_shape(shape: Mapping[str, int]) -> dict[str, int]:
    """N, B, H, D of a drawing: the family's drawing defaults for extents not given; unknown ones refused."""
    from layoutgen.dcp import DcpFamily

    unknown = sorted(set(shape) - set(DcpFamily.show_shape))
    if unknown:
        raise ValueError(f"a DCP drawing has no extent {', '.join(unknown)}; its extents: N, B, H, D")
    values = {**DcpFamily.show_shape, **shape}
    batch = values["B"]
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"B (live batch rows) must be an int >= 1, got {batch!r}")
    return values


def describe(values: Mapping[str, int], dtype: str) -> str:
    N, B, H, D = values["N"], values["B"], values["H"], values["D"]
    return f"N={N} peers, B={B} live rows (B_max={B + 1}), H={H} heads ({H // N} per peer), D={D}, out in {dtype}"


def byte_layout(spec: DcpSpec, shape: Mapping[str, int], dtype: str) -> ByteLayout:
    """The buffers of `spec` at N, B (B_max = B + 1), H, D and `dtype`, and DCP's vocabulary to draw them.

    The size is checked from the shape before anything is allocated.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    values = drawing_shape(shape)
    N, B, H, D = values["N"], values["B"], values["H"], values["D"]
    sized = Shape(N, B + 1, H, D, getattr(torch, dtype))
    check_shape(spec, sized)
    shape_text = describe(values, dtype)
    total = sum(math.prod(extents) * wire.itemsize for _, extents, wire in buffer_shapes(spec, sized).values())
    check_drawing_size(total, f"the buffers of '{spec.name}' at {shape_text}", SIZE_HINT)
    bufs = LayoutBuffers.allocate(spec, N, B + 1, H, D, sized.dtype, "cpu")
    axes = {name: tuple(found_axes) for name, (found_axes, _, _) in buffer_shapes(spec, sized).items()}

    def classify(info: BufferInfo, coords: torch.Tensor) -> torch.Tensor:
        beyond_batch = coords[:, info.axes.index("batch")] >= B
        if info.name == "payload":
            return torch.where(beyond_batch, UNUSED, PADDING).to(torch.int64)
        return torch.full(beyond_batch.shape, UNUSED, dtype=torch.int64)

    return ByteLayout(
        name=spec.name,
        shape_text=shape_text,
        buffers=tuple(Buffer(name, tensor, axes[name]) for name, tensor in bufs.tensors.items()),
        placements=(
            Placement("payload", bufs.payload_view(B), PAYLOAD_AXES),
            Placement("lse", bufs.lse_view(B), LSE_AXES, tag="lse"),
        ),
        kinds=KINDS,
        axis_letters=AXIS_LETTERS,
        colour_axis="peer",
        label=lambda run: label(run, B),
        legend=legend(B),
        summary=lambda bmap, found: summary(spec, values, bmap, found),
        elements_phrase=lambda counts: (
            f"{counts['payload']} payload elements and {counts['lse']} LSE words of the first B={B} rows"
        ),
        json_header={
            "spec": spec.name,
            "layout_hash": spec.layout_hash(),
            "transport": spec.transport.value,
            "shape": {"N": N, "B": B, "B_max": B + 1, "H": H, "heads_per_peer": H // N, "D": D, "dtype": dtype},
        },
        shape_json={"N": N, "B": B, "B_max": B + 1, "H": H, "D": D, "dtype": dtype},
        unassigned=classify,
        extra_facts=lambda bmap, found: lse_facts(spec, bmap, found),
    )


def label(run: Run, live_batch: int) -> str:
    """Short text for a cell, e.g. `p1 b0 h3 d0..15`, `p1 b0 h3 lse`, `pad 12B`, `s1 unused`."""
    if run.kind == "padding":
        return f"pad {run.length}B"
    slot, batch = run.range("slot"), run.range("batch")
    if run.kind == "unused" and slot is not None and batch is not None and batch[0] < live_batch:
        return f"{format_range(AXIS_LETTERS['slot'], slot)} unused"
    if run.kind == "payload":
        return " ".join(axes_label(run, tuple(AXIS_LETTERS), AXIS_LETTERS))
    return " ".join([*axes_label(run, LSE_AXES, AXIS_LETTERS), run.kind])


def legend(live_batch: int) -> Legend:
    return Legend(
        colour_title="peers",
        entries=(
            LegendEntry("lse", " lse ", "float32 LSE word", "LSE (float32)"),
            LegendEntry("padding", "pad", "alignment padding", "padding"),
            LegendEntry(
                "unused",
                "unused",
                f"rows b >= B={live_batch} or other stats slots",
                f"unused (b >= {live_batch}, other slots)",
            ),
        ),
        key="p peer, b batch row, h head of the peer's block, d position in the row (wire elements), s stats slot",
    )


def lse_facts(spec: DcpSpec, bmap: ByteMap, found: Facts) -> dict[str, Any]:
    """Where the LSE lives: its buffer, the byte of its word in each row (row_tail with dim innermost) or
    the stats slots that hold it (separate)."""
    lse_runs = [run for run in bmap.runs if run.kind == "lse"]
    row_stride = {buffer.name: buffer.row_bytes for buffer in found.buffers}
    tail_in_rows = spec.row_tail and spec.payload.axes[-1] == "dim"
    in_row = sorted({run.offset % row_stride[run.buffer] for run in lse_runs}) if tail_in_rows else []
    slots = sorted({i for run in lse_runs if (slot := run.range("slot")) is not None for i in range(*slot)})
    return {
        "lse_buffer": lse_runs[0].buffer if lse_runs else "",
        "lse_offsets_in_row": in_row,
        "lse_slots": slots,
    }


def summary(spec: DcpSpec, values: Mapping[str, int], bmap: ByteMap, found: Facts) -> str:
    """One paragraph: buffers, shapes, bytes per peer, row alignment, store width, LSE, transport."""
    B, D = values["B"], values["D"]
    lse = lse_facts(spec, bmap, found)
    dim_innermost = spec.payload.axes[-1] == "dim"
    sentences = [
        f"{spec.name} at {bmap.layout.shape_text}: "
        + ("one buffer, " if len(bmap.buffers) == 1 else f"{len(bmap.buffers)} buffers, ")
        + "; ".join(info.describe() for info in bmap.buffers)
        + "."
    ]
    per_peer = []
    for buffer in found.buffers:
        if buffer.colour_outermost:
            per_peer.append(f"{buffer.name} chunk of {buffer.colour_block_bytes} contiguous bytes")
        else:
            blocks = bmap.buffer(buffer.name).nbytes // buffer.colour_block_every
            per_peer.append(
                f"{buffer.name}: {blocks} blocks of {buffer.colour_block_bytes} bytes, {buffer.colour_block_every} apart"
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
    store = found.store_bytes["payload"]
    if store >= WIDEST_STORE_BYTES:
        verdict = "16-byte stores: yes"
    else:
        verdict = f"16-byte stores: no, at most {store}-byte stores cover every payload run exactly"
        if dim_innermost and spec.row_tail and found.buffer("payload").row_align < WIDEST_STORE_BYTES:
            verdict += (
                " (align_bytes: 32 pads rows to fix that; 16 would leave two partly written 32-byte sectors per row)"
            )
        elif dim_innermost:
            row_payload = D * bmap.buffer("payload").elem_bytes
            verdict += f" (a row's D elements are {row_payload} bytes, not a multiple of 16)"
    sentences.append(f"Payload runs start and end on {store}-byte boundaries: {verdict}.")
    if spec.row_tail and dim_innermost:
        where = ", ".join(str(offset) for offset in lse["lse_offsets_in_row"])
        sentences.append(
            f"LSE: a float32 word at byte {where} of every {lse['lse_buffer']} row (after the D elements)."
        )
    elif spec.row_tail:
        sentences.append(
            f"LSE: the float32 element at index D={D} of the dim axis, one more element of each "
            f"(peer, batch, head) entry."
        )
    else:
        stats = bmap.buffer(lse["lse_buffer"])
        where = ", ".join(str(slot) for slot in lse["lse_slots"])
        sentences.append(
            f"LSE: slot {where} of {stats.extents[stats.axes.index('slot')]} float32 word(s) per entry of {stats.name}."
        )
    sentences.append(
        f"Never written by pack nor read by combine: {found.kind_bytes['padding']} bytes of padding, "
        f"{found.kind_bytes['unused']} bytes of unused rows (b >= {B}) or slots."
    )
    if spec.transport is Transport.ALL_TO_ALL_SINGLE:
        sentences.append(
            "Transport all_to_all_single: one torch.distributed.all_to_all_single per buffer moves each peer's chunk."
        )
    else:
        sentences.append("Transport external: the caller's transport moves these buffers (no exchange() is generated).")
    return " ".join(sentences)
