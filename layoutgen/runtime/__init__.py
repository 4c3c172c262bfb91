"""Run-time support for generated modules: argument checks, config dispatch, launch plans, exchange.

Generated modules keep the kernels and their `_launch_*` functions; everything
that is the same for every layout lives here.  The hot path is
`Dispatcher.pack` / `Dispatcher.combine` (`layoutgen.runtime.dispatch`):
validation and config lookup once per shape key, then one dict lookup and a
direct launch of the compiled kernel (`layoutgen.runtime.launch`).
"""

from __future__ import annotations

from typing import Any

import torch

from layoutgen import ops as _ops  # noqa: F401  (registers the torch.ops.layoutgen custom ops)
from layoutgen.layout import LayoutBuffers
from layoutgen.runtime.checks import check_buffers
from layoutgen.runtime.configs import CONFIG_ENV, TUNING_DB_ENV, LayoutgenWarning, database_dirs
from layoutgen.runtime.dispatch import Dispatcher, dispatcher, remember_buffers, reset_caches
from layoutgen.spec import LayoutSpec, Transport

__all__ = [
    "CONFIG_ENV",
    "TUNING_DB_ENV",
    "Dispatcher",
    "LayoutgenWarning",
    "all_to_all_buffers",
    "allocate",
    "check_buffers",
    "database_dirs",
    "dispatcher",
    "reset_caches",
]


def allocate(
    spec: LayoutSpec, N: int, B_max: int, H: int, D: int, dtype: torch.dtype, device: Any = None
) -> LayoutBuffers:
    return remember_buffers(LayoutBuffers.allocate(spec, N, B_max, H, D, dtype, device))


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
