"""GPU only: the fp8 wire (issue 22) on the device, byte for byte against the CPU reference.

The GPU kernels take paths the interpreter cannot: `cvt.rn.satfinite` for the codes and, for tiles whose
blocks are all finite with amax 0 or in [2^-60, 2^100], a per-block reciprocal with Markstein's correction
instead of `div.rn` per element (`layoutgen.dcp.templates.pack_fp8.py.jinja`).  So the pack bytes (codes
and scales) are compared with `layoutgen.dcp.reference.pack` run on CPU copies of the inputs, on random
rows and on rows built to hit every corner: quotients on fp8 rounding midpoints and one float32 ulp either
side (ties to even), a block whose amax is exactly FMAX, values that round up to FMAX, all-zero rows,
-0.0, one huge element, subnormal-only rows, blocks outside the fast path's range, NaN and +-inf elements;
at several tiles and warps, for e4m3fn and e5m2, per-row and 32-element scale blocks, row-tail and
separate scales, masked rows.  Combine is judged against the float64 merge of the dequantised partials,
with NaN codes and scales behind empty entries; pack and combine replay from a CUDA graph.

Run on the device: `python -m pytest -q -m gpu tests/gpu/test_dcp_fp8_gpu.py`.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
from conftest import assert_same_bytes, fill_bytes, generated_module, make_spec, render_module

from layoutgen.dcp import reference
from layoutgen.dcp.config import CombineConfig, PackConfig
from layoutgen.dcp.layout import LayoutBuffers
from layoutgen.dcp.tolerances import combine_error, lse_error
from layoutgen.runtime import reset_caches

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.filterwarnings("ignore::layoutgen.runtime.LayoutgenWarning"),
]

#: Rendered beside the bundled pynccl_a2a_fp8 / vllm_a2a_fp8: e5m2, 32-element blocks, (max, sum) in a row
#: tail, a transposing layout with batch-innermost scales, and layouts with batch, peer or head innermost (peer
#: innermost with batch or head right outside it: the pack's runs of pairs; head innermost with batch-innermost
#: scales, whose default box holds a sector of scales).
EXTRA = {
    "fp8_e5m2_blocks": {
        "name": "fp8_e5m2_blocks",
        "transport": "all_to_all_single",
        "payload": {"axes": ["peer", "batch", "head", "dim"], "dtype": "float8_e5m2", "scale_block": 32},
        "stats": {"placement": "row_tail", "form": "max_sum"},
        "align_bytes": 16,
    },
    "fp8_blocks_separate": {
        "name": "fp8_blocks_separate",
        "transport": "all_to_all_single",
        "payload": {"axes": ["peer", "batch", "head", "dim"], "dtype": "float8_e4m3fn", "scale_block": 32},
        "stats": {"placement": "separate", "axes": ["peer", "batch", "head", "slot"]},
    },
    "fp8_batch_inner": {
        "name": "fp8_batch_inner",
        "transport": "external",
        "payload": {
            "axes": ["peer", "head", "dim", "batch"],
            "dtype": "float8_e4m3fn",
            "scale_block": 64,
            "scale_axes": ["peer", "head", "block", "batch"],
        },
        "stats": {"placement": "separate", "axes": ["peer", "head", "slot", "batch"]},
    },
    "fp8_peer_inner": {
        "name": "fp8_peer_inner",
        "transport": "external",
        "payload": {
            "axes": ["head", "dim", "batch", "peer"],
            "dtype": "float8_e4m3fn",
            "scale_block": 16,
            "scale_axes": ["block", "head", "batch", "peer"],
        },
        "stats": {"placement": "separate", "axes": ["slot", "head", "batch", "peer"], "slots": 2, "slot": 1},
    },
    "fp8_head_inner_scales_batch": {
        "name": "fp8_head_inner_scales_batch",
        "transport": "external",
        "payload": {
            "axes": ["peer", "dim", "batch", "head"],
            "dtype": "float8_e4m3fn",
            "scale_block": 32,
            "scale_axes": ["head", "peer", "block", "batch"],
        },
        "stats": {"placement": "separate", "axes": ["peer", "batch", "head", "slot"], "form": "max_sum"},
    },
    "fp8_head_peer_pairs": {
        "name": "fp8_head_peer_pairs",
        "transport": "external",
        "payload": {"axes": ["batch", "dim", "head", "peer"], "dtype": "float8_e5m2"},
        "stats": {"placement": "separate", "axes": ["batch", "head", "slot", "peer"], "form": "max_sum"},
    },
    "fp8_head_inner": {
        "name": "fp8_head_inner",
        "transport": "external",
        "payload": {"axes": ["batch", "dim", "peer", "head"], "dtype": "float8_e4m3fn"},
        "stats": {"placement": "separate", "axes": ["slot", "batch", "head", "peer"], "form": "max_sum"},
    },
}
SPECS = ["pynccl_a2a_fp8", "vllm_a2a_fp8", *EXTRA]
N, H, D = 4, 32, 128


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModuleType]:
    found = {name: generated_module(name) for name in SPECS if name not in EXTRA}
    directory = tmp_path_factory.mktemp("fp8_gpu")
    found.update({name: render_module(make_spec(**fields), directory) for name, fields in EXTRA.items()})
    return found


@pytest.fixture(autouse=True)
def fresh() -> None:
    reset_caches()


def fp8_values(dtype: torch.dtype) -> torch.Tensor:
    """Every finite value of an fp8 dtype, ascending."""
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    return values[values.isfinite()].unique()


def awkward_rows(spec: Any, B: int, generator: torch.Generator, *, H: int = H, D: int = D) -> torch.Tensor:
    """float32 out [B, H, D] (H >= 9): random rows, then rows built to hit each corner of the quantisation."""
    fmax = spec.fp8_max
    wire = torch.float8_e4m3fn if spec.payload.dtype.value == "float8_e4m3fn" else torch.float8_e5m2
    out = torch.randn(B, H, D, generator=generator) * torch.exp2(torch.randint(-8, 8, (B, H, 1), generator=generator))
    codes = fp8_values(wire)
    midpoints = (codes[1:] + codes[:-1]) / 2
    targets = torch.cat([codes, midpoints])
    for b in range(min(B, 8)):
        for h in range(H):
            scale = float(torch.rand((), generator=generator)) * 2.0 ** int(torch.randint(-20, 20, ()))
            picked = targets[torch.randint(0, targets.numel(), (D,), generator=generator)]
            row = (picked.double() * scale).float()
            bits = row.view(torch.int32) + torch.randint(-1, 2, (D,), generator=generator, dtype=torch.int32)
            row = bits.view(torch.float32)
            row[0] = fmax * scale  # the block's amax: its quotient is exactly FMAX
            out[b, h] = row
    corner = 8 % B
    out[corner, 0] = 0.0  # all zero: scale 1, zero codes
    out[corner, 1] = -0.0  # negative zeros stay 0x80
    out[corner, 2, 5] = 3e38  # one huge element (outside the fast path's range)
    out[corner, 3] = torch.rand(D, generator=generator) * 1e-39  # subnormal only
    out[corner, 4, 7] = float("nan")
    out[corner, 5, 9] = float("inf")
    out[corner, 6, 11] = float("-inf")
    out[corner, 7] = torch.linspace(-fmax, fmax, D) * (1 + 2**-10)  # values that round to +-FMAX
    out[corner, 8] = torch.randn(D, generator=generator) * 1e-25  # below the fast path's range
    return out


def reference_bytes(
    spec: Any, out: torch.Tensor, lse: torch.Tensor, empty: torch.Tensor | None, capacity: int | None = None
) -> LayoutBuffers:
    B, heads, width = out.shape
    want = fill_bytes(LayoutBuffers.allocate(spec, N, capacity or B, heads, width, out.dtype, "cpu"))
    reference.pack(out.cpu(), lse.cpu(), want, empty=None if empty is None else empty.cpu())
    return want


def to_cpu(bufs: LayoutBuffers) -> LayoutBuffers:
    return LayoutBuffers(bufs.spec, bufs.shape, {name: t.cpu() for name, t in bufs.tensors.items()})


CONFIGS = [
    None,
    PackConfig(block_peer=1, block_batch=1, block_head=8, block_dim=128, num_warps=4),
    PackConfig(block_peer=2, block_batch=2, block_head=2, block_dim=128, num_warps=2),
    PackConfig(block_peer=1, block_batch=4, block_head=1, block_dim=128, num_warps=1),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("spec_name", SPECS)
def test_fp8_pack_is_byte_exact_on_the_gpu(spec_name: str, dtype: torch.dtype, modules: dict[str, ModuleType]) -> None:
    module = modules[spec_name]
    generator = torch.Generator().manual_seed(22)
    for B in (1, 13, 64):
        out = awkward_rows(module.SPEC, B, generator)
        if dtype is torch.float16:
            out = out.clamp(-6e4, 6e4)
        out = out.to(dtype)
        lse = torch.randn(B, H, generator=generator) * 4
        empty = torch.rand(B, generator=generator) < 0.2
        for masked in (None, empty):
            want = reference_bytes(module.SPEC, out, lse, masked)
            for config in CONFIGS:
                if config is not None and module.SPEC.payload.axes[-1] == "batch":
                    config = PackConfig(block_peer=1, block_batch=16, block_head=1, block_dim=128, num_warps=4)
                bufs = fill_bytes(module.alloc(N, B, H, D, dtype, "cuda"))
                module.pack(
                    out.cuda(), lse.cuda(), bufs, empty=None if masked is None else masked.cuda(), config=config
                )
                torch.cuda.synchronize()
                assert_same_bytes(to_cpu(bufs), want, f"{spec_name} {dtype} B={B} masked={masked is not None} {config}")


def check_masked_packs(
    module: ModuleType, B: int, heads: int, width: int, configs: list[Any], generator: torch.Generator,
    capacity: int | None = None,
) -> None:  # fmt: skip
    """bf16 awkward rows [B, heads, width], a quarter of the requests empty, packed with each config into
    canary-filled buffers of `capacity` rows (B unless given): byte for byte the reference's."""
    out = awkward_rows(module.SPEC, B, generator, H=heads, D=width).to(torch.bfloat16)
    lse = torch.randn(B, heads, generator=generator) * 4
    empty = torch.rand(B, generator=generator) < 0.25
    want = reference_bytes(module.SPEC, out, lse, empty, capacity)
    for config in configs:
        bufs = fill_bytes(module.alloc(N, capacity or B, heads, width, torch.bfloat16, "cuda"))
        module.pack(out.cuda(), lse.cuda(), bufs, empty=empty.cuda(), config=config)
        torch.cuda.synchronize()
        assert_same_bytes(to_cpu(bufs), want, f"{module.SPEC.name} D={width} B={B} {config}")


@pytest.mark.parametrize("spec_name", ["pynccl_a2a_fp8", "vllm_a2a_fp8", "fp8_e5m2_blocks"])
def test_fp8_pack_is_byte_exact_at_the_mla_width(spec_name: str, modules: dict[str, ModuleType]) -> None:
    """D 512 (MLA decode, the width the database is tuned at): one scale per 512 or per 32 elements, the
    dispatched config and tiles that split a row's block or hold several blocks."""
    module = modules[spec_name]
    heads, width = 16, 512
    generator = torch.Generator().manual_seed(512)
    configs = [
        None,
        PackConfig(block_peer=1, block_batch=1, block_head=2, block_dim=512, num_warps=4),
        PackConfig(block_peer=1, block_batch=2, block_head=1, block_dim=512, num_warps=8),
    ]
    if module.SPEC.scale_block_of(width) < width:  # a tile of four 32-element blocks, a quarter of the row
        configs.append(PackConfig(block_peer=1, block_batch=2, block_head=2, block_dim=128, num_warps=4))
    for B in (1, 37, 256):
        check_masked_packs(module, B, heads, width, configs, generator)


def test_fp8_pack_in_words_is_byte_exact_on_the_gpu(modules: dict[str, ModuleType]) -> None:
    """batch innermost in one pass: four rows' codes per 32-bit word (whole tiles), byte by byte in a last tile
    that is not whole, and a capacity that is not whole words (the byte path throughout)."""
    module = modules["fp8_batch_inner"]
    generator = torch.Generator().manual_seed(4)
    configs = [
        PackConfig(block_peer=1, block_batch=4, block_head=1, block_dim=64, num_warps=1),
        PackConfig(block_peer=1, block_batch=16, block_head=2, block_dim=128, num_warps=4),
        PackConfig(block_peer=2, block_batch=64, block_head=1, block_dim=64, num_warps=4),
    ]
    for width in (128, 512):
        for B, capacity in ((64, 64), (37, 40), (37, 37), (1, 4)):
            check_masked_packs(module, B, H, width, configs, generator, capacity)


@pytest.mark.parametrize("spec_name", ["fp8_head_inner", "fp8_batch_inner", "fp8_head_inner_scales_batch"])
def test_fp8_pack_in_chunks_is_byte_exact_on_the_gpu(spec_name: str, modules: dict[str, ModuleType]) -> None:
    """Transposing fp8 layouts walk a scale block in chunks of the tile (two passes: the amax, then the codes,
    the fast path or the exact one per tile): one scale per row, per 64 or per 32 elements (the last with its
    scales along batch: the default box of several rows), at D 128 and 512, and for one scale per row at D 576,
    which 256-element chunks do not divide (the third is partial)."""
    module = modules[spec_name]
    generator = torch.Generator().manual_seed(64)
    configs = [
        None,
        PackConfig(block_peer=4, block_batch=1, block_head=8, block_dim=16, num_warps=4),
        PackConfig(block_peer=2, block_batch=2, block_head=4, block_dim=32, num_warps=8),
        PackConfig(block_peer=1, block_batch=16, block_head=1, block_dim=64, num_warps=4),
        PackConfig(block_peer=1, block_batch=1, block_head=4, block_dim=256, num_warps=4),
    ]
    widths = (128, 512, 576) if module.SPEC.payload.scale_block is None else (128, 512)
    for width in widths:
        for B in (1, 37):
            check_masked_packs(module, B, H, width, configs, generator)


def test_every_rounding_midpoint_of_e4m3fn_on_the_gpu(modules: dict[str, ModuleType]) -> None:
    """One block per row, each element a quotient on an fp8 midpoint, or one float32 ulp either side of it,
    under thousands of random scales: the ties, the Markstein division and cvt.rn.satfinite all at once."""
    module = modules["pynccl_a2a_fp8"]
    generator = torch.Generator().manual_seed(7)
    codes = fp8_values(torch.float8_e4m3fn)
    midpoints = ((codes[1:] + codes[:-1]) / 2).float()
    B = 64
    for _ in range(4):
        scales = torch.rand(B, H, 1, generator=generator) * torch.exp2(
            torch.randint(-40, 40, (B, H, 1), generator=generator)
        )
        picked = midpoints[torch.randint(0, midpoints.numel(), (B, H, D), generator=generator)]
        out = (picked.double() * scales.double()).float()
        out = (out.view(torch.int32) + torch.randint(-1, 2, out.shape, generator=generator, dtype=torch.int32)).view(
            torch.float32
        )
        out[..., 0] = 448.0 * scales[..., 0]
        lse = torch.zeros(B, H)
        want = reference_bytes(module.SPEC, out, lse, None)
        bufs = fill_bytes(module.alloc(N, B, H, D, torch.float32, "cuda"))
        module.pack(out.cuda(), lse.cuda(), bufs)
        torch.cuda.synchronize()
        assert_same_bytes(to_cpu(bufs), want, "midpoints")


@pytest.mark.parametrize("spec_name", SPECS)
def test_fp8_combine_on_the_gpu(spec_name: str, modules: dict[str, ModuleType]) -> None:
    """pack -> exchange -> combine on the device against the float64 merge of the dequantised partials; the
    empty entries' codes and scales hold NaN (0xFF bytes) and never reach the output."""
    module = modules[spec_name]
    generator = torch.Generator().manual_seed(5)
    B = 24
    outs = [torch.randn(B, H, D, generator=generator).to(torch.bfloat16) for _ in range(N)]
    lses = [torch.randn(B, H, generator=generator) * 4 for _ in range(N)]
    lses[1][3] = float("-inf")  # empty shards
    lses[2][:, 0] = float("nan")
    sends = []
    for rank in range(N):
        bufs = fill_bytes(module.alloc(N, B, H, D, torch.bfloat16, "cuda"))
        module.pack(outs[rank].cuda(), lses[rank].cuda(), bufs)
        sends.append(bufs)
    received = reference.exchange(sends)
    for rank in range(N):
        recv = received[rank]
        stats = recv.max_view(B) if module.SPEC.max_sum else recv.lse_view(B)
        empty = ~stats.isfinite()
        recv.payload_view(B).view(torch.uint8)[empty] = 0xFF  # NaN codes ...
        recv.scale_view(B)[empty] = float("nan")  # ... and NaN scales behind the empty entries
        want, want_lse = reference.combine(to_cpu(recv), B, "e", return_lse=True)
        partials = reference.received_partials(to_cpu(recv), B)
        scale = float(partials.abs().where(~empty.cpu()[..., None], 0.0).max())
        configs = [None, CombineConfig(block_batch=1, block_head=2, block_dim=32, num_warps=1)]
        if module.SPEC.payload.axes[-1] == "batch":  # the defaults' wide boxes at large batch: 64 and 128 dims
            configs += [CombineConfig(block_batch=32, block_head=1, block_dim=width, num_warps=1) for width in (64, D)]
        for config in configs:
            got, got_lse = module.combine(recv, B, return_lse=True, config=config)
            assert not got.isnan().any()
            assert combine_error(got.cpu(), want, scale) <= 1.0, (spec_name, rank, config)
            assert got_lse is not None and lse_error(got_lse.cpu(), want_lse) <= 1.0


def test_fp8_pack_and_combine_replay_from_a_cuda_graph(modules: dict[str, ModuleType]) -> None:
    module = modules["pynccl_a2a_fp8"]
    B = 16
    out = torch.randn(B, H, D, device="cuda").to(torch.bfloat16)
    lse = torch.randn(B, H, device="cuda")
    send = fill_bytes(module.alloc(N, B, H, D, torch.bfloat16, "cuda"))
    merged = torch.empty(B, H // N, D, dtype=torch.bfloat16, device="cuda")
    module.pack(out, lse, send)  # plans and compiles before capture
    module.combine(send, B, out=merged)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        module.pack(out, lse, send)
        module.combine(send, B, out=merged)
    out.copy_(torch.randn(B, H, D, device="cuda").to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    want = reference_bytes(module.SPEC, out.cpu(), lse.cpu(), None)
    assert_same_bytes(to_cpu(send), want, "graph replay")
    eager, _ = module.combine(send, B)
    assert torch.equal(eager, merged)


@pytest.mark.parametrize("wire", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_the_reference_quantises_the_same_on_the_gpu(wire: torch.dtype) -> None:
    """The tuner's gate runs the torch reference on the device: its codes and scales there must be the CPU's
    (a scalar divisor made them differ in 0.2% of the bytes on the H200, see `layoutgen.dcp.quant`)."""
    from layoutgen.dcp import quant

    generator = torch.Generator().manual_seed(11)
    values = torch.randn(256, 512, generator=generator) * torch.exp2(
        torch.randint(-20, 20, (256, 1), generator=generator)
    )
    for block in (512, 32):
        codes, scales = quant.quantise(values, block, wire)
        gpu_codes, gpu_scales = quant.quantise(values.cuda(), block, wire)
        assert torch.equal(gpu_scales.cpu().view(torch.int32), scales.view(torch.int32)), f"scales, block {block}"
        assert torch.equal(gpu_codes.cpu().view(torch.uint8), codes.view(torch.uint8)), f"codes, block {block}"
