"""Pure-torch oracle for ANY valid Ulysses spec, and the naive torch path engines write by hand.

The reference is the definition of correct: the tests, `layoutgen build`'s verification and the tuner's
gate compare the generated kernels with it byte for byte.  It reads the wire only through
`UlyssesBuffers.wire_view` and the user's tensors through their logical views, so it holds for every
layout a spec can describe:

* `scatter(tensors, send)`          a rank's shards -> its send buffers (peer p gets head block p)
* `exchange(send)`                  what one all_to_all_single per buffer delivers, for N ranks in-process
* `gather(recv)`                    received buffers -> the attention layout (row s*S_local + i from peer s)
* `scatter_out` / `gather_out`      the same two steps backwards, for the attention output

The naive path (`naive_*`) is how DeepSpeed-Ulysses (`_SeqAllToAll`) and yunchang (`all_to_all_4D`) write
the same regrouping: reshape the head axis into (peer, head), permute, `.contiguous()`, and after the
exchange reshape and permute again.  It returns new tensors instead of writing into static buffers; the
benchmark times it against the generated kernels.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from layoutgen.ulysses.layout import (
    TENSOR_ORDER,
    Shape,
    UlyssesBuffers,
    logical_order,
    tensor_block,
    tensor_shape,
)
from layoutgen.ulysses.spec import DirectionSpec, UlyssesSpec

# ----------------------------------------------------------------------------------------------------------
# Logical views: every layout as [peer, (batch,) seq, head, dim], the order the wire views use
# ----------------------------------------------------------------------------------------------------------


def _logical(tensor: torch.Tensor, axes: tuple[str, ...]) -> torch.Tensor:
    """A shard or attention tensor laid out in `axes` as [(batch,) seq, head, dim]."""
    return tensor.permute(logical_order(axes, TENSOR_ORDER))


def _heads_by_peer(spec: UlyssesSpec, local: torch.Tensor, N: int) -> torch.Tensor:
    """A shard [(B,) S_local, H, D] in `spec.local` as [peer, (B,) S_local, H/N, D]: head p*H/N + h is peer p's h."""
    shard = _logical(local, spec.local)
    head = shard.dim() - 2
    return shard.unflatten(head, (N, shard.shape[head] // N)).movedim(head, 0)


def _rows_by_peer(spec: UlyssesSpec, attention: torch.Tensor, N: int) -> torch.Tensor:
    """An attention tensor [(B,) S, H/N, D] as [peer, (B,) S_local, H/N, D]: row s*S_local + i is peer s's i."""
    full = _logical(attention, spec.attention)
    seq = full.dim() - 3
    return full.unflatten(seq, (N, full.shape[seq] // N)).movedim(seq, 0)


def _check_tensors(bufs: UlyssesBuffers, tensors: Mapping[str, torch.Tensor], side: str, label: str) -> None:
    """The caller's tensors of `bufs`' direction on `side`: every name once, each of its shape and the buffers'
    dtype (the oracle copies bytes: a conversion would hide a wrong dtype the kernels refuse)."""
    names = [t.name for t in bufs.tensor_specs]
    if not isinstance(tensors, Mapping) or sorted(tensors) != sorted(names):
        names_given = sorted(tensors) if isinstance(tensors, Mapping) else type(tensors).__name__
        raise ValueError(f"{label} must map the tensors {names} of the {bufs.direction} direction, got {names_given}")
    for tensor_spec in bufs.tensor_specs:
        tensor = tensors[tensor_spec.name]
        expected = tensor_shape(bufs.spec, bufs.shape, tensor_spec, side)
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != expected or tensor.dtype != bufs.dtype:
            given = f"shape {tuple(tensor.shape)}, {tensor.dtype}" if isinstance(tensor, torch.Tensor) else type(tensor)
            raise ValueError(
                f"{label}[{tensor_spec.name!r}] must have shape {expected} ({', '.join(getattr(bufs.spec, side))}) "
                f"and dtype {bufs.dtype}, as the buffers; got {given}"
            )


def _check_buffers_list(send: object) -> list[UlyssesBuffers]:
    """`exchange`'s argument: one rank's buffers per peer, all of one spec, direction and shape."""
    if not isinstance(send, list | tuple) or not send or not all(isinstance(b, UlyssesBuffers) for b in send):
        raise TypeError(
            "exchange takes a list of every rank's send buffers (UlyssesBuffers, one per rank), got "
            + (
                (f"a {type(send).__name__} of other objects" if send else f"an empty {type(send).__name__}")
                if isinstance(send, list | tuple)
                else type(send).__name__
            )
        )
    first = send[0]
    for rank, bufs in enumerate(send):
        if (bufs.layout_hash, bufs.direction, bufs.shape) != (first.layout_hash, first.direction, first.shape):
            raise ValueError(
                f"exchange: rank {rank}'s buffers ({bufs!r}) differ from rank 0's ({first!r}); every rank sends "
                "buffers of one spec, direction and shape"
            )
    if len(send) != first.N:
        raise ValueError(f"{len(send)} ranks exchange buffers sized for N={first.N} peers: pass one per peer")
    return list(send)


# ----------------------------------------------------------------------------------------------------------
# The reference
# ----------------------------------------------------------------------------------------------------------


def scatter(tensors: Mapping[str, torch.Tensor], send: UlyssesBuffers) -> None:
    """Copy a rank's shards (in `spec.local`, any strides) into the bytes of its to_attention send buffers."""
    _check_tensors(send, tensors, "local", "tensors")
    for name, local in tensors.items():
        send.wire_view(name).copy_(_heads_by_peer(send.spec, local, send.N))


def scatter_out(tensors: Mapping[str, torch.Tensor], send: UlyssesBuffers) -> None:
    """Copy a rank's attention outputs (in `spec.attention`) into its from_attention send buffers."""
    _check_tensors(send, tensors, "attention", "tensors")
    for name, attention in tensors.items():
        send.wire_view(name).copy_(_rows_by_peer(send.spec, attention, send.N))


def exchange(send: list[UlyssesBuffers]) -> list[UlyssesBuffers]:
    """What an all-to-all over the peer axis delivers: rank r receives, at peer index p, what rank p sent
    to peer r.  The wire is dense, so this moves every byte, as a transport would."""
    send = _check_buffers_list(send)
    world = len(send)
    first = send[0]
    recv = [UlyssesBuffers(b.spec, b.direction, b.shape, {k: torch.empty_like(t) for k, t in b.tensors.items()})
            for b in send]  # fmt: skip
    for tensor in first.tensor_specs:
        for destination in range(world):
            received = recv[destination].wire_view(tensor.name)
            for source in range(world):
                received[source].copy_(send[source].wire_view(tensor.name)[destination])
    return recv


def _fill_tensors(
    spec: UlyssesSpec, recv: UlyssesBuffers, side: str, out: Mapping[str, torch.Tensor] | None
) -> dict[str, torch.Tensor]:
    if out is not None:
        _check_tensors(recv, out, side, "out")
    results = {}
    for tensor in recv.tensor_specs:
        if out is not None:
            results[tensor.name] = out[tensor.name]
        else:
            extents = tensor_shape(spec, recv.shape, tensor, side)
            results[tensor.name] = torch.empty(extents, dtype=recv.dtype, device=recv.device)
    return results


def gather(recv: UlyssesBuffers, out: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The to_attention receive buffers -> every tensor in `spec.attention` ([(B,) S, H/N, D] logically),
    written into `out` (any strides) when given."""
    results = _fill_tensors(recv.spec, recv, "attention", out)
    for name, attention in results.items():
        _rows_by_peer(recv.spec, attention, recv.N).copy_(recv.wire_view(name))
    return results


def gather_out(recv: UlyssesBuffers, out: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The from_attention receive buffers -> every tensor as a shard in `spec.local` ([(B,) S_local, H, D])."""
    results = _fill_tensors(recv.spec, recv, "local", out)
    for name, local in results.items():
        _heads_by_peer(recv.spec, local, recv.N).copy_(recv.wire_view(name))
    return results


# ----------------------------------------------------------------------------------------------------------
# The naive torch path, as engines write it
# ----------------------------------------------------------------------------------------------------------


def _permutation(source: tuple[str, ...], target: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(source.index(axis) for axis in target)


def _to_wire(
    spec: UlyssesSpec, direction: DirectionSpec, shape: Shape, grouped: dict[str, tuple[torch.Tensor, tuple[str, ...]]]
) -> dict[str, torch.Tensor]:
    """Per tensor, its elements as [peer, ...] in `grouped` (tensor, axis names) -> the send buffers."""
    axes = tuple(axis for axis in direction.wire if axis != "tensor")
    wires = {name: tensor.permute(_permutation(names, axes)).contiguous() for name, (tensor, names) in grouped.items()}
    if not direction.shared:
        return wires
    # One buffer: each tensor's block of the axes inside `tensor`, flattened, concatenated along that axis
    # (with `tensor` innermost a block is one element: a new last axis).
    outer = direction.wire.index("tensor")

    def block(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.flatten(outer) if outer < tensor.dim() else tensor.unsqueeze(outer)

    return {"wire": torch.cat([block(wires[t.name]) for t in direction.tensors], dim=outer)}


def _from_wire(
    spec: UlyssesSpec, direction: DirectionSpec, shape: Shape, received: Mapping[str, torch.Tensor]
) -> dict[str, tuple[torch.Tensor, tuple[str, ...]]]:
    """The receive buffers -> per tensor, its elements with the wire's axis names (the `tensor` axis split)."""
    axes = tuple(axis for axis in direction.wire if axis != "tensor")
    if not direction.shared:
        return {t.name: (received[t.name], axes) for t in direction.tensors}
    outer = direction.wire.index("tensor")
    blocks = [tensor_block(direction, shape, t) for t in direction.tensors]
    sizes = [int(torch.Size(extents).numel()) for _, extents in blocks]
    pieces = received["wire"].split(sizes, dim=outer)
    return {
        t.name: (piece.unflatten(outer, extents) if inner else piece.squeeze(outer), axes)
        for t, piece, (inner, extents) in zip(direction.tensors, pieces, blocks, strict=True)
    }


def naive_scatter(spec: UlyssesSpec, shape: Shape, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """DeepSpeed's pre-all2all step: each shard's head axis reshaped into (peer, head) and permuted into the
    wire order with `.contiguous()` (plus a `torch.cat` when the tensors share one buffer)."""
    direction = spec.to_attention
    grouped = {}
    for t in direction.tensors:
        local = tensors[t.name]
        head = spec.local.index("head")
        split = local.reshape(*local.shape[:head], shape.N, local.shape[head] // shape.N, *local.shape[head + 1 :])
        grouped[t.name] = (split, (*spec.local[:head], "peer", "head", *spec.local[head + 1 :]))
    return _to_wire(spec, direction, shape, grouped)


def naive_gather(spec: UlyssesSpec, shape: Shape, received: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """DeepSpeed's post-all2all step: the received chunks permuted into the attention order with the peer
    axis just outside seq, `.contiguous()`, and the (peer, seq) pair reshaped into one sequence axis."""
    results = {}
    seq = spec.attention.index("seq")
    target = (*spec.attention[:seq], "peer", "seq", *spec.attention[seq + 1 :])
    for name, (tensor, axes) in _from_wire(spec, spec.to_attention, shape, received).items():
        grouped = tensor.permute(_permutation(axes, target)).contiguous()
        results[name] = grouped.flatten(seq, seq + 1)
    return results


def naive_scatter_out(spec: UlyssesSpec, shape: Shape, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The post-attention step before the exchange: the sequence axis reshaped into (peer, seq), permuted
    into the wire order, `.contiguous()`."""
    grouped = {}
    seq = spec.attention.index("seq")
    for t in spec.from_attention.tensors:
        attention = tensors[t.name]
        split = attention.reshape(
            *attention.shape[:seq], shape.N, attention.shape[seq] // shape.N, *attention.shape[seq + 1 :]
        )
        grouped[t.name] = (split, (*spec.attention[:seq], "peer", "seq", *spec.attention[seq + 1 :]))
    return _to_wire(spec, spec.from_attention, shape, grouped)


def naive_gather_out(spec: UlyssesSpec, shape: Shape, received: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The received head blocks permuted into the shard's order with the peer axis just outside head,
    `.contiguous()`, and (peer, head) reshaped into one head axis."""
    results = {}
    head = spec.local.index("head")
    target = (*spec.local[:head], "peer", "head", *spec.local[head + 1 :])
    for name, (tensor, axes) in _from_wire(spec, spec.from_attention, shape, received).items():
        results[name] = tensor.permute(_permutation(axes, target)).contiguous().flatten(head, head + 1)
    return results


def naive_exchange(send: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """What one all_to_all_single per tensor delivers to the naive path's send tensors (peer outermost)."""
    world = len(send)
    return [
        {name: torch.stack([send[source][name][rank] for source in range(world)]) for name in send[rank]}
        for rank in range(world)
    ]
