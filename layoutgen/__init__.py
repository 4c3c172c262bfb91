"""layoutgen: layout-parameterised DCP pack / combine kernels from a YAML spec.

Importing this package does no CUDA work and imports neither Triton nor the
generated modules; `load()` does that on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING, Any

from layoutgen.loader import load

if TYPE_CHECKING:
    from layoutgen.distributed import DcpExchange

__all__ = ["DcpExchange", "__version__", "load"]


def __getattr__(name: str) -> Any:
    # The distributed exchange is imported on first use: the package import stays cheap.
    if name == "DcpExchange":
        from layoutgen.distributed import DcpExchange

        return DcpExchange
    raise AttributeError(f"module 'layoutgen' has no attribute {name!r}")
