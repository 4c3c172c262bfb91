"""The generated Ulysses kernels against the torch reference, byte for byte, under the Triton interpreter.

Every bundled spec, and random valid specs, through all four kernels on every rank: send buffers laid into
canary-filled memory (the guard bytes around them, and every input, must not change), gather's outputs as
strided views into canary-filled memory, N 1 to 8, S_local = 1, H/N = 1, odd sizes, strided inputs, the
default config and small blocks (many programs, every branch of the program decomposition), 64-bit
indexing; and the round trip through identity attention back to the shards.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from conftest import generated_module, render_module, requires_interpreter
from hypothesis import given, settings
from hypothesis import strategies as st
from ulysses_cases import (
    BUNDLED,
    KERNELS,
    STRIDE_KINDS,
    default_configs,
    identity_twins,
    make_shape,
    run_pass,
    same_bytes,
    spec_data,
    tiny_configs,
)

from layoutgen.runtime.tensors import needs_int64
from layoutgen.spec import parse_spec
from layoutgen.ulysses import reference
from layoutgen.ulysses.config import ScatterConfig
from layoutgen.ulysses.layout import UlyssesBuffers, tensor_shape

pytestmark = requires_interpreter
FAST = {"deadline": None, "derandomize": True}


def random_module(data: dict[str, Any], directory: Path) -> ModuleType:
    spec = parse_spec(data, source="<hypothesis>")
    return render_module(spec, directory)


def round_trip_holds(module: Any, result: Any) -> None:
    """Identity attention: gather_out returns, for each output with a twin (`identity_twins`), that input's shard."""
    for name, twin in identity_twins(module.SPEC).items():
        if twin is None:
            continue
        for rank, (shards, returned) in enumerate(zip(result.shards, result.returned, strict=True)):
            assert same_bytes(returned[name], shards[twin]), f"round trip rank {rank}: {name} != {twin}"


@pytest.mark.parametrize("name", BUNDLED)
@pytest.mark.parametrize(
    ("N", "S_local", "heads", "kv_heads", "D", "dtype"),
    [
        (1, 2, 2, 1, 8, torch.bfloat16),  # one rank: the wire is a permutation of the shard
        (2, 1, 1, 1, 6, torch.float16),  # S_local = 1, H/N = 1
        (3, 5, 3, 1, 10, torch.float32),  # odd everything
        (4, 3, 2, 2, 12, torch.bfloat16),
        (8, 1, 1, 1, 4, torch.bfloat16),
    ],
)
def test_bundled_specs_are_byte_exact(
    name: str, N: int, S_local: int, heads: int, kv_heads: int, D: int, dtype: torch.dtype, generator: torch.Generator
) -> None:
    module = generated_module(name)
    shape = make_shape(module.SPEC, N, S_local, heads, kv_heads, D, B=3, dtype=dtype)
    round_trip_holds(module, run_pass(module, shape, generator, default_configs(), fresh=N <= 2))


@pytest.mark.parametrize("name", BUNDLED)
@pytest.mark.parametrize("stride_kind", STRIDE_KINDS[1:])
def test_strided_inputs_and_outputs(name: str, stride_kind: str, generator: torch.Generator) -> None:
    """Non-contiguous shards, attention tensors and gather outputs (views into larger NaN or canary memory)."""
    module = generated_module(name)
    shape = make_shape(module.SPEC, N=2, S_local=3, heads=3, kv_heads=1, D=5, B=2)
    round_trip_holds(module, run_pass(module, shape, generator, default_configs(), stride_kind, fresh=False))


@pytest.mark.parametrize("name", BUNDLED)
def test_small_blocks_take_every_branch_of_the_program_decomposition(name: str, generator: torch.Generator) -> None:
    """Boxes smaller than every extent (many programs, masked edges, every tensor's branch), and boxes of one
    element on a tiny shape (D = 1 too)."""
    module = generated_module(name)
    shape = make_shape(module.SPEC, N=2, S_local=3, heads=3, kv_heads=1, D=5, B=1)
    blocks = {"block_peer": 2, "block_seq": 2, "block_head": 2, "block_dim": 4}
    round_trip_holds(module, run_pass(module, shape, generator, tiny_configs(**blocks), "wide", fresh=False))
    tiny = make_shape(module.SPEC, N=2, S_local=1, heads=1, kv_heads=1, D=1, B=2)
    round_trip_holds(module, run_pass(module, tiny, generator, tiny_configs(), fresh=False))


#: seq innermost on the local side, the attention side and a wire: the kernels that copy whole rows without
#: the bound on seq (and their last, partial seq block with it).
SEQ_INNERMOST = {
    "family": "ulysses",
    "name": "seq_innermost",
    "summary": "seq innermost on every side",
    "transport": "all_to_all_single",
    "local": ["head", "dim", "seq"],
    "attention": ["dim", "head", "seq"],
    "to_attention": {"tensors": [{"name": "q", "heads": "H"}, {"name": "k", "heads": "H_kv"}],
                     "wire": ["peer", "dim", "head", "seq"]},
    "from_attention": {"tensors": [{"name": "out", "heads": "H"}], "wire": ["peer", "head", "seq", "dim"]},
}  # fmt: skip


def test_whole_seq_rows_and_the_partial_last_block_are_byte_exact(generator: torch.Generator) -> None:
    """Where seq is innermost on a side, a box of whole rows is copied without the bound on seq: S_local 7 in
    blocks of 2 (three whole blocks and a partial one per peer), 4 (one of each) and 8 (only a partial one)."""
    with tempfile.TemporaryDirectory() as directory:
        module = random_module(SEQ_INNERMOST, Path(directory))
        source = Path(module.__file__).read_text(encoding="utf-8")
        assert source.count("if (seq_block + 1) * BLOCK_SEQ <= seq_len") == 4  # every kernel has seq innermost
        shape = make_shape(module.SPEC, N=2, S_local=7, heads=3, kv_heads=1, D=5, B=1)
        for block_seq in (2, 4, 8):
            configs = tiny_configs(block_peer=2, block_seq=block_seq, block_head=2, block_dim=4)
            round_trip_holds(module, run_pass(module, shape, generator, configs, "wide", fresh=False))


def test_programs_walk_one_tensor_after_another_unless_the_wire_interleaves_them() -> None:
    """With the q, k, v boxes of each seq block in turn a scatter wrote three regions at once (deepspeed_ulysses
    scatter N 4, S_local 4096 on the H200: 53.49 against 50.04 µs tensor-major)."""
    from layoutgen.ulysses.render import kernel_context

    def tensor_major(spec: Any, kernel: str) -> bool:
        return bool(kernel_context(spec, kernel)["tensor_major"])

    bundled = {name: generated_module(name).SPEC for name in BUNDLED}
    assert tensor_major(bundled["ulysses_qkv_gqa"], "scatter")  # wire [peer, tensor, seq, head, dim]
    assert tensor_major(bundled["ulysses_qkv_gqa"], "gather")
    assert tensor_major(bundled["deepspeed_ulysses"], "scatter")  # a buffer per tensor
    assert not tensor_major(bundled["deepspeed_ulysses_head_major"], "gather")  # tensors on grid y already
    assert not tensor_major(bundled["ulysses_qkv_gqa"], "scatter_out")  # one tensor
    # The bundled q+k+v spec with its wire's tensor axis moved inside seq.
    data = bundled["ulysses_qkv_gqa"].model_dump(mode="json", exclude_none=True)
    data["to_attention"]["wire"] = ["peer", "seq", "tensor", "head", "dim"]
    interleaved = parse_spec(data)
    assert not tensor_major(interleaved, "scatter")  # seq blocks first is that wire's memory order
    source = Path(generated_module("ulysses_qkv_gqa").__file__).read_text(encoding="utf-8")
    kernel = source[source.index("def _scatter_kernel(") : source.index("def _launch_scatter(")]
    assert "seq_blocks = " in kernel and "program_in_tensor" in kernel


#: bench_unseen_specs.py's spec 15 (seed 0): q and k interleave element by element on one wire.
INTERLEAVED = {
    "family": "ulysses",
    "name": "interleaved",
    "summary": "the tensors interleave innermost on the wire",
    "transport": "all_to_all_single",
    "local": ["head", "dim", "seq"],
    "attention": ["dim", "head", "seq"],
    "to_attention": {"tensors": [{"name": "q", "heads": "H"}, {"name": "k", "heads": "H"}],
                     "wire": ["peer", "dim", "head", "seq", "tensor"]},
    "from_attention": {"tensors": [{"name": "out", "heads": "H"}, {"name": "res", "heads": "H"}],
                       "wire": ["peer", "seq", "head", "dim"]},
}  # fmt: skip


#: Four tensors alternating innermost on both wires, along dim (the attention side is head-major).
FOUR_ALTERNATING = {
    **INTERLEAVED,
    "name": "four",
    "attention": ["head", "seq", "dim"],
    "to_attention": {"tensors": [{"name": name, "heads": "H"} for name in ("q", "k", "v", "g")],
                     "wire": ["peer", "head", "seq", "dim", "tensor"]},
    "from_attention": {"tensors": [{"name": "out", "heads": "H"}, {"name": "res", "heads": "H"}],
                       "wire": ["peer", "head", "seq", "dim", "tensor"]},
}  # fmt: skip


@pytest.mark.parametrize("heads", ["H", "H_kv"])
def test_tensors_that_interleave_on_the_wire_are_copied_box_by_box(heads: str, generator: torch.Generator) -> None:
    """A shared wire holding `tensor` inside seq, where the tensors' boxes lie along grid y: with one head
    count every program copies its box of each tensor in turn (spec 15's scatter at 43% of a copy on the H200
    with q's boxes before k's); with two, their boxes follow one another as elsewhere.  Byte-exact both ways,
    over many boxes with edges."""
    from layoutgen.ulysses.render import kernel_context

    data = {**INTERLEAVED, "to_attention": {**INTERLEAVED["to_attention"]}}
    data["to_attention"]["tensors"] = [{"name": "q", "heads": "H"}, {"name": "k", "heads": heads}]
    if heads == "H_kv":  # each tensor's block holds its own heads: `head` inside `tensor`
        data["to_attention"]["wire"] = ["peer", "dim", "seq", "tensor", "head"]
    with tempfile.TemporaryDirectory() as directory:
        module = random_module(data, Path(directory))
        spec = module.SPEC
        together = heads == "H"
        assert kernel_context(spec, "gather")["together"] is together  # attention [dim, head, (peer, seq)]: grid y
        assert kernel_context(spec, "scatter")["together"] is together  # with H_kv, head is on grid x
        assert not kernel_context(spec, "scatter_out")["together"]  # a buffer per tensor: nothing interleaves
        source = Path(module.__file__).read_text(encoding="utf-8")
        kernel = source[source.index("def _gather_kernel(") : source.index("def _launch_gather(")]
        assert ("if outer < " in kernel) is not together
        assert kernel.count("_gather_tile(") == (1 if together else 2)  # together, `tensor` innermost: one box
        shape = make_shape(spec, N=3, S_local=5, heads=3, kv_heads=1, D=6)
        for blocks in ({"block_peer": 2, "block_seq": 2, "block_head": 2, "block_dim": 4},
                       {"block_peer": 4, "block_seq": 8, "block_head": 4, "block_dim": 8}):  # fmt: skip
            round_trip_holds(module, run_pass(module, shape, generator, tiny_configs(**blocks), fresh=False))


def test_tensors_alternating_innermost_on_the_wire_move_as_one_box(generator: torch.Generator) -> None:
    """Copied together with `tensor` innermost on the wire, the tensors' boxes are interleaved into one box of the
    wire (scatters, `tl.interleave`) or split from it (gathers, `tl.split`): spec 15's scatter stored 2-byte
    elements 4 bytes apart (STG.E.U16 x128 per program, now STG.E.128 x16; sm_90).  Byte-exact with two and four
    tensors, the pairs along seq and along dim, edges on every axis (D 5 in blocks of 4: half the last pair box
    masked), in strided inputs; three tensors (not a power of two) keep one box per tensor."""
    from layoutgen.ulysses.render import kernel_context

    with tempfile.TemporaryDirectory() as directory:
        module = random_module(INTERLEAVED, Path(directory))
        source = Path(module.__file__).read_text(encoding="utf-8")
        assert source.count("tl.interleave(q_box, k_box)") == 2 and source.count("tl.split(") == 2  # two branches
        assert kernel_context(module.SPEC, "scatter")["joined"] and kernel_context(module.SPEC, "gather")["joined"]
        assert not kernel_context(module.SPEC, "scatter_out")["joined"]  # its wire has no tensor axis
    three = {**INTERLEAVED, "name": "three",
             "to_attention": {"tensors": [{"name": name, "heads": "H"} for name in ("q", "k", "v")],
                              "wire": ["peer", "dim", "head", "seq", "tensor"]}}  # fmt: skip
    with tempfile.TemporaryDirectory() as directory:
        module = random_module(FOUR_ALTERNATING, Path(directory))
        contexts = {kernel: kernel_context(module.SPEC, kernel) for kernel in ("scatter", "gather", "scatter_out")}
        assert all(context["joined"] and context["pair_axis"] == "dim" for context in contexts.values())
        source = Path(module.__file__).read_text(encoding="utf-8")
        assert "tl.interleave(tl.interleave(q_box, v_box), tl.interleave(k_box, g_box))" in source
        shape = make_shape(module.SPEC, N=3, S_local=5, heads=3, kv_heads=3, D=5)
        for blocks in ({"block_peer": 2, "block_seq": 2, "block_head": 2, "block_dim": 4},
                       {"block_peer": 4, "block_seq": 8, "block_head": 1, "block_dim": 8}):  # fmt: skip
            for stride_kind in ("contiguous", "wide"):
                result = run_pass(module, shape, generator, tiny_configs(**blocks), stride_kind, fresh=False)
                round_trip_holds(module, result)
        three_module = random_module(three, Path(directory))
        context = kernel_context(three_module.SPEC, "scatter")
        assert context["together"] and not context["joined"]
        shape = make_shape(three_module.SPEC, N=2, S_local=3, heads=1, kv_heads=1, D=3)
        configs = tiny_configs(block_peer=2, block_seq=2, block_head=1, block_dim=2)
        round_trip_holds(three_module, run_pass(three_module, shape, generator, configs, fresh=False))


#: bench_unseen_specs.py's spec 17 (seed 0): GQA tensors whose attention side has `head` innermost.
GQA_HEAD_INNERMOST = {
    "family": "ulysses",
    "name": "gqa_head_innermost",
    "summary": "k and v have fewer heads, and head is the attention side's innermost axis",
    "transport": "external",
    "local": ["seq", "head", "dim", "batch"],
    "attention": ["seq", "batch", "dim", "head"],
    "to_attention": {"tensors": [{"name": "q", "heads": "H"}, {"name": "k", "heads": "H_kv"},
                                 {"name": "v", "heads": "H_kv"}],
                     "wire": ["tensor", "head", "seq", "batch", "dim", "peer"]},
    "from_attention": {"tensors": [{"name": "out", "heads": "H"}, {"name": "res", "heads": "H"}],
                       "wire": ["peer", "head", "tensor", "seq", "dim", "batch"]},
}  # fmt: skip


def test_kv_boxes_take_only_their_heads_where_head_is_innermost(generator: torch.Generator) -> None:
    """Where `head` is a side's innermost axis, k and v's boxes hold at most their own heads per peer (the box
    is sized for q's): spec 17's gather at 42% of a copy on the H200 with 2 of a box's 8 heads live, 63% with
    k and v at q's head count.  Byte-exact with the k/v box narrower than q's (1 and 3 heads per peer in
    blocks of 4 and 8) and as wide (blocks of 2 over 3 heads); rendered only there."""
    from layoutgen.ulysses.render import kernel_context

    with tempfile.TemporaryDirectory() as directory:
        module = random_module(GQA_HEAD_INNERMOST, Path(directory))
        spec = module.SPEC
        assert [kernel for kernel in KERNELS if kernel_context(spec, kernel)["kv_box"]] == ["gather"]
        source = Path(module.__file__).read_text(encoding="utf-8")
        assert "BLOCK_KV_HEAD=min(config.block_head, triton.next_power_of_2(kv_heads_per_peer))" in source
        for kv_heads, block_head in ((1, 4), (3, 8), (3, 2)):
            shape = make_shape(spec, N=2, S_local=3, heads=5, kv_heads=kv_heads, D=6, B=2)
            blocks = {"block_peer": 2, "block_batch": 2, "block_seq": 2, "block_head": block_head, "block_dim": 4}
            for stride_kind in ("contiguous", "wide"):
                result = run_pass(module, shape, generator, tiny_configs(**blocks), stride_kind, fresh=False)
                round_trip_holds(module, result)
    bundled = [generated_module(name).SPEC for name in BUNDLED]
    assert not any(kernel_context(spec, kernel)["kv_box"] for spec in bundled for kernel in KERNELS)


#: bench_unseen_specs.py's spec 13 (seed 0) around its gather_out, wire [peer, head, dim, seq] -> local [seq, dim,
#: head], plus GQA and a shared wire: kernels whose wire holds `head` right inside `peer`, with `head` innermost.
GLOBAL_HEADS = {
    "family": "ulysses",
    "name": "global_heads",
    "summary": "peer and head adjacent on both sides of scatter and gather_out",
    "transport": "external",
    "local": ["seq", "dim", "head"],
    "attention": ["dim", "head", "seq"],
    "to_attention": {"tensors": [{"name": "q", "heads": "H"}, {"name": "k", "heads": "H_kv"}],
                     "wire": ["dim", "seq", "peer", "head"]},
    "from_attention": {"tensors": [{"name": "out", "heads": "H"}, {"name": "res", "heads": "H"}],
                       "wire": ["peer", "head", "tensor", "dim", "seq"]},
}  # fmt: skip


def test_peer_and_head_adjacent_on_both_sides_are_one_axis_of_global_heads(generator: torch.Generator) -> None:
    """Where the wire holds `head` right inside `peer` and `head` is a side's innermost axis, the boxes take the
    shard's heads as one axis (spec 13's gather_out stored runs of H / N heads: 48% of a copy on the H200, 91-95%
    as one run).  Byte-exact with head blocks crossing peers (3 heads per peer in blocks of 2 and 4), a k/v box
    narrower than q's, a shared wire, N 1 to 4, strided tensors; the other kernels keep peer x head, and so does
    every bundled spec (its tuned configs stay current)."""
    from layoutgen.tuning.problem import Problem
    from layoutgen.tuning.space import bind
    from layoutgen.ulysses.config import box_extents
    from layoutgen.ulysses.layout import DTYPE_NAMES, global_heads, key_extents, tile_axes
    from layoutgen.ulysses.render import kernel_context

    with tempfile.TemporaryDirectory() as directory:
        module = random_module(GLOBAL_HEADS, Path(directory))
        spec = module.SPEC
        assert [kernel for kernel in KERNELS if global_heads(spec, kernel)] == ["scatter", "gather_out"]
        assert tile_axes(spec, "gather_out") == ["seq", "dim", "head"]
        assert kernel_context(spec, "scatter")["kv_box"]
        source = Path(module.__file__).read_text(encoding="utf-8")
        tile = source[source.index("def _gather_out_tile(") : source.index("def _gather_out_kernel(")]
        assert not any(name in tile for name in ("peer_block", "peer_3d", "wire_stride_peer"))
        assert "(head_3d < NUM_PEERS * HEADS)" in tile
        assert "triton.next_power_of_2(N * kv_heads_per_peer)" in source
        shape = make_shape(spec, N=4, S_local=4096, heads=8, kv_heads=2, D=128, B=1)
        assert box_extents(spec, "gather_out", shape)["peer"] == 1
        assert box_extents(spec, "gather_out", shape)["head"] == 32
        problem = Problem(spec, "gather_out", tuple(key_extents(spec, "gather_out", shape).items()),
                          DTYPE_NAMES[shape.dtype])  # fmt: skip
        assert bind(problem, 4096).choices["block_peer"] == (1,)
        for N, S_local, heads, kv_heads, D in ((1, 2, 3, 1, 4), (2, 3, 3, 1, 5), (3, 1, 1, 1, 6), (4, 3, 3, 2, 5)):
            shape = make_shape(spec, N, S_local, heads, kv_heads, D, B=1)
            round_trip_holds(module, run_pass(module, shape, generator, default_configs(), fresh=False))
            for block_head in (2, 4):
                configs = tiny_configs(block_seq=2, block_head=block_head, block_dim=4)
                for stride_kind in ("contiguous", "wide"):
                    result = run_pass(module, shape, generator, configs, stride_kind, fresh=False)
                    round_trip_holds(module, result)
    bundled = [generated_module(name).SPEC for name in BUNDLED]
    assert not any(global_heads(spec, kernel) for spec in bundled for kernel in KERNELS)


class _Recorder:
    """Stands in for a compiled kernel: keeps the keyword arguments of each launch."""

    def __init__(self) -> None:
        self.launches: list[dict[str, Any]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        return lambda *args, **kwargs: self.launches.append(kwargs)


def test_a_dense_short_innermost_axis_gives_its_stride_at_compile_time() -> None:
    """A user side whose innermost axis is heads or batch rows (not dim): where every tensor is dense there, the
    stride outside it is passed as its extent at compile time (spec 17's gather stored 2 bytes at a time with
    8 heads innermost: STG.E.U16 x96, now STG.E.128 x4 for q and 4-byte stores for k and v's 2 heads; sm_90).
    The launcher's flag follows the strides: contiguous tensors set it, a view with padded heads or one tensor
    strided alone does not.  (The byte-exact tests above take both paths.)"""
    from layoutgen.ulysses.render import kernel_context

    with tempfile.TemporaryDirectory() as directory:
        module = random_module(GQA_HEAD_INNERMOST, Path(directory))
        spec = module.SPEC
        assert kernel_context(spec, "gather")["dense_inner"]  # attention [seq, batch, dim, head]
        assert kernel_context(spec, "scatter")["dense_inner"]  # local [seq, head, dim, batch]
        shape = make_shape(spec, N=2, S_local=3, heads=3, kv_heads=1, D=4, B=2)
        bufs = UlyssesBuffers.allocate(spec, "to_attention", shape)
        config = tiny_configs()["gather"]
        outputs = {t.name: torch.empty(tensor_shape(spec, shape, t, "attention"), dtype=shape.dtype)
                   for t in spec.to_attention.tensors}  # fmt: skip
        recorder = _Recorder()
        module._launch_gather(bufs, *outputs.values(), config, False, kernel=recorder)
        padded = torch.empty((*outputs["k"].shape[:-1], 2), dtype=shape.dtype)[..., :1]  # 1 head of 2 stored
        module._launch_gather(bufs, outputs["q"], padded, outputs["v"], config, False, kernel=recorder)
        assert [launch["DENSE_INNER"] for launch in recorder.launches] == [True, False]
    bundled = [generated_module(name).SPEC for name in BUNDLED]
    assert not any(kernel_context(spec, kernel)["dense_inner"] for spec in bundled for kernel in KERNELS)


def test_every_tile_shape_of_the_shared_gqa_wire(generator: torch.Generator) -> None:
    """The one-buffer q+k+v wire: boxes spanning several peers, heads and rows, with and without edges."""
    module = generated_module("ulysses_qkv_gqa")
    shape = make_shape(module.SPEC, N=3, S_local=3, heads=3, kv_heads=1, D=6)
    for blocks in ({"block_peer": 4, "block_seq": 4, "block_head": 4, "block_dim": 8},
                   {"block_peer": 2, "block_seq": 2, "block_head": 2, "block_dim": 4}):  # fmt: skip
        run_pass(module, shape, generator, tiny_configs(**blocks), fresh=False)


def test_64_bit_indexing_moves_the_same_bytes(generator: torch.Generator) -> None:
    """INDEX_64 (chosen when an offset passes 2**31) through the launcher directly: the same bytes."""
    module = generated_module("yunchang_ulysses_head_major")
    spec = module.SPEC
    shape = make_shape(spec, N=2, S_local=3, heads=2, kv_heads=1, D=4, B=2)
    shards = {t.name: torch.randn(tensor_shape(spec, shape, t, "local"), generator=generator).to(shape.dtype)
              for t in spec.to_attention.tensors}  # fmt: skip
    want = UlyssesBuffers.allocate(spec, "to_attention", shape)
    reference.scatter(shards, want)
    for index_64 in (False, True):
        got = UlyssesBuffers.allocate(spec, "to_attention", shape)
        config = ScatterConfig(block_seq=2, block_head=1, block_dim=4, num_warps=1)
        module._launch_scatter(*shards.values(), got, config, index_64)
        assert all(same_bytes(got.tensors[n], want.tensors[n]) for n in want.tensors)
    assert not needs_int64(*shards.values())


def _random_case(data: dict[str, Any], draw: Any) -> None:
    with tempfile.TemporaryDirectory() as directory:
        module = random_module(data, Path(directory))
        spec = module.SPEC
        N = draw(st.sampled_from([1, 2, 3]))
        shape = make_shape(spec, N, draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 2)),
                           draw(st.integers(1, 6)), B=draw(st.integers(1, 2)),
                           dtype=draw(st.sampled_from([torch.bfloat16, torch.float32])))  # fmt: skip
        blocks = {
            axis: draw(st.sampled_from([1, 2, 4])) for axis in ("block_peer", "block_seq", "block_head", "block_dim")
        }
        configs = draw(st.sampled_from([default_configs(), tiny_configs(**blocks)]))
        stride_kind = draw(st.sampled_from(STRIDE_KINDS))
        generator = torch.Generator().manual_seed(0)
        round_trip_holds(module, run_pass(module, shape, generator, configs, stride_kind, fresh=False))


@settings(max_examples=6, **FAST)
@given(data=spec_data(), draw=st.data())
def test_random_valid_specs_are_byte_exact(data: dict[str, Any], draw: Any) -> None:
    _random_case(data, draw.draw)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(data=spec_data(), draw=st.data())
def test_random_valid_specs_are_byte_exact_long_run(data: dict[str, Any], draw: Any) -> None:
    _random_case(data, draw.draw)
