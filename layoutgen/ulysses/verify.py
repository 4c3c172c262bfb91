"""Check a generated module against the reference on small random problems (`layoutgen build`)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from layoutgen.family import Check, VerifyReport
from layoutgen.ulysses import reference
from layoutgen.ulysses.layout import Shape, UlyssesBuffers, tensor_shape
from layoutgen.ulysses.spec import HeadCount, UlyssesSpec

CANARY = 0xA5
KERNELS = ("scatter", "gather", "scatter_out", "gather_out")
# (N, S_local, B, heads per peer, kv heads per peer, D, dtype): one rank, S_local = 1 and H/N = 1, odd
# sizes, D not a power of two, every dtype.
VERIFY_SHAPES: tuple[tuple[int, int, int, int, int, int, torch.dtype], ...] = (
    (1, 1, 1, 1, 1, 8, torch.bfloat16),
    (2, 3, 2, 3, 1, 24, torch.bfloat16),
    (3, 2, 1, 1, 2, 10, torch.float16),
    (4, 5, 3, 2, 1, 12, torch.float32),
    (8, 1, 2, 1, 1, 8, torch.bfloat16),
)


def filled(bufs: UlyssesBuffers, byte: int = CANARY) -> UlyssesBuffers:
    for tensor in bufs.tensors.values():
        tensor.view(torch.uint8).fill_(byte)
    return bufs


def same_bytes(left: torch.Tensor, right: torch.Tensor) -> bool:
    return left.shape == right.shape and torch.equal(
        left.contiguous().view(torch.uint8), right.contiguous().view(torch.uint8)
    )


def round_trip_twins(spec: UlyssesSpec) -> dict[str, str]:
    """from_attention tensor -> the to_attention tensor whose shard a round trip through identity attention
    returns (the first one with its head count)."""
    twins = {}
    for tensor in spec.from_attention.tensors:
        twin = next((t.name for t in spec.to_attention.tensors if t.heads is tensor.heads), None)
        if twin is not None:
            twins[tensor.name] = twin
    return twins


class _Run:
    """One shape of one module: allocations, random inputs and the comparisons, failures collected."""

    def __init__(self, module: ModuleType, shape: Shape, device: str, generator: torch.Generator) -> None:
        self.module = module
        self.spec: UlyssesSpec = module.SPEC
        self.shape = shape
        self.device = device
        self.generator = generator
        self.failures: list[str] = []
        self.differing: set[str] = set()
        self.label = (
            f"N={shape.N} S_local={shape.S_local} B={shape.B} H={shape.H} H_kv={shape.H_kv} D={shape.D} "
            f"{str(shape.dtype).removeprefix('torch.')}"
        )

    def alloc(self, direction: str) -> UlyssesBuffers:
        shape, spec = self.shape, self.spec
        keywords = {
            **({"B": shape.B} if spec.has_batch else {}),
            **({"H_kv": shape.H_kv} if spec.uses(HeadCount.H_KV) else {}),
        }
        allocate = self.module.alloc if direction == "to_attention" else self.module.alloc_out
        return filled(allocate(shape.N, shape.S_local, shape.H, shape.D, shape.dtype, self.device, **keywords))

    def random(self, direction: str, side: str) -> dict[str, torch.Tensor]:
        return {
            t.name: torch.randn(tensor_shape(self.spec, self.shape, t, side), generator=self.generator)
            .to(self.shape.dtype)
            .to(self.device)
            for t in self.spec.direction(direction).tensors
        }

    def differs(self, kernel: str, rank: int, what: str = "differs from the reference") -> None:
        self.differing.add(kernel)
        self.failures.append(f"{kernel} {what} at {self.label}, rank {rank}")

    def scatter(self, kernel: str, direction: str, inputs: list[dict[str, torch.Tensor]]) -> list[UlyssesBuffers]:
        sends = []
        for rank, tensors in enumerate(inputs):
            ours = self.alloc(direction)
            theirs = filled(UlyssesBuffers.allocate(self.spec, direction, self.shape, self.device))
            getattr(self.module, kernel)(*tensors.values(), ours)
            (reference.scatter if kernel == "scatter" else reference.scatter_out)(tensors, theirs)
            if not all(same_bytes(ours.tensors[name], theirs.tensors[name]) for name in ours.tensors):
                self.differs(kernel, rank)
            sends.append(ours)
        return sends

    def gather(self, kernel: str, direction: str, received: list[UlyssesBuffers]) -> list[dict[str, torch.Tensor]]:
        results = []
        names = [t.name for t in self.spec.direction(direction).tensors]
        for rank, recv in enumerate(received):
            got = getattr(self.module, kernel)(recv)
            got = dict(zip(names, got if isinstance(got, tuple) else (got,), strict=True))
            want = (reference.gather if kernel == "gather" else reference.gather_out)(recv)
            if not all(same_bytes(got[name], want[name]) for name in names):
                self.differs(kernel, rank)
            results.append(got)
        return results

    def run(self) -> None:
        """scatter -> exchange -> gather -> identity attention -> scatter_out -> exchange -> gather_out."""
        N = self.shape.N
        shards = [self.random("to_attention", "local") for _ in range(N)]
        gathered = self.gather(
            "gather", "to_attention", reference.exchange(self.scatter("scatter", "to_attention", shards))
        )
        twins = round_trip_twins(self.spec)
        outputs = []
        for rank in range(N):
            chosen = self.random("from_attention", "attention")
            outputs.append({name: gathered[rank][twins[name]] if name in twins else tensor
                            for name, tensor in chosen.items()})  # fmt: skip
        sends = self.scatter("scatter_out", "from_attention", outputs)
        returned = self.gather("gather_out", "from_attention", reference.exchange(sends))
        for rank in range(N):
            for name, twin in twins.items():
                if not same_bytes(returned[rank][name], shards[rank][twin]):
                    self.differs("gather_out", rank, f"does not return {twin}'s shard as {name} after the round trip")


def verify_module(module: ModuleType, device: str = "cpu", seed: int = 0) -> VerifyReport:
    """Every kernel's bytes against the reference (send buffers canary-filled) on every rank, the exchange
    in-process, and the round trip through identity attention back to the shards."""
    spec: UlyssesSpec = module.SPEC
    generator = torch.Generator().manual_seed(seed)
    failures: list[str] = []
    differing: set[str] = set()
    kv = spec.uses(HeadCount.H_KV)
    for N, S_local, B, heads, kv_heads, D, dtype in VERIFY_SHAPES:
        shape = Shape(N=N, S_local=S_local, H=N * heads, H_kv=N * (kv_heads if kv else heads), D=D, dtype=dtype,
                      B=B if spec.has_batch else 1)  # fmt: skip
        run = _Run(module, shape, device, generator)
        run.run()
        failures += run.failures
        differing |= run.differing
    trip = ", round trip exact" if round_trip_twins(spec) and "gather_out" not in differing else ""
    checks: list[Any] = []
    for kernel in KERNELS:
        ok = kernel not in differing
        detail = f"bytes {'identical' if ok else 'DIFFER'} in {len(VERIFY_SHAPES)} shapes"
        checks.append(Check(kernel, ok, detail + (trip if kernel == "gather_out" else "")))
    return VerifyReport(spec.name, "ulysses", tuple(checks), tuple(failures))
