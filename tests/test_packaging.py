"""A non-editable install ships everything: a wheel built from the source tree holds every module, template,
spec, generated module and tuning database, and setuptools builds it without a warning."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import REPO_ROOT

#: What the wheel must hold, by source folder: (folder, its name in the package, the suffixes shipped).
SHIPPED = (
    ("layoutgen", "layoutgen", (".py", ".yaml", ".jinja", ".typed")),
    ("generated", "layoutgen/generated", (".py",)),
    ("tuning_db", "layoutgen/_tuning_db", (".py", ".json")),
)


def test_a_wheel_holds_every_module_template_and_spec(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: building writes build/ and *.egg-info next to pyproject.toml
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, source / name)
    for folder, _, _ in SHIPPED:
        shutil.copytree(REPO_ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", ".", "-w", str(tmp_path)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Warning" not in result.stdout + result.stderr, result.stdout + result.stderr
    (wheel,) = tmp_path.glob("layoutgen-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        inside = set(archive.namelist())
        metadata = next(archive.read(n).decode() for n in inside if n.endswith(".dist-info/METADATA"))
    expected = {
        f"{package}/{path.relative_to(source / folder).as_posix()}"
        for folder, package, suffixes in SHIPPED
        for path in (source / folder).rglob("*")
        if path.is_file() and path.suffix in suffixes
    }
    assert expected - inside == set(), f"missing from the wheel: {sorted(expected - inside)}"
    for required in ("layoutgen/dcp/specs/pynccl_a2a.yaml", "layoutgen/dcp/templates/pack.py.jinja"):
        assert required in inside
    assert "License-Expression: Apache-2.0" in metadata
