"""The DCP family's render context: everything its templates need, derived from the spec alone."""

from __future__ import annotations

from typing import Any

from layoutgen.dcp.spec import DcpSpec, PayloadDtype, Transport
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
    }
    if row_tail:
        lse_axes = [a for a in payload_axes if a != "dim"]
        lse_strides, lse_prefix = payload_stride, "payload"
        tail = "HEAD_DIM" if payload_stride["dim"] == "1" else "HEAD_DIM * payload_stride_dim"
        cast = spec.payload.dtype is not PayloadDtype.FLOAT32
        base = "payload_ptr"
        context["lse_desc"] = (
            "the float32 bits right after the HEAD_DIM payload elements of each row"
            if cast
            else "element HEAD_DIM of each float32 payload row"
        )
        context["stats_axes"], context["stats_stride"], context["stats_desc"] = [], {}, ""
    else:
        stats_axes = spec.stats.axes
        if stats_axes is None or spec.stats.slot is None:  # filled in by the spec's validator
            raise RuntimeError(f"spec {spec.name}: a separate stats buffer without axes or slot")
        lse_strides = stride_expressions(stats_axes, {**_EXTENT, "slot": str(spec.stats.slots)})
        lse_axes, lse_prefix = [a for a in stats_axes if a != "slot"], "stats"
        slot = spec.stats.slot
        tail = "" if slot == 0 else (str(slot) if lse_strides["slot"] == "1" else f"{slot} * stats_stride_slot")
        cast, base = False, "stats_ptr"
        context["lse_desc"] = f"word {slot} of {spec.stats.slots} per entry of the stats buffer"
        context["stats_axes"] = list(stats_axes)
        context["stats_stride"] = lse_strides
        context["stats_desc"] = f"stats [{', '.join(stats_axes)}]"
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
    return context


def module_context(spec: DcpSpec) -> dict[str, Any]:
    """The kernel context plus what the module template's docstring and API need."""
    context: dict[str, Any] = kernel_context(spec)
    buffer_lines = [
        str(context["payload_desc"]) + ", the activations' dtype"
        if spec.payload.dtype is PayloadDtype.INPUT
        else str(context["payload_desc"]) + ", float32"
    ]
    if not spec.row_tail:
        buffer_lines.append(f"{context['stats_desc']}, float32, {spec.stats.slots} slot(s)")
    context["buffer_lines"] = buffer_lines
    context["transport"] = spec.transport.value
    context["transport_desc"] = (
        "one torch.distributed.all_to_all_single per buffer (peer is outermost)"
        if spec.transport is Transport.ALL_TO_ALL_SINGLE
        else "external: the caller moves the bytes (no exchange() here)"
    )
    context["has_exchange"] = spec.transport is Transport.ALL_TO_ALL_SINGLE
    return context
