"""The README's "Use it from an inference engine" example runs as written (CPU, Triton interpreter)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
HEADING = "## Use it from an inference engine"


def readme_example() -> str:
    """The first python code block under HEADING, before the next section."""
    text = README.read_text(encoding="utf-8")
    if HEADING not in text:
        raise AssertionError(f"README.md has no section {HEADING!r}")
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    match = re.search(r"^```python\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    if match is None:
        raise AssertionError(f"no ```python block under {HEADING!r} in README.md")
    return match.group(1)


def test_readme_engine_example_runs(tmp_path: Path) -> None:
    code = readme_example()
    assert "mod.pack(" in code and "mod.combine(" in code and "assert " in code  # it checks its own result
    # A fresh interpreter: TRITON_INTERPRET must be set before the generated kernels are defined.
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"README example failed:\n{result.stdout}\n{result.stderr}"
    assert list(tmp_path.iterdir()) == []  # the example writes nothing
