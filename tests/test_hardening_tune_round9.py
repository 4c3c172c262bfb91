"""Ninth hardening pass, the tuner's half (see tests/test_hardening_round9.py): a mutation audit of the tuning
database and the tuner (59 mutations of decision, plan, space, search, timing, storage, report, the database
and the `db` / `tune` commands; 41 failed some test).  No survivor was a defect in the package; each test below
fails under the mutation it names:

* the noise floor a tuned config must beat (`gain > noise`, not `> 0`), with the default's own spread in it,
  and the gain measured as 1 - tuned / default;
* a tuned entry records the tuned config's timing and the default's, and a default that cannot run is
  recorded as default_us 0 (a branch no test ran);
* a space of exactly `--exhaustive-limit` configs is searched exhaustively, and a limit of 0 is honoured;
* the study name changes with every hash and version an entry is current against (else a re-tune after a
  timing change resumes the old, decided study);
* the feasible-space cache keyed by everything a bucket changes (min_program_bytes);
* every config compiles as its own variant (else one compile failure marks its neighbours failed);
* the search gives up on a candidate against the best so far;
* the report says "gate failed", not "none ran";
* `remove` (db prune) waits for the database lock a tuner holds;
* an entry timed L2-resident and then rotated records the rotation's set count (taken from the first state,
  the interpreter's only one, a GPU's entries would be re-tuned on every run).
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from conftest import requires_interpreter
from filelock import FileLock
from test_tuning import LaunchOf, run_tune, tiny_options
from test_tuning_db import make_entry, make_key
from typer.testing import CliRunner

import layoutgen
from layoutgen.cli import app
from layoutgen.cli.common import expand_arguments
from layoutgen.dcp.workload import DcpWorkload
from layoutgen.tuning import plan, space
from layoutgen.tuning.report import ResultRow, row_cells
from layoutgen.tuning.storage import open_storage
from layoutgen.tuning.timing import Timing, WallClockTimer, summarize
from layoutgen.tuning_db import CPU_INTERPRETER_DEVICE, device_file_name, lock_path, read_database, record, remove


def timings_by_config(monkeypatch: pytest.MonkeyPatch, search_us: Any, final: Any) -> None:
    """Search times each config at search_us(config); the final re-timing gives final(config) -> Timing."""

    def time(self: WallClockTimer, launch: LaunchOf, *args: Any, **kwargs: Any) -> Timing:
        return summarize([search_us(launch.config)] * 3, 1)

    def time_interleaved(self: WallClockTimer, launches: list[LaunchOf], *args: Any, **kwargs: Any) -> list[Timing]:
        return [final(launch.config) for launch in launches]

    monkeypatch.setattr(DcpWorkload, "timing_launch", lambda self, config: LaunchOf(config))
    monkeypatch.setattr(WallClockTimer, "time", time)
    monkeypatch.setattr(WallClockTimer, "time_interleaved", time_interleaved)


def decide_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, default_t: Timing, other_t: Timing):
    options = tiny_options(tmp_path, buckets=(1,))  # 4 feasible configs, exhaustive
    (target,) = plan.make_targets(options)
    default = target.default_config(1)
    timings_by_config(
        monkeypatch, lambda c: 50.0 if c == default else 10.0, lambda c: default_t if c == default else other_t
    )
    run_tune(options)
    storage = open_storage(options.storage)
    (summary,) = optuna.get_all_study_summaries(storage)
    final = optuna.load_study(study_name=summary.study_name, storage=storage).user_attrs["final"]
    db = read_database(Path(options.db_dir) / device_file_name(CPU_INTERPRETER_DEVICE))
    return default, final, db.entries[target.problem.key(1).as_str()]


def flat(us: float) -> Timing:
    return summarize([us] * 3, 1)


@requires_interpreter
@pytest.mark.parametrize(("tuned_us", "chosen"), [(9.9, "default"), (9.801, "default"), (9.0, "tuned")])
def test_a_config_within_the_noise_floor_of_the_default_keeps_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tuned_us: float, chosen: str
) -> None:
    # default 10 µs: 9.9 is 1% faster; 9.801 is 1.99% by 1 - t/d (within the 2% floor) but 2.03% by d/t - 1.
    default, final, entry = decide_one(tmp_path, monkeypatch, flat(10.0), flat(tuned_us))
    assert final["chosen"] == chosen
    assert final["gain"] == pytest.approx(1 - final["tuned_us"] / final["default_us"])
    if chosen == "default":
        assert entry.config == default.as_dict() and "within the noise" in final["reason"]
    else:
        assert entry.config != default.as_dict()


@requires_interpreter
def test_the_defaults_own_spread_is_noise_a_winner_must_exceed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 5% faster than a default whose p20-p80 spans 10% of its median: within its noise, the default stays.
    default, final, entry = decide_one(tmp_path, monkeypatch, Timing(10.0, 9.5, 10.5, 100, 1), flat(9.5))
    assert final["noise"] == pytest.approx(0.10)
    assert final["chosen"] == "default" and entry.config == default.as_dict()


@requires_interpreter
def test_a_tuned_entry_records_the_tuned_configs_timing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, final, entry = decide_one(tmp_path, monkeypatch, Timing(10.0, 9.9, 10.1, 100, 1), Timing(5.0, 4.9, 5.1, 100, 1))
    assert final["chosen"] == "tuned"
    assert (entry.median_us, entry.p20_us, entry.p80_us, entry.default_us) == (5.0, 4.9, 5.1, 10.0)


# --- plan / space ---------------------------------------------------------------------------------------------
def test_a_space_of_exactly_the_exhaustive_limit_is_searched_exhaustively(tmp_path: Path) -> None:
    options = tiny_options(tmp_path, buckets=(3,), trials=4)
    (target,) = plan.make_targets(options)
    size = len(space.bind(target.problem, 3).feasible())
    at = plan.search_plan(target.problem, 3, dataclasses.replace(options, exhaustive_limit=size))
    below = plan.search_plan(target.problem, 3, dataclasses.replace(options, exhaustive_limit=size - 1))
    assert (at.mode, at.budget) == ("exhaustive", size)
    assert (below.mode, below.budget) == ("tpe", 4)


@pytest.mark.parametrize("field", ["spec_hash", "source_hash", "space_hash", "timing_hash", "versions"])
def test_the_study_name_changes_with_everything_an_entry_is_current_against(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str
) -> None:
    (target,) = plan.make_targets(tiny_options(tmp_path, buckets=(3,)))
    before = plan.study_name("dev", target, 3)
    real = plan.expected(target)
    changed = {"triton": "0.1", "torch": "0.1"} if field == "versions" else "f" * 64
    monkeypatch.setattr(plan, "expected", lambda t: dataclasses.replace(real, **{field: changed}))
    assert plan.study_name("dev", target, 3) != before


def test_the_feasible_cache_never_serves_another_buckets_space(tmp_path: Path) -> None:
    (target,) = plan.make_targets(tiny_options(tmp_path, buckets=(9,)))
    space._feasible_cache.clear()
    for bucket in (9, 17, 64, 1):  # same choices, other min_program_bytes at 9 and 17
        bound = space.bind(target.problem, bucket)
        assert all(bound.is_feasible(config) for config in bound.feasible()), bucket


def test_every_config_compiles_as_its_own_variant(tmp_path: Path) -> None:
    (target,) = plan.make_targets(tiny_options(tmp_path, buckets=(3,)))
    workload = DcpWorkload(target, 3, torch.device("cpu"), l2_bytes=0)
    configs = space.bind(target.problem, 3).feasible()
    variants = {workload.compile_job(config).variant for config in configs}
    assert len(variants) == len(configs)


# --- search ---------------------------------------------------------------------------------------------------
@requires_interpreter
def test_a_candidate_gives_up_against_the_best_so_far(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    options = tiny_options(tmp_path, buckets=(3,), trials=6)
    (target,) = plan.make_targets(options)
    feasible = sorted(space.bind(target.problem, 3).feasible(), key=str)
    us = {config: 10.0 + 7 * ((index * 5) % 12) for index, config in enumerate(feasible)}  # not monotone
    calls: list[tuple[float | None, float]] = []

    def time(self: WallClockTimer, launch: LaunchOf, sets: int, estimated: float, give_up_us: float | None = None):
        calls.append((give_up_us, us.get(launch.config, 99.0)))
        return summarize([calls[-1][1]] * 3, 1)

    monkeypatch.setattr(DcpWorkload, "timing_launch", lambda self, config: LaunchOf(config))
    monkeypatch.setattr(WallClockTimer, "time", time)
    run_tune(options)
    assert calls[0][0] is None
    for index in range(1, len(calls)):
        assert calls[index][0] == pytest.approx(1.5 * min(value for _, value in calls[:index]))


# --- report / cli ---------------------------------------------------------------------------------------------
def test_a_study_whose_kernel_failed_the_gate_says_so_in_the_kept_column() -> None:
    row = ResultRow(
        "s",
        "pack",
        (("N", 2),),
        "bfloat16",
        "B",
        1,
        "exhaustive",
        4,
        None,
        None,
        None,
        None,
        None,
        "wrong",
        finished=True,
        wrong_results=2,
    )
    assert row_cells(row)["kept"] == "gate failed"


@requires_interpreter
def test_an_exhaustive_limit_of_zero_is_honoured(tmp_path: Path) -> None:
    args = [
        "tune",
        "--interpret",
        "--dry-run",
        "--spec",
        "pynccl_a2a",
        "--kernel",
        "pack",
        "--N",
        "2",
        "--heads",
        "4",
        "--D",
        "8",
        "--batch",
        "1",
        "--trials",
        "2",
        "--exhaustive-limit",
        "0",
        "--db",
        str(tmp_path / "db"),
        "--storage",
        str(tmp_path / "j"),
    ]
    result = CliRunner().invoke(app, expand_arguments(args))
    assert result.exit_code == 0, result.output
    assert "tpe 2/4" in result.output and "ex 4/4" not in result.output


def test_remove_waits_for_the_database_lock(tmp_path: Path) -> None:
    path = record(tmp_path, "dev", "9.0", [make_entry(make_key(1)), make_entry(make_key(8))])
    held = read_database(path).entries
    name = make_key(1).as_str()
    with FileLock(str(lock_path(path))):  # a tuner mid-record
        worker = threading.Thread(target=remove, args=(path, {name: held[name]}))
        worker.start()
        worker.join(0.5)
        assert worker.is_alive(), "remove read and rewrote the database under another writer's lock"
    worker.join(10)
    assert sorted(read_database(path).entries) == [make_key(8).as_str()]


@requires_interpreter
def test_a_default_that_cannot_run_is_recorded_as_default_us_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = layoutgen.load("pynccl_a2a")
    original = module._launch_pack
    options = tiny_options(tmp_path, buckets=(1,))
    (target,) = plan.make_targets(options)
    default = target.default_config(1)

    def launch(out: Any, lse: Any, bufs: Any, batch: int, config: Any, index_64: bool, **kwargs: Any) -> None:
        if config == default:
            raise ValueError("the default cannot launch here")
        original(out, lse, bufs, batch, config, index_64, **kwargs)

    monkeypatch.setattr(module, "_launch_pack", launch)
    summary = run_tune(options)
    (row,) = summary.rows
    assert row.chosen == "tuned" and row.default_us == 0.0 and row.speedup is None
    entry = read_database(Path(options.db_dir) / device_file_name(CPU_INTERPRETER_DEVICE)).entries[
        target.problem.key(1).as_str()
    ]
    assert entry.default_us == 0.0 and entry.config != default.as_dict()


@requires_interpreter
def test_an_entry_timed_resident_then_rotated_records_the_rotation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a GPU, combine (resident_timing) is timed in two cache states, (1, sets), where its call fits the L2:
    # the entry must record `sets`, the count `decided` compares with (a 1 would be re-tuned on every run).  The
    # interpreter has no L2; a 64 KiB one is lent to the worker and to the runner.
    from layoutgen.tuning import runner, worker

    l2_bytes = 1 << 16
    real_context = worker.make_context
    monkeypatch.setattr(
        worker, "make_context", lambda *args: dataclasses.replace(real_context(*args), l2_bytes=l2_bytes)
    )
    monkeypatch.setattr(runner, "device_l2", lambda options: l2_bytes)
    options = tiny_options(tmp_path, kernels=("combine",), buckets=(1,))
    (target,) = plan.make_targets(options)
    workload = DcpWorkload(target, 1, torch.device("cpu"), l2_bytes=l2_bytes)
    assert workload.sets > 1 and workload.states == (1, workload.sets)
    run_tune(options)
    entry = read_database(Path(options.db_dir) / device_file_name(CPU_INTERPRETER_DEVICE)).entries[
        target.problem.key(1).as_str()
    ]
    assert entry.rotating_sets == workload.sets
    assert plan.decided(entry, target, 1, l2_bytes)
