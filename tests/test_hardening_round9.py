"""Ninth hardening pass, from a mutation audit of the run-time validation and dispatch layer (61 single
mutations of the argument checks, plan keys, config resolution and the direct launch; 13 survived every test).

* A defect: a lazily negated view (`x.conj().imag`, `torch._neg_view(x)`) has a plain tensor's shape, strides,
  dtype and device, so once a plain tensor of that geometry had been planned, the negated one hit the plan
  and skipped the check that refuses it: pack read the bytes under the view (the sign lost without a word)
  and combine wrote its merge where the caller then read it negated.  The negation bit is now part of every
  plan key (pack, the masked / (max, sum) pack, combine's `out`, Ulysses' sources and outputs), and
  `combine(out_lse=)`, which never checked it, refuses it.
* Test gaps the audit found, now covered: buffers replaced by a tensor of another dtype, a non-contiguous
  one, one on another device, or a set with a name missing or added; a cached masked plan met with a mask
  of another dtype; `needs_int64` at exactly 2**31; the expected-entry cache per kernel source;
  combine's plan per LSE base; the direct launch's alignment key for residues that swap places.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch
from conftest import fill_bytes, generated_module, requires_interpreter

from layoutgen.dcp import FAMILY as DCP_FAMILY
from layoutgen.dcp import reference
from layoutgen.runtime import configs
from layoutgen.runtime.tensors import INT32_LIMIT, needs_int64

pytestmark = [requires_interpreter, pytest.mark.usefixtures("fresh_dynamo_and_plans")]

N, B_MAX, H, D = 2, 5, 6, 24  # heads per peer 3 (odd), D not a power of two
B = 3
NEGATION = r"is a view with torch's lazy negation bit set .*\.resolve_neg\(\)"


@pytest.fixture
def module() -> ModuleType:
    return generated_module("vllm_a2a")


def inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    out = torch.randn(B, H, D, generator=generator).to(torch.bfloat16)
    return out, torch.randn(B, H, generator=generator) * 3


def snapshot(bufs: Any) -> list[bytes]:
    return [bytes(tensor.view(torch.uint8).flatten().numpy()) for tensor in bufs.tensors.values()]


PACK_CALLS: dict[str, Callable[[ModuleType, torch.Tensor, torch.Tensor, Any, bool], None]] = {
    "lse": lambda m, out, lse, bufs, negate: m.pack(out, torch._neg_view(lse) if negate else lse, bufs),
    "out": lambda m, out, lse, bufs, negate: m.pack(torch._neg_view(out) if negate else out, lse, bufs),
    "lse, masked": lambda m, out, lse, bufs, negate: m.pack(
        out, torch._neg_view(lse) if negate else lse, bufs, empty=torch.tensor([False, True, False])
    ),
    "max_sum[1]": lambda m, out, lse, bufs, negate: m.pack(
        out, None, bufs, max_sum=(lse, torch._neg_view(lse.exp()) if negate else lse.exp())
    ),
}


@pytest.mark.parametrize("call", PACK_CALLS, ids=list(PACK_CALLS))
def test_a_negated_pack_input_is_refused_after_a_plain_one_of_the_same_geometry(module: ModuleType, call: str) -> None:
    out, lse = inputs()
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16)
    PACK_CALLS[call](module, out, lse, bufs, False)  # plans this geometry
    fill_bytes(bufs)
    before = snapshot(bufs)
    label = call.split(",")[0].replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(TypeError, match=rf"{label} {NEGATION}"):
        PACK_CALLS[call](module, out, lse, bufs, True)
    assert snapshot(bufs) == before, "a refused pack wrote the buffers"


def test_a_negated_combine_output_is_refused_after_a_plain_one(module: ModuleType) -> None:
    out, lse = inputs()
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16)
    module.pack(out, lse, bufs)
    merged = torch.empty(B, H // N, D, dtype=torch.bfloat16)
    module.combine(bufs, B, out=merged)
    target = torch.full_like(merged, 7.0)
    with pytest.raises(TypeError, match=rf"out {NEGATION}"):
        module.combine(bufs, B, out=torch._neg_view(target))
    assert bool((target == 7.0).all()), "a refused combine wrote its output"
    merged_lse = torch.full((B, H // N), 7.0)
    with pytest.raises(TypeError, match=rf"out_lse {NEGATION}"):
        module.combine(bufs, B, out=merged, out_lse=torch._neg_view(merged_lse))
    assert bool((merged_lse == 7.0).all())
    _, got_lse = module.combine(bufs, B, out=merged, out_lse=merged_lse)  # the plain tensor still works
    assert got_lse is merged_lse
    want_out, want_lse = reference.combine(bufs, B, "e", True)
    torch.testing.assert_close(merged_lse.double(), want_lse, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(merged.double(), want_out.to(torch.bfloat16).double(), rtol=0, atol=2e-2)


def _non_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor of `tensor`'s shape and dtype whose strides run backwards (dense, not contiguous)."""
    order = tuple(reversed(range(tensor.dim())))
    return torch.zeros(tuple(tensor.shape[i] for i in order), dtype=tensor.dtype).permute(order)


REPLACED_BUFFERS: dict[str, tuple[Callable[[dict[str, torch.Tensor]], None], str]] = {
    "stats dtype": (
        lambda t: t.__setitem__("stats", t["stats"].to(torch.float16)),
        r"bufs.tensors['stats'] must be a contiguous torch.float32 tensor of shape (2, 5, 3, 1) on cpu; got shape "
        r"(2, 5, 3, 1), strides (15, 3, 1, 1), torch.float16 on cpu",
    ),
    "payload strides": (
        lambda t: t.__setitem__("payload", _non_contiguous(t["payload"])),
        r"bufs.tensors['payload'] must be a contiguous torch.bfloat16 tensor of shape (2, 5, 3, 24) on cpu",
    ),
    "stats device": (
        lambda t: t.__setitem__("stats", t["stats"].to("meta")),
        r"bufs.tensors['stats'] must be a contiguous torch.float32 tensor of shape (2, 5, 3, 1) on cpu; got shape "
        r"(2, 5, 3, 1), strides (15, 3, 1, 1), torch.float32 on meta",
    ),
    "a name added": (
        lambda t: t.__setitem__("scales", torch.zeros(2)),
        r"bufs.tensors must hold ['payload', 'stats'], got ['payload', 'scales', 'stats']",
    ),
    "a name missing": (lambda t: t.pop("stats"), r"bufs.tensors must hold ['payload', 'stats'], got ['payload']"),
}


@pytest.mark.parametrize("case", REPLACED_BUFFERS, ids=list(REPLACED_BUFFERS))
def test_replaced_buffer_tensors_are_refused_by_name(module: ModuleType, case: str) -> None:
    replace, message = REPLACED_BUFFERS[case]
    out, lse = inputs()
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16)
    replace(bufs.tensors)
    with pytest.raises(ValueError, match=re.escape(message)):
        module.pack(out, lse, bufs)
    with pytest.raises(ValueError, match=re.escape(message)):
        module.combine(bufs, B)


def test_a_cached_masked_plan_refuses_a_mask_of_another_dtype(module: ModuleType) -> None:
    out, lse = inputs()
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16)
    empty = torch.tensor([False, True, False])
    module.pack(out, lse, bufs, empty=empty)
    fill_bytes(bufs)
    before = snapshot(bufs)
    with pytest.raises(TypeError, match=r"empty must be a torch.bool tensor \[R=3\] .*torch.uint8"):
        module.pack(out, lse, bufs, empty=empty.to(torch.uint8))
    assert snapshot(bufs) == before


def test_needs_int64_from_exactly_the_int32_limit() -> None:
    assert INT32_LIMIT == 2**31
    assert needs_int64(torch.empty(2**31, device="meta"))
    assert not needs_int64(torch.empty(2**31 - 1, device="meta"))
    reach = torch.empty(1, device="meta").as_strided((2,), (2**31,))  # offset 2**31 with two elements
    assert needs_int64(reach)
    assert not needs_int64(torch.empty(1, device="meta").as_strided((2,), (2**31 - 1,)))


def test_the_expected_entry_follows_the_kernel_source() -> None:
    kernel = DCP_FAMILY.kernel("pack")
    first = configs.expected_for(kernel, "s" * 64, "a" * 64)
    second = configs.expected_for(kernel, "s" * 64, "b" * 64)
    assert (first.source_hash, second.source_hash) == ("a" * 64, "b" * 64)
    assert configs.expected_for(DCP_FAMILY.kernel("combine"), "t" * 64, "a" * 64).spec_hash == "t" * 64


@pytest.mark.parametrize("spec", ["vllm_a2a", "pynccl_a2a"])
def test_combine_plans_per_lse_base(spec: str) -> None:
    module = generated_module(spec)
    out, lse = inputs(1)
    bufs = fill_bytes(module.alloc(N, B_MAX, H, D, torch.bfloat16))
    module.pack(out, lse, bufs)
    for lse_base in ("e", "2", "e"):  # each base after the other's plan exists
        got, got_lse = module.combine(bufs, B, lse_base=lse_base, return_lse=True)
        want, want_lse = reference.combine(bufs, B, lse_base, True)
        torch.testing.assert_close(got_lse.double(), want_lse, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.double(), want.to(torch.bfloat16).double(), rtol=0, atol=2e-2)


def test_a_repeated_eager_call_hits_its_plan(module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    # The hot paths inline their plan keys: one that drifted from the key a plan is stored under would still give
    # the right bytes, but validate and plan again on every call.
    from layoutgen.dcp import combine_plan, pack_plan

    planned: list[str] = []

    def counted(kind: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            planned.append(kind)
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(pack_plan, "plan_pack", counted("pack", pack_plan.plan_pack))
    monkeypatch.setattr(combine_plan, "plan_combine", counted("combine", combine_plan.plan_combine))
    out, lse = inputs()
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16)
    merged, merged_lse = torch.empty(B, H // N, D, dtype=torch.bfloat16), torch.empty(B, H // N)
    calls: list[Callable[[], Any]] = [
        lambda: module.pack(out, lse, bufs),
        lambda: module.pack(out, lse, bufs, empty=torch.tensor([False, True, False])),
        lambda: module.pack(out, None, bufs, max_sum=(lse, lse.exp())),
        lambda: module.combine(bufs, B),
        lambda: module.combine(bufs, B, lse_base="2", return_lse=True),
        lambda: module.combine(bufs, B, out=merged, scale=0.5),
        lambda: module.combine(bufs, B, out=merged, out_lse=merged_lse),
    ]
    for call in calls:
        before = len(planned)
        for _ in range(3):
            call()
        assert len(planned) - before == 1, f"{len(planned) - before} plans for three identical calls"
