"""The contract-v2 spec fields (the brief's DESIGN.md §8.3: `stats.form`, `max_slot`, `sum_slot`), and any valid spec with them.

* every new rule is a validator naming its field;
* a spec that does not use the new fields keeps its layout hash (and so its generated module and tuning
  entries), and `form: lse` written out is the same layout as leaving it out;
* the bundled TensorRT-LLM helix specs are the three layouts of its test, in DCP axes (cp = peer, T = batch);
* hypothesis draws random valid specs with the new fields, renders each, and checks pack (byte-exact, with
  an empty mask, [R, T] rows, both stats inputs) and pack -> exchange -> combine against the float64
  reference.  A few examples by default, more under `-m slow`.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import make_spec, render_module, requires_interpreter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_dcp_v2_pack import check_case, fill, random_max_sum

from layoutgen import codegen
from layoutgen.dcp import reference
from layoutgen.dcp.config import CombineConfig
from layoutgen.dcp.layout import LayoutBuffers, Shape, buffer_shapes, row_length, wire_dtype
from layoutgen.dcp.spec import PAYLOAD_AXES, STATS_AXES
from layoutgen.dcp.tolerances import combine_error, lse_error
from layoutgen.spec import SpecError, bundled_specs, parse_spec

SEPARATE_MAX_SUM = {
    "name": "helix_like",
    "summary": "separate (max, sum) stats",
    "transport": "external",
    "payload": {"axes": ["batch", "peer", "head", "dim"], "dtype": "input"},
    "stats": {"placement": "separate", "form": "max_sum", "axes": ["batch", "peer", "head", "slot"]},
}
ROW_TAIL_MAX_SUM = {
    "name": "tail_pair",
    "summary": "(max, sum) in the row tail",
    "transport": "all_to_all_single",
    "payload": {"axes": ["peer", "batch", "head", "dim"], "dtype": "input"},
    "stats": {"placement": "row_tail", "form": "max_sum"},
}


def _with_stats(base: dict[str, Any], **stats: Any) -> dict[str, Any]:
    merged = {**base["stats"], **stats}
    return {**base, "stats": {key: value for key, value in merged.items() if value is not None}}


# (id, spec data, field the error must name, words the message must contain)
V2_RULES = [
    ("form-unknown", _with_stats(SEPARATE_MAX_SUM, form="logsumexp"), "stats.form", "'lse' or 'max_sum'"),
    ("slot-with-max-sum", _with_stats(SEPARATE_MAX_SUM, slot=0), "stats.slot", "max_slot"),
    ("one-slot-for-two-words", _with_stats(SEPARATE_MAX_SUM, slots=1), "stats.slots", "two words"),
    ("max-slot-out-of-range", _with_stats(SEPARATE_MAX_SUM, slots=2, max_slot=2), "stats.max_slot", "[0, 2)"),
    ("sum-slot-negative", _with_stats(SEPARATE_MAX_SUM, sum_slot=-1), "stats.sum_slot", "[0, 2)"),
    ("same-slot-twice", _with_stats(SEPARATE_MAX_SUM, slots=3, max_slot=1, sum_slot=1), "stats.sum_slot", "differ"),
    ("max-slot-with-lse", _with_stats(SEPARATE_MAX_SUM, form="lse", max_slot=0), "stats.max_slot", "form: max_sum"),
    ("sum-slot-with-lse", _with_stats(SEPARATE_MAX_SUM, form=None, sum_slot=1), "stats.sum_slot", "form: max_sum"),
    ("max-slot-in-row-tail", _with_stats(ROW_TAIL_MAX_SUM, max_slot=0), "stats.max_slot", "separate"),
    ("max-slot-a-string", _with_stats(SEPARATE_MAX_SUM, max_slot="0"), "stats.max_slot", "valid integer"),
    ("max-slot-a-bool", _with_stats(SEPARATE_MAX_SUM, max_slot=True), "stats.max_slot", "valid integer"),
]


@pytest.mark.parametrize(("data", "field", "words"), [r[1:] for r in V2_RULES], ids=[r[0] for r in V2_RULES])
def test_each_v2_rule_names_the_field(data: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(data, source="inline spec")
    message = str(caught.value)
    assert field in [f for f, _ in caught.value.problems], message
    assert f"  {field}: " in message and words in message, message


def test_max_sum_defaults() -> None:
    separate = make_spec(**SEPARATE_MAX_SUM)
    assert separate.max_sum and separate.stats.words == 2
    assert (separate.stats.slots, separate.stats.max_slot, separate.stats.sum_slot, separate.stats.slot) == (
        2,
        0,
        1,
        None,
    )
    tail = make_spec(**ROW_TAIL_MAX_SUM)
    assert tail.max_sum and tail.align_bytes == 4
    # bf16 D = 10: 20 bytes of payload, then the max's 4 bytes and the sum's 4 bytes.
    assert row_length(tail, 10, 2) == 14
    shapes = buffer_shapes(tail, Shape(2, 3, 4, 10, torch.bfloat16))
    assert shapes["payload"][1] == (2, 3, 2, 14)
    float32_tail = make_spec(
        **{**ROW_TAIL_MAX_SUM, "payload": {"axes": ["peer", "dim", "head", "batch"], "dtype": "float32"}}
    )
    assert row_length(float32_tail, 10, 4) == 12  # elements D (max) and D + 1 (sum)


def test_specs_without_the_new_fields_keep_their_layout_hash() -> None:
    # The hashes before contract v2 (the generated modules' SPEC_HASH and every tuning entry record them).
    before = {
        "pynccl_a2a": "8a63ca2cc9e3d62f661c10abba83f7197115755e4650b32f64c8fd0ef216374e",
        "vllm_a2a": "26cd21f2faaee7a6c4fdacc8191ddb61c31c109e5ab0c7f4d32c7bcf231454ae",
    }
    specs = bundled_specs()
    for name, digest in before.items():
        assert specs[name].layout_hash() == digest
        explicit = _with_stats(specs[name].model_dump(mode="json"), form="lse")
        assert make_spec(**explicit).layout_hash() == digest, "form: lse is the default, the same layout"
    helix = make_spec(**SEPARATE_MAX_SUM)
    assert helix.layout_hash() != make_spec(**_with_stats(SEPARATE_MAX_SUM, max_slot=1, sum_slot=0)).layout_hash()
    lse_twin = make_spec(**_with_stats(SEPARATE_MAX_SUM, form=None, slots=2))
    assert helix.layout_hash() != lse_twin.layout_hash()
    assert codegen.render_kernels(helix) != codegen.render_kernels(lse_twin)


def test_the_bundled_helix_specs_are_tensorrt_llm_s_layouts() -> None:
    """cp_dim 0: [cp, T, H, D] + [cp, T, H, 2]; native v1: [T, H, cp, D] + [T, H, cp, 2]; native v2:
    [T, cp, H, D] + [T, cp, H, 2] (cp = peer, T = batch, H = heads per peer); word 0 the max, 1 the sum."""
    specs = bundled_specs()
    expected = {
        "trtllm_helix_nccl": (("peer", "batch", "head", "dim"), "all_to_all_single"),
        "trtllm_helix_native_v1": (("batch", "head", "peer", "dim"), "external"),
        "trtllm_helix_native_v2": (("batch", "peer", "head", "dim"), "external"),
    }
    for name, (axes, transport) in expected.items():
        spec = specs[name]
        assert spec.payload.axes == axes and spec.transport.value == transport
        assert spec.stats.axes == (*axes[:3], "slot") and spec.max_sum
        assert (spec.stats.slots, spec.stats.max_slot, spec.stats.sum_slot) == (2, 0, 1)
        bufs = LayoutBuffers.allocate(spec, 4, 8, 4 * 2, 64, torch.float16, "meta")
        logical = {"peer": 4, "batch": 8, "head": 2, "dim": 64}
        assert tuple(bufs.tensors["payload"].shape) == tuple(logical[a] for a in axes)
        assert tuple(bufs.tensors["stats"].shape) == (*(logical[a] for a in axes[:3]), 2)


# ---------------------------------------------------------------------------------------------
# Any valid spec with the new fields
# ---------------------------------------------------------------------------------------------
@st.composite
def v2_spec_data(draw: Any) -> dict[str, Any]:
    """A random valid spec dict that uses the contract-v2 fields (or an lse one, for the masked pack)."""
    payload_axes = draw(st.permutations(PAYLOAD_AXES))
    dtype = draw(st.sampled_from(["input", "float32"]))
    transport = draw(st.sampled_from(["all_to_all_single", "external"]))
    if transport == "all_to_all_single":
        payload_axes = ["peer", *[a for a in payload_axes if a != "peer"]]
    form = draw(st.sampled_from(["max_sum", "max_sum", "lse"]))
    row_tail = draw(st.booleans()) and (dtype == "float32" or payload_axes[-1] == "dim")
    data: dict[str, Any] = {
        "name": "drawn",
        "summary": "drawn by hypothesis",
        "transport": transport,
        "payload": {"axes": list(payload_axes), "dtype": dtype},
    }
    if row_tail:
        data["stats"] = {"placement": "row_tail", "form": form}
        align = draw(st.sampled_from([None, 4, 8, 16, 32]))
        if align is not None:
            data["align_bytes"] = align
        return data
    stats_axes = draw(st.permutations(STATS_AXES))
    if transport == "all_to_all_single":
        stats_axes = ["peer", *[a for a in stats_axes if a != "peer"]]
    data["stats"] = {"placement": "separate", "form": form, "axes": list(stats_axes), **draw_slots(draw, form, 4)}
    return data


def draw_slots(draw: Any, form: str | None, most: int) -> dict[str, int]:
    """A separate stats buffer's slot fields: up to `most` slots for (max, sum), one fewer for an LSE."""
    if form == "max_sum":
        slots = draw(st.integers(2, most))
        max_slot, sum_slot = draw(st.permutations(range(slots)))[:2]
        return {"slots": slots, "max_slot": max_slot, "sum_slot": sum_slot}
    slots = draw(st.integers(1, most - 1))
    return {"slots": slots, "slot": draw(st.integers(0, slots - 1))}


@st.composite
def v2_problems(draw: Any) -> dict[str, Any]:
    rows = draw(st.sampled_from([(1, 0), (3, 0), (2, 2), (1, 3)]))
    return {
        "spec": draw(v2_spec_data()),
        "case": {
            "dtype": draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32])),
            "N": draw(st.integers(1, 3)),
            "input": draw(st.sampled_from(["lse", "max_sum"])),
            # One request cannot have some requests empty and others not.
            "mask": draw(st.sampled_from(["none", "all"] if rows[0] == 1 else ["none", "some", "all"])),
            "rows": rows,
            "h": draw(st.integers(1, 3)),
            "D": draw(st.sampled_from([4, 7, 12])),
            "strides": draw(st.sampled_from(["contiguous", "strided"])),
            "spare": draw(st.integers(0, 2)),
        },
        "base": draw(st.sampled_from(["e", "2"])),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def check_v2_problem(problem: dict[str, Any], directory: Any, index: int) -> None:
    data = {**problem["spec"], "name": f"drawn_{index}"}
    module = render_module(make_spec(**data), directory)
    case = problem["case"]
    generator = torch.Generator().manual_seed(problem["seed"])
    check_case(module, case, generator)

    # pack -> exchange -> combine, against the float64 merge of every rank's shard.
    spec, N, dtype = module.SPEC, case["N"], case["dtype"]
    D = case["D"]
    if spec.row_tail and D * wire_dtype(spec, dtype).itemsize % 4:
        D += 1
    B, h = 3, case["h"]
    H = N * h
    outs = [torch.randn(B, H, D, generator=generator).to(dtype) for _ in range(N)]
    maxes, sums = zip(*(random_max_sum((B, H), generator) for _ in range(N)), strict=True)
    sends = []
    for rank in range(N):
        bufs = fill(module.alloc(N, B, H, D, dtype))
        module.pack(outs[rank], bufs=bufs, max_sum=(maxes[rank], sums[rank]))
        sends.append(bufs)
    received = reference.exchange(sends)
    config = CombineConfig(block_batch=4, block_head=4, block_dim=16)
    for rank in range(N):
        got, got_lse = module.combine(received[rank], B, lse_base=problem["base"], return_lse=True, config=config)
        if spec.max_sum:
            want, want_lse = reference.merge_shards_max_sum(outs, list(maxes), list(sums), rank, problem["base"])
        else:  # an lse spec stored max + ln(sum): its merge is the LSE merge of those words
            lses = [reference.lse_from_max_sum(m, s) for m, s in zip(maxes, sums, strict=True)]
            want, want_lse = reference.merge_shards(outs, lses, rank, problem["base"])
        scale = max(float(o.abs().max()) for o in outs)
        assert combine_error(got, want, scale) <= 1.0, (data, rank)
        assert got_lse is not None and lse_error(got_lse, want_lse) <= 1.0, (data, rank)


FAST = {"deadline": None, "derandomize": True, "suppress_health_check": list(HealthCheck)}


@requires_interpreter
@settings(max_examples=10, **FAST)
@given(problem=v2_problems())
def test_any_valid_v2_spec_packs_exactly_and_combines_within_tolerance(
    problem: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    check_v2_problem(problem, tmp_path_factory.mktemp("drawn"), 0)


@pytest.mark.slow
@requires_interpreter
@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(problem=v2_problems())
def test_any_valid_v2_spec_long_run(problem: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> None:
    check_v2_problem(problem, tmp_path_factory.mktemp("drawn"), 1)


def test_drawn_specs_are_valid_and_cover_the_forms() -> None:
    @settings(max_examples=200, **FAST)
    @given(data=v2_spec_data())
    def collect(data: dict[str, Any]) -> None:
        spec = make_spec(**data)
        seen.add((spec.row_tail, spec.max_sum, spec.payload.dtype.value, spec.transport.value))

    seen: set[tuple[Any, ...]] = set()
    collect()
    assert {(tail, pair) for tail, pair, _, _ in seen} == {(True, True), (True, False), (False, True), (False, False)}
