"""Find and import generated modules: bundled ones by name, user-built ones by path."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import stat
import sys
import threading
from pathlib import Path
from types import ModuleType

from layoutgen.files import GENERATED_MARK, generated_by_layoutgen

_lock = threading.Lock()
#: Resolved path -> (the file's identity when it was imported, the module).
_loaded: dict[Path, tuple[tuple[int, int, int], ModuleType]] = {}


@functools.cache
def source_root() -> Path | None:
    """The checkout this package runs from (editable install or PYTHONPATH), or None when installed; looked up
    once per process (it was two thirds of a repeated `load(name)`'s 100 us)."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "generated").is_dir() else None


def generated_dir() -> Path:
    """Where the bundled specs' modules live: the checkout's `generated/`, else the installed copy."""
    root = source_root()
    if root is not None:
        return root / "generated"
    return Path(__file__).resolve().parent / "generated"


def module_name_for(path: Path) -> str:
    """The import name of the user-built module at the resolved `path`: the same in every process (it is baked
    into torch.compile graphs as the custom ops' `module` argument), unlike `hash()`, which is salted per process."""
    digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:16]
    return f"layoutgen_generated_{path.stem}_{digest}"


def _identity(path: Path) -> tuple[int, int, int] | None:
    """What tells one version of the file at `path` from the next (None: no regular file there).  `layoutgen
    build` replaces a module by renaming a new file over it, which changes the inode; the modification time and
    the size catch a file rewritten in place."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (status.st_ino, status.st_mtime_ns, status.st_size) if stat.S_ISREG(status.st_mode) else None


def load_path(path: Path, module_name: str | None = None) -> ModuleType:
    """Import a generated module from a file, once per version of the file: while the file at the resolved path
    is unchanged (inode, st_mtime_ns, size), the module imported before is returned; once it changed (a
    rebuild), the new file is imported under the same name and replaces the old module in sys.modules."""
    path = path.resolve()
    with _lock:
        identity = _identity(path)
        cached = _loaded.get(path)
        if cached is not None and cached[0] == identity:
            return cached[1]
        if identity is None:
            raise FileNotFoundError(
                f"no generated module at {path}; build it first: layoutgen build --spec FILE.yaml --out {path.parent}"
            )
        name = module_name or module_name_for(path)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {path} as a Python module")
        module = importlib.util.module_from_spec(spec)
        previous = sys.modules.get(name)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            if previous is None:
                del sys.modules[name]
            else:  # the version imported before stays what the name means
                sys.modules[name] = previous
            raise
        _loaded[path] = (identity, module)
        return module


def load(name_or_path: str | Path) -> ModuleType:
    """The generated module for a bundled spec name (`"pynccl_a2a"`) or a generated `.py` file.

    A file is imported once per version: while it is unchanged on disk (its inode, st_mtime_ns and size), every
    call returns the module imported first; once it changed (`layoutgen build` rewrote it), the next call imports
    the new file, under the same module name (derived from the resolved path, the same in every process), and
    returns that.  A module obtained before keeps the layout it was imported with."""
    import re

    from layoutgen.spec import NAME_PATTERN

    if not isinstance(name_or_path, str | os.PathLike):
        raise TypeError(
            "load() takes a bundled spec name (e.g. 'pynccl_a2a') or the path of a generated .py file; "
            f"got {type(name_or_path).__name__}"
        )
    text = str(name_or_path)
    if isinstance(name_or_path, str) and re.fullmatch(NAME_PATTERN, text):
        path = generated_dir() / f"{text}.py"
        if not path.is_file():
            from layoutgen.spec import bundled_spec_paths

            known = ", ".join(p.stem for p in bundled_spec_paths())
            raise ValueError(
                f"no generated module for spec '{text}' in {path.parent}; bundled specs: {known}. For a spec of "
                f"your own, build it first (layoutgen build --spec {text}.yaml --out DIR) and pass "
                f"load('DIR/{text}.py')"
            )
        return load_path(path, f"layoutgen.generated.{text}" if source_root() is None else None)
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        raise ValueError(
            f"load() takes a bundled spec name or a generated .py file; {text!r} is a spec: build it first with "
            f"`layoutgen build --spec {text} --out DIR`, then load('DIR/<name>.py')"
        )
    if path.suffix != ".py":
        raise ValueError(
            f"load() takes a bundled spec name or a generated .py file; got {text!r}. "
            "Build a YAML spec first: layoutgen build --spec FILE --out DIR"
        )
    if generated_by_layoutgen(path) is False:  # a file it cannot read is load_path's to report
        raise ValueError(
            f"{text} is not a module generated by layoutgen (its first line is not {GENERATED_MARK.strip()!r} "
            "...), so load() does not import it: build one with `layoutgen build --spec FILE.yaml --out DIR`"
        )
    return load_path(path)
