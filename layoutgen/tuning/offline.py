"""Compile a generated kernel for a GPU this machine does not have, without launching anything.

Triton's interpreter (`TRITON_INTERPRET=1`, the CPU tests) runs a kernel's Python and never sees what only
the compiler checks: that a variable has one type on both sides of an `if`, constexpr rules, what the
backend accepts.  The tensor-major Ulysses programs' 64-bit path failed that way on the H200 while every
CPU test passed (`program_in_tensor` int32 in one branch, int64 in the other).  Here the family's
`compile_variant` runs the module's own launcher on `meta` tensors, as the tuner's compile pool does, so
Triton binds and specialises every argument as a real launch would, and compiles for `arch` with the
`ptxas` that ships with Triton.

Relies on Triton 3.6 internals (`triton.runtime.driver.set_active` and its `_active`, `JITFunction.run(...,
warmup=True)`), and needs a process without `TRITON_INTERPRET` (under it `@triton.jit` gives interpreted
functions, which cannot compile): `tests/test_offline_compile.py` runs it in a subprocess.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any


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
    """Stands in for a `@triton.jit` kernel in a launcher: compiles, keeps the result, launches nothing."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.compiled: Any = None

    def __getitem__(self, grid: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> None:
            self.compiled = self.kernel.run(*args, grid=grid, warmup=True, **kwargs)

        return run


def compile_offline(module: ModuleType, job: Mapping[str, Any], arch: int = 90) -> Any:
    """Compile the kernel of `job` (the family's compile-job dict: kernel, config, shape, dtype) for
    compute capability `arch` (x 10); the compiled kernel (`.asm["cubin"]`, `.metadata`)."""
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
    compiled = compiler.compiled
    if compiled is None:
        raise RuntimeError(f"the launcher of {job['kernel']} launched nothing")
    return compiled.result() if hasattr(compiled, "result") else compiled


def _jobs(spec: Any) -> list[tuple[str, dict[str, Any]]]:
    """(label, compile job) of every kernel of `spec` at a small shape (32-bit offsets, odd sizes) and at one
    past 2**31 elements (64-bit offsets), each with the family's heuristic default config."""
    from layoutgen.family import get_family

    family = get_family(spec.family)
    jobs: list[tuple[str, dict[str, Any]]] = []
    if spec.family == "ulysses":
        import torch

        from layoutgen.ulysses.config import runtime_default
        from layoutgen.ulysses.layout import Shape
        from layoutgen.ulysses.spec import HeadCount

        gqa = spec.uses(HeadCount.H_KV)
        # 266240 x 64 heads x 128 = 2.2e9 elements in every tensor, whichever head count it has.
        for label, (N, S_local, H, H_kv, D) in {"32-bit": (2, 3, 6, 2, 24), "64-bit": (2, 266240, 64, 64, 128)}.items():
            values = {"N": N, "S_local": S_local, "B": 1, "H": H, "H_kv": H_kv if gqa else H, "D": D}
            shape = Shape(**values, dtype=torch.bfloat16)
            for decl in family.kernels:
                config = runtime_default(spec, decl.name, shape).as_dict()
                jobs.append((label, {"kernel": decl.name, "config": config, **values, "dtype": "bfloat16"}))
        return jobs
    from layoutgen.tuning.problem import Problem

    N, H, D = 2, 128, 512
    # 32784 rows x 128 heads x 512 = 2.1e9 elements of out.
    for label, batch in {"32-bit": 5, "64-bit": 32784}.items():
        for decl in family.kernels:
            problem = Problem(spec, decl.name, (("N", N), ("Hl", H // N), ("D", D)), "bfloat16")
            config = family.default_config(problem, batch).as_dict()
            job = {"kernel": decl.name, "config": config, "N": N, "H": H, "D": D, "dtype": "bfloat16",
                   "batch": batch, "capacity": -(-batch // 16) * 16}  # fmt: skip
            if decl.name == "pack":
                job["pack_forms"] = ((True, False), (False, True), (True, True))  # empty mask, (max, sum) in, both
            jobs.append((label, job))
    return jobs


def check_spec(name: str, arch: int = 90) -> list[str]:
    """Compile every kernel of the bundled or generated module `name` for `arch` at both offset widths;
    one line per kernel and width, "ok" or the compiler's complaint."""
    from layoutgen.loader import load

    module = load(name)
    lines = []
    for label, job in _jobs(module.SPEC):
        try:
            compile_offline(module, job, arch)
        except Exception as error:  # every complaint is reported, not only the first
            lines.append(f"FAILED {name} {job['kernel']} {label}: {type(error).__name__}: {str(error)[-2000:]}")
        else:
            lines.append(f"ok {name} {job['kernel']} {label}")
    return lines


if __name__ == "__main__":
    import sys

    report = [line for spec_name in sys.argv[1:] for line in check_spec(spec_name)]
    print("\n".join(report))
    raise SystemExit(1 if any(line.startswith("FAILED") for line in report) else 0)
