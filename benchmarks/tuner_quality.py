"""How well does the tuner's TPE search converge?  Exhaustive optimum vs TPE, per batch bucket.

For each bucket below, every feasible config of the declared search space is compiled (on the tuner's
process pool), gated against the reference and timed exactly as `layoutgen tune` times a trial
(CUDA-graph replays, median).  That table is the ground truth.  The tuner's search is then replayed
against the table, with the tuner's own sampler settings (multivariate TPE, constant liar, three trials
in flight, the heuristic default enqueued first; neighbouring buckets' winners are *not* given, so this
is the harder, cold-start case), for several sampler seeds, and the same with random search for scale.

Reported per bucket: feasible points; the exhaustive optimum and the default; for TPE the measured
trials until the best found is within 3% of the optimum (median and worst over seeds, and as a share of
the exhaustive count; target: <= 30%), and the gap left after the tuner's default budget (24 trials).

The two phases can run on different machines: the GPU's time goes to the truth tables only.

Usage (GPU, both phases):  python benchmarks/tuner_quality.py --out benchmarks/results
GPU, tables only (written after every bucket, so an interrupted run keeps what it measured):
    python benchmarks/tuner_quality.py --tables-only --out $OUT
anywhere, the replay and the report from saved tables (CPU only, no GPU needed):
    python benchmarks/tuner_quality.py --replay $OUT/tuner_quality_tables.json --out benchmarks/results
or from `probe_combine.py --space` runs, each config's geometric mean over them (e.g. rotated and --resident):
    python benchmarks/tuner_quality.py --from-probes rotated.json resident.json --out $OUT
CPU smoke test (meaningless timings, tiny shapes):
    TRITON_INTERPRET=1 python benchmarks/tuner_quality.py --interpret --seeds 2 --out /tmp/tq
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # a checkout that is not pip-installed

#: (spec, kernel, N, H, D, buckets): MLA decode shapes, both kernels, three layouts.  Cheapest spaces first
#: (compiling every feasible config is most of the cost): an interrupted run still reports six buckets.
GPU_CASES: tuple[tuple[str, str, int, int, int, tuple[int, ...]], ...] = (
    ("flashinfer_mnnvl", "combine", 8, 128, 512, (16, 256, 4096)),
    ("vllm_a2a", "combine", 4, 128, 512, (8, 64, 1024)),
    ("vllm_a2a", "pack", 2, 16, 512, (256,)),
    ("pynccl_a2a", "pack", 4, 128, 512, (1, 64, 1024)),
)
INTERPRET_CASES: tuple[tuple[str, str, int, int, int, tuple[int, ...]], ...] = (
    ("pynccl_a2a", "pack", 2, 4, 8, (3, 4)),
    ("flashinfer_mnnvl", "combine", 2, 4, 8, (3,)),
)
WITHIN = 1.03
TARGET_SHARE = 0.30
#: A replay that has not come within WITHIN of the optimum by this share of the table counts as a miss.
MAX_REPLAY_SHARE = 0.6
LOOKAHEAD = 3


def measure_exhaustively(ctx: Any, target: Any, batch: int) -> dict[str, Any]:
    """Time every feasible config once; returns the table keyed by Optuna params."""
    from layoutgen.tuning.claims import params_key
    from layoutgen.tuning.objective import evaluate
    from layoutgen.tuning.space import bind

    bound = bind(target.problem, batch)
    configs = bound.feasible()
    workload = target.problem.family.workload(target, batch, ctx.device, ctx.l2_bytes)
    compiled = {config: ctx.pool.submit(workload.compile_job(config)) for config in configs}
    started = time.perf_counter()
    table: dict[tuple[tuple[str, int], ...], float | None] = {}
    failures: Counter[str] = Counter()
    for index, config in enumerate(configs):
        measurement = evaluate(workload, config, compiled[config], ctx.timer, seed=index)
        if measurement.status == "gate_failed":
            raise SystemExit(f"BUG: {target.problem.label} B={batch}: {config} fails the gate: {measurement.reason}")
        table[params_key(bound.to_params(config))] = measurement.timing.median_us if measurement.timing else None
        if measurement.timing is None:
            failures[measurement.status] += 1
    default = target.default_config(batch)
    default_us = table.get(params_key(bound.to_params(default))) if bound.is_feasible(default) else None
    if default_us is None:
        timing = ctx.timer.time(workload.timing_launch(default), workload.sets, workload.estimated_us)
        default_us = timing.median_us
    return {
        "table": table,
        "seconds": time.perf_counter() - started,
        "failures": dict(failures),
        "default_us": default_us,
        "default": default.as_dict(),
    }


def replay_search(
    name: str,
    bound: Any,
    table: dict[Any, float | None],
    default: Any,
    seed: int,
    random: bool,
    goal: float,
    budget: int,
) -> dict[str, Any]:
    """The tuner's ask/tell loop against the measured table; returns the trajectory of the best value.

    Stops once the best is within `goal` and `budget` trials are measured (all the report needs), or at
    MAX_REPLAY_SHARE of the table: replaying all of a large space costs TPE minutes of CPU per seed (its
    asks grow with the trials; 332 configs x 20 replays ran out a 6-minute device slot on 2026-11-29).
    """
    import optuna
    from optuna.trial import TrialState

    from layoutgen.tuning.claims import params_key
    from layoutgen.tuning.plan import TuneOptions
    from layoutgen.tuning.prepare import make_sampler

    sampler = (
        optuna.samplers.RandomSampler(seed=seed) if random else make_sampler(name, TuneOptions(seed=seed), len(table))
    )
    study = optuna.create_study(direction="minimize", sampler=sampler)
    if bound.is_feasible(default):
        study.enqueue_trial(bound.to_params(default))
    ranges = bound.param_ranges()
    measured: dict[Any, float | None] = {}
    best = float("inf")
    trajectory: list[float] = []
    in_flight: deque[tuple[Any, Any]] = deque()
    asks = 0
    limit = min(len(table), max(budget, math.ceil(MAX_REPLAY_SHARE * len(table))))
    while len(measured) < limit and asks < 50 * len(table):
        if len(trajectory) >= budget and best <= goal:
            break
        while len(in_flight) < LOOKAHEAD and asks < 50 * len(table):
            asks += 1
            trial = study.ask()
            params = {key: trial.suggest_int(key, low, high) for key, (low, high) in ranges.items()}
            key = params_key(params)
            if key not in table:
                study.tell(trial, state=TrialState.PRUNED)
            elif key in measured or any(key == k for k, _ in in_flight):
                value = measured.get(key)
                study.tell(trial, value) if value is not None else study.tell(trial, state=TrialState.FAIL)
            else:
                in_flight.append((key, trial))
        if not in_flight:
            continue
        key, trial = in_flight.popleft()
        value = table[key]
        measured[key] = value
        if value is None:
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, value)
            best = min(best, value)
        trajectory.append(best)
    return {"trajectory": trajectory}


def trials_to_reach(trajectory: list[float], goal: float) -> int | None:
    return next((index + 1 for index, best in enumerate(trajectory) if best <= goal), None)


def tables_stem(meta: dict[str, Any], interpret: bool, what: str) -> str:
    """File stem of a result: the GPU's is committed under benchmarks/results, a smoke test's is kept apart."""
    from layoutgen.tuning_db import device_file_name

    return what + (f"_{device_file_name(meta['device']).removesuffix('.json')}" if interpret else "")


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    partial.replace(path)  # never a half-written file


def measure_tables(args: argparse.Namespace) -> dict[str, Any]:
    """Phase 1 (GPU): the truth table of every bucket, saved after each one."""
    import optuna

    from layoutgen.tuning.context import QuietReporter, make_context
    from layoutgen.tuning.plan import TuneOptions, make_targets
    from layoutgen.tuning_db import software_versions

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ctx = make_context(TuneOptions(interpret=args.interpret, workers=1), None, QuietReporter())
    tables: dict[str, Any] = {
        "meta": {
            "device": ctx.device_name,
            "compute_capability": ctx.compute_capability,
            "versions": software_versions(),
            "date": datetime.date.today().isoformat(),
            "copy_tbps": ctx.copy_tbps,
            "timer": ctx.timer.description,
            "interpret": args.interpret,
        },
        "buckets": [],
        "complete": False,
    }
    path = args.out / f"{tables_stem(tables['meta'], args.interpret, 'tuner_quality_tables')}.json"
    cases = INTERPRET_CASES if args.interpret else GPU_CASES
    try:
        for spec, kernel, N, H, D, buckets in cases:
            (target,) = make_targets(case_options(spec, kernel, N, H, D, args.interpret))
            for batch in buckets:
                label = f"{target.problem.label} B={batch}"
                print(f"measuring every feasible config of {label} ...", flush=True)
                truth = measure_exhaustively(ctx, target, batch)
                tables["buckets"].append(
                    {
                        "case": label,
                        "spec": spec, "kernel": kernel, "N": N, "H": H, "D": D, "batch": batch,
                        "seconds": round(truth["seconds"], 1),
                        "failures": truth["failures"],
                        "default": truth["default"],
                        "default_us": truth["default_us"],
                        "table": [{"params": dict(key), "us": us} for key, us in truth["table"].items()],
                    }
                )  # fmt: skip
                write_json(path, tables)
                print(f"  {len(truth['table'])} configs in {truth['seconds']:.0f} s -> {path}", flush=True)
    except KeyboardInterrupt:
        print(f"interrupted: {path} holds the {len(tables['buckets'])} bucket(s) measured so far")
    finally:
        ctx.pool.close()
    tables["complete"] = len(tables["buckets"]) == sum(len(case[-1]) for case in cases)
    write_json(path, tables)
    return tables


def case_options(spec: str, kernel: str, N: int, H: int, D: int, interpret: bool) -> Any:
    from layoutgen.tuning.plan import TuneOptions

    grid = (("N", (N,)), ("H", (H,)), ("D", (D,)))
    return TuneOptions(specs=(spec,), kernels=(kernel,), grid=grid, interpret=interpret)


def replay_tables(tables: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Phase 2 (CPU): replay the tuner's search against each truth table; report after every bucket."""
    import optuna

    from layoutgen.tuning.claims import params_key
    from layoutgen.tuning.plan import make_targets
    from layoutgen.tuning.space import bind

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results: list[dict[str, Any]] = []
    for bucket in tables["buckets"]:
        (target,) = make_targets(
            case_options(bucket["spec"], bucket["kernel"], bucket["N"], bucket["H"], bucket["D"], args.interpret)
        )
        bound = bind(target.problem, bucket["batch"])
        table = {params_key(row["params"]): row["us"] for row in bucket["table"]}
        if set(table) != {params_key(bound.to_params(config)) for config in bound.feasible()}:
            raise SystemExit(
                f"{bucket['case']}: the saved table does not match today's search space (the space changed "
                "since it was measured): measure again with --tables-only"
            )
        optimum = min(us for us in table.values() if us is not None)
        goal = WITHIN * optimum
        default = bound.config_type.from_dict(bucket["default"])
        row: dict[str, Any] = {
            "case": bucket["case"],
            "feasible": len(table),
            "failed": bucket["failures"],
            "exhaustive_seconds": bucket["seconds"],
            "optimum_us": optimum,
            "optimum_config": next(dict(k) for k, v in table.items() if v == optimum),
            "default_us": bucket["default_us"],
        }
        for method in ("tpe", "random"):
            reached, gaps = [], []
            for seed in range(args.seeds):
                trajectory = replay_search(
                    bucket["case"], bound, table, default, seed, method == "random", goal, args.budget
                )["trajectory"]
                reached.append(trials_to_reach(trajectory, goal))
                gaps.append(trajectory[min(args.budget, len(trajectory)) - 1] / optimum - 1.0)
            counts = [r if r is not None else len(table) for r in reached]
            row[method] = {
                "trials_to_3pct": reached,
                "median_trials": statistics.median(counts),
                "worst_trials": max(counts),
                "median_share": statistics.median(counts) / len(table),
                "median_gap_at_budget": statistics.median(gaps),
                "worst_gap_at_budget": max(gaps),
            }
        results.append(row)
        write_report(tables, args, results)
        print(f"{row['case']}: {len(table)} configs, optimum {optimum:.2f} µs; TPE reaches 3% in "
              f"{row['tpe']['median_trials']} trials (median), random in {row['random']['median_trials']}",
              flush=True)  # fmt: skip
    return results


def tables_from_probes(paths: list[Path]) -> dict[str, Any]:
    """Truth tables from `probe_combine.py --space` runs of one module each: per (spec, N, B, H, D) they all
    timed, each config's geometric mean over the runs (a rotated run and a `--resident` one: the ranking of
    a kernel declared with `resident_timing`).  No GPU needed."""
    from probe_combine import config_name

    from layoutgen.tuning.plan import make_targets
    from layoutgen.tuning.space import bind

    runs = []
    for path in paths:
        try:
            probe = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise SystemExit(f"--from-probes {path}: cannot read the probe: {error}") from None
        if not probe.get("space") or len(probe.get("modules", {})) != 1:
            raise SystemExit(f"--from-probes {path}: not a `probe_combine.py --space` run of one module")
        (label,) = probe["modules"]
        runs.append((probe, {(r["spec"], r["N"], r["B"], r["H"], r["D"]): r[label] for r in probe["rows"]}))
    buckets = []
    for key in sorted(set.intersection(*(set(times) for _, times in runs))):
        spec, N, B, H, D = key
        (target,) = make_targets(case_options(spec, "combine", N, H, D, False))
        bound = bind(target.problem, B)
        table = []
        for config in bound.feasible():
            per_run = [timed[key].get(config_name(config)) for _, timed in runs]
            us = statistics.geometric_mean(per_run) if None not in per_run else None
            table.append({"params": bound.to_params(config), "us": us})
        default_us = statistics.geometric_mean([timed[key]["default"] for _, timed in runs])
        states = " and ".join("L2-resident" if probe.get("resident") else "rotated" for probe, _ in runs)
        buckets.append({
            "case": f"{spec} combine N={N} H/N={H // N} D={D} bfloat16 B={B} (geomean of {states})",
            "spec": spec, "kernel": "combine", "N": N, "H": H, "D": D, "batch": B, "seconds": 0.0, "failures": {},
            "default": target.default_config(B).as_dict(), "default_us": default_us, "table": table,
        })  # fmt: skip
    first = runs[0][0]
    meta = {"device": first["device"], "compute_capability": "", "versions": {"torch": first["torch"]},
            "date": first["date"][:10], "copy_tbps": None, "timer": "CUDA-graph replays", "interpret": False}  # fmt: skip
    return {"meta": meta, "buckets": buckets, "complete": True}


def write_report(tables: dict[str, Any], args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    """JSON and markdown of the buckets replayed so far."""
    report = {
        **{key: value for key, value in tables["meta"].items() if key != "interpret"},
        "seeds": args.seeds,
        "budget": args.budget,
        "within": WITHIN,
        "target_share": TARGET_SHARE,
        "cases": results,
        "complete": bool(tables["complete"]) and len(results) == len(tables["buckets"]),
    }
    stem = tables_stem(tables["meta"], bool(tables["meta"].get("interpret")), "tuner_quality")
    write_json(args.out / f"{stem}.json", report)
    (args.out / f"{stem}.md").write_text(markdown(report), encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--seeds", type=int, default=10, help="sampler seeds per bucket")
    parser.add_argument("--budget", type=int, default=24, help="the tuner's TPE trial budget to report the gap at")
    parser.add_argument("--interpret", action="store_true", help="CPU smoke test under the Triton interpreter")
    phase = parser.add_mutually_exclusive_group()
    phase.add_argument("--tables-only", action="store_true", help="measure the truth tables, skip the replay")
    phase.add_argument("--replay", type=Path, metavar="TABLES_JSON", help="replay saved tables (no GPU needed)")
    phase.add_argument(
        "--from-probes",
        type=Path,
        nargs="+",
        metavar="PROBE_JSON",
        help="build the tables from probe_combine.py --space runs (geomean over them), save and replay them",
    )
    args = parser.parse_args()
    if args.from_probes:
        tables = tables_from_probes(args.from_probes)
        args.out.mkdir(parents=True, exist_ok=True)
        write_json(args.out / "tuner_quality_tables_probes.json", tables)
        args.replay = args.out / "tuner_quality_tables_probes.json"
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    if args.replay is not None:
        try:
            tables = json.loads(args.replay.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise SystemExit(f"--replay {args.replay}: cannot read the tables: {error}") from None
        args.interpret = bool(tables["meta"].get("interpret"))
    else:
        tables = measure_tables(args)
        if args.tables_only:
            return 0 if tables["complete"] else 130
    results = replay_tables(tables, args)
    missed = [row["case"] for row in results if row["tpe"]["median_share"] > TARGET_SHARE]
    print("target met in every bucket" if not missed else f"target missed in: {', '.join(missed)}")
    return 0


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Tuner quality: exhaustive optimum vs TPE ({report['device']})",
        "",
        f"{report['date']}; {', '.join(f'{k} {v}' for k, v in report['versions'].items())}; timing: "
        f"{report['timer']} (median per call, inputs rotated while they fit in 2x L2).",
        "",
        "Every feasible config of the declared space was measured once (the truth table); the tuner's search "
        "(multivariate TPE with the constant liar, 3 trials in flight, the heuristic default first, no "
        "neighbouring-bucket seeds) was then replayed against it for "
        f'{report["seeds"]} sampler seeds, and random search for scale.  "Trials to 3%": measured trials '
        f"until the best found is within 3% of the exhaustive optimum; target <= {report['target_share']:.0%} "
        f"of the exhaustive count (a replay stops at {MAX_REPLAY_SHARE:.0%} of it: one that has not come within "
        '3% by then counts as the whole count).  "Gap at budget": how far the best is from the optimum after '
        f"{report['budget']} measured trials (the tuner's default budget).",
        "",
        "| bucket | feasible | optimum µs | default µs | TPE trials to 3% (median / worst) | share | "
        "TPE gap at budget (median / worst) | random trials to 3% (median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["cases"]:
        tpe, rnd = row["tpe"], row["random"]
        lines.append(
            f"| {row['case']} | {row['feasible']} | {row['optimum_us']:.2f} | {row['default_us']:.2f} | "
            f"{tpe['median_trials']:g} / {tpe['worst_trials']} | {tpe['median_share']:.1%} | "
            f"{tpe['median_gap_at_budget']:.1%} / {tpe['worst_gap_at_budget']:.1%} | {rnd['median_trials']:g} |"
        )
    if not report["complete"]:
        lines += ["", f"Partial run: the {len(report['cases'])} bucket(s) above were measured before it was cut."]
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
