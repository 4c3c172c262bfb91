"""`benchmarks/tuner_quality.py`'s second phase: the tuner's search replayed against a saved truth table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import dcp_problem

import layoutgen
from layoutgen.tuning import space

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from probe_combine import config_name  # noqa: E402


def synthetic_tables(tmp_path: Path) -> Path:
    """A truth table over a real search space with one clear optimum, as the GPU phase would save it."""
    module = layoutgen.load("vllm_a2a")
    problem = dcp_problem(module.SPEC, "combine", 4, 32, 512, "bfloat16")
    bound = space.bind(problem, 64)
    configs = bound.feasible()
    rows = []
    for index, config in enumerate(configs):
        params = bound.to_params(config)
        rows.append({"params": params, "us": None if index == 1 else 10.0 + sum(params.values()) % 7 + index / 100})
    best = rows[-1]
    best["us"] = 5.0
    meta = {"device": "synthetic", "compute_capability": "9.0", "versions": {}, "date": "2026-11-29"}
    meta |= {"copy_tbps": None, "timer": "synthetic", "interpret": False}
    bucket = {"case": "vllm_a2a combine N=4 H/N=32 D=512 B=64", "spec": "vllm_a2a", "kernel": "combine"}
    bucket |= {"N": 4, "H": 128, "D": 512, "batch": 64, "seconds": 1.0, "failures": {"compile_failed": 1}}
    bucket |= {"default": configs[0].as_dict(), "default_us": 12.0, "table": rows}
    tables = {"meta": meta, "buckets": [bucket], "complete": True}
    path = tmp_path / "tables.json"
    path.write_text(json.dumps(tables), encoding="utf-8")
    return path


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(ROOT / "benchmarks" / "tuner_quality.py"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


def test_replay_reports_trials_to_the_optimum_without_a_gpu(tmp_path: Path) -> None:
    tables = synthetic_tables(tmp_path)
    result = replay("--replay", str(tables), "--seeds", "1", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "tuner_quality.json").read_text(encoding="utf-8"))
    (case,) = report["cases"]
    assert case["optimum_us"] == 5.0 and report["complete"]
    feasible = case["feasible"]
    for method in ("tpe", "random"):
        reached = case[method]["trials_to_3pct"]
        assert len(reached) == 1 and all(r is None or 1 <= r <= feasible for r in reached)
    assert "| vllm_a2a combine N=4 H/N=32 D=512 B=64 |" in (tmp_path / "out" / "tuner_quality.md").read_text()


def test_replay_refuses_a_table_from_another_search_space(tmp_path: Path) -> None:
    tables = synthetic_tables(tmp_path)
    data = json.loads(tables.read_text(encoding="utf-8"))
    data["buckets"][0]["table"].pop()
    tables.write_text(json.dumps(data), encoding="utf-8")
    result = replay("--replay", str(tables), "--out", str(tmp_path / "out"))
    assert result.returncode != 0 and "does not match today's search space" in result.stderr
    assert not (tmp_path / "out" / "tuner_quality.json").exists()


def synthetic_probe(tmp_path: Path, name: str, resident: bool, scale: float) -> Path:
    """A `probe_combine.py --space` run over the real space of one point, every config timed."""
    module = layoutgen.load("vllm_a2a")
    problem = dcp_problem(module.SPEC, "combine", 4, 32, 512, "bfloat16")
    configs = space.bind(problem, 8).feasible()
    times = {config_name(config): scale * (3.0 + i / 100) for i, config in enumerate(configs)}
    times["default"] = scale * 4.0
    row = {"spec": "vllm_a2a", "N": 4, "B": 8, "H": 128, "D": 512, "cur": times, "sglang": 1.0}
    probe = {"date": "2026-12-01T14:00:00+00:00", "device": "synthetic", "torch": "2.11", "space": True}
    probe |= {"resident": resident, "modules": {"cur": "generated/vllm_a2a.py"}, "rows": [row]}
    path = tmp_path / name
    path.write_text(json.dumps(probe), encoding="utf-8")
    return path


def test_tables_from_two_probes_hold_each_configs_geometric_mean(tmp_path: Path) -> None:
    rotated = synthetic_probe(tmp_path, "rotated.json", False, 4.0)
    resident = synthetic_probe(tmp_path, "resident.json", True, 1.0)
    result = replay("--from-probes", str(rotated), str(resident), "--seeds", "1", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-3000:]
    tables = json.loads((tmp_path / "out" / "tuner_quality_tables_probes.json").read_text(encoding="utf-8"))
    (bucket,) = tables["buckets"]
    assert bucket["case"].endswith("(geomean of rotated and L2-resident)") and bucket["batch"] == 8
    assert abs(bucket["default_us"] - 8.0) < 1e-9  # sqrt(16 * 4)
    assert abs(min(row["us"] for row in bucket["table"]) - 6.0) < 1e-9  # sqrt(12 * 3)
    (case,) = json.loads((tmp_path / "out" / "tuner_quality.json").read_text(encoding="utf-8"))["cases"]
    assert abs(case["optimum_us"] - 6.0) < 1e-9


def test_from_probes_refuses_a_probe_that_did_not_time_the_space(tmp_path: Path) -> None:
    probe = synthetic_probe(tmp_path, "probe.json", False, 1.0)
    data = json.loads(probe.read_text(encoding="utf-8"))
    data["space"] = False
    probe.write_text(json.dumps(data), encoding="utf-8")
    result = replay("--from-probes", str(probe), "--out", str(tmp_path / "out"))
    assert result.returncode != 0 and "not a `probe_combine.py --space` run of one module" in result.stderr
