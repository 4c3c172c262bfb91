"""The one way layoutgen reads a file (regular files only, never more than a stated number of bytes) and
the one way it replaces one (atomically, `replace_atomically`).

Specs, existing generated modules and tuning databases are read through `read_bounded`.  A FIFO, a
device (a symlink to /dev/zero), a directory or a socket is refused without being read (the file is
opened non-blocking, so a FIFO with no writer cannot hang the open), and a file larger than the limit is
refused after reading at most limit + 1 bytes.  A file that a library opens itself (Optuna reads the
study journal) is checked first with `check_regular_file`, by the same rules, without being opened.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path


class FileRefused(OSError):
    """A file that is not read: missing, not a regular file, too large or unreadable.  `reason` is the
    short phrase a caller puts after the file's name ("no such file", "is a FIFO, not a regular file")."""

    def __init__(self, path: Path, reason: str, code: int = errno.EINVAL) -> None:
        super().__init__(code, reason, str(path))
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


_KINDS = (
    (stat.S_ISDIR, "is a directory"),
    (stat.S_ISFIFO, "is a FIFO (named pipe), not a regular file"),
    (stat.S_ISCHR, "is a character device, not a regular file"),
    (stat.S_ISBLK, "is a block device, not a regular file"),
    (stat.S_ISSOCK, "is a socket, not a regular file"),
)


def _kind(mode: int) -> str | None:
    """Why a file of this mode is not read (None: a regular file)."""
    if stat.S_ISREG(mode):
        return None
    return next((reason for test, reason in _KINDS if test(mode)), "is not a regular file")


def regular_file_problem(path: Path) -> str | None:
    """Without opening it: None when `path` (symlinks followed) is a regular file, else why it is not one
    ("no such file" included).  For callers that must not read a file, only decide whether they may."""
    try:
        return _kind(os.stat(path).st_mode)
    except FileNotFoundError:
        return "no such file"
    except OSError as error:
        return f"cannot be read: {error.strerror or error}"


def check_regular_file(path: str | Path, limit: int) -> int | None:
    """The size of the regular file `path` (symlinks followed), or None when there is nothing there; for
    files another library opens and reads.  Anything else, and a file larger than `limit` bytes, raises
    `FileRefused` (nothing is opened, so a FIFO cannot block)."""
    path = Path(path)
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise FileRefused(path, f"cannot be read: {error.strerror or error}", error.errno or errno.EIO) from None
    problem = _kind(status.st_mode)
    if problem is not None:
        raise FileRefused(path, problem)
    if status.st_size > limit:
        raise FileRefused(path, f"is larger than {limit} bytes ({status.st_size} bytes)", errno.EFBIG)
    return status.st_size


def read_bounded(path: str | Path, limit: int) -> bytes:
    """The bytes of the regular file `path` (symlinks followed), refusing anything else and anything
    larger than `limit` bytes with `FileRefused`."""
    path = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags)
    except FileNotFoundError:
        raise FileRefused(path, "no such file", errno.ENOENT) from None
    except IsADirectoryError:
        raise FileRefused(path, "is a directory", errno.EISDIR) from None
    except OSError as error:
        # A socket cannot be opened at all (ENXIO): name what it is rather than the errno's words.
        kind = regular_file_problem(path)
        if kind is not None and kind.startswith("is "):
            raise FileRefused(path, kind, error.errno or errno.EIO) from None
        raise FileRefused(path, f"cannot be read: {error.strerror or error}", error.errno or errno.EIO) from None
    try:
        problem = _kind(os.fstat(descriptor).st_mode)
        if problem is not None:
            raise FileRefused(path, problem)
        chunks = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(descriptor, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
    except OSError as error:
        if isinstance(error, FileRefused):
            raise
        raise FileRefused(path, f"cannot be read: {error.strerror or error}", error.errno or errno.EIO) from None
    finally:
        os.close(descriptor)
    if len(data) > limit:
        raise FileRefused(path, f"is larger than {limit} bytes", errno.EFBIG)
    return data


def read_text_bounded(path: str | Path, limit: int) -> str:
    """`read_bounded` decoded as UTF-8 (`FileRefused` for bytes that are not UTF-8)."""
    data = read_bounded(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise FileRefused(Path(path), f"is not UTF-8 text ({error.reason} at byte {error.start})") from None


def replace_atomically(path: Path, content: str | bytes, mode: int | None = None) -> None:
    """Replace `path` (a regular file or nothing) with `content` (bytes, or text written as UTF-8 with no
    newline translation) through a synced temporary file in its directory: a reader sees the old file or the
    new one, never a part.

    The new file gets `mode`, or else the replaced file's mode and, where this process may, its owner (a
    shared database stays readable by its other users), or else what the umask allows.
    """
    try:
        previous: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        previous = None
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content.encode("utf-8") if isinstance(content, str) else content)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(temporary, mode)
        elif previous is not None:
            os.chmod(temporary, stat.S_IMODE(previous.st_mode))
            if hasattr(os, "chown") and (previous.st_uid, previous.st_gid) != (os.getuid(), os.getgid()):
                with contextlib.suppress(PermissionError):  # only root may give a file away
                    os.chown(temporary, previous.st_uid, previous.st_gid)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
