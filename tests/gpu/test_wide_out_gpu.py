"""GPU only: combine into an `out` view whose last head lies past 2**31 elements from its first (4 GiB of
bf16 behind it).  The kernel's head offsets are 32-bit: written directly, the last head's rows wrapped and
landed gigabytes before `out`; the plan now writes a contiguous stage and copies it into the view."""

from __future__ import annotations

import pytest
import torch
from conftest import generated_module

from layoutgen.runtime import reset_caches

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.filterwarnings("ignore::layoutgen.runtime.LayoutgenWarning"),
]

N, H, D, B_MAX, B = 2, 6, 16, 4, 2
HEAD_STRIDE = 2**30 + 2**20  # below 2**31 (a 32-bit kernel argument); the last of 3 heads at 2**31 + 2**21
CANARY = -7.0


@pytest.fixture(autouse=True)
def fresh() -> None:
    reset_caches()


@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "trtllm_helix_native_v2"])
def test_combine_writes_a_view_past_32_bit_offsets_through_a_stage(spec_name: str) -> None:
    heads = H // N
    needed = (heads - 1) * HEAD_STRIDE + (B - 1) * D + D
    if torch.cuda.mem_get_info()[0] < 3 * needed * 2:
        pytest.skip(f"needs {3 * needed * 2 / 2**30:.1f} GiB of free GPU memory")
    module = generated_module(spec_name)
    generator = torch.Generator().manual_seed(0)
    out = torch.randn(B, H, D, generator=generator).to(torch.bfloat16).cuda()
    lse = (torch.randn(B, H, generator=generator) * 4).cuda()
    send = module.alloc(N, B_MAX, H, D, torch.bfloat16, "cuda")
    module.pack(out, lse, send)
    want, want_lse = module.combine(send, B, return_lse=True)

    storage = torch.full((needed,), CANARY, dtype=torch.bfloat16, device="cuda")
    view = storage.as_strided((B, heads, D), (D, HEAD_STRIDE, 1))
    for _ in range(2):  # planned, then from the plan
        got, got_lse = module.combine(send, B, out=view, return_lse=True)
        torch.cuda.synchronize()
        assert got is view and torch.equal(view, want) and torch.equal(got_lse, want_lse)
        view.fill_(CANARY)
        assert bool((storage == CANARY).all()), "combine wrote outside its out view"
    del storage
    torch.cuda.empty_cache()
