"""pack / combine as torch.library custom ops: torch.compile(fullgraph=True) gives eager's bytes.

On CPU the kernels run under the Triton interpreter; the compiled graphs call the custom ops, whose real
implementations run those kernels.  Most tests use backend="aot_eager" (functionalisation and the fake
implementations are exercised, no C++ compile); one uses the default inductor backend.
"""

from __future__ import annotations

import re
from types import ModuleType

import pytest
import torch
from conftest import assert_same_bytes, fill_bytes, generated_module, requires_interpreter

from layoutgen.config import config_values
from layoutgen.dcp.config import CombineConfig, PackConfig
from layoutgen.dcp.layout import LayoutBuffers
from layoutgen.runtime import reset_caches

pytestmark = [requires_interpreter, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

N, H, D, B_MAX, B = 2, 6, 24, 4, 3


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()
    reset_caches()


def inputs(seed: int, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    out = torch.randn(B, H, D, generator=generator).to(dtype)
    lse = torch.randn(B, H, generator=generator) * 3
    lse[0, 1] = float("-inf")  # an empty shard
    return out, lse


def step(module: ModuleType, out: torch.Tensor, lse: torch.Tensor, send: LayoutBuffers, recv: LayoutBuffers):
    """A decode step's DCP part: pack my partials, (exchange: here a copy), combine what arrived."""
    module.pack(out, lse, send)
    for name, tensor in recv.tensors.items():
        tensor.copy_(send.tensors[name])
    merged, merged_lse = module.combine(recv, out.shape[0], lse_base="2", return_lse=True)
    plain, _ = module.combine(recv, out.shape[0])
    return merged, merged_lse, plain


@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "vllm_a2a", "pynccl_a2a_fp8", "vllm_a2a_fp8"])
def test_compiled_step_matches_eager_bytes(spec_name: str) -> None:
    module = generated_module(spec_name)
    buffers = {
        mode: [fill_bytes(module.alloc(N, B_MAX, H, D, torch.bfloat16)) for _ in range(2)]
        for mode in ("eager", "compiled")
    }
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for seed in range(2):  # the second call reuses the compiled graph
        out, lse = inputs(seed)
        want = step(module, out, lse, *buffers["eager"])
        got = compiled(module, out, lse, *buffers["compiled"])
        for got_tensor, want_tensor in zip(got, want, strict=True):
            assert torch.equal(got_tensor.view(torch.uint8), want_tensor.view(torch.uint8))
        for got_bufs, want_bufs in zip(buffers["compiled"], buffers["eager"], strict=True):
            assert_same_bytes(got_bufs, want_bufs, f"seed {seed}")


def test_inductor_compiled_step_matches_eager_bytes() -> None:
    module = generated_module("pynccl_a2a")
    eager = [fill_bytes(module.alloc(N, B_MAX, H, D, torch.bfloat16)) for _ in range(2)]
    traced = [fill_bytes(module.alloc(N, B_MAX, H, D, torch.bfloat16)) for _ in range(2)]
    out, lse = inputs(3)
    want = step(module, out, lse, *eager)
    got = torch.compile(step, fullgraph=True)(module, out, lse, *traced)
    for got_tensor, want_tensor in zip(got, want, strict=True):
        assert torch.equal(got_tensor.view(torch.uint8), want_tensor.view(torch.uint8))
    assert_same_bytes(traced[0], eager[0], "inductor")
    # The op found alloc()'s buffers object: its plans were reused, not rebuilt from bare tensors.
    assert traced[0].__dict__["_layoutgen_plans"]


def test_compiled_pack_with_explicit_config_and_out() -> None:
    module = generated_module("vllm_a2a")
    pack_config = PackConfig(block_batch=1, block_head=1, block_dim=8, num_warps=1)
    combine_config = CombineConfig(block_batch=1, block_head=2, block_dim=32, num_warps=2)

    def run(out, lse, bufs, merged):
        module.pack(out, lse, bufs, config=pack_config)
        return module.combine(bufs, B, out=merged, config=combine_config)

    out, lse = inputs(5)
    eager_bufs, traced_bufs = (fill_bytes(module.alloc(N, B_MAX, H, D, torch.bfloat16)) for _ in range(2))
    want, _ = run(out, lse, eager_bufs, torch.empty(B, H // N, D, dtype=torch.bfloat16))
    merged = torch.empty(B, H // N, D, dtype=torch.bfloat16)
    returned, got_lse = torch.compile(run, fullgraph=True, backend="aot_eager")(out, lse, traced_bufs, merged)
    assert got_lse is None and returned.data_ptr() == merged.data_ptr()
    assert torch.equal(merged.view(torch.uint8), want.view(torch.uint8))
    assert_same_bytes(traced_bufs, eager_bufs, "explicit config")


def test_ops_called_directly_on_bare_tensors() -> None:
    module = generated_module("vllm_a2a")
    out, lse = inputs(7)
    want = fill_bytes(module.alloc(N, B_MAX, H, D, torch.bfloat16))
    module.pack(out, lse, want)
    tensors = [torch.full_like(t, 0).view(torch.uint8).fill_(0xA5).view(t.dtype) for t in want.tensors.values()]
    torch.ops.layoutgen.pack(out, lse, tensors, module.__name__, N, B_MAX, H, D, [])
    for name, tensor in zip(want.tensors, tensors, strict=True):
        assert torch.equal(tensor.view(torch.uint8), want.tensors[name].view(torch.uint8)), name
    merged = torch.empty(B, H // N, D, dtype=torch.bfloat16)
    merged_lse = torch.empty(B, H // N)
    config = config_values(CombineConfig(block_batch=1, block_head=1, block_dim=8))
    torch.ops.layoutgen.combine(tensors, merged, merged_lse, module.__name__, N, B_MAX, H, D, B, "e", config)
    expected, expected_lse = module.combine(want, B, return_lse=True)
    assert torch.equal(merged, expected) and torch.equal(merged_lse, expected_lse)


def test_ops_reject_bad_arguments() -> None:
    module = generated_module("vllm_a2a")
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16)
    tensors = list(bufs.tensors.values())
    merged = torch.empty(B, H // N, D, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=re.escape("out_lse must be a contiguous float32 tensor of shape [3, 3]")):
        torch.ops.layoutgen.combine(tensors, merged, torch.empty(B, 2), module.__name__, N, B_MAX, H, D, B, "e", [])
    with pytest.raises(ValueError, match=re.escape("no generated layoutgen module named 'nope'")):
        torch.ops.layoutgen.combine(tensors, merged, None, "nope", N, B_MAX, H, D, B, "e", [])
    with pytest.raises(ValueError, match=re.escape("buffers must be the 2 tensors ['payload', 'stats']")):
        torch.ops.layoutgen.pack(*inputs(0), tensors[:1], module.__name__, N, B_MAX, H, D, [])
    with pytest.raises(ValueError, match=re.escape("config must list the pack config fields")):
        torch.ops.layoutgen.pack(*inputs(0), tensors, module.__name__, N, B_MAX, H, D, [1, 2])


def test_opcheck_pack_and_combine() -> None:
    module = generated_module("pynccl_a2a")
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16)
    out, lse = inputs(9)
    module.pack(out, lse, bufs)
    tensors = list(bufs.tensors.values())
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(
        torch.ops.layoutgen.pack.default, (out, lse, tensors, module.__name__, N, B_MAX, H, D, []), test_utils=utils
    )
    merged = torch.empty(B, H // N, D, dtype=torch.bfloat16)
    merged_lse = torch.empty(B, H // N)
    torch.library.opcheck(
        torch.ops.layoutgen.combine.default,
        (tensors, merged, merged_lse, module.__name__, N, B_MAX, H, D, B, "e", []),
        test_utils=utils,
    )


def test_ops_check_the_shape_they_are_given() -> None:
    module = generated_module("vllm_a2a")
    tensors = list(module.alloc(N, B_MAX, H, D, torch.bfloat16).tensors.values())
    with pytest.raises(ValueError, match=re.escape("H (number of heads) must be divisible by N (peers): H=6, N=4")):
        torch.ops.layoutgen.pack(*inputs(0), tensors, module.__name__, 4, B_MAX, H, D, [])
    with pytest.raises(
        ValueError,
        match=re.escape("bufs.tensors['payload'] must be a contiguous torch.bfloat16 tensor of shape (2, 8, 3, 24)"),
    ):
        torch.ops.layoutgen.pack(*inputs(0), tensors, module.__name__, N, 8, H, D, [])
