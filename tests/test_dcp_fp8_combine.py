"""fp8 combine (issue 22) and the fp8 specs in the tuner, dispatch and the database.

* pack -> exchange -> combine against the float64 merge of the dequantised partials, within the output
  dtype's tolerance (`layoutgen.dcp.tolerances`), for the bundled fp8 specs and rendered ones (e5m2, (max,
  sum) in a row tail, 16-element blocks, layouts with peer, batch or head innermost), bases e and 2, the merged LSE, an output
  scale, tiles narrower than a scale block (its programs share a block) and wider (several blocks);
* the same for random valid fp8 specs (hypothesis: any payload order, scale layout, stats form, block);
* empty entries whose codes and scales hold NaN (and a zero or NaN sum) never reach the output; a row empty
  on every rank merges to 0 and LSE -inf;
* against the float64 merge of the unquantised partials within the wire's worst-case bound: every dequantised
  element is within 2^-4 (e4m3fn) or 2^-3 (e5m2) of its magnitude, plus a subnormal floor of half the
  smallest fp8 subnormal times the block's scale (`fp8_wire_bound`), so the merged output is within that
  relative amount of the merge of |partials| (benchmarks/results/fp8_accuracy.md measures the typical error);
* the tuner's gate passes fp8 configs and refuses (a failed launch, not a wrong result) a pack tile that
  splits a scale block; the default configs cover whole blocks; dispatch keys fp8 specs by their own names.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
from conftest import NAN_BYTE, dcp_problem, fill_bytes, generated_module, make_spec, render_module, requires_interpreter
from hypothesis import given, settings
from test_dcp_fp8_pack import FAST, fp8_problems

from layoutgen.config import next_pow2
from layoutgen.dcp import quant, reference
from layoutgen.dcp.config import CombineConfig, PackConfig, check_pack_tile, default_pack_config
from layoutgen.dcp.layout import LayoutBuffers, wire_dtype
from layoutgen.dcp.spec import DcpSpec
from layoutgen.dcp.tolerances import COMBINE_RTOL, combine_error, lse_error

pytestmark = [requires_interpreter, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

EXTRA = {
    "e5m2_tail_max_sum": {
        "name": "e5m2_tail_max_sum",
        "transport": "all_to_all_single",
        "payload": {"axes": ["peer", "batch", "head", "dim"], "dtype": "float8_e5m2", "scale_block": 16},
        "stats": {"placement": "row_tail", "form": "max_sum"},
        "align_bytes": 16,
    },
    "fp8_transposed": {
        "name": "fp8_transposed",
        "transport": "external",
        "payload": {
            "axes": ["head", "dim", "batch", "peer"],
            "dtype": "float8_e4m3fn",
            "scale_block": 16,
            "scale_axes": ["block", "head", "batch", "peer"],
        },
        "stats": {"placement": "separate", "axes": ["slot", "head", "batch", "peer"], "slots": 2, "slot": 1},
    },
    # batch innermost (the four-axis scale load) and head innermost (the 3-D one, combine_scales_3d): (max, sum)
    # stats, e5m2 blocks of 16 and e4m3 with one scale per row.
    "fp8_batch_inner": {
        "name": "fp8_batch_inner",
        "transport": "all_to_all_single",
        "payload": {
            "axes": ["peer", "head", "dim", "batch"],
            "dtype": "float8_e5m2",
            "scale_block": 16,
            "scale_axes": ["peer", "head", "batch", "block"],
        },
        "stats": {
            "placement": "separate",
            "form": "max_sum",
            "axes": ["peer", "head", "slot", "batch"],
            "slots": 3,
            "max_slot": 2,
            "sum_slot": 0,
        },
    },
    "fp8_batch_inner_rows": {
        "name": "fp8_batch_inner_rows",
        "transport": "external",
        "payload": {
            "axes": ["dim", "peer", "head", "batch"],
            "dtype": "float8_e4m3fn",
            "scale_axes": ["peer", "batch", "head", "block"],
        },
        "stats": {"placement": "separate", "axes": ["peer", "slot", "head", "batch"], "slots": 3, "slot": 2},
    },
    "fp8_head_inner": {
        "name": "fp8_head_inner",
        "transport": "external",
        "payload": {
            "axes": ["batch", "dim", "peer", "head"],
            "dtype": "float8_e4m3fn",
            "scale_axes": ["block", "peer", "batch", "head"],
        },
        "stats": {
            "placement": "separate",
            "form": "max_sum",
            "axes": ["slot", "batch", "head", "peer"],
            "slots": 2,
            "max_slot": 1,
            "sum_slot": 0,
        },
    },
}
SPECS = ["pynccl_a2a_fp8", "vllm_a2a_fp8", *EXTRA]
#: The relative half-ulp of each fp8 format's significand: the worst rounding of a normal code.
FP8_RELATIVE = {torch.float8_e4m3fn: 2.0**-4, torch.float8_e5m2: 2.0**-3}
#: Half the smallest subnormal, in units of the block's scale: the worst rounding below the normal range.
FP8_FLOOR = {torch.float8_e4m3fn: 2.0**-10, torch.float8_e5m2: 2.0**-17}


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModuleType]:
    found = {name: generated_module(name) for name in SPECS if name not in EXTRA}
    directory = tmp_path_factory.mktemp("fp8_combine")
    found.update({name: render_module(make_spec(**fields), directory) for name, fields in EXTRA.items()})
    return found


def fp8_wire_bound(spec: DcpSpec, dtype: torch.dtype) -> tuple[float, float]:
    """(relative, floor in units of the block's scale) bound of one dequantised element's error."""
    wire = wire_dtype(spec, dtype)
    return FP8_RELATIVE[wire], FP8_FLOOR[wire]


def exchange_case(module: ModuleType, N: int, B: int, h: int, D: int, generator: torch.Generator) -> dict[str, Any]:
    """Every rank packs random partials (empty shards, a row empty everywhere); the received buffers."""
    spec = module.SPEC
    H = N * h
    outs = [(torch.randn(B, H, D, generator=generator) * (1 + rank)).to(torch.bfloat16) for rank in range(N)]
    maxes = [torch.randn(B, H, generator=generator) * 4 for _ in range(N)]
    sums = [1 + 8 * torch.rand(B, H, generator=generator) for _ in range(N)]
    maxes[0][0] = float("-inf")  # an empty shard
    maxes[-1][:, -1] = float("nan")  # empty by a NaN statistic
    for m in maxes:
        m[-1] = float("-inf")  # the last row is empty on every rank
    sends = []
    for rank in range(N):
        bufs = fill_bytes(module.alloc(N, B, H, D, torch.bfloat16))
        if spec.max_sum:
            module.pack(outs[rank], bufs=bufs, max_sum=(maxes[rank], sums[rank]))
        else:
            module.pack(outs[rank], maxes[rank], bufs)
        sends.append(bufs)
    return {"outs": outs, "maxes": maxes, "sums": sums, "received": reference.exchange(sends)}


def poison_empty_entries(recv: LayoutBuffers, B: int) -> torch.Tensor:
    """NaN codes and NaN scales behind every empty entry (what garbage there may be); its mask [N, B, h]."""
    stats = recv.max_view(B) if recv.spec.max_sum else recv.lse_view(B)
    empty = ~stats.isfinite()
    recv.payload_view(B).view(torch.uint8)[empty] = NAN_BYTE
    recv.scale_view(B)[empty] = float("nan")
    return empty


COMBINE_CONFIGS = [
    None,
    CombineConfig(block_batch=1, block_head=1, block_dim=8, num_warps=1),  # a share of one block per program
    CombineConfig(block_batch=2, block_head=2, block_dim=64, num_warps=2),  # several blocks per program
]


def check_dequantised_merge(module: ModuleType, N: int, B: int, h: int, D: int, seed: int, configs: list[Any]) -> None:
    """Every rank's combine of the exchanged packs, with NaN behind every empty entry, against the float64 merge
    of the dequantised partials (bases e and 2, the merged LSE, an output scale); the row empty everywhere
    merges to 0 and LSE -inf."""
    case = exchange_case(module, N, B, h, D, torch.Generator().manual_seed(seed))
    name = module.SPEC.name
    for rank in range(N):
        recv = case["received"][rank]
        empty = poison_empty_entries(recv, B)
        partials = reference.received_partials(recv, B)
        magnitude = float(partials.abs().where(~empty[..., None], 0.0).max())
        for base in ("e", "2"):
            want, want_lse = reference.combine(recv, B, base, return_lse=True, scale=0.5)
            for config in configs:
                got, got_lse = module.combine(recv, B, lse_base=base, return_lse=True, scale=0.5, config=config)
                assert not bool(got.isnan().any()), (name, rank, config)
                assert combine_error(got, want, magnitude * 0.5) <= 1.0, (name, rank, base, config)
                assert got_lse is not None and lse_error(got_lse, want_lse) <= 1.0
                assert bool((got[-1] == 0).all()) and bool((got_lse[-1] == float("-inf")).all())


@pytest.mark.parametrize("tiny", [1e-39, 1.401298464324817e-45])
@pytest.mark.parametrize("spec_name", [name for name in SPECS if name in EXTRA and EXTRA[name]["stats"].get("form")])
def test_fp8_max_sum_rows_whose_weights_sum_below_2_to_the_minus_64_merge(
    spec_name: str, tiny: float, modules: dict[str, ModuleType]
) -> None:
    """The fp8 combines' lift (docs/design.md §4.2): rows whose live sums are all `tiny` (below 1 / FLT_MAX, and
    float32's least subnormal), with equal maxima, one live entry or every peer's, merge like the dequantised
    float64 merge; without the lift their reciprocal overflows and the output is NaN."""
    module = modules[spec_name]
    N, B, h, D = 2, 3, 2, 32
    generator = torch.Generator().manual_seed(3)
    outs = [torch.randn(B, N * h, D, generator=generator).to(torch.bfloat16) for _ in range(N)]
    maxes = [torch.randn(B, N * h, generator=generator) for _ in range(N)]
    sums = [1 + torch.rand(B, N * h, generator=generator) for _ in range(N)]
    for rank in range(N):
        maxes[rank][:2], sums[rank][:2] = 0.0, tiny
    maxes[1][0], sums[1][0] = float("-inf"), 0.0  # row 0: one live entry (every rank's heads)
    sends = [fill_bytes(module.alloc(N, B, N * h, D, torch.bfloat16)) for _ in range(N)]
    for rank, bufs in enumerate(sends):
        module.pack(outs[rank], bufs=bufs, max_sum=(maxes[rank], sums[rank]))
    for recv in reference.exchange(sends):
        magnitude = float(reference.received_partials(recv, B).abs().nan_to_num(0.0).max())
        want, want_lse = reference.combine(recv, B, "e", return_lse=True)
        got, got_lse = module.combine(recv, B, return_lse=True)
        assert not bool(got.isnan().any()), "NaN reached the output"
        assert combine_error(got, want, magnitude) <= 1.0
        assert got_lse is not None and lse_error(got_lse, want_lse) <= 1.0


@pytest.mark.parametrize("spec_name", SPECS)
def test_fp8_combine_matches_the_dequantised_merge(spec_name: str, modules: dict[str, ModuleType]) -> None:
    check_dequantised_merge(modules[spec_name], 3, 5, 2, 32, 11, COMBINE_CONFIGS)


def test_batch_innermost_fp8_combine_in_wide_boxes(modules: dict[str, ModuleType]) -> None:
    """batch innermost: the boxes the default takes at large batch (32 rows x 64 dims x 1 warp for blocks of 16,
    32 x 128 x 1 for blocks of 128 and more), over a whole tile of rows and a partial one, and a box of four
    blocks in four warps."""
    configs = [
        CombineConfig(block_batch=32, block_head=1, block_dim=64, num_warps=1),
        CombineConfig(block_batch=16, block_head=2, block_dim=64, num_warps=4),
        CombineConfig(block_batch=32, block_head=1, block_dim=128, num_warps=1),  # eight blocks of 16
    ]
    check_dequantised_merge(modules["fp8_batch_inner"], 2, 40, 2, 128, 5, configs)
    whole_row = [CombineConfig(block_batch=32, block_head=1, block_dim=128, num_warps=1)]  # one scale per row
    check_dequantised_merge(modules["fp8_batch_inner_rows"], 3, 40, 2, 128, 6, whole_row)


# Any payload order, scale layout, stats form and placement, fp8 format and block: the default config at small
# awkward shapes (one peer among them; at least two rows, the last one empty on every rank).
@settings(max_examples=12, **FAST)
@given(problem=fp8_problems())
def test_any_valid_fp8_spec_combines_to_the_dequantised_merge(
    problem: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    module = render_module(make_spec(**problem["spec"]), tmp_path_factory.mktemp("drawn_fp8_combine"))
    check_dequantised_merge(module, problem["N"], problem["B"] + 1, problem["h"], problem["D"], problem["seed"], [None])


@pytest.mark.parametrize("spec_name", ["pynccl_a2a_fp8", "e5m2_tail_max_sum"])
def test_fp8_combine_is_within_the_wire_bound_of_the_unquantised_merge(
    spec_name: str, modules: dict[str, ModuleType]
) -> None:
    module = modules[spec_name]
    spec = module.SPEC
    generator = torch.Generator().manual_seed(3)
    N, B, h, D = 4, 6, 2, 32
    case = exchange_case(module, N, B, h, D, generator)
    relative, floor = fp8_wire_bound(spec, torch.bfloat16)
    for rank in range(N):
        got, _ = module.combine(case["received"][rank], B)
        if spec.max_sum:
            exact, _ = reference.merge_shards_max_sum(case["outs"], case["maxes"], case["sums"], rank)
            weighted, _ = reference.merge_shards_max_sum(
                [o.abs() for o in case["outs"]], case["maxes"], case["sums"], rank
            )
        else:
            exact, _ = reference.merge_shards(case["outs"], case["maxes"], rank)
            weighted, _ = reference.merge_shards([o.abs() for o in case["outs"]], case["maxes"], rank)
        largest_scale = float(reference.received_partials(case["received"][rank], B).abs().max()) / spec.fp8_max
        allowed = relative * weighted + floor * largest_scale + COMBINE_RTOL[torch.bfloat16] * exact.abs() + 1e-6
        excess = ((got.double() - exact).abs() - allowed).max()
        assert float(excess) <= 0.0, (spec_name, rank)


@pytest.mark.parametrize("spec_name", SPECS)
def test_every_fp8_code_decodes_exactly_through_combine(spec_name: str, modules: dict[str, ModuleType]) -> None:
    """N 1, scales 1, neutral stats, a float32 output: combine returns each code's value as torch decodes it,
    all 256 codes (subnormals, both zeros, the largest normals, e5m2's infinities, every NaN), in every load
    path of these layouts. The tolerance tests weigh errors against the largest magnitude of a tensor, which
    hides a decode that is off by 2x on the subnormal codes alone."""
    module = modules[spec_name]
    B, D = 8, 32
    recv = fill_bytes(module.alloc(1, B, 1, D, torch.float32), NAN_BYTE)
    codes = torch.arange(256, dtype=torch.uint8).view(1, B, 1, D)
    recv.payload_view(B).view(torch.uint8).copy_(codes)
    recv.scale_view(B).fill_(1.0)
    if module.SPEC.max_sum:
        recv.max_view(B).fill_(0.0)
        recv.sum_view(B).fill_(1.0)
    else:
        recv.lse_view(B).fill_(0.0)
    got, _ = module.combine(recv, B)
    want = codes.view(wire_dtype(module.SPEC, torch.float32)).to(torch.float32)[0]
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_all_empty_rows_and_garbage_scales_give_zero(modules: dict[str, ModuleType]) -> None:
    module = modules["vllm_a2a_fp8"]
    N, B, H, D = 2, 3, 4, 16
    recv = fill_bytes(module.alloc(N, B, H, D, torch.bfloat16), NAN_BYTE)
    recv.lse_view(B).fill_(float("-inf"))
    got, got_lse = module.combine(recv, B, return_lse=True)
    assert bool((got == 0).all()) and got_lse is not None and bool((got_lse == float("-inf")).all())


# ---------------------------------------------------------------------------------------------
# Tuner, defaults, dispatch
# ---------------------------------------------------------------------------------------------
def workload(spec_name: str, kernel: str, batch: int, D: int = 16) -> Any:
    from layoutgen.dcp.workload import DcpWorkload
    from layoutgen.tuning.objective import Target

    module = generated_module(spec_name)
    problem = dcp_problem(module.SPEC, kernel, 2, 2, D, "bfloat16")
    return DcpWorkload(Target(problem, module), batch, torch.device("cpu"), 0)


@pytest.mark.parametrize("spec_name", ["pynccl_a2a_fp8", "vllm_a2a_fp8"])
def test_the_gate_passes_fp8_configs_and_refuses_split_blocks(spec_name: str) -> None:
    pack = workload(spec_name, "pack", 3)
    assert pack.gate(PackConfig(block_batch=2, block_head=2, block_dim=16, block_peer=1), seed=1) is None
    with pytest.raises(ValueError, match="use block_dim >= 16"):
        pack.gate(PackConfig(block_batch=1, block_head=1, block_dim=8, block_peer=1), seed=1)
    combine = workload(spec_name, "combine", 3)
    for config in (
        CombineConfig(block_batch=1, block_head=2, block_dim=8),
        CombineConfig(block_batch=2, block_head=1, block_dim=32),
    ):
        assert combine.gate(config, seed=2) is None


def test_the_gate_catches_a_wrong_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    work = workload("vllm_a2a_fp8", "pack", 3)
    module = work.target.module
    original = module._launch_pack

    def off_by_one(out: Any, lse: Any, bufs: Any, *args: Any, **kwargs: Any) -> None:
        original(out, lse, bufs, *args, **kwargs)
        bufs.tensors["scales"].view(torch.int32).add_(1)

    monkeypatch.setattr(module, "_launch_pack", off_by_one)
    mismatch = work.gate(PackConfig(block_batch=1, block_head=2, block_dim=16, block_peer=1), seed=1)
    assert mismatch is not None and "'scales'" in mismatch


@pytest.mark.parametrize("block", [None, 32, 128])
@pytest.mark.parametrize("innermost", ["dim", "head", "batch"])
def test_the_tuners_space_holds_only_configs_the_fp8_launcher_accepts(block: int | None, innermost: str) -> None:
    """With dim innermost the pack's space starts its dim block at the scale block: below it the launcher
    refuses the config (263 of the 273 configs of a block-D spec's space at N 8, H 128, D 512 were such failed
    launches).  A layout that transposes splits blocks into chunks: its space starts at 16 dims (or the whole
    block, when smaller), and every config of it launches."""
    from layoutgen.dcp.config import pack_search_floor
    from layoutgen.tuning.problem import Problem
    from layoutgen.tuning.space import bind

    axes = {"dim": ["peer", "head", "batch", "dim"], "head": ["batch", "dim", "peer", "head"]}.get(
        innermost, ["peer", "head", "dim", "batch"]
    )
    payload: dict[str, Any] = {"axes": axes, "dtype": "float8_e4m3fn", **({"scale_block": block} if block else {})}
    spec = make_spec(
        name="space_fp8",
        transport="all_to_all_single" if axes[0] == "peer" else "external",
        payload=payload,
        stats={"placement": "separate", "axes": ["peer", "batch", "head", "slot"]},
    )
    for D in (128, 512):
        space = bind(Problem(spec, "pack", (("N", 8), ("Hl", 16), ("D", D)), "bfloat16"), 1024)
        feasible = space.feasible()
        lowest = min(config.block_dim for config in feasible)
        assert lowest == pack_search_floor(spec, D)
        assert lowest == (next_pow2(block or D) if innermost == "dim" else min(16, block or D))
        for config in feasible:
            check_pack_tile(spec, D, config)  # raises for a config the launcher would refuse


@pytest.mark.parametrize("block", [None, 32, 128])
@pytest.mark.parametrize("innermost", ["dim", "batch", "head"])
def test_default_pack_configs_launch(block: int | None, innermost: str) -> None:
    """Whole scale blocks where dim is innermost; where the pack transposes, the boxes measured on the H200 at
    B 1024 (32 rows x 128 dims, or the whole block of 256 or 512 at 32 per thread; 16 heads x 128 dims, or x 512
    with blocks of at least 128) and two waves of programs (264) at B >= 64, except where batch runs stay 32
    rows long."""
    axes = {"dim": ["peer", "head", "batch", "dim"], "head": ["peer", "batch", "dim", "head"]}.get(
        innermost, ["peer", "head", "dim", "batch"]
    )
    payload: dict[str, Any] = {"axes": axes, "dtype": "float8_e4m3fn", **({"scale_block": block} if block else {})}
    spec = make_spec(
        name="defaults_fp8",
        transport="all_to_all_single",
        payload=payload,
        stats={"placement": "separate", "axes": ["peer", "batch", "head", "slot"]},
    )
    for D in (128, 512, 576 if block is None else 512):
        for B in (1, 64, 1024, 4096):
            config = default_pack_config(spec, 8, 16, D, B, 1)
            check_pack_tile(spec, D, config)
            lanes = next_pow2(spec.scale_block_of(D))
            if innermost == "dim":
                assert config.block_dim >= lanes
                per_thread = 16 if B <= 8 else 32  # measured: probe_unseen_dcp_defaults_{old,new}15_H200.md
                assert config.tile_elements <= per_thread * 32 * config.num_warps or config.num_warps == 8
                continue
            whole_rows = innermost == "batch" and 128 < lanes <= 512
            if B == 1024 and innermost == "batch":
                expected = (32, lanes, 32 * lanes // 1024) if whole_rows else (32, 128, 4)
                assert (config.block_batch, config.block_dim, config.num_warps) == expected, config
            elif B == 1024 and D == 512:
                expected = (16, 512, 8) if lanes >= 128 else (16, 128, 4)
                assert (config.block_head, config.block_dim, config.num_warps) == expected, config
            programs = -(-B // config.block_batch) * -(-8 // config.block_peer) * -(-16 // config.block_head)
            programs *= max(1, D // max(config.block_dim, spec.scale_block_of(D)))
            if whole_rows and B >= 32:
                assert config.block_batch == 32, config  # 32-byte runs even below two waves (B 64: 256 programs)
            elif B >= 64:
                assert programs >= 264, config
            else:  # one request: at most 16 rows a program
                assert config.block_peer * config.block_batch * config.block_head <= 16, config


def test_the_database_key_and_bytes_of_an_fp8_spec() -> None:
    """fp8 specs are specs of their own (the key holds the spec name); bytes moved count the wire's one byte
    per element and the float32 scales."""
    from layoutgen.dcp import FAMILY

    spec = generated_module("pynccl_a2a_fp8").SPEC
    assert FAMILY.key_shapes(spec, "pack", {"N": 8, "H": 128, "D": 512}, "bfloat16") == {"N": 8, "Hl": 16, "D": 512}
    pack = dcp_problem(spec, "pack", 8, 16, 512, "bfloat16")
    assert pack.key(1024).spec == "pynccl_a2a_fp8"
    # reads bf16 out + lse, writes one code per element, the LSE word and one scale per row
    assert FAMILY.bytes_moved(pack, 1024) == 1024 * 8 * 16 * (512 * (2 + 1) + 4 * (1 + 2))
    combine = dcp_problem(spec, "combine", 8, 16, 512, "bfloat16")
    assert FAMILY.bytes_moved(combine, 1024) == 1024 * 16 * (8 * (512 + 4 * 2) + 512 * 2)
    extents = FAMILY.space_extents(pack, 1024)
    assert extents.elem_bytes == 1 and extents.innermost == "dim"


def test_quantised_exchange_through_dcp_exchange_helpers() -> None:
    """`reference.received_partials` is what every fp8 check above merges: the dequantised payload."""
    spec = generated_module("pynccl_a2a_fp8").SPEC
    bufs = LayoutBuffers.allocate(spec, 2, 2, 4, 16, torch.bfloat16)
    out = torch.randn(2, 4, 16).to(torch.bfloat16)
    reference.pack(out, torch.zeros(2, 4), bufs)
    codes, scales = quant.quantise(out.float(), 16, torch.float8_e4m3fn)
    want = quant.dequantise(codes, scales).reshape(2, 2, 2, 16).permute(1, 0, 2, 3)
    assert torch.equal(reference.received_partials(bufs, 2), want)
