"""The tuning database's seventh audit, from an adversarial review of the tuner and dispatch: each test is a
defect a reviewer hit, fixed.

* A `LAYOUTGEN_TUNING_DB` directory holding one bucket of a shape hid every other bucket of that shape in the
  packaged file: its config ran at every size.  The bucket is now picked among all databases' buckets.
* An entry under another size name (`...|Q=64` beside `...|B=64`) passed `db check` and was dispatched at
  B 64.  Dispatch looks up the family's size name only, and `db check` calls the other invalid.
* An entry dated in the future (a clock ahead, an edit) won every merge until then, so a `--retune` said
  "recorded" while the old entry stayed.  `db check` names such entries, and the tuner says when its decision
  lost the merge.
* `record` could write a file larger than any reader takes, so every entry in it became unusable.
* Two tuners creating a fresh RDB storage at once: one failed with "cannot open it as an Optuna database".
* A database whose device name differs from the running device's only where its file name cannot show it
  was ignored with advice to move it to the name it already had.
* An interrupted `--retune`, run again, tuned again every study it had already re-tuned (a new generation
  each), and a later run without --retune recorded the decision a re-tune had replaced; and an exhaustive study did not re-time the database's config as a TPE study does
  (`test_tuning.py::test_a_retune_replaces_the_database_config_only_past_the_noise[...-exhaustive]`).
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import generated_module, requires_interpreter
from test_cli_polish import run_main
from test_hardening_db_round5 import DB_FILE, current_entry, planned

from layoutgen import tuning_db
from layoutgen.dcp import FAMILY as DCP_FAMILY
from layoutgen.dcp.config import PackConfig
from layoutgen.runtime import LayoutgenWarning, configs, reset_caches
from layoutgen.tuning import recorded
from layoutgen.tuning_db import CPU_INTERPRETER_DEVICE, DatabaseError, read_database, record

SPEC = "pynccl_a2a"
N, H, D = 2, 4, 8


def config_with_warps(warps: int) -> dict[str, Any]:
    config = PackConfig(block_batch=1, block_head=2, block_dim=8, num_warps=warps)
    return dataclasses.asdict(config)


def tuned_warps(size: int) -> int | None:
    """num_warps of the tuned pack config dispatch picks for `SPEC` at `size` rows (None: no tuned config)."""
    module = generated_module(SPEC)
    kernel = DCP_FAMILY.kernel("pack")
    expected = configs.expected_for(kernel, module.SPEC_HASH, module.SOURCE_HASHES["pack"])
    extents = {"N": N, "Hl": H // N, "D": D}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LayoutgenWarning)
        config = configs.tuned_config(
            "dcp", SPEC, kernel, torch.device("cpu"), extents, "bfloat16", size, expected, module.SPEC
        )
    return None if config is None else config.num_warps


@requires_interpreter
def test_an_override_directory_does_not_hide_the_packaged_buckets(clean_dispatch: Path) -> None:
    packaged = clean_dispatch.parent / "packaged"
    record(packaged, CPU_INTERPRETER_DEVICE, "cpu", [current_entry(SPEC, config_with_warps(w), bucket=b) for b, w in ((1, 1), (64, 2), (4096, 8))])  # fmt: skip
    record(clean_dispatch, CPU_INTERPRETER_DEVICE, "cpu", [current_entry(SPEC, config_with_warps(4), bucket=64)])
    reset_caches()
    # B 64: the override's entry (first directory); every other size: the packaged file's own buckets.
    assert {size: tuned_warps(size) for size in (1, 64, 65, 2048, 4096, 10**6)} == {
        1: 1, 64: 4, 65: 8, 2048: 8, 4096: 8, 10**6: 8,
    }  # fmt: skip


@requires_interpreter
def test_an_entry_under_another_size_name_is_never_dispatched_and_db_check_fails_on_it(
    clean_dispatch: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    right = current_entry(SPEC, config_with_warps(2), bucket=64)
    wrong = right.model_copy(update={"key": right.key.model_copy(update={"bucket_name": "Q"}), "config": config_with_warps(8)})  # fmt: skip
    record(clean_dispatch, CPU_INTERPRETER_DEVICE, "cpu", [right, wrong])
    reset_caches()
    assert tuned_warps(64) == 2
    code, out, _ = run_main(["db", "check", "--db", str(clean_dispatch)], capsys, monkeypatch, width=1000)
    assert code == 1 and f"{wrong.key.as_str()}: its size is Q, not the dcp key's B" in out, out


def test_an_entry_dated_in_the_future_is_named_by_db_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    future = current_entry(SPEC, config_with_warps(4), bucket=16, measured_at="2099-01-01T00:00:00+00:00")
    now = current_entry(SPEC, config_with_warps(2), bucket=16, measured_at=tuning_db.utc_now())
    record(tmp_path, CPU_INTERPRETER_DEVICE, "cpu", [future])
    record(tmp_path, CPU_INTERPRETER_DEVICE, "cpu", [now])
    (kept,) = read_database(tmp_path / DB_FILE).entries.values()
    assert kept == future  # the merge keeps the later date: what the tuner's note and db check are about
    assert recorded.future_entries([future, now]) == [future]
    code, out, _ = run_main(["db", "check", "--db", str(tmp_path)], capsys, monkeypatch, width=1000)
    assert code == 1 and "measured more than an hour from now" in out, out
    assert f"{future.key.as_str()}: measured_at 2099-01-01T00:00:00+00:00" in out, out


def test_record_refuses_to_write_a_database_no_reader_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record(tmp_path, CPU_INTERPRETER_DEVICE, "cpu", [current_entry(SPEC, config_with_warps(2), bucket=1)])
    before = (tmp_path / DB_FILE).read_bytes()
    monkeypatch.setattr(tuning_db, "MAX_DATABASE_BYTES", len(before) + 100)
    more = [current_entry(SPEC, config_with_warps(2), bucket=bucket) for bucket in range(2, 6)]
    with pytest.raises(DatabaseError, match=r"would grow to \d+ bytes with these 4 entries, past the \d+ bytes"):
        record(tmp_path, CPU_INTERPRETER_DEVICE, "cpu", more)
    assert (tmp_path / DB_FILE).read_bytes() == before, "the database was changed"


def test_a_schema_race_on_a_fresh_rdb_storage_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    import optuna

    from layoutgen.tuning import storage

    class IntegrityError(Exception):  # SQLAlchemy's, as another process creating the schema raises it
        pass

    calls: list[str] = []

    def rdb_storage(url: str, **kwargs: Any) -> str:
        calls.append(url)
        if len(calls) == 1:
            raise IntegrityError("UNIQUE constraint failed: alembic_version.version_num")
        return "opened"

    monkeypatch.setattr(optuna.storages, "RDBStorage", rdb_storage)
    assert storage.open_storage("sqlite:////tmp/x.db") == "opened" and len(calls) == 2
    calls.clear()
    monkeypatch.setattr(optuna.storages, "RDBStorage", lambda url, **kwargs: (_ for _ in ()).throw(IntegrityError("x")))
    with pytest.raises(ValueError, match="cannot open it as an Optuna database"):  # twice: reported
        storage.open_storage("sqlite:////tmp/x.db")


@requires_interpreter
def test_a_device_name_its_file_name_cannot_show_gets_the_right_advice(clean_dispatch: Path) -> None:
    record(clean_dispatch, CPU_INTERPRETER_DEVICE + " ", "cpu", [current_entry(SPEC, config_with_warps(2))])
    assert (clean_dispatch / DB_FILE).is_file()  # the same file name as the running device's
    _, messages = planned(SPEC)
    (message,) = [m for m in messages if "ignoring the tuning database" in m]
    assert f"correct its device_name to '{CPU_INTERPRETER_DEVICE}'" in message and "move it to" not in message


def test_an_interrupted_retune_resumes_its_studies_and_an_ended_one_starts_fresh(tmp_path: Path) -> None:
    import optuna

    from layoutgen.tuning.prepare import RETUNE_OPEN, end_retune, latest_decided_study, retune_study
    from layoutgen.tuning.storage import open_storage

    storage = open_storage(str(tmp_path / "studies.journal"))

    def study(name: str, final: bool, open_: bool | None = None) -> None:
        created = optuna.create_study(storage=storage, study_name=name, load_if_exists=True)
        if final:
            created.set_user_attr("final", {"config": {}})
        if open_ is not None:
            created.set_user_attr(RETUNE_OPEN, open_)

    assert retune_study(storage, "s", decided=False) == "s"  # nothing decided: the study itself
    study("s", final=True)
    assert retune_study(storage, "s", decided=True) == "s|retune 1"
    study("s|retune 1", final=True, open_=True)  # decided by a --retune that was interrupted
    assert retune_study(storage, "s", decided=True) == "s|retune 1", "the re-run must resume it, not start anew"
    end_retune(storage, ["s|retune 1"])  # that --retune ran to its end
    assert retune_study(storage, "s", decided=True) == "s|retune 2"
    study("t", final=True, open_=True)  # a --retune searched t itself (nothing was decided) and was interrupted
    assert retune_study(storage, "t", decided=True) == "t"
    # A run without --retune reads the newest decision (it used to record the one the re-tune replaced).
    study("s|retune 2", final=False)
    assert latest_decided_study(storage, "s") == "s|retune 1"
    assert latest_decided_study(storage, "t") == "t" and latest_decided_study(storage, "new") == "new"
