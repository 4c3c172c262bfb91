"""Preparing a study (one process, before any search): create or load it, record its search plan, fail
trials left RUNNING by a dead worker, and enqueue the seeds -- every feasible config of an exhaustive
study not yet measured, or for a TPE study the heuristic default and the config the tuning database
holds (a re-tune starts from the decision it may replace)."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import optuna
from optuna.trial import TrialState

from layoutgen.config import LaunchConfig
from layoutgen.tuning.claims import EVALUATED, fail_trial, is_stale, outcome_of, params_key, result_of
from layoutgen.tuning.objective import Target
from layoutgen.tuning.plan import SearchPlan, TuneOptions, run_study_name, sampler_seed, search_plan
from layoutgen.tuning.space import bind


def make_sampler(name: str, options: TuneOptions, budget: int) -> optuna.samplers.BaseSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            multivariate=True,
            constant_liar=True,
            n_startup_trials=max(1, min(8, budget // 3)),
            seed=sampler_seed(name, options.seed),
        )


def study_meta(target: Target, bucket: int, plan: SearchPlan, device_name: str) -> dict[str, Any]:
    p = target.problem
    return {
        "device": device_name,
        "family": p.spec.family,
        "spec": p.spec.name,
        "kernel": p.kernel,
        "extents": dict(p.extents),
        "dtype": p.dtype,
        "bucket_name": p.family.bucket.name,
        "bucket": bucket,
        "spec_hash": target.spec_hash,
        "source_hash": target.source_hash,
        "mode": plan.mode,
        "space_size": plan.space_size,
        "budget": plan.budget,
    }


def prepare_study(
    storage: Any,
    options: TuneOptions,
    device_name: str,
    target: Target,
    bucket: int,
    recorded: dict[str, int] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Create or load the study and make it ready to search; returns (name, meta).

    `recorded` is the config the tuning database holds for this study (see `plan.database_entries`): a TPE
    study measures it first, with the default, when that config is still a point of today's space.
    """
    name = run_study_name(options, device_name, target, bucket)
    plan = search_plan(target.problem, bucket, options)
    meta = study_meta(target, bucket, plan, device_name)
    study = optuna.create_study(storage=storage, study_name=name, direction="minimize", load_if_exists=True)
    if study.user_attrs.get("layoutgen") != meta:
        study.set_user_attr("layoutgen", meta)
    if options.retune and not study.user_attrs.get(RETUNE_OPEN):
        study.set_user_attr(RETUNE_OPEN, True)  # until this run ends: a re-run of it resumes this study
    trials = study.get_trials(deepcopy=False)
    for trial in trials:
        if is_stale(trial):
            fail_trial(study, trial.number, "interrupted", "its worker is gone", result_of(trial).get("config"))
    trials = study.get_trials(deepcopy=False)
    evaluated = {params_key(t.params) for t in trials if outcome_of(t) in EVALUATED}
    pending = {params_key(t.params) for t in trials if t.state == TrialState.RUNNING}
    waiting = {params_key(t.system_attrs.get("fixed_params", {})) for t in trials if t.state == TrialState.WAITING}
    if study.user_attrs.get("final") and len(evaluated) < plan.budget:
        study.set_user_attr("final", None)  # more trials were asked for than the final decision saw
    space = bind(target.problem, bucket)
    database: LaunchConfig | None = None
    if recorded is not None:
        with contextlib.suppress(TypeError, ValueError):  # a field today's config type no longer has
            database = space.config_type.from_dict(recorded)
    seeds: list[tuple[LaunchConfig, str]]
    if plan.mode == "exhaustive":
        # The database's config keeps its tag among the points: the decision re-times it with the finalists
        # and keeps it unless beaten past the noise, as in a TPE study.
        seeds = [(config, "database" if config == database else "exhaustive") for config in space.feasible()]
    else:
        seeds = []
        if not evaluated:  # a fresh study: a resumed one has had its seeds
            seeds.append((target.default_config(bucket), "default"))
            if database is not None:
                seeds.append((database, "database"))
    for config, source in seeds:
        if not space.is_feasible(config):
            continue
        params = space.to_params(config)
        key = params_key(params)
        if key not in evaluated and key not in pending and key not in waiting:
            study.enqueue_trial(params, user_attrs={"seed": source})
            waiting.add(key)
    return name, meta


#: A study's user attribute: True while a --retune that searched it has not ended (interrupted, or still running).
RETUNE_OPEN = "retune_open"


def retune_study(storage: Any, name: str, decided: bool) -> str:
    """The study a --retune searches for the study `name`: where a decision exists (`decided`: the database
    holds a current one; or the study holds one), the first of `name|retune 1`, `name|retune 2`, ... that holds
    no decision or was searched by a --retune that has not ended (`RETUNE_OPEN`), so that an interrupted
    --retune run again resumes its studies, decided ones included, and a later one starts another, while
    `name` stays as it is for any worker searching it or reading its decision (Optuna cannot forget a study's
    trials, and deleting the study would pull it from under them).  `name` itself where nothing is decided yet,
    or where an unended --retune searched it."""

    def taken(study: str) -> bool:
        found = _study_attrs(storage, study) or {}
        return bool(found.get("final")) and not found.get(RETUNE_OPEN)

    own = _study_attrs(storage, name) or {}
    if (not decided and not own.get("final")) or own.get(RETUNE_OPEN):
        return name
    generation = 1
    while taken(f"{name}|retune {generation}"):
        generation += 1
    return f"{name}|retune {generation}"


def latest_decided_study(storage: Any, name: str) -> str:
    """The newest of `name`, `name|retune 1`, ... that holds a decision (`name` where none does): what a run
    without --retune reads and resumes, so that it records a re-tune's decision, not the one that re-tune replaced."""
    latest, generation = name, 1
    while (attrs := _study_attrs(storage, f"{name}|retune {generation}")) is not None:
        if attrs.get("final"):
            latest = f"{name}|retune {generation}"
        generation += 1
    return latest


def _study_attrs(storage: Any, study: str) -> dict[str, Any] | None:
    """A study's user attributes, None where the storage holds no such study."""
    try:
        return dict(storage.get_study_user_attrs(storage.get_study_id_from_name(study)))
    except KeyError:
        return None


def end_retune(storage: Any, names: list[str]) -> None:
    """A --retune over the studies `names` ended: the next --retune starts fresh studies for them."""
    for name in names:
        storage.set_study_user_attr(storage.get_study_id_from_name(name), RETUNE_OPEN, False)
