"""What a `layoutgen tune` run covers: options, targets (spec x kernel x shape x dtype), study names.

The default grid (DESIGN §6, issue 4): DeepSeek-style MLA decode, H in {16, 128} with D = 512, and a
plain-attention case, H = 32 with D = 128; N in {2, 4, 8}; bfloat16; batch buckets 1 ... 4096 in powers
of two.  `--interpret` swaps in tiny shapes that the Triton interpreter runs in seconds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layoutgen.tuning.space import DTYPE_SIZES, KERNELS, Kernel, Problem, bind

#: Bump when the declared spaces or the trial protocol change: study names change with it, so trials
#: measured under the old rules are not mixed into new studies.
SPACE_VERSION = 5

DEFAULT_HEADS_AND_DIMS: tuple[tuple[int, int], ...] = ((16, 512), (128, 512), (32, 128))
DEFAULT_PEERS: tuple[int, ...] = (2, 4, 8)
DEFAULT_BUCKETS: tuple[int, ...] = tuple(1 << k for k in range(13))  # 1 ... 4096
DEFAULT_DTYPES: tuple[str, ...] = ("bfloat16",)

INTERPRET_HEADS_AND_DIMS: tuple[tuple[int, int], ...] = ((4, 8),)
INTERPRET_PEERS: tuple[int, ...] = (2,)
INTERPRET_BUCKETS: tuple[int, ...] = (1, 3)

#: Measured trials of a TPE study.  Budget (issue 4: the default grid in <= 15 GPU minutes on an H200): the
#: 936 studies took 554 s at 19-25 ms per trial (benchmarks/results/tune_H200.md); the
#: replay against exhaustive tables had the median seed within 3% of the optimum after 1-13 trials in 9 of
#: 10 buckets and 58 in the tenth (benchmarks/results/tuner_quality.md).
DEFAULT_TPE_TRIALS = 24
INTERPRET_TPE_TRIALS = 4
#: Spaces with at most this many feasible points are searched exhaustively.
DEFAULT_EXHAUSTIVE_LIMIT = 64
INTERPRET_EXHAUSTIVE_LIMIT = 8


@dataclass(frozen=True)
class TuneOptions:
    """Everything a run (and each of its worker processes) needs, as plain JSON-able values."""

    specs: tuple[str, ...] = ()
    kernels: tuple[str, ...] = KERNELS
    shapes: tuple[tuple[int, int, int], ...] = ()  # (N, H, D)
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    trials: int = DEFAULT_TPE_TRIALS
    time_budget_s: float | None = None
    exhaustive_limit: int = DEFAULT_EXHAUSTIVE_LIMIT
    storage: str | None = None
    db_dir: str | None = None
    interpret: bool = False
    workers: int = 1
    compile_workers: int | None = None
    lookahead: int = 3
    seed: int = 0
    report: str | None = None
    #: Tune studies again even where the database already holds a current decision.
    retune: bool = False
    #: Study names this run leaves alone (decided in the database); set by `runner.run`.
    skip: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TuneOptions:
        data = json.loads(text)
        for name in ("specs", "kernels", "dtypes", "buckets", "skip"):
            data[name] = tuple(data[name])
        data["shapes"] = tuple(tuple(shape) for shape in data["shapes"])
        return cls(**data)


def default_shapes(interpret: bool) -> tuple[tuple[int, int, int], ...]:
    peers = INTERPRET_PEERS if interpret else DEFAULT_PEERS
    heads_and_dims = INTERPRET_HEADS_AND_DIMS if interpret else DEFAULT_HEADS_AND_DIMS
    return tuple((N, H, D) for H, D in heads_and_dims for N in peers)


def grid_shapes(
    peers: list[int] | None, heads: list[int] | None, dims: list[int] | None, interpret: bool
) -> tuple[tuple[int, int, int], ...]:
    """(N, H, D) to tune: the default grid when none of the three is given, else the product of the given
    lists with the defaults for the others (pairs with H not divisible by N are skipped)."""
    if not peers and not heads and not dims:
        return default_shapes(interpret)
    default_peers = INTERPRET_PEERS if interpret else DEFAULT_PEERS
    base = INTERPRET_HEADS_AND_DIMS if interpret else DEFAULT_HEADS_AND_DIMS
    default_heads = tuple(dict.fromkeys(h for h, _ in base))
    default_dims = tuple(dict.fromkeys(d for _, d in base))
    shapes = [
        (N, H, D)
        for H in (heads or default_heads)
        for D in (dims or default_dims)
        for N in (peers or default_peers)
        if H % N == 0
    ]
    if not shapes:
        raise ValueError(f"no (N, H) pair with H divisible by N among N={peers or default_peers}, H={heads}")
    return tuple(shapes)


def load_module(source: str) -> Any:
    """The generated module of a bundled spec name, a generated .py file, or a spec YAML (rendered into
    the cache on demand)."""
    from layoutgen.loader import load, load_path
    from layoutgen.spec import NAME_PATTERN

    if re.fullmatch(NAME_PATTERN, source):
        return load(source)
    path = Path(source)
    if path.suffix == ".py":
        return load_path(path)
    if path.suffix not in (".yaml", ".yml"):
        raise ValueError(f"--spec takes a bundled spec name, a spec .yaml or a generated .py file; got {source!r}")
    from layoutgen import codegen
    from layoutgen.spec import load_spec
    from layoutgen.tuning.storage import cache_dir

    spec = load_spec(path)
    module_path = cache_dir() / "generated" / f"{spec.name}.py"
    module_path.parent.mkdir(parents=True, exist_ok=True)
    codegen.write_if_changed(module_path, codegen.render(spec, str(path)))
    return load_path(module_path)


def spec_sources(options: TuneOptions) -> list[str]:
    if options.specs:
        return list(options.specs)
    from layoutgen.spec import bundled_spec_paths

    return [path.stem for path in bundled_spec_paths()]


def make_targets(options: TuneOptions) -> list[Any]:
    """One `Target` per (spec, kernel, shape, dtype) the spec can lay out, in a stable order."""
    from layoutgen.layout import Shape, check_shape
    from layoutgen.tuning.objective import Target

    targets = []
    for source in spec_sources(options):
        module = load_module(source)
        for kernel in options.kernels:
            if kernel not in KERNELS:
                raise ValueError(f"--kernel must be one of {KERNELS}, got {kernel!r}")
            for N, H, D in options.shapes:
                for dtype in options.dtypes:
                    if dtype not in DTYPE_SIZES:
                        raise ValueError(f"--dtype must be one of {sorted(DTYPE_SIZES)}, got {dtype!r}")
                    import torch

                    try:
                        check_shape(module.SPEC, Shape(N, 1, H, D, getattr(torch, dtype)))
                    except (TypeError, ValueError):
                        continue  # e.g. a row-tail spec with an odd D: that spec cannot hold the shape
                    problem = Problem(module.SPEC, _kernel(kernel), N, H // N, D, dtype)
                    targets.append(Target(problem, module))
    return targets


def _kernel(name: str) -> Kernel:
    return "pack" if name == "pack" else "combine"


def database_entries(
    db_dir: str, device_name: str, targets: list[Any], buckets: list[int]
) -> dict[str, tuple[Any, int, Any]]:
    """Study name -> (target, batch bucket, the entry `db_dir` holds for that study on this device), current
    or stale.  A current one (`decided`) need not be tuned again, also on a machine without the study storage (a
    fresh GPU host); any one is a re-tune's first candidate, so a short budget cannot lose a config an
    earlier run found.  An existing database that does not validate raises DatabaseError before any
    tuning."""
    from layoutgen.tuning_db import device_file_name, read_database

    path = Path(db_dir) / device_file_name(device_name)
    if not path.is_file():
        return {}
    entries = read_database(path).entries
    held = {}
    for target in targets:
        for batch in buckets:
            entry = entries.get(tuning_key(target, batch).as_str())
            if entry is not None:
                held[study_name(device_name, target, batch)] = (target, batch, entry)
    return held


def decided(entry: Any, target: Any, batch: int, l2_bytes: int) -> bool:
    """Whether a database entry was tuned for the target's current spec and kernel source, under the
    timing conditions this tuner would measure it in (as many rotating input sets, the same cache state,
    and the kernel's current timing rule)."""
    from layoutgen.tuning.objective import bytes_moved
    from layoutgen.tuning.timing import TIMING_RULES, rotating_sets

    return bool(
        entry.spec_hash == target.spec_hash
        and entry.source_hash == target.source_hash
        and entry.rotating_sets == rotating_sets(bytes_moved(target.problem, batch), l2_bytes)
        and entry.timing_rule == TIMING_RULES[target.problem.kernel]
    )


def tuning_key(target: Any, batch: int) -> Any:
    """The tuning-database key of a target's study for one batch bucket."""
    from layoutgen.tuning_db import TuningKey

    p = target.problem
    return TuningKey(spec=p.spec.name, kernel=p.kernel, N=p.N, heads_per_peer=p.heads_per_peer, D=p.D, dtype=p.dtype,
                     batch_bucket=batch)  # fmt: skip


def study_name(device_name: str, target: Any, batch: int) -> str:
    """Deterministic: re-running the same command finds (and resumes) the same study."""
    p = target.problem
    device = re.sub(r"[^A-Za-z0-9.-]+", "_", device_name)
    return (
        f"layoutgen-v{SPACE_VERSION}|{device}|{p.spec.name}|{target.spec_hash[:12]}|{target.source_hash[:12]}"
        f"|{p.kernel}|N={p.N}|Hl={p.heads_per_peer}|D={p.D}|{p.dtype}|B={batch}"
    )


@dataclass(frozen=True)
class SearchPlan:
    """How one study searches: exhaustively over `space_size` points, or `budget` TPE trials."""

    mode: str
    space_size: int
    budget: int


def search_plan(problem: Problem, batch: int, options: TuneOptions) -> SearchPlan:
    """Exhaustive when the space is small, or no larger than the trial budget; TPE otherwise."""
    size = len(bind(problem, batch).feasible())
    if size <= options.exhaustive_limit or (options.time_budget_s is None and size <= options.trials):
        return SearchPlan("exhaustive", size, size)
    return SearchPlan("tpe", size, min(options.trials, size))


def sampler_seed(name: str, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}|{name}".encode()).digest()[:4], "little")
