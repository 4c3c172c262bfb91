"""DCP contract v2 combine (the brief's DESIGN.md §8.3): (max, sum) stats, the output scale, and masked packs end to end.

Receive buffers hold NaN in every byte the layout does not assign, so a combine that reads one, or lets an
empty entry's payload through, produces NaN and fails.  Results are compared with the float64 reference
(`layoutgen.dcp.reference.merge_max_sum` / `merge_partials`) within `layoutgen.dcp.tolerances`.

TensorRT-LLM's helix post-processing is checked against the baseline of its own test
(tests/unittest/_torch/thop/parallel_hw_agnostic/test_helix_postprocess.py), restated in
`helix_baseline` below, on its three layouts and its shapes, including the empty-rank case.
"""

from __future__ import annotations

import fractions
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from conftest import NAN_BYTE, requires_interpreter
from test_dcp_v2_pack import SPEC_NAMES, fill, load_v2_modules, random_max_sum

from layoutgen.config import next_pow2
from layoutgen.dcp import reference
from layoutgen.dcp.config import CombineConfig, PackConfig
from layoutgen.dcp.layout import wire_dtype
from layoutgen.dcp.tolerances import combine_error, lse_error

pytestmark = [requires_interpreter, pytest.mark.usefixtures("no_log_warnings")]

INF, NAN = float("inf"), float("nan")
HELIX = ("trtllm_helix_nccl", "trtllm_helix_native_v1", "trtllm_helix_native_v2")
MAX_SUM_SPECS = (*HELIX, "npu_max_sum", "slots_swapped", "tail_max_sum", "stats_peer_inner")


@pytest.fixture(scope="module")
def v2_modules(tmp_path_factory: pytest.TempPathFactory, spec_modules: dict[str, ModuleType]) -> dict[str, ModuleType]:
    return load_v2_modules(tmp_path_factory.mktemp("dcp_v2"), spec_modules)


def wide_combine(B: int, h: int, D: int) -> CombineConfig:
    """Few, large programs: the interpreter runs programs one after another (the default tiles are tested
    elsewhere)."""
    return CombineConfig(block_batch=min(next_pow2(B), 16), block_head=min(next_pow2(h), 8), block_dim=next_pow2(D))


def wide_pack(N: int, B: int, h: int, D: int) -> PackConfig:
    return PackConfig(
        block_peer=next_pow2(N),
        block_batch=min(next_pow2(B), 8),
        block_head=min(next_pow2(h), 8),
        block_dim=next_pow2(D),
    )


def max_sum_buffers(
    module: ModuleType, partial_out: torch.Tensor, maximum: torch.Tensor, total: torch.Tensor, B_max: int
) -> Any:
    """Receive buffers of a (max, sum) spec as a transport delivers them: partials [N, B, h, D] and their
    stats [N, B, h] in place, NaN in every other byte."""
    N, B, h, D = partial_out.shape
    bufs = fill(module.alloc(N, B_max, N * h, D, partial_out.dtype), NAN_BYTE)
    bufs.payload_view(B).copy_(partial_out.to(wire_dtype(module.SPEC, partial_out.dtype)))
    bufs.max_view(B).copy_(maximum)
    bufs.sum_view(B).copy_(total)
    return bufs


def taking_part_scale(partial_out: torch.Tensor, maximum: torch.Tensor, total: torch.Tensor) -> float:
    """The largest |partial| that takes part (the tolerance's absolute scale)."""
    m, s = reference.sanitize_max_sum(maximum, total)
    values = partial_out.double()[(s > 0) & (m > -INF)]
    return float(values.abs().max()) if values.numel() else 0.0


def check_max_sum_combine(
    module: ModuleType,
    bufs: Any,
    partial_out: torch.Tensor,
    maximum: torch.Tensor,
    total: torch.Tensor,
    base: str,
    scale: float = 1.0,
    config: CombineConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    B = partial_out.shape[1]
    got, got_lse = module.combine(bufs, B, lse_base=base, return_lse=True, scale=scale, config=config)
    want, want_lse = reference.merge_max_sum(partial_out, maximum, total, base, scale)
    assert got_lse is not None
    assert not bool(torch.isnan(got).any()), "NaN reached the output"
    error = combine_error(got, want, taking_part_scale(partial_out, maximum, total) * abs(scale))
    assert error <= 1.0, f"combine off by {error:.2f}x the tolerance"
    assert lse_error(got_lse, want_lse) <= 1.0, f"LSE off by {lse_error(got_lse, want_lse):.2f}x"
    # The same numbers from the reference's own view of the buffers (up to float64 summation order).
    again, again_lse = reference.combine(bufs, B, base, return_lse=True, scale=scale)
    assert again_lse is not None
    torch.testing.assert_close(again, want, rtol=1e-12, atol=0.0)
    torch.testing.assert_close(again_lse, want_lse, rtol=1e-12, atol=0.0)
    return got, got_lse


# (dtype, N, B, B_max, h, D): awkward extents, N = 1 included.
MAX_SUM_SHAPES = {
    "trtllm_helix_nccl": (torch.bfloat16, 4, 3, 5, 3, 13),
    "trtllm_helix_native_v1": (torch.float16, 3, 2, 2, 1, 24),
    "trtllm_helix_native_v2": (torch.float32, 1, 4, 6, 2, 7),
    "npu_max_sum": (torch.float16, 2, 5, 5, 2, 10),
    "slots_swapped": (torch.bfloat16, 8, 1, 3, 2, 8),
    "tail_max_sum": (torch.float32, 2, 2, 3, 3, 12),
    "stats_peer_inner": (torch.bfloat16, 3, 5, 6, 2, 20),
}


@pytest.mark.parametrize("base", ["e", "2"])
@pytest.mark.parametrize("spec_name", MAX_SUM_SPECS)
def test_max_sum_combine_matches_the_float64_reference(
    spec_name: str, base: str, v2_modules: dict[str, ModuleType], generator: Any
) -> None:
    dtype, N, B, B_max, h, D = MAX_SUM_SHAPES[spec_name]
    partial_out = torch.randn(N, B, h, D, generator=generator).to(dtype)
    maximum, total = random_max_sum((N, B, h), generator)
    module = v2_modules[spec_name]
    check_max_sum_combine(
        module, max_sum_buffers(module, partial_out, maximum, total, B_max), partial_out, maximum, total, base
    )
    # Without the merged LSE: the same output.
    got, got_lse = module.combine(max_sum_buffers(module, partial_out, maximum, total, B_max), B, lse_base=base)
    want, _ = module.combine(
        max_sum_buffers(module, partial_out, maximum, total, B_max), B, lse_base=base, return_lse=True
    )
    assert got_lse is None and torch.equal(got, want)


@pytest.mark.parametrize("spec_name", ["stats_peer_inner", "stats_peer_inner_lse"])
def test_stats_with_peer_at_stride_one_load_as_a_tile_in_long_runs_of_rows(
    spec_name: str, v2_modules: dict[str, ModuleType], generator: Any
) -> None:
    """Programs of 128 rows and more load a row's N stats as one tile (`stats_peer_tile`), fewer one per peer:
    both against the float64 merge, over a whole tile of rows and a partial one, N 3 (the tile padded to 4),
    an empty entry and a row empty on every peer with NaN payload behind them."""
    module = v2_modules[spec_name]
    N, B, h, D = 3, 130, 2, 20
    bufs = lse_buffers(module, N, B, h, D, torch.bfloat16, generator)
    stats = bufs.stats_views(B)
    first = stats["max" if module.SPEC.max_sum else "lse"]
    first[:, 129, 1] = -INF  # every peer empty
    bufs.payload_view(B)[:, 129, 1] = NAN
    want, want_lse = reference.combine(bufs, B, "e", return_lse=True)
    payload = bufs.payload_view(B).double()
    valid = payload.where(first.isfinite()[..., None], 0.0)
    for rows in (128, 256, 64):
        config = CombineConfig(block_batch=rows, block_head=1, block_dim=16, num_warps=4)
        got, got_lse = module.combine(bufs, B, return_lse=True, config=config)
        assert got_lse is not None and want_lse is not None
        assert not bool(torch.isnan(got).any()), rows
        assert combine_error(got, want, float(valid.abs().max())) <= 1.0, rows
        assert lse_error(got_lse, want_lse) <= 1.0, rows
        assert torch.equal(got[129, 1], torch.zeros(D, dtype=torch.bfloat16)), rows


#: (max, sum) entries that are empty, each with a NaN payload behind it.
EMPTY_ENTRIES = ((-INF, 0.0), (NAN, 1.0), (INF, 1.0), (1.0, 0.0), (1.0, -2.0), (1.0, NAN), (1.0, INF), (-INF, 5.0))


@pytest.mark.parametrize("base", ["e", "2"])
@pytest.mark.parametrize("spec_name", HELIX)
def test_empty_entries_contribute_nothing_even_with_nan_payload(
    spec_name: str, base: str, v2_modules: dict[str, ModuleType], generator: Any
) -> None:
    module = v2_modules[spec_name]
    N, B, h, D = 3, len(EMPTY_ENTRIES) + 1, 2, 12
    partial_out = torch.randn(N, B, h, D, generator=generator).to(torch.bfloat16)
    maximum, total = random_max_sum((N, B, h), generator)
    for b, (m, s) in enumerate(EMPTY_ENTRIES):  # row b: peer 0's entry of head 0 is empty
        maximum[0, b, 0], total[0, b, 0] = m, s
        partial_out[0, b, 0] = NAN
    maximum[:, -1, 1], total[:, -1, 1] = torch.tensor([-INF, NAN, 1.0]), torch.tensor([0.0, 1.0, 0.0])
    partial_out[:, -1, 1] = NAN  # a row where every entry is empty
    bufs = max_sum_buffers(module, partial_out, maximum, total, B)
    got, got_lse = check_max_sum_combine(module, bufs, partial_out, maximum, total, base)
    assert torch.equal(got[-1, 1], torch.zeros(D, dtype=torch.bfloat16)), "an all-empty row must be exactly 0"
    assert got_lse[-1, 1] == -INF
    # Each row with one empty entry is the merge of the other two peers alone.
    for b in range(len(EMPTY_ENTRIES)):
        others, _ = reference.merge_max_sum(
            partial_out[1:, b : b + 1, :1], maximum[1:, b : b + 1, :1], total[1:, b : b + 1, :1], base
        )
        assert combine_error(got[b : b + 1, :1], others, float(partial_out[1:, b, 0].abs().max())) <= 1.0


def test_max_sum_and_lse_forms_agree(v2_modules: dict[str, ModuleType], generator: Any) -> None:
    """(m, s) and lse = m + log(s) are the same partial: the two forms merge to the same result."""
    N, B, h, D = 4, 3, 2, 16
    partial_out = torch.randn(N, B, h, D, generator=generator).to(torch.float32)
    maximum, total = random_max_sum((N, B, h), generator)
    helix = v2_modules["trtllm_helix_nccl"]
    got, got_lse = helix.combine(max_sum_buffers(helix, partial_out, maximum, total, B), B, return_lse=True)
    vllm = v2_modules["vllm_a2a"]
    bufs = fill(vllm.alloc(N, B, N * h, D, torch.float32), NAN_BYTE)
    bufs.payload_view(B).copy_(partial_out)
    bufs.lse_view(B).copy_(reference.lse_from_max_sum(maximum, total))
    as_lse, as_lse_lse = vllm.combine(bufs, B, return_lse=True)
    want, want_lse = reference.merge_partials(partial_out, maximum.double() + total.double().log())
    for result, lse in ((got, got_lse), (as_lse, as_lse_lse)):
        assert combine_error(result, want, float(partial_out.abs().max())) <= 1.0
        assert lse is not None and lse_error(lse, want_lse) <= 1.0


def test_large_maxima_keep_float32_accuracy(v2_modules: dict[str, ModuleType], generator: Any) -> None:
    """The weights come from (m, s) directly: maxima near +-1e4 (where m + log(s) in float32 would be off by
    ~1e-3 in every weight) still merge to float32 accuracy."""
    module = v2_modules["trtllm_helix_native_v2"]
    N, B, h, D = 4, 3, 2, 8
    partial_out = torch.randn(N, B, h, D, generator=generator)
    maximum = 1e4 + torch.randn(N, B, h, generator=generator)
    maximum[:, 1] -= 2e4
    total = 1 + 8 * torch.rand(N, B, h, generator=generator)
    for base in ("e", "2"):
        bufs = max_sum_buffers(module, partial_out, maximum, total, B)
        _, got_lse = check_max_sum_combine(module, bufs, partial_out, maximum, total, base)
        assert bool(torch.isfinite(got_lse).all())


# (sum, the second entry's max) for live entries whose float32 weights sum below 2^-64, where the combine lifts the
# row by 2^64: below 1 / FLT_MAX (a reciprocal that would overflow), float32's least subnormal (a weight of one
# bit: equal maxima keep both weights exact), and around the bound (row 1's two equal weights sum to exactly
# 2^-64, not lifted, or to the float below it; at 5e-20 row 0 is lifted and row 1, 8e-20, is not).
TINY_SUMS = (
    (1e-39, -0.5),
    (1.401298464324817e-45, 0.0),
    (2.0**-65, 0.0),
    (float(np.nextafter(np.float32(2.0**-65), np.float32(0.0))), 0.0),
    (5.0e-20, -0.5),
)
#: The (max, sum) specs whose combine takes every peer's stats as one tile (the peer-tile weights), with the
#: configs that reach it: peer innermost in the payload (the default), and programs of 128 rows and more.
PEER_TILE_CASES = {
    "batch_peer_pairs": [None],
    "stats_peer_inner": [CombineConfig(block_batch=128, block_head=1, block_dim=8, num_warps=1)],
}


@pytest.mark.parametrize(("total_value", "second_max"), TINY_SUMS)
@pytest.mark.parametrize("spec_name", [*MAX_SUM_SPECS, *PEER_TILE_CASES])
def test_a_row_whose_weights_sum_below_the_float32_reciprocal_range_merges(
    spec_name: str, total_value: float, second_max: float, v2_modules: dict[str, ModuleType], generator: Any
) -> None:
    # Row 0: one live entry beside an empty one (the merge is that partial). Row 1: two live tiny entries.
    # Row 2: ordinary stats beside them (the lift multiplies them by exactly 1).
    module = v2_modules[spec_name]
    N, B, h, D = 2, 3, 2, 8
    partial_out = torch.randn(N, B, h, D, generator=generator)
    maximum, total = torch.randn(N, B, h, generator=generator), 1 + torch.rand(N, B, h, generator=generator)
    maximum[:, :2], total[:, :2] = 0.0, total_value
    maximum[1, 0], total[1, 0] = -INF, 0.0
    maximum[1, 1] = second_max
    for base in ("e", "2"):
        for config in PEER_TILE_CASES.get(spec_name, [None]):
            bufs = max_sum_buffers(module, partial_out, maximum, total, B)
            got, _ = check_max_sum_combine(module, bufs, partial_out, maximum, total, base, config=config)
            torch.testing.assert_close(got[0], partial_out[0, 0].to(got.dtype), rtol=1e-6, atol=0.0)


@pytest.mark.xfail(
    strict=True,
    reason="documented limit (docs/design.md §4.2): weights below float32's normal range keep fewer bits "
    "(1e-43 x exp(-0.5) holds about 7), and the merge leaves the float64 contract's tolerance",
)
def test_a_row_whose_weights_are_subnormal_merges_within_the_tolerance(
    v2_modules: dict[str, ModuleType], generator: Any
) -> None:
    module = v2_modules["trtllm_helix_native_v2"]
    N, B, h, D = 2, 1, 2, 8
    partial_out = torch.randn(N, B, h, D, generator=generator)
    maximum, total = torch.tensor([0.0, -0.5])[:, None, None].expand(N, B, h).clone(), torch.full((N, B, h), 1e-43)
    check_max_sum_combine(
        module, max_sum_buffers(module, partial_out, maximum, total, B), partial_out, maximum, total, "e"
    )


# ---------------------------------------------------------------------------------------------
# The output scale
# ---------------------------------------------------------------------------------------------
def lse_buffers(module: ModuleType, N: int, B: int, h: int, D: int, dtype: torch.dtype, generator: Any) -> Any:
    """Received buffers of any spec, filled in its own stats form (an empty entry with a NaN payload)."""
    bufs = fill(module.alloc(N, B, N * h, D, dtype), NAN_BYTE)
    bufs.payload_view(B).copy_(torch.randn(N, B, h, D, generator=generator).to(dtype))
    for name, view in bufs.stats_views(B).items():
        values = torch.randn(view.shape, generator=generator)
        view.copy_(values * 4 if name != "sum" else 1 + values.abs())
    first = bufs.stats_views(B)["max" if module.SPEC.max_sum else "lse"]
    first[0, 0, 0] = -INF
    bufs.payload_view(B)[0, 0, 0] = NAN
    return bufs


@pytest.mark.parametrize("spec_name", SPEC_NAMES)
def test_scale_one_gives_the_bits_of_no_scale(
    spec_name: str, v2_modules: dict[str, ModuleType], generator: Any
) -> None:
    module = v2_modules[spec_name]
    N, B, h, D = 3, 2, 2, 12
    bufs = lse_buffers(module, N, B, h, D, torch.bfloat16, generator)
    plain, plain_lse = module.combine(bufs, B, return_lse=True)
    for one in (1.0, 1):
        scaled, scaled_lse = module.combine(bufs, B, return_lse=True, scale=one)
        assert torch.equal(scaled.view(torch.uint8), plain.view(torch.uint8))
        assert scaled_lse is not None and plain_lse is not None
        assert torch.equal(scaled_lse.view(torch.uint8), plain_lse.view(torch.uint8))
    assert module._dispatch.combine_plan(bufs, B, "e", None, True, None, 1.0).scale == 1.0


@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "trtllm_helix_native_v1", "npu_like"])
def test_scale_multiplies_the_float32_merge_before_the_cast(
    spec_name: str, v2_modules: dict[str, ModuleType], generator: Any
) -> None:
    module = v2_modules[spec_name]
    N, B, h, D = 2, 3, 2, 8
    # float32 buffers: the output is the float32 accumulator itself, so scale s gives exactly acc * s.
    bufs = lse_buffers(module, N, B, h, D, torch.float32, generator)
    accumulator, lse = module.combine(bufs, B, return_lse=True)
    for scale in (0.5, 0.1, -3.0, 0.0):
        got, got_lse = module.combine(bufs, B, return_lse=True, scale=scale)
        assert torch.equal(got, accumulator * torch.tensor(scale, dtype=torch.float32)), scale
        assert got_lse is not None and lse is not None and torch.equal(got_lse, lse), "the LSE is not scaled"
    # bf16: the scaled float64 merge within the output dtype's rounding; a negative scale keeps the guards.
    bufs = lse_buffers(module, N, B, h, D, torch.bfloat16, generator)
    for scale in (0.7, -2.0):
        got, _ = module.combine(bufs, B, lse_base="2", scale=scale)
        want, _ = reference.combine(bufs, B, "2", scale=scale)
        assert not bool(torch.isnan(got).any())
        valid = torch.nan_to_num(bufs.payload_view(B).double(), nan=0.0)
        assert combine_error(got, want, float(valid.abs().max()) * abs(scale)) <= 1.0


@pytest.mark.parametrize("scale", [True, "1.0", torch.tensor(1.0), None])
def test_scale_must_be_a_number(scale: Any, v2_modules: dict[str, ModuleType]) -> None:
    module = v2_modules["vllm_a2a"]
    bufs = module.alloc(2, 2, 4, 8, torch.bfloat16)
    with pytest.raises(TypeError, match="scale must be a Python float"):
        module.combine(bufs, 2, scale=scale)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf"), 1e39, -4e38])
def test_scale_must_be_finite_in_float32(scale: float, v2_modules: dict[str, ModuleType]) -> None:
    # The merge is scaled in float32: 1e39 would be inf there, and 0 * inf turns a row that merges to 0 NaN.
    module = v2_modules["vllm_a2a"]
    bufs = module.alloc(2, 2, 4, 8, torch.bfloat16)
    with pytest.raises(ValueError, match="scale must be a finite number within float32's range"):
        module.combine(bufs, 2, scale=scale)


def test_scale_takes_any_real_number(v2_modules: dict[str, ModuleType], generator: Any) -> None:
    module = v2_modules["vllm_a2a"]
    bufs = lse_buffers(module, 2, 3, 2, 8, torch.bfloat16, generator)
    want, _ = module.combine(bufs, 3, scale=0.5)
    for scale in (np.float32(0.5), np.float64(0.5), fractions.Fraction(1, 2)):
        got, _ = module.combine(bufs, 3, scale=scale)
        assert torch.equal(got, want), type(scale).__name__


# ---------------------------------------------------------------------------------------------
# Masked packs, end to end
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec_name", SPEC_NAMES)
def test_masked_pack_exchange_combine(spec_name: str, v2_modules: dict[str, ModuleType], generator: Any) -> None:
    """Each rank packs out [R, T, H, D] with its own empty requests ((max, sum) in for a (max, sum) spec);
    after the exchange every rank merges its head block as the float64 merge of the unmasked rows."""
    module = v2_modules[spec_name]
    spec = module.SPEC
    N, R, T, h = 3, 3, 2, 2
    D = 12
    H = N * h
    dtype = torch.float16
    outs = [torch.randn(R, T, H, D, generator=generator).to(dtype) for _ in range(N)]
    empties = [torch.tensor([rank == 0, rank != 1, True]) for rank in range(N)]  # request 2 is empty everywhere
    sends = []
    stats: list[list[torch.Tensor]] = []
    for rank in range(N):
        bufs = fill(module.alloc(N, R * T + 1, H, D, dtype))
        config = wide_pack(N, R * T, h, D)
        if spec.max_sum:
            maximum, total = random_max_sum((R, T, H), generator)
            module.pack(outs[rank], bufs=bufs, max_sum=(maximum, total), empty=empties[rank], config=config)
            stats.append([maximum, total])
        else:
            lse = torch.randn(R, T, H, generator=generator) * 4
            module.pack(outs[rank], lse, bufs, empty=empties[rank], config=config)
            stats.append([lse])
        sends.append(bufs)
    received = reference.exchange(sends)
    masked = [reference.masked_inputs(outs[rank], stats[rank], empties[rank]) for rank in range(N)]
    for rank in range(N):
        for base in ("e", "2"):
            got, got_lse = module.combine(
                received[rank], R * T, lse_base=base, return_lse=True, config=wide_combine(R * T, h, D)
            )
            if spec.max_sum:
                want, want_lse = reference.merge_shards_max_sum(
                    [m[0] for m in masked], [m[1][0] for m in masked], [m[1][1] for m in masked], rank, base
                )
            else:
                want, want_lse = reference.merge_shards([m[0] for m in masked], [m[1][0] for m in masked], rank, base)
            scale = max(float(o.abs().max()) for o in outs)
            assert combine_error(got, want, scale) <= 1.0, (rank, base)
            assert got_lse is not None and lse_error(got_lse, want_lse) <= 1.0, (rank, base)
            assert torch.equal(got[2 * T : 3 * T], torch.zeros(T, h, D, dtype=dtype)), "an all-empty request"
            assert bool((got_lse[2 * T : 3 * T] == -INF).all())


# ---------------------------------------------------------------------------------------------
# TensorRT-LLM helix post-processing
# ---------------------------------------------------------------------------------------------
def helix_baseline(gathered_o: torch.Tensor, gathered_stats: torch.Tensor, scale: float) -> torch.Tensor:
    """The baseline of TensorRT-LLM's test_helix_postprocess.py, restated for gathered_o [cp, T, H, D] (fp16 or
    bf16, the partials normalised) and gathered_stats [cp, T, H, 2] float32, word 0 the max m_c and word 1 the
    sum of exponentials s_c (the cp_dim 0 layout; the native ones hold the same numbers transposed):

        M      = max_c m_c
        corr_c = s_c * exp(m_c - M) / sum_c' s_c' * exp(m_c' - M)      (float32)
        out    = (sum_c float32(o_c) * corr_c).to(o.dtype) * scale      ([T, H * D]; here [T, H, D])

    TensorRT-LLM applies `scale` after the cast, in the output dtype; layoutgen multiplies the float32 merge
    before the cast (one rounding instead of two), so the two agree within TensorRT-LLM's tolerance (atol
    1e-3, rtol 1e-2), and exactly for scale 1."""
    m, s = gathered_stats[..., 0], gathered_stats[..., 1]
    top = m.amax(dim=0, keepdim=True)
    corrected = s * torch.exp(m - top)
    corr = corrected / corrected.sum(dim=0, keepdim=True)
    merged = (gathered_o.float() * corr[..., None]).sum(dim=0)
    return merged.to(gathered_o.dtype) * scale


def helix_inputs(
    cp: int, T: int, H: int, D: int, dtype: torch.dtype, generator: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """TensorRT-LLM's test inputs: o ~ U(-1, 1), stats from o itself (m = max over D, s = sum exp(o - m))."""
    o = (torch.rand(cp, T, H, D, generator=generator) * 2 - 1).to(dtype)
    m = o.float().amax(dim=-1)
    s = torch.exp(o.float() - m[..., None]).sum(dim=-1)
    return o, torch.stack([m, s], dim=-1)


def helix_combine(module: ModuleType, o: torch.Tensor, stats: torch.Tensor, scale: float) -> torch.Tensor:
    """Write TensorRT-LLM's gathered tensors into the spec's receive buffers (a transport's job) and combine."""
    T, H, D = o.shape[1:]
    bufs = max_sum_buffers(module, o, stats[..., 0], stats[..., 1], T)
    got, _ = module.combine(bufs, T, scale=scale, config=wide_combine(T, H, D))
    return got


# (cp, T, H, D, scale, dtype): the test's basic and edge parametrisations.
HELIX_BASIC = [
    (4, 8, 2, 64, 1.0, torch.float16),
    (4, 8, 2, 64, 1.0, torch.bfloat16),
    (8, 16, 4, 128, 0.5, torch.float16),
    (8, 16, 4, 128, 0.5, torch.bfloat16),
]
HELIX_EDGE = [
    (1, 1, 1, 16, 1.0, torch.float16),  # minimal: cp_size 1
    (256, 1, 1, 16, 1.0, torch.float16),  # max cp_size
    (128, 1, 1, 16, 1.0, torch.float16),  # single token
    (4, 8, 1, 16, 1.0, torch.float16),  # single head
]


@pytest.mark.parametrize("layout", HELIX)
@pytest.mark.parametrize("shape", HELIX_BASIC + HELIX_EDGE, ids=lambda s: "cp{}-T{}-H{}-D{}-s{}-{}".format(*s))
def test_helix_post_processing_matches_tensorrt_llm(
    layout: str, shape: tuple[Any, ...], v2_modules: dict[str, ModuleType], generator: Any
) -> None:
    cp, T, H, D, scale, dtype = shape
    o, stats = helix_inputs(cp, T, H, D, dtype, generator)
    got = helix_combine(v2_modules[layout], o, stats, scale)
    torch.testing.assert_close(got, helix_baseline(o, stats, scale), atol=1e-3, rtol=1e-2)
    want, _ = reference.merge_max_sum(o, stats[..., 0], stats[..., 1], scale=scale)
    assert combine_error(got, want, float(o.abs().max()) * scale) <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("layout", HELIX)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_helix_post_processing_large_shapes(layout: str, dtype: torch.dtype, v2_modules: dict[str, ModuleType]) -> None:
    generator = torch.Generator().manual_seed(7)
    for cp, T, H, D, scale in ((16, 32, 8, 256, 2.0), (16, 16, 64, 512, 1.0)):
        o, stats = helix_inputs(cp, T, H, D, dtype, generator)
        got = helix_combine(v2_modules[layout], o, stats, scale)
        torch.testing.assert_close(got, helix_baseline(o, stats, scale), atol=1e-3, rtol=1e-2)


@pytest.mark.parametrize("layout", HELIX)
def test_helix_empty_rank_is_a_no_op(layout: str, v2_modules: dict[str, ModuleType], generator: Any) -> None:
    """TensorRT-LLM's test_helix_postprocess_empty_rank_noop (cp 4, T 8, H 2, D 64, fp16): the last rank
    sends stats (-inf, 0) and zeroed partials; the output is finite and equals the merge of the other ranks.
    layoutgen also holds it with NaN in that rank's partials, which TensorRT-LLM's kernel must not see."""
    cp, T, H, D = 4, 8, 2, 64
    o, stats = helix_inputs(cp, T, H, D, torch.float16, generator)
    stats[-1, ..., 0], stats[-1, ..., 1] = -INF, 0.0
    for garbage in (0.0, NAN):
        o[-1] = garbage
        got = helix_combine(v2_modules[layout], o, stats, 1.0)
        assert bool(torch.isfinite(got).all())
        torch.testing.assert_close(got, helix_baseline(o[:-1], stats[:-1], 1.0), atol=1e-3, rtol=1e-2)


def test_helix_ranks_pack_exchange_and_combine(v2_modules: dict[str, ModuleType], generator: Any) -> None:
    """The whole helix step on the cp_dim 0 layout: every rank packs its normalised partials for all H heads
    with (max, sum); after the all-to-all, rank p's combine is the baseline over its head block."""
    module = v2_modules["trtllm_helix_nccl"]
    cp, T, h, D = 4, 3, 2, 32
    H = cp * h
    ranks = [helix_inputs(1, T, H, D, torch.bfloat16, generator) for _ in range(cp)]  # each [1, T, H, .]
    sends = []
    for o, stats in ranks:
        bufs = fill(module.alloc(cp, T, H, D, torch.bfloat16))
        module.pack(o[0], bufs=bufs, max_sum=(stats[0, ..., 0], stats[0, ..., 1]))
        sends.append(bufs)
    received = reference.exchange(sends)
    for p in range(cp):
        heads = slice(p * h, (p + 1) * h)
        gathered_o = torch.stack([o[0, :, heads] for o, _ in ranks])  # [cp, T, h, D]
        gathered_stats = torch.stack([stats[0, :, heads] for _, stats in ranks])
        got, _ = module.combine(received[p], T, config=wide_combine(T, h, D))
        torch.testing.assert_close(got, helix_baseline(gathered_o, gathered_stats, 1.0), atol=1e-3, rtol=1e-2)
