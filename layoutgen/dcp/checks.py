"""Argument checks of the DCP pack / combine: run once per plan key, never on the cached path.

Every error names the argument, what was expected and what was given (docs/design.md §4).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from layoutgen.dcp.layout import LayoutBuffers, buffer_shapes
from layoutgen.dcp.spec import DcpSpec
from layoutgen.runtime.tensors import INT32_LIMIT as _INT32_LIMIT  # a module global: tests lower it
from layoutgen.runtime.tensors import (
    as_int,
    check_plain,
    describe,
    overlap,
    overlap_relation,
    overlaps_itself,
    type_name,
)


def check_buffers(spec: DcpSpec, bufs: Any, label: str = "bufs") -> LayoutBuffers:
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
    if (
        spec.row_tail
        and isinstance(payload, torch.Tensor)
        and payload.element_size() < 4
        and not torch.compiler.is_compiling()
        and payload.data_ptr() % 4
    ):
        # The LSE is a float32 word inside the rows (every row is a multiple of 4 bytes): a GPU faults on a
        # misaligned 4-byte access, so a payload view starting mid-word is refused here.  A traced tensor has
        # no address (exchange under torch.compile): the pack and combine ops check it when they run.
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


def check_pack_buffers(spec: DcpSpec, lse: Any, bufs: Any) -> LayoutBuffers:
    """pack's buffers (also checked while torch.compile traces a call, before the trace reads them)."""
    if bufs is None and isinstance(lse, LayoutBuffers):
        raise TypeError(
            "pack's buffers came in lse's place (its second argument) and bufs is None: with max_sum= call "
            "pack(out, bufs=bufs, max_sum=(max, sum)) or pack(out, None, bufs, max_sum=(max, sum))"
        )
    return check_buffers(spec, bufs)


def check_max_sum_pair(max_sum: Any, stats_shape: str = "[B, H] (out's leading shape)") -> tuple[Any, Any] | None:
    """pack's `max_sum` as its (max, sum) pair, None for None; anything but a tuple or list of two is refused."""
    if max_sum is None:
        return None
    pair = max_sum_pair(max_sum)
    if pair is None:
        raise TypeError(
            f"max_sum must be a (max, sum) pair of float32 tensors {stats_shape}; got {type(max_sum).__name__}"
        )
    return pair


def check_pack_types(out: Any, lse: Any, empty: Any, pair: tuple[Any, Any] | None) -> None:
    """What the pack op's schema takes, checked while torch.compile traces a call (TypeError in pack's words,
    not the schema's): tensors, and None for the optional ones.  The op checks the rest when it runs, where its
    errors keep their type (raised while tracing, Dynamo reports them as its own)."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(
            f"out must be a torch.Tensor [B, H, D], got {type(out).__name__} ([R, T, H, D]: T tokens per request)"
        )
    for label, tensor in (("lse", lse), ("empty", empty)):
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{label} must be None or a torch.Tensor, got {type(tensor).__name__}")
    for label, tensor in zip(("max_sum[0] (max)", "max_sum[1] (sum)"), pair or (), strict=False):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{label} must be a torch.Tensor of float32, got {type(tensor).__name__}")


def check_pack_args(spec: DcpSpec, out: Any, lse: Any, bufs: Any, empty: Any = None, max_sum: Any = None) -> int:
    """Validate pack's arguments; return the number of rows B (R * T for a 4-D `out`)."""
    bufs = check_pack_buffers(spec, lse, bufs)
    H, D = bufs.H, bufs.D
    if not isinstance(out, torch.Tensor):
        raise TypeError(
            f"out must be a torch.Tensor [B, H, D], got {type(out).__name__} ([R, T, H, D]: T tokens per request)"
        )
    check_plain("out", out)
    if out.dim() not in (3, 4) or out.shape[-2] != H or out.shape[-1] != D:
        raise ValueError(
            f"out must have shape [B, H={H}, D={D}] (B <= {bufs.B_max}); got {describe(out)} (or [R, T, H={H}, D={D}] "
            f"with R * T <= {bufs.B_max})"
        )
    lead = tuple(out.shape[:-2])
    batch = math.prod(lead)
    if batch > bufs.B_max:
        rows = "" if len(lead) == 1 else f" ({lead[0]} x {lead[1]})"
        raise ValueError(
            f"out has B={batch} rows{rows} but the buffers hold at most B_max={bufs.B_max}; allocate larger buffers"
        )
    if out.dtype != bufs.dtype:
        raise TypeError(f"out must be {bufs.dtype} (the buffers' dtype); got {describe(out)}")
    if D > 1 and out.stride(-1) != 1:
        raise ValueError(f"out must have stride 1 along D (any other strides); got {describe(out)}")
    want = (*lead, H)
    stats_shape = (
        f"[B={lead[0]}, H={H}]" if len(lead) == 1 else f"[R={lead[0]}, T={lead[1]}, H={H}] (out's leading shape)"
    )
    if (lse is None) == (max_sum is None):
        raise TypeError(
            f"pass exactly one of lse (float32 {stats_shape}) and max_sum=(max, sum); got "
            + ("both" if lse is not None else "neither")
        )
    named: list[tuple[str, Any]] = [("lse", lse)]
    pair = check_max_sum_pair(max_sum, stats_shape)
    if pair is not None:
        named = [("max_sum[0] (max)", pair[0]), ("max_sum[1] (sum)", pair[1])]
    for label, tensor in named:
        if not isinstance(tensor, torch.Tensor):
            kind = "[B, H]" if len(lead) == 1 else "[R, T, H]"
            raise TypeError(f"{label} must be a torch.Tensor {kind} of float32, got {type(tensor).__name__}")
        check_plain(label.split(" ")[0], tensor)
        if tuple(tensor.shape) != want:
            raise ValueError(f"{label} must have shape {stats_shape}; got {describe(tensor)}")
        if tensor.dtype != torch.float32:
            raise TypeError(f"{label} must be float32; got {describe(tensor)}")
    if empty is not None:
        if not isinstance(empty, torch.Tensor):
            raise TypeError(f"empty must be None or a torch.bool tensor [{lead[0]}], got {type(empty).__name__}")
        check_plain("empty", empty)
        if empty.dtype != torch.bool:
            raise TypeError(
                f"empty must be a torch.bool tensor [R={lead[0]}] (True: nothing on this rank); got {describe(empty)}"
            )
        if tuple(empty.shape) != lead[:1]:
            raise ValueError(
                f"empty must be a torch.bool tensor [R={lead[0]}], one flag per request (out's first dim); "
                f"got {describe(empty)}"
            )
        named.append(("empty", empty))
    for label, tensor in (("out", out), *named):
        if tensor.device != bufs.device:
            raise ValueError(f"{label} is on {tensor.device} but the buffers are on {bufs.device}")
    if not torch.compiler.is_compiling():  # a traced tensor has no address: the op checks it when it runs
        for label, tensor in (("out", out), *named):
            for name, buffer in bufs.tensors.items():
                if overlap(tensor, buffer):
                    raise ValueError(
                        f"{label} must not overlap the buffers pack writes: it {overlap_relation(tensor, buffer)} "
                        f"bufs.tensors[{name!r}] ({describe(buffer)}); got {describe(tensor)}. Pack from a tensor "
                        f"of its own (e.g. {label.split(' ')[0]}.clone())"
                    )
    return batch


#: The largest finite float32: the kernel multiplies in float32.
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def max_sum_pair(max_sum: Any) -> tuple[Any, Any] | None:
    """`max_sum` as its (max, sum) pair, or None when it is not a tuple or list of two (a stacked [2, ...]
    tensor would unpack into two as well, and must not pass for a pair)."""
    return (max_sum[0], max_sum[1]) if isinstance(max_sum, tuple | list) and len(max_sum) == 2 else None


def refuse_gradients(out: Any, lse: Any, max_sum: Any) -> None:
    """pack records nothing for autograd: an input that requires grad, in grad mode, would lose its gradient
    without a word (as Ulysses' sources would)."""
    inputs = [("out", out), ("lse", lse)]
    if isinstance(max_sum, tuple | list):  # a malformed max_sum is refused by the argument checks
        inputs += list(zip(("max_sum[0]", "max_sum[1]"), max_sum, strict=False))
    for name, tensor in inputs:
        if getattr(tensor, "requires_grad", False):
            raise RuntimeError(
                f"pack: {name} requires grad, and layoutgen's kernels do not propagate gradients (inference "
                f"only): call under torch.no_grad() or torch.inference_mode(), or pass {name}.detach()"
            )


def refuse_out_gradient(function: str, name: str) -> None:
    """An output written in place that requires grad, in grad mode: the write is invisible to autograd, so a
    gradient through it would be wrong without a word (torch refuses out= arguments that require grad too)."""
    raise RuntimeError(
        f"{function}: {name} requires grad, but {function} writes {name} in place through its kernel, which "
        "autograd does not record (layoutgen's kernels do not propagate gradients; torch's out= functions refuse "
        f"such tensors too): pass {name}.detach() (or a tensor that does not require grad), or call under "
        "torch.no_grad() or torch.inference_mode()"
    )


def check_scale_type(scale: Any) -> None:
    """combine's output scale is a Python number (not a bool, not a tensor: it is baked into the launch)."""
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a Python float (or int); got {type(scale).__name__}")


def check_scale(scale: Any) -> float:
    """combine's output scale: a finite real number within float32's range."""
    check_scale_type(scale)
    try:
        value = float(scale)
    except OverflowError:  # an int beyond any float
        value = math.inf
    if not math.isfinite(value) or abs(value) > _FLOAT32_MAX:
        raise ValueError(
            f"scale must be a finite number within float32's range (|scale| <= {_FLOAT32_MAX:.4g}: the merge is "
            f"scaled in float32); got {scale!r}"
        )
    return value


def check_combine_scalars(B: Any, B_max: int, lse_base: Any, return_lse: Any) -> int:
    """combine's arguments besides the tensors (also checked while torch.compile traces a call); B as an int."""
    B = as_int(B)
    if isinstance(B, bool) or not isinstance(B, int) or not 0 <= B <= B_max:
        raise ValueError(f"B must be an int in [0, B_max={B_max}]; got {B!r}")
    if lse_base not in ("e", "2"):
        raise ValueError(f"lse_base must be 'e' or '2'; got {lse_base!r}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool; got {type_name(return_lse)}")
    return B


def check_combine_args(spec: DcpSpec, bufs: Any, B: Any, lse_base: Any, out: Any, return_lse: Any) -> int:
    """combine's arguments, `out` included; B as an int."""
    bufs = check_buffers(spec, bufs)
    B = check_combine_scalars(B, bufs.B_max, lse_base, return_lse)
    out_shape = (B, bufs.H // bufs.N, bufs.D)
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
        check_plain("out", out)
        if tuple(out.shape) != out_shape or out.dtype != bufs.dtype or out.device != bufs.device:
            raise ValueError(
                f"out must have shape {list(out_shape)}, dtype {bufs.dtype}, device {bufs.device}; got {describe(out)}"
            )
        if overlaps_itself(out):
            raise ValueError(
                "out must not overlap itself (e.g. an expand()ed view: programs would race to write one element); "
                f"got {describe(out)}"
            )
        for name, tensor in bufs.tensors.items():
            if overlap(out, tensor):
                raise ValueError(
                    f"out must not overlap the buffers it reads: it {overlap_relation(out, tensor)} bufs.tensors[{name!r}] "
                    f"({describe(tensor)}); got {describe(out)}. Pass a separate tensor, or out=None"
                )
    return B


def wide_out_offsets(out: torch.Tensor) -> bool:
    """Whether combine's kernel cannot write `out` in place: it writes at batch * stride(0) + head * stride(1) +
    dim * stride(2), the batch term in 64 bits where needed and the head and dim terms in 32 (each a 32-bit
    index times a stride that fits 32 bits), so a view whose last head or dim lies 2**31 or more elements past
    its first would wrap and be written outside `out`.  Such an `out` is written through a contiguous stage."""
    return any(out.stride(axis) < _INT32_LIMIT <= (out.shape[axis] - 1) * out.stride(axis) for axis in (1, 2))
