"""`layoutgen build` as a user runs it (a subprocess of the real entry point; in this process where a test fakes a
failing verification), writing only to tmp."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from layoutgen import codegen
from layoutgen.dcp import FAMILY as DCP_FAMILY
from layoutgen.files import GENERATED_MARK
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


# A failing verification, faked: the family's verify (and the offline compile) replaced in this process.
def build_here(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    """`layoutgen build ARGS` through the real entry point in this process: (exit code, stdout, stderr)."""
    from layoutgen.cli import main

    monkeypatch.setenv("COLUMNS", "200")  # one message, one line
    monkeypatch.delenv("LAYOUTGEN_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["layoutgen", "build", *args])
    try:
        main()
        code: object = 0
    except SystemExit as exited:
        code = exited.code
    out, err = capsys.readouterr()
    return (code if isinstance(code, int) else 0 if code is None else 1), out, err


def fake_verification(monkeypatch: pytest.MonkeyPatch, failing: set[str]) -> list[tuple[str, str]]:
    """DCP verification reports a failure for the specs in `failing` and passes the others; returns (file,
    text) of every module it was given, read when it was verified.  No offline compile."""
    from layoutgen import verification
    from layoutgen.family import Check, VerifyReport
    from layoutgen.tuning import offline

    seen: list[tuple[str, str]] = []

    def verify(self: object, module: object, device: str) -> VerifyReport:
        name = module.SPEC.name  # type: ignore[attr-defined]
        seen.append((module.__file__, Path(module.__file__).read_text(encoding="utf-8")))  # type: ignore[attr-defined]
        bad = name in failing
        check = Check("pack", not bad, "bytes differ in 1 shape" if bad else "bytes identical in 5 shapes")
        return VerifyReport(name, "dcp", (check,), (f"{name} pack: bytes differ",) if bad else ())

    def in_this_process(paths: list[Path], on_device: Any) -> list[VerifyReport]:
        on_device("cpu")
        return [verification.verify_path(path, "cpu") for path in paths]

    monkeypatch.setattr(type(DCP_FAMILY), "verify", verify)
    monkeypatch.setattr(verification, "verify_in_subprocess", in_this_process)  # where the fake verify is
    monkeypatch.setattr(offline, "unavailable", lambda: "faked for this test")
    return seen


def _rendering(path: Path) -> str:
    return codegen.render(load_spec(path), codegen.display_name(path))


def test_a_failing_module_is_not_written_and_the_previous_one_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    # An earlier build's module (a hand-written file there is refused before anything is verified).
    previous = f"{GENERATED_MARK}0.1.0 from pynccl_a2a.yaml (spec sha256 000000000000). DO NOT EDIT.\n"
    (out / "pynccl_a2a.py").write_text(previous, encoding="utf-8")
    seen = fake_verification(monkeypatch, failing={"pynccl_a2a"})
    code, stdout, stderr = build_here(
        ["--spec", str(PYNCCL_SPEC), "--spec", str(VLLM_SPEC), "--out", str(out)], capsys, monkeypatch
    )
    assert code == 1, stdout + stderr
    assert (out / "pynccl_a2a.py").read_text(encoding="utf-8") == previous, "a failing module replaced a previous one"
    assert (out / "vllm_a2a.py").read_text(encoding="utf-8") == _rendering(VLLM_SPEC), "a passing module was held back"
    assert sorted(path.name for path in out.iterdir()) == ["pynccl_a2a.py", "vllm_a2a.py"]
    message = " ".join(stderr.split())
    assert "verification failed for pynccl_a2a:" in message and "vllm_a2a" not in message.split("error:")[-1]
    assert "run the build again" in message and "--no-verify" in message and "Traceback" not in message
    assert f"{out / 'pynccl_a2a.py'} not replaced" in message
    assert "1 written, 0 unchanged, 1 not written (failed verification) in" in stdout
    # What was verified is the text each module gets, from files outside --out that are gone now.
    assert sorted(text for _, text in seen) == sorted([_rendering(PYNCCL_SPEC), _rendering(VLLM_SPEC)])
    assert all(Path(file).parent != out and not Path(file).exists() for file, _ in seen)


def test_an_unchanged_module_that_fails_is_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The module in --out is this very rendering, now known to fail: it must not stay there as if it were good.
    out = tmp_path / "out"
    code, _, stderr = build_here(["--spec", str(PYNCCL_SPEC), "--out", str(out), "--no-verify"], capsys, monkeypatch)
    assert code == 0 and (out / "pynccl_a2a.py").is_file(), stderr
    fake_verification(monkeypatch, failing={"pynccl_a2a"})
    code, stdout, stderr = build_here(["--spec", str(PYNCCL_SPEC), "--out", str(out)], capsys, monkeypatch)
    assert code == 1, stdout + stderr
    assert list(out.iterdir()) == [], "a module known to fail stayed in --out"
    assert f"removed {out / 'pynccl_a2a.py'}" in " ".join(stderr.split())
    assert "verification failed for pynccl_a2a" in " ".join(stderr.split())
    code, _, stderr = build_here(["--spec", str(PYNCCL_SPEC), "--out", str(out), "--check"], capsys, monkeypatch)
    assert code == 1 and f"{out / 'pynccl_a2a.py'}: missing" in stderr


def test_a_new_module_that_fails_is_not_written_and_one_that_passes_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    fake_verification(monkeypatch, failing={"pynccl_a2a"})
    code, stdout, stderr = build_here(["--spec", str(PYNCCL_SPEC), "--out", str(out)], capsys, monkeypatch)
    assert code == 1, stdout + stderr
    assert not out.exists(), "nothing passed: nothing written, not even the directory"
    assert f"{out / 'pynccl_a2a.py'} not written" in " ".join(stderr.split())

    fake_verification(monkeypatch, failing=set())
    code, stdout, stderr = build_here(["--spec", str(PYNCCL_SPEC), "--out", str(out)], capsys, monkeypatch)
    assert code == 0, stdout + stderr
    assert stdout.splitlines()[-1] == f"1 written, 0 unchanged in {out}"
    assert (out / "pynccl_a2a.py").read_text(encoding="utf-8") == _rendering(PYNCCL_SPEC)
    code, stdout, _ = build_here(["--spec", str(PYNCCL_SPEC), "--out", str(out)], capsys, monkeypatch)
    assert code == 0 and stdout.splitlines()[-1] == f"0 written, 1 unchanged in {out}"


def test_a_module_that_does_not_compile_offline_is_not_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sm_90 compile is part of the verification: it too runs on the text about to be written.
    from layoutgen.tuning import offline

    out = tmp_path / "out"
    fake_verification(monkeypatch, failing=set())
    compiled: list[tuple[str, str]] = []

    def check_in_subprocesses(paths: list[str]) -> dict[str, list[dict[str, str]]]:
        compiled.extend((path, Path(path).read_text(encoding="utf-8")) for path in paths)
        return {
            path: [{"kernel": "pack", "width": "64-bit", "error": "CompilationError: at 1:2: nope"}] for path in paths
        }

    monkeypatch.setattr(offline, "unavailable", lambda: None)
    monkeypatch.setattr(offline, "check_in_subprocesses", check_in_subprocesses)
    code, stdout, stderr = build_here(["--spec", str(PYNCCL_SPEC), "--out", str(out)], capsys, monkeypatch)
    assert code == 1, stdout + stderr
    assert not out.exists(), "a module that does not compile was written"
    assert "verification failed for pynccl_a2a" in " ".join(stderr.split()) and "does not compile" in stderr
    ((path, text),) = compiled
    assert text == _rendering(PYNCCL_SPEC) and Path(path).parent != out
