"""The DCP family's words for `layoutgen show` / `layoutgen diff`: a spec's buffers as a `ByteLayout`.

The buffers are the ones `LayoutBuffers` allocates, and the placements are the strided views the
reference packs through (`payload_view(B)` [peer, batch, head, dim] and, per stats word, `lse_view(B)` or
`max_view(B)` / `sum_view(B)` [peer, batch, head]), so the map is right by construction.  The batch
capacity is one more than the live batch so that an unused row shows.  Bytes no view covers are "unused"
in rows b >= B and in every other stats slot, and "padding" where they lie in a live payload row (its
tail rounded up to align_bytes).  With the extent E (`--empty`) the last E live rows are drawn as rows of
empty requests (pack's `empty=`): their payload is kind "empty" (written as +0.0), their stats words are
labelled with the value pack writes (-inf; a sum 0).  An fp8 spec's block scales are the kind "scale"
(`scale_view(B)` [peer, batch, head, block]; axis letter k), in the row tail after the stats words or in
the scales buffer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from layoutgen.dcp.constants import SHOW_SHAPE
from layoutgen.dcp.layout import LayoutBuffers, Shape, buffer_shapes, check_shape, scale_blocks, stats_words
from layoutgen.dcp.spec import PAYLOAD_AXES, SCALE_AXES, DcpSpec, Transport
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
#: The payload of a row whose request is empty (pack writes +0.0 there); drawn only when E > 0.
EMPTY_KIND = Kind("empty", Look.FILLER)
#: The empty rows' placement indexes them from 0 (the e-th of the E empty rows is batch row B - E + e).
EMPTY_ROW_AXIS = "empty_row"
EMPTY_ROW_AXES: tuple[str, ...] = ("peer", EMPTY_ROW_AXIS, "head", "dim")
#: What pack writes into each stats word of an empty row.
EMPTY_VALUES = {"lse": "-inf", "max": "-inf", "sum": "0", "scale": "1"}
#: An fp8 spec's float32 block scales; their axis `block` (letter k) is drawn only for fp8 specs.
SCALE_KIND = Kind("scale", Look.MARKED)
SCALE_LETTERS = {"block": "k"}


def kinds_of(spec: DcpSpec, empty_rows: int) -> tuple[Kind, ...]:
    """The kinds of a drawing: payload, [empty], the spec's stats words (lse, or max and sum), [scale], padding,
    unused.  An lse spec without empty rows or fp8 has exactly KINDS (its drawings are the ones before)."""
    words = tuple(Kind(word, Look.MARKED) for word in stats_words(spec))
    scales = (SCALE_KIND,) if spec.fp8 else ()
    return (KINDS[0], *((EMPTY_KIND,) if empty_rows else ()), *words, *scales, *KINDS[2:])


DTYPES = ("bfloat16", "float16", "float32")
SIZE_HINT = "Use smaller --batch/--heads/--D: the pattern is the same at any size"


def drawing_shape(shape: Mapping[str, int]) -> dict[str, int]:
    """N, B, H, D (and E, the empty rows) of a drawing: the family's drawing defaults for extents not given;
    unknown ones refused."""
    defaults = SHOW_SHAPE
    unknown = sorted(set(shape) - set(defaults))
    if unknown:
        raise ValueError(f"a DCP drawing has no extent {', '.join(unknown)}; its extents: N, B, H, D, E")
    values = {**defaults, **shape}
    batch = values["B"]
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"B (live batch rows) must be an int >= 1, got {batch!r}")
    empty = values["E"]
    if isinstance(empty, bool) or not isinstance(empty, int) or not 0 <= empty <= batch:
        raise ValueError(
            f"E (empty rows, the last E of the B={batch} live rows) must be an int in [0, B], got {empty!r}"
        )
    return values


def describe(values: Mapping[str, int], dtype: str) -> str:
    N, B, H, D, E = values["N"], values["B"], values["H"], values["D"], values["E"]
    empty = f" ({E} of them empty)" if E else ""
    return (
        f"N={N} peers, B={B} live rows{empty} (B_max={B + 1}), H={H} heads ({H // N} per peer), D={D}, out in {dtype}"
    )


def byte_layout(spec: DcpSpec, shape: Mapping[str, int], dtype: str) -> ByteLayout:
    """The buffers of `spec` at N, B (B_max = B + 1), H, D and `dtype`, and DCP's vocabulary to draw them;
    the last E live rows drawn as empty requests' rows.

    The size is checked from the shape before anything is allocated.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    values = drawing_shape(shape)
    N, B, H, D, E = values["N"], values["B"], values["H"], values["D"], values["E"]
    sized = Shape(N, B + 1, H, D, getattr(torch, dtype))
    check_shape(spec, sized)
    shape_text = describe(values, dtype)
    total = sum(math.prod(extents) * wire.itemsize for _, extents, wire in buffer_shapes(spec, sized).values())
    check_drawing_size(total, f"the buffers of '{spec.name}' at {shape_text}", SIZE_HINT)
    bufs = LayoutBuffers.allocate(spec, N, B + 1, H, D, sized.dtype, "cpu")
    axes = {name: tuple(found_axes) for name, (found_axes, _, _) in buffer_shapes(spec, sized).items()}
    kinds = kinds_of(spec, E)
    names = [kind.name for kind in kinds]
    padding, unused = names.index("padding"), names.index("unused")

    def classify(info: BufferInfo, coords: torch.Tensor) -> torch.Tensor:
        beyond_batch = coords[:, info.axes.index("batch")] >= B
        if info.name == "payload":
            return torch.where(beyond_batch, unused, padding).to(torch.int64)
        return torch.full(beyond_batch.shape, unused, dtype=torch.int64)

    payload = bufs.payload_view(B)
    placements = [Placement("payload", payload[:, : B - E], PAYLOAD_AXES)]
    if E:
        # Its own row axis: view index e is buffer row B - E + e (a view axis named `batch` would claim index e).
        placements.append(Placement("empty", payload[:, B - E :], EMPTY_ROW_AXES, tag="+0.0"))
    placements += [Placement(word, view, LSE_AXES, tag=word) for word, view in bufs.stats_views(B).items()]
    if spec.fp8:
        placements.append(Placement("scale", bufs.scale_view(B), SCALE_AXES, tag="scale"))
    header_shape: dict[str, Any] = {"N": N, "B": B, "B_max": B + 1, "H": H, "heads_per_peer": H // N, "D": D}
    shape_json: dict[str, Any] = {"N": N, "B": B, "B_max": B + 1, "H": H, "D": D}
    if E:
        header_shape["E"] = shape_json["E"] = E
    return ByteLayout(
        name=spec.name,
        shape_text=shape_text,
        buffers=tuple(Buffer(name, tensor, axes[name]) for name, tensor in bufs.tensors.items()),
        placements=tuple(placements),
        kinds=kinds,
        axis_letters={
            **AXIS_LETTERS,
            **({EMPTY_ROW_AXIS: "e"} if E else {}),
            **(SCALE_LETTERS if spec.fp8 else {}),
        },
        colour_axis="peer",
        label=lambda run: label(run, B, E),
        legend=legend(spec, B, E),
        summary=lambda bmap, found: summary(spec, values, bmap, found),
        elements_phrase=lambda counts: elements_phrase(spec, counts, B),
        json_header={
            "spec": spec.name,
            "layout_hash": spec.layout_hash(),
            "transport": spec.transport.value,
            "shape": {**header_shape, "dtype": dtype},
        },
        shape_json={**shape_json, "dtype": dtype},
        unassigned=classify,
        extra_facts=lambda bmap, found: lse_facts(spec, bmap, found),
    )


def elements_phrase(spec: DcpSpec, counts: Mapping[str, int], live_batch: int) -> str:
    """What a diff counted, e.g. "64 payload elements and 4 LSE words of the first B=2 rows" (the kinds it
    compared: two layouts' payloads alone where their stats differ in form)."""
    parts = []
    if "payload" in counts or "empty" in counts:
        parts.append(f"{counts.get('payload', 0) + counts.get('empty', 0)} payload elements")
    if "max" in counts and "sum" in counts:
        parts.append(f"{counts['max']} max and {counts['sum']} sum words")
    elif "lse" in counts:
        parts.append(f"{counts['lse']} LSE words")
    if "scale" in counts:
        parts.append(f"{counts['scale']} block scales")
    listed = parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
    return f"{listed} of the first B={live_batch} rows"


def label(run: Run, live_batch: int, empty_rows: int = 0) -> str:
    """Short text for a cell, e.g. `p1 b0 h3 d0..15`, `p1 b0 h3 lse`, `p1 b1 h3 max -inf`, `pad 12B`,
    `s1 unused`."""
    if run.kind == "padding":
        return f"pad {run.length}B"
    slot, batch = run.range("slot"), run.range("batch")
    if run.kind == "unused" and slot is not None and batch is not None and batch[0] < live_batch:
        return f"{format_range(AXIS_LETTERS['slot'], slot)} unused"
    if run.kind == "payload":
        return " ".join(axes_label(run, tuple(AXIS_LETTERS), AXIS_LETTERS))
    if run.kind == "empty":
        return " ".join([*axes_label(run, tuple(AXIS_LETTERS), AXIS_LETTERS), "+0.0"])
    if run.kind == "scale":
        words = [*axes_label(run, SCALE_AXES, {**AXIS_LETTERS, **SCALE_LETTERS}), run.kind]
    else:
        words = [*axes_label(run, LSE_AXES, AXIS_LETTERS), run.kind]
    first_empty = live_batch - empty_rows
    if run.kind in EMPTY_VALUES and empty_rows and batch is not None and batch[1] > first_empty:
        # A run along batch may hold live and empty rows (batch-innermost layouts): say where the values start.
        value = EMPTY_VALUES[run.kind]
        words.append(value if batch[0] >= first_empty else f"({value} from b{first_empty})")
    return " ".join(words)


def legend(spec: DcpSpec, live_batch: int, empty_rows: int = 0) -> Legend:
    if spec.max_sum:
        stats: tuple[LegendEntry, ...] = (
            LegendEntry("max", " max ", "float32 running max", "max (float32)"),
            LegendEntry("sum", " sum ", "float32 sum of exponentials", "sum (float32)"),
        )
    else:
        stats = (LegendEntry("lse", " lse ", "float32 LSE word", "LSE (float32)"),)
    if spec.fp8:
        stats = (*stats, LegendEntry("scale", " scl ", "float32 scale of a block of the row", "block scale (float32)"))
    empty: tuple[LegendEntry, ...] = ()
    if empty_rows:
        words = "(max, sum) (-inf, 0)" if spec.max_sum else "LSE -inf"
        zero = "zero codes, scale 1" if spec.fp8 else "+0.0"
        empty = (
            LegendEntry(
                "empty",
                "+0.0",
                f"rows of empty requests (b >= {live_batch - empty_rows}): {zero}, {words}",
                f"empty row ({zero}; {words})",
            ),
        )
    return Legend(
        colour_title="peers",
        entries=(
            *empty,
            *stats,
            LegendEntry("padding", "pad", "alignment padding", "padding"),
            LegendEntry(
                "unused",
                "unused",
                f"rows b >= B={live_batch} or other stats slots",
                f"unused (b >= {live_batch}, other slots)",
            ),
        ),
        key="p peer, b batch row, h head of the peer's block, d position in the row (wire elements), s stats slot"
        + (", k scale block of the row" if spec.fp8 else "")
        + (f", e empty row (batch row {live_batch - empty_rows} + e)" if empty_rows else ""),
    )


def lse_facts(spec: DcpSpec, bmap: ByteMap, found: Facts) -> dict[str, Any]:
    """Where the stats live: their buffer, the byte of the first word in each row (row_tail with dim
    innermost) and the stats slots that hold them (separate); for a max_sum spec also each word's slots."""
    words = stats_words(spec)
    word_runs = {word: [run for run in bmap.runs if run.kind == word] for word in words}
    row_stride = {buffer.name: buffer.row_bytes for buffer in found.buffers}
    tail_in_rows = spec.row_tail and spec.payload.axes[-1] == "dim"

    def offsets(runs: list[Run]) -> list[int]:
        return sorted({run.offset % row_stride[run.buffer] for run in runs}) if tail_in_rows else []

    def slots(runs: list[Run]) -> list[int]:
        return sorted({i for run in runs if (slot := run.range("slot")) is not None for i in range(*slot)})

    first = word_runs[words[0]]
    every = [run for runs in word_runs.values() for run in runs]
    facts: dict[str, Any] = {
        "lse_buffer": first[0].buffer if first else "",
        "lse_offsets_in_row": offsets(first),
        "lse_slots": slots(every),
    }
    if spec.max_sum:
        facts["stats_form"] = "max_sum"
        for word in words:
            facts[f"{word}_offsets_in_row"] = offsets(word_runs[word])
            facts[f"{word}_slots"] = slots(word_runs[word])
    return facts


def _max_sum_sentence(spec: DcpSpec, D: int, bmap: ByteMap, facts: Mapping[str, Any]) -> str:
    """Where a max_sum spec keeps its two float32 words."""
    if spec.row_tail and spec.payload.axes[-1] == "dim":
        first = ", ".join(str(offset) for offset in facts["max_offsets_in_row"])
        second = ", ".join(str(offset) for offset in facts["sum_offsets_in_row"])
        return (
            f"Stats (max, sum): the max's float32 word at byte {first} and the sum's at byte {second} of every "
            f"{facts['lse_buffer']} row (after the D elements)."
        )
    if spec.row_tail:
        return f"Stats (max, sum): the float32 elements at index D={D} (max) and D+1={D + 1} (sum) of the dim axis."
    stats = bmap.buffer(facts["lse_buffer"])
    slots = stats.extents[stats.axes.index("slot")]
    max_slot = ", ".join(str(slot) for slot in facts["max_slots"])
    sum_slot = ", ".join(str(slot) for slot in facts["sum_slots"])
    return f"Stats (max, sum): slot {max_slot} (max) and slot {sum_slot} (sum) of {slots} float32 words per entry of {stats.name}."


def _scale_sentence(spec: DcpSpec, D: int, bmap: ByteMap) -> str:
    """Where an fp8 spec keeps its block scales."""
    block = spec.scale_block_of(D)
    blocks = scale_blocks(spec, D)
    head = (
        f"Payload: {spec.payload.dtype.value} codes, one float32 scale per block of {block} elements "
        f"({blocks} per row; code x scale is the value)"
    )
    if spec.row_tail:
        start = D + 4 * spec.stats.words
        return f"{head}, at bytes {start}..{start + 4 * blocks - 1} of every payload row (after the stats)."
    return f"{head}, in {bmap.buffer('scales').describe()}."


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
        payload_info = next(info for info in bmap.buffers if info.name == "payload")
        whole_vectors = D * payload_info.elem_bytes % WIDEST_STORE_BYTES == 0  # else padding cannot help
        if dim_innermost and spec.row_tail and found.buffer("payload").row_align < WIDEST_STORE_BYTES and whole_vectors:
            verdict += (
                " (align_bytes: 32 pads rows to fix that; 16 would leave two partly written 32-byte sectors per row)"
            )
        elif dim_innermost:
            row_payload = D * bmap.buffer("payload").elem_bytes
            verdict += f" (a row's D elements are {row_payload} bytes, not a multiple of 16)"
    sentences.append(f"Payload runs start and end on {store}-byte boundaries: {verdict}.")
    if spec.max_sum:
        sentences.append(_max_sum_sentence(spec, D, bmap, lse))
    elif spec.row_tail and dim_innermost:
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
    if spec.fp8:
        sentences.append(_scale_sentence(spec, D, bmap))
    E = values["E"]
    if E:
        written = "max -inf and sum 0" if spec.max_sum else "LSE -inf"
        zero = "zero codes with scale 1" if spec.fp8 else "+0.0"
        sentences.append(
            f"Rows b >= {B - E} belong to empty requests (pack's empty=): pack writes their payload as {zero} and "
            f"their {written}, the same bytes as any live row."
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
