"""Eleventh hardening pass, the Ulysses host layer (spec rules, layout, argument checks, dispatch, custom ops,
runtime helpers): tests for the mutants a mutation audit of layoutgen/ulysses/{spec,layout,checks,dispatch,ops,
runtime}.py left alive.  Each test answers (kills) the mutation named here:

* test_a_tensor_name_may_have_sixteen_characters_not_seventeen: TENSOR_NAME_PATTERN `{0,15}` -> `{0,16}`.
* test_a_wire_without_peer_is_refused_under_an_external_transport: `peer` moved from the wire's required
  axes to its optional ones (all_to_all_single's peer-outermost rule hid it).
* test_heads_only_the_output_direction_uses_must_still_split_over_the_ranks: `UlyssesSpec.uses` looking at
  to_attention only, so check_shape skips H_kv % N for an H_kv that from_attention alone uses.
* test_a_spec_without_batch_takes_b_1_only: check_shape's `B != 1` -> `B > 2`.
* test_a_cached_gather_plan_refuses_an_output_without_a_unit_last_stride: the gather plan key without strides.
* test_the_scatter_op_plans_with_the_config_it_is_given: the scatter custom op dropping its `config`.
* test_size_errors_name_the_axes_of_the_side_the_kernel_reads_or_writes: checks._side swapped (a size error
  naming the attention axes for a shard, or the shard's for an attention output).
* test_a_tuned_entry_answers_only_calls_of_its_dtype: dispatch looking the tuning database up under a fixed
  dtype name.
* test_hand_built_buffers_with_missing_or_extra_tensors_are_refused_by_name: check_buffers' name check dropped.
* test_hand_built_buffers_of_another_size_or_dtype_are_refused_by_name: check_buffers' extents check dropped;
  its dtype check dropped.
* test_hand_built_buffers_on_two_devices_are_refused_naming_the_odd_one: check_buffers' device check dropped.
* test_a_source_on_another_device_is_refused_by_name: _check_tensor's device check dropped.
* test_a_two_element_last_axis_must_have_a_unit_stride: the unit-stride check skipped for D 2
  (`expected[-1] > 1` -> `> 2`).
* test_an_output_that_requires_grad_is_named_by_its_position: the grad refusal's `out[i]` label with a wrong i.
* test_check_grid_refuses_each_axis_past_cuda_s_limit: check_grid without its grid-y bound (and x off by one).
* test_a_gather_plan_takes_64_bit_offsets_when_a_given_output_needs_them: the gather plan's 64-bit decision
  made from the buffers alone, not the given outputs.
* test_the_exchange_refuses_an_external_transport_and_buffers_of_two_shapes: all_to_all_buffers without its
  transport check; without its send/recv shape check.
* test_views_refuse_buffers_of_another_spec: runtime.views passing the buffers on without check_buffers.
* test_a_source_of_the_right_size_but_another_shape_is_refused: the source shape check reduced to a numel check.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import generated_module, requires_interpreter
from ulysses_cases import alloc, as_tuple, fill, gather_entry, make_shape, random_tensor

from layoutgen import tuning_db
from layoutgen.config import config_values
from layoutgen.spec import SpecError, parse_spec
from layoutgen.tuning_db import CPU_INTERPRETER_DEVICE
from layoutgen.ulysses import checks, dispatch, reference, runtime
from layoutgen.ulysses.config import MAX_GRID_X, MAX_GRID_Y, ScatterConfig, runtime_default
from layoutgen.ulysses.dispatch import shape_values
from layoutgen.ulysses.layout import Shape, UlyssesBuffers, check_shape, tensor_shape
from layoutgen.ulysses.spec import HeadCount, UlyssesSpec

# No cached plans, LAYOUTGEN_CONFIG unset and empty tuning databases, for every test.
pytestmark = [requires_interpreter, pytest.mark.usefixtures("clean_dispatch")]

BASE: dict[str, Any] = {
    "family": "ulysses",
    "name": "round11",
    "summary": "a test spec",
    "transport": "all_to_all_single",
    "local": ["seq", "head", "dim"],
    "attention": ["seq", "head", "dim"],
    "to_attention": {"tensors": [{"name": "q", "heads": "H"}], "wire": ["peer", "seq", "head", "dim"]},
    "from_attention": {"tensors": [{"name": "out", "heads": "H"}], "wire": ["peer", "head", "seq", "dim"]},
}
#: An output direction with an H_kv-headed tensor, where the input direction has none.
KV_OUT: dict[str, Any] = {
    "tensors": [{"name": "out", "heads": "H"}, {"name": "kvout", "heads": "H_kv"}],
    "wire": ["peer", "seq", "head", "dim"],
}


def spec_of(**changes: Any) -> UlyssesSpec:
    data = copy.deepcopy(BASE)
    data.update(changes)
    spec = parse_spec(data, source="round11.yaml")
    assert isinstance(spec, UlyssesSpec)
    return spec


def problems(**changes: Any) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as raised:
        spec_of(**changes)
    return raised.value.problems


def test_a_tensor_name_may_have_sixteen_characters_not_seventeen() -> None:
    sixteen = {"tensors": [{"name": "a" * 16, "heads": "H"}], "wire": ["peer", "seq", "head", "dim"]}
    assert spec_of(from_attention=sixteen).from_attention.tensors[0].name == "a" * 16
    seventeen = {"tensors": [{"name": "a" * 17, "heads": "H"}], "wire": ["peer", "seq", "head", "dim"]}
    found = problems(from_attention=seventeen)
    assert any(field == "from_attention.tensors.0.name" and "a" * 17 in text for field, text in found), found


def test_a_wire_without_peer_is_refused_under_an_external_transport() -> None:
    wire = {"tensors": [{"name": "x", "heads": "H"}], "wire": ["seq", "head", "dim"]}
    found = problems(transport="external", from_attention=wire)
    assert any(field == "from_attention.wire" and "missing ['peer']" in text for field, text in found), found


def test_heads_only_the_output_direction_uses_must_still_split_over_the_ranks() -> None:
    # H_kv appears only in from_attention: alloc_out for H_kv 3 over N 2 would drop a head per rank.
    spec = spec_of(from_attention=KV_OUT)
    assert spec.uses(HeadCount.H_KV)
    shape = Shape(N=2, S_local=3, H=4, H_kv=3, D=4, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"H_kv \(heads\) must be divisible by N \(ranks\): H_kv=3, N=2"):
        check_shape(spec, shape)
    with pytest.raises(ValueError, match=r"H_kv=3, N=2"):
        UlyssesBuffers.allocate(spec, "from_attention", shape, "cpu")


@pytest.mark.parametrize(("batch", "message"), [(0, "B must be >= 1, got 0"), (2, "B must be 1, got 2")])
def test_a_spec_without_batch_takes_b_1_only(batch: int, message: str) -> None:
    spec = generated_module("ulysses_qkv_gqa").SPEC
    shape = Shape(N=2, S_local=3, H=4, H_kv=2, D=4, dtype=torch.bfloat16, B=batch)
    with pytest.raises(ValueError, match=message):
        check_shape(spec, shape)


def gqa_problem(generator: torch.Generator) -> tuple[Any, Shape, list[torch.Tensor]]:
    module = generated_module("ulysses_qkv_gqa")
    shape = make_shape(module.SPEC, N=2, S_local=3, heads=3, kv_heads=1, D=4)  # H 6, H_kv 2
    sources = [random_tensor(tensor_shape(module.SPEC, shape, t, "local"), shape.dtype, generator)
               for t in module.SPEC.to_attention.tensors]  # fmt: skip
    return module, shape, sources


def wire_bytes(bufs: UlyssesBuffers) -> list[bytes]:
    return [bytes(tensor.view(torch.uint8).flatten().numpy()) for tensor in bufs.tensors.values()]


def test_a_cached_gather_plan_refuses_an_output_without_a_unit_last_stride(generator: torch.Generator) -> None:
    module, shape, _ = gqa_problem(generator)
    recv = alloc(module, shape, "to_attention")
    given = as_tuple(module.gather(recv))
    module.gather(recv, out=given)  # plans outputs of this shape, dtype and (dense) strides
    wide = torch.full((*given[1].shape[:-1], 2 * given[1].shape[-1]), 7.0, dtype=shape.dtype)[..., ::2]
    with pytest.raises(ValueError, match=r"gather: out\[1\] \(k\) must have stride 1 along its last axis \(dim\)"):
        module.gather(recv, out=(given[0], wide, given[2]))
    assert bool((wide == 7.0).all())


def test_the_scatter_op_plans_with_the_config_it_is_given(
    generator: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    module, shape, sources = gqa_problem(generator)
    send, want = alloc(module, shape, "to_attention"), alloc(module, shape, "to_attention")
    explicit = ScatterConfig(block_seq=1, block_head=1, block_dim=2, num_warps=1)
    values = config_values(explicit)
    torch.ops.layoutgen.ulysses_scatter(
        sources, list(send.tensors.values()), module.__name__, shape_values(send), values
    )
    reference.scatter(dict(zip(("q", "k", "v"), sources, strict=True)), want)
    assert wire_bytes(send) == wire_bytes(want)
    validated = []
    real = checks.check_sources
    monkeypatch.setattr(checks, "check_sources", lambda *args: validated.append(args) or real(*args))
    plan = module._dispatch.plan("scatter", tuple(sources), send, config=explicit)
    assert plan.config == explicit and not validated, "the op planned with another config than it was given"


def test_size_errors_name_the_axes_of_the_side_the_kernel_reads_or_writes(generator: torch.Generator) -> None:
    # deepspeed_ulysses_head_major: shards [seq, batch, head, dim], attention [batch, head, seq, dim].
    module = generated_module("deepspeed_ulysses_head_major")
    shape = make_shape(module.SPEC, N=2, S_local=3, heads=2, kv_heads=2, D=4, B=2)
    q, k, v = (random_tensor(tensor_shape(module.SPEC, shape, t, "local"), shape.dtype, generator)
               for t in module.SPEC.to_attention.tensors)  # fmt: skip
    send = alloc(module, shape, "to_attention")
    with pytest.raises(ValueError, match=r"scatter: v must have shape \[seq=3, batch=2, head=4, dim=4\] .*got shape "
                                         r"\(3, 2, 4, 2\)"):  # fmt: skip
        module.scatter(q, k, v[..., :2], send)
    given = as_tuple(module.gather(send))
    assert given[0].shape == (2, 2, 6, 4)
    with pytest.raises(ValueError, match=r"gather: out\[2\] \(v\) must have shape \[batch=2, head=2, seq=6, dim=4\] "
                                         r".*got shape \(2, 2, 5, 4\)"):  # fmt: skip
        module.gather(send, out=(*given[:2], given[2][:, :, :5]))


@pytest.mark.filterwarnings("ignore:no current tuning entry:UserWarning")  # the bfloat16 call has none, as meant
def test_a_tuned_entry_answers_only_calls_of_its_dtype(clean_dispatch: Path) -> None:
    module = generated_module("yunchang_ulysses")
    shape = make_shape(module.SPEC, N=2, S_local=3, heads=2, kv_heads=2, D=4, B=1)
    default = runtime_default(module.SPEC, "gather", shape)
    tuned_warps = 2 if default.num_warps != 2 else 4
    tuning_db.record(
        clean_dispatch,
        CPU_INTERPRETER_DEVICE,
        "0.0",
        [gather_entry(module, shape, 4, tuned_warps, "float16")],
        {"layoutgen": "test"},
    )
    half = alloc(module, dataclasses.replace(shape, dtype=torch.float16), "to_attention")
    assert module._dispatch.plan("gather", half, None).config.num_warps == tuned_warps
    brain = alloc(module, shape, "to_attention")
    assert module._dispatch.plan("gather", brain, None).config == default, "a float16 entry answered a bfloat16 call"


def test_hand_built_buffers_with_missing_or_extra_tensors_are_refused_by_name(generator: torch.Generator) -> None:
    module, shape, sources = gqa_problem(generator)
    wire = alloc(module, shape, "to_attention").tensors["wire"]
    extra = UlyssesBuffers(module.SPEC, "to_attention", shape, {"wire": wire, "gate": torch.empty_like(wire)})
    with pytest.raises(ValueError, match=r"bufs.tensors must hold \['wire'\], got \['gate', 'wire'\]"):
        module.scatter(*sources, extra)
    renamed = UlyssesBuffers(module.SPEC, "to_attention", shape, {"qkv": wire})
    with pytest.raises(ValueError, match=r"bufs.tensors must hold \['wire'\], got \['qkv'\]"):
        module.gather(renamed)


@pytest.mark.parametrize(
    ("change", "got"),
    [
        (lambda wire: wire[:, :-1], r"shape \(2, 59\)"),  # one element short per peer: the kernel would write past it
        (
            lambda wire: wire.view(torch.float16),
            r"shape \(2, 60\), strides \(60, 1\), torch.float16",
        ),  # same bytes, another dtype
    ],
    ids=["extents", "dtype"],
)
def test_hand_built_buffers_of_another_size_or_dtype_are_refused_by_name(
    change: Any, got: str, generator: torch.Generator
) -> None:
    module, shape, sources = gqa_problem(generator)
    wire = change(fill(alloc(module, shape, "to_attention")).tensors["wire"]).clone(
        memory_format=torch.contiguous_format
    )
    before = bytes(wire.view(torch.uint8).flatten().numpy())
    bufs = UlyssesBuffers(module.SPEC, "to_attention", shape, {"wire": wire})
    with pytest.raises(
        ValueError,
        match=rf"bufs.tensors\['wire'\] must be a contiguous torch.bfloat16 tensor of shape \(2, 60\) on cpu; got {got}",
    ):
        module.scatter(*sources, bufs)
    assert bytes(wire.view(torch.uint8).flatten().numpy()) == before


def test_hand_built_buffers_on_two_devices_are_refused_naming_the_odd_one(generator: torch.Generator) -> None:
    module = generated_module("deepspeed_ulysses")
    shape = make_shape(module.SPEC, N=2, S_local=3, heads=1, kv_heads=1, D=4, B=3)
    tensors = dict(alloc(module, shape, "to_attention").tensors)
    tensors["k"] = torch.empty_like(tensors["k"], device="meta")
    bufs = UlyssesBuffers(module.SPEC, "to_attention", shape, tensors)
    with pytest.raises(ValueError, match=r"bufs.tensors\['k'\] must be a contiguous torch.bfloat16 tensor of shape "
                                         r"\(2, 3, 3, 1, 4\) on cpu; got .*on meta"):  # fmt: skip
        module.gather(bufs)


def test_a_source_on_another_device_is_refused_by_name(generator: torch.Generator) -> None:
    module, shape, (q, k, v) = gqa_problem(generator)
    send = alloc(module, shape, "to_attention")
    before = wire_bytes(send)
    with pytest.raises(ValueError, match=r"scatter: k must be on cpu \(the buffers' device\); got .*on meta"):
        module.scatter(q, k.to("meta"), v, send)
    assert wire_bytes(send) == before


def test_a_two_element_last_axis_must_have_a_unit_stride(generator: torch.Generator) -> None:
    module = generated_module("ulysses_qkv_gqa")
    shape = make_shape(module.SPEC, N=2, S_local=3, heads=3, kv_heads=1, D=2)
    q, k, v = (random_tensor(tensor_shape(module.SPEC, shape, t, "local"), shape.dtype, generator)
               for t in module.SPEC.to_attention.tensors)  # fmt: skip
    spread = torch.full((*v.shape[:-1], 4), 7.0, dtype=shape.dtype)[..., ::2]
    spread.copy_(v)
    send = alloc(module, shape, "to_attention")
    before = wire_bytes(send)
    with pytest.raises(ValueError, match=r"scatter: v must have stride 1 along its last axis \(dim\), any other "
                                         r"strides; got shape \(3, 2, 2\), strides \(8, 4, 2\)"):  # fmt: skip
        module.scatter(q, k, spread, send)
    assert wire_bytes(send) == before


def test_an_output_that_requires_grad_is_named_by_its_position(generator: torch.Generator) -> None:
    module, shape, _ = gqa_problem(generator)
    recv = alloc(module, shape, "to_attention")
    q, k, v = as_tuple(module.gather(recv))
    with pytest.raises(RuntimeError, match=r"gather: out\[2\] \(v\) requires grad.*pass v\.detach\(\) instead"):
        module.gather(recv, out=(q, k, v.float().requires_grad_().to(shape.dtype)))


def test_check_grid_refuses_each_axis_past_cuda_s_limit() -> None:
    runtime.check_grid("gather", (MAX_GRID_X, MAX_GRID_Y))  # the largest grid CUDA holds
    with pytest.raises(ValueError, match=rf"gather: the config needs a grid of 1 x {MAX_GRID_Y + 1} programs"):
        runtime.check_grid("gather", (1, MAX_GRID_Y + 1))
    with pytest.raises(ValueError, match=rf"scatter: the config needs a grid of {MAX_GRID_X + 1} x 1 programs"):
        runtime.check_grid("scatter", (MAX_GRID_X + 1, 1))


def test_a_gather_plan_takes_64_bit_offsets_when_a_given_output_needs_them(
    generator: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2**31 elements cannot be allocated here: the threshold is lowered to the largest buffer, which a given
    # output with a wide stride passes while the buffers and dense new outputs do not.
    module, shape, _ = gqa_problem(generator)
    recv = alloc(module, shape, "to_attention")
    limit = max(tensor.numel() for tensor in recv.tensors.values())

    def past_limit(*tensors: torch.Tensor) -> bool:
        return any(sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) >= limit for t in tensors)

    monkeypatch.setattr(dispatch, "needs_int64", past_limit)
    q, k, v = as_tuple(module.gather(recv))
    assert not module._dispatch.plan("gather", recv, None).index_64
    wide = torch.full((*q.shape[:-1], 10 * q.shape[-1]), 7.0, dtype=shape.dtype)[..., : q.shape[-1]]
    assert module._dispatch.plan("gather", recv, (wide, k, v)).index_64


def test_the_exchange_refuses_an_external_transport_and_buffers_of_two_shapes() -> None:
    external = spec_of(transport="external")
    shape = Shape(N=2, S_local=3, H=2, H_kv=2, D=4, dtype=torch.bfloat16)
    send, recv = (UlyssesBuffers.allocate(external, "to_attention", shape, "cpu") for _ in range(2))
    with pytest.raises(ValueError, match="spec 'round11' has transport external; the caller moves its bytes"):
        runtime.all_to_all_buffers(external, send, recv)
    module = generated_module("ulysses_qkv_gqa")
    three = make_shape(module.SPEC, N=2, S_local=3, heads=3, kv_heads=1, D=4)
    send = alloc(module, three, "to_attention")
    recv = alloc(module, dataclasses.replace(three, S_local=5), "to_attention")
    with pytest.raises(ValueError, match=r"send and recv differ in shape: .*S_local=3.* vs .*S_local=5"):
        module.exchange(send, recv)


def test_views_refuse_buffers_of_another_spec() -> None:
    gqa = generated_module("ulysses_qkv_gqa")
    bufs = alloc(gqa, make_shape(gqa.SPEC, N=2, S_local=3, heads=3, kv_heads=1, D=4), "to_attention")
    deepspeed = generated_module("deepspeed_ulysses")
    with pytest.raises(ValueError, match="bufs were allocated for spec 'ulysses_qkv_gqa', not 'deepspeed_ulysses'"):
        deepspeed.attention_views(bufs)


def test_a_source_of_the_right_size_but_another_shape_is_refused(generator: torch.Generator) -> None:
    module, shape, (q, k, v) = gqa_problem(generator)
    send = alloc(module, shape, "to_attention")
    with pytest.raises(
        ValueError, match=r"scatter: k must have shape \[seq=3, head=2, dim=4\] .*got shape \(3, 4, 2\)"
    ):
        module.scatter(q, k.reshape(3, 4, 2), v, send)
