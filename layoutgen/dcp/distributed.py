"""The DCP decode step across ranks: pack -> exchange -> combine on static buffers.

`DcpExchange` owns one send and one receive buffer set, allocated once with the
generated module's `alloc` for `B_max` rows.  A call with `B <= B_max` rows works
on a dense `B`-row layout laid over the first bytes of those buffers, so the
transport moves only live rows and no call allocates wire memory.  The bytes move
through the existing distributed engine -- `torch.distributed.all_to_all_single`
(NCCL on GPUs, gloo on CPU) or a transport the caller passes in; layoutgen never
moves bytes between ranks itself.

CUDA graphs: run each batch size once eagerly before capturing it (that call
validates, compiles the kernels and builds the `B`-row views); afterwards a call
does no host sync and allocates only its result, which comes from the graph's
memory pool during capture (pass `merged_out=` to write into a tensor of your own).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from layoutgen.dcp.checks import check_combine_scalars, check_scale, refuse_out_gradient
from layoutgen.dcp.exchange_inputs import check_call_inputs
from layoutgen.dcp.layout import INPUT_DTYPES, LayoutBuffers, Shape
from layoutgen.dcp.plans import remember_buffers
from layoutgen.dcp.spec import Transport
from layoutgen.runtime.exchange import ExchangeFn, call_exchange_fn, check_exchange_fn, refuse_unprepared_size
from layoutgen.runtime.groups import check_ranks_agree, generated_module, join_group, tell_peers_of_refusal
from layoutgen.runtime.tensors import as_int, describe, overlap, positive_int, required_device

_LSE_BASES = ("e", "2")


def _agreement_fields(layout: str | None, B_max: Any, H: Any, D: Any, dtype: Any, lse_base: Any) -> dict[str, Any]:
    """What every rank's DcpExchange must agree on; the raw arguments on a rank that refused them."""
    return {"spec layout (sha256 prefix)": layout, "B_max": B_max, "H": H, "D": D, "dtype": dtype,
            "lse_base": lse_base}  # fmt: skip


class DcpExchange:
    """Merge this rank's head block of the partial attention results of every rank in `group`.

    Args:
        spec: a bundled spec name (``"pynccl_a2a"``), a generated module (``layoutgen.load(...)``)
            or the path of a generated ``.py``.
        group: the DCP process group (``None``: the default group). Its size is N, the number of
            KV shards; every rank must construct the exchange with the same arguments (one all_gather
            checks them: a rank whose arguments are refused raises its error, every other rank one naming it).
        B_max: the most query rows one call may carry (B, or R * T for ``out [R, T, H, D]``).
        H, D: heads of ``out`` (all of them, divisible by N) and the head dimension.
        dtype, device: of ``out``; the buffers live on ``device``.
        lse_base: ``"e"`` or ``"2"``, the base of the LSEs the attention kernel produced.
        exchange_fn: the transport, ``exchange_fn(send_tensors, recv_tensors)`` over dicts of buffer
            name -> tensor (views of the static buffers, dense in the spec's layout at the call's B): it writes
            into the receive views (``recv_tensors[name].copy_(...)``; replacing one is refused). Required for ``external`` specs, in a group of one too (see `flashinfer_mnnvl_exchange`); for
            ``all_to_all_single`` specs it replaces the default one ``all_to_all_single`` per buffer.

    ``exchange(out [B, H, D], lse [B, H])`` returns this rank's merged ``[B, H/N, D]`` (and its LSE
    ``[B, H/N]`` with ``return_lse=True``); ``out [R, T, H, D]`` (T tokens per request) gives
    ``[R, T, H/N, D]``. ``empty=`` (bool ``[R]``) marks requests with nothing on this rank, ``max_sum=``
    takes (max, sum) statistics instead of ``lse``, ``scale=`` multiplies the merged output (see the
    generated module's ``pack`` and ``combine``). Every rank must call with the same B, as DCP does (each
    rank holds every query): unequal B is not checked (a collective per call) and ends in the backend's
    error or a hang inside the exchange. Likewise an argument one rank refuses: that rank raises before the
    exchange and the others wait in it until the group's timeout, so an engine that catches the error must
    stop the step on every rank. A group of one rank packs and combines its one partial without an exchange:
    the same rules for empty shards (an LSE of -inf, NaN or +inf, an empty (max, sum), an ``empty`` request
    merge to 0 and LSE -inf), the same bits as any N.
    """

    def __init__(
        self,
        spec: Any,
        group: Any = None,
        *,
        B_max: int,
        H: int,
        D: int,
        dtype: torch.dtype,
        device: torch.device | str,
        lse_base: str = "e",
        exchange_fn: ExchangeFn | None = None,
    ) -> None:
        self.group = group
        try:
            self._build(spec, B_max, H, D, dtype, device, lse_base, exchange_fn)
        except Exception:
            # Its peers are (or will be) in the agreement all_gather: this rank takes part, marked refused.
            module = getattr(self, "module", None)
            layout = None if module is None else module.SPEC.layout_hash()
            fields = _agreement_fields(layout, B_max, H, D, dtype, lse_base)
            tell_peers_of_refusal(fields, group, device, "DcpExchange")
            raise
        if self.world_size > 1:
            # One all_gather: a rank built with other arguments would otherwise hang or exchange garbage on the
            # first call.
            fields = _agreement_fields(self.spec.layout_hash(), self.B_max, self.H, self.D, dtype, lse_base)
            check_ranks_agree(fields, group, self.device, "DcpExchange")

    def _build(
        self,
        spec: Any,
        B_max: int,
        H: int,
        D: int,
        dtype: torch.dtype,
        device: torch.device | str,
        lse_base: str,
        exchange_fn: ExchangeFn | None,
    ) -> None:
        """Every check of this rank's arguments, and the buffers' allocation."""
        self.module = generated_module(spec, "dcp", ("alloc", "pack", "combine"), "DcpExchange")
        self.spec = self.module.SPEC
        ready_made = "layoutgen.dcp.distributed.flashinfer_mnnvl_exchange(workspace, rank, N)"
        check_exchange_fn(
            self.spec.name,
            self.spec.transport is Transport.EXTERNAL,
            exchange_fn,
            f" with FlashInfer MNNVL's all-to-all: {ready_made}"
            if self.spec.name == "flashinfer_mnnvl"
            else " with your transport's all-to-all (TensorRT-LLM helix's for its native layouts)",
        )
        if lse_base not in _LSE_BASES:
            raise ValueError(f"lse_base must be 'e' or '2', got {lse_base!r}")
        if dtype not in INPUT_DTYPES:
            raise TypeError(f"dtype must be one of {[str(d) for d in INPUT_DTYPES]}, got {dtype}")
        self.B_max = positive_int("B_max", B_max)
        self.H = positive_int("H", H)
        self.D = positive_int("D", D)
        self.dtype = dtype
        self.device = required_device(device, "DcpExchange")
        self.lse_base = lse_base
        self.exchange_fn = exchange_fn
        self.rank, self.world_size = join_group(self.group, self.device, "DcpExchange", "DCP")
        if self.H % self.world_size:
            raise ValueError(
                f"H={self.H} heads cannot be split evenly over the group's {self.world_size} ranks; "
                "H must be divisible by the world size"
            )
        self.heads_per_rank = self.H // self.world_size
        self._checked_inputs: set[tuple[Any, ...]] = set()
        self._views: dict[int, tuple[LayoutBuffers, LayoutBuffers]] = {}
        N = self.world_size
        self.send: LayoutBuffers = self.module.alloc(N, self.B_max, self.H, self.D, self.dtype, self.device)
        # One rank sends nothing: combine reads the partial where pack wrote it.
        self.recv: LayoutBuffers = self.send
        if N > 1:
            self.recv = self.module.alloc(N, self.B_max, self.H, self.D, self.dtype, self.device)

    def prepare(self, *batches: int) -> None:
        """Lay out the views of these batch sizes now (every B from 1 to B_max when none is named).

        Under ``torch.compile(fullgraph=True)`` a call may only carry a B prepared here or called eagerly
        before: building a new B's views cannot be traced (without ``fullgraph`` that call runs eagerly)."""
        for B in batches or range(1, self.B_max + 1):
            self.batch_buffers(as_int(B))

    def batch_buffers(self, B: int) -> tuple[LayoutBuffers, LayoutBuffers]:
        """(send, recv) for a B-row call: the spec's dense layout at B_max=B over the static buffers'
        first bytes (no allocation; the same objects every call with this B)."""
        views = self._views.get(B)
        if views is not None:
            return views
        if isinstance(B, bool) or not isinstance(B, int) or not 1 <= B <= self.B_max:
            raise ValueError(f"B must be an int in [1, B_max={self.B_max}], got {B!r}")
        refuse_unprepared_size("DcpExchange", "B", B)
        shapes = LayoutBuffers.allocate(self.spec, self.world_size, B, self.H, self.D, self.dtype, "meta").tensors
        shape = Shape(self.world_size, B, self.H, self.D, self.dtype)

        def prefix(static: LayoutBuffers) -> LayoutBuffers:
            tensors = {
                name: static.tensors[name].view(-1)[: meta.numel()].view(meta.shape) for name, meta in shapes.items()
            }
            # Remembered, so that the custom ops under torch.compile find the views' cached plans.
            return remember_buffers(LayoutBuffers(self.spec, shape, tensors))

        send = prefix(self.send)
        views = (send, send if self.recv is self.send else prefix(self.recv))
        self._views[B] = views
        return views

    def _check_inputs(
        self, out: Any, lse: Any, empty: Any, max_sum: Any, merged_out: Any = None, merged_lse_out: Any = None
    ) -> tuple[int, tuple[int, ...]]:
        """Validate a call's inputs (once per shape, stride, dtype and device); (rows, out's leading shape)."""
        return check_call_inputs(self, out, lse, empty, max_sum, merged_out, merged_lse_out)

    def __call__(
        self,
        out: torch.Tensor,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        *,
        empty: torch.Tensor | None = None,
        max_sum: tuple[torch.Tensor, torch.Tensor] | None = None,
        scale: float = 1.0,
        merged_out: torch.Tensor | None = None,
        merged_lse_out: torch.Tensor | None = None,
    ) -> Any:
        """Pack -> exchange -> combine: this rank's merged ``[B, H/N, D]`` (``[R, T, H/N, D]`` for a 4-D
        ``out``), and its LSE (``[B, H/N]`` / ``[R, T, H/N]``, in ``lse_base``) when ``return_lse``.

        ``lse`` or ``max_sum=(max, sum)`` give the statistics (see the module's ``pack``); ``empty`` (bool
        ``[R]``) marks requests with nothing on this rank: they count as empty shards everywhere.
        ``scale`` multiplies the merged output. ``merged_out`` (the result's shape, ``out``'s dtype and
        device) receives the result instead of a new tensor; ``merged_lse_out`` (float32, contiguous, the
        LSE's shape) receives the LSE (it implies ``return_lse``)."""
        if merged_lse_out is not None and return_lse is False:  # any other value is validated as return_lse
            return_lse = True
        B, lead = self._check_inputs(out, lse, empty, max_sum, merged_out, merged_lse_out)
        for name, given in (("merged_out", merged_out), ("merged_lse_out", merged_lse_out)):
            if given is not None and torch.is_grad_enabled() and getattr(given, "requires_grad", False) is True:
                refuse_out_gradient("DcpExchange", name)  # combine would refuse it, naming its own argument
        # While torch.compile traces, tensors have no address: combine's op checks the pair when it runs.
        if (
            merged_out is not None
            and merged_lse_out is not None
            and not torch.compiler.is_compiling()
            and overlap(merged_out, merged_lse_out)
        ):
            raise ValueError(
                "merged_lse_out must not share memory with merged_out: pass a tensor of its own (e.g. torch.empty); "
                f"got {describe(merged_lse_out)}"
            )
        h = self.heads_per_rank
        flat_out = None if merged_out is None else merged_out.view(B, h, self.D)
        if B == 0:
            # combine, which checks these, does not run: refuse them here as at any other B.
            check_combine_scalars(B, self.B_max, self.lse_base, return_lse)
            check_scale(scale)
            # Every rank has the same B: all of them skip the collective together.
            merged = out.new_empty((*lead, h, self.D)) if merged_out is None else merged_out
            if merged_lse_out is None:
                merged_lse_out = out.new_empty((*lead, h), dtype=torch.float32)
            return (merged, merged_lse_out) if return_lse else merged
        send, recv = self.batch_buffers(B)
        self.module.pack(out, lse, send, empty=empty, max_sum=max_sum)
        if self.world_size > 1:  # one rank's combine reads what its pack wrote
            if self.exchange_fn is not None:
                call_exchange_fn(self.exchange_fn, send.tensors, recv.tensors)
            else:
                self.module.exchange(send, recv, self.group)
        flat_lse = None if merged_lse_out is None else merged_lse_out.view(B, h)
        merged, merged_lse = self.module.combine(
            recv, B, lse_base=self.lse_base, out=flat_out, return_lse=return_lse, scale=scale, out_lse=flat_lse
        )
        if len(lead) == 2:
            merged = merged.view(*lead, h, self.D) if merged_out is None else merged_out
            merged_lse = None if merged_lse is None else merged_lse.view(*lead, h)
        elif merged_out is not None:
            merged = merged_out
        if merged_lse_out is not None:
            merged_lse = merged_lse_out
        return (merged, merged_lse) if return_lse else merged

    def __repr__(self) -> str:
        return (
            f"DcpExchange(spec={self.spec.name!r}, rank={self.rank}, world_size={self.world_size}, "
            f"B_max={self.B_max}, H={self.H}, D={self.D}, dtype={self.dtype}, device={self.device}, "
            f"lse_base={self.lse_base!r}, exchange={'exchange_fn' if self.exchange_fn else 'all_to_all_single'})"
        )


_FLASHINFER_DTYPES = (torch.float16, torch.bfloat16)


def flashinfer_mnnvl_exchange(
    workspace: torch.Tensor, rank: int, world_size: int, *, enable_pdl: bool | None = None
) -> ExchangeFn:
    """An `exchange_fn` for the ``flashinfer_mnnvl`` spec over FlashInfer's ``decode_cp_a2a_alltoall``.

    ``workspace`` comes from ``flashinfer.comm.dcp_alltoall.decode_cp_a2a_allocate_workspace`` and has
    been initialised (``decode_cp_a2a_init_workspace`` on every rank, then a barrier) as FlashInfer
    requires. FlashInfer returns new tensors rather than writing into ours, so each call copies them
    into the receive buffers (two device copies). Needs an SM90+ GPU, fp16/bf16 and
    ``D * element size`` a multiple of 16 bytes.
    """
    try:
        from flashinfer.comm.dcp_alltoall import decode_cp_a2a_alltoall
    except ImportError as error:
        raise ImportError(
            "flashinfer_mnnvl_exchange needs FlashInfer's DCP all-to-all (flashinfer.comm.dcp_alltoall."
            "decode_cp_a2a_alltoall), which is not importable: install a FlashInfer that ships it "
            f"(pip install flashinfer-python); the import failed with: {error}"
        ) from error
    if not isinstance(workspace, torch.Tensor):
        raise TypeError(f"workspace must be FlashInfer's int64 workspace tensor, got {type(workspace).__name__}")
    _require_sm90(workspace.device)
    world_size = positive_int("world_size", world_size)
    rank = as_int(rank)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, world_size={world_size}), got {rank!r}")
    checked: set[tuple[Any, ...]] = set()

    def exchange(send: Mapping[str, torch.Tensor], recv: Mapping[str, torch.Tensor]) -> None:
        payload, stats = send["payload"], send["stats"]
        key = (payload.shape, payload.dtype, stats.shape)
        if key not in checked:
            if payload.dtype not in _FLASHINFER_DTYPES:
                raise TypeError(f"FlashInfer's DCP all-to-all moves fp16 or bf16 payloads; got {payload.dtype}")
            if payload.shape[-1] * payload.element_size() % 16:
                raise ValueError(
                    f"FlashInfer's DCP all-to-all needs D * element size to be a multiple of 16 bytes; "
                    f"got D={payload.shape[-1]} of {payload.dtype}"
                )
            if payload.shape[-2] != world_size:
                raise ValueError(f"payload has {payload.shape[-2]} peers on axis -2, the workspace {world_size}")
            checked.add(key)
        received_payload, received_stats = decode_cp_a2a_alltoall(
            payload, stats, workspace, rank, world_size, enable_pdl
        )
        recv["payload"].copy_(received_payload)
        recv["stats"].copy_(received_stats)

    return exchange


def _require_sm90(device: torch.device) -> None:
    if device.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(
            f"FlashInfer's DCP all-to-all needs an NVIDIA GPU of compute capability 9.0 or newer (Hopper, SM90+) "
            f"with CUDA; the workspace is on {device}"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < (9, 0):
        raise RuntimeError(
            f"FlashInfer's DCP all-to-all needs compute capability 9.0 or newer (Hopper, SM90+); "
            f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}"
        )
