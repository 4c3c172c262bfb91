"""GPU benchmark of the DCP contract v2 and fp8 targets, side by side in one process.

* masked pack (`empty=`, every 4th request empty) against the unmasked pack of the same spec and config, on
  bench_dcp.py's grid; and, for the lse specs, against sglang 0.5.23's pack plus the two `torch.where` that
  a masked pack replaces (`out` zeroed, `lse` set to -inf for empty rows);
* the (max, sum) combine of the TensorRT-LLM helix specs at B >= 1024: share of the copy ceiling;
* a transposing layout nobody tuned (sglang's NPU-path rows: float32 `[peer, head, dim, batch]` with the LSE
  as element D), with its default config and a few hand tiles: share of the copy ceiling;
* fp8 wire specs (every bundled spec whose payload is float8) against their bf16 base spec: pack at
  B >= 1024, combine at N = 8, and their share of the copy ceiling for the bytes they move.

Every variant is checked against `layoutgen.dcp.reference` before it is timed; times are CUDA-graph replay
medians with inputs rotated by the tuner's rule; bytes are `FAMILY.bytes_moved` (what a kernel must move).
Configs come from the device's tuning database where it holds one, else the heuristic default.

Usage (GPU): python benchmarks/bench_dcp_v2.py --out benchmarks/results [--db tuning_db] [--quick]
             python benchmarks/bench_dcp_v2.py --interpret   (CPU smoke run: tiny shapes, no timings claimed)
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch

REPO = Path(__file__).resolve().parent.parent
LSE_SPECS = ("pynccl_a2a", "pynccl_a2a_aligned", "vllm_a2a", "flashinfer_mnnvl")
HELIX_SPECS = ("trtllm_helix_nccl", "trtllm_helix_native_v1", "trtllm_helix_native_v2")
NPU_LIKE_YAML = """\
name: npu_like_rows
summary: sglang's NPU-path layout, float32 [peer, head, dim + 1, batch] with the LSE as element D (transposing).
transport: all_to_all_single
payload:
  axes: [peer, head, dim, batch]
  dtype: float32
stats:
  placement: row_tail
"""


def grid(quick: bool, interpret: bool) -> list[tuple[int, int, int, int]]:
    """(N, B, H, D) as bench_dcp.py's grid (tiny under the interpreter)."""
    if interpret:
        return [(2, 3, 4, 8), (4, 5, 8, 16)]
    batches = (1, 8, 64, 1024) if quick else (1, 8, 64, 256, 1024, 4096)
    points = [(N, B, 128, 512) for N in (2, 4, 8) for B in batches]
    points += [(N, B, 16, 512) for N in (2, 8) for B in (8, 1024)]
    points += [(N, B, 32, 128) for N in (2, 8) for B in (8, 1024)]
    return points


class Bench:
    """The timer, the device, the tuning database and the copy ceiling shared by every measurement."""

    def __init__(self, interpret: bool, db_dir: Path | None) -> None:
        from layoutgen.tuning.timing import CudaGraphTimer, WallClockTimer, copy_bandwidth_tbps, device_l2_bytes

        self.interpret = interpret
        self.device = torch.device("cpu" if interpret else "cuda")
        self.timer: Any = WallClockTimer() if interpret else CudaGraphTimer()
        self.l2 = 0 if interpret else device_l2_bytes(0)
        self.copy_tbps = None if interpret else copy_bandwidth_tbps(self.device)
        self.entries = self._entries(db_dir)

    def _entries(self, db_dir: Path | None) -> dict[str, Any]:
        from layoutgen.tuning_db import device_file_name, read_database

        if self.interpret or db_dir is None:
            return {}
        path = db_dir / device_file_name(torch.cuda.get_device_name())
        return read_database(path).entries if path.is_file() else {}

    def config(self, module: Any, kernel: str, N: int, H: int, D: int, B: int) -> tuple[Any, str]:
        """The database's config for this point (as dispatch maps the batch to a bucket), else the default."""
        from layoutgen.dcp import FAMILY
        from layoutgen.tuning.problem import Problem
        from layoutgen.tuning_db import pick_bucket

        group = ("dcp", module.SPEC_NAME, kernel, (("N", N), ("Hl", H // N), ("D", D)), "bfloat16")
        current = {e.key.bucket: e for e in self.entries.values() if e.key.group() == group}
        config_type = FAMILY.kernel(kernel).config_type
        if current:
            entry = current[pick_bucket(B, current)]
            if entry.source_hash == module.SOURCE_HASHES[kernel]:
                return config_type.from_dict(entry.config), "tuned"
        problem = Problem(module.SPEC, kernel, (("N", N), ("Hl", H // N), ("D", D)), "bfloat16")
        return FAMILY.default_config(problem, max(B, 1)), "default"

    def bytes_moved(self, module: Any, kernel: str, N: int, H: int, D: int, B: int) -> int:
        from layoutgen.dcp import FAMILY
        from layoutgen.tuning.problem import Problem

        return FAMILY.bytes_moved(Problem(module.SPEC, kernel, (("N", N), ("Hl", H // N), ("D", D)), "bfloat16"), B)

    def sets(self, nbytes: int) -> int:
        from layoutgen.tuning.timing import rotating_sets

        return rotating_sets(nbytes, self.l2)

    def time(self, run: Callable[[int], Any], sets: int, nbytes: int) -> dict[str, float]:
        return self._result(self.timer.time(run, sets, estimated_us=max(1.0, nbytes / 3.5e6)), nbytes)

    def time_interleaved(self, runs: list[Callable[[int], Any]], sets: int, nbytes: int) -> list[dict[str, float]]:
        """`runs` replayed in turn (A, B, C, A, B, C, ...): one clock and thermal state for all of them."""
        timings = self.timer.time_interleaved(runs, sets, estimated_us=max(1.0, nbytes / 3.5e6))
        return [self._result(timing, nbytes) for timing in timings]

    def _result(self, timing: Any, nbytes: int) -> dict[str, float]:
        tbps = nbytes / (timing.median_us * 1e-6) / 1e12
        result = {"us": timing.median_us, "p20_us": timing.p20_us, "p80_us": timing.p80_us, "tbps": tbps}
        if self.copy_tbps:
            result["ceiling"] = tbps / self.copy_tbps
        return result


def _same(left: Any, right: Any) -> bool:
    return all(torch.equal(left.tensors[n].view(torch.uint8), right.tensors[n].view(torch.uint8)) for n in left.tensors)


def _filled(bufs: Any) -> Any:
    for tensor in bufs.tensors.values():
        tensor.view(torch.uint8).fill_(0xA5)
    return bufs


def pack_inputs(
    bench: Bench, module: Any, N: int, B: int, H: int, D: int, empty_every: int = 4
) -> tuple[int, int, list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """A pack point's bytes moved, rotating set count, bf16 `out` and `lse` per set, and its empty mask: every
    `empty_every`-th request empty (0: none, a mask of all False)."""
    nbytes = bench.bytes_moved(module, "pack", N, H, D, B)
    sets = bench.sets(nbytes)
    outs = [torch.randn(B, H, D, dtype=torch.bfloat16, device=bench.device) for _ in range(sets)]
    lses = [torch.randn(B, H, device=bench.device) * 4 for _ in range(sets)]
    rows = torch.arange(B, device=bench.device)
    empty = rows % empty_every == empty_every - 1 if empty_every else torch.zeros_like(rows, dtype=torch.bool)
    return nbytes, sets, outs, lses, empty


def masked_pack(bench: Bench, name: str, sglang: Any, N: int, B: int, H: int, D: int) -> dict[str, Any]:
    """Unmasked and masked pack of one spec with one config; sglang plus two `torch.where` beside them."""
    import layoutgen
    from layoutgen.dcp import reference

    module = layoutgen.load(name)
    device, dtype = bench.device, torch.bfloat16
    nbytes, sets, outs, lses, empty = pack_inputs(bench, module, N, B, H, D)
    sends = [_filled(module.alloc(N, B, H, D, dtype, device)) for _ in range(sets)]
    config, source = bench.config(module, "pack", N, H, D, B)
    row: dict[str, Any] = {"spec": name, "N": N, "B": B, "H": H, "D": D, "config": source, "bytes": nbytes}
    runs = []
    for label, mask in (("unmasked", None), ("masked", empty)):
        expected = _filled(module.alloc(N, B, H, D, dtype, device))
        reference.pack(outs[0], lses[0], expected, empty=mask)

        def run(i: int, mask: Any = mask) -> None:
            module.pack(outs[i], lses[i], sends[i], empty=mask, config=config)

        _filled(sends[0])
        run(0)
        if not _same(sends[0], expected):
            raise AssertionError(f"{label} pack differs from the reference at {row}")
        runs.append(run)
    # Timed in turn, with the unmasked pack twice: at B <= 8 the two packs differ by 0.02-0.10 µs of about
    # 1.5 (H200, 2026-12-06, timed one after the other), and the repeat gives this run's noise at each point.
    row["unmasked"], row["masked"], row["unmasked_again"] = bench.time_interleaved([*runs, runs[0]], sets, nbytes)
    if sglang is not None and not module.SPEC.max_sum:
        inf = torch.tensor(float("-inf"), device=device)

        def run_sglang(i: int) -> None:
            out = torch.where(empty[:, None, None], torch.zeros((), dtype=dtype, device=device), outs[i])
            lse = torch.where(empty[:, None], inf, lses[i])
            sglang.dcp_pack_a2a_send(out, lse, sends[i].payload_view(B), sends[i].lse_view(B))

        expected = _filled(module.alloc(N, B, H, D, dtype, device))
        reference.pack(outs[0], lses[0], expected, empty=empty)
        _filled(sends[0])
        run_sglang(0)
        if not (torch.equal(sends[0].payload_view(B), expected.payload_view(B))):
            raise AssertionError(f"sglang + torch.where differs from the reference at {row}")
        row["sglang_where"] = bench.time(run_sglang, sets, nbytes)
    row["masked_over_unmasked"] = row["masked"]["us"] / row["unmasked"]["us"]
    row["unmasked_again_over_unmasked"] = row["unmasked_again"]["us"] / row["unmasked"]["us"]
    return row


def max_sum_combine(bench: Bench, name: str, N: int, B: int, H: int, D: int) -> dict[str, Any]:
    """Combine of a (max, sum) spec (or, for comparison, an lse spec) over packed buffers."""
    import layoutgen
    from layoutgen.dcp import reference
    from layoutgen.dcp.tolerances import combine_error

    module = layoutgen.load(name)
    device, dtype = bench.device, torch.bfloat16
    nbytes = bench.bytes_moved(module, "combine", N, H, D, B)
    sets = bench.sets(nbytes)
    bufs = [module.alloc(N, B, H, D, dtype, device) for _ in range(sets)]
    for index, buffer in enumerate(bufs):
        out = torch.randn(B, H, D, dtype=dtype, device=device)
        maximum = torch.randn(B, H, device=device) * 4
        if module.SPEC.max_sum:
            reference.pack(out, None, buffer, max_sum=(maximum, 1 + torch.rand(B, H, device=device)))
        else:
            reference.pack(out, maximum, buffer)
        if index == 0:
            scale = float(out.abs().max())
    config, source = bench.config(module, "combine", N, H, D, B)
    result = torch.empty(B, H // N, D, dtype=dtype, device=device)
    want, _ = reference.combine(bufs[0], B)
    module.combine(bufs[0], B, out=result, config=config)
    if combine_error(result.cpu(), want.cpu(), scale) > 1:
        raise AssertionError(f"{name} combine outside the tolerance at N={N} B={B}")
    row: dict[str, Any] = {"spec": name, "N": N, "B": B, "H": H, "D": D, "config": source, "bytes": nbytes}
    row["combine"] = bench.time(lambda i: module.combine(bufs[i], B, out=result, config=config), sets, nbytes)
    row["combine_scale_0.5"] = bench.time(
        lambda i: module.combine(bufs[i], B, out=result, scale=0.5, config=config), sets, nbytes
    )
    return row


def transposing_pack(bench: Bench, N: int, B: int, H: int, D: int, tiles: list[tuple[int, int, int]]) -> dict[str, Any]:
    """The NPU-path layout, rendered here from its YAML (no database entry: nobody tuned it)."""
    from layoutgen import codegen
    from layoutgen.dcp import FAMILY, reference
    from layoutgen.dcp.config import PackConfig
    from layoutgen.loader import load_path
    from layoutgen.spec import parse_spec_text
    from layoutgen.tuning.problem import Problem

    spec = parse_spec_text(NPU_LIKE_YAML, "npu_like_rows.yaml")
    directory = Path(tempfile.mkdtemp(prefix="layoutgen-bench-"))
    path = directory / f"{spec.name}.py"
    codegen.write_if_changed(path, codegen.render(spec, "npu_like_rows.yaml"))
    module = load_path(path)
    device, dtype = bench.device, torch.bfloat16
    problem = Problem(spec, "pack", (("N", N), ("Hl", H // N), ("D", D)), "bfloat16")
    nbytes = FAMILY.bytes_moved(problem, B)
    sets = bench.sets(nbytes)
    outs = [torch.randn(B, H, D, dtype=dtype, device=device) for _ in range(sets)]
    lses = [torch.randn(B, H, device=device) for _ in range(sets)]
    sends = [module.alloc(N, B, H, D, dtype, device) for _ in range(sets)]
    expected = _filled(module.alloc(N, B, H, D, dtype, device))
    reference.pack(outs[0], lses[0], expected)
    default = FAMILY.default_config(problem, B)
    configs = {"default": default} | {
        f"{rows}x{dims}x{warps}w": PackConfig(block_batch=rows, block_head=1, block_dim=dims, num_warps=warps)
        for rows, dims, warps in tiles
    }
    row: dict[str, Any] = {"N": N, "B": B, "H": H, "D": D, "bytes": nbytes, "default_config": default.as_dict()}
    for label, config in configs.items():

        def run(i: int, config: Any = config) -> None:
            module.pack(outs[i], lses[i], sends[i], config=config)

        _filled(sends[0])
        run(0)
        if not _same(sends[0], expected):
            raise AssertionError(f"the transposing pack ({label}) differs from the reference at N={N} B={B}")
        row[label] = bench.time(run, sets, nbytes)
    return row


def _timed_kernel(bench: Bench, spec_name: str, kernel: str, N: int, B: int, H: int, D: int) -> dict[str, Any]:
    """One spec's pack or combine at one point, checked against the reference, with its config."""
    import layoutgen
    from layoutgen.dcp import reference

    device, dtype = bench.device, torch.bfloat16
    module = layoutgen.load(spec_name)
    nbytes = bench.bytes_moved(module, kernel, N, H, D, B)
    sets = bench.sets(nbytes)
    outs = [torch.randn(B, H, D, dtype=dtype, device=device) for _ in range(sets)]
    lses = [torch.randn(B, H, device=device) * 4 for _ in range(sets)]
    bufs = [module.alloc(N, B, H, D, dtype, device) for _ in range(sets)]
    config, source = bench.config(module, kernel, N, H, D, B)
    if kernel == "pack":
        expected = _filled(module.alloc(N, B, H, D, dtype, device))
        reference.pack(outs[0], lses[0], expected)
        _filled(bufs[0])
        module.pack(outs[0], lses[0], bufs[0], config=config)
        if not _same(bufs[0], expected):
            raise AssertionError(f"{spec_name} pack differs from the reference at N={N} B={B}")
        timing = bench.time(lambda i: module.pack(outs[i], lses[i], bufs[i], config=config), sets, nbytes)
    else:
        for index in range(sets):
            reference.pack(outs[index], lses[index], bufs[index])
        result = torch.empty(B, H // N, D, dtype=dtype, device=device)
        timing = bench.time(lambda i: module.combine(bufs[i], B, out=result, config=config), sets, nbytes)
    return {**timing, "config": source, "bytes": nbytes}


def fp8_pair(bench: Bench, name: str, base: str, kernel: str, N: int, B: int, H: int, D: int) -> dict[str, Any]:
    """An fp8 spec's kernel against its bf16 base spec's, the same inputs' shapes, each with its config."""
    row: dict[str, Any] = {"spec": name, "base": base, "kernel": kernel, "N": N, "B": B, "H": H, "D": D}
    row["fp8"] = _timed_kernel(bench, name, kernel, N, B, H, D)
    row["bf16"] = _timed_kernel(bench, base, kernel, N, B, H, D)
    row["speedup"] = row["bf16"]["us"] / row["fp8"]["us"]
    return row


def fp8_specs() -> dict[str, str]:
    """fp8 spec -> its bf16 base spec (the bundled spec of the name without `_fp8`)."""
    from layoutgen.spec import bundled_specs

    specs = bundled_specs()
    return {
        name: name.removesuffix("_fp8")
        for name, spec in specs.items()
        if spec.family == "dcp"
        and str(spec.payload.dtype.value).startswith("float8")
        and name.removesuffix("_fp8") in specs
    }


def environment() -> dict[str, Any]:
    import triton

    from layoutgen import __version__

    info: dict[str, Any] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    info.update(torch=torch.__version__, triton=triton.__version__, layoutgen=__version__)
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def markdown(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [
        f"# DCP contract v2 and fp8: {env.get('device', 'CPU interpreter')}",
        "",
        f"{env['date']}; torch {env['torch']}, triton {env['triton']}, layoutgen {env['layoutgen']}; copy ceiling "
        + (f"{results['copy_tbps']:.2f} TB/s (read + write)" if results.get("copy_tbps") else "not measured")
        + ". CUDA-graph replay medians, inputs rotated by the tuner's rule; every variant checked against the "
        "reference first. Baseline: sglang 0.5.23's `dcp_pack_a2a_send` after the two `torch.where` a masked "
        "pack replaces.",
        "",
        "## Masked pack (every 4th request empty) against the unmasked pack, same config",
        "",
        "The unmasked, masked and unmasked-again packs are replayed in turn; the last column but two is the "
        "unmasked pack timed twice, this run's noise at that point.",
        "",
        "| spec | N | B | H | D | config | unmasked µs | masked µs | masked/unmasked | unmasked twice | "
        "sglang + where µs | ours vs that |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["masked"]:
        sglang = row.get("sglang_where")
        lines.append(
            f"| {row['spec']} | {row['N']} | {row['B']} | {row['H']} | {row['D']} | {row['config']} | "
            f"{row['unmasked']['us']:.2f} | {row['masked']['us']:.2f} | {row['masked_over_unmasked']:.3f} | "
            f"{row['unmasked_again_over_unmasked']:.3f} | "
            + (f"{sglang['us']:.2f} | {sglang['us'] / row['masked']['us']:.2f}x |" if sglang else "- | - |")
        )
    worst = max((row["masked_over_unmasked"] for row in results["masked"]), default=math.nan)
    noise = max((abs(row["unmasked_again_over_unmasked"] - 1) for row in results["masked"]), default=math.nan)
    over = sum(row["masked_over_unmasked"] > 1.03 for row in results["masked"])
    lines += [
        "",
        f"Worst masked/unmasked ratio: {worst:.3f} (target <= 1.03; {over} of {len(results['masked'])} points "
        f"over). The unmasked pack timed twice differs from itself by up to {100 * noise:.1f}%.",
        "",
    ]
    lines += ["## (max, sum) combine (TensorRT-LLM helix) and an lse combine beside it", ""]
    lines += [
        "| spec | N | B | H | D | config | µs | TB/s | of ceiling | scale 0.5 µs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["max_sum_combine"]:
        combine = row["combine"]
        lines.append(
            f"| {row['spec']} | {row['N']} | {row['B']} | {row['H']} | {row['D']} | {row['config']} | {combine['us']:.2f} | "
            f"{combine['tbps']:.2f} | {_pct(combine.get('ceiling'))} | {row['combine_scale_0.5']['us']:.2f} |"
        )
    lines += ["", "## Transposing pack (NPU-path rows, float32 [peer, head, dim, batch]; untuned)", ""]
    for row in results["transposing"]:
        parts = [
            f"{label} {value['us']:.1f} µs ({_pct(value.get('ceiling'))})"
            for label, value in row.items()
            if isinstance(value, dict) and "us" in value
        ]
        lines.append(f"* N {row['N']}, B {row['B']}, H {row['H']}, D {row['D']}: " + "; ".join(parts))
    if results["fp8"]:
        lines += ["", "## fp8 wire against the bf16 wire of the same layout", ""]
        lines += [
            "| spec | kernel | N | B | H | D | fp8 config | fp8 µs | bf16 config | bf16 µs | speed-up | fp8 of ceiling |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in results["fp8"]:
            lines.append(
                f"| {row['spec']} | {row['kernel']} | {row['N']} | {row['B']} | {row['H']} | {row['D']} | "
                f"{row['fp8']['config']} | {row['fp8']['us']:.2f} | {row['bf16']['config']} | {row['bf16']['us']:.2f} | "
                f"{row['speedup']:.2f}x | {_pct(row['fp8'].get('ceiling'))} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write bench_dcp_v2_<device>.{json,md} here")
    parser.add_argument("--db", type=Path, default=REPO / "tuning_db", help="tuning database directory")
    parser.add_argument("--quick", action="store_true", help="fewer batch sizes")
    parser.add_argument("--interpret", action="store_true", help="CPU smoke run under the Triton interpreter")
    parser.add_argument("--no-fp8", action="store_true", help="leave out the fp8 comparisons")
    args = parser.parse_args()
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    elif not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (or --interpret for a CPU smoke run)")
    from baselines import load_sglang_dcp_kernels

    bench = Bench(args.interpret, args.db)
    try:
        sglang = None if args.interpret else load_sglang_dcp_kernels()
    except (ImportError, FileNotFoundError, OSError) as error:
        print(f"sglang baseline unavailable: {error}", file=sys.stderr)
        sglang = None
    points = grid(args.quick, args.interpret)
    large = [(N, B, H, D) for N, B, H, D in points if B >= 1024] or points[-1:]
    results: dict[str, Any] = {"environment": environment(), "copy_tbps": bench.copy_tbps}
    results["masked"] = [
        masked_pack(bench, name, sglang, *point) for name in (*LSE_SPECS, *HELIX_SPECS) for point in points
    ]
    results["max_sum_combine"] = [
        max_sum_combine(bench, name, *point) for name in (*HELIX_SPECS, "vllm_a2a") for point in large
    ]
    transposing_points = [(2, 3, 4, 8)] if args.interpret else [(2, 4096, 128, 512), (8, 1024, 128, 512)]
    tiles = [(2, 8, 1)] if args.interpret else [(32, 64, 4), (64, 64, 4), (64, 128, 8), (128, 32, 4)]
    results["transposing"] = [transposing_pack(bench, *point, tiles) for point in transposing_points]
    fp8_points_pack = large
    fp8_points_combine = [(N, B, H, D) for N, B, H, D in points if N == 8 and B >= 64] or points[-1:]
    results["fp8"] = [
        fp8_pair(bench, name, base, kernel, *point)
        for name, base in ({} if args.no_fp8 else fp8_specs()).items()
        for kernel, kernel_points in (("pack", fp8_points_pack), ("combine", fp8_points_combine))
        for point in kernel_points
    ]
    text = markdown(results)
    print(text)
    if args.out is not None:
        device = results["environment"].get("device", "cpu-interpreter").replace(" ", "_")
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"bench_dcp_v2_{device}.json").write_text(json.dumps(results, indent=1) + "\n")
        (args.out / f"bench_dcp_v2_{device}.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
