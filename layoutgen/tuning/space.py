"""A kernel's declared search space bound to one problem and size bucket, and the rules that prune it.

Each family declares per kernel a `layoutgen.family.SearchSpace`: a power-of-two block along each
tiled logical axis, `num_warps`, `num_stages` and the parameters of the pruning rules below.  `bind`
fixes a problem and a bucket (the family says what the rules need to know of them: the extent of every
tiled axis, the destination's innermost axis, the element size and how many elements each output loads);
the result enumerates the feasible configs, maps them to and from Optuna parameters (log2 integers, so
that TPE sees the order of block sizes) and explains why a point is infeasible.  Constraints are
checked before anything is compiled:

* a block no larger than its axis's next power of two (and the declared caps);
* along the stores' contiguous axis, a row segment of at least one DRAM sector (or the whole extent);
* at most `max_elements_per_thread` tile elements per thread (beyond that a thread spills registers);
* beyond one warp, at least `min_bytes_per_thread` loaded per thread (one 16-byte vector), counting every
  element an output loads (a merge of N partials loads N);
* at least `min_tile_bytes` loaded per program, unless the whole problem is smaller (a program's fixed
  cost must be spread over enough data).

Nothing here imports torch or Triton.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import MISSING, dataclass
from typing import Any

from layoutgen.config import WARPS, LaunchConfig, next_pow2
from layoutgen.family import FamilyDeclarationError, KernelDecl, SearchSpace, SpaceExtents
from layoutgen.tuning.problem import Problem


def _log2(value: int) -> int:
    return int(value).bit_length() - 1


def param_name(config_field: str) -> str:
    """Optuna parameter of a config field: the log2 of the value (block sizes and warps are powers of two)."""
    return f"log2_{config_field}"


_feasible_cache: dict[tuple[Any, ...], list[LaunchConfig]] = {}


@dataclass(frozen=True)
class BoundSpace:
    """A kernel's space for one problem and size bucket."""

    space: SearchSpace
    problem: Problem
    bucket: int
    extents: SpaceExtents
    #: config field -> allowed values, ascending.
    choices: dict[str, tuple[int, ...]]

    @property
    def config_type(self) -> type[LaunchConfig]:
        return self.problem.decl.config_type

    def violations(self, config: LaunchConfig) -> list[str]:
        """Why `config` is outside this space (empty when feasible)."""
        return self._violations(config.as_dict())

    def _violations(self, values: dict[str, int]) -> list[str]:
        space = self.space
        problems = [
            f"{name}={values[name]} not in {list(allowed)}"
            for name, allowed in self.choices.items()
            if values[name] not in allowed
        ]
        tile = math.prod(values[name] for name, _ in space.blocks)
        threads = 32 * values["num_warps"]
        if tile > space.max_tile_elements:
            problems.append(f"tile of {tile} elements exceeds {space.max_tile_elements}")
        if tile > space.max_elements_per_thread * threads:
            problems.append(
                f"{tile} elements over {threads} threads is {tile // threads} per thread "
                f"(> {space.max_elements_per_thread}: register spills)"
            )
        loaded = tile * self.extents.elem_bytes * self.extents.loads_per_element
        if values["num_warps"] > 1 and loaded < space.min_bytes_per_thread * threads:
            problems.append(
                f"{loaded} bytes loaded over {threads} threads is under {space.min_bytes_per_thread} bytes per thread"
            )
        if loaded < self.min_program_bytes:
            problems.append(f"a program loading {loaded} bytes is under {space.min_tile_bytes} bytes per program")
        return problems

    @property
    def problem_bytes(self) -> int:
        """Bytes of the whole tiled domain: tiny problems may use tiny tiles."""
        sizes = self.extents.extents
        return math.prod(sizes[axis] for _, axis in self.space.blocks) * self.extents.elem_bytes

    @property
    def min_program_bytes(self) -> int:
        return min(self.space.min_tile_bytes, self.problem_bytes // 16)

    def is_feasible(self, config: LaunchConfig) -> bool:
        return not self.violations(config)

    def feasible(self) -> list[LaunchConfig]:
        """Every feasible config, in a deterministic order."""
        # Buckets beyond the caps share their space: key by what the constraints read, not by the bucket.
        key = (
            self.problem.spec.layout_hash(),
            self.problem.label,
            tuple(self.choices.items()),
            self.extents.elem_bytes * self.extents.loads_per_element,
            self.min_program_bytes,
        )
        found = _feasible_cache.get(key)
        if found is None:
            names = list(self.choices)
            found = []
            for values in itertools.product(*(self.choices[name] for name in names)):
                data = dict(zip(names, values, strict=True))
                if not self._violations(data):
                    found.append(self.config_type.from_dict(data))
            _feasible_cache[key] = found
        return list(found)

    def to_params(self, config: LaunchConfig) -> dict[str, int]:
        return {param_name(name): _log2(value) for name, value in config.as_dict().items()}

    def from_params(self, params: dict[str, int]) -> LaunchConfig:
        """The config of a point; raises ValueError for a point the config type itself rejects."""
        data = {name: 1 << int(params[param_name(name)]) for name in self.choices}
        return self.config_type.from_dict(data)

    def param_ranges(self) -> dict[str, tuple[int, int]]:
        """Optuna parameter -> inclusive (low, high) of its log2 values."""
        return {param_name(name): (_log2(values[0]), _log2(values[-1])) for name, values in self.choices.items()}


def check_declared_space(family: str, decl: KernelDecl) -> None:
    """Raise FamilyDeclarationError where a kernel's `SearchSpace` contradicts its config type or itself (the
    tuner would fail on it with a bare KeyError, or silently ignore a cap)."""
    where, space = f"family {family!r}, kernel {decl.name!r}: KernelDecl.space", decl.space
    fields, axes = [name for name, _ in space.blocks], [axis for _, axis in space.blocks]
    config_fields = set(decl.config_type.field_names())
    searched = {*fields, "num_warps", "num_stages"}
    problems = [
        f"blocks names {what} {name!r} twice; give each block its own config field and axis"
        for what, names in (("config field", fields), ("axis", axes))
        for name in sorted(set(names))
        if names.count(name) > 1
    ]
    config = decl.config_type.__name__
    problems += [
        f"searches {name!r}, which is not a field of {config} (its fields: {', '.join(sorted(config_fields))}); "
        f"name a field of KernelDecl.config_type in blocks, or add {name} to {config}"
        for name in sorted(searched - config_fields)
    ]
    problems += [
        f"leaves {config} field {field.name!r} unsearched, and it has no default; give it a default or add it "
        "to SearchSpace.blocks"
        for field in dataclasses.fields(decl.config_type)
        if field.name not in searched and field.default is MISSING and field.default_factory is MISSING
    ]
    for caps_field, caps in (("caps", space.caps), ("innermost_caps", space.innermost_caps)):
        problems += [
            f"{caps_field} names axis {axis!r}, which SearchSpace.blocks does not tile (its axes: "
            f"{', '.join(axes)}); key the cap by one of them"
            for axis in caps
            if axis not in axes
        ]
    if not space.num_warps or any(warps not in WARPS for warps in space.num_warps):
        problems.append(f"num_warps {tuple(space.num_warps)} must be a non-empty tuple of values among {WARPS}")
    if not space.num_stages or any(not 1 <= stages <= 8 for stages in space.num_stages):
        problems.append(f"num_stages {tuple(space.num_stages)} must be a non-empty tuple of values in [1, 8]")
    if problems:
        raise FamilyDeclarationError(f"{where}: {'; '.join(problems)}")


def check_space_extents(family: str, decl: KernelDecl, extents: SpaceExtents) -> None:
    """Raise FamilyDeclarationError where the family's `space_extents()` does not cover its kernel's declared
    axes: every tiled axis needs an extent, and the innermost axes and floors must name extents (else the
    pruning rules that read them silently do not apply)."""
    known = set(extents.extents)
    named = ", ".join(extents.extents) or "none"
    fix = f"return an extent for it from {family}'s space_extents(), or rename it to one of: {named}"
    problems = [
        f"SearchSpace.blocks tiles axis {axis!r} (config field {name}), which has no extent; {fix}"
        for name, axis in decl.space.blocks
        if axis not in known
    ]
    if extents.innermost not in known:
        problems.append(f"SpaceExtents.innermost {extents.innermost!r} is not an extent; {fix}")
    if extents.source_innermost is not None and extents.source_innermost not in known:
        problems.append(f"SpaceExtents.source_innermost {extents.source_innermost!r} is not an extent; {fix}")
    problems += [f"SpaceExtents.floors names axis {axis!r}, which is not an extent; {fix}"
                 for axis in extents.floors if axis not in known]  # fmt: skip
    if problems:
        raise FamilyDeclarationError(f"family {family!r}, kernel {decl.name!r}: {'; '.join(problems)}")


def bind(problem: Problem, bucket: int) -> BoundSpace:
    """The space of `problem`'s kernel for `problem` at size bucket `bucket`."""
    if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 1:
        raise ValueError(f"size bucket must be a positive int, got {bucket!r}")
    space = problem.decl.space
    check_declared_space(problem.family.name, problem.decl)
    extents = problem.family.space_extents(problem, bucket)
    check_space_extents(problem.family.name, problem.decl, extents)
    sizes, innermost = extents.extents, extents.innermost
    choices: dict[str, tuple[int, ...]] = {}
    for name, axis in space.blocks:
        cap = space.innermost_caps.get(axis) if axis in (innermost, extents.source_innermost) else None
        cap = cap if cap is not None else space.caps.get(axis)
        high = next_pow2(sizes[axis]) if cap is None else min(next_pow2(sizes[axis]), cap)
        low = min(high, max(1, space.sector_bytes // extents.elem_bytes)) if axis == innermost else 1
        low = min(high, max(low, next_pow2(extents.floors.get(axis, 1))))  # below it the launcher refuses
        choices[name] = tuple(1 << k for k in range(_log2(low), _log2(high) + 1))
    choices["num_warps"] = tuple(space.num_warps)
    choices["num_stages"] = tuple(space.num_stages)
    return BoundSpace(space, problem, bucket, extents, choices)
