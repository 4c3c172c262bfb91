"""Where studies live: an Optuna journal file in the user cache by default, or any Optuna storage URL.

The cache root is `platformdirs.user_cache_dir("layoutgen")`, or `LAYOUTGEN_CACHE_DIR` when set; the
default journal is `<cache>/tuning/studies.journal`.  A `--storage` value with `://` is an Optuna RDB URL
(`postgresql://user@host/db`, `sqlite:///file.db`); anything else is the path of a journal file.

A journal is one JSON record per line, appended by every process that tunes into it; Optuna replays the
whole file at every open.  `open_storage` makes sure a journal can be replayed before Optuna reads it:

* It must be a regular file (or absent) of at most MAX_JOURNAL_BYTES; a FIFO, a device, a directory or a
  socket is refused without being opened.
* A record cut off by an interrupted append (ENOSPC, a SIGKILL mid-write) is removed, and so is
  everything from the first line that is not a whole record on (garbage in the middle: what follows it
  cannot be replayed without it).  The bytes removed are kept in `<journal>.damaged-<UTC time>`
  (`cat <journal> <journal>.damaged-...` gives back the original), and stderr says so; the whole records
  before them are the study state the run resumes from.  A file whose first line is not a journal
  record is not a journal: it is refused, never cut.
* Every append first removes a torn end that a failed append of this run left, so one ENOSPC cannot
  make the next record unreadable; errors reading or appending name the journal.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layoutgen.files import FileRefused, check_regular_file
from layoutgen.settings import settings

#: A journal larger than this is refused: Optuna replays the whole file into memory at every open.  A study
#: of 4 trials writes 14 KB (47 records, under the interpreter), so the default grid of 936 studies of up
#: to 24 trials writes about 70 MB; the limit leaves room for a dozen such runs in one journal.
MAX_JOURNAL_BYTES = 1 << 30
#: Every record Optuna appends starts with these bytes (its dict puts op_code first): a last line that
#: starts so, or is a start of them, is a record cut off mid-write.
_RECORD_START = b'{"op_code":'
#: What `read_logs` and replay raise for a record they cannot use.
_REPLAY_ERRORS = (ValueError, KeyError, TypeError, IndexError, AttributeError, AssertionError)


class JournalError(ValueError):
    """A study journal that cannot be used; the message names the file and the fix."""


def cache_dir() -> Path:
    """layoutgen's cache root (studies, generated modules of user spec files)."""
    override = settings.cache_dir
    if override is not None:
        return override
    import platformdirs

    return Path(platformdirs.user_cache_dir("layoutgen"))


def default_journal_path() -> Path:
    return cache_dir() / "tuning" / "studies.journal"


def describe_storage(url: str | None) -> str:
    if url is None:
        return f"journal file {default_journal_path()}"
    if "://" in url:
        scheme, _, rest = url.partition("://")
        # Never echo a password that the URL may carry.
        host = rest.rsplit("@", 1)[-1]
        return f"{scheme}://…@{host}" if "@" in rest else url
    return f"journal file {url}"


def open_storage(url: str | None) -> Any:
    """An Optuna storage object for `url` (None: the default journal file, created on first use).

    A journal is checked and, where damaged, repaired first (see the module docstring); JournalError
    names the file when it cannot be used."""
    import optuna
    from optuna.storages import JournalStorage

    if url is not None and "://" in url:
        try:
            try:
                return optuna.storages.RDBStorage(_with_installed_driver(url), engine_kwargs={"pool_pre_ping": True})
            except Exception as error:
                # Two tuners creating a fresh database's schema at once: one loses alembic's version row (an
                # IntegrityError, 2 of 3 tries with two processes on a new sqlite file); the schema is there now.
                if type(error).__name__ != "IntegrityError":
                    raise
                return optuna.storages.RDBStorage(_with_installed_driver(url), engine_kwargs={"pool_pre_ping": True})
        except Exception as error:  # SQLAlchemy's errors, many kinds: reported as one line naming the URL
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            raise ValueError(
                f"--storage {describe_storage(url)}: cannot open it as an Optuna database ({type(error).__name__}: "
                f"{reason}); check the URL (e.g. postgresql://user@host/db, sqlite:///file.db) and that the "
                "server is reachable, or pass a journal file path"
            ) from None
    path = default_journal_path() if url is None else Path(url).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"cannot create the study directory {path.parent}: {error.strerror or error}") from None
    try:
        check_regular_file(path, MAX_JOURNAL_BYTES)
    except FileRefused as refused:
        raise JournalError(
            f"study journal {path} {refused.reason}; pass --storage a journal file path (or a database URL), "
            "or move it aside: decisions already in the tuning database are kept"
        ) from None
    backend = _journal_backend(path)
    with backend.locked():
        _repair(path, _first_damage(path) if not _last_line_is_whole(path) else None)
    try:
        return JournalStorage(backend)
    except _REPLAY_ERRORS as error:
        failure: BaseException = error
    # A damaged line before the last one: Optuna stops replaying there.
    with backend.locked():
        damage = _first_damage(path)
        if damage is None:
            raise JournalError(
                f"study journal {path} holds whole records that cannot be replayed ({type(failure).__name__}: "
                f"{str(failure)[:200]}); move it aside (e.g. `mv {path} {path}.old`) and run again: decisions "
                "already in the tuning database are kept"
            ) from failure
        _repair(path, damage)
    try:
        return JournalStorage(_journal_backend(path))
    except _REPLAY_ERRORS as error:
        raise JournalError(
            f"study journal {path} cannot be replayed even after removing its damaged end "
            f"({type(error).__name__}: {str(error)[:200]}); move it aside and run again"
        ) from error


# ----------------------------------------------------------------------------------------------------------
# The journal file: checks, repair, and a backend whose errors name it
# ----------------------------------------------------------------------------------------------------------
def _whole_record(line: bytes) -> bool:
    """Whether one line is a record Optuna can replay: a JSON object with its op_code and worker_id, ended by
    a newline (Optuna itself skips a last line without one)."""
    if not line.endswith(b"\n"):
        return False
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError too
        return False
    if not isinstance(record, dict):
        return False
    op_code = record.get("op_code")
    return isinstance(op_code, int) and not isinstance(op_code, bool) and isinstance(record.get("worker_id"), str)


def _looks_torn(line: bytes) -> bool:
    """Whether a line that is not a whole record is the start of one (an append cut off)."""
    return line.startswith(_RECORD_START) or (_RECORD_START.startswith(line) and bool(line))


def _last_line_is_whole(path: Path) -> bool:
    """Whether the journal is empty or ends with a whole record; reads only its last line."""
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return True
        end, last_line_start = size - 1, 0  # the final byte may be the last line's own newline
        while end > 0:
            start = max(0, end - (1 << 16))
            handle.seek(start)
            newline = handle.read(end - start).rfind(b"\n")
            if newline >= 0:
                last_line_start = start + newline + 1
                break
            end = start
        handle.seek(last_line_start)
        return _whole_record(handle.read())


@dataclass(frozen=True)
class _Damage:
    """The first line of a journal that is not a whole record."""

    line: int  # 1-based
    offset: int  # its first byte
    lines: int  # lines from it to the end, itself included
    first_line: bytes  # its first bytes, to tell a torn record from another file
    total_lines: int


def _first_damage(path: Path) -> _Damage | None:
    with path.open("rb") as handle:
        offset = 0
        for number, line in enumerate(handle, start=1):
            if not _whole_record(line):
                rest = 1 + sum(1 for _ in handle)
                return _Damage(number, offset, rest, line[: len(_RECORD_START)], number - 1 + rest)
            offset += len(line)
    return None


def _repair(path: Path, damage: _Damage | None) -> None:
    """Cut the journal before `damage`, keeping the bytes cut in a side file; JournalError when the file is
    no journal or the cut bytes cannot be kept."""
    if damage is None:
        return
    torn_end = damage.lines == 1 and _looks_torn(damage.first_line)
    if damage.line == 1 and not _looks_torn(damage.first_line):
        raise JournalError(
            f"study journal {path} is not an Optuna journal: its first line is not a journal record; pass "
            "--storage the path of a journal file (a new one is created) or a database URL"
        )
    size = path.stat().st_size
    side, problem = _set_aside(path, damage.offset)
    if side is None and not torn_end:
        raise JournalError(
            f"study journal {path}: line {damage.line} of {damage.total_lines} is not a whole record, and the "
            f"lines from there on cannot be set aside ({problem}); free space or move the journal aside, "
            "then run again"
        )
    _truncate(path, damage.offset)
    kept = f"kept in {side}" if side is not None else f"not kept: {problem}"
    if torn_end:
        message = (
            f"study journal {path}: its last record was cut off by an interrupted write ({size - damage.offset} "
            f"bytes, {kept}); removed it, resuming from the {damage.line - 1} whole records before it"
        )
    else:
        message = (
            f"study journal {path}: line {damage.line} of {damage.total_lines} is not a whole record; kept the "
            f"{damage.line - 1} records before it and removed the {damage.lines} lines from there on "
            f"({size - damage.offset} bytes, {kept}); the studies they held are tuned again"
        )
    print(f"layoutgen: {message}", file=sys.stderr, flush=True)


def _set_aside(path: Path, offset: int) -> tuple[Path | None, str]:
    """Copy the bytes of `path` from `offset` on into a new `<path>.damaged-<UTC time>`: (its path, "") or
    (None, why not)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for attempt in range(100):
        side = path.with_name(f"{path.name}.damaged-{stamp}" + (f"-{attempt}" if attempt else ""))
        try:
            target = side.open("xb")
        except FileExistsError:
            continue
        except OSError as error:
            return None, error.strerror or str(error)
        try:
            with target, path.open("rb") as source:
                source.seek(offset)
                while chunk := source.read(1 << 20):
                    target.write(chunk)
                target.flush()
                os.fsync(target.fileno())
        except OSError as error:
            side.unlink(missing_ok=True)
            return None, error.strerror or str(error)
        return side, ""
    return None, f"100 files named {path.name}.damaged-{stamp}* exist"


def _truncate(path: Path, length: int) -> None:
    try:
        with path.open("r+b") as handle:
            handle.truncate(length)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        raise JournalError(f"study journal {path}: cannot remove its damaged end: {error.strerror or error}") from None


def _cut_torn_end(path: Path) -> None:
    """Remove bytes after the journal's last newline: what a failed append (ENOSPC) left.  Called under the
    journal's lock, so no other process is in the middle of an append."""
    try:
        with path.open("rb") as handle:
            end = handle.seek(0, os.SEEK_END)
            if end == 0:
                return
            handle.seek(end - 1)
            if handle.read(1) == b"\n":
                return
    except FileNotFoundError:
        return
    _repair(path, _first_damage(path))


def _journal_backend(path: Path) -> Any:
    from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

    class NamedJournalBackend(JournalFileBackend):
        """Optuna's journal file backend, whose errors name the file and whose appends never follow a torn
        record."""

        def __init__(self) -> None:
            super().__init__(str(path), JournalFileSymlinkLock(str(path)))

        @contextlib.contextmanager
        def locked(self) -> Iterator[None]:
            """The lock every writer of the journal holds while it appends."""
            try:
                self._lock.acquire()
            except OSError as error:
                raise JournalError(
                    f"study journal {path}: cannot take its lock {path}.lock: {error.strerror or error}"
                ) from None
            try:
                yield
            finally:
                self._lock.release()

        def read_logs(self, log_number_from: int) -> Generator[dict[str, Any], None, None]:
            try:
                yield from super().read_logs(log_number_from)
            except ValueError as error:  # a line that is not JSON, or not ended by a newline
                raise JournalError(f"study journal {path}: a record cannot be read ({error})") from error

        def append_logs(self, logs: list[dict[str, Any]]) -> None:
            text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs)
            with self.locked():
                _cut_torn_end(path)
                try:
                    with path.open("ab") as handle:
                        handle.write(text.encode("utf-8"))
                        handle.flush()
                        os.fsync(handle.fileno())
                except OSError as error:
                    raise OSError(
                        error.errno,
                        f"{error.strerror or error}: cannot append to the study journal (free space and run the "
                        "same command again: it resumes, and the record cut off here is removed then)",
                        str(path),
                    ) from error

    return NamedJournalBackend()


def _with_installed_driver(url: str) -> str:
    """SQLAlchemy 2.1 maps a bare `postgresql://` to psycopg 3; use psycopg2 when only that is installed."""
    import importlib.util

    scheme, separator, rest = url.partition("://")
    bare = scheme in ("postgresql", "postgres")
    if bare and importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
        return f"postgresql+psycopg2{separator}{rest}"
    return url
