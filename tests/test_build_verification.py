"""`layoutgen build` verifies in a child process: a module whose verification kills it (a kernel writing far
outside its buffers) or raises fails alone, named, and the modules after it are still verified and written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from layoutgen import verification
from layoutgen.family import Check, VerifyReport

PLUGIN = Path(__file__).resolve().parent / "plugin_family" / "stridecopy"


def test_a_crash_and_a_raise_fail_their_modules_and_the_rest_are_written(tmp_path: Path) -> None:
    packages = tmp_path / "packages"
    shutil.copytree(PLUGIN, packages / "stridecopy")
    specs = []
    for name in ("first_copy", "crash_copy", "raise_copy", "last_copy"):
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(f"family: stridecopy\nname: {name}\nsummary: a copy\norder: [col, row]\n", encoding="utf-8")
        specs += ["--spec", str(spec)]
    out = tmp_path / "out"
    environment = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "LAYOUTGEN_FAMILIES": "stridecopy=stridecopy",
                   "PYTHONPATH": os.pathsep.join([str(packages), *sys.path]),
                   "LAYOUTGEN_CACHE_DIR": str(tmp_path / "cache")}  # fmt: skip
    environment.pop("LAYOUTGEN_DEBUG", None)
    environment.pop("TRITON_INTERPRET", None)  # the child picks the interpreter itself on a CPU
    done = subprocess.run(
        [sys.executable, "-m", "layoutgen.cli", "build", *specs, "--out", str(out)],
        capture_output=True, text=True, env=environment, timeout=600, check=False,
    )  # fmt: skip
    output = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, output
    assert "crash_copy: the verification process died (signal SIGSEGV; a kernel that reads or writes" in output
    assert "raise_copy: verification raised RuntimeError: the family's verify broke" in output
    assert "verification failed for crash_copy, raise_copy:" in output and "Traceback" not in output
    assert sorted(path.name for path in out.iterdir()) == ["first_copy.py", "last_copy.py"]


def test_a_child_that_dies_before_any_module_fails_them_all(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A child that cannot even start (here: a broken interpreter) must not be restarted for ever.
    calls: list[list[Path]] = []

    def dead_child(paths: list[Path], on_device: object) -> tuple[list[VerifyReport], int, str]:
        calls.append(paths)
        return [], 1, "ImportError: no torch\n"

    monkeypatch.setattr(verification, "_run_child", dead_child)
    paths = [tmp_path / "a.py", tmp_path / "b.py"]
    reports = verification.verify_in_subprocess(paths, lambda device: None)
    assert len(calls) == 1 and [report.spec_name for report in reports] == ["a", "b"]
    assert all(not report.ok and "exit status 1" in report.failures[0] for report in reports)
    assert all("ImportError: no torch" in report.failures[0] for report in reports)


def test_reports_cross_the_process_boundary_unchanged() -> None:
    report = VerifyReport("x", "dcp", (Check("pack", True, "bytes identical"), Check("combine", False, "0.4")), ("no",))
    assert verification.report_from_json(verification.report_to_json(report)) == report
