"""Moving a layout's buffers between ranks: one `all_to_all_single` per buffer, over byte views.

For layouts whose exchange axis is outermost in every buffer (each peer's chunk contiguous), which the
families' spec validators guarantee for `all_to_all_single` transports.  NCCL on GPUs, gloo on CPU:
the same code; layoutgen never moves bytes between ranks itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from layoutgen.runtime.groups import check_group
from layoutgen.runtime.tensors import overlap, overlap_relation

#: `exchange_fn(send_tensors, recv_tensors)`: move every peer's chunk of each send buffer into the
#: receive buffer of the same name on that peer (same layout, peer index = source rank).
ExchangeFn = Callable[[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]], None]


def check_exchange_fn(spec_name: str, external: bool, exchange_fn: Any, hint: str = "") -> None:
    """A distributed helper's `exchange_fn` argument: callable if given, and given for a spec whose transport
    is external (layoutgen cannot move its buffers itself); `hint` names a ready-made one."""
    if exchange_fn is not None and not callable(exchange_fn):
        raise TypeError(f"exchange_fn must be callable(send_tensors, recv_tensors), got {type(exchange_fn).__name__}")
    if external and exchange_fn is None:
        raise ValueError(
            f"spec '{spec_name}' has transport external: pass exchange_fn(send_tensors, recv_tensors) "
            f"that moves its buffers{hint} (a group of one needs it too, though nothing moves there)"
        )


def call_exchange_fn(
    exchange_fn: ExchangeFn, send: Mapping[str, torch.Tensor], recv: Mapping[str, torch.Tensor]
) -> None:
    """Run a caller's transport on copies of the views' dicts, then refuse one that replaced a receive view
    instead of writing into it (ValueError): the kernels read the static receive buffers, so the bytes it
    received would be lost without a word, and a replaced view in the helper's own dict would stay for every
    later call."""
    given = dict(recv)
    exchange_fn(dict(send), given)
    for name, view in recv.items():
        if given.get(name) is not view:
            raise ValueError(
                f"exchange_fn replaced recv_tensors[{name!r}] instead of writing into it: the receive tensors are "
                f"views of the static buffers the kernels read; write the received bytes into them "
                f"(recv_tensors[{name!r}].copy_(received))"
            )


def refuse_unprepared_size(owner: str, size: str, value: int) -> None:
    """A distributed helper's call, under torch.compile, of a size (`B`, `S_local`) whose views it has not built:
    building them registers buffers objects in a weak map, which dynamo cannot trace.  Eager calls build them."""
    if torch.compiler.is_compiling():
        raise RuntimeError(
            f"{owner}: {size}={value} has no views yet, and torch.compile cannot trace building them: call "
            f"exchange.prepare({value}) (prepare() lays out every {size}), or the exchange once eagerly at "
            f"{size}={value}, first"
        )


def all_to_all_tensors(send: Mapping[str, torch.Tensor], recv: Mapping[str, torch.Tensor], group: Any = None) -> None:
    """One `all_to_all_single` per buffer name; every tensor's outermost extent must be the group's size."""
    import torch.distributed as dist

    if set(send) != set(recv):
        raise ValueError(f"send and receive buffers differ: {sorted(send)} vs {sorted(recv)}")
    # Traced tensors have no addresses: eager calls are checked, traced ones are not.
    for name, send_tensor in () if torch.compiler.is_compiling() else send.items():
        for other, recv_tensor in recv.items():
            if overlap(send_tensor, recv_tensor):
                # all_to_all_single would read bytes another rank's chunk has already overwritten.
                raise ValueError(
                    f"send buffer {name!r} {overlap_relation(send_tensor, recv_tensor)} receive buffer {other!r}: "
                    "the exchange needs separate send and receive buffers (two alloc() calls)"
                )
    # Sizing the group is the membership check: -1 for a group without this rank, an error for a non-group or
    # no process group; only then does check_group say which.  Per call it adds one comparison: under 0.1 us,
    # within noise, of a call's 19.5 us with the collective stubbed (two buffers; CI-like CPU, Python 3.11).
    failure: Exception | None = None
    try:
        world = dist.get_world_size(group)
    except (AttributeError, TypeError, ValueError, RuntimeError) as error:
        failure, world = error, -1
    if world < 1:
        check_group(
            group,
            "exchange",
            "calling exchange",
            "pass a group this rank belongs to (or call exchange on its members only)",
        )
        raise failure or RuntimeError(f"torch.distributed sized the group at {world} ranks")
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
