"""The SASS of one generated kernel config, compiled for a GPU this machine does not have.

Runs the module's own launcher with `meta` tensors (the family's `compile_variant`, as the tuner's compile
pool does), so Triton binds and specialises the arguments exactly as a real launch would (16-byte aligned
pointers, a capacity of B rounded up to 16 rows), then compiles for the chosen architecture with the
`ptxas` that ships with Triton and disassembles with its `cuobjdump`.  Prints registers per thread and the
global load/store instructions by width: what issue 5 asks of a missed target ("what the disassembly
shows") without a device.  Relies on Triton 3.6 internals (`triton.runtime.driver.set_active`,
`JITFunction.run(..., warmup=True)`).

Usage:
    python benchmarks/disasm.py --spec vllm_a2a --kernel combine --N 4 --H 128 --D 512 --B 8 \\
        --config block_batch=1,block_head=2,block_dim=128,num_warps=1 [--arch 90] [--sass out.sass]
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


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


class _Compile:
    """Stands in for a `@triton.jit` kernel in the launcher: compiles, keeps the result, launches nothing."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.compiled: Any = None

    def __getitem__(self, grid: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> None:
            self.compiled = self.kernel.run(*args, grid=grid, warmup=True, **kwargs)

        return run


def compile_config(
    spec: str, kernel: str, N: int, H: int, D: int, B: int, config: dict[str, int], arch: int, masked: bool = False
) -> Any:
    import torch
    import triton.runtime.driver

    from layoutgen.dcp import FAMILY
    from layoutgen.loader import load
    from layoutgen.tuning.objective import capacity_for

    triton.runtime.driver.set_active(_OfflineDriver(arch))  # type: ignore[attr-defined]
    module = load(spec)
    compiler = _Compile(getattr(module, f"_{kernel}_kernel"))
    capacity = capacity_for(B, torch.device("cuda"))  # what the tuner allocates: B rounded up to 16 rows
    job = {"kernel": kernel, "config": config, "N": N, "H": H, "D": D, "dtype": "bfloat16", "batch": B,
           "capacity": capacity}  # fmt: skip
    if masked:
        job["pack_forms"] = ((True, False),)  # the launcher compiles the unmasked form first, then this one
    FAMILY.compile_variant(module, job, compiler)
    compiled = compiler.compiled
    return compiled.result() if hasattr(compiled, "result") else compiled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--kernel", required=True, choices=("pack", "combine"))
    for name in ("N", "H", "D", "B"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--config", required=True, help="name=value,... (block_*, num_warps)")
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200)")
    parser.add_argument("--masked", action="store_true", help="pack with an empty mask (contract v2)")
    parser.add_argument("--sass", type=Path, help="also write the whole disassembly here")
    args = parser.parse_args()
    config = {name: int(value) for name, value in (item.split("=") for item in args.config.split(","))}
    compiled = compile_config(args.spec, args.kernel, args.N, args.H, args.D, args.B, config, args.arch, args.masked)

    import triton

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as directory:
        cubin = Path(directory) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([tools / "cuobjdump", "-sass", cubin], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([tools / "cuobjdump", "-res-usage", cubin], capture_output=True, text=True, check=True)
    registers = re.search(r"REG:(\d+)", usage.stdout)
    memory = collections.Counter(re.findall(r"\b((?:LDG|STG)[A-Z0-9.]*)", sass))
    instructions = len(re.findall(r"^\s+/\*[0-9a-f]{4}\*/", sass, flags=re.MULTILINE))
    print(f"{args.spec} {args.kernel} N={args.N} H={args.H} D={args.D} B={args.B} {config} sm_{args.arch}")
    print(f"registers per thread: {registers.group(1) if registers else '?'}; instructions: {instructions}")
    print("global memory instructions: " + ", ".join(f"{op} x{count}" for op, count in sorted(memory.items())))
    if args.sass:
        args.sass.write_text(sass, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
