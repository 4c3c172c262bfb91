"""GPU probe: what rows with bytes left unwritten (a row tail's padding) cost a plain copy.

A row-tail DCP layout rounds every row up to `align_bytes`, and the bytes past the stats words belong to no
one: pack never writes them (DESIGN §3).  Where a row's length is not a multiple of 32 bytes, or its padding
is, every row leaves part of an L2 sector unwritten.  This copies `--rows` rows of W bytes from a dense
source into rows of S >= W bytes (W bytes written per row, the rest left as it was), with one 16-byte
vector per access where W and S allow, under the tuner's rotation, as CUDA-graph replay medians, and
reports each (W, S) against the dense copy of the same written bytes.  `rmw` rows also load the padding
and store it back (the same bytes, so the sector is whole): what a kernel that owned the padding would pay.

Results: `<out>/probe_row_padding_<device>.json` and `.md`.

Usage (GPU): python benchmarks/probe_row_padding.py --out DIR [--rows 131072]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_dcp_v2 import environment

from layoutgen.tuning.timing import CudaGraphTimer, device_l2_bytes, rotating_sets

#: (bytes written per row, row stride in bytes): the bundled and drawn row-tail layouts' rows at D 512.
CASES = (
    (1024, 1024),  # dense bf16 rows, no stats: the reference
    (1028, 1028),  # pynccl_a2a: bf16 + LSE, align 4, nothing unwritten
    (1028, 1056),  # pynccl_a2a_aligned: align 32, 28 bytes unwritten
    (1032, 1040),  # bench_unseen_specs spec 4: bf16 + (max, sum), align 16, 8 bytes unwritten
    (1040, 1040),  # the same rows whole
    (2052, 2064),  # spec 6: float32 + LSE, align 16, 12 bytes unwritten
    (2064, 2064),  # the same rows whole
    (2048, 2048),  # dense float32 rows
)


@triton.jit
def _row_copy_kernel(
    source_ptr,
    destination_ptr,
    rows,
    WORDS: tl.constexpr,
    STRIDE_WORDS: tl.constexpr,
    FILL_PADDING: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_WORDS: tl.constexpr,
):
    row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[:, None]
    word = tl.arange(0, BLOCK_WORDS)[None, :]
    live = row < rows
    values = tl.load(source_ptr + row * WORDS + word, mask=live & (word < WORDS))
    destination = destination_ptr + row * STRIDE_WORDS + word
    if FILL_PADDING:
        padding = (word >= WORDS) & (word < STRIDE_WORDS)
        old = tl.load(destination, mask=live & padding)
        tl.store(destination, tl.where(padding, old, values), mask=live & (word < STRIDE_WORDS))
    else:
        tl.store(destination, values, mask=live & (word < WORDS))


def time_case(timer: CudaGraphTimer, rows: int, written: int, stride: int, fill: bool, l2: int) -> dict[str, Any]:
    words, stride_words = written // 4, stride // 4
    bytes_per_call = rows * (written + stride)
    sets = rotating_sets(bytes_per_call, l2)
    sources = [torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, device="cuda") for _ in range(sets)]
    destinations = [torch.zeros(rows, stride_words, dtype=torch.int32, device="cuda") for _ in range(sets)]
    block_words = triton.next_power_of_2(stride_words)
    block_rows = max(1, 4096 // block_words)
    grid = (triton.cdiv(rows, block_rows),)

    def launch(index: int) -> None:
        _row_copy_kernel[grid](
            sources[index],
            destinations[index],
            rows,
            words,
            stride_words,
            fill,
            block_rows,
            block_words,
            num_warps=8,
        )

    launch(0)
    if not torch.equal(destinations[0][:, :words], sources[0]):
        raise RuntimeError(f"row copy {written}/{stride} bytes wrote wrong values")
    timing = timer.time(launch, sets, estimated_us=bytes_per_call / 4e6)
    moved = rows * 2 * written
    return {
        "written": written,
        "stride": stride,
        "fill_padding": fill,
        "us": timing.median_us,
        "tbps_written": moved / timing.median_us / 1e6,
    }


def markdown(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [
        f"# Rows with unwritten bytes, a plain copy on {env.get('device')}",
        "",
        f"{results['date']}; torch {env.get('torch')}, triton {env.get('triton')}; {results['rows']} rows, "
        "int32 words, 8 warps, ~4096 words per program, CUDA-graph replay medians, rotated inputs. TB/s counts "
        "the written bytes twice (read + write), as the copy ceiling does.",
        "",
        "| bytes written / row stride | unwritten per row | padding | µs | TB/s |",
        "|---|---|---|---|---|",
    ]
    for row in results["cases"]:
        padding = "loaded and stored back" if row["fill_padding"] else "left"
        lines.append(
            f"| {row['written']} / {row['stride']} | {row['stride'] - row['written']} | {padding} | "
            f"{row['us']:.2f} | {row['tbps_written']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=131072)
    args = parser.parse_args()
    timer = CudaGraphTimer()
    l2 = device_l2_bytes(0)
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(),
        "rows": args.rows,
        "cases": [],
    }
    for written, stride in CASES:
        for fill in (False, True) if stride > written else (False,):
            results["cases"].append(time_case(timer, args.rows, written, stride, fill, l2))
            torch.cuda.empty_cache()
    stem = f"probe_row_padding_{torch.cuda.get_device_name().replace(' ', '_')}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    (args.out / f"{stem}.md").write_text(markdown(results), encoding="utf-8")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
