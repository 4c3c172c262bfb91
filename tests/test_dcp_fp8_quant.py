"""The fp8 quantisation rule itself (the brief's DESIGN.md §8.3; `layoutgen.dcp.quant`), its software codec in
the generated kernels, and the GPU kernels' division algorithm.

* `quant.quantise` against an oracle written here from the rule alone (float64 amax and quotient rounded to
  float32, the nearest fp8 value found by search with ties to even, saturation), on random and awkward
  blocks: all zero, -0.0, one huge element, subnormal only, NaN / +-inf, a block whose amax is FMAX,
  quotients on every rounding midpoint;
* the integer encoder and decoder the kernels use under the interpreter (`_fp8_codes`, `_fp8_values` of a
  generated module) against torch's casts, over every midpoint +- 3 float32 ulps and random values;
* the GPU pack's division (a per-block reciprocal and Markstein's correction, `pack_fp8.py.jinja`) emulated
  here with exact fused multiply-adds: it gives IEEE `x / s` on every tile it is used for (quotients below
  2^-31 aside, which encode as a signed zero either way), so the fp8 codes are those of the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from conftest import generated_module, make_spec, render_module, requires_interpreter
from torch.utils._python_dispatch import TorchDispatchMode

from layoutgen.dcp import quant

FP8 = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
INF, NAN = float("inf"), float("nan")


def fp8_table(dtype: torch.dtype) -> torch.Tensor:
    """Every finite non-negative value of an fp8 dtype, ascending, as float64."""
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).double()
    return values[values.isfinite() & (values >= 0)].unique()


def oracle_code(q: float, dtype: torch.dtype) -> int:
    """The code of float32 quotient `q`: clamp to +-FMAX, nearest fp8 value, ties to the even code."""
    table = fp8_table(dtype)
    fmax = FP8[dtype]
    sign = 0x80 if (q < 0 or (q == 0 and np.signbit(q))) else 0
    magnitude = min(abs(q), fmax)
    distance = (table - magnitude).abs()
    best = torch.nonzero(distance == distance.min()).flatten()
    index = int(best[0]) if best.numel() == 1 else next(int(i) for i in best if int(i) % 2 == 0)
    code = int(torch.tensor([float(table[index])]).to(dtype).view(torch.uint8))
    return code | sign


def oracle(block: torch.Tensor, dtype: torch.dtype) -> tuple[list[int], float]:
    """(codes, scale) of one float32 block, from the rule as written."""
    fmax = FP8[dtype]
    finite = [float(x) for x in block if np.isfinite(float(x))]
    amax = max((abs(x) for x in finite), default=0.0)
    scale = float(np.float32(np.float32(amax) / np.float32(fmax)))
    scale = 1.0 if scale == 0.0 else scale
    codes = []
    for x in block.tolist():
        if not np.isfinite(x):
            codes.append(quant.NAN_CODE)
        else:
            codes.append(oracle_code(float(np.float32(np.float32(x) / np.float32(scale))), dtype))
    return codes, scale


def awkward_blocks(dtype: torch.dtype, size: int, generator: torch.Generator) -> torch.Tensor:
    fmax = FP8[dtype]
    table = fp8_table(dtype)
    midpoints = ((table[1:] + table[:-1]) / 2).float()
    blocks = [
        torch.zeros(size),
        torch.full((size,), -0.0),
        torch.cat([torch.tensor([3e38]), torch.randn(size - 1, generator=generator)]),
        torch.rand(size, generator=generator) * 1e-39,  # subnormal only
        torch.cat([torch.tensor([NAN, INF, -INF]), torch.randn(size - 3, generator=generator)]),
        torch.cat([torch.tensor([fmax]), torch.rand(size - 1, generator=generator) * fmax]),  # amax = FMAX: scale 1
        torch.linspace(-fmax, fmax, size) * (1 + 2**-9),  # values that round to +-FMAX
        torch.cat(
            [torch.tensor([fmax]), midpoints[torch.randint(0, midpoints.numel(), (size - 1,), generator=generator)]]
        ),
        torch.tensor([NAN] * size),
        torch.randn(size, generator=generator) * 1e-30,
    ]
    return torch.stack(blocks).float()


@pytest.mark.parametrize("dtype", list(FP8))
def test_quantise_follows_the_rule(dtype: torch.dtype, generator: torch.Generator) -> None:
    size = 16
    blocks = torch.cat([awkward_blocks(dtype, size, generator), torch.randn(6, size, generator=generator) * 3])
    codes, scales = quant.quantise(blocks, size, dtype)
    for row in range(blocks.shape[0]):
        want_codes, want_scale = oracle(blocks[row], dtype)
        assert codes[row].view(torch.uint8).tolist() == want_codes, row
        assert float(scales[row, 0]) == want_scale, row


@pytest.mark.parametrize("dtype", list(FP8))
def test_quantise_corners(dtype: torch.dtype, generator: torch.Generator) -> None:
    fmax = FP8[dtype]
    size = 16
    blocks = awkward_blocks(dtype, size, generator)
    codes, scales = quant.quantise(blocks, size, dtype)
    raw = codes.view(torch.uint8)
    assert torch.equal(scales[0:2], torch.ones(2, 1)) and bool((raw[0] == 0).all()), "an all-zero block: scale 1, zeros"
    assert bool((raw[1] == 0x80).all()), "-0.0 stays -0.0"
    assert raw[4, :3].tolist() == [quant.NAN_CODE] * 3, "non-finite elements are the NaN code"
    finite_max = blocks[4, 3:].abs().max()
    assert float(scales[4, 0]) == float(np.float32(finite_max) / np.float32(fmax)), "the scale of the finite ones"
    assert float(scales[5, 0]) == 1.0 and float(codes[5, 0].float()) == fmax, "amax = FMAX: scale 1, code FMAX"
    assert float(codes[6].float().abs().max()) == fmax, "values past FMAX saturate"
    assert bool((raw[8] == quant.NAN_CODE).all()) and float(scales[8, 0]) == 1.0, "an all-NaN block: scale 1"
    back = quant.dequantise(codes, scales)
    assert bool(back[4, :3].isnan().all()), "non-finite input is carried to the output as NaN"
    assert bool(back[3].isfinite().all()) and float(back[3].abs().max()) <= 1e-39


class _Divisions(TorchDispatchMode):
    """Records the divisor of every aten division run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.divisors: list[object] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func.overloadpacket in (torch.ops.aten.div, torch.ops.aten.div_):
            self.divisors.append(args[1])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", list(FP8))
def test_quantise_never_divides_by_a_scalar(dtype: torch.dtype, generator: torch.Generator) -> None:
    """CUDA torch turns `tensor / scalar` (a number or a 0-dim CPU tensor) into a multiply by the reciprocal, up
    to one bit off the IEEE quotient the kernels compute; the tuner's gate runs this reference on the GPU, so
    every division here must be tensor by tensor (the H200 gate failures of 2026-12-01)."""
    blocks = awkward_blocks(dtype, 16, generator)
    with _Divisions() as divisions:
        quant.quantise(blocks, 16, dtype)
    assert len(divisions.divisors) == 2, "the scale and the quotient"
    for divisor in divisions.divisors:
        assert isinstance(divisor, torch.Tensor) and divisor.dim() > 0, f"a scalar divisor: {divisor!r}"


def test_dequantise_is_exact() -> None:
    for dtype in FP8:
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).reshape(16, 16)
        scales = torch.rand(16, 1) + 0.5
        want = codes.double() * scales.double()
        got = quant.dequantise(codes, scales)
        same = (got.double() == want.float().double()) | (got.isnan() & want.isnan())
        assert bool(same.all())


# ---------------------------------------------------------------------------------------------------------------
# The software codec of the generated kernels (the interpreter's own float8 casts are wrong)
# ---------------------------------------------------------------------------------------------------------------
@triton.jit
def _codec_kernel(x_ptr, codes_ptr, values_ptr, n, ENCODE: tl.constexpr, DECODE: tl.constexpr, BLOCK: tl.constexpr):
    index = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = index < n
    x = tl.load(x_ptr + index, mask=mask, other=0.0)
    codes = ENCODE(x)
    tl.store(codes_ptr + index, codes.to(tl.uint8), mask=mask)
    values = DECODE(codes.to(tl.uint8), True)
    tl.store(values_ptr + index, values, mask=mask)


def codec_inputs(dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    table = fp8_table(dtype).float()
    midpoints = (table[1:] + table[:-1]) / 2
    base = torch.cat([table, midpoints, -table, -midpoints, torch.tensor([FP8[dtype] * 1.01, 3e38, -3e38, 1e-42])])
    near = torch.cat([(base.view(torch.int32) + k).view(torch.float32) for k in range(-3, 4)])
    spread = torch.randn(20000, generator=generator) * torch.exp2(torch.randint(-30, 20, (20000,), generator=generator))
    every = torch.cat([near, spread])
    return every[every.isfinite()]  # (the kernels give non-finite elements the NaN code before encoding)


@requires_interpreter
@pytest.mark.parametrize("e5m2", [False, True])
def test_the_interpreters_codec_matches_torch(
    e5m2: bool, generator: torch.Generator, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if e5m2:
        spec = make_spec(
            name="codec_e5m2",
            transport="all_to_all_single",
            payload={"axes": ["peer", "batch", "head", "dim"], "dtype": "float8_e5m2"},
            stats={"placement": "row_tail"},
        )
        module = render_module(spec, tmp_path_factory.mktemp("codec"))
        dtype = torch.float8_e5m2
    else:
        module, dtype = generated_module("pynccl_a2a_fp8"), torch.float8_e4m3fn
    x = codec_inputs(dtype, generator)
    codes = torch.empty(x.numel(), dtype=torch.uint8)
    values = torch.empty(x.numel())
    grid = (triton.cdiv(x.numel(), 1024),)
    _codec_kernel[grid](x, codes, values, x.numel(), ENCODE=module._fp8_codes, DECODE=module._fp8_values, BLOCK=1024)
    limit = FP8[dtype]
    want = x.clamp(-limit, limit).to(dtype).view(torch.uint8)
    assert torch.equal(codes, want)
    decoded = want.view(dtype).float()
    assert bool(((values == decoded) | (values.isnan() & decoded.isnan())).all())
    # every code decodes as torch decodes it (the special codes included)
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    out = torch.empty(256)
    _decode_kernel[(1,)](every, out, DECODE=module._fp8_values)
    want_all = every.view(dtype).float()
    assert bool(((out == want_all) | (out.isnan() & want_all.isnan())).all())


@triton.jit
def _decode_kernel(codes_ptr, values_ptr, DECODE: tl.constexpr):
    index = tl.arange(0, 256)
    codes = tl.load(codes_ptr + index)
    tl.store(values_ptr + index, DECODE(codes, True))


# ---------------------------------------------------------------------------------------------------------------
# The GPU pack's division, emulated with exact fused multiply-adds
# ---------------------------------------------------------------------------------------------------------------
F32, F64 = np.float32, np.float64


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Correctly rounded float32 fma: the exact product in float64, the sum's rounding error by TwoSum, and the
    one double-rounding case (a float64 sum exactly on a float32 midpoint) settled by the error's sign."""
    a, b, c = (np.asarray(v, F32) for v in (a, b, c))
    product, addend = a.astype(F64) * b.astype(F64), c.astype(F64)
    total = product + addend
    virtual = total - product
    error = (product - (total - virtual)) + (addend - virtual)
    rounded = total.astype(F32)
    below, above = np.nextafter(rounded, F32(-np.inf)), np.nextafter(rounded, F32(np.inf))
    up_mid = (rounded.astype(F64) + above.astype(F64)) / 2
    down_mid = (rounded.astype(F64) + below.astype(F64)) / 2
    tie = ((total == up_mid) | (total == down_mid)) & (error != 0) & np.isfinite(total)
    settled = np.where(total == up_mid, np.where(error > 0, above, rounded), np.where(error > 0, rounded, below))
    return np.where(tie, settled, rounded)


def markstein_quotient(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The GPU pack's `x / s` (see `_fp8_quantise` in pack_fp8.py.jinja), step by step."""
    with np.errstate(all="ignore"):
        inverse = (F32(1) / s).astype(F32)  # div_rn(1, s)
        below = fma32(-s, inverse, np.ones_like(s)) < 0
        inverse_down = np.where(below, (inverse.view(np.int32) - 1).view(F32), inverse)
        inverse_low = (fma32(-s, inverse_down, np.ones_like(s)) * inverse_down).astype(F32)
        first = fma32(x, inverse_down, (x * inverse_low).astype(F32))
        return fma32(-inverse, fma32(s, first, -x), first)


@pytest.mark.parametrize("kind", ["uniform", "midpoints", "binade_tops", "tiny_and_zeros"])
def test_the_gpu_division_is_ieee_where_it_is_used(kind: str) -> None:
    rng = np.random.default_rng(22)
    n = 400_000
    amax = (rng.random(n) * 2.0 ** rng.integers(-60, 100, n)).astype(F32)
    amax = np.clip(amax, F32(2.0**-60), F32(2.0**100)).astype(F32)  # the fast path's range
    s = (amax / F32(448)).astype(F32)
    if kind == "uniform":
        x = (amax * (rng.random(n) * 2 - 1)).astype(F32)
    elif kind == "midpoints":
        table = fp8_table(torch.float8_e4m3fn).numpy()
        targets = np.concatenate([table, (table[1:] + table[:-1]) / 2])
        x = (rng.choice(targets, n) * s.astype(F64)).astype(F32)
        x = (x.view(np.int32) + rng.integers(-3, 4, n).astype(np.int32)).view(F32)
        x = np.clip(x, -amax, amax)
    elif kind == "binade_tops":
        mantissa = (0x7FFFFF - rng.integers(0, 64, n)).astype(np.int32)
        exponent = rng.integers(-40, 9, n).astype(np.int32)
        target = ((exponent + 127) << 23 | mantissa).view(F32) * np.where(rng.random(n) < 0.5, -1, 1).astype(F32)
        x = np.clip((target.astype(F64) * s.astype(F64)).astype(F32), -amax, amax)
    else:
        x = (amax * rng.random(n) * 2.0 ** -rng.integers(0, 140, n)).astype(F32)
        x = x * np.where(rng.random(n) < 0.5, -1, 1).astype(F32)
        x[::7], x[::11] = 0.0, -0.0
    got = markstein_quotient(x, s)
    want = (x / s).astype(F32)
    differ = got.view(np.int32) != want.view(np.int32)
    assert not (differ & (np.abs(want) >= 2.0**-31)).any()
    for dtype, fmax in FP8.items():
        a = torch.from_numpy(got).clamp(-fmax, fmax).to(dtype).view(torch.uint8)
        b = torch.from_numpy(want).clamp(-fmax, fmax).to(dtype).view(torch.uint8)
        assert torch.equal(a, b), dtype
