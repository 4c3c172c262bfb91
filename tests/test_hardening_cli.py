"""The CLI fails clearly (issue 8, guarantee 5): missing or unreadable inputs, unwritable outputs and Ctrl-C
give a short error (one line, or the usual spec report) and a non-zero exit, never a traceback unless
--debug, and never a partial file.  A tune interrupted with Ctrl-C resumes where it stopped.

Most cases run the real entry point (`layoutgen.cli.main`) in this process; Ctrl-C is a real SIGINT to
the process group of a `layoutgen` subprocess, as a terminal sends it.  `pytest -m slow` interrupts builds
at more random moments.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import default_stop_signals

from layoutgen.dcp import FAMILY as DCP_FAMILY
from layoutgen.spec import SpecError
from layoutgen.tuning.claims import UNCLAIMED_STALE_AFTER_S
from layoutgen.tuning_db import read_database

PYNCCL_SPEC = DCP_FAMILY.spec_dir / "pynccl_a2a.yaml"
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
ROOT_READS_EVERYTHING = "runs as root, where file permissions do not stop reads or writes"


def run_main(args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """`layoutgen ARGS` through the real entry point in this process: (exit code, stderr)."""
    from layoutgen.cli import main

    monkeypatch.setenv("COLUMNS", "80")  # narrow: messages must stay one line anyway
    monkeypatch.delenv("LAYOUTGEN_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["layoutgen", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    code = exited.value.code
    return (code if isinstance(code, int) else 1), capsys.readouterr().err


def assert_clear_failure(code: int, err: str, *words: str, lines: int = 1) -> None:
    assert code != 0, err
    assert "Traceback" not in err, err
    assert err.startswith("error: "), err
    assert len(err.splitlines()) <= lines, f"not {lines} line(s):\n{err}"
    for word in words:
        assert word in err, f"{word!r} not in {err!r}"


def files_under(root: Path) -> set[Path]:
    return {path for path in root.rglob("*") if not path.is_dir()}


# ---------------------------------------------------------------------------------------------
# Missing and unreadable inputs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "command",
    [
        ["show", "{missing}"],
        ["diff", "{missing}", "pynccl_a2a"],
        ["diff", "pynccl_a2a", "{missing}"],
        ["tune", "--spec", "{missing}", "--dry-run"],
        ["build", "--spec", "{missing}", "--out", "{tmp}/out", "--check"],
    ],
    ids=["show", "diff-first", "diff-second", "tune", "build-check"],
)
def test_a_missing_spec_file_is_a_short_error(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "no_such_dir" / "my_backend.yaml"
    args = [part.replace("{missing}", str(missing)).replace("{tmp}", str(tmp_path)) for part in command]
    code, err = run_main(args, capsys, monkeypatch)
    assert code == 2
    assert_clear_failure(code, err, str(missing), "no such file", lines=2)
    assert files_under(tmp_path) == set()


def test_a_spec_under_a_regular_file_cannot_be_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "notes.txt").write_text("not a directory")
    spec = tmp_path / "notes.txt" / "my_backend.yaml"
    code, err = run_main(["build", "--spec", str(spec), "--out", str(tmp_path / "out")], capsys, monkeypatch)
    assert code == 2
    assert_clear_failure(code, err, str(spec), "cannot be read", "Not a directory", lines=2)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(AS_ROOT, reason=ROOT_READS_EVERYTHING)
@pytest.mark.parametrize("target", ["file", "directory"])
def test_an_unreadable_spec_is_a_short_error(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "specs"
    directory.mkdir()
    spec = directory / "my_backend.yaml"
    spec.write_text(PYNCCL_SPEC.read_text())
    locked = spec if target == "file" else directory
    locked.chmod(0)
    try:
        code, err = run_main(["build", "--spec", str(spec), "--out", str(tmp_path / "out")], capsys, monkeypatch)
    finally:
        locked.chmod(0o755)
    assert code == 2
    assert_clear_failure(code, err, str(spec), "cannot be read", "Permission denied", lines=2)


# ---------------------------------------------------------------------------------------------
# Unwritable outputs
# ---------------------------------------------------------------------------------------------
def _unwritable(kind: str, tmp_path: Path) -> tuple[Path, str]:
    """An output directory that cannot be written, even by root, and the words its error names."""
    if kind == "parent-is-a-file":
        (tmp_path / "notes.txt").write_text("x")
        return tmp_path / "notes.txt" / "out", f"{tmp_path / 'notes.txt'} is a file"
    if kind == "out-is-a-file":
        (tmp_path / "out").write_text("x")
        return tmp_path / "out", "is not a directory"
    if kind == "module-path-is-a-directory":
        (tmp_path / "out" / "pynccl_a2a.py").mkdir(parents=True)
        return tmp_path / "out", "directory"
    if kind == "sysfs":  # sysfs refuses new files to everyone, root included
        if not Path("/sys/kernel").is_dir():
            pytest.skip("needs Linux sysfs at /sys")
        return Path("/sys"), "cannot write to /sys"
    if kind == "read-only-permissions":
        if AS_ROOT:
            pytest.skip(ROOT_READS_EVERYTHING)
        (tmp_path / "out").mkdir()
        (tmp_path / "out").chmod(0o555)
        return tmp_path / "out", "Permission denied"
    raise ValueError(kind)


@pytest.mark.parametrize(
    "kind", ["parent-is-a-file", "out-is-a-file", "module-path-is-a-directory", "sysfs", "read-only-permissions"]
)
def test_an_unwritable_output_directory_is_a_one_line_error(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out, words = _unwritable(kind, tmp_path)
    before = files_under(tmp_path)
    try:
        code, err = run_main(["build", "--spec", str(PYNCCL_SPEC), "--out", str(out)], capsys, monkeypatch)
    finally:
        if kind == "read-only-permissions":
            out.chmod(0o755)
    assert code == 2
    assert_clear_failure(code, err, str(out), words)
    assert files_under(tmp_path) == before, "a failed build left files behind"


def test_the_module_entry_point_keeps_the_exit_code_and_the_one_line(tmp_path: Path) -> None:
    # `python -m layoutgen.cli` runs a second copy of the module: its errors must still be the canonical ones.
    (tmp_path / "notes.txt").write_text("x")
    out = tmp_path / "notes.txt" / "out"
    result = subprocess.run(
        [sys.executable, "-m", "layoutgen.cli", "build", "--spec", str(PYNCCL_SPEC), "--out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "40", "NO_COLOR": "1"},
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr == f"error: --out {out}: {tmp_path / 'notes.txt'} is a file\n", result.stderr


def test_debug_shows_the_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from layoutgen.cli import main

    monkeypatch.setattr(sys, "argv", ["layoutgen", "--debug", "show", str(tmp_path / "missing.yaml")])
    with pytest.raises(SpecError, match="no such file"):
        main()


# ---------------------------------------------------------------------------------------------
# Ctrl-C
# ---------------------------------------------------------------------------------------------
def start(args: list[str], cwd: Path, **env: str) -> subprocess.Popen[str]:
    """`layoutgen ARGS` as a terminal would run it: its own process group, SIGINT and SIGTERM at their defaults
    (even where the suite was started with them ignored, by `cmd &` in a script), unbuffered output."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1", "COLUMNS": "200", **env}
    environment.pop("LAYOUTGEN_DEBUG", None)
    return subprocess.Popen(
        [sys.executable, "-m", "layoutgen.cli", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
        start_new_session=True,
        preexec_fn=default_stop_signals,
    )


def ctrl_c(process: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGINT to the whole process group (what Ctrl-C does); the rest of stdout and stderr."""
    os.killpg(process.pid, signal.SIGINT)
    try:
        return process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def interrupt_build(tmp_path: Path, delay: float) -> None:
    """Ctrl-C `delay` seconds into the verification of four specs: a module is written only once verified, so
    none is."""
    out = tmp_path / "out"
    spec_files = [DCP_FAMILY.spec_dir / f"{name}.yaml" for name in BUILT]
    # The interpreter on CPU, also on a GPU machine: verification must take long enough to be interrupted.
    process = start(
        ["build", *[f"--spec={path}" for path in spec_files], "--out", str(out)], tmp_path, CUDA_VISIBLE_DEVICES=""
    )
    assert process.stdout is not None
    first = process.stdout.readline()  # "verifying against each family's torch reference ...": it starts now
    assert first.startswith("verifying"), first + (process.stderr.read() if process.stderr else "")
    time.sleep(delay)
    assert process.poll() is None, f"the build finished within {delay:.2f} s: nothing to interrupt"
    rest, err = ctrl_c(process)
    assert process.returncode == 130, f"exit {process.returncode} (delay {delay:.2f} s)\n{first}{rest}{err}"
    assert err == "interrupted\n", err
    assert "Traceback" not in first + rest
    assert files_under(tmp_path) == set(), "unverified, partial, temporary or cache files"
    assert not out.exists()


BUILT = ("pynccl_a2a", "pynccl_a2a_aligned", "flashinfer_mnnvl", "vllm_a2a")


def test_ctrl_c_during_build_verification(tmp_path: Path) -> None:
    interrupt_build(tmp_path, delay=0.5)


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(6))
def test_ctrl_c_during_build_at_random_moments(attempt: int, tmp_path: Path) -> None:
    interrupt_build(tmp_path, delay=random.uniform(0.0, 1.5))


def _tune_args(tmp_path: Path) -> list[str]:
    shape = ["--N", "2", "--heads", "4", "--D", "8", "--trials", "4", "--exhaustive-limit", "8", "--workers", "1"]
    buckets = ["--batch", "1", "--batch", "2", "--batch", "3"]
    where = ["--storage", str(tmp_path / "studies.journal"), "--db", str(tmp_path / "db")]
    return ["tune", "--interpret", "--spec", "pynccl_a2a", "--kernel", "pack", *shape, *buckets, *where]


def _trials(journal: Path) -> dict[str, list[Any]]:
    import optuna

    from layoutgen.tuning.storage import open_storage

    storage = open_storage(str(journal))
    return {
        summary.study_name: optuna.load_study(study_name=summary.study_name, storage=storage).get_trials()
        for summary in optuna.get_all_study_summaries(storage)
    }


def _outcome(trial: Any) -> str | None:
    return (trial.user_attrs.get("result") or {}).get("outcome")


def test_ctrl_c_during_tune_then_the_same_command_resumes(tmp_path: Path) -> None:
    journal = tmp_path / "studies.journal"
    cache = str(tmp_path / "cache")
    process = start(_tune_args(tmp_path), tmp_path, LAYOUTGEN_CACHE_DIR=cache)
    deadline = time.monotonic() + 120
    # Interrupt once a trial has been measured, while the run is still going.
    while process.poll() is None and time.monotonic() < deadline:
        if journal.exists() and '"measured"' in journal.read_text(errors="replace"):
            break
        time.sleep(0.02)
    time.sleep(0.1)
    assert process.poll() is None, "the tune finished before it could be interrupted"
    out, err = ctrl_c(process)
    assert process.returncode == 130, out + err
    assert "Traceback" not in out + err
    assert err.strip() == "interrupted: decided studies were recorded; re-run the same command to resume", err
    interrupted = _trials(journal)
    measured_before = Counter(_outcome(t) for ts in interrupted.values() for t in ts)["measured"]
    running = [t for ts in interrupted.values() for t in ts if t.state.name == "RUNNING"]
    unclaimed = [t for t in running if "claim" not in t.user_attrs]
    if unclaimed:
        # Ctrl-C landed between study.ask() and the claim: the re-run takes such a trial over once it is
        # UNCLAIMED_STALE_AFTER_S old.
        time.sleep(UNCLAIMED_STALE_AFTER_S + 0.5)
    assert running == unclaimed, "claimed trials left running"
    for path in sorted((tmp_path / "db").glob("*.json")):
        read_database(path)  # what was recorded before the interrupt is a whole, valid file

    again = subprocess.run(
        [sys.executable, "-m", "layoutgen.cli", *_tune_args(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "LAYOUTGEN_CACHE_DIR": cache, "NO_COLOR": "1", "COLUMNS": "200"},
        timeout=300,
        check=False,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "3 decision(s) recorded" in again.stdout
    finished = _trials(journal)
    assert len(finished) == 3
    for name, trials in finished.items():
        evaluated = Counter(tuple(sorted(t.params.items())) for t in trials if _outcome(t) == "measured")
        assert evaluated and max(evaluated.values()) == 1, f"{name}: a config was timed twice: {evaluated}"
    measured_after = Counter(_outcome(t) for ts in finished.values() for t in ts)["measured"]
    assert measured_after > measured_before
    print(f"interrupted after {measured_before} measured trials; {measured_after} after resuming")
