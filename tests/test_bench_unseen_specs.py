"""benchmarks/bench_unseen_specs.py: its sampler draws valid specs of every kind, and its CPU smoke run checks,
times and reports every kernel of them (under the interpreter; the times mean nothing there)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_unseen_specs

from layoutgen.spec import parse_spec


def test_the_default_sample_parses_and_covers_both_placements_and_transposing_layouts() -> None:
    sample = bench_unseen_specs.sample_specs(12, 8, seed=0)
    dcp = [spec for _, spec in sample if spec.family == "dcp"]
    ulysses = [spec for _, spec in sample if spec.family == "ulysses"]
    assert len(dcp) == 12 and len(ulysses) == 8
    for data, spec in sample:
        assert parse_spec(data, source=data["name"]) == spec
    assert len({spec.name for _, spec in sample}) == len(sample)
    assert {spec.stats.placement.value for spec in dcp} == {"row_tail", "separate"}
    assert any(spec.row_tail and spec.payload.axes[-1] == "batch" for spec in dcp)  # sglang's NPU rows
    assert any(bench_unseen_specs.dcp_transposing(spec) for spec in dcp)
    assert any(
        bench_unseen_specs.ulysses_transposing(*bench_unseen_specs.ulysses_orders(spec, kernel))
        for spec in ulysses
        for kernel in bench_unseen_specs.ULYSSES_KERNELS
    )
    assert {spec.to_attention.shared for spec in ulysses} == {True, False}
    assert bench_unseen_specs.sample_specs(12, 8, seed=0) == sample  # seeded: the same sample every run


def test_the_smoke_run_checks_times_and_reports_every_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # what --interpret sets, put back after the test
    assert bench_unseen_specs.main(["--interpret", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "bench_unseen_specs_cpu-interpreter.json").read_text())
    kernels = {"dcp": bench_unseen_specs.DCP_KERNELS, "ulysses": bench_unseen_specs.ULYSSES_KERNELS}
    assert [entry["family"] for entry in results["specs"]] == ["dcp", "dcp", "ulysses", "ulysses"]
    expected = [(entry["index"], kernel) for entry in results["specs"] for kernel in kernels[entry["family"]]]
    assert [(row["spec"], row["kernel"]) for row in results["rows"]] == expected
    for row in results["rows"]:
        assert "error" not in row, row
        assert row["us"] > 0 and row["copy_us"] > 0 and row["of_copy"] > 0 and row["bytes"] > 0
    assert {(line["family"], line["kernel"]) for line in results["summary"]} == {
        (family, kernel) for family, names in kernels.items() for kernel in names
    }
    table = (tmp_path / "bench_unseen_specs_cpu-interpreter.md").read_text()
    assert "| # | layout | kernel | µs | TB/s | copy µs | % of copy | transposing |" in table
    assert "* dcp pack:" in table and "* ulysses gather_out:" in table


def test_one_family_of_the_same_draw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--family ulysses` times only the Ulysses specs of the whole draw: the same specs and indices as the full
    run (the sampler's stream depends on how many DCP specs come first)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    args = ["--interpret", "--dcp", "1", "--ulysses", "1", "--family", "ulysses", "--out", str(tmp_path)]
    assert bench_unseen_specs.main(args) == 0
    results = json.loads((tmp_path / "bench_unseen_specs_cpu-interpreter.json").read_text())
    (drawn_data, _) = bench_unseen_specs.sample_specs(1, 1, 0)[1]
    assert [(entry["index"], entry["data"]) for entry in results["specs"]] == [(1, drawn_data)]
    assert {row["spec"] for row in results["rows"]} == {1} and results["family"] == "ulysses"
    assert (
        "Only the ulysses specs of this draw timed." in (tmp_path / "bench_unseen_specs_cpu-interpreter.md").read_text()
    )


def test_one_family_keeps_the_others_rows_from_an_earlier_run_of_the_same_draw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--family dcp --keep EARLIER.json`: the DCP rows timed now, the Ulysses rows of the earlier run, in the
    sample's order; an earlier run of another draw is refused, and --keep without --family too."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    earlier_dir, now_dir = tmp_path / "earlier", tmp_path / "now"
    draw = ["--interpret", "--dcp", "1", "--ulysses", "1"]
    assert bench_unseen_specs.main([*draw, "--family", "ulysses", "--out", str(earlier_dir)]) == 0
    earlier_json = earlier_dir / "bench_unseen_specs_cpu-interpreter.json"
    earlier = json.loads(earlier_json.read_text())
    assert bench_unseen_specs.main([*draw, "--family", "dcp", "--keep", str(earlier_json), "--out", str(now_dir)]) == 0
    results = json.loads((now_dir / "bench_unseen_specs_cpu-interpreter.json").read_text())
    assert [entry["index"] for entry in results["specs"]] == [0, 1]
    assert [row for row in results["rows"] if row["family"] == "ulysses"] == earlier["rows"]
    assert {row["family"] for row in results["rows"] if row["spec"] == 0} == {"dcp"}
    assert {line["family"] for line in results["summary"]} == {"dcp", "ulysses"}
    table = (now_dir / "bench_unseen_specs_cpu-interpreter.md").read_text()
    assert f"The ulysses rows are kept from this draw's run of {earlier['environment']['date']}." in table
    # Kept again by a later run of the other family, the rows keep the date they were timed.
    later_dir = tmp_path / "later"
    now_json = now_dir / "bench_unseen_specs_cpu-interpreter.json"
    assert (
        bench_unseen_specs.main([*draw, "--family", "ulysses", "--keep", str(now_json), "--out", str(later_dir)]) == 0
    )
    later = json.loads((later_dir / "bench_unseen_specs_cpu-interpreter.json").read_text())
    assert later["kept"] == {"family": "dcp", "date": results["environment"]["date"]}
    later["environment"]["date"] = "a later date"  # runs a second apart would share a date
    (later_dir / now_json.name).write_text(json.dumps(later))
    assert bench_unseen_specs.main([*draw, "--family", "ulysses", "--keep", str(later_dir / now_json.name), "--out",
                                    str(tmp_path / "last")]) == 0  # fmt: skip
    last = json.loads((tmp_path / "last" / now_json.name).read_text())
    assert last["kept"] == {"family": "dcp", "date": results["environment"]["date"]}  # not the later run's
    other_draw = [*draw[:2], "2", *draw[3:]]
    assert bench_unseen_specs.main([*other_draw, "--family", "dcp", "--keep", str(earlier_json)]) == 2
    with pytest.raises(SystemExit):
        bench_unseen_specs.main([*draw, "--keep", str(earlier_json)])
