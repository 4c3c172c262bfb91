"""The Ulysses spec schema: bundled specs load, every rule is a SpecError naming the field and the fix."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from ulysses_cases import BUNDLED

from layoutgen.family import get_family
from layoutgen.spec import SpecError, bundled_specs, load_spec, parse_spec, parse_spec_text
from layoutgen.ulysses.spec import HeadCount, Transport, UlyssesSpec

GQA: dict[str, Any] = {
    "family": "ulysses",
    "name": "my_gqa_layout",
    "summary": "a test spec",
    "transport": "all_to_all_single",
    "local": ["seq", "head", "dim"],
    "attention": ["head", "seq", "dim"],
    "to_attention": {
        "tensors": [{"name": "q", "heads": "H"}, {"name": "k", "heads": "H_kv"}, {"name": "v", "heads": "H_kv"}],
        "wire": ["peer", "tensor", "seq", "head", "dim"],
    },
    "from_attention": {"tensors": [{"name": "out", "heads": "H"}], "wire": ["peer", "seq", "head", "dim"]},
}


def with_changes(**changes: Any) -> dict[str, Any]:
    """GQA with dotted fields replaced (`to_attention.wire=[...]`) or removed (value None)."""
    data = copy.deepcopy(GQA)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        target = data
        for key in parents:
            target = target[key]
        if value is None:
            target.pop(leaf)
        else:
            target[leaf] = value
    return data


def problems(data: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as raised:
        parse_spec(data, source="my.yaml")
    return raised.value.problems


def test_the_bundled_specs_are_ulysses_specs_named_after_their_files() -> None:
    specs = bundled_specs()
    family = get_family("ulysses")
    assert sorted(path.stem for path in family.spec_dir.glob("*.yaml")) == sorted(BUNDLED)
    for name in BUNDLED:
        spec = specs[name]
        assert isinstance(spec, UlyssesSpec) and spec.family == "ulysses"
        assert spec.transport is Transport.ALL_TO_ALL_SINGLE
    gqa = specs["ulysses_qkv_gqa"]
    assert [t.heads for t in gqa.to_attention.tensors] == [HeadCount.H, HeadCount.H_KV, HeadCount.H_KV]
    assert gqa.to_attention.shared and not gqa.from_attention.shared


def test_a_valid_spec_round_trips_and_its_summary_does_not_change_its_hash() -> None:
    spec = parse_spec(GQA)
    again = parse_spec({**spec.model_dump(mode="json"), "summary": "another text"})
    assert again == spec.model_copy(update={"summary": "another text"})
    assert again.layout_hash() == spec.layout_hash()
    reordered = with_changes(to_attention__tensors=list(reversed(GQA["to_attention"]["tensors"])))
    assert parse_spec(reordered).layout_hash() != spec.layout_hash()  # the tensors' order is the wire's


def test_yaml_text_with_flow_lists_parses(tmp_path: Path) -> None:
    text = (
        "family: ulysses\nname: from_text\nsummary: s\ntransport: external\nlocal: [batch, seq, head, dim]\n"
        "attention: [batch, head, seq, dim]\n"
        "to_attention: {tensors: [{name: x, heads: H}], wire: [batch, peer, seq, head, dim]}\n"
        "from_attention: {tensors: [{name: y, heads: H}], wire: [peer, head, seq, batch, dim]}\n"
    )
    spec = parse_spec_text(text, "from_text.yaml")
    assert spec.has_batch and spec.to_attention.wire[1] == "peer"
    path = tmp_path / "from_text.yaml"
    path.write_text(text)
    assert load_spec(path) == spec


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"local": ["seq", "head"]}, "local", "missing ['dim']"),
        ({"attention": ["seq", "head", "dim", "dim"]}, "attention", "repeated ['dim']"),
        ({"local": ["seq", "heads", "dim"]}, "local", "unknown ['heads']"),
        ({"local": ["seq", "head", "dim", "peer"]}, "local", "unknown ['peer']"),
        ({"to_attention__wire": ["peer", "seq", "dim"]}, "to_attention.wire", "missing ['head']"),
        ({"to_attention__wire": ["tensor", "peer", "seq", "head", "dim"]}, "to_attention.wire", "`peer` outermost"),
        ({"from_attention__wire": ["seq", "peer", "head", "dim"]}, "from_attention.wire", "use transport: external"),
        ({"local": ["batch", "seq", "head", "dim"]}, "attention", "every layout must agree; add `batch`"),
        ({"attention": ["batch", "seq", "head", "dim"]}, "attention", "remove `batch`"),
        (
            {"to_attention__wire": ["peer", "head", "tensor", "seq", "dim"]},
            "to_attention.wire",
            "`head` must come after `tensor`",
        ),
        ({"to_attention__tensors": []}, "to_attention.tensors", "between 1 and 8"),
        (
            {"to_attention__tensors": [{"name": "q", "heads": "H"}, {"name": "q", "heads": "H_kv"}]},
            "to_attention.tensors",
            "['q'] appear more than once",
        ),
        ({"to_attention__tensors": [{"name": "Q", "heads": "H"}]}, "to_attention.tensors.0.name", "lower-case letter"),
        (
            {"to_attention__tensors": [{"name": "k_v", "heads": "H"}]},
            "to_attention.tensors.0.name",
            "lower-case letters",
        ),
        ({"to_attention__tensors": [{"name": "bufs", "heads": "H"}]}, "to_attention.tensors.0.name", "generated code"),
        (
            {"from_attention__tensors": [{"name": "blocks", "heads": "H"}]},
            "from_attention.tensors.0.name",
            "generated code",
        ),
        ({"to_attention__tensors": [{"name": "lambda", "heads": "H"}]}, "to_attention.tensors.0.name", "keyword"),
        ({"to_attention__tensors": [{"name": "q", "heads": "H_q"}]}, "to_attention.tensors.0.heads", "'H' or 'H_kv'"),
        ({"to_attention__tensors": [{"name": "q"}]}, "to_attention.tensors.0.heads", "required; add it"),
        ({"transport": "nccl"}, "transport", "'all_to_all_single' or 'external'"),
        ({"from_attention": None}, "from_attention", "required; add it"),
        ({"wire": ["peer"]}, "wire", "unknown key; remove it"),
        ({"to_attention__buffers": "shared"}, "to_attention.buffers", "unknown key"),
        ({"local": "seq,head,dim"}, "local", "must be a list ([a, b, c], or one `- item` per line); got a string"),
        ({"to_attention__tensors": ["q", "k"]}, "to_attention.tensors.0", "must be a mapping of keys"),
        ({"from_attention": [1, 2]}, "from_attention", "must be a mapping of keys (see docs/design.md"),
    ],
)
def test_every_rule_names_its_field_and_the_fix(changes: dict[str, Any], field: str, message: str) -> None:
    found = problems(with_changes(**changes))
    assert any(got == field and message in text for got, text in found), found


def test_no_tensor_name_can_shadow_a_name_the_generated_code_uses() -> None:
    # Every lower-case name a function with tensor parameters binds or reads beside them (the launchers'
    # `blocks`, the public functions' `result`, ...) must be reserved: a tensor named like it would be
    # overwritten before use.  Read from every bundled spec's generated module.
    import ast
    import re

    from layoutgen.loader import generated_dir
    from layoutgen.ulysses.spec import RESERVED_TENSOR_NAMES, TENSOR_NAME_PATTERN

    used: set[str] = set()
    for name in BUNDLED:
        spec = bundled_specs()[name]
        tensors = {t.name for d in ("to_attention", "from_attention") for t in spec.direction(d).tensors}
        tree = ast.parse((generated_dir() / f"{name}.py").read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            arguments = {a.arg for a in (*function.args.args, *function.args.kwonlyargs)}
            if arguments & tensors:
                names = {node.id for node in ast.walk(function) if isinstance(node, ast.Name)} | arguments
                used |= {n for n in names - tensors if re.fullmatch(TENSOR_NAME_PATTERN, n)}
    assert {"blocks", "bufs", "config"} <= used, "the scan found none of the launchers' names"
    assert used <= RESERVED_TENSOR_NAMES, f"not reserved: {sorted(used - RESERVED_TENSOR_NAMES)}"


def test_a_missing_family_is_read_as_dcp_and_refused_there() -> None:
    data = with_changes(family=None)
    assert any(field == "payload" for field, _ in problems(data))


def test_tensor_axes_anywhere_inside_a_shared_wire_are_valid() -> None:
    for wire in (["peer", "seq", "tensor", "head", "dim"], ["peer", "seq", "head", "tensor", "dim"],
                 ["peer", "seq", "head", "dim", "tensor"]):  # fmt: skip
        same_heads = [{"name": "q", "heads": "H"}, {"name": "k", "heads": "H"}]
        data = with_changes(to_attention={"tensors": same_heads, "wire": wire})
        assert parse_spec(data).to_attention.shared
    mixed = with_changes(to_attention__wire=["peer", "seq", "tensor", "head", "dim"])
    assert parse_spec(mixed).to_attention.wire.index("tensor") == 2
