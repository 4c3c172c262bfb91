"""UlyssesExchange across real processes (gloo on CPU, spawned ranks, Triton interpreter), and the example.

One spawn runs every check of the exchange (spawning and importing Triton cost more than the checks).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch
from conftest import REPO_ROOT, generated_module, problems_of_gloo_ranks, requires_interpreter

from layoutgen.ulysses import reference
from layoutgen.ulysses.layout import Shape, UlyssesBuffers, tensor_shape

pytestmark = requires_interpreter
WORLD = 2


def _shards(spec: Any, shape: Shape, seed: int) -> list[dict[str, torch.Tensor]]:
    """Every rank's shards, the same on every rank (same seed)."""
    generator = torch.Generator().manual_seed(seed)
    return [{t.name: torch.randn(tensor_shape(spec, shape, t, "local"), generator=generator).to(shape.dtype)
             for t in spec.to_attention.tensors} for _ in range(shape.N)]  # fmt: skip


def _expected(spec: Any, shape: Shape, shards: list[dict[str, torch.Tensor]], rank: int) -> dict[str, torch.Tensor]:
    sends = [UlyssesBuffers.allocate(spec, "to_attention", shape) for _ in range(shape.N)]
    for shard, send in zip(shards, sends, strict=True):
        reference.scatter(shard, send)
    return reference.gather(reference.exchange(sends)[rank])


def _worker(rank: int, problems: list[str]) -> None:
    from layoutgen.ulysses.distributed import UlyssesExchange

    module = generated_module("ulysses_qkv_gqa")
    spec = module.SPEC
    exchange = UlyssesExchange("ulysses_qkv_gqa", S_max=3, H=4, H_kv=2, D=4, dtype=torch.bfloat16, device="cpu")
    for S_local in (2, 3, 2):  # shorter than S_max, the whole buffers, and the cached views again
        shape = Shape(N=WORLD, S_local=S_local, H=4, H_kv=2, D=4, dtype=torch.bfloat16)
        shards = _shards(spec, shape, seed=S_local)
        got = exchange.to_attention(*shards[rank].values())
        want = _expected(spec, shape, shards, rank)
        if not all(
            torch.equal(g.view(torch.int16), w.view(torch.int16)) for g, w in zip(got, want.values(), strict=True)
        ):
            problems.append(f"to_attention at S_local={S_local} differs from the reference")
        mine = exchange.from_attention(got[0])
        if not torch.equal(mine.view(torch.int16), shards[rank]["q"].view(torch.int16)):
            problems.append(f"from_attention(to_attention(q)) is not q at S_local={S_local}")
    shape = Shape(N=WORLD, S_local=3, H=4, H_kv=2, D=4, dtype=torch.bfloat16)
    shards = _shards(spec, shape, seed=7)
    send, recv = (
        module.alloc(WORLD, 3, 4, 4, torch.bfloat16, H_kv=2),
        module.alloc(WORLD, 3, 4, 4, torch.bfloat16, H_kv=2),
    )
    module.scatter(*shards[rank].values(), send)
    module.exchange(send, recv)
    if not all(
        torch.equal(g, w)
        for g, w in zip(module.gather(recv), _expected(spec, shape, shards, rank).values(), strict=True)
    ):
        problems.append("module.exchange delivered other bytes than the reference exchange")
    too_long = _shards(spec, Shape(N=WORLD, S_local=4, H=4, H_kv=2, D=4, dtype=torch.bfloat16), seed=1)[rank]
    for call, words in (
        (lambda: exchange.to_attention(*too_long.values()), "to_attention: q has S_local=4 rows; this "),
        (lambda: exchange.from_attention(torch.zeros(8, 2, 4, dtype=torch.bfloat16)), "1 to 6 rows here"),
    ):
        try:
            call()
            problems.append(f"no error for {words!r}")
        except ValueError as error:
            if words not in str(error) or "S_max=3" not in str(error):
                problems.append(f"unclear row-count error: {error}")
    try:
        UlyssesExchange("ulysses_qkv_gqa", S_max=3, H=4, H_kv=2, D=4 + 4 * rank, dtype=torch.bfloat16, device="cpu")
        problems.append("ranks built with different D were not refused")
    except ValueError as error:
        if "disagrees with rank" not in str(error) or "D" not in str(error):
            problems.append(f"unclear disagreement error: {error}")


def test_the_exchange_on_gloo_matches_the_reference() -> None:
    assert problems_of_gloo_ranks(_worker, WORLD, timeout_s=120) == {rank: [] for rank in range(WORLD)}


def test_the_example_runs_end_to_end_on_two_gloo_ranks() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "ulysses_attention.py"), "--device", "cpu"],
        capture_output=True, text=True, timeout=180, check=False,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": OK") == WORLD, result.stdout


def test_without_torch_distributed_the_exchange_says_so() -> None:
    from layoutgen.ulysses.distributed import UlyssesExchange

    with pytest.raises(RuntimeError, match=r"torch\.distributed is not initialised"):
        UlyssesExchange("ulysses_qkv_gqa", S_max=3, H=4, H_kv=2, D=4, dtype=torch.bfloat16, device="cpu")
    with pytest.raises(TypeError, match="pass H_kv"):
        UlyssesExchange("ulysses_qkv_gqa", S_max=3, H=4, D=4, dtype=torch.bfloat16, device="cpu")
    with pytest.raises(ValueError, match="is of the dcp family"):
        UlyssesExchange("vllm_a2a", S_max=3, H=4, D=4, dtype=torch.bfloat16, device="cpu")
    # Arguments are checked before the group is joined.
    with pytest.raises(ValueError, match="S_max must be >= 1, got 0"):
        UlyssesExchange("ulysses_qkv_gqa", S_max=0, H=4, H_kv=2, D=4, dtype=torch.bfloat16, device="cpu")
    with pytest.raises(TypeError, match="UlyssesExchange needs a device"):
        UlyssesExchange("ulysses_qkv_gqa", S_max=3, H=4, H_kv=2, D=4, dtype=torch.bfloat16, device=None)
