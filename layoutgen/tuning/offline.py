"""Compile a generated kernel for a GPU this machine does not have, without launching anything.

Triton's interpreter (`TRITON_INTERPRET=1`, the CPU tests) runs a kernel's Python and never sees what only
the compiler checks: that a variable has one type on both sides of an `if`, constexpr rules, what the
backend accepts.  The tensor-major Ulysses programs' 64-bit path failed that way on the H200 while every
CPU test passed (`program_in_tensor` int32 in one branch, int64 in the other).  Here the family's
`compile_variant` runs the module's own launcher on `meta` tensors, as the tuner's compile pool does, so
Triton binds and specialises every argument as a real launch would, and compiles for `arch` with the
`ptxas` that ships with Triton.  The jobs are the family's `offline_jobs(spec)`; a family that declares
none is compiled only where it runs.

Relies on Triton 3.6 internals (`triton.runtime.driver.set_active` and its `_active`, `JITFunction.run(...,
warmup=True)`), and needs a process without `TRITON_INTERPRET` (under it `@triton.jit` gives interpreted
functions, which cannot compile): `layoutgen build` and the tests run it in child processes
(`check_in_subprocesses`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

#: Architecture the checks compile for: the H200's (the only GPU this project's numbers come from).
ARCH = 90


class _OfflineDriver:
    """Answers what Triton's JIT asks of the active driver before compiling; launches nothing."""

    def __init__(self, arch: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target

    def get_active_torch_device(self) -> Any:
        import torch

        return torch.device("meta")


class _CompileOnly:
    """Stands in for a `@triton.jit` kernel in a launcher: compiles, keeps the results, launches nothing."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.compiled: list[Any] = []

    def __getitem__(self, grid: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> None:
            self.compiled.append(self.kernel.run(*args, grid=grid, warmup=True, **kwargs))

        return run


def compile_offline(module: ModuleType, job: Mapping[str, Any], arch: int = ARCH) -> Any:
    """Compile the kernel of `job` (the family's compile-job dict: kernel, config, shape, dtype) for
    compute capability `arch` (x 10); the compiled kernel (`.asm["cubin"]`, `.metadata`) of its last launch."""
    return compile_offline_all(module, job, arch)[-1]


def compile_offline_all(module: ModuleType, job: Mapping[str, Any], arch: int = ARCH) -> list[Any]:
    """`compile_offline`, every launch of the job in order (a DCP pack job's contract-v2 forms after the
    plain pack)."""
    import triton.runtime.driver

    from layoutgen.family import get_family

    compiler = _CompileOnly(getattr(module, f"_{job['kernel']}_kernel"))
    drivers = triton.runtime.driver
    # What was active before, None included: reset_active() would build the default driver, which needs a GPU.
    previous = drivers._active
    drivers.set_active(_OfflineDriver(arch))
    try:
        get_family(module.SPEC.family).compile_variant(module, job, compiler)
    finally:
        drivers._active = previous
    if not compiler.compiled:
        raise RuntimeError(f"the launcher of {job['kernel']} launched nothing")
    return [compiled.result() if hasattr(compiled, "result") else compiled for compiled in compiler.compiled]


def unavailable() -> str | None:
    """Why this machine cannot compile for NVIDIA GPUs offline (no CUDA backend or ptxas in its Triton), else
    None: `build` then says so once and skips the compiles, which are a check, not a build step."""
    try:
        import triton.backends
        from triton.backends.nvidia.compiler import get_ptxas

        if "nvidia" not in triton.backends.backends:
            return "this Triton has no NVIDIA backend"
        if get_ptxas(ARCH) is None:
            return "no ptxas in this Triton"
    except Exception as error:  # any failure to find the toolchain means the same: no offline compile here
        return f"no ptxas in this Triton ({type(error).__name__}: {error})"
    return None


def check_module(name_or_path: str, arch: int = ARCH) -> list[dict[str, str]]:
    """Compile every kernel of a bundled spec's module (or a generated module's path) for `arch` at both
    offset widths: one {"kernel", "width", "error"} per compile ("error" empty when it compiled)."""
    from layoutgen.family import get_family
    from layoutgen.loader import load

    module = load(name_or_path)
    results = []
    for width, job in get_family(module.SPEC.family).offline_jobs(module.SPEC):
        try:
            compile_offline(module, job, arch)
        except Exception as error:  # every complaint is reported, not only the first
            results.append({"kernel": job["kernel"], "width": width, "error": f"{type(error).__name__}: {error}"})
        else:
            results.append({"kernel": job["kernel"], "width": width, "error": ""})
    return results


def check_in_subprocesses(paths: list[str], workers: int | None = None) -> dict[str, list[dict[str, str]]]:
    """`check_module` of each path, in parallel processes without `TRITON_INTERPRET` (under it a module's
    kernels are interpreted functions, which do not compile); a process that dies reports its stderr."""
    import json
    import os
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    from layoutgen.tuning.compile import child_environment

    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # `build --out D` writes D/<name>.py and nothing else
    env.update(child_environment())  # the child loads the same specs: the families registered here

    def run(path: str) -> list[dict[str, str]]:
        command = [sys.executable, "-m", "layoutgen.tuning.offline", "--json", path]
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, check=False)
        except subprocess.TimeoutExpired:
            return [{"kernel": "(all)", "width": "", "error": "the compile process ran past 900 s"}]
        try:
            return list(json.loads(done.stdout)[path])
        except (ValueError, KeyError, TypeError):
            return [{"kernel": "(all)", "width": "", "error": f"the compile process failed: {done.stderr[-2000:]}"}]

    with ThreadPoolExecutor(max_workers=workers or min(len(paths), os.cpu_count() or 1) or 1) as pool:
        return dict(zip(paths, pool.map(run, paths), strict=True))


def main(arguments: list[str]) -> int:
    """`python -m layoutgen.tuning.offline [--json] SPEC|PATH ...`: a line per compile (or one JSON object
    of every module's results); exit 1 when any failed, 2 for a name or path that is not a generated module."""
    import argparse
    import json

    parser = argparse.ArgumentParser(
        prog="python -m layoutgen.tuning.offline",
        description=f"Compile every kernel of generated modules for sm_{ARCH} at a 32- and a 64-bit shape, "
        "without a GPU.",
    )
    parser.add_argument("modules", nargs="+", metavar="SPEC|PATH", help="a bundled spec name or a generated .py")
    parser.add_argument("--json", action="store_true", help="print one JSON object of every module's results")
    options = parser.parse_args(arguments)
    try:
        results = {name: check_module(name) for name in options.modules}
    except ValueError as error:
        parser.exit(2, f"error: {error}\n")
    if options.json:
        print(json.dumps(results))
    else:
        for name, checks in results.items():
            for check in checks:
                status = f"FAILED {name}" if check["error"] else f"ok {name}"
                print(
                    f"{status} {check['kernel']} {check['width']}" + (f": {check['error']}" if check["error"] else "")
                )
    return 1 if any(check["error"] for checks in results.values() for check in checks) else 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
