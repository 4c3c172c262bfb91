"""Ninth hardening pass, the Ulysses half (see tests/test_hardening_round9.py): a negated view that hit a plain
tensor's plan skipped its check (a defect, fixed: the negation bit is in the plan keys), and three gaps a
mutation audit found: a cached gather plan met with outputs of another dtype, a forced config fitted to the
grid at a batch past CUDA's limit, and the tuning bucket of a batched call (B x S_local, not S_local)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import generated_module, requires_interpreter
from ulysses_cases import alloc, as_tuple, fill, gather_entry, make_shape, random_tensor

from layoutgen import tuning_db
from layoutgen.tuning_db import CPU_INTERPRETER_DEVICE
from layoutgen.ulysses.config import MAX_GRID_Y, program_counts, tile_axes
from layoutgen.ulysses.layout import UlyssesBuffers, tensor_shape

# No cached plans, LAYOUTGEN_CONFIG unset and empty tuning databases, for every test.
pytestmark = [requires_interpreter, pytest.mark.usefixtures("clean_dispatch")]
NEGATION = r"is a view with torch's lazy negation bit set .*\.resolve_neg\(\)"


def wire_bytes(bufs: UlyssesBuffers) -> list[bytes]:
    return [bytes(tensor.view(torch.uint8).flatten().numpy()) for tensor in bufs.tensors.values()]


def test_a_negated_source_or_output_is_refused_after_a_plain_one(generator: torch.Generator) -> None:
    module = generated_module("ulysses_qkv_gqa")
    shape = make_shape(module.SPEC, N=2, S_local=3, heads=2, kv_heads=1, D=4)
    send = alloc(module, shape, "to_attention")
    q, k, v = (random_tensor(tensor_shape(module.SPEC, shape, t, "local"), shape.dtype, generator)
               for t in module.SPEC.to_attention.tensors)  # fmt: skip
    module.scatter(q, k, v, send)  # plans this geometry
    before = wire_bytes(fill(send))
    with pytest.raises(TypeError, match=rf"scatter: k {NEGATION}"):
        module.scatter(q, torch._neg_view(k), v, send)
    assert wire_bytes(send) == before, "a refused scatter wrote the wire"
    given = as_tuple(module.gather(send))
    module.gather(send, out=given)
    targets = tuple(torch.full_like(tensor, 7.0) for tensor in given)
    with pytest.raises(TypeError, match=rf"gather: out\[2\] \(v\) {NEGATION}"):
        module.gather(send, out=(*targets[:2], torch._neg_view(targets[2])))
    assert all(bool((tensor == 7.0).all()) for tensor in targets), "a refused gather wrote its outputs"


def test_a_cached_gather_plan_refuses_outputs_of_another_dtype() -> None:
    module = generated_module("ulysses_qkv_gqa")
    shape = make_shape(module.SPEC, N=2, S_local=3, heads=2, kv_heads=1, D=4)
    recv = alloc(module, shape, "to_attention")
    given = as_tuple(module.gather(recv))
    module.gather(recv, out=given)
    halves = tuple(torch.full(tensor.shape, 7.0, dtype=torch.float16) for tensor in given)
    with pytest.raises(TypeError, match=r"gather: out\[0\] \(q\) must be torch.bfloat16"):
        module.gather(recv, out=halves)
    assert all(bool((tensor == 7.0).all()) for tensor in halves)


def test_a_forced_config_is_fitted_to_the_grid_at_a_large_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # yunchang_ulysses' gather walks (batch, peer) along grid y: B = 70000 in blocks of one row and one peer
    # would need 140000 programs there.  Meta buffers (addresses all 0, so the config is resolved without the
    # buffers' overlap check): no memory.
    module = generated_module("yunchang_ulysses")
    shape = make_shape(module.SPEC, N=2, S_local=3, heads=2, kv_heads=2, D=4, B=70000)
    recv = UlyssesBuffers.allocate(module.SPEC, "to_attention", shape, "meta")
    monkeypatch.setenv("LAYOUTGEN_CONFIG", json.dumps({"gather": {"block_batch": 1, "block_peer": 1}}))
    config = module._dispatch._config("gather", recv, None)
    axes = tile_axes(module.SPEC, "gather")
    assert axes[:2] == ["batch", "peer"]
    extents = {"peer": 2, "batch": 70000, "seq": 3, "head": 2, "dim": 4}
    _, programs_y = program_counts(config, axes, extents)
    assert (config.block_batch, config.block_peer) != (1, 1) and programs_y <= MAX_GRID_Y


def test_a_batched_call_takes_the_bucket_of_b_times_s_local(clean_dispatch: Path) -> None:
    # B 2 x S_local 3 = 6 rows of the grid: the bucket 8 entry answers, not bucket 4 (S_local alone).
    module = generated_module("yunchang_ulysses")
    shape = make_shape(module.SPEC, N=2, S_local=3, heads=2, kv_heads=2, D=4, B=2)
    tuning_db.record(
        clean_dispatch,
        CPU_INTERPRETER_DEVICE,
        "0.0",
        [gather_entry(module, shape, 4, 2), gather_entry(module, shape, 8, 4)],
        {"layoutgen": "test"},
    )
    recv = alloc(module, shape, "to_attention")
    assert module._dispatch.plan("gather", recv, None).config.num_warps == 4
