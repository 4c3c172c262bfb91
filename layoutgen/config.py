"""Launch configurations: the base every family's kernel configs derive from.

A config holds only what a generated kernel takes as block sizes and launch options; everything the
spec knows is baked into the kernel.  A family declares one frozen dataclass per kernel with
`block_<axis>` fields (powers of two), `num_warps` and `num_stages`; this base validates them, and
configs are hashable so that the runtime can cache decisions keyed by them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

WARPS = (1, 2, 4, 8, 16, 32)
MAX_TILE_ELEMENTS = 1 << 16  # keeps a tile's registers within one SM's budget at 32 warps

LaunchConfigT = TypeVar("LaunchConfigT", bound="LaunchConfig")


def is_pow2(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def next_pow2(value: int) -> int:
    return 1 << max(0, (int(value) - 1).bit_length())


def grow_box(
    order: Sequence[str], extents: Mapping[str, int], budget: int, floors: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Power-of-two blocks of a tile along `order` (outer to inner), grown from the innermost axis outward
    until the tile holds `budget` elements, each block at most its axis's extent rounded up.  `floors` are
    blocks taken first (runs along both sides' contiguous axes, say): the budget shrinks by them, and one
    grows further with what is left when the order reaches its axis."""
    blocks = {axis: 1 for axis in order}
    for axis, floor in (floors or {}).items():
        blocks[axis] = floor
        budget = max(1, budget // floor)
    for axis in reversed(order):
        held = blocks[axis]
        blocks[axis] = min(next_pow2(extents[axis]), held * budget)
        budget = max(1, budget * held // blocks[axis])
    return blocks


@dataclass(frozen=True)
class LaunchConfig:
    """Base of a kernel's launch config; subclasses declare the fields (see the module docstring)."""

    kernel: ClassVar[str]

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{self.kernel} config field {field.name} must be an int, got {value!r}")
            if field.name.startswith("block_") and not is_pow2(value):
                raise ValueError(f"{self.kernel} config {field.name} must be a power of two, got {value}")
        warps = getattr(self, "num_warps", 4)
        if warps not in WARPS:
            raise ValueError(f"{self.kernel} config num_warps must be one of {WARPS}, got {warps}")
        stages = getattr(self, "num_stages", 1)
        if not 1 <= stages <= 8:
            raise ValueError(f"{self.kernel} config num_stages must be in [1, 8], got {stages}")
        if self.tile_elements > MAX_TILE_ELEMENTS:
            raise ValueError(
                f"{self.kernel} config tile of {self.tile_elements} elements exceeds {MAX_TILE_ELEMENTS}; "
                "use smaller blocks"
            )

    def check_problem(self, spec: Any, extents: Mapping[str, int]) -> None:
        """Raise ValueError naming the fix where the kernel of `spec` cannot run this config at `extents` (the
        family's key extents) although every field is valid; a family whose launcher has such rules overrides
        it (dispatch then skips a tuned config that breaks them, and `layoutgen db check` reports it)."""

    @property
    def tile_elements(self) -> int:
        size = 1
        for field in dataclasses.fields(self):
            if field.name.startswith("block_"):
                size *= getattr(self, field.name)
        return size

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def values(self) -> list[int]:
        """The fields in declaration order (what a custom op takes instead of the object)."""
        return [getattr(self, field.name) for field in dataclasses.fields(self)]

    @classmethod
    def field_names(cls) -> list[str]:
        return [field.name for field in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls: type[LaunchConfigT], data: dict[str, Any]) -> LaunchConfigT:
        names = set(cls.field_names())
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"{cls.kernel} config has unknown keys {sorted(unknown)}; known: {sorted(names)}")
        return cls(**data)

    def __str__(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)


def config_values(config: LaunchConfig | None) -> list[int]:
    """A config as a custom op takes it (ops take no objects): its fields in declaration order, [] for None."""
    return [] if config is None else config.values()


_from_values: dict[tuple[type[LaunchConfig], tuple[int, ...]], LaunchConfig] = {}


def config_from_values(kind: type[LaunchConfigT], values: list[int]) -> LaunchConfigT | None:
    """The inverse of `config_values` for configs of type `kind` (validated, cached: a custom op decodes its
    config on every call)."""
    if not values:
        return None
    key = (kind, tuple(values))
    config = _from_values.get(key)
    if config is None:
        names = kind.field_names()
        if len(values) != len(names):
            raise ValueError(
                f"config must list the {kind.kernel} config fields {names} in order, or be []; got {values}"
            )
        config = kind(**dict(zip(names, values, strict=True)))
        _from_values[key] = config
    return config  # type: ignore[return-value]
