"""The Ulysses kernels' launch configs and their heuristic default.

All four kernels copy boxes ("tiles") of the logical axes peer x batch x seq x head x dim, in the
destination's axis order; a config gives the box's extent along each axis.  The default takes a run of
128 bytes along each side's contiguous axes, so that loads and stores both move whole lines, then widens
the box outward from the destination's innermost axis until it holds about 8 KiB.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from layoutgen.config import MAX_TILE_ELEMENTS, LaunchConfig, grow_box, next_pow2
from layoutgen.ulysses.layout import (
    KERNEL_DIRECTION,
    KERNEL_SIDES,
    Shape,
    contiguous_axes,
    global_heads,
    tile_axes,
)
from layoutgen.ulysses.spec import UlyssesSpec

#: Bytes one program moves by default: 4 warps, each thread four 16-byte vectors.
DEFAULT_TILE_BYTES = 8192
#: The run a default box takes along each side's contiguous axes: 128 bytes, one full line per access, on the
#: source and on the destination.  Grown from the destination's innermost axis alone, a transposing box was
#: one element wide along the source: the random specs of `bench_unseen_specs.py` whose innermost axis moves
#: copied at 12-66% of the ceiling on the H200, 42-95% with a run along the source (notes_H200.md, eighth
#: pass).  Taken along the source only where the innermost axis moved, a box whose two sides share a short
#: one (8 heads, 16 bytes) read 16 bytes per line: 50% of the ceiling, 86% with both runs (twelfth pass).
RUN_BYTES = 128
#: CUDA's grid limits: x, then y (the kernels put the axes outside seq along y).
MAX_GRID_X = 2**31 - 1
MAX_GRID_Y = 65535


@dataclass(frozen=True)
class TileConfig(LaunchConfig):
    """A box of peer x batch x seq x head x dim (batch is 1 in specs without a batch axis)."""

    block_peer: int = 1
    block_batch: int = 1
    block_seq: int = 1
    block_head: int = 1
    block_dim: int = 1
    num_warps: int = 4
    num_stages: int = 1


@dataclass(frozen=True)
class ScatterConfig(TileConfig):
    kernel: ClassVar[str] = "scatter"


@dataclass(frozen=True)
class GatherConfig(TileConfig):
    kernel: ClassVar[str] = "gather"


@dataclass(frozen=True)
class ScatterOutConfig(TileConfig):
    kernel: ClassVar[str] = "scatter_out"


@dataclass(frozen=True)
class GatherOutConfig(TileConfig):
    kernel: ClassVar[str] = "gather_out"


CONFIG_TYPES: dict[str, type[TileConfig]] = {
    "scatter": ScatterConfig,
    "gather": GatherConfig,
    "scatter_out": ScatterOutConfig,
    "gather_out": GatherOutConfig,
}


def _warps_for(tile_bytes: int) -> int:
    # One 16-byte vector per thread per pass, four passes: a warp moves 2 KiB; more warps only for bigger tiles.
    return max(1, min(16, tile_bytes // 2048))


def run_floors(order: Sequence[str], extents: Mapping[str, int], run: int) -> dict[str, int]:
    """Blocks along a side's contiguous axes (`order`, outer to inner) that cover `run` contiguous elements,
    or as many as the extents give: an axis taken whole passes what is left of the run to the next one out;
    an axis taken in part, or padded to a power of two, ends it (past it the box is not contiguous)."""
    floors: dict[str, int] = {}
    for axis in reversed(order):
        if run <= 1:
            break
        floors[axis] = min(next_pow2(extents[axis]), run)
        if floors[axis] != extents[axis]:
            break
        run //= floors[axis]
    return floors


def default_config(
    kernel: str,
    tile_axes: Sequence[str],
    extents: Mapping[str, int],
    elem_size: int,
    source_axes: Sequence[str] = (),
    destination_axes: Sequence[str] | None = None,
    run_bytes: int = RUN_BYTES,
    tile_bytes: int = DEFAULT_TILE_BYTES,
) -> TileConfig:
    """A box of about `tile_bytes` that moves runs of `run_bytes` on both sides.

    `tile_axes` is the destination's order (outer to inner), `extents` each axis's extent (seq: S_local).
    `source_axes` and `destination_axes` are the axes each side is contiguous along (outer to inner; see
    `layout.contiguous_axes`; the destination's default to `tile_axes`).  The box first takes `run_bytes`
    along each side's contiguous axes, then grows from the destination's innermost axis outward until it
    holds `tile_bytes` (in a transpose Triton converts the tile between the two orders through shared memory).
    """
    run = max(1, run_bytes // elem_size)
    floors = run_floors(source_axes, extents, run)
    for axis, block in run_floors(tile_axes if destination_axes is None else destination_axes, extents, run).items():
        floors[axis] = max(block, floors.get(axis, 1))
    grown = grow_box(tile_axes, extents, max(1, tile_bytes // elem_size), floors)
    blocks = {axis: grown.get(axis, 1) for axis in ("peer", "batch", "seq", "head", "dim")}
    moved = elem_size * blocks["peer"] * blocks["batch"] * blocks["seq"] * blocks["head"] * blocks["dim"]
    return CONFIG_TYPES[kernel](
        **{f"block_{axis}": block for axis, block in blocks.items()}, num_warps=_warps_for(moved)
    )


def program_counts(config: TileConfig, tile_axes: Sequence[str], extents: Mapping[str, int]) -> tuple[int, int]:
    """(programs along x, along y) of one tensor: x = seq blocks x the blocks of the axes inside seq, y =
    the blocks of the axes outside seq (the generated launchers' grid, per tensor)."""
    seq = list(tile_axes).index("seq")
    x = y = 1
    for position, axis in enumerate(tile_axes):
        blocks = -(-extents[axis] // getattr(config, f"block_{axis}"))
        if position < seq:
            y *= blocks
        else:
            x *= blocks
    return x, y


def fit_grid(config: TileConfig, tile_axes: Sequence[str], extents: Mapping[str, int], tensors: int) -> TileConfig:
    """A config whose grid fits CUDA's limits for `tensors` tensors of these extents: the blocks of the axes
    outside seq (grid y), then seq's (grid x), double until it does.  Only shapes far beyond any model's
    reach get here; dispatch must not fail on them."""
    seq = list(tile_axes).index("seq")
    outer = list(tile_axes[:seq])
    # A block grows only while the tile stays within MAX_TILE_ELEMENTS (the config's own limit); a shape that
    # still needs more programs meets the launcher's grid error, which names the shape.
    room = config.tile_elements * 2 <= MAX_TILE_ELEMENTS
    while room:
        x, y = program_counts(config, tile_axes, extents)
        if y * tensors > MAX_GRID_Y and outer:
            growable = [a for a in outer if getattr(config, f"block_{a}") < next_pow2(extents[a])]
            if not growable:
                return config
            axis = growable[-1]
            config = dataclasses.replace(config, **{f"block_{axis}": 2 * getattr(config, f"block_{axis}")})
        elif x * tensors > MAX_GRID_X and config.block_seq < next_pow2(extents["seq"]):
            config = dataclasses.replace(config, block_seq=2 * config.block_seq)
        else:
            return config
        room = config.tile_elements * 2 <= MAX_TILE_ELEMENTS
    return config


def box_extents(spec: UlyssesSpec, kernel: str, shape: Shape) -> dict[str, int]:
    """Each box axis's extent at a live shape (head: the most heads per peer of the kernel's tensors; where
    the boxes take global heads, `layout.global_heads`, the most heads of a shard, and peer 1)."""
    tensors = spec.direction(KERNEL_DIRECTION[kernel]).tensors
    heads = max(shape.heads_per_peer(t.heads) for t in tensors)
    if global_heads(spec, kernel):
        return {"peer": 1, "batch": shape.B, "seq": shape.S_local, "head": shape.N * heads, "dim": shape.D}
    return {"peer": shape.N, "batch": shape.B, "seq": shape.S_local, "head": heads, "dim": shape.D}


def runtime_default(spec: UlyssesSpec, kernel: str, shape: Shape) -> TileConfig:
    """The heuristic config of a kernel at a live shape, fitted to the grid (what `config=None` falls back to,
    and the tuner's first candidate)."""
    extents = box_extents(spec, kernel, shape)
    axes = tile_axes(spec, kernel)
    source, destination = KERNEL_SIDES[kernel]
    config = default_config(
        kernel,
        axes,
        extents,
        shape.dtype.itemsize,
        contiguous_axes(spec, kernel, source),
        contiguous_axes(spec, kernel, destination),
    )
    return fit_to_shape(spec, kernel, shape, config)


def fit_to_shape(spec: UlyssesSpec, kernel: str, shape: Shape, config: TileConfig) -> TileConfig:
    """`config` fitted to the grid at a live shape: a default, or a tuned or forced config chosen at another
    batch (the tuner times B = 1; B x S_local is what the grid walks)."""
    tensors = spec.direction(KERNEL_DIRECTION[kernel]).tensors
    return fit_grid(config, tile_axes(spec, kernel), box_extents(spec, kernel, shape), len(tensors))
