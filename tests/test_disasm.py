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


def test_head_innermost_fp8_combine_keeps_the_codes_in_their_load_layout(tmp_path: Path) -> None:
    """Its scales load as a 3-D tile: loaded with four axes they set the accumulator's layout, and every peer's
    codes crossed to it byte by byte (576 PRMT at this box before the change, none after)."""
    from conftest import make_spec, render_module

    spec = make_spec(
        name="fp8_head_inner_sass",
        transport="external",
        payload={"axes": ["batch", "dim", "peer", "head"], "dtype": "float8_e4m3fn"},
        stats={"placement": "separate", "form": "max_sum", "axes": ["slot", "batch", "head", "peer"], "slots": 2,
               "max_slot": 1, "sum_slot": 0},
    )  # fmt: skip
    module = render_module(spec, tmp_path)
    shape = ["--kernel", "combine", "--N", "8", "--H", "128", "--D", "512", "--B", "1024"]
    config = ["--config", "block_batch=4,block_head=16,block_dim=32,num_warps=2"]
    sass_path = tmp_path / "combine.sass"
    disasm("--spec", spec.name, "--module", str(module.__file__), *shape, *config, "--sass", str(sass_path))
    sass = sass_path.read_text(encoding="utf-8")
    assert sass.count("PRMT") <= 32, sass.count("PRMT")
    assert "STS.U8" not in sass and "STS.U16" not in sass
