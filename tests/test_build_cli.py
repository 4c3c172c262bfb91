"""`layoutgen build` as a user runs it (a subprocess of the real entry point), writing only to tmp."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from layoutgen import codegen
from layoutgen.dcp import FAMILY as DCP_FAMILY
from layoutgen.spec import load_spec

PYNCCL_SPEC = DCP_FAMILY.spec_dir / "pynccl_a2a.yaml"
VLLM_SPEC = DCP_FAMILY.spec_dir / "vllm_a2a.yaml"


def layoutgen(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1"}  # an ordinary terminal: messages stay whole
    env.pop("LAYOUTGEN_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "layoutgen.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        check=False,
        timeout=300,
    )


def _write_spec(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_build_writes_once_and_then_only_when_changed(tmp_path):
    out = tmp_path / "out"
    first = layoutgen(
        "build", "--spec", str(PYNCCL_SPEC), "--spec", str(VLLM_SPEC), "--out", str(out), "--no-verify", cwd=tmp_path
    )
    assert first.returncode == 0, first.stderr
    assert "2 written, 0 unchanged" in first.stdout
    written = {p.name: p.stat().st_mtime_ns for p in out.glob("*.py")}
    assert set(written) == {"pynccl_a2a.py", "vllm_a2a.py"}, "a --spec build writes only its specs' modules"
    assert (out / "pynccl_a2a.py").read_text() == codegen.render(
        load_spec(PYNCCL_SPEC), codegen.display_name(PYNCCL_SPEC)
    )
    second = layoutgen(
        "build", "--spec", str(PYNCCL_SPEC), "--spec", str(VLLM_SPEC), "--out", str(out), "--no-verify", cwd=tmp_path
    )
    assert second.returncode == 0 and "0 written, 2 unchanged" in second.stdout
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.py")} == written
    assert [p.name for p in out.iterdir() if p.suffix == ".tmp"] == []


def test_check_fails_listing_a_missing_and_a_stale_file(tmp_path):
    out = tmp_path / "out"
    missing = layoutgen("build", "--spec", str(PYNCCL_SPEC), "--out", str(out), "--check", cwd=tmp_path)
    assert missing.returncode == 1
    assert f"{out / 'pynccl_a2a.py'}: missing" in missing.stderr
    assert not out.exists(), "--check writes nothing"

    assert (
        layoutgen("build", "--spec", str(PYNCCL_SPEC), "--out", str(out), "--no-verify", cwd=tmp_path).returncode == 0
    )
    current = layoutgen("build", "--spec", str(PYNCCL_SPEC), "--out", str(out), "--check", cwd=tmp_path)
    assert current.returncode == 0, current.stderr
    module = out / "pynccl_a2a.py"
    module.write_text(module.read_text().replace("BLOCK_DIM", "BLOCK_D"), encoding="utf-8")
    before = module.read_text()
    stale = layoutgen("build", "--spec", str(PYNCCL_SPEC), "--out", str(out), "--check", cwd=tmp_path)
    assert stale.returncode == 1
    assert f"{module}: stale" in stale.stderr and "out of date" in stale.stderr
    assert module.read_text() == before, "--check must not repair the file"


def test_bad_spec_is_a_short_error_without_traceback(tmp_path):
    data = {
        "name": "my_backend",
        "summary": "bad: peer is not outermost",
        "transport": "all_to_all_single",
        "payload": {"axes": ["batch", "peer", "head", "dim"], "dtype": "input"},
        "stats": {"placement": "row_tail"},
    }
    spec_file = _write_spec(tmp_path / "my_backend.yaml", data)
    result = layoutgen("build", "--spec", str(spec_file), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.startswith(f"error: {spec_file}: invalid layout spec")
    assert "payload.axes:" in result.stderr and "outermost" in result.stderr
    assert len(result.stderr.splitlines()) <= 10
    assert not (tmp_path / "out").exists()


def test_missing_spec_file_is_a_short_error(tmp_path):
    result = layoutgen("build", "--spec", str(tmp_path / "nope.yaml"), "--out", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "nope.yaml" in result.stderr and "no such file" in result.stderr


def test_two_specs_with_one_name_is_a_short_error(tmp_path):
    copy = _write_spec(tmp_path / "copy.yaml", yaml.safe_load(PYNCCL_SPEC.read_text()))
    result = layoutgen(
        "build", "--spec", str(PYNCCL_SPEC), "--spec", str(copy), "--out", str(tmp_path / "o"), cwd=tmp_path
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr and "both have name 'pynccl_a2a'" in result.stderr


def test_a_spec_file_without_out_is_refused_and_the_checkout_kept(tmp_path):
    # The checkout's generated/ holds the bundled specs' modules: a spec file named like a bundled spec would
    # replace its module, any other would be an orphan `build --check` fails on.
    from layoutgen.loader import generated_dir

    bundled_module = generated_dir() / "pynccl_a2a.py"
    before = bundled_module.read_bytes()
    shadow = _write_spec(tmp_path / "shadow.yaml", {**yaml.safe_load(PYNCCL_SPEC.read_text()), "summary": "mine"})
    mine = _write_spec(tmp_path / "mine.yaml", {**yaml.safe_load(PYNCCL_SPEC.read_text()), "name": "mine"})
    for spec, consequence in ((shadow, "replace the module of the bundled spec 'pynccl_a2a'"), (mine, "stale")):
        result = layoutgen("build", "--spec", str(spec), "--no-verify", cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        message = " ".join(result.stderr.split())
        assert "Traceback" not in result.stderr and "pass --out DIR" in message and consequence in message
    assert bundled_module.read_bytes() == before
    assert not (generated_dir() / "mine.py").exists()


def test_one_spec_named_twice_is_built_once(tmp_path):
    out = tmp_path / "o"
    result = layoutgen(
        "build", "--spec", "pynccl_a2a", "--spec", str(PYNCCL_SPEC), "--out", str(out), "--no-verify", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["pynccl_a2a.py"]


def test_unknown_option_is_a_usage_error(tmp_path):
    result = layoutgen("build", "--bogus", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "--bogus" in result.stderr


# How a new backend is added (a YAML file nobody bundled, rendered and verified against the reference) is
# the README's walk-through: tests/test_readme_example.py::test_the_five_minute_walk_through runs it.


@pytest.mark.parametrize("args", [["--help"], ["build", "--help"]])
def test_help(args, tmp_path):
    result = layoutgen(*args, cwd=tmp_path)
    assert result.returncode == 0 and "Usage" in result.stdout
