"""The declared search spaces of the generated kernels and the constraints that prune them.

One `KernelSpace` per kernel template names the knobs the template exposes:
a power-of-two block size along each tiled logical axis (the tile is a box of
the destination, so "heads per program" is `block_head`, "rows per program"
`block_batch`, ...), `num_warps` and `num_stages`.  `bind` fixes a problem
(spec, N, heads per peer, D, dtype) and a batch bucket; the result enumerates
the feasible configs, maps them to and from Optuna parameters (log2 integers,
so that TPE sees the order of block sizes) and explains why a point is
infeasible.  Constraints are checked before anything is compiled.

Nothing here imports torch or Triton.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from layoutgen.config import MAX_TILE_ELEMENTS, CombineConfig, KernelConfig, PackConfig, next_pow2
from layoutgen.spec import LayoutSpec, PayloadDtype

Kernel = Literal["pack", "combine"]
KERNELS: tuple[Kernel, ...] = ("pack", "combine")

#: Element sizes of the activation dtypes the kernels take, by the names the tuning database uses.
DTYPE_SIZES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}

#: A row segment along the destination's innermost axis spans at least one 32-byte DRAM sector (or the
#: whole extent): narrower segments waste most of every memory transaction.
SECTOR_BYTES = 32
#: Upper bound on tile elements per thread: values plus their addresses must fit in registers
#: (255 per thread); beyond ~64 live elements a thread spills.
MAX_ELEMENTS_PER_THREAD = 64
#: Lower bound on the bytes each thread loads (above one warp): at least one 16-byte vector, or the extra
#: warps only add scheduling work.  Combine loads N partials per output element, so its tile counts N
#: times: sglang's combine shape (one row of 512 bf16 over 4 warps, 8 bytes per partial per thread) stays
#: in the space (its kernel compiles to 192 instructions at N = 4, ours in that shape to 200:
#: benchmarks/results/notes_H200.md).
MIN_BYTES_PER_THREAD = 16
#: Lower bound on the bytes one program loads (unless the whole problem is smaller): a program's fixed
#: cost (index arithmetic, masks, the LSE branch) must be spread over enough data.  Combine counts its N
#: partials, as MIN_BYTES_PER_THREAD does: counting only its output kept the heuristic default (2 heads x
#: 128, one warp) out of the N = 8 space, and at vllm_a2a N 8, H 128, B 64 that default took 4.16 µs
#: against 4.35 µs for the best config the search could reach (H200, tune_combine_v4_H200.md).
MIN_TILE_BYTES = 1024


@dataclass(frozen=True)
class KernelSpace:
    """What one kernel template lets the tuner choose."""

    kernel: Kernel
    #: (config field, logical axis it tiles), outer to inner as the template's tile is declared.
    blocks: tuple[tuple[str, str], ...]
    num_warps: tuple[int, ...]
    #: The templates have no loop that Triton software-pipelines (the combine's peer loop is a
    #: static_range, fully unrolled), so num_stages changes no code; more values would only multiply
    #: compiles.  A template that gains a pipelined loop widens this.
    num_stages: tuple[int, ...]
    #: Largest block per axis beyond next_pow2(extent); batch rows are not contiguous in any bundled
    #: destination, so deep batch blocks only add registers.
    caps: dict[str, int] = field(default_factory=dict)


SPACES: dict[Kernel, KernelSpace] = {
    "pack": KernelSpace(
        kernel="pack",
        blocks=(("block_peer", "peer"), ("block_batch", "batch"), ("block_head", "head"), ("block_dim", "dim")),
        num_warps=(1, 2, 4, 8, 16),
        num_stages=(1,),
        caps={"batch": 16},
    ),
    "combine": KernelSpace(
        kernel="combine",
        blocks=(("block_batch", "batch"), ("block_head", "head"), ("block_dim", "dim")),
        num_warps=(1, 2, 4, 8, 16),
        num_stages=(1,),
        caps={"batch": 16},
    ),
}

#: Caps that apply instead when batch is the destination's innermost axis (stores coalesce along it).
INNERMOST_BATCH_CAP = 256


@dataclass(frozen=True)
class Problem:
    """Everything a compiled kernel is specialised for, the batch bucket aside."""

    spec: LayoutSpec
    kernel: Kernel
    N: int
    heads_per_peer: int
    D: int
    dtype: str

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {self.kernel!r}")
        if self.dtype not in DTYPE_SIZES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_SIZES)}, got {self.dtype!r}")
        for name in ("N", "heads_per_peer", "D"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")

    @property
    def H(self) -> int:
        return self.N * self.heads_per_peer

    @property
    def elem_size(self) -> int:
        """Bytes per element of `out` (the activations)."""
        return DTYPE_SIZES[self.dtype]

    @property
    def wire_elem_size(self) -> int:
        """Bytes per payload element on the wire."""
        return 4 if self.spec.payload.dtype is PayloadDtype.FLOAT32 else self.elem_size

    @property
    def label(self) -> str:
        return f"{self.spec.name} {self.kernel} N={self.N} H/N={self.heads_per_peer} D={self.D} {self.dtype}"


def extents(problem: Problem, batch: int) -> dict[str, int]:
    return {"peer": problem.N, "batch": batch, "head": problem.heads_per_peer, "dim": problem.D}


def destination_innermost(problem: Problem) -> str:
    """The axis along which the kernel's stores are contiguous."""
    return problem.spec.payload.axes[-1] if problem.kernel == "pack" else "dim"


def _log2(value: int) -> int:
    return int(value).bit_length() - 1


def param_name(config_field: str) -> str:
    """Optuna parameter of a config field: the log2 of the value (block sizes and warps are powers of two)."""
    return f"log2_{config_field}"


_feasible_cache: dict[tuple[Any, ...], list[KernelConfig]] = {}


@dataclass(frozen=True)
class BoundSpace:
    """A kernel's space for one problem and batch bucket."""

    space: KernelSpace
    problem: Problem
    batch: int
    #: config field -> allowed values, ascending.
    choices: dict[str, tuple[int, ...]]

    @property
    def config_type(self) -> type[KernelConfig]:
        return PackConfig if self.space.kernel == "pack" else CombineConfig

    def violations(self, config: KernelConfig) -> list[str]:
        """Why `config` is outside this space (empty when feasible)."""
        return self._violations(config.as_dict())

    def _violations(self, values: dict[str, int]) -> list[str]:
        problems = [
            f"{name}={values[name]} not in {list(allowed)}"
            for name, allowed in self.choices.items()
            if values[name] not in allowed
        ]
        tile = math.prod(values[name] for name, _ in self.space.blocks)
        threads = 32 * values["num_warps"]
        elem = self.problem.wire_elem_size if self.space.kernel == "pack" else self.problem.elem_size
        if tile > MAX_TILE_ELEMENTS:
            problems.append(f"tile of {tile} elements exceeds {MAX_TILE_ELEMENTS}")
        if tile > MAX_ELEMENTS_PER_THREAD * threads:
            problems.append(
                f"{tile} elements over {threads} threads is {tile // threads} per thread "
                f"(> {MAX_ELEMENTS_PER_THREAD}: register spills)"
            )
        loaded = tile * elem * (self.problem.N if self.space.kernel == "combine" else 1)
        if values["num_warps"] > 1 and loaded < MIN_BYTES_PER_THREAD * threads:
            problems.append(
                f"{loaded} bytes loaded over {threads} threads is under {MIN_BYTES_PER_THREAD} bytes per thread"
            )
        if loaded < min(MIN_TILE_BYTES, self.problem_bytes // 16):
            problems.append(f"a program loading {loaded} bytes is under {MIN_TILE_BYTES} bytes per program")
        return problems

    @property
    def problem_bytes(self) -> int:
        """Bytes of the whole tiled domain: tiny problems may use tiny tiles."""
        sizes = extents(self.problem, self.batch)
        elem = self.problem.wire_elem_size if self.space.kernel == "pack" else self.problem.elem_size
        return math.prod(sizes[axis] for _, axis in self.space.blocks) * elem

    def is_feasible(self, config: KernelConfig) -> bool:
        return not self.violations(config)

    def feasible(self) -> list[KernelConfig]:
        """Every feasible config, in a deterministic order."""
        # Buckets beyond the batch cap share their space: key by what the constraints read, not by batch.
        key = (
            self.problem.spec.layout_hash(),
            self.problem.label,
            tuple(self.choices.items()),
            min(MIN_TILE_BYTES, self.problem_bytes // 16),
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

    def to_params(self, config: KernelConfig) -> dict[str, int]:
        return {param_name(name): _log2(value) for name, value in config.as_dict().items()}

    def from_params(self, params: dict[str, int]) -> KernelConfig:
        """The config of a point; raises ValueError for a point the config type itself rejects."""
        data = {name: 1 << int(params[param_name(name)]) for name in self.choices}
        return self.config_type.from_dict(data)

    def param_ranges(self) -> dict[str, tuple[int, int]]:
        """Optuna parameter -> inclusive (low, high) of its log2 values."""
        return {param_name(name): (_log2(values[0]), _log2(values[-1])) for name, values in self.choices.items()}


def bind(problem: Problem, batch: int) -> BoundSpace:
    """The space of `problem.kernel` for `problem` at batch bucket `batch`."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch bucket must be a positive int, got {batch!r}")
    space = SPACES[problem.kernel]
    sizes = extents(problem, batch)
    innermost = destination_innermost(problem)
    elem = problem.wire_elem_size if problem.kernel == "pack" else problem.elem_size
    choices: dict[str, tuple[int, ...]] = {}
    for name, axis in space.blocks:
        cap = INNERMOST_BATCH_CAP if axis == "batch" and innermost == "batch" else space.caps.get(axis)
        high = next_pow2(sizes[axis]) if cap is None else min(next_pow2(sizes[axis]), cap)
        low = min(high, max(1, SECTOR_BYTES // elem)) if axis == innermost else 1
        choices[name] = tuple(1 << k for k in range(_log2(low), _log2(high) + 1))
    choices["num_warps"] = space.num_warps
    choices["num_stages"] = space.num_stages
    return BoundSpace(space, problem, batch, choices)
