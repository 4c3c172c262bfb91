"""Check a generated module against the reference on small random problems (`layoutgen build`)."""

from __future__ import annotations

from types import ModuleType

import torch

from layoutgen.dcp import reference
from layoutgen.dcp.layout import LayoutBuffers, wire_dtype
from layoutgen.dcp.spec import DcpSpec
from layoutgen.dcp.tolerances import combine_error, lse_error
from layoutgen.family import Check, VerifyReport

CANARY = 0xA5
# (N, B, B_max, heads per peer, D, dtype): B = 1, B < B_max, odd heads, D not a power of two.
VERIFY_SHAPES: tuple[tuple[int, int, int, int, int, torch.dtype], ...] = (
    (1, 1, 1, 1, 8, torch.bfloat16),
    (2, 3, 5, 3, 24, torch.bfloat16),
    (3, 2, 2, 1, 10, torch.float16),
    (4, 4, 6, 2, 12, torch.float32),
    (8, 1, 3, 2, 8, torch.bfloat16),
)
#: Tokens per request of the contract-v2 pack check: out [R, T, H, D] with an empty mask over R.
TOKENS = 2
#: D of each verification shape for an fp8 spec with a scale_block, in scale blocks (one, several).
FP8_BLOCKS = (1, 3, 2, 1, 2)


def verify_shapes(spec: DcpSpec) -> list[tuple[int, int, int, int, int, torch.dtype]]:
    """VERIFY_SHAPES, with D a multiple of the scale block for an fp8 spec that names one."""
    if not (spec.fp8 and spec.payload.scale_block):
        return list(VERIFY_SHAPES)
    block = spec.payload.scale_block
    return [
        (N, B, B_max, h, block * k, dtype)
        for (N, B, B_max, h, _, dtype), k in zip(VERIFY_SHAPES, FP8_BLOCKS, strict=True)
    ]


def filled(bufs: LayoutBuffers, byte: int = CANARY) -> LayoutBuffers:
    for tensor in bufs.tensors.values():
        tensor.view(torch.uint8).fill_(byte)
    return bufs


def same_bytes(left: LayoutBuffers, right: LayoutBuffers) -> bool:
    return all(torch.equal(left.tensors[k].view(torch.uint8), right.tensors[k].view(torch.uint8)) for k in left.tensors)


def random_max_sum(shape: tuple[int, ...], generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Running maxima and sums of exponentials as an attention kernel leaves them: max ~ 4 N(0, 1), sum in
    [1, 9) (the max's own term is 1)."""
    maximum = torch.randn(shape, generator=generator) * 4
    total = 1 + 8 * torch.rand(shape, generator=generator)
    return maximum, total


def _check_v2_pack(
    module: ModuleType, N: int, H: int, D: int, dtype: torch.dtype, generator: torch.Generator, device: str
) -> bool:
    """A masked pack of out [R, T, H, D] on `device`, from (max, sum) for a max_sum spec and from lse otherwise
    (inputs drawn on the CPU, so a seed draws the same values on any device)."""
    spec = module.SPEC
    R = 2
    out = torch.randn(R, TOKENS, H, D, generator=generator).to(dtype).to(device)
    empty = torch.tensor([False, True], device=device)
    ours = filled(module.alloc(N, R * TOKENS + 1, H, D, dtype, device))
    theirs = filled(LayoutBuffers.allocate(spec, N, R * TOKENS + 1, H, D, dtype, device))
    if spec.max_sum:
        maximum, total = (half.to(device) for half in random_max_sum((R, TOKENS, H), generator))
        module.pack(out, bufs=ours, max_sum=(maximum, total), empty=empty)
        reference.pack(out, None, theirs, max_sum=(maximum, total), empty=empty)
    else:
        lse = (torch.randn(R, TOKENS, H, generator=generator) * 4).to(device)
        module.pack(out, lse, ours, empty=empty)
        reference.pack(out, lse, theirs, empty=empty)
    return same_bytes(ours, theirs)


def expected_merge(
    spec: DcpSpec, received: LayoutBuffers, outs: list[torch.Tensor], lses: list[torch.Tensor], rank: int, base: str
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(float64 merge, its LSE, the largest |partial| taking part) that rank `rank`'s combine must match: the
    merge of every shard's unexchanged inputs, or for an fp8 spec of the dequantised partials it received (the
    quantisation error is the wire's, measured in benchmarks/fp8_accuracy.py, not the kernel's)."""
    if spec.fp8:
        B = outs[0].shape[0]
        want, want_lse = reference.combine(received, B, base, return_lse=True)
        assert want_lse is not None
        partials = reference.received_partials(received, B)
        taking_part = received.lse_view(B).isfinite() if not spec.max_sum else received.max_view(B).isfinite()
        scale = float(partials.abs().where(taking_part[..., None], 0.0).max())
        return want, want_lse, scale
    want, want_lse = reference.merge_shards(outs, lses, rank, base)
    return want, want_lse, max(float(o.abs().max()) for o in outs)


def verify_module(module: ModuleType, device: str = "cpu", seed: int = 0) -> VerifyReport:
    """Pack bytes against the reference (canary-filled buffers; plain, and masked over [R, T] rows), then
    pack -> exchange -> combine on every rank against the float64 merge of all shards, bases e and 2."""
    spec = module.SPEC
    generator = torch.Generator().manual_seed(seed)
    failures: list[str] = []
    worst = 0.0
    combine_ok = True
    shapes = verify_shapes(spec)
    for N, B, B_max, heads_per_peer, D, dtype in shapes:
        H = N * heads_per_peer
        if spec.row_tail and D * wire_dtype(spec, dtype).itemsize % 4:
            continue
        label = f"N={N} B={B} B_max={B_max} H={H} D={D} {str(dtype).removeprefix('torch.')}"
        outs = [torch.randn(B, H, D, generator=generator).to(dtype).to(device) for _ in range(N)]
        lses = [(torch.randn(B, H, generator=generator) * 4).to(device) for _ in range(N)]
        lses[0][0, 0] = float("-inf")  # an empty shard
        sends = []
        for rank in range(N):
            ours = filled(module.alloc(N, B_max, H, D, dtype, device))
            theirs = filled(LayoutBuffers.allocate(spec, N, B_max, H, D, dtype, device))
            module.pack(outs[rank], lses[rank], ours)
            reference.pack(outs[rank], lses[rank], theirs)
            if not same_bytes(ours, theirs):
                failures.append(f"pack differs from the reference at {label}, rank {rank}")
            sends.append(ours)
        if not _check_v2_pack(module, N, H, D, dtype, generator, device):
            failures.append(f"pack with an empty mask over [R, T={TOKENS}] rows differs from the reference at {label}")
        received = reference.exchange(sends)
        for rank in range(N):
            for base in reference.LSE_BASES:
                got, got_lse = module.combine(received[rank], B, lse_base=base, return_lse=True)
                want, want_lse, scale = expected_merge(spec, received[rank], outs, lses, rank, base)
                ratio = max(combine_error(got.cpu(), want.cpu(), scale), lse_error(got_lse.cpu(), want_lse.cpu()))
                worst = max(worst, ratio)
                if ratio > 1.0:
                    combine_ok = False
                    failures.append(f"combine (base {base}) outside tolerance at {label}, rank {rank}: {ratio:.2f}x")
    checked = sum(1 for *_, D, dtype in shapes if not (spec.row_tail and D * wire_dtype(spec, dtype).itemsize % 4))
    pack_exact = not any(f.startswith("pack") for f in failures)
    checks = (
        Check("pack", pack_exact, f"bytes {'identical' if pack_exact else 'DIFFER'} in {checked} shapes (and masked)"),
        Check("combine", combine_ok, f"worst error {worst:.2f} of the tolerance (bases e and 2)"),
    )
    return VerifyReport(spec.name, "dcp", checks, tuple(failures))
