"""GPU only: pack and combine capture into a CUDA graph and replay to eager's bytes; the direct launch path
(cached compiled kernels) stays correct when pointer alignment, strides, shapes and configs change; the hot
path does not synchronise with the host."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from conftest import assert_same_bytes, fill_bytes, generated_module

from layoutgen.dcp import reference
from layoutgen.dcp.config import CombineConfig, PackConfig
from layoutgen.dcp.layout import LayoutBuffers
from layoutgen.runtime import reset_caches

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.filterwarnings("ignore::layoutgen.runtime.LayoutgenWarning"),
]

SPECS = ["pynccl_a2a", "pynccl_a2a_aligned", "vllm_a2a", "flashinfer_mnnvl"]
N, H, D, B_MAX = 4, 32, 128, 16


@pytest.fixture(autouse=True)
def fresh() -> None:
    reset_caches()


def random_inputs(B: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    out = torch.randn(B, H, D, generator=generator).to(torch.bfloat16).cuda()
    lse = (torch.randn(B, H, generator=generator) * 4).cuda()
    lse[0, 0] = float("-inf")
    return out, lse


def expected_buffers(module: ModuleType, out: torch.Tensor, lse: torch.Tensor) -> LayoutBuffers:
    want = fill_bytes(LayoutBuffers.allocate(module.SPEC, N, B_MAX, H, D, torch.bfloat16, "cuda"))
    reference.pack(out, lse, want)
    return want


@pytest.mark.parametrize("spec_name", SPECS)
def test_graph_replay_equals_eager(spec_name: str) -> None:
    module = generated_module(spec_name)
    B = 5
    static_out, static_lse = random_inputs(B, 0)
    send = fill_bytes(module.alloc(N, B_MAX, H, D, torch.bfloat16, "cuda"))
    merged = torch.empty(B, H // N, D, dtype=torch.bfloat16, device="cuda")

    def step() -> torch.Tensor:
        module.pack(static_out, static_lse, send)
        _, lse = module.combine(send, B, out=merged, return_lse=True)  # combine of one rank's own send buffer
        return lse

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # plans, compiled kernels and direct launches exist before capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_lse = step()

    for seed in (1, 2):
        out, lse = random_inputs(B, seed)
        static_out.copy_(out)
        static_lse.copy_(lse)
        fill_bytes(send)
        graph.replay()
        torch.cuda.synchronize()
        assert_same_bytes(send, expected_buffers(module, out, lse), f"{spec_name} replay {seed}")
        eager_bufs = fill_bytes(module.alloc(N, B_MAX, H, D, torch.bfloat16, "cuda"))
        module.pack(out, lse, eager_bufs)
        eager_out, eager_lse = module.combine(eager_bufs, B, return_lse=True)
        assert torch.equal(merged, eager_out) and torch.equal(graph_lse, eager_lse)


@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "vllm_a2a"])
def test_direct_launch_follows_alignment_strides_shapes_and_configs(spec_name: str) -> None:
    module = generated_module(spec_name)
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16, "cuda")
    small = PackConfig(block_batch=1, block_head=2, block_dim=64, num_warps=2)
    cases = []
    for B in (1, 3, 16):
        out, lse = random_inputs(B, B)
        cases.append(("contiguous", out, lse, None))
        # Shifted by one element: the pointers are no longer 16-byte aligned (another specialisation).
        storage = torch.empty(B * H * D + 1, dtype=torch.bfloat16, device="cuda")
        shifted = storage[1:].view(B, H, D)
        shifted.copy_(out)
        lse_storage = torch.empty(B * H + 1, device="cuda")
        shifted_lse = lse_storage[1:].view(B, H)
        shifted_lse.copy_(lse)
        cases.append(("misaligned", shifted, shifted_lse, None))
        wide = torch.empty(B, H, D + 16, dtype=torch.bfloat16, device="cuda")[..., :D]
        wide.copy_(out)
        cases.append(("row stride", wide, lse.t().contiguous().t(), small))
    for _round in range(2):  # the second round runs every case from the cached direct launches
        for label, out, lse, config in cases:
            fill_bytes(bufs)
            module.pack(out, lse, bufs, config=config)
            torch.cuda.synchronize()
            assert_same_bytes(bufs, expected_buffers(module, out, lse), f"{label} B={out.shape[0]}")
            plan = module._dispatch.pack_plan(out, lse, bufs, config)
            assert plan.direct is not None, f"{label}: the direct launch path is not in use"


def test_combine_direct_launch_matches_triton_launch() -> None:
    module = generated_module("pynccl_a2a")
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16, "cuda")
    out, lse = random_inputs(B_MAX, 7)
    module.pack(out, lse, bufs)
    for B in (1, 7, 16):
        config = CombineConfig(block_batch=1, block_head=4, block_dim=128, num_warps=4)
        for _ in range(2):
            got, got_lse = module.combine(bufs, B, return_lse=True, config=config)
        plan = module._dispatch.combine_plan(bufs, B, "e", None, True, config)
        assert plan.direct is not None
        want = torch.empty_like(got)
        want_lse = torch.empty_like(got_lse)
        module._launch_combine(bufs, B, want, want_lse, False, config, plan.index_64)  # through kernel[grid]
        assert torch.equal(got, want) and torch.equal(got_lse, want_lse)
        ref, ref_lse = reference.combine(bufs, B, "e", True)
        torch.testing.assert_close(got.double(), ref.to(torch.bfloat16).double(), rtol=0, atol=0.05)
        torch.testing.assert_close(got_lse.double(), ref_lse, rtol=1e-5, atol=1e-5)


def test_hot_path_does_not_synchronise() -> None:
    module = generated_module("vllm_a2a")
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16, "cuda")
    out, lse = random_inputs(8, 3)
    merged = torch.empty(8, H // N, D, dtype=torch.bfloat16, device="cuda")
    module.pack(out, lse, bufs)
    module.combine(bufs, 8, out=merged)
    module.combine(bufs, 8, return_lse=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            module.pack(out, lse, bufs)
            module.combine(bufs, 8, out=merged)
            module.combine(bufs, 8, return_lse=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
