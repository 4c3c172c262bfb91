"""`layoutgen tune` on CPU: the Triton interpreter, tiny shapes, wall-clock timing.

The whole pipeline runs for real (studies, gate, timing, finalize, database); tests that need a fault
inject it by swapping the generated module's `_launch_pack` or the timer.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import itertools
import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from conftest import dcp_grid, dcp_key, dcp_problem, requires_interpreter
from optuna.trial import TrialState
from rich.console import Console

import layoutgen
from layoutgen.config import next_pow2
from layoutgen.dcp import FAMILY as DCP_FAMILY
from layoutgen.dcp.config import CombineConfig, PackConfig
from layoutgen.dcp.workload import DcpWorkload
from layoutgen.spec import bundled_specs
from layoutgen.tuning import claims, context, decision, plan, prepare, runner, search, space
from layoutgen.tuning.procedure import timing_hash, timing_procedure
from layoutgen.tuning.storage import open_storage
from layoutgen.tuning.timing import (
    MAX_ROTATING_SETS,
    Timing,
    WallClockTimer,
    cache_states,
    combine_states,
    rotating_sets,
    summarize,
    time_interleaved_states,
    time_states,
)
from layoutgen.tuning_db import (
    CPU_INTERPRETER_DEVICE,
    TuningEntry,
    device_file_name,
    entry_versions,
    read_database,
    record,
)


def tiny_options(tmp_path: Path, **changes: Any) -> plan.TuneOptions:
    """pack, N=2, H=4, D=8: B=1 has 4 feasible configs (exhaustive), B=3 has 12 (TPE, 4 trials)."""
    fields: dict[str, Any] = {
        "specs": ("pynccl_a2a",),
        "kernels": ("pack",),
        "grid": dcp_grid(2, 4, 8),
        "buckets": (1, 3),
        "trials": 4,
        "exhaustive_limit": 8,
        "storage": str(tmp_path / "studies.journal"),
        "db_dir": str(tmp_path / "db"),
        "interpret": True,
        "workers": 1,
        "lookahead": 1,
    }
    fields.update(changes)
    return plan.TuneOptions(**fields)


def run_tune(options: plan.TuneOptions) -> runner.RunSummary:
    return runner.run(options, Console(file=io.StringIO(), width=200))


def all_trials(options: plan.TuneOptions) -> dict[str, list[optuna.trial.FrozenTrial]]:
    storage = open_storage(options.storage)
    return {
        summary.study_name: optuna.load_study(study_name=summary.study_name, storage=storage).get_trials()
        for summary in optuna.get_all_study_summaries(storage)
    }


def outcome(trial: optuna.trial.FrozenTrial) -> str | None:
    return (trial.user_attrs.get("result") or {}).get("outcome")


def assert_no_config_timed_twice(trials: dict[str, list[optuna.trial.FrozenTrial]]) -> None:
    for name, study_trials in trials.items():
        evaluated = Counter(tuple(sorted(t.params.items())) for t in study_trials if outcome(t) in claims.EVALUATED)
        assert evaluated, f"{name}: nothing evaluated"
        repeated = {key: count for key, count in evaluated.items() if count > 1}
        assert not repeated, f"{name}: configs evaluated more than once: {repeated}"


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYOUTGEN_CACHE_DIR", str(tmp_path / "cache"))


# ---------------------------------------------------------------------------------------------------
# Search spaces (no kernels run)
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel", ["pack", "combine"])
@pytest.mark.parametrize("spec_name", sorted(name for name, spec in bundled_specs().items() if spec.family == "dcp"))
def test_feasible_points_obey_every_constraint(spec_name: str, kernel: str) -> None:
    problem = dcp_problem(bundled_specs()[spec_name], kernel, 4, 8, 512, "bfloat16")  # type: ignore[arg-type]
    for batch in (1, 5, 64):
        bound = space.bind(problem, batch)
        feasible = bound.feasible()
        assert feasible
        elem = bound.extents.elem_bytes
        for config in feasible:
            values = config.as_dict()
            tile = config.tile_elements
            threads = 32 * config.num_warps
            assert values["block_batch"] <= next_pow2(batch)
            assert values["block_head"] <= 8 and values["block_dim"] <= 512
            assert values["block_dim"] * elem >= bound.space.sector_bytes  # stores along dim span a sector
            assert tile <= bound.space.max_elements_per_thread * threads
            loaded = tile * elem * bound.extents.loads_per_element  # combine loads N partials
            assert config.num_warps == 1 or loaded >= bound.space.min_bytes_per_thread * threads
            assert bound.from_params(bound.to_params(config)) == config
            low_high = bound.param_ranges()
            assert all(low_high[k][0] <= v <= low_high[k][1] for k, v in bound.to_params(config).items())
        # Everything the declared choices allow but the constraints reject is reported with a reason.
        names = list(bound.choices)
        rejected = 0
        for values in itertools.product(*(bound.choices[name] for name in names)):
            data = dict(zip(names, values, strict=True))
            if math.prod(data[n] for n, _ in bound.space.blocks) > bound.space.max_tile_elements:
                continue
            config = bound.config_type.from_dict(data)
            if config not in feasible:
                rejected += 1
                assert bound.violations(config)
        assert rejected > 0


def test_infeasible_points_name_the_constraint() -> None:
    problem = dcp_problem(bundled_specs()["pynccl_a2a"], "pack", 2, 64, 512, "bfloat16")
    bound = space.bind(problem, 64)
    spills = PackConfig(block_peer=2, block_batch=16, block_head=64, block_dim=32, num_warps=1)
    assert any("register spills" in reason for reason in bound.violations(spills))
    idle = PackConfig(block_peer=1, block_batch=1, block_head=1, block_dim=64, num_warps=16)
    assert any("bytes per thread" in reason for reason in bound.violations(idle))
    narrow = PackConfig(block_peer=1, block_batch=1, block_head=64, block_dim=8, num_warps=4)
    assert any("block_dim=8 not in" in reason for reason in bound.violations(narrow))


def test_the_combine_space_holds_sglangs_shape() -> None:
    # One row of 512 bf16 over 4 warps: 8 bytes per thread per partial, 32 over the N = 4 partials it loads.
    sglang_shape = CombineConfig(block_batch=1, block_head=1, block_dim=512, num_warps=4)
    four = space.bind(dcp_problem(bundled_specs()["vllm_a2a"], "combine", 4, 32, 512, "bfloat16"), 8)
    assert four.is_feasible(sglang_shape), four.violations(sglang_shape)
    # With one peer the same threads would each load 8 bytes: under a 16-byte vector.
    one = space.bind(dcp_problem(bundled_specs()["vllm_a2a"], "combine", 1, 32, 512, "bfloat16"), 8)
    assert any("bytes per thread" in reason for reason in one.violations(sglang_shape))


@pytest.mark.parametrize("dtype", ["float32", "float8_e4m3fn", "input"])
def test_a_batch_innermost_combine_searches_runs_along_batch(dtype: str) -> None:
    # Its loads coalesce along batch (the payload's innermost axis): the space goes past the 16 rows other
    # layouts stop at, and holds the family's default (128 rows, 32 on fp8 wires in blocks of 16).  An fp8
    # wire in blocks of 128 or more defaults to 128 elements per thread, outside the space
    # (`default_combine_config` says why); the tuner's decision races it.
    from conftest import make_spec

    fp8_block = {"scale_block": 16} if dtype.startswith("float8") else {}
    spec = make_spec(
        name="batch_inner",
        transport="all_to_all_single",
        payload={"axes": ["peer", "head", "dim", "batch"], "dtype": dtype, **fp8_block},
        stats={"placement": "separate", "axes": ["peer", "head", "slot", "batch"]},
    )
    problem = dcp_problem(spec, "combine", 8, 16, 512, "bfloat16")
    bound = space.bind(problem, 1024)
    assert max(bound.choices["block_batch"]) == 256
    default = DCP_FAMILY.default_config(problem, 1024)
    assert bound.is_feasible(default), bound.violations(default)
    if fp8_block:
        whole_rows = spec.model_copy(update={"payload": spec.payload.model_copy(update={"scale_block": None})})
        rows_problem = dcp_problem(whole_rows, "combine", 8, 16, 512, "bfloat16")
        wide = DCP_FAMILY.default_config(rows_problem, 1024)
        assert (wide.block_batch, wide.block_dim, wide.num_warps) == (32, 128, 1)
        assert any("per thread" in reason for reason in space.bind(rows_problem, 1024).violations(wide))
    row_major = space.bind(dcp_problem(bundled_specs()["vllm_a2a"], "combine", 8, 16, 512, "bfloat16"), 1024)
    assert max(row_major.choices["block_batch"]) == 16


def test_combine_tiles_count_the_partials_they_load() -> None:
    # 2 heads x 128 bf16 writes 512 bytes but loads N times that: in the space at N = 8 (4 KiB loaded) and
    # N = 2 (1 KiB), out of it at N = 1; the same tile in pack (one load) stays out.
    small = CombineConfig(block_batch=1, block_head=2, block_dim=128, num_warps=1)
    for N, feasible in ((8, True), (2, True), (1, False)):
        bound = space.bind(dcp_problem(bundled_specs()["vllm_a2a"], "combine", N, 16, 512, "bfloat16"), 64)
        assert bound.is_feasible(small) is feasible, (N, bound.violations(small))
    assert any("bytes per program" in reason for reason in bound.violations(small))
    pack = space.bind(dcp_problem(bundled_specs()["vllm_a2a"], "pack", 8, 16, 512, "bfloat16"), 64)
    tile = PackConfig(block_peer=1, block_batch=1, block_head=2, block_dim=128, num_warps=1)
    assert any("bytes per program" in reason for reason in pack.violations(tile))


def test_grid_defaults_cover_mla_and_plain_attention() -> None:
    points = DCP_FAMILY.grid_points({}, interpret=False)
    assert {(p["H"], p["D"]) for p in points} == {(16, 512), (128, 512), (32, 128)}
    assert {p["N"] for p in points} == {2, 4, 8}
    assert DCP_FAMILY.bucket.defaults[0] == 1 and DCP_FAMILY.bucket.defaults[-1] == 4096
    given = DCP_FAMILY.grid_points({"N": [4], "H": [6, 8]}, interpret=False)
    assert [(p["N"], p["H"], p["D"]) for p in given] == [(4, 6, 512), (4, 6, 128), (4, 8, 512), (4, 8, 128)]


def test_options_survive_the_trip_to_a_worker_process(tmp_path: Path) -> None:
    options = tiny_options(tmp_path, time_budget_s=12.5)
    assert plan.TuneOptions.from_json(options.to_json()) == options


def test_percentiles() -> None:
    timing = summarize([5.0, 1.0, 2.0, 4.0, 3.0], calls=1)
    assert (timing.median_us, timing.p20_us, timing.p80_us) == (3.0, 1.8, 4.2)


# ---------------------------------------------------------------------------------------------------
# The pipeline under the interpreter
# ---------------------------------------------------------------------------------------------------
@requires_interpreter
def test_pipeline_writes_a_database_that_dispatch_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    options = tiny_options(tmp_path, kernels=("pack", "combine"))
    summary = run_tune(options)
    assert summary.gate_failures == 0 and not summary.interrupted and summary.unfinished == 0
    assert summary.db_path == tmp_path / "db" / "cpu-interpreter.json"
    database = read_database(summary.db_path)
    assert database.device_name == CPU_INTERPRETER_DEVICE
    module = layoutgen.load("pynccl_a2a")
    assert sorted(database.entries) == sorted(
        dcp_key("pynccl_a2a", k, 2, 2, 8, "bfloat16", b).as_str() for k in ("pack", "combine") for b in (1, 3)
    )
    for entry in database.entries.values():
        assert entry.spec_hash == module.SPEC_HASH and entry.source_hash == module.SOURCE_HASHES[entry.key.kernel]
        assert entry.trials >= 2 and entry.p20_us <= entry.median_us <= entry.p80_us and entry.default_us > 0
        problem = dcp_problem(module.SPEC, entry.key.kernel, 2, 2, 8, "bfloat16")
        config = space.bind(problem, entry.key.bucket).config_type.from_dict(entry.config)
        target = next(t for t in plan.make_targets(options) if t.problem.kernel == entry.key.kernel)
        target_default = target.default_config(entry.key.bucket)
        assert space.bind(problem, entry.key.bucket).is_feasible(config) or config == target_default
    # Every study of the exhaustive bucket measured its whole space once.
    trials = all_trials(options)
    assert_no_config_timed_twice(trials)
    # Runtime dispatch on the CPU device reads the database (the bucket for B=2 is 3).
    try:
        from layoutgen.runtime import configs
    except ImportError:
        pytest.skip("runtime dispatch (layoutgen.runtime.configs) is not available in this checkout")
    monkeypatch.setenv("LAYOUTGEN_TUNING_DB", str(tmp_path / "db"))
    configs.reset()
    for kernel in ("pack", "combine"):
        decl = DCP_FAMILY.kernel(kernel)
        chosen = configs.tuned_config(
            "dcp",
            "pynccl_a2a",
            decl,
            torch.device("cpu"),
            {"N": 2, "Hl": 2, "D": 8},
            "bfloat16",
            2,
            configs.expected_for(decl, module.SPEC_HASH, module.SOURCE_HASHES[kernel]),
        )
        key = dcp_key("pynccl_a2a", kernel, 2, 2, 8, "bfloat16", 3)
        assert chosen is not None and chosen.as_dict() == database.entries[key.as_str()].config
    configs.reset()


@requires_interpreter
def test_a_config_that_fails_to_compile_is_a_failed_trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources

    module = layoutgen.load("pynccl_a2a")
    original = module._launch_pack

    def launch(out: Any, lse: Any, bufs: Any, batch: int, config: PackConfig, index_64: bool, **kwargs: Any) -> None:
        if config.block_head == 2 and config.block_peer == 1:
            raise OutOfResources(300000, 232448, "shared memory")
        if config.block_head == 2:
            raise CompilationError(None, ast.Module(body=[], type_ignores=[]), "simulated compiler failure")
        original(out, lse, bufs, batch, config, index_64, **kwargs)

    monkeypatch.setattr(module, "_launch_pack", launch)
    options = tiny_options(tmp_path, buckets=(1,))
    summary = run_tune(options)
    assert summary.gate_failures == 0 and summary.unfinished == 0
    (trials,) = all_trials(options).values()
    failed = [t for t in trials if t.state == TrialState.FAIL]
    reasons = sorted(t.user_attrs["result"]["reason"] for t in failed)
    assert len(failed) == 2 and all(outcome(t) == "launch_failed" for t in failed)
    assert "CompilationError" in reasons[0] and "simulated compiler failure" in reasons[0]
    assert "OutOfResources" in reasons[1] and "shared memory" in reasons[1]
    # The study went on: the other two configs were measured and one of them won.
    assert sum(1 for t in trials if outcome(t) == "measured") == 2
    entry = next(iter(read_database(tmp_path / "db" / "cpu-interpreter.json").entries.values()))
    assert entry.config["block_head"] == 1


@requires_interpreter
def test_the_gate_catches_a_broken_kernel_loudly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from layoutgen.cli import CommandFailed, app
    from layoutgen.cli.common import expand_arguments

    module = layoutgen.load("pynccl_a2a")
    original = module._launch_pack

    def corrupting(out: Any, lse: Any, bufs: Any, batch: int, config: PackConfig, index_64: bool, **kw: Any) -> None:
        original(out, lse, bufs, batch, config, index_64, **kw)
        if config.block_peer == 2:  # a "kernel bug" that flips one payload byte
            bufs.tensors["payload"].view(-1).view(torch.uint8)[5] ^= 0x40

    monkeypatch.setattr(module, "_launch_pack", corrupting)
    storage, db = tmp_path / "studies.journal", tmp_path / "db"
    args = ["tune", "--interpret", "--spec", "pynccl_a2a", "--kernel", "pack", "--N", "2", "--heads", "4"]
    args += ["--D", "8", "--batch", "1", "--storage", str(storage), "--db", str(db)]
    result = CliRunner().invoke(app, expand_arguments(args))
    assert isinstance(result.exception, CommandFailed) and result.exception.code == 1, result.output
    assert "correctness gate" in str(result.exception)
    assert "fails the correctness gate" in result.output and "block_peer" in result.output
    (trials,) = all_trials(tiny_options(tmp_path)).values()
    broken = [t for t in trials if outcome(t) == "gate_failed"]
    assert len(broken) == 2 and all(t.state == TrialState.FAIL for t in broken)
    assert all(t.user_attrs["result"]["config"]["block_peer"] == 2 for t in broken)
    assert "differ" in broken[0].user_attrs["result"]["reason"]
    # A kernel wrong for one config is wrong: no config of it is recorded.
    assert "computed a wrong result" in str(result.exception)
    assert not (db / "cpu-interpreter.json").exists()


class CountingTimer:
    """Counts search timings (finalize re-times with `time_interleaved`, which is not counted)."""

    def __init__(self, interrupt_at: int | None = None) -> None:
        self.calls = 0
        self.interrupt_at = interrupt_at
        self.original = WallClockTimer.time

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        counter = self

        def time(self: WallClockTimer, *args: Any, **kwargs: Any) -> Any:
            counter.calls += 1
            if counter.interrupt_at is not None and counter.calls == counter.interrupt_at:
                raise KeyboardInterrupt
            return counter.original(self, *args, **kwargs)

        monkeypatch.setattr(WallClockTimer, "time", time)


@requires_interpreter
def test_resume_after_interruption_does_not_redo_trials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    options = tiny_options(tmp_path)
    first = CountingTimer(interrupt_at=4)
    first.install(monkeypatch)
    summary = run_tune(options)
    assert summary.interrupted
    trials = all_trials(options)
    interrupted = [t for ts in trials.values() for t in ts if outcome(t) == "interrupted"]
    measured_before = sum(1 for ts in trials.values() for t in ts if outcome(t) == "measured")
    assert measured_before == 3 and len(interrupted) >= 1
    assert not any(t.state == TrialState.RUNNING for ts in trials.values() for t in ts)

    second = CountingTimer()
    second.install(monkeypatch)
    summary = run_tune(options)
    assert not summary.interrupted and summary.unfinished == 0
    trials = all_trials(options)
    measured_after = sum(1 for ts in trials.values() for t in ts if outcome(t) == "measured")
    assert measured_after == 4 + 4  # the exhaustive bucket's 4 configs and the TPE bucket's 4 trials
    assert second.calls == measured_after - measured_before  # nothing finished before was timed again
    assert_no_config_timed_twice(trials)

    third = CountingTimer()
    third.install(monkeypatch)
    run_tune(options)
    assert third.calls == 0


@requires_interpreter
def test_a_study_decided_on_fewer_trials_than_asked_is_searched_further(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A --time-budget that ran out (or a smaller --trials) records what it found; asking for more resumes it.
    short = tiny_options(tmp_path, trials=2)
    run_tune(short)
    db_file = Path(short.db_dir) / device_file_name(CPU_INTERPRETER_DEVICE)
    trials = {entry.key.bucket: entry.trials for entry in read_database(db_file).entries.values()}
    assert trials == {1: 4, 3: 2}  # the exhaustive bucket's 4 configs; the TPE bucket's 2 trials

    timer = CountingTimer()
    timer.install(monkeypatch)
    output = io.StringIO()
    summary = runner.run(dataclasses.replace(short, trials=4), Console(file=output, width=200))
    assert [row.bucket for row in summary.rows] == [3]  # the exhaustive one stays decided
    assert "1 database entries were decided on fewer trials than this run's budget" in output.getvalue()
    assert timer.calls == 2  # resumed from the study storage: only the two trials it had not measured
    trials = {entry.key.bucket: entry.trials for entry in read_database(db_file).entries.values()}
    assert trials == {1: 4, 3: 4}

    again = CountingTimer()
    again.install(monkeypatch)
    summary = run_tune(dataclasses.replace(short, trials=4, storage=str(tmp_path / "fresh.journal")))
    assert summary.rows == [] and again.calls == 0  # decided on the trials asked for: skipped


@requires_interpreter
def test_a_time_budget_that_runs_out_is_said_in_the_tables_and_the_report(tmp_path: Path) -> None:
    # A budget gone before the first trial: each study keeps the default, and the tables say the search was
    # cut (n of m trials), where before they showed the trials like a finished search's.
    report = tmp_path / "report.md"
    short = tiny_options(tmp_path, time_budget_s=1e-9, report=str(report))
    output = io.StringIO()
    summary = runner.run(short, Console(file=output, width=200))
    assert [(row.bucket, row.trials, row.budget, row.cut_short) for row in summary.rows] == [
        (1, 0, 4, True),
        (3, 0, 4, True),
    ]
    assert all(row.chosen == "default" for row in summary.rows)
    assert "ex 0/4*" in output.getvalue() and "tpe 0/4*" in output.getvalue()
    assert report_legend_in(output.getvalue()) and report_legend_in(report.read_text())

    # With the time to finish, the same command searches both to their budget, and nothing is said.
    output = io.StringIO()
    summary = runner.run(dataclasses.replace(short, time_budget_s=None), Console(file=output, width=200))
    assert [(row.trials, row.cut_short) for row in summary.rows] == [(4, False), (4, False)]
    assert not report_legend_in(output.getvalue()) and not report_legend_in(report.read_text())


def report_legend_in(text: str) -> bool:
    return "the --time-budget ran out after n of m trials" in text


@requires_interpreter
def test_a_rerun_without_the_study_storage_skips_what_the_database_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A GPU host is often lent for one run: the next run starts with no study journal, only the database.
    options = tiny_options(tmp_path)
    run_tune(options)
    db_file = Path(options.db_dir) / device_file_name(CPU_INTERPRETER_DEVICE)
    written = db_file.read_bytes()
    timer = CountingTimer()
    timer.install(monkeypatch)
    output = io.StringIO()
    summary = runner.run(dataclasses.replace(options, storage=str(tmp_path / "fresh.journal")), Console(file=output))
    assert timer.calls == 0 and summary.rows == [] and db_file.read_bytes() == written
    assert "2 of 2 studies already have a current decision" in output.getvalue()
    assert "--retune" in output.getvalue()

    # An entry measured on another kernel source is stale: only that study runs again.
    data = json.loads(written)
    stale = next(key for key, entry in data["entries"].items() if entry["key"]["bucket"] == 3)
    data["entries"][stale]["source_hash"] = "0" * 64
    db_file.write_text(json.dumps(data), encoding="utf-8")
    summary = run_tune(dataclasses.replace(options, storage=str(tmp_path / "second.journal")))
    assert [row.bucket for row in summary.rows] == [3] and timer.calls > 0
    assert read_database(db_file).entries[stale].source_hash != "0" * 64

    # An entry timed over another number of rotating input sets (another cache state) is stale too, and so is
    # one that does not record it (a database written before layoutgen recorded it).
    data = json.loads(db_file.read_text(encoding="utf-8"))
    assert {entry["rotating_sets"] for entry in data["entries"].values()} == {1}  # the interpreter's rule
    other = next(key for key, entry in data["entries"].items() if entry["key"]["bucket"] == 1)
    data["entries"][other]["rotating_sets"] = 5
    db_file.write_text(json.dumps(data), encoding="utf-8")
    output = io.StringIO()
    summary = runner.run(
        dataclasses.replace(options, storage=str(tmp_path / "sets.journal")), Console(file=output, width=200)
    )
    assert [row.bucket for row in summary.rows] == [1]
    assert "1 database entries were tuned under other conditions than this tuner's" in output.getvalue()
    assert read_database(db_file).entries[other].rotating_sets == 1

    # So is one ranked under another timing procedure, searched in another space, or measured with another
    # triton or torch.
    pack = DCP_FAMILY.kernel("pack")
    for field, value in (
        ("timing_hash", "0" * 64),
        ("space_hash", "1" * 64),
        ("versions", {"triton": "2.0", "torch": "2.11"}),
    ):
        data = json.loads(db_file.read_text(encoding="utf-8"))
        assert {entry["timing_hash"] for entry in data["entries"].values()} == {timing_hash(pack)}
        assert all(entry["versions"] == entry_versions() for entry in data["entries"].values())
        data["entries"][stale][field] = value
        db_file.write_text(json.dumps(data), encoding="utf-8")
        summary = run_tune(dataclasses.replace(options, storage=str(tmp_path / f"{field}.journal")))
        assert [row.bucket for row in summary.rows] == [3], field

    # --retune tunes every study again.
    timer.calls = 0
    summary = run_tune(dataclasses.replace(options, storage=str(tmp_path / "third.journal"), retune=True))
    assert [row.bucket for row in summary.rows] == [1, 3] and timer.calls >= 4 + 4


@requires_interpreter
def test_a_run_that_dies_keeps_the_families_it_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A lent GPU host can be taken back mid-run with no chance to clean up: what was decided must be on disk.
    options = tiny_options(tmp_path, kernels=("pack", "combine"))
    searched = []
    original = search.search_family

    def search_family(ctx: Any, target: Any, buckets: list[int], deadline: float | None = None) -> None:
        if searched:
            raise RuntimeError("the machine went away")
        searched.append(target.problem.kernel)
        original(ctx, target, buckets, deadline)

    monkeypatch.setattr("layoutgen.tuning.worker.search_family", search_family)
    with pytest.raises(RuntimeError, match="went away"):
        run_tune(options)
    database = read_database(Path(options.db_dir) / device_file_name(CPU_INTERPRETER_DEVICE))
    assert sorted((entry.key.kernel, entry.key.bucket) for entry in database.entries.values()) == [
        (searched[0], 1),
        (searched[0], 3),
    ]


@requires_interpreter
def test_a_repeated_config_is_not_timed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    options = tiny_options(tmp_path, buckets=(1,))
    (target,) = plan.make_targets(options)
    storage = open_storage(options.storage)
    name, _ = prepare.prepare_study(storage, options, CPU_INTERPRETER_DEVICE, target, 1)
    duplicated = space.bind(target.problem, 1).to_params(target.default_config(1))
    handle = optuna.load_study(study_name=name, storage=storage)
    handle.enqueue_trial(duplicated)
    handle.enqueue_trial(duplicated)
    counter = CountingTimer()
    counter.install(monkeypatch)
    run_tune(options)
    trials = all_trials(options)[name]
    repeats = [t for t in trials if outcome(t) == "repeat"]
    assert len(repeats) == 2
    twin = next(t for t in trials if outcome(t) == "measured" and t.params == repeats[0].params)
    assert all(t.value == twin.value and t.user_attrs["result"]["repeat_of"] == twin.number for t in repeats)
    assert counter.calls == 4  # the four feasible configs, each timed once


def run_two_workers(options: plan.TuneOptions) -> None:
    summary = run_tune(options)
    assert not summary.worker_errors, summary.worker_errors
    assert summary.gate_failures == 0 and summary.unfinished == 0
    trials = all_trials(options)
    assert_no_config_timed_twice(trials)
    workers = Counter(
        str(t.user_attrs["claim"]["worker"]) for ts in trials.values() for t in ts if outcome(t) in claims.EVALUATED
    )
    assert len(workers) == 2, f"expected both workers to measure, got {dict(workers)}"
    storage = open_storage(options.storage)
    for name, study_trials in trials.items():
        budget = optuna.load_study(study_name=name, storage=storage).user_attrs["layoutgen"]["budget"]
        assert sum(1 for t in study_trials if outcome(t) in claims.EVALUATED) == budget, name


@requires_interpreter
def test_two_workers_share_a_journal_file_without_timing_a_config_twice(tmp_path: Path) -> None:
    run_two_workers(tiny_options(tmp_path, workers=2, kernels=("pack", "combine"), trials=5))


def decided_again(options: plan.TuneOptions) -> str:
    """Tune `options` (one study), then take its decision away: a study whose search is complete and that
    waits for its decision, as two tuners sharing it find it when both measured its last trials."""
    run_tune(options)
    (target,) = plan.make_targets(options)
    (bucket,) = options.buckets
    name = plan.study_name(CPU_INTERPRETER_DEVICE, target, bucket)
    optuna.load_study(study_name=name, storage=open_storage(options.storage)).set_user_attr("final", None)
    return name


def bucket_search(options: plan.TuneOptions, worker: str) -> search.BucketSearch:
    """A worker's search of the study: its own storage connection (a journal reader of its own) and worker id."""
    ctx = context.make_context(options, open_storage(options.storage), context.QuietReporter())
    ctx.worker = worker
    (target,) = plan.make_targets(options)
    (bucket,) = options.buckets
    return search.BucketSearch(ctx, target, bucket, None)


def study_names(options: plan.TuneOptions) -> list[str]:
    return sorted(summary.study_name for summary in optuna.get_all_study_summaries(open_storage(options.storage)))


@requires_interpreter
def test_two_tuners_that_find_a_study_complete_together_decide_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both found the study finalizable (searched, undecided); the second asks while the first is re-timing.
    # Deciding twice re-times twice and stores two decisions, the later overwriting the earlier, which its
    # tuner has already written into the database (measured_at decides there, so the two can disagree).
    import threading
    import time as clock

    options = tiny_options(tmp_path, buckets=(1,))
    name = decided_again(options)
    first, second = bucket_search(options, "host-a:1"), bucket_search(options, "host-b:2")
    assert first.finalizable() and second.finalizable()
    deciding, second_asked = threading.Event(), threading.Event()
    deciders: list[str] = []
    real_decide = search.decide

    def decide(bucket_search: search.BucketSearch) -> dict[str, Any]:
        deciders.append(bucket_search.ctx.worker)
        if len(deciders) == 1:
            deciding.set()
            assert second_asked.wait(30), "the second tuner neither decided nor waited"
        else:
            second_asked.set()
        return real_decide(bucket_search)

    class Clock:
        """search's clock, which tells when the second tuner waits."""

        def __getattr__(self, attribute: str) -> Any:
            return getattr(clock, attribute)

        def sleep(self, seconds: float) -> None:
            second_asked.set()
            clock.sleep(seconds)

    monkeypatch.setattr(search, "decide", decide)
    monkeypatch.setattr(search, "time", Clock())
    results: dict[str, Any] = {}

    def finalize(bucket_search: search.BucketSearch) -> None:
        results[bucket_search.ctx.worker] = bucket_search.finalize()

    threads = [threading.Thread(target=finalize, args=(first,))]
    threads[0].start()
    assert deciding.wait(30)
    threads.append(threading.Thread(target=finalize, args=(second,)))
    threads[1].start()
    for thread in threads:
        thread.join(60)
    assert deciders == ["host-a:1"], "the study was decided more than once"
    stored = optuna.load_study(study_name=name, storage=open_storage(options.storage)).user_attrs["final"]
    assert stored and results == {"host-a:1": stored, "host-b:2": stored}, "the second tuner saw another decision"
    assert study_names(options) == [name], "a finalization claim was left in the storage"
    assert not first.finalizable() and not second.finalizable()


@requires_interpreter
def test_a_finalization_claim_left_by_a_dead_tuner_is_taken_over(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys
    import time

    options = tiny_options(tmp_path, buckets=(1,))
    name = decided_again(options)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    storage = open_storage(options.storage)
    left = storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], f"{name}|finalizing|0")
    storage.set_study_user_attr(
        left, "claim", {"worker": f"{socket.gethostname()}:{dead.stdout.strip()}", "at": time.time()}
    )
    final = bucket_search(options, claims.worker_id()).finalize()
    assert final and final == optuna.load_study(study_name=name, storage=storage).user_attrs["final"]
    assert study_names(options) == [name]


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_a_finalization_claim_is_held_by_one_worker_until_released_or_gone(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Optuna refuses a study name that is taken atomically in both kinds of storage: exactly one of two
    # workers creating the same claim gets it.
    import time

    url = str(tmp_path / "studies.journal") if kind == "journal" else f"sqlite:///{tmp_path / 'studies.db'}"
    here, there = (
        claims.FinalizeClaim(open_storage(url), "s", "host-a:1"),
        claims.FinalizeClaim(open_storage(url), "s", "host-b:2"),
    )
    assert here.acquire() and not there.acquire()
    assert not there.acquire(), "a live claim of another host was taken"
    here.release()
    assert there.acquire() and not here.acquire()
    storage = open_storage(url)
    claim = storage.get_study_user_attrs(storage.get_study_id_from_name("s|finalizing|0"))["claim"]
    assert claim["worker"] == "host-b:2"
    # A claim of another host older than STALE_AFTER_S belongs to a worker that is gone: superseded.
    monkeypatch.setattr(claims, "STALE_AFTER_S", 0.0)
    assert here.acquire() and here.held == 1
    here.release()
    assert [s.study_name for s in optuna.get_all_study_summaries(storage)] == []
    # A claim created by a worker killed before it wrote its holder is gone UNCLAIMED_STALE_AFTER_S later.
    storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], "s|finalizing|0")
    monkeypatch.setattr(claims, "UNCLAIMED_STALE_AFTER_S", 0.05)
    assert not here.acquire()
    time.sleep(0.1)
    assert here.acquire() and here.held == 1


def test_cli_rejects_trials_with_time_budget(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from layoutgen.cli import CommandFailed, app
    from layoutgen.cli.common import expand_arguments

    result = CliRunner().invoke(app, expand_arguments(["tune", "--interpret", "--trials", "3", "--time-budget", "5"]))
    assert isinstance(result.exception, CommandFailed) and "not both" in str(result.exception)


def test_dry_run_prints_the_plan_without_tuning(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from layoutgen.cli import app
    from layoutgen.cli.common import expand_arguments

    result = CliRunner().invoke(
        app, expand_arguments(["tune", "--dry-run", "--spec", "vllm_a2a", "--kernel", "combine"])
    )
    assert result.exit_code == 0, result.output
    assert "117 studies" in result.output  # 9 default shapes x 13 buckets
    assert not (tmp_path / "cache" / "tuning").exists()  # no study storage was created


@requires_interpreter
def test_dry_run_marks_the_studies_the_database_decides(tmp_path: Path) -> None:
    """A dry run plans what a run would tune: studies the database holds a current decision for are shown
    decided, not counted (they were planned again, as if nothing were tuned)."""
    from typer.testing import CliRunner

    from layoutgen.cli import app
    from layoutgen.cli.common import expand_arguments

    options = tiny_options(tmp_path)
    run_tune(options)
    command = ["tune", "--dry-run", "--interpret", "--spec", "pynccl_a2a", "--kernel", "pack", "--shape", "N=2",
               "--shape", "H=4", "--shape", "D=8", "--bucket", "1", "3", "5", "--trials", "4", "--db", options.db_dir]  # fmt: skip
    result = CliRunner().invoke(app, expand_arguments(command))
    assert result.exit_code == 0, result.output
    assert "B=1: decided" in result.output and "B=3: decided" in result.output and "B=5: tpe 4/15" in result.output
    assert "1 studies, 4 measured trials planned, 2 decided" in result.output
    retune = CliRunner().invoke(app, expand_arguments([*command, "--retune"]))
    assert "3 studies" in retune.output and "decided" not in retune.output


@requires_interpreter
def test_the_tuner_names_the_smallest_bucket_that_serves_smaller_batches(tmp_path: Path) -> None:
    """Tuning only B=3 leaves B 1 and 2 on B=3's config (dispatch takes the smallest tuned bucket >= B): the
    run says so; once B=1 is tuned too there is nothing to say."""
    out = io.StringIO()
    runner.run(tiny_options(tmp_path, buckets=(3,), trials=2), Console(file=out, width=200))
    assert "note: dcp|pynccl_a2a|pack|N=2|Hl=2|D=8|bfloat16: B < 3 runs the config of B=3," in out.getvalue()
    out = io.StringIO()
    summary = runner.run(tiny_options(tmp_path, buckets=(1,)), Console(file=out, width=200))
    assert summary.db_path is not None and len(read_database(summary.db_path).entries) == 2
    assert "note:" not in out.getvalue()


def test_list_options_take_several_values_after_one_flag() -> None:
    from layoutgen.cli.common import expand_arguments

    args = ["tune", "--N", "2", "4", "8", "--report", "out.md", "--batch", "1", "--interpret", "--D", "8", "--debug"]
    assert expand_arguments(args) == [
        "--debug", "tune", "--shape", "N=2,4,8", "--report", "out.md", "--bucket", "1", "--interpret",
        "--shape", "D=8",
    ]  # fmt: skip
    spec_list = expand_arguments(["tune", "--spec", "a", "b", "--kernel", "pack"])
    assert spec_list == ["tune", "--spec", "a", "--spec", "b", "--kernel", "pack"]
    # show takes one value per alias and a positional spec argument after it.
    assert expand_arguments(["show", "--N", "2", "pynccl_a2a"]) == ["show", "--shape", "N=2", "pynccl_a2a"]


def test_the_cli_reads_several_values_after_one_flag(tmp_path: Path) -> None:
    import subprocess
    import sys

    command = [sys.executable, "-m", "layoutgen.cli", "tune", "--dry-run", "--spec", "vllm_a2a", "pynccl_a2a"]
    command += ["--kernel", "pack", "--N", "2", "4", "--heads", "8", "--D", "8", "--batch", "1", "3", "--interpret"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "8 studies" in result.stdout  # 2 specs x 2 peer counts x 2 buckets


@requires_interpreter
@pytest.mark.parametrize("spec_name", sorted(name for name, spec in bundled_specs().items() if spec.family == "dcp"))
def test_the_compile_worker_drives_every_launcher_with_meta_tensors(spec_name: str) -> None:
    """The pool worker's plumbing (meta buffers, the launcher's `kernel=` hook); under the interpreter the
    warm-up compiles nothing, on a GPU the same call fills Triton's cache."""
    from layoutgen.tuning.compile import compile_variant, integer_class
    from layoutgen.tuning.objective import Target

    module = layoutgen.load(spec_name)
    jobs = []
    for kernel in ("pack", "combine"):
        problem = dcp_problem(module.SPEC, kernel, 2, 3, 16, "bfloat16")
        config = space.bind(problem, 5).feasible()[-1]
        workload = DcpWorkload(
            Target(problem, module), 5, torch.device("cuda" if torch.cuda.is_available() else "cpu"), 0
        )
        job = workload.compile_job(config)
        assert compile_variant(job) is None
        jobs.append(job)
    broken = dataclasses.replace(jobs[0], config=(("block_dim", 3),))
    failure = compile_variant(broken)
    assert failure is not None and not failure.from_triton and "PackConfig" in failure.message
    assert [integer_class(b) for b in (1, 2, 8, 16, 4096)] == ["one", "plain", "plain", "div16", "div16"]
    # The live batch is not specialised: one compile serves every batch of the same capacity class.
    problem = dcp_problem(module.SPEC, "pack", 2, 3, 16, "bfloat16")
    config = space.bind(problem, 5).feasible()[-1]
    variants = {
        DcpWorkload(Target(problem, module), batch, torch.device("cuda"), 0).compile_job(config).variant
        for batch in (1, 5, 16)
    }
    assert len(variants) == 1
    # Capacity 17 (one spare row under the interpreter) is another integer class than 16.
    assert DcpWorkload(Target(problem, module), 16, torch.device("cpu"), 0).compile_job(config).variant not in variants


@pytest.mark.gpu
def test_gpu_pipeline_times_with_cuda_graphs_and_the_compile_pool(tmp_path: Path) -> None:
    """The GPU path end to end on two small buckets: compile pool, gate, CUDA-graph timing, copy ceiling."""
    from layoutgen.tuning_db import current_device

    options = tiny_options(
        tmp_path,
        grid=dcp_grid(2, 16, 512),
        kernels=("pack", "combine"),
        buckets=(1, 64),
        trials=6,
        exhaustive_limit=0,
        interpret=False,
        compile_workers=2,
        lookahead=3,
    )
    summary = run_tune(options)
    assert summary.gate_failures == 0 and summary.unfinished == 0 and not summary.worker_errors
    device = current_device()
    assert device is not None and summary.device_name == device[0]
    database = read_database(summary.db_path)  # type: ignore[arg-type]
    assert len(database.entries) == 4
    for row in summary.rows:
        assert row.copy_tbps is not None and row.copy_tbps > 0.5
        assert row.median_us is not None and 0.5 < row.median_us < 1000
        assert row.tbps is not None and row.tbps < 1.2 * row.copy_tbps
    trials = all_trials(options)
    assert_no_config_timed_twice(trials)
    sets = {t.user_attrs["result"]["sets"] for ts in trials.values() for t in ts if outcome(t) == "measured"}
    assert max(sets) > 1  # small buckets rotate their inputs


def test_the_phase_summary_splits_a_trial_into_its_parts() -> None:
    from types import SimpleNamespace

    phases = {"compile wait": 0.1, "gate and first launch": 0.4, "timing": 1.0}
    line = context.phase_summary(SimpleNamespace(phase_seconds=phases, trials_evaluated=100), seconds=2.0)  # type: ignore[arg-type]
    assert line == (
        "100 trials in 2 s; ms per trial: compile wait 1.0, gate and first launch 4.0, timing 10.0, "
        "the rest (sampler, storage, final re-timing) 5.0"
    )


def test_timing_inputs_rotate_until_they_span_two_l2_caches_over_at_most_eight_sets() -> None:
    l2 = 50 << 20
    assert MAX_ROTATING_SETS == 8
    assert rotating_sets(2 * l2, l2) == 1  # reads DRAM on its own
    assert rotating_sets(2 * l2 - 1, l2) == 2
    assert rotating_sets(l2 // 2, l2) == 4
    assert rotating_sets(l2 // 4 + 1, l2) == 8
    assert rotating_sets(1024, l2) == 8  # a small problem stays L2-resident, as in serving
    assert rotating_sets(1024, 0) == 1  # the interpreter has no L2 to defeat


@requires_interpreter
def test_a_retune_measures_the_config_the_database_holds_first(tmp_path: Path) -> None:
    options = tiny_options(tmp_path, buckets=(3,))
    (target,) = plan.make_targets(options)
    bound = space.bind(target.problem, 3)
    default = target.default_config(3)
    recorded = next(config for config in bound.feasible() if config != default)
    record(Path(options.db_dir), CPU_INTERPRETER_DEVICE, "none", [stale_entry(target, 3, recorded)])

    run_tune(options)  # the entry is stale (another source hash), so this study is tuned
    (trials,) = all_trials(options).values()
    seeds = {t.user_attrs.get("seed"): t.params for t in trials[:2]}
    assert seeds == {"default": bound.to_params(default), "database": bound.to_params(recorded)}


class LaunchOf:
    """A timing launch that only remembers its config, for timers that make the times up."""

    def __init__(self, config: Any) -> None:
        self.config = config

    def __call__(self, index: int) -> None:
        pass


def fake_timings(
    monkeypatch: pytest.MonkeyPatch, searched: dict[Any, float], retime: Callable[[list[Any]], list[float]]
) -> None:
    """The search times each config at `searched[config]`; the final re-timing gives `retime(configs)`."""

    def time(self: WallClockTimer, launch: LaunchOf, *args: Any, **kwargs: Any) -> Any:
        return summarize([searched[launch.config]] * 3, 1)

    def time_interleaved(self: WallClockTimer, launches: list[LaunchOf], *args: Any, **kwargs: Any) -> Any:
        return [summarize([us] * 3, 1) for us in retime([launch.config for launch in launches])]

    monkeypatch.setattr(DcpWorkload, "timing_launch", lambda self, config: LaunchOf(config))
    monkeypatch.setattr(WallClockTimer, "time", time)
    monkeypatch.setattr(WallClockTimer, "time_interleaved", time_interleaved)


def stale_entry(target: Any, batch: int, config: Any) -> TuningEntry:
    """A database entry holding `config`, measured on an older kernel source (so its study is tuned)."""
    current = plan.expected(target)
    return TuningEntry(key=target.problem.key(batch), config=config.as_dict(), median_us=1.0, p20_us=1.0,
                       p80_us=1.0, default_us=2.0, trials=4, spec_hash=target.spec_hash,
                       source_hash="an older kernel", space_hash=current.space_hash, timing_hash=current.timing_hash,
                       versions=dict(current.versions), measured_at="2026-01-01T00:00:00+00:00",
                       rotating_sets=1)  # fmt: skip


@requires_interpreter
def test_the_fastest_finalist_of_the_re_timing_wins_not_the_fastest_of_the_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = tiny_options(tmp_path, buckets=(3,), trials=6)
    (target,) = plan.make_targets(options)
    default = target.default_config(3)
    feasible = sorted(space.bind(target.problem, 3).feasible(), key=str)
    searched: dict[Any, float] = {config: 10.0 + index for index, config in enumerate(feasible)}
    searched[default] = 50.0
    lucky: list[Any] = []  # the search's fastest config, which the re-timing finds slow

    def retime(configs: list[Any]) -> list[float]:
        lucky.append(min((config for config in configs if config != default), key=searched.get))
        return [100.0 if config == lucky[-1] else searched[config] for config in configs]

    fake_timings(monkeypatch, searched, retime)
    run_tune(options)

    (name,) = all_trials(options)
    final = optuna.load_study(study_name=name, storage=open_storage(options.storage)).user_attrs["final"]
    finalists = [type(default).from_dict(f["config"]) for f in final["finalists"]]
    assert len(finalists) == decision.FINALISTS and default not in finalists and lucky[-1] in finalists
    runner_up = min((config for config in finalists if config != lucky[-1]), key=searched.get)
    assert final["chosen"] == "tuned" and final["config"] == runner_up.as_dict()


@requires_interpreter
@pytest.mark.parametrize("mode", ["tpe", "exhaustive"])
@pytest.mark.parametrize(("rival_us", "kept"), [(19.9, True), (15.0, False)])
def test_a_retune_replaces_the_database_config_only_past_the_noise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rival_us: float, kept: bool, mode: str
) -> None:
    # B 3 has 12 feasible configs: TPE under the exhaustive limit of 8, every point over one of 64 (where the
    # database's config was once seeded as one more point, re-timed only if among the fastest three).
    options = tiny_options(tmp_path, buckets=(3,), trials=6, exhaustive_limit=8 if mode == "tpe" else 64)
    (target,) = plan.make_targets(options)
    default = target.default_config(3)
    feasible = sorted(space.bind(target.problem, 3).feasible(), key=str)
    recorded = next(config for config in feasible if config != default)
    record(Path(options.db_dir), CPU_INTERPRETER_DEVICE, "none", [stale_entry(target, 3, recorded)])
    searched: dict[Any, float] = {config: 10.0 + index for index, config in enumerate(feasible)}
    searched[default] = 50.0
    retimed = {default: 50.0, recorded: 20.0}
    fake_timings(monkeypatch, searched, lambda configs: [retimed.get(config, rival_us) for config in configs])
    run_tune(options)

    (name,) = all_trials(options)
    final = optuna.load_study(study_name=name, storage=open_storage(options.storage)).user_attrs["final"]
    assert recorded.as_dict() in [f["config"] for f in final["finalists"]] and len(final["finalists"]) > 1
    assert final["chosen"] == "tuned"
    assert (final["config"] == recorded.as_dict()) is kept
    assert ("database_config_kept" in final) is kept
    database = read_database(Path(options.db_dir) / device_file_name(CPU_INTERPRETER_DEVICE))
    assert (database.entries[target.problem.key(3).as_str()].config == recorded.as_dict()) is kept


@requires_interpreter
def test_combine_timing_writes_one_output_for_every_rotating_set(tmp_path: Path) -> None:
    # As the benchmark and serving (a static output under CUDA graphs) do: with an output per set, every call's
    # writes went to DRAM and configs the benchmark tells apart tied in the tuner (the kernels' declared timing).
    options = tiny_options(tmp_path, kernels=("pack", "combine"), buckets=(3,))
    pack_target, combine_target = plan.make_targets(options)
    launched: dict[str, list[Any]] = {"pack": [], "combine": []}
    for target in (pack_target, combine_target):
        workload = DcpWorkload(target, 3, torch.device("cpu"), l2_bytes=1 << 20)
        assert workload.sets == MAX_ROTATING_SETS
        config = target.default_config(3)
        launch = workload.timing_launch(config)
        for index in range(workload.sets):
            launch(index)
        launched[target.problem.kernel] = workload._timing_sets or []
    outputs = {id(timing_set["result"]) for timing_set in launched["combine"]}
    assert len(launched["combine"]) == MAX_ROTATING_SETS and len(outputs) == 1
    sends = {id(timing_set["bufs"]) for timing_set in launched["pack"]}
    assert len(sends) == MAX_ROTATING_SETS  # pack writes each set's own send buffers


def test_only_a_kernel_declared_resident_and_fitting_in_the_l2_is_timed_in_two_cache_states() -> None:
    l2 = 50 << 20
    assert cache_states(8, 9 << 20, l2, resident_timing=True) == (1, 8)  # combine N 8, B 64: 9 MiB
    assert cache_states(2, l2, l2, resident_timing=True) == (1, 2)
    assert cache_states(2, l2 + 1, l2, resident_timing=True) == (2,)  # one call spills the L2 anyway
    assert cache_states(1, 3 << 30, l2, resident_timing=True) == (1,)
    assert cache_states(8, 9 << 20, l2, resident_timing=False) == (8,)
    assert DCP_FAMILY.kernel("combine").resident_timing and not DCP_FAMILY.kernel("pack").resident_timing


def test_resident_timing_changes_only_the_timing_hash_of_the_kernels_that_declare_it() -> None:
    combine = DCP_FAMILY.kernel("combine")
    assert timing_hash(combine) != timing_hash(dataclasses.replace(combine, resident_timing=False))
    pack = DCP_FAMILY.kernel("pack")
    # The pack entries of the committed database were tuned before resident timing existed and are current.
    assert timing_hash(pack) == timing_hash(dataclasses.replace(pack, resident_timing=False))
    assert "resident" not in timing_procedure(pack) and "resident" in timing_procedure(combine)


def test_two_cache_states_combine_as_the_geometric_mean() -> None:
    resident, rotated = Timing(2.0, 1.5, 2.5, 30, 64), Timing(8.0, 6.0, 10.0, 30, 64)
    both = combine_states([resident, rotated])
    assert math.isclose(both.median_us, 4.0) and math.isclose(both.p20_us, 3.0) and math.isclose(both.p80_us, 5.0)
    assert both.samples == 60 and not both.stopped_early
    # 10% faster in one state and 10% slower in the other ties with a config even in both.
    even = combine_states([Timing(3.0, 3.0, 3.0, 1, 1), Timing(5.0, 5.0, 5.0, 1, 1)])
    uneven = combine_states([Timing(3.3, 3.3, 3.3, 1, 1), Timing(5.0 / 1.1, 5.0 / 1.1, 5.0 / 1.1, 1, 1)])
    assert math.isclose(even.median_us, uneven.median_us)
    assert combine_states([rotated]) is rotated


class StateTimer:
    """Makes up a median per input-set count, and records the give-up limit each timing was asked with."""

    def __init__(self, medians: dict[int, float]) -> None:
        self.medians = medians
        self.asked: list[tuple[int, float | None]] = []

    def time(self, launch: Any, sets: int, estimated_us: float, give_up_us: float | None = None) -> Timing:
        self.asked.append((sets, give_up_us))
        median = self.medians[sets]
        stopped = give_up_us is not None and median > give_up_us
        return Timing(median, median, median, 8 if stopped else 30, 1, stopped)

    def time_interleaved(self, launches: list[Any], sets: int, estimated_us: float) -> list[Timing]:
        return [Timing(self.medians[sets] * launch, self.medians[sets] * launch, self.medians[sets] * launch, 100, 1)
                for launch in launches]  # fmt: skip


def test_time_states_stops_a_candidate_once_it_cannot_beat_the_best_any_more() -> None:
    timer = StateTimer({1: 3.0, 8: 5.0})
    timing = time_states(timer, None, (1, 8), 1.0)
    assert math.isclose(timing.median_us, math.sqrt(15.0)) and not timing.stopped_early
    assert timer.asked == [(1, None), (8, None)]

    # The best so far is 4.0: the resident 3.0 leaves the rotated state up to 16 / 3 us to stay in the race.
    timer = StateTimer({1: 3.0, 8: 5.0})
    assert not time_states(timer, None, (1, 8), 1.0, give_up_us=4.0).stopped_early
    assert timer.asked == [(1, 4.0), (8, pytest.approx(16.0 / 3.0))]
    timer = StateTimer({1: 3.0, 8: 6.0})
    stopped = time_states(timer, None, (1, 8), 1.0, give_up_us=4.0)
    assert stopped.stopped_early and stopped.median_us > 4.0

    # A resident run already slower than the best stops before the rotated state is timed at all.
    timer = StateTimer({1: 4.5, 8: 6.0})
    stopped = time_states(timer, None, (1, 8), 1.0, give_up_us=4.0)
    assert stopped.stopped_early and timer.asked == [(1, 4.0)]


def test_the_final_re_timing_combines_each_launch_over_the_states() -> None:
    timer = StateTimer({1: 2.0, 8: 8.0})
    first, second = time_interleaved_states(timer, [1.0, 2.0], (1, 8), 1.0)
    assert math.isclose(first.median_us, 4.0) and math.isclose(second.median_us, 8.0)
    (only,) = time_interleaved_states(timer, [1.0], (8,), 1.0)
    assert math.isclose(only.median_us, 8.0)


@requires_interpreter
def test_a_combine_workload_that_fits_in_the_l2_is_timed_resident_first(tmp_path: Path) -> None:
    options = tiny_options(tmp_path, kernels=("pack", "combine"), buckets=(3,))
    pack_target, combine_target = plan.make_targets(options)
    assert DcpWorkload(combine_target, 3, torch.device("cpu"), l2_bytes=1 << 20).states == (1, MAX_ROTATING_SETS)
    assert DcpWorkload(pack_target, 3, torch.device("cpu"), l2_bytes=1 << 20).states == (MAX_ROTATING_SETS,)
    assert DcpWorkload(combine_target, 3, torch.device("cpu"), l2_bytes=0).states == (1,)  # the interpreter


@requires_interpreter
def test_the_dispatch_hint_names_the_directory_given_for_a_linked_database(tmp_path: Path) -> None:
    """A database linked into --db receives the decisions itself; the hint names --db (read through the
    link), not the target's directory, where no file of that name need exist."""
    from typer.testing import CliRunner

    from layoutgen.cli import app
    from layoutgen.cli.common import expand_arguments

    shared = tmp_path / "shared" / "team.json"
    record(tmp_path / "shared", CPU_INTERPRETER_DEVICE, "none", [])  # an existing database, renamed
    (tmp_path / "shared" / device_file_name(CPU_INTERPRETER_DEVICE)).rename(shared)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / device_file_name(CPU_INTERPRETER_DEVICE)).symlink_to(shared)
    command = ["tune", "--interpret", "--spec", "pynccl_a2a", "--kernel", "pack", "--shape", "N=2", "--shape", "H=4",
               "--shape", "D=8", "--bucket", "1", "--db", str(mine), "--storage", str(tmp_path / "s.journal")]  # fmt: skip
    result = CliRunner().invoke(app, expand_arguments(command))
    assert result.exit_code == 0, result.output
    assert f"LAYOUTGEN_TUNING_DB={mine}" in result.output.replace("\n", "")
    assert read_database(shared).entries  # the link's target holds the decision
