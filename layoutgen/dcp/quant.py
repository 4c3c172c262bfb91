"""The fp8 wire quantisation, in torch: what an fp8 spec's pack stores and its combine reads back.

The rule (the project brief's DESIGN.md §8.3, binding; docs/design.md §4.3), per block of `scale_block`
consecutive elements of one row (b, h), on the float32 value x of each element:

* `amax = max |x|` over the block's finite elements (float32; every element of an all-finite block);
* `scale = amax / FMAX` (IEEE float32 division; FMAX 448 for float8_e4m3fn, 57344 for float8_e5m2), and
  `scale = 1` where that is 0 (amax 0, or so small that the quotient underflows to 0);
* `q = x / scale` (IEEE float32 division), clamped to [-FMAX, FMAX], then rounded to the nearest fp8 value
  (ties to even): clamping first makes every torch version and Triton's `cvt.rn.satfinite` agree bit for
  bit (torch 2.11 turns e4m3fn overflow into NaN, 2.13 saturates; torch's e5m2 overflows to inf);
* a non-finite element (NaN, +inf or -inf) is stored as the fp8 code 0x7F (NaN in both formats) and
  dequantises to NaN: it is carried to the merged output, not hidden (unless its partial takes no part:
  empty, or a float32 share of 0, see `reference._float32_share`), and does not change its block's scale;
* so a block whose largest magnitude is 0 (e.g. the rows of empty requests, written as +0.0) gets scale 1
  and zero codes, and -0.0 stays -0.0 (code 0x80).

Dequantisation is `q * scale` in float32 (exact for every code while the scale is a normal float32, i.e.
amax above about FMAX * 2^-126: 5e-36 for e4m3fn; 0x7F is NaN).  Below that, reachable only from float32
inputs, the scale is subnormal and keeps few bits, so the largest element's quotient can pass FMAX and be
clamped: its error can reach 1/8 of its magnitude, beyond the 2^-4 bound of docs/design.md §4.3.
"""

from __future__ import annotations

import torch

from layoutgen.dcp.spec import FP8_MAX, PayloadDtype

#: The fp8 code every non-finite input element is stored as: NaN in float8_e4m3fn and in float8_e5m2.
NAN_CODE = 0x7F
INF = float("inf")


def fp8_max(dtype: torch.dtype) -> float:
    """The largest finite value of an fp8 torch dtype."""
    names = {torch.float8_e4m3fn: PayloadDtype.FLOAT8_E4M3FN, torch.float8_e5m2: PayloadDtype.FLOAT8_E5M2}
    if dtype not in names:
        raise TypeError(f"not an fp8 wire dtype: {dtype} (float8_e4m3fn or float8_e5m2)")
    return FP8_MAX[names[dtype]]


def block_scales(x: torch.Tensor, scale_block: int, dtype: torch.dtype) -> torch.Tensor:
    """float32 scales `[..., D / scale_block]` of float32 values `x [..., D]` (see the module docstring)."""
    if x.dtype != torch.float32:
        raise TypeError(f"quantise float32 values, got {x.dtype}")
    if scale_block < 1 or x.shape[-1] % scale_block:
        raise ValueError(f"scale_block must be a positive divisor of D={x.shape[-1]}, got {scale_block}")
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // scale_block, scale_block)
    magnitude = blocks.abs()
    amax = torch.where(magnitude < INF, magnitude, 0.0).amax(dim=-1)
    # A divisor of the dividend's shape and device, never a scalar: CUDA torch computes `a / scalar` as
    # a * (1 / scalar), up to one bit off the IEEE quotient.  On the H200 that made this reference, run on the
    # GPU by the tuner's gate, disagree with the kernels' IEEE scales (and so codes) in 0.2% of the bytes.
    scale = amax / torch.full_like(amax, fp8_max(dtype))
    return torch.where(scale == 0, 1.0, scale)


def quantise(x: torch.Tensor, scale_block: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes `[..., D]` as `dtype`, scales `[..., D / scale_block]` float32) of float32 values `x [..., D]`."""
    scales = block_scales(x, scale_block, dtype)
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // scale_block, scale_block)
    limit = fp8_max(dtype)
    quotient = (blocks / scales[..., None]).clamp(-limit, limit)
    codes = quotient.to(dtype).view(torch.uint8)
    codes = torch.where(blocks.abs() < INF, codes, torch.tensor(NAN_CODE, dtype=torch.uint8))
    return codes.reshape(x.shape).view(dtype), scales


def dequantise(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 `q * scale` of fp8 codes `[..., D]` and their float32 scales `[..., D / scale_block]`."""
    blocks = scales.shape[-1]
    if tuple(scales.shape[:-1]) != tuple(codes.shape[:-1]):
        raise ValueError(f"scales {tuple(scales.shape)} must have the leading shape of codes {tuple(codes.shape)}")
    if blocks < 1 or codes.shape[-1] % blocks:
        raise ValueError(f"{codes.shape[-1]} codes per row must split into the {blocks} blocks of the scales")
    values = codes.to(torch.float32)
    values = values.reshape(*codes.shape[:-1], blocks, codes.shape[-1] // blocks) * scales.to(torch.float32)[..., None]
    return values.reshape(codes.shape)
