"""Checks on user tensors that every family's argument validation uses (run once per plan, never cached)."""

from __future__ import annotations

from typing import Any

import torch

from layoutgen.config import LaunchConfig

_INT32_LIMIT = 2**31


def describe(tensor: torch.Tensor) -> str:
    return f"shape {tuple(tensor.shape)}, strides {tuple(tensor.stride())}, {tensor.dtype} on {tensor.device}"


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
