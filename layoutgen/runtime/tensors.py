"""Checks on user tensors that every family's argument validation uses (run once per plan, never cached)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from layoutgen.config import LaunchConfig

_INT32_LIMIT = 2**31


def describe(tensor: torch.Tensor) -> str:
    return f"shape {tuple(tensor.shape)}, strides {tuple(tensor.stride())}, {tensor.dtype} on {tensor.device}"


def usable_device(device: Any, label: str) -> torch.device | None:
    """`device` (None: torch's default) as a torch.device this process can allocate on, else an error naming
    `label` and the fix (instead of torch's bare assertion from a CPU-only build)."""
    if device is None:
        return None
    try:
        where = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"{label}: device must be a torch.device or a name such as 'cuda' or 'cpu'; got {device!r}"
        ) from error
    if where.type not in ("cuda", "cpu"):
        raise ValueError(
            f"{label}: layoutgen's kernels run on CUDA devices (and on CPU under the Triton interpreter); got "
            f"device {where}: pass device='cuda' or device='cpu'"
        )
    if where.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"{label}: device {where} is not available here (torch.cuda.is_available() is False: a CPU-only "
                "torch build, or no GPU visible); pass device='cpu' (kernels then need TRITON_INTERPRET=1) or "
                "run on a machine with a CUDA GPU"
            )
        count = torch.cuda.device_count()
        if where.index is not None and where.index >= count:
            raise ValueError(f"{label}: device {where} does not exist; this process sees {count} CUDA device(s)")
    return where


def required_device(device: Any, label: str) -> torch.device:
    """`usable_device` where a device must be named."""
    where = usable_device(device, label)
    if where is None:
        raise TypeError(f"{label} needs a device (e.g. 'cuda' or 'cpu'), got None")
    return where


def positive_int(label: str, value: Any) -> int:
    """A size argument: an int >= 1 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{label} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{label} must be >= 1, got {value}")
    return value


def check_config(config: Any, kind: type[LaunchConfig]) -> None:
    if not isinstance(config, kind):
        raise TypeError(f"config must be a {kind.__module__}.{kind.__name__} or None, got {type(config).__name__}")


def _max_offset(tensor: torch.Tensor) -> int:
    return sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True) if size > 0)


def overlaps_itself(tensor: torch.Tensor) -> bool:
    """Whether two positions of `tensor` may share an element (e.g. an expand()ed view); conservative."""
    if tensor.numel() == 0:
        return False
    reach = 0  # the largest offset the dims with smaller strides address
    dims = sorted((stride, size) for size, stride in zip(tensor.shape, tensor.stride(), strict=True) if size > 1)
    for stride, size in dims:
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def byte_span(tensor: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) bytes of `tensor` in its storage's address space (an empty span for no elements)."""
    if tensor.numel() == 0:
        return (0, 0)
    start = tensor.data_ptr()
    return start, start + (_max_offset(tensor) + 1) * tensor.element_size()


def overlap(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether the memory two tensors may touch overlaps (conservative: their address spans)."""
    a, b = byte_span(first), byte_span(second)
    return a[0] < a[1] and b[0] < b[1] and a[0] < b[1] and b[0] < a[1]


@dataclass(frozen=True)
class OverlapGuard:
    """What a cached plan's overlap checks saw, for its later calls: the tensors of a plan key keep their
    geometry but not their addresses, so a call's tensors at new addresses may overlap memory the first
    call's did not.  `fixed` holds the byte spans of the buffers (whose addresses the plan owns), `lengths`
    each call tensor's span length, `disjoint` whether the call's tensors must not overlap one another
    (outputs).  `may_overlap` is the cached path's test: one data_ptr() per tensor and a few comparisons;
    when it says yes the call is validated again, and the validation names what overlaps."""

    fixed: tuple[tuple[int, int], ...]
    lengths: tuple[int, ...]
    disjoint: bool
    # The fixed spans' hull: a tensor outside it (the usual case) costs one comparison.
    hull: tuple[int, int] = (0, 0)

    @classmethod
    def of(cls, buffers: Iterable[torch.Tensor], tensors: Iterable[torch.Tensor], disjoint: bool) -> OverlapGuard:
        fixed = tuple(span for span in map(byte_span, buffers) if span[0] < span[1])
        hull = (min(s for s, _ in fixed), max(e for _, e in fixed)) if fixed else (0, 0)
        return cls(fixed, tuple(end - start for start, end in map(byte_span, tensors)), disjoint, hull)

    def may_overlap(self, tensors: Sequence[torch.Tensor]) -> bool:
        # Written for the hot path: 0.8-1.3 us for three tensors on the CI CPU (Python 3.11), of which 0.3 are
        # the data_ptr() calls; no generator, no strict zip (`lengths` has one entry per tensor of the plan).
        low, high = self.hull
        seen: list[tuple[int, int]] = []
        for tensor, length in zip(tensors, self.lengths):  # noqa: B905
            start = tensor.data_ptr()
            end = start + length
            if start < high and low < end and length and self._hits_fixed(start, end):
                return True
            if self.disjoint and length:
                for first, stop in seen:
                    if start < stop and first < end:
                        return True
                seen.append((start, end))
        return False

    def _hits_fixed(self, start: int, end: int) -> bool:
        return any(start < stop and first < end for first, stop in self.fixed)


def needs_int64(*tensors: torch.Tensor) -> bool:
    """Whether some element offset of these tensors does not fit the kernels' int32 index arithmetic."""
    return any(_max_offset(t) >= _INT32_LIMIT or t.numel() >= _INT32_LIMIT for t in tensors)


def check_runnable(kernel: Any, *tensors: torch.Tensor) -> None:
    """CPU tensors run only under the Triton interpreter: say so, instead of Triton's "0 active drivers"."""
    from layoutgen.runtime.launch import is_jit_function

    cpu = sorted({str(t.device) for t in tensors if t.device.type == "cpu"})
    if cpu and is_jit_function(kernel):
        raise RuntimeError(
            f"the tensors are on {', '.join(cpu)}, and Triton runs kernels on CPU tensors only under its "
            "interpreter: set TRITON_INTERPRET=1 before triton is first imported (e.g. `TRITON_INTERPRET=1 "
            "python script.py`), or pass CUDA tensors"
        )
