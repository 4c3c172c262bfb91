"""GPU benchmark: the Ulysses kernels against the torch permute/.contiguous() path engines write, its
torch.compile, and a plain copy of the same bytes.

For every bundled ulysses spec, shape and kernel (scatter, gather, scatter_out, gather_out), one process
times side by side, as CUDA-graph replay medians (`layoutgen.tuning.timing.CudaGraphTimer`, inputs
rotating over sets by the tuner's rule, `rotating_sets`):

* ours: the generated module's public function, `config=None` (the tuning database of this device when it
  holds the shape, else the heuristic default; the row says which);
* torch: `layoutgen.ulysses.reference.naive_*`, the reshape / permute / `.contiguous()` (and `torch.cat` for
  a shared wire) that DeepSpeed-Ulysses and yunchang write around all_to_all_single;
* compiled: that path under `torch.compile` (inductor, default mode);
* copy: a Triton copy moving the same number of bytes, nothing else, the fastest of its shapes (the
  data-movement floor).

Only the inputs rotate: every variant writes one output whatever set it reads (our scatters one set of send
buffers, as serving reuses one static set every layer; the torch paths and our gathers one block of the
graph's memory pool; the copy one destination).

Where the wire already holds the user side's layout at that shape (e.g. DeepSpeed's seq-first wire is the
attention layout), the row says `view`: `attention_views` / `local_views` make that step free, as the
engines' reshape is, and the kernel's time is what not using them would cost.

Every variant's output is checked byte for byte against the reference before it is timed.  Results:
`<out>/ulysses_<device>.json` (every row) and `<out>/ulysses_<device>.md` (the table).

Usage (GPU): python benchmarks/bench_ulysses.py --out benchmarks/results [--quick | --small] [--spec NAME ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton

import layoutgen
from layoutgen.tuning.copy_kernel import CONFIGS as COPY_CONFIGS
from layoutgen.tuning.copy_kernel import copy_kernel
from layoutgen.tuning.timing import CudaGraphTimer, device_l2_bytes, rotating_sets
from layoutgen.tuning_db import device_file_name
from layoutgen.ulysses import reference
from layoutgen.ulysses.layout import KERNEL_DIRECTION, KERNEL_SIDES, Shape, UlyssesBuffers, tensor_shape
from layoutgen.ulysses.spec import HeadCount

SPECS = (
    "deepspeed_ulysses",
    "deepspeed_ulysses_head_major",
    "yunchang_ulysses",
    "yunchang_ulysses_head_major",
    "ulysses_qkv_gqa",
)
KERNELS = ("scatter", "gather", "scatter_out", "gather_out")
NAIVE = {
    "scatter": reference.naive_scatter,
    "gather": reference.naive_gather,
    "scatter_out": reference.naive_scatter_out,
    "gather_out": reference.naive_gather_out,
}


#: (N, S_local, B, H, H_kv, D) of the small-size target (each tensor <= 256 KiB): one token per rank
#: (a 8 KiB q), and 64 tokens of 16 heads (a 256 KiB q) where launch latency, not bandwidth, sets the time.
SMALL_POINTS = [(2, 1, 1, 32, 8, 128), (8, 64, 1, 16, 8, 128)]


def grid_points(quick: bool, small: bool = False) -> list[tuple[int, int, int, int, int, int]]:
    """(N, S_local, B, H, H_kv, D): a video-DiT-like layer (H 24, D 128, long sequences) and an LLM one
    (H 32, GQA 8 k/v heads, D 128) at N 2, 4, 8 (H_kv = H where the spec has no GQA tensors); `small`:
    the small-size points instead."""
    if small:
        return list(SMALL_POINTS)
    if quick:
        return [(4, 4096, 1, 32, 8, 128), (8, 1024, 1, 32, 8, 128)]
    points = []
    for N in (2, 4, 8):
        for S_local in (1024, 8192, 32768):
            points.append((N, S_local, 1, 24 if N != 8 else 32, 8, 128))
            points.append((N, S_local, 1, 32, 8, 128))
    return points


def shape_for(spec: Any, point: tuple[int, int, int, int, int, int]) -> Shape:
    N, S_local, B, H, H_kv, D = point
    return Shape(N=N, S_local=S_local, H=H, H_kv=H_kv if spec.uses(HeadCount.H_KV) else H, D=D,
                 dtype=torch.bfloat16, B=B if spec.has_batch else 1)  # fmt: skip


def holds(spec: Any, shape: Shape) -> bool:
    return all(shape.heads(count) % shape.N == 0 for count in HeadCount if spec.uses(count))


class Case:
    """One (spec, shape, kernel): rotating input sets, each with what our kernel and the torch path read."""

    def __init__(self, module: Any, shape: Shape, kernel: str, sets: int) -> None:
        self.module, self.spec, self.shape, self.kernel = module, module.SPEC, shape, kernel
        self.direction = KERNEL_DIRECTION[kernel]
        self.names = [t.name for t in self.spec.direction(self.direction).tensors]
        # Only the inputs rotate: one set of send buffers serves every set, as one static set serves every
        # layer in serving, and as the torch paths' outputs (and our gathers') come from one block of the
        # graph's memory pool, reused call after call.  With a set of send buffers per input set our scatters
        # wrote DRAM where those paths wrote the L2: torch.compile took 7.1 us against our 8.0 at N 8,
        # S_local 1024 (ulysses_qkv_gqa scatter) and beat a copy of the same bytes (7.9).
        self.send = self._alloc() if self.kernel.startswith("scatter") else None
        self.sets = [self._set(index) for index in range(sets)]

    def _alloc(self) -> UlyssesBuffers:
        return UlyssesBuffers.allocate(self.spec, self.direction, self.shape, "cuda")

    def _set(self, index: int) -> dict[str, Any]:
        generator = torch.Generator("cuda").manual_seed(index)
        if self.kernel.startswith("scatter"):
            side = KERNEL_SIDES[self.kernel][0]
            tensors = {t.name: torch.randn(tensor_shape(self.spec, self.shape, t, side), device="cuda",
                                           generator=generator).to(self.shape.dtype)
                       for t in self.spec.direction(self.direction).tensors}  # fmt: skip
            return {"tensors": tensors, "bufs": self.send}
        bufs = self._alloc()
        for tensor in bufs.tensors.values():
            tensor.copy_(torch.randn(tensor.shape, device="cuda", generator=generator))
        return {"bufs": bufs}

    @property
    def bytes_moved(self) -> int:
        return bytes_moved(self.spec, self.shape, self.kernel)

    def ours(self, module: Any = None, config: Any = None) -> Callable[[int], Any]:
        """Our kernel on set i: this case's module (or another build of it), `config=None` the dispatched one."""
        function = getattr(module or self.module, self.kernel)
        if self.kernel.startswith("scatter"):
            return lambda i: function(*self.sets[i]["tensors"].values(), self.sets[i]["bufs"], config=config)
        return lambda i: function(self.sets[i]["bufs"], config=config)

    def naive(self, compiled: bool) -> Callable[[int], Any]:
        naive = NAIVE[self.kernel]
        spec, shape = self.spec, self.shape

        def run(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return naive(spec, shape, inputs)

        if compiled:
            torch._dynamo.reset()  # one compile per case: dynamo would stop recompiling `run` after eight
        step = torch.compile(run, dynamic=False) if compiled else run
        if self.kernel.startswith("scatter"):
            return lambda i: step(self.sets[i]["tensors"])
        return lambda i: step(dict(self.sets[i]["bufs"].tensors))

    def viewable(self) -> bool:
        """Whether the step needs no copy at all: the wire holds the user side's layout already."""
        side = KERNEL_SIDES[self.kernel][0 if self.kernel.startswith("scatter") else 1]
        views = self.module.attention_views if side == "attention" else self.module.local_views
        try:
            views(self.sets[0]["bufs"])
        except ValueError:
            return False
        return True

    def check(self, name: str, launch: Callable[[int], Any]) -> None:
        """Byte-exact against the reference on set 0 (a variant that is not is reported, never timed)."""
        result = launch(0)
        torch.cuda.synchronize()
        first = self.sets[0]
        if self.kernel.startswith("scatter"):
            want = self._alloc()
            (reference.scatter if self.kernel == "scatter" else reference.scatter_out)(first["tensors"], want)
            got = first["bufs"].tensors if result is None else result
            pairs = [(got[n], want.tensors[n]) for n in want.tensors]
        else:
            want_tensors = (reference.gather if self.kernel == "gather" else reference.gather_out)(first["bufs"])
            got_tensors = (
                result
                if isinstance(result, dict)
                else dict(zip(self.names, result if isinstance(result, tuple) else (result,), strict=True))
            )
            pairs = [(got_tensors[n], want_tensors[n]) for n in self.names]
        for got, want in pairs:
            if not torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)):
                raise RuntimeError(f"{name} {self.kernel} {self.spec.name} differs from the reference")


def bytes_moved(spec: Any, shape: Shape, kernel: str) -> int:
    """Every element of the direction's tensors read once and written once."""
    tensors = spec.direction(KERNEL_DIRECTION[kernel]).tensors
    elements = sum(shape.B * shape.S_local * shape.heads(t.heads) * shape.D for t in tensors)
    return 2 * elements * shape.dtype.itemsize


def copy_times(timer: CudaGraphTimer, nbytes: int, sets: int) -> dict[str, float]:
    """A Triton copy of nbytes / 2 bytes (read + write = nbytes) in each of the copy kernel's shapes
    (`layoutgen.tuning.copy_kernel.CONFIGS`, "elements x warps"): a source per set, one destination (as the
    kernels and the torch paths write one output whatever set they read)."""
    count = nbytes // 2 // 4
    sources = [torch.ones(count, dtype=torch.int32, device="cuda") for _ in range(sets)]
    destination = torch.empty(count, dtype=torch.int32, device="cuda")
    times = {}
    for block, warps in COPY_CONFIGS:
        grid = (triton.cdiv(count, block),)

        def run(i: int, block: int = block, warps: int = warps, grid: tuple[int] = grid) -> None:
            copy_kernel[grid](sources[i], destination, count, BLOCK=block, num_warps=warps)

        times[f"{block}x{warps}"] = timer.time(run, sets, 10.0).median_us
    return times


def copy_floor(timer: CudaGraphTimer, nbytes: int, sets: int) -> float:
    """The fastest of `copy_times`.  One shape is not the floor: at 96 MiB 4096 x 8 warps took 27.2-27.5 µs
    and 1024 x 4 25.7-25.9, and torch.compile ran faster than the first."""
    return min(copy_times(timer, nbytes, sets).values())


def config_source() -> str:
    """Where `config=None` looks first: this device's tuning database, if there is one (else the defaults)."""
    from layoutgen.runtime.configs import database_dirs

    name = device_file_name(torch.cuda.get_device_name())
    found = [str(directory / name) for directory in database_dirs() if (directory / name).is_file()]
    return found[0] if found else "heuristic default"


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    timer = CudaGraphTimer()
    l2 = device_l2_bytes(torch.device("cuda"))
    rows = []
    for spec_name in args.spec or SPECS:
        module = layoutgen.load(spec_name)
        for point in grid_points(args.quick, args.small):
            shape = shape_for(module.SPEC, point)
            if not holds(module.SPEC, shape):
                continue
            for kernel in KERNELS:
                sets = rotating_sets(bytes_moved(module.SPEC, shape, kernel), l2)
                case = Case(module, shape, kernel, sets)
                estimated = case.bytes_moved / 3.0e6
                row: dict[str, Any] = {"spec": spec_name, "kernel": kernel, "N": shape.N, "S_local": shape.S_local,
                                       "B": shape.B, "H": shape.H, "H_kv": shape.H_kv, "D": shape.D,
                                       "bytes": case.bytes_moved, "sets": sets, "view": case.viewable()}  # fmt: skip
                for variant, launch in (
                    ("ours", case.ours()),
                    ("torch", case.naive(False)),
                    ("compiled", case.naive(True)),
                ):
                    case.check(variant, launch)
                    row[f"{variant}_us"] = timer.time(launch, sets, estimated).median_us
                row["copy_us"] = copy_floor(timer, case.bytes_moved, sets)
                row["ours_tbps"] = case.bytes_moved / (row["ours_us"] * 1e-6) / 1e12
                rows.append(row)
                print(json.dumps(row), flush=True)
                del case
                torch.cuda.empty_cache()
    return rows


def markdown(result: dict[str, Any], small: bool = False) -> str:
    """The table of one run (`result` as main writes it to JSON: the rows and where they were measured)."""
    rows = result["rows"]
    lines = [
        f"# Ulysses kernels on {result['device']}",
        "",
        f"{result['measured_at']}; torch {result['torch']}, triton {result['triton']}, layoutgen "
        f"{result['layoutgen']}; configs: {result['configs']}.",
        "",
        "CUDA-graph replay medians (µs); torch = the engines' permute/.contiguous() path (the baseline), compiled = "
        "its torch.compile, copy = a Triton copy of the same bytes. Inputs rotate over sets by the tuner's rule; "
        "every variant writes one output whatever set it reads (one set of send buffers for our scatters, as "
        "serving reuses one static set every layer).",
        "",
        "| spec | kernel | N | S_local | H | H_kv | D | ours | torch | compiled | copy | torch/ours | copy/ours | TB/s | view |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['spec']} | {r['kernel']} | {r['N']} | {r['S_local']} | {r['H']} | {r['H_kv']} | {r['D']} | "
            f"{r['ours_us']:.1f} | {r['torch_us']:.1f} | {r['compiled_us']:.1f} | {r['copy_us']:.1f} | "
            f"{r['torch_us'] / r['ours_us']:.2f}x | {r['copy_us'] / r['ours_us']:.2f} | {r['ours_tbps']:.2f} | "
            f"{'view' if r['view'] else ''} |"
        )
    copies = [r for r in rows if not r["view"]]  # steps that must move bytes
    if copies:
        speedups = [r["torch_us"] / r["ours_us"] for r in copies]
        compiled = [r["compiled_us"] / r["ours_us"] for r in copies]
        floors = [r["copy_us"] / r["ours_us"] for r in copies]
        lines += ["", f"Geomean over the steps that must copy (no `view`): torch/ours {math.exp(statistics.fmean(map(math.log, speedups))):.2f}x, "
                  f"compiled/ours {math.exp(statistics.fmean(map(math.log, compiled))):.2f}x, "
                  f"copy/ours {math.exp(statistics.fmean(map(math.log, floors))):.2f}."]  # fmt: skip
        if small:
            slowest = max(copies, key=lambda r: r["ours_us"])
            above = max(r["ours_us"] - min(r["torch_us"], r["compiled_us"]) for r in copies)
            lines += ["", f"Small sizes (every tensor <= 256 KiB): ours at most {slowest['ours_us']:.2f} µs "
                      f"({slowest['spec']} {slowest['kernel']}), at most {above:+.2f} µs against the faster of "
                      f"torch and compiled."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--quick", action="store_true", help="two shapes per spec")
    parser.add_argument("--spec", action="append", help="a bundled ulysses spec (repeatable; default: all)")
    parser.add_argument("--small", action="store_true", help="the small-size points only (ulysses_small_*)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    rows = measure(args)
    device = torch.cuda.get_device_name()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = ("ulysses_small_" if args.small else "ulysses_") + device_file_name(device).removesuffix(".json")
    result = {
        "device": device,
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "layoutgen": layoutgen.__version__,
        "python": platform.python_version(),
        "configs": config_source(),
        "rows": rows,
    }
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(result, args.small))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
