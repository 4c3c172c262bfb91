"""Reading a run's studies back: result rows for the tables, and tuning-database entries for every
decided study."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from layoutgen.tuning.claims import EVALUATED
from layoutgen.tuning.plan import TuneOptions, expected, run_study_name
from layoutgen.tuning.report import ResultRow


def study_state(storage: Any, name: str) -> tuple[dict[str, Any], dict[str, Any] | None, int, float | None]:
    """(meta, final decision or None, evaluated trials, best measured µs) of one study."""
    study_id = storage.get_study_id_from_name(name)
    attrs = storage.get_study_user_attrs(study_id)
    trials = storage.get_all_trials(study_id, deepcopy=False)
    results = [t.user_attrs.get("result") or {} for t in trials]
    evaluated = sum(1 for r in results if r.get("outcome") in EVALUATED)
    # A worker records a trial's result before it tells optuna the value: skip those not told yet.
    measured = (t.value for t, r in zip(trials, results, strict=True) if r.get("outcome") == "measured")
    best = min((value for value in measured if value is not None), default=None)
    return attrs["layoutgen"], attrs.get("final"), evaluated, best


def collect(
    storage: Any,
    names: list[str],
    targets: list[Any],
    options: TuneOptions,
    device_name: str,
    buckets_of: Callable[[Any], list[int]],
) -> tuple[list[ResultRow], list[Any]]:
    """Result rows for every study in `names` and database entries for every decided one."""
    from layoutgen.tuning_db import TuningEntry

    wanted = set(names)
    rows, entries = [], []
    for target in targets:
        current = expected(target)
        for bucket in buckets_of(target):
            name = run_study_name(options, device_name, target, bucket)
            if name not in wanted:
                continue
            meta, final, evaluated, _ = study_state(storage, name)
            rows.append(ResultRow.from_study(meta, final, evaluated))
            if not final or not final.get("chosen"):
                continue
            entries.append(
                TuningEntry(
                    key=target.problem.key(bucket),
                    config=final["config"],
                    median_us=final["median_us"],
                    p20_us=final["p20_us"],
                    p80_us=final["p80_us"],
                    default_us=final["default_us"],
                    trials=final["trials"],
                    spec_hash=current.spec_hash,
                    source_hash=current.source_hash,
                    space_hash=current.space_hash,
                    timing_hash=final["timing_hash"],
                    versions=dict(current.versions),
                    measured_at=final["measured_at"],
                    rotating_sets=final["sets"],
                )
            )
    return rows, entries
