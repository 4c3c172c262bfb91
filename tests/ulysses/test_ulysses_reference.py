"""The torch reference against the engines' own regroupings, and the naive torch path against the reference.

The engine formulas below restate, tensor op by tensor op, what DeepSpeed-Ulysses' `_SeqAllToAll`
(seq-first [S, B, H, D]) and yunchang's `all_to_all_4D` (batch-first [B, S, H, D]) do around their
all_to_all_single: an oracle independent of the spec machinery.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import generated_module
from hypothesis import given, settings
from ulysses_cases import BUNDLED, make_shape, random_tensor, same_bytes, spec_data

from layoutgen.spec import parse_spec
from layoutgen.ulysses import reference
from layoutgen.ulysses.layout import Shape, UlyssesBuffers, tensor_shape
from layoutgen.ulysses.spec import Transport, UlyssesSpec

N, S_LOCAL, B, HEADS, D = 3, 2, 2, 2, 4  # heads per peer
H = N * HEADS


def engine_all_to_all(sends: list[torch.Tensor]) -> list[torch.Tensor]:
    """all_to_all_single over dim 0: rank r's chunk p is rank p's chunk r."""
    return [torch.stack([send[rank] for send in sends]) for rank in range(len(sends))]


def deepspeed_before(x: torch.Tensor) -> torch.Tensor:
    """[S_local, B, H, D] -> [N, S_local, B, H/N, D]: split the heads, peer outermost."""
    return x.reshape(S_LOCAL, B, N, HEADS, D).permute(2, 0, 1, 3, 4).contiguous()


def deepspeed_received(wire: torch.Tensor) -> torch.Tensor:
    """[N, S_local, B, H/N, D] -> [S, B, H/N, D]: peer s's rows are rows s*S_local ... of the sequence."""
    return wire.reshape(N * S_LOCAL, B, HEADS, D)


def deepspeed_after(attention: torch.Tensor) -> torch.Tensor:
    return attention.reshape(N, S_LOCAL, B, HEADS, D).contiguous()


def deepspeed_after_received(wire: torch.Tensor) -> torch.Tensor:
    return wire.permute(1, 2, 0, 3, 4).reshape(S_LOCAL, B, H, D)


def yunchang_before(x: torch.Tensor) -> torch.Tensor:
    """[B, S_local, H, D] -> [N, S_local, B, H/N, D]."""
    return x.reshape(B, S_LOCAL, N, HEADS, D).transpose(0, 2).contiguous()


def yunchang_received(wire: torch.Tensor) -> torch.Tensor:
    return wire.reshape(N * S_LOCAL, B, HEADS, D).transpose(0, 1).contiguous()


def yunchang_after(attention: torch.Tensor) -> torch.Tensor:
    """[B, S, H/N, D] -> [N, H/N, S_local, B, D]."""
    return attention.reshape(B, N, S_LOCAL, HEADS, D).transpose(0, 3).transpose(0, 1).contiguous()


def yunchang_after_received(wire: torch.Tensor) -> torch.Tensor:
    return wire.reshape(H, S_LOCAL, B, D).transpose(0, 2).contiguous()


ENGINES = {
    "deepspeed_ulysses": (deepspeed_before, deepspeed_received, deepspeed_after, deepspeed_after_received),
    "yunchang_ulysses": (yunchang_before, yunchang_received, yunchang_after, yunchang_after_received),
}


def buffers_of(spec: UlyssesSpec, direction: str, shape: Shape, tensors: dict[str, torch.Tensor]) -> UlyssesBuffers:
    return UlyssesBuffers(spec, direction, shape, {name: tensor.clone() for name, tensor in tensors.items()})


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("head_major", [False, True])
def test_the_reference_moves_what_the_engine_moves(engine: str, head_major: bool, generator: torch.Generator) -> None:
    before, received, after, after_received = ENGINES[engine]
    spec = generated_module(engine + ("_head_major" if head_major else "")).SPEC
    shape = make_shape(spec, N, S_LOCAL, HEADS, HEADS, D, B=B)
    names = [t.name for t in spec.to_attention.tensors]
    shards = [{n: random_tensor(tensor_shape(spec, shape, t, "local"), shape.dtype, generator)
               for n, t in zip(names, spec.to_attention.tensors, strict=True)} for _ in range(N)]  # fmt: skip
    sends = []
    for rank in range(N):
        ours = UlyssesBuffers.allocate(spec, "to_attention", shape)
        reference.scatter(shards[rank], ours)
        for name in names:
            assert same_bytes(ours.tensors[name], before(shards[rank][name])), f"{engine} rank {rank} {name}"
        sends.append(ours)
    recv = reference.exchange(sends)
    engine_recv = {name: engine_all_to_all([before(shard[name]) for shard in shards]) for name in names}
    outputs = []
    for rank in range(N):
        gathered = reference.gather(recv[rank])
        for name in names:
            theirs = received(engine_recv[name][rank])  # [S, B, H/N, D] or [B, S, H/N, D]
            if head_major:  # attention reads [B, H/N, S, D]
                theirs = theirs.permute(1, 2, 0, 3) if engine.startswith("deepspeed") else theirs.permute(0, 2, 1, 3)
            assert same_bytes(gathered[name], theirs.contiguous()), f"{engine} gather rank {rank} {name}"
        outputs.append({"out": gathered["q"]})
    sends_out = []
    for rank in range(N):
        ours = UlyssesBuffers.allocate(spec, "from_attention", shape)
        reference.scatter_out(outputs[rank], ours)
        attention = outputs[rank]["out"]
        if head_major:  # back to the engine's own attention layout
            attention = (
                attention.permute(2, 0, 1, 3) if engine.startswith("deepspeed") else attention.permute(0, 2, 1, 3)
            )
        assert same_bytes(ours.tensors["out"], after(attention))
        sends_out.append(ours)
    recv_out = reference.exchange(sends_out)
    engine_out = engine_all_to_all([send.tensors["out"] for send in sends_out])
    for rank in range(N):
        mine = reference.gather_out(recv_out[rank])["out"]
        assert same_bytes(mine, after_received(engine_out[rank]))
        assert same_bytes(mine, shards[rank]["q"])  # identity attention: the shard comes back


def test_the_shared_gqa_wire_is_q_then_k_then_v_per_peer(generator: torch.Generator) -> None:
    spec = generated_module("ulysses_qkv_gqa").SPEC
    shape = make_shape(spec, N, S_LOCAL, HEADS, 1, D)
    shard = {t.name: random_tensor(tensor_shape(spec, shape, t, "local"), shape.dtype, generator)
             for t in spec.to_attention.tensors}  # fmt: skip
    ours = UlyssesBuffers.allocate(spec, "to_attention", shape)
    reference.scatter(shard, ours)
    per_peer = [x.reshape(S_LOCAL, N, -1, D).transpose(0, 1).reshape(N, -1) for x in shard.values()]
    assert same_bytes(ours.tensors["wire"], torch.cat(per_peer, dim=1))


def exchanged(naive_sends: list[dict[str, torch.Tensor]], recv: list[UlyssesBuffers]) -> list[dict[str, torch.Tensor]]:
    """What the naive path receives: its own exchange (one all_to_all_single per tensor, as engines call it)
    for an all_to_all_single spec, whose wires the spec schema makes hold peer outermost; for an external
    one, whose peer axis may lie anywhere, the reference's received bytes."""
    if recv[0].spec.transport is Transport.ALL_TO_ALL_SINGLE:
        return reference.naive_exchange(naive_sends)
    return [dict(bufs.tensors) for bufs in recv]


def check_naive_path(spec: UlyssesSpec, generator: torch.Generator) -> None:
    """The naive path's send buffers, gathered tensors, output send buffers and returned shards are the
    reference's, byte for byte, for N ranks exchanging in-process."""
    shape = make_shape(spec, N, S_LOCAL, HEADS, 1, D, B=B)
    shards = [{t.name: random_tensor(tensor_shape(spec, shape, t, "local"), shape.dtype, generator)
               for t in spec.to_attention.tensors} for _ in range(N)]  # fmt: skip
    sends = [UlyssesBuffers.allocate(spec, "to_attention", shape) for _ in range(N)]
    for shard, send in zip(shards, sends, strict=True):
        reference.scatter(shard, send)
    naive_sends = [reference.naive_scatter(spec, shape, shard) for shard in shards]
    for send, naive in zip(sends, naive_sends, strict=True):
        assert all(same_bytes(naive[buffer], send.tensors[buffer]) for buffer in send.tensors)
    recv = reference.exchange(sends)
    naive_recv = exchanged(naive_sends, recv)
    for rank in range(N):
        want = reference.gather(recv[rank])
        got = reference.naive_gather(spec, shape, naive_recv[rank])
        assert all(same_bytes(got[n], want[n]) for n in want)
    outputs = [{t.name: random_tensor(tensor_shape(spec, shape, t, "attention"), shape.dtype, generator)
                for t in spec.from_attention.tensors} for _ in range(N)]  # fmt: skip
    sends_out = [UlyssesBuffers.allocate(spec, "from_attention", shape) for _ in range(N)]
    for output, send in zip(outputs, sends_out, strict=True):
        reference.scatter_out(output, send)
    naive_out = [reference.naive_scatter_out(spec, shape, output) for output in outputs]
    for send, naive in zip(sends_out, naive_out, strict=True):
        assert all(same_bytes(naive[buffer], send.tensors[buffer]) for buffer in send.tensors)
    recv_out = reference.exchange(sends_out)
    naive_recv_out = exchanged(naive_out, recv_out)
    for rank in range(N):
        want = reference.gather_out(recv_out[rank])
        got = reference.naive_gather_out(spec, shape, naive_recv_out[rank])
        assert all(same_bytes(got[n], want[n]) for n in want)


@pytest.mark.parametrize("name", BUNDLED)
def test_the_naive_torch_path_matches_the_reference(name: str, generator: torch.Generator) -> None:
    check_naive_path(generated_module(name).SPEC, generator)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=spec_data())
def test_the_naive_torch_path_of_any_spec_matches_the_reference(data: dict[str, Any]) -> None:
    spec = parse_spec(data, source="<hypothesis>")
    assert isinstance(spec, UlyssesSpec)
    check_naive_path(spec, torch.Generator().manual_seed(0))


def test_the_reference_refuses_other_tensors() -> None:
    spec = generated_module("deepspeed_ulysses").SPEC
    shape = make_shape(spec, N, S_LOCAL, HEADS, HEADS, D, B=B)
    bufs = UlyssesBuffers.allocate(spec, "to_attention", shape)
    with pytest.raises(
        ValueError, match=r"tensors must map the tensors \['q', 'k', 'v'\] of the to_attention direction"
    ):
        reference.scatter({"q": torch.zeros(1)}, bufs)
    with pytest.raises(ValueError, match="moves \\['q', 'k', 'v'\\], not 'x'"):
        bufs.wire_view("x")
