"""layoutgen: layout-parameterised Triton kernels from a YAML spec, one kernel family at a time.

Importing this package does no CUDA work and imports neither Triton nor the generated modules; `load()`
does that on first use, and the distributed helpers are imported when first asked for.
"""

from __future__ import annotations

__version__ = "0.2.0"

from typing import TYPE_CHECKING, Any

from layoutgen.loader import load

if TYPE_CHECKING:
    from layoutgen.dcp.distributed import DcpExchange

__all__ = ["DcpExchange", "__version__", "load"]

#: Lazily imported public names -> their module (the package import stays cheap).
_LAZY = {"DcpExchange": "layoutgen.dcp.distributed"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'layoutgen' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
