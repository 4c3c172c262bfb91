"""Hostile specs cannot inject code, escape their directory or take the loader down (issue 8, guarantee 1).

Every input is either refused with a `SpecError` whose report is one screen of printable lines (no other
exception leaves `parse_spec_text` / `load_spec`), or it renders a module whose top-level definitions are
exactly those of the bundled modules, which imports without side effects and packs byte for byte like the
reference.  `layoutgen build --spec X --out D` writes D/<name>.py and nothing else.

Default run: a few hundred fuzzed inputs.  The long run: `pytest -m slow tests/test_hardening_specs.py`.
"""

from __future__ import annotations

import ast
import os
import shutil
import stat
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import assert_same_bytes, fill_bytes, random_inputs, requires_interpreter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from layoutgen import codegen
from layoutgen.dcp import reference
from layoutgen.dcp.layout import LayoutBuffers, wire_dtype
from layoutgen.dcp.spec import PAYLOAD_AXES, STATS_AXES, DcpSpec
from layoutgen.loader import generated_dir, load_path
from layoutgen.spec import (
    MAX_PROBLEMS_SHOWN,
    MAX_SPEC_BYTES,
    SpecError,
    bundled_specs,
    load_spec,
    parse_spec,
    parse_spec_text,
)

#: The DCP family's bundled specs: the module shapes and fuzzed fields below are DCP's.
BUNDLED = {name: spec for name, spec in bundled_specs().items() if spec.family == "dcp"}
PARSE_EXAMPLES, PARSE_EXAMPLES_SLOW = 200, 5000  # per strategy; four strategies
RENDER_EXAMPLES, RENDER_EXAMPLES_SLOW = 10, 150
FAST = {"deadline": None, "derandomize": True, "suppress_health_check": list(HealthCheck)}
SLOW = {"deadline": None, "suppress_health_check": list(HealthCheck)}
#: A report line longer than this is not "one screen"; fields and messages are cut well below it.
MAX_REPORT_LINE = 520


def outcome(text: str, source: str = "fuzz.yaml") -> DcpSpec | SpecError:
    """parse_spec_text's verdict; any exception other than SpecError escapes and fails the test."""
    try:
        return parse_spec_text(text, source)
    except SpecError as error:
        assert_clear_report(error, source)
        return error


def assert_clear_report(error: SpecError, source: str) -> None:
    lines = str(error).splitlines()
    assert lines[0].endswith(": invalid layout spec") and source in lines[0], lines[0]
    assert 2 <= len(lines) <= MAX_PROBLEMS_SHOWN + 2, f"{len(lines)} lines: not one screen"
    assert error.problems, "a SpecError names at least one problem"
    for line in lines[1:]:
        assert line.startswith("  "), line
    for line in lines:
        assert line.isprintable(), f"unescaped control or format character in {line!r}"
        assert len(line) <= MAX_REPORT_LINE, f"{len(line)}-character line"


# ---------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------
FIELD_WORDS = ("name", "summary", "transport", "payload", "stats", "axes", "dtype", "placement", "slots", "slot")
FIELD_WORDS += ("align_bytes", "<<", "peer", "batch", "head", "dim", "input", "float32", "row_tail", "separate")
HUGE_INTS = st.integers(min_value=10**18, max_value=10**400) | st.integers(max_value=-(10**18), min_value=-(10**400))
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | HUGE_INTS
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=24)
    | st.sampled_from(FIELD_WORDS)
)
VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.sampled_from(FIELD_WORDS) | st.text(max_size=10), children, max_size=6)
    ),
    max_leaves=24,
)

#: YAML constructs a spec must never use, dropped into otherwise plausible text.
HOSTILE_SNIPPETS = (
    "&anchor",
    "*anchor",
    "<<: *anchor",
    "<<: {dtype: input}",
    "!!python/object/apply:os.system ['true']",
    "!!python/object:builtins.dict {}",
    "!!python/name:os.system",
    "!!python/module:os",
    "!!binary aGVsbG8=",
    "!!set {a, b}",
    "!!timestamp 2001-12-14",
    "!!omap [a: 1]",
    "!!int '0x7fffffffffffffffffff'",
    "!!float .inf",
    "!custom tag",
    "%TAG ! tag:evil.example,2024:\n---",
    "--- \n...",
    "? [complex, key]\n: value",
    "? {a: 1}\n: value",
    "[" * 40 + "]" * 40,
    "{a: " * 30,
    "9" * 5000,
    "\t",
    "\x00",
    "\ufeff",
    "\u202e",
    '"\\ud800"',
    "'''",
    '"""',
    "{{ name }}",
    "{% for x in y %}",
)


@st.composite
def valid_spec_data(draw: Any) -> dict[str, Any]:
    """A dict that parse_spec accepts: every placement, dtype, transport and axis order, any summary."""
    transport = draw(st.sampled_from(["all_to_all_single", "external"]))
    placement = draw(st.sampled_from(["row_tail", "separate"]))
    dtype = draw(st.sampled_from(["input", "float32"]))
    inner = list(draw(st.permutations(PAYLOAD_AXES)))
    if transport == "all_to_all_single":
        inner = ["peer", *[a for a in inner if a != "peer"]]
    if placement == "row_tail" and dtype == "input":
        inner = [*[a for a in inner if a != "dim"], "dim"]
    data: dict[str, Any] = {
        "name": draw(st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True)),
        "summary": draw(st.text(max_size=200)),
        "transport": transport,
        "payload": {"axes": inner, "dtype": dtype},
    }
    if placement == "row_tail":
        data["stats"] = {"placement": "row_tail"}
        align = draw(st.sampled_from([None, 4, 8, 16, 32, 64, 128, 256]))
        if align is not None:
            data["align_bytes"] = align
    else:
        axes = list(draw(st.permutations(STATS_AXES)))
        if transport == "all_to_all_single":
            axes = ["peer", *[a for a in axes if a != "peer"]]
        slots = draw(st.integers(1, 4))
        data["stats"] = {"placement": "separate", "axes": axes, "slots": slots, "slot": draw(st.integers(0, slots - 1))}
    return data


def _spec_text(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            found += _paths(value, (*prefix, index))
    return found


@st.composite
def mutated_spec_data(draw: Any) -> Any:
    """A valid spec with a few fields replaced by values of any type, removed, or joined by unknown keys."""
    data = draw(valid_spec_data())
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(data)
        path = draw(st.sampled_from(paths))
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "remove", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(VALUES)
        elif action == "remove" and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(FIELD_WORDS) | st.text(max_size=8))] = draw(VALUES)
    return data


@st.composite
def spliced_text(draw: Any) -> str:
    """A valid spec's YAML with hostile constructs spliced in at random places (lines and values)."""
    lines = _spec_text(draw(valid_spec_data())).splitlines()
    for _ in range(draw(st.integers(1, 3))):
        snippet = draw(st.sampled_from(HOSTILE_SNIPPETS))
        at = draw(st.integers(0, len(lines)))
        if at < len(lines) and ": " in lines[at] and draw(st.booleans()):
            key, _, _ = lines[at].partition(": ")
            lines[at] = f"{key}: {snippet}"
        else:
            lines.insert(at, snippet)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Fuzzing: parse only
# ---------------------------------------------------------------------------------------------
def _check_any_text(text: str) -> None:
    outcome(text)


def _check_any_structure(data: Any) -> None:
    result = outcome(yaml.safe_dump(data, allow_unicode=True))
    if isinstance(result, DcpSpec):  # a random structure that is a spec must be one the rules allow
        assert parse_spec(result.model_dump(mode="json")) == result


def _check_mutated(data: Any) -> None:
    result = outcome(_spec_text(data) if isinstance(data, dict) else yaml.safe_dump(data))
    if isinstance(result, DcpSpec):
        assert parse_spec(result.model_dump(mode="json")) == result


def _check_spliced(text: str) -> None:
    outcome(text)


@settings(max_examples=PARSE_EXAMPLES, **FAST)
@given(text=st.text(max_size=400))
def test_any_text_is_a_spec_or_a_clear_error(text: str) -> None:
    _check_any_text(text)


@settings(max_examples=PARSE_EXAMPLES, **FAST)
@given(data=VALUES)
def test_any_yaml_structure_is_a_spec_or_a_clear_error(data: Any) -> None:
    _check_any_structure(data)


@settings(max_examples=PARSE_EXAMPLES, **FAST)
@given(data=mutated_spec_data())
def test_specs_with_wrong_types_and_unknown_keys_are_clear_errors(data: Any) -> None:
    _check_mutated(data)


@settings(max_examples=PARSE_EXAMPLES, **FAST)
@given(text=spliced_text())
def test_hostile_yaml_constructs_are_clear_errors(text: str) -> None:
    _check_spliced(text)


@pytest.mark.slow
@settings(max_examples=PARSE_EXAMPLES_SLOW, **SLOW)
@given(text=st.text(max_size=2000))
def test_any_text_long_run(text: str) -> None:
    _check_any_text(text)


@pytest.mark.slow
@settings(max_examples=PARSE_EXAMPLES_SLOW, **SLOW)
@given(data=VALUES)
def test_any_yaml_structure_long_run(data: Any) -> None:
    _check_any_structure(data)


@pytest.mark.slow
@settings(max_examples=PARSE_EXAMPLES_SLOW, **SLOW)
@given(data=mutated_spec_data())
def test_wrong_types_long_run(data: Any) -> None:
    _check_mutated(data)


@pytest.mark.slow
@settings(max_examples=PARSE_EXAMPLES_SLOW, **SLOW)
@given(text=spliced_text())
def test_hostile_yaml_constructs_long_run(text: str) -> None:
    _check_spliced(text)


# ---------------------------------------------------------------------------------------------
# Hand-written hostile YAML
# ---------------------------------------------------------------------------------------------
def _billion_laughs(levels: int = 9) -> str:
    lines = ['lol0: &lol0 "lol"']
    for level in range(1, levels + 1):
        lines.append(f"lol{level}: &lol{level} [" + ", ".join([f"*lol{level - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


# (id, text, words the report must contain)
HOSTILE_YAML = [
    ("billion-laughs", _billion_laughs(), "aliases are not allowed"),
    ("merge-key-of-an-alias", "base: &b {dtype: input}\npayload:\n  <<: *b\n", "aliases are not allowed"),
    ("inline-merge-key", "payload:\n  <<: {dtype: input}\n  axes: [peer, batch, head, dim]\n", "merge keys"),
    ("python-object-apply", "name: !!python/object/apply:os.system ['touch {sentinel}']\n", "tags"),
    ("python-object-new", "!!python/object/new:os.system ['touch {sentinel}']\n", "tags"),
    ("python-name", "name: !!python/name:os.system\n", "tags"),
    ("python-module", "name: !!python/module:os\n", "tags"),
    ("deep-flow-nesting", "[" * 30000 + "]" * 30000, "nested deeper than"),
    ("deep-block-nesting", "".join("  " * i + f"k{i}:\n" for i in range(200)), "nested deeper than"),
    ("list-as-key", "? [1, 2]\n: x\n", "keys are plain words"),
    ("mapping-as-key", "{? {a: 1} : b}\n", "keys are plain words"),
    ("5000-digit-integer", "name: a\nalign_bytes: " + "9" * 5000 + "\n", "integer"),
    ("two-documents", "name: a\n---\nname: b\n", "single document"),
    ("nul-byte", "name: a\x00\n", "unacceptable character"),
    ("lone-surrogate", "name: \ud800\n", "unacceptable character"),
    ("right-to-left-override-key", "\u202ename: a\n", "\\u202e"),
    ("newline-in-key", '"a\\nb": 1\n', "a\\nb: unknown key"),
    ("7000-unknown-keys", "".join(f"k{i}: 1\n" for i in range(7000)), "more problem(s)"),
]


@pytest.mark.parametrize(("text", "words"), [c[1:] for c in HOSTILE_YAML], ids=[c[0] for c in HOSTILE_YAML])
def test_hostile_yaml_is_refused_clearly_and_quickly(text: str, words: str, tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"
    text = text.replace("{sentinel}", str(sentinel))
    assert len(text.encode("utf-8", "surrogatepass")) <= MAX_SPEC_BYTES
    started = time.perf_counter()
    result = outcome(text)
    elapsed = time.perf_counter() - started
    assert isinstance(result, SpecError) and words in str(result), str(result)
    # At most 1.3 s on 2 busy cores; CI's ran up to 7x slower.  The bound catches a blow-up, it times nothing.
    assert elapsed < 60.0, f"{elapsed:.2f} s"
    assert not sentinel.exists(), "a YAML tag ran code"


# The most expensive inputs under the size limit: how long and how much memory parsing takes.
WORST_CASES = [
    pytest.param("[" + ",".join(["1"] * 32000) + "]", id="64k-flow-list"),
    pytest.param("[" * MAX_SPEC_BYTES, id="64k-nesting"),
    pytest.param("x: [" + ",".join(["{a: 1}"] * 9000) + "]", id="64k-list-of-mappings", marks=pytest.mark.slow),
    pytest.param("".join(f"k{i}: 1\n" for i in range(7000)), id="64k-block-keys", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("text", WORST_CASES)
def test_parsing_is_bounded_in_time_and_memory(text: str) -> None:
    assert len(text.encode()) <= MAX_SPEC_BYTES
    started = time.perf_counter()
    assert isinstance(outcome(text), SpecError)
    elapsed = time.perf_counter() - started
    tracemalloc.start()  # apart: it slows PyYAML about 3x, and CI's busy cores took 18.5 s with it
    try:
        outcome(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Linear work: about 1 s on 2 busy cores and 22 MB.  The bound is there to catch a parse that grows
    # faster than its input (32000 items squared is minutes), not to time it.
    assert elapsed < 60.0 and peak < 64 * 2**20, f"{elapsed:.2f} s, {peak / 2**20:.1f} MiB"


def test_a_10_mb_file_is_refused_without_being_read(tmp_path: Path) -> None:
    huge = tmp_path / "huge.yaml"
    with huge.open("w", encoding="utf-8") as stream:
        stream.write("name: my_backend\nsummary: |\n")
        for _ in range(10 * 2**20 // 64):
            stream.write("  " + "x" * 61 + "\n")
    assert huge.stat().st_size > 10 * 2**20
    tracemalloc.start()
    try:
        started = time.perf_counter()
        with pytest.raises(SpecError, match=r"larger than 65536 bytes") as caught:
            load_spec(huge)
        elapsed = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert_clear_report(caught.value, str(huge))
    # The memory shows what was read; the time only that nothing waited on the 10 MB (milliseconds here).
    assert elapsed < 10.0 and peak < 2 * MAX_SPEC_BYTES + 2**16, f"{elapsed:.3f} s, {peak} bytes"


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_an_endless_file_is_refused() -> None:
    started = time.perf_counter()
    with pytest.raises(SpecError, match=r"/dev/zero: cannot read the spec file\n  \(file\): is a character device"):
        load_spec("/dev/zero")
    assert time.perf_counter() - started < 10.0  # an endless read never returns


# ---------------------------------------------------------------------------------------------
# Names and file names
# ---------------------------------------------------------------------------------------------
VALID = BUNDLED["pynccl_a2a"].model_dump(mode="json")
HOSTILE_NAMES = [
    "../evil",
    "..",
    "a/b",
    "a\\b",
    "a.b",
    "evil.py",
    "/abs",
    "abc\n",
    "a\nimport os",
    "a b",
    "a\x00",
    "",
    "A",
    "_private",
    "__init__",
    "__main__",
    "1abc",
    "a" * 65,
    "ａｂｃ",  # fullwidth letters
    "café",
    "import",
    "match",
    "os",
    "sys",
    "builtins",
    "torch",
    "numpy",
    "yaml",
    "jinja2",
    "sitecustomize",
    "usercustomize",
    "conftest",
    "setup",
    "con",
    "nul",
    "lpt1",
    "com9",
]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=ascii)
def test_hostile_names_are_refused_naming_the_field(name: str, tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec({**VALID, "name": name}, source="inline")
    assert "name" in [field for field, _ in caught.value.problems], str(caught.value)
    assert_clear_report(caught.value, "inline")
    if "\x00" not in name:  # YAML cannot carry NUL
        spec_file = tmp_path / "spec.yaml"
        spec_file.write_text(_spec_text({**VALID, "name": name}), encoding="utf-8")
        with pytest.raises(SpecError) as from_file:
            load_spec(spec_file)
        assert "name" in [field for field, _ in from_file.value.problems], str(from_file.value)


def _cli(args: list[str]) -> Any:
    from typer.testing import CliRunner

    from layoutgen.cli import app
    from layoutgen.cli.common import expand_arguments

    return CliRunner().invoke(app, expand_arguments(args))


def _all_files(root: Path) -> set[Path]:
    return {path for path in root.rglob("*") if not path.is_dir()}


# Spec file names with newlines, comment breakers, unicode, option-like dashes, `..` components.
HOSTILE_FILE_NAMES = [
    "evil\nimport os; os.system('touch PWNED')\n#.yaml",
    'x""".yaml',
    "spec # {{ name }} {% raw %}.yaml",
    "\u202ecod.yaml",
    "ünïcødé 🎉.yaml",
    "-spec.yaml",
    "sub/../spec.yaml",
]


@pytest.mark.parametrize("file_name", HOSTILE_FILE_NAMES, ids=ascii)
def test_build_writes_only_the_named_module_inside_out(
    file_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(codegen.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "sub").mkdir()
    spec_file = tmp_path / file_name
    spec_file.write_text(_spec_text({**VALID, "name": "my_backend"}), encoding="utf-8")
    before = _all_files(tmp_path)
    out = tmp_path / "out"
    result = _cli(["build", "--spec", str(spec_file), "--out", str(out), "--no-verify"])
    assert result.exit_code == 0, result.output
    created = _all_files(tmp_path) - before
    locks = {p for p in created if p.parent.name == f"layoutgen-locks-{os.getuid()}" and p.suffix == ".lock"}
    assert created - locks == {out / "my_backend.py"}
    source = (out / "my_backend.py").read_text(encoding="utf-8")
    assert source.splitlines()[0].startswith("# Code generated by layoutgen ")
    assert source.splitlines()[1].startswith('"""DCP pack / combine kernels')
    assert top_level_shape(source) == expected_shape("all_to_all_single")
    assert not (tmp_path / "PWNED").exists()


def test_build_replaces_a_symlink_in_out_and_leaves_its_target_alone(tmp_path: Path) -> None:
    outside = tmp_path / "outside.py"
    outside.write_text("precious = 1\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "pynccl_a2a.py").symlink_to(outside)
    spec_file = tmp_path / "pynccl_a2a.yaml"
    spec_file.write_text(_spec_text(VALID), encoding="utf-8")
    result = _cli(["build", "--spec", str(spec_file), "--out", str(out), "--no-verify"])
    assert result.exit_code == 0, result.output
    assert outside.read_text() == "precious = 1\n"
    assert not (out / "pynccl_a2a.py").is_symlink() and (out / "pynccl_a2a.py").is_file()


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="per-user lock directories are a POSIX concern")
def test_the_lock_directory_is_private_and_a_planted_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "tmp"
    base.mkdir()
    monkeypatch.setattr(codegen.tempfile, "gettempdir", lambda: str(base))
    codegen.write_if_changed(tmp_path / "out" / "a.py", "a = 1\n")
    lock_dir = base / f"layoutgen-locks-{os.getuid()}"
    assert stat.S_IMODE(lock_dir.stat().st_mode) & 0o077 == 0 and lock_dir.stat().st_uid == os.getuid()
    # Another user's directory (here: world-writable) or a planted symlink must not hold this user's locks.
    shutil.rmtree(lock_dir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    lock_dir.symlink_to(elsewhere)
    with pytest.raises(PermissionError, match="not a private directory"):
        codegen.write_if_changed(tmp_path / "out" / "b.py", "b = 1\n")
    assert list(elsewhere.iterdir()) == [] and not (tmp_path / "out" / "b.py").exists()
    lock_dir.unlink()
    lock_dir.mkdir()
    lock_dir.chmod(0o777)
    with pytest.raises(PermissionError, match="not a private directory"):
        codegen.write_if_changed(tmp_path / "out" / "b.py", "b = 1\n")


# ---------------------------------------------------------------------------------------------
# Rendered modules: the expected definitions, no side effects, byte-exact pack
# ---------------------------------------------------------------------------------------------
def top_level_shape(source: str) -> list[tuple[str, ...]]:
    """Each top-level statement as (kind, names...): what a module defines, imports and runs at import."""
    shape: list[tuple[str, ...]] = []
    for index, node in enumerate(ast.parse(source).body):
        if isinstance(node, ast.Expr) and index == 0 and isinstance(node.value, ast.Constant):
            shape.append(("docstring",))
        elif isinstance(node, ast.FunctionDef):
            shape.append(("def", node.name, *[ast.unparse(d) for d in node.decorator_list]))
        elif isinstance(node, ast.Assign):
            shape.append(("assign", *[ast.unparse(t) for t in node.targets]))
        elif isinstance(node, ast.Import):
            shape.append(("import", *[f"{a.name} as {a.asname}" for a in node.names]))
        elif isinstance(node, ast.ImportFrom):
            shape.append(("from", str(node.module), *[f"{a.name} as {a.asname}" for a in node.names]))
        else:
            shape.append((type(node).__name__, ast.unparse(node)[:60]))
    return shape


def expected_shape(transport: str, fp8: bool = False) -> list[tuple[str, ...]]:
    """The top-level statements of the bundled modules with this transport and wire kind (they all agree)."""
    shapes = {
        name: top_level_shape((generated_dir() / f"{name}.py").read_text(encoding="utf-8"))
        for name, spec in BUNDLED.items()
        if spec.transport.value == transport and spec.fp8 == fp8
    }
    first = next(iter(shapes.values()))
    assert all(shape == first for shape in shapes.values()), "bundled modules disagree on their top level"
    return first


def _ast_without_summary(source: str) -> str:
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "SPEC_SUMMARY":
            node.value = ast.Constant(value="<summary>")
    return ast.dump(tree)


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_SIDE_EFFECTS = {
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "subprocess.Popen",
    "socket.connect",
    "socket.bind",
    "socket.sendto",
    "socket.getaddrinfo",
    "os.remove",
    "os.rename",
    "os.rmdir",
    "os.mkdir",
    "os.chmod",
    "os.chown",
    "os.truncate",
    "os.symlink",
    "os.link",
    "shutil.rmtree",
    "shutil.copyfile",
    "shutil.move",
    "ctypes.dlopen",
    "urllib.Request",
    "webbrowser.open",
}
_audit: dict[str, list[tuple[str, Any]] | None] = {"log": None}


def _audit_hook(event: str, args: tuple[Any, ...]) -> None:
    log = _audit["log"]
    if log is None:
        return
    if event in _SIDE_EFFECTS:
        log.append((event, args))
    elif event == "open" and len(args) >= 3:
        mode, flags = args[1], args[2]
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS
        ):
            log.append((event, args))


sys.addaudithook(_audit_hook)  # inert unless a test switches the log on; audit hooks cannot be removed


def import_watching_side_effects(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[tuple[str, Any]]]:
    """Import a module file; return it and every write, process, network or file-system event on the way."""
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # Python's own __pycache__ write is not the module's
    log: list[tuple[str, Any]] = []
    _audit["log"] = log
    try:
        module = load_path(path)
    finally:
        _audit["log"] = None
    return module, log


def test_the_side_effect_audit_sees_writes_and_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The check must be able to fail: a module that writes a file and starts a process at import.
    bad = tmp_path / "bad_module.py"
    bad.write_text(
        f"import os, subprocess\nopen({str(tmp_path / 'out.txt')!r}, 'w').close()\nsubprocess.run(['true'])\n",
        encoding="utf-8",
    )
    _, log = import_watching_side_effects(bad, monkeypatch)
    assert {"open", "subprocess.Popen"} <= {event for event, _ in log}


def check_rendered(data: dict[str, Any], directory: Path, monkeypatch: pytest.MonkeyPatch, pack: bool) -> None:
    """Render `data`; the module has the bundled top level, imports quietly, and (if `pack`) packs exactly."""
    spec = parse_spec(data, source="fuzz")
    source = codegen.render(spec, "fuzz.yaml")
    assert top_level_shape(source) == expected_shape(spec.transport.value, spec.fp8)
    plain = codegen.render(spec.model_copy(update={"summary": "plain"}), "fuzz.yaml")
    assert _ast_without_summary(source) == _ast_without_summary(plain), "the summary changed code"
    path = directory / f"{spec.name}.py"
    codegen.write_if_changed(path, source)
    module, events = import_watching_side_effects(path, monkeypatch)
    assert events == [], f"import had side effects: {events}"
    assert spec == module.SPEC and spec.summary == module.SPEC_SUMMARY
    if not pack:
        return
    N, B, B_max, H, D, dtype = 2, 2, 3, 4, 4, torch.bfloat16
    if spec.row_tail and D * wire_dtype(spec, dtype).itemsize % 4:
        D = 6
    out, lse = random_inputs(B, H, D, dtype, torch.Generator().manual_seed(len(spec.summary)))
    ours = fill_bytes(module.alloc(N, B_max, H, D, dtype))
    theirs = fill_bytes(LayoutBuffers.allocate(spec, N, B_max, H, D, dtype))
    module.pack(out, lse, ours)
    reference.pack(out, lse, theirs)
    assert_same_bytes(ours, theirs, spec.name)


HOSTILE_SUMMARIES = [
    '"""',
    "'''",
    '"""; import os; os.system("touch PWNED"); """',
    "'''\nimport os\nos.system('touch PWNED')\n'''",
    "\n",
    "\r\n\r",
    "#",
    "# -*- coding: latin-1 -*-",
    "{{ name }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% for x in range(10**9) %}{% endfor %}",
    "{% raw %}",
    "{# unterminated",
    "__import__('os').system('touch PWNED')",
    "\\",
    "\\N{BULLET} \\x00 \\u0041",
    "\x00\x01\x1b[31m",
    "\u2028\u2029\x85",
    "\u202e\u2066evil\u2069",
    "\ufeff",
    "\ud800\udfff",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🎉",
    "../../etc/passwd",
    "C:\\Windows\\system32",
    "x" * 2000,
    '"' * 2000,
]


@requires_interpreter
def test_hostile_summaries_render_the_same_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for index, summary in enumerate(HOSTILE_SUMMARIES):
        for base in ("pynccl_a2a", "flashinfer_mnnvl"):
            data = {**BUNDLED[base].model_dump(mode="json"), "name": f"hostile_{base}_{index}", "summary": summary}
            try:
                parse_spec(data, source="inline")
            except SpecError as error:  # text that is not a string at all (lone surrogates) is refused
                assert [field for field, _ in error.problems] == ["summary"], str(error)
                assert_clear_report(error, "inline")
                continue
            check_rendered(data, tmp_path, monkeypatch, pack=index % 9 == 0)
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()


@requires_interpreter
@settings(max_examples=RENDER_EXAMPLES, **FAST)
@given(data=valid_spec_data())
def test_any_valid_spec_renders_quietly_and_packs_exactly(
    data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    assume(_accepted(data))
    with tempfile.TemporaryDirectory() as directory:
        check_rendered(data, Path(directory), monkeypatch, pack=True)


@pytest.mark.slow
@requires_interpreter
@settings(max_examples=RENDER_EXAMPLES_SLOW, **SLOW)
@given(data=valid_spec_data())
def test_any_valid_spec_renders_quietly_long_run(data: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    assume(_accepted(data))
    with tempfile.TemporaryDirectory() as directory:
        check_rendered(data, Path(directory), monkeypatch, pack=True)


def _accepted(data: dict[str, Any]) -> bool:
    try:
        parse_spec(data)
    except SpecError as error:
        # Only a reserved name may be refused: everything else the strategy draws is valid by construction.
        assert [field for field, _ in error.problems] == ["name"], str(error)
        return False
    return True
