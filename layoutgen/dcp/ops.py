"""pack / combine as `torch.library` custom ops, so that `torch.compile(fullgraph=True)` traces them.

Generated modules route here by themselves while `torch.compiler.is_compiling()`
(`layoutgen.dcp.traced`): a compiled model just calls
`module.pack(...)` / `module.combine(...)`.  Importing `layoutgen.dcp.runtime`
registers the ops.  The ops
take tensors and ints, not the buffers object:

* `torch.ops.layoutgen.pack(out, lse, buffers, module, N, B_max, H, D, config, empty=None, max_stats=None, sum_stats=None)`
  writes into `buffers` (the buffers object's tensors, in `bufs.tensors` order); `lse` is None when the
  statistics come as `max_stats` and `sum_stats`, `empty` the optional bool mask [R];
* `torch.ops.layoutgen.combine(buffers, out, out_lse, module, N, B_max, H, D, B, lse_base, config, scale=1.0)`
  writes `out` [B, H/N, D] and, unless None, `out_lse` [B, H/N] (float32, contiguous).

`module` is the generated module's `__name__`, `config` a config's fields in
declaration order (`layoutgen.config.config_values`) or [] for the
dispatched default.  When the tensors are those of a live `alloc()` result the
op reuses its cached plans; otherwise (e.g. functionalisation handed it copies)
it validates and plans again, which is correct but slower.
"""

from __future__ import annotations

from typing import Any

import torch

from layoutgen.config import config_from_values
from layoutgen.dcp.combine_plan import check_out_lse
from layoutgen.dcp.config import CONFIG_TYPES
from layoutgen.dcp.dispatch import dispatcher
from layoutgen.dcp.plans import buffers_from_tensors
from layoutgen.runtime.tensors import check_one_device


def _config(kernel: str, values: list[int]) -> Any:
    return config_from_values(CONFIG_TYPES[kernel], values)


@torch.library.custom_op("layoutgen::pack", mutates_args=("buffers",))
def pack_op(
    out: torch.Tensor,
    lse: torch.Tensor | None,
    buffers: list[torch.Tensor],
    module: str,
    N: int,
    B_max: int,
    H: int,
    D: int,
    config: list[int],
    empty: torch.Tensor | None = None,
    max_stats: torch.Tensor | None = None,
    sum_stats: torch.Tensor | None = None,
) -> None:
    """Scatter out [B, H, D] (or [R, T, H, D]) and lse, or (max, sum), into the layout's buffers, rows of
    empty requests as +0.0 and an empty entry (see the generated module's pack)."""
    owner = dispatcher(module)
    bufs = buffers_from_tensors(owner.spec, buffers, N, B_max, H, D, out.dtype)
    max_sum = None if max_stats is None and sum_stats is None else (max_stats, sum_stats)
    owner.pack(out, lse, bufs, _config("pack", config), empty, max_sum)


@pack_op.register_fake
def _pack_fake(
    out: torch.Tensor,
    lse: torch.Tensor | None,
    buffers: list[torch.Tensor],
    module: str,
    N: int,
    B_max: int,
    H: int,
    D: int,
    config: list[int],
    empty: torch.Tensor | None = None,
    max_stats: torch.Tensor | None = None,
    sum_stats: torch.Tensor | None = None,
) -> None:
    check_one_device({"out": out, "lse": lse, "empty": empty, "max_stats": max_stats, "sum_stats": sum_stats}, buffers)


@torch.library.custom_op("layoutgen::combine", mutates_args=("out", "out_lse"))
def combine_op(
    buffers: list[torch.Tensor],
    out: torch.Tensor,
    out_lse: torch.Tensor | None,
    module: str,
    N: int,
    B_max: int,
    H: int,
    D: int,
    B: int,
    lse_base: str,
    config: list[int],
    scale: float = 1.0,
) -> None:
    """Merge the N partials of the first B rows of the buffers into out (and out_lse unless None), the
    merged output multiplied by `scale`."""
    owner = dispatcher(module)
    bufs = buffers_from_tensors(owner.spec, buffers, N, B_max, H, D, out.dtype)
    return_lse = out_lse is not None
    plan = owner.combine_plan(bufs, B, lse_base, out, return_lse, _config("combine", config), scale)
    if out_lse is not None:
        check_out_lse(plan, buffers, out, out_lse)
    if B:
        owner.combine_into(plan, bufs, out, out_lse)


@combine_op.register_fake
def _combine_fake(
    buffers: list[torch.Tensor],
    out: torch.Tensor,
    out_lse: torch.Tensor | None,
    module: str,
    N: int,
    B_max: int,
    H: int,
    D: int,
    B: int,
    lse_base: str,
    config: list[int],
    scale: float = 1.0,
) -> None:
    check_one_device({"out": out, "out_lse": out_lse}, buffers)
