"""Seventh hardening pass on the CLI and Ulysses dispatch, from an adversarial review: each test is a defect a
reviewer hit, fixed.

* `show --png` and `tune --report` replaced whatever was at the path: a device node (as root, `--png
  /dev/null` put a PNG where the node was), a FIFO, or the spec file the command was reading.
* A dangling symbolic link (or a loop) as `--db`, `build --out` or `LAYOUTGEN_CACHE_DIR` passed the checks and
  failed after the work with a raw `FileExistsError` (exit 1); a name over 255 bytes did the same.
* `tune --report NEW/DIRS/r.md` created its directories on a dry run and on a refused run.
* A PNG under the text drawing's byte limit could take minutes and gigabytes to draw.
* `show --empty` on a Ulysses spec named "extent E", `--batch` on a spec without one said "leave B out", and
  `db show --spec ULYSSES --shape B=64` selected nothing without saying why.
* A tuned or forced Ulysses config chosen at a small size made a `config=None` call at a large batch raise the
  launcher's grid error ("... or config=None").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import generated_module, requires_interpreter
from test_cli_polish import assert_one_line_error, run_main

from layoutgen.runtime import configs, reset_caches
from layoutgen.spec import bundled_spec_paths
from layoutgen.ulysses import config as ulysses_config
from layoutgen.ulysses import reference
from layoutgen.ulysses import runtime as ulysses_runtime
from layoutgen.ulysses.config import box_extents, program_counts, tile_axes

LONG_NAME = "a" * 256
ULYSSES_SPEC = next(path for path in bundled_spec_paths() if path.stem == "ulysses_qkv_gqa")
TINY_TUNE = ["tune", "--interpret", "--spec", "pynccl_a2a", "--kernel", "pack", "--N", "2", "--heads", "2", "--D", "8"]


def own_spec(tmp_path: Path) -> Path:
    """A spec file of the user's own (the bundled one under another name)."""
    text = ULYSSES_SPEC.read_text().replace("name: ulysses_qkv_gqa", "name: mine_gqa")
    assert "name: mine_gqa" in text
    (tmp_path / "mine.yaml").write_text(text)
    return tmp_path / "mine.yaml"


# --- files a command replaces whole ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["show", "tune"])
def test_a_fifo_is_never_replaced_by_the_png_or_the_report(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # stands in for a device node: root may replace /dev/null the same way
    args = ["show", "pynccl_a2a", "--png", str(fifo)] if command == "show" else [*TINY_TUNE, "--report", str(fifo)]
    code, out, err = run_main(args, capsys, monkeypatch)
    assert_one_line_error(code, err, str(fifo), "is a FIFO (named pipe), not a regular file")
    assert fifo.is_fifo(), "the FIFO was replaced"
    assert not out.strip(), "work began before the refusal"


@pytest.mark.parametrize("command", ["show", "tune"])
def test_the_spec_being_read_is_never_replaced(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAYOUTGEN_CACHE_DIR", str(tmp_path / "cache"))
    spec = own_spec(tmp_path)
    before = spec.read_bytes()
    via_link = tmp_path / "link.yaml"
    via_link.symlink_to(spec)  # the same file under another name
    for target in (spec, via_link):
        if command == "show":
            args = ["show", str(spec), "--png", str(target)]
        else:
            args = ["tune", "--interpret", "--dry-run", "--spec", str(spec), "--report", str(target)]
        code, _, err = run_main(args, capsys, monkeypatch)
        assert_one_line_error(code, err, f"would replace {spec}, which this command reads")
    assert spec.read_bytes() == before


# --- directories: dangling links, loops, long names -----------------------------------------------------------


def dangling(tmp_path: Path, kind: str) -> Path:
    link = tmp_path / "link"
    if kind == "dangling":
        link.symlink_to(tmp_path / "gone" / "target")
    else:
        (tmp_path / "other").symlink_to(link)
        link.symlink_to(tmp_path / "other")
    return link


@pytest.mark.parametrize("kind", ["dangling", "loop"])
@pytest.mark.parametrize("command", ["tune --db", "build --out", "LAYOUTGEN_CACHE_DIR"])
def test_a_link_to_nothing_is_bad_input_before_any_work(
    command: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    link = dangling(tmp_path, kind)
    if command == "tune --db":
        args = [*TINY_TUNE, "--db", str(link)]
    elif command == "build --out":
        args = ["build", "--spec", "pynccl_a2a", "--out", str(link)]
    else:
        monkeypatch.setenv("LAYOUTGEN_CACHE_DIR", str(link))
        args = ["tune", "--interpret", "--dry-run", "--spec", str(own_spec(tmp_path))]
    code, out, err = run_main(args, capsys, monkeypatch)
    assert_one_line_error(code, err, f"{link} is a symbolic link to nothing")
    assert "verified" not in out and "decision" not in out, "work began before the refusal"


@pytest.mark.parametrize("option", ["build --out", "show --png", "tune --db", "tune --report"])
def test_a_name_longer_than_a_file_system_takes_is_bad_input(
    option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    suffix = {"show --png": ".png", "tune --report": ".md"}.get(option, "")
    path = str(tmp_path / LONG_NAME) + suffix
    args = {
        "build --out": ["build", "--no-verify", "--spec", "pynccl_a2a", "--out", path],
        "show --png": ["show", "pynccl_a2a", "--png", path],
        "tune --db": [*TINY_TUNE, "--dry-run", "--db", path],
        "tune --report": [*TINY_TUNE, "--dry-run", "--report", path],
    }[option]
    code, _, err = run_main(args, capsys, monkeypatch)
    size = len(LONG_NAME + suffix)
    assert_one_line_error(code, err, option.split()[1], f"is {size} bytes long; file systems take at most 255")


@pytest.mark.parametrize("run", ["dry-run", "refused"])
def test_a_report_leaves_no_directories_when_nothing_is_written(
    run: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAYOUTGEN_CACHE_DIR", str(tmp_path / "cache"))
    report = tmp_path / "reports" / "new" / "r.md"
    extra = ["--dry-run"] if run == "dry-run" else ["--shape", "Q=3"]  # refused after the report's check
    code, _, err = run_main(
        [*TINY_TUNE, "--db", str(tmp_path / "db"), *extra, "--report", str(report)], capsys, monkeypatch
    )
    assert code == (0 if run == "dry-run" else 2), err
    assert not (tmp_path / "reports").exists(), "the report's directories were created"


# --- show's messages and the PNG's size -----------------------------------------------------------------------


def test_a_png_too_large_to_draw_is_refused_before_drawing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    from layoutgen.show import png

    target = tmp_path / "big.png"
    code, out, err = run_main(["show", "deepspeed_ulysses", "--seq", "400", "--png", str(target)], capsys, monkeypatch)
    assert_one_line_error(code, err, f"the PNG would draw 3200 lines of bytes; it is limited to {png.MAX_PNG_LINES}")
    assert not target.exists() and not out.strip()
    code, out, err = run_main(["show", "deepspeed_ulysses", "--seq", "400"], capsys, monkeypatch)
    assert code == 0 and out.strip(), err  # the text drawing of the same shape is drawn


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["show", "deepspeed_ulysses", "--empty", "1"], "has no extent --empty (E)"),
        (["show", "ulysses_qkv_gqa", "--batch", "2"], "has no batch axis; leave B out (--batch, --shape B=)"),
        (["show", "deepspeed_ulysses", "--batch", "100000"], "Use smaller --N/--batch/--seq/--heads/--D"),
    ],
)
def test_show_names_the_option_that_was_given(
    args: list[str], words: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_main(args, capsys, monkeypatch)
    assert_one_line_error(code, err, words)


def test_db_show_says_which_extents_the_selected_specs_have(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import REPO_ROOT

    db = REPO_ROOT / "tuning_db"
    code, out, err = run_main(["db", "show", "--db", str(db), "--spec", "ulysses_qkv_gqa", "--shape", "B=64"], capsys, monkeypatch, width=200)  # fmt: skip
    assert code == 0, err
    assert "0 selected" in out and "no entry has the extent B; the --spec/--kernel selection's: D, Hl, Hl_kv, N, S_local" in out, out  # fmt: skip


# --- Ulysses dispatch fits a tuned or forced config to the live grid -----------------------------------------


@requires_interpreter
@pytest.mark.parametrize("source", ["forced", "tuned"])
def test_a_config_chosen_at_a_small_size_is_fitted_to_a_large_batch(
    source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CUDA's 65535 rows of programs need B = 342 at H 64 (a 7-minute gather under the interpreter); a limit of
    # 24 puts the same fit at B = 8, H = 4.
    for module_with_limit in (ulysses_config, ulysses_runtime):
        monkeypatch.setattr(module_with_limit, "MAX_GRID_Y", 24)
    small_blocks = {"block_head": 1, "block_peer": 1, "block_batch": 1, "block_seq": 32, "block_dim": 1, "num_warps": 4}
    monkeypatch.delenv("LAYOUTGEN_CONFIG", raising=False)
    if source == "forced":
        monkeypatch.setenv("LAYOUTGEN_CONFIG", json.dumps({"gather": small_blocks}))
    else:
        real = configs.tuned_config

        def tuned(family: str, spec_name: str, kernel: Any, *args: Any, **kwargs: Any) -> Any:
            if kernel.name == "gather":
                return kernel.config_type.from_dict(small_blocks)
            return real(family, spec_name, kernel, *args, **kwargs)

        monkeypatch.setattr(configs, "tuned_config", tuned)
    reset_caches()
    module = generated_module("deepspeed_ulysses_head_major")
    N, S_local, H, D, B = 2, 1, 4, 1, 8  # (2 peers x 8 rows x 2 heads) x 3 tensors = 96 rows of programs unfitted
    recv = module.alloc(N, S_local, H, D, torch.float32, "cpu", B=B)
    generator = torch.Generator().manual_seed(11)
    for tensor in recv.tensors.values():
        tensor.copy_(torch.randn(tensor.shape, generator=generator))
    spec = module._dispatch.spec
    config = module._dispatch.plan("gather", recv, None).config
    extents = box_extents(spec, "gather", recv.shape)
    assert program_counts(config, tile_axes(spec, "gather"), extents)[1] * 3 <= 24, config
    got = module.gather(recv)
    want = reference.gather(recv)
    for name, tensor in zip(want, got, strict=True):
        assert torch.equal(tensor.view(torch.uint8), want[name].view(torch.uint8)), name
    reset_caches()


# --- diff, show's advice and spec messages (a review of DCP specs, show and diff) -----------------------------


def write_spec(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nsummary: x\ntransport: all_to_all_single\n{text}")
    return path


def test_diff_names_the_spec_fields_that_differ_where_the_bytes_only_match_at_this_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = write_spec(tmp_path, "blocks_of_16", "payload: {axes: [peer, batch, head, dim], dtype: float8_e4m3fn, scale_block: 16}\nstats: {placement: row_tail}\nalign_bytes: 16\n")  # fmt: skip
    code, out, err = run_main(["diff", "pynccl_a2a_fp8", str(blocks)], capsys, monkeypatch, width=400)
    out = " ".join(out.split())  # the drawing console folds lines at its own width
    assert code == 0, err  # at the drawing's D 16 one block of 16 is one scale per row, as in the bundled spec
    assert "At this shape and dtype the two layouts place every byte identically, but the specs differ in payload.scale_block" in out, out  # fmt: skip
    code, out, err = run_main(["diff", "pynccl_a2a_fp8", str(blocks), "--json"], capsys, monkeypatch)
    header = json.loads(out.split('"runs"')[0].rstrip().rstrip(",") + "}")
    assert header["identical"] is True and header["differing_fields"] == ["payload.scale_block"], header
    copy = write_spec(tmp_path, "same_as_fp8", "payload: {axes: [peer, batch, head, dim], dtype: float8_e4m3fn}\nstats: {placement: row_tail}\nalign_bytes: 16\n")  # fmt: skip
    code, out, _ = run_main(["diff", "pynccl_a2a_fp8", str(copy)], capsys, monkeypatch, width=400)
    out = " ".join(out.split())
    assert code == 0 and "place every byte identically: a port needs no kernel change" in out, out


def test_show_offers_padding_only_where_padding_gives_whole_16_byte_stores(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hint = "align_bytes: 32 pads rows to fix that"
    code, out, _ = run_main(["show", "pynccl_a2a"], capsys, monkeypatch, width=1000)
    out = " ".join(out.split())
    assert code == 0 and hint in out  # D 16 in bf16: 32 bytes a row, whole vectors once rows are aligned
    code, out, _ = run_main(["show", "pynccl_a2a", "--D", "12"], capsys, monkeypatch, width=1000)
    out = " ".join(out.split())
    assert code == 0 and hint not in out and "16-byte stores: no" in out, out  # 24 bytes: padding cannot help


@pytest.mark.parametrize(
    ("stats", "message"),
    [
        (
            "{placement: separate, axes: [peer, batch, head, slot], slot: 1}",
            "stats.slot: must be in [0, slots) = [0, 1), got 1 (slots not given: 1; add `slots: 2`)",
        ),
        (
            "{placement: separate, axes: [peer, batch, head, slot], form: max_sum, max_slot: 1}",
            "stats.max_slot: must differ from sum_slot (1): the max and the sum are two words; sum_slot is not given (default 1): add `sum_slot: 0`",
        ),
        (
            "{placement: separate, axes: [peer, batch, head, slot], form: max_sum, sum_slot: 0}",
            "stats.sum_slot: must differ from max_slot (0): the max and the sum are two words; max_slot is not given (default 0): add `max_slot: 1`",
        ),
    ],
)
def test_a_clash_with_a_default_names_the_default_and_the_fix(
    stats: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = write_spec(tmp_path, "clash", f"payload: {{axes: [peer, batch, head, dim], dtype: input}}\nstats: {stats}\n")
    code, _, err = run_main(["show", str(spec)], capsys, monkeypatch, width=1000)
    assert code == 2 and message in " ".join(err.split()), err
