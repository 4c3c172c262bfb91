"""The Ulysses `FAMILY` as the shared machinery sees it: its declarations, default grid, tuning workload
(gate and compile variants), and a tune under the interpreter whose decision dispatch then uses."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import generated_module, requires_interpreter
from rich.console import Console

from layoutgen.family import Family, get_family
from layoutgen.runtime import configs, reset_caches
from layoutgen.runtime.launch import Recorder
from layoutgen.tuning.objective import Target
from layoutgen.tuning.problem import Problem
from layoutgen.ulysses.config import GatherConfig, ScatterConfig

FAMILY = get_family("ulysses")


def problem(spec_name: str, kernel: str, N: int = 2, Hl: int = 2, Hl_kv: int = 1, D: int = 8) -> Problem:
    spec = generated_module(spec_name).SPEC
    return Problem(spec, kernel, (("N", N), ("Hl", Hl), ("Hl_kv", Hl_kv), ("D", D)), "bfloat16")


def test_the_family_is_registered_and_implements_the_interface() -> None:
    assert isinstance(FAMILY, Family) and FAMILY.name == "ulysses"
    described = FAMILY.describe()
    assert list(described["kernels"]) == ["scatter", "gather", "scatter_out", "gather_out"]
    assert described["key"] == ["N", "Hl", "Hl_kv", "D", "dtype", "S_local"]
    assert all(kernel.exact for kernel in FAMILY.kernels)


def test_the_default_grid_is_1080_studies_over_the_bundled_specs() -> None:
    points = FAMILY.grid_points({}, interpret=False)
    assert len(points) == 6 and {(p["H"], p["D"]) for p in points} == {(8, 64), (64, 128)}
    assert {p["H_kv"] for p in points if p["H"] == 64} == {16} and {p["N"]: p["H_kv"] for p in points if p["H"] == 8} == {
        2: 2, 4: 4, 8: 8}  # fmt: skip
    studies = 0
    for path in FAMILY.spec_dir.glob("*.yaml"):
        spec = generated_module(path.stem).SPEC
        for kernel in FAMILY.kernels:
            keys = {tuple(FAMILY.key_shapes(spec, kernel.name, p, "bfloat16").items()) for p in points}
            studies += len(keys) * len(FAMILY.bucket.defaults)
    assert studies == 1080 and FAMILY.bucket.defaults[-1] == 65536


def test_key_shapes_skip_what_a_spec_cannot_hold() -> None:
    spec = generated_module("ulysses_qkv_gqa").SPEC
    assert FAMILY.key_shapes(spec, "scatter", {"N": 4, "H": 8, "H_kv": 2, "D": 64}, "bfloat16") is None
    assert FAMILY.key_shapes(spec, "scatter", {"N": 2, "H": 8, "H_kv": 2, "D": 64}, "bfloat16") == {
        "N": 2, "Hl": 4, "Hl_kv": 1, "D": 64}  # fmt: skip
    # The reverse kernels move only the H-headed output: their key does not depend on H_kv.
    assert FAMILY.key_shapes(spec, "gather_out", {"N": 2, "H": 8, "H_kv": 2, "D": 64}, "bfloat16")["Hl_kv"] == 4


def test_sizes_and_default_configs() -> None:
    gather = problem("ulysses_qkv_gqa", "gather", N=2, Hl=4, Hl_kv=1, D=128)
    assert FAMILY.bytes_moved(gather, 16) == 2 * 2 * 16 * (8 + 2 + 2) * 128
    extents = FAMILY.space_extents(gather, 16)
    assert extents.innermost == "dim" and extents.extents["head"] == 4 and extents.elem_bytes == 2
    config = FAMILY.default_config(gather, 65536)
    # 16-byte stores along the destination's innermost axis, about 8 KiB per program.
    assert config.block_dim == 128 and config.block_head == 4 and config.block_seq == 8 and config.num_warps == 4
    head_major = problem("yunchang_ulysses_head_major", "gather", N=2, Hl=4, Hl_kv=4, D=64)
    assert FAMILY.space_extents(head_major, 16).innermost == "dim"
    tiny = FAMILY.default_config(problem("deepspeed_ulysses", "scatter", N=8, Hl=1, Hl_kv=1, D=4), 1)
    assert (tiny.block_peer, tiny.block_dim, tiny.num_warps) == (8, 4, 1)  # one program moves everything


def test_a_default_box_takes_a_run_along_both_sides() -> None:
    """The default box first takes 128 bytes along each side's contiguous axes, then grows from the
    destination's innermost axis with what is left."""
    from layoutgen.ulysses.config import default_config

    extents = {"peer": 4, "batch": 1, "seq": 4096, "head": 8, "dim": 128}
    # wire [peer, head, dim, seq] -> local [seq, dim, (peer, head)]: loads along seq, stores along head.
    box = default_config("gather_out", ["seq", "dim", "peer", "head"], extents, 2, ["peer", "head", "dim", "seq"])
    assert (box.block_head, box.block_peer, box.block_dim, box.block_seq) == (8, 4, 2, 64)
    # local [dim, (peer, head), seq] -> wire [peer, dim, seq, head]: seq, reached second, grows past its run.
    grown = default_config("scatter", ["peer", "dim", "seq", "head"], extents, 2, ["dim", "peer", "head", "seq"])
    assert (grown.block_head, grown.block_seq, grown.block_dim) == (8, 512, 1)
    # local [seq, dim, (peer, head)] -> wire [peer, dim, seq, head]: both sides have head innermost, 16 bytes of
    # it; the source's run goes on across peers and dims, so loads are not 16 bytes a line.
    shared = default_config("scatter", ["peer", "dim", "seq", "head"], extents, 2, ["seq", "dim", "peer", "head"])
    assert (shared.block_head, shared.block_peer, shared.block_dim, shared.block_seq) == (8, 4, 2, 64)
    # Not a transpose: the box is the one grown from the destination's innermost axis alone.
    plain = default_config("scatter", ["peer", "seq", "head", "dim"], extents, 2, ["seq", "peer", "head", "dim"])
    assert plain == default_config("scatter", ["peer", "seq", "head", "dim"], extents, 2)
    assert (plain.block_dim, plain.block_head, plain.block_seq) == (128, 8, 4)


def test_a_run_ends_at_an_axis_taken_in_part_or_padded() -> None:
    from layoutgen.ulysses.config import run_floors

    order = ["seq", "dim", "peer", "head"]
    assert run_floors(order, {"seq": 4096, "dim": 128, "peer": 4, "head": 8}, 64) == {"head": 8, "peer": 4, "dim": 2}
    # 3 heads take a block of 4: past it the box's elements are not contiguous.
    assert run_floors(order, {"seq": 4096, "dim": 128, "peer": 4, "head": 3}, 64) == {"head": 4}
    assert run_floors(order, {"seq": 4096, "dim": 128, "peer": 4, "head": 128}, 64) == {"head": 64}
    tiny = {"seq": 1, "dim": 2, "peer": 1, "head": 1}
    assert run_floors(order, tiny, 64) == tiny


def test_a_shared_wire_is_contiguous_only_inside_its_tensor_axis() -> None:
    from layoutgen.ulysses.layout import contiguous_axes

    spec = generated_module("ulysses_qkv_gqa").SPEC  # wire [peer, tensor, seq, head, dim]
    assert contiguous_axes(spec, "scatter", "wire") == ["seq", "head", "dim"]
    assert contiguous_axes(spec, "scatter_out", "wire") == ["peer", "seq", "head", "dim"]
    assert contiguous_axes(spec, "scatter", "local") == ["seq", "peer", "head", "dim"]


@requires_interpreter
def test_the_gate_passes_the_kernels_and_catches_a_wrong_one(monkeypatch: pytest.MonkeyPatch) -> None:
    module = generated_module("yunchang_ulysses")
    for kernel, config in (("scatter", ScatterConfig(block_seq=2, block_dim=4)), ("gather", GatherConfig(block_dim=2))):
        workload = FAMILY.workload(Target(problem("yunchang_ulysses", kernel, Hl=2, Hl_kv=2, D=4), module), 3,
                                   torch.device("cpu"), 1 << 20)  # fmt: skip
        assert workload.gate(config, seed=1) is None
        assert workload.gate(FAMILY.default_config(workload.problem, 3), seed=2) is None
        launch = getattr(module, f"_launch_{kernel}")
        # The first and the last tensor each (was: the first only, which a gate checking one tensor passed).
        for which in (0, -1):

            def off_by_one(*args: Any, launch: Any = launch, scatters: bool = kernel == "scatter", which: int = which,
                           **kwargs: Any) -> None:  # fmt: skip
                launch(*args, **kwargs)
                # scatter(q, k, v, bufs, config, index_64): a send buffer; gather(bufs, q, k, v, ...): an output.
                tensor = list(args[3].tensors.values())[which] if scatters else args[1:4][which]
                tensor.view(-1)[-1] += 1

            monkeypatch.setattr(module, f"_launch_{kernel}", off_by_one)
            assert "bytes differ" in (workload.gate(config, seed=3) or ""), (kernel, which)
            monkeypatch.undo()


@requires_interpreter
def test_timing_sets_rotate_the_inputs_and_share_one_output() -> None:
    # As serving (one static set of send buffers every layer) and bench_ulysses.py do: with an output per set
    # every call's writes went to DRAM where serving's go to the L2.
    module = generated_module("ulysses_qkv_gqa")
    for kernel in ("scatter", "gather", "scatter_out", "gather_out"):
        workload = FAMILY.workload(Target(problem("ulysses_qkv_gqa", kernel), module), 3, torch.device("cpu"), 1 << 10)
        assert workload.sets > 1
        launch = workload.timing_launch(FAMILY.default_config(workload.problem, 3))
        for index in range(workload.sets):
            launch(index)
        timing_sets = workload._timing_sets or []
        users = [id(tensors[0]) for tensors, _ in timing_sets]
        buffers = [id(bufs) for _, bufs in timing_sets]
        inputs, outputs = (users, buffers) if kernel.startswith("scatter") else (buffers, users)
        assert len(timing_sets) == workload.sets and len(set(inputs)) == workload.sets, kernel
        assert len(set(outputs)) == 1, kernel
        first, second = (
            (timing_sets[0][0][0], timing_sets[1][0][0])
            if kernel.startswith("scatter")
            else (next(iter(timing_sets[0][1].tensors.values())), next(iter(timing_sets[1][1].tensors.values())))
        )
        assert not torch.equal(first, second), kernel  # each set its own random inputs


def test_compile_variants_launch_on_meta_tensors() -> None:
    module = generated_module("ulysses_qkv_gqa")
    target = Target(problem("ulysses_qkv_gqa", "scatter", N=4, Hl=2, Hl_kv=1, D=8), module)
    workload = FAMILY.workload(target, 5, torch.device("cpu"), 1 << 20)
    config = ScatterConfig(block_seq=2, block_head=2, block_dim=8)
    job = workload.compile_job(config)
    recorder = Recorder()
    FAMILY.compile_variant(module, {"kernel": job.kernel, "config": dict(job.config), **dict(job.args)}, recorder)
    ((grid, args, kwargs),) = recorder.calls
    assert grid == (3 * (1 + 1 + 1), 4)  # 3 seq blocks x (q's box + k's + v's); 4 peers
    assert all(isinstance(a, torch.Tensor) and a.is_meta for a in args[:4]) and kwargs["KV_HEADS_PER_PEER"] == 1
    other = FAMILY.workload(target, 64, torch.device("cpu"), 1 << 20)
    assert other.compile_job(config).variant == job.variant  # one compile serves every S_local


@requires_interpreter
def test_a_tune_under_the_interpreter_is_what_dispatch_then_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from layoutgen.tuning import plan, runner
    from layoutgen.tuning_db import read_database

    monkeypatch.setenv("LAYOUTGEN_CACHE_DIR", str(tmp_path / "cache"))
    options = plan.TuneOptions(specs=("ulysses_qkv_gqa",), kernels=("gather",), buckets=(3,), storage=str(tmp_path / "j"),
                               db_dir=str(tmp_path / "db"), interpret=True, trials=2, exhaustive_limit=2, lookahead=1)  # fmt: skip
    summary = runner.run(options, Console(file=io.StringIO(), width=120))
    assert summary.gate_failures == 0 and summary.unfinished == 0 and summary.db_path is not None
    (entry,) = read_database(summary.db_path).entries.values()
    assert entry.key.as_str() == "ulysses|ulysses_qkv_gqa|gather|N=2|Hl=2|Hl_kv=1|D=8|bfloat16|S_local=3"
    monkeypatch.setenv("LAYOUTGEN_TUNING_DB", str(summary.db_path.parent))
    reset_caches()
    module = generated_module("ulysses_qkv_gqa")
    recv = module.alloc(2, 3, 4, 8, torch.bfloat16, H_kv=2)
    assert module._dispatch.plan("gather", recv, None).config.as_dict() == entry.config
    configs.reset()
