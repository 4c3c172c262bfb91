"""GPU only: the contract-v2 pack (empty rows fused in, [R, T] rows, (max, sum) stats) and the scaled
(max, sum) combine under CUDA-graph capture and `torch.compile(fullgraph=True)`, byte for byte against
eager and the reference; the mask is read on the device (a changed mask changes a replay's bytes, no host
sync); the vectorised whole-tile stores of a transposing layout are exact at every batch remainder.

Run on the device: `python -m pytest -q -m gpu tests/gpu/test_dcp_v2_gpu.py`.
"""

from __future__ import annotations

import itertools
from types import ModuleType
from typing import Any

import pytest
import torch
from conftest import assert_same_bytes, fill_bytes, generated_module, make_spec, render_module

from layoutgen.dcp import reference
from layoutgen.dcp.config import PackConfig
from layoutgen.dcp.layout import LayoutBuffers
from layoutgen.dcp.tolerances import combine_error, lse_error
from layoutgen.runtime import reset_caches

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.filterwarnings("ignore::layoutgen.runtime.LayoutgenWarning"),
]

SPECS = ["pynccl_a2a", "vllm_a2a", "flashinfer_mnnvl", "trtllm_helix_nccl", "trtllm_helix_native_v2"]
N, H, D, R, T = 4, 32, 128, 6, 2
ROWS = R * T


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()
    reset_caches()


def inputs(seed: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """out [R, T, H, D] with garbage in the rows of empty requests, lse, (max, sum) and an empty mask."""
    generator = torch.Generator().manual_seed(seed)
    empty = torch.rand(R, generator=generator) < 0.4
    empty[0] = seed % 2 == 1
    out = torch.randn(R, T, H, D, generator=generator).to(dtype)
    out[empty] = float("nan")
    lse = torch.randn(R, T, H, generator=generator) * 4
    lse[empty] = float("inf")
    maximum = torch.randn(R, T, H, generator=generator) * 4
    total = 1 + 8 * torch.rand(R, T, H, generator=generator)
    return {
        name: t.cuda() for name, t in {"out": out, "lse": lse, "max": maximum, "sum": total, "empty": empty}.items()
    }


def pack(module: ModuleType, x: dict[str, torch.Tensor], bufs: LayoutBuffers, config: Any = None) -> None:
    if module.SPEC.max_sum:
        module.pack(x["out"], bufs=bufs, max_sum=(x["max"], x["sum"]), empty=x["empty"], config=config)
    else:
        module.pack(x["out"], x["lse"], bufs, empty=x["empty"], config=config)


def reference_bytes(module: ModuleType, x: dict[str, torch.Tensor]) -> LayoutBuffers:
    want = fill_bytes(LayoutBuffers.allocate(module.SPEC, N, ROWS, H, D, x["out"].dtype, "cuda"))
    if module.SPEC.max_sum:
        reference.pack(x["out"], None, want, max_sum=(x["max"], x["sum"]), empty=x["empty"])
    else:
        reference.pack(x["out"], x["lse"], want, empty=x["empty"])
    return want


def forced_reads(module: ModuleType, reads: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """`module`, its masked pack forced not to read empty rows for `reads == "live_rows"` (the launcher's
    form for calls from `_SKIP_EMPTY_READS_BYTES` up; these shapes are below it)."""
    if reads == "live_rows":
        monkeypatch.setattr(module, "_SKIP_EMPTY_READS_BYTES", 0)
    return module


@pytest.mark.parametrize("reads", ["every_row", "live_rows"])
@pytest.mark.parametrize("spec_name", SPECS)
def test_masked_pack_is_byte_exact_on_the_gpu(spec_name: str, reads: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = forced_reads(generated_module(spec_name), reads, monkeypatch)
    for seed in range(3):
        x = inputs(seed)
        bufs = fill_bytes(module.alloc(N, ROWS, H, D, torch.bfloat16, "cuda"))
        pack(module, x, bufs)
        torch.cuda.synchronize()
        assert_same_bytes(bufs, reference_bytes(module, x), f"{spec_name} seed {seed}")


@pytest.mark.parametrize("reads", ["every_row", "live_rows"])
@pytest.mark.parametrize("spec_name", SPECS)
def test_masked_pack_and_scaled_combine_replay_in_a_cuda_graph(
    spec_name: str, reads: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = forced_reads(generated_module(spec_name), reads, monkeypatch)
    static = inputs(0)
    send = fill_bytes(module.alloc(N, ROWS, H, D, torch.bfloat16, "cuda"))
    merged = torch.empty(ROWS, H // N, D, dtype=torch.bfloat16, device="cuda")

    def step() -> torch.Tensor:
        pack(module, static, send)
        _, lse = module.combine(send, ROWS, out=merged, return_lse=True, scale=0.5)
        return lse

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # plans, compiled kernels and direct launches exist before capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_lse = step()

    for seed in (1, 2, 3):  # new values and a new mask, written in place: the graph reads them on the device
        x = inputs(seed)
        for name, tensor in x.items():
            static[name].copy_(tensor)
        fill_bytes(send)
        graph.replay()
        torch.cuda.synchronize()
        assert_same_bytes(send, reference_bytes(module, x), f"{spec_name} replay {seed}")
        eager = fill_bytes(module.alloc(N, ROWS, H, D, torch.bfloat16, "cuda"))
        pack(module, x, eager)
        eager_out, eager_lse = module.combine(eager, ROWS, return_lse=True, scale=0.5)
        assert torch.equal(merged, eager_out) and torch.equal(graph_lse, eager_lse)


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "trtllm_helix_nccl"])
def test_masked_pack_under_torch_compile_fullgraph(spec_name: str, backend: str) -> None:
    module = generated_module(spec_name)

    def step(x: dict[str, torch.Tensor], send: LayoutBuffers) -> tuple[torch.Tensor, torch.Tensor | None]:
        pack(module, x, send)
        return module.combine(send, ROWS, lse_base="2", return_lse=True, scale=2.0)

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    for seed in range(2):
        x = inputs(seed)
        eager_bufs, traced_bufs = (fill_bytes(module.alloc(N, ROWS, H, D, torch.bfloat16, "cuda")) for _ in range(2))
        want = step(x, eager_bufs)
        got = compiled(x, traced_bufs)
        torch.cuda.synchronize()
        assert_same_bytes(traced_bufs, eager_bufs, f"{spec_name} {backend} seed {seed}")
        for got_tensor, want_tensor in zip(got, want, strict=True):
            assert got_tensor is not None and want_tensor is not None
            assert torch.equal(got_tensor.view(torch.uint8), want_tensor.view(torch.uint8))


def test_the_masked_pack_does_not_synchronise() -> None:
    module = generated_module("vllm_a2a")
    x = inputs(4)
    bufs = module.alloc(N, ROWS, H, D, torch.bfloat16, "cuda")
    pack(module, x, bufs)
    module.combine(bufs, ROWS, scale=0.5)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            pack(module, x, bufs)
            module.combine(bufs, ROWS, scale=0.5)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_max_sum_combine_against_the_float64_reference_on_the_gpu() -> None:
    module = generated_module("trtllm_helix_native_v1")
    generator = torch.Generator().manual_seed(11)
    bufs = fill_bytes(module.alloc(N, ROWS, H, D, torch.bfloat16, "cuda"), 0xFF)
    partial = torch.randn(N, ROWS, H // N, D, generator=generator).to(torch.bfloat16).cuda()
    maximum = (torch.randn(N, ROWS, H // N, generator=generator) * 4).cuda()
    total = (1 + 8 * torch.rand(N, ROWS, H // N, generator=generator)).cuda()
    maximum[0, 0], total[1, 1] = float("-inf"), 0.0  # empty entries (NaN payload behind them: bytes 0xFF)
    bufs.payload_view(ROWS).copy_(partial)
    bufs.payload_view(ROWS)[0, 0].view(torch.int16).fill_(-1)
    bufs.payload_view(ROWS)[1, 1].view(torch.int16).fill_(-1)
    bufs.max_view(ROWS).copy_(maximum)
    bufs.sum_view(ROWS).copy_(total)
    for base in ("e", "2"):
        got, got_lse = module.combine(bufs, ROWS, lse_base=base, return_lse=True, scale=0.25)
        want, want_lse = reference.combine(bufs, ROWS, base, return_lse=True, scale=0.25)
        assert got_lse is not None and want_lse is not None
        valid = torch.nan_to_num(bufs.payload_view(ROWS).double(), nan=0.0)
        assert combine_error(got.cpu(), want.cpu(), float(valid.abs().max()) * 0.25) <= 1.0
        assert lse_error(got_lse.cpu(), want_lse.cpu()) <= 1.0


@pytest.mark.parametrize("spec_name", ["trtllm_helix_nccl", "trtllm_helix_native_v1", "trtllm_helix_native_v2"])
def test_max_sum_rows_whose_weights_sum_below_2_to_the_minus_64_merge_on_the_gpu(spec_name: str) -> None:
    """The combine lifts such a row by 2^64 before the reciprocal: sums below 1 / FLT_MAX (whose reciprocal
    overflows), just under the lift's bound, and float32's least subnormal (equal maxima: one-bit weights)
    merge as the float64 reference does on the device, where subnormals could be flushed to zero."""
    module = generated_module(spec_name)
    generator = torch.Generator().manual_seed(5)
    bufs = fill_bytes(module.alloc(N, ROWS, H, D, torch.float32, "cuda"), 0xFF)
    partial = torch.randn(N, ROWS, H // N, D, generator=generator)
    maximum = torch.randn(N, ROWS, H // N, generator=generator) * 4
    total = 1 + 8 * torch.rand(N, ROWS, H // N, generator=generator)
    for row, tiny in ((0, 1e-39), (1, 5.0e-20), (2, 1.401298464324817e-45)):
        total[:, row] = tiny
    maximum[:, 2] = maximum[0, 2]
    maximum[1:, 3], total[1:, 3] = float("-inf"), 0.0  # one live tiny entry: the merge is its partial
    total[0, 3] = 1e-39
    bufs.payload_view(ROWS).copy_(partial)
    bufs.max_view(ROWS).copy_(maximum)
    bufs.sum_view(ROWS).copy_(total)
    got, got_lse = module.combine(bufs, ROWS, return_lse=True)
    want, want_lse = reference.combine(bufs, ROWS, "e", return_lse=True)
    assert got_lse is not None and want_lse is not None
    assert not bool(torch.isnan(got).any()), "NaN reached the output"
    assert combine_error(got.cpu(), want.cpu(), float(partial.abs().max())) <= 1.0
    assert lse_error(got_lse.cpu(), want_lse.cpu()) <= 1.0
    torch.testing.assert_close(got[3].cpu(), partial[0, 3], rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("batch", [1, 63, 64, 65, 200])
def test_transposing_pack_with_whole_and_partial_tiles(batch: int, tmp_path: Any) -> None:
    """sglang's NPU-path layout ([peer, head, dim + 1, batch] float32, the LSE as element D): whole batch
    tiles take 16-byte stores without the live-batch bound; the remainder takes the bounded stores."""
    fields = {
        "name": "npu_transposed",
        "summary": "x",
        "transport": "all_to_all_single",
        "payload": {"axes": ["peer", "head", "dim", "batch"], "dtype": "float32"},
        "stats": {"placement": "row_tail"},
    }
    module = render_module(make_spec(**fields), tmp_path)
    generator = torch.Generator().manual_seed(batch)
    out = torch.randn(batch, H, D, generator=generator).to(torch.bfloat16).cuda()
    lse = (torch.randn(batch, H, generator=generator) * 4).cuda()
    empty = (torch.rand(batch, generator=generator) < 0.3).cuda()
    for config in (None, PackConfig(block_batch=64, block_head=1, block_dim=64, num_warps=8)):
        for mask in (None, empty):
            bufs = fill_bytes(module.alloc(N, batch + 16, H, D, torch.bfloat16, "cuda"))
            module.pack(out, lse, bufs, empty=mask, config=config)
            want = fill_bytes(LayoutBuffers.allocate(module.SPEC, N, batch + 16, H, D, torch.bfloat16, "cuda"))
            reference.pack(out, lse, want, empty=mask)
            torch.cuda.synchronize()
            assert_same_bytes(bufs, want, f"B={batch} config={config} masked={mask is not None}")


@pytest.mark.parametrize(
    "axes", [["head", "dim", "batch", "peer"], ["batch", "dim", "head", "peer"], ["batch", "dim", "peer", "head"]]
)
@pytest.mark.parametrize("batch", [1, 7, 200])
def test_pack_of_peer_pairs_on_the_gpu(axes: list[str], batch: int, tmp_path: Any) -> None:
    """Peer innermost with batch or head right outside it: the pack tiles flat runs of (X, peer) pairs, whole
    and partial, at N 3 (pairs cross a run's end mid-row) and 4, lse and (max, sum) inputs, masked and not,
    the default box and explicit ones; and runs of (peer, head) pairs where head is innermost."""
    fields = {
        "name": "pairs_" + "_".join(axes),
        "summary": "x",
        "transport": "external",
        "payload": {"axes": axes, "dtype": "input"},
        "stats": {"placement": "separate", "axes": ["slot", "head", "batch", "peer"], "form": "max_sum"},
    }
    module = render_module(make_spec(**fields), tmp_path)
    generator = torch.Generator().manual_seed(batch)
    configs = (
        None,
        PackConfig(block_batch=16, block_head=1, block_dim=64, block_peer=8),
        PackConfig(block_batch=1, block_head=32, block_dim=32, block_peer=1, num_warps=8),
    )
    for peers in (3, 4):
        heads = 8 * peers
        out = torch.randn(batch, heads, D, generator=generator).to(torch.bfloat16).cuda()
        maximum = (torch.randn(batch, heads, generator=generator) * 4).cuda()
        total = (1 + 8 * torch.rand(batch, heads, generator=generator)).cuda()
        empty = (torch.rand(batch, generator=generator) < 0.3).cuda()
        for config, mask, with_lse in itertools.product(configs, (None, empty), (False, True)):
            bufs = fill_bytes(module.alloc(peers, batch + 5, heads, D, torch.bfloat16, "cuda"))
            want = fill_bytes(LayoutBuffers.allocate(module.SPEC, peers, batch + 5, heads, D, torch.bfloat16, "cuda"))
            if with_lse:
                module.pack(out, maximum, bufs, empty=mask, config=config)
                reference.pack(out, maximum, want, empty=mask)
            else:
                module.pack(out, bufs=bufs, max_sum=(maximum, total), empty=mask, config=config)
                reference.pack(out, None, want, empty=mask, max_sum=(maximum, total))
            torch.cuda.synchronize()
            assert_same_bytes(bufs, want, f"{axes} N={peers} B={batch} config={config} masked={mask is not None}")


def test_lse_from_max_sum_on_the_gpu_is_within_one_ulp() -> None:
    module = generated_module("vllm_a2a")
    generator = torch.Generator().manual_seed(5)
    B = 64
    maximum = (torch.randn(B, H, generator=generator) * 30).cuda()
    total = torch.exp(torch.randn(B, H, generator=generator) * 5).cuda()
    maximum[:, 0] = -torch.log(total[:, 0])  # cancellation: the exact LSE is ~0
    out = torch.randn(B, H, D, generator=generator).to(torch.bfloat16).cuda()
    bufs = module.alloc(N, B, H, D, torch.bfloat16, "cuda")
    module.pack(out, bufs=bufs, max_sum=(maximum, total))
    got = bufs.lse_view(B).cpu()
    want = reference.lse_from_max_sum(maximum.cpu(), total.cpu()).reshape(B, N, H // N).permute(1, 0, 2)
    got_bits, want_bits = got.contiguous().view(torch.int32).long(), want.contiguous().view(torch.int32).long()
    assert bool(((got_bits - want_bits).abs() <= 1).all()), "an LSE word is more than one float32 ulp off"


@pytest.mark.parametrize(
    "axes",
    [
        ["head", "dim", "batch", "peer"],
        ["batch", "dim", "head", "peer"],
        ["batch", "head", "dim", "peer"],
        ["peer", "dim", "head", "batch"],
        ["head", "dim", "peer", "batch"],
    ],
)
def test_peer_innermost_combine_against_the_float64_reference_on_the_gpu(axes: list[str], tmp_path: Any) -> None:
    """Peer innermost (batch or head outside it: the peers in the tile, padded to 4 at N 3; dim outside it:
    one peer at a time), and the stats' peer-at-stride-1 tile under payloads with batch innermost: N 3 and 4,
    (max, sum) stats [batch, head, slot, peer] with empty entries whose payload is NaN, the default box and an
    explicit one."""
    from layoutgen.dcp.config import CombineConfig

    fields = {
        "name": "peer_inner_" + "_".join(axes),
        "summary": "x",
        "transport": "external",
        "payload": {"axes": axes, "dtype": "input"},
        "stats": {"placement": "separate", "axes": ["batch", "head", "slot", "peer"], "form": "max_sum"},
    }
    module = render_module(make_spec(**fields), tmp_path)
    generator = torch.Generator().manual_seed(7)
    for peers, heads in ((3, 24), (4, H)):
        bufs = fill_bytes(module.alloc(peers, ROWS, heads, D, torch.bfloat16, "cuda"), 0xFF)
        shape = (peers, ROWS, heads // peers)
        bufs.payload_view(ROWS).copy_(torch.randn(*shape, D, generator=generator).to(torch.bfloat16))
        maximum = torch.randn(*shape, generator=generator) * 4
        total = 1 + 8 * torch.rand(*shape, generator=generator)
        maximum[0, 0], total[1, 1] = float("-inf"), 0.0
        maximum[:, 2, 0] = float("-inf")  # every peer empty
        bufs.max_view(ROWS).copy_(maximum)
        bufs.sum_view(ROWS).copy_(total)
        for entry in ((0, 0), (1, 1), *((peer, 2, 0) for peer in range(peers))):
            bufs.payload_view(ROWS)[entry].view(torch.int16).fill_(-1)  # NaN behind the empty entries
        configs = [None, CombineConfig(block_batch=32, block_head=1, block_dim=32, num_warps=4)]
        if axes[-1] == "batch":  # the stats tile takes programs of 128 rows and more
            configs.append(CombineConfig(block_batch=128, block_head=1, block_dim=16, num_warps=4))
        for config in configs:
            got, got_lse = module.combine(bufs, ROWS, return_lse=True, config=config)
            want, want_lse = reference.combine(bufs, ROWS, "e", return_lse=True)
            assert got_lse is not None and want_lse is not None
            valid = torch.nan_to_num(bufs.payload_view(ROWS).double(), nan=0.0)
            assert not got.isnan().any(), (axes, peers, config)
            assert combine_error(got.cpu(), want.cpu(), float(valid.abs().max())) <= 1.0, (axes, peers, config)
            assert lse_error(got_lse.cpu(), want_lse.cpu()) <= 1.0
            assert torch.equal(got[2, 0].cpu(), torch.zeros(D, dtype=torch.bfloat16))
