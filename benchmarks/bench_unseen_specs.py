"""GPU benchmark: random valid specs nobody tuned, each kernel's share of the copy ceiling.

The project promises that any valid spec is fast, not only exact.  This draws a seeded sample of specs from
the schema (DCP: payload and stats axis orders, both stats placements and forms, slots, row alignment, wire
dtypes input / float32 / fp8 with their scale blocks, both transports; Ulysses: local, wire and attention axis
orders, a batch axis or none, one tensor, a buffer per tensor or one shared buffer, GQA head counts, both
transports), validates each with `layoutgen.spec.parse_spec`, renders it with the codegen into a temporary
folder and imports it.  Every kernel of every spec is then

* checked against its family's torch reference: pack, scatter, gather, scatter_out and gather_out byte for
  byte (into canary-filled buffers), combine within `layoutgen.dcp.tolerances`;
* timed with the family's default config (`FAMILY.default_config`: no tuning database) as CUDA-graph replay
  medians, inputs rotated by the tuner's rule (`rotating_sets`), as `bench_dcp_v2.py` and `bench_ulysses.py`
  time;
* set against a plain copy of the same number of bytes (`bench_ulysses.copy_floor`: the fastest Triton copy,
  same rotation): % of copy = copy µs / kernel µs.  Bytes are `FAMILY.bytes_moved`.

One large point per family, so that every kernel moves tens of MiB or more (DRAM-bound, where the claim is
made): DCP N 8, B 1024, H 128, D 512 (bf16 `out`); Ulysses N 4, S_local 4096, H 32 (H_kv 8 for GQA tensors),
D 128, bf16, B 1.  Transposing layouts are marked: DCP, a payload whose innermost axis is not `dim` (batch or
head innermost, e.g. sglang's NPU rows `[peer, head, dim, batch]`); Ulysses, a kernel whose source and
destination axis orders differ beyond the peer split.  Results: `<out>/bench_unseen_specs_<device>.json`
(every spec and row) and `.md` (the table), both rewritten after every spec.  A kernel that fails its check is
reported as such, never timed, and makes the exit status 1.

Usage (GPU): python benchmarks/bench_unseen_specs.py --out benchmarks/results [--dcp 12] [--ulysses 8] [--seed 0]
             [--family dcp|ulysses [--keep EARLIER.json]]   (time one family; --keep: the other's rows from an
             earlier run of the same draw, so the files hold the whole sample)
             python benchmarks/bench_unseen_specs.py --interpret --out DIR   (CPU smoke run: tiny shapes, 2 specs
             each, wall-clock times that claim nothing)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from bench_dcp_v2 import Bench, _filled, _pct, _same, environment

from layoutgen.dcp.spec import PAYLOAD_AXES, SCALE_AXES, STATS_AXES
from layoutgen.spec import SpecError, parse_spec
from layoutgen.ulysses.spec import TENSOR_AXES

DCP_KERNELS = ("pack", "combine")
ULYSSES_KERNELS = ("scatter", "gather", "scatter_out", "gather_out")
#: One large point per family (tens of MiB per kernel: DRAM-bound), and the interpreter's tiny one.  The tiny
#: D is 128 so that every fp8 scale block the sampler draws divides it.
DCP_POINT = {"N": 8, "B": 1024, "H": 128, "D": 512}
DCP_TINY = {"N": 2, "B": 3, "H": 4, "D": 128}
ULYSSES_POINT = {"N": 4, "S_local": 4096, "H": 32, "H_kv": 8, "D": 128}
ULYSSES_TINY = {"N": 2, "S_local": 3, "H": 4, "H_kv": 2, "D": 8}
DTYPE = torch.bfloat16

TRANSPORTS = ("all_to_all_single", "external")
DCP_WIRE_DTYPES = ("input", "float32", "float8_e4m3fn", "float8_e5m2")
SCALE_BLOCKS = (None, 16, 32, 64, 128)
ALIGNS = (None, 4, 16, 64, 256)
#: The innermost payload axis decides how a pack stores (dim: whole rows; batch or head: a transpose).  Peer
#: goes anywhere outside it, so that every kind is open to both transports (all_to_all_single: outermost).
INNER_PAYLOAD_AXES = ("dim", "batch", "head")
TO_ATTENTION_NAMES = ("q", "k", "v")
FROM_ATTENTION_NAMES = ("out", "res")
#: Ulysses groupings of the to_attention tensors: (buffers, whether some tensors have H_kv heads).
ULYSSES_GROUPINGS = (
    ("one tensor", False),
    ("per tensor", False),
    ("per tensor", True),
    ("shared", False),
    ("shared", True),
)
ATTEMPTS = 100


# ----------------------------------------------------------------------------------------------------------
# The sampler: seeded, stratified so every kind of layout appears, each draw validated by parse_spec
# ----------------------------------------------------------------------------------------------------------


def dcp_kinds(placement: str) -> list[tuple[str, str, str]]:
    """(placement, wire dtype, innermost payload axis) that the schema allows: a row tail of `input` or fp8
    elements follows the row's D elements, so those need dim innermost."""
    return [
        (placement, dtype, inner)
        for dtype in DCP_WIRE_DTYPES
        for inner in INNER_PAYLOAD_AXES
        if placement == "separate" or dtype == "float32" or inner == "dim"
    ]


def _axes_with_peer(rng: random.Random, axes: tuple[str, ...], transport: str, last: str | None = None) -> list[str]:
    """A random order of `axes`, `last` innermost when given, peer outermost where all_to_all_single needs it."""
    others = [axis for axis in axes if axis != last and axis != "peer"]
    rng.shuffle(others)
    position = 0 if transport == "all_to_all_single" else rng.randint(0, len(others))
    others.insert(position, "peer")
    return others + ([last] if last else [])


def draw_dcp(rng: random.Random, kind: tuple[str, str, str], name: str) -> dict[str, Any]:
    """A DCP spec of one kind; every other field (transport, the other axes, form, slots, alignment, fp8 scale
    block and scale axes) drawn among the values the schema allows with it."""
    placement, dtype, inner = kind
    transport = rng.choice(TRANSPORTS)
    payload: dict[str, Any] = {"axes": _axes_with_peer(rng, PAYLOAD_AXES, transport, inner), "dtype": dtype}
    fp8 = dtype.startswith("float8")
    if fp8 and (block := rng.choice(SCALE_BLOCKS)) is not None:
        payload["scale_block"] = block
    stats: dict[str, Any] = {"placement": placement}
    max_sum = rng.random() < 0.5
    if max_sum:
        stats["form"] = "max_sum"
    data: dict[str, Any] = {"name": name, "summary": "drawn by bench_unseen_specs.py", "transport": transport}
    if placement == "row_tail":
        if (align := rng.choice(ALIGNS)) is not None:
            data["align_bytes"] = align
    else:
        stats["axes"] = _axes_with_peer(rng, STATS_AXES, transport)
        slots = rng.randint(2 if max_sum else 1, 4)
        stats["slots"] = slots
        if max_sum:
            stats["max_slot"], stats["sum_slot"] = rng.sample(range(slots), 2)
        else:
            stats["slot"] = rng.randrange(slots)
        if fp8 and rng.random() < 0.5:
            payload["scale_axes"] = _axes_with_peer(rng, SCALE_AXES, transport)
    return {**data, "payload": payload, "stats": stats}


def _ulysses_direction(
    rng: random.Random, transport: str, base: list[str], tensors: list[dict[str, str]], shared: bool, dim_last: bool
) -> dict[str, Any]:
    wire = _axes_with_peer(rng, (*base, "peer"), transport, "dim" if dim_last else None)
    if shared:
        low = 1 if transport == "all_to_all_single" else 0
        high = wire.index("dim") if dim_last else len(wire)
        if len({t["heads"] for t in tensors}) > 1:  # different head counts need `head` inside `tensor`
            high = min(high, wire.index("head"))
        wire.insert(rng.randint(low, high), "tensor")
    return {"tensors": tensors, "wire": wire}


def _order(rng: random.Random, base: list[str], dim_last: bool) -> list[str]:
    others = [axis for axis in base if axis != "dim" or not dim_last]
    return rng.sample(others, len(others)) + (["dim"] if dim_last else [])


def draw_ulysses(rng: random.Random, grouping: tuple[str, bool], dim_last: bool, name: str) -> dict[str, Any]:
    """A Ulysses spec of one to_attention grouping; `dim_last`: D contiguous in every layout (what engines
    write, their transposes moving whole rows), else any order at all."""
    buffers, gqa = grouping
    transport = rng.choice(TRANSPORTS)
    base = [axis for axis in TENSOR_AXES if axis != "batch" or rng.random() < 0.5]
    count = 1 if buffers == "one tensor" else rng.randint(2, 3)
    to_tensors = [{"name": n, "heads": "H_kv" if gqa and i else "H"} for i, n in enumerate(TO_ATTENTION_NAMES[:count])]
    from_count = rng.choice((1, 1, 2))
    from_tensors = [
        {"name": n, "heads": rng.choice(("H", "H_kv")) if i else "H"}
        for i, n in enumerate(FROM_ATTENTION_NAMES[:from_count])
    ]
    from_shared = from_count > 1 and rng.random() < 0.5
    return {
        "family": "ulysses",
        "name": name,
        "summary": "drawn by bench_unseen_specs.py",
        "transport": transport,
        "local": _order(rng, base, dim_last),
        "attention": _order(rng, base, dim_last),
        "to_attention": _ulysses_direction(rng, transport, base, to_tensors, buffers == "shared", dim_last),
        "from_attention": _ulysses_direction(rng, transport, base, from_tensors, from_shared, dim_last),
    }


def _valid(draw: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], Any]:
    """The first draw that parse_spec accepts, with its parsed spec (the draws are valid by construction;
    this holds them to the schema's own rules)."""
    for _ in range(ATTEMPTS):
        data = draw()
        try:
            return data, parse_spec(data, source=data["name"])
        except SpecError:
            continue
    raise RuntimeError(f"no valid spec in {ATTEMPTS} draws")


def _walk(rng: random.Random, kinds: list[Any]) -> Iterator[Any]:
    """The kinds in a seeded order, again and again (each pass in a new order)."""
    while True:
        yield from rng.sample(kinds, len(kinds))


def sample_specs(dcp: int, ulysses: int, seed: int) -> list[tuple[dict[str, Any], Any]]:
    """`dcp` DCP and `ulysses` Ulysses specs (data, parsed spec), seeded.

    DCP alternates the placements, each walking a seeded order of its (wire dtype, innermost payload axis)
    kinds, so that 12 specs hold every row-tail kind (sglang's NPU rows among them) and half the separate
    ones.  Ulysses walks the tensor groupings likewise, every other spec with D innermost everywhere."""
    rng = random.Random(seed)
    placements = {placement: _walk(rng, dcp_kinds(placement)) for placement in ("row_tail", "separate")}
    specs = []
    for index in range(dcp):
        kind = next(placements["row_tail" if index % 2 == 0 else "separate"])
        specs.append(_valid(lambda kind=kind, index=index: draw_dcp(rng, kind, f"unseen_dcp_{index:02d}")))
    groupings = _walk(rng, list(ULYSSES_GROUPINGS))
    for index in range(ulysses):
        grouping, dim_last, name = next(groupings), index % 2 == 0, f"unseen_ulysses_{index:02d}"
        specs.append(_valid(lambda g=grouping, d=dim_last, n=name: draw_ulysses(rng, g, d, n)))
    return specs


# ----------------------------------------------------------------------------------------------------------
# Layouts in words
# ----------------------------------------------------------------------------------------------------------


def _axes(axes: Any) -> str:
    return "[" + ", ".join(axes) + "]"


def dcp_transposing(spec: Any) -> bool:
    """The payload's rows are not whole: its innermost axis is batch or head, not `out`'s contiguous dim."""
    return bool(spec.payload.axes[-1] != "dim")


def dcp_layout(spec: Any) -> str:
    payload = f"payload {_axes(spec.payload.axes)} {spec.payload.dtype.value}"
    if spec.fp8:
        payload += f" block {spec.payload.scale_block or 'D'}"
        if spec.payload.scale_axes:
            payload += f" scales {_axes(spec.payload.scale_axes)}"
    stats, form = spec.stats, spec.stats.stats_form.value
    if spec.row_tail:
        words = f"row_tail {form} align {spec.align_bytes}"
    else:
        slot = f"max {stats.max_slot} sum {stats.sum_slot}" if spec.max_sum else f"slot {stats.slot}"
        words = f"separate {_axes(stats.axes)} {form} slots {stats.slots} {slot}"
    return f"{payload}; stats {words}; {spec.transport.value}"


def _grouping(direction: Any) -> str:
    tensors = " ".join(f"{t.name}:{t.heads.value}" for t in direction.tensors)
    return f"{tensors} wire {_axes(direction.wire)}"


def ulysses_layout(spec: Any) -> str:
    return (
        f"local {_axes(spec.local)}; to {_grouping(spec.to_attention)}; attention {_axes(spec.attention)}; "
        f"from {_grouping(spec.from_attention)}; {spec.transport.value}"
    )


def ulysses_orders(spec: Any, kernel: str) -> tuple[list[str], list[str]]:
    """A kernel's source and destination axis orders: a user side with its split axis preceded by `peer`
    (`layoutgen.ulysses.layout.tile_axes`' rule), a wire without its `tensor` axis."""
    from layoutgen.ulysses.layout import KERNEL_DIRECTION, KERNEL_SIDES, SPLIT_AXIS

    def order(side: str) -> list[str]:
        if side == "wire":
            return [a for a in spec.direction(KERNEL_DIRECTION[kernel]).wire if a != "tensor"]
        axes: list[str] = []
        for axis in spec.local if side == "local" else spec.attention:
            axes += ["peer", axis] if axis == SPLIT_AXIS[side] else [axis]
        return axes

    source, destination = KERNEL_SIDES[kernel]
    return order(source), order(destination)


def ulysses_transposing(source: list[str], destination: list[str]) -> bool:
    """Whether the axes other than peer come in another order (only moving peer is a block copy)."""
    return [a for a in source if a != "peer"] != [a for a in destination if a != "peer"]


# ----------------------------------------------------------------------------------------------------------
# Measurement
# ----------------------------------------------------------------------------------------------------------


class CopyCeiling:
    """A plain copy of a kernel's bytes, with its rotation, cached by (bytes, sets): on a GPU the fastest of
    the Triton copy kernel's shapes (`bench_ulysses.copy_floor`), under the interpreter torch's copy_."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.times: dict[tuple[int, int], float] = {}

    def us(self, nbytes: int, sets: int) -> float:
        key = (nbytes, sets)
        if key not in self.times:
            if self.bench.interpret:
                sources = [torch.ones(nbytes // 2, dtype=torch.uint8) for _ in range(sets)]
                destination = torch.empty_like(sources[0])
                timing = self.bench.timer.time(lambda i: destination.copy_(sources[i]), sets, 1.0)
                self.times[key] = timing.median_us
            else:
                from bench_ulysses import copy_floor

                self.times[key] = copy_floor(self.bench.timer, nbytes, sets)
        return self.times[key]


def timed(bench: Bench, ceiling: CopyCeiling, run: Callable[[int], Any], sets: int, nbytes: int) -> dict[str, Any]:
    timing = bench.time(run, sets, nbytes)
    copy_us = ceiling.us(nbytes, sets)
    return {"us": timing["us"], "tbps": timing["tbps"], "copy_us": copy_us, "of_copy": copy_us / timing["us"]}


def dcp_kernel(
    bench: Bench, ceiling: CopyCeiling, module: Any, kernel: str, point: dict[str, int], config: Any = None
) -> dict[str, Any]:
    """One DCP kernel at `point`, checked against `layoutgen.dcp.reference`, timed with `config` (by default
    the family's default config)."""
    from layoutgen.dcp import reference
    from layoutgen.dcp.tolerances import combine_error

    N, B, H, D = point["N"], point["B"], point["H"], point["D"]
    device = bench.device
    if config is None:
        config, _ = bench.config(module, kernel, N, H, D, B)  # no database given: the family's default
    nbytes = bench.bytes_moved(module, kernel, N, H, D, B)
    sets = bench.sets(nbytes)
    outs = [torch.randn(B, H, D, dtype=DTYPE, device=device) for _ in range(sets)]
    lses = [torch.randn(B, H, device=device) * 4 for _ in range(sets)]
    bufs = [_filled(module.alloc(N, B, H, D, DTYPE, device)) for _ in range(sets)]
    if kernel == "pack":
        expected = _filled(module.alloc(N, B, H, D, DTYPE, device))
        reference.pack(outs[0], lses[0], expected)
        module.pack(outs[0], lses[0], bufs[0], config=config)
        if not _same(bufs[0], expected):
            raise AssertionError("pack differs from the reference")

        def run(i: int) -> None:
            module.pack(outs[i], lses[i], bufs[i], config=config)

    else:
        for out, lse, buffer in zip(outs, lses, bufs, strict=True):
            reference.pack(out, lse, buffer)
        result = torch.empty(B, H // N, D, dtype=DTYPE, device=device)
        module.combine(bufs[0], B, out=result, config=config)
        want, _ = reference.combine(bufs[0], B)
        error = combine_error(result.cpu(), want.cpu(), float(outs[0].abs().max()))
        if error > 1:
            raise AssertionError(f"combine outside the tolerance ({error:.2f} of it)")

        def run(i: int) -> None:
            module.combine(bufs[i], B, out=result, config=config)

    return {"bytes": nbytes, "sets": sets, "config": config.as_dict(), **timed(bench, ceiling, run, sets, nbytes)}


def _same_tensor(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and torch.equal(
        got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)
    )


def ulysses_kernel(
    bench: Bench, ceiling: CopyCeiling, module: Any, kernel: str, point: dict[str, int], config: Any = None
) -> dict[str, Any]:
    """One Ulysses kernel at `point`, byte-exact against `layoutgen.ulysses.reference`, timed with `config`
    (default: the family's default config).  As `bench_ulysses.py` times: only the inputs rotate; a scatter
    writes one set of send buffers (serving reuses one static set every layer), a gather new tensors from the
    graph's pool."""
    from layoutgen.tuning.problem import Problem
    from layoutgen.ulysses import FAMILY, reference
    from layoutgen.ulysses.layout import (
        DTYPE_NAMES,
        KERNEL_DIRECTION,
        KERNEL_SIDES,
        Shape,
        UlyssesBuffers,
        key_extents,
        tensor_shape,
    )
    from layoutgen.ulysses.spec import HeadCount

    spec, device = module.SPEC, bench.device
    kv = point["H_kv"] if spec.uses(HeadCount.H_KV) else point["H"]
    shape = Shape(N=point["N"], S_local=point["S_local"], H=point["H"], H_kv=kv, D=point["D"], dtype=DTYPE)
    problem = Problem(spec, kernel, tuple(key_extents(spec, kernel, shape).items()), DTYPE_NAMES[DTYPE])
    if config is None:
        config = FAMILY.default_config(problem, shape.S_local)
    nbytes = FAMILY.bytes_moved(problem, shape.S_local)
    sets = bench.sets(nbytes)
    direction = KERNEL_DIRECTION[kernel]
    tensors = spec.direction(direction).tensors
    function = getattr(module, kernel)
    generators = [torch.Generator(device).manual_seed(index) for index in range(sets)]

    def buffers() -> UlyssesBuffers:
        return UlyssesBuffers.allocate(spec, direction, shape, device)

    if kernel.startswith("scatter"):
        side = KERNEL_SIDES[kernel][0]
        inputs = [
            [torch.randn(tensor_shape(spec, shape, t, side), device=device, generator=g).to(DTYPE) for t in tensors]
            for g in generators
        ]
        send, expected = _filled(buffers()), _filled(buffers())
        (reference.scatter if kernel == "scatter" else reference.scatter_out)(
            {t.name: tensor for t, tensor in zip(tensors, inputs[0], strict=True)}, expected
        )
        function(*inputs[0], send, config=config)
        if not _same(send, expected):
            raise AssertionError(f"{kernel} differs from the reference")

        def run(i: int) -> None:
            function(*inputs[i], send, config=config)

    else:
        received = [buffers() for _ in generators]
        for bufs, g in zip(received, generators, strict=True):
            for tensor in bufs.tensors.values():
                tensor.copy_(torch.randn(tensor.shape, device=device, generator=g))
        want = (reference.gather if kernel == "gather" else reference.gather_out)(received[0])
        got = function(received[0], config=config)
        got = got if isinstance(got, tuple) else (got,)
        if not all(_same_tensor(g, want[t.name]) for t, g in zip(tensors, got, strict=True)):
            raise AssertionError(f"{kernel} differs from the reference")

        def run(i: int) -> None:
            function(received[i], config=config)

    return {"bytes": nbytes, "sets": sets, "config": config.as_dict(), **timed(bench, ceiling, run, sets, nbytes)}


def render(spec: Any, directory: Path) -> Any:
    """The spec's module, rendered by the codegen into `directory` and imported from there."""
    from layoutgen import codegen
    from layoutgen.loader import load_path

    path = directory / f"{spec.name}.py"
    codegen.write_if_changed(path, codegen.render(spec, f"{spec.name}.yaml"))
    return load_path(path)


def measure_spec(
    bench: Bench,
    ceiling: CopyCeiling,
    index: int,
    data: dict[str, Any],
    spec: Any,
    directory: Path,
    points: dict[str, dict[str, int]],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One spec's entry and its rows, one per kernel; a kernel that fails (to build, or its check) gets an
    `error` row instead of times."""
    family = spec.family
    dcp = family == "dcp"
    entry: dict[str, Any] = {"index": index, "family": family, "name": spec.name, "data": data}
    entry["layout"] = dcp_layout(spec) if dcp else ulysses_layout(spec)
    if dcp:
        entry["transposing"] = dcp_transposing(spec)
    print(f"[{index}] {family} {spec.name}: {entry['layout']}", flush=True)
    rows = []
    try:
        module = render(spec, directory)
    except Exception as error:  # a spec that parses must build: report it, go on with the next one
        module, entry["error"] = None, f"render: {type(error).__name__}: {error}"
    for kernel in DCP_KERNELS if dcp else ULYSSES_KERNELS:
        row: dict[str, Any] = {"spec": index, "family": family, "kernel": kernel}
        if dcp:  # `out` has dim innermost: a DCP transpose is one of the innermost axis
            row.update(transposing=entry["transposing"], innermost_moves=entry["transposing"])
        else:
            source, destination = ulysses_orders(spec, kernel)
            row.update(source=source, destination=destination, transposing=ulysses_transposing(source, destination))
            row["innermost_moves"] = source[-1] != destination[-1]
        try:
            if module is None:
                raise RuntimeError(entry["error"])
            row.update((dcp_kernel if dcp else ulysses_kernel)(bench, ceiling, module, kernel, points[family]))
            print(
                f"[{index}] {kernel}: {row['us']:.2f} µs, {row['tbps']:.2f} TB/s, {_pct(row['of_copy'])} of copy "
                f"({row['copy_us']:.2f} µs){' transposing' if row['transposing'] else ''}",
                flush=True,
            )
        except Exception as error:  # reported in the results and the exit status, never timed
            row["error"] = f"{type(error).__name__}: {error}"
            print(f"[{index}] {kernel}: FAILED {row['error']}", flush=True)
            traceback.print_exc()
        rows.append(row)
        if not bench.interpret:
            torch.cuda.empty_cache()
    return entry, rows


# ----------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------


def _point(point: dict[str, int]) -> str:
    return ", ".join(f"{name} {value}" for name, value in point.items())


#: The groups of a summary line.  A Ulysses transpose that keeps the innermost axis moves whole rows (of D
#: elements, say); one that moves it reads or writes strided elements, which is where the slow kernels are.
GROUPS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "all": lambda row: True,
    "transposing": lambda row: bool(row["transposing"]),
    "innermost axis moves": lambda row: bool(row["innermost_moves"]),
}


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per family and kernel: min and median % of copy over the specs, and over each group of them (DCP's
    transposes are all of the innermost axis: no third group there)."""
    lines = []
    for family, kernels in (("dcp", DCP_KERNELS), ("ulysses", ULYSSES_KERNELS)):
        labels = ["all", "transposing"] + (["innermost axis moves"] if family == "ulysses" else [])
        for kernel in kernels:
            timed_rows = [r for r in rows if r["family"] == family and r["kernel"] == kernel and "of_copy" in r]
            if not timed_rows:
                continue
            line: dict[str, Any] = {"family": family, "kernel": kernel}
            for label in labels:
                group = [r for r in timed_rows if GROUPS[label](r)]
                if group:
                    worst = min(group, key=lambda r: r["of_copy"])
                    line[label] = {
                        "specs": len(group),
                        "min": worst["of_copy"],
                        "min_spec": worst["spec"],
                        "median": statistics.median(r["of_copy"] for r in group),
                    }
            lines.append(line)
    return lines


def markdown(results: dict[str, Any]) -> str:
    env = results["environment"]
    interpret = results["interpret"]
    shapes = results["shapes"]
    lines = [
        f"# Random valid specs nobody tuned: share of the copy ceiling on {env.get('device', 'the CPU interpreter')}",
        "",
        f"{env['date']}; torch {env['torch']}, triton {env['triton']}, layoutgen {env['layoutgen']}; seed "
        f"{results['seed']}: {results['counts']['dcp']} DCP specs at {_point(shapes['dcp'])} (bf16 `out`), "
        f"{results['counts']['ulysses']} Ulysses specs at {_point(shapes['ulysses'])} (H_kv for GQA tensors; "
        "bf16, B 1)."
        + (f" Only the {results['family']} specs of this draw timed." if results.get("family") else "")
        + (
            f" The {results['kept']['family']} rows are kept from this draw's run of {results['kept']['date']}."
            if results.get("kept")
            else ""
        ),
        "",
        "Each spec drawn from the schema, validated, rendered with the codegen into a temporary folder; every kernel "
        "checked against the family's torch reference first (byte for byte; combine within the tolerance), then "
        "timed with the family's default config (no tuning database: untuned) as "
        + (
            "wall-clock medians under the Triton interpreter: a smoke run, the times claim nothing. "
            if interpret
            else "CUDA-graph replay medians, inputs rotated by the tuner's rule. "
        )
        + "copy = a plain copy of the same bytes with the same rotation ("
        + ("torch's copy_ under the interpreter" if interpret else "the fastest Triton copy shape")
        + "); % of copy = copy µs / kernel µs"
        + (
            f" (for scale: a 1 GiB copy moves {results['copy_tbps_1gib']:.2f} TB/s)"
            if results["copy_tbps_1gib"]
            else ""
        )
        + ". Transposing: DCP, the payload's innermost axis is not dim (batch or head); Ulysses, the kernel's source "
        "and destination axis orders differ beyond the peer split (the column gives both).",
        "",
        "| # | layout | kernel | µs | TB/s | copy µs | % of copy | transposing |",
        "|---|---|---|---|---|---|---|---|",
    ]
    layouts = {entry["index"]: entry["layout"] for entry in results["specs"]}
    shown: set[int] = set()
    for row in results["rows"]:
        if row["family"] == "ulysses":
            transposing = f"{_axes(row['source'])} → {_axes(row['destination'])}" if row["transposing"] else ""
        else:
            transposing = "yes" if row["transposing"] else ""
        times = (
            f"FAILED: {row['error'].splitlines()[0].replace('|', '/')} | | | |"
            if "error" in row
            else f"{row['us']:.2f} | {row['tbps']:.2f} | {row['copy_us']:.2f} | {_pct(row['of_copy'])} |"
        )
        layout = "" if row["spec"] in shown else layouts[row["spec"]]  # once per spec: the rows below are its kernels
        shown.add(row["spec"])
        lines.append(f"| {row['spec']} | {layout} | {row['kernel']} | {times} {transposing} |")
    lines += ["", "Summary (% of copy over the sample):", ""]
    for line in results["summary"]:
        text = f"* {line['family']} {line['kernel']}:"
        for label in GROUPS:
            if label in line:
                part = line[label]
                text += (
                    f" {label} ({part['specs']}) min {_pct(part['min'])} (#{part['min_spec']}), "
                    f"median {_pct(part['median'])};"
                )
        lines.append(text.rstrip(";"))
    failed = [row for row in results["rows"] if "error" in row]
    if failed:
        lines += ["", f"{len(failed)} kernel(s) failed their check or build; see the table and the JSON."]
    return "\n".join(lines) + "\n"


def keep_rows(results: dict[str, Any], earlier: dict[str, Any], source: str) -> None:
    """Add to a one-family run (`--family`) the other family's specs and rows from an earlier run of the same
    draw, so that the files hold the whole sample; the report names where they came from."""
    timed = results["family"]
    if timed is None:
        raise ValueError("--keep needs --family: a run of both families keeps nothing")
    for field in ("seed", "counts", "shapes", "interpret"):
        if earlier.get(field) != results[field]:
            raise ValueError(f"--keep {source}: its {field} is {earlier.get(field)!r}, this run's {results[field]!r}")
    kept = [spec for spec in earlier["specs"] if spec["family"] != timed]
    results["specs"] = sorted(results["specs"] + kept, key=lambda spec: spec["index"])
    results["rows"] = sorted(
        results["rows"] + [row for row in earlier["rows"] if row["family"] != timed], key=lambda row: row["spec"]
    )
    results["summary"] = summary(results["rows"])
    family = "ulysses" if timed == "dcp" else "dcp"
    # Rows the earlier run itself kept carry the date they were timed, not the earlier run's.
    carried = earlier.get("kept") or {}
    date = carried["date"] if carried.get("family") == family else earlier["environment"]["date"]
    results["kept"] = {"family": family, "date": date}


def write(out: Path, results: dict[str, Any]) -> None:
    device = results["environment"].get("device", "cpu-interpreter").replace(" ", "_")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"bench_unseen_specs_{device}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / f"bench_unseen_specs_{device}.md").write_text(markdown(results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dcp", type=int, help="DCP specs to draw (default 12; 2 with --interpret)")
    parser.add_argument("--ulysses", type=int, help="Ulysses specs to draw (default 8; 2 with --interpret)")
    parser.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    parser.add_argument("--out", type=Path, help="write bench_unseen_specs_<device>.{json,md} here")
    parser.add_argument(
        "--family",
        choices=("dcp", "ulysses"),
        help="time only this family's specs of the same draw (the indices and specs stay those of the whole sample)",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        help="with --family: the other family's rows from this earlier results JSON of the same draw",
    )
    parser.add_argument("--interpret", action="store_true", help="CPU smoke run under the Triton interpreter")
    args = parser.parse_args(argv)
    if args.keep is not None and args.family is None:
        parser.error("--keep needs --family (the family this run times)")
    counts = {"dcp": args.dcp, "ulysses": args.ulysses}
    for family, default in (("dcp", 12), ("ulysses", 8)):
        if counts[family] is None:
            counts[family] = 2 if args.interpret else default
        elif counts[family] < 0:
            parser.error(f"--{family} must be 0 or more, got {counts[family]}")
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    elif not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (or --interpret for a CPU smoke run)")
    points = (
        {"dcp": DCP_TINY, "ulysses": ULYSSES_TINY} if args.interpret else {"dcp": DCP_POINT, "ulysses": ULYSSES_POINT}
    )
    bench = Bench(args.interpret, None)
    ceiling = CopyCeiling(bench)
    results: dict[str, Any] = {
        "environment": environment(),
        "interpret": args.interpret,
        "seed": args.seed,
        "counts": counts,
        "family": args.family,
        "shapes": points,
        "copy_tbps_1gib": bench.copy_tbps,
        "specs": [],
        "rows": [],
        "summary": [],
    }
    with tempfile.TemporaryDirectory(prefix="layoutgen-unseen-") as directory:
        for index, (data, spec) in enumerate(sample_specs(counts["dcp"], counts["ulysses"], args.seed)):
            if args.family is not None and spec.family != args.family:
                continue
            entry, rows = measure_spec(bench, ceiling, index, data, spec, Path(directory), points)
            results["specs"].append(entry)
            results["rows"] += rows
            results["summary"] = summary(results["rows"])
            if args.out is not None:
                write(args.out, results)  # after every spec: an interrupted run keeps what it measured
    if args.keep is not None:
        try:
            keep_rows(results, json.loads(args.keep.read_text(encoding="utf-8")), str(args.keep))
        except (OSError, ValueError, KeyError) as error:
            print(f"--keep {args.keep}: {error}", file=sys.stderr)
            return 2
    if args.out is not None:
        write(args.out, results)  # also when there was no spec to draw
    print(markdown(results), flush=True)
    return 1 if any("error" in row for row in results["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
