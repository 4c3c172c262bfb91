"""Eighth hardening pass, from an adversarial review of the DCP integration surface (the exchange helper, the
custom ops, torch.compile): each test is a defect a reviewer hit, fixed.  Kernels run under the Triton
interpreter; torch.compile cases use the eager backend.

* `DcpExchange(..., merged_out=, merged_lse_out=)` under torch.compile(fullgraph=True) failed inside Dynamo:
  the pair's overlap check read addresses a traced tensor does not have.
* An `exchange_fn` that assigned into `recv` (`recv[name] = received`) instead of writing into the view was
  not caught: the received bytes were lost (or combine blamed a buffer the caller never passed), and the
  replaced view stayed in the helper's cached views.
* Compiled `pack` with a list for `empty`, a float for a stats tensor, and compiled `combine` with a list for
  `out`, failed in the op schema's words instead of the eager message.
* `torch.ops.layoutgen.pack` / `combine` with one tensor on the meta device returned having written nothing
  (torch sends such a call to the fake kernel).
* Sparse and lazily negated tensors were read as memory (a negated `lse` with its sign lost).
* `DcpExchange` raised ValueError for an `empty` of the wrong type, where the module's pack raises TypeError.
* From a review of the fp8 wire: `diff` of an e4m3fn and an e5m2 spec said every element lands in place and
  not that the wire dtype differs; the quantisation reference raised torch's reshape errors for a block that
  does not divide the row.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import problems_of_gloo_ranks, requires_interpreter

import layoutgen
from layoutgen.dcp import reference

pytestmark = [requires_interpreter, pytest.mark.usefixtures("fresh_dynamo_and_plans")]

N, B_MAX, H, D = 2, 4, 4, 8
B = 3


def compiled(function: Any) -> Any:
    return torch.compile(function, fullgraph=True, backend="eager")


def inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, D, generator=generator), torch.randn(B, H, generator=generator)


@pytest.mark.usefixtures("one_rank_group")
def test_a_compiled_exchange_writes_both_merged_outputs() -> None:
    from layoutgen import DcpExchange

    exchange = DcpExchange("pynccl_a2a", None, B_max=B_MAX, H=H, D=D, dtype=torch.float32, device="cpu")
    out, lse = inputs()
    want, want_lse = exchange(out, lse, return_lse=True)  # eager; also lays out B = 3

    def step(out: torch.Tensor, lse: torch.Tensor, merged: torch.Tensor, merged_lse: torch.Tensor) -> Any:
        return exchange(out, lse, merged_out=merged, merged_lse_out=merged_lse)

    merged, merged_lse = torch.full_like(want, -7.0), torch.full_like(want_lse, -7.0)
    got, got_lse = compiled(step)(out, lse, merged, merged_lse)
    assert got is merged and got_lse is merged_lse
    assert torch.equal(merged, want) and torch.equal(merged_lse, want_lse)


def _assigning_transport_worker(rank: int, problems: list[str]) -> None:
    import torch.distributed as dist

    from layoutgen import DcpExchange

    def assigning(send: dict[str, torch.Tensor], recv: dict[str, torch.Tensor]) -> None:
        for name, tensor in send.items():
            received = torch.empty_like(tensor)
            dist.all_to_all_single(received.view(torch.uint8), tensor.view(torch.uint8))
            recv[name] = received  # replaces the view instead of writing into it

    exchange = DcpExchange("pynccl_a2a", None, B_max=B_MAX, H=H, D=D, dtype=torch.float32, device="cpu",
                           exchange_fn=assigning)  # fmt: skip
    views = exchange.batch_buffers(B)[1].tensors
    before = dict(views)
    try:
        exchange(*inputs(rank))
        problems.append("an exchange_fn that replaced a receive view was not refused")
    except ValueError as error:
        if "exchange_fn replaced recv_tensors['payload'] instead of writing into it" not in str(error):
            problems.append(f"wrong message: {error}")
    if any(views[name] is not view for name, view in before.items()):
        problems.append("the helper's cached receive views were replaced")


def test_an_exchange_fn_that_replaces_a_receive_view_is_refused() -> None:
    assert problems_of_gloo_ranks(_assigning_transport_worker, 2, timeout_s=30) == {0: [], 1: []}


@pytest.mark.parametrize(
    ("case", "kind", "message"),
    [
        ("empty list", TypeError, r"empty must be None or a torch.(bool tensor \[3\]|Tensor), got list"),
        ("sum float", TypeError, r"max_sum\[1\] \(sum\) must be a torch.Tensor (\[B, H\] )?of float32, got float"),
        ("combine out list", TypeError, r"out must be a torch.Tensor or None, got list"),
    ],
)
def test_compiled_calls_give_the_eager_message(case: str, kind: type[Exception], message: str) -> None:
    module = layoutgen.load("trtllm_helix_nccl")
    bufs = module.alloc(N, B_MAX, H, D, torch.float32, device="cpu")
    out, lse = inputs()
    module.pack(out, bufs=bufs, max_sum=(lse, lse.exp()))
    calls = {
        "empty list": lambda: module.pack(out, bufs=bufs, max_sum=(lse, lse.exp()), empty=[True, False, True]),
        "sum float": lambda: module.pack(out, bufs=bufs, max_sum=(lse, 1.0)),
        "combine out list": lambda: module.combine(bufs, B, out=[0.0]),
    }
    with pytest.raises(kind, match=message):
        calls[case]()  # eager
    with pytest.raises(Exception, match=message):  # Dynamo wraps what the traced code raised
        compiled(calls[case])()


def test_the_raw_ops_refuse_a_tensor_on_another_device() -> None:
    module = layoutgen.load("vllm_a2a")
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16, device="cpu")
    for tensor in bufs.tensors.values():
        tensor.view(torch.uint8).fill_(0xA5)
    out, lse = inputs()
    out = out.to(torch.bfloat16)
    mask = torch.ones(B, dtype=torch.bool, device="meta")
    buffers = list(bufs.tensors.values())
    with pytest.raises(ValueError, match=r"empty is on meta but the buffers are on cpu"):
        torch.ops.layoutgen.pack(out, lse, buffers, module.__name__, N, B_MAX, H, D, [], mask)
    merged = torch.full((B, H // N, D), 5.0, dtype=torch.bfloat16)
    meta_buffers = [tensor.to("meta") for tensor in buffers]
    with pytest.raises(ValueError, match=r"out is on cpu but the buffers are on meta"):
        torch.ops.layoutgen.combine(meta_buffers, merged, None, module.__name__, N, B_MAX, H, D, B, "e", [])
    assert all(bool((tensor.view(torch.uint8) == 0xA5).all()) for tensor in buffers)


def test_sparse_and_negated_inputs_are_refused_by_name() -> None:
    module = layoutgen.load("pynccl_a2a")
    bufs = module.alloc(N, B_MAX, H, D, torch.float32, device="cpu")
    out, lse = inputs()
    negated = torch.complex(torch.zeros(B, H), lse).conj().imag  # -lse, lazily
    assert negated.is_neg()
    with pytest.raises(TypeError, match=r"lse is a view with torch's lazy negation bit set .*\.resolve_neg\(\)"):
        module.pack(out, negated, bufs)
    with pytest.raises(TypeError, match=r"out must be a dense tensor, got a sparse_coo tensor .*\.to_dense\(\)"):
        module.pack(out.to_sparse(), lse, bufs)
    module.pack(out, negated.resolve_neg(), bufs)  # the fix the message gives
    expected = module.alloc(N, B_MAX, H, D, torch.float32, device="cpu")
    for tensor in (*bufs.tensors.values(), *expected.tensors.values()):
        tensor.view(torch.uint8).fill_(0xA5)
    module.pack(out, negated.resolve_neg(), bufs)
    reference.pack(out, -lse, expected)
    assert torch.equal(bufs.tensors["payload"].view(torch.uint8), expected.tensors["payload"].view(torch.uint8))


@pytest.mark.usefixtures("one_rank_group")
def test_the_exchange_raises_the_pack_s_exception_types_for_empty() -> None:
    from layoutgen import DcpExchange

    exchange = DcpExchange("trtllm_helix_nccl", None, B_max=B_MAX, H=H, D=D, dtype=torch.float32, device="cpu")
    out, lse = inputs()
    with pytest.raises(TypeError, match=r"empty must be None or a torch.bool tensor \[R=3\]"):
        exchange(out, lse, empty=torch.zeros(B, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"empty must be None or a torch.bool tensor \[R=3\]"):
        exchange(out, lse, empty=[False] * B)
    with pytest.raises(ValueError, match=r"empty must be None or a torch.bool tensor \[R=3\]"):
        exchange(out, lse, empty=torch.zeros(B + 1, dtype=torch.bool))


def test_diff_names_the_wire_dtype_when_every_element_lands_in_place() -> None:
    # An e4m3fn wire against an e5m2 one places every element alike, and every code byte means something else:
    # the summary said only "288 of 288 logical elements land at the same buffer and byte offsets".
    from layoutgen.show import diff_layouts, diff_summary
    from layoutgen.spec import bundled_specs

    e4m3 = bundled_specs()["pynccl_a2a_fp8"]
    e5m2 = type(e4m3).model_validate(
        {**e4m3.model_dump(mode="json"), "name": "pynccl_a2a_e5m2",
         "payload": {**e4m3.model_dump(mode="json")["payload"], "dtype": "float8_e5m2"}}
    )  # fmt: skip
    found = diff_layouts(e4m3, e5m2, {"N": 2, "B": 2, "H": 4, "D": 16}, "bfloat16")
    assert not found.identical and found.differing_fields == ("payload.dtype",)
    assert "Yet the specs differ in payload.dtype" in diff_summary(found)


def test_the_quantisation_reference_names_a_block_that_does_not_divide_the_row() -> None:
    from layoutgen.dcp import quant

    values = torch.randn(2, 24)
    with pytest.raises(ValueError, match=r"scale_block must be a positive divisor of D=24, got 16"):
        quant.quantise(values, 16, torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"scale_block must be a positive divisor of D=24, got 0"):
        quant.block_scales(values, 0, torch.float8_e4m3fn)
    codes, _ = quant.quantise(values[:, :16], 16, torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"16 codes per row must split into the 3 blocks of the scales"):
        quant.dequantise(codes, torch.ones(2, 3))
