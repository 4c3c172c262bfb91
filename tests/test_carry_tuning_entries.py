"""`scripts/carry_tuning_entries.py` (offline compiles for sm_90, no GPU): an entry whose kernel source changed
only where the code it was timed with does not (a statement under `if INDEX_64:`, folded away at its shape)
takes the current source hash; an entry whose compiled code changed is listed and left stale (exit 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from layoutgen.loader import load
from layoutgen.tuning import offline
from layoutgen.tuning_db import TuningEntry, read_database

REPO = Path(__file__).resolve().parent.parent
TUNED_WITH = "a" * 64  # the source hash the entries below were "tuned" with
INDEX_64_BRANCH = "    if INDEX_64:\n"


def entry_for(spec: str) -> tuple[str, dict[str, object]]:
    """A committed pack entry of `spec` (its smallest bucket), marked as tuned with another source."""
    entries = json.loads((REPO / "tuning_db" / "NVIDIA_H200.json").read_text())["entries"]
    name = min(
        (name for name, entry in entries.items() if name.startswith(f"dcp|{spec}|pack|")),
        key=lambda name: entries[name]["key"]["bucket"],
    )
    return name, {**entries[name], "source_hash": TUNED_WITH}


def source_tuned_with(spec: str, change: str) -> str:
    """`spec`'s generated module with its pack's first 64-bit branch changed, under the hash TUNED_WITH."""
    text = (REPO / "generated" / f"{spec}.py").read_text()
    assert INDEX_64_BRANCH in text
    text = text.replace(load(spec).SOURCE_HASHES["pack"], TUNED_WITH)
    return text.replace(INDEX_64_BRANCH, change, 1)


@pytest.mark.skipif(offline.unavailable() is not None, reason=str(offline.unavailable()))
def test_only_entries_whose_compiled_code_is_unchanged_are_carried(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    # Under the branch (never compiled at a tuned shape): the same code.  The branch inverted: 64-bit offsets.
    (old / "pynccl_a2a.py").write_text(source_tuned_with("pynccl_a2a", INDEX_64_BRANCH + "        batch_size += 0\n"))
    (old / "vllm_a2a.py").write_text(source_tuned_with("vllm_a2a", "    if not INDEX_64:\n"))
    database = json.loads((REPO / "tuning_db" / "NVIDIA_H200.json").read_text())
    same_name, same_entry = entry_for("pynccl_a2a")
    changed_name, changed_entry = entry_for("vllm_a2a")
    database["entries"] = {same_name: same_entry, changed_name: changed_entry}
    path = tmp_path / "NVIDIA_H200.json"
    path.write_text(json.dumps(database))

    script = REPO / "scripts" / "carry_tuning_entries.py"
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    command = [sys.executable, str(script), "--from-dir", str(old), "--workers", "1", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"different code, left stale: NVIDIA_H200.json {changed_name}" in result.stdout
    assert "1 of 2 entries carried" in result.stdout
    entries = read_database(path).entries
    assert entries[same_name].source_hash == load("pynccl_a2a").SOURCE_HASHES["pack"]
    assert entries[changed_name].source_hash == TUNED_WITH
    untouched = TuningEntry.model_validate(same_entry).model_dump(exclude={"source_hash"})
    assert entries[same_name].model_dump(exclude={"source_hash"}) == untouched
