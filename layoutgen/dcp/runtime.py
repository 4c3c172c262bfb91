"""What a DCP generated module imports: `allocate`, the `Dispatcher` and the exchange.

Generated modules keep the kernels and their `_launch_*` functions; everything that is the same for
every DCP layout lives in this family's modules, and what is the same for every family in
`layoutgen.runtime`.  Importing this registers the `torch.ops.layoutgen` custom ops.
"""

from __future__ import annotations

from typing import Any

import torch

from layoutgen.dcp import ops as _ops  # noqa: F401  (registers the torch.ops.layoutgen custom ops)
from layoutgen.dcp.checks import check_buffers
from layoutgen.dcp.dispatch import Dispatcher
from layoutgen.dcp.layout import LayoutBuffers
from layoutgen.dcp.plans import remember_buffers
from layoutgen.dcp.spec import DcpSpec, Transport
from layoutgen.runtime.exchange import all_to_all_tensors
from layoutgen.runtime.tensors import usable_device

__all__ = ["Dispatcher", "all_to_all_buffers", "allocate"]


def allocate(
    spec: DcpSpec, N: int, B_max: int, H: int, D: int, dtype: torch.dtype, device: Any = None
) -> LayoutBuffers:
    device = usable_device(device, "alloc")
    return remember_buffers(LayoutBuffers.allocate(spec, N, B_max, H, D, dtype, device))


def all_to_all_buffers(spec: DcpSpec, send: Any, recv: Any, group: Any = None) -> None:
    """One `all_to_all_single` per buffer over flat byte views (peer is outermost: equal chunks)."""
    if spec.transport is not Transport.ALL_TO_ALL_SINGLE:
        raise ValueError(f"spec '{spec.name}' has transport {spec.transport.value}; the caller moves its bytes")
    send = check_buffers(spec, send, "send_bufs")
    recv = check_buffers(spec, recv, "recv_bufs")
    if send.shape != recv.shape:
        differ = [
            f"{field} {getattr(send.shape, field)} vs {getattr(recv.shape, field)}"
            for field in ("N", "B_max", "H", "D", "dtype")
            if getattr(send.shape, field) != getattr(recv.shape, field)
        ]
        raise ValueError(
            "send_bufs and recv_bufs must be allocated alike (the same N, B_max, H, D and dtype); they differ in "
            + ", ".join(differ)
        )
    all_to_all_tensors(send.tensors, recv.tensors, group)
