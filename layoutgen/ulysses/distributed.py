"""The Ulysses all-to-all across ranks: scatter -> exchange -> gather on static buffers, and back.

`UlyssesExchange` owns the send and receive buffers of both directions, allocated once with the generated
module's `alloc` / `alloc_out` for `S_max` rows per shard.  A call with `S_local <= S_max` rows works on
the spec's dense `S_local`-row layout laid over the first bytes of those buffers, so the transport moves
only live rows and no call allocates wire memory.  The bytes move through `torch.distributed`
(`all_to_all_single` per buffer: NCCL on GPUs, gloo on CPU, the same code) or a transport the caller
passes in; layoutgen never moves bytes between ranks itself.

CUDA graphs: run each S_local once eagerly before capturing it (that call validates, compiles the kernels
and builds the `S_local`-row views); afterwards a call does no host sync and allocates only its results,
which come from the graph's memory pool during capture (pass `out=` to write into tensors of your own).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from layoutgen.runtime.exchange import (
    ExchangeFn,
    all_to_all_tensors,
    call_exchange_fn,
    check_exchange_fn,
    refuse_unprepared_size,
)
from layoutgen.runtime.groups import check_ranks_agree, generated_module, join_group, tell_peers_of_refusal
from layoutgen.runtime.tensors import as_int, describe, positive_int, required_device
from layoutgen.ulysses.dispatch import remember_buffers
from layoutgen.ulysses.layout import DTYPES, Shape, UlyssesBuffers, check_shape
from layoutgen.ulysses.spec import HeadCount, Transport, UlyssesSpec


def _agreement_fields(layout: str | None, S_max: Any, H: Any, H_kv: Any, D: Any, B: Any, dtype: Any) -> dict[str, Any]:
    """What every rank's UlyssesExchange must agree on; the raw arguments on a rank that refused them."""
    return {"spec layout (sha256 prefix)": layout, "S_max": S_max, "H": H, "H_kv": H_kv, "D": D, "B": B,
            "dtype": dtype}  # fmt: skip


class UlyssesExchange:
    """Regroup this rank's sequence shards for attention over its head block, and the attention output back.

    Args:
        spec: a bundled spec name (``"ulysses_qkv_gqa"``), a generated module (``layoutgen.load(...)``) or
            the path of a generated ``.py``.
        group: the sequence-parallel process group (``None``: the default group).  Its size is N; every
            rank must construct the exchange with the same arguments (one all_gather checks them: a rank whose
            arguments are refused raises its error, every other rank one naming it).
        S_max: the most rows one shard may have.
        H, D: heads of H-headed tensors (q, the attention output; divisible by N) and the head dim.
        dtype, device: of the tensors; the buffers live on ``device``.
        H_kv: heads of H_kv-headed tensors (GQA k and v; divisible by N), for specs that have them.
        B: sequences, for specs with a batch axis.
        exchange_fn: the transport, ``exchange_fn(send_tensors, recv_tensors)`` over dicts of buffer name ->
            tensor (views of the static buffers, dense in the spec's layout at the call's S_local).  Required
            for ``external`` specs; for ``all_to_all_single`` specs it replaces one ``all_to_all_single``
            per buffer.

    ``to_attention(q, k, v)`` takes the shards (the spec's local layout, S_local <= S_max rows, any strides
    with the last one 1) and returns them in the attention layout over the whole sequence for this rank's
    head block; ``from_attention(out)`` takes the attention output and returns this rank's shard of it.
    Every rank must call with the same S_local, as sequence parallelism does.
    """

    def __init__(
        self,
        spec: Any,
        group: Any = None,
        *,
        S_max: int,
        H: int,
        D: int,
        dtype: torch.dtype,
        device: torch.device | str,
        H_kv: int | None = None,
        B: int = 1,
        exchange_fn: ExchangeFn | None = None,
    ) -> None:
        self.group = group
        try:
            self._build(spec, S_max, H, D, dtype, device, H_kv, B, exchange_fn)
        except Exception:
            # Its peers are (or will be) in the agreement all_gather: this rank takes part, marked refused.
            module = getattr(self, "module", None)
            layout = None if module is None else module.SPEC.layout_hash()
            fields = _agreement_fields(layout, S_max, H, H if H_kv is None else H_kv, D, B, dtype)
            tell_peers_of_refusal(fields, group, device, "UlyssesExchange")
            raise
        if self.world_size > 1:
            shape = self.shape
            # The checked sizes, not the raw arguments: a NumPy integer is unreadable to the agreement and was skipped.
            fields = _agreement_fields(
                self.spec.layout_hash(), self.S_max, shape.H, shape.H_kv, shape.D, shape.B, dtype
            )
            check_ranks_agree(fields, group, self.device, "UlyssesExchange")

    def _build(
        self,
        spec: Any,
        S_max: int,
        H: int,
        D: int,
        dtype: torch.dtype,
        device: torch.device | str,
        H_kv: int | None,
        B: int,
        exchange_fn: ExchangeFn | None,
    ) -> None:
        """Every check of this rank's arguments, and the buffers' allocation."""
        self.module = generated_module(spec, "ulysses", ("alloc", "alloc_out", "scatter", "gather"), "UlyssesExchange")
        self.spec: UlyssesSpec = self.module.SPEC
        check_exchange_fn(self.spec.name, self.spec.transport is Transport.EXTERNAL, exchange_fn)
        if H_kv is None and self.spec.uses(HeadCount.H_KV):
            raise TypeError(f"spec '{self.spec.name}' has H_kv-headed tensors: pass H_kv")
        if H_kv is not None and not self.spec.uses(HeadCount.H_KV):
            raise TypeError(f"spec '{self.spec.name}' has no H_kv-headed tensors: leave H_kv out (got H_kv={H_kv!r})")
        if dtype not in DTYPES:
            raise TypeError(f"dtype must be one of {[str(d) for d in DTYPES]}, got {dtype}")
        self.device = required_device(device, "UlyssesExchange")
        self.exchange_fn = exchange_fn
        S_max = positive_int("S_max", S_max)
        self.rank, self.world_size = join_group(self.group, self.device, "UlyssesExchange", "sequence-parallel")
        self.shape = Shape.of(
            N=self.world_size, S_local=S_max, H=H, H_kv=H if H_kv is None else H_kv, D=D, dtype=dtype, B=B
        )
        check_shape(self.spec, self.shape)
        self.S_max = S_max
        self._views: dict[tuple[str, int], tuple[UlyssesBuffers, UlyssesBuffers]] = {}
        self._static = {
            direction: tuple(UlyssesBuffers.allocate(self.spec, direction, self.shape, self.device) for _ in range(2))
            for direction in ("to_attention", "from_attention")
        }

    def prepare(self, *S_locals: int) -> None:
        """Lay out both directions' views of these shard lengths now (every S_local from 1 to S_max when none
        is named).

        Under ``torch.compile(fullgraph=True)`` a call may only carry an S_local prepared here or called
        eagerly before: building a new S_local's views cannot be traced (without ``fullgraph`` that call runs
        eagerly)."""
        for S_local in S_locals or range(1, self.S_max + 1):
            for direction in ("to_attention", "from_attention"):
                self.buffers(direction, as_int(S_local))

    def buffers(self, direction: str, S_local: int) -> tuple[UlyssesBuffers, UlyssesBuffers]:
        """(send, recv) of `direction` for an S_local-row call: the spec's dense layout at S_local over the
        static buffers' first bytes (no allocation; the same objects every call with this S_local)."""
        views = self._views.get((direction, S_local))
        if views is not None:
            return views
        if isinstance(S_local, bool) or not isinstance(S_local, int) or not 1 <= S_local <= self.S_max:
            raise ValueError(f"S_local must be an int in [1, S_max={self.S_max}], got {S_local!r}")
        refuse_unprepared_size("UlyssesExchange", "S_local", S_local)
        shape = dataclasses.replace(self.shape, S_local=S_local)
        layout = UlyssesBuffers.allocate(self.spec, direction, shape, "meta").tensors

        def prefix(static: UlyssesBuffers) -> UlyssesBuffers:
            tensors = {
                name: static.tensors[name].view(-1)[: meta.numel()].view(meta.shape) for name, meta in layout.items()
            }
            return remember_buffers(UlyssesBuffers(self.spec, direction, shape, tensors))

        send, recv = self._static[direction]
        views = (prefix(send), prefix(recv))
        self._views[(direction, S_local)] = views
        return views

    def _seq_extent(self, tensors: tuple[Any, ...], axes: tuple[str, ...], what: str, names: list[str]) -> int:
        if len(tensors) != len(names):
            raise TypeError(f"{what} takes the tensors {names} (in this order), got {len(tensors)}")
        first = tensors[0]
        if not isinstance(first, torch.Tensor) or first.dim() != len(axes):
            raise TypeError(
                f"{what}: {names[0]} must be a torch.Tensor with axes [{', '.join(axes)}], got "
                + (describe(first) if isinstance(first, torch.Tensor) else type(first).__name__)
            )
        return int(first.shape[axes.index("seq")])

    def _move(self, direction: str, S_local: int) -> UlyssesBuffers:
        send, recv = self.buffers(direction, S_local)
        if self.world_size == 1:
            return send  # one rank: what it sends is what it receives
        if self.exchange_fn is not None:
            call_exchange_fn(self.exchange_fn, send.tensors, recv.tensors)
        else:
            all_to_all_tensors(send.tensors, recv.tensors, self.group)
        return recv

    def to_attention(self, *tensors: torch.Tensor, out: Any = None) -> Any:
        """Scatter -> exchange -> gather: the shards (local layout) -> the attention layout for this rank's
        head block over the whole sequence (a tensor, or a tuple of them in the spec's order)."""
        names = [t.name for t in self.spec.to_attention.tensors]
        S_local = self._seq_extent(tensors, self.spec.local, "to_attention", names)
        if S_local < 1:
            raise ValueError(
                f"to_attention: {names[0]} has no rows; a shard needs at least one; got {describe(tensors[0])}"
            )
        if S_local > self.S_max:
            raise ValueError(
                f"to_attention: {names[0]} has S_local={S_local} rows; this UlyssesExchange takes 1 to "
                f"S_max={self.S_max} rows per shard (build one with a larger S_max); got {describe(tensors[0])}"
            )
        send, _ = self.buffers("to_attention", S_local)
        self._call("to_attention", self.module.scatter, *tensors, send)
        return self._call("to_attention", self.module.gather, self._move("to_attention", S_local), out=out)

    def from_attention(self, *tensors: torch.Tensor, out: Any = None) -> Any:
        """Scatter_out -> exchange -> gather_out: the attention output over the whole sequence for this rank's
        head block -> this rank's shard of it, all heads (local layout)."""
        names = [t.name for t in self.spec.from_attention.tensors]
        S = self._seq_extent(tensors, self.spec.attention, "from_attention", names)
        if S % self.world_size:
            raise ValueError(
                f"from_attention: {names[0]} has {S} rows, not a multiple of the group's {self.world_size} ranks; "
                f"got {describe(tensors[0])}"
            )
        S_local = S // self.world_size
        if S_local < 1:
            raise ValueError(
                f"from_attention: {names[0]} has no rows; each rank's shard needs at least one; got {describe(tensors[0])}"
            )
        if S_local > self.S_max:
            raise ValueError(
                f"from_attention: {names[0]} has {S} rows, S_local={S_local} per rank; this UlyssesExchange takes 1 "
                f"to S_max={self.S_max} rows per shard, so 1 to {self.S_max * self.world_size} rows here (build one "
                f"with a larger S_max); got {describe(tensors[0])}"
            )
        send, _ = self.buffers("from_attention", S_local)
        self._call("from_attention", self.module.scatter_out, *tensors, send)
        return self._call("from_attention", self.module.gather_out, self._move("from_attention", S_local), out=out)

    def _call(self, what: str, function: Any, *args: Any, **kwargs: Any) -> Any:
        """The module's scatter or gather, whose refusal is reworded for this call: it names `what` (not the
        function the user did not call), and for a shape or dtype the sizes this exchange was built for."""
        if torch.compiler.is_compiling():
            return function(*args, **kwargs)
        try:
            return function(*args, **kwargs)
        except (TypeError, ValueError, RuntimeError) as error:
            reason = str(error).removeprefix(f"{function.__name__}: ")
            if "(the buffers' shape)" in reason or "(the buffers' dtype)" in reason:
                shape = self.shape
                kv_heads = f", H_kv={shape.H_kv}" if shape.H_kv != shape.H else ""
                reason += (
                    f". This UlyssesExchange was built for dtype {shape.dtype}, B={shape.B}, H={shape.H}{kv_heads}, "
                    f"D={shape.D}: build another for other sizes"
                )
            raise type(error)(f"{what}: {reason}") from None

    def __repr__(self) -> str:
        shape = self.shape
        return (
            f"UlyssesExchange(spec={self.spec.name!r}, rank={self.rank}, world_size={self.world_size}, "
            f"S_max={self.S_max}, B={shape.B}, H={shape.H}, H_kv={shape.H_kv}, D={shape.D}, dtype={shape.dtype}, "
            f"device={self.device}, exchange={'exchange_fn' if self.exchange_fn else 'all_to_all_single'})"
        )
