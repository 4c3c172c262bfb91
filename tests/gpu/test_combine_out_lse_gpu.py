"""GPU only: combine's `out_lse=` through the direct launch and in a CUDA graph: the same bits as the LSE
combine allocates, for an `out_lse` at 16-byte and at 4-byte alignment (its own specialisation)."""

from __future__ import annotations

import pytest
import torch
from conftest import fill_bytes, generated_module

from layoutgen.runtime import reset_caches

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.filterwarnings("ignore::layoutgen.runtime.LayoutgenWarning"),
]

N, H, D, B_MAX, B = 4, 32, 512, 16, 5


@pytest.fixture(autouse=True)
def fresh() -> None:
    reset_caches()


@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "trtllm_helix_native_v2", "vllm_a2a_fp8"])
def test_out_lse_replays_and_launches_directly_to_the_allocated_lse_bits(spec_name: str) -> None:
    module = generated_module(spec_name)
    generator = torch.Generator().manual_seed(0)
    out = torch.randn(B, H, D, generator=generator).to(torch.bfloat16).cuda()
    lse = (torch.randn(B, H, generator=generator) * 4).cuda()
    send = fill_bytes(module.alloc(N, B_MAX, H, D, torch.bfloat16, "cuda"))
    module.pack(out, lse, send)
    want, want_lse = module.combine(send, B, return_lse=True)

    whole = torch.full((B * (H // N) + 1,), float("nan"), device="cuda")
    for offset in (0, 1, 0):  # 16-byte aligned, 4-byte aligned, then the first specialisation again
        out_lse = whole[offset : offset + B * (H // N)].view(B, H // N)
        out_lse.fill_(float("nan"))
        got, got_lse = module.combine(send, B, out_lse=out_lse)
        torch.cuda.synchronize()
        assert got_lse is out_lse and torch.equal(got, want) and torch.equal(out_lse, want_lse), offset

    out_lse = torch.full((B, H // N), float("nan"), device="cuda")
    merged = torch.empty_like(want)
    graph = torch.cuda.CUDAGraph()
    module.combine(send, B, out=merged, out_lse=out_lse)  # the plan and its launch exist before capture
    with torch.cuda.graph(graph):
        module.combine(send, B, out=merged, out_lse=out_lse)
    out_lse.fill_(float("nan"))
    merged.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(merged, want) and torch.equal(out_lse, want_lse)
