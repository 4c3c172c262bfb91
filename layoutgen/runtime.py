"""Run-time support for generated modules: argument checks, launch plans, exchange.

Generated modules keep the kernels and launchers; everything that is the same
for every layout lives here.  The hot path is `plan_pack` / `plan_combine`:
they validate a (shapes, strides, dtypes, devices, buffers, config) key once
and afterwards return the cached plan with one dict lookup.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from layoutgen.config import (
    CombineConfig,
    KernelConfig,
    PackConfig,
    default_combine_config,
    default_pack_config,
)
from layoutgen.layout import LayoutBuffers
from layoutgen.spec import LayoutSpec, Transport

_INT32_LIMIT = 2**31


def allocate(
    spec: LayoutSpec, N: int, B_max: int, H: int, D: int, dtype: torch.dtype, device: Any = None
) -> LayoutBuffers:
    return LayoutBuffers.allocate(spec, N, B_max, H, D, dtype, device)


@dataclass(frozen=True)
class PackPlan:
    batch: int
    config: PackConfig
    index_64: bool


@dataclass(frozen=True)
class CombinePlan:
    config: CombineConfig
    index_64: bool
    lse_base_2: bool
    out_shape: tuple[int, int, int]
    dtype: torch.dtype
    device: torch.device

    def new_out(self) -> torch.Tensor:
        return torch.empty(self.out_shape, dtype=self.dtype, device=self.device)

    def new_lse(self) -> torch.Tensor:
        return torch.empty(self.out_shape[:2], dtype=torch.float32, device=self.device)


_checked_buffers: weakref.WeakKeyDictionary[LayoutBuffers, str] = weakref.WeakKeyDictionary()
_pack_plans: dict[tuple[Any, ...], PackPlan] = {}
_combine_plans: dict[tuple[Any, ...], CombinePlan] = {}


def _describe(tensor: torch.Tensor) -> str:
    return f"shape {tuple(tensor.shape)}, strides {tuple(tensor.stride())}, {tensor.dtype} on {tensor.device}"


def check_buffers(spec: LayoutSpec, bufs: Any, label: str = "bufs") -> LayoutBuffers:
    """`bufs` must come from this spec's `alloc` and still hold tensors of the allocated shapes."""
    if isinstance(bufs, LayoutBuffers) and _checked_buffers.get(bufs) == spec.layout_hash():
        return bufs
    if not isinstance(bufs, LayoutBuffers):
        raise TypeError(f"{label} must be the buffers object returned by alloc(), got {type(bufs).__name__}")
    if bufs.layout_hash != spec.layout_hash():
        raise ValueError(
            f"{label} were allocated for spec '{bufs.spec_name}', not '{spec.name}'; allocate them with "
            f"this module's alloc()"
        )
    expected = LayoutBuffers.allocate(spec, bufs.N, bufs.B_max, bufs.H, bufs.D, bufs.dtype, "meta").tensors
    if set(bufs.tensors) != set(expected):
        raise ValueError(f"{label}.tensors must hold {sorted(expected)}, got {sorted(bufs.tensors)}")
    device = bufs.tensors["payload"].device
    for name, want in expected.items():
        got = bufs.tensors[name]
        if (
            not isinstance(got, torch.Tensor)
            or got.shape != want.shape
            or got.dtype != want.dtype
            or not got.is_contiguous()
            or got.device != device
        ):
            raise ValueError(
                f"{label}.tensors[{name!r}] must be a contiguous {want.dtype} tensor of shape "
                f"{tuple(want.shape)} on {device}; got "
                + (_describe(got) if isinstance(got, torch.Tensor) else type(got).__name__)
            )
    _checked_buffers[bufs] = spec.layout_hash()
    return bufs


def _max_offset(tensor: torch.Tensor) -> int:
    return sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True) if size > 0)


def _needs_int64(*tensors: torch.Tensor) -> bool:
    return any(_max_offset(t) >= _INT32_LIMIT or t.numel() >= _INT32_LIMIT for t in tensors)


def _check_config(config: Any, kind: type[KernelConfig]) -> None:
    if not isinstance(config, kind):
        raise TypeError(f"config must be a layoutgen.config.{kind.__name__} or None, got {type(config).__name__}")


def plan_pack(spec: LayoutSpec, out: Any, lse: Any, bufs: Any, config: PackConfig | None) -> PackPlan:
    try:
        key = (
            id(bufs),
            out.shape,
            out.stride(),
            out.dtype,
            out.device,
            lse.shape,
            lse.stride(),
            lse.dtype,
            lse.device,
            config,
        )
        plan = _pack_plans.get(key)
    except AttributeError:
        plan, key = None, None
    if plan is not None and _checked_buffers.get(bufs) == spec.layout_hash():
        return plan
    bufs = check_buffers(spec, bufs)
    N, H, D = bufs.N, bufs.H, bufs.D
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor [B, H, D], got {type(out).__name__}")
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"lse must be a torch.Tensor [B, H] of float32, got {type(lse).__name__}")
    if out.dim() != 3 or out.shape[1] != H or out.shape[2] != D:
        raise ValueError(f"out must have shape [B, H={H}, D={D}] (B <= {bufs.B_max}); got {_describe(out)}")
    batch = out.shape[0]
    if batch > bufs.B_max:
        raise ValueError(f"out has B={batch} rows but the buffers hold at most B_max={bufs.B_max}; allocate larger")
    if out.dtype != bufs.dtype:
        raise TypeError(f"out must be {bufs.dtype} (the buffers' dtype); got {_describe(out)}")
    if D > 1 and out.stride(2) != 1:
        raise ValueError(f"out must have stride 1 along D (any other strides); got {_describe(out)}")
    if lse.dim() != 2 or tuple(lse.shape) != (batch, H):
        raise ValueError(f"lse must have shape [B={batch}, H={H}]; got {_describe(lse)}")
    if lse.dtype != torch.float32:
        raise TypeError(f"lse must be float32; got {_describe(lse)}")
    for label, tensor in (("out", out), ("lse", lse)):
        if tensor.device != bufs.device:
            raise ValueError(f"{label} is on {tensor.device} but the buffers are on {bufs.device}")
    if config is None:
        config = default_pack_config(spec, N, H // N, D, max(batch, 1), bufs.tensors["payload"].element_size())
    _check_config(config, PackConfig)
    plan = PackPlan(batch, config, _needs_int64(out, lse, *bufs.tensors.values()))
    if key is not None:
        _pack_plans[key] = plan
    return plan


def plan_combine(
    spec: LayoutSpec,
    bufs: Any,
    B: Any,
    lse_base: Any,
    out: Any,
    return_lse: bool,
    config: CombineConfig | None,
) -> CombinePlan:
    out_key = None if out is None else (out.shape, out.stride(), out.dtype, out.device)
    key = (id(bufs), B, lse_base, out_key, return_lse, config)
    plan = _combine_plans.get(key)
    if plan is not None and _checked_buffers.get(bufs) == spec.layout_hash():
        return plan
    bufs = check_buffers(spec, bufs)
    if isinstance(B, bool) or not isinstance(B, int) or not 0 <= B <= bufs.B_max:
        raise ValueError(f"B must be an int in [0, B_max={bufs.B_max}]; got {B!r}")
    if lse_base not in ("e", "2"):
        raise ValueError(f"lse_base must be 'e' or '2'; got {lse_base!r}")
    heads_per_peer = bufs.H // bufs.N
    out_shape = (B, heads_per_peer, bufs.D)
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
        if tuple(out.shape) != out_shape or out.dtype != bufs.dtype or out.device != bufs.device:
            raise ValueError(
                f"out must have shape {list(out_shape)}, dtype {bufs.dtype}, device {bufs.device}; got {_describe(out)}"
            )
    if config is None:
        config = default_combine_config(
            spec, bufs.N, heads_per_peer, bufs.D, max(B, 1), bufs.tensors["payload"].element_size()
        )
    _check_config(config, CombineConfig)
    tensors = list(bufs.tensors.values()) + ([out] if out is not None else [])
    plan = CombinePlan(config, _needs_int64(*tensors), lse_base == "2", out_shape, bufs.dtype, bufs.device)
    _combine_plans[key] = plan
    return plan


def all_to_all_buffers(spec: LayoutSpec, send: Any, recv: Any, group: Any = None) -> None:
    """One `all_to_all_single` per buffer over flat byte views (peer is outermost: equal chunks)."""
    if spec.transport is not Transport.ALL_TO_ALL_SINGLE:
        raise ValueError(f"spec '{spec.name}' has transport {spec.transport.value}; the caller moves its bytes")
    import torch.distributed as dist

    send = check_buffers(spec, send, "send_bufs")
    recv = check_buffers(spec, recv, "recv_bufs")
    if send.shape != recv.shape:
        raise ValueError(f"send_bufs and recv_bufs differ in shape: {send} vs {recv}")
    world = dist.get_world_size(group)
    if world != send.N:
        raise ValueError(f"the group has {world} ranks but the buffers were allocated for N={send.N} peers")
    for name, send_tensor in send.tensors.items():
        dist.all_to_all_single(
            recv.tensors[name].view(-1).view(torch.uint8), send_tensor.view(-1).view(torch.uint8), group=group
        )
