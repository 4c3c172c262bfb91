"""layoutgen: layout-parameterised DCP pack / combine kernels from a YAML spec.

Importing this package does no CUDA work and imports neither Triton nor the
generated modules; `load()` does that on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"

from layoutgen.loader import load

__all__ = ["__version__", "load"]
