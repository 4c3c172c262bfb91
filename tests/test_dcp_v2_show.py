"""Contract v2 in `layoutgen show` / `diff` (the (max, sum) words and rows of empty requests drawn), and
`layoutgen build`'s verification of the (max, sum) specs."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import generated_module, requires_interpreter
from test_dcp_v2_pack import fill, random_max_sum

from layoutgen.dcp import reference
from layoutgen.dcp.layout import LayoutBuffers
from layoutgen.spec import bundled_specs

pytestmark = [requires_interpreter, pytest.mark.filterwarnings("ignore::RuntimeWarning")]


# ---------------------------------------------------------------------------------------------
# show and diff
# ---------------------------------------------------------------------------------------------
def _check_map_against_packed(spec_name: str, shape: dict[str, int], dtype: str) -> None:
    """Every run of the byte map holds what a masked pack wrote there: payload, zeros, and the stats words."""
    from layoutgen import show

    spec = bundled_specs()[spec_name]
    bmap = show.byte_map(spec, shape, dtype)
    n, B, heads, d, E = shape["N"], shape["B"], shape["H"], shape["D"], shape.get("E", 0)
    torch_dtype = getattr(torch, dtype)
    bufs = fill(LayoutBuffers.allocate(spec, n, B + 1, heads, d, torch_dtype, "cpu"))
    generator = torch.Generator().manual_seed(1)
    out = torch.randn(B, heads, d, generator=generator).to(torch_dtype)
    maximum, total = random_max_sum((B, heads), generator)
    empty = torch.arange(B) >= B - E
    reference.pack(out, None, bufs, empty=empty, max_sum=(maximum, total))
    h = heads // n
    values = {
        "payload": out.to(bufs.tensors["payload"].dtype).reshape(B, n, h, d).permute(1, 0, 2, 3),
        "max": torch.where(empty[:, None], float("-inf"), maximum).reshape(B, n, h).permute(1, 0, 2),
        "sum": torch.where(empty[:, None], 0.0, total).reshape(B, n, h).permute(1, 0, 2),
    }
    kinds = set()
    for run in bmap.runs:
        kinds.add(run.kind)
        got = bufs.tensors[run.buffer].reshape(-1).view(torch.uint8)[run.offset : run.offset + run.length]
        if run.kind in ("padding", "unused"):
            assert bool((got == 0xA5).all()), run
            continue
        index = tuple(slice(*run.ranges[axis]) for axis in ("peer", "batch", "head"))
        if run.kind == "empty":
            assert bool((got == 0).all()), f"{run}: an empty row's payload must be +0.0"
            continue
        source = values[run.kind][index]
        if run.kind == "payload":
            source = source[..., slice(*run.ranges["dim"])]
        assert torch.equal(got, source.contiguous().reshape(-1).view(torch.uint8)), run
    assert {"payload", "max", "sum"} <= kinds and ("empty" in kinds) == bool(E)


@pytest.mark.parametrize("spec_name", ["trtllm_helix_nccl", "trtllm_helix_native_v1", "trtllm_helix_native_v2"])
@pytest.mark.parametrize("E", [0, 1])
def test_show_draws_the_max_and_sum_words_and_empty_rows(spec_name: str, E: int) -> None:
    _check_map_against_packed(spec_name, {"N": 4, "B": 2, "H": 8, "D": 16, "E": E}, "bfloat16")
    _check_map_against_packed(spec_name, {"N": 2, "B": 3, "H": 6, "D": 10, "E": E}, "float16")


def test_show_text_and_json_of_a_max_sum_spec_with_an_empty_row() -> None:
    from layoutgen import show

    spec = bundled_specs()["trtllm_helix_native_v2"]
    bmap = show.byte_map(spec, {"N": 2, "B": 2, "H": 4, "D": 8, "E": 1}, "bfloat16")
    data = json.loads(show.to_json(bmap))
    assert data["shape"]["E"] == 1
    assert data["facts"]["max_slots"] == [0] and data["facts"]["sum_slots"] == [1]
    assert data["facts"]["stats_form"] == "max_sum"
    text = _render(bmap)
    assert "p0 b1 h0 max -inf" in text and "p0 b1 h0 sum 0" in text and "p0 b0 h0 max" in text
    assert "+0.0" in text and "Stats (max, sum): slot 0 (max) and slot 1 (sum)" in _words(text)
    assert "Rows b >= 1 belong to empty requests" in _words(text)


def _render(bmap: Any) -> str:
    from rich.console import Console

    from layoutgen import show

    console = Console(file=io.StringIO(), width=200, no_color=True)
    console.print(show.renderable(bmap))
    return console.file.getvalue()  # type: ignore[attr-defined]


def _words(text: str) -> str:
    """The text with every run of whitespace as one space (paragraphs wrap at the console's width)."""
    return " ".join(text.split())


def test_a_row_tail_max_sum_spec_is_drawn_with_both_words_in_the_tail() -> None:
    from layoutgen import show
    from layoutgen.spec import parse_spec

    spec = parse_spec(
        {
            "name": "tail_pair",
            "summary": "x",
            "transport": "all_to_all_single",
            "payload": {"axes": ["peer", "batch", "head", "dim"], "dtype": "input"},
            "stats": {"placement": "row_tail", "form": "max_sum"},
        }
    )
    bmap = show.byte_map(spec, {"N": 2, "B": 1, "H": 2, "D": 8, "E": 0}, "bfloat16")
    facts = json.loads(show.to_json(bmap))["facts"]
    assert facts["max_offsets_in_row"] == [16] and facts["sum_offsets_in_row"] == [20]
    assert "the max's float32 word at byte 16 and the sum's at byte 20" in _words(_render(bmap))


def test_diff_between_two_helix_layouts_and_a_clear_error_across_forms() -> None:
    from layoutgen import show

    specs = bundled_specs()
    shape = {"N": 2, "B": 2, "H": 4, "D": 8, "E": 0}
    result = show.diff_layouts(specs["trtllm_helix_nccl"], specs["trtllm_helix_native_v2"], shape, "bfloat16")
    counts = result.counts()
    assert counts == {"payload": 2 * 2 * 2 * 8, "max": 8, "sum": 8} and not result.identical
    same = show.diff_layouts(specs["trtllm_helix_nccl"], specs["trtllm_helix_nccl"], shape, "bfloat16")
    assert same.identical
    # Across stats forms the payloads are compared and the stats words named as not compared.
    across = show.diff_layouts(specs["vllm_a2a"], specs["trtllm_helix_nccl"], shape, "bfloat16")
    assert across.counts() == {"payload": 2 * 2 * 2 * 8} and not across.identical
    assert across.not_compared == "only vllm_a2a holds lse; only trtllm_helix_nccl holds max, sum"
    text = show.diff_summary(across)
    assert text.startswith("64 payload elements of the first B=2 rows in ")
    assert text.endswith("Not compared: only vllm_a2a holds lse; only trtllm_helix_nccl holds max, sum.")


def test_diff_of_a_bf16_wire_and_its_fp8_wire_compares_payload_and_lse_and_names_the_scales() -> None:
    from layoutgen import show

    specs = bundled_specs()
    shape = {"N": 2, "B": 2, "H": 4, "D": 16, "E": 0}
    result = show.diff_layouts(specs["vllm_a2a"], specs["vllm_a2a_fp8"], shape, "bfloat16")
    assert result.counts() == {"payload": 2 * 2 * 2 * 16, "lse": 8} and not result.identical
    assert result.not_compared == "only vllm_a2a_fp8 holds scale"
    # The same element, one byte in B and two in A: every run's lengths say so.
    assert all(run.a_length == 2 * run.b_length for run in result.runs if run.kind == "payload")
    assert json.loads(show.diff_to_json(result))["not_compared"] == "only vllm_a2a_fp8 holds scale"
    same = show.diff_layouts(specs["vllm_a2a_fp8"], specs["vllm_a2a_fp8"], shape, "bfloat16")
    assert same.identical and same.not_compared == ""


def test_show_refuses_more_empty_rows_than_live_ones() -> None:
    from layoutgen import show

    with pytest.raises(ValueError, match=r"E \(empty rows.*\[0, B\]"):
        show.byte_map(bundled_specs()["vllm_a2a"], {"N": 2, "B": 2, "H": 4, "D": 8, "E": 3}, "bfloat16")


def test_the_cli_draws_an_empty_row(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from layoutgen.cli import app
    from layoutgen.cli.common import expand_arguments

    args = ["show", "trtllm_helix_nccl", "--N", "2", "--batch", "2", "--heads", "4", "--D", "8", "--empty", "1"]
    result = CliRunner().invoke(app, expand_arguments(args), env={"NO_COLOR": "1", "COLUMNS": None})
    assert result.exit_code == 0, result.output
    assert "p0 b1 h0 d0..7 +0.0" in result.stdout and "p0 b1 h0 max -inf" in result.stdout


def test_the_cli_takes_no_empty_rows_as_its_default_and_refuses_a_zero_elsewhere() -> None:
    # Was: `--empty 0` (the drawing's default) refused as "extents are positive integers".
    from typer.testing import CliRunner

    from layoutgen.cli import app
    from layoutgen.cli.common import expand_arguments

    def show(*extra: str) -> Any:
        args = ["show", "trtllm_helix_nccl", "--N", "2", "--batch", "2", "--heads", "4", "--D", "8", *extra]
        return CliRunner().invoke(app, expand_arguments(args), env={"NO_COLOR": "1", "COLUMNS": None})

    plain, zero = show(), show("--empty", "0")
    assert zero.exit_code == 0 and zero.stdout == plain.stdout, zero.output
    for extra, words in ((("--empty", "-1"), "non-negative"), (("--shape", "N=0"), "positive integers")):
        refused = show(*extra)
        assert refused.exit_code != 0 and words in f"{refused.output} {refused.exception}", refused.output


# ---------------------------------------------------------------------------------------------
# layoutgen build
# ---------------------------------------------------------------------------------------------
def test_build_verifies_a_helix_module() -> None:
    # (`layoutgen build` verifies every bundled module; one here, with its report's shape.)
    from layoutgen.dcp.verify import verify_module

    report = verify_module(generated_module("trtllm_helix_native_v2"))
    assert report.ok, report.failures
    assert [check.kernel for check in report.checks] == ["pack", "combine"]


def test_verify_catches_a_broken_masked_pack(tmp_path: Path) -> None:
    from layoutgen.dcp.verify import verify_module
    from layoutgen.loader import generated_dir, load_path

    source = (generated_dir() / "trtllm_helix_native_v1.py").read_text(encoding="utf-8")
    broken = source.replace("sum_values = tl.where(stats_row_empty, 0.0, sum_values)", "pass")
    assert broken != source
    (tmp_path / "trtllm_helix_native_v1.py").write_text(broken, encoding="utf-8")
    report = verify_module(load_path(tmp_path / "trtllm_helix_native_v1.py"))
    assert not report.ok and any("empty mask" in failure for failure in report.failures)


def test_a_stats_run_over_live_and_empty_rows_says_where_the_empty_values_start() -> None:
    from layoutgen import show
    from layoutgen.spec import parse_spec

    spec = parse_spec(
        {
            "name": "npu_pair",
            "summary": "x",
            "transport": "all_to_all_single",
            "payload": {"axes": ["peer", "head", "dim", "batch"], "dtype": "float32"},
            "stats": {"placement": "row_tail", "form": "max_sum"},
        }
    )
    text = _render(show.byte_map(spec, {"N": 2, "B": 3, "H": 2, "D": 2, "E": 1}, "bfloat16"))
    assert "p0 b0..2 h0 max (-inf from b2)" in text and "p0 b0..2 h0 sum (0 from b2)" in text
    assert "p0 b2 h0 d0 +0.0" in text
