"""The oracle itself, checked against expectations built by hand from docs/design.md §3 and §4.

Everything else is judged against `layoutgen.reference`, so here it is judged
against constructions that do not go through `LayoutBuffers` views: the byte
layouts sglang's and vLLM's code build, the NPU's float32 batch-innermost rows,
and merges worked out in closed form.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import (
    CANARY,
    NPU_LIKE_SPEC_FIELDS,
    assert_canary_outside,
    byte_views,
    expected_layout_bytes,
    fill_bytes,
    make_spec,
    owned_byte_count,
    random_inputs,
)

from layoutgen.dcp import reference
from layoutgen.dcp.layout import LayoutBuffers
from layoutgen.spec import bundled_specs

#: The DCP family's bundled specs with one LSE word per entry ((max, sum) specs: tests/test_dcp_v2_pack.py) and
#: a payload in the activations' dtype or float32 (fp8 specs: tests/test_dcp_fp8_pack.py).
BUNDLED = {
    name: spec for name, spec in bundled_specs().items() if spec.family == "dcp" and not spec.max_sum and not spec.fp8
}


def _packed(spec, out, lse, N, B_max):
    _, H, D = out.shape
    bufs = fill_bytes(LayoutBuffers.allocate(spec, N, B_max, H, D, out.dtype))
    reference.pack(out, lse, bufs)
    return bufs


def _float32_bytes(values: torch.Tensor) -> torch.Tensor:
    """[..., ] float32 -> [..., 4] uint8."""
    return values.to(torch.float32).contiguous().unsqueeze(-1).view(torch.uint8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_pynccl_a2a_rows_are_payload_bytes_then_lse_bits(dtype, generator):
    # sglang's send_combined [N, B_max, H/N, D + lpd]: each row is D values then the float32 LSE bits.
    N, B, B_max, H, D = 2, 3, 5, 6, 24
    out, lse = random_inputs(B, H, D, dtype, generator)
    bufs = _packed(BUNDLED["pynccl_a2a"], out, lse, N, B_max)
    h = H // N
    body = out.view(B, N, h, D).permute(1, 0, 2, 3).contiguous().view(torch.uint8)  # [N, B, h, D*es]
    rows = torch.cat([body, _float32_bytes(lse.view(B, N, h).permute(1, 0, 2))], dim=-1)
    lpd = 4 // dtype.itemsize
    want = torch.full((N, B_max, h, (D + lpd) * dtype.itemsize), CANARY, dtype=torch.uint8)
    want[:, :B] = rows
    assert bufs.tensors["payload"].shape == (N, B_max, h, D + lpd)
    assert torch.equal(bufs.tensors["payload"].view(torch.uint8), want)


def test_pynccl_a2a_aligned_pads_rows_to_16_bytes_and_leaves_padding(generator):
    N, B, B_max, H, D = 2, 2, 3, 4, 10  # bf16 row: 20 + 4 bytes -> 32
    out, lse = random_inputs(B, H, D, torch.bfloat16, generator)
    bufs = _packed(BUNDLED["pynccl_a2a_aligned"], out, lse, N, B_max)
    h = H // N
    assert bufs.tensors["payload"].shape == (N, B_max, h, 16)
    body = out.view(B, N, h, D).permute(1, 0, 2, 3).contiguous().view(torch.uint8)
    rows = torch.cat([body, _float32_bytes(lse.view(B, N, h).permute(1, 0, 2))], dim=-1)
    want = torch.full((N, B_max, h, 32), CANARY, dtype=torch.uint8)
    want[:, :B, :, :24] = rows
    assert torch.equal(bufs.tensors["payload"].view(torch.uint8), want)


@pytest.mark.parametrize(("N", "B", "h", "D"), [(2, 4, 8, 16), (4, 1, 3, 40)])
def test_flashinfer_mnnvl_matches_sglang_peer_inside_layout(N, B, h, D, generator):
    # As sglang's test_pack_serves_the_split_peer_inside_layout: partial_o [B, H/N, N, D],
    # stats [B, H/N, N, 2] with the LSE in slot 0 and slot 1 never written.
    H = N * h
    out, lse = random_inputs(B, H, D, torch.bfloat16, generator)
    bufs = _packed(BUNDLED["flashinfer_mnnvl"], out, lse, N, B)
    want_o = out.view(B, N, h, D).permute(0, 2, 1, 3)
    want_lse = lse.view(B, N, h).permute(0, 2, 1)
    assert torch.equal(bufs.tensors["payload"].view(torch.uint8), want_o.contiguous().view(torch.uint8))
    stats = bufs.tensors["stats"]
    assert stats.shape == (B, h, N, 2)
    assert torch.equal(stats[..., 0], want_lse)
    assert bool((stats[..., 1].contiguous().view(torch.uint8) == CANARY).all())


def test_vllm_a2a_payload_and_lse_buffers(generator):
    N, B, B_max, H, D = 3, 2, 4, 9, 7
    out, lse = random_inputs(B, H, D, torch.float16, generator)
    bufs = _packed(BUNDLED["vllm_a2a"], out, lse, N, B_max)
    h = H // N
    payload, stats = bufs.tensors["payload"], bufs.tensors["stats"]
    assert payload.shape == (N, B_max, h, D) and stats.shape == (N, B_max, h, 1)
    assert torch.equal(payload[:, :B], out.view(B, N, h, D).permute(1, 0, 2, 3))
    assert torch.equal(stats[:, :B, :, 0], lse.view(B, N, h).permute(1, 0, 2))
    assert bool((payload[:, B:].contiguous().view(torch.uint8) == CANARY).all())
    assert bool((stats[:, B:].contiguous().view(torch.uint8) == CANARY).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_float32_row_tail_with_batch_innermost(dtype, generator):
    # The NPU path: float32 [N, H/N, D + 1, B_max]; element D of each float32 row is the LSE.
    spec = make_spec(**NPU_LIKE_SPEC_FIELDS)
    N, B, B_max, H, D = 2, 3, 4, 6, 5
    out, lse = random_inputs(B, H, D, dtype, generator)
    bufs = _packed(spec, out, lse, N, B_max)
    h = H // N
    payload = bufs.tensors["payload"]
    assert payload.shape == (N, h, D + 1, B_max) and payload.dtype == torch.float32
    for p in range(N):
        for j in range(h):
            for b in range(B):
                assert torch.equal(payload[p, j, :D, b], out[b, p * h + j].float())
                assert payload[p, j, D, b] == lse[b, p * h + j]
    assert bool((payload[..., B:].contiguous().view(torch.uint8) == CANARY).all())


@pytest.mark.parametrize("name", sorted(BUNDLED))
@pytest.mark.parametrize(("B", "B_max"), [(1, 1), (2, 5)])
def test_bundled_specs_match_the_layout_built_from_the_design_text(name, B, B_max, generator):
    spec = BUNDLED[name]
    N, H, D = 3, 9, 12
    out, lse = random_inputs(B, H, D, torch.bfloat16, generator)
    bufs = _packed(spec, out, lse, N, B_max)
    expected = expected_layout_bytes(spec, out, lse, N, B_max)
    assert set(expected) == set(bufs.tensors)
    for buffer, got in byte_views(bufs).items():
        assert torch.equal(got, expected[buffer]), buffer
    assert_canary_outside(bufs, owned_byte_count(spec, N, B, H, D, out.dtype))


def test_pack_of_zero_rows_writes_nothing(generator):
    spec = BUNDLED["pynccl_a2a"]
    out, lse = random_inputs(0, 4, 8, torch.bfloat16, generator)
    bufs = _packed(spec, out, lse, 2, 3)
    assert_canary_outside(bufs, 0)


@pytest.mark.parametrize("name", ["pynccl_a2a", "flashinfer_mnnvl"])
def test_exchange_delivers_each_peers_chunk(name, generator):
    spec = BUNDLED[name]
    N, B_max, H, D = 3, 2, 6, 8
    sends = []
    for _ in range(N):
        bufs = LayoutBuffers.allocate(spec, N, B_max, H, D, torch.bfloat16)
        for tensor in bufs.tensors.values():
            # Random bytes everywhere, padding included: a transport moves all of them.
            tensor.view(torch.uint8).copy_(torch.randint(0, 256, tensor.view(torch.uint8).shape, generator=generator))
        sends.append(bufs)
    received = reference.exchange(sends)
    for tensor_name in sends[0].tensors:
        peer_dim = (spec.payload.axes if tensor_name == "payload" else spec.stats.axes).index("peer")
        for rank in range(N):
            for peer in range(N):
                got = received[rank].tensors[tensor_name].select(peer_dim, peer)
                want = sends[peer].tensors[tensor_name].select(peer_dim, rank)
                assert torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8))


def test_exchange_refuses_a_world_that_does_not_match_N():
    spec = BUNDLED["vllm_a2a"]
    sends = [LayoutBuffers.allocate(spec, 3, 1, 3, 4, torch.float32) for _ in range(2)]
    with pytest.raises(ValueError, match="N=3"):
        reference.exchange(sends)


# --- merge ------------------------------------------------------------------------------------
@pytest.mark.parametrize("base", ["e", "2"])
def test_merge_of_two_partials_in_closed_form(base):
    exp = math.exp if base == "e" else (lambda x: 2.0**x)
    log = math.log if base == "e" else math.log2
    o = torch.tensor([[[[1.0, -2.0]]], [[[3.0, 0.5]]]], dtype=torch.float64)  # [N=2, B=1, h=1, D=2]
    lse = torch.tensor([[[0.5]], [[-1.25]]], dtype=torch.float64)
    merged, merged_lse = reference.merge_partials(o, lse, base)
    w0, w1 = exp(0.5), exp(-1.25)
    for d in range(2):
        want = (w0 * o[0, 0, 0, d].item() + w1 * o[1, 0, 0, d].item()) / (w0 + w1)
        assert merged[0, 0, d].item() == pytest.approx(want, rel=1e-14)
    assert merged_lse[0, 0].item() == pytest.approx(log(w0 + w1), rel=1e-14)
    assert merged.dtype == torch.float64


@pytest.mark.parametrize("bad", [float("-inf"), float("nan"), float("inf")])
def test_merge_treats_nan_and_inf_lse_as_empty_and_ignores_its_payload(bad):
    o = torch.tensor([[[[2.0, 4.0]]], [[[float("nan"), float("inf")]]]])
    lse = torch.tensor([[[1.5]], [[bad]]])
    merged, merged_lse = reference.merge_partials(o, lse)
    assert torch.equal(merged, torch.tensor([[[2.0, 4.0]]], dtype=torch.float64))
    assert merged_lse.item() == pytest.approx(1.5, rel=1e-15)


def test_merge_of_all_empty_partials_is_zero_with_lse_minus_inf():
    o = torch.full((3, 2, 1, 4), float("nan"))
    lse = torch.tensor([float("-inf"), float("nan"), float("inf")]).view(3, 1, 1).expand(3, 2, 1)
    merged, merged_lse = reference.merge_partials(o, lse, "2")
    assert torch.equal(merged, torch.zeros(2, 1, 4, dtype=torch.float64))
    assert bool((merged_lse == float("-inf")).all())


def test_merge_with_large_lse_magnitudes_does_not_overflow():
    o = torch.tensor([[[[1.0]]], [[[3.0]]], [[[5.0]]]])
    lse = torch.tensor([[[1e4]], [[1e4 + math.log(3.0)]], [[-1e4]]], dtype=torch.float64)
    merged, merged_lse = reference.merge_partials(o, lse)
    assert merged.item() == pytest.approx((1.0 + 3 * 3.0) / 4.0, rel=1e-12)
    assert merged_lse.item() == pytest.approx(1e4 + math.log(4.0), rel=1e-12)


def test_merge_refuses_an_unknown_base():
    with pytest.raises(ValueError, match="lse_base"):
        reference.merge_partials(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1), "10")


def test_merge_shards_takes_the_ranks_head_block(generator):
    N, B, H, D = 3, 2, 6, 4
    outs = [torch.randn(B, H, D, generator=generator) for _ in range(N)]
    lses = [torch.randn(B, H, generator=generator) for _ in range(N)]
    for rank in range(N):
        merged, merged_lse = reference.merge_shards(outs, lses, rank)
        for b in range(B):
            for j in range(H // N):
                head = rank * (H // N) + j
                weights = torch.tensor([math.exp(float(lses[i][b, head])) for i in range(N)], dtype=torch.float64)
                values = torch.stack([outs[i][b, head].double() for i in range(N)])
                want = (weights[:, None] * values).sum(0) / weights.sum()
                assert torch.allclose(merged[b, j], want, rtol=1e-12, atol=0)
                assert merged_lse[b, j].item() == pytest.approx(math.log(float(weights.sum())), rel=1e-12)


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_reference_combine_merges_the_partials_the_views_expose(name, generator):
    spec = BUNDLED[name]
    N, B, H, D = 2, 3, 4, 6
    out, lse = random_inputs(B, H, D, torch.float32, generator)
    bufs = _packed(spec, out, lse, N, B + 1)
    # The views expose peer p's slot as partial p; combine merges exactly those.
    assert torch.equal(bufs.payload_view(B), out.view(B, N, H // N, D).permute(1, 0, 2, 3))
    assert torch.equal(bufs.lse_view(B), lse.view(B, N, H // N).permute(1, 0, 2))
    merged, merged_lse = reference.combine(bufs, B, return_lse=True)
    want, want_lse = reference.merge_partials(bufs.payload_view(B), bufs.lse_view(B))
    assert torch.equal(merged, want) and merged_lse is not None and torch.equal(merged_lse, want_lse)
    assert reference.combine(bufs, B)[1] is None
