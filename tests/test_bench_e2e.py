"""The end-to-end benchmark runs (gloo, CPU, interpreter) and checks both steps against the reference merge.

Times under the interpreter mean nothing; this keeps the multi-GPU script runnable between GPU sessions.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_e2e_benchmark_smoke_run_checks_and_reports(tmp_path: Path) -> None:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed
        pytest.skip("torch.distributed is unavailable")
    if not dist.is_available():
        pytest.skip("torch.distributed is unavailable")
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_dcp_e2e.py"),
            "--cpu",
            "--world-size",
            "2",
            "--specs",
            "pynccl_a2a",
            "vllm_a2a",
            "--batches",
            "3",
            "--replays",
            "1",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    table = (tmp_path / "bench_dcp_e2e_N2_cpu.md").read_text()
    assert "| pynccl_a2a | 2 | 3 | 8 | 16 |" in table and "| vllm_a2a | 2 | 3 | 8 | 16 |" in table
