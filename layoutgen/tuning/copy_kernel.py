"""The device's copy ceiling for the tuner's "% copy" column: a plain Triton copy kernel.

On an H200 torch's `copy_` moves 2.7 TB/s (read + write) while a Triton copy with 16-byte accesses
moves 4.1 TB/s (benchmarks/results/notes_H200.md), so the ceiling is the best of both.  Imported only
on a GPU (the kernel is defined at import).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def copy_kernel(source_ptr, destination_ptr, count, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < count
    tl.store(destination_ptr + offsets, tl.load(source_ptr + offsets, mask=mask), mask=mask)


#: (elements per program, warps): int32 elements, so 8192 over 8 warps is 32 bytes per thread.  The small
#: programs are the fastest at tens of MiB: H200, 96 MiB read + written, 1024 x 4 warps 25.7-25.9 µs against
#: 27.2-27.5 for 4096 x 8 (benchmarks/results/archive/probe_ulysses_*_H200.json).
CONFIGS: tuple[tuple[int, int], ...] = (
    (1024, 4),
    (2048, 4),
    (2048, 8),
    (4096, 8),
    (8192, 8),
    (8192, 16),
    (16384, 16),
)
