"""Which launch config a pack / combine call gets when the caller passes `config=None`.

In order: `LAYOUTGEN_CONFIG` (forced, JSON), then the tuning database of the
tensors' device (`LAYOUTGEN_TUNING_DB`, then the packaged `tuning_db/`), then the
heuristic default of `layoutgen.config`.  The database never raises on this
path: a corrupt or foreign file, a stale entry or a missing shape is reported
once with a `LayoutgenWarning` and skipped.  Callers cache the result per plan,
so all of this runs once per shape.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from layoutgen import tuning_db
from layoutgen.config import CONFIG_TYPES, KernelConfig, default_combine_config, default_pack_config
from layoutgen.spec import LayoutSpec

CONFIG_ENV = "LAYOUTGEN_CONFIG"
TUNING_DB_ENV = "LAYOUTGEN_TUNING_DB"
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
#: CUDA's limit on a grid's y dimension, along which pack runs its batch blocks (the generated launcher
#: refuses a config that needs more).
MAX_GRID_Y = 65535


class LayoutgenWarning(UserWarning):
    """Something layoutgen worked around (e.g. a stale tuning entry); filter with this category."""


_lock = threading.Lock()
_warned: set[tuple[Any, ...]] = set()
_databases: dict[Path, tuning_db.TuningDatabase | None] = {}
_indexes: dict[Path, dict[tuple[Any, ...], dict[int, tuning_db.TuningEntry]]] = {}
_device_names: dict[torch.device, str] = {}


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


def database_dirs() -> list[Path]:
    """Where dispatch looks for `<device>.json`, first match per entry wins."""
    dirs = []
    override = os.environ.get(TUNING_DB_ENV, "").strip()
    if override:
        dirs.append(Path(os.path.expanduser(override)))  # unlike Path.expanduser, never raises for `~nobody`
    dirs.append(packaged_database_dir())
    return dirs


def packaged_database_dir() -> Path:
    """The checkout's `tuning_db/`, else the copy installed inside the package."""
    from layoutgen.loader import source_root

    root = source_root()
    if root is not None:
        return root / "tuning_db"
    return Path(__file__).resolve().parent.parent / "_tuning_db"  # pyproject maps tuning_db/ there


def device_name(device: torch.device) -> str:
    """The database device name: the CUDA device's name, or `cpu-interpreter` for CPU tensors."""
    name = _device_names.get(device)
    if name is None:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else tuning_db.CPU_INTERPRETER_DEVICE
        _device_names[device] = name
    return name


def _database(path: Path) -> tuning_db.TuningDatabase | None:
    if path in _databases:
        return _databases[path]
    database: tuning_db.TuningDatabase | None = None
    try:
        exists = path.is_file()
    except OSError as error:  # e.g. a LAYOUTGEN_TUNING_DB path too long for the file system
        warn_once(("corrupt", path), f"ignoring the tuning database {path}: {error}")
        exists = False
    if exists:
        try:
            database = tuning_db.read_database(path)
        except tuning_db.DatabaseError as error:
            warn_once(("corrupt", path), f"ignoring the tuning database: {error}")
    index: dict[tuple[Any, ...], dict[int, tuning_db.TuningEntry]] = {}
    if database is not None:
        for entry in database.entries.values():
            key = entry.key
            group = (key.spec, key.kernel, key.N, key.heads_per_peer, key.D, key.dtype)
            index.setdefault(group, {})[key.batch_bucket] = entry
    with _lock:
        _databases[path] = database
        _indexes[path] = index
    return database


def _config_from_entry(
    entry: tuning_db.TuningEntry, path: Path, kind: type[KernelConfig], spec_hash: str, source_hash: str
) -> KernelConfig | None:
    name = entry.key.as_str()
    if entry.spec_hash != spec_hash or entry.source_hash != source_hash:
        stale = "spec" if entry.spec_hash != spec_hash else "generated source"
        warn_once(
            ("stale", path, name),
            f"ignoring tuning entry {name!r} in {path}: it was tuned for another {stale} "
            f"(hash {getattr(entry, 'spec_hash' if stale == 'spec' else 'source_hash')[:12]}, now "
            f"{(spec_hash if stale == 'spec' else source_hash)[:12]}); re-run `layoutgen tune`",
        )
        return None
    try:
        return kind.from_dict(entry.config)
    except (TypeError, ValueError) as error:
        warn_once(("bad-config", path, name), f"ignoring tuning entry {name!r} in {path}: {error}")
        return None


def tuned_config(
    spec: LayoutSpec,
    kernel: str,
    device: torch.device,
    N: int,
    heads_per_peer: int,
    D: int,
    dtype: torch.dtype,
    batch: int,
    spec_hash: str,
    source_hash: str,
) -> KernelConfig | None:
    """The tuned config for this shape from the first database that has a current one, else None (warned)."""
    kind = CONFIG_TYPES[kernel]
    try:
        name = device_name(device)
        file_name = tuning_db.device_file_name(name)
    except Exception as error:  # the device query must not break serving
        warn_once(("device", str(device)), f"cannot name the tuning database of {device}: {error}")
        return None
    group = (spec.name, kernel, N, heads_per_peer, D, _DTYPE_NAMES.get(dtype, str(dtype)))
    dirs = database_dirs()
    found_file = False
    skipped_entry = False  # a stale or invalid entry was already reported: no second warning for this call
    for directory in dirs:
        path = directory / file_name
        if _database(path) is None:
            continue
        found_file = True
        buckets = _indexes[path].get(group)
        if not buckets:
            continue
        entry = buckets[tuning_db.batch_bucket(batch, buckets)]
        config = _config_from_entry(entry, path, kind, spec_hash, source_hash)
        if config is not None:
            return config
        skipped_entry = True
    if skipped_entry:
        return None
    searched = ", ".join(str(d) for d in dirs)
    if not found_file:
        if name == tuning_db.CPU_INTERPRETER_DEVICE:
            return None  # CPU runs are the interpreter's (tests, `layoutgen build`): defaults are expected there
        warn_once(
            ("no-device", file_name, tuple(dirs)),
            f"no tuning database {file_name} for device {name!r} in {searched}; using heuristic default "
            f"configs (tune with `layoutgen tune`, or point {TUNING_DB_ENV} at a directory holding one)",
        )
    else:
        shape = "|".join([group[0], kernel, f"N={N}", f"Hl={heads_per_peer}", f"D={D}", group[5]])
        warn_once(
            ("no-shape", file_name, group),
            f"no current tuning entry for {shape} (any batch) in {file_name} ({searched}); using the heuristic "
            "default config",
        )
    return None


@dataclass(frozen=True)
class ForcedConfigs:
    """The parsed `LAYOUTGEN_CONFIG`: per kernel, fields that override the heuristic default."""

    text: str
    fields: dict[str, dict[str, int]]


_forced: dict[str, ForcedConfigs] = {}


def forced_fields(kernel: str) -> dict[str, int] | None:
    """The fields `LAYOUTGEN_CONFIG` forces for `kernel`, or None when it forces nothing for it.

    Format: a JSON object with optional keys "pack" and "combine", each an object of config fields,
    e.g. `{"pack": {"block_head": 4, "num_warps": 4}, "combine": {"num_warps": 8}}`.  Fields not given
    keep the heuristic default's value.  A malformed value raises ValueError: it is a debugging switch
    that someone set on purpose.
    """
    text = os.environ.get(CONFIG_ENV, "").strip()
    if not text:
        return None
    parsed = _forced.get(text)
    if parsed is None:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{CONFIG_ENV} is not valid JSON: {error}; got {text!r}") from None
        if not isinstance(data, dict) or set(data) - set(CONFIG_TYPES):
            raise ValueError(
                f"{CONFIG_ENV} must be a JSON object with keys among {sorted(CONFIG_TYPES)}, e.g. "
                f'{{"pack": {{"num_warps": 4}}}}; got {text!r}'
            )
        fields: dict[str, dict[str, int]] = {}
        for name, value in data.items():
            known = {field.name for field in dataclasses.fields(CONFIG_TYPES[name])}
            if not isinstance(value, dict) or set(value) - known:
                raise ValueError(
                    f"{CONFIG_ENV}[{name!r}] must be an object with fields among {sorted(known)}; got {value!r}"
                )
            fields[name] = value
        parsed = ForcedConfigs(text, fields)
        _forced[text] = parsed
    return parsed.fields.get(kernel)


def resolve_config(
    spec: LayoutSpec,
    kernel: str,
    device: torch.device,
    N: int,
    heads_per_peer: int,
    D: int,
    dtype: torch.dtype,
    batch: int,
    elem_size: int,
    spec_hash: str,
    source_hash: str,
) -> KernelConfig:
    """The config for `config=None`: forced, else tuned, else the heuristic default."""
    default_for = default_pack_config if kernel == "pack" else default_combine_config
    forced = forced_fields(kernel)
    if forced is not None:
        base = default_for(spec, N, heads_per_peer, D, max(batch, 1), elem_size)
        try:
            return CONFIG_TYPES[kernel].from_dict({**base.as_dict(), **forced})
        except (TypeError, ValueError) as error:
            raise ValueError(f"{CONFIG_ENV} forces an invalid {kernel} config: {error}") from None
    tuned = tuned_config(spec, kernel, device, N, heads_per_peer, D, dtype, batch, spec_hash, source_hash)
    chosen = tuned if tuned is not None else default_for(spec, N, heads_per_peer, D, max(batch, 1), elem_size)
    return fit_grid(chosen, batch) if kernel == "pack" else chosen


def fit_grid(config: KernelConfig, batch: int) -> KernelConfig:
    """A pack config whose batch blocks fit the grid's y axis: past MAX_GRID_Y x block_batch rows (a batch
    no decode step reaches, but dispatch must not fail on it) the rows per program double until they fit."""
    block_batch = config.block_batch
    while -(-batch // block_batch) > MAX_GRID_Y:
        block_batch *= 2
    return config if block_batch == config.block_batch else dataclasses.replace(config, block_batch=block_batch)
