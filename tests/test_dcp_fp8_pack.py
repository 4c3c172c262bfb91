"""fp8 pack (issue 22): the codes and the float32 block scales, byte for byte.

Every case packs into canary-filled buffers and checks the generated kernel against
`layoutgen.dcp.reference.pack`, and the reference against the bytes built here from the schema text alone
(docs/design.md §3 and `layoutgen.dcp.spec`'s fp8 paragraph: a row tail holds the codes, the stats words,
then one float32 scale per block; separate stats put the scales in a `scales` buffer of their own axes),
with `layoutgen.dcp.quant.quantise` as the quantiser (itself checked against the rule in
tests/test_dcp_fp8_quant.py).  Specs: the bundled pynccl_a2a_fp8 and vllm_a2a_fp8, and specs drawn by
hypothesis over every fp8 field with every other field (axis orders, both placements and stats forms,
slots, align_bytes, transports), packed with and without an empty mask, from lse and from (max, sum), on
random rows and on awkward ones (all zero, -0.0, one huge element, subnormal only, NaN and +-inf, a block
at FMAX, values that round to FMAX).  `-m slow` draws more specs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import CANARY, generated_module, make_spec, render_module, requires_interpreter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_dcp_v2_specs import draw_slots

from layoutgen.dcp import quant, reference
from layoutgen.dcp.config import PackConfig
from layoutgen.dcp.layout import LSE_BYTES, LayoutBuffers, row_length, stats_words, wire_dtype
from layoutgen.dcp.spec import PAYLOAD_AXES, SCALE_AXES, STATS_AXES, DcpSpec
from layoutgen.runtime.launch import Recorder

pytestmark = requires_interpreter

LOGICAL = ("peer", "batch", "head")
FAST = {"deadline": None, "derandomize": True, "suppress_health_check": list(HealthCheck)}


# ---------------------------------------------------------------------------------------------
# The bytes from the schema text
# ---------------------------------------------------------------------------------------------
def to_axes(tensor: torch.Tensor, axes: tuple[str, ...], logical: tuple[str, ...]) -> torch.Tensor:
    return tensor.permute([logical.index(axis) for axis in axes]).contiguous()


def stored_words(
    spec: DcpSpec, lse: torch.Tensor | None, max_sum: Any, masked: torch.Tensor
) -> dict[str, torch.Tensor]:
    """[B, H] float32 per stats word, as the contract says pack stores them."""
    if spec.max_sum:
        words = {"max": lse, "sum": torch.ones_like(lse)} if lse is not None else {"max": max_sum[0], "sum": max_sum[1]}
        fills = {"max": -float("inf"), "sum": 0.0}
    else:
        words = {"lse": lse if lse is not None else reference.lse_from_max_sum(*max_sum)}
        fills = {"lse": -float("inf")}
    return {name: torch.where(masked[:, None], fills[name], value.float()) for name, value in words.items()}


def expected_bytes(
    spec: DcpSpec, out: torch.Tensor, words: dict[str, torch.Tensor], N: int, B_max: int, masked: torch.Tensor
) -> dict[str, torch.Tensor]:
    B, H, D = out.shape
    h = H // N
    wire = wire_dtype(spec, out.dtype)
    values = torch.where(masked[:, None, None], 0.0, out.float())
    codes, scales = quant.quantise(values, spec.scale_block_of(D), wire)
    blocks = scales.shape[-1]
    payload = codes.view(torch.uint8).reshape(B, N, h, D).permute(1, 0, 2, 3)  # [peer, batch, head, dim]
    scale_logical = scales.reshape(B, N, h, blocks).permute(1, 0, 2, 3)  # [peer, batch, head, block]
    logical = {name: w.reshape(B, N, h).permute(1, 0, 2) for name, w in words.items()}
    order = stats_words(spec)
    buffers: dict[str, torch.Tensor] = {}
    if spec.row_tail:
        row = row_length(spec, D, 1)
        rows = torch.full((N, B_max, h, row), CANARY, dtype=torch.uint8)
        tail = [logical[name].contiguous().unsqueeze(-1).view(torch.uint8) for name in order]
        scale_bytes = scale_logical.contiguous().view(torch.uint8)
        used = D + LSE_BYTES * len(order) + 4 * blocks
        rows[:, :B, :, :used] = torch.cat([payload, *tail, scale_bytes], dim=-1)
        buffers["payload"] = to_axes(rows, spec.payload.axes, PAYLOAD_AXES)
    else:
        data = torch.full((N, B_max, h, D), CANARY, dtype=torch.uint8)
        data[:, :B] = payload
        buffers["payload"] = to_axes(data, spec.payload.axes, PAYLOAD_AXES)
        assert spec.stats.axes is not None and spec.stats.slots is not None
        slots = (spec.stats.max_slot, spec.stats.sum_slot) if spec.max_sum else (spec.stats.slot,)
        stats = torch.zeros((N, B_max, h, spec.stats.slots))
        stats.view(torch.uint8).fill_(CANARY)
        for slot, name in zip(slots, order, strict=True):
            stats[:, :B, :, slot] = logical[name]
        buffers["stats"] = to_axes(stats, spec.stats.axes, STATS_AXES)
        table = torch.zeros((N, B_max, h, blocks))
        table.view(torch.uint8).fill_(CANARY)
        table[:, :B] = scale_logical
        buffers["scales"] = to_axes(table, spec.payload.scale_axes or SCALE_AXES, SCALE_AXES)
    return {name: tensor.reshape(-1).view(torch.uint8) for name, tensor in buffers.items()}


def flat(bufs: LayoutBuffers) -> dict[str, torch.Tensor]:
    return {name: tensor.reshape(-1).view(torch.uint8) for name, tensor in bufs.tensors.items()}


def filled(bufs: LayoutBuffers) -> LayoutBuffers:
    for tensor in bufs.tensors.values():
        tensor.view(torch.uint8).fill_(CANARY)
    return bufs


def assert_bytes(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], label: str) -> None:
    assert set(got) == set(want), label
    for name, tensor in got.items():
        if not torch.equal(tensor, want[name]):
            differ = (tensor != want[name]).nonzero().flatten()
            raise AssertionError(
                f"{label}: {name}: {differ.numel()} of {tensor.numel()} bytes differ, first at {int(differ[0])} "
                f"(got {int(tensor[differ[0]])}, want {int(want[name][differ[0]])})"
            )


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
def awkward_out(spec: DcpSpec, B: int, H: int, D: int, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Random rows (spread over magnitudes), then each awkward row the rule singles out."""
    out = torch.randn(B, H, D, generator=generator) * torch.exp2(torch.randint(-6, 6, (B, H, 1), generator=generator))
    fmax = spec.fp8_max if dtype is not torch.float16 else 448.0
    rows = [
        torch.zeros(D),
        torch.full((D,), -0.0),
        torch.cat(
            [torch.tensor([3e38 if dtype is not torch.float16 else 6e4]), torch.randn(D - 1, generator=generator)]
        ),
        torch.rand(D, generator=generator) * (1e-39 if dtype is not torch.float16 else 1e-7),
        torch.cat([torch.tensor([float("nan"), float("inf"), -float("inf")]), torch.randn(D - 3, generator=generator)]),
        torch.cat([torch.tensor([fmax]), torch.rand(D - 1, generator=generator) * fmax]),
        torch.linspace(-fmax, fmax, D) * (1 + 2**-9),
    ]
    for index, row in enumerate(rows):
        out[index % B, (index // B) % H] = row
    return out.to(dtype)


def some_rows(B: int, generator: torch.Generator) -> torch.Tensor:
    """Some of B rows marked empty: at least one, and from two rows up at least one left live (a draw of rand
    < 0.4 alone emptied none of the 5 rows of one test, which then never masked)."""
    mask = torch.rand(B, generator=generator) < 0.4
    order = torch.randperm(B, generator=generator)
    mask[order[0]] = True
    if B > 1:
        mask[order[1]] = False
    return mask


def pack_case(
    module: Any, N: int, B: int, h: int, D: int, dtype: torch.dtype, generator: torch.Generator, form: str, mask: str,
    config: Any = None, B_max: int | None = None,
) -> None:  # fmt: skip
    """One pack, kernel against the reference and against the schema text (buffers of B_max rows, B + 1 unless
    given)."""
    spec = module.SPEC
    H = N * h
    out = awkward_out(spec, B, H, D, dtype, generator)
    stats = torch.randn(B, H, generator=generator) * 4
    sums = 1 + 8 * torch.rand(B, H, generator=generator)
    empty = {"none": None, "some": some_rows(B, generator), "all": torch.ones(B, dtype=torch.bool)}[mask]
    masked = torch.zeros(B, dtype=torch.bool) if empty is None else empty
    B_max = B + 1 if B_max is None else B_max
    ours = filled(module.alloc(N, B_max, H, D, dtype))
    theirs = filled(LayoutBuffers.allocate(spec, N, B_max, H, D, dtype))
    if form == "lse":
        module.pack(out, stats, ours, empty=empty, config=config)
        reference.pack(out, stats, theirs, empty=empty)
        words = stored_words(spec, stats, None, masked)
    else:
        module.pack(out, bufs=ours, max_sum=(stats, sums), empty=empty, config=config)
        reference.pack(out, None, theirs, max_sum=(stats, sums), empty=empty)
        words = stored_words(spec, None, (stats, sums), masked)
    label = f"{spec.name} N={N} B={B} h={h} D={D} {dtype} {form} mask={mask} {config}"
    assert_bytes(flat(ours), flat(theirs), label + " (kernel vs reference)")
    assert_bytes(flat(theirs), expected_bytes(spec, out, words, N, B_max, masked), label + " (reference vs text)")


# ---------------------------------------------------------------------------------------------
# Bundled specs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("spec_name", ["pynccl_a2a_fp8", "vllm_a2a_fp8"])
def test_bundled_fp8_packs_are_byte_exact(spec_name: str, dtype: torch.dtype, generator: torch.Generator) -> None:
    module = generated_module(spec_name)
    for N, B, h, D, form, mask in (
        (2, 3, 3, 24, "lse", "none"),
        (4, 8, 2, 16, "max_sum", "some"),
        (1, 1, 1, 12, "lse", "all"),
    ):
        pack_case(module, N, B, h, D, dtype, generator, form, mask)


@pytest.mark.parametrize(
    "config",
    [
        PackConfig(block_peer=1, block_batch=1, block_head=1, block_dim=32, num_warps=1),
        PackConfig(block_peer=2, block_batch=2, block_head=2, block_dim=64, num_warps=2),
        PackConfig(block_peer=4, block_batch=4, block_head=1, block_dim=32, num_warps=4),
    ],
    ids=lambda c: f"{c.block_peer}x{c.block_batch}x{c.block_head}x{c.block_dim}",
)
def test_fp8_pack_tiles_of_several_blocks(
    config: PackConfig, generator: torch.Generator, tmp_path_factory: Any
) -> None:
    """Tiles holding one scale block, several, and blocks of a row split over dim programs."""
    spec = make_spec(
        name="tiles_fp8",
        transport="all_to_all_single",
        payload={"axes": ["peer", "batch", "head", "dim"], "dtype": "float8_e4m3fn", "scale_block": 16},
        stats={"placement": "row_tail"},
        align_bytes=16,
    )
    module = render_module(spec, tmp_path_factory.mktemp("tiles"))
    pack_case(module, 4, 5, 3, 96, torch.bfloat16, generator, "lse", "some", config)


@pytest.mark.parametrize(
    ("axes", "block", "widths"),
    [
        (["batch", "dim", "peer", "head"], None, ((24, 8), (24, 16), (20, 8))),
        (["peer", "head", "dim", "batch"], 16, ((48, 8), (32, 4))),
        (["peer", "batch", "dim", "head"], None, ((32, 8),)),
    ],
    ids=["head-inner-block-D", "batch-inner-block-16", "head-inner-peer-outer"],
)
def test_transposing_fp8_packs_split_scale_blocks_into_chunks(
    axes: list[str], block: int | None, widths: tuple[tuple[int, int], ...], generator: torch.Generator,
    tmp_path_factory: Any,
) -> None:  # fmt: skip
    """A payload whose innermost axis is not dim packs a scale block wider than its tile in chunks (two
    passes): chunks that divide the block (24 = 3 x 8), a partial last chunk (24 in 16s, 20 in 8s), several
    chunks per block of 16; masked rows, both stats forms, odd N, B and heads."""
    payload: dict[str, Any] = {"axes": axes, "dtype": "float8_e4m3fn", **({"scale_block": block} if block else {})}
    spec = make_spec(
        name="chunks_fp8",
        transport="external",
        payload=payload,
        stats={"placement": "separate", "axes": ["peer", "batch", "head", "slot"]},
    )
    module = render_module(spec, tmp_path_factory.mktemp("chunks"))
    for D, block_dim in widths:
        config = PackConfig(block_peer=2, block_batch=2, block_head=2, block_dim=block_dim, num_warps=1)
        assert block_dim < (block or D)  # the chunked path, not one pass
        for form, mask in (("lse", "some"), ("max_sum", "none")):
            pack_case(module, 3, 5, 3, D, torch.bfloat16, generator, form, mask, config)


@pytest.mark.parametrize(
    ("axes", "block", "scale_axes"),
    [
        (["head", "dim", "batch", "peer"], 16, ["block", "head", "batch", "peer"]),
        (["batch", "dim", "head", "peer"], None, ["peer", "batch", "head", "block"]),
    ],
    ids=["batch-peer-pairs-block-16", "head-peer-pairs-block-D"],
)
def test_fp8_packs_of_peer_pairs(
    axes: list[str], block: int | None, scale_axes: list[str], generator: torch.Generator, tmp_path_factory: Any
) -> None:
    """Peer innermost with batch or head right outside it: the tile's runs are (X, peer) pairs, which at N 3
    cross a run's end mid-row; one pass and chunks, the default box, masked rows, both stats forms."""
    payload: dict[str, Any] = {"axes": axes, "dtype": "float8_e5m2", "scale_axes": scale_axes}
    spec = make_spec(
        name="pairs_fp8",
        transport="external",
        payload={**payload, **({"scale_block": block} if block else {})},
        stats={"placement": "separate", "axes": ["batch", "head", "slot", "peer"], "form": "max_sum"},
    )
    module = render_module(spec, tmp_path_factory.mktemp("pairs"))
    configs = (
        None,
        PackConfig(block_peer=2, block_batch=2, block_head=2, block_dim=8, num_warps=1),
        PackConfig(block_peer=1, block_batch=2, block_head=8, block_dim=32, num_warps=2),
    )
    for N, config in zip((3, 4, 3), configs, strict=True):
        for form, mask in (("lse", "some"), ("max_sum", "none")):
            pack_case(module, N, 5, 3, 32, torch.bfloat16, generator, form, mask, config)


@pytest.mark.parametrize(
    ("axes", "stats_axes"),
    [
        (["peer", "head", "dim", "batch"], ["peer", "head", "slot", "batch"]),
        (["dim", "peer", "head", "batch"], ["peer", "batch", "head", "slot"]),
    ],
    ids=["peer-head-dim-batch", "dim-peer-head-batch"],
)
def test_batch_innermost_fp8_packs_store_codes_four_rows_to_a_word(
    axes: list[str], stats_axes: list[str], generator: torch.Generator, tmp_path_factory: Any
) -> None:
    """batch innermost, one pass, a capacity of whole words: the codes of rows 4i .. 4i + 3 go out as one 32-bit
    word (`WORDS`), and a last tile that is not whole byte by byte.  Whole tiles and a partial last one (B 8 and
    B 13 in tiles of 4 and 8), a capacity that is not whole words (B_max 13: the byte path), masked rows, both
    stats forms, scales with batch innermost or not, a block wider than one tile's dims and narrower."""
    for scale_block, scale_axes in (
        (16, ["peer", "head", "block", "batch"]),
        (None, ["peer", "head", "batch", "block"]),
    ):
        payload: dict[str, Any] = {"axes": axes, "dtype": "float8_e5m2", "scale_axes": scale_axes}
        if scale_block:
            payload["scale_block"] = scale_block
        spec = make_spec(
            name="words_fp8",
            transport="external",
            payload=payload,
            stats={"placement": "separate", "axes": stats_axes},
        )
        module = render_module(spec, tmp_path_factory.mktemp("words"))
        D = 32
        for block_batch, B, B_max, block_dim in ((4, 8, 8, 32), (8, 13, 16, 32), (4, 13, 13, 32), (8, 5, 8, 64)):
            config = PackConfig(block_peer=2, block_batch=block_batch, block_head=2, block_dim=block_dim, num_warps=1)
            recorder = Recorder()
            bufs = module.alloc(3, B_max, 9, D, torch.bfloat16)
            module._launch_pack(
                torch.randn(B, 9, D).to(torch.bfloat16), torch.randn(B, 9), bufs, B, config, False, kernel=recorder
            )
            assert recorder.calls[0][2]["WORDS"] is (B_max % 4 == 0), (config, B_max)
            for form, mask in (("lse", "some"), ("max_sum", "none")):
                pack_case(module, 3, B, 3, D, torch.bfloat16, generator, form, mask, config, B_max=B_max)
        # Rows of T tokens per request (R 3 x T 4: row 4i + k is token k of a request, request i), from strided
        # views, a request empty: the sub-tiles' row arithmetic.
        R, T, heads = 3, 4, 9
        out = torch.randn(R, T, 2 * heads, D, generator=generator).to(torch.bfloat16)[:, :, ::2]
        lse = (torch.randn(R, T, 2 * heads, generator=generator) * 4)[:, :, ::2]
        empty = torch.tensor([False, True, False])
        config = PackConfig(block_peer=1, block_batch=8, block_head=1, block_dim=32, num_warps=1)
        ours = filled(module.alloc(3, R * T, heads, D, torch.bfloat16))
        theirs = filled(LayoutBuffers.allocate(spec, 3, R * T, heads, D, torch.bfloat16))
        module.pack(out, lse, ours, empty=empty, config=config)
        reference.pack(out, lse, theirs, empty=empty)
        assert_bytes(flat(ours), flat(theirs), f"{spec.name} R={R} T={T} strided (kernel vs reference)")


def test_a_tile_that_splits_a_scale_block_is_refused(generator: torch.Generator) -> None:
    module = generated_module("pynccl_a2a_fp8")  # one scale per row: D = 64 needs block_dim >= 64
    bufs = module.alloc(2, 2, 4, 64, torch.bfloat16)
    out, lse = torch.randn(2, 4, 64).to(torch.bfloat16), torch.randn(2, 4)
    config = PackConfig(block_peer=1, block_batch=1, block_head=1, block_dim=32)
    with pytest.raises(ValueError, match=r"block_dim=32 splits the scale blocks.*use block_dim >= 64"):
        module.pack(out, lse, bufs, config=config)
    with pytest.raises(ValueError, match=r"use block_dim >= 64"):
        module._launch_pack(out, lse, bufs, 2, config, False)
    module.pack(out, lse, bufs)  # the default config covers whole blocks


def test_d_must_be_a_multiple_of_the_scale_block(tmp_path_factory: Any) -> None:
    spec = make_spec(
        name="blocks_fp8",
        transport="all_to_all_single",
        payload={"axes": ["peer", "batch", "head", "dim"], "dtype": "float8_e5m2", "scale_block": 32},
        stats={"placement": "separate", "axes": ["peer", "batch", "head", "slot"]},
    )
    with pytest.raises(ValueError, match=r"scale_block=32 .* must divide D; got D=48"):
        LayoutBuffers.allocate(spec, 2, 2, 4, 48, torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# Any valid fp8 spec
# ---------------------------------------------------------------------------------------------
@st.composite
def fp8_spec_data(draw: Any) -> dict[str, Any]:
    transport = draw(st.sampled_from(["all_to_all_single", "external"]))
    row_tail = draw(st.booleans())
    form = draw(st.sampled_from([None, "lse", "max_sum"]))
    axes = list(draw(st.permutations(PAYLOAD_AXES)))
    if transport == "all_to_all_single":
        axes = ["peer", *[a for a in axes if a != "peer"]]
    if row_tail:
        axes = [*[a for a in axes if a != "dim"], "dim"]
    payload: dict[str, Any] = {"axes": axes, "dtype": draw(st.sampled_from(["float8_e4m3fn", "float8_e5m2"]))}
    block = draw(st.sampled_from([None, 16, 32]))
    if block is not None:
        payload["scale_block"] = block
    data: dict[str, Any] = {"name": "drawn_fp8", "transport": transport, "payload": payload}
    if row_tail:
        data["stats"] = {"placement": "row_tail", **({"form": form} if form else {})}
        align = draw(st.sampled_from([None, 4, 16, 64]))
        if align is not None:
            data["align_bytes"] = align
        return data
    stats_axes = list(draw(st.permutations(STATS_AXES)))
    scale_axes = list(draw(st.permutations(SCALE_AXES)))
    if transport == "all_to_all_single":
        stats_axes = ["peer", *[a for a in stats_axes if a != "peer"]]
        scale_axes = ["peer", *[a for a in scale_axes if a != "peer"]]
    if draw(st.booleans()):
        payload["scale_axes"] = scale_axes
    data["stats"] = {
        "placement": "separate",
        "axes": stats_axes,
        **({"form": form} if form else {}),
        **draw_slots(draw, form, 3),
    }
    return data


@st.composite
def fp8_problems(draw: Any) -> dict[str, Any]:
    spec = draw(fp8_spec_data())
    block = spec["payload"].get("scale_block")
    return {
        "spec": spec,
        "dtype": draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32])),
        "N": draw(st.integers(1, 3)),
        "B": draw(st.integers(1, 4)),
        "h": draw(st.integers(1, 3)),
        "D": (block or 8) * draw(st.integers(1, 3)) if block else draw(st.sampled_from([8, 12, 20])),
        "form": draw(st.sampled_from(["lse", "max_sum"])),
        "mask": draw(st.sampled_from(["none", "some", "all"])),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def check_problem(problem: dict[str, Any], directory: Any) -> None:
    module = render_module(make_spec(**problem["spec"]), directory)
    generator = torch.Generator().manual_seed(problem["seed"])
    pack_case(
        module, problem["N"], problem["B"], problem["h"], problem["D"], problem["dtype"], generator,
        problem["form"], problem["mask"],
    )  # fmt: skip


@settings(max_examples=8, **FAST)
@given(problem=fp8_problems())
def test_any_valid_fp8_spec_packs_exactly(problem: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> None:
    check_problem(problem, tmp_path_factory.mktemp("drawn_fp8"))


@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(problem=fp8_problems())
def test_any_valid_fp8_spec_long_run(problem: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> None:
    check_problem(problem, tmp_path_factory.mktemp("drawn_fp8"))


def test_drawn_fp8_specs_are_valid_and_cover_the_forms() -> None:
    seen: set[tuple[Any, ...]] = set()

    @settings(max_examples=300, **FAST)
    @given(data=fp8_spec_data())
    def collect(data: dict[str, Any]) -> None:
        spec = make_spec(**data)
        seen.add((spec.row_tail, spec.max_sum, spec.payload.dtype.value, spec.payload.scale_block is None))

    collect()
    assert {(tail, pair) for tail, pair, *_ in seen} == {(True, True), (True, False), (False, True), (False, False)}
    assert {dtype for _, _, dtype, _ in seen} == {"float8_e4m3fn", "float8_e5m2"}


def e4m3_module(tmp_path: Path, name: str, axes: list[str], scale_block: int | None, stats_axes: list[str]) -> Any:
    """A rendered e4m3fn spec with payload `axes` (one scale per row without `scale_block`), separate stats."""
    payload: dict[str, object] = {"axes": axes, "dtype": "float8_e4m3fn"}
    if scale_block is not None:
        payload["scale_block"] = scale_block
    spec = make_spec(
        name=name, transport="external", payload=payload, stats={"placement": "separate", "axes": stats_axes}
    )
    return render_module(spec, tmp_path)


@pytest.mark.parametrize(
    ("axes", "scale_block", "box", "capped"),
    [
        (["peer", "head", "dim", "batch"], 16, (32, 1, 128, 4), True),  # words, 32 per thread
        (["peer", "head", "dim", "batch"], 16, (64, 1, 128, 4), False),  # 64 per thread: the cap spilled
        (["peer", "head", "dim", "batch"], 16, (32, 1, 128, 8), False),  # 16 per thread: it gained nothing
        (["peer", "head", "dim", "batch"], 128, (64, 1, 64, 4), False),  # a block in two chunks
        (["peer", "batch", "dim", "head"], 128, (1, 16, 512, 8), True),  # head innermost, blocks of 128
        (["peer", "batch", "dim", "head"], None, (1, 16, 256, 4), False),  # one scale per row in two chunks
        (["peer", "batch", "dim", "head"], 16, (1, 16, 256, 4), False),  # head innermost, blocks of 16
    ],
)
def test_transposing_packs_cap_registers_only_where_it_was_measured_to_pay(
    tmp_path: Path, axes: list[str], scale_block: int | None, box: tuple[int, int, int, int], capped: bool
) -> None:
    """The launcher's `maxnreg`: 64 on one-pass tiles of 32 elements per thread (batch innermost in words, head
    innermost with blocks of at least 128), none elsewhere (notes, eleventh pass)."""
    from layoutgen.dcp.config import PackConfig
    from layoutgen.runtime.launch import Recorder

    module = e4m3_module(tmp_path, "capped", axes, scale_block, ["peer", "batch", "head", "slot"])
    N, B, H, D = 2, 64, 32, 512
    bufs = module.alloc(N, B, H, D, torch.bfloat16)
    out, lse = torch.randn(B, H, D, dtype=torch.bfloat16), torch.randn(B, H)
    rows, heads, dims, warps = box
    config = PackConfig(block_peer=1, block_batch=rows, block_head=heads, block_dim=dims, num_warps=warps)
    recorder = Recorder()
    module._launch_pack(out, lse, bufs, B, config, False, kernel=recorder)
    ((_, _, options),) = recorder.calls
    assert options["maxnreg"] == (64 if capped else None)


@pytest.mark.parametrize(("scale_block", "D"), [(None, 256), (256, 512), (128, 256)])
def test_batch_innermost_fp8_default_takes_whole_blocks_of_rows(
    scale_block: int | None, D: int, generator: torch.Generator, tmp_path: Path
) -> None:
    """batch innermost with blocks of 256 or 512: the default box is 32 rows x the whole block, one pass in words
    under the register cap (twentieth pass: 41 -> 58% of the copy at one scale per row, D 512), byte-exact over
    a whole tile of 32 rows and a partial one; blocks of 128 keep their 128-dim box."""
    from layoutgen.dcp.config import default_pack_config
    from layoutgen.runtime.launch import Recorder

    axes = ["dim", "peer", "head", "batch"]
    module = e4m3_module(tmp_path, "whole_rows_fp8", axes, scale_block, ["peer", "head", "slot", "batch"])
    N, h, B = 2, 2, 40
    config = default_pack_config(module.SPEC, N, h, D, B, 2)
    lanes = scale_block or D
    if lanes == 128:
        assert config.block_dim == 128 and config.block_batch <= 32, config
    else:
        assert (config.block_batch, config.block_dim, config.num_warps) == (32, lanes, lanes // 32), config
        recorder = Recorder()
        bufs = module.alloc(N, B, N * h, D, torch.bfloat16)
        out, lse = torch.randn(B, N * h, D).to(torch.bfloat16), torch.randn(B, N * h)
        module._launch_pack(out, lse, bufs, B, config, False, kernel=recorder)
        ((_, _, options),) = recorder.calls
        assert options["WORDS"] and options["LANE_CHUNKS"] == 1 and options["maxnreg"] == 64, options
    for form, mask in (("lse", "some"), ("max_sum", "none")):
        pack_case(module, N, B, h, D, torch.bfloat16, generator, form, mask, config, B_max=B)


@pytest.mark.parametrize(("scale_block", "box"), [(16, (8, 32)), (32, (8, 32)), (64, (4, 64))])
def test_head_innermost_fp8_default_holds_a_sector_of_scales(
    scale_block: int, box: tuple[int, int], generator: torch.Generator, tmp_path: Path
) -> None:
    """head innermost with blocks under 128 whose scales run along batch: the default box holds up to 8 rows, a
    32-byte sector of scales, over whole blocks of at least 32 dims (H200, N 8, B 1024: blocks of 16, 32 and
    64 at 35 -> 61%, 44 -> 63% and 48 -> 59% of the copy); byte-exact over a whole tile and a partial one.  Scales
    with their blocks or peer innermost keep one row and one peer (a box of 8 peers lost: 49 -> 37%)."""
    from layoutgen.dcp.config import default_pack_config

    def spec_with(scale_axes: list[str]) -> DcpSpec:
        payload = {"axes": ["peer", "dim", "batch", "head"], "dtype": "float8_e4m3fn", "scale_block": scale_block}
        return make_spec(
            name="sector_scales",
            transport="external",
            payload={**payload, "scale_axes": scale_axes},
            stats={"placement": "separate", "axes": ["peer", "batch", "head", "slot"]},
        )

    along_batch = spec_with(["head", "peer", "block", "batch"])
    config = default_pack_config(along_batch, 8, 16, 512, 1024, 2)
    assert (config.block_peer, config.block_batch, config.block_head, config.block_dim) == (1, box[0], 16, box[1])
    assert config.num_warps == 4 and config.tile_elements <= 4096, config
    for other in (["peer", "batch", "head", "block"], ["head", "batch", "block", "peer"]):
        kept = default_pack_config(spec_with(other), 8, 16, 512, 1024, 2)
        assert (kept.block_peer, kept.block_batch, kept.block_dim) == (1, 1, 128), (other, kept)

    module = render_module(along_batch, tmp_path)
    N, h, B, D = 2, 3, 11, 128
    config = default_pack_config(module.SPEC, N, h, D, B, 2)
    assert (config.block_batch, config.block_dim) == (8, max(32, scale_block)), config
    pack_case(module, N, B, h, D, torch.bfloat16, generator, "lse", "some", config, B_max=B)
