"""The Ulysses kernels as `torch.library` custom ops, so that `torch.compile(fullgraph=True)` traces them.

Generated modules route here by themselves while `torch.compiler.is_compiling()`: a compiled model just
calls `module.scatter(...)` / `module.gather(...)`.  Importing `layoutgen.ulysses.runtime` registers:

* `torch.ops.layoutgen.ulysses_scatter(tensors, buffers, module, shape, config)` and
  `torch.ops.layoutgen.ulysses_scatter_out(...)`: write `tensors` (the direction's, in order) into
  `buffers` (the buffers object's tensors, in `bufs.tensors` order);
* `torch.ops.layoutgen.ulysses_gather(buffers, out, module, shape, config)` and
  `torch.ops.layoutgen.ulysses_gather_out(...)`: write the direction's tensors into `out`.

`module` is the generated module's `__name__`, `shape` the buffers' [N, S_local, B, H, H_kv, D], `config`
a config's fields in declaration order (`layoutgen.config.config_values`) or [] for the
dispatched default.  When the tensors are those of a live `alloc()` result the op reuses its cached
plans; otherwise (e.g. functionalisation handed it copies) it validates and plans again.

The ops declare what they write (`mutates_args`), so torch bumps those tensors' autograd version counters
itself, as for its own in-place ops (the eager gather the op runs bumps its `out` again: harmless).
"""

from __future__ import annotations

from typing import Any

import torch

from layoutgen.config import config_from_values
from layoutgen.runtime.tensors import check_one_device
from layoutgen.ulysses.config import CONFIG_TYPES
from layoutgen.ulysses.dispatch import dispatcher, op_buffers
from layoutgen.ulysses.layout import KERNEL_DIRECTION


def _config(kernel: str, values: list[int]) -> Any:
    return config_from_values(CONFIG_TYPES[kernel], values)


def _register_scatter(kernel: str) -> Any:
    @torch.library.custom_op(f"layoutgen::ulysses_{kernel}", mutates_args=("buffers",))
    def scatter_op(
        tensors: list[torch.Tensor], buffers: list[torch.Tensor], module: str, shape: list[int], config: list[int]
    ) -> None:
        owner = dispatcher(module)
        bufs = op_buffers(owner.spec, KERNEL_DIRECTION[kernel], buffers, shape)
        owner.scatter(kernel, tuple(tensors), bufs, _config(kernel, config))

    @scatter_op.register_fake
    def _(
        tensors: list[torch.Tensor], buffers: list[torch.Tensor], module: str, shape: list[int], config: list[int]
    ) -> None:
        check_one_device({f"tensors[{i}]": tensor for i, tensor in enumerate(tensors)}, buffers)

    return scatter_op


def _register_gather(kernel: str) -> Any:
    @torch.library.custom_op(f"layoutgen::ulysses_{kernel}", mutates_args=("out",))
    def gather_op(
        buffers: list[torch.Tensor], out: list[torch.Tensor], module: str, shape: list[int], config: list[int]
    ) -> None:
        owner = dispatcher(module)
        bufs = op_buffers(owner.spec, KERNEL_DIRECTION[kernel], buffers, shape)
        owner.gather(kernel, bufs, tuple(out), _config(kernel, config))

    @gather_op.register_fake
    def _(
        buffers: list[torch.Tensor], out: list[torch.Tensor], module: str, shape: list[int], config: list[int]
    ) -> None:
        check_one_device({f"out[{i}]": tensor for i, tensor in enumerate(out)}, buffers)

    return gather_op


scatter_op = _register_scatter("scatter")
scatter_out_op = _register_scatter("scatter_out")
gather_op = _register_gather("gather")
gather_out_op = _register_gather("gather_out")
