"""Find and import generated modules: bundled ones by name, user-built ones by path."""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType

_lock = threading.Lock()
_loaded: dict[Path, ModuleType] = {}


def source_root() -> Path | None:
    """The checkout this package runs from (editable install or PYTHONPATH), or None when installed."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "generated").is_dir() else None


def generated_dir() -> Path:
    """Where the bundled specs' modules live: the checkout's `generated/`, else the installed copy."""
    root = source_root()
    if root is not None:
        return root / "generated"
    return Path(__file__).resolve().parent / "generated"


def load_path(path: Path, module_name: str | None = None) -> ModuleType:
    """Import a generated module from a file, once per resolved path."""
    path = path.resolve()
    with _lock:
        module = _loaded.get(path)
        if module is not None:
            return module
        if not path.is_file():
            raise FileNotFoundError(
                f"no generated module at {path}; build it first: layoutgen build --spec FILE.yaml --out {path.parent}"
            )
        name = module_name or f"layoutgen_generated_{path.stem}_{abs(hash(str(path))):x}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {path} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        _loaded[path] = module
        return module


def load(name_or_path: str | Path) -> ModuleType:
    """The generated module for a bundled spec name (`"pynccl_a2a"`) or a generated `.py` file."""
    import re

    from layoutgen.spec import NAME_PATTERN

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
    return load_path(path)
