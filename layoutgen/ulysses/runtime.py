"""What a Ulysses generated module imports: `allocate`, the `Dispatcher`, the grid check and the exchange.

Generated modules keep the kernels and their `_launch_*` functions; everything that is the same for
every Ulysses layout lives in this family's modules, and what is the same for every family in
`layoutgen.runtime`.  Importing this registers the `torch.ops.layoutgen.ulysses_*` custom ops.
"""

from __future__ import annotations

from typing import Any

import torch

from layoutgen.runtime.exchange import all_to_all_tensors
from layoutgen.runtime.tensors import usable_device
from layoutgen.ulysses import ops as _ops  # noqa: F401  (registers the torch.ops.layoutgen.ulysses_* custom ops)
from layoutgen.ulysses.checks import check_buffers
from layoutgen.ulysses.config import MAX_GRID_X, MAX_GRID_Y
from layoutgen.ulysses.dispatch import Dispatcher, remember_buffers
from layoutgen.ulysses.layout import Shape, UlyssesBuffers, user_views
from layoutgen.ulysses.spec import Transport, UlyssesSpec

__all__ = ["Dispatcher", "all_to_all_buffers", "allocate", "check_grid", "views"]


def allocate(
    spec: UlyssesSpec,
    direction: str,
    N: int,
    S_local: int,
    H: int,
    D: int,
    dtype: torch.dtype,
    device: Any = None,
    *,
    B: int = 1,
    H_kv: int,
) -> UlyssesBuffers:
    shape = Shape.of(N=N, S_local=S_local, H=H, H_kv=H_kv, D=D, dtype=dtype, B=B)
    device = usable_device(device, "alloc" if direction == "to_attention" else "alloc_out")
    return remember_buffers(UlyssesBuffers.allocate(spec, direction, shape, device))


def check_grid(kernel: str, grid: tuple[int, int]) -> None:
    """A launch whose grid CUDA cannot hold is refused with the fix (the default config always fits)."""
    x, y = grid
    if x > MAX_GRID_X or y > MAX_GRID_Y:
        raise ValueError(
            f"{kernel}: the config needs a grid of {x} x {y} programs; CUDA holds {MAX_GRID_X} x {MAX_GRID_Y}. "
            "Use larger blocks (block_seq for x; the blocks of the axes outside seq for y), or config=None"
        )


def all_to_all_buffers(spec: UlyssesSpec, send: Any, recv: Any, group: Any = None) -> None:
    """One `all_to_all_single` per buffer over flat byte views (peer is outermost: equal chunks)."""
    if spec.transport is not Transport.ALL_TO_ALL_SINGLE:
        raise ValueError(f"spec '{spec.name}' has transport {spec.transport.value}; the caller moves its bytes")
    if not isinstance(send, UlyssesBuffers):
        raise TypeError(
            f"send must be the buffers object returned by alloc() or alloc_out(), got {type(send).__name__}"
        )
    if isinstance(recv, UlyssesBuffers) and recv.direction != send.direction:
        raise ValueError(
            f"send holds the {send.direction} wire and recv the {recv.direction} wire: exchange two buffers objects "
            "of one direction (both from alloc(), or both from alloc_out())"
        )
    send = check_buffers(spec, send, send.direction, "send")
    recv = check_buffers(spec, recv, send.direction, "recv")
    if send.shape != recv.shape:
        raise ValueError(f"send and recv differ in shape: {send} vs {recv}")
    all_to_all_tensors(send.tensors, recv.tensors, group)


def views(spec: UlyssesSpec, bufs: Any, side: str) -> tuple[torch.Tensor, ...]:
    """`layoutgen.ulysses.layout.user_views` for buffers of either direction from this module's alloc."""
    if not isinstance(bufs, UlyssesBuffers):
        raise TypeError(
            f"bufs must be the buffers object returned by alloc() or alloc_out(), got {type(bufs).__name__}"
        )
    return user_views(check_buffers(spec, bufs, bufs.direction), side)
