"""Tenth hardening pass: a mutation audit of the distributed layer (`DcpExchange`, `UlyssesExchange`, the
all-to-all helper, the construction-time agreement, the FlashInfer adapter).  Each test fails under a small
mutation that every earlier test let through; gloo on the CPU, the Triton interpreter, small shapes.

* A helper built on a subgroup moves its bytes over that subgroup: dropping `group` from the exchange call
  went unnoticed, since every multi-rank test used the default group.
* The agreement compares `lse_base` (DCP) and `H_kv`, `B` (Ulysses), and a rank refusing its arguments in a
  group of two tells its one peer (the refusal tests ran in groups of three).
* A call of no rows gives this rank's head block, `H/N` heads (tested only where N = 1, so `H/N == H`).
* `from_attention` names a row count that the group cannot split; the all-to-all refuses buffers sized for
  another number of peers (it would move the wrong chunks without a word).
* A group of one returns the attention layout `to_attention` packed, byte for byte.
* Construction refuses an `exchange_fn` that cannot be called, and an NCCL group with a CPU device.
* The FlashInfer adapter refuses a rank outside the workspace and a payload for another number of peers, and
  checks a new payload dtype after a cached call of the same shape.
"""

from __future__ import annotations

import os
import re
import sys
import types
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy
import pytest
import torch
import torch.distributed as dist
from conftest import expect_error, problems_of_gloo_ranks, requires_interpreter

import layoutgen

pytestmark = [requires_interpreter, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

WORLD = 3


def _same_bytes(got: torch.Tensor, want: torch.Tensor) -> bool:
    return (
        got.shape == want.shape
        and got.dtype == want.dtype
        and torch.equal(got.contiguous().view(-1).view(torch.uint8), want.contiguous().view(-1).view(torch.uint8))
    )


def _attempt(problems: list[str], label: str, action: Callable[[], None]) -> None:
    """Run one check; an unexpected exception is a problem, and the rank goes on to its next collective."""
    try:
        action()
    except Exception as error:
        problems.append(f"{label}: {type(error).__name__}: {error}")


# --- the exchanges over a subgroup, and the checks that need several ranks (3 gloo ranks) ------------------


def _dcp_over_pair(rank: int, pair: Any, problems: list[str]) -> None:
    """DcpExchange on the subgroup {0, 1}: the merged bits of pack -> reference exchange -> combine."""
    from layoutgen.dcp import reference

    module = layoutgen.load("pynccl_a2a")
    N, B, H, D = 2, 3, 4, 8
    exchange = layoutgen.DcpExchange(module, pair, B_max=4, H=H, D=D, dtype=torch.bfloat16, device="cpu")
    generator = torch.Generator().manual_seed(1010)
    outs = [torch.randn(B, H, D, generator=generator).to(torch.bfloat16) for _ in range(N)]
    lses = [torch.randn(B, H, generator=generator) * 3 for _ in range(N)]
    got, got_lse = exchange(outs[rank], lses[rank], return_lse=True)
    sends = [module.alloc(N, B, H, D, torch.bfloat16, "cpu") for _ in range(N)]
    for out, lse, send in zip(outs, lses, sends, strict=True):
        module.pack(out, lse, send)
    want, want_lse = module.combine(reference.exchange(sends)[rank], B, return_lse=True)
    if not (_same_bytes(got, want) and _same_bytes(got_lse, want_lse)):
        problems.append("DcpExchange over the subgroup: other bits than pack -> reference exchange -> combine")


def _ulysses_over_pair(rank: int, pair: Any, problems: list[str]) -> None:
    """UlyssesExchange on the subgroup {0, 1}: the reference's attention layout, and back to the shard."""
    from layoutgen.ulysses import reference
    from layoutgen.ulysses.distributed import UlyssesExchange
    from layoutgen.ulysses.layout import Shape, UlyssesBuffers, tensor_shape

    spec = layoutgen.load("ulysses_qkv_gqa").SPEC
    shape = Shape(N=2, S_local=2, H=4, H_kv=2, D=4, dtype=torch.bfloat16)
    exchange = UlyssesExchange("ulysses_qkv_gqa", pair, S_max=3, H=4, H_kv=2, D=4, dtype=torch.bfloat16, device="cpu")
    generator = torch.Generator().manual_seed(1011)
    shards = [{t.name: torch.randn(tensor_shape(spec, shape, t, "local"), generator=generator).to(torch.bfloat16)
               for t in spec.to_attention.tensors} for _ in range(2)]  # fmt: skip
    got = exchange.to_attention(*shards[rank].values())
    sends = [UlyssesBuffers.allocate(spec, "to_attention", shape) for _ in range(2)]
    for shard, send in zip(shards, sends, strict=True):
        reference.scatter(shard, send)
    want = reference.gather(reference.exchange(sends)[rank])
    if not all(_same_bytes(g, w) for g, w in zip(got, want.values(), strict=True)):
        problems.append("UlyssesExchange over the subgroup: to_attention differs from the reference")
    if not _same_bytes(exchange.from_attention(got[0]), shards[rank]["q"]):
        problems.append("UlyssesExchange over the subgroup: from_attention(to_attention(q)) is not q")


def _three_rank_worker(rank: int, problems: list[str]) -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    from layoutgen.ulysses.distributed import UlyssesExchange

    pair = dist.new_group([0, 1], timeout=timedelta(seconds=20))
    # A. Exchanges over the subgroup {0, 1}; rank 2 is not in it.
    if rank < 2:
        _attempt(problems, "DCP over the subgroup", lambda: _dcp_over_pair(rank, pair, problems))
        _attempt(problems, "Ulysses over the subgroup", lambda: _ulysses_over_pair(rank, pair, problems))
    dist.barrier()
    # B. Valid arguments that differ on rank 2: every rank names the field.
    odd = rank == 2
    dcp = {"B_max": 2, "H": 6, "D": 8, "device": "cpu"}
    disagreements: list[tuple[str, Callable[[], Any], str]] = [
        ("lse_base", lambda: layoutgen.DcpExchange("pynccl_a2a", **dcp, dtype=torch.float32,
                                                   lse_base="2" if odd else "e"), "lse_base"),
        ("dtype", lambda: layoutgen.DcpExchange("pynccl_a2a", **dcp,
                                                dtype=torch.float16 if odd else torch.bfloat16), "dtype"),
        ("H_kv", lambda: UlyssesExchange("ulysses_qkv_gqa", S_max=2, H=6, H_kv=6 if odd else 3, D=4,
                                         dtype=torch.float32, device="cpu"), "H_kv ("),
        ("B", lambda: UlyssesExchange("deepspeed_ulysses", S_max=2, H=3, B=2 if odd else 1, D=4,
                                      dtype=torch.float32, device="cpu"), "B ("),
        # NumPy sizes: the agreement once took the raw arguments, which it cannot read, and skipped them.
        ("NumPy D", lambda: UlyssesExchange("ulysses_qkv_gqa", S_max=numpy.int64(2), H=numpy.int64(6), H_kv=3,
                                            D=numpy.int64(8 if odd else 4), dtype=torch.float32, device="cpu"), "D ("),
    ]  # fmt: skip
    for label, build, word in disagreements:
        expect_error(problems, f"{label} differs on rank 2", build, ["differ between ranks", word], ValueError)
    # C. A call of no rows gives this rank's H/N heads; rows the group cannot split are named; buffers sized
    # for 6 peers are refused by a group of 3.
    exchange = layoutgen.DcpExchange("pynccl_a2a", **dcp, dtype=torch.bfloat16)
    merged, merged_lse = exchange(torch.randn(0, 6, 8).to(torch.bfloat16), torch.randn(0, 6), return_lse=True)
    if merged.shape != (0, 2, 8) or merged_lse.shape != (0, 2) or merged_lse.dtype != torch.float32:
        problems.append(f"no rows: merged {tuple(merged.shape)}, LSE {tuple(merged_lse.shape)} {merged_lse.dtype}")
    ulysses = UlyssesExchange("ulysses_qkv_gqa", S_max=2, H=6, H_kv=3, D=4, dtype=torch.float32, device="cpu")
    expect_error(problems, "from_attention of 4 rows over 3 ranks", lambda: ulysses.from_attention(torch.randn(4, 2, 4)),
            ["has 4 rows, not a multiple of the group's 3 ranks"], ValueError)  # fmt: skip
    module = layoutgen.load("pynccl_a2a")
    send, recv = (module.alloc(6, 2, 6, 8, torch.float32, "cpu") for _ in range(2))
    for bufs in (send, recv):
        for tensor in bufs.tensors.values():
            tensor.copy_(torch.randn(tensor.shape))
    expect_error(problems, "buffers for 6 peers in a group of 3", lambda: module.exchange(send, recv),
            ["the group has 3 ranks but buffer", "holds 6 peer chunks"], ValueError)  # fmt: skip
    # D. Rank 1 refuses its H in the group of two: rank 0 names it (last: were it not told, rank 0 would wait
    # out the subgroup's timeout).
    if rank < 2:

        def build() -> Any:
            H = 3 if rank else 4
            return layoutgen.DcpExchange("pynccl_a2a", pair, B_max=2, H=H, D=8, dtype=torch.float32, device="cpu")

        words = ["divisible"] if rank else ["DcpExchange was not built: rank 1 of the group refused", "H (3 on rank 1"]
        expect_error(problems, "a refusal in a group of two", build, words, ValueError)
    dist.barrier()


def test_exchanges_on_a_subgroup_and_the_agreement_across_three_ranks() -> None:
    assert problems_of_gloo_ranks(_three_rank_worker, WORLD, timeout_s=60) == {rank: [] for rank in range(WORLD)}


# --- one rank ------------------------------------------------------------------------------------------------


def test_a_group_of_one_returns_the_packed_attention_layout_byte_for_byte(one_rank_group: None) -> None:
    from layoutgen.ulysses import reference
    from layoutgen.ulysses.distributed import UlyssesExchange
    from layoutgen.ulysses.layout import Shape, UlyssesBuffers

    exchange = UlyssesExchange("ulysses_qkv_gqa", S_max=3, H=4, H_kv=2, D=4, dtype=torch.float32, device="cpu")
    generator = torch.Generator().manual_seed(1012)
    shard = {name: torch.randn(2, heads, 4, generator=generator) for name, heads in (("q", 4), ("k", 2), ("v", 2))}
    got = exchange.to_attention(*shard.values())
    send = UlyssesBuffers.allocate(exchange.spec, "to_attention", Shape(N=1, S_local=2, H=4, H_kv=2, D=4,
                                                                       dtype=torch.float32))  # fmt: skip
    reference.scatter(shard, send)
    want = reference.gather(send)
    assert all(_same_bytes(g, w) for g, w in zip(got, want.values(), strict=True))
    assert _same_bytes(exchange.from_attention(got[0]), shard["q"])


@pytest.mark.parametrize("wrong", [0, 1], ids=["max", "sum"])
def test_an_exchange_names_the_half_of_max_sum_of_the_wrong_shape(wrong: int, one_rank_group: None) -> None:
    exchange = layoutgen.DcpExchange("trtllm_helix_nccl", B_max=4, H=4, D=8, dtype=torch.float32, device="cpu")
    generator = torch.Generator().manual_seed(1013 + wrong)
    out = torch.randn(2, 4, 8, generator=generator)
    pair = [torch.randn(2, 4, generator=generator), 1 + torch.rand(2, 4, generator=generator)]
    exchange(out, max_sum=tuple(pair))  # a valid call first: its checks are cached per shape
    pair[wrong] = pair[wrong][:, :3]
    label = ["max_sum[0] (max)", "max_sum[1] (sum)"][wrong]
    with pytest.raises(ValueError, match=rf"^{re.escape(label)} must have shape \[B=2, H=4\]; got shape \(2, 3\)"):
        exchange(out, max_sum=tuple(pair))


def test_max_sum_into_an_lse_spec_with_lse_base_2_is_refused(one_rank_group: None) -> None:
    # pack turns (max, sum) into a natural-log LSE; combine would read it as base 2 and merge wrong weights.
    generator = torch.Generator().manual_seed(1014)
    out = torch.randn(2, 4, 8, generator=generator)
    max_sum = (torch.randn(2, 4, generator=generator), 1 + torch.rand(2, 4, generator=generator))
    arguments: dict[str, Any] = {"B_max": 2, "H": 4, "D": 8, "dtype": torch.float32, "device": "cpu", "lse_base": "2"}
    exchange = layoutgen.DcpExchange("pynccl_a2a", **arguments)
    with pytest.raises(ValueError, match=r"spec 'pynccl_a2a' keeps LSEs.*with lse_base '2' pass lse"):
        exchange(out, max_sum=max_sum)
    merged = layoutgen.DcpExchange("trtllm_helix_nccl", **arguments)(out, max_sum=max_sum)  # a max_sum spec
    assert merged.shape == (2, 4, 8) and bool(torch.isfinite(merged).all())


def test_an_exchange_names_out_when_out_and_lse_have_other_heads(one_rank_group: None) -> None:
    # An out and lse of H=5 heads for an exchange built for H=4: the error is about out (and the H it was built
    # for), not lse, whose heads agree with out.
    exchange = layoutgen.DcpExchange("pynccl_a2a", B_max=4, H=4, D=8, dtype=torch.bfloat16, device="cpu")
    generator = torch.Generator().manual_seed(1015)
    out, lse = torch.randn(2, 5, 8, generator=generator).to(torch.bfloat16), torch.randn(2, 5, generator=generator)
    with pytest.raises(
        ValueError, match=r"^out must have shape \[B, H=4, D=8\] or \[R, T, H=4, D=8\]; got shape \(2, 5, 8\)"
    ):
        exchange(out, lse)


@pytest.mark.parametrize("which", ["merged_out", "merged_lse_out"])
def test_an_exchange_names_a_merged_output_on_another_device(which: str, one_rank_group: None) -> None:
    exchange = layoutgen.DcpExchange("pynccl_a2a", B_max=4, H=4, D=8, dtype=torch.bfloat16, device="cpu")
    generator = torch.Generator().manual_seed(1016)
    out, lse = torch.randn(2, 4, 8, generator=generator).to(torch.bfloat16), torch.randn(2, 4, generator=generator)
    exchange(out, lse, merged_out=torch.empty(2, 4, 8, dtype=torch.bfloat16), merged_lse_out=torch.empty(2, 4))
    outputs = {"merged_out": torch.empty(2, 4, 8, dtype=torch.bfloat16), "merged_lse_out": torch.empty(2, 4)}
    outputs[which] = outputs[which].to("meta")
    error = TypeError if which == "merged_out" else ValueError
    with pytest.raises(error, match=rf"^{which} must be .* on cpu.*; got shape .* on meta"):
        exchange(out, lse, **outputs)


@pytest.mark.parametrize("case", ["wrong shape", "R and T swapped"])
def test_a_bad_merged_out_is_refused_after_calls_of_the_same_inputs_without_one(
    case: str, one_rank_group: None
) -> None:
    # The checks are cached per shape, stride, dtype and device of every input: merged_out is one of them.
    exchange = layoutgen.DcpExchange("pynccl_a2a", B_max=4, H=4, D=8, dtype=torch.bfloat16, device="cpu")
    generator = torch.Generator().manual_seed(1017)
    out = torch.randn(2, 2, 4, 8, generator=generator).to(torch.bfloat16)
    lse = torch.randn(2, 2, 4, generator=generator)
    exchange(out, lse)
    merged_out, message = {
        "wrong shape": (torch.empty(2, 2, 3, 8, dtype=torch.bfloat16), r"merged_out must have shape \[2, 2, 4, 8\]"),
        "R and T swapped": (torch.empty(2, 2, 4, 8, dtype=torch.bfloat16).transpose(0, 1), r"viewable as \[R\*T=4"),
    }[case]
    with pytest.raises(ValueError, match=message):
        exchange(out, lse, merged_out=merged_out)


@pytest.mark.parametrize("helper", ["DcpExchange", "UlyssesExchange"])
def test_an_exchange_fn_that_cannot_be_called_is_refused_at_construction(helper: str, one_rank_group: None) -> None:
    from layoutgen.ulysses.distributed import UlyssesExchange

    build = {
        "DcpExchange": lambda fn: layoutgen.DcpExchange(
            "pynccl_a2a", B_max=2, H=4, D=8, dtype=torch.float32, device="cpu", exchange_fn=fn
        ),
        "UlyssesExchange": lambda fn: UlyssesExchange(
            "ulysses_qkv_gqa", S_max=2, H=4, H_kv=2, D=4, dtype=torch.float32, device="cpu", exchange_fn=fn
        ),
    }[helper]
    with pytest.raises(TypeError, match=r"exchange_fn must be callable\(send_tensors, recv_tensors\), got str"):
        build("all_to_all")


def test_an_nccl_group_with_a_cpu_device_is_refused(one_rank_group: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from layoutgen.runtime.groups import join_group

    # What an NCCL group of two reports (the check itself needs no GPU).
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    with pytest.raises(ValueError, match=r"the group uses NCCL, which moves CUDA tensors only, but device is cpu"):
        join_group(None, torch.device("cpu"), "DcpExchange", "DCP")
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "cpu:gloo,cuda:nccl")
    assert join_group(None, torch.device("cpu"), "DcpExchange", "DCP") == (0, 2)


# --- the FlashInfer adapter ---------------------------------------------------------------------------------


@pytest.fixture
def flashinfer_adapter(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """`flashinfer_mnnvl_exchange` over a stand-in FlashInfer whose all-to-all returns its inputs doubled."""
    import layoutgen.dcp.distributed as distributed

    package, comm, module = (
        types.ModuleType(n) for n in ("flashinfer", "flashinfer.comm", "flashinfer.comm.dcp_alltoall")
    )
    module.decode_cp_a2a_alltoall = lambda payload, stats, *rest: (payload * 2, stats * 2)  # type: ignore[attr-defined]
    for name, value in (("flashinfer", package), ("flashinfer.comm", comm), ("flashinfer.comm.dcp_alltoall", module)):
        monkeypatch.setitem(sys.modules, name, value)
    monkeypatch.setattr(distributed, "_require_sm90", lambda device: None)
    return distributed.flashinfer_mnnvl_exchange


def _flashinfer_buffers(peers: int, dtype: torch.dtype, seed: int) -> tuple[dict[str, torch.Tensor], ...]:
    generator = torch.Generator().manual_seed(seed)
    send = {"payload": torch.randn(3, 2, peers, 8, generator=generator).to(dtype),
            "stats": torch.randn(3, 2, peers, 2, generator=generator)}  # fmt: skip
    return send, {name: torch.full_like(tensor, float("nan")) for name, tensor in send.items()}


@pytest.mark.parametrize("rank", [2, 3, -1])
def test_the_flashinfer_adapter_refuses_a_rank_outside_the_group(flashinfer_adapter: Any, rank: int) -> None:
    with pytest.raises(ValueError, match=rf"rank must be an int in \[0, world_size=2\), got {rank}"):
        flashinfer_adapter(torch.zeros(2, 8, dtype=torch.int64), rank, 2)


def test_the_flashinfer_adapter_refuses_a_payload_for_another_number_of_peers(flashinfer_adapter: Any) -> None:
    exchange = flashinfer_adapter(torch.zeros(2, 8, dtype=torch.int64), 0, 2)
    send, recv = _flashinfer_buffers(2, torch.bfloat16, seed=1)
    exchange(send, recv)
    assert _same_bytes(recv["payload"], send["payload"] * 2) and _same_bytes(recv["stats"], send["stats"] * 2)
    send, recv = _flashinfer_buffers(4, torch.bfloat16, seed=2)
    with pytest.raises(ValueError, match="payload has 4 peers on axis -2, the workspace 2"):
        exchange(send, recv)
    assert bool(recv["payload"].isnan().all())  # nothing was moved


def test_the_flashinfer_adapter_checks_the_dtype_of_a_payload_of_a_cached_shape(flashinfer_adapter: Any) -> None:
    exchange = flashinfer_adapter(torch.zeros(2, 8, dtype=torch.int64), 1, 2)
    exchange(*_flashinfer_buffers(2, torch.float16, seed=3))
    with pytest.raises(TypeError, match=r"moves fp16 or bf16 payloads; got torch\.float32"):
        exchange(*_flashinfer_buffers(2, torch.float32, seed=4))
