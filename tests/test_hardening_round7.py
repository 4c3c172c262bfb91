"""Seventh hardening pass, from an adversarial review of the DCP runtime API: each test is a defect a reviewer
hit, fixed.  Kernel cases run under the Triton interpreter; torch.compile cases use the eager backend.

* `combine(out=view)` whose last head (or dim) lies 2**31 elements or more past its first: the kernels
  compute those offsets in 32 bits, so the rows wrapped and landed gigabytes before `out`, and `out` kept its
  old values.  Such an `out` was refused first; now the kernel writes a contiguous stage copied into it.
* Under torch.compile, pack unpacked `max_sum` and read `bufs` before any check: a stacked [2, B, H] tensor
  passed for a pair, and a 3-tuple or `bufs=None` failed in Dynamo's words.
* `scale=10**400` raised a bare OverflowError instead of the documented ValueError.
* The pack op on tensors that are not alloc()'s own (functionalised copies) blamed the buffers for a wrong
  `out` dtype and asked for a payload of the wrong dtype.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import requires_interpreter

import layoutgen
from layoutgen.dcp import checks

pytestmark = [requires_interpreter, pytest.mark.usefixtures("fresh_dynamo_and_plans")]

N, B_MAX, H, D = 2, 4, 8, 16
B = 3
CANARY = -7.0


def packed(spec_name: str = "pynccl_a2a") -> tuple[Any, Any]:
    module = layoutgen.load(spec_name)
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16, device="cpu")
    generator = torch.Generator().manual_seed(7)
    out = torch.randn(B, H, D, generator=generator).to(torch.bfloat16)
    module.pack(out, torch.randn(B, H, generator=generator), bufs)
    return module, bufs


# --- combine's 32-bit head and dim offsets -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "strides", "wide"),
    [
        ((1, 3, 16), (16, 2**30 + 2**20, 1), "head"),  # 2 x stride passes 2**31; the stride itself does not
        ((2, 2, 16), (16, 2**30, 1), None),  # the last head at 2**30
        ((1, 3, 16), (16, 2**31, 1), None),  # a stride past 32 bits is a 64-bit kernel argument
        ((1, 2, 4), (1, 8, 2**30), "dim"),  # 3 x 2**30
    ],
)
def test_combine_out_offsets_that_pass_32_bits_are_found(
    shape: tuple[int, ...], strides: tuple[int, ...], wide: str | None
) -> None:
    out = torch.empty_strided(shape, strides, dtype=torch.bfloat16, device="meta")  # no storage behind it
    assert checks.wide_out_offsets(out) is (wide is not None)


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("axis", ["head", "dim"])
def test_combine_writes_such_an_out_through_a_stage(
    axis: str, return_lse: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real limit needs an 8 GiB view; a limit of 128 elements puts a small view past it.
    monkeypatch.setattr(checks, "_INT32_LIMIT", 128)
    module, bufs = packed()
    heads = H // N
    if axis == "head":  # heads outermost: head stride (B + 1) * D = 64, the last head at 192
        storage = torch.full((heads, B + 1, D), CANARY, dtype=torch.bfloat16)
        out = storage[:, :B].transpose(0, 1)
    else:  # dim outermost: dim stride (B + 1) * heads = 16, the last dim at 240
        storage = torch.full((D, B + 1, heads), CANARY, dtype=torch.bfloat16)
        out = storage[:, :B].permute(1, 2, 0)
    fresh, fresh_lse = module.combine(bufs, B, return_lse=return_lse)
    for _ in range(2):  # planned, then from the plan
        out.fill_(CANARY)
        written, lse = module.combine(bufs, B, out=out, return_lse=return_lse)
        assert written is out
        assert torch.equal(out.contiguous().view(torch.uint8), fresh.view(torch.uint8)), "the staged out differs"
        assert (lse is None) is (not return_lse) and (lse is None or torch.equal(lse, fresh_lse))
    assert module._dispatch.combine_plan(bufs, B, "e", out, return_lse, None).staged
    spare_row = storage[:, B]  # the row of the storage outside the view
    assert bool((spare_row == CANARY).all()), "bytes outside out were written"
    contiguous = torch.full((B, heads, D), CANARY, dtype=torch.bfloat16)  # last head at 48, last dim at 15
    module.combine(bufs, B, out=contiguous)
    assert not module._dispatch.combine_plan(bufs, B, "e", contiguous, False, None).staged
    assert torch.equal(contiguous.view(torch.uint8), fresh.view(torch.uint8)), "combine into out differs from its own"


# --- pack under torch.compile checks what it unpacks ---------------------------------------------------------


def compiled(function: Any) -> Any:
    return torch.compile(function, fullgraph=True, backend="eager")


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("three", r"max_sum must be a \(max, sum\) pair of float32 tensors .*got tuple"),
        ("stacked", r"max_sum must be a \(max, sum\) pair of float32 tensors .*got Tensor"),
        ("no_bufs", r"bufs must be the buffers object returned by alloc\(\), got NoneType"),
    ],
)
def test_compiled_pack_refuses_what_eager_pack_refuses(case: str, message: str) -> None:
    module = layoutgen.load("trtllm_helix_nccl")
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16, device="cpu")
    generator = torch.Generator().manual_seed(3)
    out = torch.randn(B, H, D, generator=generator).to(torch.bfloat16)
    maximum, total = torch.randn(B, H, generator=generator), 1 + torch.rand(B, H, generator=generator)
    before = {name: tensor.clone() for name, tensor in bufs.tensors.items()}

    def call(o: torch.Tensor, m: torch.Tensor, s: torch.Tensor) -> None:
        if case == "three":
            module.pack(o, bufs=bufs, max_sum=(m, s, s))
        elif case == "stacked":
            module.pack(o, bufs=bufs, max_sum=torch.stack([m, s]))
        else:
            module.pack(o, m, None)

    with pytest.raises(TypeError, match=message):
        call(out, maximum, total)
    with pytest.raises(Exception, match=message):
        compiled(call)(out, maximum, total)
    for name, tensor in bufs.tensors.items():
        assert torch.equal(tensor.view(torch.uint8), before[name].view(torch.uint8)), f"{name} was written"


def test_compiled_combine_refuses_a_non_buffers_object() -> None:
    module = layoutgen.load("pynccl_a2a")
    with pytest.raises(Exception, match=r"bufs must be the buffers object returned by alloc\(\), got NoneType"):
        compiled(lambda b: module.combine(None, b))(B)


# --- scale and the ops' error on copies -----------------------------------------------------------------------


@pytest.mark.parametrize("scale", [10**400, -(10**400), 10**39], ids=["1e400", "-1e400", "1e39"])
def test_an_int_scale_beyond_float32_is_a_value_error(scale: int) -> None:
    module, bufs = packed()
    with pytest.raises(ValueError, match=r"scale must be a finite number within float32's range"):
        module.combine(bufs, B, scale=scale)


@pytest.mark.parametrize("own", [True, False], ids=["alloc_tensors", "copies"])
def test_the_pack_op_names_out_for_a_wrong_out_dtype(own: bool) -> None:
    module = layoutgen.load("pynccl_a2a")
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16, device="cpu")
    tensors = list(bufs.tensors.values()) if own else [t.clone() for t in bufs.tensors.values()]
    out, lse = torch.randn(B, H, D), torch.randn(B, H)  # float32 into bfloat16 buffers
    with pytest.raises(TypeError, match=r"out must be torch.bfloat16 \(the buffers' dtype\); got .*torch.float32"):
        torch.ops.layoutgen.pack(out, lse, tensors, module.__name__, N, B_MAX, H, D, [])
