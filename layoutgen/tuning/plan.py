"""What a `layoutgen tune` run covers: options, targets (spec x kernel x shape x dtype), study names.

Each family declares its default grid (`Family.grid_axes`, `grid_points`) and its size buckets
(`Family.bucket`); `--shape NAME=V,...` and `--bucket` narrow them, and `--interpret` swaps in the
families' tiny values, which the Triton interpreter runs in seconds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layoutgen.family import get_family
from layoutgen.tuning.problem import Problem
from layoutgen.tuning.space import bind

#: Measured trials of a TPE study.  Budget (issue 4: the DCP default grid in <= 15 GPU minutes on an H200):
#: the 936 studies took 554 s at 19-25 ms per trial (benchmarks/results/tune_H200.md); the replay against
#: exhaustive tables had the median seed within 3% of the optimum after 1-13 trials in 9 of 10 buckets and
#: 58 in the tenth (benchmarks/results/tuner_quality.md).
DEFAULT_TPE_TRIALS = 24
INTERPRET_TPE_TRIALS = 4
#: Spaces with at most this many feasible points are searched exhaustively.
DEFAULT_EXHAUSTIVE_LIMIT = 64
INTERPRET_EXHAUSTIVE_LIMIT = 8
#: The largest size bucket a run takes: 2**31-1 rows (tokens), above any real batch or sequence shard.  A larger
#: value is a typo; one near it cannot be allocated anyway (the search then names the bucket).
MAX_BUCKET = 2**31 - 1
#: How many reasons a grid that no spec can hold names (each names its point).
SHOWN_REASONS = 3


@dataclass(frozen=True)
class TuneOptions:
    """Everything a run (and each of its worker processes) needs, as plain JSON-able values."""

    specs: tuple[str, ...] = ()
    #: Kernel names; empty: every kernel of each spec's family.
    kernels: tuple[str, ...] = ()
    #: Grid values given per axis name (`--shape N=2,4`); an axis not given takes its family's defaults.
    grid: tuple[tuple[str, tuple[int, ...]], ...] = ()
    #: Activation dtypes; empty: each family's default.
    dtypes: tuple[str, ...] = ()
    #: Size buckets; empty: each family's default buckets.
    buckets: tuple[int, ...] = ()
    #: Measured trials of a TPE study (exhaustive studies measure their whole space).
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
    #: (study name, the study this run searches instead): a --retune's fresh studies; set by `runner.run`.
    renamed: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TuneOptions:
        data = json.loads(text)
        for name in ("specs", "kernels", "dtypes", "buckets", "skip"):
            data[name] = tuple(data[name])
        data["grid"] = tuple((name, tuple(values)) for name, values in data["grid"])
        data["renamed"] = tuple((name, fresh) for name, fresh in data["renamed"])
        return cls(**data)


def load_module(source: str) -> Any:
    """The generated module of a bundled spec name, a generated .py file, or a spec YAML (rendered into
    the cache on demand)."""
    from layoutgen.loader import load, load_path
    from layoutgen.spec import NAME_PATTERN

    if re.fullmatch(NAME_PATTERN, source) and not Path(source).is_file():
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
    codegen.write_if_changed(module_path, codegen.render(spec, str(path)))
    return load_path(module_path)


def _origin(source: str) -> Path:
    """The file a --spec value stands for (a bundled name: its YAML), to tell two sources of one name apart."""
    from layoutgen.spec import NAME_PATTERN, bundled_spec_paths

    if re.fullmatch(NAME_PATTERN, source) and not Path(source).is_file():
        return next((path.resolve() for path in bundled_spec_paths() if path.stem == source), Path(source))
    return Path(source).resolve()


def spec_sources(options: TuneOptions) -> list[str]:
    if options.specs:
        return list(dict.fromkeys(options.specs))
    from layoutgen.spec import bundled_spec_paths

    return [path.stem for path in bundled_spec_paths()]


def make_targets(options: TuneOptions) -> list[Any]:
    """One `Target` per (spec, kernel, shape, dtype) the spec can lay out, in a stable order.

    Raises ValueError for a kernel, grid axis or dtype that none of the specs' families has, for a spec named
    with --spec that has none of the --kernel kernels, and for two specs with one name (their studies and
    database entries would collide), among them a spec file or module that takes a bundled spec's name with
    another layout, and for a bucket above MAX_BUCKET."""
    from layoutgen.tuning.objective import Target

    too_large = [bucket for bucket in options.buckets if bucket > MAX_BUCKET]
    if too_large:
        raise ValueError(
            f"--bucket {too_large[0]}: sizes are at most {MAX_BUCKET} (2**31-1 rows or tokens, more than any real "
            "batch); tune the sizes you serve"
        )
    given = dict(options.grid)
    targets: list[Any] = []
    seen: dict[str, Path] = {}
    kernels_used: set[str] = set()
    axes_used: set[str] = set()
    #: Why points were left out ("spec at N=3 H=16 D=512 bfloat16: ..."), for a grid where none is left.
    left_out: dict[str, None] = {}
    for source in spec_sources(options):
        module = load_module(source)
        spec = module.SPEC
        # By source, not by module file: two YAML files of one name render to the same cached module.
        origin = _origin(source)
        if spec.name in seen and seen[spec.name] != origin:
            raise ValueError(f"--spec {seen[spec.name]} and {source} both name a spec {spec.name!r}; rename one")
        seen[spec.name] = origin
        _check_not_a_bundled_name(source, origin, spec.name, str(module.SPEC_HASH))
        family = get_family(spec.family)
        axes_used |= {axis.name for axis in family.grid_axes}
        for dtype in options.dtypes:
            if dtype not in family.dtypes:
                raise ValueError(f"--dtype {dtype} is not one the {family.name} family takes: {list(family.dtypes)}")
        kernels = [k.name for k in family.kernels if not options.kernels or k.name in options.kernels]
        if options.specs and not kernels:  # a spec named on purpose is not left out of the run without a word
            raise ValueError(
                f"--spec {source} has no kernel {' or '.join(options.kernels)} (a {family.name} spec; its kernels: "
                f"{', '.join(k.name for k in family.kernels)}); tune it in a run of its own or add one of its "
                "kernels to --kernel"
            )
        kernels_used |= set(kernels)
        points = family.grid_points({k: list(v) for k, v in given.items()}, options.interpret)
        found: dict[tuple[Any, ...], Any] = {}
        for kernel in kernels:
            for point in points:
                for dtype in options.dtypes or family.default_dtypes:
                    key = family.key_shapes(spec, kernel, point, dtype)
                    if key is None:  # the spec cannot hold this shape (e.g. H not divisible by N)
                        why = family.shape_problem(spec, kernel, point, dtype) or "the spec cannot hold it"
                        shape = " ".join(f"{name}={value}" for name, value in point.items())
                        left_out.setdefault(f"{spec.name} at {shape} {dtype}: {why}")
                        continue
                    problem = Problem(spec, kernel, tuple(key.items()), dtype)
                    found.setdefault((kernel, problem.extents, dtype), Target(problem, module))
        targets += found.values()
    unknown_kernels = set(options.kernels) - kernels_used
    if unknown_kernels:
        raise ValueError(f"--kernel {', '.join(sorted(unknown_kernels))}: no selected spec's family has such a kernel")
    unknown_axes = set(given) - axes_used
    if unknown_axes:
        raise ValueError(
            f"--shape {', '.join(sorted(unknown_axes))}: not a grid axis of the selected specs' families "
            f"(theirs: {', '.join(sorted(axes_used))})"
        )
    if not targets:
        asked = " ".join(f"{name}={','.join(map(str, values))}" for name, values in given.items()) or "the default grid"
        reasons = list(left_out)
        more = f"; and {len(reasons) - SHOWN_REASONS} more" if len(reasons) > SHOWN_REASONS else ""
        raise ValueError(
            f"no study to plan: the selected specs can lay out no point of {asked} "
            f"({'; '.join(reasons[:SHOWN_REASONS])}{more}); give shapes they hold (see `layoutgen families` for "
            "each family's grid)"
        )
    return targets


def _check_not_a_bundled_name(source: str, origin: Path, name: str, spec_hash: str) -> None:
    """Refuse a spec file or module named like a bundled spec but laid out otherwise (ValueError): database
    keys hold the spec's name, so its decisions would replace the bundled spec's entries (in the checkout's
    tuning_db/ by default).  A copy of the bundled spec (the same layout) is that spec, and stays allowed."""
    from layoutgen.spec import bundled_spec_paths, load_spec

    bundled = next((path for path in bundled_spec_paths() if path.stem == name), None)
    if bundled is None or origin == bundled.resolve():
        return
    bundled_hash = load_spec(bundled).layout_hash()
    if spec_hash != bundled_hash:
        raise ValueError(
            f"--spec {source}: its name {name!r} is a bundled spec's, but its layout is not that spec's (spec hash "
            f"{spec_hash[:12]}, the bundled one's {bundled_hash[:12]}): its decisions would replace the bundled "
            f"spec's entries in the tuning database; give it a name of its own (`name:` in the spec)"
        )


def target_buckets(options: TuneOptions, target: Any) -> list[int]:
    """The size buckets of a target: the run's, else its family's defaults (tiny ones under --interpret)."""
    if options.buckets:
        return sorted(set(options.buckets))
    bucket = target.problem.family.bucket
    return sorted(set(bucket.interpret if options.interpret else bucket.defaults))


def expected(target: Any) -> Any:
    """What a current database entry of the target must record (`layoutgen.tuning_db.Expected`)."""
    from layoutgen.tuning.procedure import space_hash, timing_hash
    from layoutgen.tuning_db import Expected, entry_versions

    decl = target.problem.decl
    return Expected(target.spec_hash, target.source_hash, space_hash(decl), timing_hash(decl), entry_versions())


def database_entries(db_dir: str, device_name: str, targets: list[Any], options: TuneOptions) -> dict[str, Any]:
    """Study name -> (target, bucket, the entry `db_dir` holds for that study on this device), current or
    stale.  A current one (`decided`) need not be tuned again, also on a machine without the study storage
    (a fresh GPU host); any one is a re-tune's first candidate, so a short budget cannot lose a config an
    earlier run found.  An existing database that does not validate raises DatabaseError before any
    tuning."""
    import os

    from layoutgen.tuning_db import device_file_name, read_database

    path = Path(db_dir) / device_file_name(device_name)
    if not os.path.lexists(path):
        return {}
    entries = read_database(path).entries
    held = {}
    for target in targets:
        for bucket in target_buckets(options, target):
            entry = entries.get(target.problem.key(bucket).as_str())
            if entry is not None:
                held[study_name(device_name, target, bucket)] = (target, bucket, entry)
    return held


def decided(entry: Any, target: Any, bucket: int, l2_bytes: int) -> bool:
    """Whether a database entry is current for the target (spec, kernel source, search space, timing
    procedure, triton and torch) and was timed in the cache state this tuner would time it in (as many
    rotating input sets)."""
    from layoutgen.tuning.timing import rotating_sets
    from layoutgen.tuning_db import current_problems

    return not current_problems(entry, expected(target)) and entry.rotating_sets == rotating_sets(
        target.bytes_moved(bucket), l2_bytes
    )


def study_name(device_name: str, target: Any, bucket: int) -> str:
    """Deterministic: re-running the same command finds (and resumes) the same study; a change of the spec,
    the kernel source, the search space, the timing procedure or the triton/torch versions starts a new one."""
    p = target.problem
    device = re.sub(r"[^A-Za-z0-9.-]+", "_", device_name)
    current = expected(target)
    versions = "-".join(f"{name}{current.versions[name]}" for name in ("triton", "torch"))
    hashes = "|".join(h[:12] for h in (current.spec_hash, current.source_hash, current.space_hash, current.timing_hash))
    return f"layoutgen|{device}|{versions}|{hashes}|{p.key(bucket).as_str()}"


def run_study_name(options: TuneOptions, device_name: str, target: Any, bucket: int) -> str:
    """The study this run searches for (target, bucket): `study_name`, or the fresh study of a --retune
    (`TuneOptions.renamed`)."""
    name = study_name(device_name, target, bucket)
    return dict(options.renamed).get(name, name)


@dataclass(frozen=True)
class SearchPlan:
    """How one study searches: exhaustively over `space_size` points, or `budget` TPE trials."""

    mode: str
    space_size: int
    budget: int


def search_plan(problem: Problem, bucket: int, options: TuneOptions) -> SearchPlan:
    """Exhaustive when the space is small (`--exhaustive-limit`, whatever `--trials` says), or no larger than
    the trial budget; TPE otherwise, measuring at most `trials` configs."""
    size = len(bind(problem, bucket).feasible())
    if size <= options.exhaustive_limit or (options.time_budget_s is None and size <= options.trials):
        return SearchPlan("exhaustive", size, size)
    return SearchPlan("tpe", size, min(options.trials, size))


def sampler_seed(name: str, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}|{name}".encode()).digest()[:4], "little")
