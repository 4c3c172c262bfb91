"""The Ulysses family's render context: everything its templates need, derived from the spec alone.

All four kernels copy between two layouts of the same logical axes, peer x (batch x) seq x head x dim:

* a wire (a buffer per tensor, or one shared buffer whose `tensor` axis concatenates every tensor's block);
* a shard (`local`), whose head axis is (peer, head): peer p's local head h is the shard's head p*H/N + h;
* an attention tensor, whose seq axis is (peer, seq): row p*S_local + i is row i of peer p's shard.

A kernel's tile is a box of those axes in its destination's order (so the box's innermost axis is the
destination's, for coalesced stores).  Its programs walk the destination in memory order: grid x holds
the seq blocks, each followed by the tiles of the axes inside seq (the innermost fastest), grid y the
axes outside seq.  Every division in that decomposition is by a compile-time block count (seq, the only
run-time extent, is the outermost part of x).  The tensors of one direction share one launch: their
tiles follow one another along the grid axis that holds `head` (the only axis whose extent differs
between tensors), so no program idles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from layoutgen.render_helpers import broadcast_index, interleave_tree, split_tree, stride_expressions
from layoutgen.ulysses import layout
from layoutgen.ulysses.describe import describe_tensors, describe_wire
from layoutgen.ulysses.layout import KERNEL_DIRECTION
from layoutgen.ulysses.spec import DirectionSpec, HeadCount, TensorSpec, Transport, UlyssesSpec

#: Per head count: the kernels' constexpr, the launchers' variable, the prefix of its tile counts.
_GROUP_CONST = {HeadCount.H: "HEADS_PER_PEER", HeadCount.H_KV: "KV_HEADS_PER_PEER"}
_GROUP_VARIABLE = {HeadCount.H: "heads_per_peer", HeadCount.H_KV: "kv_heads_per_peer"}
_GROUP_PREFIX = {HeadCount.H: "", HeadCount.H_KV: "kv_"}
_GROUP_BLOCKS = {HeadCount.H: "head", HeadCount.H_KV: "kv_head"}
#: Extents as a tile function sees them (its tensor's heads are HEADS).
_TILE_EXTENT = {"peer": "NUM_PEERS", "batch": "BATCH", "seq": "seq_len", "head": "HEADS", "dim": "HEAD_DIM"}
_KERNEL_SIDES = layout.KERNEL_SIDES
_SPLIT_AXIS = layout.SPLIT_AXIS
_LINE = 100


def block_count(axis: str, extent: str) -> str:
    """The number of blocks along `axis` of a compile-time extent, as a constexpr expression."""
    block = f"BLOCK_{axis.upper()}"
    return f"(({extent} + {block} - 1) // {block})"


def wrap_terms(terms: Sequence[str], indent: int, joiner: str = " + ") -> str:
    """`terms` joined, one per line inside parentheses when the line would be long (readable generated code)."""
    text = joiner.join(terms)
    if len(text) + indent <= _LINE - 20 or len(terms) == 1:
        return text
    pad = " " * (indent + 4)
    return "(\n" + pad + ("\n" + pad + joiner.strip() + " ").join(terms) + "\n" + " " * indent + ")"


def product(factors: Sequence[str]) -> str:
    return " * ".join(factors) if factors else "1"


def grouped_sum(terms: Sequence[str]) -> str:
    """The terms' sum as one factor: the single term bare, several in parentheses."""
    return terms[0] if len(terms) == 1 else f"({' + '.join(terms)})"


@dataclass(frozen=True)
class _Group:
    """One head count used by a kernel's tensors."""

    count: HeadCount

    @property
    def const(self) -> str:
        return _GROUP_CONST[self.count]

    @property
    def variable(self) -> str:
        return _GROUP_VARIABLE[self.count]

    @property
    def prefix(self) -> str:
        return _GROUP_PREFIX[self.count]

    @property
    def blocks(self) -> str:
        return _GROUP_BLOCKS[self.count]

    @property
    def source(self) -> str:
        return "bufs.H" if self.count is HeadCount.H else "bufs.H_kv"


def _user_offset(axes: Sequence[str], side: str, index: dict[str, str], prefix: str, merged: bool) -> list[str]:
    """Terms of a user tensor's element offset: its strides are run-time arguments but the innermost's (1).
    The split axis is peer x its own index, unless `merged` (global heads: the box's head is the shard's)."""
    split = _SPLIT_AXIS[side]
    split_extent = "HEADS" if split == "head" else "seq_len"
    terms = []
    for position, axis in enumerate(axes):
        innermost = position == len(axes) - 1
        peer_split = axis == split and not merged
        value = f"peer{index['peer']} * {split_extent} + {axis}{index[axis]}" if peer_split else f"{axis}{index[axis]}"
        if innermost:
            terms.append(value)
        else:
            terms.append(f"({value}) * {prefix}_stride_{axis}" if peer_split else f"{value} * {prefix}_stride_{axis}")
    return terms


def _wire_strides(direction: DirectionSpec) -> dict[str, str]:
    """Per wire axis (`tensor` aside), its dense stride as a tile function computes it."""
    extents = dict(_TILE_EXTENT)
    if not direction.shared:
        return stride_expressions(direction.wire, extents)
    position = direction.wire.index("tensor")
    outer = stride_expressions([*direction.wire[:position], "tensor"], {**extents, "tensor": "tensor_axis_size"})
    inner = stride_expressions(direction.wire[position + 1 :], extents)
    outer.pop("tensor")
    return {**outer, **inner}


def _tensor_size(direction: DirectionSpec, group: _Group) -> str:
    """Elements of one tensor's block inside a shared wire's `tensor` axis, in the kernel's names."""
    inner = direction.wire[direction.wire.index("tensor") + 1 :]
    extents = {**_TILE_EXTENT, "head": group.const}
    runtime = [extents[a] for a in inner if not extents[a].isupper()]
    constant = [extents[a] for a in inner if extents[a].isupper()]
    factors = runtime + ([f"({' * '.join(constant)})" if len(constant) > 1 else constant[0]] if constant else [])
    return product(factors)


def kernel_context(spec: UlyssesSpec, kernel: str) -> dict[str, Any]:
    """Everything one kernel's template needs."""
    direction = spec.direction(KERNEL_DIRECTION[kernel])
    source_side, destination_side = _KERNEL_SIDES[kernel]
    user_side = destination_side if destination_side != "wire" else source_side
    user_axes = spec.local if user_side == "local" else spec.attention
    tile_axes = layout.tile_axes(spec, kernel)
    seq = tile_axes.index("seq")
    outer_axes, inner_axes = tile_axes[:seq], tile_axes[seq + 1 :]
    fused = "x" if "head" in inner_axes else "y"
    groups = [_Group(count) for count in HeadCount if any(t.heads is count for t in direction.tensors)]
    group_of = {t.name: _Group(t.heads) for t in direction.tensors}
    rank = len(tile_axes)
    index = {axis: f"_{rank}d" for axis in tile_axes}
    # Global heads (`layout.global_heads`): the box's head is the shard's, and the wire's peer x head offset
    # is head x the head stride (the wire holds head right inside peer), so peer leaves both offsets.
    merged = layout.global_heads(spec, kernel)
    extents = {**_TILE_EXTENT, "head": "NUM_PEERS * HEADS"} if merged else dict(_TILE_EXTENT)
    wire_strides = _wire_strides(direction)
    if merged:
        wire_strides.pop("peer")
    wire_axes = [axis for axis in direction.wire if axis != "tensor" and axis in wire_strides]
    wire_terms = [
        f"{axis}{index[axis]}" if wire_strides[axis] == "1" else f"{axis}{index[axis]} * wire_stride_{axis}"
        for axis in wire_axes
    ]
    user_terms = _user_offset(user_axes, user_side, index, user_side, merged)
    source_terms, destination_terms = (wire_terms, user_terms) if source_side == "wire" else (user_terms, wire_terms)
    user_strides = list(user_axes[:-1])  # the innermost stride is 1 (checked), baked in
    shared = direction.shared
    takes_axis_size = shared and direction.wire.index("tensor") > 0

    def tile_counts(axes: Sequence[str], group: _Group | None, scope: str) -> str:
        """Blocks of `axes` multiplied, in the kernel (`kernel`) or the launcher (`launcher`)."""
        factors = []
        for axis in axes:
            if scope == "launcher":
                factors.append(f'blocks["{group.blocks if axis == "head" and group else axis}"]')
            else:
                if axis == "head" and group:
                    extent = f"NUM_PEERS * {group.const}" if merged else group.const
                else:
                    extent = extents[axis]
                factors.append(block_count(axis, extent))
        return product(factors)

    # The grid axis that holds `head` carries every tensor's tiles, one tensor after another.  On grid x the
    # programs then walk one tensor's seq blocks after another's (tensor-major) unless a shared wire holds the
    # tensor axis inside seq, whose memory order is every tensor's boxes of one seq block in turn.  With the
    # q, k, v boxes of each seq block interleaved, a scatter wrote three regions (or buffers) at once: H200,
    # N 4, S_local 4096, ulysses_qkv_gqa scatter 27.11 against 26.23 µs tensor-major, deepspeed_ulysses
    # scatter 53.49 against 50.04 (the copy of their bytes: 25.74 and 49.25; bench_ulysses.py, 18:01 and
    # 18:19 UTC, each after its own re-tune).
    interleaved = shared and direction.wire.index("tensor") > direction.wire.index("seq")
    several_tensors = len(direction.tensors) > 1
    tensor_major = fused == "x" and several_tensors and not interleaved
    # On grid y, interleaved tensors lie finer than the boxes: one tensor's programs after another's then wrote
    # each line in parts far apart in time (a scatter to wire [peer, dim, head, seq, tensor] at 43% of a copy on
    # the H200, bench_unseen_specs.py's spec 15).  With one head count, each program copies its box of every
    # tensor in turn.
    together = fused == "y" and several_tensors and interleaved and len(groups) == 1
    # Copied together to or from a wire whose innermost axis is `tensor`, the tensors' elements alternate: each
    # tensor's store wrote 2-byte elements T apart (spec 15's scatter, wire [peer, dim, head, seq, tensor], at 65%
    # of a copy on the H200).  With a power-of-two count of tensors, and the wire's innermost other axis the
    # box's, the boxes are interleaved in registers (`tl.interleave`) and stored as one box T times as long along
    # it, or loaded as one and split (`tl.split`): whole vectors on the wire.
    tensor_count = len(direction.tensors)
    pair_axis = [axis for axis in direction.wire if axis != "tensor"][-1]
    joined = (
        together
        and direction.wire[-1] == "tensor"
        and pair_axis == tile_axes[-1]
        and tensor_count & (tensor_count - 1) == 0
    )
    # k and v boxes take only their heads where `head` is a side's innermost axis: the box is sized for q's heads
    # per peer, and GQA's fewer left most of a k/v box masked, its vectors a few heads wide (spec 17's gather,
    # attention [seq, batch, dim, head], at 42% of a copy on the H200 with 2 of 8 heads live, 63% with k and v
    # at q's head count).  Only boxes that took all of k/v's heads shrink, so the grid is the same.
    kv_box = len(groups) == 2 and "head" in (tile_axes[-1], layout.side_axes(spec, kernel, source_side)[-1])
    # A user side whose innermost axis is short (heads or batch rows, not dim) has a stride next to it that is no
    # multiple of 16 (8 heads), so Triton knows nothing of the rows' alignment and moves single elements: spec
    # 17's gather to attention [seq, batch, dim, head] stored 2 bytes at a time (`STG.E.U16` x96, sm_90).  Where
    # every tensor is dense there, the launcher says so and that stride becomes the compile-time extent.
    inner_axis = user_axes[-1]
    dense_inner = inner_axis in ("head", "batch") and len(user_axes) > 1
    next_axis = user_axes[-2] if dense_inner else ""
    inner_extent = {"head": "NUM_PEERS * HEADS" if user_side == "local" else "HEADS", "batch": "BATCH"}.get(
        inner_axis, ""
    )

    def launch_extent(tensor: TensorSpec) -> str:
        if inner_axis == "batch":
            return "bufs.B"
        if user_side == "local":
            return "bufs.H" if tensor.heads is HeadCount.H else "bufs.H_kv"
        return group_of[tensor.name].variable

    dense_check = (
        " and ".join(f"{t.name}.stride({user_axes.index(next_axis)}) == {launch_extent(t)}" for t in direction.tensors)
        if dense_inner
        else ""
    )
    count_name = "tiles" if fused == "x" else "outer_tiles"
    counts = {group.count: f"{group.prefix}{count_name}" for group in groups}
    tensors = []
    offset_terms: list[str] = []
    start_terms: list[str] = []
    for tensor in direction.tensors:
        group = group_of[tensor.name]
        count = counts[tensor.heads]
        start = " + ".join(start_terms)
        variable = "tile" if fused == "x" else "outer"
        relative = (
            variable
            if not start or together
            else (f"{variable} - {start}" if len(start_terms) == 1 else f"{variable} - ({start})")
        )
        wire_pointer = (
            f"{tensor.name}_wire_ptr"
            if not shared
            else ("wire_ptr" if not offset_terms else f"wire_ptr + {' + '.join(offset_terms)}")
        )
        tensors.append(
            {
                "name": tensor.name,
                "block_head": "BLOCK_KV_HEAD" if kv_box and tensor.heads is HeadCount.H_KV else "BLOCK_HEAD",
                "user_offset": wrap_terms(_user_offset(user_axes, user_side, index, tensor.name, merged), 4),
                "const": group.const,
                "condition": f"{variable} < {' + '.join([*start_terms, count])}",
                "program_condition": f"program < seq_blocks * {grouped_sum([*start_terms, count])}",
                "program_start": f"seq_blocks * {grouped_sum(start_terms)}" if start_terms else "",
                "tiles": count,
                "relative": relative,
                "wire_pointer": wire_pointer,
                "user_strides": [f"{tensor.name}_stride_{axis}" for axis in user_strides],
                "launch_strides": [f"{tensor.name}.stride({user_axes.index(axis)})" for axis in user_strides],
                "size": _tensor_size(direction, group) if shared else "",
            }
        )
        start_terms.append(count)
        offset_terms.append(f"{tensor.name}_size")

    names = [t.name for t in direction.tensors]
    source_role, destination_role = source_side, destination_side
    peer_meaning = (
        "The box's head is the shard's: peer p's chunk holds heads p * HEADS ... p * HEADS + HEADS - 1"
        if merged
        else "Peer p's chunk holds heads p * HEADS ... p * HEADS + HEADS - 1 of the shard"
        if user_side == "local"
        else "Peer p's chunk holds rows p * seq_len ... p * seq_len + seq_len - 1 of the attention tensor"
    )
    wire_desc = f"wire [{', '.join(direction.wire)}]"
    user_desc = f"{user_side} [" + ", ".join(user_axes) + "]"
    source_desc, destination_desc = (wire_desc, user_desc) if source_side == "wire" else (user_desc, wire_desc)
    x_total = [counts[t.heads] for t in direction.tensors] if fused == "x" else (["tiles"] if inner_axes else [])
    if fused == "x":
        y_total = ["outer_tiles"] if outer_axes else []
    else:
        y_total = [counts[groups[0].count]] if together else [counts[t.heads] for t in direction.tensors]
    bounds = {axis: f"({axis}{index[axis]} < {extents[axis]})" for axis in tile_axes}
    joined_bounds = {
        **bounds,
        pair_axis: f"({pair_axis}_pairs{index[pair_axis]} < {extents[pair_axis]} * {tensor_count})",
    }
    joined_terms = [
        f"{pair_axis}_pairs{index[pair_axis]}" if axis == pair_axis else term
        for axis, term in zip(wire_axes, wire_terms, strict=True)
    ]
    return {
        "name": kernel,
        "kernel_name": f"_{kernel}_kernel",
        "tile_name": f"_{kernel}_tile",
        "launch_name": f"_launch_{kernel}",
        "source_role": source_role,
        "destination_role": destination_role,
        "user_side": user_side,
        "user_strides": user_strides,
        "peer_meaning": peer_meaning,
        "source_desc": source_desc,
        "destination_desc": destination_desc,
        "wire_desc": wire_desc,
        "wire_strides": {a: s for a, s in wire_strides.items() if s != "1"},
        "shared": shared,
        "takes_axis_size": takes_axis_size,
        "tile_axes": tile_axes,
        "outer_axes": outer_axes,
        "inner_axes": inner_axes,
        "fused": fused,
        "tensor_major": tensor_major,
        "together": together,
        "kv_box": kv_box,
        "merged": merged,
        "kv_heads": "N * kv_heads_per_peer" if merged else "kv_heads_per_peer",
        "dense_inner": dense_inner,
        "inner_extent": inner_extent,
        "dense_check": dense_check,
        "dense_strides": (
            [f"{t.name}_stride_{next_axis}" for t in direction.tensors]
            if joined
            else [f"{user_side}_stride_{next_axis}"]
        )
        if dense_inner
        else [],
        "joined": joined,
        "pair_axis": pair_axis,
        "tensor_count": tensor_count,
        "interleaved_boxes": interleave_tree([f"{t.name}_box" for t in direction.tensors]),
        "joined_mask": wrap_terms(list(joined_bounds.values()), 4, " & "),
        # Whole rows drop the bound on seq; the stores' mask is the loads' unless the pairs lie along another axis.
        "joined_whole_rows_mask": (
            wrap_terms([bound for axis, bound in joined_bounds.items() if axis != "seq"], 8, " & ")
            if pair_axis != "seq"
            else ""
        ),
        "joined_wire_offset": wrap_terms(joined_terms, 4),
        "split_boxes": split_tree(
            "pairs", [f"{t.name}_box" for t in direction.tensors], [f"BLOCK_{axis.upper()}" for axis in tile_axes]
        ),
        "expand": broadcast_index(tile_axes),
        "rank": rank,
        "block_count": {axis: block_count(axis, extents[axis]) for axis in tile_axes if axis != "seq"},
        "mask": wrap_terms(list(bounds.values()), 4, " & "),
        # seq contiguous on one side: boxes of whole rows are copied without the run-time bound on seq.
        "seq_innermost": "seq" in (tile_axes[-1], layout.side_axes(spec, kernel, source_side)[-1]),
        "whole_rows_mask": wrap_terms([bound for axis, bound in bounds.items() if axis != "seq"], 8, " & "),
        "source_offset": wrap_terms(source_terms, 4),
        "destination_offset": wrap_terms(destination_terms, 4),
        "groups": [
            {
                "const": g.const,
                "variable": g.variable,
                "source": g.source,
                "blocks": g.blocks,
                "heads": f"N * {g.variable}" if merged else g.variable,
                "tiles": f"{g.prefix}tiles",
                "outer_tiles": f"{g.prefix}outer_tiles",
                "kernel_tiles": tile_counts(inner_axes, g, "kernel"),
                "kernel_outer_tiles": tile_counts(outer_axes, g, "kernel"),
                "launch_tiles": tile_counts(inner_axes, g, "launcher"),
                "launch_outer_tiles": tile_counts(outer_axes, g, "launcher"),
            }
            for g in groups
        ],
        "shared_tiles": tile_counts(inner_axes, None, "kernel"),
        "launch_shared_tiles": tile_counts(inner_axes, None, "launcher"),
        "launch_shared_outer_tiles": tile_counts(outer_axes, None, "launcher"),
        "x_total": " + ".join(x_total) if x_total else "",
        "x_divisor": grouped_sum(x_total) if x_total else "",
        "y_total": " + ".join(y_total) if y_total else "",
        "tensors": tensors,
        "axis_size_sum": " + ".join(f"{t.name}_size" for t in direction.tensors),
        "launch_params": ", ".join(["bufs", *names] if source_side == "wire" else [*names, "bufs"]),
        "has_batch": spec.has_batch,
        "buffer_names": ["wire"] if shared else [t.name for t in direction.tensors],
    }


def module_context(spec: UlyssesSpec) -> dict[str, Any]:
    """The kernels' contexts plus what the module template's docstring and API need."""
    to_attention, from_attention = spec.to_attention, spec.from_attention
    uses_kv = spec.uses(HeadCount.H_KV)
    shape_params = ["N", "S_local", "H", "D", "dtype", "device=None"]
    keywords = [*(["B"] if spec.has_batch else []), *(["H_kv"] if uses_kv else [])]
    signature = ", ".join(shape_params) + (", *, " + ", ".join(keywords) if keywords else "")
    forwarded = (
        ", ".join(["N", "S_local", "H", "D", "dtype", "device"])
        + (", B=B" if spec.has_batch else ", B=1")
        + (", H_kv=H_kv" if uses_kv else ", H_kv=H")
    )
    return {
        "ulysses": {kernel: kernel_context(spec, kernel) for kernel in KERNEL_DIRECTION},
        "transport": spec.transport.value,
        "has_exchange": spec.transport is Transport.ALL_TO_ALL_SINGLE,
        "transport_desc": (
            "one torch.distributed.all_to_all_single per buffer (peer is outermost)"
            if spec.transport is Transport.ALL_TO_ALL_SINGLE
            else "external: the caller moves the bytes (no exchange() here)"
        ),
        "local_desc": describe_tensors(spec.local, [*to_attention.tensors], "local"),
        "local_out_desc": describe_tensors(spec.local, [*from_attention.tensors], "local"),
        "attention_desc": describe_tensors(spec.attention, [*to_attention.tensors], "attention"),
        "attention_out_desc": describe_tensors(spec.attention, [*from_attention.tensors], "attention"),
        "wire_desc": describe_wire(to_attention),
        "wire_out_desc": describe_wire(from_attention),
        "local_axes": ", ".join(spec.local),
        "attention_axes": ", ".join(spec.attention),
        "tensor_names": [t.name for t in to_attention.tensors],
        "tensor_out_names": [t.name for t in from_attention.tensors],
        "alloc_signature": signature,
        "alloc_forward": forwarded,
        "has_batch": spec.has_batch,
    }
