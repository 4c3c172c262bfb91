"""Contract v2 through torch.compile and the custom ops (backend aot_eager; inductor runs in
tests/gpu/test_dcp_v2_gpu.py), the tuner's gate, the database key and the default tile of a transposing pack."""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

import pytest
import torch
from conftest import assert_same_bytes, dcp_problem, fill_bytes, generated_module, requires_interpreter
from test_dcp_v2_pack import random_max_sum

from layoutgen.dcp.config import CombineConfig, PackConfig
from layoutgen.dcp.layout import LayoutBuffers
from layoutgen.dcp.spec import PayloadDtype
from layoutgen.runtime import reset_caches
from layoutgen.spec import bundled_specs

pytestmark = [requires_interpreter, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

N, H, D, R, T = 2, 6, 24, 2, 2


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch._dynamo.reset()
    reset_caches()


def v2_inputs(seed: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    maximum, total = random_max_sum((R, T, H), generator)
    return {
        "out": torch.randn(R, T, H, D, generator=generator).to(dtype),
        "lse": torch.randn(R, T, H, generator=generator) * 3,
        "max": maximum,
        "sum": total,
        "empty": torch.tensor([False, True]),
    }


def v2_step(module: ModuleType, x: dict[str, torch.Tensor], send: LayoutBuffers, recv: LayoutBuffers) -> Any:
    """A masked pack of [R, T] rows ((max, sum) in for a max_sum spec), the exchange (a copy), a scaled combine."""
    if module.SPEC.max_sum:
        module.pack(x["out"], bufs=send, max_sum=(x["max"], x["sum"]), empty=x["empty"])
    else:
        module.pack(x["out"], x["lse"], send, empty=x["empty"])
    for name, tensor in recv.tensors.items():
        tensor.copy_(send.tensors[name])
    merged, merged_lse = module.combine(recv, R * T, lse_base="2", return_lse=True, scale=0.5)
    plain, _ = module.combine(recv, R * T)
    return merged, merged_lse, plain


@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "trtllm_helix_nccl"])
def test_compiled_v2_step_matches_eager_bytes(spec_name: str) -> None:
    module = generated_module(spec_name)
    buffers = {
        mode: [fill_bytes(module.alloc(N, R * T, H, D, torch.bfloat16)) for _ in range(2)]
        for mode in ("eager", "compiled")
    }
    compiled = torch.compile(v2_step, fullgraph=True, backend="aot_eager")
    for seed in range(2):  # the second call reuses the compiled graph
        x = v2_inputs(seed)
        want = v2_step(module, x, *buffers["eager"])
        got = compiled(module, x, *buffers["compiled"])
        for got_tensor, want_tensor in zip(got, want, strict=True):
            assert torch.equal(got_tensor.view(torch.uint8), want_tensor.view(torch.uint8))
        for got_bufs, want_bufs in zip(buffers["compiled"], buffers["eager"], strict=True):
            assert_same_bytes(got_bufs, want_bufs, f"seed {seed}")


def test_ops_take_the_v2_arguments_on_bare_tensors() -> None:
    module = generated_module("trtllm_helix_nccl")
    x = v2_inputs(4)
    want = fill_bytes(module.alloc(N, R * T, H, D, torch.bfloat16))
    module.pack(x["out"], bufs=want, max_sum=(x["max"], x["sum"]), empty=x["empty"])
    tensors = [torch.empty_like(t).view(torch.uint8).fill_(0xA5).view(t.dtype) for t in want.tensors.values()]
    torch.ops.layoutgen.pack(
        x["out"],
        None,
        tensors,
        module.__name__,
        N,
        R * T,
        H,
        D,
        [],
        empty=x["empty"],
        max_stats=x["max"],
        sum_stats=x["sum"],
    )
    for name, tensor in zip(want.tensors, tensors, strict=True):
        assert torch.equal(tensor.view(torch.uint8), want.tensors[name].view(torch.uint8)), name
    merged = torch.empty(R * T, H // N, D, dtype=torch.bfloat16)
    torch.ops.layoutgen.combine(tensors, merged, None, module.__name__, N, R * T, H, D, R * T, "e", [], 2.0)
    expected, _ = module.combine(want, R * T, scale=2.0)
    assert torch.equal(merged, expected)


def test_opcheck_v2() -> None:
    module = generated_module("trtllm_helix_native_v1")
    bufs = module.alloc(N, R * T, H, D, torch.bfloat16)
    x = v2_inputs(5)
    tensors = list(bufs.tensors.values())
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(
        torch.ops.layoutgen.pack.default,
        (x["out"], None, tensors, module.__name__, N, R * T, H, D, [], x["empty"], x["max"], x["sum"]),
        test_utils=utils,
    )
    merged = torch.empty(R * T, H // N, D, dtype=torch.bfloat16)
    torch.library.opcheck(
        torch.ops.layoutgen.combine.default,
        (tensors, merged, None, module.__name__, N, R * T, H, D, R * T, "2", [], 0.25),
        test_utils=utils,
    )


# ---------------------------------------------------------------------------------------------
# The tuner: the gate runs the spec's v2 form; the database key is the spec, kernel and shape
# ---------------------------------------------------------------------------------------------
def workload(spec_name: str, kernel: str, batch: int) -> Any:
    from layoutgen.dcp.workload import DcpWorkload
    from layoutgen.tuning.objective import Target

    module = generated_module(spec_name)
    problem = dcp_problem(module.SPEC, kernel, 2, 2, 8, "bfloat16")
    return DcpWorkload(Target(problem, module), batch, torch.device("cpu"), 0)


@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "trtllm_helix_native_v2"])
def test_the_pack_gate_runs_the_v2_form_of_the_spec(spec_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    work = workload(spec_name, "pack", 3)
    config = PackConfig(block_batch=1, block_head=2, block_dim=8, block_peer=1)
    module = work.target.module
    calls: list[dict[str, Any]] = []
    original = module._launch_pack

    def recording(*args: Any, **kwargs: Any) -> None:
        calls.append({key: value for key, value in kwargs.items() if key in ("sums", "empty")})
        original(*args, **kwargs)

    monkeypatch.setattr(module, "_launch_pack", recording)
    assert work.gate(config, seed=1) is None
    assert calls[0] == {} and calls[1]["empty"] is not None and bool(calls[1]["empty"][-1])
    assert ("sums" in calls[1]) is module.SPEC.max_sum
    job = dict(work.compile_job(config).args)
    assert job["pack_forms"] == ((True, module.SPEC.max_sum),)


def test_the_pack_gate_catches_a_pack_that_ignores_the_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    work = workload("trtllm_helix_nccl", "pack", 3)
    module = work.target.module
    original = module._launch_pack

    def unmasked(*args: Any, **kwargs: Any) -> None:
        kwargs.pop("empty", None)
        original(*args, **kwargs)

    monkeypatch.setattr(module, "_launch_pack", unmasked)
    mismatch = work.gate(PackConfig(block_batch=1, block_head=2, block_dim=8, block_peer=1), seed=2)
    assert mismatch is not None and "masked, from (max, sum)" in mismatch


def test_the_combine_gate_uses_max_sum_stats() -> None:
    work = workload("trtllm_helix_nccl", "combine", 3)
    assert work.gate(CombineConfig(block_batch=1, block_head=2, block_dim=8), seed=3) is None
    received = work._gate_buffers["received"]
    assert bool((received.sum_view(3) == 0).any()), "the gate draws empty (max, sum) entries"


def test_the_database_key_of_a_max_sum_spec() -> None:
    from layoutgen.dcp import FAMILY

    spec = bundled_specs()["trtllm_helix_nccl"]
    assert FAMILY.key_shapes(spec, "combine", {"N": 4, "H": 128, "D": 512}, "bfloat16") == {"N": 4, "Hl": 32, "D": 512}
    assert FAMILY.key_shapes(spec, "pack", {"N": 3, "H": 128, "D": 512}, "bfloat16") is None
    problem = dcp_problem(spec, "combine", 4, 32, 512, "bfloat16")
    # combine reads two stats words per entry: bytes moved = N partials + 8 bytes each + the output.
    assert FAMILY.bytes_moved(problem, 64) == 64 * 32 * (4 * (512 * 2 + 8) + 512 * 2)
    pack = dcp_problem(spec, "pack", 4, 32, 512, "bfloat16")
    assert FAMILY.bytes_moved(pack, 64) == 64 * 4 * 32 * (512 * 4 + 4 + 2 * 4)  # lse in, (max, sum) out


def test_default_pack_config_of_a_transposing_layout() -> None:
    from layoutgen.dcp.config import default_pack_config
    from layoutgen.dcp.spec import DcpSpec

    npu = bundled_specs()["pynccl_a2a"].model_copy(
        update={
            "payload": bundled_specs()["pynccl_a2a"].payload.model_copy(
                update={"axes": ("peer", "head", "dim", "batch")}
            )
        }
    )
    assert isinstance(npu, DcpSpec)
    big = default_pack_config(npu, 2, 64, 512, 4096, 4)
    assert (big.block_batch, big.block_dim, big.block_head, big.num_warps) == (64, 64, 1, 8)
    one = default_pack_config(npu, 2, 64, 512, 1, 4)
    assert (one.block_batch, one.block_dim) == (1, 512)


def _with_payload_axes(name: str, axes: tuple[str, ...]) -> Any:
    spec = bundled_specs()[name]
    return spec.model_copy(update={"payload": spec.payload.model_copy(update={"axes": axes})})


def test_default_configs_of_head_and_peer_innermost_layouts_take_whole_runs() -> None:
    """The destination is contiguous along its inner axes: pack's box covers every head (or peer) of a
    run and at least 64 dims of `out` (bench_unseen_specs: 61% of the copy ceiling before, 93% after)."""
    from layoutgen.dcp.config import (
        default_combine_config,
        default_pack_config,
        pack_pairs_axis,
        pack_pairs_peer_outer,
    )

    head_inner = _with_payload_axes("pynccl_a2a", ("peer", "batch", "dim", "head"))
    pack = default_pack_config(head_inner, 8, 16, 512, 1024, 2)
    assert (pack.block_head, pack.block_dim, pack.block_batch, pack.block_peer) == (16, 256, 1, 1)
    # Peer innermost with head or batch right outside it: runs of 64 (X, peer) pairs x 64 dims (H200, bf16 [head,
    # dim, batch, peer]: 98% of the copy at B 64, 92% at 1024), 128 x 128 from 4096 pairs (96%), more dims
    # with fewer pairs; block_X is the run's length, block_peer 1.
    peer_inner = _with_payload_axes("pynccl_a2a", ("batch", "dim", "head", "peer"))
    pack = default_pack_config(peer_inner, 8, 16, 512, 1024, 2)
    assert (pack.block_peer, pack.block_batch, pack.block_head, pack.block_dim, pack.num_warps) == (1, 1, 64, 64, 4)
    # Head innermost with peer right outside it: runs of (peer, head) pairs, the global heads (bf16 [batch, dim,
    # peer, head] at N 8, H 32 on the H200: 33% of the copy as a box of 4-head runs).
    peer_head = _with_payload_axes("pynccl_a2a", ("batch", "dim", "peer", "head"))
    pack = default_pack_config(peer_head, 8, 4, 512, 1024, 2)
    assert (pack.block_peer, pack.block_batch, pack.block_head, pack.block_dim) == (1, 1, 32, 128)
    # ... but not on an fp8 wire, where the pairs lost to the box (seed 0's spec 1: 62 -> 55% at B 1024).
    assert pack_pairs_axis(peer_head) == "head" and pack_pairs_peer_outer(peer_head)
    fp8_peer_head = _with_payload_axes("pynccl_a2a_fp8", ("batch", "dim", "peer", "head"))
    assert pack_pairs_axis(fp8_peer_head) is None and not pack_pairs_peer_outer(fp8_peer_head)
    batch_pairs = _with_payload_axes("pynccl_a2a", ("head", "dim", "batch", "peer"))
    pack = default_pack_config(batch_pairs, 8, 16, 512, 64, 2)
    assert (pack.block_peer, pack.block_batch, pack.block_head, pack.block_dim) == (1, 64, 1, 64)
    pack = default_pack_config(batch_pairs, 8, 16, 512, 1024, 2)
    assert (pack.block_batch, pack.block_dim) == (128, 128)
    pack = default_pack_config(batch_pairs, 3, 16, 40, 1, 2)  # 3 pairs: a run of 4, the dims of a whole row
    assert (pack.block_batch, pack.block_dim) == (4, 64)
    few_heads = default_pack_config(head_inner, 2, 3, 40, 5, 2)  # awkward extents: the box stays within them
    assert (few_heads.block_head, few_heads.block_dim) == (4, 64)
    # Combine loads along head there: a run of heads per row, not 2; along batch, a run of rows.
    combine = default_combine_config(head_inner, 8, 16, 512, 1024, 2)
    assert (combine.block_batch, combine.block_head, combine.block_dim, combine.num_warps) == (4, 16, 32, 2)
    assert default_combine_config(head_inner, 8, 16, 512, 1, 2).block_batch == 1
    batch_inner = _with_payload_axes("pynccl_a2a", ("head", "dim", "peer", "batch"))
    # 128 rows x 16 dims x 4 warps on bf16 and float32 wires (H200: 55 -> 94% and 89 -> 95% of the copy), fewer
    # rows and warps at a small batch; an fp8 wire keeps 32 rows x 32 x 1 warp.
    combine = default_combine_config(batch_inner, 8, 16, 512, 1024, 2)
    assert (combine.block_batch, combine.block_head, combine.block_dim, combine.num_warps) == (128, 1, 16, 4)
    assert (default_combine_config(batch_inner, 8, 16, 512, 5, 2).block_batch, combine.block_dim) == (8, 16)
    wide = batch_inner.model_copy(
        update={"payload": batch_inner.payload.model_copy(update={"dtype": PayloadDtype.FLOAT32})}
    )
    combine = default_combine_config(wide, 8, 16, 512, 1024, 2)
    assert (combine.block_batch, combine.block_dim, combine.num_warps) == (128, 16, 4)
    # Peer innermost with batch outside it: the peers in the tile, 32 rows x 32 dims x 4 warps (H200: 47 -> 88%
    # of the copy on bf16, 34 -> 97% on fp8 blocks of 16); head or dim outside it keep the generic box.
    batch_peer = _with_payload_axes("pynccl_a2a", ("head", "dim", "batch", "peer"))
    combine = default_combine_config(batch_peer, 8, 16, 512, 1024, 2)
    assert (combine.block_batch, combine.block_head, combine.block_dim, combine.num_warps) == (32, 1, 32, 4)
    assert default_combine_config(batch_peer, 8, 16, 512, 3, 2).block_batch == 4
    for outside in (("batch", "dim", "head", "peer"), ("batch", "head", "dim", "peer")):
        combine = default_combine_config(_with_payload_axes("pynccl_a2a", outside), 8, 16, 512, 1024, 2)
        assert (combine.block_batch, combine.block_head, combine.block_dim) == (1, 2, 128), outside
    # An fp8 wire keeps 32 rows x 1 warp; its dims widen to 64 where the grid holds eight waves (B 1024:
    # 37-51 -> 42-63% of the copy over five drawn specs), to 128 where a scale block spans 128 dims or more
    # (here one scale per row) and the grid holds four waves at that width (B 512: 32 -> 47% and 42 -> 56% on
    # two drawn specs), and stay 32 at B 64 and 256.
    fp8_inner = _with_payload_axes("pynccl_a2a_fp8", ("peer", "head", "dim", "batch"))
    blocks_of_16 = fp8_inner.model_copy(update={"payload": fp8_inner.payload.model_copy(update={"scale_block": 16})})
    for spec, B, block_dim in [
        (fp8_inner, 1024, 128),
        (fp8_inner, 512, 128),
        (blocks_of_16, 1024, 64),
        (blocks_of_16, 512, 64),
    ]:
        combine = default_combine_config(spec, 8, 16, 512, B, 2)
        assert (combine.block_batch, combine.block_dim, combine.num_warps) == (32, block_dim, 1), (B, spec.payload)
    for spec in (fp8_inner, blocks_of_16):
        for B in (64, 256):
            combine = default_combine_config(spec, 8, 16, 512, B, 2)
            assert (combine.block_batch, combine.block_dim, combine.num_warps) == (32, 32, 1), B
    # An fp8 wire with head innermost and blocks of at least 128 (here a whole row) takes whole blocks in one
    # pass, 16 heads x 512 dims x 8 warps: 32 elements per thread, under the launcher's register cap.
    fp8 = _with_payload_axes("pynccl_a2a_fp8", ("peer", "batch", "dim", "head"))
    pack = default_pack_config(fp8, 8, 16, 512, 1024, 2)
    assert (pack.block_head, pack.block_dim, pack.num_warps) == (16, 512, 8)
    # With blocks of 16 the cap cost time: 16 heads x 128 dims x 4 warps, no cap.
    small = fp8.model_copy(update={"payload": fp8.payload.model_copy(update={"scale_block": 16})})
    pack = default_pack_config(small, 8, 16, 512, 1024, 2)
    assert (pack.block_head, pack.block_dim, pack.num_warps) == (16, 128, 4)


def test_dim_innermost_pack_defaults_take_rows_next_to_each_other() -> None:
    """With dim innermost, pack's default box takes whole rows of D along the destination's innermost row axis
    (heads in [peer, batch, head, dim], peers in [head, batch, peer, dim]), 2048 elements at 8 per thread
    (1024 at B <= 8, 4096 heads at 8 < B <= 64); an fp8 wire whole scale blocks at 32 per thread (16 at B <= 8)."""
    from layoutgen.dcp.config import default_pack_config

    heads_next = bundled_specs()["pynccl_a2a"]
    pack = default_pack_config(heads_next, 8, 16, 512, 1024, 2)
    assert (pack.block_peer, pack.block_batch, pack.block_head, pack.block_dim, pack.num_warps) == (1, 1, 4, 512, 8)
    pack = default_pack_config(heads_next, 8, 16, 512, 8, 2)
    assert (pack.block_head, pack.block_dim, pack.num_warps) == (2, 512, 4)
    pack = default_pack_config(heads_next, 8, 16, 512, 64, 2)  # there 4096 elements of heads measured faster
    assert (pack.block_head, pack.block_dim, pack.num_warps) == (8, 512, 4)
    peers_next = _with_payload_axes("pynccl_a2a", ("head", "batch", "peer", "dim"))
    pack = default_pack_config(peers_next, 8, 16, 512, 1024, 2)
    assert (pack.block_peer, pack.block_batch, pack.block_head, pack.block_dim) == (4, 1, 1, 512)
    rows_next = _with_payload_axes("pynccl_a2a", ("head", "peer", "batch", "dim"))
    assert default_pack_config(rows_next, 8, 16, 128, 1024, 2).block_batch == 16  # short rows: more of them
    assert default_pack_config(rows_next, 2, 3, 40, 3, 2).tile_elements <= 1024  # awkward extents stay within
    fp8 = bundled_specs()["pynccl_a2a_fp8"]
    pack = default_pack_config(fp8, 8, 16, 512, 1024, 1)
    assert (pack.block_head, pack.block_dim, pack.num_warps) == (4, 512, 2)
    assert default_pack_config(fp8, 8, 16, 512, 1, 1).num_warps == 2  # 1024 elements, 16 per thread
    # One scale per row at D 2048: the tile holds the whole block, the launcher refuses less (it was 1024).
    assert default_pack_config(fp8, 8, 16, 2048, 1024, 1).block_dim == 2048


def test_configs_are_the_same_types() -> None:
    # The v2 forms add no launch parameters: the tuner's spaces and the database's configs are unchanged.
    assert [f.name for f in dataclasses.fields(PackConfig)] == [
        "block_batch",
        "block_head",
        "block_dim",
        "num_warps",
        "num_stages",
        "block_peer",
    ]


def test_dim_innermost_combine_default_under_one_wave_takes_four_warps() -> None:
    """Under one wave of programs (132) the dim-innermost combine is latency-bound: 4 warps over about 2048 / N
    elements, split back along heads until 32 programs run (H100: 1.08x the one-warp tile's speed over 42
    points at B 1-8); an fp8 wire keeps one warp below 512 elements.  Above a wave the one-warp rule stands."""
    from layoutgen.dcp.config import default_combine_config

    vllm, fp8 = bundled_specs()["vllm_a2a"], bundled_specs()["pynccl_a2a_fp8"]

    def box(spec: Any, N: int, H: int, D: int, B: int) -> tuple[int, int, int, int]:
        config = default_combine_config(spec, N, H // N, D, B, 2)
        return config.block_batch, config.block_head, config.block_dim, config.num_warps

    assert box(vllm, 2, 128, 512, 1) == (1, 2, 512, 4)  # 2 x 512 x 2 peers: 2048 elements, 32 programs
    assert box(vllm, 4, 128, 512, 1) == (1, 2, 256, 4)
    assert box(vllm, 8, 128, 512, 1) == (1, 2, 128, 4)
    assert box(vllm, 2, 32, 128, 8) == (1, 4, 128, 4)  # 8 heads would leave 16 programs
    assert box(vllm, 8, 32, 128, 8) == (1, 1, 128, 4)  # 2 heads would leave 16 programs
    assert box(vllm, 8, 8, 96, 1) == (1, 1, 128, 4)  # one head per peer, D not a power of two
    # Tiles whose N partials hold under 1024 elements take fewer warps: 16 bytes of bf16 a thread.
    assert box(vllm, 8, 8, 64, 1) == (1, 1, 64, 2)
    assert box(vllm, 2, 4, 8, 3) == (1, 1, 8, 1)
    assert box(fp8, 2, 128, 512, 1) == (1, 2, 512, 4)
    assert box(fp8, 8, 16, 512, 8) == (1, 2, 128, 1)
    # A wave or more: the one-warp tiles, grown with 2048 / N only from four waves.
    assert box(vllm, 8, 128, 512, 8) == (1, 2, 128, 1)
    assert box(vllm, 2, 128, 512, 8) == (1, 2, 256, 2)
