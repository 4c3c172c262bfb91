"""The tuning database's fifth audit: entries dispatch cannot run, foreign files, prune's race and repeats,
entries of specs that are not bundled, duplicated keys, non-finite numbers and the future-schema message.

Dispatch never raises because of the database: an entry its kernel refuses or a file of another device is
skipped with one warning naming it, and the default config runs.  `layoutgen db check` fails on what dispatch
cannot use, naming it; `prune` removes only what it judged, once per file.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import dcp_key, generated_module, requires_interpreter
from test_cli_polish import run_main

from layoutgen import tuning_db
from layoutgen.dcp import FAMILY as DCP_FAMILY
from layoutgen.dcp.config import PackConfig
from layoutgen.runtime import LayoutgenWarning, configs, reset_caches
from layoutgen.tuning_db import CPU_INTERPRETER_DEVICE, DatabaseError, TuningEntry, read_database, record

N, H, D, B = 2, 4, 8, 1  # fp8 specs: one scale block of 8 elements per row at D 8
DB_FILE = f"{CPU_INTERPRETER_DEVICE}.json"


def current_entry(spec: str, config: dict[str, int], bucket: int = B, **changes: Any) -> TuningEntry:
    """An entry of `spec`'s pack that dispatch takes as current, holding `config`."""
    module = generated_module(spec)
    expected = configs.expected_for(DCP_FAMILY.kernel("pack"), module.SPEC_HASH, module.SOURCE_HASHES["pack"])
    entry = TuningEntry(
        key=dcp_key(spec, "pack", N, H // N, D, "bfloat16", bucket),
        config=config,
        median_us=2.0,
        p20_us=1.9,
        p80_us=2.2,
        default_us=3.0,
        trials=4,
        spec_hash=expected.spec_hash,
        source_hash=expected.source_hash,
        space_hash=expected.space_hash,
        timing_hash=expected.timing_hash,
        versions=dict(expected.versions),
        measured_at="2026-11-29T07:00:00+00:00",
        rotating_sets=1,
    )
    return entry.model_copy(update=changes)


def pack_config(spec: str) -> PackConfig:
    """The config a `pack` with config=None plans on CPU tensors of shape (N, H, D, B) (the kernel is run too)."""
    module = generated_module(spec)
    out, lse = torch.randn(B, H, D).to(torch.bfloat16), torch.randn(B, H)
    bufs = module.alloc(N, B, H, D, torch.bfloat16)
    module.pack(out, lse, bufs)
    return module._dispatch.pack_plan(out, lse, bufs).config


def planned(spec: str) -> tuple[PackConfig, list[str]]:
    """`pack_config` from fresh caches, with the LayoutgenWarnings it gave."""
    reset_caches()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = pack_config(spec)
    return config, [str(w.message) for w in caught if issubclass(w.category, LayoutgenWarning)]


def run_cli(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    """`layoutgen ARGS` through the real entry point, in this process: (exit code, stdout unwrapped, stderr)."""
    code, out, err = run_main(args, capsys, monkeypatch, width=1000)
    return code, " ".join(out.split()), err


#: Valid for every spec here at (N, H, D), and not the default config there (num_warps 1).
FP8_TUNED = {"block_batch": 1, "block_head": 2, "block_dim": 8, "num_warps": 2, "num_stages": 1, "block_peer": 2}


# ---------------------------------------------------------------------------------------------
# 1. An entry whose config its kernel refuses for the problem
# ---------------------------------------------------------------------------------------------
@requires_interpreter
def test_a_tuned_config_the_kernel_refuses_is_skipped_with_one_warning(
    clean_dispatch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default, messages = planned("pynccl_a2a_fp8")
    assert messages == []
    record(clean_dispatch, CPU_INTERPRETER_DEVICE, "none", [current_entry("pynccl_a2a_fp8", FP8_TUNED)])
    assert planned("pynccl_a2a_fp8")[0] == PackConfig(**FP8_TUNED)  # the control: a valid entry is used
    splitting = current_entry("pynccl_a2a_fp8", {**FP8_TUNED, "block_dim": 4})
    path = record(
        clean_dispatch,
        CPU_INTERPRETER_DEVICE,
        "none",
        [splitting.model_copy(update={"measured_at": "2026-12-01T00:00:00+00:00"})],
    )
    config, messages = planned("pynccl_a2a_fp8")  # raised "splits the scale blocks" before
    assert config == default
    assert len(messages) == 1, messages
    assert splitting.key.as_str() in messages[0] and str(path) in messages[0] and "block_dim >= 8" in messages[0]
    # A forced config keeps its error, naming the variable; an explicit one raises as before.
    reset_caches()
    monkeypatch.setenv("LAYOUTGEN_CONFIG", json.dumps({"pack": {"block_dim": 4}}))
    with pytest.raises(ValueError, match=r"LAYOUTGEN_CONFIG forces an invalid pack config: .*splits the scale"):
        pack_config("pynccl_a2a_fp8")
    monkeypatch.delenv("LAYOUTGEN_CONFIG")
    module = generated_module("pynccl_a2a_fp8")
    bufs = module.alloc(N, B, H, D, torch.bfloat16)
    with pytest.raises(ValueError, match="splits the scale blocks"):
        module.pack(
            torch.zeros(B, H, D, dtype=torch.bfloat16),
            torch.zeros(B, H),
            bufs,
            config=PackConfig(**{**FP8_TUNED, "block_dim": 4}),
        )


INVALID_ENTRIES: list[tuple[str, str, dict[str, Any], str]] = [
    ("fp8-block-dim-splits-blocks", "pynccl_a2a_fp8", {"config": {**FP8_TUNED, "block_dim": 4}}, "splits the scale blocks"),
    ("num-warps-3", "pynccl_a2a", {"config": {**FP8_TUNED, "num_warps": 3}}, "num_warps must be one of"),
    ("unknown-config-key", "pynccl_a2a", {"config": {**FP8_TUNED, "colour": 1}}, "unknown keys ['colour']"),
    ("extents-out-of-order", "pynccl_a2a", {"extents": (("Hl", 2), ("N", 2), ("D", 8))}, "are not the dcp key's N, Hl, D"),
    ("dtype-not-the-familys", "pynccl_a2a", {"dtype": "float64"}, "takes no dtype 'float64'"),
    ("family-not-the-specs", "pynccl_a2a", {"family": "ulysses"}, "is a dcp spec, not ulysses"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "change", "problem"), [c[1:] for c in INVALID_ENTRIES], ids=[c[0] for c in INVALID_ENTRIES]
)
def test_db_check_fails_naming_an_entry_dispatch_cannot_use(
    spec: str, change: dict[str, Any], problem: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    good = current_entry(spec, FP8_TUNED)
    # Another bucket: an entry of the same name would replace the good one.
    key = good.key.model_copy(
        update={"bucket": 2, **{name: value for name, value in change.items() if name != "config"}}
    )
    bad = good.model_copy(update={"key": key, "config": change.get("config", good.config)})
    record(tmp_path, CPU_INTERPRETER_DEVICE, "none", [good])
    code, out, _ = run_cli(["db", "check", "--db", str(tmp_path)], capsys, monkeypatch)
    assert code == 0 and f"ok {tmp_path / DB_FILE}: 1 current" in out, out  # the control
    record(tmp_path, CPU_INTERPRETER_DEVICE, "none", [bad])
    code, out, err = run_cli(["db", "check", "--db", str(tmp_path)], capsys, monkeypatch)
    assert code == 1 and "1 invalid tuning database file(s)" in err
    assert f"invalid {tmp_path / DB_FILE}: 1 current, 1 invalid" in out
    assert f"{bad.key.as_str()}: " in out and problem in out, out
    code, out, _ = run_cli(["db", "show", "--db", str(tmp_path)], capsys, monkeypatch)
    assert code == 0 and "invalid: e.g." in out and problem in out


# ---------------------------------------------------------------------------------------------
# 2. A file holding another device
# ---------------------------------------------------------------------------------------------
@requires_interpreter
def test_a_file_holding_another_device_is_not_used_by_dispatch(clean_dispatch: Path) -> None:
    tuned = {**FP8_TUNED, "num_warps": 16}
    path = record(clean_dispatch, CPU_INTERPRETER_DEVICE, "none", [current_entry("pynccl_a2a", tuned)])
    assert planned("pynccl_a2a") == (PackConfig(**tuned), [])  # the control: this device's file is used
    data = json.loads(path.read_text())
    path.write_text(json.dumps(data | {"device_name": "NVIDIA H100 80GB HBM3"}))
    config, messages = planned("pynccl_a2a")
    assert config != PackConfig(**tuned)
    assert len(messages) == 1, messages
    assert (
        str(path) in messages[0]
        and "holds device 'NVIDIA H100 80GB HBM3', not the running 'cpu-interpreter'" in (messages[0])
    )


# ---------------------------------------------------------------------------------------------
# 3. prune: an entry replaced since the read stays; a folder given twice is pruned once
# ---------------------------------------------------------------------------------------------
def test_remove_keeps_an_entry_a_writer_replaced_since_the_read(tmp_path: Path) -> None:
    stale = current_entry("vllm_a2a", FP8_TUNED, source_hash="0" * 64)
    path = record(tmp_path, CPU_INTERPRETER_DEVICE, "none", [stale])
    judged = dict(read_database(path).entries)
    fresh = current_entry("vllm_a2a", FP8_TUNED, measured_at="2026-12-01T00:00:00+00:00")
    record(tmp_path, CPU_INTERPRETER_DEVICE, "none", [fresh])  # a tuner, between prune's read and its remove
    assert tuning_db.remove(path, judged) == 0
    assert read_database(path).entries == {fresh.key.as_str(): fresh}
    assert tuning_db.remove(path, dict(read_database(path).entries)) == 1  # the control: unchanged, it goes


def test_prune_keeps_what_a_tuner_wrote_while_it_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = record(
        tmp_path, CPU_INTERPRETER_DEVICE, "none", [current_entry("vllm_a2a", FP8_TUNED, source_hash="0" * 64)]
    )
    fresh = current_entry("vllm_a2a", FP8_TUNED, measured_at="2026-12-01T00:00:00+00:00")
    real_remove = tuning_db.remove

    def tuner_meanwhile(target: Path, entries: Any) -> int:
        record(tmp_path, CPU_INTERPRETER_DEVICE, "none", [fresh])
        return real_remove(target, entries)

    monkeypatch.setattr(tuning_db, "remove", tuner_meanwhile)
    code, out, _ = run_cli(["db", "prune", "--db", str(tmp_path)], capsys, monkeypatch)
    assert code == 0 and f"{path}: removed 0 of 1 entries (1 replaced since read: kept)" in out, out
    assert read_database(path).entries == {fresh.key.as_str(): fresh}


def test_a_folder_given_twice_is_read_and_pruned_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = record(
        tmp_path, CPU_INTERPRETER_DEVICE, "none", [current_entry("vllm_a2a", FP8_TUNED, source_hash="0" * 64)]
    )
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / DB_FILE).symlink_to(path)  # the same file through another folder
    twice = ["--db", str(tmp_path), "--db", f"{tmp_path}/", "--db", str(linked)]
    for command, line in (("show", f"{path} "), ("check", f"ok {path}:"), ("prune", "removed 1 of 1 entries")):
        code, out, _ = run_cli(["db", command, *twice], capsys, monkeypatch)
        assert code == 0 and out.count(line) == 1, out
    assert read_database(path).entries == {}


# ---------------------------------------------------------------------------------------------
# 4. Entries of a spec that is not bundled
# ---------------------------------------------------------------------------------------------
def test_an_entry_of_a_spec_that_is_not_bundled_is_not_called_unread_and_prune_keeps_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    users = current_entry("vllm_a2a", FP8_TUNED)
    users = users.model_copy(update={"key": users.key.model_copy(update={"spec": "my_spec"}), "source_hash": "0" * 64})
    # Of a bundled spec's name but another family: prune cannot attribute it to the bundled spec either.
    other_family = users.model_copy(
        update={"key": users.key.model_copy(update={"spec": "vllm_a2a", "family": "ulysses"})}
    )
    path = record(tmp_path, CPU_INTERPRETER_DEVICE, "none", [users, other_family])
    for command in ("show", "check"):
        _, out, _ = run_cli(["db", command, "--db", str(tmp_path)], capsys, monkeypatch)
        assert "never reads" not in out and "1 not bundled" in out, out
    _, out, _ = run_cli(["db", "show", "--db", str(tmp_path)], capsys, monkeypatch)
    assert "not a bundled spec: whether it is current cannot be checked here" in out
    code, out, _ = run_cli(["db", "prune", "--db", str(tmp_path)], capsys, monkeypatch)
    assert code == 0 and "removed 0 of 2 entries" in out, out
    assert len(read_database(path).entries) == 2


# ---------------------------------------------------------------------------------------------
# 5-7. Duplicated keys, non-finite numbers, a future schema
# ---------------------------------------------------------------------------------------------
def _valid_file(tmp_path: Path) -> tuple[Path, str]:
    path = record(tmp_path, CPU_INTERPRETER_DEVICE, "none", [current_entry("vllm_a2a", FP8_TUNED)])
    return path, path.read_text()


def _duplicated_entry(text: str) -> str:
    data = json.loads(text)
    ((name, entry),) = data["entries"].items()
    block = json.dumps({name: entry})[1:-1]
    return json.dumps(data | {"entries": "@"}).replace('"@"', "{" + block + ", " + block + "}")


def _duplicated_entries_block(text: str) -> str:
    data = json.loads(text)
    first = json.dumps(data["entries"])
    return json.dumps(data | {"entries": {}}).replace('"entries": {}', f'"entries": {first}, "entries": {{}}')


@requires_interpreter
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(("edit", "key"), [(_duplicated_entry, "dcp|vllm_a2a"), (_duplicated_entries_block, "entries")])
def test_a_key_given_twice_is_refused_everywhere(
    edit: Any, key: str, clean_dispatch: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, text = _valid_file(clean_dispatch)
    damaged = edit(text)
    json.loads(damaged)  # Python's json takes it, keeping the last of the two
    path.write_text(damaged)
    with pytest.raises(DatabaseError) as raised:
        read_database(path)
    assert f"{path} is ambiguous: the key '{key}" in str(raised.value) and "appears twice" in str(raised.value)
    with pytest.raises(DatabaseError, match="appears twice"):
        record(clean_dispatch, CPU_INTERPRETER_DEVICE, "none", [current_entry("vllm_a2a", FP8_TUNED, bucket=2)])
    assert path.read_text() == damaged, "record rewrote the file without one of the duplicates"
    config, messages = planned("vllm_a2a")
    assert config != PackConfig(**FP8_TUNED)
    assert len(messages) == 1 and "ignoring the tuning database" in messages[0] and "appears twice" in messages[0]
    code, out, err = run_cli(["db", "check", "--db", str(clean_dispatch)], capsys, monkeypatch)
    assert code == 1 and f"invalid tuning database {path} is ambiguous" in out and "Traceback" not in out + err


@pytest.mark.parametrize("value", ["Infinity", "-Infinity", "NaN"])
def test_a_non_finite_number_is_refused(value: str, tmp_path: Path) -> None:
    path, text = _valid_file(tmp_path)
    path.write_text(text.replace('"default_us": 3.0', f'"default_us": {value}'))
    with pytest.raises(DatabaseError, match="default_us"):
        read_database(path)


def test_record_never_writes_a_non_finite_number(tmp_path: Path) -> None:
    path, text = _valid_file(tmp_path)
    with pytest.raises(ValueError, match="default_us"):
        TuningEntry.model_validate(current_entry("vllm_a2a", FP8_TUNED).model_dump() | {"default_us": math.inf})
    unchecked = current_entry("vllm_a2a", FP8_TUNED, bucket=2, default_us=math.inf)  # model_copy validates nothing
    with pytest.raises(ValueError, match="not JSON compliant"):
        record(tmp_path, CPU_INTERPRETER_DEVICE, "none", [unchecked])
    assert path.read_text() == text


def test_a_future_schema_names_a_fix_that_works(tmp_path: Path) -> None:
    path, text = _valid_file(tmp_path)
    path.write_text(json.dumps(json.loads(text) | {"schema_version": tuning_db.SCHEMA_VERSION + 1}))
    with pytest.raises(DatabaseError) as raised:
        read_database(path)
    message = str(raised.value)
    assert "move the file aside or pass another --db" in message and "re-tune" not in message
    with pytest.raises(DatabaseError):  # re-tuning into that --db is refused: the old advice could not work
        record(tmp_path, CPU_INTERPRETER_DEVICE, "none", [current_entry("vllm_a2a", FP8_TUNED)])
