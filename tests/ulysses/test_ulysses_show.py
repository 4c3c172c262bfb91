"""`layoutgen show` / `diff` for Ulysses specs: every byte of both wires is one tensor's element, labels name
the tensor and its indices, and bad drawing shapes are clear errors."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner
from ulysses_cases import BUNDLED

from layoutgen.cli import app
from layoutgen.cli.common import expand_arguments
from layoutgen.show import byte_map, diff_layouts, render_text, renderable
from layoutgen.spec import bundled_specs


@pytest.mark.parametrize("name", BUNDLED)
def test_every_byte_of_both_wires_is_one_element(name: str) -> None:
    spec = bundled_specs()[name]
    bmap = byte_map(spec, {"N": 2, "S_local": 3, "H": 4, "H_kv": 2, "D": 4}, "bfloat16")
    assert sum(run.length for run in bmap.runs) == sum(info.nbytes for info in bmap.buffers)
    kinds = {run.kind for run in bmap.runs}
    assert kinds == {f"before.{t.name}" for t in spec.to_attention.tensors} | {
        f"after.{t.name}" for t in spec.from_attention.tensors
    }


def test_the_drawing_names_tensors_peers_and_rows() -> None:
    spec = bundled_specs()["yunchang_ulysses"]
    text = render_text(renderable(byte_map(spec, {"N": 2, "B": 2, "S_local": 1, "H": 2, "D": 4}, "float32")))
    assert "before.q [peer 2, seq 1, batch 2, head 1, dim 4] float32" in text
    assert "q p1 b1 s0 h0 d0..3" in text and "after.out [peer 2, head 1, seq 1, batch 2, dim 4]" in text
    gqa = render_text(renderable(byte_map(bundled_specs()["ulysses_qkv_gqa"], {}, "bfloat16")))
    assert "q p0, 16 elements" in gqa and "k p0, 8 elements" in gqa


def test_diff_and_the_cli() -> None:
    specs = bundled_specs()
    diff = diff_layouts(specs["deepspeed_ulysses"], specs["yunchang_ulysses"], {"B": 2}, "bfloat16")
    assert diff is not None
    result = CliRunner().invoke(app, expand_arguments(["show", "deepspeed_ulysses", "--seq", "1", "--heads", "2"]))
    assert result.exit_code == 0, result.output
    assert "out p1 b0 s0 h0 d0..3" in result.output and "S_local=1" in result.output


def test_bad_drawing_shapes_are_clear_errors() -> None:
    spec = bundled_specs()["ulysses_qkv_gqa"]
    with pytest.raises(ValueError, match="a Ulysses drawing has no extent X"):
        byte_map(spec, {"X": 1}, "bfloat16")
    with pytest.raises(ValueError, match="has no batch axis; leave B out"):
        byte_map(spec, {"B": 2}, "bfloat16")
    with pytest.raises(ValueError, match=r"H_kv \(heads\) must be divisible by N"):
        byte_map(spec, {"N": 2, "H_kv": 3}, "bfloat16")
    with pytest.raises(ValueError, match="dtype must be one of"):
        byte_map(spec, {}, "int8")
