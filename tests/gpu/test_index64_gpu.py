"""GPU only: DCP pack and combine through buffers of 2**32 elements (4-17 GiB), rows written past 2**31
elements.  The plans switch to 64-bit offsets there (`needs_int64`); under the interpreter no CI-sized
buffer reaches that far, so a kernel whose offsets wrapped in 32 bits would pass every CPU test (a mutation
audit dropped the kernels' `.to(tl.int64)` and no CPU test failed).  Here the big buffers must hold, in every
written row, the bytes a small buffer gets from the same call, and no other byte may leave the canary.

Before the fix the packs' strides of the axes outside batch (the int32 `batch_capacity` times constexpr row
sizes) wrapped: an illegal address at N 2, B_max 2^24 + 8, one head of 128 dims (H100, pynccl_a2a)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import CANARY, NPU_LIKE_SPEC_FIELDS, byte_views, fill_bytes, generated_module, make_spec, render_module

from layoutgen.dcp.layout import LayoutBuffers
from layoutgen.runtime import reset_caches

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.filterwarnings("ignore::layoutgen.runtime.LayoutgenWarning"),
]

# N 2, one head per peer, 128 dims, buffers of 2**32 elements: every layout below writes some element past
# 2**31 (peer 1's rows where peer is outermost, the last dims where dim is outside batch) with 5 rows packed;
# 4 GiB (fp8) to 17 GiB (float32) of buffer.
N, H, D, R = 2, 2, 128, 5
ELEMENTS = 2**32
RENDERED = {
    "npu_like": NPU_LIKE_SPEC_FIELDS,  # float32 [peer, head, dim, batch], LSE in the row tail
    "peer_pairs": {  # (batch, peer) pairs innermost: the pack's pairs path
        "name": "peer_pairs",
        "transport": "external",
        "payload": {"axes": ["head", "dim", "batch", "peer"], "dtype": "input"},
        "stats": {"placement": "separate", "axes": ["peer", "batch", "head", "slot"], "slots": 1, "slot": 0},
    },
}


@pytest.fixture(autouse=True)
def fresh() -> None:
    reset_caches()


def views(bufs: LayoutBuffers, B: int) -> dict[str, torch.Tensor]:
    """The logical views a pack of B rows writes, as bytes."""
    spec = bufs.spec
    found = {"payload": bufs.payload_view(B)}
    if spec.fp8:
        found["scale"] = bufs.scale_view(B)
    if spec.max_sum:
        found["max"], found["sum"] = bufs.max_view(B), bufs.sum_view(B)
    else:
        found["lse"] = bufs.lse_view(B)
    return {name: view.contiguous().view(torch.uint8) for name, view in found.items()}


def changed_bytes(flat: torch.Tensor) -> int:
    """How many bytes no longer hold the canary, a GiB at a time (a whole 17 GiB buffer's int64 sum took 8x)."""
    return sum(int(torch.count_nonzero(chunk != CANARY)) for chunk in flat.split(2**30))


@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "trtllm_helix_nccl", "pynccl_a2a_fp8", *RENDERED])
def test_pack_and_combine_past_32_bit_offsets_move_the_small_buffers_bytes(spec_name: str, tmp_path: Path) -> None:
    if spec_name in RENDERED:
        module = render_module(make_spec(**RENDERED[spec_name]), tmp_path)
    else:
        module = generated_module(spec_name)
    spec = module.SPEC
    one_row = module.alloc(N, 1, H, D, torch.bfloat16).tensors
    B_max = ELEMENTS // one_row["payload"].numel() + 8
    needed = 3 * B_max * sum(t.numel() * t.element_size() for t in one_row.values()) // 2
    if torch.cuda.mem_get_info()[0] < needed:
        pytest.skip(f"needs {needed / 2**30:.1f} GiB of free GPU memory")

    generator = torch.Generator().manual_seed(1)
    out = torch.randn(R, H, D, generator=generator).to(torch.bfloat16).cuda()
    lse = (torch.randn(R, H, generator=generator) * 4).cuda()
    maximum, total = lse.clone(), (1 + 8 * torch.rand(R, H, generator=generator)).cuda()
    empty = torch.tensor([False, True, False, False, True], device="cuda")

    def pack(bufs: LayoutBuffers) -> None:
        if spec.max_sum:
            module.pack(out, bufs=bufs, max_sum=(maximum, total), empty=empty)
        else:
            module.pack(out, lse, bufs, empty=empty)

    small = fill_bytes(module.alloc(N, R, H, D, torch.bfloat16, "cuda"))
    big = fill_bytes(module.alloc(N, B_max, H, D, torch.bfloat16, "cuda"))
    pack(small)
    pack(big)
    torch.cuda.synchronize()
    stats = (maximum, total) if spec.max_sum else None
    assert module._dispatch.pack_plan(out, None if stats else lse, big, empty=empty, max_sum=stats).index_64
    assert not module._dispatch.pack_plan(out, None if stats else lse, small, empty=empty, max_sum=stats).index_64
    small_views, big_views = views(small, R), views(big, R)
    for name, want in small_views.items():
        assert torch.equal(big_views[name], want), f"{spec_name}: the big buffers' {name} rows differ"
    for name, flat in byte_views(big).items():
        changed, want_changed = changed_bytes(flat), changed_bytes(byte_views(small)[name])
        assert changed == want_changed, f"{spec_name}: {changed} bytes of {name!r} left the canary, not {want_changed}"

    config = module._dispatch.combine_plan(small, R, "e", None, True, None).config
    assert module._dispatch.combine_plan(big, R, "e", None, True, config).index_64
    want, want_lse = module.combine(small, R, return_lse=True, config=config)
    got, got_lse = module.combine(big, R, return_lse=True, config=config)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert torch.equal(got_lse.view(torch.int32), want_lse.view(torch.int32))
