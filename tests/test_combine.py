"""Generated combine kernels against the float64 reference, within the written tolerance policy.

Receive buffers are filled with NaN bytes before the live partials are
written, so a kernel that reads a byte the layout does not assign (rows >= B,
row padding, unused stats slots) or lets an empty partial's payload through
produces NaN and fails.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import CANARY, NAN_BYTE, fill_bytes, make_spec, render_module, requires_interpreter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layoutgen.dcp import reference
from layoutgen.dcp.config import CombineConfig
from layoutgen.dcp.layout import wire_dtype
from layoutgen.dcp.tolerances import combine_error, lse_error
from layoutgen.loader import generated_dir, load_path

pytestmark = [requires_interpreter, pytest.mark.usefixtures("no_log_warnings")]

SPEC_NAMES = ("flashinfer_mnnvl", "npu_like", "pynccl_a2a", "pynccl_a2a_aligned", "vllm_a2a")
INF = float("inf")
NAN = float("nan")


def receive_buffers(module, partial_out, partial_lse, B_max, dtype):
    """Buffers as a transport delivers them: the N partials [N, B, h, D] and LSEs [N, B, h] in their
    slots, NaN in every byte the layout does not assign."""
    N, B, h, D = partial_out.shape
    bufs = fill_bytes(module.alloc(N, B_max, N * h, D, dtype), NAN_BYTE)
    bufs.payload_view(B).copy_(partial_out.to(wire_dtype(module.SPEC, dtype)))
    bufs.lse_view(B).copy_(partial_lse)
    return bufs


def random_partials(N, B, h, D, dtype, generator, lse_scale=4.0):
    partial_out = torch.randn(N, B, h, D, generator=generator).to(dtype)
    partial_lse = torch.randn(N, B, h, generator=generator) * lse_scale
    return partial_out, partial_lse


def check_combine(module, bufs, B, base, return_lse, out=None, config=None, out_lse=None):
    """Run the generated combine and compare with the float64 reference; returns (out, lse)."""
    got, got_lse = module.combine(
        bufs, B, lse_base=base, return_lse=return_lse, out=out, config=config, out_lse=out_lse
    )
    want, want_lse = reference.combine(bufs, B, base, return_lse=True)
    lse = bufs.lse_view(B)
    valid = ~(torch.isnan(lse) | (lse.abs() == INF))
    taking_part = bufs.payload_view(B).to(torch.float64)[valid]
    scale = float(taking_part.abs().max()) if taking_part.numel() else 0.0
    assert got.shape == (B, bufs.H // bufs.N, bufs.D) and got.dtype == bufs.dtype
    assert not bool(torch.isnan(got).any()), "NaN reached the output"
    error = combine_error(got, want, scale)
    assert error <= 1.0, f"combine off by {error:.2f}x the tolerance"
    if return_lse:
        assert got_lse is not None and got_lse.shape == (B, bufs.H // bufs.N) and got_lse.dtype == torch.float32
        assert lse_error(got_lse, want_lse) <= 1.0, f"LSE off by {lse_error(got_lse, want_lse):.2f}x"
    else:
        assert got_lse is None
    return got, got_lse


# (spec, dtype, N, B, B_max, h, D): every spec and base, both return_lse, awkward extents.
SHAPES = {
    "flashinfer_mnnvl": (torch.bfloat16, 4, 3, 5, 3, 13),
    "npu_like": (torch.float16, 3, 5, 5, 1, 24),
    "pynccl_a2a": (torch.float32, 2, 1, 3, 16, 40),
    "pynccl_a2a_aligned": (torch.bfloat16, 8, 2, 2, 3, 10),
    "vllm_a2a": (torch.float16, 1, 4, 6, 2, 7),
}


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("base", ["e", "2"])
@pytest.mark.parametrize("spec_name", SPEC_NAMES)
def test_combine_matches_the_float64_reference(spec_name, base, return_lse, spec_modules, generator):
    dtype, N, B, B_max, h, D = SHAPES[spec_name]
    partial_out, partial_lse = random_partials(N, B, h, D, dtype, generator)
    bufs = receive_buffers(spec_modules[spec_name], partial_out, partial_lse, B_max, dtype)
    check_guarded_combine(spec_modules[spec_name], bufs, B, base, return_lse)


def check_guarded_combine(module, bufs, B, base, return_lse, config=None):
    """`check_combine` into `out` (and `out_lse`) with canary guards on both sides as wide as the buffers'
    B_max rows: a store past the B live rows (a tile's rows masked by the buffers' capacity, say) fails an
    assertion here rather than, at best, aborting the interpreter's process."""
    row = bufs.H // bufs.N * bufs.D  # elements of one merged row
    out, out_guards = guarded((B, bufs.H // bufs.N, bufs.D), bufs.B_max * row, bufs.dtype)
    out_lse, lse_guards = guarded((B, bufs.H // bufs.N), bufs.B_max * bufs.H // bufs.N, torch.float32)
    check_combine(module, bufs, B, base, return_lse, out=out, config=config, out_lse=out_lse if return_lse else None)
    for label, guards in (("out", out_guards), ("out_lse", lse_guards)):
        for side, span in zip(("before", "after"), guards, strict=True):
            written = int((span.view(torch.uint8) != CANARY).sum())
            assert written == 0, f"combine wrote {written} bytes {side} {label}"


def guarded(shape, guard, dtype):
    """A contiguous tensor of `shape` inside canary bytes, with `guard` canary elements on each side (the
    tensor and the two guards are returned)."""
    size = math.prod(shape)
    storage = torch.empty(guard + size + guard, dtype=dtype)
    storage.view(torch.uint8).fill_(CANARY)
    return storage[guard : guard + size].view(shape), (storage[:guard], storage[guard + size :])


@pytest.mark.parametrize("base", ["e", "2"])
@pytest.mark.parametrize("spec_name", SPEC_NAMES)
def test_empty_shards_contribute_nothing_even_with_nan_payload(spec_name, base, spec_modules, generator):
    dtype, N, B, B_max, h = torch.bfloat16, 3, 4, 5, 2
    D = 12
    partial_out, partial_lse = random_partials(N, B, h, D, dtype, generator)
    partial_lse[0, 0, 0] = -INF  # one empty shard
    partial_lse[1, 1, 0] = NAN  # NaN counts as empty
    partial_lse[2, 1, 1] = INF  # +inf counts as empty
    partial_lse[:, 2, 0] = torch.tensor([-INF, NAN, INF])  # every shard empty
    partial_lse[:, 3, 1] = -INF
    for peer, b, head in ((0, 0, 0), (1, 1, 0), (2, 1, 1), (0, 2, 0), (1, 2, 0), (2, 2, 0), (0, 3, 1)):
        partial_out[peer, b, head] = NAN  # garbage in the payload of an empty shard
    bufs = receive_buffers(spec_modules[spec_name], partial_out, partial_lse, B_max, dtype)
    got, got_lse = check_combine(spec_modules[spec_name], bufs, B, base, return_lse=True)
    for b, head in ((2, 0), (3, 1)):
        assert torch.equal(got[b, head], torch.zeros(D, dtype=dtype)), "all-empty rows must be exactly 0"
        assert got_lse[b, head] == -INF
    # The single empty shard's row is the merge of the other two alone.
    others, _ = reference.merge_partials(partial_out[1:, :1, :1], partial_lse[1:, :1, :1], base)
    assert combine_error(got[:1, :1], others, float(partial_out[1:, 0, 0].abs().max())) <= 1.0


@pytest.mark.parametrize("base", ["e", "2"])
@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "vllm_a2a"])
def test_a_non_finite_payload_reaches_the_output_unless_its_share_underflows(spec_name, base, spec_modules, generator):
    """A live partial's NaN or inf is carried to the output while its float32 share w_i / Σ w is positive
    (its stat 50 below the largest) and dropped, as an empty partial's, where the share underflows to 0
    (200 below): the kernels and the reference agree on both sides (the reference used to weigh in
    float64, where exp(-200) > 0, and carried the NaN the kernels drop)."""
    dtype, N, B, h, D = torch.float32, 2, 2, 1, 4
    partial_out, partial_lse = random_partials(N, B, h, D, dtype, generator)
    partial_lse[0] = 0.0
    partial_lse[1, 0] = -50.0  # share about 2e-22 (base e) or 9e-16 (base 2): carried
    partial_lse[1, 1] = -200.0  # share 0 in float32 in either base: dropped
    partial_out[1, :, :, 1] = NAN
    partial_out[1, :, :, 2] = INF
    bufs = receive_buffers(spec_modules[spec_name], partial_out, partial_lse, B, dtype)
    got, _ = spec_modules[spec_name].combine(bufs, B, lse_base=base)
    want, _ = reference.combine(bufs, B, base, return_lse=True)
    assert bool(torch.isnan(got[0, 0, 1])) and bool(torch.isnan(want[0, 0, 1]))
    assert got[0, 0, 2] == INF and want[0, 0, 2] == INF
    assert bool(torch.isfinite(got[1]).all()) and bool(torch.isfinite(want[1]).all())
    assert torch.equal(got[1, 0], partial_out[0, 1, 0]), "a dropped partial leaves the other one alone"


@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "flashinfer_mnnvl", "npu_like"])
def test_large_lse_magnitudes(spec_name, spec_modules, generator):
    dtype, N, B, h, D = torch.float32, 4, 3, 2, 8
    partial_out, _ = random_partials(N, B, h, D, dtype, generator)
    signs = torch.where(torch.rand(N, B, h, generator=generator) < 0.5, -1.0, 1.0)
    partial_lse = signs * 1e4 + torch.randn(N, B, h, generator=generator)
    partial_lse[:, 0, 0] = 1e4 + torch.randn(N, generator=generator)  # all near +1e4: a true mix
    partial_lse[:, 0, 1] = -1e4 + torch.randn(N, generator=generator)  # all near -1e4
    for base in ("e", "2"):
        bufs = receive_buffers(spec_modules[spec_name], partial_out, partial_lse, B, dtype)
        _, got_lse = check_combine(spec_modules[spec_name], bufs, B, base, return_lse=True)
        assert bool(torch.isfinite(got_lse).all())


def test_a_single_peer_returns_its_partial_exactly(spec_modules, generator):
    partial_out, partial_lse = random_partials(1, 3, 2, 8, torch.bfloat16, generator)
    bufs = receive_buffers(spec_modules["pynccl_a2a"], partial_out, partial_lse, 3, torch.bfloat16)
    got, got_lse = spec_modules["pynccl_a2a"].combine(bufs, 3, return_lse=True)
    assert torch.equal(got, partial_out[0]) and torch.equal(got_lse, partial_lse[0])


@pytest.mark.parametrize(
    "layout",
    ["dim_slice", "heads_outer", "dim_step_2"],
)
@pytest.mark.parametrize("spec_name", ["vllm_a2a", "npu_like"])
def test_out_with_unusual_strides(spec_name, layout, spec_modules, generator):
    dtype, N, B, h, D = torch.float16, 2, 3, 3, 10
    partial_out, partial_lse = random_partials(N, B, h, D, dtype, generator)
    bufs = receive_buffers(spec_modules[spec_name], partial_out, partial_lse, B, dtype)
    if layout == "dim_slice":
        storage = torch.full((B, h, D + 6), NAN, dtype=dtype)
        out = storage[:, :, 2 : 2 + D]
    elif layout == "heads_outer":
        storage = torch.full((h, B, D), NAN, dtype=dtype)
        out = storage.permute(1, 0, 2)
    else:
        storage = torch.full((B, h, 2 * D), NAN, dtype=dtype)
        out = storage[:, :, ::2]
    got, _ = check_combine(spec_modules[spec_name], bufs, B, "e", return_lse=False, out=out)
    assert got.data_ptr() == out.data_ptr() and got.stride() == out.stride()
    outside = torch.ones_like(storage, dtype=torch.bool)
    if layout == "dim_slice":
        outside[:, :, 2 : 2 + D] = False
    elif layout == "heads_outer":
        outside[:] = False
    else:
        outside[:, :, ::2] = False
    assert bool(torch.isnan(storage[outside]).all()), "combine wrote outside `out`"


@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "flashinfer_mnnvl"])
def test_combine_of_zero_rows(spec_name, spec_modules):
    bufs = fill_bytes(spec_modules[spec_name].alloc(2, 3, 4, 8, torch.bfloat16), NAN_BYTE)
    got, got_lse = spec_modules[spec_name].combine(bufs, 0, return_lse=True)
    assert got.shape == (0, 2, 8) and got_lse is not None and got_lse.shape == (0, 2)
    out = torch.empty(0, 2, 8, dtype=torch.bfloat16)
    assert spec_modules[spec_name].combine(bufs, 0, out=out)[0] is out


# Tiles that do not divide B=3, h=3, D=24; several rows and heads per program.
COMBINE_CONFIGS = (
    CombineConfig(block_batch=2, block_head=2, block_dim=16),
    CombineConfig(block_batch=4, block_head=1, block_dim=8, num_warps=2),
    CombineConfig(block_batch=1, block_head=4, block_dim=32, num_stages=2),
)


@pytest.mark.parametrize("config", COMBINE_CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.as_dict().items()))
@pytest.mark.parametrize("spec_name", ["pynccl_a2a_aligned", "flashinfer_mnnvl", "npu_like"])
def test_combine_with_explicit_configs(spec_name, config, spec_modules, generator):
    dtype, N, B, h, D = torch.bfloat16, 3, 3, 3, 24
    partial_out, partial_lse = random_partials(N, B, h, D, dtype, generator)
    partial_lse[1, 2, 2] = -INF
    partial_out[1, 2, 2] = NAN
    bufs = receive_buffers(spec_modules[spec_name], partial_out, partial_lse, 4, dtype)
    check_guarded_combine(spec_modules[spec_name], bufs, B, "2", return_lse=True, config=config)


#: Payloads with `peer` innermost.  With batch or head outside it the combine loads every peer's partial of an
#: element as one vector (the peers the tile's last axis, padded to a power of two and masked); with dim
#: outside it, one peer at a time (`combine_peers_in_tile`).
PEER_INNER_PAYLOADS = {
    "batch_outside": ["head", "dim", "batch", "peer"],
    "head_outside": ["batch", "dim", "head", "peer"],
    "dim_outside": ["batch", "head", "dim", "peer"],
}


@pytest.mark.parametrize("N", [3, 5])
@pytest.mark.parametrize("payload", PEER_INNER_PAYLOADS)
def test_peer_innermost_combines_pad_the_peers_and_drop_empty_shards(payload, N, tmp_path, generator):
    """N not a power of two: the padded peers of the tile are never read (NaN bytes there would reach the
    output); empty shards (-inf, NaN, +inf) with NaN payload behind them contribute nothing."""
    spec = make_spec(
        name=f"peer_inner_{payload}",
        transport="external",
        payload={"axes": PEER_INNER_PAYLOADS[payload], "dtype": "input"},
        stats={"placement": "separate", "axes": ["batch", "head", "peer", "slot"], "slots": 2, "slot": 1},
    )
    module = render_module(spec, tmp_path)
    dtype, B, h, D = torch.bfloat16, 3, 3, 10
    partial_out, partial_lse = random_partials(N, B, h, D, dtype, generator)
    partial_lse[:, 0, 0] = torch.tensor([-INF, NAN, INF, -INF, NAN][:N])  # every shard empty
    partial_lse[1, 1, 2], partial_lse[N - 1, 2, 1] = NAN, INF
    for peer, b, head in [(p, 0, 0) for p in range(N)] + [(1, 1, 2), (N - 1, 2, 1)]:
        partial_out[peer, b, head] = NAN
    bufs = receive_buffers(module, partial_out, partial_lse, B + 1, dtype)
    for config in (None, CombineConfig(block_batch=2, block_head=2, block_dim=8, num_warps=1)):
        got, got_lse = check_combine(module, bufs, B, "e", return_lse=True, config=config)
        assert torch.equal(got[0, 0], torch.zeros(D, dtype=dtype)) and got_lse[0, 0] == -INF


# --- properties -------------------------------------------------------------------------------
PROPERTY_SETTINGS = settings(
    max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@st.composite
def problems(draw):
    N = draw(st.integers(1, 4))
    B = draw(st.integers(1, 3))
    h = draw(st.integers(1, 3))
    D = draw(st.sampled_from([4, 6, 16]))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    partial_out, partial_lse = random_partials(N, B, h, D, torch.bfloat16, generator)
    empties = draw(st.lists(st.tuples(st.integers(0, N - 1), st.integers(0, B - 1), st.integers(0, h - 1))))
    for peer, b, head in empties:
        partial_lse[peer, b, head] = draw(st.sampled_from([-INF, NAN, INF]))
        partial_out[peer, b, head] = NAN
    return partial_out, partial_lse


def _agree(left, right, partial_out):
    scale = float(torch.nan_to_num(partial_out.double(), nan=0.0).abs().max())
    return combine_error(left, right.to(torch.float64), scale)


@PROPERTY_SETTINGS
@given(problem=problems(), data=st.data(), spec_name=st.sampled_from(["pynccl_a2a", "flashinfer_mnnvl"]))
def test_permuting_peers_changes_nothing_beyond_rounding(problem, data, spec_name, spec_modules):
    partial_out, partial_lse = problem
    N, B = partial_out.shape[:2]
    order = data.draw(st.permutations(range(N)))
    module = spec_modules[spec_name]
    original = receive_buffers(module, partial_out, partial_lse, B, torch.bfloat16)
    permuted = receive_buffers(module, partial_out[order], partial_lse[order], B, torch.bfloat16)
    got, got_lse = check_combine(module, original, B, "e", return_lse=True)
    got_permuted, got_permuted_lse = check_combine(module, permuted, B, "e", return_lse=True)
    assert _agree(got_permuted, got, partial_out) <= 1.0
    assert lse_error(got_permuted_lse, got_lse.to(torch.float64)) <= 1.0


@PROPERTY_SETTINGS
@given(problem=problems(), data=st.data(), spec_name=st.sampled_from(["vllm_a2a", "npu_like"]))
def test_adding_an_empty_partial_changes_nothing(problem, data, spec_name, spec_modules):
    partial_out, partial_lse = problem
    N, B, h, D = partial_out.shape
    position = data.draw(st.integers(0, N))
    empty_lse = data.draw(st.sampled_from([-INF, NAN, INF]))
    grown_out = torch.cat([partial_out[:position], torch.full((1, B, h, D), NAN), partial_out[position:]])
    grown_lse = torch.cat([partial_lse[:position], torch.full((1, B, h), empty_lse), partial_lse[position:]])
    module = spec_modules[spec_name]
    base = data.draw(st.sampled_from(["e", "2"]))
    got, got_lse = check_combine(
        module, receive_buffers(module, partial_out, partial_lse, B, torch.bfloat16), B, base, True
    )
    grown = receive_buffers(module, grown_out.to(torch.bfloat16), grown_lse, B, torch.bfloat16)
    got_grown, got_grown_lse = check_combine(module, grown, B, base, True)
    assert _agree(got_grown, got, partial_out) <= 1.0
    assert lse_error(got_grown_lse, got_lse.to(torch.float64)) <= 1.0


@pytest.mark.parametrize("N", [2, 3], ids=["N2", "N3"])
def test_the_check_catches_a_combine_that_lets_empty_payloads_through(N, tmp_path, generator):
    # The tests must be able to fail: without the share > 0 guard, 0 * NaN reaches the output.
    source = (generated_dir() / "pynccl_a2a.py").read_text(encoding="utf-8")
    guard = "share_3d * tl.where(share_3d > 0.0, partial, 0.0)"
    assert source.count(guard) == 1, "the combine template changed: update this mutation"
    (tmp_path / "pynccl_a2a.py").write_text(source.replace(guard, "(share_3d * partial)"), encoding="utf-8")
    module = load_path(tmp_path / "pynccl_a2a.py")
    partial_out, partial_lse = random_partials(N, 2, 2, 8, torch.bfloat16, generator)
    partial_lse[0, 1, 1] = -INF
    partial_out[0, 1, 1] = NAN
    bufs = receive_buffers(module, partial_out, partial_lse, 2, torch.bfloat16)
    with pytest.raises(AssertionError, match="NaN reached the output"):
        check_combine(module, bufs, 2, "e", return_lse=False)
