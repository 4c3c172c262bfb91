"""GPU benchmark: host time per eager pack / combine call, against Triton's launcher and sglang's eager pack.

In eager decode the host, not the GPU, is the cost of these small kernels.  For
one shape (default N=4, B=8, H=128, D=512, bf16, spec pynccl_a2a) this measures
the host time of one call, median over --calls (>= 10000) individually timed
calls, of:

  (a) layoutgen `pack(out, lse, bufs)` and `combine(bufs, B, out=...)` with the
      config dispatch picks (tuned from the tuning database, else the default),
      and `combine(bufs, B)` allocating its output; then the contract-v2 forms an
      engine calls every step: the masked pack (`empty=`, every 4th request
      empty), the pack from `max_sum=(max, sum)`, and the combine with `scale=`
      and with `return_lse=True`;
  (b) the same compiled kernels launched through `kernel[grid](...)` with the same
      (pre-built) arguments, and through the generated `_launch_*` function;
  (c) an empty Triton kernel through `kernel[grid](...)`, and through the same
      direct launch path layoutgen uses;
  (d) sglang 0.5.23's eager `dcp_pack_a2a_send` on the same buffers (loaded by
      path by `baselines.load_sglang_dcp_kernels`; skipped with a message when
      missing);

plus the GPU time per call of pack, combine and both, replayed in a CUDA graph.
Every layoutgen and sglang variant is checked against `layoutgen.reference`
first.  Writes dispatch_overhead_<device>.json and .md to --out.

Usage (GPU): python benchmarks/dispatch_overhead.py --out benchmarks/results
Smoke test without a GPU (meaningless times, no CUDA-graph rows):
    TRITON_INTERPRET=1 python benchmarks/dispatch_overhead.py --device cpu --calls 20 --H 8 --D 16 --out /tmp/x
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # a checkout that is not pip-installed
sys.path.insert(0, str(ROOT / "benchmarks"))

import layoutgen  # noqa: E402
from layoutgen.dcp import FAMILY, reference  # noqa: E402
from layoutgen.dcp.layout import LayoutBuffers  # noqa: E402
from layoutgen.runtime import configs, launch  # noqa: E402
from layoutgen.tuning_db import device_file_name, software_versions  # noqa: E402

SYNC_EVERY = 256  # keep the launch queue short: host time must not include waiting for the GPU
GRAPH_REPEATS = 64


@triton.jit
def _empty_kernel(pointer):
    pass


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def host_times(call: Callable[[], Any], calls: int) -> dict[str, float]:
    """Median / p20 / p80 host µs of one call, each call timed on its own."""
    for _ in range(min(1000, calls // 10)):
        call()
    synchronize()
    samples = []
    clock = time.perf_counter_ns
    for index in range(calls):
        if index % SYNC_EVERY == 0:
            synchronize()
        start = clock()
        call()
        samples.append(clock() - start)
    synchronize()
    quantiles = statistics.quantiles(samples, n=10)
    return {
        "median_us": statistics.median(samples) / 1e3,
        "p20_us": quantiles[1] / 1e3,
        "p80_us": quantiles[7] / 1e3,
        "calls": calls,
    }


def graph_gpu_us(call: Callable[[], Any]) -> float:
    """GPU µs per call: GRAPH_REPEATS calls captured in one CUDA graph, median over 50 replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_REPEATS):
            call()
    for _ in range(5):
        graph.replay()
    times = []
    for _ in range(50):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / GRAPH_REPEATS)
    return statistics.median(times)


def recorded_call(launch_function: Callable[..., None], arguments: tuple[Any, ...]) -> tuple[Any, Any, Any]:
    """(grid, args, kwargs) that a generated `_launch_*` passes to its kernel."""
    recorder = launch.Recorder()
    launch_function(*arguments, kernel=recorder)
    (call,) = recorder.calls
    return call


def environment(device: str) -> dict[str, Any]:
    cuda = device == "cuda"
    return {
        "device": torch.cuda.get_device_name() if cuda else "cpu-interpreter",
        "compute_capability": ".".join(map(str, torch.cuda.get_device_capability())) if cuda else "none",
        **software_versions(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    N, B, H, D = args.N, args.B, args.H, args.D
    dtype, device = torch.bfloat16, args.device
    module = layoutgen.load(args.spec)
    torch.manual_seed(0)
    out = torch.randn(B, H, D, device=device).to(dtype)
    lse = torch.randn(B, H, device=device) * 4
    bufs = module.alloc(N, args.B_max, H, D, dtype, device)
    merged = torch.empty(B, H // N, D, dtype=dtype, device=device)
    empty = torch.arange(B, device=device) % 4 == 3
    maximum = torch.randn(B, H, device=device) * 4
    total = torch.rand(B, H, device=device) * 8 + 0.5
    rows: dict[str, dict[str, Any]] = {}
    notes: list[str] = []

    # Correctness first: pack bytes equal the reference's; combine within tolerance of reference.combine.
    want = LayoutBuffers.allocate(module.SPEC, N, args.B_max, H, D, dtype, device)
    for tensor in (*bufs.tensors.values(), *want.tensors.values()):
        tensor.view(torch.uint8).fill_(0xA5)
    module.pack(out, lse, bufs)
    reference.pack(out, lse, want)
    for name in bufs.tensors:
        if not torch.equal(bufs.tensors[name].view(torch.uint8), want.tensors[name].view(torch.uint8)):
            raise SystemExit(f"layoutgen pack differs from the reference in buffer {name!r}")
    got, _ = module.combine(bufs, B, out=merged)
    expected, _ = reference.combine(bufs, B, "e", False)
    worst = (got.double() - expected).abs().max().item()
    if worst > 0.05 * max(1.0, expected.abs().max().item()):
        raise SystemExit(f"layoutgen combine is off the reference by {worst}")
    scaled, _ = module.combine(bufs, B, out=merged, scale=0.5)
    worst = (scaled.double() - expected * 0.5).abs().max().item()
    if worst > 0.05 * max(1.0, expected.abs().max().item()):
        raise SystemExit(f"layoutgen combine with scale=0.5 is off the reference by {worst}")
    for label, stats in (
        ("masked", {"lse": lse, "empty": empty}),
        ("max_sum", {"lse": None, "max_sum": (maximum, total)}),
    ):
        for tensor in (*bufs.tensors.values(), *want.tensors.values()):
            tensor.view(torch.uint8).fill_(0xA5)
        module.pack(out, bufs=bufs, **stats)
        reference.pack(out, bufs=want, **stats)
        for name in bufs.tensors:
            if not torch.equal(bufs.tensors[name].view(torch.uint8), want.tensors[name].view(torch.uint8)):
                raise SystemExit(f"layoutgen's {label} pack differs from the reference in buffer {name!r}")
    module.pack(out, lse, bufs)
    reference.pack(out, lse, want)  # the plain pack's bytes again: sglang's pack is checked against them below

    pack_plan = module._dispatch.pack_plan(out, lse, bufs)
    combine_plan = module._dispatch.combine_plan(bufs, B, "e", merged, False, None)
    tuned = {}
    for kernel in ("pack", "combine"):
        decl = FAMILY.kernel(kernel)
        expected = configs.expected_for(decl, module.SPEC_HASH, module.SOURCE_HASHES[kernel])
        extents = {"N": N, "Hl": H // N, "D": D}
        found = configs.tuned_config(FAMILY.name, module.SPEC.name, decl, bufs.device, extents, "bfloat16", B, expected)
        tuned[kernel] = found is not None
    direct = {"pack": pack_plan.direct is not None, "combine": combine_plan.direct is not None}
    if not all(direct.values()):
        notes.append(f"direct launch not in use: {direct} (launches went through kernel[grid])")

    # (a) layoutgen's public calls.
    rows["a_pack"] = host_times(lambda: module.pack(out, lse, bufs), args.calls)
    rows["a_combine_out"] = host_times(lambda: module.combine(bufs, B, out=merged), args.calls)
    rows["a_combine_alloc"] = host_times(lambda: module.combine(bufs, B), args.calls)
    rows["a_pack_masked"] = host_times(lambda: module.pack(out, lse, bufs, empty=empty), args.calls)
    rows["a_pack_max_sum"] = host_times(lambda: module.pack(out, bufs=bufs, max_sum=(maximum, total)), args.calls)
    module.pack(out, lse, bufs)
    rows["a_combine_scaled"] = host_times(lambda: module.combine(bufs, B, out=merged, scale=0.5), args.calls)
    rows["a_combine_lse"] = host_times(lambda: module.combine(bufs, B, out=merged, return_lse=True), args.calls)

    # (b) the same compiled kernels through Triton's launcher.
    pack_grid, pack_args, pack_kwargs = recorded_call(
        module._launch_pack, (out, lse, bufs, pack_plan.batch, pack_plan.config, pack_plan.index_64)
    )
    combine_grid, combine_args, combine_kwargs = recorded_call(
        module._launch_combine,
        (bufs, B, merged, None, combine_plan.lse_base_2, combine_plan.config, combine_plan.index_64),
    )
    pack_kernel, combine_kernel = module._pack_kernel, module._combine_kernel
    rows["b_pack_kernel_grid"] = host_times(lambda: pack_kernel[pack_grid](*pack_args, **pack_kwargs), args.calls)
    rows["b_combine_kernel_grid"] = host_times(
        lambda: combine_kernel[combine_grid](*combine_args, **combine_kwargs), args.calls
    )
    rows["b_pack_launch_function"] = host_times(
        lambda: module._launch_pack(out, lse, bufs, pack_plan.batch, pack_plan.config, pack_plan.index_64), args.calls
    )
    if pack_plan.direct is not None:
        tensors = (out, lse, *bufs.tensors.values())
        rows["b_pack_direct_only"] = host_times(lambda: pack_plan.direct(tensors), args.calls)

    # (c) an empty kernel: Triton's launcher, and the direct path.
    scratch = torch.empty(16, device=device)
    rows["c_empty_kernel_grid"] = host_times(lambda: _empty_kernel[(1,)](scratch), args.calls)
    if launch.is_jit_function(_empty_kernel) and device == "cuda":
        empty_direct = launch.DirectLaunch(_empty_kernel, (1,), (scratch,), {}, (scratch,), (0,))
        rows["c_empty_kernel_direct"] = host_times(lambda: empty_direct((scratch,)), args.calls)

    # (d) sglang's eager pack on the same buffers (its layout is pynccl_a2a's).
    try:
        from baselines import load_sglang_dcp_kernels

        sglang = load_sglang_dcp_kernels(args.sglang)
    except (ImportError, FileNotFoundError) as error:
        notes.append(f"(d) skipped: sglang baseline unavailable: {error}")
        sglang = None
    if sglang is not None and args.spec.startswith("pynccl_a2a"):
        for tensor in bufs.tensors.values():
            tensor.view(torch.uint8).fill_(0xA5)
        payload_view, lse_view = bufs.payload_view(B), bufs.lse_view(B)
        sglang.dcp_pack_a2a_send(out, lse, payload_view, lse_view)
        synchronize()
        same = all(
            torch.equal(bufs.tensors[n].view(torch.uint8), want.tensors[n].view(torch.uint8)) for n in bufs.tensors
        )
        if not same:
            notes.append("sglang's dcp_pack_a2a_send did not reproduce the reference bytes (timed anyway)")
        rows["d_sglang_pack"] = host_times(
            lambda: sglang.dcp_pack_a2a_send(out, lse, payload_view, lse_view), args.calls
        )
    elif sglang is not None:
        notes.append(f"(d) skipped: sglang's pack writes pynccl_a2a's layout, not {args.spec}'s")

    gpu: dict[str, float] = {}
    if device == "cuda":
        gpu = {
            "pack_us": graph_gpu_us(lambda: module.pack(out, lse, bufs)),
            "pack_masked_us": graph_gpu_us(lambda: module.pack(out, lse, bufs, empty=empty)),
            "combine_us": graph_gpu_us(lambda: module.combine(bufs, B, out=merged)),
            "pack_combine_us": graph_gpu_us(lambda: (module.pack(out, lse, bufs), module.combine(bufs, B, out=merged))),
            "empty_kernel_us": graph_gpu_us(lambda: _empty_kernel[(1,)](scratch)),
        }
    return {
        "environment": environment(device),
        "shape": {"spec": args.spec, "N": N, "B": B, "B_max": args.B_max, "H": H, "D": D, "dtype": "bfloat16"},
        "configs": {
            "pack": {"config": pack_plan.config.as_dict(), "tuned": tuned["pack"]},
            "combine": {"config": combine_plan.config.as_dict(), "tuned": tuned["combine"]},
        },
        "direct_launch": direct,
        "host": rows,
        "gpu_graph": gpu,
        "notes": notes,
    }


LABELS = {
    "a_pack": "(a) layoutgen pack(out, lse, bufs)",
    "a_combine_out": "(a) layoutgen combine(bufs, B, out=...)",
    "a_combine_alloc": "(a) layoutgen combine(bufs, B) (allocates out)",
    "a_pack_masked": "(a) layoutgen pack(out, lse, bufs, empty=...) (every 4th request empty)",
    "a_pack_max_sum": "(a) layoutgen pack(out, bufs=bufs, max_sum=(max, sum))",
    "a_combine_scaled": "(a) layoutgen combine(bufs, B, out=..., scale=0.5)",
    "a_combine_lse": "(a) layoutgen combine(bufs, B, out=..., return_lse=True)",
    "b_pack_kernel_grid": "(b) pack kernel via kernel[grid](...)",
    "b_combine_kernel_grid": "(b) combine kernel via kernel[grid](...)",
    "b_pack_launch_function": "(b) generated _launch_pack (kernel[grid] + grid arithmetic)",
    "b_pack_direct_only": "(b) pack: cached compiled-kernel launch alone (no dispatch)",
    "c_empty_kernel_grid": "(c) empty Triton kernel via kernel[grid](...)",
    "c_empty_kernel_direct": "(c) empty Triton kernel via layoutgen's direct launch",
    "d_sglang_pack": "(d) sglang 0.5.23 dcp_pack_a2a_send (eager)",
}


def markdown(result: dict[str, Any]) -> str:
    env, shape = result["environment"], result["shape"]
    lines = [
        f"# Dispatch overhead: {env['device']} (sm {env['compute_capability']})",
        "",
        f"{env['date']}; layoutgen {env['layoutgen']}, triton {env['triton']}, torch {env['torch']}, "
        f"CUDA {env['cuda']}, Python {env['python']}.",
        f"Shape: spec {shape['spec']}, N={shape['N']}, B={shape['B']} (B_max {shape['B_max']}), H={shape['H']}, "
        f"D={shape['D']}, {shape['dtype']}.",
        "Configs: "
        + "; ".join(
            f"{kernel} {'tuned' if item['tuned'] else 'default'} {json.dumps(item['config'], sort_keys=True)}"
            for kernel, item in result["configs"].items()
        ),
        f"Direct launch in use: {result['direct_launch']}.",
        "",
        "Host time per eager call (each call timed on its own; synchronised every "
        f"{SYNC_EVERY} calls outside the timed region):",
        "",
        "| call | median µs | p20 µs | p80 µs | calls |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, row in result["host"].items():
        lines.append(
            f"| {LABELS.get(key, key)} | {row['median_us']:.2f} | {row['p20_us']:.2f} | {row['p80_us']:.2f} | "
            f"{row['calls']} |"
        )
    gpu = result["gpu_graph"]
    lines.append("")
    if gpu:
        lines.append(
            f"GPU time per call, {GRAPH_REPEATS} calls captured in one CUDA graph (median of 50 replays): "
            f"pack {gpu['pack_us']:.2f} µs, masked pack {gpu['pack_masked_us']:.2f} µs, combine {gpu['combine_us']:.2f} µs, pack + combine "
            f"{gpu['pack_combine_us']:.2f} µs, empty kernel {gpu['empty_kernel_us']:.2f} µs."
        )
    host = result["host"]
    if "d_sglang_pack" in host:
        ratio = host["d_sglang_pack"]["median_us"] / host["a_pack"]["median_us"]
        lines.append(f"sglang eager pack / layoutgen pack, host time: {ratio:.2f}x (target >= 2).")
    for key, call in (("a_pack", "pack"), ("a_pack_masked", "masked pack")):
        ratio = host[key]["median_us"] / host["c_empty_kernel_grid"]["median_us"]
        lines.append(f"layoutgen {call} / empty kernel via kernel[grid], host time: {ratio:.2f} (target <= 1).")
    lines += [f"Note: {note}" for note in result["notes"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--spec", default="pynccl_a2a")
    parser.add_argument("--N", type=int, default=4)
    parser.add_argument("--B", type=int, default=8)
    parser.add_argument("--B-max", dest="B_max", type=int, default=None, help="buffer rows (default: B)")
    parser.add_argument("--H", type=int, default=128)
    parser.add_argument("--D", type=int, default=512)
    parser.add_argument("--calls", type=int, default=10000, help="timed calls per row (>= 10000 for the report)")
    parser.add_argument("--sglang", default=None, help="path of sglang's dcp_kernels.py (default: installed sglang)")
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="cpu: smoke test under TRITON_INTERPRET=1"
    )
    args = parser.parse_args()
    args.B_max = args.B_max or args.B
    if args.device == "cuda" and not torch.cuda.is_available():
        print("dispatch_overhead.py needs a CUDA GPU (or --device cpu with TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    result = measure(args)
    args.out.mkdir(parents=True, exist_ok=True)
    # The default spec's report keeps its name; another spec's carries the spec's name too.
    spec_part = "" if args.spec == "pynccl_a2a" else f"{args.spec}_"
    stem = f"dispatch_overhead_{spec_part}" + device_file_name(result["environment"]["device"]).removesuffix(".json")
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    text = markdown(result)
    (args.out / f"{stem}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
