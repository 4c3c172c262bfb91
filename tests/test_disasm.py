"""`benchmarks/disasm.py`: a generated kernel's SASS without a GPU (Triton's own ptxas and cuobjdump)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def disasm(*args: str) -> str:
    # Compiled, not interpreted: the kernels must be JIT functions, so the interpreter stays off here.
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    command = [sys.executable, str(ROOT / "benchmarks" / "disasm.py"), *args]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_pack_into_16_byte_rows_stores_16_bytes_and_into_1028_byte_rows_4(tmp_path: Path) -> None:
    shape = ["--kernel", "pack", "--N", "2", "--H", "8", "--D", "512", "--B", "16"]
    config = ["--config", "block_peer=1,block_batch=1,block_head=4,block_dim=512,num_warps=4"]
    split = disasm("--spec", "vllm_a2a", *shape, *config, "--sass", str(tmp_path / "split.sass"))
    assert "STG.E.128" in split and "registers per thread:" in split
    assert "STG.E.128" in (tmp_path / "split.sass").read_text(encoding="utf-8")
    row_tail = disasm("--spec", "pynccl_a2a", *shape, *config)
    assert "STG.E.128" not in row_tail and "STG.E x" in row_tail
