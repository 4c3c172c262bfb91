"""The `LAYOUTGEN_*` variables a command relies on, checked before it starts: a bad value is bad input (exit 2)
naming the variable and the fix, never an internal error half-way through (exit 1).

The library itself stays lenient where the README promises it (dispatch never raises for an odd
`LAYOUTGEN_TUNING_DB`); only the commands that would act on a value refuse it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from layoutgen.cli.common import CommandFailed, bad_input
from layoutgen.cli.paths import check_writable_dir


def check_cache_dir() -> Path:
    """layoutgen's cache directory, which takes new files; refused naming `LAYOUTGEN_CACHE_DIR` when it is set."""
    from layoutgen.settings import CACHE_DIR
    from layoutgen.tuning.storage import cache_dir

    directory = cache_dir()
    if CACHE_DIR.raw():
        what = f"{CACHE_DIR.name}={CACHE_DIR.raw()}"
        fix = f"set {CACHE_DIR.name} to a writable directory, or unset it for the user cache"
    else:
        what, fix = f"the cache directory {directory}", f"set {CACHE_DIR.name} to a writable directory"
    try:
        check_writable_dir(directory, what)
    except CommandFailed as refused:
        raise bad_input(f"{refused}; {fix}") from None
    return directory


def check_forced_configs() -> None:
    """`LAYOUTGEN_CONFIG` parses and every config it forces is one its kernel accepts: a command that launches
    kernels with `config=None` (build's verification) would otherwise fail at its first launch (exit 1)."""
    from layoutgen.family import families
    from layoutgen.runtime.configs import forced_fields
    from layoutgen.settings import CONFIG

    if not CONFIG.raw():
        return
    fix = f"fix {CONFIG.name} or unset it"
    for family in families():
        for kernel in family.kernels:
            try:
                forced = forced_fields(kernel)
            except ValueError as error:
                raise bad_input(f"{error}; {fix}") from None
            if forced is None:
                continue
            # The fields not forced take the heuristic default's values at a call; their declared defaults
            # (1 where none) stand in for them here, so that only the forced values can be at fault.
            base = {
                field.name: 1 if field.default is dataclasses.MISSING else field.default
                for field in dataclasses.fields(kernel.config_type)
            }
            try:
                kernel.config_type.from_dict({**base, **forced})
            except (TypeError, ValueError) as error:
                raise bad_input(f"{CONFIG.name} forces an invalid {kernel.name} config: {error}; {fix}") from None


def check_database_dir(directory: Path, what: str, fix: str = "pass a directory holding <device>.json files") -> None:
    """`directory` (named `what`: `--db DIR` or the variable) is an existing directory to read databases from."""
    if directory.is_dir():
        return
    problem = "is not a directory" if directory.exists() else "does not exist"
    under_file = next((parent for parent in directory.parents if parent.is_file()), None)
    if under_file is not None:
        problem = f"cannot exist: {under_file} is a file"
    raise bad_input(f"{what} {problem}; {fix}")


def database_dirs(given: list[Path] | None) -> list[Path]:
    """The directories the db commands read: the `--db` ones, else `LAYOUTGEN_TUNING_DB` (which must be a
    directory here, unlike at dispatch, which skips it) and the packaged database."""
    if given:
        for directory in given:
            check_database_dir(directory, f"--db {directory}")
        return list(given)
    from layoutgen.runtime.configs import database_dirs as dispatch_dirs
    from layoutgen.settings import TUNING_DB

    override = TUNING_DB.read()
    if override is not None:
        fix = f"set {TUNING_DB.name} to a directory holding <device>.json files, or unset it"
        check_database_dir(override, f"{TUNING_DB.name}={TUNING_DB.raw()}", fix)
    return dispatch_dirs()
