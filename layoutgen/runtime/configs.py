"""Which launch config a kernel call gets when the caller passes `config=None`, for any family.

In order: `LAYOUTGEN_CONFIG` (forced, JSON by kernel name), then the tuning database of the tensors'
device (`LAYOUTGEN_TUNING_DB`, then the packaged `tuning_db/`), then the family's heuristic default.
The database never raises on this path: a corrupt, foreign (holding another device) or oversized file, a
stale entry (another spec, kernel source, search space, timing procedure, triton or torch), an entry whose
config the kernel refuses or a missing shape is reported once per reason with a `LayoutgenWarning` and
skipped.  Callers cache the result per plan, so all of this runs once per shape.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from layoutgen import strict_json, tuning_db
from layoutgen.config import LaunchConfig
from layoutgen.family import KernelDecl, families, get_family
from layoutgen.settings import CONFIG, TUNING_DB, settings


class LayoutgenWarning(UserWarning):
    """Something layoutgen worked around (e.g. a stale tuning entry); filter with this category."""


_lock = threading.Lock()
_warned: set[tuple[Any, ...]] = set()
_databases: dict[Path, tuning_db.TuningDatabase | None] = {}
_indexes: dict[Path, dict[tuple[Any, ...], dict[int, tuning_db.TuningEntry]]] = {}
_device_names: dict[Any, str] = {}
_expected: dict[tuple[str, str, str], tuning_db.Expected] = {}


def warn_once(reason: tuple[Any, ...], message: str) -> None:
    """Emit `message` as a LayoutgenWarning the first time `reason` comes up in this process."""
    with _lock:
        if reason in _warned:
            return
        _warned.add(reason)
    warnings.warn(message, LayoutgenWarning, stacklevel=4)


def reset() -> None:
    """Forget loaded databases, device names and warnings already given (tests; after editing the DB)."""
    with _lock:
        _warned.clear()
        _databases.clear()
        _indexes.clear()
        _device_names.clear()
        _expected.clear()


def database_dirs() -> list[Path]:
    """Where dispatch looks for `<device>.json`, first match per entry wins."""
    dirs = []
    try:
        override = settings.tuning_db
    except ValueError:
        override = None
    if override is not None:
        dirs.append(override)
    dirs.append(packaged_database_dir())
    return dirs


def packaged_database_dir() -> Path:
    """The checkout's `tuning_db/`, else the copy installed inside the package."""
    from layoutgen.loader import source_root

    root = source_root()
    if root is not None:
        return root / "tuning_db"
    return Path(__file__).resolve().parent.parent / "_tuning_db"  # pyproject maps tuning_db/ there


def device_name(device: Any) -> str:
    """The database device name: the CUDA device's name, or `cpu-interpreter` for CPU tensors."""
    name = _device_names.get(device)
    if name is None:
        import torch

        name = torch.cuda.get_device_name(device) if device.type == "cuda" else tuning_db.CPU_INTERPRETER_DEVICE
        _device_names[device] = name
    return name


def _database(path: Path, device: str) -> tuning_db.TuningDatabase | None:
    """The database at `path` (read once), or None (warned) where it is missing, unusable or not `device`'s."""
    if path in _databases:
        return _databases[path]
    database: tuning_db.TuningDatabase | None = None
    try:
        exists = os.path.lexists(path)  # a FIFO or device there is reported by the reader, not skipped
    except OSError as error:  # e.g. a LAYOUTGEN_TUNING_DB path too long for the file system
        warn_once(("corrupt", path), f"ignoring the tuning database {path}: {error}")
        exists = False
    if exists:
        try:
            database = tuning_db.read_database(path)
        except tuning_db.DatabaseError as error:
            warn_once(("corrupt", path), f"ignoring the tuning database: {error}")
        except (MemoryError, RecursionError) as error:  # dispatch must never raise because of a database
            warn_once(("corrupt", path), f"ignoring the tuning database {path}: {type(error).__name__}")
    if database is not None and database.device_name != device:
        # Its entries were measured on other hardware: as `record` refuses to add to it, dispatch does not use it.
        home = tuning_db.device_file_name(database.device_name)
        fix = (
            f"move it to {home} or correct its device_name"
            if path.name != home
            else f"correct its device_name to {device!r}"
        )
        warn_once(
            ("foreign", path),
            f"ignoring the tuning database {path}: it holds device {database.device_name!r}, not the running "
            f"{device!r}; {fix}",
        )
        database = None
    index: dict[tuple[Any, ...], dict[int, tuning_db.TuningEntry]] = {}
    if database is not None:
        for entry in database.entries.values():
            index.setdefault(entry.key.group(), {})[entry.key.bucket] = entry
    with _lock:
        _databases[path] = database
        _indexes[path] = index
    return database


def expected_for(kernel: KernelDecl, spec_hash: str, source_hash: str) -> tuning_db.Expected:
    """What a current entry of `kernel` must record, for the running code and software (cached)."""
    key = (kernel.name, spec_hash, source_hash)
    expected = _expected.get(key)
    if expected is None:
        from layoutgen.tuning.procedure import space_hash, timing_hash

        expected = tuning_db.Expected(
            spec_hash, source_hash, space_hash(kernel), timing_hash(kernel), tuning_db.entry_versions()
        )
        _expected[key] = expected
    return expected


def entry_config(entry: tuning_db.TuningEntry, kernel: KernelDecl, spec: Any) -> LaunchConfig:
    """The launch config `entry` holds, refused where dispatch refuses it: TypeError or ValueError naming the
    problem where its type rejects the fields (an unknown one, num_warps 3) or, given `spec` (None: not
    checked), the kernel cannot run it at the entry's shape (a dim block splitting an fp8 spec's scale blocks)."""
    config = kernel.config_type.from_dict(entry.config)
    if spec is not None:
        config.check_problem(spec, dict(entry.key.extents))
    return config


def _config_from_entry(
    entry: tuning_db.TuningEntry, path: Path, kernel: KernelDecl, expected: tuning_db.Expected, spec: Any
) -> LaunchConfig | None:
    name = entry.key.as_str()
    problems = current_problems(entry, expected)
    if problems:
        reason, detail = problems[0]
        warn_once(
            _stale_scope(reason, detail, path, entry.key),
            f"ignoring tuning entries like {name!r} in {path}: {detail}; re-run `layoutgen tune`",
        )
        return None
    try:
        return entry_config(entry, kernel, spec)
    except (TypeError, ValueError) as error:
        warn_once(
            ("bad-config", path, name),
            f"ignoring tuning entry {name!r} in {path}: {error}; using the heuristic default (correct the entry's "
            "config or re-tune it with `layoutgen tune`)",
        )
        return None


current_problems = tuning_db.current_problems


def _stale_scope(reason: str, detail: str, path: Path, key: tuning_db.TuningKey) -> tuple[Any, ...]:
    """What one stale-entry warning stands for: every entry that is stale for the same cause.  Another
    Triton or torch makes a whole file stale (one warning, not one per shape: 708 for the bundled database);
    a changed search space or timing procedure, a kernel of a family; a changed spec or kernel source, one
    spec's kernel."""
    if reason in ("triton", "torch"):
        return ("stale", reason, path, detail)
    if reason in ("search space", "timing procedure"):
        return ("stale", reason, path, key.family, key.kernel)
    return ("stale", reason, path, key.family, key.spec, key.kernel)


def tuned_config(
    family: str,
    spec_name: str,
    kernel: KernelDecl,
    device: Any,
    extents: dict[str, int],
    dtype: str,
    size: int,
    expected: tuning_db.Expected,
    spec: Any = None,
) -> LaunchConfig | None:
    """The tuned config for this shape, else None (warned): the bucket is picked from the buckets every database
    holds for the shape, and that bucket's entry from the first database whose entry is current (a directory
    in LAYOUTGEN_TUNING_DB holding one bucket does not hide the packaged file's others).  `spec`: the spec
    object, whose problem rules (`LaunchConfig.check_problem`) a tuned config must pass."""
    try:
        name = device_name(device)
        file_name = tuning_db.device_file_name(name)
    except Exception as error:  # the device query must not break serving
        warn_once(("device", str(device)), f"cannot name the tuning database of {device}: {error}")
        return None
    group = (family, spec_name, kernel.name, tuple(extents.items()), dtype, get_family(family).bucket.name)
    dirs = database_dirs()
    found_file = False
    by_bucket: dict[int, list[tuple[Path, tuning_db.TuningEntry]]] = {}  # in directory order
    for directory in dirs:
        path = directory / file_name
        if _database(path, name) is None:
            continue
        found_file = True
        for bucket, entry in (_indexes[path].get(group) or {}).items():
            by_bucket.setdefault(bucket, []).append((path, entry))
    if by_bucket:
        for path, entry in by_bucket[tuning_db.pick_bucket(size, by_bucket)]:
            config = _config_from_entry(entry, path, kernel, expected, spec)
            if config is not None:
                return config
        return None  # every entry there was stale or refused, and each was reported
    searched = ", ".join(str(d) for d in dirs)
    if not found_file:
        if name == tuning_db.CPU_INTERPRETER_DEVICE:
            return None  # CPU runs are the interpreter's (tests, `layoutgen build`): defaults are expected there
        warn_once(
            ("no-device", file_name, tuple(dirs)),
            f"no tuning database {file_name} for device {name!r} in {searched}; using heuristic default "
            f"configs (tune with `layoutgen tune`, or point {TUNING_DB.name} at a directory holding one)",
        )
    else:
        shape = "|".join([family, spec_name, kernel.name, *(f"{k}={v}" for k, v in extents.items()), dtype])
        warn_once(
            ("no-shape", file_name, group),
            f"no current tuning entry for {shape} (any size) in {file_name} ({searched}); using the heuristic "
            "default config",
        )
    return None


_forced: dict[str, dict[str, dict[str, int]]] = {}


def _depth_ok(value: Any, limit: int = 3) -> bool:
    """Whether a parsed JSON value nests no deeper than `limit` (a config is {kernel: {field: int}})."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return False
        if isinstance(item, dict):
            stack += [(child, depth + 1) for child in item.values()]
        elif isinstance(item, list):
            stack += [(child, depth + 1) for child in item]
    return True


def forced_fields(kernel: KernelDecl) -> dict[str, int] | None:
    """The fields `LAYOUTGEN_CONFIG` forces for `kernel`, or None when it forces nothing for it.

    Format: a JSON object whose keys are kernel names, each an object of config fields, e.g.
    `{"pack": {"block_head": 4, "num_warps": 4}, "combine": {"num_warps": 8}}`.  Fields not given keep the
    heuristic default's value.  A malformed value raises ValueError: it is a debugging switch that someone
    set on purpose.
    """
    text = settings.config
    if not text:
        return None
    parsed = _forced.get(text)
    if parsed is None:
        if text.count("[") + text.count("{") > 1000:
            raise ValueError(f"{CONFIG.name} nests far deeper than a config; got {text[:80]!r}...")
        try:
            data = strict_json.loads(text)  # a key given twice is refused, as in the tuning database
        except strict_json.DuplicateKey as twice:
            raise ValueError(
                f"{CONFIG.name} names the key {twice.key[:80]!r} twice in one object; keep one (which of the two "
                "would win is not what the text says)"
            ) from None
        except json.JSONDecodeError as error:
            raise ValueError(f"{CONFIG.name} is not valid JSON: {error}; got {text[:200]!r}") from None
        except RecursionError:
            raise ValueError(f"{CONFIG.name} nests far deeper than a config; got {text[:80]!r}...") from None
        if not isinstance(data, dict) or not _depth_ok(data):
            raise ValueError(
                f"{CONFIG.name} must be a JSON object of kernel names to config fields, e.g. "
                f'{{"pack": {{"num_warps": 4}}}}; got {text[:200]!r}'
            )
        kernel_names = sorted({declared.name for family in families() for declared in family.kernels})
        for name, value in data.items():
            if name not in kernel_names:  # a typo would otherwise force nothing, without a word
                raise ValueError(
                    f"{CONFIG.name} names kernel {name!r}, which no family has; the kernels: {', '.join(kernel_names)}"
                )
            if not isinstance(value, dict):
                raise ValueError(f"{CONFIG.name}[{name!r}] must be an object of config fields; got {value!r}")
        parsed = data
        _forced[text] = parsed
    fields = parsed.get(kernel.name)
    if fields is None:
        return None
    known = set(kernel.config_type.field_names())
    if set(fields) - known:
        raise ValueError(f"{CONFIG.name}[{kernel.name!r}] must hold fields among {sorted(known)}; got {fields!r}")
    return dict(fields)


def resolve_config(
    family: str,
    spec_name: str,
    kernel: KernelDecl,
    device: Any,
    extents: dict[str, int],
    dtype: str,
    size: int,
    spec_hash: str,
    source_hash: str,
    default: Callable[[], LaunchConfig],
    spec: Any = None,
) -> LaunchConfig:
    """The config for `config=None`: forced, else tuned, else the family's heuristic default.  Given `spec`, a
    forced or tuned config must also pass its problem rules (`LaunchConfig.check_problem`): a forced one that
    fails raises, a tuned one is skipped with a warning."""
    forced = forced_fields(kernel)
    if forced is not None:
        try:
            config = kernel.config_type.from_dict({**default().as_dict(), **forced})
            if spec is not None:
                config.check_problem(spec, extents)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{CONFIG.name} forces an invalid {kernel.name} config: {error}") from None
        return config
    expected = expected_for(kernel, spec_hash, source_hash)
    tuned = tuned_config(family, spec_name, kernel, device, extents, dtype, size, expected, spec)
    return tuned if tuned is not None else default()
