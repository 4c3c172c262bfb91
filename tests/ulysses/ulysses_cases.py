"""Shared pieces of the Ulysses tests: specs (bundled and random), shapes, inputs, guarded outputs, and one
full pass of every kernel against the reference.

Kept in this folder (not tests/conftest.py, which is family-neutral); the tests import it by name.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from conftest import CANARY
from hypothesis import strategies as st

from layoutgen.runtime import configs
from layoutgen.tuning_db import TuningEntry, TuningKey
from layoutgen.ulysses import FAMILY as ULYSSES_FAMILY
from layoutgen.ulysses import reference
from layoutgen.ulysses.config import CONFIG_TYPES, TileConfig, runtime_default
from layoutgen.ulysses.layout import Shape, UlyssesBuffers, key_extents, tensor_shape
from layoutgen.ulysses.spec import HeadCount, UlyssesSpec

BUNDLED = (
    "deepspeed_ulysses",
    "deepspeed_ulysses_head_major",
    "yunchang_ulysses",
    "yunchang_ulysses_head_major",
    "ulysses_qkv_gqa",
)
KERNELS = ("scatter", "gather", "scatter_out", "gather_out")
#: Bytes of guard before and after every buffer or output a test lays into a larger allocation.
GUARD = 40


#: Tensor names a drawn spec picks from.
NAMES = ("q", "k", "v", "x", "gate", "out2")


@st.composite
def spec_data(draw: Any) -> dict[str, Any]:
    """Any valid spec: axis orders, batch or not, transports, one to three tensors of either head count, a
    buffer per tensor or a shared one with its tensor axis anywhere it may go."""
    batch = draw(st.booleans())
    base = ["seq", "head", "dim", *(["batch"] if batch else [])]
    transport = draw(st.sampled_from(["all_to_all_single", "external"]))

    def direction() -> dict[str, Any]:
        count = draw(st.integers(1, 3))
        names = draw(st.permutations(NAMES))[:count]
        tensors = [{"name": n, "heads": draw(st.sampled_from(["H", "H_kv"]))} for n in names]
        axes = [*draw(st.permutations(base))]
        axes.insert(0 if transport == "all_to_all_single" else draw(st.integers(0, len(axes))), "peer")
        if draw(st.booleans()):
            low = 1 if transport == "all_to_all_single" else 0
            position = draw(st.integers(low, len(axes)))
            if len({t["heads"] for t in tensors}) > 1:
                position = max(low, min(position, axes.index("head")))  # different head counts: head inside
            axes.insert(position, "tensor")
        return {"tensors": tensors, "wire": axes}

    return {
        "family": "ulysses",
        "name": "random_ulysses",
        "summary": "drawn by hypothesis",
        "transport": transport,
        "local": [*draw(st.permutations(base))],
        "attention": [*draw(st.permutations(base))],
        "to_attention": direction(),
        "from_attention": direction(),
    }


def make_shape(spec: UlyssesSpec, N: int, S_local: int, heads: int, kv_heads: int, D: int, B: int = 2,
               dtype: torch.dtype = torch.bfloat16) -> Shape:  # fmt: skip
    """A shape for `spec`: `heads` (and `kv_heads`) per peer; B only where the spec has a batch axis."""
    kv = spec.uses(HeadCount.H_KV)
    return Shape(N=N, S_local=S_local, H=N * heads, H_kv=N * (kv_heads if kv else heads), D=D, dtype=dtype,
                 B=B if spec.has_batch else 1)  # fmt: skip


def alloc_kwargs(spec: UlyssesSpec, shape: Shape) -> dict[str, int]:
    """The keyword arguments a generated `alloc` takes for this spec."""
    return {**({"B": shape.B} if spec.has_batch else {}), **({"H_kv": shape.H_kv} if spec.uses(HeadCount.H_KV) else {})}


def alloc(module: ModuleType, shape: Shape, direction: str, device: str = "cpu") -> UlyssesBuffers:
    allocate = module.alloc if direction == "to_attention" else module.alloc_out
    bufs = allocate(shape.N, shape.S_local, shape.H, shape.D, shape.dtype, device, **alloc_kwargs(module.SPEC, shape))
    return fill(bufs)


def fill(bufs: UlyssesBuffers, byte: int = CANARY) -> UlyssesBuffers:
    for tensor in bufs.tensors.values():
        tensor.view(torch.uint8).fill_(byte)
    return bufs


def guarded_buffers(
    spec: UlyssesSpec, direction: str, shape: Shape, device: str = "cpu"
) -> tuple[UlyssesBuffers, torch.Tensor]:
    """Buffers laid into one canary-filled allocation with GUARD bytes around each; (buffers, allocation)."""
    layout = UlyssesBuffers.allocate(spec, direction, shape, "meta").tensors
    item = shape.dtype.itemsize
    pad = GUARD // item
    total = sum(t.numel() + 2 * pad for t in layout.values())
    storage = torch.empty(total, dtype=shape.dtype, device=device)
    storage.view(torch.uint8).fill_(CANARY)
    tensors, offset = {}, 0
    for name, meta in layout.items():
        tensors[name] = storage[offset + pad : offset + pad + meta.numel()].view(meta.shape)
        offset += meta.numel() + 2 * pad
    return UlyssesBuffers(spec, direction, shape, tensors), storage


def random_tensor(extents: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Random values, never zero (a kernel that leaves zeros behind cannot pass by luck)."""
    values = torch.randn(extents, generator=generator)
    return torch.where(values.abs() < 1e-3, 1.0, values).to(dtype)


def strided_copy(tensor: torch.Tensor, kind: str) -> torch.Tensor:
    """The same values in a non-contiguous view (last stride 1) of a larger NaN-filled allocation:
    `wide` (every axis padded), `permuted` (outer axes stored in reverse order), or `contiguous`."""
    if kind == "contiguous":
        return tensor.clone()
    if kind == "wide":
        padded = [extent + 1 + position for position, extent in enumerate(tensor.shape)]
        big = torch.full(padded, float("nan"), dtype=tensor.dtype, device=tensor.device)
        view = big[tuple(slice(1, 1 + extent) for extent in tensor.shape[:-1])]
        view = view[..., 2 : 2 + tensor.shape[-1]]
    elif kind == "permuted":
        order = [*reversed(range(tensor.dim() - 1)), tensor.dim() - 1]
        big = torch.full([tensor.shape[i] for i in order], float("nan"), dtype=tensor.dtype, device=tensor.device)
        inverse = [order.index(i) for i in range(tensor.dim())]
        view = big.permute(inverse)
    else:
        raise ValueError(f"unknown stride kind {kind!r}")
    view.copy_(tensor)
    assert view.stride(-1) == 1 or tensor.shape[-1] == 1
    return view


STRIDE_KINDS = ("contiguous", "wide", "permuted")


def guarded_output(
    extents: tuple[int, ...], dtype: torch.dtype, kind: str, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """An output view (last stride 1) into a canary-filled allocation that also holds guard bytes; (view, allocation)."""
    if kind == "permuted":
        order = [*reversed(range(len(extents) - 1)), len(extents) - 1]
        inner = [extents[i] for i in order]
    else:
        inner = [extent + (1 if kind == "wide" else 0) for extent in extents]
    pad = GUARD // dtype.itemsize
    storage = torch.empty(math.prod(inner) + 2 * pad, dtype=dtype, device=device)
    storage.view(torch.uint8).fill_(CANARY)
    block = storage[pad : pad + math.prod(inner)].view(inner)
    if kind == "permuted":
        view = block.permute([order.index(i) for i in range(len(extents))])
    else:
        view = block[tuple(slice(0, extent) for extent in extents)]
    return view, storage


def untouched_outside(storage: torch.Tensor, views: list[torch.Tensor]) -> bool:
    """Every byte of `storage` outside the views still holds the canary."""
    owned = torch.zeros(storage.numel() * storage.element_size(), dtype=torch.bool)
    base = storage.data_ptr()
    for view in views:
        offsets = torch.zeros(view.shape, dtype=torch.int64) + (view.data_ptr() - base) // view.element_size()
        for axis, (extent, stride) in enumerate(zip(view.shape, view.stride(), strict=True)):
            offsets = offsets + (torch.arange(extent) * stride).view(
                [-1 if a == axis else 1 for a in range(view.dim())]
            )
        starts = offsets.reshape(-1) * view.element_size()
        owned[(starts[:, None] + torch.arange(view.element_size())).reshape(-1)] = True
    return bool((storage.view(torch.uint8).cpu()[~owned] == CANARY).all())


def same_bytes(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and torch.equal(
        got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)
    )


def assert_same_buffers(got: UlyssesBuffers, want: UlyssesBuffers, label: str) -> None:
    for name, tensor in got.tensors.items():
        got_bytes, want_bytes = tensor.reshape(-1).view(torch.uint8), want.tensors[name].reshape(-1).view(torch.uint8)
        if not torch.equal(got_bytes, want_bytes):
            differing = (got_bytes != want_bytes).nonzero().flatten()
            raise AssertionError(
                f"{label}: buffer {name!r}: {differing.numel()} of {got_bytes.numel()} bytes differ, first at "
                f"byte {int(differing[0])}"
            )


def as_tuple(result: Any) -> tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


@dataclass
class Pass:
    """What one scatter -> exchange -> gather -> identity attention -> scatter_out -> exchange -> gather_out
    pass produced, per rank."""

    shards: list[dict[str, torch.Tensor]]
    gathered: list[dict[str, torch.Tensor]]
    returned: list[dict[str, torch.Tensor]]


def identity_twins(spec: UlyssesSpec) -> dict[str, str | None]:
    """For each attention output, the input an identity attention returns as it: the first input with its head
    count, for the first output with that count only (a second output, e.g. a residual beside `out`, gets its
    own random bytes, so that swapping the two shows)."""
    twins: dict[str, str | None] = {}
    for tensor in spec.from_attention.tensors:
        first = all(spec_tensor.heads is not tensor.heads for spec_tensor in spec.from_attention.tensors[: len(twins)])
        twin = next((t.name for t in spec.to_attention.tensors if t.heads is tensor.heads), None)
        twins[tensor.name] = twin if first else None
    return twins


def run_pass(module: ModuleType, shape: Shape, generator: torch.Generator, configs: dict[str, TileConfig | None],
             stride_kind: str = "contiguous", fresh: bool = True, device: str = "cpu") -> Pass:  # fmt: skip
    """Every kernel of `module` on every rank, each output checked byte for byte against the reference
    (send buffers canary-filled, guard bytes around them and around gather's outputs untouched); `fresh`:
    gather also into new tensors."""
    spec: UlyssesSpec = module.SPEC
    N = shape.N
    to_names = [t.name for t in spec.to_attention.tensors]
    shards = [
        {
            t.name: random_tensor(tensor_shape(spec, shape, t, "local"), shape.dtype, generator).to(device)
            for t in spec.to_attention.tensors
        }
        for _ in range(N)
    ]
    sends = []
    for rank in range(N):
        ours, storage = guarded_buffers(spec, "to_attention", shape, device)
        theirs = fill(UlyssesBuffers.allocate(spec, "to_attention", shape, device))
        inputs = [strided_copy(shards[rank][name], stride_kind) for name in to_names]
        module.scatter(*inputs, ours, config=configs["scatter"])
        reference.scatter(shards[rank], theirs)
        assert_same_buffers(ours, theirs, f"scatter rank {rank}")
        assert untouched_outside(storage, list(ours.tensors.values())), "scatter wrote outside its buffers"
        assert all(same_bytes(i, shards[rank][n]) for i, n in zip(inputs, to_names, strict=True)), (
            "scatter changed its input"
        )
        sends.append(ours)
    received = reference.exchange(sends)
    gathered = []
    for rank in range(N):
        want = reference.gather(received[rank])
        outs = [guarded_output(tuple(want[name].shape), shape.dtype, stride_kind, device) for name in to_names]
        result = as_tuple(module.gather(received[rank], out=tuple(v for v, _ in outs) if len(outs) > 1 else outs[0][0],
                                        config=configs["gather"]))  # fmt: skip
        for name, got, (view, storage) in zip(to_names, result, outs, strict=True):
            assert got is view
            assert same_bytes(got, want[name]), f"gather rank {rank}: {name} differs from the reference"
            assert untouched_outside(storage, [view]), f"gather rank {rank} wrote outside {name}"
        if fresh:
            new = as_tuple(module.gather(received[rank], config=configs["gather"]))
            assert all(same_bytes(f, want[n]) for f, n in zip(new, to_names, strict=True)), "gather into new tensors"
        gathered.append(want)
    # Identity attention for the outputs that have a twin (`identity_twins`), random bytes for the others.
    outputs = []
    twins = identity_twins(spec)
    for rank in range(N):
        chosen = {}
        for tensor in spec.from_attention.tensors:
            twin = twins[tensor.name]
            extents = tensor_shape(spec, shape, tensor, "attention")
            chosen[tensor.name] = (
                gathered[rank][twin] if twin else random_tensor(extents, shape.dtype, generator).to(device)
            )
        outputs.append(chosen)
    sends_out = []
    for rank in range(N):
        ours = fill(UlyssesBuffers.allocate(spec, "from_attention", shape, device))
        theirs = fill(UlyssesBuffers.allocate(spec, "from_attention", shape, device))
        inputs = [strided_copy(outputs[rank][t.name], stride_kind) for t in spec.from_attention.tensors]
        module.scatter_out(*inputs, ours, config=configs["scatter_out"])
        reference.scatter_out(outputs[rank], theirs)
        assert_same_buffers(ours, theirs, f"scatter_out rank {rank}")
        sends_out.append(ours)
    received_out = reference.exchange(sends_out)
    returned = []
    for rank in range(N):
        want = reference.gather_out(received_out[rank])
        result = as_tuple(module.gather_out(received_out[rank], config=configs["gather_out"]))
        got = {t.name: tensor for t, tensor in zip(spec.from_attention.tensors, result, strict=True)}
        for name, tensor in got.items():
            assert same_bytes(tensor, want[name]), f"gather_out rank {rank}: {name} differs from the reference"
        # Into the caller's (strided, guarded) tensors too: nothing else checks the bytes `out=` receives.
        from_names = list(got)
        outs = [guarded_output(tuple(want[name].shape), shape.dtype, stride_kind, device) for name in from_names]
        into = as_tuple(module.gather_out(received_out[rank], out=tuple(v for v, _ in outs) if len(outs) > 1
                                          else outs[0][0], config=configs["gather_out"]))  # fmt: skip
        for name, tensor, (view, storage) in zip(from_names, into, outs, strict=True):
            assert tensor is view
            assert same_bytes(tensor, want[name]), f"gather_out(out=) rank {rank}: {name} differs from the reference"
            assert untouched_outside(storage, [view]), f"gather_out rank {rank} wrote outside {name}"
        returned.append(got)
    return Pass(shards, gathered, returned)


def default_configs() -> dict[str, TileConfig | None]:
    return dict.fromkeys(KERNELS)


def tiny_configs(**blocks: int) -> dict[str, TileConfig | None]:
    """Every kernel with the same (small) blocks: many programs, every decomposition path taken."""
    return {kernel: CONFIG_TYPES[kernel](**blocks, num_warps=1) for kernel in KERNELS}


def gather_entry(module: ModuleType, shape: Shape, bucket: int, num_warps: int, dtype: str = "bfloat16") -> TuningEntry:
    """A current tuning entry for `module`'s gather at `shape` (its dtype `dtype`, size bucket `bucket`): the
    runtime default config with `num_warps` changed, so a test can tell whether dispatch took it."""
    kernel = ULYSSES_FAMILY.kernel("gather")
    expected = configs.expected_for(kernel, module.SPEC_HASH, module.SOURCE_HASHES["gather"])
    return TuningEntry(
        key=TuningKey(
            family="ulysses",
            spec=module.SPEC_NAME,
            kernel="gather",
            extents=tuple(key_extents(module.SPEC, "gather", shape).items()),
            dtype=dtype,
            bucket_name=ULYSSES_FAMILY.bucket.name,
            bucket=bucket,
        ),
        config={**dataclasses.asdict(runtime_default(module.SPEC, "gather", shape)), "num_warps": num_warps},
        median_us=2.0,
        p20_us=1.9,
        p80_us=2.2,
        default_us=3.0,
        trials=10,
        spec_hash=module.SPEC_HASH,
        source_hash=module.SOURCE_HASHES["gather"],
        space_hash=expected.space_hash,
        timing_hash=expected.timing_hash,
        versions=dict(expected.versions),
        measured_at="2026-12-07T20:00:00+00:00",
        rotating_sets=1,
    )
