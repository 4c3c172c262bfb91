"""How the tuner times a kernel: CUDA-graph replays on a GPU, wall clock under the interpreter.

GPU: `calls` back-to-back launches (cycling over the workload's rotating input
sets) are captured into one CUDA graph; the graph is replayed `repeats` times
between CUDA events, and each replay gives one sample of (replay time / calls).
Host launch overhead is outside the measurement, as it is in a serving loop
that replays graphs.  The result is the median with the 20th and 80th
percentiles as the spread.  A clearly hopeless candidate stops after
`min_repeats` samples.

`time_interleaved` replays several graphs in turn (A, B, A, B, ...) so that a
winner and the default are compared under the same clock and thermal state.

CPU (`--interpret`): the same protocol with `time.perf_counter` around each
launch; the numbers only exercise the pipeline.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from layoutgen.tuning.procedure import (
    GRAPH_TARGET_US,
    INTERLEAVED_REPEATS,
    MAX_CALLS_PER_GRAPH,
    MAX_ROTATING_SETS,
    MIN_REPEATS,
    REPEATS,
    ROTATE_L2_MULTIPLE,
)

Launch = Callable[[int], object]


def device_l2_bytes(device: torch.device | int) -> int:
    """The device's L2 size, which the rotation is sized by (50 MiB where torch does not report it)."""
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20))


def rotating_sets(bytes_per_call: int, l2_bytes: int) -> int:
    """Input sets to rotate over: enough that one pass spans ROTATE_L2_MULTIPLE L2 caches, at most
    MAX_ROTATING_SETS."""
    wanted = -(-ROTATE_L2_MULTIPLE * l2_bytes // max(1, bytes_per_call))
    return max(1, min(MAX_ROTATING_SETS, wanted))


def cache_states(sets: int, bytes_per_call: int, l2_bytes: int, resident_timing: bool) -> tuple[int, ...]:
    """The input-set counts a candidate is timed with: the rotation alone, or for a kernel declared with
    `resident_timing` whose call fits in the L2, one set (L2-resident) first and then the rotation."""
    if resident_timing and sets > 1 and bytes_per_call <= l2_bytes:
        return (1, sets)
    return (sets,)


@dataclass(frozen=True)
class Timing:
    """Per-call microseconds over `samples` samples of `calls` calls each."""

    median_us: float
    p20_us: float
    p80_us: float
    samples: int
    calls: int
    stopped_early: bool = False

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: the relative noise of this measurement."""
        return (self.p80_us - self.p20_us) / self.median_us if self.median_us > 0 else 0.0


def summarize(samples_us: Sequence[float], calls: int, stopped_early: bool = False) -> Timing:
    if not samples_us:
        raise ValueError("no timing samples")
    ordered = sorted(samples_us)

    def percentile(q: float) -> float:
        position = q * (len(ordered) - 1)
        low = int(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    return Timing(statistics.median(ordered), percentile(0.2), percentile(0.8), len(ordered), calls, stopped_early)


def combine_states(timings: Sequence[Timing]) -> Timing:
    """One timing for several cache states: the geometric mean of their medians (and of their p20s and
    p80s), so that a config 10% faster in one state and 10% slower in the other ties."""
    if len(timings) == 1:
        return timings[0]

    def mean(values: Sequence[float]) -> float:
        return statistics.geometric_mean([max(value, 1e-9) for value in values])  # a gate-only timing is 0

    return Timing(
        mean([t.median_us for t in timings]),
        mean([t.p20_us for t in timings]),
        mean([t.p80_us for t in timings]),
        sum(t.samples for t in timings),
        timings[0].calls,
        any(t.stopped_early for t in timings),
    )


def time_states(
    timer: Any, launch: Launch, states: Sequence[int], estimated_us: float, give_up_us: float | None = None
) -> Timing:
    """`timer.time` in every cache state of `states` (`cache_states`), combined by `combine_states`.

    A candidate stops as soon as it cannot beat `give_up_us` any more: the first state (L2-resident, the
    faster one) alone over it, or the two together.  A stopped candidate's timing is what was measured,
    marked `stopped_early`; it only has to rank behind the best."""
    timings: list[Timing] = []
    for index, sets in enumerate(states):
        limit = give_up_us
        if give_up_us is not None and timings:
            limit = give_up_us ** (index + 1) / max(math.prod(t.median_us for t in timings), 1e-9)
        timing = timer.time(launch, sets, estimated_us, limit)
        timings.append(timing)
        if timing.stopped_early:
            break
    return combine_states(timings)


def time_interleaved_states(
    timer: Any, launches: Sequence[Launch], states: Sequence[int], estimated_us: float
) -> list[Timing]:
    """`timer.time_interleaved` in every cache state of `states`, combined per launch by `combine_states`."""
    per_state = [timer.time_interleaved(launches, sets, estimated_us) for sets in states]
    return [combine_states([timings[which] for timings in per_state]) for which in range(len(launches))]


def calls_per_graph(estimated_us: float, sets: int) -> int:
    """Calls to capture: about GRAPH_TARGET_US of work, at least one pass over the rotating sets."""
    calls = max(1, min(MAX_CALLS_PER_GRAPH, round(GRAPH_TARGET_US / max(estimated_us, 0.5))))
    return max(calls, min(sets, MAX_CALLS_PER_GRAPH))


class CudaGraphTimer:
    """Times launches with CUDA-graph replays on the current device."""

    description = "CUDA-graph replays"

    def __init__(self, repeats: int = REPEATS, min_repeats: int = MIN_REPEATS) -> None:
        self.repeats = repeats
        self.min_repeats = min(min_repeats, repeats)
        self._stream: torch.cuda.Stream | None = None

    def _capture(self, launch: Launch, calls: int, sets: int) -> torch.cuda.CUDAGraph:
        # `torch.cuda.graph` would empty the allocator cache before every capture (one per trial), and the
        # next trial's inputs would pay cudaMalloc again: capture directly on a side stream instead.
        launch(0)  # loads the kernel's module outside capture
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                for call in range(calls):
                    launch(call % sets)
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
        return graph

    def time(self, launch: Launch, sets: int, estimated_us: float, give_up_us: float | None = None) -> Timing:
        calls = calls_per_graph(estimated_us, sets)
        graph = self._capture(launch, calls, sets)
        try:
            graph.replay()  # warm: instruction cache, TLB, clocks
            samples: list[float] = []
            batch = self.min_repeats if give_up_us is not None else self.repeats
            stopped_early = False
            while len(samples) < self.repeats:
                samples += self._replay(graph, batch, calls)
                batch = self.repeats - len(samples)
                if give_up_us is not None and len(samples) < self.repeats and statistics.median(samples) > give_up_us:
                    stopped_early = True
                    break
            return summarize(samples, calls, stopped_early)
        finally:
            del graph

    @staticmethod
    def _replay(graph: torch.cuda.CUDAGraph, count: int, calls: int) -> list[float]:
        events = [torch.cuda.Event(enable_timing=True) for _ in range(count + 1)]
        events[0].record()
        for index in range(count):
            graph.replay()
            events[index + 1].record()
        events[-1].synchronize()
        return [events[i].elapsed_time(events[i + 1]) * 1000.0 / calls for i in range(count)]

    def time_interleaved(
        self, launches: Sequence[Launch], sets: int, estimated_us: float, repeats: int = INTERLEAVED_REPEATS
    ) -> list[Timing]:
        """Replays A, B, A, B, ... back to back; one event between consecutive replays."""
        calls = calls_per_graph(estimated_us, sets)
        graphs = [self._capture(launch, calls, sets) for launch in launches]
        try:
            for graph in graphs:
                graph.replay()
            events = [torch.cuda.Event(enable_timing=True) for _ in range(repeats * len(graphs) + 1)]
            events[0].record()
            for index in range(repeats * len(graphs)):
                graphs[index % len(graphs)].replay()
                events[index + 1].record()
            events[-1].synchronize()
            samples: list[list[float]] = [[] for _ in graphs]
            for index in range(repeats * len(graphs)):
                samples[index % len(graphs)].append(events[index].elapsed_time(events[index + 1]) * 1000.0 / calls)
            return [summarize(s, calls) for s in samples]
        finally:
            del graphs


class WallClockTimer:
    """Times launches with the host clock (the interpreter runs kernels synchronously on the CPU)."""

    description = "wall clock (Triton interpreter)"

    def __init__(self, repeats: int = 3) -> None:
        self.repeats = repeats

    def time(self, launch: Launch, sets: int, estimated_us: float, give_up_us: float | None = None) -> Timing:
        launch(0)
        samples = []
        for index in range(self.repeats):
            start = time.perf_counter()
            launch(index % sets)
            samples.append((time.perf_counter() - start) * 1e6)
        return summarize(samples, 1)

    def time_interleaved(
        self, launches: Sequence[Launch], sets: int, estimated_us: float, repeats: int | None = None
    ) -> list[Timing]:
        samples: list[list[float]] = [[] for _ in launches]
        for launch in launches:
            launch(0)
        for index in range(repeats or self.repeats):
            for which, launch in enumerate(launches):
                start = time.perf_counter()
                launch(index % sets)
                samples[which].append((time.perf_counter() - start) * 1e6)
        return [summarize(s, 1) for s in samples]


def copy_bandwidth_tbps(device: torch.device, nbytes: int = 1 << 30, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth in TB/s, counting bytes read plus bytes written (the copy ceiling the
    benchmarks' percentages divide by): the best of torch's `copy_` and a Triton copy kernel over a few block sizes, each one
    large copy per replay of a CUDA graph."""
    best_us = _best_copy_us(
        torch.ones(nbytes // 4, dtype=torch.int32, device=device),
        torch.empty(nbytes // 4, dtype=torch.int32, device=device),
        CudaGraphTimer(repeats=repeats, min_repeats=repeats),
    )
    torch.cuda.empty_cache()
    return 2 * nbytes / (best_us * 1e-6) / 1e12


def _best_copy_us(source: torch.Tensor, destination: torch.Tensor, timer: CudaGraphTimer) -> float:
    import triton

    from layoutgen.tuning.copy_kernel import CONFIGS, copy_kernel

    count = source.numel()

    def triton_copy(block: int, warps: int) -> Launch:
        grid = (triton.cdiv(count, block),)
        return lambda _: copy_kernel[grid](source, destination, count, BLOCK=block, num_warps=warps)

    launches: list[Launch] = [lambda _: destination.copy_(source)]
    launches += [triton_copy(block, warps) for block, warps in CONFIGS]
    best_us = min(timer.time(launch, 1, estimated_us=1e6).median_us for launch in launches)
    if not torch.equal(source, destination):
        raise RuntimeError("the copy-bandwidth kernel did not copy its input")
    return best_us
