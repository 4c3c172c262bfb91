"""The CLI audit's fourth round: environment variables, paths and arguments the commands misread.

Each bad value is bad input (exit 2) with one `error: ...` line naming the thing and the fix, found before
anything is drawn, verified or written.  Commands run through the real entry point in this process.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from test_cli_polish import PYNCCL_SPEC, assert_one_line_error, run_main

from layoutgen.spec import SpecError, reserved_names


def read_only_dir(path: Path) -> Path:
    """`path` made a folder no file can be created in; skipped where this process writes there anyway (root
    with CAP_DAC_OVERRIDE: run under `setpriv --bounding-set=-dac_override` to exercise it)."""
    path.mkdir(exist_ok=True)
    path.chmod(0o555)
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError:
        return path
    path.chmod(0o755)
    pytest.skip("this process writes into a read-only folder (root): permissions cannot be tested")


# ---------------------------------------------------------------------------------------------
# 1. Generated modules on the path do not make their names reserved
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def fresh_reserved_names() -> Iterator[None]:
    reserved_names.cache_clear()  # computed once per process from sys.path
    yield
    reserved_names.cache_clear()


def test_a_folder_of_generated_modules_on_the_path_reserves_none_of_their_names(
    fresh_reserved_names: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # `PYTHONPATH=<a build's --out> layoutgen show vllm_a2a` failed: the bundled specs' names read as taken.
    built = tmp_path / "built"
    built.mkdir()
    shutil.copy(REPO_ROOT / "generated" / "deepspeed_ulysses.py", built)
    (built / "someones_module.py").write_text("VALUE = 1\n")  # an ordinary module keeps its name reserved
    monkeypatch.syspath_prepend(str(built))
    code, out, err = run_main(["show", "vllm_a2a", "--json"], capsys, monkeypatch)
    assert code == 0 and out.startswith("{"), err
    assert "deepspeed_ulysses" not in reserved_names() and "someones_module" in reserved_names()


def test_a_spec_rebuilds_with_its_output_folder_on_the_path(
    fresh_reserved_names: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spec = tmp_path / "zzz_round4.yaml"
    spec.write_text(PYNCCL_SPEC.read_text().replace("name: pynccl_a2a", "name: zzz_round4"))
    out = tmp_path / "out"
    args = ["build", "--no-verify", "--spec", str(spec), "--out", str(out)]
    code, _, err = run_main(args, capsys, monkeypatch)
    assert code == 0, err
    monkeypatch.syspath_prepend(str(out))
    reserved_names.cache_clear()
    code, out_text, err = run_main(args, capsys, monkeypatch)
    assert code == 0 and "0 written, 1 unchanged" in out_text, err


# ---------------------------------------------------------------------------------------------
# 2. LAYOUTGEN_FAMILIES
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("x=os", ("module os of family 'x' must expose", "fix the entry x=os")),
        ("x=layoutgen.dcp", ("its FAMILY is 'dcp'", "remove the entry x=layoutgen.dcp")),
        ("x=json,x=os", ("names the family 'x' twice", "keep one")),
        ("My-Family=os", ("family name 'My-Family' must match", "rename it")),
    ],
    ids=["no FAMILY", "another family's module", "a name twice", "a bad name"],
)
def test_layoutgen_families_entries_that_name_no_family_are_bad_input(
    value: str, words: tuple[str, ...], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Exit 1 with "error: TypeError: ..." / "ValueError: ..." before; the last two were taken as they came.
    monkeypatch.setenv("LAYOUTGEN_FAMILIES", value)
    code, _, err = run_main(["families"], capsys, monkeypatch)
    assert_one_line_error(code, err, "LAYOUTGEN_FAMILIES", *words)


# ---------------------------------------------------------------------------------------------
# 3. LAYOUTGEN_CONFIG
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("garbage", "is not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"pack": {"block_head": 3}}', "forces an invalid pack config"),
    ],
)
def test_a_malformed_layoutgen_config_fails_build_before_verification(
    value: str, words: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LAYOUTGEN_CONFIG", value)
    out = tmp_path / "out"
    code, stdout, err = run_main(["build", "--spec", "pynccl_a2a", "--out", str(out)], capsys, monkeypatch)
    assert_one_line_error(code, err, "LAYOUTGEN_CONFIG", words, "unset it")
    assert "ValueError" not in err and "verifying" not in stdout and not out.exists()


# ---------------------------------------------------------------------------------------------
# 4. LAYOUTGEN_CACHE_DIR
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["a regular file", "read-only"])
def test_an_unusable_cache_dir_is_named(
    kind: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if kind == "a regular file":
        cache = tmp_path / "afile"
        cache.write_text("x\n")
    else:
        cache = read_only_dir(tmp_path / "cache")
    monkeypatch.setenv("LAYOUTGEN_CACHE_DIR", str(cache))
    try:
        args = ["tune", "--dry-run", "--db", str(tmp_path / "db"), "--spec", str(PYNCCL_SPEC)]
        code, _, err = run_main(args, capsys, monkeypatch)
    finally:
        cache.chmod(0o755)
    assert_one_line_error(code, err, f"LAYOUTGEN_CACHE_DIR={cache}", "writable directory")


# ---------------------------------------------------------------------------------------------
# 5. LAYOUTGEN_DEBUG
# ---------------------------------------------------------------------------------------------
def run_with_debug(value: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """`layoutgen show missing.yaml` (a SpecError) with LAYOUTGEN_DEBUG=value; a SpecError raised out of the
    entry point is a traceback, shown when debugging is on."""
    from layoutgen.cli import main

    monkeypatch.setenv("LAYOUTGEN_DEBUG", value)
    monkeypatch.setattr(sys, "argv", ["layoutgen", "show", "missing_round4.yaml"])
    try:
        main()
    except SystemExit as exited:
        return int(exited.code or 0), capsys.readouterr().err
    raise AssertionError("main() returned")


@pytest.mark.parametrize("value", ["False", "FALSE", "No", "OFF", "0", "false"])
def test_layoutgen_debug_off_in_any_case(
    value: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, err = run_with_debug(value, capsys, monkeypatch)
    assert code == 2 and "spec file missing" in err, err


@pytest.mark.parametrize("value", ["True", "YES", "On", "1"])
def test_layoutgen_debug_on_in_any_case(
    value: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SpecError):
        run_with_debug(value, capsys, monkeypatch)


def test_an_unrecognised_layoutgen_debug_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, err = run_with_debug("maybe", capsys, monkeypatch)
    assert_one_line_error(code, err, "LAYOUTGEN_DEBUG", "'maybe'", "0/false/no/off")


# ---------------------------------------------------------------------------------------------
# 6. LAYOUTGEN_TUNING_DB in the db commands (dispatch keeps never raising)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["check", "show", "prune"])
@pytest.mark.parametrize("kind", ["a regular file", "missing"])
def test_db_commands_refuse_a_tuning_db_variable_that_is_no_directory(
    command: str, kind: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from layoutgen.runtime.configs import database_dirs

    where = tmp_path / "afile"
    if kind == "a regular file":
        where.write_text("x\n")
    monkeypatch.setenv("LAYOUTGEN_TUNING_DB", str(where))
    code, _, err = run_main(["db", command], capsys, monkeypatch)
    problem = "is not a directory" if kind == "a regular file" else "does not exist"
    assert_one_line_error(code, err, f"LAYOUTGEN_TUNING_DB={where} {problem}", "or unset it")
    assert database_dirs()[0] == where  # dispatch reads the variable as before, and does not raise


# ---------------------------------------------------------------------------------------------
# 7. tune --spec X.py that layoutgen did not generate
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["x = 1\n", "def (:\n", "raise RuntimeError('imported')\n"])
def test_tune_refuses_a_python_file_layoutgen_did_not_generate(
    text: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    module = tmp_path / "empty_mod.py"
    module.write_text(text)
    args = ["tune", "--dry-run", "--interpret", "--db", str(tmp_path / "db"), "--spec", str(module)]
    code, _, err = run_main(args, capsys, monkeypatch)
    assert_one_line_error(code, err, f"{module} is not a module generated by layoutgen")


# ---------------------------------------------------------------------------------------------
# 8. db prune on a read-only folder
# ---------------------------------------------------------------------------------------------
def test_db_prune_names_a_read_only_database_folder(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from test_tuning_db import DEVICE, VERSIONS, make_entry, make_key

    from layoutgen.tuning_db import read_database, record

    db = tmp_path / "db"
    path = record(db, DEVICE, "9.0", [make_entry(make_key(1, spec="vllm_a2a"))], VERSIONS)  # a stale spec hash
    read_only_dir(db)
    try:
        code, _, err = run_main(["db", "prune", "--db", str(db)], capsys, monkeypatch)
    finally:
        db.chmod(0o755)
    assert_one_line_error(code, err, f"cannot prune the database folder {db}", "make it writable", "--dry-run")
    assert len(read_database(path).entries) == 1


# ---------------------------------------------------------------------------------------------
# 9-11. Paths in the way: a directory where the module goes, --check into a file, --png a directory
# ---------------------------------------------------------------------------------------------
def test_build_names_the_module_path_a_directory_holds(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "out" / "pynccl_a2a.py").mkdir(parents=True)
    args = ["build", "--spec", "pynccl_a2a", "--out", str(tmp_path / "out")]
    code, out, err = run_main(args, capsys, monkeypatch)
    assert_one_line_error(code, err, f"cannot write {tmp_path / 'out' / 'pynccl_a2a.py'}: it is a directory")
    assert "verifying" not in out  # found before the verification, not after it


def test_build_check_into_a_file_is_bad_input_and_its_advice_keeps_the_options(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x\n")
    code, _, err = run_main(["build", "--check", "--out", str(afile), "--spec", "pynccl_a2a"], capsys, monkeypatch)
    assert_one_line_error(code, err, f"--out {afile}: {afile} is not a directory")
    out = tmp_path / "my out"
    code, _, err = run_main(["build", "--check", "--out", str(out), "--spec", "pynccl_a2a"], capsys, monkeypatch)
    assert code == 1 and f"run `layoutgen build --spec pynccl_a2a --out '{out}'`" in err, err


@pytest.mark.parametrize(("target", "words"), [("adir", "is a directory"), ("", "--png needs a file name")])
def test_show_png_refuses_a_directory_or_no_name_before_drawing(
    target: str, words: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if target:
        (tmp_path / target).mkdir()
        target = str(tmp_path / target)
    code, out, err = run_main(["show", "pynccl_a2a", "--png", target], capsys, monkeypatch)
    assert_one_line_error(code, err, words)
    assert not out.strip(), "something was drawn before the refusal"


def test_build_out_empty_is_bad_input(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run_main(["build", "--no-verify", "--spec", "pynccl_a2a", "--out", ""], capsys, monkeypatch)
    assert_one_line_error(code, err, "--out needs a directory")


# ---------------------------------------------------------------------------------------------
# 12. A generated module where a spec belongs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["show", "build"])
def test_a_generated_module_given_for_a_spec_names_its_source(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    module = REPO_ROOT / "generated" / "vllm_a2a.py"
    args = ["show", str(module)] if command == "show" else ["build", "--spec", str(module), "--out", str(tmp_path)]
    code, _, err = run_main(args, capsys, monkeypatch)
    assert_one_line_error(code, err, "is a module generated by layoutgen, not a spec", "built from", "vllm_a2a.yaml")


# ---------------------------------------------------------------------------------------------
# 13. `--spec A B` and `--db A B`, as the README writes them
# ---------------------------------------------------------------------------------------------
def test_build_and_db_take_several_values_after_one_option(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    args = ["build", "--no-verify", "--spec", "pynccl_a2a", "vllm_a2a", "--out", str(out)]
    code, stdout, err = run_main(args, capsys, monkeypatch)
    assert code == 0 and "2 written" in stdout, err
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    code, stdout, err = run_main(["db", "check", "--db", str(tmp_path / "a"), str(tmp_path / "b")], capsys, monkeypatch)
    assert code == 0 and f"{tmp_path / 'a'}, {tmp_path / 'b'}" in " ".join(stdout.split()), err


# ---------------------------------------------------------------------------------------------
# 14. An --out path that is not UTF-8
# ---------------------------------------------------------------------------------------------
def test_build_into_a_path_that_is_not_utf8(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if sys.getfilesystemencoding() != "utf-8":
        pytest.skip("a surrogate-escaped name needs a UTF-8 file system encoding")
    out = tmp_path / "o\udcffx"  # the byte 0xff, as Python reads it from argv
    code, out_text, err = run_main(
        ["build", "--no-verify", "--spec", "pynccl_a2a", "--out", str(out)], capsys, monkeypatch
    )
    assert code == 0 and "o\\xffx" in out_text, err  # printed, the byte escaped
    assert (out / "pynccl_a2a.py").is_file()


# ---------------------------------------------------------------------------------------------
# 15. tune --kernel that one of the specs does not have
# ---------------------------------------------------------------------------------------------
def test_tune_refuses_a_spec_without_the_kernels_asked_for(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    args = ["tune", "--dry-run", "--interpret", "--db", str(tmp_path / "db"), "--spec", "pynccl_a2a"]
    code, out, err = run_main([*args, "deepspeed_ulysses", "--kernel", "pack"], capsys, monkeypatch)
    assert_one_line_error(code, err, "--spec deepspeed_ulysses has no kernel pack", "its kernels: scatter")
    assert not out.strip()


# ---------------------------------------------------------------------------------------------
# Spec reports: an empty file, and values of the wrong kind shown as given
# ---------------------------------------------------------------------------------------------
SPEC_WITHOUT_SUMMARY = """name: my_backend
transport: all_to_all_single
payload: {axes: [peer, batch, head, dim], dtype: input}
stats: {placement: row_tail}
"""


@pytest.mark.parametrize("text", ["", "\n\n", "---\n...\n"])
def test_an_empty_spec_file_is_called_empty(tmp_path: Path, text: str) -> None:
    from layoutgen.spec import load_spec

    spec = tmp_path / "empty.yaml"
    spec.write_text(text)
    with pytest.raises(SpecError, match=r"\(top level\): the file is empty; a spec is a mapping of keys"):
        load_spec(spec)


@pytest.mark.parametrize(
    ("line", "field", "shown"),
    [
        ('align_bytes: "4"', "align_bytes", "Input should be a valid integer; got a string '4'"),
        ("align_bytes: 4.5", "align_bytes", "Input should be a valid integer; got a number 4.5"),
        ("summary: no", "summary", "Input should be a valid string; got the boolean false (YAML reads yes/no/on/off"),
    ],
)
def test_a_value_of_the_wrong_kind_is_shown_as_given(tmp_path: Path, line: str, field: str, shown: str) -> None:
    from layoutgen.spec import load_spec

    spec = tmp_path / "my_backend.yaml"
    spec.write_text(SPEC_WITHOUT_SUMMARY + ("" if line.startswith("summary") else "summary: s\n") + line + "\n")
    with pytest.raises(SpecError) as raised:
        load_spec(spec)
    assert f"{field}: {shown}" in str(raised.value), str(raised.value)


def test_an_unknown_transport_is_shown_as_given(tmp_path: Path) -> None:
    from layoutgen.spec import load_spec

    spec = tmp_path / "my_backend.yaml"
    spec.write_text("summary: s\n" + SPEC_WITHOUT_SUMMARY.replace("all_to_all_single", "nccl"))
    with pytest.raises(
        SpecError, match=r"transport: Input should be 'all_to_all_single' or 'external'; got a string 'nccl'"
    ):
        load_spec(spec)


def test_version_prints_the_package_version(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from layoutgen import __version__

    code, out, err = run_main(["--version"], capsys, monkeypatch)
    assert (code, out.strip(), err) == (0, f"layoutgen {__version__}", "")


def test_db_show_entries_of_an_interpreter_database_shows_no_times(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # README (Tuning): the interpreter's wall clock is no kernel timing; `tune --interpret` shows none, nor may db.
    from test_tuning_db import VERSIONS, make_entry

    from layoutgen.tuning_db import CPU_INTERPRETER_DEVICE, record

    record(tmp_path, CPU_INTERPRETER_DEVICE, "0.0", [make_entry(median_us=14235.57)], VERSIONS)
    args = ["db", "show", "--db", str(tmp_path), "--device", CPU_INTERPRETER_DEVICE, "--entries"]
    code, out, err = run_main(args, capsys, monkeypatch)
    assert code == 0, err
    assert "not shown for the Triton interpreter" in out and "14235" not in out, out
    assert not re.search(r"\d\.\d\dx", out), out  # no speed-up
    assert "B=64 - - - 40 head4 dim512 w4" in " ".join(out.split()), out


def test_a_negative_shape_alias_is_refused_as_a_value(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not click's "No such option: -1": the alias takes -1 as its value, which the shape check refuses.
    code, out, err = run_main(["show", "pynccl_a2a", "--N", "-1"], capsys, monkeypatch)
    assert_one_line_error(code, err, "extents are positive integers; got 'N=-1'")
    assert not out.strip()  # refused before anything is drawn
