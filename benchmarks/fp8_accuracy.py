"""Accuracy of the fp8 DCP wire (issue 22): the merged output against the float64 merge of the unquantised
partials, side by side with the bf16 wire.  CPU, float math, no GPU and no Triton: the wire is emulated
with `layoutgen.dcp.quant`, the quantisation every fp8 pack kernel is byte-exact against.

Method.  Each (request, head) row attends over a context of S tokens split evenly over N ranks (KV shards).
Its value rows are random: V[t, d] = N(0, 1) * c_d, with per-channel scales c_d = exp(N(0, 0.5^2)) and 1 % of
the channels outliers (c_d x 20), as activations in LLMs have; the attention logits are N(0, sigma^2) with
sigma drawn per row from {0.5, 1, 2, 4} (flat to peaked softmax).  Rank i's partial is the softmax-weighted
mean of its shard's value rows (normalised over the shard, as attention kernels leave it) and its LSE, all in
float64.  The exact result is the float64 LSE merge of the N partials; a wire's result is the same float64
merge of the partials as the wire carries them: cast to bfloat16, or quantised per block of `scale_block`
elements and dequantised (code x scale; float32 LSE words on every wire).  Reported per configuration, over
all rows: the largest and the RMS relative error of a row (max |err| / max |exact| and ||err|| / ||exact||,
then the max, the mean and the 99th percentile over rows), the smallest and mean cosine similarity, and the
worst element error relative to the merge of |partials| -- the quantity the worst-case bound speaks of (2^-4
for e4m3fn, 2^-3 for e5m2, plus a subnormal floor).  The combine kernels add only their float32 accumulation
and the output dtype's rounding (bf16: 2^-8 relative) on top, the same for every wire.

Usage: python benchmarks/fp8_accuracy.py [--out benchmarks/results] [--rows 256] [--context 4096]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from layoutgen.dcp import quant  # noqa: E402

WIRES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")
FP8 = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
#: The worst relative rounding of a normal code, per fp8 wire.
WORST = {"float8_e4m3fn": 2.0**-4, "float8_e5m2": 2.0**-3, "bfloat16": 2.0**-8}
SIGMAS = (0.5, 1.0, 2.0, 4.0)


def partials(N: int, D: int, rows: int, context: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 partial outputs [N, rows, D] (each normalised over its rank's shard) and their LSEs [N, rows]."""
    shard = context // N
    channel = torch.exp(torch.randn(D, generator=generator, dtype=torch.float64) * 0.5)
    outliers = torch.rand(D, generator=generator) < 0.01
    channel = torch.where(outliers, channel * 20, channel)
    sigma = torch.tensor(SIGMAS, dtype=torch.float64)[torch.randint(0, len(SIGMAS), (rows,), generator=generator)]
    outs = torch.empty(N, rows, D, dtype=torch.float64)
    lses = torch.empty(N, rows, dtype=torch.float64)
    for start in range(0, rows, 16):  # 16 rows at a time: [16, S, D] values stay small
        stop = min(rows, start + 16)
        count = stop - start
        values = torch.randn(count, context, D, generator=generator, dtype=torch.float64) * channel
        logits = torch.randn(count, context, generator=generator, dtype=torch.float64) * sigma[start:stop, None]
        for rank in range(N):
            piece = slice(rank * shard, (rank + 1) * shard)
            weights = torch.softmax(logits[:, piece], dim=-1)
            outs[rank, start:stop] = torch.einsum("rs,rsd->rd", weights, values[:, piece])
            lses[rank, start:stop] = torch.logsumexp(logits[:, piece], dim=-1)
    return outs, lses


def on_the_wire(outs: torch.Tensor, wire: str, scale_block: int) -> torch.Tensor:
    """float64 partials as the combine reads them back from `wire`."""
    if wire == "bfloat16":
        return outs.to(torch.bfloat16).double()
    codes, scales = quant.quantise(outs.float(), scale_block, FP8[wire])
    return quant.dequantise(codes, scales).double()


def merge(outs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    """The float64 LSE merge of N partials [N, rows, D]."""
    weights = torch.softmax(lses, dim=0)
    return (weights[..., None] * outs).sum(dim=0)


def measure(N: int, D: int, wire: str, scale_block: int | None, rows: int, context: int, seed: int) -> dict[str, Any]:
    """The error statistics of one configuration (see the module docstring)."""
    generator = torch.Generator().manual_seed(seed)
    outs, lses = partials(N, D, rows, context, generator)
    lses = lses.float().double()  # the LSE travels as float32 on every wire
    exact = merge(outs, lses)
    got = merge(on_the_wire(outs, wire, scale_block or D), lses)
    error = got - exact
    row_max = error.abs().amax(-1) / exact.abs().amax(-1)
    row_rms = error.norm(dim=-1) / exact.norm(dim=-1)
    cosine = torch.nn.functional.cosine_similarity(got, exact, dim=-1)
    weighted = merge(outs.abs(), lses)
    bound_ratio = float((error.abs() / weighted).max())
    return {
        "N": N,
        "D": D,
        "wire": wire,
        "scale_block": scale_block if wire != "bfloat16" else None,
        "rows": rows,
        "context": context,
        "max_rel_error": float(row_max.max()),
        "max_rel_error_mean": float(row_max.mean()),
        "rms_rel_error_max": float(row_rms.max()),
        "rms_rel_error_mean": float(row_rms.mean()),
        "rms_rel_error_p99": float(row_rms.quantile(0.99)),
        "cosine_min": float(cosine.min()),
        "cosine_mean": float(cosine.mean()),
        "error_over_weighted_magnitude_max": bound_ratio,
        "worst_case_bound": WORST[wire],
        "wire_bytes_per_row": wire_bytes(wire, D, scale_block or D),
    }


def wire_bytes(wire: str, D: int, scale_block: int) -> int:
    """Payload bytes of one partial row on the wire (the stats word aside)."""
    return 2 * D if wire == "bfloat16" else D + 4 * (D // scale_block)


def configurations(peers: tuple[int, ...], dims: tuple[int, ...]) -> list[tuple[int, int, str, int | None]]:
    found = []
    for D in dims:
        for N in peers:
            found.append((N, D, "bfloat16", None))
            for wire in ("float8_e4m3fn", "float8_e5m2"):
                for block in dict.fromkeys((D, 128, 32)):
                    if block <= D:
                        found.append((N, D, wire, block))
    return found


def run(
    peers: tuple[int, ...] = (2, 4, 8), dims: tuple[int, ...] = (128, 512), rows: int = 256, context: int = 4096
) -> list[dict[str, Any]]:
    results = []
    for index, (N, D, wire, block) in enumerate(configurations(peers, dims)):
        seed = 1000 * N + D  # every wire of one (N, D) sees the same partials
        results.append(measure(N, D, wire, block, rows, context, seed))
        del index
    return results


def markdown(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# fp8 DCP wire: accuracy of the merged output",
        "",
        f"Measured {meta['date']} with `benchmarks/fp8_accuracy.py` (torch {meta['torch']}, Python {meta['python']}, "
        f"CPU, float64 reference); {meta['rows']} (request, head) rows per configuration, a context of "
        f"{meta['context']} tokens split over the N ranks.",
        "",
        "Method: see the script's docstring. Errors are of the float64 merge of the partials as each wire carries "
        "them, against the float64 merge of the unquantised partials; the combine kernels add only float32 "
        "accumulation and the output dtype's rounding (bf16: 2^-8 relative) on top, alike for every wire.",
        "",
        "| N | D | wire | scale_block | bytes/row | max rel err (row, max / mean) | RMS rel err (mean / p99 / max) "
        "| cosine (min / mean) | err / merged abs (max; bound) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['N']} | {r['D']} | {r['wire']} | {r['scale_block'] or '-'} | {r['wire_bytes_per_row']} | "
            f"{r['max_rel_error']:.4f} / {r['max_rel_error_mean']:.4f} | "
            f"{r['rms_rel_error_mean']:.4f} / {r['rms_rel_error_p99']:.4f} / {r['rms_rel_error_max']:.4f} | "
            f"{r['cosine_min']:.6f} / {r['cosine_mean']:.6f} | "
            f"{r['error_over_weighted_magnitude_max']:.4f}; {r['worst_case_bound']:.4f} |"
        )
    lines += ["", *summary(results), ""]
    return "\n".join(lines)


def summary(results: list[dict[str, Any]]) -> list[str]:
    """The statements the docs make, computed from the table: per wire and scale block (one per row, 128, 32)."""
    lines = [
        "## Summary",
        "",
        "Worst over N and D of each statistic (mean: the worst configuration's mean over rows):",
        "",
    ]
    for wire in WIRES:
        for block in (None,) if wire == "bfloat16" else ("row", 128, 32):
            chosen = [
                r
                for r in results
                if r["wire"] == wire
                and (
                    block is None
                    or (r["scale_block"] == r["D"] if block == "row" else r["scale_block"] == block and r["D"] != block)
                )
            ]
            if not chosen:
                continue
            label = wire if block is None else f"{wire}, scale_block {'D (one per row)' if block == 'row' else block}"
            lines.append(
                f"* {label}: RMS relative error of a row <= {max(r['rms_rel_error_max'] for r in chosen):.4f} "
                f"(mean <= {max(r['rms_rel_error_mean'] for r in chosen):.4f}), max relative error <= "
                f"{max(r['max_rel_error'] for r in chosen):.4f}, cosine >= {min(r['cosine_min'] for r in chosen):.6f}; "
                f"worst element error / merged |partials| "
                f"{max(r['error_over_weighted_magnitude_max'] for r in chosen):.4f} (guaranteed <= {WORST[wire]:.4f})."
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--context", type=int, default=4096)
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    results = run(rows=args.rows, context=args.context)
    meta = {
        "date": started.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "rows": args.rows,
        "context": args.context,
        "value_model": "V = N(0,1) x lognormal(0, 0.5) per channel, 1% outlier channels x20; logits N(0, sigma^2), "
        f"sigma in {list(SIGMAS)}",
        "seconds": round((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(), 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fp8_accuracy.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    (args.out / "fp8_accuracy.md").write_text(markdown(results, meta))
    print("\n".join(summary(results)))
    print(f"wrote {args.out / 'fp8_accuracy.md'} and .json ({meta['seconds']} s)")
    return 0 if all(math.isfinite(r["rms_rel_error_max"]) for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
