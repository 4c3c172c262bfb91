"""Argument checks of the Ulysses kernels: run once per plan key, never on the cached path.

Every error names the argument, what was expected (shape in the spec's axis order, dtype, device) and
what was given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from layoutgen.runtime.tensors import check_plain, describe, overlap, overlap_relation, overlaps_itself, shares_memory
from layoutgen.ulysses.layout import (
    KERNEL_DIRECTION,
    KERNEL_SIDES,
    Shape,
    UlyssesBuffers,
    check_shape,
    tensor_shape,
    wire_buffers,
)
from layoutgen.ulysses.spec import UlyssesSpec

_ALLOCATOR = {"to_attention": "alloc()", "from_attention": "alloc_out()"}
_KERNELS = {"to_attention": "scatter / gather", "from_attention": "scatter_out / gather_out"}


def describe_values(values: Any) -> str:
    """What a caller passed for a sequence of tensors: its type and length, each item's shape, strides, dtype
    and device (never the values, which a repr would print)."""
    if not isinstance(values, tuple | list):
        return type(values).__name__
    items = [describe(v) if isinstance(v, torch.Tensor) else type(v).__name__ for v in values]
    return f"a {type(values).__name__} of {len(values)}" + (f": [{'; '.join(items)}]" if items else "")


def check_buffers(spec: UlyssesSpec, bufs: Any, direction: str, label: str = "bufs") -> UlyssesBuffers:
    """`bufs` must come from this spec's `alloc` (to_attention) or `alloc_out` (from_attention), or be built
    alike: a shape the spec can lay out (as `alloc` checks it) and dense tensors of its shapes on one device."""
    if not isinstance(bufs, UlyssesBuffers):
        raise TypeError(
            f"{label} must be the buffers object returned by {_ALLOCATOR[direction]}, got {type(bufs).__name__}"
        )
    if bufs.layout_hash != spec.layout_hash():
        raise ValueError(
            f"{label} were allocated for spec '{bufs.spec_name}', not '{spec.name}'; allocate them with this "
            f"module's {_ALLOCATOR[direction]}"
        )
    if bufs.direction != direction:
        raise ValueError(
            f"{label} hold the {bufs.direction} wire (from {_ALLOCATOR[bufs.direction]}, for "
            f"{_KERNELS[bufs.direction]}); {_KERNELS[direction]} take the buffers of {_ALLOCATOR[direction]}"
        )
    if not isinstance(bufs.shape, Shape):
        raise TypeError(f"{label}.shape must be a layoutgen.ulysses.layout.Shape, got {type(bufs.shape).__name__}")
    try:  # a UlyssesBuffers built directly skips alloc()'s check; heads that do not split would be dropped
        check_shape(spec, bufs.shape)
    except (TypeError, ValueError) as error:
        raise type(error)(
            f"{label} are sized for a shape spec '{spec.name}' cannot lay out ({error}); build them with "
            f"{_ALLOCATOR[direction]}, which checks the shape"
        ) from None
    expected = wire_buffers(spec, direction, bufs.shape)
    if sorted(bufs.tensors) != sorted(b.name for b in expected):
        raise ValueError(f"{label}.tensors must hold {sorted(b.name for b in expected)}, got {sorted(bufs.tensors)}")
    first = next(iter(bufs.tensors.values()))
    device = first.device if isinstance(first, torch.Tensor) else None  # a non-tensor is refused below
    for buffer in expected:
        got = bufs.tensors[buffer.name]
        if (
            not isinstance(got, torch.Tensor)
            or tuple(got.shape) != buffer.extents
            or got.dtype != bufs.dtype
            or not got.is_contiguous()
            or got.device != device
        ):
            raise ValueError(
                f"{label}.tensors[{buffer.name!r}] must be a contiguous {bufs.dtype} tensor of shape "
                f"{buffer.extents}{'' if device is None else f' on {device}'}; got "
                + (describe(got) if isinstance(got, torch.Tensor) else type(got).__name__)
            )
    # Addresses are not known while torch.compile traces; the custom op checks its buffers again when it runs.
    names = [] if torch.compiler.is_compiling() else list(bufs.tensors)
    for position, name in enumerate(names):
        for other in names[position + 1 :]:
            if overlap(bufs.tensors[name], bufs.tensors[other]):
                raise ValueError(
                    f"{label}.tensors[{name!r}] and {label}.tensors[{other!r}] share memory, so one kernel's writes "
                    f"would overwrite the other's: give each buffer its own memory (e.g. {_ALLOCATOR[direction]}); "
                    f"got {describe(bufs.tensors[name])} and {describe(bufs.tensors[other])}"
                )
    return bufs


def _check_tensor(kernel: str, label: str, tensor: Any, expected: tuple[int, ...], axes: Sequence[str],
                  bufs: UlyssesBuffers) -> None:  # fmt: skip
    layout = f"[{', '.join(f'{axis}={extent}' for axis, extent in zip(axes, expected, strict=True))}]"
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"{kernel}: {label} must be a torch.Tensor {layout} of {bufs.dtype}, got {type(tensor).__name__}"
        )
    check_plain(label, tensor, f"{kernel}: ")
    if tuple(tensor.shape) != expected:
        raise ValueError(f"{kernel}: {label} must have shape {layout} (the buffers' shape); got {describe(tensor)}")
    if tensor.dtype != bufs.dtype:
        raise TypeError(f"{kernel}: {label} must be {bufs.dtype} (the buffers' dtype); got {describe(tensor)}")
    if tensor.device != bufs.device:
        raise ValueError(f"{kernel}: {label} must be on {bufs.device} (the buffers' device); got {describe(tensor)}")
    if expected[-1] > 1 and tensor.stride(-1) != 1:
        raise ValueError(
            f"{kernel}: {label} must have stride 1 along its last axis ({axes[-1]}), any other strides; "
            f"got {describe(tensor)}. Pass a view with a unit last stride, e.g. .contiguous()"
        )
    for name, buffer in bufs.tensors.items():
        if overlap(tensor, buffer):
            raise ValueError(
                f"{kernel}: {label} {overlap_relation(tensor, buffer)} bufs.tensors[{name!r}] ({describe(buffer)}); got "
                f"{describe(tensor)}. Pass separate tensors"
            )


def _side(spec: UlyssesSpec, kernel: str, side: str) -> tuple[str, ...]:
    return spec.local if side == "local" else spec.attention


def check_sources(spec: UlyssesSpec, kernel: str, tensors: Any, bufs: Any) -> UlyssesBuffers:
    """scatter / scatter_out: one tensor per name of the direction, in the spec's axis order, any strides
    with the last one 1, the buffers' dtype and device, not overlapping the buffers they write."""
    direction = KERNEL_DIRECTION[kernel]
    bufs = check_buffers(spec, bufs, direction)
    side = KERNEL_SIDES[kernel][0]
    names = [t.name for t in bufs.tensor_specs]
    if not isinstance(tensors, tuple) or len(tensors) != len(names):
        raise TypeError(f"{kernel} takes {len(names)} tensor(s) {names}, in this order; got {describe_values(tensors)}")
    for tensor_spec, tensor in zip(bufs.tensor_specs, tensors, strict=True):
        expected = tensor_shape(spec, bufs.shape, tensor_spec, side)
        _check_tensor(kernel, tensor_spec.name, tensor, expected, _side(spec, kernel, side), bufs)
    return bufs


def check_destinations(spec: UlyssesSpec, kernel: str, bufs: Any, out: Any) -> UlyssesBuffers:
    """gather / gather_out: the buffers, and `out` (None, or one tensor per name of the direction, any
    strides with the last one 1, overlapping neither itself, nor another, nor the buffers)."""
    direction = KERNEL_DIRECTION[kernel]
    bufs = check_buffers(spec, bufs, direction)
    if out is None:
        return bufs
    side = KERNEL_SIDES[kernel][1]
    names = [t.name for t in bufs.tensor_specs]
    single = len(names) == 1
    if not isinstance(out, tuple | list) or len(out) != len(names):
        wanted = "a tensor" if single else f"a tuple of {len(names)} tensors ({', '.join(names)})"
        raise TypeError(f"{kernel}: out must be None or {wanted}, got {describe_values(out)}")
    for position, (tensor_spec, tensor) in enumerate(zip(bufs.tensor_specs, out, strict=True)):
        label = "out" if single else f"out[{position}] ({tensor_spec.name})"
        expected = tensor_shape(spec, bufs.shape, tensor_spec, side)
        _check_tensor(kernel, label, tensor, expected, _side(spec, kernel, side), bufs)
        if overlaps_itself(tensor):
            raise ValueError(
                f"{kernel}: {label} must not overlap itself (e.g. an expand()ed view: programs would race to "
                f"write one element); got {describe(tensor)}"
            )
        for earlier, other in enumerate(out[:position]):
            if overlap(tensor, other):
                other_label = f"out[{earlier}] ({bufs.tensor_specs[earlier].name})"
                if shares_memory(tensor, other):
                    problem = f"must not share memory; {label} does, with {other_label}"
                else:
                    problem = f"must not overlap; {label} {overlap_relation(tensor, other)} {other_label}"
                raise ValueError(
                    f"{kernel}: the tensors of out {problem} ({describe(tensor)}; {describe(other)}). Pass "
                    "separate tensors, or disjoint slices of one"
                )
    return bufs
