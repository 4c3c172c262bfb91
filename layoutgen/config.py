"""Launch configurations of the generated kernels and their heuristic defaults.

A config holds only what the generated kernels take as block sizes and launch
options; everything the spec knows is baked into the kernel.  Configs are
frozen and hashable so that the runtime can cache decisions keyed by them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from layoutgen.spec import LayoutSpec

WARPS = (1, 2, 4, 8, 16, 32)
MAX_TILE_ELEMENTS = 1 << 16  # keeps a tile's registers within one SM's budget at 32 warps

KernelConfigT = TypeVar("KernelConfigT", bound="KernelConfig")


def _is_pow2(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def next_pow2(value: int) -> int:
    return 1 << max(0, (int(value) - 1).bit_length())


@dataclass(frozen=True)
class KernelConfig:
    kernel: ClassVar[str]
    block_batch: int
    block_head: int
    block_dim: int
    num_warps: int = 4
    num_stages: int = 1

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{self.kernel} config field {field.name} must be an int, got {value!r}")
            if field.name.startswith("block_") and not _is_pow2(value):
                raise ValueError(f"{self.kernel} config {field.name} must be a power of two, got {value}")
        if self.num_warps not in WARPS:
            raise ValueError(f"{self.kernel} config num_warps must be one of {WARPS}, got {self.num_warps}")
        if not 1 <= self.num_stages <= 8:
            raise ValueError(f"{self.kernel} config num_stages must be in [1, 8], got {self.num_stages}")
        if self.tile_elements > MAX_TILE_ELEMENTS:
            raise ValueError(
                f"{self.kernel} config tile of {self.tile_elements} elements exceeds {MAX_TILE_ELEMENTS}; "
                "use smaller blocks"
            )

    @property
    def tile_elements(self) -> int:
        size = 1
        for field in dataclasses.fields(self):
            if field.name.startswith("block_"):
                size *= getattr(self, field.name)
        return size

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[KernelConfigT], data: dict[str, Any]) -> KernelConfigT:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"{cls.kernel} config has unknown keys {sorted(unknown)}; known: {sorted(names)}")
        return cls(**data)

    def __str__(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)


@dataclass(frozen=True)
class PackConfig(KernelConfig):
    kernel: ClassVar[str] = "pack"
    block_peer: int = 1


@dataclass(frozen=True)
class CombineConfig(KernelConfig):
    kernel: ClassVar[str] = "combine"


CONFIG_TYPES: dict[str, type[KernelConfig]] = {"pack": PackConfig, "combine": CombineConfig}


def _warps_for(tile_elements: int, elem_size: int) -> int:
    # One 16-byte access per thread per pass: 4 warps move 2 KiB; more warps only help big tiles.
    tile_bytes = tile_elements * elem_size
    return max(1, min(16, tile_bytes // 2048)) if tile_bytes >= 2048 else 1


def default_pack_config(spec: LayoutSpec, N: int, heads_per_peer: int, D: int, B: int, elem_size: int) -> PackConfig:
    """A safe, reasonably fast starting point; the tuner replaces it per shape."""
    innermost = spec.payload.axes[-1]
    block_dim = min(next_pow2(D), 1024)
    if innermost == "batch":
        # Stores coalesce along batch: give the tile a run of rows, narrow the dim block to match.
        block_batch = min(next_pow2(B), 32)
        block_dim = min(block_dim, 64)
        block_head, block_peer = 1, 1
    elif innermost in ("peer", "head"):
        block_batch = 1
        block_peer = next_pow2(N) if innermost == "peer" else 1
        block_head = min(next_pow2(heads_per_peer), max(1, 4096 // (block_dim * block_peer)))
    else:
        block_batch, block_peer = 1, 1
        block_head = min(next_pow2(heads_per_peer), max(1, 4096 // block_dim))
    config = PackConfig(
        block_peer=block_peer,
        block_batch=block_batch,
        block_head=block_head,
        block_dim=block_dim,
        num_warps=1,
    )
    return dataclasses.replace(config, num_warps=_warps_for(config.tile_elements, elem_size))


def default_combine_config(
    spec: LayoutSpec, N: int, heads_per_peer: int, D: int, B: int, elem_size: int
) -> CombineConfig:
    """Small one-warp tiles, grown only until a program loads about 2048 elements over its N peers.

    Each program loops over the N peers, so parallelism comes from many programs.  H200, bf16, D = 512
    (benchmarks/results/): 2 heads x 128 elements x 1 warp was the best of a 27-config grid for vllm_a2a
    at N = 8, B = 8 (1.88 µs) and B = 1024 (36.3 µs), where the earlier 4 x 512 x 4 warps took 2.94 µs
    at B = 8; with N = 2 the same small tile starves each program (H = 16, B = 1024: 11.4 µs against
    sglang's 7.8 µs with 512-element programs), hence the growth with 2048 / N.
    """
    if spec.payload.axes[-1] == "batch":
        # Loads coalesce along batch: a run of rows, a narrow dim block.
        block_batch, block_head, block_dim = min(next_pow2(B), 32), 1, min(next_pow2(D), 32)
        return CombineConfig(block_batch=block_batch, block_head=block_head, block_dim=block_dim, num_warps=1)
    heads, dims = next_pow2(heads_per_peer), next_pow2(D)
    block_head, block_dim = min(2, heads), min(128, dims)

    def programs() -> int:
        return B * -(-heads_per_peer // block_head) * -(-D // block_dim)

    while block_head * block_dim * N < 2048 and programs() >= 4 * 132:
        if block_dim < min(512, dims):
            block_dim *= 2
        elif block_head < heads:
            block_head *= 2
        else:
            break
    warps = max(1, min(8, block_head * block_dim // 256))
    return CombineConfig(block_batch=1, block_head=block_head, block_dim=block_dim, num_warps=warps)
