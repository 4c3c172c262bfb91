"""Baselines that layoutgen is compared with: sglang's own DCP pack / combine kernels.

sglang's `dcp_kernels.py` needs only torch and Triton, so it is imported by
path from an sglang wheel installed with `pip install --no-deps sglang==0.5.23`
(or from the file named by `LAYOUTGEN_SGLANG_DCP_KERNELS`), never through
`import sglang`, which would pull in its whole serving stack.  The interop
test and the GPU benchmark share this loader.

Triton kernels are defined when the file is imported: set `TRITON_INTERPRET=1`
before loading it on a machine without a GPU.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

SGLANG_DCP_KERNELS_ENV = "LAYOUTGEN_SGLANG_DCP_KERNELS"
SGLANG_VERSION = "0.5.23"
#: Where sglang 0.5.23 keeps the kernels, relative to the `sglang` package directory.
SGLANG_DCP_KERNELS_PATH = Path("kernels/ops/attention/dcp_kernels.py")
#: What the loaded file must define to be the baseline.
SGLANG_DCP_FUNCTIONS = ("dcp_pack_a2a_send", "dcp_lse_combine_triton")


def find_sglang_dcp_kernels(path: str | Path | None = None) -> Path:
    """The file defining sglang's DCP kernels: `path`, else $LAYOUTGEN_SGLANG_DCP_KERNELS, else the
    installed `sglang` package.  Raises FileNotFoundError saying how to get it."""
    explicit = path if path is not None else os.environ.get(SGLANG_DCP_KERNELS_ENV) or None
    if explicit is not None:
        file = Path(explicit).expanduser()
        if not file.is_file():
            source = "path" if path is not None else f"${SGLANG_DCP_KERNELS_ENV}"
            raise FileNotFoundError(f"{source} names {file}, which is not a file")
        return file
    package = importlib.util.find_spec("sglang")  # locates the package without importing it
    if package is None or not package.submodule_search_locations:
        raise FileNotFoundError(
            f"sglang is not installed; run `pip install --no-deps sglang=={SGLANG_VERSION}` "
            f"or set {SGLANG_DCP_KERNELS_ENV} to the path of sglang's dcp_kernels.py"
        )
    for root in map(Path, package.submodule_search_locations):
        if (root / SGLANG_DCP_KERNELS_PATH).is_file():
            return root / SGLANG_DCP_KERNELS_PATH
        # Other sglang versions may keep the kernels elsewhere: find the file that defines them.
        for candidate in sorted(root.rglob("*.py")):
            text = candidate.read_text(encoding="utf-8", errors="replace")
            if all(f"def {name}(" in text for name in SGLANG_DCP_FUNCTIONS):
                return candidate
    raise FileNotFoundError(
        f"the installed sglang ({', '.join(package.submodule_search_locations)}) has no file defining "
        f"{' and '.join(SGLANG_DCP_FUNCTIONS)}; install sglang=={SGLANG_VERSION} with --no-deps"
    )


def load_sglang_dcp_kernels(path: str | Path | None = None) -> ModuleType:
    """sglang's `dcp_kernels` module, imported by path once per file (see `find_sglang_dcp_kernels`)."""
    from layoutgen.loader import load_path

    file = find_sglang_dcp_kernels(path).resolve()
    module = load_path(file, module_name=f"layoutgen_baseline_sglang_dcp_kernels_{abs(hash(str(file))):x}")
    missing = [fn for fn in SGLANG_DCP_FUNCTIONS if not callable(getattr(module, fn, None))]
    if missing:
        raise ImportError(f"{file} does not define {', '.join(missing)}; is it sglang's dcp_kernels.py?")
    return module
