"""`layoutgen show` / `layoutgen diff`: golden outputs, and the byte map checked against the reference's bytes."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from layoutgen import reference
from layoutgen.show import (
    MAX_MAP_BYTES,
    ByteMap,
    Problem,
    allocate,
    byte_map,
    diff_layouts,
    problem_from,
    to_json,
    write_png,
)
from layoutgen.spec import LayoutSpec, bundled_specs, parse_spec_text

ROOT = Path(__file__).resolve().parent.parent
CANARY = 0xA5


def _load_regen_script():
    path = ROOT / "scripts" / "regen_golden.py"
    spec = importlib.util.spec_from_file_location("layoutgen_regen_golden", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


regen = _load_regen_script()

# Specs beyond the bundled ones, to show that nothing is special-cased: batch innermost with the LSE as
# element D of a float32 row (sglang's NPU path), and a stats buffer whose slot axis is not innermost.
EXTRA_SPECS = {
    "batch_inner_fp32": """
name: batch_inner_fp32
summary: fp32 [peer, head, dim + 1, batch]
transport: all_to_all_single
payload: {axes: [peer, head, dim, batch], dtype: float32}
stats: {placement: row_tail}
align_bytes: 8
""",
    "slot_outer": """
name: slot_outer
summary: stats slot axis outside batch and head
transport: external
payload: {axes: [head, batch, peer, dim], dtype: input}
stats: {placement: separate, axes: [peer, slot, batch, head], slots: 3, slot: 2}
""",
}


def all_specs() -> dict[str, LayoutSpec]:
    specs = dict(bundled_specs())
    specs.update({name: parse_spec_text(text, f"<{name}>") for name, text in EXTRA_SPECS.items()})
    return specs


SHAPES = [
    problem_from(4, 2, 8, 16, "bfloat16"),  # the CLI's default
    problem_from(2, 1, 6, 10, "float16"),  # B = 1, odd heads per peer, D not a power of two
    problem_from(3, 3, 3, 6, "float32"),  # one head per peer, float32 rows
]


@pytest.mark.parametrize("case", sorted(regen.CASES))
def test_output_matches_golden_file(case: str) -> None:
    golden = regen.GOLDEN_DIR / case
    assert golden.is_file(), f"{golden} missing; run `python scripts/regen_golden.py`"
    got = regen.run_case(regen.CASES[case])
    assert got == golden.read_text(encoding="utf-8"), (
        f"`layoutgen {' '.join(regen.CASES[case])}` differs from {golden}. If the change is intended, run "
        "`python scripts/regen_golden.py` and review `git diff tests/golden/`"
    )


def test_golden_dir_holds_only_cases() -> None:
    assert sorted(p.name for p in regen.GOLDEN_DIR.iterdir()) == sorted(regen.CASES)


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


def _check_against_reference(bmap: ByteMap, spec: LayoutSpec, problem: Problem) -> None:
    """Pack distinct random values with the reference and check every claim of the map byte by byte."""
    bufs = allocate(spec, problem)
    for tensor in bufs.tensors.values():
        _bytes_of(tensor).fill_(CANARY)
    gen = torch.Generator().manual_seed(problem.N * 1000 + problem.B * 10 + problem.D)
    out = torch.randn(problem.B, problem.H, problem.D, generator=gen).to(problem.dtype)
    lse = torch.randn(problem.B, problem.H, generator=gen) * 8
    reference.pack(out, lse, bufs)
    N, B, h, D = problem.N, problem.B, problem.heads_per_peer, problem.D
    wire = bufs.tensors["payload"].dtype
    per_peer_out = out.to(wire).reshape(B, N, h, D).permute(1, 0, 2, 3)  # [peer, batch, head, d]
    per_peer_lse = lse.reshape(B, N, h).permute(1, 0, 2)  # [peer, batch, head]
    covered = {name: 0 for name in bufs.tensors}
    counts = {"payload": 0, "lse": 0}
    for run in sorted(bmap.runs, key=lambda r: (r.buffer, r.offset)):
        assert run.offset == covered[run.buffer], f"runs of {run.buffer} leave a gap or overlap at {run.offset}"
        covered[run.buffer] += run.length
        got = _bytes_of(bufs.tensors[run.buffer])[run.offset : run.offset + run.length]
        if run.kind in ("padding", "unused"):
            assert bool((got == CANARY).all()), f"{run} was written by the reference"
            continue
        assert run.peer and run.batch and run.head
        index = (slice(*run.peer), slice(*run.batch), slice(*run.head))
        if run.kind == "payload":
            assert run.dim is not None
            want = per_peer_out[(*index, slice(*run.dim))]
            counts["payload"] += want.numel()
        else:
            want = per_peer_lse[index]
            counts["lse"] += want.numel()
        want_bytes = _bytes_of(want.contiguous())
        assert got.numel() == want_bytes.numel(), f"{run} has {got.numel()} bytes, its elements {want_bytes.numel()}"
        assert torch.equal(got, want_bytes), f"{spec.name}: bytes of {run} are not what the reference wrote there"
    for name, tensor in bufs.tensors.items():
        assert covered[name] == tensor.numel() * tensor.element_size(), f"runs do not cover all of {name}"
    assert counts == {"payload": N * B * h * D, "lse": N * B * h}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda p: f"N{p.N}B{p.B}H{p.H}D{p.D}{p.dtype_name}")
@pytest.mark.parametrize("name", sorted(all_specs()))
def test_byte_map_agrees_with_reference(name: str, shape: Problem) -> None:
    spec = all_specs()[name]
    _check_against_reference(byte_map(spec, shape), spec, shape)


def test_reference_check_catches_a_wrong_map() -> None:
    """The check above can fail: swap the labels of two payload runs and it must object."""
    spec, shape = bundled_specs()["vllm_a2a"], SHAPES[0]
    bmap = byte_map(spec, shape)
    runs = list(bmap.runs)
    first, second = [i for i, run in enumerate(runs) if run.kind == "payload"][:2]
    runs[first], runs[second] = (
        dataclasses.replace(runs[first], head=runs[second].head),
        dataclasses.replace(runs[second], head=runs[first].head),
    )
    with pytest.raises(AssertionError, match="not what the reference wrote"):
        _check_against_reference(ByteMap(bmap.spec, bmap.problem, bmap.buffers, tuple(runs)), spec, shape)


def test_json_is_the_map() -> None:
    spec = bundled_specs()["flashinfer_mnnvl"]
    bmap = byte_map(spec, SHAPES[1])
    data = json.loads(to_json(bmap))
    assert data["shape"] == {"N": 2, "B": 1, "B_max": 2, "H": 6, "heads_per_peer": 3, "D": 10, "dtype": "float16"}
    assert [run["kind"] for run in data["runs"]] == [run.kind for run in bmap.runs]
    for buffer in data["buffers"]:
        runs = [run for run in data["runs"] if run["buffer"] == buffer["name"]]
        assert sum(run["length"] for run in runs) == buffer["bytes"]
    assert data["facts"]["lse_slots"] == [0]
    assert data["facts"]["payload_store_bytes"] == 4  # 20-byte rows of float16


@pytest.mark.parametrize(
    ("name", "store", "padding"),
    [("pynccl_a2a", 4, 0), ("pynccl_a2a_aligned", 16, 4 * 2 * 2 * 28), ("vllm_a2a", 16, 0)],
)
def test_summary_facts(name: str, store: int, padding: int) -> None:
    from layoutgen.show import facts

    found = facts(byte_map(bundled_specs()[name], SHAPES[0]))
    assert found.payload_store_bytes == store
    assert found.padding_bytes == padding  # live rows only: a row b >= B counts as unused, padding included


@pytest.mark.parametrize("pair", [("pynccl_a2a", "flashinfer_mnnvl"), ("vllm_a2a", "pynccl_a2a_aligned")])
def test_diff_agrees_with_both_byte_maps(pair: tuple[str, str]) -> None:
    specs = bundled_specs()
    shape = SHAPES[1]
    diff = diff_layouts(specs[pair[0]], specs[pair[1]], shape)
    for side, name in zip(("a", "b"), pair, strict=True):
        bmap = byte_map(specs[name], shape)
        where: dict[tuple[str, tuple[int, ...]], tuple[str, int]] = {}
        for run in bmap.runs:
            if run.kind not in ("payload", "lse"):
                continue
            assert run.peer and run.batch and run.head
            ranges = [range(*run.peer), range(*run.batch), range(*run.head)]
            if run.kind == "payload":
                assert run.dim is not None
                ranges.append(range(*run.dim))
            elements = torch.cartesian_prod(*[torch.tensor(list(r)) for r in ranges]).reshape(-1, len(ranges))
            size = run.length // len(elements)
            for i, element in enumerate(elements.tolist()):
                where[(run.kind, tuple(element))] = (run.buffer, run.offset + i * size)
        seen = 0
        for drun in diff.runs:
            buffer, offset, length = (getattr(drun, f"{side}_{field}") for field in ("buffer", "offset", "length"))
            shape_ = (shape.N, shape.B, shape.heads_per_peer, shape.D)[: len(drun.first)]
            start = int(torch.tensor(drun.first) @ torch.tensor(_row_major_strides(shape_)))
            for i in range(drun.count):
                element = tuple(int(x) for x in torch.unravel_index(torch.tensor(start + i), shape_))
                assert where[(drun.kind, element)] == (buffer, offset + i * (length // drun.count))
                seen += 1
        assert seen == len(where)


def _row_major_strides(shape: tuple[int, ...]) -> list[int]:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return strides[::-1]


def test_diff_of_a_layout_with_itself_is_identical() -> None:
    spec = bundled_specs()["pynccl_a2a"]
    diff = diff_layouts(spec, spec, SHAPES[0])
    assert diff.identical
    assert diff.same_place == 4 * 2 * 2 * (16 + 1)
    other = diff_layouts(spec, bundled_specs()["pynccl_a2a_aligned"], SHAPES[0])
    assert not other.identical
    assert other.same_place == 16 + 1  # peer 0, batch 0, head 0: the first row starts at byte 0 in both


def test_png_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the PNG needs the optional dependency layoutgen[plot]")
    path = tmp_path / "sub" / "map.png"
    size = write_png(byte_map(bundled_specs()["flashinfer_mnnvl"], SHAPES[0]), path)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert size == len(data) > 10_000
    assert [p.name for p in path.parent.iterdir()] == ["map.png"]  # no temporary file left behind


def test_cli_png_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    from layoutgen.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["layoutgen", *args])
        code = 0
        try:
            main()
        except SystemExit as done:
            code = int(done.code or 0)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    code, _, err = run("show", "no_such_spec")
    assert code == 2 and "no bundled spec named 'no_such_spec'" in err and "pynccl_a2a" in err
    code, _, err = run("show", "vllm_a2a", "--heads", "6")
    assert code == 2 and "H (number of heads) must be divisible by N" in err
    code, _, err = run("diff", "vllm_a2a", str(tmp_path / "missing.yaml"))
    assert code == 2 and "missing.yaml" in err and "no such file" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXTRA_SPECS["slot_outer"].replace("slot: 2", "slot: 3"))
    code, _, err = run("show", str(bad))
    assert code == 2 and "stats.slot" in err
    good = tmp_path / "batch_inner_fp32.yaml"
    good.write_text(EXTRA_SPECS["batch_inner_fp32"])
    code, out, _ = run("show", str(good), "--N", "2", "--heads", "2", "--D", "4")
    assert code == 0 and "p1 b0..1 h0 lse" in out
    if importlib.util.find_spec("matplotlib") is not None:
        code, _, err = run("show", "pynccl_a2a", "--png", str(tmp_path / "p.png"))
        assert code == 0 and (tmp_path / "p.png").stat().st_size > 10_000 and "wrote" in err


def test_large_maps_are_refused() -> None:
    with pytest.raises(ValueError, match="a drawing is limited"):
        byte_map(bundled_specs()["vllm_a2a"], problem_from(8, 64, 64, 512, "float32"))
    assert MAX_MAP_BYTES < 8 * 65 * 64 * 512 * 4


def test_docs_pictures_exist_and_are_small() -> None:
    for name in bundled_specs():
        picture = ROOT / "docs" / f"{name}.png"
        assert picture.is_file(), f"{picture} missing; see README (layoutgen show {name} --png {picture})"
        assert 10_000 < picture.stat().st_size < 300_000
