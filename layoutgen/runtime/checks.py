"""Argument checks of pack / combine: run once per plan key, never on the cached path.

Every error names the argument, what was expected and what was given (DESIGN §4).
"""

from __future__ import annotations

from typing import Any

import torch

from layoutgen.config import KernelConfig
from layoutgen.layout import LayoutBuffers, buffer_shapes
from layoutgen.spec import LayoutSpec

_INT32_LIMIT = 2**31


def describe(tensor: torch.Tensor) -> str:
    return f"shape {tuple(tensor.shape)}, strides {tuple(tensor.stride())}, {tensor.dtype} on {tensor.device}"


def check_buffers(spec: LayoutSpec, bufs: Any, label: str = "bufs") -> LayoutBuffers:
    """`bufs` must come from this spec's `alloc` and hold dense tensors of the allocated shapes on one device."""
    if not isinstance(bufs, LayoutBuffers):
        raise TypeError(f"{label} must be the buffers object returned by alloc(), got {type(bufs).__name__}")
    if bufs.layout_hash != spec.layout_hash():
        raise ValueError(
            f"{label} were allocated for spec '{bufs.spec_name}', not '{spec.name}'; allocate them with "
            "this module's alloc()"
        )
    expected = buffer_shapes(spec, bufs.shape)
    if set(bufs.tensors) != set(expected):
        raise ValueError(f"{label}.tensors must hold {sorted(expected)}, got {sorted(bufs.tensors)}")
    payload = bufs.tensors["payload"]
    if spec.row_tail and isinstance(payload, torch.Tensor) and payload.element_size() < 4 and payload.data_ptr() % 4:
        # The LSE is a float32 word inside the rows (every row is a multiple of 4 bytes): a GPU faults on a
        # misaligned 4-byte access, so a payload view starting mid-word is refused here.
        raise ValueError(
            f"{label}.tensors['payload'] must start at a 4-byte aligned address (its rows hold float32 LSE words); "
            f"got address {payload.data_ptr():#x}. Allocate with alloc() or hand in an aligned view"
        )
    device = payload.device
    for name, (_, extents, dtype) in expected.items():
        got = bufs.tensors[name]
        if (
            not isinstance(got, torch.Tensor)
            or tuple(got.shape) != extents
            or got.dtype != dtype
            or not got.is_contiguous()
            or got.device != device
        ):
            raise ValueError(
                f"{label}.tensors[{name!r}] must be a contiguous {dtype} tensor of shape {extents} on {device}; got "
                + (describe(got) if isinstance(got, torch.Tensor) else type(got).__name__)
            )
    return bufs


def check_config(config: Any, kind: type[KernelConfig]) -> None:
    if not isinstance(config, kind):
        raise TypeError(f"config must be a layoutgen.config.{kind.__name__} or None, got {type(config).__name__}")


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


def needs_int64(*tensors: torch.Tensor) -> bool:
    """Whether some element offset of these tensors does not fit the kernels' int32 index arithmetic."""
    return any(_max_offset(t) >= _INT32_LIMIT or t.numel() >= _INT32_LIMIT for t in tensors)


def check_pack_args(spec: LayoutSpec, out: Any, lse: Any, bufs: Any) -> int:
    """Validate pack's arguments; return the batch B."""
    bufs = check_buffers(spec, bufs)
    H, D = bufs.H, bufs.D
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor [B, H, D], got {type(out).__name__}")
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"lse must be a torch.Tensor [B, H] of float32, got {type(lse).__name__}")
    if out.dim() != 3 or out.shape[1] != H or out.shape[2] != D:
        raise ValueError(f"out must have shape [B, H={H}, D={D}] (B <= {bufs.B_max}); got {describe(out)}")
    batch = out.shape[0]
    if batch > bufs.B_max:
        raise ValueError(
            f"out has B={batch} rows but the buffers hold at most B_max={bufs.B_max}; allocate larger buffers"
        )
    if out.dtype != bufs.dtype:
        raise TypeError(f"out must be {bufs.dtype} (the buffers' dtype); got {describe(out)}")
    if D > 1 and out.stride(2) != 1:
        raise ValueError(f"out must have stride 1 along D (any other strides); got {describe(out)}")
    if lse.dim() != 2 or tuple(lse.shape) != (batch, H):
        raise ValueError(f"lse must have shape [B={batch}, H={H}]; got {describe(lse)}")
    if lse.dtype != torch.float32:
        raise TypeError(f"lse must be float32; got {describe(lse)}")
    for label, tensor in (("out", out), ("lse", lse)):
        if tensor.device != bufs.device:
            raise ValueError(f"{label} is on {tensor.device} but the buffers are on {bufs.device}")
    return batch


def check_combine_args(spec: LayoutSpec, bufs: Any, B: Any, lse_base: Any, out: Any, return_lse: Any) -> None:
    bufs = check_buffers(spec, bufs)
    if isinstance(B, bool) or not isinstance(B, int) or not 0 <= B <= bufs.B_max:
        raise ValueError(f"B must be an int in [0, B_max={bufs.B_max}]; got {B!r}")
    if lse_base not in ("e", "2"):
        raise ValueError(f"lse_base must be 'e' or '2'; got {lse_base!r}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool; got {type(return_lse).__name__}")
    out_shape = (B, bufs.H // bufs.N, bufs.D)
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
        if tuple(out.shape) != out_shape or out.dtype != bufs.dtype or out.device != bufs.device:
            raise ValueError(
                f"out must have shape {list(out_shape)}, dtype {bufs.dtype}, device {bufs.device}; got {describe(out)}"
            )
        if overlaps_itself(out):
            raise ValueError(
                "out must not overlap itself (e.g. an expand()ed view: programs would race to write one element); "
                f"got {describe(out)}"
            )
