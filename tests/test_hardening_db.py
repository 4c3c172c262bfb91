"""The tuning database never loses an entry and never takes down a caller (issue 8, guarantee 2).

* 16 writer processes record overlapping entries at once: the file ends as the union, later measurement
  winning per key, byte for byte the same whatever order the writers came in; a reader polling meanwhile
  never sees a broken file.
* A writer SIGKILLed at random moments (mid-read, mid-write, between writes): the file is always a valid
  version holding everything recorded before.
* Damaged files (truncated, not JSON, wrong schema or version, hand-edited): reading raises DatabaseError
  and nothing else, `record` refuses to overwrite them, dispatch warns once and falls back with the right
  bytes, and `layoutgen db check` names the file and exits 1.

The long run: `pytest -m slow tests/test_hardening_db.py`.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_same_bytes, fill_bytes, generated_module, requires_interpreter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layoutgen.dcp import reference
from layoutgen.dcp.config import default_pack_config
from layoutgen.dcp.layout import LayoutBuffers
from layoutgen.runtime import LayoutgenWarning
from layoutgen.tuning_db import (
    CPU_INTERPRETER_DEVICE,
    SCHEMA_VERSION,
    DatabaseError,
    TuningDatabase,
    TuningEntry,
    TuningKey,
    device_file_name,
    parse_database,
    read_database,
    record,
)

DEVICE, CAPABILITY, VERSIONS = "NVIDIA H200", "9.0", {"layoutgen": "test"}
WRITERS, ENTRIES_PER_WRITER = 16, 4
KILLS, KILLS_SLOW = 10, 100
EPOCH = datetime(2026, 11, 29, tzinfo=timezone.utc)
CHILD_ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def entry_data(spec: str, kernel: str, bucket: int, minutes: int, median_us: float) -> dict[str, Any]:
    return {
        "key": {
            "family": "dcp",
            "spec": spec,
            "kernel": kernel,
            "extents": [["N", 4], ["Hl", 32], ["D", 512]],
            "dtype": "bfloat16",
            "bucket_name": "B",
            "bucket": bucket,
        },
        "config": {"block_batch": 1, "block_head": 4, "block_dim": 512, "num_warps": 4, "num_stages": 1},
        "median_us": median_us,
        "p20_us": median_us * 0.9,
        "p80_us": median_us * 1.1,
        "default_us": median_us * 1.5,
        "trials": 8,
        "spec_hash": "a" * 64,
        "source_hash": "b" * 64,
        "space_hash": "c" * 64,
        "timing_hash": "d" * 64,
        "versions": {"triton": "3.6", "torch": "2.11"},
        "measured_at": (EPOCH + timedelta(minutes=minutes)).isoformat(),
        "rotating_sets": 1,
    }


def _child(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=CHILD_ENV,
    )


# ---------------------------------------------------------------------------------------------
# 16 concurrent writers
# ---------------------------------------------------------------------------------------------
WRITER = """
    import json, sys
    from pathlib import Path
    from layoutgen.tuning_db import TuningEntry, record
    db_dir, plan = Path(sys.argv[1]), json.loads(sys.argv[2])
    print("ready", flush=True)
    sys.stdin.readline()  # the start barrier: every writer begins at once
    for data in plan:
        record(db_dir, "NVIDIA H200", "9.0", [TuningEntry.model_validate(data)], {"layoutgen": "test"})
    print("done", flush=True)
"""


def writer_plans(seed: int) -> list[list[dict[str, Any]]]:
    """16 x 4 entries over 6 keys; times are shuffled over writers, two entries share each time (the faster
    wins such a tie), so the winner of a key is often written before the entries it beats."""
    rng = random.Random(seed)
    keys = [(kernel, bucket) for kernel in ("pack", "combine") for bucket in (1, 8, 64)]
    slots = list(range(WRITERS * ENTRIES_PER_WRITER))
    rng.shuffle(slots)
    plans: list[list[dict[str, Any]]] = [[] for _ in range(WRITERS)]
    for index, slot in enumerate(slots):
        kernel, bucket = rng.choice(keys)
        median = round(1.0 + rng.random() * 9.0, 6)
        plans[index % WRITERS].append(entry_data("pynccl_a2a", kernel, bucket, slot // 2, median))
    return plans


def expected_database(plans: list[list[dict[str, Any]]]) -> TuningDatabase:
    """The union by the documented rule, computed independently of tuning_db.merge_entries."""
    winners: dict[str, dict[str, Any]] = {}
    for data in (data for plan in plans for data in plan):
        name = TuningKey.model_validate(data["key"]).as_str()
        current = winners.get(name)
        rank = (datetime.fromisoformat(data["measured_at"]), -data["median_us"])
        if current is None or rank > (datetime.fromisoformat(current["measured_at"]), -current["median_us"]):
            winners[name] = data
    return TuningDatabase(
        schema_version=SCHEMA_VERSION,
        device_name=DEVICE,
        compute_capability=CAPABILITY,
        versions=VERSIONS,
        entries={name: TuningEntry.model_validate(data) for name, data in sorted(winners.items())},
    )


def test_16_concurrent_writers_lose_nothing_and_agree_on_the_winner(tmp_path: Path) -> None:
    plans = writer_plans(seed=8)
    path = tmp_path / device_file_name(DEVICE)
    writers = [_child(WRITER, str(tmp_path), json.dumps(plan)) for plan in plans]
    try:
        for writer in writers:
            assert writer.stdout is not None and writer.stdout.readline() == "ready\n", writer.stderr
        for writer in writers:
            assert writer.stdin is not None
            writer.stdin.write("go\n")
            writer.stdin.flush()
        reads = 0
        while any(writer.poll() is None for writer in writers):
            if path.exists():
                read_database(path)  # a reader meanwhile only ever sees a complete version
                reads += 1
            time.sleep(0.002)
        for writer in writers:
            out, err = writer.communicate(timeout=120)
            assert writer.returncode == 0 and out == "done\n", err
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
    assert path.read_text(encoding="utf-8") == expected_database(plans).to_json()
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, path.name + ".lock"]
    print(f"{WRITERS} writers x {ENTRIES_PER_WRITER} records, {reads} concurrent reads")


# ---------------------------------------------------------------------------------------------
# Writers killed at random points
# ---------------------------------------------------------------------------------------------
LOOPER = """
    import itertools, sys, time
    from datetime import datetime, timezone
    from pathlib import Path
    from layoutgen.tuning_db import TuningEntry, record
    from layoutgen import tuning_db
    db_dir, first = Path(sys.argv[1]), int(sys.argv[2])
    template = TuningEntry.model_validate_json(sys.argv[3])
    # Fault injection: widen the window between the temporary file's fsync and the replace, so that kills
    # also land there (the file must still be the old version then).
    fsync = tuning_db.os.fsync
    tuning_db.os.fsync = lambda descriptor: (fsync(descriptor), time.sleep(0.03))[0]
    print("ready", flush=True)
    for index in itertools.count(first):
        key = template.key.model_copy(update={"bucket": index})
        entry = template.model_copy(update={"key": key, "measured_at": datetime.now(timezone.utc).isoformat()})
        record(db_dir, "NVIDIA H200", "9.0", [entry], {"layoutgen": "test"})
        print(index, flush=True)  # recorded: must survive any later kill
"""


def _kill_writers(tmp_path: Path, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    path = tmp_path / device_file_name(DEVICE)
    # A large file, so that a kill often lands inside a read, a validation or a write of it.
    prefill = [TuningEntry.model_validate(entry_data("vllm_a2a", "pack", b, 0, 2.0)) for b in range(1, 1201)]
    record(tmp_path, DEVICE, CAPABILITY, prefill, VERSIONS)
    template = json.dumps(entry_data("pynccl_a2a", "combine", 1, 0, 3.0))
    known = set(read_database(path).entries)
    acknowledged: set[str] = set()
    for round_ in range(kills):
        looper = _child(LOOPER, str(tmp_path), str((round_ + 1) * 10**6), template)
        assert looper.stdout is not None and looper.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0.0, 0.25))
        looper.send_signal(signal.SIGKILL)
        out, _ = looper.communicate(timeout=60)
        assert looper.returncode == -signal.SIGKILL
        for index in out.split():
            acknowledged.add(f"dcp|pynccl_a2a|combine|N=4|Hl=32|D=512|bfloat16|B={index}")
        entries = set(read_database(path).entries)  # old or new version: always valid
        assert known <= entries, f"round {round_}: lost {sorted(known - entries)[:3]}"
        assert acknowledged <= entries, f"round {round_}: lost recorded {sorted(acknowledged - entries)[:3]}"
        known = entries
    # The killed writers' locks died with them: the next writer gets through at once.
    started = time.perf_counter()
    record(tmp_path, DEVICE, CAPABILITY, [TuningEntry.model_validate(entry_data("pynccl_a2a", "pack", 3, 9, 1.0))])
    assert time.perf_counter() - started < 10
    temporaries = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    print(f"{kills} kills, {len(acknowledged)} acknowledged writes, {len(temporaries)} killed mid-write")


def test_a_writer_killed_at_random_points_leaves_a_valid_superset(tmp_path: Path) -> None:
    _kill_writers(tmp_path, KILLS, seed=1)


@pytest.mark.slow
def test_a_writer_killed_at_random_points_long_run(tmp_path: Path) -> None:
    _kill_writers(tmp_path, KILLS_SLOW, seed=int(time.time()))


# ---------------------------------------------------------------------------------------------
# Damaged files
# ---------------------------------------------------------------------------------------------
def _valid_text() -> str:
    from layoutgen.dcp import FAMILY
    from layoutgen.runtime.configs import expected_for

    module = generated_module("vllm_a2a")
    current = expected_for(FAMILY.kernel("pack"), module.SPEC_HASH, module.SOURCE_HASHES["pack"])
    data = entry_data("vllm_a2a", "pack", 8, 0, 2.0) | {
        "spec_hash": module.SPEC_HASH,
        "source_hash": module.SOURCE_HASHES["pack"],
        "space_hash": current.space_hash,
        "timing_hash": current.timing_hash,
        "versions": dict(current.versions),
        "key": {"family": "dcp", "spec": "vllm_a2a", "kernel": "pack", "extents": [["N", 2], ["Hl", 3], ["D", 24]]}
        | {"dtype": "bfloat16", "bucket_name": "B", "bucket": 8},
        "config": {"block_batch": 1, "block_head": 2, "block_dim": 8, "num_warps": 2, "num_stages": 1, "block_peer": 1},
    }
    entry = TuningEntry.model_validate(data)
    return TuningDatabase(
        schema_version=SCHEMA_VERSION,
        device_name=CPU_INTERPRETER_DEVICE,
        compute_capability="0.0",
        versions=VERSIONS,
        entries={entry.key.as_str(): entry},
    ).to_json()


VALID_TEXT = _valid_text()
VALID_DATA = json.loads(VALID_TEXT)
ENTRY_NAME = next(iter(VALID_DATA["entries"]))


def _edited(path: tuple[str, ...], value: Any) -> str:
    data = json.loads(VALID_TEXT)
    target = data
    for part in path[:-1]:
        target = target[part]
    if value is _REMOVE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return json.dumps(data, indent=2)


_REMOVE = object()
_ENTRY = ("entries", ENTRY_NAME)

# (id, file bytes): every way a file gets damaged that we could think of.
DAMAGED: list[tuple[str, bytes]] = [
    *[
        (f"truncated-at-{fraction}", VALID_TEXT.encode()[: int(len(VALID_TEXT.rstrip()) * fraction)])
        for fraction in (0.0, 0.01, 0.25, 0.5, 0.75, 0.99)
    ],
    ("truncated-last-brace", VALID_TEXT.rstrip()[:-1].encode()),
    ("trailing-garbage", (VALID_TEXT + "}}").encode()),
    ("two-objects", (VALID_TEXT + VALID_TEXT).encode()),
    ("binary", bytes(range(256)) * 4),
    ("latin-1", '{"device_name": "caf\xe9"}'.encode("latin-1")),
    ("utf-16", VALID_TEXT.encode("utf-16")),
    ("utf-8-bom", b"\xef\xbb\xbf" + VALID_TEXT.encode()),
    ("yaml", b"schema_version: 1\ndevice_name: x\n"),
    ("bare-nan", b"NaN"),
    ("deep-nesting", b"[" * 100_000 + b"]" * 100_000),
    ("5000-digit-number", b'{"schema_version": ' + b"1" * 5000 + b"}"),
    ("a-list", b"[]"),
    ("null", b"null"),
    ("a-number", b"42"),
    ("missing-device", _edited(("device_name",), _REMOVE).encode()),
    ("entries-a-list", _edited(("entries",), []).encode()),
    ("unknown-top-level-key", _edited(("colour",), "blue").encode()),
    ("schema-version-2", _edited(("schema_version",), SCHEMA_VERSION + 1).encode()),
    ("schema-version-0", _edited(("schema_version",), 0).encode()),
    ("schema-version-string", _edited(("schema_version",), "2").encode()),
    ("schema-version-1", _edited(("schema_version",), 1).encode()),
    ("schema-version-true", _edited(("schema_version",), True).encode()),
    ("schema-version-float", _edited(("schema_version",), 2.0).encode()),
    (
        "entry-name-mismatch",
        json.dumps(VALID_DATA | {"entries": {"other": VALID_DATA["entries"][ENTRY_NAME]}}).encode(),
    ),
    ("entry-null", _edited(_ENTRY, None).encode()),
    ("key-dtype-bf16", _edited((*_ENTRY, "key", "dtype"), "bf16").encode()),
    ("key-kernel-unknown", _edited((*_ENTRY, "key", "kernel"), "merge").encode()),
    ("key-N-zero", _edited((*_ENTRY, "key", "N"), 0).encode()),
    ("config-string-value", _edited((*_ENTRY, "config", "block_dim"), "8").encode()),
    ("config-fraction", _edited((*_ENTRY, "config", "block_dim"), 8.5).encode()),
    ("config-true", _edited((*_ENTRY, "config", "num_stages"), True).encode()),
    ("trials-string", _edited((*_ENTRY, "trials"), "8").encode()),
    ("median-negative", _edited((*_ENTRY, "median_us"), -1.0).encode()),
    ("median-nan", _edited((*_ENTRY, "median_us"), float("nan")).encode()),
    ("trials-missing", _edited((*_ENTRY, "trials"), _REMOVE).encode()),
    ("measured-at-without-offset", _edited((*_ENTRY, "measured_at"), "2026-11-29T07:00:00").encode()),
    ("measured-at-garbage", _edited((*_ENTRY, "measured_at"), "yesterday").encode()),
    ("entry-unknown-field", _edited((*_ENTRY, "colour"), "blue").encode()),
]


def dispatch_warnings(launch: bool) -> list[str]:
    """Plan (and, if `launch`, run and check against the reference) packs with config=None at two shapes;
    return the LayoutgenWarnings given.  The plan must hold the heuristic default config."""
    module = generated_module("vllm_a2a")
    N, B, B_max, H, D = 2, 3, 5, 6, 24
    generator = torch.Generator().manual_seed(3)
    out = torch.randn(B, H, D, generator=generator).to(torch.bfloat16)
    lse = torch.randn(B, H, generator=generator) * 3
    ours = fill_bytes(module.alloc(N, B_max, H, D, torch.bfloat16))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if launch:
            module.pack(out[:2], lse[:2], ours)
            module.pack(out, lse, ours)
        else:
            module._dispatch.pack_plan(out[:2], lse[:2], ours)
        plan = module._dispatch.pack_plan(out, lse, ours)  # a second shape: no second warning
    if launch:
        theirs = fill_bytes(LayoutBuffers.allocate(module.SPEC, N, B_max, H, D, torch.bfloat16))
        reference.pack(out, lse, theirs)
        assert_same_bytes(ours, theirs, "dispatch with a damaged database")
    assert plan.config == default_pack_config(module.SPEC, N, H // N, D, B, 2), "did not fall back to the default"
    return [str(w.message) for w in caught if issubclass(w.category, LayoutgenWarning)]


@requires_interpreter
def test_the_valid_file_is_used_by_dispatch(clean_dispatch: Path) -> None:
    # The control: undamaged, the same file is read without warnings and its config wins over the default.
    (clean_dispatch / f"{CPU_INTERPRETER_DEVICE}.json").write_text(VALID_TEXT)
    read_database(clean_dispatch / f"{CPU_INTERPRETER_DEVICE}.json")
    with pytest.raises(AssertionError, match="did not fall back"):
        dispatch_warnings(launch=True)


#: Damage kinds whose dispatch test also runs the kernel and compares bytes (planning alone covers the rest).
LAUNCHED = {"truncated-at-0.5", "binary", "deep-nesting", "5000-digit-number", "schema-version-true"}
LAUNCHED |= {"config-string-value", "measured-at-garbage"}


@requires_interpreter
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(("kind", "content"), DAMAGED, ids=[d[0] for d in DAMAGED])
def test_a_damaged_file_is_refused_everywhere_and_dispatch_falls_back(
    kind: str, content: bytes, clean_dispatch: Path
) -> None:
    path = clean_dispatch / f"{CPU_INTERPRETER_DEVICE}.json"
    path.write_bytes(content)
    with pytest.raises(DatabaseError, match=re.escape(str(path))):
        read_database(path)
    new_entry = TuningEntry.model_validate(VALID_DATA["entries"][ENTRY_NAME])
    with pytest.raises(DatabaseError):
        record(clean_dispatch, CPU_INTERPRETER_DEVICE, "0.0", [new_entry], VERSIONS)
    assert path.read_bytes() == content, "record overwrote a damaged file"
    messages = dispatch_warnings(launch=kind in LAUNCHED)
    assert len(messages) == 1, messages
    assert messages[0].startswith("ignoring the tuning database") and str(path) in messages[0]


@pytest.mark.parametrize("content", [d[1] for d in DAMAGED], ids=[d[0] for d in DAMAGED])
def test_db_check_names_a_damaged_file_and_fails(
    content: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / f"{CPU_INTERPRETER_DEVICE}.json").write_text(VALID_TEXT)
    (tmp_path / "bad").mkdir()
    damaged = tmp_path / "bad" / "NVIDIA_H200.json"
    damaged.write_bytes(content)
    code, out, err = run_cli(
        ["db", "check", "--db", str(tmp_path / "good"), "--db", str(tmp_path / "bad")], capsys, monkeypatch
    )
    assert code == 1, out + err
    assert f"invalid tuning database {damaged}" in out and "1 invalid tuning database file(s)" in err
    assert f"ok {tmp_path / 'good'}" in out
    assert "Traceback" not in out + err


def test_db_check_fails_on_a_file_holding_another_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "NVIDIA_H200.json").write_text(VALID_TEXT)  # holds cpu-interpreter
    code, out, _ = run_cli(["db", "check", "--db", str(tmp_path)], capsys, monkeypatch)
    assert code == 1 and "holds device 'cpu-interpreter', which belongs in cpu-interpreter.json" in out


def run_cli(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    """`layoutgen ARGS` through the real entry point (layoutgen.cli.main), in this process."""
    from rich.console import Console

    from layoutgen.cli import db as cli_db
    from layoutgen.cli import main

    monkeypatch.setattr(cli_db, "console", Console(width=1000))  # rich reads COLUMNS once, at construction
    monkeypatch.setattr(sys, "argv", ["layoutgen", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    captured = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), " ".join(captured.out.split()), captured.err


def test_db_check_as_a_process_exits_1_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "NVIDIA_H200.json").write_bytes(b"[" * 100_000)
    result = subprocess.run(
        [sys.executable, "-m", "layoutgen.cli", "db", "check", "--db", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**CHILD_ENV, "COLUMNS": "1000", "NO_COLOR": "1"},
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "is not usable JSON" in result.stdout and result.stderr.strip() == "error: 1 invalid tuning database file(s)"


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    text=st.text(max_size=300)
    | st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5),
        max_leaves=20,
    ).map(json.dumps)
    | st.builds(
        lambda position, junk: VALID_TEXT[:position] + junk + VALID_TEXT[position:],
        st.integers(0, len(VALID_TEXT)),
        st.text(max_size=8),
    )
    | st.integers(0, 200_000).map(lambda depth: "[" * depth + "]" * depth)
    | st.integers(1, 20_000).map(lambda digits: '{"schema_version": ' + "7" * digits + "}")
)
def test_any_text_is_a_database_or_a_database_error(text: str) -> None:
    try:
        parse_database(text, "fuzz.json")
    except DatabaseError as error:
        assert str(error).startswith("tuning database fuzz.json ")


# ---------------------------------------------------------------------------------------------
# Where dispatch looks: odd LAYOUTGEN_TUNING_DB values never raise
# ---------------------------------------------------------------------------------------------
def _odd_location(kind: str, tmp_path: Path) -> str:
    if kind == "too-long":
        return str(tmp_path / ("d" * 300) / ("e" * 300) / ("f" * 4000))
    if kind == "unknown-user-home":
        return "~no_such_user_for_layoutgen_tests/db"
    if kind == "a-file":
        (tmp_path / "file").write_text("x")
        return str(tmp_path / "file")
    if kind == "under-a-file":
        (tmp_path / "file").write_text("x")
        return str(tmp_path / "file" / "db")
    directory = tmp_path / kind
    directory.mkdir()
    target = directory / f"{CPU_INTERPRETER_DEVICE}.json"
    if kind == "device-file-is-a-directory":
        target.mkdir()
    elif kind == "device-file-is-a-fifo":
        os.mkfifo(target)
    elif kind == "device-file-is-a-symlink-loop":
        target.symlink_to(target)
    elif kind == "device-file-is-a-dangling-symlink":
        target.symlink_to(tmp_path / "nowhere.json")
    return str(directory)


ODD_LOCATIONS = [
    "too-long",
    "unknown-user-home",
    "a-file",
    "under-a-file",
    "device-file-is-a-directory",
    "device-file-is-a-fifo",
    "device-file-is-a-symlink-loop",
    "device-file-is-a-dangling-symlink",
]


@requires_interpreter
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("kind", ODD_LOCATIONS)
def test_odd_database_locations_never_raise(
    kind: str, clean_dispatch: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kind == "device-file-is-a-fifo" and not hasattr(os, "mkfifo"):
        pytest.skip("needs os.mkfifo")
    monkeypatch.setenv("LAYOUTGEN_TUNING_DB", _odd_location(kind, tmp_path))
    messages = dispatch_warnings(launch=True)
    assert len(messages) <= 1, messages
