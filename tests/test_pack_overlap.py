"""pack refuses inputs that share memory with the buffers it writes: on the call that plans, and on a cached
plan's later calls, whose tensors keep the planned geometry at new addresses (`PackPlan.guard`).

A kernel that reads `out` while it writes the payload over it would pack garbage without a word; the check
is `layoutgen.runtime.tensors.overlap` at planning time and `OverlapGuard.may_overlap` on the hot path, as for
combine's `out`.  Every case fills the buffers with a canary first and checks that a refused call wrote
nothing."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import CANARY, requires_interpreter

import layoutgen
from layoutgen.dcp import reference

pytestmark = requires_interpreter

N, B, H, D = 2, 3, 4, 16


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(-1).view(torch.uint8)


def _setup(spec_name: str, generator: torch.Generator) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    module = layoutgen.load(spec_name)
    bufs = module.alloc(N, B, H, D, torch.bfloat16)
    for tensor in bufs.tensors.values():
        _bytes_of(tensor).fill_(CANARY)
    out = torch.randn(B, H, D, generator=generator).to(torch.bfloat16)
    lse = torch.randn(B, H, generator=generator)
    return module, bufs, out, lse


def _inside(buffer: torch.Tensor, like: torch.Tensor, byte: int = 0) -> torch.Tensor:
    """A tensor shaped and typed as `like` whose bytes lie in `buffer`'s memory from `byte` on."""
    raw = _bytes_of(buffer)
    nbytes = like.numel() * like.element_size()
    return raw[byte : byte + nbytes].view(like.dtype).view(like.shape)


def _snapshot(bufs: Any) -> dict[str, torch.Tensor]:
    return {name: _bytes_of(tensor).clone() for name, tensor in bufs.tensors.items()}


def _unchanged(bufs: Any, before: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(_bytes_of(tensor), before[name]) for name, tensor in bufs.tensors.items())


def _payload_then_out(module: Any, bufs: Any, out: torch.Tensor, gap: int) -> tuple[Any, torch.Tensor]:
    """Buffers whose payload lies at the start of one allocation, and `out` at `gap` bytes after the payload's
    end (negative: its first bytes are the payload's last)."""
    payload = bufs.tensors["payload"]
    nbytes = payload.numel() * payload.element_size()
    allocation = torch.empty(nbytes + max(gap, 0) + out.numel() * out.element_size(), dtype=torch.uint8)
    allocation[:nbytes].copy_(_bytes_of(payload))
    own = module.alloc(N, B, H, D, torch.bfloat16)
    own.tensors["payload"] = allocation[:nbytes].view(payload.dtype).view(payload.shape)
    for name, tensor in own.tensors.items():
        if name != "payload":
            _bytes_of(tensor).fill_(CANARY)
    placed = allocation[nbytes + gap : nbytes + gap + out.numel() * out.element_size()].view(out.dtype).view(out.shape)
    placed.copy_(out)
    return own, placed


@pytest.mark.parametrize("spec_name", ["vllm_a2a", "trtllm_helix_nccl"])
@pytest.mark.parametrize("where", ["the whole payload", "its last bytes"])
def test_an_out_in_the_payload_is_refused_on_the_first_call(
    spec_name: str, where: str, generator: torch.Generator
) -> None:
    module, bufs, out, lse = _setup(spec_name, generator)
    if where == "the whole payload":
        aliased = _inside(bufs.tensors["payload"], out)
        aliased.copy_(out)
    else:
        bufs, aliased = _payload_then_out(module, bufs, out, gap=-2)
    before = _snapshot(bufs)
    with pytest.raises(ValueError, match=r"out must not overlap the buffers pack writes: it (shares memory with|may overlap .*) "
                       r"bufs.tensors\['payload'\].*out.clone\(\)"):  # fmt: skip
        module.pack(aliased, lse, bufs)
    assert _unchanged(bufs, before)


def test_a_cached_plan_refuses_an_out_that_moved_into_the_buffers(generator: torch.Generator) -> None:
    """The second call has the first's geometry (a plan hit) but its `out` now lies in the payload."""
    module, bufs, out, lse = _setup("vllm_a2a", generator)
    module.pack(out, lse, bufs)
    for tensor in bufs.tensors.values():
        _bytes_of(tensor).fill_(CANARY)
    aliased = _inside(bufs.tensors["payload"], out)
    aliased.copy_(out)
    before = _snapshot(bufs)
    with pytest.raises(ValueError, match=r"out must not overlap the buffers pack writes"):
        module.pack(aliased, lse, bufs)
    assert _unchanged(bufs, before)
    module.pack(out.clone(), lse, bufs)  # a tensor of its own packs again, from the same plan


def test_stats_inputs_and_the_mask_are_checked_too(generator: torch.Generator) -> None:
    """lse, the (max, sum) pair and `empty`, each inside a buffer, planned and cached (pack_v2's path)."""
    module, bufs, out, lse = _setup("trtllm_helix_nccl", generator)
    empty = torch.zeros(B, dtype=torch.bool)
    sums = 1 + torch.rand(B, H, generator=generator)
    last = list(bufs.tensors.values())[-1]
    cases = {
        "lse": lambda: module.pack(out, _inside(last, lse), bufs, empty=empty),
        r"max_sum\[1\] \(sum\)": lambda: module.pack(out, bufs=bufs, max_sum=(lse, _inside(last, sums)), empty=empty),
        "empty": lambda: module.pack(out, lse, bufs, empty=_inside(last, empty)),
    }
    module.pack(out, lse, bufs, empty=empty)  # the plans the cases below hit
    module.pack(out, bufs=bufs, max_sum=(lse, sums), empty=empty)
    for label, call in cases.items():
        for tensor in bufs.tensors.values():
            _bytes_of(tensor).fill_(CANARY)
        before = _snapshot(bufs)
        with pytest.raises(ValueError, match=rf"{label} must not overlap the buffers pack writes"):
            call()
        assert _unchanged(bufs, before), label


def test_inputs_next_to_the_buffers_pack(generator: torch.Generator) -> None:
    """One allocation holding the payload and, right after it, `out`: adjacent is not overlapping."""
    module, bufs, out, lse = _setup("vllm_a2a", generator)
    # Against the reference, canary around: a pack compared with another pack would hide a bug both share.
    want = module.alloc(N, B, H, D, torch.bfloat16)
    for tensor in want.tensors.values():
        _bytes_of(tensor).fill_(CANARY)
    reference.pack(out, lse, want)
    own, beside = _payload_then_out(module, bufs, out, gap=0)
    module.pack(beside, lse, own)
    for name, tensor in want.tensors.items():
        assert torch.equal(_bytes_of(own.tensors[name]), _bytes_of(tensor)), name
