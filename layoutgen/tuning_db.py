"""The tuning database: one JSON file per device with the tuned launch config per shape.

A file `tuning_db/<device>.json` holds a `TuningDatabase`: the device, the
software it was tuned with, and one `TuningEntry` per `TuningKey` (spec, kernel,
N, heads per peer, D, dtype, batch bucket), stored under `key.as_str()`.
Files are written with sorted keys, an indent and a trailing newline so that
diffs stay reviewable.  `record` merges new entries into a file under a file
lock and replaces it atomically: concurrent tuners lose nothing and a crash
mid-write leaves the previous file intact.

Nothing here touches CUDA at import; `current_device()` does on call.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterable
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from filelock import FileLock
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

SCHEMA_VERSION = 1
#: Where `layoutgen tune --interpret` records its (meaningless for speed) timings; GPU dispatch never reads it.
CPU_INTERPRETER_DEVICE = "cpu-interpreter"
#: How long a writer waits for another writer's lock before giving up.
LOCK_TIMEOUT_S = 60.0

DTYPE_NAMES = ("bfloat16", "float16", "float32")
_KEY_PATTERN = re.compile(
    r"(?P<spec>[^|]+)\|(?P<kernel>pack|combine)\|N=(?P<N>\d+)\|Hl=(?P<heads_per_peer>\d+)\|D=(?P<D>\d+)"
    r"\|(?P<dtype>[a-z0-9]+)\|B=(?P<batch_bucket>\d+)"
)


class DatabaseError(ValueError):
    """A tuning database file that cannot be used; the message names the file and the problem."""


class TuningKey(BaseModel):
    """What a tuned config is specific to."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: str = Field(min_length=1, pattern=r"^[^|]+$")
    kernel: Literal["pack", "combine"]
    N: int = Field(ge=1)
    heads_per_peer: int = Field(ge=1)
    D: int = Field(ge=1)
    dtype: Literal["bfloat16", "float16", "float32"]
    batch_bucket: int = Field(ge=1)

    def as_str(self) -> str:
        """The canonical entry name, e.g. `pynccl_a2a|pack|N=4|Hl=32|D=512|bfloat16|B=64`."""
        return (
            f"{self.spec}|{self.kernel}|N={self.N}|Hl={self.heads_per_peer}|D={self.D}"
            f"|{self.dtype}|B={self.batch_bucket}"
        )

    @classmethod
    def from_str(cls, text: str) -> TuningKey:
        """Inverse of `as_str`; raises ValueError for anything else."""
        match = _KEY_PATTERN.fullmatch(text)
        if match is None:
            raise ValueError(
                f"not a tuning key: {text!r}; expected e.g. 'pynccl_a2a|pack|N=4|Hl=32|D=512|bfloat16|B=64'"
            )
        return cls.model_validate(match.groupdict())


def _parse_time(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(
            f"measured_at must carry a UTC offset (ISO-8601, e.g. 2026-11-29T07:26:00+00:00); got {text!r}"
        )
    return moment


def utc_now() -> str:
    """The current time as `TuningEntry.measured_at` wants it."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class TuningEntry(BaseModel):
    """The winner of one tuning run and how it compares with the heuristic default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: TuningKey
    config: dict[str, StrictInt]  # a hand-edited "8" or true is an error, not a launch parameter
    median_us: float = Field(ge=0)
    p20_us: float = Field(ge=0)
    p80_us: float = Field(ge=0)
    default_us: float = Field(ge=0)
    trials: StrictInt = Field(ge=0)
    spec_hash: str = Field(min_length=1)
    source_hash: str = Field(min_length=1)
    measured_at: str
    #: Input sets the timing rotated over (`layoutgen.tuning.timing.rotating_sets`): the cache state the
    #: config was ranked in.  A tuner whose rule gives another count for this key tunes it again; None is
    #: an entry from before layoutgen recorded it.
    rotating_sets: StrictInt | None = Field(default=None, ge=1)
    #: The kernel's timing rule when it was ranked (`layoutgen.tuning.timing.TIMING_RULES`); None as above.
    timing_rule: StrictInt | None = Field(default=None, ge=1)

    @field_validator("measured_at")
    @classmethod
    def _check_time(cls, value: str) -> str:
        _parse_time(value)
        return value

    @property
    def measured_time(self) -> datetime:
        return _parse_time(self.measured_at)


class TuningDatabase(BaseModel):
    """The content of one `tuning_db/<device>.json` file."""

    model_config = ConfigDict(extra="forbid")

    schema_version: StrictInt  # `true`, "1" or 1.0 are not version 1
    device_name: str = Field(min_length=1)
    compute_capability: str
    versions: dict[str, str] = Field(default_factory=dict)
    entries: dict[str, TuningEntry] = Field(default_factory=dict)

    @field_validator("schema_version")
    @classmethod
    def _check_schema(cls, value: int) -> int:
        if value != SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {value} is not the supported version {SCHEMA_VERSION}; "
                "re-tune with this layoutgen or use the layoutgen release that wrote the file"
            )
        return value

    @model_validator(mode="after")
    def _check_entry_names(self) -> TuningDatabase:
        for name, entry in self.entries.items():
            if name != entry.key.as_str():
                raise ValueError(f"entry {name!r} holds the key {entry.key.as_str()!r}; the names must match")
        return self

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=2) + "\n"


def device_file_name(device_name: str) -> str:
    """The database file of a device: `"NVIDIA H200"` -> `"NVIDIA_H200.json"`."""
    stem = re.sub(r"[^A-Za-z0-9.-]+", "_", device_name.strip()).strip("_.")
    if not stem:
        raise ValueError(f"device name {device_name!r} has no letters or digits to name a file with")
    return f"{stem}.json"


def current_device() -> tuple[str, str] | None:
    """(name, compute capability like "9.0") of the current CUDA device, or None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return torch.cuda.get_device_name(index), f"{major}.{minor}"


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "none"


def software_versions() -> dict[str, str]:
    """The versions a tuning result depends on: layoutgen, triton, torch and CUDA."""
    import torch

    from layoutgen import __version__

    return {
        "layoutgen": __version__,
        "triton": _version("triton"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
    }


def _problem(error: ValidationError) -> str:
    parts = []
    for detail in error.errors():
        where = ".".join(str(p) for p in detail["loc"]) or "file"
        parts.append(f"{where}: {detail['msg']}")
    return "; ".join(parts)


def parse_database(text: str, source: str) -> TuningDatabase:
    """Validate the JSON text of a database file; `source` names it in errors."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise DatabaseError(f"tuning database {source} is not valid JSON: {error}") from None
    except (ValueError, RecursionError) as error:  # a number too long to convert; nesting beyond the stack
        raise DatabaseError(f"tuning database {source} is not usable JSON: {str(error)[:200]}") from None
    if not isinstance(data, dict):
        raise DatabaseError(f"tuning database {source} must hold a JSON object, got {type(data).__name__}")
    try:
        return TuningDatabase.model_validate(data)
    except ValidationError as error:
        raise DatabaseError(f"tuning database {source} is invalid: {_problem(error)}") from None


def read_database(path: Path) -> TuningDatabase:
    """Read and validate one database file; raises DatabaseError naming the file and the problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DatabaseError(f"tuning database {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise DatabaseError(f"tuning database {path} cannot be read: {error}") from None
    return parse_database(text, str(path))


def _newer(entry: TuningEntry) -> tuple[Any, ...]:
    # Later measurement wins; equal times fall back to the faster, then to the JSON text, so that the merge
    # result never depends on the order the writers came in.
    return (entry.measured_time, -entry.median_us, json.dumps(entry.model_dump(mode="json"), sort_keys=True))


def merge_entries(old: dict[str, TuningEntry], new: Iterable[TuningEntry]) -> dict[str, TuningEntry]:
    merged = dict(old)
    for entry in new:
        name = entry.key.as_str()
        current = merged.get(name)
        if current is None or _newer(entry) > _newer(current):
            merged[name] = entry
    return dict(sorted(merged.items()))


def _write_atomically(path: Path, text: str) -> None:
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def record(
    db_dir: Path,
    device_name: str,
    compute_capability: str,
    entries: list[TuningEntry],
    versions: dict[str, str] | None = None,
) -> Path:
    """Merge `entries` into `db_dir/<device>.json` (created if absent) and return the file's path.

    Per key the later `measured_at` wins.  The file-level `versions` become those of this write
    (default: `software_versions()`).  An existing file that does not validate raises DatabaseError
    and is left as it is.
    """
    db_dir = Path(db_dir)
    db_dir.mkdir(parents=True, exist_ok=True)
    path = db_dir / device_file_name(device_name)
    for entry in entries:
        if not isinstance(entry, TuningEntry):
            raise TypeError(f"entries must be TuningEntry objects, got {type(entry).__name__}")
    with FileLock(str(lock_path(path)), timeout=LOCK_TIMEOUT_S):
        if path.exists():
            existing = read_database(path)
            if existing.compute_capability != compute_capability:
                raise DatabaseError(
                    f"tuning database {path} is for compute capability {existing.compute_capability}, "
                    f"not {compute_capability}; device names must identify the hardware"
                )
            old_entries = existing.entries
        else:
            old_entries = {}
        database = TuningDatabase(
            schema_version=SCHEMA_VERSION,
            device_name=device_name,
            compute_capability=compute_capability,
            versions=dict(versions) if versions is not None else software_versions(),
            entries=merge_entries(old_entries, entries),
        )
        _write_atomically(path, database.to_json())
    return path


def batch_bucket(B: int, buckets: Iterable[int]) -> int:
    """The smallest tuned bucket >= B, else the largest."""
    ordered = sorted(set(buckets))
    if not ordered:
        raise ValueError("batch_bucket needs at least one tuned bucket")
    for bucket in ordered:
        if bucket >= B:
            return bucket
    return ordered[-1]
