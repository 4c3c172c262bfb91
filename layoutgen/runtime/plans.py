"""The plan cache every family's hot path shares.

A family's public function turns a call into a cached plan: the first call with a new key (shapes,
strides, dtypes, devices, config) validates every argument, resolves `config=None` (`configs`) and
records the kernel launch (`launch`); later calls with that key do one dict lookup and launch.  Plans
live in a dict on the buffers object the call writes or reads, so they die with it.

Buffers objects are also remembered by the id of one of their tensors (weakly), so that a
`torch.library` custom op, which sees only tensors, finds the object that holds the cached plans.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from layoutgen.runtime import configs

PLANS = "_layoutgen_plans"
_lock = threading.Lock()
_owners: weakref.WeakSet[Any] = weakref.WeakSet()
_by_tensor: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def plans_of(owner: Any) -> dict[tuple[Any, ...], Any]:
    """The plan dict of a buffers object (created on first use)."""
    plans = owner.__dict__.get(PLANS)
    if plans is None:
        plans = owner.__dict__.setdefault(PLANS, {})
        with _lock:
            _owners.add(owner)
    return plans


def remember(owner: Any, tensor: Any) -> Any:
    """Let `owner` be found from `tensor` (the custom ops' way back to the cached plans)."""
    _by_tensor[id(tensor)] = owner
    return owner


def remembered(tensor: Any) -> Any | None:
    return _by_tensor.get(id(tensor))


def reset_caches() -> None:
    """Drop every cached plan, loaded tuning database and given warning (tests; after changing the DB or env)."""
    with _lock:
        owners = list(_owners)
    for owner in owners:
        owner.__dict__.pop(PLANS, None)
    configs.reset()
