"""Every `LAYOUTGEN_*` environment variable, declared once: its name, type, default and meaning.

`settings.<attribute>` reads the environment at the moment it is asked (so a test's monkeypatch or a
parent's export takes effect), parsed by the variable's type; nothing else in layoutgen reads
`os.environ` for a `LAYOUTGEN_*` name.  `VARIABLES` is the table the README documents (a test keeps the
two in step).  The shapes follow Triton's `knobs.py`: one typed descriptor per variable.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


@dataclass(frozen=True)
class Variable(Generic[T]):
    """One environment variable: `parse` turns its stripped, non-empty text into a value."""

    name: str
    help: str
    parse: Callable[[str], T]
    default: T

    def read(self) -> T:
        text = os.environ.get(self.name, "").strip()
        if not text:
            return self.default
        try:
            return self.parse(text)
        except SettingError:
            raise
        except ValueError as error:  # a parser's complaint, named after the variable it came from
            raise SettingError(f"{self.name} {error}") from None

    def raw(self) -> str:
        return os.environ.get(self.name, "").strip()


class _Descriptor(Generic[T]):
    def __init__(self, variable: Variable[T]) -> None:
        self.variable = variable

    @overload
    def __get__(self, owner: None, kind: type) -> _Descriptor[T]: ...
    @overload
    def __get__(self, owner: object, kind: type) -> T: ...
    def __get__(self, owner: object | None, kind: type) -> Any:
        return self if owner is None else self.variable.read()


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(text: str) -> bool:
    # Any case: `False` or `NO` read as "on" before, since only the lower-case words counted as off.
    word = text.lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"must be one of {'/'.join(_TRUE)} (on) or {'/'.join(_FALSE)} (off), in any case; got {text!r}")


def _path(text: str) -> Path:
    return Path(os.path.expanduser(text))  # unlike Path.expanduser, never raises for `~nobody`


class SettingError(ValueError):
    """A LAYOUTGEN_* variable that cannot be used; the message names it and the fix (the CLI: exit 2)."""


def _families(text: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in text.split(","):
        name, separator, module = (part.strip() for part in item.strip().partition("="))
        if not separator or not name or not module:
            raise SettingError(
                f"LAYOUTGEN_FAMILIES must be NAME=MODULE pairs separated by commas, e.g. "
                f"'stridecopy=my_package.stridecopy'; got {text!r}"
            )
        if name in pairs:
            raise SettingError(
                f"LAYOUTGEN_FAMILIES names the family {name!r} twice ({name}={pairs[name]} and {name}={module}); "
                "keep one"
            )
        pairs[name] = module
    return pairs


DEBUG = Variable(
    "LAYOUTGEN_DEBUG",
    "`1`: show tracebacks for CLI errors (`1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off`, in any case; "
    "another value is an error)",
    _flag,
    False,
)
TUNING_DB: Variable[Path | None] = Variable(
    "LAYOUTGEN_TUNING_DB",
    "a directory of tuning databases (`<device>.json`) searched before the packaged `tuning_db/`; per entry "
    "the first current match wins; dispatch skips a value that is no directory, `layoutgen db show/check/prune` "
    "refuse it (exit 2)",
    _path,
    None,
)
CONFIG = Variable(
    "LAYOUTGEN_CONFIG",
    "JSON forcing launch configs of the calls of any kernel (DCP `pack` / `combine`, Ulysses `scatter`, "
    "`gather`, `scatter_out`, `gather_out`) made with `config=None`, for debugging and determinism, by kernel "
    'name: `{"pack": {"block_head": 4, "num_warps": 4}, "combine": {"num_warps": 8}}`; fields left out keep '
    "the heuristic default's value (the tuning database is not consulted); a malformed value (a key given twice "
    "in one object included), or a kernel name no family has, raises `ValueError` at the first call (`layoutgen "
    "build` refuses it before verifying, exit 2)",
    str,
    "",
)
CACHE_DIR: Variable[Path | None] = Variable(
    "LAYOUTGEN_CACHE_DIR",
    "layoutgen's cache directory (default: `platformdirs.user_cache_dir(\"layoutgen\")`): the tuner's "
    "default study journal `tuning/studies.journal`, modules rendered from `--spec FILE.yaml`, the "
    "`--interpret` database; `layoutgen tune` refuses one it cannot write to (exit 2)",
    _path,
    None,
)
FAMILIES: Variable[dict[str, str]] = Variable(
    "LAYOUTGEN_FAMILIES",
    "kernel families outside layoutgen, `NAME=MODULE[,NAME=MODULE...]`: each MODULE exposes a "
    "`layoutgen.family.Family` as `FAMILY` (`layoutgen.family.register` does the same in code); each NAME once, "
    "a family name (`[a-z][a-z0-9_]{0,31}`), the name of that `FAMILY`",
    _families,
    {},
)
TEST_POSTGRES_URL = Variable(
    "LAYOUTGEN_TEST_POSTGRES_URL",
    "PostgreSQL server for `tests/test_tuning_postgres.py` (default: the URL `.ci/postgres` writes to "
    "`/tmp/layoutgen_pg_url`); each test creates and drops its own database",
    str,
    "",
)
SGLANG_DCP_KERNELS: Variable[Path | None] = Variable(
    "LAYOUTGEN_SGLANG_DCP_KERNELS",
    "path to sglang's `dcp_kernels.py` for the interop test and the baseline benchmark (default: the "
    "installed `sglang` package, `pip install --no-deps sglang==0.5.23`)",
    _path,
    None,
)

VARIABLES: tuple[Variable[Any], ...] = (
    DEBUG,
    TUNING_DB,
    CONFIG,
    CACHE_DIR,
    FAMILIES,
    TEST_POSTGRES_URL,
    SGLANG_DCP_KERNELS,
)


class Settings:
    """Typed access to the variables above, read when asked."""

    debug = _Descriptor(DEBUG)
    tuning_db = _Descriptor(TUNING_DB)
    config = _Descriptor(CONFIG)
    cache_dir = _Descriptor(CACHE_DIR)
    families = _Descriptor(FAMILIES)
    test_postgres_url = _Descriptor(TEST_POSTGRES_URL)
    sglang_dcp_kernels = _Descriptor(SGLANG_DCP_KERNELS)


settings = Settings()
