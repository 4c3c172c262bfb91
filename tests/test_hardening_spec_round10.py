"""Tenth hardening pass, from a mutation audit of the spec validation, code generation, `build`, `show` and
`diff` layers (98 single mutations; the tests here kill the 29 that survived every test and were no
equivalent mutation).

* Spec reports: exactly MAX_PROBLEMS_SHOWN problems have no "... and 0 more" line; a quoted key is cut only
  past its limit; a file name holding a newline stays on the first line; the YAML-boolean hint is for
  booleans only; an explicit empty key is named `~`; a family model's TypeError is a SpecError; a spec of
  exactly MAX_SPEC_BYTES is read; name + summary alone get no other family's hint; nesting is refused
  exactly past MAX_YAML_DEPTH; one name bundled by two families is refused.
* Schema rules: a repeated axis is no permutation; a (max, sum) slot clash blames the field written; a
  Ulysses direction takes at most MAX_TENSORS tensors.
* Generated files: left-over modules are listed in name order whatever the directory order, also those of
  a spec file whose name holds a space; a link in a module's place is replaced; modules are mode 0644.
* `build`: a `--check` finding only left-overs says to delete them; its rebuild hint quotes paths; one spec
  by a relative and an absolute path is built once; bundled specs do not own a directory of one's own; a
  spec file without an extension is a file.
* `show` / `diff`: bad --dtype / --shape values are refused naming the option; two families are refused
  before the shape is read; kinds not compared make a diff not identical and are named (other extents
  too); an element of another width is not in the same place.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_cli_polish import run_main

from layoutgen import codegen, show
from layoutgen.spec import (
    MAX_PROBLEMS_SHOWN,
    MAX_SPEC_BYTES,
    SpecError,
    bundled_spec_paths,
    bundled_specs,
    load_spec,
    parse_spec,
    parse_spec_text,
)
from layoutgen.spec_yaml import MAX_YAML_DEPTH
from layoutgen.ulysses.spec import MAX_TENSORS

VLLM_FIELDS: dict[str, object] = {
    "name": "round10_spec",
    "summary": "test spec",
    "transport": "all_to_all_single",
    "payload": {"axes": ["peer", "batch", "head", "dim"], "dtype": "input"},
    "stats": {"placement": "separate", "axes": ["peer", "batch", "head", "slot"]},
}


def problems_of(data: object) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as caught:
        parse_spec(data, source="round10.yaml")
    return caught.value.problems


# ---------------------------------------------------------------------------------------------
# Spec reports
# ---------------------------------------------------------------------------------------------
def test_exactly_the_shown_number_of_problems_has_no_more_line():
    extra = {f"unknown_{i:02d}": 1 for i in range(MAX_PROBLEMS_SHOWN)}
    with pytest.raises(SpecError) as caught:
        parse_spec({**VLLM_FIELDS, **extra}, source="round10.yaml")
    lines = str(caught.value).splitlines()
    assert len(lines) == 1 + MAX_PROBLEMS_SHOWN and "more problem" not in str(caught.value), lines
    with pytest.raises(SpecError) as caught:
        parse_spec({**VLLM_FIELDS, **extra, "unknown_last": 1}, source="round10.yaml")
    assert str(caught.value).splitlines()[-1] == "  ... and 1 more problem(s)"


def test_an_unknown_key_is_cut_only_past_its_limit():
    ((field, _),) = problems_of({**VLLM_FIELDS, "k" * 80: 1})
    assert field == "k" * 80
    ((field, _),) = problems_of({**VLLM_FIELDS, "k" * 81: 1})
    assert field == "k" * 77 + "..."


def test_a_file_name_holding_a_newline_stays_on_the_first_line(tmp_path):
    path = tmp_path / "evil\nname.yaml"
    path.write_text("name: [not, a, name]\n", encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    lines = str(caught.value).splitlines()
    assert lines[0] == f"{tmp_path}/evil\\nname.yaml: invalid layout spec", lines[0]
    assert all(line.startswith("  ") for line in lines[1:]), lines


@pytest.mark.parametrize("value, shown", [("5", "got a number 5"), ("[a]", "got a list ['a']")])
def test_the_yaml_boolean_hint_is_only_for_booleans(value, shown):
    text = yaml.safe_dump({**VLLM_FIELDS, "summary": "x"}, sort_keys=False).replace("summary: x", f"summary: {value}")
    with pytest.raises(SpecError) as caught:
        parse_spec_text(text, "round10.yaml")
    ((field, message),) = caught.value.problems
    assert field == "summary" and message.endswith(shown) and "boolean" not in message, message


def test_a_spec_of_exactly_the_size_limit_is_read(tmp_path):
    text = yaml.safe_dump(VLLM_FIELDS, sort_keys=False)
    padding = MAX_SPEC_BYTES - len(text.encode()) - 2  # "#" and "\n"
    path = tmp_path / "round10_spec.yaml"
    path.write_text(text + "#" + "x" * padding + "\n", encoding="utf-8")
    assert path.stat().st_size == MAX_SPEC_BYTES
    assert load_spec(path).name == "round10_spec"
    assert parse_spec_text(path.read_text(), "same.yaml").name == "round10_spec"
    path.write_text(text + "#" + "x" * (padding + 1) + "\n", encoding="utf-8")
    with pytest.raises(SpecError, match=f"larger than {MAX_SPEC_BYTES} bytes"):
        load_spec(path)


def test_a_spec_of_only_name_and_summary_is_not_told_it_is_another_family():
    problems = problems_of({"name": "round10_spec", "summary": "only these two"})
    assert "family" not in [field for field, _ in problems], problems
    assert ("transport", "required; add it") in problems


def test_an_empty_key_is_named_as_yaml_spells_a_null():
    text = yaml.safe_dump(VLLM_FIELDS, sort_keys=False) + "? \n: 5\n"  # an explicit key with nothing written
    with pytest.raises(SpecError) as caught:
        parse_spec_text(text, "round10.yaml")
    assert caught.value.problems == [
        ("~", "YAML reads the key ~ as null, not as a word: keys are field names; remove it, or quote it")
    ]


def test_a_family_model_that_raises_a_type_error_is_a_spec_error(monkeypatch):
    from pydantic import model_validator

    from layoutgen.dcp import FAMILY
    from layoutgen.dcp.spec import DcpSpec

    class Broken(DcpSpec):
        @model_validator(mode="after")
        def _broken(self) -> Broken:
            raise TypeError("a bug in the family")

    monkeypatch.setattr(type(FAMILY), "spec_model", Broken)
    with pytest.raises(SpecError) as caught:
        parse_spec(VLLM_FIELDS, source="round10.yaml")
    assert caught.value.problems == [("(spec)", "the dcp family's spec model raised TypeError: a bug in the family")]


def test_one_name_bundled_by_two_families_is_refused(tmp_path, monkeypatch):
    from layoutgen import spec as spec_module

    first = bundled_spec_paths_by_name()["vllm_a2a"]
    second = tmp_path / "other_family" / "vllm_a2a.yaml"
    second.parent.mkdir()
    second.write_bytes(first.read_bytes())
    monkeypatch.setattr(spec_module, "bundled_spec_paths", lambda: [first, second])
    with pytest.raises(SpecError, match="'vllm_a2a' is bundled by two families; rename one") as caught:
        bundled_specs()
    assert caught.value.source == str(second)


def test_nesting_is_refused_exactly_past_the_depth_limit():
    def summary_nested(levels: int) -> str:
        lists = levels - 2  # the top-level mapping and the innermost scalar are levels too
        return f"name: round10_spec\nsummary: {'[' * lists}1{']' * lists}\n"

    with pytest.raises(SpecError) as within:
        parse_spec_text(summary_nested(MAX_YAML_DEPTH), "deep.yaml")
    assert "nested deeper" not in str(within.value) and within.value.problems[0][0] == "summary"
    with pytest.raises(SpecError, match=f"nested deeper than {MAX_YAML_DEPTH} levels"):
        parse_spec_text(summary_nested(MAX_YAML_DEPTH + 1), "deep.yaml")


# ---------------------------------------------------------------------------------------------
# Schema rules
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "changes, field",
    [
        ({"payload": {"axes": ["peer", "batch", "head", "dim", "dim"], "dtype": "input"}}, "payload.axes"),
        ({"stats": {"placement": "separate", "axes": ["peer", "batch", "head", "slot", "peer"]}}, "stats.axes"),
        (
            {
                "payload": {
                    "axes": ["peer", "batch", "head", "dim"],
                    "dtype": "float8_e4m3fn",
                    "scale_axes": ["peer", "batch", "head", "block", "block"],
                }
            },
            "payload.scale_axes",
        ),
    ],
    ids=["payload", "stats", "scale_axes"],
)
def test_an_axis_list_that_repeats_an_axis_is_no_permutation(changes, field):
    problems = problems_of({**VLLM_FIELDS, **changes})
    assert [name for name, _ in problems] == [field]
    assert "permutation" in problems[0][1] and "each once" in problems[0][1]


@pytest.mark.parametrize(
    "written, field, fix",
    [
        ({"max_slot": 1}, "stats.max_slot", "add `sum_slot: 0`"),
        ({"sum_slot": 0}, "stats.sum_slot", "add `max_slot: 1`"),
    ],
)
def test_a_slot_clash_with_a_default_blames_the_field_written(written, field, fix):
    stats = {**VLLM_FIELDS["stats"], "form": "max_sum", **written}  # type: ignore[dict-item]
    ((name, message),) = problems_of({**VLLM_FIELDS, "stats": stats})
    assert name == field and fix in message, (name, message)


def test_a_ulysses_direction_takes_at_most_max_tensors():
    def with_tensors(count: int) -> dict[str, object]:
        spec = yaml.safe_load((bundled_spec_paths_by_name()["deepspeed_ulysses"]).read_text())
        spec["name"] = "round10_ulysses"
        spec["to_attention"]["tensors"] = [{"name": f"t{i}", "heads": "H"} for i in range(count)]
        return spec

    assert len(parse_spec(with_tensors(MAX_TENSORS)).to_attention.tensors) == MAX_TENSORS
    ((field, message),) = problems_of(with_tensors(MAX_TENSORS + 1))
    assert field == "to_attention.tensors" and f"between 1 and {MAX_TENSORS}" in message


def bundled_spec_paths_by_name() -> dict[str, Path]:
    return {path.stem: path for path in bundled_spec_paths()}


# ---------------------------------------------------------------------------------------------
# Generated files
# ---------------------------------------------------------------------------------------------
def test_left_over_modules_are_listed_in_name_order_whatever_the_directory_order(tmp_path, monkeypatch):
    spec = parse_spec(VLLM_FIELDS)
    planned = codegen.plan_outputs([(spec, Path("round10.yaml"))], tmp_path, with_init=False)
    codegen.write_if_changed(planned[0].path, planned[0].content)
    for name in ("b_left.py", "c_left.py", "a_left.py"):
        (tmp_path / name).write_text("")
    listing = pathlib.Path.glob
    monkeypatch.setattr(pathlib.Path, "glob", lambda self, pattern: iter(sorted(listing(self, pattern), reverse=True)))
    problems = codegen.stale_files(planned, tmp_path, owns_directory=True)
    assert problems == [
        f"{tmp_path / name}: no spec renders it; delete it" for name in ("a_left.py", "b_left.py", "c_left.py")
    ]


def test_a_module_left_by_a_spec_file_whose_name_holds_a_space_is_found(tmp_path):
    spec_path = tmp_path / "my backend.yaml"
    old = parse_spec({**VLLM_FIELDS, "name": "backend_v1"})
    new = parse_spec({**VLLM_FIELDS, "name": "backend_v2"})
    out = tmp_path / "out"
    codegen.write_if_changed(out / "backend_v1.py", codegen.render(old, codegen.display_name(spec_path, out)))
    planned = codegen.plan_outputs([(new, spec_path)], out, with_init=False)
    codegen.write_if_changed(planned[0].path, planned[0].content)
    assert codegen.header_source(planned[0].content) == "../my backend.yaml"
    (problem,) = codegen.stale_files(planned, out, owns_directory=False)
    assert problem.startswith(f"{out / 'backend_v1.py'}: generated from the spec file {spec_path}")
    assert problem.endswith("delete it")


def test_a_link_in_a_modules_place_is_replaced_even_when_its_target_holds_the_module(tmp_path):
    content = codegen.render(parse_spec(VLLM_FIELDS), "round10.yaml")
    target = tmp_path / "elsewhere.py"
    target.write_text(content, encoding="utf-8")
    module = tmp_path / "out" / "round10_spec.py"
    module.parent.mkdir()
    module.symlink_to(target)
    planned = codegen.plan_outputs([(parse_spec(VLLM_FIELDS), Path("round10.yaml"))], module.parent, with_init=False)
    assert codegen.stale_files(planned, module.parent, owns_directory=False) == [f"{module}: stale"]
    assert codegen.write_if_changed(module, content) is True
    assert not module.is_symlink() and module.read_text() == content and target.read_text() == content


def test_a_generated_module_is_readable_by_all_whatever_the_umask(tmp_path):
    previous = os.umask(0o077)
    try:
        assert codegen.write_if_changed(tmp_path / "new.py", "x = 1\n") is True
    finally:
        os.umask(previous)
    (tmp_path / "old.py").write_text("x = 1\n")
    (tmp_path / "old.py").chmod(0o600)
    assert codegen.write_if_changed(tmp_path / "old.py", "x = 2\n") is True
    assert [stat.S_IMODE((tmp_path / name).stat().st_mode) for name in ("new.py", "old.py")] == [0o644, 0o644]


# ---------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------
def write_spec(path: Path, **changes: object) -> Path:
    path.write_text(yaml.safe_dump({**VLLM_FIELDS, **changes}, sort_keys=False), encoding="utf-8")
    return path


def test_a_spec_file_without_an_extension_is_read_as_a_file(tmp_path, capsys, monkeypatch):
    from layoutgen.cli.common import resolve_spec

    write_spec(tmp_path / "myspec")  # a name a bundled spec could have, but none has
    monkeypatch.chdir(tmp_path)
    assert resolve_spec("myspec").name == "round10_spec"
    code, out, err = run_main(["show", "myspec", "--json"], capsys, monkeypatch)
    assert code == 0 and '"round10_spec"' in out, err


def test_check_that_finds_only_left_over_modules_says_to_delete_them(tmp_path, capsys, monkeypatch):
    spec_path = write_spec(tmp_path / "mine.yaml", name="mine_v1")
    out = tmp_path / "out"
    assert run_main(["build", "--no-verify", "--spec", str(spec_path), "--out", str(out)], capsys, monkeypatch)[0] == 0
    write_spec(spec_path, name="mine_v2")
    assert run_main(["build", "--no-verify", "--spec", str(spec_path), "--out", str(out)], capsys, monkeypatch)[0] == 0
    code, _, err = run_main(["build", "--check", "--spec", str(spec_path), "--out", str(out)], capsys, monkeypatch)
    assert code == 1 and f"mine_v1.py: generated from the spec file {spec_path}," in err, err
    assert "delete the files that a line above says to delete" in err and "run `" not in err, err


def test_check_names_the_rebuild_with_the_spec_path_quoted(tmp_path, capsys, monkeypatch):
    spec_path = write_spec(tmp_path / "my spec.yaml")
    out = tmp_path / "out"
    code, _, err = run_main(["build", "--check", "--spec", str(spec_path), "--out", str(out)], capsys, monkeypatch)
    assert code == 1 and "round10_spec.py: missing" in err, err
    assert f"run `layoutgen build --spec {shlex.quote(str(spec_path))} --out {shlex.quote(str(out))}`" in err, err


def test_one_spec_file_by_a_relative_and_an_absolute_path_is_built_once(tmp_path, capsys, monkeypatch):
    spec_path = write_spec(tmp_path / "mine.yaml")
    monkeypatch.chdir(tmp_path)
    args = ["build", "--no-verify", "--spec", "mine.yaml", "--spec", str(spec_path), "--out", "out"]
    code, out, err = run_main(args, capsys, monkeypatch)
    assert code == 0, err
    assert "1 written" in out and sorted(p.name for p in (tmp_path / "out").iterdir()) == ["round10_spec.py"]


def test_bundled_specs_built_into_a_directory_of_ones_own_do_not_own_it(tmp_path, capsys, monkeypatch):
    out = tmp_path / "mine"
    out.mkdir()
    every = bundled_specs()
    for path in bundled_spec_paths():
        codegen.write_if_changed(out / f"{path.stem}.py", codegen.render(every[path.stem], codegen.display_name(path)))
    (out / "helper.py").write_text("VALUE = 1\n")  # the user's own module beside them
    code, stdout, err = run_main(["build", "--check", "--out", str(out)], capsys, monkeypatch)
    assert code == 0, err
    assert f"{len(every)} generated file(s) up to date" in stdout
    assert sorted(p.name for p in out.iterdir()) == sorted([*(f"{name}.py" for name in every), "helper.py"])


# ---------------------------------------------------------------------------------------------
# show and diff
# ---------------------------------------------------------------------------------------------
def dcp_diff(changes_a: dict[str, object], changes_b: dict[str, object], **shape: int) -> Any:
    from layoutgen.dcp import FAMILY

    spec_a = parse_spec({**VLLM_FIELDS, "name": "layout_a", **changes_a})
    spec_b = parse_spec({**VLLM_FIELDS, "name": "layout_b", **changes_b})
    return show.diff_layouts(spec_a, spec_b, {**FAMILY.show_shape, **shape}, "bfloat16")


def test_a_diff_with_kinds_not_compared_is_never_identical():
    # Same buffers and every payload element in place, but the stats words hold an LSE in A and (max, sum) in B.
    lse = {"stats": {"placement": "separate", "axes": ["peer", "batch", "head", "slot"], "slots": 2}}
    max_sum = {"stats": {"placement": "separate", "axes": ["peer", "batch", "head", "slot"], "form": "max_sum"}}
    found = dcp_diff(lse, max_sum)
    assert found.buffers_a == found.buffers_b and all(run.same_place() for run in found.runs)
    assert found.not_compared == "only layout_a holds lse; only layout_b holds max, sum"
    assert not found.identical and '"identical": false' in show.diff_to_json(found)
    assert "place every byte identically" not in show.diff_summary(found)


def test_an_element_of_another_width_is_not_in_the_same_place():
    # bf16 against float32 payload: only the first element of each layout starts at the same byte, yet it is two
    # bytes in one and four in the other; the LSE words are the elements in place.
    found = dcp_diff({}, {"payload": {"axes": ["peer", "batch", "head", "dim"], "dtype": "float32"}})
    assert found.counts() == {"payload": 256, "lse": 16} and found.same_place == 16
    assert "16 of 272 logical elements land at the same buffer and byte offsets" in show.diff_summary(found)


def test_a_kind_of_other_extents_is_named_as_not_compared():
    def fp8(block: int) -> dict[str, object]:
        return {"payload": {"axes": ["peer", "batch", "head", "dim"], "dtype": "float8_e4m3fn", "scale_block": block}}

    found = dcp_diff(fp8(16), fp8(32), D=64)
    assert found.not_compared == (
        "scale is peer 4 x batch 2 x head 2 x block 4 in layout_a, peer 4 x batch 2 x head 2 x block 2 in layout_b"
    ), found.not_compared
    assert "scale" not in found.compared and found.not_compared in show.diff_summary(found)


def test_diff_of_two_families_says_so_before_reading_the_shape(capsys, monkeypatch):
    # --shape S=8 is an extent of the Ulysses family only: the family mismatch is the problem, not the extent.
    code, _, err = run_main(["diff", "vllm_a2a", "deepspeed_ulysses", "--shape", "S=8"], capsys, monkeypatch)
    assert code == 2 and "only layouts of one family hold the same logical elements" in err, err
    assert "no extent" not in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dtype", "int8"], "--dtype int8: the dcp family takes bfloat16, float16, float32"),
        (["--shape", "N=0"], "--shape N: extents are positive integers; got 'N=0'"),
        (["--shape", "N=2,4"], "--shape N: a drawing takes one value, got [2, 4]"),
        (["--shape", "N=2", "--shape", "N=4"], "--shape N: a drawing takes one value, got [2, 4]"),
    ],
    ids=["dtype", "zero", "two-values", "twice"],
)
def test_show_refuses_what_it_cannot_draw_naming_the_option(args, message, capsys, monkeypatch):
    code, out, err = run_main(["show", "vllm_a2a", *args], capsys, monkeypatch)
    assert code == 2 and message in err and out == "", err
