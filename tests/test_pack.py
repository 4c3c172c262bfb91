"""Generated pack kernels are byte-exact against the reference and touch no byte they do not own.

The interpreter is slow, so the shape space (spec x dtype x N x B x H/N x D x
input strides) is covered pairwise: every pair of values of any two factors
appears in some case, which is what catches interaction bugs (a stride with a
dtype, a tile with an extent) without the full cartesian product.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
import torch
from conftest import (
    STRIDE_KINDS,
    assert_canary_outside,
    assert_same_bytes,
    byte_views,
    expected_layout_bytes,
    fill_bytes,
    make_spec,
    owned_byte_count,
    pairwise,
    random_inputs,
    render_module,
    requires_interpreter,
    strided_inputs,
)

from layoutgen.dcp import reference
from layoutgen.dcp.config import PackConfig
from layoutgen.dcp.layout import LayoutBuffers
from layoutgen.loader import generated_dir, load_path
from layoutgen.spec import bundled_specs

pytestmark = requires_interpreter

#: The DCP family's bundled specs of the first contract (one LSE word; the (max, sum) specs and the v2 pack
#: arguments are tests/test_dcp_v2_pack.py's, the fp8 specs tests/test_dcp_fp8_pack.py's), plus a
#: batch-innermost float32 layout.
SPEC_NAMES = (
    *sorted(
        name for name, spec in bundled_specs().items() if spec.family == "dcp" and not spec.max_sum and not spec.fp8
    ),
    "npu_like",
)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
PEERS = (1, 2, 3, 4, 8)
BATCH = ("B<B_max", "B=B_max")
HEADS_PER_PEER = (1, 3, 16)
HEAD_DIMS = (8, 13, 24, 40, 66)  # 13 only where the layout allows an odd D (else 14 is used)


CASES = pairwise(
    {
        "spec": SPEC_NAMES,
        "dtype": DTYPES,
        "N": PEERS,
        "batch": BATCH,
        "heads_per_peer": HEADS_PER_PEER,
        "D": HEAD_DIMS,
        "strides": STRIDE_KINDS,
    },
    seed=7,
)


@pytest.fixture(scope="module")
def modules(spec_modules):
    assert set(SPEC_NAMES) <= set(spec_modules)
    return {name: spec_modules[name] for name in SPEC_NAMES}


def _case_id(case: dict) -> str:
    dtype = str(case["dtype"]).removeprefix("torch.")
    return (
        f"{case['spec']}-{dtype}-N{case['N']}-{case['batch']}-h{case['heads_per_peer']}-D{case['D']}-{case['strides']}"
    )


def _check_pack(module, N, B, B_max, H, D, dtype, out, lse, config=None):
    spec = module.SPEC
    ours = fill_bytes(module.alloc(N, B_max, H, D, dtype))
    theirs = fill_bytes(LayoutBuffers.allocate(spec, N, B_max, H, D, dtype))
    module.pack(out, lse, ours, config=config)
    reference.pack(out, lse, theirs)
    assert_same_bytes(ours, theirs, f"{spec.name} vs reference")
    expected = expected_layout_bytes(spec, out.contiguous(), lse.contiguous(), N, B_max)
    for name, got in byte_views(ours).items():
        assert torch.equal(got, expected[name]), f"{spec.name}: {name} differs from the layout of docs/design.md §3"
    assert_canary_outside(ours, owned_byte_count(spec, N, B, H, D, dtype))


def test_pairwise_cover_is_complete_and_small():
    assert 30 <= len(CASES) <= 60
    for a, b in itertools.combinations(CASES[0], 2):
        factor_values = {"spec": SPEC_NAMES, "dtype": DTYPES, "N": PEERS, "batch": BATCH}
        factor_values |= {"heads_per_peer": HEADS_PER_PEER, "D": HEAD_DIMS, "strides": STRIDE_KINDS}
        seen = {(case[a], case[b]) for case in CASES}
        assert seen == set(itertools.product(factor_values[a], factor_values[b]))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_pack_is_byte_exact(case, modules, generator):
    module = modules[case["spec"]]
    dtype, N, h = case["dtype"], case["N"], case["heads_per_peer"]
    D = case["D"]
    wire_size = 4 if module.SPEC.payload.dtype.value == "float32" else dtype.itemsize
    if module.SPEC.row_tail and D * wire_size % 4:
        D += 1
    B, B_max = (2, 5) if case["batch"] == "B<B_max" else (3, 3)
    H = N * h
    out, lse = random_inputs(B, H, D, dtype, generator)
    out, lse = strided_inputs(out, lse, case["strides"])
    _check_pack(module, N, B, B_max, H, D, dtype, out, lse)


# Blocks that do not divide the extents (N=3, B=3, H/N=3, D=24), several peers or rows per tile.
EXPLICIT_CONFIGS = (
    PackConfig(block_batch=2, block_head=2, block_dim=16, block_peer=2),
    PackConfig(block_batch=4, block_head=1, block_dim=8, block_peer=4, num_warps=2),
    PackConfig(block_batch=1, block_head=4, block_dim=64, block_peer=1, num_stages=2),
)


@pytest.mark.parametrize("config", EXPLICIT_CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.as_dict().items()))
@pytest.mark.parametrize("spec_name", SPEC_NAMES)
def test_pack_with_explicit_configs_masks_partial_tiles(spec_name, config, modules, generator):
    N, B, B_max, h, D = 3, 3, 4, 3, 24
    out, lse = random_inputs(B, N * h, D, torch.bfloat16, generator)
    _check_pack(modules[spec_name], N, B, B_max, N * h, D, torch.bfloat16, out, lse, config)


@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "flashinfer_mnnvl"])
def test_pack_of_zero_rows_writes_nothing(spec_name, modules, generator):
    module = modules[spec_name]
    out, lse = random_inputs(0, 4, 8, torch.float16, generator)
    bufs = fill_bytes(module.alloc(2, 3, 4, 8, torch.float16))
    module.pack(out, lse, bufs)
    assert_canary_outside(bufs, 0)


def test_repacking_fewer_rows_leaves_the_older_rows(modules, generator):
    # Rows >= B are not the layout's at this call: a smaller second pack must not clear them.
    module = modules["vllm_a2a"]
    N, B_max, H, D = 2, 4, 4, 8
    first, first_lse = random_inputs(4, H, D, torch.bfloat16, generator)
    second, second_lse = random_inputs(2, H, D, torch.bfloat16, generator)
    ours = fill_bytes(module.alloc(N, B_max, H, D, torch.bfloat16))
    theirs = fill_bytes(LayoutBuffers.allocate(module.SPEC, N, B_max, H, D, torch.bfloat16))
    for out, lse in ((first, first_lse), (second, second_lse)):
        module.pack(out, lse, ours)
        reference.pack(out, lse, theirs)
    assert_same_bytes(ours, theirs)
    assert torch.equal(ours.payload_view(4)[:, 2:], first.view(4, N, H // N, D).permute(1, 0, 2, 3)[:, 2:])


_BITS = {
    torch.bfloat16: (torch.int16, 0x7F80),
    torch.float16: (torch.int16, 0x7C00),
    torch.float32: (torch.int32, 0x7F800000),
}


def _arbitrary_bits(shape, dtype, generator):
    """Random bit patterns of `dtype` where every fourth element is a NaN or inf with a random payload."""
    integer, exponent = _BITS[dtype]
    bits = torch.randint(-(2**31), 2**31 - 1, shape, generator=generator, dtype=torch.int64).to(integer)
    special = torch.arange(bits.numel()).view(shape) % 4 == 0
    return torch.where(special, bits | exponent, bits).view(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "flashinfer_mnnvl", "vllm_a2a"])
def test_pack_moves_arbitrary_bit_patterns_unchanged(spec_name, dtype, modules, generator):
    # Pure data movement when the wire dtype is the input dtype: NaN payloads, infinities, signed zeros
    # and subnormals arrive bit for bit (the LSE word too).
    N, B, H, D = 2, 3, 4, 12
    out = _arbitrary_bits((B, H, D), dtype, generator)
    lse = _arbitrary_bits((B, H), torch.float32, generator)
    out[0, 0, :3] = torch.tensor([-0.0, float("inf"), float("-inf")], dtype=dtype)
    assert bool(torch.isnan(out).any()) and bool(torch.isnan(lse).any())
    _check_pack(modules[spec_name], N, B, B, H, D, dtype, out, lse)


def test_the_check_catches_a_kernel_that_writes_past_the_row(tmp_path, generator):
    # The tests must be able to fail: a pack whose dim mask is off by one writes into the next row.
    source = (generated_dir() / "vllm_a2a.py").read_text(encoding="utf-8")
    broken = source.replace("(dim_4d < HEAD_DIM)", "(dim_4d <= HEAD_DIM)")
    assert broken.count("(dim_4d <= HEAD_DIM)") == 1, "the pack template changed: update this mutation"
    (tmp_path / "vllm_a2a.py").write_text(broken, encoding="utf-8")
    module = load_path(tmp_path / "vllm_a2a.py")
    N, B, H, D = 2, 2, 4, 24
    out, lse = random_inputs(B, H, D, torch.bfloat16, generator)
    with pytest.raises(AssertionError, match="bytes differ"):
        _check_pack(module, N, B, B + 1, H, D, torch.bfloat16, out, lse)


def recorded_pack(module: Any, N: int, batch: int, H: int, D: int, config: PackConfig) -> Any:
    """The launches of one bf16 pack of meta tensors, recorded (grid, args, constexprs), not run."""
    from layoutgen.runtime.launch import Recorder

    bufs = LayoutBuffers.allocate(module.SPEC, N, batch, H, D, torch.bfloat16, "meta")
    out = torch.empty(batch, H, D, dtype=torch.bfloat16, device="meta")
    lse = torch.empty(batch, H, dtype=torch.float32, device="meta")
    recorder = Recorder()
    module._launch_pack(out, lse, bufs, batch, config, False, kernel=recorder)
    return recorder


@pytest.mark.parametrize("spec_name", ["vllm_a2a", "flashinfer_mnnvl"])
def test_pack_runs_batch_blocks_along_the_grid_y_axis_and_refuses_more_than_cuda_allows(spec_name, modules):
    from layoutgen.runtime.launch import Recorder

    module = modules[spec_name]
    N, H, D = 2, 4, 8
    config = PackConfig(block_peer=1, block_batch=1, block_head=1, block_dim=8, num_warps=1, num_stages=1)

    def launch(batch: int) -> Recorder:
        return recorded_pack(module, N, batch, H, D, config)

    ((grid, _, _),) = launch(65535).calls
    assert grid[1] == 65535 and grid[0] * grid[2] == N * (H // N)  # one program per (peer, head) per row
    with pytest.raises(ValueError, match=r"65536 programs along the grid's y axis.*block_batch >= 2"):
        launch(65536)


def test_a_pack_of_batch_peer_pairs_runs_the_pairs_along_the_grid_y_axis(tmp_path):
    # payload [head, dim, batch, peer]: the y axis walks the B x N (batch, peer) pairs, block_batch x block_peer
    # per program; the limit and dispatch's fit count pairs, not rows.
    from layoutgen.dcp.dispatch import MAX_GRID_Y, fit_grid
    from layoutgen.runtime.launch import Recorder

    fields = {"axes": ["head", "dim", "batch", "peer"], "dtype": "input"}
    stats = {"placement": "separate", "axes": ["slot", "head", "batch", "peer"], "slots": 1, "slot": 0}
    spec = make_spec(name="pairs", transport="external", payload=fields, stats=stats)
    module = render_module(spec, tmp_path)
    N, H, D = 3, 6, 8
    config = PackConfig(block_peer=2, block_batch=4, block_head=1, block_dim=8, num_warps=1, num_stages=1)

    def launch(batch: int, config: PackConfig) -> Recorder:
        return recorded_pack(module, N, batch, H, D, config)

    ((grid, _, _),) = launch(5, config).calls
    assert grid == (1, 2, (H // N) * (D // 8))  # 15 pairs in runs of 8
    batch = 8 * MAX_GRID_Y // N + 1
    with pytest.raises(ValueError, match=r"pairs needs 65536 programs.*block_batch \* block_peer >= 9"):
        launch(batch, config)
    fitted = fit_grid(config, batch, N)
    assert fitted.block_batch == 8 and fit_grid(config, batch) is config  # rows alone would fit
    ((grid, _, _),) = launch(batch, fitted).calls
    assert grid[1] == -(-batch * N // 16) <= MAX_GRID_Y


def test_dispatch_fits_a_batch_past_the_grid_limit_instead_of_failing(modules):
    from layoutgen.dcp.dispatch import MAX_GRID_Y, fit_grid
    from layoutgen.runtime.launch import Recorder

    module = modules["vllm_a2a"]
    config = PackConfig(block_peer=1, block_batch=1, block_head=1, block_dim=8, num_warps=1, num_stages=1)
    assert fit_grid(config, MAX_GRID_Y) is config
    fitted = fit_grid(config, 2 * MAX_GRID_Y + 1)
    assert fitted.block_batch == 4 and dataclasses.replace(fitted, block_batch=1) == config
    batch = 2 * MAX_GRID_Y + 1
    bufs = LayoutBuffers.allocate(module.SPEC, 2, batch, 4, 8, torch.bfloat16, "meta")
    out = torch.empty(batch, 4, 8, dtype=torch.bfloat16, device="meta")
    lse = torch.empty(batch, 4, dtype=torch.float32, device="meta")
    recorder = Recorder()
    module._launch_pack(out, lse, bufs, batch, fitted, False, kernel=recorder)
    ((grid, _, _),) = recorder.calls
    assert grid[1] == -(-batch // 4) <= MAX_GRID_Y
