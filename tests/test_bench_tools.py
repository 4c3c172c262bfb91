"""The benchmark's helpers that run without a GPU: the clock sampler's windows, the clock line of the
report, the data-movement floor kernel (under the interpreter), the mask probe and its rewrites of the masked pack,
and the Ulysses box probe's list."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import render_module, requires_interpreter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from clocks import ClockSampler


def sample(sm: float, power: float = 200.0) -> dict[str, float]:
    return {"sm_mhz": sm, "mem_mhz": 3201.0, "power_w": power, "temp_c": 50.0}


def test_a_window_takes_the_medians_of_its_samples_or_the_nearest_one() -> None:
    clocks = ClockSampler()
    clocks.samples = [
        (10.0, sample(345)),
        (11.0, sample(1980)),
        (11.5, sample(1755)),
        (12.0, sample(1980)),
        (20.0, sample(345)),
    ]
    inside = clocks.window(10.5, 12.5)
    assert inside["sm_mhz"] == 1980 and inside["sm_mhz_min"] == 1755 and inside["samples"] == 3
    nearest = clocks.window(19.0, 19.5)  # shorter than the sampling interval: the closest sample stands in
    assert nearest["sm_mhz"] == 345 and nearest["samples"] == 1


def test_a_window_without_samples_says_why() -> None:
    clocks = ClockSampler()
    clocks.problem = "nvidia-smi not found"
    assert clocks.window(0.0, 1.0) == {"samples": 0, "problem": "nvidia-smi not found"}


@requires_interpreter
def test_the_report_states_the_clock_range_or_why_it_is_missing() -> None:
    import bench_dcp

    rows = [{"clocks": sample(1980, 150.0)}, {"clocks": sample(1755, 250.0)}, {"clocks": sample(1980, 200.0)}]
    line = bench_dcp.clock_line(rows)
    assert "1755-1980 MHz, median 1980" in line and "power 150-250 W" in line
    assert "nvidia-smi not found" in bench_dcp.clock_line(
        [{"clocks": {"samples": 0, "problem": "nvidia-smi not found"}}]
    )


@requires_interpreter
@pytest.mark.parametrize("sources", [1, 3])
def test_the_floor_kernel_xors_its_sources_and_writes_nothing_past_the_count(sources: int) -> None:
    import bench_dcp

    count, block = 100, 64  # two programs, the second one masked
    source = torch.randint(-(2**31), 2**31 - 1, (sources, count), dtype=torch.int32)
    destination = torch.full((count + 28,), 0x5A5A5A5A, dtype=torch.int32)
    bench_dcp._move_kernel[(2,)](source, destination, count, count, SOURCES=sources, BLOCK=block)
    want = source[0].clone()
    for index in range(1, sources):
        want ^= source[index]
    assert torch.equal(destination[:count], want)
    assert torch.equal(destination[count:], torch.full((28,), 0x5A5A5A5A, dtype=torch.int32))


@requires_interpreter
def test_the_mask_probe_forces_each_form_and_checks_its_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    import probe_pack_mask
    from bench_dcp_v2 import Bench

    import layoutgen

    bench = Bench(True, None)
    module = layoutgen.load("pynccl_a2a")
    threshold = module._SKIP_EMPTY_READS_BYTES
    launch = module._launch_pack
    thresholds: list[int] = []

    def recording(*args: object, **kwargs: object) -> None:
        thresholds.append(module._SKIP_EMPTY_READS_BYTES)
        launch(*args, **kwargs)

    monkeypatch.setattr(module, "_launch_pack", recording)
    row = probe_pack_mask.measure(bench, module, 2, 5, 4, 8, 4)
    assert set(row["us"]) == {"unmasked", "stores", "skip"}
    assert set(thresholds) == {threshold, *probe_pack_mask.FORMS.values()}
    assert threshold == module._SKIP_EMPTY_READS_BYTES  # put back after every launch

    def skips_the_skip_form(*args: object, **kwargs: object) -> None:
        if module._SKIP_EMPTY_READS_BYTES != 0:
            launch(*args, **kwargs)

    monkeypatch.setattr(module, "_launch_pack", skips_the_skip_form)
    with pytest.raises(AssertionError, match="skip pack differs from the reference"):
        probe_pack_mask.measure(bench, module, 2, 5, 4, 8, 4)


@requires_interpreter
def test_the_mask_probe_compares_another_module_and_checks_its_bytes(tmp_path: Path) -> None:
    import probe_pack_mask
    from bench_dcp_v2 import Bench

    import layoutgen
    from layoutgen.loader import load_path

    bench = Bench(True, None)
    module = layoutgen.load("vllm_a2a")
    source = Path(module.__file__).read_text(encoding="utf-8")
    (tmp_path / "same.py").write_text(source, encoding="utf-8")
    other = load_path(tmp_path / "same.py", module_name="layoutgen_test_probe_same")
    row = probe_pack_mask.measure_compare(bench, module, other, "variant", 2, 5, 4, 8)
    assert set(row["us"]) == {"unmasked", "masked", "variant"}
    assert row["config"] == "default" and row["over_unmasked"]["unmasked"] == 1.0

    # A variant that writes its empty rows' values instead of zeros is caught before it is timed.
    unmasked_stores = source.replace("tl.store(destination, tl.zeros_like(values), mask=mask & row_empty)", "pass")
    assert unmasked_stores != source
    (tmp_path / "wrong.py").write_text(unmasked_stores.replace("& ~row_empty)", ")"), encoding="utf-8")
    wrong = load_path(tmp_path / "wrong.py", module_name="layoutgen_test_probe_wrong")
    with pytest.raises(AssertionError, match="variant pack differs from the reference"):
        probe_pack_mask.measure_compare(bench, module, wrong, "variant", 2, 5, 4, 8)


@requires_interpreter
@pytest.mark.parametrize("variant", ["over", "oneflag", "both", "split", "gate"])
def test_each_masked_pack_rewrite_applies_to_its_specs_and_stays_exact(variant: str, tmp_path: Path) -> None:
    import probe_pack_mask
    import probe_pack_rewrites
    from bench_dcp_v2 import Bench

    import layoutgen
    from layoutgen.loader import load_path

    rewrite = probe_pack_rewrites.VARIANTS[variant]
    for name in probe_pack_rewrites.SPECS:
        source = Path(layoutgen.load(name).__file__).read_text(encoding="utf-8")
        assert rewrite(source) != source
    bench = Bench(True, None)
    # A (max, sum) layout with a stats buffer and an lse layout whose stats sit in the payload's row tail.
    for name in ("trtllm_helix_native_v2", "pynccl_a2a"):
        module = layoutgen.load(name)
        path = tmp_path / f"{name}.py"
        path.write_text(rewrite(Path(module.__file__).read_text(encoding="utf-8")), encoding="utf-8")
        other = load_path(path, module_name=f"layoutgen_test_rewrite_{variant}_{name}")
        row = probe_pack_mask.measure_compare(bench, module, other, variant, 2, 5, 4, 8)
        assert set(row["us"]) == {"unmasked", "masked", variant}


def test_a_rewrite_names_what_it_did_not_find() -> None:
    import probe_pack_rewrites

    with pytest.raises(ValueError, match="expected one"):
        probe_pack_rewrites.over("def _pack_kernel(): pass\n")


def test_the_box_probe_lists_the_default_first_and_every_box_once() -> None:
    import bench_unseen_specs
    import probe_ulysses_boxes

    from layoutgen.ulysses.config import runtime_default
    from layoutgen.ulysses.layout import Shape

    spec = bench_unseen_specs.sample_specs(12, 8, 0)[13][1]  # local [seq, dim, head]: runs on both sides matter
    shape = Shape(N=4, S_local=4096, H=32, H_kv=32, D=128, dtype=torch.bfloat16)
    listed = probe_ulysses_boxes.candidates(spec, "scatter", shape, space=5, seed=0)
    assert listed[0] == ("default", runtime_default(spec, "scatter", shape))
    boxes = [json.dumps(config.as_dict(), sort_keys=True) for _, config in listed]
    assert len(boxes) == len(set(boxes))
    labels = [label for label, _ in listed]
    assert "destination run alone" in labels and sum(label.startswith("space #") for label in labels) == 5
    # The destination's run alone is the box before the twelfth pass: 512 rows of 8 heads, one peer.
    alone = dict(listed)["destination run alone"]
    assert (alone.block_peer, alone.block_seq, alone.block_head) == (1, 512, 8)
    assert listed == probe_ulysses_boxes.candidates(spec, "scatter", shape, space=5, seed=0)  # seeded


PROBE_SPECS = sorted((Path(__file__).resolve().parent.parent / "benchmarks" / "specs").glob("*.yaml"))


@requires_interpreter
@pytest.mark.parametrize("path", PROBE_SPECS, ids=lambda path: path.stem)
def test_the_probe_specs_are_valid_and_their_kernels_exact(path: Path, tmp_path: Path) -> None:
    """`benchmarks/specs/` (layouts nobody ships, for `probe_unseen_dcp.py --spec-file`): each parses, renders
    and passes the family's verification (pack bytes against the reference, combine against float64)."""
    from layoutgen.dcp.verify import verify_module
    from layoutgen.spec import load_spec

    spec = load_spec(path)
    assert spec.name == path.stem
    report = verify_module(render_module(spec, tmp_path))
    assert report.ok, report.failures


@requires_interpreter
def test_the_head_to_head_timed_in_turn_counts_only_gaps_beyond_our_own_spread() -> None:
    import bench_dcp

    row = {"spec": "vllm_a2a", "N": 8, "B": 64, "H": 128, "D": 512}
    # Ours 4.00 then 4.04 (1% apart), sglang 3.98: 0.5% faster than our mean, inside our spread.
    noise = {**row, "combine_turn_us": [4.00, 3.98, 4.04], "combine_warm_turn_us": [2.70, 2.90, 2.70]}
    ours, theirs, speedup, twice = bench_dcp.in_turn(noise, "combine_turn")
    assert (ours, theirs) == (4.02, 3.98) and twice == pytest.approx(1.01) and speedup < 1.0
    assert bench_dcp.slower_beyond_spread([bench_dcp.in_turn(noise, "combine_turn")]) == 0
    # sglang 5% faster while ours repeats itself within 0.5%: a real gap.
    gap = {**row, "combine_turn_us": [4.20, 4.00, 4.22]}
    assert bench_dcp.slower_beyond_spread([bench_dcp.in_turn(gap, "combine_turn")]) == 1
    assert bench_dcp.in_turn(row, "pack_turn") is None
    table = "\n".join(bench_dcp.in_turn_markdown([noise, gap]))
    assert "| vllm_a2a | 8 | 64 | 128 | 512 | 4.02 | 3.98 | 0.99x | 1.010 | 2.70 | 2.90 | 1.07x | 1.000 |" in table
    assert "| 4.21 | 4.00 | 0.95x | 1.005 | – | – | – | – |" in table
    assert bench_dcp.in_turn_markdown([row]) == []
