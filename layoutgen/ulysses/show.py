"""The Ulysses family's words for `layoutgen show` / `layoutgen diff`: both wires of a spec as a `ByteLayout`.

The buffers are the ones `UlyssesBuffers` allocates for each direction (named `before.<buffer>` for the
to_attention wire that scatter writes and gather reads, `after.<buffer>` for the from_attention wire of
scatter_out and gather_out), and the placements are the views the reference copies through
(`wire_view(name)`, [peer, (batch,) seq, head, dim] per tensor), so the map is right by construction.
The wire is dense: every byte belongs to one tensor's element.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from layoutgen.family import get_family
from layoutgen.show.facts import WIDEST_STORE_BYTES, Facts
from layoutgen.show.model import (
    Buffer,
    ByteLayout,
    ByteMap,
    Kind,
    Legend,
    Look,
    Placement,
    Run,
    axes_label,
    check_drawing_size,
)
from layoutgen.ulysses.layout import DTYPE_NAMES, WIRE_ORDER, Shape, UlyssesBuffers, check_shape, wire_buffers
from layoutgen.ulysses.spec import DIRECTIONS, HeadCount, Transport, UlyssesSpec

#: Every axis of a Ulysses buffer with its label letter, in the order JSON lists a run's ranges.
AXIS_LETTERS: dict[str, str] = {"peer": "p", "batch": "b", "seq": "s", "head": "h", "dim": "d", "tensor": "t"}
#: Buffer and kind prefixes of the two directions.
PREFIX = {"to_attention": "before", "from_attention": "after"}
SIZE_HINT = "Use smaller --N/--batch/--seq/--heads/--D: the pattern is the same at any size"


def drawing_shape(spec: UlyssesSpec, shape: Mapping[str, int]) -> Shape:
    """The drawing's Shape: the family's drawing defaults for extents not given, unknown ones refused; B is
    1 and H_kv is H in a spec without a batch axis or H_kv-headed tensors."""
    defaults = get_family("ulysses").show_shape
    unknown = sorted(set(shape) - set(defaults))
    if unknown:
        raise ValueError(f"a Ulysses drawing has no extent {', '.join(unknown)}; its extents: {', '.join(defaults)}")
    values = {**defaults, **shape}
    if not spec.has_batch:
        if "B" in shape and shape["B"] != 1:
            raise ValueError(f"spec '{spec.name}' has no batch axis; leave B out (--batch, --shape B=)")
        values["B"] = 1
    if not spec.uses(HeadCount.H_KV):
        values["H_kv"] = values["H"]
    return Shape(N=values["N"], S_local=values["S_local"], H=values["H"], H_kv=values["H_kv"], D=values["D"],
                 dtype=torch.bfloat16, B=values["B"])  # fmt: skip


def describe(spec: UlyssesSpec, shape: Shape, dtype: str) -> str:
    batch = f", B={shape.B}" if spec.has_batch else ""
    kv = f", H_kv={shape.H_kv} ({shape.H_kv // shape.N} per peer)" if spec.uses(HeadCount.H_KV) else ""
    return (
        f"N={shape.N} peers, S_local={shape.S_local} rows per shard (S={shape.S}){batch}, H={shape.H} heads "
        f"({shape.H // shape.N} per peer){kv}, D={shape.D}, in {dtype}"
    )


def byte_layout(spec: UlyssesSpec, shape: Mapping[str, int], dtype: str) -> ByteLayout:
    """Both wires of `spec` at a drawing shape and `dtype`, in the Ulysses family's words.  The size is
    checked from the shape before anything is allocated."""
    torch_dtype = next((d for d, name in DTYPE_NAMES.items() if name == dtype), None)
    if torch_dtype is None:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES.values())}, got {dtype!r}")
    sized = Shape(**{**drawing_shape(spec, shape).__dict__, "dtype": torch_dtype})
    check_shape(spec, sized)
    shape_text = describe(spec, sized, dtype)
    total = sum(
        math.prod(buffer.extents) * torch_dtype.itemsize
        for direction in DIRECTIONS
        for buffer in wire_buffers(spec, direction, sized)
    )
    check_drawing_size(total, f"the wires of '{spec.name}' at {shape_text}", SIZE_HINT)
    buffers, placements, kinds = [], [], []
    logical = tuple(axis for axis in WIRE_ORDER if spec.has_batch or axis != "batch")
    for direction in DIRECTIONS:
        bufs = UlyssesBuffers.allocate(spec, direction, sized, "cpu")
        for buffer in wire_buffers(spec, direction, sized):
            name = f"{PREFIX[direction]}.{buffer.name}"
            buffers.append(Buffer(name, bufs.tensors[buffer.name], buffer.axes))
        for tensor in spec.direction(direction).tensors:
            kind = f"{PREFIX[direction]}.{tensor.name}"
            kinds.append(Kind(kind, Look.COLOURED, store_fact=True))
            placements.append(Placement(kind, bufs.wire_view(tensor.name), logical, tag=tensor.name))
    shape_json: dict[str, Any] = {"N": sized.N, "S_local": sized.S_local, "H": sized.H, "D": sized.D, "dtype": dtype}
    if spec.has_batch:
        shape_json["B"] = sized.B
    if spec.uses(HeadCount.H_KV):
        shape_json["H_kv"] = sized.H_kv
    return ByteLayout(
        name=spec.name,
        shape_text=shape_text,
        buffers=tuple(buffers),
        placements=tuple(placements),
        kinds=tuple(kinds),
        axis_letters=AXIS_LETTERS,
        colour_axis="peer",
        label=lambda run: label(run, logical, torch_dtype.itemsize),
        legend=Legend(
            colour_title="peers",
            entries=(),
            key="p peer (whose chunk), b batch, s row of the shard, h head of the peer's block, d element "
            "of the head, t a shared wire's tensor axis; before = scatter/gather's wire, after = "
            "scatter_out/gather_out's",
        ),
        summary=lambda bmap, found: summary(spec, bmap, found),
        elements_phrase=elements_phrase,
        json_header={
            "spec": spec.name,
            "layout_hash": spec.layout_hash(),
            "transport": spec.transport.value,
            "shape": shape_json,
        },
        shape_json=shape_json,
        user_side_fields=("local", "attention"),
    )


def label(run: Run, logical: tuple[str, ...], elem_bytes: int) -> str:
    """A cell's text, e.g. `k p1 s0 h0 d0..3`: the tensor, then its index ranges; in a shared wire, whose
    innermost axis is `tensor`, a tensor's whole block is one run: `q p0, 8 elements`."""
    tensor = run.kind.split(".", 1)[1]
    words = " ".join([tensor, *axes_label(run, logical, AXIS_LETTERS)])
    return f"{words}, {run.length // elem_bytes} elements" if run.range("tensor") is not None else words


def elements_phrase(counts: Mapping[str, int]) -> str:
    """What a diff counted, e.g. "16 q, 8 k, 8 v elements before attention and 16 out elements after"."""
    parts = []
    for prefix, when in (("before", "before attention"), ("after", "after")):
        mine = [f"{count} {kind.split('.', 1)[1]}" for kind, count in counts.items() if kind.startswith(prefix + ".")]
        if mine:
            parts.append(f"{', '.join(mine)} elements {when}")
    return " and ".join(parts)


def summary(spec: UlyssesSpec, bmap: ByteMap, found: Facts) -> str:
    """One paragraph: buffers, each peer's chunk, store width, transport."""
    sentences = [
        f"{spec.name} at {bmap.layout.shape_text}: "
        + "; ".join(info.describe() for info in bmap.buffers)
        + ". Every byte holds one element: the wires are dense."
    ]
    chunks = []
    for buffer in found.buffers:
        if buffer.colour_outermost:
            chunks.append(f"{buffer.name}: one contiguous chunk of {buffer.colour_block_bytes} bytes")
        else:
            blocks = bmap.buffer(buffer.name).nbytes // max(1, buffer.colour_block_every)
            chunks.append(f"{buffer.name}: {blocks} blocks of {buffer.colour_block_bytes} bytes")
    sentences.append("Per peer: " + "; ".join(chunks) + ".")
    narrow = {kind: width for kind, width in found.store_bytes.items() if width < WIDEST_STORE_BYTES}
    if narrow:
        widths = ", ".join(f"{kind.split('.', 1)[1]} {width}" for kind, width in narrow.items())
        sentences.append(f"Runs too short or misaligned for 16-byte stores (widest store, bytes): {widths}.")
    else:
        sentences.append("Every tensor's runs start and end on 16-byte boundaries: 16-byte stores: yes.")
    if spec.transport is Transport.ALL_TO_ALL_SINGLE:
        sentences.append("Transport all_to_all_single: one torch.distributed.all_to_all_single per buffer.")
    else:
        sentences.append("Transport external: the caller's transport moves these buffers (no exchange() here).")
    return " ".join(sentences)
