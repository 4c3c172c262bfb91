"""What a DCP dispatcher caches per call key, and the helpers the custom ops share with it.

A `PackPlan` / `CombinePlan` is made once per (shapes, strides, dtypes, devices, config) key by
`layoutgen.dcp.pack_plan` / `layoutgen.dcp.combine_plan` and kept on the buffers object
(`layoutgen.runtime.plans`); `direct` replays the recorded kernel launch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from layoutgen.dcp.config import CombineConfig, PackConfig
from layoutgen.dcp.layout import LayoutBuffers, Shape, buffer_shapes, check_shape, wire_dtype
from layoutgen.dcp.spec import DcpSpec
from layoutgen.runtime.plans import remember, remembered
from layoutgen.runtime.tensors import OverlapGuard

#: CUDA's limit on a grid's y dimension, along which pack runs its batch blocks (the generated launcher
#: refuses a config that needs more).
MAX_GRID_Y = 65535
DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}

LaunchFunction = Callable[..., None]


@dataclass
class PackPlan:
    batch: int
    config: PackConfig
    index_64: bool
    # The overlap check of a call's inputs (out, lse or max and sum, empty) against the buffers pack writes, for
    # later calls: their geometry is in the plan key, their addresses are not.
    guard: OverlapGuard | None = None
    # Replays the recorded launch with a call's (out, lse, *buffers); None until recorded or when it can't be.
    direct: Callable[[tuple[Any, ...]], None] | None = None
    recorded: bool = False

    def may_overlap(self, inputs: tuple[torch.Tensor, ...]) -> bool:
        """Whether a call's inputs, in the planned order, may share memory with the buffers (then the call is
        validated again, which says so)."""
        return self.guard is not None and self.guard.may_overlap(inputs)


@dataclass
class CombinePlan:
    config: CombineConfig
    index_64: bool
    lse_base_2: bool
    out_shape: tuple[int, int, int]
    dtype: torch.dtype
    device: torch.device
    scale: float = 1.0
    # Whether the kernel writes a contiguous stage that is then copied into the caller's `out`, whose head or dim
    # offsets pass the kernel's 32 bits (`checks.wide_out_offsets`).
    staged: bool = False
    # The overlap check of a caller's `out` against the buffers combine reads, for later calls (its geometry is
    # in the plan key, its address is not); None for a combine that allocates its output.
    guard: OverlapGuard | None = None
    # The custom op's check of a caller's out_lse against out and the buffers, made the first time it gets one.
    lse_guard: OverlapGuard | None = None
    # Replays the recorded launch with a call's (*buffers, out, out_lse); None until recorded or when it can't be.
    direct: Callable[[tuple[Any, ...]], None] | None = None
    recorded: bool = False

    def may_overlap(self, out: torch.Tensor) -> bool:
        """Whether a caller's `out` of the planned geometry may share memory with the buffers (then the call is
        validated again, which says so)."""
        return self.guard is not None and self.guard.may_overlap((out,))


def remember_buffers(bufs: LayoutBuffers) -> LayoutBuffers:
    remember(bufs, bufs.tensors["payload"])
    return bufs


def buffers_from_tensors(
    spec: DcpSpec, tensors: list[torch.Tensor], N: int, B_max: int, H: int, D: int, dtype: torch.dtype
) -> LayoutBuffers:
    """The buffers object holding exactly `tensors` (alloc()'s, when it is alive), else a new one over them.

    `dtype` (the ops pass their `out`'s) is not matched against alloc()'s: a call with an `out` of another
    dtype then gets the buffers it was made for, whose checks name `out` as the tensor that is wrong.  New
    buffers take the payload's dtype where the wire carries the activations' own (then the checks name `out`
    there too, not the payload)."""
    if tensors:
        bufs = remembered(tensors[0])
        if (
            isinstance(bufs, LayoutBuffers)
            and bufs.layout_hash == spec.layout_hash()
            and (bufs.N, bufs.B_max, bufs.H, bufs.D) == (N, B_max, H, D)
            and len(bufs.tensors) == len(tensors)
            and all(mine is given for mine, given in zip(bufs.tensors.values(), tensors, strict=True))
        ):
            return bufs
    payload = tensors[0] if tensors else None
    if (
        isinstance(payload, torch.Tensor)
        and payload.dtype in DTYPE_NAMES
        and wire_dtype(spec, payload.dtype) == payload.dtype
    ):
        dtype = payload.dtype
    shape = Shape(N, B_max, H, D, dtype)
    check_shape(spec, shape)
    names = list(buffer_shapes(spec, shape))
    if len(tensors) != len(names):
        raise ValueError(f"buffers must be the {len(names)} tensors {names} of spec '{spec.name}'; got {len(tensors)}")
    return LayoutBuffers(spec, shape, dict(zip(names, tensors, strict=True)))


def fit_grid(config: PackConfig, batch: int, peers: int | None = None) -> PackConfig:
    """A pack config whose batch blocks fit the grid's y axis: past MAX_GRID_Y x block_batch rows (a batch
    no decode step reaches, but dispatch must not fail on it) the rows per program double until they fit.
    `peers`: N where the y axis walks (batch, peer) pairs (`pack_pairs_axis`), block_batch x block_peer of
    them per program."""
    rows, per_row_block = (batch, 1) if peers is None else (batch * peers, config.block_peer)
    block_batch = config.block_batch
    while -(-rows // (block_batch * per_row_block)) > MAX_GRID_Y:
        block_batch *= 2
    return config if block_batch == config.block_batch else dataclasses.replace(config, block_batch=block_batch)
