"""What a new user trips over (issue 17) and the CLI's input handling (issue 18, items 3 and 4).

* CPU tensors without the interpreter are a clear error, not Triton's "0 active drivers";
* output fits 80 columns with every name whole (db show, tune --dry-run, the verification lines, the tune
  tables), also for every bundled spec of every family;
* a closed pipe (`| head`) ends every printing command with exit 0 and no traceback;
* help texts: flags shown as flags, `layoutgen[plot]` not eaten as markup; `--png` without matplotlib fails
  before drawing; `--debug` works after the subcommand;
* bundled names for `build --spec`, `load()` errors that say how to build, a missing spec file and a YAML
  syntax error named as such;
* user text (paths, exception messages) is never rich markup; bad input exits 2 with one line.

Commands run through the real entry point (`layoutgen.cli.main`) in this process where they can; the
closed pipe and the missing interpreter need a process of their own (they run in parallel).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT
from rich.console import Console

from layoutgen import codegen
from layoutgen.family import Check, VerifyReport, get_family
from layoutgen.spec import SpecError, bundled_spec_paths, bundled_specs
from layoutgen.tuning_db import TuningEntry, TuningKey, read_database, record

WIDTH = 80
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
PYNCCL_SPEC = next(path for path in bundled_spec_paths() if path.stem == "pynccl_a2a")


def run_main(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, width: int = WIDTH
) -> tuple[int, str, str]:
    """`layoutgen ARGS` through the real entry point, in this process, on a console `width` columns wide:
    (exit code, stdout, stderr)."""
    from layoutgen.cli import build, common, db, main, tune

    narrow = Console(width=width, highlight=False)  # rich reads COLUMNS once, when a console is made
    for module in (common, build, db, tune):
        monkeypatch.setattr(module, "console", narrow)
    monkeypatch.delenv("LAYOUTGEN_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["layoutgen", *args])
    try:
        main()
        code: Any = 0  # a command that succeeds returns
    except SystemExit as exited:
        code = exited.code
    out, err = capsys.readouterr()
    return (code if isinstance(code, int) else 0 if code is None else 1), out, err


def child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": str(WIDTH), **extra}
    env.pop("LAYOUTGEN_DEBUG", None)
    return env


def assert_fits(text: str, width: int = WIDTH, exempt: str | None = None) -> None:
    """Every line within `width` columns, but those naming `exempt` (a path the test chose: a path is printed
    whole on its own line, however long)."""
    long = [line for line in text.splitlines() if len(line) > width and (exempt is None or exempt not in line)]
    assert not long, f"{len(long)} line(s) wider than {width} columns, e.g. {long[0]!r}"


def assert_one_line_error(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert "Traceback" not in err and "rerun with --debug" not in err, err
    for word in words:
        assert word in err, f"{word!r} not in {err!r}"


# ---------------------------------------------------------------------------------------------
# Item 1: CPU tensors without TRITON_INTERPRET
# ---------------------------------------------------------------------------------------------
CPU_WITHOUT_INTERPRETER = """
import json, traceback, torch, layoutgen
mod = layoutgen.load("pynccl_a2a")
bufs = mod.alloc(2, 4, 8, 16, torch.bfloat16, device="cpu")
calls = {
    "pack": lambda: mod.pack(torch.randn(3, 8, 16, dtype=torch.bfloat16), torch.randn(3, 8), bufs),
    "combine": lambda: mod.combine(bufs, 3),
}
seen = {}
for name, call in calls.items():
    try:
        call()
        seen[name] = None
    except Exception as error:
        files = [frame.filename for frame in traceback.extract_tb(error.__traceback__)]
        seen[name] = [type(error).__name__, str(error), files]
print(json.dumps(seen))
"""


def test_cpu_tensors_without_the_interpreter_are_a_clear_error(tmp_path: Path) -> None:
    env = child_env()
    env.pop("TRITON_INTERPRET", None)
    result = subprocess.run(
        [sys.executable, "-c", CPU_WITHOUT_INTERPRETER],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.splitlines()[-1])
    for name, outcome in seen.items():
        assert outcome is not None, f"{name} ran on CPU tensors without the interpreter"
        kind, message, files = outcome
        assert kind == "RuntimeError", outcome
        assert "on cpu" in message and "TRITON_INTERPRET=1" in message and "CUDA tensors" in message, message
        assert "active drivers" not in message
        assert not [f for f in files if f"{os.sep}triton{os.sep}" in f], f"{name} failed inside Triton: {files}"


# ---------------------------------------------------------------------------------------------
# Item 3: 80 columns, every name whole, for every bundled spec
# ---------------------------------------------------------------------------------------------
def _widest_entry(spec: Any, kernel: str, bucket: int) -> TuningEntry:
    """An entry of `spec`'s `kernel` with large extents and every block > 1: the widest line it can print."""
    family = get_family(spec.family)
    config = {
        name: 1024 if name.startswith("block_") else 16 for name in family.kernel(kernel).config_type.field_names()
    }
    config["num_stages"] = 2
    key = TuningKey(
        family=family.name,
        spec=spec.name,
        kernel=kernel,
        extents=tuple((name, 4096) for name in family.key_extents),
        dtype=family.dtypes[-1],
        bucket_name=family.bucket.name,
        bucket=bucket,
    )
    return TuningEntry(
        key=key,
        config=config,
        median_us=12345.67,
        p20_us=12000.01,
        p80_us=13000.02,
        default_us=23456.78,
        trials=1024,
        spec_hash="a" * 64,
        source_hash="b" * 64,
        space_hash="c" * 64,
        timing_hash="d" * 64,
        versions={"triton": "3.6", "torch": "2.11"},
        measured_at="2026-11-29T07:00:00+00:00",
        rotating_sets=8,
    )


def every_bundled_kernel() -> list[tuple[Any, str]]:
    return [(spec, kernel.name) for spec in bundled_specs().values() for kernel in get_family(spec.family).kernels]


def test_db_show_fits_80_columns_for_every_bundled_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = [_widest_entry(spec, kernel, bucket) for spec, kernel in every_bundled_kernel() for bucket in (1, 65536)]
    record(tmp_path, "NVIDIA H200", "9.0", entries, {"triton": "3.6", "torch": "2.11"})
    code, summary, err = run_main(["db", "show", "--db", str(tmp_path), "--device", "NVIDIA H200"], capsys, monkeypatch)
    assert code == 0, err
    assert_fits(summary, exempt=str(tmp_path))
    for spec, kernel in every_bundled_kernel():
        assert any(line.split()[:2] == [spec.name, kernel] for line in summary.splitlines()), (spec.name, kernel)
    assert len(summary.splitlines()) < 10 + len(every_bundled_kernel()), "the default is a summary"

    code, listed, err = run_main(
        ["db", "show", "--db", str(tmp_path), "--device", "NVIDIA H200", "--entries"], capsys, monkeypatch
    )
    assert code == 0, err
    assert_fits(listed, exempt=str(tmp_path))
    lines, words = listed.splitlines(), " ".join(listed.split())
    for entry in entries:
        key = entry.key
        label = " ".join([key.spec, key.kernel, *(f"{name}={value}" for name, value in key.extents), key.dtype])
        assert f"{label} (stale spec)" in words, label  # the test entries' spec hashes are made up
        size = f"{key.bucket_name}={key.bucket}"
        assert any(line.split()[:2] == [size, "12345.67"] for line in lines), size
    assert "peer1024" in listed or "batch1024" in listed


def test_db_show_selects_by_spec_kernel_and_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = [_widest_entry(spec, kernel, bucket) for spec, kernel in every_bundled_kernel() for bucket in (1, 64)]
    record(tmp_path, "NVIDIA H200", "9.0", entries, {"triton": "3.6", "torch": "2.11"})
    spec, kernel = every_bundled_kernel()[0]
    bucket_name = get_family(spec.family).bucket.name
    args = ["db", "show", "--db", str(tmp_path), "--entries", "--spec", spec.name, "--kernel", kernel]
    code, out, err = run_main([*args, "--shape", f"{bucket_name}=64"], capsys, monkeypatch)
    assert code == 0, err
    assert "1 selected" in out and f"{bucket_name}=64 " in out and f"{bucket_name}=1 " not in out
    code, out, err = run_main([*args, "--shape", "nope=3"], capsys, monkeypatch)
    assert code == 0 and "0 selected" in out and "no entry has the extent nope" in out, out + err
    assert "grid" not in out
    # The grid's total heads are no key extent: the hint says the keys hold one rank's share.
    code, out, err = run_main([*args, "--shape", "H=128"], capsys, monkeypatch)
    assert code == 0 and "no entry has the extent H;" in out and "Hl = H/N" in out, out + err


def test_the_verification_lines_fit_80_columns_for_every_bundled_spec() -> None:
    from layoutgen.cli.build import checks_table

    longest = "worst error 0.96 of the tolerance (bases e and 2), bytes identical in 5 shapes (N 1 to 8), round trip"
    reports = [
        VerifyReport(
            spec.name, spec.family, tuple(Check(k.name, True, longest) for k in get_family(spec.family).kernels), ()
        )
        for spec in bundled_specs().values()
    ]
    widest = max(len(check.kernel) for report in reports for check in report.checks)
    console = Console(file=io.StringIO(), width=WIDTH, no_color=True)
    for report in reports:
        console.print(checks_table(report, widest))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert_fits(text)
    words = " ".join(text.split())
    for report in reports:
        for check in report.checks:
            assert f"ok {check.kernel} " in words
    assert words.count("round trip") == sum(len(report.checks) for report in reports), "a detail was cut"


def _result_rows(timed: bool) -> list[Any]:
    """A study of every bundled spec and kernel at its family's smallest and largest default bucket, with
    three-digit extents and five-digit times."""
    from layoutgen.tuning.report import ResultRow

    rows = []
    for spec, kernel in every_bundled_kernel():
        family = get_family(spec.family)
        for bucket in (1, max(family.bucket.defaults)):
            rows.append(
                ResultRow(
                    spec=spec.name,
                    kernel=kernel,
                    extents=tuple((name, 512) for name in family.key_extents),
                    dtype=family.dtypes[-1],
                    bucket_name=family.bucket.name,
                    bucket=bucket,
                    mode="exhaustive" if bucket == 1 else "tpe",
                    trials=1024,
                    chosen="database",
                    median_us=12345.67 if timed else 8088.27,
                    default_us=23456.78,
                    bytes_moved=10**10,
                    copy_tbps=4.14 if timed else None,
                    reason="",
                )
            )
    return rows


def test_the_tune_tables_fit_80_columns_or_fall_back_to_a_line_per_study() -> None:
    from layoutgen.tuning.report import result_lines

    rows = _result_rows(timed=True)
    lines = result_lines(rows, " (NVIDIA H200, copy 4.14 TB/s)", width=WIDTH)
    assert_fits("\n".join(lines))
    for row in rows:
        assert f"  {row.kernel} {row.shape} {row.dtype}" in lines
        assert any(line.split()[:3] == [str(row.bucket), "ex" if row.bucket == 1 else "tpe", "1024"]
                   for line in lines)  # fmt: skip
    narrow = result_lines(rows, "", width=40)
    for row in rows:
        line = next(line for line in narrow if f"{row.kernel} {row.shape} {row.dtype} size {row.bucket_name}=" in line)
        assert "tuned µs 12345.67" in line and "speed-up 1.90x" in line and "kept database" in line


def test_tuning_on_the_interpreter_shows_no_timings() -> None:
    from layoutgen.tuning.report import INTERPRETER_NOTE, markdown, result_lines, summary_lines

    rows = _result_rows(timed=False)
    console = Console(file=io.StringIO(), width=WIDTH, no_color=True)
    for line in result_lines(rows, " (cpu-interpreter)", timed=False, width=WIDTH):
        console.print(line, soft_wrap=True)  # as the runner prints: tables whole, the summary wrapped
    for line in summary_lines(rows, timed=False):
        console.print(line)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert_fits(text)
    assert INTERPRETER_NOTE[0] in text
    for hidden in ("µs", "8088", "TB/s", "speed-up", "1.90x", "geomean"):
        assert hidden not in text.replace(INTERPRETER_NOTE[0], ""), hidden
    report = markdown(rows, ["# layoutgen tune: cpu-interpreter"], timed=False)
    assert "8088" not in report and "speed-up" not in report and "| kept |" in report


# ---------------------------------------------------------------------------------------------
# Item 4: a closed pipe; items 3, 5, 7: 80 columns and help texts, in processes of their own
# ---------------------------------------------------------------------------------------------
class ClosedPipe(io.StringIO):
    """stdout whose reader went away: every write fails as a pipe with no reader does (EPIPE)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


PRINTING_COMMANDS = {
    "build": ["build", "--spec", "pynccl_a2a", "--out", "{tmp}/out", "--no-verify"],
    "show": ["show", "pynccl_a2a"],
    "show --json": ["show", "pynccl_a2a", "--json"],
    "diff": ["diff", "pynccl_a2a", "vllm_a2a", "--runs"],
    "tune --dry-run": ["tune", "--dry-run", "--spec", "pynccl_a2a"],
    "db show": ["db", "show", "--entries"],
    "db check": ["db", "check"],
    "families": ["families"],
    "families --json": ["families", "--json"],
    "help": ["show", "--help"],
}


def test_a_closed_pipe_ends_every_printing_command_with_exit_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each command's first write meets a closed pipe (rich, click and plain writes alike); one real pipe,
    closed after a few lines as `| head -3` closes it, in a process of its own."""
    from layoutgen.cli import build, common, db, main, tune

    monkeypatch.delenv("LAYOUTGEN_DEBUG", raising=False)
    for name, args in PRINTING_COMMANDS.items():
        fresh = Console(highlight=False)  # a console keeps what it could not write: none may leak to later tests
        for module in (common, build, db, tune):
            monkeypatch.setattr(module, "console", fresh)
        monkeypatch.setattr(sys, "argv", ["layoutgen", *(arg.replace("{tmp}", str(tmp_path)) for arg in args)])
        monkeypatch.setattr(sys, "stdout", ClosedPipe())
        try:
            main()
            code: Any = "returned"
        except SystemExit as exited:
            code = exited.code
        err = capsys.readouterr().err
        assert code == 0, f"{name}: exit {code!r}\n{err}"
        assert err == "", f"{name}:\n{err}"

    process = subprocess.Popen(
        [sys.executable, "-m", "layoutgen.cli", "tune", "--dry-run"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={key: value for key, value in child_env().items() if key != "COLUMNS"},  # a pipe's own width
    )
    assert process.stdout is not None and process.stderr is not None
    head = [process.stdout.readline().decode() for _ in range(3)]
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0 and err == "", err
    assert_fits("".join(head))


def test_output_and_help_fit_80_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from layoutgen.tuning import plan, prepare  # noqa: F401  (prepare binds the real search_plan first)

    monkeypatch.setenv("COLUMNS", str(WIDTH))  # click sizes help to the terminal
    # The widest cell a study can print, without enumerating every space (tests/test_tuning.py checks those).
    # prepare is imported above: imported first under the stub, it would keep the stub for the rest of the
    # process (`from ... import search_plan`), and a later `tune --interpret` in this worker would plan with it.
    monkeypatch.setattr(plan, "search_plan", lambda problem, bucket, options: plan.SearchPlan("tpe", 99999, 9999))
    commands = {
        "tune --dry-run": ["tune", "--dry-run"],
        "families": ["families"],
        **{f"{' '.join(c)} --help": [*c, "--help"] for c in (["build"], ["show"], ["diff"], ["tune"], ["db", "show"])},
    }
    outputs = {}
    for name, args in commands.items():
        code, outputs[name], err = run_main(args, capsys, monkeypatch)
        assert code == 0, f"{name}: {err}"
        assert_fits(outputs[name])
    dry_run = outputs["tune --dry-run"]
    for spec in bundled_specs().values():
        for kernel in get_family(spec.family).kernels:
            assert any(line.startswith(f"{spec.name} {kernel.name} ") for line in dry_run.splitlines()), spec.name
    assert any("studies," in line for line in dry_run.splitlines()[-3:])  # then the legend (and why no db read)
    helps = "\n".join(text for name, text in outputs.items() if name.endswith("--help"))
    assert "<bool>" not in helps and "<list[" not in helps and "\\[" not in helps  # flags as flags, values named
    assert "layoutgen[plot]" in outputs["show --help"]
    for flag in ("--check ", "--interpret ", "--dry-run ", "--retune ", "--entries ", "--runs "):
        assert flag in helps, flag
    assert "Not a cap" in " ".join(outputs["tune --help"].split())


def test_png_without_matplotlib_fails_before_drawing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    code, out, err = run_main(["show", "pynccl_a2a", "--png", str(tmp_path / "p.png")], capsys, monkeypatch)
    assert_one_line_error(code, err, "layoutgen[plot]")
    assert out == "" and list(tmp_path.iterdir()) == []


def test_debug_after_the_subcommand_shows_the_traceback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from layoutgen.cli import main
    from layoutgen.cli.common import expand_arguments

    assert expand_arguments(["show", "x.yaml", "--debug"]) == ["--debug", "show", "x.yaml"]
    monkeypatch.delenv("LAYOUTGEN_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["layoutgen", "show", str(tmp_path / "missing.yaml"), "--debug"])
    with pytest.raises(SpecError, match="spec file missing"):
        main()


# ---------------------------------------------------------------------------------------------
# Item 6: bundled names, load() errors, missing files, YAML syntax errors
# ---------------------------------------------------------------------------------------------
def test_build_takes_a_bundled_spec_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_main(
        ["build", "--spec", "pynccl_a2a", "--out", str(tmp_path), "--no-verify"], capsys, monkeypatch
    )
    assert code == 0, err
    spec = bundled_specs()["pynccl_a2a"]
    assert (tmp_path / "pynccl_a2a.py").read_text() == codegen.render(spec, codegen.display_name(PYNCCL_SPEC))
    code, _, err = run_main(["build", "--spec", "pynccl_a2b", "--out", str(tmp_path)], capsys, monkeypatch)
    assert_one_line_error(code, err, "no bundled spec named 'pynccl_a2b'", "pynccl_a2a")


def test_load_errors_say_how_to_build_a_module(tmp_path: Path) -> None:
    import layoutgen

    cases = {
        "my_backend": "layoutgen build --spec my_backend.yaml --out DIR",
        "my_backend.yaml": "layoutgen build --spec my_backend.yaml --out DIR",
        "my_backend.txt": "layoutgen build --spec FILE --out DIR",
        str(tmp_path / "my_backend.py"): f"layoutgen build --spec FILE.yaml --out {tmp_path}",
    }
    for argument, advice in cases.items():
        with pytest.raises((ValueError, FileNotFoundError)) as raised:
            layoutgen.load(argument)
        assert advice in str(raised.value), (argument, str(raised.value))


def test_a_missing_spec_and_a_yaml_syntax_error_are_named_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "my_backend.yaml"
    code, _, err = run_main(["show", str(missing)], capsys, monkeypatch)
    assert code == 2 and err.startswith(f"error: {missing}: spec file missing\n") and "invalid" not in err, err
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\n  payload: [\n")
    code, _, err = run_main(["show", str(broken)], capsys, monkeypatch)
    assert code == 2 and err.startswith(f"error: {broken}: invalid layout spec"), err
    assert f"in {broken}, line 2" in err and "unicode string" not in err, err


# ---------------------------------------------------------------------------------------------
# Issue 18, item 3: user text is never markup
# ---------------------------------------------------------------------------------------------
MARKUP_PATHS = ("d[/x]", "e[bold]B", "f[red]g[/red]")


def test_paths_that_look_like_markup_are_printed_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for index, name in enumerate(MARKUP_PATHS):
        verify = ["--no-verify"] if index else []  # one verification: the lines after a markup-like path
        code, out, err = run_main(["build", "--spec", "pynccl_a2a", "--out", name, *verify], capsys, monkeypatch)
        assert code == 0, err
        assert f"1 written, 0 unchanged in {name}\n" in out and (tmp_path / name / "pynccl_a2a.py").is_file()
        if not index:
            assert "ok" in out and "pack" in out
        database = tmp_path / f"db{name}"
        shutil.copytree(REPO_ROOT / "tuning_db", database, ignore=shutil.ignore_patterns("*.py", ".*"))
        code, out, err = run_main(["db", "check", "--db", str(database)], capsys, monkeypatch)
        assert code == 0 and f"ok {database / 'NVIDIA_H200.json'}: " in out, out + err
        code, out, err = run_main(["db", "show", "--db", str(database)], capsys, monkeypatch)
        assert code == 0 and f"{database / 'NVIDIA_H200.json'}\n  NVIDIA H200" in out, out + err
        missing = tmp_path / f"{name}.yaml"
        code, _, err = run_main(["show", str(missing)], capsys, monkeypatch)
        assert code == 2 and err.startswith(f"error: {missing}: spec file missing"), err


def test_tune_prints_markup_like_paths_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, db, report = tmp_path / "c[bold]", tmp_path / "e[bold]B", tmp_path / "r[/x]" / "report.md"
    monkeypatch.setenv("LAYOUTGEN_CACHE_DIR", str(cache))
    shape = ["--N", "2", "--heads", "2", "--D", "8", "--batch", "1", "--trials", "1", "--exhaustive-limit", "1"]
    args = ["tune", "--interpret", "--spec", "pynccl_a2a", "--kernel", "pack", *shape, "--workers", "1"]
    code, out, err = run_main([*args, "--db", str(db), "--report", str(report)], capsys, monkeypatch)
    assert code == 0, out + err
    assert f"studies in journal file {cache / 'tuning' / 'studies.journal'}\n" in out
    assert f"1 decision(s) recorded in {db / 'cpu-interpreter.json'}" in out
    assert read_database(db / "cpu-interpreter.json").entries and report.read_text().startswith("# layoutgen tune")


# ---------------------------------------------------------------------------------------------
# Issue 18, item 4: bad input exits 2 with one line
# ---------------------------------------------------------------------------------------------
def _bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], tuple[str, ...]]]:
    (tmp_path / "notes.txt").write_text("a regular file")
    under_file = str(tmp_path / "notes.txt" / "db")
    copy = tmp_path / "copy.yaml"
    copy.write_text(PYNCCL_SPEC.read_text())
    dry = ["--dry-run"]
    tiny = ["tune", "--interpret", "--spec", "pynccl_a2a", "--kernel", "pack", "--N", "2", "--heads", "2", "--D", "8"]
    return {
        "tune unknown spec": (["tune", "--spec", "nope", *dry], ("--spec nope", "bundled: ")),
        "tune /dev/null": (["tune", "--spec", "/dev/null", *dry], ("--spec /dev/null", "not a regular file")),
        "tune a directory": (["tune", "--spec", str(tmp_path), *dry], ("is a directory",)),
        "tune two specs, one name": (["tune", "--spec", "pynccl_a2a", str(copy), *dry], ("both name a spec",)),
        "tune unknown kernel": (["tune", "--kernel", "pak", *dry], ("--kernel pak",)),
        "tune --db under a file": ([*tiny, "--db", under_file], (f"--db {under_file}", "is a file")),
        "tune --report under a file": ([*tiny, "--report", f"{under_file}/r.md"], ("--report", "is a file")),
        "db show empty device": (["db", "show", "--device", ""], ("--device", "no letters or digits")),
        "db show --db under a file": (["db", "show", "--db", under_file], (f"--db {under_file}", "is a file")),
        "db check --db under a file": (["db", "check", "--db", under_file], (f"--db {under_file}", "is a file")),
        "db check missing --db": (["db", "check", "--db", str(tmp_path / "none")], ("does not exist",)),
        "db show bad --shape": (["db", "show", "--shape", "N"], ("--shape takes NAME=VALUE",)),
    }


def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAYOUTGEN_CACHE_DIR", str(tmp_path / "cache"))
    for name, (args, words) in _bad_inputs(tmp_path).items():
        code, _, err = run_main(args, capsys, monkeypatch)
        try:
            assert_one_line_error(code, err, *words)
        except AssertionError as failure:
            raise AssertionError(f"{name}: {failure}") from None
    assert not (tmp_path / "cache" / "tuning").exists(), "bad input was found after the study storage was opened"


@pytest.mark.parametrize("kind", ["sysfs", "read-only-permissions"])
def test_tune_refuses_an_unwritable_db_before_tuning(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if kind == "sysfs":
        if not Path("/sys/kernel").is_dir():
            pytest.skip("needs Linux sysfs at /sys")
        db = Path("/sys/layoutgen_db")
    else:
        if AS_ROOT:
            pytest.skip("runs as root, where file permissions do not stop writes")
        db = tmp_path / "read_only"
        db.mkdir()
        db.chmod(0o555)
    monkeypatch.setenv("LAYOUTGEN_CACHE_DIR", str(tmp_path / "cache"))
    args = ["tune", "--interpret", "--spec", "pynccl_a2a", "--kernel", "pack", "--N", "2", "--heads", "2", "--D", "8"]
    try:
        code, _, err = run_main([*args, "--db", str(db)], capsys, monkeypatch)
    finally:
        if kind != "sysfs":
            db.chmod(0o755)
    assert_one_line_error(code, err, f"--db {db}", "cannot write to")
    assert not (tmp_path / "cache" / "tuning").exists()


def test_the_diff_summary_is_short_and_runs_list_every_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, summary, err = run_main(["diff", "pynccl_a2a", "vllm_a2a"], capsys, monkeypatch)
    assert code == 0 and len(summary.splitlines()) <= 12, summary + err
    code, runs, err = run_main(["diff", "pynccl_a2a", "vllm_a2a", "--runs"], capsys, monkeypatch)
    assert code == 0 and len(runs.splitlines()) > 3 * len(summary.splitlines()), err


def test_ci_stops_the_postgres_server_it_started(tmp_path: Path) -> None:
    run = (REPO_ROOT / ".ci" / "run").read_text()
    trap, start = run.index("trap '.ci/postgres stop"), run.index("    .ci/postgres ||")
    assert trap < start, ".ci/run must arm the stop before it starts the server"
    result = subprocess.run(
        ["bash", str(REPO_ROOT / ".ci" / "postgres"), "stop"],
        env={**os.environ, "LAYOUTGEN_PG_DATA": str(tmp_path / "pg")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0 and "nothing to stop" in result.stdout, result.stdout + result.stderr


def test_references_to_the_design_document_point_into_docs() -> None:
    from layoutgen.spec import SCHEMA_DOC

    assert SCHEMA_DOC.startswith("docs/design.md §")
    texts = {"README.md": (REPO_ROOT / "README.md").read_text()}
    texts.update({str(p): p.read_text() for p in (REPO_ROOT / "layoutgen" / "cli").glob("*.py")})
    stale = [name for name, text in texts.items() if "DESIGN §" in text or "DESIGN.md" in text]
    assert not stale, f"'DESIGN §N' or 'DESIGN.md' in {stale}: the design document is docs/design.md"


def test_json_output_is_never_wrapped(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from layoutgen.cli import common

    monkeypatch.setattr(common, "console", Console(width=20))
    for args in (["families", "--json"], ["show", "pynccl_a2a", "--json"]):
        monkeypatch.setattr(sys, "argv", ["layoutgen", *args])
        from layoutgen.cli import main

        main()
        json.loads(capsys.readouterr().out)  # whole lines however narrow the console
