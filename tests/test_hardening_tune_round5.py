"""`layoutgen tune`, fifth review round: what a re-tune, a shared study storage, a spec named like a bundled
one, an installed layoutgen, an unreadable database, a size no config can run and a grid no spec holds did.

Each test runs the real pipeline under the Triton interpreter on the tiny pack problem (N 2, H 4, D 8: at
B 1 an exhaustive space of 4 configs), through the entry point where the exit code or the words matter.
"""

from __future__ import annotations

import io
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest import REPO_ROOT, requires_interpreter
from optuna.trial import TrialState
from rich.console import Console
from test_cli_polish import PYNCCL_SPEC, assert_one_line_error, run_main
from test_tuning import tiny_options as tuning_tiny_options

from layoutgen import codegen
from layoutgen.dcp import FAMILY as DCP_FAMILY
from layoutgen.dcp.workload import DcpWorkload
from layoutgen.spec import bundled_specs, load_spec
from layoutgen.tuning import plan, prepare, runner
from layoutgen.tuning.claims import trial_handle
from layoutgen.tuning.space import bind
from layoutgen.tuning.storage import open_storage
from layoutgen.tuning.timing import WallClockTimer
from layoutgen.tuning_db import CPU_INTERPRETER_DEVICE, device_file_name, read_database, record

TINY = ["--interpret", "--spec", "pynccl_a2a", "--kernel", "pack", "--shape", "N=2", "--shape", "H=4", "--shape", "D=8"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYOUTGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LAYOUTGEN_TUNING_DB", raising=False)


def tiny_options(tmp_path: Path, **changes: Any) -> plan.TuneOptions:
    """`test_tuning.tiny_options` with one size bucket."""
    return tuning_tiny_options(tmp_path, **{"buckets": (1,), **changes})


def run_tune(options: plan.TuneOptions) -> runner.RunSummary:
    return runner.run(options, Console(file=io.StringIO(), width=200))


class Timings:
    """Counts the search's timings; raises KeyboardInterrupt at timing `interrupt_at` (Ctrl-C mid-search)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.interrupt_at: int | None = None
        original = WallClockTimer.time

        def time(timer: WallClockTimer, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.interrupt_at:
                raise KeyboardInterrupt
            return original(timer, *args, **kwargs)

        monkeypatch.setattr(WallClockTimer, "time", time)

    def reset(self, interrupt_at: int | None = None) -> None:
        self.calls, self.interrupt_at = 0, interrupt_at


def entry(options: plan.TuneOptions) -> Any:
    (only,) = read_database(Path(options.db_dir) / device_file_name(CPU_INTERPRETER_DEVICE)).entries.values()
    return only


def study_trials(storage: Any) -> dict[str, int]:
    """Study name -> its trials, of every study (claims of a decision aside) in the storage."""
    return {
        summary.study_name: summary.n_trials
        for summary in optuna.get_all_study_summaries(storage)
        if "|finalizing|" not in summary.study_name
    }


# ---------------------------------------------------------------------------------------------------
# 1. --retune measures again, also where the study storage still holds the decision
# ---------------------------------------------------------------------------------------------------
@requires_interpreter
def test_retune_measures_again_in_a_fresh_study_and_resumes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Was: the study, final in the storage, handed its old decision back; nothing was timed, measured_at kept.
    options = tiny_options(tmp_path)
    timings = Timings(monkeypatch)
    run_tune(options)
    assert timings.calls == 4
    first = entry(options)
    (base,) = study_trials(open_storage(options.storage))

    retune = tiny_options(tmp_path, retune=True)
    timings.reset(interrupt_at=3)
    assert run_tune(retune).interrupted  # two trials of the fresh study measured, then Ctrl-C
    assert entry(options) == first
    timings.reset()
    summary = run_tune(retune)  # the same --retune resumes that study: only what it lacks is timed
    assert timings.calls == 2 and summary.unfinished == 0
    again = entry(options)
    assert again.trials == 4 and again.measured_at >= first.measured_at
    studies = study_trials(open_storage(options.storage))
    assert studies[base] == 4 and len(studies) == 2, "the old study stays as it was, for any worker using it"

    timings.reset()
    run_tune(retune)  # a later --retune replaces that decision in a study of its own
    assert timings.calls == 4 and len(study_trials(open_storage(options.storage))) == 3


# ---------------------------------------------------------------------------------------------------
# 2. A spec file named like a bundled spec but laid out otherwise
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["yaml", "module"])
def test_a_spec_named_like_a_bundled_one_with_another_layout_is_refused(
    form: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Was: accepted, and its decisions replaced the bundled spec's entries (keys hold the name).
    text = PYNCCL_SPEC.read_text()
    assert "\nalign_bytes: 4\n" in text
    spec_file = tmp_path / "pynccl_a2a.yaml"
    spec_file.write_text(text.replace("\nalign_bytes: 4\n", "\nalign_bytes: 16\n"))
    source = spec_file
    if form == "module":
        source = tmp_path / "built" / "pynccl_a2a.py"
        codegen.write_if_changed(source, codegen.render(load_spec(spec_file), str(spec_file)))
    args = ["tune", "--dry-run", *TINY[:1], "--spec", str(source), *TINY[3:], "--bucket", "1"]
    code, _, err = run_main(args, capsys, monkeypatch)
    assert_one_line_error(code, err, str(source), "'pynccl_a2a' is a bundled spec's", "`name:`")


def test_a_copy_of_a_bundled_spec_may_be_tuned_under_its_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "pynccl_a2a.yaml"
    copy.write_text(PYNCCL_SPEC.read_text().replace("summary:", "summary: my copy.", 1))  # the summary is no layout
    assert load_spec(copy).layout_hash() == bundled_specs()["pynccl_a2a"].layout_hash()
    args = ["tune", "--dry-run", *TINY[:1], "--spec", str(copy), *TINY[3:], "--bucket", "1"]
    code, out, err = run_main(args, capsys, monkeypatch)
    assert code == 0 and "1 studies" in out, err


# ---------------------------------------------------------------------------------------------------
# 3. The database dispatch does not read says how to make it read it, on the GPU path too
# ---------------------------------------------------------------------------------------------------
def fake_gpu_run(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`runner.run` replaced by one that records an empty database where the run would (no GPU here)."""
    written: list[str] = []

    def run(options: plan.TuneOptions, console: Any) -> runner.RunSummary:
        assert options.db_dir is not None and not options.interpret
        written.append(options.db_dir)
        path = record(Path(options.db_dir), "NVIDIA Fake", "9.0", [])
        return runner.RunSummary([], "NVIDIA Fake", path, 0, 0)

    monkeypatch.setattr(runner, "run", run)
    return written


def test_an_installed_layoutgen_says_how_dispatch_reads_what_tune_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Was: the GPU path printed nothing, and the cache's tuning_db/ it wrote is not where dispatch looks.
    import layoutgen.loader

    written = fake_gpu_run(monkeypatch)
    monkeypatch.setattr(layoutgen.loader, "source_root", lambda: None)  # no checkout: an installed layoutgen
    module = REPO_ROOT / "generated" / "pynccl_a2a.py"  # the bundled module, found without a checkout
    code, out, err = run_main(["tune", "--spec", str(module), *TINY[3:], "--bucket", "1"], capsys, monkeypatch)
    assert code == 0, err
    assert written == [str(tmp_path / "cache" / "tuning_db")]
    assert f"dispatch reads it with LAYOUTGEN_TUNING_DB={tmp_path / 'cache' / 'tuning_db'}" in out.replace("\n", "")


def test_no_hint_where_dispatch_reads_the_database_already(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_gpu_run(monkeypatch)
    mine = tmp_path / "mine"
    code, out, err = run_main(["tune", *TINY[1:], "--bucket", "1", "--db", str(mine)], capsys, monkeypatch)
    assert code == 0 and f"LAYOUTGEN_TUNING_DB={mine}" in out.replace("\n", ""), err
    monkeypatch.setenv("LAYOUTGEN_TUNING_DB", str(mine))
    code, out, err = run_main(["tune", *TINY[1:], "--bucket", "1", "--db", str(mine)], capsys, monkeypatch)
    assert code == 0 and "LAYOUTGEN_TUNING_DB" not in out, err


# ---------------------------------------------------------------------------------------------------
# 4. A database file tune cannot read is a failure (exit 1), as in `db check`
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dry_run", [False, True])
@pytest.mark.parametrize("content", ["not json", '{"schema_version": 3, "device_name": "cpu-interpreter"}'])
def test_an_unreadable_database_exits_1_saying_what_to_do(
    content: str, dry_run: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "bad" / device_file_name(CPU_INTERPRETER_DEVICE)
    bad.parent.mkdir()
    bad.write_text(content)
    args = ["tune", *TINY, "--bucket", "1", "--db", str(bad.parent)] + (["--dry-run"] if dry_run else [])
    code, _, err = run_main(args, capsys, monkeypatch)
    assert code == 1, err
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(bad) in err and "--db" in err and "move" in err, err
    assert bad.read_text() == content


# ---------------------------------------------------------------------------------------------------
# 5. A study another tuner still measures is waited for and decided, not left undecided
# ---------------------------------------------------------------------------------------------------
def claim_two_trials(options: plan.TuneOptions, worker_pid: int) -> tuple[Any, list[int]]:
    """As another tuner sharing the storage: prepare the study, take two of its configs and claim them."""
    storage = open_storage(options.storage)
    (target,) = plan.make_targets(options)
    prepare.prepare_study(storage, options, CPU_INTERPRETER_DEVICE, target, 1)
    study = optuna.load_study(study_name=plan.study_name(CPU_INTERPRETER_DEVICE, target, 1), storage=storage)
    ranges = bind(target.problem, 1).param_ranges()
    numbers = []
    for _ in range(2):
        trial = study.ask()
        for name, (low, high) in ranges.items():
            trial.suggest_int(name, low, high)
        trial.set_user_attr("claim", {"worker": f"{socket.gethostname()}:{worker_pid}", "at": time.time()})
        numbers.append(trial.number)
    return study, numbers


@requires_interpreter
@pytest.mark.parametrize("other", ["finishes", "dies"])
def test_a_study_another_tuner_measures_is_waited_for_and_decided(
    other: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Was: the run left it undecided ("re-run the same command to continue") and its database lacked it.
    options = tiny_options(tmp_path)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the other tuner's process
    study, numbers = claim_two_trials(options, worker.pid)
    space = bind(plan.make_targets(options)[0].problem, 1)

    def other_tuner() -> None:
        time.sleep(1.0)  # while this run measures the two configs left, then waits
        if other == "dies":
            worker.kill()
            worker.wait()  # reaped: a zombie's pid still answers
            return
        for number in numbers:
            handle = trial_handle(study, number)
            config = space.from_params(handle.params).as_dict()
            handle.set_user_attr("result", {"outcome": "measured", "config": config, "median_us": 5.0})
            study.tell(handle, 5.0)

    thread = threading.Thread(target=other_tuner)
    timings = Timings(monkeypatch)
    thread.start()
    try:
        summary = run_tune(options)
    finally:
        thread.join()
        worker.kill()
        worker.wait()
    assert summary.unfinished == 0 and [bool(row.chosen) for row in summary.rows] == [True]
    assert timings.calls == (2 if other == "finishes" else 4)  # a dead tuner's configs are measured here
    assert entry(options).trials == 4
    states = [t.state for t in study.get_trials() if t.number in numbers]
    assert states == ([TrialState.COMPLETE] * 2 if other == "finishes" else [TrialState.FAIL] * 2)


# ---------------------------------------------------------------------------------------------------
# 6. Sizes: bounded up front, an allocation failure names the size, a study no config ran fails the run
# ---------------------------------------------------------------------------------------------------
def test_a_bucket_beyond_any_batch_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = tmp_path / "j.journal"
    args = ["tune", *TINY, "--bucket", "99999999999999999999", "--db", str(tmp_path / "db"), "--storage", str(journal)]
    code, _, err = run_main(args, capsys, monkeypatch)
    assert_one_line_error(code, err, "--bucket 99999999999999999999", str(plan.MAX_BUCKET), "2**31-1")
    assert not journal.exists() and not (tmp_path / "db").exists()
    code, _, err = run_main([*args[:-4], "--dry-run"], capsys, monkeypatch)
    assert_one_line_error(code, err, "--bucket 99999999999999999999")


@requires_interpreter
def test_buffers_that_cannot_be_allocated_name_the_bucket(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Was: exit 2 with the allocator's words alone (`DefaultCPUAllocator: can't allocate memory`).
    def alloc(self: DcpWorkload) -> Any:
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
            "allocate 1374389534800 bytes. Error code 12 (Cannot allocate memory)"
        )

    monkeypatch.setattr(DcpWorkload, "_alloc", alloc)
    args = ["tune", *TINY, "--bucket", "3", "--db", str(tmp_path / "db"), "--storage", str(tmp_path / "j.journal")]
    code, _, err = run_main(args, capsys, monkeypatch)
    assert code == 2 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and "B=3" in last and "--bucket 3 is too large" in last, err


@requires_interpreter
def test_a_study_where_no_config_ran_fails_the_run_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Was: exit 0, an empty reason ("TypeError: ") and "re-run the same command to continue", which decides the same.
    def gate(self: DcpWorkload, config: Any, seed: int) -> str | None:
        raise TypeError  # no message, as the interpreter's for a size beyond int64

    monkeypatch.setattr(DcpWorkload, "gate", gate)
    db = tmp_path / "db"
    args = ["tune", *TINY, "--bucket", "1", "--db", str(db), "--storage", str(tmp_path / "j.journal")]
    for _ in range(2):  # the decision stays, and so does what the run says
        code, out, err = run_main(args, capsys, monkeypatch)
        assert code == 1, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: 1 studies could not be decided"), err
        assert "pynccl_a2a pack N=2 Hl=2 D=8 bfloat16 B=1: no config ran" in last and "TypeError()" in last, err
        assert "re-run" not in err and "none ran" in out
        assert not (db / device_file_name(CPU_INTERPRETER_DEVICE)).exists()


# ---------------------------------------------------------------------------------------------------
# 7. A grid no spec holds names why
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["--spec", "pynccl_a2a", "--shape", "N=1", "--shape", "H=1", "--shape", "D=1"],
            ["row tail", "D divisible by 2"],
        ),
        (
            ["--spec", "deepspeed_ulysses", "--shape", "N=3"],
            ["deepspeed_ulysses at N=3", "H (heads) must be divisible"],
        ),
    ],
)
def test_a_grid_no_spec_can_hold_names_the_specs_reason(
    args: list[str], words: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Was: "(e.g. a head count not divisible by N)" whatever the reason.
    code, _, err = run_main(["tune", "--interpret", "--dry-run", *args, "--bucket", "1"], capsys, monkeypatch)
    assert_one_line_error(code, err, "no study to plan", *words)


def test_the_families_say_why_a_point_is_left_out() -> None:
    spec = bundled_specs()["pynccl_a2a"]
    point = {"N": 1, "H": 1, "D": 1}
    assert DCP_FAMILY.key_shapes(spec, "pack", point, "bfloat16") is None
    assert "row tail" in str(DCP_FAMILY.shape_problem(spec, "pack", point, "bfloat16"))
    assert DCP_FAMILY.shape_problem(spec, "pack", {"N": 2, "H": 4, "D": 8}, "bfloat16") is None


# ---------------------------------------------------------------------------------------------------
# 8. The help gives the interpreter's defaults too
# ---------------------------------------------------------------------------------------------------
def test_tune_help_gives_both_defaults(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = run_main(["tune", "--help"], capsys, monkeypatch)
    text = " ".join(out.replace("│", " ").split())
    assert code == 0, err
    assert f"(default {plan.DEFAULT_TPE_TRIALS}; {plan.INTERPRET_TPE_TRIALS} with --interpret)" in text
    assert f"({plan.DEFAULT_EXHAUSTIVE_LIMIT}; {plan.INTERPRET_EXHAUSTIVE_LIMIT} with --interpret)" in text


def test_the_retune_names_travel_to_worker_processes(tmp_path: Path) -> None:
    # `--workers K` hands the options to each worker process as JSON: the fresh studies must come through.
    options = tiny_options(tmp_path, retune=True, renamed=(("a", "a|retune 1"),))
    assert plan.TuneOptions.from_json(options.to_json()) == options
