"""Hardening of the fp8 wire path (round 11 mutation audit of quant.py, the fp8 rules of spec.py, layout.py and
the fp8 kernel templates).  Each test answers mutations the fp8 suite let through:

* `test_e5m2_quotients_past_fmax_saturate` -- quant.quantise without the clamp before the cast (`q / scale`
  sent to torch unclamped) and with a one-sided clamp (`clamp(max=FMAX)`): torch's float32 -> float8_e5m2 cast
  overflows to +-inf (code 0x7C / 0xFC), so a block whose scale is a float32 subnormal (quotient 71680) must
  still store +-57344 (0x7B / 0xFB).  e4m3fn saturates in torch 2.13 itself, so only e5m2 can see the clamp.
* `test_e5m2_pack_kernel_saturates_like_the_reference` -- the same rows through a rendered e5m2 pack kernel
  (the template's `_fp8_codes` clamp), byte for byte against `reference.pack` in canary-filled buffers, and the
  exact codes and scales the rule gives.
* `test_a_scale_that_underflows_to_zero_is_one` -- "scale = 1 where amax / FMAX is 0" tested on amax instead of
  on the quotient (quant.block_scales `torch.where(amax == 0, ...)`, pack_fp8.py.jinja `_fp8_scales` likewise):
  float32 blocks whose amax is a few subnormal ulps divide to scale 0, which must become 1 with zero codes (the
  mutant stores scale 0 and FMAX codes).
* `test_pack_kernel_turns_an_underflowing_scale_into_one` -- the kernel side of the previous one, in one
  pass and in chunks, e4m3fn and e5m2, with canary bytes checked.
* `test_the_documented_scale_block_bounds_are_accepted` -- spec.py's bound `block > MAX_SCALE_BLOCK` made
  `>=` (65536, documented as allowed, refused) and the 16 / 65536 edges and their neighbours.
* `test_dequantise_refuses_scales_that_do_not_fit_the_codes` -- quant.dequantise without its two checks: scales
  of another leading shape broadcast silently into the product; a row that does not split into the blocks
  fails in reshape with torch's error instead of the ValueError.
* `test_quantise_refuses_what_the_rule_does_not_cover` -- quant.block_scales without its float32 check (a
  bfloat16 input quantised in bfloat16), quantise without its divisor check (ZeroDivisionError / reshape
  errors), fp8_max without its TypeError (a KeyError).
* `test_an_fp8_row_tail_needs_d_a_multiple_of_4` -- layout.check_shape's row-tail alignment check skipped for
  fp8 specs (one scale per row admits any D, e.g. 6, whose scale word would sit at an odd offset).

Two defects the audit found, fixed with these tests (each fails on the code before):

* `test_the_default_pack_config_holds_a_scale_block_past_1024` -- config._dim_innermost_pack_config capped the
  dim block at 1024 below its own floor, so a dim-innermost fp8 pack with no config refused itself at D=2048.
* `test_a_row_scale_no_pack_tile_can_hold_is_refused_at_allocation` -- one scale per row past 65536 elements
  was allocated, and pack then asked for a block_dim no config may have; now the shape check names the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import CANARY, assert_same_bytes, fill_bytes, make_spec, render_module, requires_interpreter

from layoutgen.dcp import quant, reference
from layoutgen.dcp.config import PackConfig
from layoutgen.dcp.layout import LayoutBuffers, scale_blocks
from layoutgen.spec import SpecError, bundled_specs

TINY = 2.0**-149  # the smallest float32 subnormal
E5M2_MAX = 57344.0
#: An element whose block's scale, amax / 57344 = 2.5 subnormal ulps, rounds (to even) to 2 ulps: its
#: quotient is 57344 * 1.25 = 71680, past e5m2's largest finite value and past the midpoint to infinity.
PAST_E5M2_MAX = TINY * E5M2_MAX * 2.5


def spec_fields(name: str, dtype: str, axes: list[str], block: int | None, row_tail: bool) -> dict[str, Any]:
    payload: dict[str, Any] = {"axes": axes, "dtype": dtype, **({"scale_block": block} if block else {})}
    if row_tail:
        return {
            "name": name,
            "transport": "all_to_all_single",
            "payload": payload,
            "stats": {"placement": "row_tail", "form": "max_sum"},
            "align_bytes": 16,
        }
    return {
        "name": name,
        "transport": "external",
        "payload": {**payload, "scale_axes": ["block", "head", "peer", "batch"]},
        "stats": {"placement": "separate", "axes": ["slot", "batch", "peer", "head"], "slots": 2, "slot": 1},
    }


def owned_bytes(bufs: LayoutBuffers, B: int) -> int:
    """Bytes a pack of B rows assigns: the codes, the stats words and the scales of every (peer, row, head)."""
    entries = bufs.N * B * (bufs.H // bufs.N)
    return entries * (bufs.D + 4 * bufs.spec.stats.words + 4 * scale_blocks(bufs.spec, bufs.D))


def pack_both(module: Any, out: torch.Tensor, lse: torch.Tensor, N: int, config: Any) -> tuple[Any, Any]:
    """The kernel's and the reference's pack of `out` into canary-filled buffers of one spare row; checked
    byte for byte, with every byte the layout does not own left at the canary."""
    B, H, D = out.shape
    ours = fill_bytes(module.alloc(N, B + 1, H, D, out.dtype))
    theirs = fill_bytes(LayoutBuffers.allocate(module.SPEC, N, B + 1, H, D, out.dtype))
    module.pack(out, lse, ours, config=config)
    reference.pack(out, lse, theirs)
    assert_same_bytes(ours, theirs, f"{module.SPEC.name} {config}")
    changed = sum(int((t.reshape(-1).view(torch.uint8) != CANARY).sum()) for t in ours.tensors.values())
    assert changed <= owned_bytes(ours, B), f"{changed} bytes lost the canary; a pack of {B} rows owns fewer"
    return ours, theirs


# ---------------------------------------------------------------------------------------------------------------
# e5m2: quotients past FMAX saturate (torch's cast would give +-inf)
# ---------------------------------------------------------------------------------------------------------------
def test_e5m2_quotients_past_fmax_saturate(generator: torch.Generator) -> None:
    rest = (torch.rand(14, generator=generator) * 0.5 + 0.25) * PAST_E5M2_MAX
    block = torch.cat([torch.tensor([PAST_E5M2_MAX, -PAST_E5M2_MAX]), rest]).float()[None]
    codes, scales = quant.quantise(block, 16, torch.float8_e5m2)
    assert float(scales[0, 0]) == 2 * TINY, "amax / 57344 = 2.5 ulps rounds to even: 2 ulps"
    raw = codes.view(torch.uint8)[0]
    assert int(raw[0]) == 0x7B and int(raw[1]) == 0xFB, "+-71680 saturate to +-57344, not +-inf (0x7C / 0xFC)"
    back = quant.dequantise(codes, scales)
    assert bool(back.isfinite().all()) and float(back[0, 0]) == E5M2_MAX * 2 * TINY == -float(back[0, 1])
    # the other elements: quotients below FMAX, as torch rounds them
    want = (block[0, 2:] / scales[0, 0]).to(torch.float8_e5m2).view(torch.uint8)
    assert torch.equal(raw[2:], want)


@requires_interpreter
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # 1 / scale of a subnormal scale
@pytest.mark.parametrize(
    ("axes", "block", "row_tail", "block_dim"),
    [
        (["peer", "batch", "head", "dim"], 16, True, None),  # one pass, several blocks per row, row tail
        (["head", "dim", "batch", "peer"], None, False, 16),  # a transposing pack: one block of 48 in chunks
    ],
    ids=["tail-blocks-16", "separate-chunks"],
)
def test_e5m2_pack_kernel_saturates_like_the_reference(
    axes: list[str], block: int | None, row_tail: bool, block_dim: int | None, generator: torch.Generator,
    tmp_path: Path,
) -> None:  # fmt: skip
    spec = make_spec(**spec_fields("sat_e5m2", "float8_e5m2", axes, block, row_tail))
    module = render_module(spec, tmp_path)
    N, B, H, D = 3, 1, 3, 48
    out = torch.randn(B, H, D, generator=generator) * 3
    out[0, 1] = (torch.rand(D, generator=generator) * 0.5 + 0.25) * PAST_E5M2_MAX
    out[0, 1, 0], out[0, 1, 5] = PAST_E5M2_MAX, -PAST_E5M2_MAX  # in the first block of the row
    lse = torch.randn(B, H, generator=generator) * 4
    config = None if block_dim is None else PackConfig(block_peer=1, block_batch=1, block_head=1, block_dim=block_dim)
    ours, _ = pack_both(module, out, lse, N, config)
    codes = ours.payload_view(B).view(torch.uint8)[1, 0, 0]  # head 1 is peer 1's only head
    assert int(codes[0]) == 0x7B and int(codes[5]) == 0xFB
    assert float(ours.scale_view(B)[1, 0, 0, 0]) == 2 * TINY


# ---------------------------------------------------------------------------------------------------------------
# amax / FMAX that underflows to 0: scale 1 (the rule tests the quotient, not amax)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_a_scale_that_underflows_to_zero_is_one(dtype: torch.dtype, generator: torch.Generator) -> None:
    fmax = quant.fp8_max(dtype)
    ulps = torch.randint(1, int(fmax // 2) if fmax < 1000 else 200, (3, 16), generator=generator).float()
    signs = torch.where(torch.rand(3, 16, generator=generator) < 0.5, -1.0, 1.0)
    blocks = signs * ulps * TINY  # amax <= FMAX / 2 ulps: the quotient amax / FMAX rounds to 0
    assert bool((blocks != 0).all())
    codes, scales = quant.quantise(blocks, 16, dtype)
    assert torch.equal(scales, torch.ones(3, 1)), "amax / FMAX underflows to 0: scale 1"
    want = (blocks / 1.0).to(dtype).view(torch.uint8)  # x / 1 rounds to a signed zero
    assert torch.equal(codes.view(torch.uint8), want)
    assert bool((quant.dequantise(codes, scales) == 0).all())


@requires_interpreter
@pytest.mark.parametrize(
    ("dtype", "axes", "block", "row_tail", "block_dim"),
    [
        ("float8_e4m3fn", ["peer", "batch", "head", "dim"], None, True, None),
        ("float8_e5m2", ["peer", "batch", "head", "dim"], 16, False, None),
        ("float8_e4m3fn", ["head", "dim", "batch", "peer"], None, False, 8),  # in chunks
    ],
    ids=["e4m3-tail-row", "e5m2-separate-16", "e4m3-chunks"],
)
def test_pack_kernel_turns_an_underflowing_scale_into_one(
    dtype: str, axes: list[str], block: int | None, row_tail: bool, block_dim: int | None,
    generator: torch.Generator, tmp_path: Path,
) -> None:  # fmt: skip
    spec = make_spec(**spec_fields("underflow_fp8", dtype, axes, block, row_tail))
    module = render_module(spec, tmp_path)
    N, B, H, D = 1, 2, 3, 16 if block else 20
    out = torch.randn(B, H, D, generator=generator)
    ulps = torch.randint(1, 100, (D,), generator=generator).float()
    out[1, 2] = torch.where(torch.rand(D, generator=generator) < 0.5, -1.0, 1.0) * ulps * TINY
    lse = torch.randn(B, H, generator=generator) * 4
    config = None if block_dim is None else PackConfig(block_peer=1, block_batch=1, block_head=1, block_dim=block_dim)
    ours, _ = pack_both(module, out, lse, N, config)
    assert float(ours.scale_view(B)[0, 1, 2, 0]) == 1.0
    assert bool((ours.payload_view(B).view(torch.uint8)[0, 1, 2] & 0x7F == 0).all()), "signed zero codes"


# ---------------------------------------------------------------------------------------------------------------
# spec validation: scale_block is a power of two from 16 to 65536
# ---------------------------------------------------------------------------------------------------------------
def test_the_documented_scale_block_bounds_are_accepted() -> None:
    def spec(block: int) -> Any:
        return make_spec(**spec_fields("bounds_fp8", "float8_e5m2", ["peer", "batch", "head", "dim"], block, True))

    for block in (16, 32, 32768, 65536):
        assert spec(block).scale_block_of(2 * block) == block
    big = spec(65536)
    bufs = LayoutBuffers.allocate(big, 1, 1, 1, 65536, torch.bfloat16)
    assert bufs.scale_view(1).shape == (1, 1, 1, 1)
    for block in (8, 15, 17, 48, 65535, 131072):
        with pytest.raises(SpecError, match=r"payload\.scale_block"):
            spec(block)


# ---------------------------------------------------------------------------------------------------------------
# quant's argument checks: each one fires, with its own message (without them torch broadcasts or fails elsewhere)
# ---------------------------------------------------------------------------------------------------------------
def test_dequantise_refuses_scales_that_do_not_fit_the_codes(generator: torch.Generator) -> None:
    codes, scales = quant.quantise(torch.randn(2, 4, 32, generator=generator), 16, torch.float8_e4m3fn)
    assert quant.dequantise(codes, scales).shape == (2, 4, 32)
    for wrong in (scales[:1], scales[0], scales[:, :1]):  # each would broadcast into the product
        with pytest.raises(ValueError, match="leading shape of codes"):
            quant.dequantise(codes, wrong)
    for blocks in (3, 5):  # 32 codes do not split into 3 or 5 blocks
        with pytest.raises(ValueError, match=f"split into the {blocks} blocks"):
            quant.dequantise(codes, torch.ones(2, 4, blocks))


def test_quantise_refuses_what_the_rule_does_not_cover(generator: torch.Generator) -> None:
    x = torch.randn(3, 48, generator=generator)
    for dtype in (torch.bfloat16, torch.float16, torch.float64):  # the rule is float32 arithmetic
        with pytest.raises(TypeError, match="quantise float32 values"):
            quant.block_scales(x.to(dtype), 16, torch.float8_e5m2)
        with pytest.raises(TypeError, match="quantise float32 values"):
            quant.quantise(x.to(dtype), 16, torch.float8_e4m3fn)
    for block in (0, -16, 32, 96):  # not a positive divisor of 48
        with pytest.raises(ValueError, match=f"positive divisor of D=48, got {block}"):
            quant.quantise(x, block, torch.float8_e4m3fn)
    for dtype in (torch.float32, torch.bfloat16, torch.uint8):
        with pytest.raises(TypeError, match="not an fp8 wire dtype"):
            quant.fp8_max(dtype)
    assert (quant.fp8_max(torch.float8_e4m3fn), quant.fp8_max(torch.float8_e5m2)) == (448.0, 57344.0)


def test_an_fp8_row_tail_needs_d_a_multiple_of_4() -> None:
    """One scale per row (scale_block unset) lets any D through the spec; a row tail's float32 words still need
    D codes to end on a 4-byte boundary, and the shape check says so before any view is made."""
    spec = bundled_specs()["pynccl_a2a_fp8"]
    for D in (6, 10, 30):
        with pytest.raises(ValueError, match=f"multiple of 4 bytes; got D={D}"):
            LayoutBuffers.allocate(spec, 1, 1, 1, D, torch.bfloat16)
    bufs = LayoutBuffers.allocate(spec, 1, 2, 3, 12, torch.bfloat16)
    assert bufs.scale_view(2).shape == (1, 2, 3, 1)


# ---------------------------------------------------------------------------------------------------------------
# scale blocks past 1024 elements: the default pack tile holds a whole block; one past any tile is refused early
# ---------------------------------------------------------------------------------------------------------------
@requires_interpreter
@pytest.mark.parametrize(("D", "block"), [(2048, None), (4096, 2048)], ids=["row-2048", "blocks-2048"])
def test_the_default_pack_config_holds_a_scale_block_past_1024(
    D: int, block: int | None, generator: torch.Generator, tmp_path: Path
) -> None:
    """The default dim-innermost config grew its box with the dim extent capped at 1024 (block_dim's cap), so
    its own floor check refused it: "use block_dim >= 2048" for a pack called with no config."""
    spec = make_spec(**spec_fields("wide_fp8", "float8_e4m3fn", ["peer", "batch", "head", "dim"], block, True))
    module = render_module(spec, tmp_path)
    out = torch.randn(1, 2, D, generator=generator, dtype=torch.bfloat16) * 3
    lse = torch.randn(1, 2, generator=generator) * 4
    pack_both(module, out, lse, 2, None)


def test_a_row_scale_no_pack_tile_can_hold_is_refused_at_allocation() -> None:
    """Past 65536 elements (rounded up to a power of two) no pack config can hold a row's one scale block, and
    the launcher's "use block_dim >= 131072" named a fix PackConfig refuses: the shape check names the field."""
    spec = bundled_specs()["pynccl_a2a_fp8"]
    for D in (65540, 131072):
        with pytest.raises(ValueError, match=f"D={D} elements under one scale.*set payload.scale_block"):
            LayoutBuffers.allocate(spec, 1, 1, 1, D, torch.bfloat16)
    assert LayoutBuffers.allocate(spec, 1, 1, 1, 65536, torch.bfloat16).scale_view(1).shape == (1, 1, 1, 1)
    chunked = make_spec(**spec_fields("chunked_fp8", "float8_e4m3fn", ["head", "dim", "batch", "peer"], None, False))
    assert LayoutBuffers.allocate(chunked, 1, 1, 1, 131072, torch.bfloat16).scale_view(1).shape == (1, 1, 1, 1)
