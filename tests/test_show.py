"""`layoutgen show` / `layoutgen diff`: golden outputs, and the byte map checked against the reference's bytes."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from layoutgen.dcp import quant, reference
from layoutgen.dcp.layout import LayoutBuffers
from layoutgen.dcp.spec import DcpSpec
from layoutgen.show import (
    MAX_MAP_BYTES,
    Buffer,
    ByteLayout,
    ByteMap,
    Kind,
    Legend,
    LegendEntry,
    Look,
    Placement,
    axes_label,
    build_byte_map,
    byte_map,
    diff_byte_layouts,
    diff_layouts,
    diff_renderable,
    diff_to_json,
    render_text,
    renderable,
    to_json,
    write_png,
)
from layoutgen.spec import bundled_specs, parse_spec_text

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
    "fp8_blocks_in_tail": """
name: fp8_blocks_in_tail
summary: e5m2 codes with a scale per 16 elements after the (max, sum) words in the row tail
transport: all_to_all_single
payload: {axes: [peer, batch, head, dim], dtype: float8_e5m2, scale_block: 16}
stats: {placement: row_tail, form: max_sum}
align_bytes: 8
""",
    "fp8_scales_outer": """
name: fp8_scales_outer
summary: e4m3fn codes, batch innermost, scales buffer with the block axis outside the heads
transport: external
payload: {axes: [peer, head, dim, batch], dtype: float8_e4m3fn, scale_axes: [block, peer, head, batch]}
stats: {placement: separate, axes: [peer, batch, head, slot], slots: 1, slot: 0}
""",
}


def all_specs() -> dict[str, DcpSpec]:
    """The DCP family's bundled specs and the extra ones (the reference check below speaks DCP)."""
    specs = {name: spec for name, spec in bundled_specs().items() if spec.family == "dcp"}
    specs.update({name: parse_spec_text(text, f"<{name}>") for name, text in EXTRA_SPECS.items()})
    return specs


#: (drawing shape, dtype): the CLI's default; B = 1, odd heads per peer, D not a power of two; one head per
#: peer, float32 rows.
SHAPES: list[tuple[dict[str, int], str]] = [
    ({"N": 4, "B": 2, "H": 8, "D": 16}, "bfloat16"),
    ({"N": 2, "B": 1, "H": 6, "D": 10}, "float16"),
    ({"N": 3, "B": 3, "H": 3, "D": 6}, "float32"),
]


def _shape_id(case: tuple[dict[str, int], str]) -> str:
    shape, dtype = case
    return "".join(f"{name}{value}" for name, value in shape.items()) + dtype


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


def _check_against_reference(bmap: ByteMap, spec: DcpSpec, shape: dict[str, int], dtype: str) -> None:
    """Pack distinct random values with the reference and check every claim of the map byte by byte."""
    N, B, H, D = shape["N"], shape["B"], shape["H"], shape["D"]
    bufs = LayoutBuffers.allocate(spec, N, B + 1, H, D, getattr(torch, dtype), "cpu")
    for tensor in bufs.tensors.values():
        _bytes_of(tensor).fill_(CANARY)
    gen = torch.Generator().manual_seed(N * 1000 + B * 10 + D)
    out = torch.randn(B, H, D, generator=gen).to(getattr(torch, dtype))
    lse = torch.randn(B, H, generator=gen) * 8
    reference.pack(out, lse, bufs)
    h = H // N
    wire = bufs.tensors["payload"].dtype
    per_peer = out.reshape(B, N, h, D).permute(1, 0, 2, 3)  # [peer, batch, head, d]
    if spec.fp8:  # codes and block scales: the quantisation rule is tested on its own (test_dcp_fp8_quant.py)
        per_peer_out, per_peer_scale = quant.quantise(per_peer.to(torch.float32), spec.scale_block_of(D), wire)
    else:
        per_peer_out = per_peer.to(wire)
    per_peer_lse = lse.reshape(B, N, h).permute(1, 0, 2)  # [peer, batch, head]
    covered = {name: 0 for name in bufs.tensors}
    counts = {"payload": 0, "lse": 0, "scale": 0}
    for run in sorted(bmap.runs, key=lambda r: (r.buffer, r.offset)):
        assert run.offset == covered[run.buffer], f"runs of {run.buffer} leave a gap or overlap at {run.offset}"
        covered[run.buffer] += run.length
        got = _bytes_of(bufs.tensors[run.buffer])[run.offset : run.offset + run.length]
        if run.kind in ("padding", "unused"):
            assert bool((got == CANARY).all()), f"{run} was written by the reference"
            continue
        peer, batch, head = run.range("peer"), run.range("batch"), run.range("head")
        assert peer and batch and head
        index = (slice(*peer), slice(*batch), slice(*head))
        if run.kind == "payload":
            dim = run.range("dim")
            assert dim is not None
            want = per_peer_out[(*index, slice(*dim))]
            counts["payload"] += want.numel()
        elif run.kind == "scale":  # a scales buffer names the block; a row tail holds all of the row's, in order
            block = run.range("block") or (0, D // spec.scale_block_of(D))
            want = per_peer_scale[(*index, slice(*block))]
            counts["scale"] += want.numel()
        elif run.kind == "sum":  # a (max, sum) spec: pack from `lse=` writes max = lse, sum = 1
            want = torch.ones_like(per_peer_lse[index])
            counts["lse"] += want.numel()
        else:
            want = per_peer_lse[index]
            counts["lse"] += want.numel()
        want_bytes = _bytes_of(want.contiguous())
        assert got.numel() == want_bytes.numel(), f"{run} has {got.numel()} bytes, its elements {want_bytes.numel()}"
        assert torch.equal(got, want_bytes), f"{spec.name}: bytes of {run} are not what the reference wrote there"
    for name, tensor in bufs.tensors.items():
        assert covered[name] == tensor.numel() * tensor.element_size(), f"runs do not cover all of {name}"
    scales = N * B * h * (D // spec.scale_block_of(D)) if spec.fp8 else 0
    assert counts == {"payload": N * B * h * D, "lse": N * B * h * spec.stats.words, "scale": scales}


@pytest.mark.parametrize("case", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("name", sorted(all_specs()))
def test_byte_map_agrees_with_reference(name: str, case: tuple[dict[str, int], str]) -> None:
    spec = all_specs()[name]
    shape, dtype = case
    if spec.fp8:  # D a multiple of the scale block, and fp8 rows with a tail end on a float32 word: D 10 -> 12
        multiple = max(spec.payload.scale_block or 1, 4 if spec.row_tail else 1)
        case = ({**shape, "D": -(-shape["D"] // multiple) * multiple}, dtype)
    _check_against_reference(byte_map(spec, *case), spec, *case)


def test_reference_check_catches_a_wrong_map() -> None:
    """The check above can fail: swap the labels of two payload runs and it must object."""
    spec, case = bundled_specs()["vllm_a2a"], SHAPES[0]
    bmap = byte_map(spec, *case)
    runs = list(bmap.runs)
    first, second = [i for i, run in enumerate(runs) if run.kind == "payload"][:2]
    runs[first], runs[second] = (
        dataclasses.replace(runs[first], ranges={**runs[first].ranges, "head": runs[second].ranges["head"]}),
        dataclasses.replace(runs[second], ranges={**runs[second].ranges, "head": runs[first].ranges["head"]}),
    )
    with pytest.raises(AssertionError, match="not what the reference wrote"):
        _check_against_reference(dataclasses.replace(bmap, runs=tuple(runs)), spec, *case)


def test_json_is_the_map() -> None:
    spec = bundled_specs()["flashinfer_mnnvl"]
    bmap = byte_map(spec, *SHAPES[1])
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

    found = facts(byte_map(bundled_specs()[name], *SHAPES[0]))
    assert found.store_bytes["payload"] == store
    assert found.kind_bytes["padding"] == padding  # live rows only: a row b >= B counts as unused, padding included


@pytest.mark.parametrize("pair", [("pynccl_a2a", "flashinfer_mnnvl"), ("vllm_a2a", "pynccl_a2a_aligned")])
def test_diff_agrees_with_both_byte_maps(pair: tuple[str, str]) -> None:
    specs = bundled_specs()
    shape, dtype = SHAPES[1]
    diff = diff_layouts(specs[pair[0]], specs[pair[1]], shape, dtype)
    for side, name in zip(("a", "b"), pair, strict=True):
        bmap = byte_map(specs[name], shape, dtype)
        where: dict[tuple[str, tuple[int, ...]], tuple[str, int]] = {}
        for run in bmap.runs:
            if run.kind not in ("payload", "lse"):
                continue
            axes = ("peer", "batch", "head", "dim") if run.kind == "payload" else ("peer", "batch", "head")
            ranges = [range(*run.ranges[axis]) for axis in axes]
            elements = torch.cartesian_prod(*[torch.tensor(list(r)) for r in ranges]).reshape(-1, len(ranges))
            size = run.length // len(elements)
            for i, element in enumerate(elements.tolist()):
                where[(run.kind, tuple(element))] = (run.buffer, run.offset + i * size)
        seen = 0
        for drun in diff.runs:
            buffer, offset, length = (getattr(drun, f"{side}_{field}") for field in ("buffer", "offset", "length"))
            shape_ = (shape["N"], shape["B"], shape["H"] // shape["N"], shape["D"])[: len(drun.first)]
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
    diff = diff_layouts(spec, spec, *SHAPES[0])
    assert diff.identical
    assert diff.same_place == 4 * 2 * 2 * (16 + 1)
    other = diff_layouts(spec, bundled_specs()["pynccl_a2a_aligned"], *SHAPES[0])
    assert not other.identical
    assert other.same_place == 16 + 1  # peer 0, batch 0, head 0: the first row starts at byte 0 in both


def test_png_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the PNG needs the optional dependency layoutgen[plot]")
    path = tmp_path / "sub" / "map.png"
    size = write_png(byte_map(bundled_specs()["flashinfer_mnnvl"], *SHAPES[0]), path)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert size == len(data) > 10_000
    assert [p.name for p in path.parent.iterdir()] == ["map.png"]  # no temporary file left behind


@pytest.mark.parametrize(
    ("spec_name", "shape"),
    [("flashinfer_mnnvl", SHAPES[0][0]), ("vllm_a2a_fp8", {"N": 16, "B": 1, "H": 16, "D": 16})],
    ids=["one-legend-row", "three-legend-rows"],
)
def test_png_legend_and_title_clear_the_panels(spec_name: str, shape: dict[str, int]) -> None:
    # 16 peers and 4 kinds fill three legend rows: before, the legend covered the last panel's axis label and
    # ran off the figure's bottom edge, and the title sat on the first panel's.
    pytest.importorskip("matplotlib", reason="the PNG needs the optional dependency layoutgen[plot]")
    import matplotlib.pyplot as plt

    from layoutgen.show.png import draw

    fig = draw(byte_map(bundled_specs()[spec_name], shape, "bfloat16"))
    try:
        renderer = fig.canvas.get_renderer()
        (legend,) = fig.legends
        legend_box = legend.get_window_extent(renderer)
        title_box = fig._suptitle.get_window_extent(renderer)
        panel_boxes = [ax.get_tightbbox(renderer) for ax in fig.axes]
        assert legend_box.y0 >= 0 and legend_box.x0 >= 0 and legend_box.x1 <= fig.bbox.x1
        assert title_box.y1 <= fig.bbox.y1
        assert legend_box.y1 <= min(box.y0 for box in panel_boxes)
        assert title_box.y0 >= max(box.y1 for box in panel_boxes)
    finally:
        plt.close(fig)


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """`layoutgen ARGS` through the real entry point: (exit code, stdout, stderr)."""
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

    return run


def test_cli_png_and_bad_input(tmp_path: Path, run_cli) -> None:
    code, _, err = run_cli("show", "no_such_spec")
    assert code == 2 and "no bundled spec named 'no_such_spec'" in err and "pynccl_a2a" in err
    code, _, err = run_cli("show", "vllm_a2a", "--heads", "6")
    assert code == 2 and "H (number of heads) must be divisible by N" in err
    code, _, err = run_cli("diff", "vllm_a2a", str(tmp_path / "missing.yaml"))
    assert code == 2 and "missing.yaml" in err and "no such file" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXTRA_SPECS["slot_outer"].replace("slot: 2", "slot: 3"))
    code, _, err = run_cli("show", str(bad))
    assert code == 2 and "stats.slot" in err
    good = tmp_path / "batch_inner_fp32.yaml"
    good.write_text(EXTRA_SPECS["batch_inner_fp32"])
    code, out, _ = run_cli("show", str(good), "--N", "2", "--heads", "2", "--D", "4")
    assert code == 0 and "p1 b0..1 h0 lse" in out
    code, same, _ = run_cli("show", str(good), "--shape", "N=2", "--shape", "H=2", "--shape", "D=4")
    assert code == 0 and same == out
    if importlib.util.find_spec("matplotlib") is not None:
        code, _, err = run_cli("show", "pynccl_a2a", "--png", str(tmp_path / "p.png"))
        assert code == 0 and (tmp_path / "p.png").stat().st_size > 10_000 and "wrote" in err


def test_png_without_matplotlib_is_refused_up_front(monkeypatch: pytest.MonkeyPatch) -> None:
    from layoutgen.show import png

    monkeypatch.setattr(png.importlib.util, "find_spec", lambda name, *rest: None)
    with pytest.raises(ImportError, match=re.escape("pip install 'layoutgen[plot]'")):
        png.require_matplotlib()


def test_large_maps_are_refused() -> None:
    with pytest.raises(ValueError, match="a drawing is limited"):
        byte_map(bundled_specs()["vllm_a2a"], {"N": 8, "B": 64, "H": 64, "D": 512}, "float32")
    assert MAX_MAP_BYTES < 8 * 65 * 64 * 512 * 4


def test_huge_shape_is_refused_before_allocating(run_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shape larger than memory gets the size message, not a MemoryError: the size is computed first."""

    def no_allocation(*args: object, **kwargs: object) -> None:
        raise AssertionError("buffers were allocated before the size check")

    monkeypatch.setattr(LayoutBuffers, "allocate", no_allocation)
    with pytest.raises(ValueError, match="hold 4800000096 bytes; a drawing is limited to 1048576 bytes"):
        byte_map(bundled_specs()["pynccl_a2a"], {"D": 100_000_000}, "bfloat16")
    code, out, err = run_cli("show", "pynccl_a2a", "--shape", "D=100000000")
    assert code == 2 and out == "" and "a drawing is limited" in err and "MemoryError" not in err


def test_diff_prints_a_summary_unless_runs_are_asked_for(run_cli) -> None:
    code, summary, _ = run_cli("diff", "pynccl_a2a", "flashinfer_mnnvl")
    assert code == 0 and "logical element(s)" not in summary and "--runs lists every run" in summary
    assert len(summary.splitlines()) < 12
    code, with_runs, _ = run_cli("diff", "pynccl_a2a", "flashinfer_mnnvl", "--runs")
    diff = diff_layouts(bundled_specs()["pynccl_a2a"], bundled_specs()["flashinfer_mnnvl"], *SHAPES[0])
    assert code == 0 and "logical element(s)" in with_runs
    buffers, table, _ = with_runs.split("\n\n")
    assert summary.startswith(buffers + "\n\n") and len(summary.split("\n\n")) == 2
    assert len(table.splitlines()) == 1 + len(diff.runs)  # the header, then one line per run
    assert render_text(diff_renderable(diff)) == summary
    assert render_text(diff_renderable(diff, runs=True)) == with_runs


#: Words of the DCP family that the shared show machinery must not contain (they come from a ByteLayout).
DCP_WORDS = ("peer", "batch", "head", "dim", "lse", "stats", "slot", "payload", "row_tail", "rowtail")


@pytest.mark.parametrize("path", sorted((ROOT / "layoutgen" / "show").glob("*.py")), ids=lambda p: p.name)
def test_show_machinery_speaks_no_family_words(path: Path) -> None:
    """Identifiers, strings, docstrings and comments alike: `_` separates words (`peer_count` is caught),
    letters do not (`header`, `ndim` are not)."""
    pattern = re.compile(rf"(?<![a-z0-9])({'|'.join(DCP_WORDS)})(e?s)?(?![a-z0-9])")
    found = [
        f"{path.name}:{number}: {line.strip()}"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line.lower().replace("_", " ")) or "row_tail" in line.lower()
    ]
    assert not found, "family words in shared code:\n" + "\n".join(found)


def test_another_family_vocabulary_draws_and_diffs() -> None:
    """Nothing in the machinery is DCP's: a made-up two-rank layout with its own words draws and diffs."""

    def layout(name: str, rank_outer: bool) -> ByteLayout:
        wire = torch.zeros((2, 3, 4) if rank_outer else (3, 2, 4), dtype=torch.float16)
        axes = ("rank", "token", "lane") if rank_outer else ("token", "rank", "lane")
        logical = wire if rank_outer else wire.permute(1, 0, 2)
        kinds = (Kind("q", Look.COLOURED, store_fact=True), Kind("spare", Look.VOID, byte_total=True))
        letters = {"rank": "r", "token": "t", "lane": "l"}
        return ByteLayout(
            name=name,
            shape_text="2 ranks, 2 of 3 tokens, 4 lanes",
            buffers=(Buffer("wire", wire, axes),),
            placements=(Placement("q", logical[:, :2], ("rank", "token", "lane")),),
            kinds=kinds,
            axis_letters=letters,
            colour_axis="rank",
            label=lambda run: " ".join([*axes_label(run, ("rank", "token", "lane"), letters), run.kind]),
            legend=Legend("ranks", (LegendEntry("spare", "spare", "a token slot no one uses", "spare"),), "r rank"),
            summary=lambda bmap, found: f"{found.kind_bytes['spare']} spare bytes.",
            elements_phrase=lambda counts: f"{counts['q']} q elements",
            json_header={"layout": name},
            shape_json={"ranks": 2},
            unassigned=lambda info, coords: torch.ones(len(coords), dtype=torch.int64),
        )

    bmap = build_byte_map(layout("rank_outer", True))
    text = render_text(renderable(bmap))
    assert "ranks:  r0   r1 " in text and "r1 t0 l0..3 q" in text and "r0 t2 l0..3 spare" in text
    assert "16 spare bytes." in text
    data = json.loads(to_json(bmap))
    assert data["layout"] == "rank_outer" and data["facts"]["q_store_bytes"] == 8
    assert data["facts"]["buffers"][0]["rank_block_bytes"] == 24 and data["facts"]["spare_bytes"] == 16
    assert data["runs"][0] == {"buffer": "wire", "offset": 0, "length": 8, "kind": "q", "rank": [0, 1],
                               "token": [0, 1], "lane": [0, 4]}  # fmt: skip
    diff = diff_byte_layouts(layout("rank_outer", True), layout("token_outer", False))
    assert not diff.identical and diff.counts() == {"q": 16}
    assert json.loads(diff_to_json(diff))["shape"] == {"ranks": 2}
    assert "16 q elements in 4 runs." in render_text(diff_renderable(diff))
    # Two layouts with no kind in common cannot be compared at all.
    other = layout("token_outer", False)
    renamed = dataclasses.replace(
        other,
        placements=(dataclasses.replace(other.placements[0], kind="k"),),
        kinds=(Kind("k", Look.COLOURED, store_fact=True), *other.kinds[1:]),
    )
    with pytest.raises(ValueError, match=r"hold no logical elements in common.*only rank_outer holds q"):
        diff_byte_layouts(layout("rank_outer", True), renamed)


def test_docs_pictures_exist_and_are_small() -> None:
    for name in bundled_specs():
        picture = ROOT / "docs" / f"{name}.png"
        assert picture.is_file(), f"{picture} missing; see README (layoutgen show {name} --png {picture})"
        assert 10_000 < picture.stat().st_size < 300_000


def test_cli_refuses_h_kv_for_specs_without_gqa_tensors(run_cli) -> None:
    """Given to a spec that has no H_kv-headed tensors, H_kv would be ignored: show and diff refuse it."""
    code, _, err = run_cli("show", "yunchang_ulysses", "--heads-kv", "8")
    assert code == 2 and "--shape H_kv: spec 'yunchang_ulysses' has no H_kv-headed tensors; leave H_kv out" in err
    code, _, err = run_cli("diff", "yunchang_ulysses", "deepspeed_ulysses", "--shape", "H_kv=8")
    assert code == 2 and "spec 'deepspeed_ulysses' has no H_kv-headed tensors" in err
    code, out, _ = run_cli("show", "ulysses_qkv_gqa", "--heads-kv", "4", "--heads", "8")
    assert code == 0 and "H_kv=4 (2 per peer)" in out


def test_tune_refuses_h_kv_when_no_spec_of_the_run_has_gqa_tensors(run_cli) -> None:
    grid = ["--kernel", "scatter", "--shape", "N=2", "--shape", "H=32", "--bucket", "64", "--dry-run"]
    code, _, err = run_cli("tune", "--spec", "yunchang_ulysses", "--heads-kv", "8", *grid)
    assert code == 2 and "--shape H_kv: spec 'yunchang_ulysses' has no H_kv-headed tensors; leave H_kv out" in err
    code, out, _ = run_cli("tune", "--spec", "yunchang_ulysses", "--spec", "ulysses_qkv_gqa", "--heads-kv", "8", *grid)
    assert code == 0 and "ulysses_qkv_gqa scatter N=2 Hl=16 Hl_kv=4" in out


def test_build_and_tune_say_where_a_spec_given_as_an_argument_goes(run_cli) -> None:
    """show and diff take their specs as arguments, build and tune after --spec: click's refusal says so."""
    code, _, err = run_cli("build", "my.yaml", "--check")
    assert code == 2 and "Got unexpected extra argument" in err
    assert "build takes each spec after --spec, e.g. layoutgen build --spec my.yaml" in err
    code, _, err = run_cli("tune", "a.yaml", "b c.yaml")  # names with spaces are not split apart in the example
    assert code == 2 and "tune takes each spec after --spec, e.g. layoutgen tune --spec FILE" in err
    code, _, err = run_cli("families", "dcp")  # no --spec option: click's message alone
    assert code == 2 and "Got unexpected extra argument" in err and "--spec" not in err
