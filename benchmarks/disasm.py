"""The SASS of one generated kernel config, compiled for a GPU this machine does not have.

Compiles through `layoutgen.tuning.offline.compile_offline` (the module's own launcher on `meta` tensors,
as the tuner's compile pool runs it: Triton binds and specialises the arguments exactly as a real launch
would, 16-byte aligned pointers, a DCP capacity of B rounded up to 16 rows) for the chosen architecture,
then disassembles with the `cuobjdump` that ships with Triton.  Prints registers per thread and the global
load/store instructions by width: what issue 5 asks of a missed target ("what the disassembly shows")
without a device.  DCP kernels take B as the batch; Ulysses kernels take it as S_local (one batch row).

Usage:
    python benchmarks/disasm.py --spec vllm_a2a --kernel combine --N 4 --H 128 --D 512 --B 8 \\
        --config block_batch=1,block_head=2,block_dim=128,num_warps=1 [--arch 90] [--sass out.sass]
    python benchmarks/disasm.py --spec ulysses_qkv_gqa --kernel scatter --N 4 --H 32 --H-kv 8 --D 128 \\
        --B 4096 --config block_peer=4,block_seq=4,block_head=1,block_dim=128,num_warps=8 [--module PATH]
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


def compile_config(
    spec: str,
    kernel: str,
    N: int,
    H: int,
    D: int,
    B: int,
    config: dict[str, int],
    arch: int,
    masked: bool = False,
    H_kv: int | None = None,
    module_path: Path | None = None,
) -> Any:
    """Compile one config of a DCP kernel (B: the batch) or a Ulysses kernel (B: S_local, one batch row)."""
    import torch

    from layoutgen.loader import load, load_path
    from layoutgen.tuning.objective import capacity_for
    from layoutgen.tuning.offline import compile_offline

    module = load_path(module_path) if module_path else load(spec)
    if module.SPEC.family == "ulysses":
        job: dict[str, Any] = {"kernel": kernel, "config": config, "N": N, "S_local": B, "B": 1, "H": H,
                               "H_kv": H if H_kv is None else H_kv, "D": D, "dtype": "bfloat16"}  # fmt: skip
    else:
        capacity = capacity_for(B, torch.device("cuda"))  # what the tuner allocates: B rounded up to 16 rows
        job = {"kernel": kernel, "config": config, "N": N, "H": H, "D": D, "dtype": "bfloat16", "batch": B,
               "capacity": capacity}  # fmt: skip
        if masked:
            job["pack_forms"] = ((True, False),)  # the launcher compiles the unmasked form first, then this one
    return compile_offline(module, job, arch)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", required=True)
    parser.add_argument(
        "--kernel", required=True, choices=("pack", "combine", "scatter", "gather", "scatter_out", "gather_out")
    )
    for name in ("N", "H", "D", "B"):
        parser.add_argument(f"--{name}", type=int, required=True, help="B: S_local for a Ulysses kernel")
    parser.add_argument("--H-kv", type=int, help="a Ulysses spec's k/v heads (default H)")
    parser.add_argument("--module", type=Path, help="a build of the spec's module to compile instead (e.g. a probe's)")
    parser.add_argument("--config", required=True, help="name=value,... (block_*, num_warps)")
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200)")
    parser.add_argument("--masked", action="store_true", help="pack with an empty mask (contract v2)")
    parser.add_argument("--sass", type=Path, help="also write the whole disassembly here")
    args = parser.parse_args()
    config = {name: int(value) for name, value in (item.split("=") for item in args.config.split(","))}
    compiled = compile_config(
        args.spec, args.kernel, args.N, args.H, args.D, args.B, config, args.arch, args.masked, args.H_kv, args.module
    )

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
