"""The generated modules' runtime: clear errors naming the tensor, cached plans, config resolution, the CPU
without interpreter error, and torch.compile(fullgraph=True) through the custom ops."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conftest import generated_module, requires_interpreter
from triton.runtime.jit import JITFunction
from ulysses_cases import alloc, as_tuple, make_shape, random_tensor, same_bytes

from layoutgen.runtime import reset_caches
from layoutgen.ulysses import checks
from layoutgen.ulysses.config import GatherConfig, ScatterConfig
from layoutgen.ulysses.layout import Shape, tensor_shape

pytestmark = requires_interpreter


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("LAYOUTGEN_CONFIG", raising=False)
    reset_caches()
    yield
    reset_caches()


def gqa() -> tuple[Any, Shape]:
    module = generated_module("ulysses_qkv_gqa")
    return module, make_shape(module.SPEC, N=2, S_local=3, heads=2, kv_heads=1, D=4)


def shards(module: Any, shape: Shape, generator: torch.Generator) -> list[torch.Tensor]:
    return [random_tensor(tensor_shape(module.SPEC, shape, t, "local"), shape.dtype, generator)
            for t in module.SPEC.to_attention.tensors]  # fmt: skip


def test_bad_tensors_are_named_with_what_was_expected(generator: torch.Generator) -> None:
    module, shape = gqa()
    send = alloc(module, shape, "to_attention")
    q, k, v = shards(module, shape, generator)
    with pytest.raises(
        TypeError, match=r"scatter: q must be a torch.Tensor \[seq=3, head=4, dim=4\] of torch.bfloat16"
    ):
        module.scatter([1, 2], k, v, send)
    with pytest.raises(ValueError, match=r"scatter: k must have shape \[seq=3, head=2, dim=4\].*got shape \(3, 4, 4\)"):
        module.scatter(q, q, v, send)
    with pytest.raises(TypeError, match=r"scatter: v must be torch.bfloat16 .*got .*torch.float32"):
        module.scatter(q, k, v.float(), send)
    with pytest.raises(ValueError, match=r"scatter: q must have stride 1 along its last axis \(dim\)"):
        module.scatter(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, send)
    with pytest.raises(ValueError, match=r"scatter: q shares memory with bufs.tensors\['wire'\]"):
        module.scatter(send.tensors["wire"].view(-1)[: q.numel()].view(q.shape), k, v, send)
    with pytest.raises(TypeError, match=r"bufs must be the buffers object returned by alloc\(\)"):
        module.scatter(q, k, v, send.tensors["wire"])
    with pytest.raises(TypeError, match="missing 1 required positional argument"):
        module.scatter(q, k, send)
    send_out = alloc(module, shape, "from_attention")
    with pytest.raises(
        ValueError, match=r"hold the from_attention wire \(from alloc_out\(\).*take the buffers of alloc\(\)"
    ):
        module.scatter(q, k, v, send_out)
    other = generated_module("deepspeed_ulysses")
    with pytest.raises(ValueError, match="allocated for spec 'ulysses_qkv_gqa', not 'deepspeed_ulysses'"):
        other.gather(send)


def test_overlap_is_refused_on_every_call_of_a_plan(generator: torch.Generator) -> None:
    # A plan's key holds the tensors' geometry, not their addresses: a call that reuses a valid call's plan
    # with tensors that now overlap is refused as a first call would be (and leaves the valid plan usable).
    module, shape = gqa()
    send = alloc(module, shape, "to_attention")
    q, k, v = shards(module, shape, generator)
    module.scatter(q, k, v, send)
    aliased = send.tensors["wire"].view(-1)[: q.numel()].view(q.shape)
    with pytest.raises(ValueError, match=r"scatter: q shares memory with bufs.tensors\['wire'\]"):
        module.scatter(aliased, k, v, send)
    recv = alloc(module, shape, "to_attention")
    recv.tensors["wire"].copy_(send.tensors["wire"])
    outputs = [torch.empty_like(t) for t in as_tuple(module.gather(recv))]
    module.gather(recv, out=tuple(outputs))
    first_k = outputs[1].clone()
    with pytest.raises(ValueError, match=r"gather: the tensors of out must not share memory; out\[2\] \(v\)"):
        module.gather(recv, out=(outputs[0], outputs[1], outputs[1]))
    assert torch.equal(outputs[1], first_k), "a refused gather wrote its outputs"
    into_wire = recv.tensors["wire"].view(-1)[: outputs[0].numel()].view(outputs[0].shape)
    with pytest.raises(ValueError, match=r"shares memory with bufs\.tensors"):
        module.gather(recv, out=(into_wire, outputs[1], outputs[2]))
    module.scatter(q, k, v, send)
    module.gather(recv, out=tuple(outputs))


def test_a_source_that_requires_grad_is_refused_in_grad_mode(generator: torch.Generator) -> None:
    # The copies record nothing for autograd: rather an error than a gradient lost without a word.
    module, shape = gqa()
    send = alloc(module, shape, "to_attention")
    q, k, v = shards(module, shape, generator)
    module.scatter(q, k, v, send)  # the plan exists: the refusal must not depend on it
    k = k.float().requires_grad_().to(k.dtype)
    with pytest.raises(RuntimeError, match=r"scatter: k requires grad.*torch.no_grad\(\).*k.detach\(\)"):
        module.scatter(q, k, v, send)
    with torch.no_grad():
        module.scatter(q, k, v, send)
    with torch.inference_mode():
        module.scatter(q, k.detach(), v, send)
    out_send = alloc(module, shape, "from_attention")
    attention_out = torch.randn(*tensor_shape(module.SPEC, shape, module.SPEC.from_attention.tensors[0], "attention"))
    with pytest.raises(RuntimeError, match="scatter_out: out requires grad"):
        module.scatter_out(attention_out.to(shape.dtype).requires_grad_(), out_send)


def test_bad_outputs_and_shapes_are_named(generator: torch.Generator) -> None:
    module, shape = gqa()
    recv = alloc(module, shape, "to_attention")
    q, k, v = as_tuple(module.gather(recv))
    with pytest.raises(TypeError, match=r"gather: out must be None or a tuple of 3 tensors \(q, k, v\)"):
        module.gather(recv, out=q)
    with pytest.raises(ValueError, match=r"gather: out\[1\] \(k\) must have shape \[seq=6, head=1, dim=4\]"):
        module.gather(recv, out=(q, q, v))
    wide = torch.empty(1, 1, 4, dtype=shape.dtype).expand(6, 1, 4)
    with pytest.raises(ValueError, match=r"out\[1\] \(k\) must not overlap itself"):
        module.gather(recv, out=(q, wide, v))
    with pytest.raises(ValueError, match="the tensors of out must not share memory"):
        module.gather(recv, out=(q, k, k))
    out = torch.empty(2 * shape.S_local, shape.H // shape.N, shape.D, dtype=shape.dtype)
    with pytest.raises(TypeError, match=r"gather_out: out must be a torch.Tensor \[seq=3, head=4, dim=4\] .*got tuple"):
        module.gather_out(alloc(module, shape, "from_attention"), out=(out, out))
    with pytest.raises(ValueError, match=r"H_kv \(heads\) must be divisible by N \(ranks\): H_kv=3, N=2"):
        module.alloc(2, 3, 4, 4, torch.bfloat16, H_kv=3)
    with pytest.raises(TypeError, match="dtype must be one of"):
        module.alloc(2, 3, 4, 4, torch.int32, H_kv=2)
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'B'"):
        generated_module("yunchang_ulysses").alloc(2, 3, 4, 4, torch.bfloat16)
    with pytest.raises(ValueError, match="S_local must be >= 1, got 0"):
        module.alloc(2, 0, 4, 4, torch.bfloat16, H_kv=2)


def test_cpu_tensors_without_the_interpreter_are_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                               generator: torch.Generator) -> None:  # fmt: skip
    module, shape = gqa()

    def compiled_kernel(x: Any) -> None:  # what @triton.jit gives without TRITON_INTERPRET=1
        pass

    launch = module._dispatch.kernels["scatter"][1]
    monkeypatch.setitem(module._dispatch.kernels, "scatter", (JITFunction(compiled_kernel), launch))
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1 before triton is first imported"):
        module.scatter(*shards(module, shape, generator), alloc(module, shape, "to_attention"))


def test_a_plan_is_validated_once_per_key(monkeypatch: pytest.MonkeyPatch, generator: torch.Generator) -> None:
    module, shape = gqa()
    send = alloc(module, shape, "to_attention")
    inputs = shards(module, shape, generator)
    module.scatter(*inputs, send)
    first = bytes(send.tensors["wire"].view(torch.uint8).numpy())
    calls = []
    real = checks.check_sources
    monkeypatch.setattr(checks, "check_sources", lambda *args: calls.append(args) or real(*args))
    module.scatter(*inputs, send)
    assert not calls and bytes(send.tensors["wire"].view(torch.uint8).numpy()) == first
    module.scatter(
        inputs[0].clone(), *[t[:, :, :].transpose(0, 1).contiguous().transpose(0, 1) for t in inputs[1:]], send
    )
    assert len(calls) == 1  # other strides: a new key, validated once
    assert bytes(send.tensors["wire"].view(torch.uint8).numpy()) == first


def test_config_none_is_forced_by_the_environment_and_explicit_configs_win(monkeypatch: pytest.MonkeyPatch) -> None:
    module, shape = gqa()
    recv = alloc(module, shape, "to_attention")
    default = module._dispatch.plan("gather", recv, None).config
    assert default.block_dim == 4 and default.num_warps == 1  # the destination's innermost axis first
    reset_caches()
    monkeypatch.setenv("LAYOUTGEN_CONFIG", json.dumps({"gather": {"block_seq": 2, "block_dim": 2}}))
    forced = module._dispatch.plan("gather", recv, None).config
    assert (forced.block_seq, forced.block_dim, forced.block_head) == (2, 2, default.block_head)
    explicit = GatherConfig(block_seq=1, block_dim=1)
    assert module._dispatch.plan("gather", recv, None, config=explicit).config is explicit
    with pytest.raises(TypeError, match=r"config must be a layoutgen\.ulysses\.config\.GatherConfig or None"):
        module.gather(recv, config=ScatterConfig())


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_torch_compile_fullgraph_traces_the_custom_ops(generator: torch.Generator) -> None:
    torch._dynamo.reset()
    module, _ = gqa()

    def step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, send: Any, recv: Any, send_out: Any, recv_out: Any):
        module.scatter(q, k, v, send)
        for name, tensor in recv.tensors.items():  # one rank: the exchange delivers what was sent
            tensor.copy_(send.tensors[name])
        q_a, k_a, v_a = module.gather(recv)
        module.scatter_out(q_a * 1, send_out)
        for name, tensor in recv_out.tensors.items():
            tensor.copy_(send_out.tensors[name])
        return q_a, k_a, v_a, module.gather_out(recv_out)

    one = make_shape(module.SPEC, N=1, S_local=3, heads=2, kv_heads=1, D=4)
    inputs = shards(module, one, generator)
    buffers = {mode: [alloc(module, one, d) for d in ("to_attention",) * 2 + ("from_attention",) * 2]
               for mode in ("eager", "compiled")}  # fmt: skip
    want = step(*inputs, *buffers["eager"])
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(*inputs, *buffers["compiled"])
    assert all(same_bytes(g, w) for g, w in zip(got, want, strict=True))
    assert same_bytes(got[3], inputs[0])
    for mine, theirs in zip(buffers["compiled"], buffers["eager"], strict=True):
        assert all(same_bytes(mine.tensors[n], theirs.tensors[n]) for n in mine.tensors)


def test_a_wire_that_holds_the_attention_layout_is_viewed_not_copied(generator: torch.Generator) -> None:
    """DeepSpeed's seq-first wire is the attention layout [S, B, H/N, D]: attention reads the receive buffers
    and writes the send buffers of the output in place of gather and scatter_out."""
    module = generated_module("deepspeed_ulysses")
    shape = make_shape(module.SPEC, N=2, S_local=3, heads=2, kv_heads=2, D=4, B=2)
    recv = alloc(module, shape, "to_attention")
    for tensor in recv.tensors.values():
        tensor.copy_(torch.randn(tensor.shape, generator=generator))
    views = module.attention_views(recv)
    for view, copy, name in zip(views, module.gather(recv), ("q", "k", "v"), strict=True):
        assert same_bytes(view, copy) and view.data_ptr() == recv.tensors[name].data_ptr() and view.is_contiguous()
    out = random_tensor((6, 2, 2, 4), shape.dtype, generator)
    (written,) = module.attention_views(send_out := alloc(module, shape, "from_attention"))
    written.copy_(out)
    module.scatter_out(out, copied := alloc(module, shape, "from_attention"))
    assert same_bytes(send_out.tensors["out"], copied.tensors["out"])
    with pytest.raises(ValueError, match=r"q in the local layout \[seq, batch, head, dim\] is not held by the wire"):
        module.local_views(alloc(module, shape, "to_attention"))
    head_major = generated_module("deepspeed_ulysses_head_major")
    with pytest.raises(ValueError, match=r"q in the attention layout \[batch, head, seq, dim\] is not held"):
        head_major.attention_views(alloc(head_major, shape, "to_attention"))
