"""The tuning database: schema, canonical names, bucket choice, merging, locking and crash safety."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from layoutgen import tuning_db
from layoutgen.tuning.recorded import smallest_buckets
from layoutgen.tuning_db import (
    SCHEMA_VERSION,
    DatabaseError,
    TuningDatabase,
    TuningEntry,
    TuningKey,
    device_file_name,
    pick_bucket,
    read_database,
    record,
)

DEVICE = "NVIDIA H200"
VERSIONS = {"layoutgen": "0.1.0", "triton": "3.6.0", "torch": "2.13.0", "cuda": "12.8"}


def make_key(bucket: int = 64, spec: str = "pynccl_a2a", kernel: str = "pack", N: int = 4) -> TuningKey:
    return TuningKey(
        family="dcp",
        spec=spec,
        kernel=kernel,
        extents=(("N", N), ("Hl", 32), ("D", 512)),
        dtype="bfloat16",
        bucket_name="B",
        bucket=bucket,
    )


def make_entry(
    key: TuningKey | None = None, median_us: float = 3.5, measured_at: str = "2026-11-29T07:00:00+00:00"
) -> TuningEntry:
    return TuningEntry(
        key=key or make_key(),
        config={"block_batch": 1, "block_head": 4, "block_dim": 512, "num_warps": 4, "num_stages": 1},
        median_us=median_us,
        p20_us=median_us * 0.9,
        p80_us=median_us * 1.2,
        default_us=median_us * 1.5,
        trials=40,
        spec_hash="a" * 64,
        source_hash="b" * 64,
        space_hash="c" * 64,
        timing_hash="d" * 64,
        versions={"triton": "3.6", "torch": "2.11"},
        measured_at=measured_at,
        rotating_sets=8,
    )


# --- schema ---------------------------------------------------------------------------------------------------


def test_key_string_is_canonical_and_round_trips() -> None:
    key = make_key()
    assert key.as_str() == "dcp|pynccl_a2a|pack|N=4|Hl=32|D=512|bfloat16|B=64"
    assert TuningKey.from_str(key.as_str()) == key
    with pytest.raises(ValueError, match="not a tuning key"):
        TuningKey.from_str(str(tuple(key.model_dump().values())))


def test_key_rejects_malformed_fields() -> None:
    good = make_key().model_dump()
    for field, value in (("dtype", "Int 8"), ("kernel", "pa|ck"), ("extents", (("N", 0),)), ("bucket", 0)):
        with pytest.raises(ValueError, match=field):
            TuningKey(**{**good, field: value})
    with pytest.raises(ValueError, match="not a tuning key"):
        TuningKey.from_str("pynccl_a2a|pack|N=4|Hl=32|D=512|bfloat16|B=64")  # a schema-1 name: no family


def test_database_round_trips_through_json(tmp_path: Path) -> None:
    entries = [make_entry(make_key(bucket)) for bucket in (1, 8, 64)] + [make_entry(make_key(8, kernel="combine"))]
    path = record(tmp_path, DEVICE, "9.0", entries, VERSIONS)
    assert path == tmp_path / "NVIDIA_H200.json"
    text = path.read_text()
    assert text.endswith("}\n") and not text.endswith("\n\n")
    data = json.loads(text)
    assert json.dumps(data, sort_keys=True, indent=2) + "\n" == text  # sorted keys, stable indent: reviewable
    database = read_database(path)
    assert database.schema_version == SCHEMA_VERSION
    assert (database.device_name, database.compute_capability, database.versions) == (DEVICE, "9.0", VERSIONS)
    assert database.entries == {entry.key.as_str(): entry for entry in entries}
    assert TuningDatabase.model_validate_json(text).to_json() == text


def test_entry_names_must_match_their_keys(tmp_path: Path) -> None:
    path = record(tmp_path, DEVICE, "9.0", [make_entry()], VERSIONS)
    data = json.loads(path.read_text())
    data["entries"]["dcp|pynccl_a2a|pack|N=4|Hl=32|D=512|bfloat16|B=1"] = data["entries"].popitem()[1]
    path.write_text(json.dumps(data))
    with pytest.raises(DatabaseError, match=r"NVIDIA_H200\.json.*the names must match"):
        read_database(path)


def test_wrong_schema_version_and_corrupt_files_name_file_and_problem(tmp_path: Path) -> None:
    path = record(tmp_path, DEVICE, "9.0", [make_entry()], VERSIONS)
    data = json.loads(path.read_text())
    data["schema_version"] = SCHEMA_VERSION + 1
    path.write_text(json.dumps(data))
    with pytest.raises(DatabaseError, match=rf"{path.name}.*schema_version {SCHEMA_VERSION + 1} is not"):
        read_database(path)
    path.write_text('{"schema_version": 1, "device_name": ')
    with pytest.raises(DatabaseError, match=rf"{path.name} is not valid JSON"):
        read_database(path)
    path.write_text("[]")
    with pytest.raises(DatabaseError, match="must hold a JSON object"):
        read_database(path)
    with pytest.raises(DatabaseError, match="does not exist"):
        read_database(tmp_path / "missing.json")


def test_measured_at_needs_a_utc_offset() -> None:
    with pytest.raises(ValueError, match="UTC offset"):
        make_entry(measured_at="2026-11-29T07:00:00")
    assert make_entry(measured_at="2026-11-29T07:00:00Z").measured_time.utcoffset() is not None
    assert tuning_db.utc_now().endswith("+00:00")


@pytest.mark.parametrize(
    ("name", "file"),
    [
        ("NVIDIA H200", "NVIDIA_H200.json"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3.json"),
        ("cpu-interpreter", "cpu-interpreter.json"),
        ("  AMD Instinct MI300X / OAM ", "AMD_Instinct_MI300X_OAM.json"),
    ],
)
def test_device_file_name(name: str, file: str) -> None:
    assert device_file_name(name) == file


def test_device_file_name_rejects_names_without_letters() -> None:
    with pytest.raises(ValueError, match="no letters or digits"):
        device_file_name(" / ")


@pytest.mark.parametrize(("B", "bucket"), [(0, 1), (1, 1), (2, 8), (8, 8), (9, 64), (64, 64), (65, 64), (4096, 64)])
def test_the_bucket_is_the_smallest_tuned_one_at_least_the_size_else_the_largest(B: int, bucket: int) -> None:
    assert pick_bucket(B, [64, 1, 8, 8]) == bucket


def test_the_smallest_tuned_bucket_is_named_where_it_serves_smaller_sizes() -> None:
    """Dispatch runs the smallest tuned bucket's config below it; the tuner names that bucket per group of the
    keys it recorded, only where it is above 1, whichever of the group's keys it recorded."""
    entries = [make_entry(make_key(bucket)) for bucket in (64, 8)]
    entries += [make_entry(make_key(bucket, N=8)) for bucket in (1, 64)]
    recorded = [make_key(64), make_key(8), make_key(64, N=8), make_key(64, spec="vllm_a2a")]
    assert smallest_buckets(entries, recorded) == {make_key(64): 8}
    assert smallest_buckets(entries, []) == {}


def test_picking_a_bucket_needs_buckets() -> None:
    with pytest.raises(ValueError, match="at least one"):
        pick_bucket(3, [])


# --- merging ----------------------------------------------------------------------------------------------------


def test_record_merges_and_later_measurement_wins(tmp_path: Path) -> None:
    old = make_entry(median_us=5.0, measured_at="2026-11-29T07:00:00+00:00")
    other = make_entry(make_key(8), median_us=2.0)
    record(tmp_path, DEVICE, "9.0", [old, other], VERSIONS)
    newer = make_entry(median_us=9.0, measured_at="2026-11-29T08:00:00+00:00")
    stale = make_entry(make_key(8), median_us=1.0, measured_at="2026-11-28T00:00:00+00:00")
    path = record(tmp_path, DEVICE, "9.0", [newer, stale], {**VERSIONS, "triton": "3.7.0"})
    database = read_database(path)
    assert database.entries[old.key.as_str()] == newer
    assert database.entries[other.key.as_str()] == other  # the older measurement did not replace it
    assert database.versions["triton"] == "3.7.0"


def test_equal_times_merge_the_same_whatever_the_order(tmp_path: Path) -> None:
    fast, slow = make_entry(median_us=2.0), make_entry(median_us=3.0)
    first = record(tmp_path / "a", DEVICE, "9.0", [fast], VERSIONS)
    record(tmp_path / "a", DEVICE, "9.0", [slow], VERSIONS)
    second = record(tmp_path / "b", DEVICE, "9.0", [slow], VERSIONS)
    record(tmp_path / "b", DEVICE, "9.0", [fast], VERSIONS)
    assert first.read_text() == second.read_text()
    assert read_database(first).entries[fast.key.as_str()] == fast


def test_record_refuses_to_overwrite_a_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / device_file_name(DEVICE)
    path.write_text("{ not json")
    with pytest.raises(DatabaseError, match="not valid JSON"):
        record(tmp_path, DEVICE, "9.0", [make_entry()], VERSIONS)
    assert path.read_text() == "{ not json"


def test_record_refuses_another_compute_capability(tmp_path: Path) -> None:
    record(tmp_path, DEVICE, "9.0", [make_entry()], VERSIONS)
    with pytest.raises(DatabaseError, match=r"compute capability 9\.0, not 10\.0"):
        record(tmp_path, DEVICE, "10.0", [make_entry(make_key(8))], VERSIONS)


def test_record_refuses_a_file_of_another_device_name(tmp_path: Path) -> None:
    """A file whose device_name is not its own (hand-copied from another GPU's) is refused, not relabelled:
    `db check` calls it invalid, and the entries it holds were measured on that other device."""
    path = record(tmp_path, DEVICE, "9.0", [make_entry()], VERSIONS)
    data = json.loads(path.read_text())
    data["device_name"] = "NVIDIA H100 80GB HBM3"
    path.write_text(json.dumps(data))
    before = path.read_bytes()
    with pytest.raises(DatabaseError, match=r"holds device_name 'NVIDIA H100 80GB HBM3', not"):
        record(tmp_path, DEVICE, "9.0", [make_entry(make_key(8))], VERSIONS)
    assert path.read_bytes() == before


def test_failed_replace_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = record(tmp_path, DEVICE, "9.0", [make_entry()], VERSIONS)
    before = path.read_text()

    def failing_replace(source: str, target: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tuning_db.os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        record(tmp_path, DEVICE, "9.0", [make_entry(make_key(8))], VERSIONS)
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".tmp") == []


# --- processes --------------------------------------------------------------------------------------------------


def _write_one(db_dir: str, bucket: int) -> None:
    record(Path(db_dir), DEVICE, "9.0", [make_entry(make_key(bucket))], VERSIONS)


def _die_before_replace(db_dir: str) -> None:
    def killed(source: str, target: str) -> None:
        os._exit(17)  # the process dies between writing the temporary file and replacing the database

    tuning_db.os.replace = killed  # type: ignore[assignment]
    record(Path(db_dir), DEVICE, "9.0", [make_entry(make_key(8))], VERSIONS)


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    buckets = [1, 2, 4, 8, 16, 32, 64, 128]
    workers = [context.Process(target=_write_one, args=(str(tmp_path), bucket)) for bucket in buckets]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [worker.exitcode for worker in workers] == [0] * len(buckets)
    database = read_database(tmp_path / device_file_name(DEVICE))
    assert sorted(entry.key.bucket for entry in database.entries.values()) == buckets


def test_writer_killed_mid_write_leaves_a_valid_file(tmp_path: Path) -> None:
    path = record(tmp_path, DEVICE, "9.0", [make_entry()], VERSIONS)
    before = path.read_text()
    worker = multiprocessing.get_context("spawn").Process(target=_die_before_replace, args=(str(tmp_path),))
    worker.start()
    worker.join(timeout=120)
    assert worker.exitcode == 17
    assert path.read_text() == before
    read_database(path)
    # The dead writer's lock is gone with its process: the next writer gets through.
    record(tmp_path, DEVICE, "9.0", [make_entry(make_key(8))], VERSIONS)
    assert len(read_database(path).entries) == 2


# --- CLI ----------------------------------------------------------------------------------------------------------


def test_cli_db_check_and_show(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console
    from typer.testing import CliRunner

    from layoutgen.cli import CommandFailed, app
    from layoutgen.cli import db as cli_db
    from layoutgen.cli.common import expand_arguments

    monkeypatch.setattr(cli_db, "console", Console(width=400))

    runner = CliRunner()

    def text(result: Any) -> str:
        return " ".join(result.output.split())  # rich wraps long lines

    empty = runner.invoke(app, expand_arguments(["db", "check", "--db", str(tmp_path)]))
    assert empty.exit_code == 0 and "an empty database is valid" in text(empty)
    record(tmp_path, DEVICE, "9.0", [make_entry(), make_entry(make_key(8, kernel="combine"))], VERSIONS)
    checked = runner.invoke(app, expand_arguments(["db", "check", "--db", str(tmp_path)]))
    assert checked.exit_code == 0, checked.output
    assert f"ok {tmp_path / 'NVIDIA_H200.json'}: 2 stale spec" in text(checked)  # the test entries' hashes are made up
    shown = runner.invoke(app, expand_arguments(["db", "show", "--db", str(tmp_path), "--device", DEVICE, "--entries"]))
    assert shown.exit_code == 0, shown.output
    assert "pynccl_a2a pack N=4 Hl=32 D=512 bfloat16 (stale spec)" in text(shown)
    assert "B=64 3.50 3.15-4.20 1.50x 40 head4 dim512 w4" in text(shown)
    (tmp_path / "Other_GPU.json").write_text('{"schema_version": 2}')
    broken = runner.invoke(app, expand_arguments(["db", "check", "--db", str(tmp_path)]))
    assert isinstance(broken.exception, CommandFailed) and "1 invalid tuning database file(s)" in str(broken.exception)
    assert f"invalid tuning database {tmp_path / 'Other_GPU.json'} is invalid: device_name: Field required" in text(
        broken
    )


# --- the committed database and its migration from schema 1 ---------------------------------------------------------


COMMITTED_DATABASES = ("NVIDIA_H200.json", "NVIDIA_H100_80GB_HBM3.json")


def test_every_packaged_database_is_committed_and_tested() -> None:
    from layoutgen.runtime import configs

    packaged = sorted(path.name for path in configs.packaged_database_dir().glob("*.json"))
    assert packaged == sorted(COMMITTED_DATABASES)


@pytest.mark.parametrize("file_name", COMMITTED_DATABASES)
def test_a_committed_database_is_current_and_dispatch_picks_its_configs(
    file_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every one of a committed file's entries is current for today's specs, kernels, spaces and timing procedure
    (`layoutgen db prune` keeps it so), and dispatch on its device (torch 2.11, triton 3.6, as the file
    records) chooses exactly its config."""
    import warnings

    import torch

    from layoutgen.family import get_family
    from layoutgen.loader import load
    from layoutgen.runtime import LayoutgenWarning, configs

    def fallback_fails(name: str) -> Any:
        return lambda: pytest.fail(f"{name}: dispatch fell back to the default")

    database = read_database(configs.packaged_database_dir() / file_name)
    assert database.entries  # what the last session on that device tuned (README, "Tuning")
    monkeypatch.delenv("LAYOUTGEN_TUNING_DB", raising=False)
    monkeypatch.setattr(configs, "device_name", lambda device: database.device_name)
    monkeypatch.setattr(tuning_db, "entry_versions", lambda: {"triton": "3.6", "torch": "2.11"})
    configs.reset()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", LayoutgenWarning)
            for entry in database.entries.values():
                key = entry.key
                module = load(key.spec)
                decl = get_family(key.family).kernel(key.kernel)
                chosen = configs.resolve_config(
                    key.family,
                    key.spec,
                    decl,
                    torch.device("cuda", 0),
                    dict(key.extents),
                    key.dtype,
                    key.bucket,
                    module.SPEC_HASH,
                    module.SOURCE_HASHES[key.kernel],
                    fallback_fails(key.as_str()),
                )
                assert chosen.as_dict() == entry.config, key.as_str()
    finally:
        configs.reset()


def test_the_schema_1_migration_converts_by_content(tmp_path: Path) -> None:
    import hashlib
    import subprocess
    import sys

    from layoutgen.codegen import render_kernels
    from layoutgen.spec import bundled_specs

    spec = bundled_specs()["pynccl_a2a"]
    units = render_kernels(spec)
    legacy_spec = hashlib.sha256(
        json.dumps(
            spec.model_dump(mode="json", exclude={"summary", "family"}), sort_keys=True, separators=(",", ":")
        ).encode()
    ).hexdigest()

    def old_entry(kernel: str, bucket: int, source_hash: str, timing_rule: int) -> dict[str, Any]:
        key = {"spec": "pynccl_a2a", "kernel": kernel, "N": 2, "heads_per_peer": 2, "D": 8, "dtype": "bfloat16"}
        return {
            "key": key | {"batch_bucket": bucket},
            "config": {"block_batch": 1, "block_head": 2, "block_dim": 8, "num_warps": 1, "num_stages": 1},
            "median_us": 1.0, "p20_us": 1.0, "p80_us": 1.0, "default_us": 2.0, "trials": 3,
            "spec_hash": legacy_spec, "source_hash": source_hash, "measured_at": "2026-11-29T07:00:00+00:00",
            "rotating_sets": 8, "timing_rule": timing_rule,
        }  # fmt: skip

    pack_legacy = hashlib.sha256((units["pack"] + "\n\n").encode()).hexdigest()
    combine_legacy = hashlib.sha256(units["combine"].encode()).hexdigest()
    entries = [
        old_entry("pack", 1, pack_legacy, 1),
        old_entry("combine", 1, combine_legacy, 2),
        old_entry("combine", 2, "0" * 64, 2),  # another kernel source
        old_entry("combine", 4, combine_legacy, 1),  # the old combine timing rule
    ]
    old = {
        "schema_version": 1, "device_name": DEVICE, "compute_capability": "9.0",
        "versions": {"triton": "3.6.0", "torch": "2.11.0+cu130", "layoutgen": "0.1.0", "cuda": "13.0"},
        "entries": {f"pynccl_a2a|{e['key']['kernel']}|N=2|Hl=2|D=8|bfloat16|B={e['key']['batch_bucket']}": e for e in entries},
    }  # fmt: skip
    path = tmp_path / "NVIDIA_H200.json"
    path.write_text(json.dumps(old))
    with pytest.raises(DatabaseError, match="migrate_tuning_db_v2"):
        read_database(path)
    script = Path(__file__).resolve().parent.parent / "scripts" / "migrate_tuning_db_v2.py"
    result = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "4 entries converted to schema 2 (2 current, 2 stale, 1 stale kernel source, 1 stale timing rule)" in (
        result.stdout
    )
    converted = read_database(path).entries
    from layoutgen.dcp import FAMILY
    from layoutgen.tuning.procedure import space_hash, timing_hash

    first = converted["dcp|pynccl_a2a|pack|N=2|Hl=2|D=8|bfloat16|B=1"]
    assert first.spec_hash == spec.layout_hash() and first.versions == {"triton": "3.6", "torch": "2.11"}
    assert first.source_hash == hashlib.sha256(units["pack"].encode()).hexdigest()
    assert first.space_hash == space_hash(FAMILY.kernel("pack")) and first.timing_hash == timing_hash(
        FAMILY.kernel("pack")
    )
    assert converted["dcp|pynccl_a2a|combine|N=2|Hl=2|D=8|bfloat16|B=1"].source_hash == combine_legacy
    assert converted["dcp|pynccl_a2a|combine|N=2|Hl=2|D=8|bfloat16|B=2"].source_hash.startswith("legacy:")
    assert converted["dcp|pynccl_a2a|combine|N=2|Hl=2|D=8|bfloat16|B=4"].timing_hash.startswith("legacy:")


def test_db_prune_removes_only_what_no_machine_can_use(tmp_path: Path) -> None:
    """An entry tuned for another kernel source goes; one tuned with another torch stays (another machine runs
    it); an entry of a spec that is not bundled stays (a user's)."""
    from typer.testing import CliRunner

    from layoutgen.cli import app
    from layoutgen.cli.common import expand_arguments
    from layoutgen.dcp import FAMILY as DCP_FAMILY
    from layoutgen.loader import load
    from layoutgen.runtime.configs import expected_for

    module = load("vllm_a2a")
    decl = DCP_FAMILY.kernel("pack")
    current = expected_for(decl, module.SPEC_HASH, module.SOURCE_HASHES["pack"])

    def entry(bucket: int, **changes: Any) -> TuningEntry:
        base = make_entry(make_key(bucket, spec="vllm_a2a")).model_copy(
            update={"spec_hash": current.spec_hash, "source_hash": current.source_hash,
                    "space_hash": current.space_hash, "timing_hash": current.timing_hash}
        )  # fmt: skip
        return base.model_copy(update=changes)

    entries = [
        entry(1),
        entry(2, source_hash="0" * 64),
        entry(4, versions={"triton": "3.6", "torch": "9.9"}),
        make_entry(make_key(8, spec="someone_elses")),
    ]
    path = record(tmp_path, DEVICE, "9.0", entries, VERSIONS)
    runner = CliRunner()
    planned = runner.invoke(app, expand_arguments(["db", "prune", "--db", str(tmp_path), "--dry-run"]))
    assert planned.exit_code == 0 and "would remove 1 of 4 entries" in planned.output
    assert len(read_database(path).entries) == 4
    pruned = runner.invoke(app, expand_arguments(["db", "prune", "--db", str(tmp_path)]))
    assert pruned.exit_code == 0 and "removed 1 of 4 entries" in pruned.output
    assert sorted(e.key.bucket for e in read_database(path).entries.values()) == [1, 4, 8]
