"""The tuning database: one JSON file per device with the tuned launch config per specialisation.

A file `tuning_db/<device>.json` holds a `TuningDatabase` (schema 2): the device, the software of its
last write, and one `TuningEntry` per `TuningKey` -- (family, spec, kernel, the shape as named extents,
dtype, size bucket) -- stored under `key.as_str()`.  An entry is current only while everything it was
measured against is unchanged, and it records all of it, each derived from content: the spec's layout
hash, its kernel's source hash, the hash of the kernel's search-space declaration, the hash of its
timing procedure, and the major.minor versions of triton and torch (`current_problems` says which
differ).  Nothing is bumped by hand.

Files are written with sorted keys, an indent and a trailing newline so that diffs stay reviewable.
`record` merges new entries into a file under a file lock and replaces it atomically (keeping the
replaced file's mode and, where the writer may, its owner; through a symlink, into its target):
concurrent tuners lose nothing and a crash mid-write leaves the previous file intact.  Every read is
bounded (`layoutgen.files`).

Nothing here touches CUDA at import; `current_device()` does on call.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from filelock import FileLock
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

from layoutgen import strict_json
from layoutgen.files import FileRefused, read_bounded, replace_atomically

SCHEMA_VERSION = 2
#: Where `layoutgen tune --interpret` records its (meaningless for speed) timings; GPU dispatch never reads it.
CPU_INTERPRETER_DEVICE = "cpu-interpreter"
#: How long a writer waits for another writer's lock before giving up.
LOCK_TIMEOUT_S = 60.0
#: A database larger than this is refused unread (the H200 file of 708 entries is 0.96 MB).
MAX_DATABASE_BYTES = 64 << 20
#: The migration of a schema-1 file (layoutgen 0.1): a script of the repository, since it must know the
#: family whose entries it rewrites.
MIGRATE_V1 = "python scripts/migrate_tuning_db_v2.py FILE"

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_KEY_PATTERN = re.compile(
    rf"(?P<family>[a-z][a-z0-9_]*)\|(?P<spec>[^|=]+)\|(?P<kernel>[a-z][a-z0-9_]*)"
    rf"\|(?P<extents>(?:{_NAME}=\d+\|)*)(?P<dtype>[a-z][a-z0-9_]*)\|(?P<bucket_name>{_NAME})=(?P<bucket>\d+)"
)


class DatabaseError(ValueError):
    """A tuning database file that cannot be used; the message names the file and the problem."""


class TuningKey(BaseModel):
    """What a tuned config is specific to."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    family: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    spec: str = Field(min_length=1, pattern=r"^[^|=]+$")
    kernel: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    #: The shape as (name, value) pairs in the family's key order (e.g. N, Hl, D): a list in JSON, so that the
    #: sorted-keys file keeps the order.
    extents: tuple[tuple[str, StrictInt], ...]
    dtype: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    bucket_name: str = Field(pattern=rf"^{_NAME}$")
    bucket: StrictInt = Field(ge=1)

    @field_validator("extents")
    @classmethod
    def _check_extents(cls, extents: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
        for name, value in extents:
            if not re.fullmatch(_NAME, name) or value < 1:
                raise ValueError(f"extent {name}={value} must be a name and a positive int")
        return extents

    def group(self) -> tuple[Any, ...]:
        """Everything but the bucket's value: the entries dispatch chooses a bucket among (the bucket's name is
        the family's, `B` or `S_local`: an entry under another name is never looked up)."""
        return (self.family, self.spec, self.kernel, self.extents, self.dtype, self.bucket_name)

    def shape_text(self) -> str:
        """The key without its bucket, e.g. `dcp|pynccl_a2a|pack|N=4|Hl=32|D=512|bfloat16`."""
        extents = "".join(f"{name}={value}|" for name, value in self.extents)
        return f"{self.family}|{self.spec}|{self.kernel}|{extents}{self.dtype}"

    def as_str(self) -> str:
        """The canonical entry name, e.g. `dcp|pynccl_a2a|pack|N=4|Hl=32|D=512|bfloat16|B=64`."""
        return f"{self.shape_text()}|{self.bucket_name}={self.bucket}"

    @classmethod
    def from_str(cls, text: str) -> TuningKey:
        """Inverse of `as_str`; raises ValueError for anything else."""
        match = _KEY_PATTERN.fullmatch(text)
        if match is None:
            raise ValueError(
                f"not a tuning key: {text!r}; expected e.g. 'dcp|pynccl_a2a|pack|N=4|Hl=32|D=512|bfloat16|B=64'"
            )
        parts = match.groupdict()
        extents = []
        for item in parts.pop("extents").split("|"):
            if item:
                name, _, value = item.partition("=")
                extents.append((name, int(value)))
        return cls.model_validate({**parts, "extents": tuple(extents), "bucket": int(parts["bucket"])})


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
    """The winner of one tuning run, what it was measured against, and how it compares with the default."""

    # Python's json reads and writes Infinity and NaN, which are no JSON: other readers of the file refuse them.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    key: TuningKey
    config: dict[str, StrictInt]  # a hand-edited "8" or true is an error, not a launch parameter
    median_us: float = Field(ge=0)
    p20_us: float = Field(ge=0)
    p80_us: float = Field(ge=0)
    default_us: float = Field(ge=0)
    trials: StrictInt = Field(ge=0)
    spec_hash: str = Field(min_length=1)
    source_hash: str = Field(min_length=1)
    #: sha256 of the kernel's search-space declaration (`layoutgen.family.SearchSpace`).
    space_hash: str = Field(min_length=1)
    #: sha256 of the timing procedure it was ranked under (`layoutgen.tuning.timing.procedure_hash`).
    timing_hash: str = Field(min_length=1)
    #: major.minor of the software that compiled and timed it: {"triton": "3.6", "torch": "2.11"}.
    versions: dict[str, str]
    measured_at: str
    #: Input sets the timing rotated over (`layoutgen.tuning.timing.rotating_sets`): the cache state the
    #: config was ranked in.  A tuner whose rule gives another count for this key tunes it again.
    rotating_sets: StrictInt = Field(ge=1)

    @field_validator("measured_at")
    @classmethod
    def _check_time(cls, value: str) -> str:
        _parse_time(value)
        return value

    @field_validator("versions")
    @classmethod
    def _check_versions(cls, versions: dict[str, str]) -> dict[str, str]:
        for name in ("triton", "torch"):
            if not re.fullmatch(r"\d+\.\d+", versions.get(name, "")):
                raise ValueError(f"versions must give {name} as major.minor (e.g. '3.6'); got {versions!r}")
        return versions

    @property
    def measured_time(self) -> datetime:
        return _parse_time(self.measured_at)


class TuningDatabase(BaseModel):
    """The content of one `tuning_db/<device>.json` file."""

    model_config = ConfigDict(extra="forbid")

    schema_version: StrictInt  # `true`, "2" or 2.0 are not version 2
    device_name: str = Field(min_length=1)
    compute_capability: str
    #: The software of the file's last write (each entry records what it was measured with).
    versions: dict[str, str] = Field(default_factory=dict)
    entries: dict[str, TuningEntry] = Field(default_factory=dict)

    @field_validator("schema_version")
    @classmethod
    def _check_schema(cls, value: int) -> int:
        if value == 1:
            raise ValueError(f"schema_version 1 was written by layoutgen 0.1; convert the file with `{MIGRATE_V1}`")
        if value != SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {value} is not the supported version {SCHEMA_VERSION}; move the file aside or "
                "pass another --db (`layoutgen tune` writes no file it cannot read), or use the layoutgen release "
                "that wrote it"
            )
        return value

    @model_validator(mode="after")
    def _check_entry_names(self) -> TuningDatabase:
        for name, entry in self.entries.items():
            if name != entry.key.as_str():
                raise ValueError(f"entry {name!r} holds the key {entry.key.as_str()!r}; the names must match")
        return self

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=2, allow_nan=False) + "\n"


@dataclass(frozen=True)
class Expected:
    """What a current entry must have been measured against (the running code and software)."""

    spec_hash: str
    source_hash: str
    space_hash: str
    timing_hash: str
    versions: Mapping[str, str]


def current_problems(entry: TuningEntry, expected: Expected) -> list[tuple[str, str]]:
    """Why `entry` is not current: (reason, detail) pairs, empty when it is.  The reasons are stable words
    ("spec", "kernel source", "search space", "timing procedure", "triton", "torch") so that a caller can
    report each once."""
    problems = []
    for reason, held, now in (
        ("spec", entry.spec_hash, expected.spec_hash),
        ("kernel source", entry.source_hash, expected.source_hash),
        ("search space", entry.space_hash, expected.space_hash),
        ("timing procedure", entry.timing_hash, expected.timing_hash),
    ):
        if held != now:
            problems.append((reason, f"tuned for another {reason} (hash {held[:12]}, now {now[:12]})"))
    for name in ("triton", "torch"):
        held, now = entry.versions.get(name, "?"), expected.versions.get(name, "?")
        if held != now:
            problems.append((name, f"tuned with {name} {held}, running {now}"))
    return problems


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


def major_minor(version: str) -> str:
    """`"2.11.0+cu130"` -> `"2.11"` (what an entry is current against)."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return f"{match.group(1)}.{match.group(2)}" if match else version


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


def entry_versions() -> dict[str, str]:
    """major.minor of triton and torch, as entries record them."""
    versions = software_versions()
    return {"triton": major_minor(versions["triton"]), "torch": major_minor(versions["torch"])}


def _problem(error: ValidationError) -> str:
    parts = []
    for detail in error.errors()[:5]:
        where = ".".join(str(p) for p in detail["loc"]) or "file"
        parts.append(f"{where}: {detail['msg'].removeprefix('Value error, ')}")
    more = len(error.errors()) - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def parse_database(text: str, source: str) -> TuningDatabase:
    """Validate the JSON text of a database file; `source` names it in errors."""
    try:
        data = strict_json.loads(text)
    except strict_json.DuplicateKey as error:
        raise DatabaseError(f"tuning database {source} is ambiguous: {error}; delete or rename one of them") from None
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
    except RecursionError:
        raise DatabaseError(f"tuning database {source} is nested too deeply to be a database") from None


def read_database(path: Path) -> TuningDatabase:
    """Read and validate one database file; raises DatabaseError naming the file and the problem."""
    path = Path(path)
    try:
        raw = read_bounded(path, MAX_DATABASE_BYTES)
        text = raw.decode("utf-8")
    except FileRefused as refused:
        missing = refused.reason == "no such file"
        raise DatabaseError(f"tuning database {path} {'does not exist' if missing else refused.reason}") from None
    except UnicodeDecodeError as error:
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


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def database_path(db_dir: Path, device_name: str) -> Path:
    """The file `record` writes: `db_dir/<device>.json`, or the target of a symlink there (a shared
    database linked into a user's directory receives the entry itself)."""
    path = Path(db_dir) / device_file_name(device_name)
    if path.is_symlink():
        return Path(os.path.realpath(path))
    return path


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
    for entry in entries:
        if not isinstance(entry, TuningEntry):
            raise TypeError(f"entries must be TuningEntry objects, got {type(entry).__name__}")
    db_dir.mkdir(parents=True, exist_ok=True)
    path = database_path(db_dir, device_name)
    with FileLock(str(lock_path(path)), timeout=LOCK_TIMEOUT_S):
        if os.path.lexists(path):
            existing = read_database(path)
            if existing.device_name != device_name:
                raise DatabaseError(
                    f"tuning database {path} holds device_name {existing.device_name!r}, not {device_name!r} "
                    "(dispatch on this device ignores it); correct its device_name or move it away"
                )
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
        text = database.to_json()
        size = len(text.encode("utf-8"))
        if size > MAX_DATABASE_BYTES:  # every reader would refuse the file, and its entries
            raise DatabaseError(
                f"tuning database {path} would grow to {size} bytes with these "
                f"{len(entries)} entries, past the {MAX_DATABASE_BYTES} bytes a database is read up to; it is "
                "left as it is: record into another --db directory, or prune this one (`layoutgen db prune`)"
            )
        replace_atomically(path, text)
    return path


def remove(path: Path, entries: Mapping[str, TuningEntry]) -> int:
    """Drop `entries` (name -> the entry as the caller read it) from the database at `path`, under its lock and
    atomically; the count removed.  An entry a writer replaced since the caller's read stays: the caller judged
    the old one."""
    path = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)
    with FileLock(str(lock_path(path)), timeout=LOCK_TIMEOUT_S):
        database = read_database(path)
        doomed = {name for name, entry in entries.items() if database.entries.get(name) == entry}
        if doomed:
            database.entries = {name: entry for name, entry in database.entries.items() if name not in doomed}
            replace_atomically(path, database.to_json())
    return len(doomed)


def pick_bucket(size: int, buckets: Iterable[int]) -> int:
    """The smallest tuned bucket >= size, else the largest."""
    ordered = sorted(set(buckets))
    if not ordered:
        raise ValueError("pick_bucket needs at least one tuned bucket")
    for bucket in ordered:
        if bucket >= size:
            return bucket
    return ordered[-1]
