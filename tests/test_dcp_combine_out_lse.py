"""combine's `out_lse=`: the merged LSE written into a caller's tensor instead of a new one (the custom op
took one already; the module's combine allocated it on every call: with return_lse=True a call took 5-7 µs
more host time on the H100's host).  Under the Triton interpreter on CPU tensors; torch.compile cases use the eager backend."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import CANARY, requires_interpreter

import layoutgen
from layoutgen.dcp import reference
from layoutgen.dcp.tolerances import lse_error

pytestmark = [requires_interpreter, pytest.mark.usefixtures("fresh_dynamo_and_plans")]

# B_max 5, H 6 (3 per peer at N 2: odd), D 12 (not a power of two).
N, B_MAX, H, D = 2, 5, 6, 12
SPECS = ["pynccl_a2a", "trtllm_helix_native_v2", "vllm_a2a_fp8"]


def received(module: Any, B: int) -> Any:
    """A receive buffer of B live rows, as N ranks' packs and the exchange leave it (random partials)."""
    generator = torch.Generator().manual_seed(B)
    send = [module.alloc(N, B_MAX, H, D, torch.bfloat16, device="cpu") for _ in range(N)]
    for bufs in send:
        out = torch.randn(B, H, D, generator=generator).to(torch.bfloat16)
        module.pack(out, torch.randn(B, H, generator=generator) * 3, bufs)
    return reference.exchange(send)[0]


def lse_with_margins(B: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A contiguous [B, H/N] float32 view inside a larger tensor of canary bytes: what lies around it must stay."""
    whole = torch.empty(B + 2, H // N, dtype=torch.float32)
    whole.view(torch.uint8).fill_(CANARY)
    return whole, whole[1 : B + 1]


@pytest.mark.parametrize("given_out", [False, True], ids=["new out", "out="])
@pytest.mark.parametrize("spec_name", SPECS)
def test_out_lse_gets_the_bits_combine_would_return(spec_name: str, given_out: bool) -> None:
    module = layoutgen.load(spec_name)
    B = 3
    recv = received(module, B)
    want, want_lse = module.combine(recv, B, return_lse=True)
    whole, out_lse = lse_with_margins(B)
    margins = torch.cat([whole[:1], whole[B + 1 :]]).view(torch.uint8).clone()
    out = torch.empty(B, H // N, D, dtype=torch.bfloat16) if given_out else None
    for _ in range(2):  # planned, then the cached plan
        got, got_lse = module.combine(recv, B, out=out, out_lse=out_lse)  # out_lse implies return_lse
        assert got_lse is out_lse and (out is None or got is out)
        assert torch.equal(got_lse.view(torch.uint8), want_lse.view(torch.uint8))
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
        assert torch.equal(torch.cat([whole[:1], whole[B + 1 :]]).view(torch.uint8), margins), "wrote past out_lse"
    _, reference_lse = reference.combine(recv, B, "e", return_lse=True)
    assert lse_error(got_lse, reference_lse) <= 1.0


def test_out_lse_with_return_lse_true_and_with_no_rows() -> None:
    module = layoutgen.load("pynccl_a2a")
    recv = received(module, 2)
    out_lse = torch.empty(2, H // N)
    assert module.combine(recv, 2, return_lse=True, out_lse=out_lse)[1] is out_lse
    nothing = torch.empty(0, H // N)
    got, got_lse = module.combine(recv, 0, out_lse=nothing)
    assert got.shape == (0, H // N, D) and got_lse is nothing


@pytest.mark.parametrize(
    ("make", "given"),
    [
        (lambda: torch.empty(3, H // N + 1), "shape (3, 4)"),
        (lambda: torch.empty(3, H // N, dtype=torch.float64), "torch.float64"),
        (lambda: torch.empty(H // N, 3).t(), "strides (1, 3)"),
        (lambda: [[0.0] * (H // N)] * 3, "got list"),
    ],
    ids=["shape", "dtype", "not contiguous", "not a tensor"],
)
def test_a_wrong_out_lse_is_refused_and_nothing_is_written(make: Any, given: str) -> None:
    module = layoutgen.load("pynccl_a2a")
    recv = received(module, 3)
    out = torch.full((3, H // N, D), 7.0, dtype=torch.bfloat16)
    for _ in range(2):  # also once the plan is cached
        with pytest.raises(ValueError, match=r"out_lse must be a contiguous float32 tensor of shape \[3, 3\]") as error:
            module.combine(recv, 3, out=out, out_lse=make())
        assert given in str(error.value)
        assert bool((out == 7.0).all()), "a refused call wrote out"
        module.combine(recv, 3, out=torch.empty_like(out), return_lse=True)  # a valid call in between


def test_an_out_lse_over_out_or_the_buffers_is_refused() -> None:
    module = layoutgen.load("pynccl_a2a")
    recv = received(module, 3)
    before = recv.tensors["payload"].clone()
    out = torch.empty(3, H // N, D, dtype=torch.bfloat16)
    words = 3 * (H // N)
    over_out = out.view(-1)[: 2 * words].view(torch.float32).view(3, H // N)
    over_payload = recv.tensors["payload"].view(-1)[: 2 * words].view(torch.float32).view(3, H // N)
    for out_lse in (over_out, over_payload, over_payload):  # the last once the plan holds its check
        with pytest.raises(ValueError, match="out_lse must not share memory with out or the buffers"):
            module.combine(recv, 3, out=out, out_lse=out_lse)
    assert torch.equal(before.view(torch.uint8), recv.tensors["payload"].view(torch.uint8))


def test_an_invalid_return_lse_is_still_refused_beside_out_lse() -> None:
    module = layoutgen.load("pynccl_a2a")
    recv = received(module, 3)
    with pytest.raises(TypeError, match="return_lse must be a bool; got int"):
        module.combine(recv, 3, return_lse=1, out_lse=torch.empty(3, H // N))


def test_out_lse_in_grad_mode_is_refused_and_its_version_moves() -> None:
    module = layoutgen.load("pynccl_a2a")
    recv = received(module, 3)
    with pytest.raises(RuntimeError, match="combine: out_lse requires grad"):
        module.combine(recv, 3, out_lse=torch.empty(3, H // N, requires_grad=True))
    out_lse = torch.empty(3, H // N)
    before = out_lse._version
    module.combine(recv, 3, out_lse=out_lse)
    assert out_lse._version > before, "autograd could use a saved out_lse the kernel overwrote"


def test_a_compiled_combine_into_out_lse_matches_eager() -> None:
    module = layoutgen.load("trtllm_helix_native_v2")
    recv = received(module, 3)
    want, want_lse = module.combine(recv, 3, return_lse=True)

    def step(out_lse: torch.Tensor) -> torch.Tensor:
        merged, _ = module.combine(recv, 3, out_lse=out_lse)
        return merged

    out_lse = torch.empty(3, H // N)
    got = torch.compile(step, fullgraph=True, backend="eager")(out_lse)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(out_lse.view(torch.uint8), want_lse.view(torch.uint8))


# --- DcpExchange's merged_lse_out ------------------------------------------------------------------------


@pytest.mark.parametrize("lead", [(4,), (2, 2), (0,)], ids=["[B, H, D]", "[R, T, H, D]", "no rows"])
def test_an_exchange_writes_its_lse_into_merged_lse_out(lead: tuple[int, ...], one_rank_group: None) -> None:
    exchange = layoutgen.DcpExchange("vllm_a2a", None, B_max=B_MAX, H=H, D=D, dtype=torch.bfloat16, device="cpu")
    generator = torch.Generator().manual_seed(len(lead))
    out = torch.randn(*lead, H, D, generator=generator).to(torch.bfloat16)
    lse = torch.randn(*lead, H, generator=generator) * 3
    want, want_lse = exchange(out, lse, return_lse=True)
    merged_lse_out = torch.full((*lead, H), float("nan"))  # one rank: H/N = H
    merged, merged_lse = exchange(out, lse, merged_lse_out=merged_lse_out)  # implies return_lse
    assert merged_lse is merged_lse_out
    assert torch.equal(merged.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(merged_lse_out.view(torch.uint8), want_lse.view(torch.uint8))


def test_an_exchange_refuses_a_merged_lse_out_that_requires_grad(one_rank_group: None) -> None:
    exchange = layoutgen.DcpExchange("vllm_a2a", None, B_max=B_MAX, H=H, D=D, dtype=torch.bfloat16, device="cpu")
    out, lse = torch.randn(2, H, D).to(torch.bfloat16), torch.randn(2, H)
    with pytest.raises(RuntimeError, match="DcpExchange: merged_lse_out requires grad"):
        exchange(out, lse, merged_lse_out=torch.empty(2, H, requires_grad=True))
