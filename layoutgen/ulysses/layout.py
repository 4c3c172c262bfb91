"""Geometry of a Ulysses spec at a concrete shape, and the buffers object.

`UlyssesBuffers` is what a generated module's `alloc` / `alloc_out` return and what the reference
scatters into: the wire buffer(s) of one direction, dense and C-contiguous in the spec's axis order,
plus `wire_view(name)`, the strided logical view `[peer, (batch,) seq, head, dim]` of one tensor's
elements.  Everything is derived from the spec alone, so the reference, the generated modules and the
byte maps agree on where each element lives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from layoutgen.runtime.tensors import as_int, positive_int
from layoutgen.ulysses.spec import DIRECTIONS, DirectionSpec, HeadCount, TensorSpec, UlyssesSpec

#: Dtypes the kernels move (the wire holds the tensors' own dtype, byte for byte).
DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)
DTYPE_NAMES: dict[torch.dtype, str] = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
#: Logical orders of the views: a shard or attention tensor, and a tensor's elements on the wire.
TENSOR_ORDER: tuple[str, ...] = ("batch", "seq", "head", "dim")
WIRE_ORDER: tuple[str, ...] = ("peer", "batch", "seq", "head", "dim")
#: Which direction each kernel works in.
KERNEL_DIRECTION: dict[str, str] = {
    "scatter": "to_attention",
    "gather": "to_attention",
    "scatter_out": "from_attention",
    "gather_out": "from_attention",
}


#: Which side each kernel reads and writes: a shard (`local`), the `wire`, or the `attention` side.
KERNEL_SIDES: dict[str, tuple[str, str]] = {
    "scatter": ("local", "wire"),
    "gather": ("wire", "attention"),
    "scatter_out": ("attention", "wire"),
    "gather_out": ("wire", "local"),
}
#: The axis of a user side that the peer index splits: a shard's head (peer p's block of heads), an
#: attention tensor's seq (peer p's rows).
SPLIT_AXIS: dict[str, str] = {"local": "head", "attention": "seq"}


def global_heads(spec: UlyssesSpec, kernel: str) -> bool:
    """Whether a kernel's boxes take `peer` and `head` as one axis of the shard's heads (head g is head
    g % (H / N) of peer g // (H / N)): a kernel between a shard and a wire that holds `head` right inside
    `peer`, where `head` is either side's innermost axis.

    Both sides then hold a peer's heads right after the previous peer's, so the pair is one run of H heads
    on both.  As two axes, a box of them stored runs of H / N heads: a gather_out from wire [peer, head, dim,
    seq] to local [seq, dim, head] at 48% of a copy on the H200 with its default box, 77% with the best (16
    bytes per run at N 4, H 32, bf16), 91-95% as one run of heads (`benchmarks/probe_ulysses_pairs.py`).
    Where `head` is innermost on neither side the runs lie along dim and the split costs nothing (yunchang's
    gather_out from wire [peer, head, seq, batch, dim]: 97% of a copy), so those kernels keep both axes."""
    if "local" not in KERNEL_SIDES[kernel]:
        return False
    wire = spec.direction(KERNEL_DIRECTION[kernel]).wire
    position = wire.index("peer")
    if position + 1 == len(wire) or wire[position + 1] != "head":
        return False
    return spec.local[-1] == "head" or [axis for axis in wire if axis != "tensor"][-1] == "head"


def side_axes(spec: UlyssesSpec, kernel: str, side: str) -> list[str]:
    """The axes of one side of a kernel (`side` "local", "attention" or "wire"), outer to inner, a user
    side's split axis preceded by `peer` (the peer index is the outer part of it), the wire's `tensor` left
    out (each tensor is copied on its own).  Where the kernel takes global heads (`global_heads`), neither
    side has `peer`: its `head` counts the shard's heads."""
    merged = global_heads(spec, kernel)
    if side == "wire":
        wire = spec.direction(KERNEL_DIRECTION[kernel]).wire
        return [axis for axis in wire if axis != "tensor" and not (merged and axis == "peer")]
    split = SPLIT_AXIS[side]
    axes: list[str] = []
    for axis in spec.local if side == "local" else spec.attention:
        axes += ["peer", axis] if axis == split and not (merged and side == "local") else [axis]
    return axes


def tile_axes(spec: UlyssesSpec, kernel: str) -> list[str]:
    """The axes of a kernel's boxes: its destination's (see `side_axes`)."""
    return side_axes(spec, kernel, KERNEL_SIDES[kernel][1])


def contiguous_axes(spec: UlyssesSpec, kernel: str, side: str) -> list[str]:
    """The axes of one side of a kernel (`side` "local", "attention" or "wire") along which its elements can
    lie contiguously, outer to inner: a dense user side's every axis (see `side_axes`: a shard's heads of all
    peers follow one another, so local [..., head] is contiguous along peer x head), a wire's every axis but
    those outside a shared wire's `tensor` (each tensor's elements lie apart by the other tensors' blocks)."""
    axes = side_axes(spec, kernel, side)
    direction = spec.direction(KERNEL_DIRECTION[kernel])
    if side == "wire" and direction.shared:
        inside = direction.wire[direction.wire.index("tensor") + 1 :]
        return [axis for axis in axes if axis in inside]
    return axes


@dataclass(frozen=True)
class Shape:
    """The problem buffers are sized for: N ranks, S_local rows per shard, H and H_kv heads of D elements,
    B sequences (1 when the spec has no batch axis)."""

    N: int
    S_local: int
    H: int
    H_kv: int
    D: int
    dtype: torch.dtype
    B: int = 1

    @classmethod
    def of(cls, *, N: Any, S_local: Any, H: Any, H_kv: Any, D: Any, dtype: torch.dtype, B: Any = 1) -> Shape:
        """A shape from a caller's sizes: NumPy integers as ints (anything else stays for check_shape)."""
        sizes = {"N": N, "S_local": S_local, "H": H, "H_kv": H_kv, "D": D, "B": B}
        return cls(dtype=dtype, **{name: as_int(value) for name, value in sizes.items()})

    def heads(self, count: HeadCount) -> int:
        return self.H if count is HeadCount.H else self.H_kv

    def heads_per_peer(self, count: HeadCount) -> int:
        return self.heads(count) // self.N

    @property
    def S(self) -> int:
        """The whole sequence: every rank's shard, rank s holding rows s * S_local ... (s + 1) * S_local - 1."""
        return self.N * self.S_local


def key_extents(spec: UlyssesSpec, kernel: str, shape: Shape) -> dict[str, int]:
    """A kernel's tuning-key extents: N, the heads per peer of H- and H_kv-headed tensors (Hl_kv = Hl when
    the kernel moves no H_kv-headed tensor: its code does not depend on H_kv), D."""
    tensors = spec.direction(KERNEL_DIRECTION[kernel]).tensors
    kv = any(t.heads is HeadCount.H_KV for t in tensors)
    heads_per_peer = shape.H // shape.N
    return {"N": shape.N, "Hl": heads_per_peer, "Hl_kv": shape.H_kv // shape.N if kv else heads_per_peer, "D": shape.D}


def check_shape(spec: UlyssesSpec, shape: Shape) -> None:
    """Raise ValueError/TypeError naming the argument when `shape` cannot be laid out by `spec`."""
    for label in ("N", "S_local", "H", "H_kv", "D", "B"):
        positive_int(label, getattr(shape, label))
    for count in (HeadCount.H, HeadCount.H_KV):  # not `in HeadCount`: torch 2.11's dynamo cannot iterate an enum
        if spec.uses(count) and shape.heads(count) % shape.N:
            raise ValueError(
                f"{count.value} (heads) must be divisible by N (ranks): {count.value}={shape.heads(count)}, "
                f"N={shape.N}; every rank gets {count.value}/N heads"
            )
    if not spec.has_batch and shape.B != 1:
        raise ValueError(f"spec '{spec.name}' has no batch axis; B must be 1, got {shape.B}")
    if shape.dtype not in DTYPES:
        raise TypeError(f"dtype must be one of {[str(d) for d in DTYPES]}, got {shape.dtype}")


def _extents(shape: Shape, tensor: TensorSpec, side: str) -> dict[str, int]:
    """Axis -> extent of one tensor on one side: `local` (a shard), `attention`, or `wire` (one peer's view)."""
    heads = shape.heads(tensor.heads)
    if side == "local":
        return {"batch": shape.B, "seq": shape.S_local, "head": heads, "dim": shape.D}
    if side == "attention":
        return {"batch": shape.B, "seq": shape.S, "head": heads // shape.N, "dim": shape.D}
    return {"peer": shape.N, "batch": shape.B, "seq": shape.S_local, "head": heads // shape.N, "dim": shape.D}


def tensor_shape(spec: UlyssesSpec, shape: Shape, tensor: TensorSpec, side: str) -> tuple[int, ...]:
    """A shard's (`local`) or attention tensor's (`attention`) shape, in the spec's axis order."""
    axes = spec.local if side == "local" else spec.attention
    extents = _extents(shape, tensor, side)
    return tuple(extents[axis] for axis in axes)


def logical_order(axes: tuple[str, ...], logical: tuple[str, ...]) -> list[int]:
    """The permutation that turns a tensor laid out in `axes` into the logical order (absent axes skipped)."""
    return [axes.index(axis) for axis in logical if axis in axes]


@dataclass(frozen=True)
class WireBuffer:
    """One wire buffer: its axes (outer to inner; a shared buffer ends in `tensor`, the concatenation of
    every tensor's block of the axes inside it) and extents."""

    name: str
    axes: tuple[str, ...]
    extents: tuple[int, ...]


def tensor_block(direction: DirectionSpec, shape: Shape, tensor: TensorSpec) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Axes and extents of one tensor's block inside a shared buffer's `tensor` axis."""
    inner = direction.wire[direction.wire.index("tensor") + 1 :]
    extents = _extents(shape, tensor, "wire")
    return inner, tuple(extents[axis] for axis in inner)


def wire_buffers(spec: UlyssesSpec, direction_name: str, shape: Shape) -> list[WireBuffer]:
    """The wire buffers of one direction at `shape`: one per tensor, or one shared `wire` buffer."""
    direction = spec.direction(direction_name)
    if not direction.shared:
        buffers = []
        for tensor in direction.tensors:
            extents = _extents(shape, tensor, "wire")
            buffers.append(WireBuffer(tensor.name, direction.wire, tuple(extents[a] for a in direction.wire)))
        return buffers
    position = direction.wire.index("tensor")
    outer = direction.wire[:position]
    first = _extents(shape, direction.tensors[0], "wire")  # the axes outside `tensor` are the same for all
    concatenated = sum(math.prod(tensor_block(direction, shape, t)[1]) for t in direction.tensors)
    return [WireBuffer("wire", (*outer, "tensor"), (*(first[a] for a in outer), concatenated))]


class UlyssesBuffers:
    """Dense wire buffers of one direction at one shape (send side or receive side: the same layout)."""

    def __init__(self, spec: UlyssesSpec, direction: str, shape: Shape, tensors: dict[str, torch.Tensor]) -> None:
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {list(DIRECTIONS)}, got {direction!r}")
        self.spec = spec
        self.direction = direction
        self.shape = shape
        # In the direction's order, whatever order a dict built by hand has: the custom ops take the buffers as
        # a list and name them by position (a {k, q, v} dict wrote k's bytes into q's buffer under compile).
        order = [tensor.name for tensor in spec.direction(direction).tensors]
        if isinstance(tensors, dict) and sorted(tensors) == sorted(order) and list(tensors) != order:
            tensors = {name: tensors[name] for name in order}
        self.tensors = tensors
        self.spec_name = spec.name
        self.layout_hash = spec.layout_hash()

    @classmethod
    def allocate(
        cls, spec: UlyssesSpec, direction: str, shape: Shape, device: torch.device | str | None = None
    ) -> UlyssesBuffers:
        check_shape(spec, shape)
        tensors = {
            buffer.name: torch.empty(buffer.extents, dtype=shape.dtype, device=device)
            for buffer in wire_buffers(spec, direction, shape)
        }
        return cls(spec, direction, shape, tensors)

    N = property(lambda self: self.shape.N)
    S_local = property(lambda self: self.shape.S_local)
    B = property(lambda self: self.shape.B)
    H = property(lambda self: self.shape.H)
    H_kv = property(lambda self: self.shape.H_kv)
    D = property(lambda self: self.shape.D)
    dtype = property(lambda self: self.shape.dtype)

    @property
    def device(self) -> torch.device:
        return next(iter(self.tensors.values())).device

    @property
    def tensor_specs(self) -> tuple[TensorSpec, ...]:
        return self.spec.direction(self.direction).tensors

    def wire_view(self, name: str) -> torch.Tensor:
        """[peer, (batch,) seq, head, dim] strided view of tensor `name`'s elements on the wire."""
        direction = self.spec.direction(self.direction)
        tensor = next((t for t in direction.tensors if t.name == name), None)
        if tensor is None:
            raise ValueError(f"direction {self.direction} moves {[t.name for t in direction.tensors]}, not {name!r}")
        if not direction.shared:
            return self.tensors[name].permute(logical_order(direction.wire, WIRE_ORDER))
        wire = self.tensors["wire"]
        offset = 0
        for other in direction.tensors:
            if other.name == name:
                break
            offset += math.prod(tensor_block(direction, self.shape, other)[1])
        inner, extents = tensor_block(direction, self.shape, tensor)
        block = wire.narrow(-1, offset, math.prod(extents)).unflatten(-1, extents) if inner else wire[..., offset]
        axes = tuple(axis for axis in direction.wire if axis != "tensor")
        return block.permute(logical_order(axes, WIRE_ORDER))

    def __repr__(self) -> str:
        shapes = ", ".join(f"{name}={tuple(t.shape)}" for name, t in self.tensors.items())
        batch = f", B={self.B}" if self.spec.has_batch else ""
        return (
            f"UlyssesBuffers(spec={self.spec_name!r}, {self.direction}, N={self.N}, S_local={self.S_local}{batch}, "
            f"H={self.H}, H_kv={self.H_kv}, D={self.D}, dtype={self.dtype}, {shapes})"
        )


def user_views(bufs: UlyssesBuffers, side: str) -> tuple[torch.Tensor, ...]:
    """The direction's tensors laid out as `side` wants them (`local` or `attention`: dense, in the spec's axis
    order), as views of the wire buffers' memory, in the direction's order; ValueError naming the tensor
    when the wire does not hold them in that order at this shape (then the kernel has to copy).

    Where they are (e.g. DeepSpeed's seq-first wire, whose received chunks are the attention tensor
    [S, B, H/N, D] already), attention can read the receive buffers in place of gather, and write its output
    into the send buffers in place of scatter_out."""
    if side not in SPLIT_AXIS:
        raise ValueError(f"side must be 'local' or 'attention', got {side!r}")
    spec = bufs.spec
    axes = spec.local if side == "local" else spec.attention
    split = SPLIT_AXIS[side]
    expanded: list[str] = []
    for axis in axes:
        expanded += ["peer", axis] if axis == split else [axis]
    logical = tuple(axis for axis in WIRE_ORDER if axis in expanded)
    views = []
    for tensor in bufs.tensor_specs:
        grouped = bufs.wire_view(tensor.name).permute([logical.index(axis) for axis in expanded])
        at = expanded.index("peer")
        shape = tensor_shape(spec, bufs.shape, tensor, side)
        try:
            view = grouped.view(shape)
        except RuntimeError:
            view = None
        if view is None or not view.is_contiguous():
            raise ValueError(
                f"{tensor.name} in the {side} layout [{', '.join(axes)}] is not held by the wire "
                f"[{', '.join(spec.direction(bufs.direction).wire)}] at this shape (its elements are in another "
                f"order there, or its peer and {expanded[at + 1]} axes are apart); use the kernel, which copies"
            )
        views.append(view)
    return tuple(views)
