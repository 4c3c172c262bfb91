"""Moving a layout's buffers between ranks: one `all_to_all_single` per buffer, over byte views.

For layouts whose exchange axis is outermost in every buffer (each peer's chunk contiguous), which the
families' spec validators guarantee for `all_to_all_single` transports.  NCCL on GPUs, gloo on CPU:
the same code; layoutgen never moves bytes between ranks itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def all_to_all_tensors(send: Mapping[str, torch.Tensor], recv: Mapping[str, torch.Tensor], group: Any = None) -> None:
    """One `all_to_all_single` per buffer name; every tensor's outermost extent must be the group's size."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    if set(send) != set(recv):
        raise ValueError(f"send and receive buffers differ: {sorted(send)} vs {sorted(recv)}")
    for name, send_tensor in send.items():
        recv_tensor = recv[name]
        if send_tensor.shape != recv_tensor.shape or send_tensor.dtype != recv_tensor.dtype:
            raise ValueError(
                f"buffer {name!r}: send is {tuple(send_tensor.shape)} {send_tensor.dtype}, receive is "
                f"{tuple(recv_tensor.shape)} {recv_tensor.dtype}; allocate both with the same alloc() arguments"
            )
        if send_tensor.shape[0] != world:
            raise ValueError(
                f"the group has {world} ranks but buffer {name!r} holds {send_tensor.shape[0]} peer chunks; "
                "allocate it for as many peers as the group has ranks"
            )
        dist.all_to_all_single(
            recv_tensor.view(-1).view(torch.uint8), send_tensor.view(-1).view(torch.uint8), group=group
        )
