"""The DCP family's render context: everything its templates need, derived from the spec alone."""

from __future__ import annotations

from typing import Any

from layoutgen.dcp.config import combine_peers_in_tile, pack_pairs_axis, pack_pairs_peer_outer
from layoutgen.dcp.spec import SCALE_AXES, DcpSpec, PayloadDtype, Transport
from layoutgen.render_helpers import broadcast_index, offset_sum, stride_expressions, wrap_sum

_EXTENT = {"peer": "NUM_PEERS", "batch": "batch_capacity", "head": "HEADS_PER_PEER", "dim": "ROW_LEN"}
_BLOCK_COUNT = {
    "peer": "((NUM_PEERS + BLOCK_PEER - 1) // BLOCK_PEER)",
    "batch": "tl.cdiv(batch_size, BLOCK_BATCH)",
    "head": "((HEADS_PER_PEER + BLOCK_HEAD - 1) // BLOCK_HEAD)",
    "dim": "((HEAD_DIM + BLOCK_DIM - 1) // BLOCK_DIM)",
}


def kernel_context(spec: DcpSpec) -> dict[str, object]:
    """Everything the kernel template needs, derived from the spec alone."""
    payload_axes = spec.payload.axes
    payload_stride = stride_expressions(payload_axes, _EXTENT)
    row_tail = spec.row_tail
    payload_dims = [("dim + tail" if a == "dim" and row_tail else a) for a in payload_axes]
    in_tile = {a: f"{a}_4d" for a in payload_axes}
    in_rows = {"batch": "batch_3d", "head": "head_3d", "dim": "dim_3d"}
    context: dict[str, object] = {
        "row_tail": row_tail,
        "payload_axes": list(payload_axes),
        "payload_stride": payload_stride,
        "payload_desc": f"payload [{', '.join(payload_dims)}]",
        "expand4": broadcast_index(list(payload_axes)),
        "block_count": _BLOCK_COUNT,
        "dim_position": payload_axes.index("dim"),
        "payload_offset4": wrap_sum(offset_sum(payload_axes, payload_stride, "payload", in_tile), 4),
        "payload_row_offset": wrap_sum(offset_sum(payload_axes, payload_stride, "payload", in_rows), 4),
        "payload_peer_term": offset_sum(payload_axes, payload_stride, "payload", {"peer": "peer"}),
        "peer_in_tile": combine_peers_in_tile(spec),
        "payload_offset_peers": wrap_sum(
            offset_sum(payload_axes, payload_stride, "payload", {a: f"{a}_4d" for a in payload_axes}), 4
        ),
    }
    max_sum = spec.max_sum
    if row_tail:
        lse_axes = [a for a in payload_axes if a != "dim"]
        lse_strides, lse_prefix = payload_stride, "payload"
        tail = "HEAD_DIM" if payload_stride["dim"] == "1" else "HEAD_DIM * payload_stride_dim"
        cast = spec.payload.dtype is not PayloadDtype.FLOAT32
        base = "payload_ptr"
        if cast:
            where = "the float32 bits right after the HEAD_DIM payload elements of each row"
            # The sum's word follows the max's: one float32 word on, once the pointer is a float32 pointer.
            sum_word = "+ 1"
        else:
            where = "element HEAD_DIM of each float32 payload row"
            sum_word = "+ 1" if payload_stride["dim"] == "1" else "+ payload_stride_dim"
        context["lse_desc"] = f"{where} holds the max, the next float32 word the sum" if max_sum else where
        context["stats_axes"], context["stats_stride"], context["stats_desc"] = [], {}, ""
        stats_innermost = lse_axes[-1]
    else:
        stats_axes = spec.stats.axes
        if stats_axes is None or spec.stats.slots is None:  # filled in by the spec's validator
            raise RuntimeError(f"spec {spec.name}: a separate stats buffer without axes or slots")
        lse_strides = stride_expressions(stats_axes, {**_EXTENT, "slot": str(spec.stats.slots)})
        lse_axes, lse_prefix = [a for a in stats_axes if a != "slot"], "stats"
        slot_stride = lse_strides["slot"]
        if max_sum:
            if spec.stats.max_slot is None or spec.stats.sum_slot is None:  # filled in by the spec's validator
                raise RuntimeError(f"spec {spec.name}: a max_sum stats buffer without max_slot or sum_slot")
            slot = spec.stats.max_slot
            step = spec.stats.sum_slot - spec.stats.max_slot
            sum_word = _scaled(step, "" if slot_stride == "1" else "stats_stride_slot")
            context["lse_desc"] = (
                f"words {spec.stats.max_slot} (max) and {spec.stats.sum_slot} (sum) of {spec.stats.slots} per "
                "entry of the stats buffer"
            )
        else:
            if spec.stats.slot is None:  # filled in by the spec's validator
                raise RuntimeError(f"spec {spec.name}: a separate stats buffer without a slot")
            slot, sum_word = spec.stats.slot, ""
            context["lse_desc"] = f"word {slot} of {spec.stats.slots} per entry of the stats buffer"
        tail = "" if slot == 0 else (str(slot) if slot_stride == "1" else f"{slot} * stats_stride_slot")
        cast, base = False, "stats_ptr"
        context["stats_axes"] = list(stats_axes)
        context["stats_stride"] = lse_strides
        context["stats_desc"] = f"stats [{', '.join(stats_axes)}]"
        stats_innermost = stats_axes[-1]
    context["max_sum"] = max_sum
    context["sum_word"] = sum_word
    context["stats_form"] = "max_sum" if max_sum else "lse"
    # Stores run along batch when it is a destination's innermost axis: pack then stores whole tiles without the
    # live-batch bound (see the template), which Triton could not prove to keep vectors of rows whole.
    context["payload_batch_innermost"] = payload_axes[-1] == "batch"
    # Combine's loads where batch is innermost are bounded by the buffers' capacity, not the live batch: a
    # bound Triton knows to divide by 16 keeps whole vectors along batch (rows past the live batch are read
    # and never stored); the masks' names in the templates.  Untuned at N 8, B 1024, H 128, D 512 on H200: a
    # float32 wire 118.4 -> 76.4 µs (58 -> 90% of a copy), an fp8 one with blocks of 16 179.0 -> 51.0 µs.
    capacity_bound = context["payload_batch_innermost"]
    context["combine_rows_mask"] = "load_rows" if capacity_bound else "row_mask"
    context["combine_payload_mask"] = "load_mask" if capacity_bound else "mask"
    context["combine_block_mask"] = "load_block_mask" if capacity_bound else "block_mask"
    context["stats_batch_innermost"] = stats_innermost == "batch"
    lse_order = tuple(lse_axes)

    def with_tail(offset: str) -> str:
        return f"{offset} + {tail}" if tail else offset

    def pointer(address: str) -> str:
        return f"({address}).to(tl.pointer_type(tl.float32))" if cast else address

    context["lse_axes"] = lse_axes
    context["expand3"] = broadcast_index(lse_axes)
    tile3 = {a: f"{a}_3d" for a in lse_axes}
    context["lse_offset3"] = wrap_sum(with_tail(offset_sum(lse_order, lse_strides, lse_prefix, tile3)), 4)
    context["lse_pointer3"] = pointer(f"{base} + lse_offset")
    rows2 = {"batch": "batch_2d", "head": "head_2d"}
    context["lse_row_offset"] = wrap_sum(with_tail(offset_sum(lse_order, lse_strides, lse_prefix, rows2)), 4)
    peer_term = offset_sum(lse_order, lse_strides, lse_prefix, {"peer": "peer"})
    context["lse_pointer2"] = pointer(f"{base} + {peer_term} + lse_row_offset")
    peers_term = offset_sum(lse_order, lse_strides, lse_prefix, {"peer": "peer_3d"})
    context["lse_pointer_peers"] = pointer(f"{base} + {peers_term} + lse_row_offset[:, :, None]")
    # A separate stats buffer with `peer` at stride 1: a row's N entries lie side by side and rows lie slots x N
    # words apart, so where a combine's program takes a long run of batch rows (payload batch innermost), one
    # load per peer touched a sector per row.  Such a combine loads them as one batch x head x peer tile (one
    # vector per row) in programs of 128 rows and more (the launcher's STATS_TILE) and takes each peer's weight
    # from it in registers.  H100, N 8, H 128, D 512, three such layouts (notes, twenty-first pass): B 1024
    # 0.78-0.96x the time, B 256 0.86-1.02x, B 64 (64 rows, the loads per peer) unchanged.  Not for fp8 wires:
    # with head innermost the same tile took 47.7 -> 59.0 µs; nor with dim innermost: 52.1 -> 52.2 µs.
    context["stats_peer_tile"] = (
        not row_tail
        and not spec.fp8
        and not context["peer_in_tile"]
        and payload_axes[-1] == "batch"
        and lse_strides.get("peer") == "1"
    )
    context["fp8"] = spec.fp8
    if spec.fp8:
        context.update(fp8_context(spec, payload_stride))
    context.update(pack_tile_context(spec, context))
    return context


_PACK_BOUND = {"peer": "NUM_PEERS", "batch": "batch_size", "head": "HEADS_PER_PEER", "dim": "HEAD_DIM"}


def pack_tile_context(spec: DcpSpec, context: dict[str, Any]) -> dict[str, object]:
    """How both pack templates index their tile.  As a box, each axis has its own index vector.  With a pairs
    axis X (`pack_pairs_axis`) the tile's X position holds one flat run of (X, peer) pairs, or of (peer, head)
    pairs, `X_pair`, from which X and peer follow, and its peer position has one element; the destination's X
    and peer terms are the pair itself (the inner one's stride is 1, the outer one's its extent) and the run's
    mask one bound."""
    payload_axes = list(spec.payload.axes)
    pairs_axis = pack_pairs_axis(spec)
    expand4: dict[str, str] = dict(context["expand4"])
    expand3: dict[str, str] = dict(context["expand3"])
    lse_axes: list[str] = list(context["lse_axes"])
    payload_stride: dict[str, str] = dict(context["payload_stride"])
    block_count: dict[str, str] = dict(context["block_count"])

    def mask(axes: list[str], suffix: str, extra: tuple[str, ...] = ()) -> str:
        bounds = [
            f"({axis}_{suffix} < {_PACK_BOUND[axis]})" for axis in ["peer", "batch", "head", "dim"] if axis in axes
        ]
        return " & ".join([*bounds, *extra])

    # fp8: the tile's dim axis is (block, lane); its mask bounds the blocks (the lanes apart, in the template).
    fp8_bound = ("(block_5d < NUM_SCALE_BLOCKS)",)
    if pairs_axis is None:
        found: dict[str, object] = {
            "pairs_axis": None,
            "pairs_peer_outer": False,
            "pack_program_axes": payload_axes,
            "pack_block_count": block_count,
            "pack_expand4": expand4,
            "pack_expand3": expand3,
            "pack_stride_axes": [axis for axis in payload_axes if payload_stride[axis] != "1"],
            "pack_payload_offset4": context["payload_offset4"],
            "pack_mask4": mask(payload_axes, "4d"),
            "pack_lse_mask3": mask(lse_axes, "3d"),
        }
        if spec.fp8:
            found["pack_expand5"] = context["expand5"]
            found["pack_block_mask5"] = mask([a for a in payload_axes if a != "dim"], "5d", fp8_bound)
            found["pack_fp8_payload_offset5"] = context["fp8_payload_offset5"]
            found["pack_amax_shape"] = context["amax_shape"]
        return found
    others = [axis for axis in payload_axes if axis not in (pairs_axis, "peer")]
    pair_bound = f"({pairs_axis}_pair_{{}} < {_PACK_BOUND[pairs_axis]} * NUM_PEERS)"
    pair_strides = {**payload_stride, pairs_axis: "1"}
    names = {**{axis: f"{axis}_4d" for axis in others}, pairs_axis: f"{pairs_axis}_pair_4d"}
    if pairs_axis == "head":
        block_count["head"] = (
            "((HEADS_PER_PEER * NUM_PEERS + BLOCK_HEAD * BLOCK_PEER - 1) // (BLOCK_HEAD * BLOCK_PEER))"
        )
    found = {
        "pairs_axis": pairs_axis,
        "pairs_peer_outer": pack_pairs_peer_outer(spec),
        "pack_program_axes": [axis for axis in payload_axes if axis != "peer"],
        "pack_block_count": block_count,
        "pack_expand4": {**expand4, "peer": expand4[pairs_axis]},
        "pack_expand3": {**expand3, "peer": expand3[pairs_axis]},
        # The strides of the axes outside the pair; a row tail's stats offset takes every payload stride.
        "pack_stride_axes": [
            axis for axis in payload_axes if payload_stride[axis] != "1" and (axis in others or spec.row_tail)
        ],
        "pack_payload_offset4": wrap_sum(offset_sum(payload_axes, pair_strides, "payload", names), 4),
        "pack_mask4": " & ".join([pair_bound.format("4d"), mask(others, "4d")]),
        "pack_lse_mask3": " & ".join(
            [pair_bound.format("3d"), mask([a for a in lse_axes if a not in (pairs_axis, "peer")], "3d")]
        ),
    }
    if spec.fp8:
        expand5: dict[str, str] = dict(context["expand5"])
        names5 = {**{axis: f"{axis}_5d" for axis in others}, pairs_axis: f"{pairs_axis}_pair_5d"}
        found["pack_expand5"] = {**expand5, "peer": expand5[pairs_axis]}
        rows = [axis for axis in others if axis != "dim"]
        found["pack_block_mask5"] = " & ".join([pair_bound.format("5d"), mask(rows, "5d", fp8_bound)])
        found["pack_fp8_payload_offset5"] = wrap_sum(offset_sum(payload_axes, pair_strides, "payload", names5), 4)
        tile_blocks = {**_TILE_BLOCK, "peer": "1", pairs_axis: f"{_TILE_BLOCK[pairs_axis]} * BLOCK_PEER"}
        found["pack_amax_shape"] = ", ".join("1" if a == "lane" else tile_blocks[a] for a in context["tile_axes"])
    return found


#: Each fp8 tile axis's block constexpr.
_TILE_BLOCK = {
    "peer": "BLOCK_PEER",
    "batch": "BLOCK_BATCH",
    "head": "BLOCK_HEAD",
    "block": "TILE_BLOCKS",
    "lane": "SCALE_LANES",
}

#: The Triton type and the largest finite value of each fp8 wire dtype.
_FP8_TYPES = {PayloadDtype.FLOAT8_E4M3FN: "tl.float8e4nv", PayloadDtype.FLOAT8_E5M2: "tl.float8e5"}


def fp8_context(spec: DcpSpec, payload_stride: dict[str, str]) -> dict[str, object]:
    """What the fp8 templates add: the tile's dim axis split into (block, lane) -- element dim of a row is
    lane `dim % SCALE_BLOCK` of scale block `dim // SCALE_BLOCK` -- and where the block scales live."""
    payload_axes = list(spec.payload.axes)
    position = payload_axes.index("dim")
    tile_axes = [*payload_axes[:position], "block", "lane", *payload_axes[position + 1 :]]
    in_tile = {a: f"{a}_5d" for a in payload_axes}
    in_tile["dim"] = "dim_5d"
    rows5 = {a: f"{a}_5d" for a in ("peer", "batch", "head")}
    rows4 = {"batch": "batch_4d", "head": "head_4d"}
    context: dict[str, object] = {
        "fp8_type": _FP8_TYPES[spec.payload.dtype],
        "fp8_ptx": "e4m3" if spec.payload.dtype is PayloadDtype.FLOAT8_E4M3FN else "e5m2",
        "fp8_max": repr(spec.fp8_max),
        "fp8_e4m3": spec.payload.dtype is PayloadDtype.FLOAT8_E4M3FN,
        "scale_block_literal": repr(spec.payload.scale_block),
        "tile_axes": tile_axes,
        "lane_axis": tile_axes.index("lane"),
        "expand5": broadcast_index(tile_axes),
        "fp8_payload_offset5": wrap_sum(offset_sum(payload_axes, payload_stride, "payload", in_tile), 4),
        "fp8_payload_row_offset4": wrap_sum(
            offset_sum(payload_axes, payload_stride, "payload", {**rows4, "dim": "dim_4d"}), 4
        ),
        # Programs along dim: groups of TILE_BLOCKS scale blocks, each split over LANE_PROGRAMS programs when a
        # block is wider than the tile (combine only; pack needs whole blocks).
        "block_count": {
            **_BLOCK_COUNT,
            "dim": "(((NUM_SCALE_BLOCKS + TILE_BLOCKS - 1) // TILE_BLOCKS) * LANE_PROGRAMS)",
        },
        "scales_batch_innermost": False,
        "fp8_chunks": spec.fp8_chunks,
        # The launcher's register cap (see pack_fp8.py.jinja): measured with batch or head innermost only.
        "register_cap": spec.fp8_chunks and payload_axes[-1] in ("batch", "head"),
        # The tile's shape with its lane axis reduced: one amax per (peer, batch, head, block).
        "amax_shape": ", ".join("1" if axis == "lane" else _TILE_BLOCK[axis] for axis in tile_axes),
        # One chunk of SCALE_LANES elements along the destination's dim axis.
        "chunk_step": "SCALE_LANES" if payload_stride["dim"] == "1" else "SCALE_LANES * payload_stride_dim",
        # batch innermost: the pack may store four rows' codes as one 32-bit word (`WORDS`), its tile split into
        # four sub-tiles of rows 4i + k (`rows_5d`); every other axis's stride is then a multiple of 4 bytes.
        "fp8_words": payload_axes[-1] == "batch",
        # Combine loads the scales as a 3-D tile where head is the payload's innermost axis (see the template).
        # With batch innermost it cost time: its load layout gives a thread 16 rows, so 16 scales per peer
        # (232 registers against 135; [peer, head, dim, batch], blocks of 16, N 8, B 1024 on the H200: 56.7
        # against 51.0 µs).  With peer innermost it timed the same as the 4-D load (285.4 against 286.1 µs for
        # benchmarks/specs/probe_fp8_peer_inner_blocks.yaml), so it keeps that one.
        "combine_scales_3d": payload_axes[-1] == "head",
        "fp8_payload_offset_peers": wrap_sum(
            offset_sum(payload_axes, payload_stride, "payload", {a: f"{a}_5d" for a in payload_axes}), 4
        ),
    }
    if context["fp8_words"]:
        word_terms = [
            "batch_word_5d" if axis == "batch" else f"{in_tile[axis]} * (payload_stride_{axis} // 4)"
            for axis in payload_axes
        ]
        context["fp8_word_offset5"] = wrap_sum(" + ".join(word_terms), 8)
        context["fp8_payload_rows_offset5"] = wrap_sum(
            offset_sum(payload_axes, payload_stride, "payload", {**in_tile, "batch": "rows_5d"}), 12
        )
    if spec.row_tail:
        # dim is innermost (validated), so element HEAD_DIM of a row is its first tail byte: the stats words, then
        # one float32 scale per block.
        words = spec.stats.words
        row5 = offset_sum(payload_axes, payload_stride, "payload", rows5)
        row4 = offset_sum(payload_axes, payload_stride, "payload", {"peer": "peer", **rows4})
        context["scale_pointer5"] = (
            f"(payload_ptr + {row5} + HEAD_DIM).to(tl.pointer_type(tl.float32)) + {words} + block_5d"
        )
        context["scale_pointer4"] = (
            f"(payload_ptr + {row4} + HEAD_DIM).to(tl.pointer_type(tl.float32)) + {words} + block_4d"
        )
        context["scales_desc"] = f"float32 scales after the {words} stats word(s) of each payload row, one per block"
        context["scale_axes"], context["scale_stride"] = [], {}
    else:
        scale_axes = list(spec.payload.scale_axes or SCALE_AXES)
        strides = stride_expressions(scale_axes, {**_EXTENT, "block": "NUM_SCALE_BLOCKS"})
        names5 = {**rows5, "block": "block_5d"}
        names4 = {"peer": "peer", **rows4, "block": "block_4d"}
        context["scale_pointer5"] = "scales_ptr + " + offset_sum(scale_axes, strides, "scales", names5)
        context["scale_rows_pointer5"] = "scales_ptr + " + offset_sum(
            scale_axes, strides, "scales", {**names5, "batch": "rows_5d"}
        )
        context["scale_batch_step"] = "" if strides["batch"] == "1" else " * scales_stride_batch"
        context["scale_pointer4"] = "scales_ptr + " + offset_sum(scale_axes, strides, "scales", names4)
        names3 = {"peer": "peer", "batch": "batch_3d", "head": "head_3d", "block": "block_3d"}
        names_peers = {"peer": "peer_5d", "batch": "batch_5d", "head": "head_5d", "block": "block_5d"}
        context["scale_pointer_peers"] = "scales_ptr + " + offset_sum(scale_axes, strides, "scales", names_peers)
        context["scale_pointer3"] = "scales_ptr + " + offset_sum(scale_axes, strides, "scales", names3)
        context["scales_desc"] = f"scales [{', '.join(scale_axes)}], float32"
        context["scale_axes"], context["scale_stride"] = scale_axes, strides
        context["scales_batch_innermost"] = scale_axes[-1] == "batch"
    return context


def _scaled(count: int, stride: str) -> str:
    """`count` words along an axis of stride `stride` ("" for 1) as the step from one pointer to another:
    `+ 1`, `- 1`, `+ stats_stride_slot`, `- 2 * stats_stride_slot`."""
    term = str(abs(count)) if not stride else (stride if abs(count) == 1 else f"{abs(count)} * {stride}")
    return f"{'+' if count > 0 else '-'} {term}"


def module_context(spec: DcpSpec) -> dict[str, Any]:
    """The kernel context plus what the module template's docstring and API need."""
    context: dict[str, Any] = kernel_context(spec)
    wire = {PayloadDtype.INPUT: "the activations' dtype", PayloadDtype.FLOAT32: "float32"}.get(
        spec.payload.dtype, f"{spec.payload.dtype.value} codes in blocks of {spec.payload.scale_block or 'D'} elements"
    )
    buffer_lines = [f"{context['payload_desc']}, {wire}"]
    if not spec.row_tail:
        buffer_lines.append(f"{context['stats_desc']}, float32, {spec.stats.slots} slot(s)")
    if spec.fp8:
        buffer_lines.append(str(context["scales_desc"]))
    context["stats_label"] = "(max, sum)" if spec.max_sum else "LSE"
    context["buffer_lines"] = buffer_lines
    context["transport"] = spec.transport.value
    context["transport_desc"] = (
        "one torch.distributed.all_to_all_single per buffer (peer is outermost)"
        if spec.transport is Transport.ALL_TO_ALL_SINGLE
        else "external: the caller moves the bytes (no exchange() here)"
    )
    context["has_exchange"] = spec.transport is Transport.ALL_TO_ALL_SINGLE
    context["scale_block_desc"] = (
        f"{spec.payload.scale_block} consecutive elements of a row"
        if spec.payload.scale_block
        else "a row's D elements"
    )
    return context
