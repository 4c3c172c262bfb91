"""The fp8 accuracy harness (`benchmarks/fp8_accuracy.py`) as a test: small sizes, loose bounds that can fail.

The bounds are the documented ones, loosened for the small sample (benchmarks/results/fp8_accuracy.md holds
the full measurement): the merged output of an fp8 wire stays within the worst-case bound of the merge of
|partials| (2^-4 e4m3fn, 2^-3 e5m2: a property of the rounding, so it must hold for any sample), its RMS error
is a few percent of the row, its cosine above 0.99; 32-element blocks beat one scale per row; e4m3fn beats
e5m2; the bf16 wire is an order of magnitude more accurate.  A wire that loses its scales, or rounds to one
bit less, fails them (the harness can fail).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import fp8_accuracy

ROWS, CONTEXT = 24, 512


def measure(N: int, D: int, wire: str, block: int | None) -> dict[str, Any]:
    return fp8_accuracy.measure(N, D, wire, block, ROWS, CONTEXT, seed=1000 * N + D)


def check_wire(result: dict[str, Any]) -> None:
    """The documented bounds, loosened for a small sample."""
    wire = result["wire"]
    assert result["error_over_weighted_magnitude_max"] <= result["worst_case_bound"] * 1.01, result
    limits = {"bfloat16": (0.005, 0.9999), "float8_e4m3fn": (0.04, 0.997), "float8_e5m2": (0.08, 0.99)}
    rms, cosine = limits[wire]
    assert result["rms_rel_error_max"] <= rms, result
    assert result["cosine_min"] >= cosine, result


@pytest.mark.parametrize("N", [2, 4])
@pytest.mark.parametrize("D", [128])
def test_the_wires_are_within_their_bounds(N: int, D: int) -> None:
    found = {(wire, block): measure(N, D, wire, block) for wire, block in
             [("bfloat16", None), ("float8_e4m3fn", D), ("float8_e4m3fn", 32), ("float8_e5m2", D)]}  # fmt: skip
    for result in found.values():
        check_wire(result)
    e4m3_row, e4m3_32 = found[("float8_e4m3fn", D)], found[("float8_e4m3fn", 32)]
    assert e4m3_32["rms_rel_error_mean"] < e4m3_row["rms_rel_error_mean"], "32-element blocks are more accurate"
    assert e4m3_row["rms_rel_error_mean"] < found[("float8_e5m2", D)]["rms_rel_error_mean"], "e4m3fn beats e5m2"
    assert found[("bfloat16", None)]["rms_rel_error_mean"] * 5 < e4m3_32["rms_rel_error_mean"]
    assert e4m3_row["wire_bytes_per_row"] == D + 4 and e4m3_32["wire_bytes_per_row"] == D + 4 * D // 32


def test_the_harness_fails_a_wire_that_loses_its_scales(monkeypatch: pytest.MonkeyPatch) -> None:
    from layoutgen.dcp import quant

    monkeypatch.setattr(quant, "dequantise", lambda codes, scales: codes.to(torch.float32))
    with pytest.raises(AssertionError):
        check_wire(measure(2, 128, "float8_e4m3fn", 32))


def test_the_harness_fails_a_wire_one_bit_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """e5m2 codes read as if they were e4m3fn's accuracy: the e4m3fn bounds must reject them."""
    original = fp8_accuracy.on_the_wire
    monkeypatch.setattr(fp8_accuracy, "on_the_wire", lambda outs, wire, block: original(outs, "float8_e5m2", block))
    with pytest.raises(AssertionError):
        check_wire(measure(2, 128, "float8_e4m3fn", 128))


def test_the_report_states_the_table_and_the_summary(tmp_path: Path) -> None:
    results = [measure(2, 128, wire, block) for wire, block in [("bfloat16", None), ("float8_e4m3fn", 128), ("float8_e4m3fn", 32), ("float8_e5m2", 128), ("float8_e5m2", 32)]]  # fmt: skip
    meta = {"date": "today", "torch": torch.__version__, "python": "3", "rows": ROWS, "context": CONTEXT}
    text = fp8_accuracy.markdown(results, meta)
    assert text.count("\n| 2 | 128 |") == len(results)
    assert (
        "float8_e4m3fn, scale_block D (one per row): RMS relative error of a row <=" in text
        and "(guaranteed <= 0.0625)" in text
    )
