"""The compiled kernels on a GPU: byte-exact at realistic shapes and configs from the tuner's space, the
direct launch path, CUDA-graph capture and replay, and 64-bit indexing (needs CUDA; skipped without)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from conftest import generated_module
from ulysses_cases import BUNDLED, KERNELS, alloc, as_tuple, default_configs, make_shape, run_pass, same_bytes

from layoutgen.runtime import reset_caches
from layoutgen.tuning.problem import Problem
from layoutgen.tuning.space import bind
from layoutgen.ulysses import reference
from layoutgen.ulysses.layout import key_extents, tensor_shape

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", BUNDLED)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_default_configs_are_byte_exact(name: str, dtype: torch.dtype, generator: torch.Generator) -> None:
    module = generated_module(name)
    shape = make_shape(module.SPEC, N=4, S_local=77, heads=5, kv_heads=2, D=128, B=2, dtype=dtype)
    run_pass(module, shape, generator, default_configs(), "wide", device="cuda")


@pytest.mark.parametrize("layout", ["two", "four", "gqa", "global"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_unusual_layouts_are_byte_exact_compiled(
    layout: str, dtype: torch.dtype, generator: torch.Generator, tmp_path: Path
) -> None:
    """As Triton compiles them: the interleaved and split boxes (`tl.interleave`, `tl.split`) of two and four
    tensors; k/v boxes of their own heads and strides given at compile time where head is innermost (dense and
    strided inputs); boxes of global heads (peer and head one axis).  Default configs and small boxes with edges
    on every axis."""
    from test_ulysses_kernels import FOUR_ALTERNATING, GLOBAL_HEADS, GQA_HEAD_INNERMOST, INTERLEAVED, random_module
    from ulysses_cases import tiny_configs

    data = {"two": INTERLEAVED, "four": FOUR_ALTERNATING, "gqa": GQA_HEAD_INNERMOST, "global": GLOBAL_HEADS}[layout]
    module = random_module(data, tmp_path)
    shape = make_shape(module.SPEC, N=4, S_local=77, heads=8, kv_heads=2, D=72, dtype=dtype)
    for stride_kind in ("contiguous", "wide"):
        run_pass(module, shape, generator, default_configs(), stride_kind, device="cuda")
    small = tiny_configs(block_peer=2, block_batch=2, block_seq=16, block_head=4, block_dim=32)
    run_pass(module, shape, generator, small, fresh=False, device="cuda")


@pytest.mark.parametrize("name", [*BUNDLED, "global_heads"])
def test_configs_from_the_tuners_space_are_byte_exact(name: str, generator: torch.Generator, tmp_path: Path) -> None:
    """Eight feasible configs per kernel, drawn from the space the tuner searches (S_local 64); the bundled specs
    and one whose scatter and gather_out take global heads (head blocks across peers)."""
    if name == "global_heads":
        from test_ulysses_kernels import GLOBAL_HEADS, random_module

        module = random_module(GLOBAL_HEADS, tmp_path)
    else:
        module = generated_module(name)
    spec = module.SPEC
    shape = make_shape(spec, N=2, S_local=64, heads=4, kv_heads=2, D=64, B=2)
    draw = random.Random(0)
    spaces = {}
    for kernel in KERNELS:
        problem = Problem(spec, kernel, tuple(key_extents(spec, kernel, shape).items()), "bfloat16")
        spaces[kernel] = draw.sample(bind(problem, 64).feasible(), 8)
    for index in range(8):
        configs = {kernel: spaces[kernel][index] for kernel in KERNELS}
        run_pass(module, shape, generator, configs, fresh=False, device="cuda")


def test_calls_launch_directly_and_replay_in_a_cuda_graph(generator: torch.Generator) -> None:
    reset_caches()
    module = generated_module("ulysses_qkv_gqa")
    spec = module.SPEC
    shape = make_shape(spec, N=1, S_local=300, heads=8, kv_heads=2, D=128)
    tensors = [torch.randn(tensor_shape(spec, shape, t, "local"), device="cuda").to(shape.dtype)
               for t in spec.to_attention.tensors]  # fmt: skip
    send = alloc(module, shape, "to_attention", "cuda")
    module.scatter(*tensors, send)
    plan = module._dispatch.plan("scatter", tuple(tensors), send)
    assert plan.direct is not None  # the recorded launch replays without kernel[grid]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        module.scatter(*tensors, send)
        gathered = as_tuple(module.gather(send))  # one rank: what it sends is what it receives
    for seed in range(2):
        for tensor in tensors:
            tensor.copy_(torch.randn(tensor.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)))
        graph.replay()
        torch.cuda.synchronize()
        want = reference.gather(send)
        assert all(same_bytes(g, want[t.name]) for g, t in zip(gathered, spec.to_attention.tensors, strict=True))
        assert same_bytes(gathered[0], tensors[0])  # N = 1: attention sees the shard itself


def test_64_bit_indexing_compiles_and_moves_the_same_bytes() -> None:
    module = generated_module("yunchang_ulysses_head_major")
    spec = module.SPEC
    shape = make_shape(spec, N=2, S_local=33, heads=3, kv_heads=3, D=64, B=2)
    recv = alloc(module, shape, "to_attention", "cuda")
    for tensor in recv.tensors.values():
        tensor.copy_(torch.randn(tensor.shape, device="cuda"))
    want = reference.gather(recv)
    config = module._dispatch.plan("gather", recv, None).config
    for index_64 in (False, True):
        outs = [torch.empty_like(want[t.name]) for t in spec.to_attention.tensors]
        module._launch_gather(recv, *outs, config, index_64)
        assert all(same_bytes(o, want[t.name]) for o, t in zip(outs, spec.to_attention.tensors, strict=True))


def test_offsets_past_2_to_the_31_take_64_bit_indexing() -> None:
    """q [S_local, 64, 128] with S_local = 266240 holds 2.2e9 elements (4.4 GB): the plan switches to 64-bit
    offsets, and scatter and gather still move exactly the reference's bytes."""
    module = generated_module("ulysses_qkv_gqa")
    spec = module.SPEC
    shape = make_shape(spec, N=2, S_local=266240, heads=32, kv_heads=4, D=128)
    generator = torch.Generator("cuda").manual_seed(0)
    shards = [torch.randn(tensor_shape(spec, shape, t, "local"), device="cuda", generator=generator).to(shape.dtype)
              for t in spec.to_attention.tensors]  # fmt: skip
    send = alloc(module, shape, "to_attention", "cuda")
    module.scatter(*shards, send)
    assert module._dispatch.plan("scatter", tuple(shards), send).index_64
    want = alloc(module, shape, "to_attention", "cuda")
    reference.scatter(dict(zip(("q", "k", "v"), shards, strict=True)), want)
    assert torch.equal(send.tensors["wire"].view(torch.int16), want.tensors["wire"].view(torch.int16))
    del want, shards
    torch.cuda.empty_cache()
    gathered = module.gather(send)
    expected = reference.gather(send)
    assert all(
        torch.equal(g.view(torch.int16), expected[n].view(torch.int16)) for g, n in zip(gathered, "qkv", strict=True)
    )
