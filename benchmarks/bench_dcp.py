"""GPU benchmark: layoutgen pack / combine against sglang's kernels, the copy paths and the copy ceiling.

One process measures everything side by side, so every ratio is taken under the
same clocks:

* ceiling: a large device-to-device copy (bytes read + written), the best of torch's
  `copy_` and a Triton copy with 16-byte accesses (torch's reached only 2.7 TB/s on the
  H200 here), and an empty Triton kernel in a CUDA graph;
* ours: every bundled spec, tuned config (from the tuning database of this
  device) and untuned default;
* sglang 0.5.23's `dcp_pack_a2a_send` / `dcp_lse_combine_triton` writing and
  reading the very same buffers (loaded by path, see `baselines.py`);
* the old materialising FlashInfer path (permute/contiguous copies and a zero
  fill on both sides of the exchange) and vLLM's split a2a send side (two
  `permute(...).contiguous()` copies).

Every variant is checked against `layoutgen.reference` before it is timed.
Times are CUDA-graph replay medians (`layoutgen.tuning.timing.CudaGraphTimer`);
inputs rotate over sets by the tuner's rule (`layoutgen.tuning.timing.rotating_sets`:
until they span 2x the L2, at most 8).  From about B = 256 at H = 128 every call
reads DRAM; below, the 8 sets fit in the L2 and the figure is close to the
L2-resident one that `--warm` adds per small point (a single input set: the
case where attention has just written `out`).  Ours and sglang's kernels are also
timed in turn (ours, sglang, ours again, replayed alternately), rotated and, with
`--warm`, L2-resident: the head-to-head beside the spread of ours timed twice.

Usage (GPU): python benchmarks/bench_dcp.py --out benchmarks/results [--db tuning_db]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))

import layoutgen
from layoutgen.dcp import reference
from layoutgen.dcp.config import CombineConfig, PackConfig, default_combine_config, default_pack_config
from layoutgen.dcp.tolerances import combine_error
from layoutgen.tuning.procedure import MAX_ROTATING_SETS
from layoutgen.tuning.timing import CudaGraphTimer, copy_bandwidth_tbps, device_l2_bytes, rotating_sets
from layoutgen.tuning_db import device_file_name, pick_bucket, read_database

SPECS = ("pynccl_a2a", "pynccl_a2a_aligned", "vllm_a2a", "flashinfer_mnnvl")


def grid_points(quick: bool) -> list[tuple[int, int, int, int]]:
    """(N, B, H, D): the issue's main grid plus H = 16 and plain-attention D = 128 rows."""
    batches = (1, 8, 64, 1024) if quick else (1, 8, 64, 256, 1024, 4096)
    points = [(N, B, 128, 512) for N in (2, 4, 8) for B in batches]
    points += [(N, B, 16, 512) for N in (2, 8) for B in (8, 1024)]
    points += [(N, B, 32, 128) for N in (2, 8) for B in (8, 1024)]
    return points


@triton.jit
def _empty_kernel(pointer):
    pass


@triton.jit
def _move_kernel(source_ptr, destination_ptr, count, source_stride, SOURCES: tl.constexpr, BLOCK: tl.constexpr):
    # destination = xor of SOURCES slices of source: the bytes a combine reads and writes without its
    # arithmetic (SOURCES = 1: a copy, the bytes a pack moves).  Every load is issued before the store.
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < count
    value = tl.load(source_ptr + offsets, mask=mask)
    for index in tl.static_range(1, SOURCES):
        value ^= tl.load(source_ptr + index * source_stride + offsets, mask=mask)
    tl.store(destination_ptr + offsets, value, mask=mask)


#: (int32 elements per program, warps) for the data-movement floor: 16 or 32 bytes per thread, and from
#: 1 KiB per program, so a B = 1 problem still spreads over the SMs.
FLOOR_CONFIGS = ((256, 1), (512, 1), (512, 2), (1024, 2), (1024, 4), (2048, 4), (2048, 8), (4096, 8), (8192, 16))


def movement_floor_us(timer: CudaGraphTimer, sources: int, read_bytes_each: int) -> float:
    """The fastest of FLOOR_CONFIGS at moving `sources` x `read_bytes_each` bytes in and `read_bytes_each`
    out (the layout-free part of a pack, sources = 1, or a combine, sources = N), inputs rotated by the
    benchmark's rule: a reference for what moving these bytes costs, launch and memory latency included.
    Not a proof of a bound: a kernel with other tiles can beat it."""
    count = read_bytes_each // 4
    sets = rotating_sets((sources + 1) * read_bytes_each, device_l2_bytes(0))
    inputs = [
        torch.randint(-(2**31), 2**31 - 1, (sources, count), dtype=torch.int32, device="cuda") for _ in range(sets)
    ]
    # As timed above: pack writes each set's own send buffers, combine one output for every set.
    output = torch.empty(count, dtype=torch.int32, device="cuda")
    outputs = [torch.empty_like(output) for _ in range(sets)] if sources == 1 else [output] * sets
    want = inputs[0][0].clone()
    for index in range(1, sources):
        want ^= inputs[0][index]
    best = math.inf
    for block, warps in FLOOR_CONFIGS:

        def run(i: int, block: int = block, warps: int = warps) -> None:
            _move_kernel[(triton.cdiv(count, block),)](
                inputs[i], outputs[i], count, count, SOURCES=sources, BLOCK=block, num_warps=warps
            )

        run(0)
        if not torch.equal(outputs[0], want):
            raise AssertionError(f"the data-movement floor kernel is wrong ({block} x {warps})")
        best = min(
            best, timer.time(run, sets, estimated_us=max(1.0, (sources + 1) * read_bytes_each / 3.5e6)).median_us
        )
    return best


def ceilings(timer: CudaGraphTimer) -> dict[str, float]:
    """Copy ceiling (the tuner's: best of torch `copy_` and a 16-byte Triton copy), torch `copy_`
    alone, and an empty kernel per launch in a CUDA graph."""
    result = {"copy_tbps": copy_bandwidth_tbps(torch.device("cuda"))}
    source = torch.ones(1 << 28, dtype=torch.int32, device="cuda")
    destination = torch.empty_like(source)
    timing = timer.time(lambda _: destination.copy_(source), 1, estimated_us=600)
    result["torch_copy_tbps"] = 2 * source.numel() * 4 / (timing.median_us * 1e-6) / 1e12
    scratch = torch.empty(1, device="cuda")
    result["empty_kernel_us"] = timer.time(lambda _: _empty_kernel[(1,)](scratch), 1, estimated_us=1).median_us
    return result


def tuned_configs(db_dir: Path | None) -> tuple[dict[str, Any], str]:
    """Entries of this device's tuning database (empty when there is none)."""
    name = torch.cuda.get_device_name()
    for directory in [db_dir] if db_dir else []:
        path = directory / device_file_name(name)
        if path.is_file():
            root = Path(__file__).resolve().parent.parent
            shown = path.resolve().relative_to(root) if path.resolve().is_relative_to(root) else path
            return read_database(path).entries, str(shown)
    return {}, "none"


def pick_tuned(
    entries: dict[str, Any], spec: str, kernel: str, N: int, H: int, D: int, B: int
) -> dict[str, int] | None:
    """The database's config for this point, the batch mapped to a tuned bucket as dispatch maps it."""
    group = ("dcp", spec, kernel, (("N", N), ("Hl", H // N), ("D", D)), "bfloat16")
    by_bucket = {e.key.bucket: e.config for e in entries.values() if e.key.group() == group}
    if not by_bucket:
        return None
    return by_bucket[pick_bucket(B, by_bucket)]


def same_bytes(left: Any, right: Any, B: int) -> bool:
    return torch.equal(left.payload_view(B), right.payload_view(B)) and torch.equal(
        left.lse_view(B).view(torch.int32), right.lse_view(B).view(torch.int32)
    )


def measure_point(
    module: Any, sglang: Any, timer: CudaGraphTimer, entries: dict[str, Any], N: int, B: int, H: int, D: int, warm: bool
) -> dict[str, Any]:
    spec = module.SPEC
    dtype = torch.bfloat16
    Hl = H // N
    set_bytes = B * H * D * 2 * 2
    sets = rotating_sets(set_bytes, device_l2_bytes(0))
    outs = [torch.randn(B, H, D, dtype=dtype, device="cuda") for _ in range(sets)]
    lses = [torch.randn(B, H, device="cuda") * 4 for _ in range(sets)]
    sends = [module.alloc(N, B, H, D, dtype, "cuda") for _ in range(sets)]
    expected = module.alloc(N, B, H, D, dtype, "cuda")
    reference.pack(outs[0], lses[0], expected)
    scale = float(outs[0].abs().max())
    want, _ = reference.combine(expected, B)
    elem = 2
    pack_bytes = 2 * B * H * D * elem + 2 * B * H * 4
    combine_bytes = B * H * D * elem + B * H * 4 + B * Hl * D * elem
    row: dict[str, Any] = dict(
        spec=spec.name, N=N, B=B, H=H, D=D, sets=sets, pack_bytes=pack_bytes, combine_bytes=combine_bytes
    )
    estimate_pack = max(1.0, pack_bytes / 3.5e6)
    estimate_combine = max(1.0, combine_bytes / 3.5e6)

    def check_pack(name: str, run: Any) -> None:
        for bufs in sends[:1]:
            for tensor in bufs.tensors.values():
                tensor.view(torch.uint8).fill_(0xA5)
        run(0)
        torch.cuda.synchronize()
        if not same_bytes(sends[0], expected, B):
            raise AssertionError(f"{name} pack differs from the reference at {row}")

    def check_combine(name: str, merged: torch.Tensor) -> None:
        ratio = combine_error(merged.cpu(), want.cpu(), scale)
        if ratio > 1.0:
            raise AssertionError(f"{name} combine outside tolerance ({ratio:.2f}x) at {row}")

    def time_it(label: str, run: Any, estimate: float, nbytes: int) -> None:
        timing = timer.time(run, sets, estimated_us=estimate)
        row[f"{label}_us"] = timing.median_us
        row[f"{label}_tbps"] = nbytes / (timing.median_us * 1e-6) / 1e12

    def time_in_turn(label: str, ours: Any, theirs: Any, estimate: float, input_sets: int) -> None:
        """Ours, sglang's and ours again replayed in turn (one clock and thermal state): the head-to-head
        ratio beside the spread of our kernel timed twice, which a ratio must exceed to mean anything."""
        timings = timer.time_interleaved([ours, theirs, ours], input_sets, estimated_us=estimate)
        row[f"{label}_us"] = [timing.median_us for timing in timings]

    variants = {
        "tuned": pick_tuned(entries, spec.name, "pack", N, H, D, B),
        "default": default_pack_config(spec, N, Hl, D, B, elem).as_dict(),
    }
    row["pack_tuned_config"] = variants["tuned"]
    pack_runs: dict[str, Any] = {}
    for label, config_dict in variants.items():
        if config_dict is None:
            continue
        config = PackConfig.from_dict(config_dict)

        def run_pack(i: int, config: PackConfig = config) -> None:
            module.pack(outs[i], lses[i], sends[i], config=config)

        check_pack(f"layoutgen {label}", run_pack)
        time_it(f"pack_{label}", run_pack, estimate_pack, pack_bytes)
        pack_runs[label] = run_pack
    # Ours: the tuned config where the database has one, else the default.
    run_ours_pack = pack_runs.get("tuned") or pack_runs["default"]
    if sglang is not None:

        def run_sglang_pack(i: int) -> None:
            sglang.dcp_pack_a2a_send(outs[i], lses[i], sends[i].payload_view(B), sends[i].lse_view(B))

        check_pack("sglang", run_sglang_pack)
        time_it("pack_sglang", run_sglang_pack, estimate_pack, pack_bytes)
        time_in_turn("pack_turn", run_ours_pack, run_sglang_pack, estimate_pack, sets)
    if spec.name == "flashinfer_mnnvl":
        # The pre-#34651 fi_a2a send side: two materialising constructions and a zero fill.
        def run_copy_pack(i: int) -> tuple[torch.Tensor, torch.Tensor]:
            partial_o = outs[i].view(B, N, Hl, D).permute(0, 2, 1, 3).contiguous()
            stats = torch.zeros(B, Hl, N, 2, dtype=torch.float32, device="cuda")
            stats[..., 0] = lses[i].view(B, N, Hl).permute(0, 2, 1)
            return partial_o, stats

        partial_o, stats = run_copy_pack(0)
        if not (
            torch.equal(partial_o, expected.tensors["payload"][:B])
            and torch.equal(stats[..., 0], expected.tensors["stats"][:B, ..., 0])
        ):
            raise AssertionError(f"the copy path differs from the reference at {row}")
        time_it("pack_copy_path", run_copy_pack, estimate_pack, pack_bytes)
    if spec.name == "vllm_a2a":
        # vLLM's split a2a send side: two permute(...).contiguous() copies.
        def run_vllm_send(i: int) -> tuple[torch.Tensor, torch.Tensor]:
            send_o = outs[i].view(B, N, Hl, D).permute(1, 0, 2, 3).contiguous()
            send_lse = lses[i].view(B, N, Hl).permute(1, 0, 2).contiguous()
            return send_o, send_lse

        send_o, send_lse = run_vllm_send(0)
        if not (torch.equal(send_o, expected.payload_view(B)) and torch.equal(send_lse, expected.lse_view(B))):
            raise AssertionError(f"vLLM's split send differs from the reference at {row}")
        time_it("pack_vllm_split", run_vllm_send, estimate_pack, pack_bytes)

    # Combine reads the buffers pack filled (a rank's receive buffer has the same layout).
    for bufs, out, lse in zip(sends, outs, lses, strict=True):
        reference.pack(out, lse, bufs)
    combine_variants = {
        "tuned": pick_tuned(entries, spec.name, "combine", N, H, D, B),
        "default": default_combine_config(spec, N, Hl, D, B, elem).as_dict(),
    }
    row["combine_tuned_config"] = combine_variants["tuned"]
    merged_out = torch.empty(B, Hl, D, dtype=dtype, device="cuda")
    combine_runs: dict[str, Any] = {}
    for label, config_dict in combine_variants.items():
        if config_dict is None:
            continue
        config = CombineConfig.from_dict(config_dict)

        def run_combine(i: int, config: CombineConfig = config) -> None:
            module.combine(sends[i], B, out=merged_out, config=config)

        run_combine(0)
        check_combine(f"layoutgen {label}", merged_out)
        time_it(f"combine_{label}", run_combine, estimate_combine, combine_bytes)
        combine_runs[label] = run_combine
    run_ours_combine = combine_runs.get("tuned") or combine_runs["default"]
    if sglang is not None:

        def run_sglang_combine(i: int) -> None:
            sglang.dcp_lse_combine_triton(sends[i].payload_view(B), sends[i].lse_view(B))

        check_combine("sglang", sglang.dcp_lse_combine_triton(sends[0].payload_view(B), sends[0].lse_view(B))[0])
        time_it("combine_sglang", run_sglang_combine, estimate_combine, combine_bytes)
        time_in_turn("combine_turn", run_ours_combine, run_sglang_combine, estimate_combine, sets)
    if spec.name == "flashinfer_mnnvl" and sglang is not None:
        # The pre-#34651 fi_a2a receive side: two contiguous() copies, then the combine.
        def run_copy_combine(i: int) -> None:
            recv_output = sends[i].payload_view(B).contiguous()
            recv_lse = sends[i].lse_view(B).contiguous()
            sglang.dcp_lse_combine_triton(recv_output, recv_lse)

        time_it("combine_copy_path", run_copy_combine, estimate_combine, combine_bytes)
    row["pack_floor_us"] = movement_floor_us(timer, 1, B * H * D * elem + B * H * 4)
    row["combine_floor_us"] = movement_floor_us(timer, N, B * Hl * D * elem)
    if warm and B <= 64:
        # L2-resident: one input set (every call gets index 0), as when attention has just written `out`.
        row["pack_warm_us"] = timer.time(run_ours_pack, 1, estimated_us=estimate_pack).median_us
        row["combine_warm_us"] = timer.time(run_ours_combine, 1, estimated_us=estimate_combine).median_us
        if sglang is not None:
            row["pack_sglang_warm_us"] = timer.time(run_sglang_pack, 1, estimated_us=estimate_pack).median_us
            row["combine_sglang_warm_us"] = timer.time(run_sglang_combine, 1, estimated_us=estimate_combine).median_us
            time_in_turn("pack_warm_turn", run_ours_pack, run_sglang_pack, estimate_pack, 1)
            time_in_turn("combine_warm_turn", run_ours_combine, run_sglang_combine, estimate_combine, 1)
    return row


def environment() -> dict[str, Any]:
    import subprocess

    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        driver = "unknown"
    return {
        "device": torch.cuda.get_device_name(),
        "compute_capability": ".".join(map(str, torch.cuda.get_device_capability())),
        "driver": driver,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "layoutgen": layoutgen.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def in_turn(row: dict[str, Any], label: str) -> tuple[float, float, float, float] | None:
    """A head-to-head timed in turn: (ours µs, the mean of its two timings; sglang µs; sglang over ours; ours
    timed twice, the later over the earlier), or None where it was not timed."""
    times = row.get(f"{label}_us")
    if not times:
        return None
    first, theirs, again = times
    ours = (first + again) / 2
    return ours, theirs, theirs / ours, again / first


def slower_beyond_spread(turns: list[tuple[float, float, float, float]]) -> int:
    """Points where sglang is faster by more than our own kernel differed from itself timed twice."""
    return sum(1 for _, _, speedup, twice in turns if speedup < 1.0 - abs(twice - 1.0))


def summarize(rows: list[dict[str, Any]], ceiling: float) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for spec in SPECS:
        mine = [r for r in rows if r["spec"] == spec]
        if not mine:  # not run (--specs): no summary rather than a row of NaN
            continue
        for kernel in ("pack", "combine"):
            ours_key = f"{kernel}_tuned_us" if any(f"{kernel}_tuned_us" in r for r in mine) else f"{kernel}_default_us"
            ratios = [
                r[f"{kernel}_sglang_us"] / r.get(f"{kernel}_tuned_us", r[f"{kernel}_default_us"])
                for r in mine
                if f"{kernel}_sglang_us" in r
            ]
            main = [r for r in mine if r["H"] == 128 and r["D"] == 512]
            ratios_main = [
                r[f"{kernel}_sglang_us"] / r.get(f"{kernel}_tuned_us", r[f"{kernel}_default_us"])
                for r in main
                if f"{kernel}_sglang_us" in r
            ]
            big = [
                r[f"{kernel}_bytes"] / (r.get(f"{kernel}_tuned_us", r[f"{kernel}_default_us"]) * 1e-6) / 1e12 / ceiling
                for r in main
                if r["B"] >= 1024
            ]
            small = [r.get(f"{kernel}_tuned_us", r[f"{kernel}_default_us"]) for r in main if r["B"] <= 8]
            floored = [r for r in main if f"{kernel}_floor_us" in r and f"{kernel}_sglang_us" in r]
            turns = [t for r in mine if (t := in_turn(r, f"{kernel}_turn"))]
            warm_turns = [t for r in mine if (t := in_turn(r, f"{kernel}_warm_turn"))]
            summary[f"{spec}/{kernel}"] = {
                "ours": ours_key,
                "geomean_speedup_vs_sglang_main_grid": geomean(ratios_main),
                "geomean_speedup_vs_sglang_all": geomean(ratios),
                "min_speedup_vs_sglang": min(ratios) if ratios else None,
                "min_fraction_of_copy_ceiling_B_ge_1024": min(big) if big else None,
                "max_us_B_le_8": max(small) if small else None,
                # How close to the data-movement floor (1.0: there), and the speed-up over sglang a kernel
                # at the floor would have: the most any kernel moving these bytes could show.
                "geomean_floor_over_ours_main_grid": geomean(
                    [r[f"{kernel}_floor_us"] / r.get(f"{kernel}_tuned_us", r[f"{kernel}_default_us"]) for r in floored]
                ),
                "geomean_sglang_over_floor_main_grid": geomean(
                    [r[f"{kernel}_sglang_us"] / r[f"{kernel}_floor_us"] for r in floored]
                ),
                # The same comparison timed in turn (ours, sglang, ours again), rotated and L2-resident.
                "min_in_turn_speedup_vs_sglang": min((t[2] for t in turns), default=None),
                "min_warm_in_turn_speedup_vs_sglang": min((t[2] for t in warm_turns), default=None),
                "max_ours_twice_spread": max((abs(t[3] - 1.0) for t in turns + warm_turns), default=None),
                "in_turn_points_slower_beyond_spread": slower_beyond_spread(turns + warm_turns),
                "in_turn_points": len(turns) + len(warm_turns),
            }
    return summary


def markdown(result: dict[str, Any]) -> str:
    env, ceil, rows = result["environment"], result["ceilings"], result["rows"]
    lines = [
        "# DCP pack / combine on the GPU: layoutgen vs sglang 0.5.23",
        "",
        f"{env['device']} (cc {env['compute_capability']}, driver {env['driver']}), CUDA {env['cuda']}, "
        f"torch {env['torch']}, triton {env['triton']}, layoutgen {env['layoutgen']}, {env['date']}.",
        f"Copy ceiling (best of torch `copy_` and a 16-byte Triton copy, read + write): {ceil['copy_tbps']:.2f} TB/s "
        f"(torch `copy_`: {ceil['torch_copy_tbps']:.2f} TB/s); empty Triton kernel in a CUDA graph: "
        f"{ceil['empty_kernel_us']:.2f} µs. Tuning database: {result['tuning_db']}.",
        f"CUDA-graph replay medians; bf16; inputs rotated over up to {MAX_ROTATING_SETS} sets until they span 2x the L2 "
        "(at B ≤ 64, H = 128 they fit in the L2). "
        "`ours` is the tuned config where the database has one, else the default. Speed-up = sglang µs / ours µs.",
        clock_line(rows),
        "",
        "## Summary",
        "",
        "| spec / kernel | geomean vs sglang (H=128, D=512) | geomean (all rows) | worst point | min % of copy ceiling, B ≥ 1024 | max µs, B ≤ 8 | floor / ours (H=128) | sglang / floor (H=128) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in result["summary"].items():
        frac = s["min_fraction_of_copy_ceiling_B_ge_1024"]
        lines.append(
            f"| {name} | {s['geomean_speedup_vs_sglang_main_grid']:.2f}x | {s['geomean_speedup_vs_sglang_all']:.2f}x | "
            f"{(s['min_speedup_vs_sglang'] or float('nan')):.2f}x | {(frac or float('nan')) * 100:.0f}% | "
            f"{(s['max_us_B_le_8'] or float('nan')):.2f} | {s.get('geomean_floor_over_ours_main_grid', float('nan')):.2f} | "
            f"{s.get('geomean_sglang_over_floor_main_grid', float('nan')):.2f}x |"
        )
    lines += [
        "",
        "Floor: a streaming kernel that moves the same bytes and does nothing else (pack: a copy of `out` and "
        "`lse`; combine: N partials read, xor-ed, one written), the fastest of "
        f"{len(FLOOR_CONFIGS)} tile sizes, same rotation and output buffers. floor / ours = 1.00: as fast as it; "
        "sglang / floor: the speed-up over sglang of a kernel that only moved the bytes. A reference, not a "
        "proven bound (another tiling can beat it).",
    ]
    lines += in_turn_markdown(rows)
    for kernel in ("pack", "combine"):
        lines += [
            "",
            f"## {kernel}",
            "",
            "| spec | N | B | H | D | ours µs | floor µs | TB/s | % ceiling | default µs | sglang µs | speed-up | copy path µs | warm ours / sglang µs |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            ours = r.get(f"{kernel}_tuned_us", r.get(f"{kernel}_default_us"))
            tbps = r[f"{kernel}_bytes"] / (ours * 1e-6) / 1e12
            sg = r.get(f"{kernel}_sglang_us")
            copy = r.get(f"{kernel}_copy_path_us", r.get(f"{kernel}_vllm_split_us"))
            warm = r.get(f"{kernel}_warm_us")
            warm_sg = r.get(f"{kernel}_sglang_warm_us")
            lines.append(
                f"| {r['spec']} | {r['N']} | {r['B']} | {r['H']} | {r['D']} | {ours:.2f} | "
                f"{r.get(f'{kernel}_floor_us', float('nan')):.2f} | {tbps:.2f} | "
                f"{100 * tbps / ceil['copy_tbps']:.0f}% | {r.get(f'{kernel}_default_us', float('nan')):.2f} | "
                + (f"{sg:.2f} | {sg / ours:.2f}x | " if sg else "– | – | ")
                + (f"{copy:.2f} | " if copy else "– | ")
                + (f"{warm:.2f} / {warm_sg:.2f} |" if warm and warm_sg else "– |")
            )
    return "\n".join(lines) + "\n"


def in_turn_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The head-to-head against sglang timed in turn, per kernel: rotated and (with --warm) L2-resident."""
    if not any(in_turn(r, "pack_turn") or in_turn(r, "combine_turn") for r in rows):
        return []
    lines = [
        "",
        "## Against sglang, timed in turn",
        "",
        "Ours (tuned, else default), sglang's kernel and ours again, replayed in turn on one clock and thermal "
        "state (METHOD: time the same version twice; a difference smaller than that spread is noise). Ours µs "
        "is the mean of its two timings; ours twice = the later over the earlier.",
    ]

    def cells(turn: tuple[float, float, float, float] | None) -> str:
        if turn is None:
            return "– | – | – | – |"
        ours, theirs, speedup, twice = turn
        return f"{ours:.2f} | {theirs:.2f} | {speedup:.2f}x | {twice:.3f} |"

    for kernel in ("pack", "combine"):
        lines += [
            "",
            f"### {kernel}",
            "",
            "| spec | N | B | H | D | ours µs | sglang µs | speed-up | ours twice | L2-resident ours µs | sglang µs | speed-up | ours twice |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            turn = in_turn(r, f"{kernel}_turn")
            if turn is None:
                continue
            lines.append(
                f"| {r['spec']} | {r['N']} | {r['B']} | {r['H']} | {r['D']} | {cells(turn)} "
                f"{cells(in_turn(r, f'{kernel}_warm_turn'))}"
            )
    return lines


def clock_line(rows: list[dict[str, Any]]) -> str:
    """The SM clock the GPU chose while the points were timed (read by nvidia-smi, never set)."""
    sm = [r["clocks"]["sm_mhz"] for r in rows if "sm_mhz" in r.get("clocks", {})]
    if not sm:
        problems = {r["clocks"].get("problem") for r in rows if "clocks" in r} - {None}
        return f"SM clock not recorded ({', '.join(sorted(problems)) or 'no samples'})."
    power = [r["clocks"]["power_w"] for r in rows if "power_w" in r.get("clocks", {})]
    return (
        f"SM clock while the points were timed (nvidia-smi, median per point): {min(sm):.0f}-{max(sm):.0f} MHz, "
        f"median {statistics.median(sm):.0f}; power {min(power):.0f}-{max(power):.0f} W."
    )


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ceiling = result["ceilings"]["copy_tbps"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for axis, kernel in zip(axes, ("pack", "combine"), strict=True):
        for spec in SPECS:
            for source, style in (("ours", "-"), ("sglang", "--")):
                points = sorted(
                    (r["B"], r[f"{kernel}_bytes"] / (us * 1e-6) / 1e12)
                    for r in result["rows"]
                    if r["spec"] == spec and r["N"] == 8 and r["H"] == 128 and r["D"] == 512
                    for us in [
                        r.get(f"{kernel}_tuned_us", r.get(f"{kernel}_default_us"))
                        if source == "ours"
                        else r.get(f"{kernel}_sglang_us")
                    ]
                    if us
                )
                if points:
                    axis.plot(*zip(*points, strict=True), style, marker="o", ms=3, label=f"{spec} ({source})")
        axis.axhline(ceiling, color="black", lw=1)
        axis.text(1, ceiling * 1.01, f"copy ceiling {ceiling:.2f} TB/s", fontsize=8)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("batch B (N = 8, H = 128, D = 512, bf16)")
        axis.set_title(kernel)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("achieved TB/s (bytes read + written)")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"layoutgen vs sglang 0.5.23 on {result['environment']['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_results(result: dict[str, Any], rows: list[dict[str, Any]], out: Path) -> None:
    result["rows"] = rows
    result["summary"] = summarize(rows, result["ceilings"]["copy_tbps"])
    out.mkdir(parents=True, exist_ok=True)
    stem = "bench_dcp_" + device_file_name(result["environment"]["device"]).removesuffix(".json")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    (out / f"{stem}.md").write_text(markdown(result))
    try:
        plot(result, out / f"{stem}.png")
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--db", type=Path, default=None, help="tuning database directory (default: tuning_db/)")
    parser.add_argument("--quick", action="store_true", help="fewer batch sizes")
    parser.add_argument("--warm", action="store_true", help="also time L2-resident inputs at B <= 64")
    parser.add_argument("--specs", nargs="*", default=list(SPECS))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_dcp.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from baselines import load_sglang_dcp_kernels
    from clocks import ClockSampler

    try:
        sglang = load_sglang_dcp_kernels()
    except FileNotFoundError as error:
        print(f"sglang baseline unavailable: {error}", file=sys.stderr)
        sglang = None
    db_dir = args.db or (Path(__file__).resolve().parent.parent / "tuning_db")
    entries, db_path = tuned_configs(db_dir)
    timer = CudaGraphTimer()
    torch.manual_seed(0)
    result: dict[str, Any] = {"environment": environment(), "ceilings": ceilings(timer), "tuning_db": db_path}
    print(json.dumps(result), flush=True)
    rows: list[dict[str, Any]] = []
    with ClockSampler() as clocks:
        for spec in args.specs:
            module = layoutgen.load(spec)
            for N, B, H, D in grid_points(args.quick):
                start = time.time()
                row = measure_point(module, sglang, timer, entries, N, B, H, D, args.warm)
                row["clocks"] = clocks.window(start, time.time())
                rows.append(row)
                print(
                    f"{spec:20s} N={N} B={B:5d} H={H:3d} D={D}: pack {row.get('pack_tuned_us', row['pack_default_us']):8.2f} "
                    f"(sglang {row.get('pack_sglang_us', float('nan')):8.2f})  combine "
                    f"{row.get('combine_tuned_us', row['combine_default_us']):8.2f} (sglang {row.get('combine_sglang_us', float('nan')):8.2f})",
                    flush=True,
                )
                torch.cuda.empty_cache()
            write_results(result, rows, args.out)  # after every spec: a run cut short still leaves its figures
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
