"""Spec validation: one case per rule of docs/design.md §3, each naming the field (and the file)."""

from __future__ import annotations

import copy

import pytest
import torch
import yaml
from conftest import NPU_LIKE_SPEC_FIELDS, REPO_ROOT, generated_module, make_spec

from layoutgen.dcp.layout import LayoutBuffers
from layoutgen.dcp.spec import DcpSpec
from layoutgen.spec import (
    MAX_SPEC_BYTES,
    SpecError,
    bundled_spec_paths,
    bundled_specs,
    load_spec,
    parse_spec,
    parse_spec_text,
)

ROW_TAIL = {
    "name": "my_backend",
    "summary": "a valid row-tail spec",
    "transport": "all_to_all_single",
    "payload": {"axes": ["peer", "batch", "head", "dim"], "dtype": "input"},
    "stats": {"placement": "row_tail"},
    "align_bytes": 8,
}
SEPARATE = {
    "name": "my_backend",
    "summary": "a valid separate-stats spec",
    "transport": "external",
    "payload": {"axes": ["batch", "head", "peer", "dim"], "dtype": "input"},
    "stats": {"placement": "separate", "axes": ["batch", "head", "peer", "slot"], "slots": 2, "slot": 1},
}


def _edit(base: dict, path: str, value: object) -> dict:
    """A copy of `base` with the dotted `path` set to `value` (or removed when value is _REMOVE)."""
    data = copy.deepcopy(base)
    *parents, leaf = path.split(".")
    target = data
    for key in parents:
        target = target[key]
    if value is _REMOVE:
        del target[leaf]
    else:
        target[leaf] = value
    return data


_REMOVE = object()

# (id, base, dotted path, new value, field the error must name, words the message must contain)
RULES = [
    ("name-uppercase", ROW_TAIL, "name", "MyBackend", "name", "[a-z]"),
    ("name-leading-digit", ROW_TAIL, "name", "2fast", "name", "[a-z]"),
    ("name-dash", ROW_TAIL, "name", "my-backend", "name", "[a-z]"),
    ("name-too-long", ROW_TAIL, "name", "a" * 65, "name", "[a-z]"),
    ("name-keyword", ROW_TAIL, "name", "class", "name", "keyword"),
    ("name-soft-keyword", ROW_TAIL, "name", "match", "name", "keyword"),
    ("name-stdlib-module", ROW_TAIL, "name", "os", "name", "module"),
    ("name-torch", ROW_TAIL, "name", "torch", "name", "module"),
    ("name-triton", ROW_TAIL, "name", "triton", "name", "module"),
    ("name-layoutgen", ROW_TAIL, "name", "layoutgen", "name", "module"),
    ("name-generated", ROW_TAIL, "name", "generated", "name", "module"),
    ("missing-summary", ROW_TAIL, "summary", _REMOVE, "summary", "required"),
    ("missing-transport", ROW_TAIL, "transport", _REMOVE, "transport", "required"),
    ("summary-too-long", ROW_TAIL, "summary", "x" * 2001, "summary", "2000"),
    ("unknown-transport", ROW_TAIL, "transport", "nccl", "transport", "all_to_all_single"),
    ("unknown-dtype", ROW_TAIL, "payload.dtype", "bf16", "payload.dtype", "float32"),
    ("unknown-placement", ROW_TAIL, "stats.placement", "inline", "stats.placement", "separate"),
    ("unknown-top-level-key", ROW_TAIL, "colour", "blue", "colour", "unknown key"),
    ("unknown-payload-key", ROW_TAIL, "payload.order", "C", "payload.order", "unknown key"),
    ("unknown-stats-key", SEPARATE, "stats.slotz", 2, "stats.slotz", "unknown key"),
    ("payload-axes-missing-dim", ROW_TAIL, "payload.axes", ["peer", "batch", "head"], "payload.axes", "permutation"),
    ("payload-axes-repeated", ROW_TAIL, "payload.axes", ["peer", "peer", "head", "dim"], "payload.axes", "permutation"),
    (
        "payload-axes-unknown",
        ROW_TAIL,
        "payload.axes",
        ["peer", "batch", "heads", "dim"],
        "payload.axes",
        "permutation",
    ),
    ("payload-axes-slot", SEPARATE, "payload.axes", ["batch", "head", "peer", "slot"], "payload.axes", "permutation"),
    ("stats-axes-dim", SEPARATE, "stats.axes", ["batch", "head", "peer", "dim"], "stats.axes", "permutation"),
    ("stats-axes-short", SEPARATE, "stats.axes", ["batch", "head", "peer"], "stats.axes", "permutation"),
    (
        "row-tail-input-dim-not-innermost",
        ROW_TAIL,
        "payload.axes",
        ["peer", "batch", "dim", "head"],
        "payload.axes",
        "innermost",
    ),
    (
        "a2a-payload-peer-not-outermost",
        ROW_TAIL,
        "payload.axes",
        ["batch", "peer", "head", "dim"],
        "payload.axes",
        "outermost",
    ),
    (
        "a2a-stats-peer-not-outermost",
        _edit(_edit(SEPARATE, "transport", "all_to_all_single"), "payload.axes", ["peer", "batch", "head", "dim"]),
        "stats.axes",
        ["batch", "peer", "head", "slot"],
        "stats.axes",
        "outermost",
    ),
    ("align-bytes-with-separate", SEPARATE, "align_bytes", 4, "align_bytes", "row_tail"),
    ("align-bytes-not-power-of-two", ROW_TAIL, "align_bytes", 12, "align_bytes", "power of two"),
    ("align-bytes-too-small", ROW_TAIL, "align_bytes", 2, "align_bytes", "power of two"),
    ("align-bytes-too-large", ROW_TAIL, "align_bytes", 512, "align_bytes", "power of two"),
    ("separate-without-axes", SEPARATE, "stats.axes", _REMOVE, "stats.axes", "needs"),
    ("slot-equals-slots", SEPARATE, "stats.slot", 2, "stats.slot", "[0, 2)"),
    ("slot-negative", SEPARATE, "stats.slot", -1, "stats.slot", "[0, 2)"),
    ("slots-zero", SEPARATE, "stats.slots", 0, "stats.slots", "between 1 and 64"),
    ("slots-too-many", SEPARATE, "stats.slots", 65, "stats.slots", "between 1 and 64"),
    ("row-tail-with-axes", ROW_TAIL, "stats.axes", ["peer", "batch", "head", "slot"], "stats.axes", "separate"),
    ("row-tail-with-slots", ROW_TAIL, "stats.slots", 2, "stats.slots", "separate"),
    ("row-tail-with-slot", ROW_TAIL, "stats.slot", 0, "stats.slot", "separate"),
    # Integers are integers: YAML's `yes`, quoted numbers and floats are refused, not coerced.
    ("slot-yaml-bool", SEPARATE, "stats.slot", True, "stats.slot", "valid integer"),
    ("slot-float", SEPARATE, "stats.slot", 1.0, "stats.slot", "valid integer"),
    ("slots-string", SEPARATE, "stats.slots", "2", "stats.slots", "valid integer"),
    ("align-bytes-string", ROW_TAIL, "align_bytes", "16", "align_bytes", "valid integer"),
]


def _fields(error: SpecError) -> list[str]:
    return [field for field, _ in error.problems]


@pytest.mark.parametrize(("base", "path", "value", "field", "words"), [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_each_rule_names_the_field(base, path, value, field, words):
    with pytest.raises(SpecError) as caught:
        parse_spec(_edit(base, path, value), source="inline spec")
    assert field in _fields(caught.value), str(caught.value)
    message = str(caught.value)
    assert message.startswith("inline spec: invalid layout spec")
    assert f"  {field}: " in message and words in message, message
    assert len(message.splitlines()) <= 12, "one screen"


@pytest.mark.parametrize(("base", "path", "value", "field", "words"), [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_file_errors_name_the_file_and_the_field(base, path, value, field, words, tmp_path):
    spec_file = tmp_path / "my_backend.yaml"
    spec_file.write_text(yaml.safe_dump(_edit(base, path, value), sort_keys=False), encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        load_spec(spec_file)
    message = str(caught.value)
    assert message.splitlines()[0] == f"{spec_file}: invalid layout spec"
    assert f"  {field}: " in message and words in message


# Problems the YAML text itself has, before any field is looked at.
YAML_TEXTS = [
    ("alias", "name: &n my_backend\nsummary: *n\n", "(yaml)", "aliases are not allowed"),
    ("merge-key-alias", "base: &b {dtype: input}\npayload:\n  <<: *b\n", "(yaml)", "aliases are not allowed"),
    ("duplicate-key", "name: a\nname: b\n", "(yaml)", "duplicate key 'name'"),
    ("a-list", "- name: a\n- name: b\n", "(top level)", "mapping"),
    ("a-scalar", "just text\n", "(top level)", "mapping"),
    ("empty-file", "", "(top level)", "mapping"),
    ("syntax-error", "name: [unclosed\n", "(yaml)", ""),
    ("python-tag", "name: !!python/object/apply:os.system ['true']\n", "(yaml)", ""),
]


@pytest.mark.parametrize(("text", "field", "words"), [t[1:] for t in YAML_TEXTS], ids=[t[0] for t in YAML_TEXTS])
def test_yaml_level_problems(text, field, words, tmp_path):
    spec_file = tmp_path / "bad.yaml"
    spec_file.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        load_spec(spec_file)
    assert _fields(caught.value) == [field]
    assert str(spec_file) in str(caught.value) and words in str(caught.value)


def test_file_problems(tmp_path):
    with pytest.raises(SpecError, match=r"no such file"):
        load_spec(tmp_path / "missing.yaml")
    with pytest.raises(SpecError, match=r"is a directory"):
        load_spec(tmp_path)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(SpecError, match=r"binary.yaml: cannot read the spec file\n  \(file\): cannot be read"):
        load_spec(binary)
    with pytest.raises(SpecError, match=r"larger than"):
        parse_spec_text("#" * (MAX_SPEC_BYTES + 1))


def test_several_problems_are_reported_together():
    data = _edit(_edit(ROW_TAIL, "name", "Bad"), "payload.dtype", "bf16")
    with pytest.raises(SpecError) as caught:
        parse_spec(data)
    assert {"name", "payload.dtype"} <= set(_fields(caught.value))


def test_row_tail_needs_d_times_element_size_divisible_by_4_at_alloc():
    spec = make_spec(**ROW_TAIL)
    with pytest.raises(ValueError, match=r"D=7 .*14 bytes") as caught:
        LayoutBuffers.allocate(spec, 2, 1, 2, 7, torch.bfloat16)
    assert "row tail" in str(caught.value) and spec.name in str(caught.value)
    LayoutBuffers.allocate(spec, 2, 1, 2, 7, torch.float32)  # 28 bytes: fine
    npu_like = make_spec(**NPU_LIKE_SPEC_FIELDS)
    LayoutBuffers.allocate(npu_like, 2, 1, 2, 7, torch.bfloat16)  # float32 on the wire: any D
    with pytest.raises(ValueError, match=r"D=5 .*10 bytes"):
        generated_module("pynccl_a2a").alloc(2, 1, 2, 5, torch.float16)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"H": 5}, ValueError, "divisible by N"),
        ({"N": 0}, ValueError, "N must be >= 1"),
        ({"B_max": 2.0}, TypeError, "B_max must be an int"),
        ({"dtype": torch.int8}, TypeError, "dtype must be one of"),
    ],
)
def test_alloc_rejects_bad_shapes_naming_the_argument(kwargs, error, words):
    shape = {"N": 2, "B_max": 2, "H": 4, "D": 8, "dtype": torch.bfloat16} | kwargs
    with pytest.raises(error, match=words):
        LayoutBuffers.allocate(make_spec(**SEPARATE), **shape)


# --- valid specs ------------------------------------------------------------------------------
def test_valid_specs_fill_defaults():
    row_tail = make_spec(**_edit(ROW_TAIL, "align_bytes", _REMOVE))
    assert row_tail.row_tail and row_tail.align_bytes == 4
    separate = make_spec(**_edit(_edit(SEPARATE, "stats.slots", _REMOVE), "stats.slot", _REMOVE))
    assert not separate.row_tail and (separate.stats.slots, separate.stats.slot) == (1, 0)
    float32_tail = make_spec(
        **_edit(ROW_TAIL, "payload", {"axes": ["peer", "dim", "head", "batch"], "dtype": "float32"})
    )
    assert float32_tail.payload.axes == ("peer", "dim", "head", "batch")


def test_bundled_specs_are_the_documented_ones():
    specs = bundled_specs()
    assert {"flashinfer_mnnvl", "pynccl_a2a", "pynccl_a2a_aligned", "vllm_a2a"} <= set(specs)
    assert [p.stem for p in bundled_spec_paths()] == sorted(specs)
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    undocumented = [name for name in specs if f"`{name}`" not in readme]
    assert not undocumented, f"README's spec tables lack {undocumented}"
    assert specs["pynccl_a2a"].payload.axes == ("peer", "batch", "head", "dim") and specs["pynccl_a2a"].row_tail
    assert specs["pynccl_a2a_aligned"].align_bytes == 32
    mnnvl = specs["flashinfer_mnnvl"]
    assert mnnvl.payload.axes == ("batch", "head", "peer", "dim") and mnnvl.transport.value == "external"
    assert (mnnvl.stats.axes, mnnvl.stats.slots, mnnvl.stats.slot) == (("batch", "head", "peer", "slot"), 2, 0)
    vllm = specs["vllm_a2a"]
    assert vllm.stats.axes == ("peer", "batch", "head", "slot") and vllm.stats.slots == 1


def test_layout_hash_ignores_the_summary_only():
    base = make_spec(**SEPARATE)
    assert make_spec(**_edit(SEPARATE, "summary", "other words")).layout_hash() == base.layout_hash()
    for path, value in [("stats.slot", 0), ("name", "other"), ("transport", "all_to_all_single")]:
        changed = _edit(SEPARATE, path, value)
        if path == "transport":
            changed = _edit(
                _edit(changed, "payload.axes", ["peer", "batch", "head", "dim"]),
                "stats.axes",
                ["peer", "batch", "head", "slot"],
            )
        assert make_spec(**changed).layout_hash() != base.layout_hash(), path


def test_specs_are_frozen():
    spec = make_spec(**ROW_TAIL)
    with pytest.raises(Exception, match="frozen"):
        spec.name = "other"  # type: ignore[misc]


def test_bundled_spec_name_must_equal_its_file_name(tmp_path, monkeypatch):
    from layoutgen import spec as spec_module

    (tmp_path / "one_name.yaml").write_text(yaml.safe_dump(_edit(ROW_TAIL, "name", "another_name")), encoding="utf-8")
    monkeypatch.setattr(spec_module, "bundled_spec_paths", lambda: [tmp_path / "one_name.yaml"])
    with pytest.raises(SpecError, match="must equal the file name 'one_name'"):
        spec_module.bundled_specs()


def test_parse_spec_round_trips_through_the_model():
    spec = make_spec(**SEPARATE)
    again = DcpSpec.model_validate(spec.model_dump())
    assert again == spec and again.layout_hash() == spec.layout_hash()


def test_a_spec_without_its_family_key_is_told_which_family_its_keys_belong_to(tmp_path):
    from layoutgen.family import get_family

    text = (get_family("ulysses").spec_dir / "deepspeed_ulysses.yaml").read_text()
    path = tmp_path / "forgot.yaml"
    path.write_text(text.replace("family: ulysses\n", ""))
    with pytest.raises(SpecError, match="family: missing, so `dcp` was assumed; these keys are the ulysses family's"):
        load_spec(path)
