"""An out-of-tree family through the tuner and the CLI: registered in code and seen by the tuner's child
processes, its bugs and its aliases kept from spoiling the database or the other families' options.

`tests/plugin_family/stridecopy` is the family (registered with `layoutgen.family.register`, as a user of the
Python API does); `tests/plugin_family/aliasclash` is the same copy with aliases that collide.
"""

from __future__ import annotations

import io
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import requires_interpreter
from rich.console import Console
from test_cli_polish import run_main

from layoutgen import family as family_registry
from layoutgen.tuning import plan, runner
from layoutgen.tuning_db import CPU_INTERPRETER_DEVICE, device_file_name, read_database

PLUGINS = Path(__file__).resolve().parent / "plugin_family"
SPEC_TEXT = """\
family: stridecopy
name: transposed_copy
summary: a transposing copy, tuned from a family registered in code
order: [col, row]
"""
TINY_DCP = ["--spec", "pynccl_a2a", "--kernel", "pack", "--interpret", "--dry-run"]


@pytest.fixture
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """stridecopy and aliasclash importable from a temporary directory (neither registered yet)."""
    folder = tmp_path / "packages"
    for name in ("stridecopy", "aliasclash"):
        shutil.copytree(PLUGINS / name, folder / name)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("LAYOUTGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LAYOUTGEN_FAMILIES", raising=False)
    try:
        yield folder
    finally:
        for name in ("stridecopy", "aliasclash"):
            family_registry.unregister(name)
        for module in [m for m in sys.modules if m.split(".")[0] in ("stridecopy", "aliasclash")]:
            del sys.modules[module]


@pytest.fixture
def stridecopy_spec(packages: Path, tmp_path: Path) -> Path:
    family_registry.register("stridecopy", "stridecopy")
    spec_file = tmp_path / "transposed_copy.yaml"
    spec_file.write_text(SPEC_TEXT)
    return spec_file


def tiny_tune(spec_file: Path, tmp_path: Path, **changes: Any) -> plan.TuneOptions:
    fields: dict[str, Any] = {
        "specs": (str(spec_file),),
        "storage": str(tmp_path / "studies.journal"),
        "db_dir": str(tmp_path / "db"),
        "interpret": True,
        "trials": 2,
        "exhaustive_limit": 8,
        "lookahead": 1,
    }
    return plan.TuneOptions(**{**fields, **changes})


def one_line(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------------------------------------------
# D1. A family registered in code reaches the worker processes and the compile pool
# ---------------------------------------------------------------------------------------------------
@requires_interpreter
def test_a_family_registered_in_code_tunes_with_two_workers(stridecopy_spec: Path, tmp_path: Path) -> None:
    # Was: both workers exited 1 with "unknown family 'stridecopy'", and no database was written.
    options = tiny_tune(stridecopy_spec, tmp_path, workers=2)
    summary = runner.run(options, Console(file=io.StringIO(), width=120))
    assert not summary.worker_errors and summary.unfinished == 0 and summary.db_path is not None
    (entry,) = read_database(summary.db_path).entries.values()
    assert entry.key.family == "stridecopy"


def test_the_compile_pool_sees_families_registered_in_code_and_reports_what_it_cannot_load(
    stridecopy_spec: Path,
) -> None:
    # Was: the pool's process answered "unknown family 'stridecopy'", taken for a broken pool and dropped.
    from layoutgen.tuning.compile import CompileJob, CompilePool

    (target,) = plan.make_targets(tiny_tune(stridecopy_spec, stridecopy_spec.parent))
    pool = CompilePool(1)
    try:
        args = (("rows", 3), ("cols", 5))
        config = (("block_col", 8), ("block_row", 4), ("num_stages", 1), ("num_warps", 1))
        compiled = pool.submit(CompileJob(target.module_path, "copy", args, config, args))
        missing = pool.submit(CompileJob(str(stridecopy_spec.parent / "gone.py"), "copy", args, config, args))
        assert compiled is not None and missing is not None
        result = compiled.result(timeout=300)
        assert result is None or ("unknown family" not in result.message and not result.setup), result
        problem = missing.result(timeout=300)
        assert problem is not None and problem.setup and "gone.py" in problem.message
        deadline = time.monotonic() + 10  # the pool's callback runs just after the future is done
        while pool.setup_failures < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.setup_failures == 1 and "gone.py" in (pool.setup_problem or "")
    finally:
        pool.close()


def test_a_compile_pool_whose_processes_died_compiles_lazily_and_says_so(stridecopy_spec: Path) -> None:
    # Was: BrokenProcessPool raised out of `submit` and took the tuner down with a traceback (seen on an H100:
    # a script tuning without a __main__ guard, whose spawned compile processes re-ran it and died).
    import os
    import signal

    from layoutgen.tuning.compile import CompileJob, CompilePool

    (target,) = plan.make_targets(tiny_tune(stridecopy_spec, stridecopy_spec.parent))
    args = (("rows", 3), ("cols", 5))
    config = (("block_col", 8), ("block_row", 4), ("num_stages", 1), ("num_warps", 1))
    pool = CompilePool(1)
    try:
        first = pool.submit(CompileJob(target.module_path, "copy", args, config, args))
        assert first is not None
        first.result(timeout=300)
        assert pool._executor is not None
        for process in list(pool._executor._processes.values()):  # the pool's one process dies
            os.kill(process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        later = None
        while time.monotonic() < deadline:
            wider = (("rows", 3), ("cols", 7 + int(time.monotonic() * 1000) % 1000))
            later = pool.submit(CompileJob(target.module_path, "copy", wider, config, wider))
            if later is None:
                break
            time.sleep(0.1)
        assert later is None, "a broken pool must stop taking compiles"
        assert pool.setup_failures >= 1 and "the compile process" in (pool.setup_problem or "")
    finally:
        pool.close()


def test_child_processes_are_told_the_families_registered_in_code(stridecopy_spec: Path, packages: Path) -> None:
    from layoutgen.tuning.compile import child_environment

    environment = child_environment()
    assert environment["LAYOUTGEN_FAMILIES"] == "stridecopy=stridecopy"
    assert str(packages) in environment["PYTHONPATH"].split(":")


# ---------------------------------------------------------------------------------------------------
# D5. A kernel that computes a wrong result for one config records nothing
# ---------------------------------------------------------------------------------------------------
@requires_interpreter
def test_a_kernel_wrong_for_some_configs_records_no_decision(
    stridecopy_spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Was: "1 decision(s) recorded" for a kernel that failed the gate in most configs (the default passed by luck).
    from stridecopy import CopyWorkload

    original = CopyWorkload.gate

    def wrong_unless_the_default(self: Any, config: Any, seed: int) -> str | None:
        passed = original(self, config, seed)
        return passed if config.block_col == 8 and config.block_row == 4 else "copy differs from the reference"

    monkeypatch.setattr(CopyWorkload, "gate", wrong_unless_the_default)
    db = tmp_path / "db"
    args = ["tune", "--spec", str(stridecopy_spec), "--interpret", "--workers", "1", "--trials", "2"]
    args += ["--db", str(db), "--storage", str(tmp_path / "studies.journal")]
    code, out, err = run_main(args, capsys, monkeypatch)
    assert code == 1, err
    last = one_line(err.strip().splitlines()[-1])
    assert last.startswith("error: 1 studies recorded no decision because their kernel computed a wrong result")
    assert "transposed_copy copy C=5 float32 R=3" in last
    assert re.search(r"\b\d+ of \d+ configs failed the correctness gate, e\.g\. \{", last), last
    assert "copy differs from the reference" in last and "Traceback" not in err
    assert "decision(s) recorded" not in out
    assert not (db / device_file_name(CPU_INTERPRETER_DEVICE)).exists()


# ---------------------------------------------------------------------------------------------------
# D2, D3, D9. Family aliases on the command line
# ---------------------------------------------------------------------------------------------------
def test_a_broken_plugin_leaves_the_other_families_aliases(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Was: "No such option: --heads" (every family's aliases gone with the broken one).
    monkeypatch.setenv("LAYOUTGEN_FAMILIES", "broken=no_such_module_for_layoutgen_tests")
    monkeypatch.setenv("LAYOUTGEN_CACHE_DIR", str(tmp_path / "cache"))
    code, out, err = run_main(["tune", *TINY_DCP, "--heads", "64", "--db", str(tmp_path / "db")], capsys, monkeypatch)
    assert code == 0, err
    assert "pynccl_a2a pack N=2 Hl=32 D=8" in out
    # An option no loaded family declares names the family that did not load, and why, on one line.
    code, out, err = run_main(["tune", *TINY_DCP, "--kvheads", "4"], capsys, monkeypatch)
    assert code == 2 and "No such option" not in err and "Traceback" not in err, err
    (line,) = err.strip().splitlines()
    assert "--kvheads is no option of `layoutgen tune`" in line and "family 'broken' did not load" in line
    assert "LAYOUTGEN_FAMILIES" in line and "no_such_module_for_layoutgen_tests" in line


def test_an_alias_never_hijacks_an_option_and_a_shared_alias_is_refused(
    packages: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Was: `--workers 1` read as `--bucket 1`, and `--heads` silently meaning the alphabetically last family's C.
    import layoutgen.cli  # noqa: F401  (the app whose options expand_arguments protects)
    from layoutgen.cli.common import expand_arguments

    family_registry.register("aliasclash", "aliasclash")
    assert expand_arguments(["tune", "--workers", "1"])[1:] == ["--workers", "1"]
    capsys.readouterr()
    code, out, err = run_main(["tune", *TINY_DCP, "--workers", "1", "--db", str(tmp_path / "db")], capsys, monkeypatch)
    assert code == 0 and "B=1:" in out and "B=3:" in out, err  # the grid's sizes, not --bucket 1
    (warning,) = [one_line(line) for line in err.splitlines() if line.startswith("warning:")]
    assert "family 'aliasclash' declares the alias --workers for its size buckets" in warning
    assert "--workers is an option of `layoutgen tune`: the alias is ignored" in warning
    code, _, err = run_main(["tune", *TINY_DCP, "--heads", "4"], capsys, monkeypatch)
    assert code == 2, err
    last = one_line(err.strip().splitlines()[-1])
    assert last.startswith("error: --heads names different extents in different families")
    assert "C in aliasclash; H in dcp/ulysses" in last and "--shape C=V or --shape H=V" in last
    # --N is declared alike by DCP and Ulysses: still an alias.
    assert expand_arguments(["tune", "--N", "2"])[1:] == ["--shape", "N=2"]


def test_tune_help_lists_the_aliases_the_families_declare(
    packages: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Was: DCP's aliases written into the help ("DCP: --N, --heads, --D", "DCP alias --batch"), whatever is registered.
    code, out, _ = run_main(["tune", "--help"], capsys, monkeypatch)
    text = one_line(out)
    assert code == 0 and "DCP" not in text
    assert "--heads = H (dcp, ulysses)" in text and "--heads-kv = H_kv (ulysses)" in text
    assert "Aliases: --batch (dcp), --seq (ulysses)." in text
    family_registry.register("aliasclash", "aliasclash")
    code, out, _ = run_main(["tune", "--help"], capsys, monkeypatch)
    text = one_line(out)
    assert "--workers (aliasclash: --bucket) is ignored, an option of tune." in text
    assert "--heads names different extents in different families" in text and "--heads = H" not in text


# ---------------------------------------------------------------------------------------------------
# D8. `db show --spec` takes a spec file as build and tune do
# ---------------------------------------------------------------------------------------------------
@requires_interpreter
def test_db_show_selects_by_a_spec_file(
    stridecopy_spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Was: "no entry has the spec /…/transposed_copy.yaml": the path was compared with the spec names.
    summary = runner.run(tiny_tune(stridecopy_spec, tmp_path), Console(file=io.StringIO(), width=120))
    assert summary.db_path is not None
    db = str(tmp_path / "db")
    code, out, err = run_main(["db", "show", "--db", db, "--spec", str(stridecopy_spec)], capsys, monkeypatch)
    assert code == 0, err
    assert "1 entries" in out and "selected" not in out and "transposed_copy  copy" in out
    code, out, err = run_main(["db", "show", "--db", db, "--spec", str(tmp_path / "gone.yaml")], capsys, monkeypatch)
    (line,) = err.strip().splitlines()
    assert code == 2 and "--spec" in line and "gone.yaml" in line and "no such file" in line, err


@pytest.mark.parametrize("command", ["show", "diff"])
def test_show_and_diff_help_list_the_aliases_the_families_declare(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Was: "(DCP: --N, --batch, --heads, --D)" written into the help: DCP's --empty and Ulysses' --seq missing.
    code, out, _ = run_main([command, "--help"], capsys, monkeypatch)
    text = one_line(out)
    assert code == 0 and "DCP" not in text
    assert "--empty = E (dcp)" in text and "--seq = S_local (ulysses)" in text and "--heads = H (dcp, ulysses)" in text
