"""Sixth hardening pass, from an adversarial review of the runtime API: each test is a defect a reviewer hit,
fixed.  Kernel cases run under the Triton interpreter; torch.compile cases use the eager backend; the
agreement cases spawn gloo ranks on the CPU.

* DCP `combine(bufs, B, out=x)` wrote `x` behind autograd's back: its version counter is bumped now (a graph
  that saved `x` fails in backward), and an `out` that requires grad is refused in grad mode.
* `exchange(send, recv, group)` with a group this rank is not in, or with a non-group, now says so.
* A rank whose own checks refuse its `DcpExchange` / `UlyssesExchange` arguments still takes part in the
  construction-time agreement, so every other rank raises naming it instead of waiting for the timeout.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from conftest import expect_error, problems_of_gloo_ranks, requires_interpreter

import layoutgen

pytestmark = [
    requires_interpreter,
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.usefixtures("fresh_dynamo_and_plans"),
]

N, B_MAX, H, D = 2, 4, 8, 16
B = 3


def packed_buffers() -> tuple[Any, Any]:
    module = layoutgen.load("pynccl_a2a")
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16, device="cpu")
    generator = torch.Generator().manual_seed(0)
    out = torch.randn(B, H, D, generator=generator).to(torch.bfloat16)
    module.pack(out, torch.randn(B, H, generator=generator), bufs)
    return module, bufs


def compiled(function: Any) -> Any:
    return torch.compile(function, fullgraph=True, backend="eager")


# --- A. combine(out=...) and autograd ----------------------------------------------------------------------


def test_combine_into_out_bumps_its_version_so_a_graph_that_saved_it_fails_in_backward() -> None:
    module, bufs = packed_buffers()
    base = torch.full((B + 1, H // N, D), 3.0, dtype=torch.bfloat16)
    x = base[:B]  # a view: autograd's counter is its base's
    for call in range(2):  # planning, then the cached path
        weight = torch.ones(B, H // N, D, dtype=torch.bfloat16, requires_grad=True)
        loss = (weight * x).sum()  # saves x for the gradient of weight
        before = base._version
        module.combine(bufs, B, out=x)
        assert base._version > before, f"call {call}: combine wrote out without bumping its version counter"
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()
    fresh_out, _ = module.combine(bufs, B)  # combine's own result: nothing to bump, nothing refused
    assert torch.equal(fresh_out, x)


def test_combine_into_out_under_torch_compile_bumps_its_version() -> None:
    module, bufs = packed_buffers()
    x = torch.empty(B, H // N, D, dtype=torch.bfloat16)
    before = x._version
    compiled(lambda out: module.combine(bufs, B, out=out))(x)
    assert x._version > before


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_combine_refuses_an_out_that_requires_grad_in_grad_mode(mode: str) -> None:
    module, bufs = packed_buffers()
    leaf = torch.zeros(B, H // N, D, dtype=torch.bfloat16, requires_grad=True)

    def call(out: torch.Tensor) -> Any:
        return module.combine(bufs, B, out=out)

    function = call if mode == "eager" else compiled(call)
    for out in (leaf, leaf * 1):  # a leaf and a result of the graph
        with pytest.raises(
            RuntimeError if mode == "eager" else Exception,
            match=r"combine: out requires grad.*out.detach\(\).*torch.no_grad\(\) or torch.inference_mode\(\)",
        ):
            function(out)
    assert not leaf.detach().any(), "the refused out was written"
    with torch.no_grad():
        function(leaf)  # inference: accepted
    assert leaf.detach().any()
    with torch.inference_mode():
        function(torch.empty(B, H // N, D, dtype=torch.bfloat16))  # an inference tensor has no counter to bump


def test_an_exchange_refuses_a_merged_out_that_requires_grad(one_rank_group: None) -> None:
    exchange = layoutgen.DcpExchange("pynccl_a2a", None, B_max=B_MAX, H=H, D=D, dtype=torch.bfloat16, device="cpu")
    out, lse = torch.randn(B, H, D).to(torch.bfloat16), torch.randn(B, H)
    merged = torch.zeros(B, H, D, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"DcpExchange: merged_out requires grad.*merged_out.detach\(\)"):
        exchange(out, lse, merged_out=merged)
    target = merged.detach()
    before = target._version
    exchange(out, lse, merged_out=target)
    assert target._version > before


# --- B. exchange's group -----------------------------------------------------------------------------------


def exchange_buffers() -> tuple[Any, Any, Any]:
    module = layoutgen.load("ulysses_qkv_gqa")
    send, recv = (module.alloc(1, 2, 4, 4, torch.float32, "cpu", H_kv=2) for _ in range(2))
    return module, send, recv


def test_exchange_names_a_group_that_is_not_a_process_group(one_rank_group: None) -> None:
    module, send, recv = exchange_buffers()
    for group in ("sp", 3):
        with pytest.raises(
            TypeError,
            match=rf"group must be a torch.distributed ProcessGroup .* or None .*; exchange got {type(group).__name__}",
        ):
            module.exchange(send, recv, group)
    module.exchange(send, recv, dist.new_group([0]))  # a real group still works


def test_exchange_names_a_group_this_rank_is_not_a_member_of(one_rank_group: None) -> None:
    module, send, recv = exchange_buffers()
    # What torch.distributed.new_group hands a process outside the new group.
    with pytest.raises(
        ValueError, match=r"this process \(global rank 0\) is not a member of the group passed to exchange"
    ):
        module.exchange(send, recv, dist.GroupMember.NON_GROUP_MEMBER)


def test_exchange_without_a_process_group_says_to_initialise_one() -> None:
    module, send, recv = exchange_buffers()
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match=r"call torch.distributed.init_process_group .* before calling exchange"):
        module.exchange(send, recv)


# --- C. agreement when a rank refuses its own arguments (gloo, 3 ranks) ------------------------------------

WORLD = 3


def _dcp(H: int = 6, **changes: Any) -> Callable[[], Any]:
    arguments: dict[str, Any] = {"B_max": 2, "H": H, "D": 8, "dtype": torch.float32, "device": "cpu"} | changes
    return lambda: layoutgen.DcpExchange("pynccl_a2a", **arguments)


def _ulysses(H: int = 6, **changes: Any) -> Callable[[], Any]:
    from layoutgen.ulysses.distributed import UlyssesExchange

    arguments: dict[str, Any] = {"S_max": 2, "H": H, "H_kv": 3, "D": 4, "dtype": torch.float32, "device": "cpu"}
    return lambda: UlyssesExchange("ulysses_qkv_gqa", **(arguments | changes))


def _agreement_worker(rank: int, problems: list[str]) -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    # One rank's H is refused by its own check (H % N, after joining the group): the others name it, and H.
    for kind, build in (("DcpExchange", _dcp), ("UlyssesExchange", _ulysses)):
        if rank == 1:
            expect_error(problems, f"{kind} H=5", build(H=5), ["divisible"])
        else:
            words = [
                f"{kind} was not built: rank 1 of the group refused its arguments",
                f"H (5 on rank 1, 6 on rank {rank})",
            ]
            expect_error(problems, f"{kind} beside H=5", build(), words)
    # Refused before joining the group (dtype), and by two ranks at once (B_max on rank 1, dtype on rank 2).
    if rank == 2:
        expect_error(problems, "dtype int32", _dcp(dtype=torch.int32), ["dtype must be one of"])
    else:
        expect_error(problems, "beside dtype int32", _dcp(), ["rank 2 of the group refused", "differs", "dtype"])
    changes: dict[int, dict[str, Any]] = {1: {"B_max": 0}, 2: {"dtype": torch.int32}}
    refusals = {0: ["ranks 1, 2 of the group refused their arguments"], 1: ["B_max"], 2: ["dtype must be one of"]}
    expect_error(problems, "two ranks refused", _dcp(**changes.get(rank, {})), refusals[rank])
    # Valid on every rank but different (already refused on every rank): the values are named.
    expect_error(problems, "D differs", _ulysses(D=4 + 4 * (rank == 2)), ["disagrees with rank", "D ("])
    # A valid exchange afterwards: the collectives are still in step.
    exchange = _dcp()()
    merged = exchange(torch.ones(2, 6, 8), torch.zeros(2, 6))
    if not torch.allclose(merged, torch.ones(2, 2, 8)):
        problems.append(f"the exchange after the refusals merged {merged.flatten()[:4].tolist()}")
    # B. exchange over a subgroup this rank is not in.
    module = layoutgen.load("pynccl_a2a")
    send, recv = (module.alloc(2, 2, 4, 8, torch.float32, "cpu") for _ in range(2))
    subgroup = dist.new_group([0, 1])
    if rank == 2:
        words = ["this process (global rank 2) is not a member of the group passed to exchange"]
        expect_error(problems, "exchange outside the subgroup", lambda: module.exchange(send, recv, subgroup), words)
    else:
        module.exchange(send, recv, subgroup)
    dist.barrier()


def test_every_rank_raises_when_one_refuses_its_exchange_arguments() -> None:
    assert problems_of_gloo_ranks(_agreement_worker, WORLD, timeout_s=15) == {rank: [] for rank in range(WORLD)}
