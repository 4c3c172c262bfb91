"""What a tuning-database entry was measured under, as declared data, and the hashes derived from it.

An entry is current only while its kernel's search-space declaration and its timing procedure are the
ones it records (`layoutgen.tuning_db.current_problems`).  Both are hashed from content: the space from
the family's `SearchSpace`, the timing from the shared timer's constants below together with the
family's own timing facts for that kernel (`KernelDecl.timing`, e.g. where its outputs go).  Changing
any of them makes the entries it affects stale, with nothing to bump by hand.

Nothing here imports torch.
"""

from __future__ import annotations

from typing import Any

from layoutgen.family import KernelDecl, content_hash

#: Work per captured graph: enough calls that the graph launch (~2-3 µs) is amortised.
GRAPH_TARGET_US = 200.0
MAX_CALLS_PER_GRAPH = 64
#: Samples per candidate (each a replay of ~GRAPH_TARGET_US), cut short for hopeless candidates.  The search
#: only ranks candidates; the winner and the default are re-timed together with INTERLEAVED_REPEATS each.
REPEATS = 30
MIN_REPEATS = 8
#: Interleaved replays per side when the finalists and the default are re-timed together.
INTERLEAVED_REPEATS = 100
#: Timing inputs rotate over several sets until together they span this many L2 caches, so a small problem is
#: not timed from a cache that serving would not have ...
ROTATE_L2_MULTIPLE = 2
#: ... but over at most this many sets: in serving, a kernel reads its input right after the one before wrote
#: it, so a small problem's inputs are still in the L2.  Up to B = 64 at H = 128, eight DCP sets fit in the
#: H200's L2.  With 64 sets (DRAM-cold) the tuner ranked configs for a cache state no caller sees:
#: pynccl_a2a combine N 4 B 8, its winner took 2.30 µs timed over 64 sets and 1.59 over 8, where the best
#: config over 8 sets took 1.31 (benchmarks/results/archive/probe_space_pynccl_a2a_H200.json).  One rule for the tuner and the
#: benchmarks, so a benchmark measures the conditions the tuner ranked under.
MAX_ROTATING_SETS = 8
#: Buffers are sized for the bucket rounded up to this many rows on a GPU (as serving allocates, and one
#: integer specialisation for every bucket).
CAPACITY_ROUNDING = 16

SHARED_TIMING: dict[str, Any] = {
    "method": "CUDA-graph replays between events, median of samples",
    "graph_target_us": GRAPH_TARGET_US,
    "max_calls_per_graph": MAX_CALLS_PER_GRAPH,
    "repeats": REPEATS,
    "min_repeats": MIN_REPEATS,
    "interleaved_repeats": INTERLEAVED_REPEATS,
    "rotate_l2_multiple": ROTATE_L2_MULTIPLE,
    "max_rotating_sets": MAX_ROTATING_SETS,
    "capacity_rounding": CAPACITY_ROUNDING,
}


def space_hash(kernel: KernelDecl) -> str:
    """sha256 of a kernel's search-space declaration and the fields of its config type."""
    return content_hash({"space": kernel.space.declaration(), "config": kernel.config_type.field_names()})


#: The second cache state of a kernel declared with `resident_timing` (`layoutgen.tuning.timing.time_states`).
RESIDENT_RULE = "also one input set where one call's bytes fit in the L2; ranked by the geometric mean of both"


def timing_procedure(kernel: KernelDecl) -> dict[str, Any]:
    procedure: dict[str, Any] = {"shared": SHARED_TIMING, "kernel": dict(kernel.timing)}
    if kernel.resident_timing:
        procedure["resident"] = RESIDENT_RULE  # only here, so the other kernels' entries stay current
    return procedure


def timing_hash(kernel: KernelDecl) -> str:
    """sha256 of the procedure a kernel's timings are taken under."""
    return content_hash(timing_procedure(kernel))
