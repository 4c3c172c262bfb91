"""Where studies live: an Optuna journal file in the user cache by default, or any Optuna storage URL.

The cache root is `platformdirs.user_cache_dir("layoutgen")`, or `LAYOUTGEN_CACHE_DIR` when set; the
default journal is `<cache>/tuning/studies.journal`.  A `--storage` value with `://` is an Optuna RDB URL
(`postgresql://user@host/db`, `sqlite:///file.db`); anything else is the path of a journal file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from layoutgen.settings import settings


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
    """An Optuna storage object for `url` (None: the default journal file, created on first use)."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    if url is not None and "://" in url:
        return optuna.storages.RDBStorage(_with_installed_driver(url), engine_kwargs={"pool_pre_ping": True})
    path = default_journal_path() if url is None else Path(url).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"cannot create the study directory {path.parent}: {error.strerror or error}") from None
    return JournalStorage(JournalFileBackend(str(path)))


def _with_installed_driver(url: str) -> str:
    """SQLAlchemy 2.1 maps a bare `postgresql://` to psycopg 3; use psycopg2 when only that is installed."""
    import importlib.util

    scheme, separator, rest = url.partition("://")
    bare = scheme in ("postgresql", "postgres")
    if bare and importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
        return f"postgresql+psycopg2{separator}{rest}"
    return url
