"""The written tolerance policy (one table for tests, `build` verification and the tuner's gate).

Pack is pure data movement: bytes must be identical (compare `uint8` views).
Combine is judged against the float64 reference by the output dtype's rounding
only: |got - ref| <= rtol * |ref| + atol * scale, where scale is the largest
|partial| that took part.  For bf16 and fp16 rtol is one unit in the last place
of the output dtype: GPUs round to nearest (half an ulp), the Triton interpreter
truncates to bfloat16 (up to one ulp, measured 1.9x half an ulp).  A float32
output's own rounding (2^-24) is below what its float32 exponentials, weights
and sums carry, so float32 gets 2^-20 (8 units in the last place).  atol
covers float32 accumulation near 0.
"""

from __future__ import annotations

import torch

COMBINE_RTOL: dict[torch.dtype, float] = {
    torch.bfloat16: 2.0**-7,
    torch.float16: 2.0**-10,
    torch.float32: 2.0**-20,
}
COMBINE_ATOL_SCALED = 1e-5
LSE_RTOL = 2.0**-20
LSE_ATOL = 1e-5


def combine_error(got: torch.Tensor, ref: torch.Tensor, scale: float) -> float:
    """Largest violation ratio (<= 1 passes) of `got` against the float64 `ref`; inf on NaN/inf mismatch."""
    rtol = COMBINE_RTOL[got.dtype]
    return _ratio(got.to(torch.float64), ref, rtol, COMBINE_ATOL_SCALED * max(scale, 1e-30))


def lse_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return _ratio(got.to(torch.float64), ref, LSE_RTOL, LSE_ATOL)


def _ratio(got: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> float:
    if got.shape != ref.shape:
        return float("inf")
    if got.numel() == 0:
        return 0.0
    same_special = (got == ref) | (torch.isnan(got) & torch.isnan(ref))
    finite = torch.isfinite(ref) & torch.isfinite(got)
    if not bool((same_special | finite).all()):
        return float("inf")
    # Matching specials (NaN with NaN, inf with inf) pass with ratio 0; a NaN allowance would make the max NaN,
    # and `ratio > 1` is False for NaN, hiding a real violation elsewhere in the tensor.
    allowed = torch.where(finite, rtol * ref.abs() + atol, 1.0)
    diff = torch.where(finite, (got - ref).abs(), 0.0)
    return float((diff / allowed).max())


def max_abs_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    finite = torch.isfinite(ref)
    if got.numel() == 0:
        return 0.0
    return float(torch.where(finite, (got.to(torch.float64) - ref).abs(), 0.0).max())
