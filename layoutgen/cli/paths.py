"""The paths a command writes, checked before any work: directories it creates or fills, and the single
files it replaces (`show --png`, `tune --report`).

Each problem is bad input (exit 2) naming the option and the path, found before a verification, a drawing
or a search, never as an exception after it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from layoutgen.cli.common import bad_input
from layoutgen.files import nearest_existing, regular_file_problem

#: The longest file or directory name ext4, xfs, btrfs and tmpfs take, in bytes.
NAME_MAX = 255


def check_name_lengths(path: Path, what: str) -> None:
    """Every name on `path` fits a file system (a longer one is ENAMETOOLONG when the write comes)."""
    for name in path.parts:
        size = len(os.fsencode(name))
        if size > NAME_MAX:
            raise bad_input(f"{what}: the name {name[:32]}… is {size} bytes long; file systems take at most {NAME_MAX}")


def check_directory_path(directory: Path, what: str) -> Path:
    """`directory` is a directory or can be made one (nothing but directories on its way, no link to nothing);
    its nearest existing part."""
    check_name_lengths(directory, what)
    existing = nearest_existing(directory)
    try:
        exists, is_directory = existing.exists(), existing.is_dir()
    except OSError as error:
        raise bad_input(f"{what}: {existing}: {error.strerror or error}") from None
    if not exists:  # there, yet nothing behind it: a link whose target is missing, or a loop of links
        raise bad_input(
            f"{what}: {existing} is a symbolic link to nothing (its target is missing, or the links loop); "
            "create its target or name another path"
        )
    if not is_directory:
        raise bad_input(f"{what}: {existing} is {'not a directory' if existing == directory else 'a file'}")
    return existing


def check_writable_dir(directory: Path, what: str) -> None:
    """`directory` exists (or can be created) and takes new files: tried with a temporary file in it or in its
    nearest existing parent, which covers permissions, read-only file systems and paths under a regular file."""
    existing = check_directory_path(directory, what)
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".layoutgen-probe-"):
            pass
    except OSError as error:
        raise bad_input(f"{what}: cannot write to {existing} ({error.strerror or error})") from None


def check_output_file(path: Path, what: str, inputs: Iterable[Path] = ()) -> None:
    """A file a command replaces whole: nothing there or a regular file (a device, a FIFO or a socket is never
    replaced: as root, `--png /dev/null` would put a PNG where the device node was), none of the files the
    command reads (`inputs`), in a directory that takes new files."""
    check_name_lengths(path, what)
    if os.path.lexists(path):
        problem = regular_file_problem(path)
        if problem is not None and problem != "no such file":  # a link to nothing is replaced like a new file
            raise bad_input(f"{what}: {path} {problem}; name a regular file, or a new one")
        for source in inputs:
            if problem is None and os.path.lexists(source) and os.path.samefile(path, source):
                raise bad_input(f"{what} would replace {source}, which this command reads; name a file of its own")
    check_writable_dir(path.parent, what)
