"""Optuna studies: one per (device, spec, kernel, N, H/N, D, dtype, batch bucket).

A run has three phases.

* `prepare` (one process): create or load every study (deterministic names, `load_if_exists`), record
  its search plan, fail trials left RUNNING by a dead worker (they do not count), and enqueue the seeds:
  every feasible config of an exhaustive study not yet measured, or for a TPE study the heuristic default
  and the config the tuning database holds (a re-tune starts from the decision it may replace).
* `search_family` (each worker process): the studies of one compiled family (spec, kernel, N, H/N, D,
  dtype) advance together, because they share compiled kernels: batch is a run-time argument.  Each
  study keeps a few trials in flight whose configs compile ahead on a process pool while the GPU times
  others; a new best is enqueued into the neighbouring buckets' studies.  TPE is multivariate with the
  constant liar (in-flight trials count as bad), so parallel trials spread out.  A config already
  measured in the study is not re-timed: the trial copies the stored value.  Trials are claimed in
  storage, so workers sharing a study (`--workers`, PostgreSQL) do not time the same config twice.
* `finalize`: the few fastest configs of the search (FINALISTS, and the database's config) and the
  heuristic default are re-timed together, interleaved; the fastest of them is kept only when it beats
  the default by more than the noise, else the default stays (and why is recorded).  The decision is
  stored on the study; `run` turns decisions into tuning-database entries.

Trial outcomes (user attribute `result["outcome"]`): measured, compile_failed, launch_failed,
gate_failed (these are "evaluated" and count toward the budget), repeat (a copy of an evaluated twin),
infeasible (pruned before any compile), surplus (another worker claimed the last of the budget first),
interrupted (Ctrl-C or a dead worker; the config is tried again on the next run).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from layoutgen.config import KernelConfig
from layoutgen.tuning.compile import CompileError, CompilePool
from layoutgen.tuning.objective import Measurement, Target, Workload, evaluate
from layoutgen.tuning.plan import SearchPlan, TuneOptions, sampler_seed, search_plan, study_name
from layoutgen.tuning.space import BoundSpace, bind
from layoutgen.tuning.timing import TIMING_RULES, Timing

EVALUATED = ("measured", "compile_failed", "launch_failed", "gate_failed")
#: A RUNNING trial of another host whose claim is this old belongs to a dead worker.
STALE_AFTER_S = 900.0
#: A worker claims a trial right after asking for it (milliseconds, even on a remote PostgreSQL); one
#: still unclaimed after this long was asked by a worker interrupted in between (Ctrl-C), so a re-run
#: need not wait a minute to take it over.
UNCLAIMED_STALE_AFTER_S = 10.0
#: Minimum gain over the default, as a fraction, for a winner to be written (timing noise floor).
NOISE_FLOOR = 0.02
#: The fastest configs of the search re-timed together with the default (and the database's config), and
#: the fastest of that re-timing kept.  One search sample can be off as a whole: on the H200 the first
#: family of a run (its trials waiting on compiles, the GPU idling in between) timed 10-19% faster in the
#: search than in its final re-timing, every later family within 1%; ranking by the search alone kept a
#: config 1.35 µs where the database's 1.22 µs one had run in the same study (pynccl_a2a pack N 2 B 1).
FINALISTS = 3
#: A candidate slower than this multiple of the study's best stops timing after MIN_REPEATS samples.
GIVE_UP_FACTOR = 1.5
#: A first launch this slow compiled the kernel instead of loading it from Triton's cache.
SLOW_FIRST_LAUNCH_S = 0.25
#: Asks per study that produced nothing new (infeasible points, repeats) before the search gives up.
MAX_IDLE_ASKS = 64


class Reporter(Protocol):
    def update(self, name: str, label: str, evaluated: int, budget: int, best_us: float | None, done: bool) -> None: ...

    def error(self, message: str) -> None: ...

    def info(self, message: str) -> None: ...


class QuietReporter:
    def update(self, name: str, label: str, evaluated: int, budget: int, best_us: float | None, done: bool) -> None:
        return None

    def error(self, message: str) -> None:
        import sys

        print(f"error: {message}", file=sys.stderr, flush=True)

    def info(self, message: str) -> None:
        return None


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _result(trial: FrozenTrial) -> dict[str, Any]:
    return dict(trial.user_attrs.get("result") or {})


def _outcome(trial: FrozenTrial) -> str | None:
    return _result(trial).get("outcome")


def _claim_order(trial: FrozenTrial) -> tuple[float, int]:
    """Claims order trials that compete for one config or the last of a budget: first claimed wins."""
    claim = trial.user_attrs.get("claim")
    return (float(claim["at"]), trial.number) if claim else (float("inf"), trial.number)


def params_key(params: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((name, int(value)) for name, value in params.items()))


def make_sampler(name: str, options: TuneOptions, budget: int) -> optuna.samplers.BaseSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            multivariate=True,
            constant_liar=True,
            n_startup_trials=max(1, min(8, budget // 3)),
            seed=sampler_seed(name, options.seed),
        )


# ---------------------------------------------------------------------------------------------------
# Run context
# ---------------------------------------------------------------------------------------------------
@dataclass
class Context:
    """What every study of one worker process shares."""

    options: TuneOptions
    storage: Any
    device: Any  # torch.device
    device_name: str
    compute_capability: str
    timer: Any
    pool: CompilePool
    l2_bytes: int
    copy_tbps: float | None
    reporter: Reporter
    worker: str = field(default_factory=worker_id)
    gate_failures: int = 0
    #: Kernel variants launched here for the first time, and how many of those took long enough to have
    #: been compiled in this process (the compile pool missed them: a diagnostic for the pool).
    variants_seen: set[tuple[Any, ...]] = field(default_factory=set)
    slow_first_launches: int = 0
    #: Where the evaluated trials' wall time went (seconds): compile wait, gate, timing; and their count.
    phase_seconds: dict[str, float] = field(
        default_factory=lambda: {"compile wait": 0.0, "gate and first launch": 0.0, "timing": 0.0}
    )
    trials_evaluated: int = 0


# ---------------------------------------------------------------------------------------------------
# Prepare: studies, plans, stale trials, seeds
# ---------------------------------------------------------------------------------------------------
def study_meta(target: Target, batch: int, plan: SearchPlan, device_name: str) -> dict[str, Any]:
    p = target.problem
    return {
        "device": device_name,
        "spec": p.spec.name,
        "kernel": p.kernel,
        "N": p.N,
        "heads_per_peer": p.heads_per_peer,
        "D": p.D,
        "dtype": p.dtype,
        "batch": batch,
        "spec_hash": target.spec_hash,
        "source_hash": target.source_hash,
        "mode": plan.mode,
        "space_size": plan.space_size,
        "budget": plan.budget,
    }


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(trial: FrozenTrial, now: float | None = None) -> bool:
    """A RUNNING trial whose worker is gone: a dead process on this host, or a claim older than
    STALE_AFTER_S (another host), or never claimed for UNCLAIMED_STALE_AFTER_S."""
    if trial.state != TrialState.RUNNING:
        return False
    now = time.time() if now is None else now
    claim = trial.user_attrs.get("claim")
    if not claim:
        started = trial.datetime_start.timestamp() if trial.datetime_start else now
        return now - started > UNCLAIMED_STALE_AFTER_S
    host, _, pid = str(claim.get("worker", "")).rpartition(":")
    if host == socket.gethostname() and pid.isdigit():
        return int(pid) != os.getpid() and not _pid_alive(int(pid))
    return now - float(claim.get("at", now)) > STALE_AFTER_S


def trial_handle(study: optuna.Study, number: int) -> optuna.Trial:
    """A writable handle on trial `number`, which another process (or an earlier run) may have asked.
    Optuna has no public lookup by number; its storage API does (via the study's storage and id)."""
    storage = study._storage
    return optuna.Trial(study, storage.get_trial_id_from_study_id_trial_number(study._study_id, number))


def fail_trial(study: optuna.Study, number: int, outcome: str, reason: str, config: dict[str, int] | None) -> None:
    handle = trial_handle(study, number)
    handle.set_user_attr("result", {"outcome": outcome, "reason": reason, "config": config})
    study.tell(handle, state=TrialState.FAIL, skip_if_finished=True)


def prepare_study(
    storage: Any,
    options: TuneOptions,
    device_name: str,
    target: Target,
    batch: int,
    recorded: dict[str, int] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Create or load the study and make it ready to search; returns (name, meta).

    `recorded` is the config the tuning database holds for this study (see `plan.database_entries`): a TPE
    study measures it first, with the default, when that config is still a point of today's space.
    """
    name = study_name(device_name, target, batch)
    plan = search_plan(target.problem, batch, options)
    meta = study_meta(target, batch, plan, device_name)
    study = optuna.create_study(storage=storage, study_name=name, direction="minimize", load_if_exists=True)
    if study.user_attrs.get("layoutgen") != meta:
        study.set_user_attr("layoutgen", meta)
    trials = study.get_trials(deepcopy=False)
    for trial in trials:
        if is_stale(trial):
            fail_trial(study, trial.number, "interrupted", "its worker is gone", _result(trial).get("config"))
    trials = study.get_trials(deepcopy=False)
    evaluated = {params_key(t.params) for t in trials if _outcome(t) in EVALUATED}
    pending = {params_key(t.params) for t in trials if t.state == TrialState.RUNNING}
    waiting = {params_key(t.system_attrs.get("fixed_params", {})) for t in trials if t.state == TrialState.WAITING}
    if study.user_attrs.get("final") and len(evaluated) < plan.budget:
        study.set_user_attr("final", None)  # more trials were asked for than the final decision saw
    space = bind(target.problem, batch)
    seeds: list[tuple[KernelConfig, str]]
    if plan.mode == "exhaustive":
        seeds = [(config, "exhaustive") for config in space.feasible()]
    else:
        seeds = []
        if not evaluated:  # a fresh study: a resumed one has had its seeds
            seeds.append((target.default_config(batch), "default"))
            if recorded is not None:
                with contextlib.suppress(TypeError, ValueError):  # a field today's config type no longer has
                    seeds.append((space.config_type.from_dict(recorded), "database"))
    for config, source in seeds:
        if not space.is_feasible(config):
            continue
        params = space.to_params(config)
        key = params_key(params)
        if key not in evaluated and key not in pending and key not in waiting:
            study.enqueue_trial(params, user_attrs={"seed": source})
            waiting.add(key)
    return name, meta


# ---------------------------------------------------------------------------------------------------
# Search
# ---------------------------------------------------------------------------------------------------
@dataclass
class Pending:
    """A claimed trial whose config is compiling or waiting for the GPU."""

    search: BucketSearch
    trial: optuna.Trial
    config: KernelConfig
    compiled: Future[CompileError | None] | None

    def ready(self) -> bool:
        return self.compiled is None or self.compiled.done()


@dataclass
class Deferred:
    """A claimed trial whose config an earlier-claimed twin is measuring."""

    trial: optuna.Trial
    config: KernelConfig
    claim: dict[str, Any]
    twin: int


class BucketSearch:
    """The search of one study inside a worker."""

    def __init__(self, ctx: Context, target: Target, batch: int, deadline: float | None) -> None:
        self.ctx = ctx
        self.target = target
        self.batch = batch
        self.deadline = deadline
        self.name = study_name(ctx.device_name, target, batch)
        self.study = optuna.load_study(study_name=self.name, storage=ctx.storage)
        self.meta: dict[str, Any] = self.study.user_attrs["layoutgen"]
        self.study.sampler = make_sampler(self.name, ctx.options, self.meta["budget"])
        self.space: BoundSpace = bind(target.problem, batch)
        self.ranges = self.space.param_ranges()
        self.inflight: dict[int, Pending] = {}
        self.deferred: dict[int, Deferred] = {}
        self.idle_asks = 0
        #: Whether the last ask used no budget (an infeasible point or a repeat of an evaluated config).
        self.last_ask_idle = False
        self._workload: Workload | None = None
        trials = self.trials()
        measured = [t for t in trials if _outcome(t) == "measured" and t.value is not None]
        self.best_us: float | None = min((t.value for t in measured), default=None)  # type: ignore[type-var]
        self.evaluated_count = self.evaluated(trials)  # for progress; exact counts come from storage
        self.label = f"{target.problem.label} B={batch}"

    # -- state -----------------------------------------------------------------------------------
    def trials(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    @property
    def exhaustive(self) -> bool:
        return bool(self.meta["mode"] == "exhaustive")

    @property
    def budget(self) -> int:
        return int(self.meta["budget"])

    def evaluated(self, trials: list[FrozenTrial] | None = None) -> int:
        return sum(1 for t in (trials if trials is not None else self.trials()) if _outcome(t) in EVALUATED)

    def is_final(self) -> bool:
        return bool(self.study.user_attrs.get("final"))

    def room(self, trials: list[FrozenTrial]) -> int:
        """How many more trials may be asked now: the enqueued configs of an exhaustive study, the budget
        left after evaluated and running trials (any worker's) of a TPE study."""
        if self.idle_asks >= MAX_IDLE_ASKS or (self.deadline is not None and time.monotonic() > self.deadline):
            return 0
        if self.exhaustive:
            return sum(1 for t in trials if t.state == TrialState.WAITING)
        running = sum(1 for t in trials if t.state == TrialState.RUNNING)
        return max(0, self.budget - self.evaluated(trials) - running)

    def can_ask(self, trials: list[FrozenTrial]) -> bool:
        return self.room(trials) > 0

    def searching(self) -> bool:
        return bool(self.inflight or self.deferred)

    def workload(self) -> Workload:
        if self._workload is None:
            self._workload = Workload(self.target, self.batch, self.ctx.device, self.ctx.l2_bytes)
        return self._workload

    def release(self) -> None:
        self._workload = None

    def report(self, done: bool = False) -> None:
        self.ctx.reporter.update(self.name, self.label, self.evaluated_count, self.budget, self.best_us, done)

    # -- asking ----------------------------------------------------------------------------------
    def ask(self) -> Pending | None:
        """Ask for a trial; returns it when this worker should measure it (None: it was infeasible, a
        repeat, or deferred to a twin)."""
        trial = self.study.ask()
        params = {name: trial.suggest_int(name, low, high) for name, (low, high) in self.ranges.items()}
        try:
            config = self.space.from_params(params)
            problems = self.space.violations(config)
        except (TypeError, ValueError) as error:
            config, problems = None, [str(error)]
        self.last_ask_idle = False
        if config is None or problems:
            self.idle_asks += 1
            self.last_ask_idle = True
            trial.set_user_attr("result", {"outcome": "infeasible", "reason": "; ".join(problems)})
            self.study.tell(trial, state=TrialState.PRUNED)
            return None
        claim = {"worker": self.ctx.worker, "at": time.time()}
        trial.set_user_attr("claim", claim)
        return self.route(trial, config, claim)

    def route(self, trial: optuna.Trial, config: KernelConfig, claim: dict[str, Any]) -> Pending | None:
        """Measure `trial` here, unless a twin (same config) was evaluated or claimed first."""
        key = params_key(trial.params)
        mine = (float(claim["at"]), trial.number)
        trials = self.trials()
        others = [t for t in trials if t.number != trial.number]
        twins = [t for t in others if params_key(t.params) == key]
        for twin in twins:
            if _outcome(twin) in EVALUATED:
                self.idle_asks += 1
                self.last_ask_idle = True
                self.copy_from(trial, twin)
                return None
        claimed_before = [t for t in others if t.state == TrialState.RUNNING and _claim_order(t) < mine]
        earlier = [t for t in claimed_before if t in twins]
        if earlier:
            self.deferred[trial.number] = Deferred(trial, config, claim, earlier[0].number)
            return None
        if not self.exhaustive and self.evaluated(trials) + len(claimed_before) >= self.budget:
            # Another worker claimed the last of the budget first (both asked from the same snapshot).
            trial.set_user_attr("result", {"outcome": "surplus", "config": config.as_dict()})
            self.study.tell(trial, state=TrialState.FAIL)
            return None
        self.idle_asks = 0
        pending = Pending(self, trial, config, self.ctx.pool.submit(self.workload().compile_job(config)))
        self.inflight[trial.number] = pending
        return pending

    def copy_from(self, trial: optuna.Trial, twin: FrozenTrial) -> None:
        """Finish `trial` as a repeat of its evaluated twin: same value, nothing re-timed."""
        result = _result(twin)
        trial.set_user_attr("result", {**result, "outcome": "repeat", "repeat_of": twin.number})
        if twin.state == TrialState.COMPLETE and twin.value is not None:
            self.study.tell(trial, twin.value)
        else:
            self.study.tell(trial, state=TrialState.FAIL)

    def poll_deferred(self) -> list[Pending]:
        """Resolve deferred trials whose twin finished; returns those this worker must now measure."""
        if not self.deferred:
            return []
        by_number = {t.number: t for t in self.trials()}
        now = time.time()
        to_measure = []
        for number, deferred in list(self.deferred.items()):
            twin = by_number[deferred.twin]
            if _outcome(twin) in EVALUATED:
                del self.deferred[number]
                self.copy_from(deferred.trial, twin)
            elif twin.state.is_finished() or is_stale(twin, now):
                if not twin.state.is_finished():
                    fail_trial(
                        self.study, twin.number, "interrupted", "its worker is gone", _result(twin).get("config")
                    )
                del self.deferred[number]
                pending = self.route(deferred.trial, deferred.config, deferred.claim)
                if pending is not None:
                    to_measure.append(pending)
        return to_measure

    def offer(self, config: KernelConfig, source: str) -> None:
        """Enqueue a neighbouring bucket's best, unless this study has tried it or cannot take it."""
        if self.exhaustive or not self.space.is_feasible(config):
            return
        trials = self.trials()
        if not self.can_ask(trials):
            return
        key = params_key(self.space.to_params(config))
        for trial in trials:
            params = trial.params if trial.state != TrialState.WAITING else trial.system_attrs.get("fixed_params", {})
            if params_key(params) == key:
                return
        self.study.enqueue_trial(self.space.to_params(config), user_attrs={"seed": source})

    # -- recording -------------------------------------------------------------------------------
    def record(self, pending: Pending, measurement: Measurement) -> bool:
        """Store a measurement; returns True when it is the study's new best."""
        del self.inflight[pending.trial.number]
        result: dict[str, Any] = {
            "outcome": "measured" if measurement.status == "ok" else measurement.status,
            "config": pending.config.as_dict(),
            "worker": self.ctx.worker,
        }
        timing = measurement.timing
        if timing is not None:
            result.update(
                median_us=timing.median_us,
                p20_us=timing.p20_us,
                p80_us=timing.p80_us,
                samples=timing.samples,
                calls=timing.calls,
                sets=self.workload().sets,
                stopped_early=timing.stopped_early,
            )
        if measurement.reason:
            result["reason"] = measurement.reason
        pending.trial.set_user_attr("result", result)
        self.evaluated_count += 1
        if measurement.status == "gate_failed":
            self.ctx.gate_failures += 1
            self.ctx.reporter.error(
                f"BUG: {self.label}: config {pending.config} fails the correctness gate: {measurement.reason}"
            )
        improved = False
        if timing is not None:
            self.study.tell(pending.trial, timing.median_us)
            improved = self.best_us is None or timing.median_us < self.best_us
            if improved:
                self.best_us = timing.median_us
        else:
            self.study.tell(pending.trial, state=TrialState.FAIL)
        waiting = [number for number, deferred in self.deferred.items() if deferred.twin == pending.trial.number]
        if waiting:
            told = next(t for t in self.trials() if t.number == pending.trial.number)
            for number in waiting:
                self.copy_from(self.deferred.pop(number).trial, told)
        return improved

    def abandon(self, reason: str) -> None:
        """Fail every trial this worker holds (Ctrl-C, a machine error): the next run tries them again."""
        for number, item in list(self.inflight.items()) + list(self.deferred.items()):
            # The storage may be what failed; the next run's prepare then cleans up.
            with contextlib.suppress(Exception):
                fail_trial(self.study, number, "interrupted", reason, item.config.as_dict())
        self.inflight.clear()
        self.deferred.clear()

    # -- finalize --------------------------------------------------------------------------------
    def finalizable(self) -> bool:
        trials = self.trials()
        # A neighbour's offer may still wait in a TPE study whose budget is spent: it does not hold up the end.
        return (
            not self.searching()
            and not self.can_ask(trials)
            and not any(t.state == TrialState.RUNNING for t in trials)
            and not self.is_final()
        )

    def finalize(self) -> dict[str, Any]:
        """Re-time the finalists and the default together; decide what the database gets."""
        trials = self.trials()
        measured = [t for t in trials if _outcome(t) == "measured" and t.value is not None]
        workload = self.workload()
        default = self.target.default_config(self.batch)
        final: dict[str, Any] = {
            "trials": self.evaluated(trials),
            "default_config": default.as_dict(),
            "bytes_moved": workload.bytes_moved,
            "sets": workload.sets,
            "timing_rule": TIMING_RULES[self.target.problem.kernel],
            "copy_tbps": self.ctx.copy_tbps,
            "timer": self.ctx.timer.description,
            "measured_at": _utc_now(),
            "failed": sum(1 for t in trials if _outcome(t) in ("compile_failed", "launch_failed")),
            "gate_failed": sum(1 for t in trials if _outcome(t) == "gate_failed"),
        }
        default_problem = self._default_problem(trials, workload, default)
        finalists = self._finalists(measured, default)
        incumbent = self._database_config(measured, default)
        timer, sets, estimate = self.ctx.timer, workload.sets, workload.estimated_us
        if default_problem is not None:
            if not finalists:
                final.update(chosen=None, reason=f"no config ran: the default {default} failed: {default_problem}")
            else:
                # The database must not leave dispatch on a default that cannot run; default_us 0 says so.
                timings = timer.time_interleaved([workload.timing_launch(c) for c in finalists], sets, estimate)
                best_config, tuned = _fastest(finalists, timings, incumbent, final)
                final.update(chosen="tuned", config=best_config.as_dict(), tuned_us=tuned.median_us, default_us=0.0,
                             reason=f"the default config cannot run ({default_problem})", **_timing_fields(tuned))  # fmt: skip
        elif not finalists:
            (default_timing,) = timer.time_interleaved([workload.timing_launch(default)], sets, estimate)
            final.update(
                chosen="default",
                config=default.as_dict(),
                reason="no candidate passed" if not measured else "the default is the best config found",
                default_us=default_timing.median_us,
                **_timing_fields(default_timing),
            )
        else:
            *timings, default_timing = timer.time_interleaved(
                [workload.timing_launch(c) for c in (*finalists, default)], sets, estimate
            )
            final["finalists"] = [
                {"config": c.as_dict(), "median_us": t.median_us} for c, t in zip(finalists, timings, strict=True)
            ]
            best_config, tuned = _fastest(finalists, timings, incumbent, final)
            gain, noise = _margin(tuned, default_timing)
            final.update(tuned_config=best_config.as_dict(), tuned_us=tuned.median_us,
                         default_us=default_timing.median_us, gain=gain, noise=noise)  # fmt: skip
            if gain > noise:
                final.update(chosen="tuned", config=best_config.as_dict(), reason=f"{gain:.1%} faster (noise {noise:.1%})",
                             **_timing_fields(tuned))  # fmt: skip
            else:
                final.update(
                    chosen="default",
                    config=default.as_dict(),
                    reason=f"best config {gain:+.1%} vs the default is within the noise ({noise:.1%})",
                    **_timing_fields(default_timing),
                )
        self._store_final(final)
        return final

    def _database_config(self, measured: list[FrozenTrial], default: KernelConfig) -> KernelConfig | None:
        """The config the database held for this study, if it ran here and is not the default."""
        for trial in measured:
            if trial.user_attrs.get("seed") == "database":
                config = self.space.config_type.from_dict(_result(trial)["config"])
                return config if config != default else None
        return None

    def _finalists(self, measured: list[FrozenTrial], default: KernelConfig) -> list[KernelConfig]:
        """The FINALISTS fastest configs of the search and the database's config if it ran, the default
        left out (it is re-timed on its own side)."""
        ranked = sorted(measured, key=lambda t: float(t.value))  # type: ignore[arg-type]
        chosen = [t for t in ranked if t.user_attrs.get("seed") != "database"][:FINALISTS]
        chosen += [t for t in ranked if t.user_attrs.get("seed") == "database"][:1]
        finalists: list[KernelConfig] = []
        for trial in chosen:
            config = self.space.config_type.from_dict(_result(trial)["config"])
            if config != default and config not in finalists:
                finalists.append(config)
        return finalists

    def _default_problem(self, trials: list[FrozenTrial], workload: Workload, default: KernelConfig) -> str | None:
        """Why the default config cannot be used (None when it ran and passed the gate).  The study's own
        trial decides when it measured the default; otherwise the default is gated here."""
        if self.space.is_feasible(default):
            key = params_key(self.space.to_params(default))
            for trial in trials:
                if params_key(trial.params) == key and _outcome(trial) in EVALUATED:
                    return None if _outcome(trial) == "measured" else str(_result(trial).get("reason"))
        seed = sampler_seed(self.name, self.ctx.options.seed) + 10**6
        measurement = evaluate(workload, default, None, _NoTiming(), seed)
        if measurement.status == "gate_failed":
            self.ctx.gate_failures += 1
            self.ctx.reporter.error(
                f"BUG: {self.label}: the default config {default} fails the correctness gate: {measurement.reason}"
            )
        return None if measurement.status == "ok" else measurement.reason

    def _store_final(self, final: dict[str, Any]) -> None:
        self.study.set_user_attr("final", final)
        self.report(done=True)


class _NoTiming:
    """A timer for gate-only evaluations."""

    description = "none"

    def time(
        self, launch: Callable[[int], None], sets: int, estimated_us: float, give_up_us: float | None = None
    ) -> Timing:
        return Timing(0.0, 0.0, 0.0, 0, 0)


def _fastest(
    finalists: list[KernelConfig], timings: list[Timing], incumbent: KernelConfig | None, final: dict[str, Any]
) -> tuple[KernelConfig, Timing]:
    """The fastest finalist of the re-timing, except that the database's config stays unless the fastest
    beats it by more than the noise: a re-tune does not churn the database over a tie (on the H200 two
    configs that tied at 1.44 µs in the tuner took 1.42 and 1.49 µs in the benchmark)."""
    best_config, best = min(zip(finalists, timings, strict=True), key=lambda pair: pair[1].median_us)
    if incumbent is None or best_config == incumbent or incumbent not in finalists:
        return best_config, best
    held = timings[finalists.index(incumbent)]
    margin, noise = _margin(best, held)
    if margin > noise:
        return best_config, best
    final["database_config_kept"] = f"the fastest finalist was {margin:.1%} faster, within the noise ({noise:.1%})"
    return incumbent, held


def _margin(faster: Timing, slower: Timing) -> tuple[float, float]:
    """How much faster `faster` ran than `slower` (a fraction), and the noise a margin must exceed to count:
    NOISE_FLOOR or either timing's own spread, whichever is larger."""
    return 1.0 - faster.median_us / slower.median_us, max(NOISE_FLOOR, faster.spread, slower.spread)


def _timing_fields(timing: Timing) -> dict[str, float]:
    return {"median_us": timing.median_us, "p20_us": timing.p20_us, "p80_us": timing.p80_us}


def _utc_now() -> str:
    from layoutgen.tuning_db import utc_now

    return utc_now()


def search_family(ctx: Context, target: Target, buckets: list[int], deadline: float | None = None) -> None:
    """Advance every bucket study of one compiled family together, then finalize what is complete."""
    searches = [BucketSearch(ctx, target, batch, deadline) for batch in sorted(buckets)]
    active = [s for s in searches if not s.is_final()]
    for search in searches:
        if search.is_final():
            search.report(done=True)
    queue: list[Pending] = []
    lookahead = max(1, ctx.options.lookahead)

    def refill(search: BucketSearch) -> None:
        room = search.room(search.trials())
        while room > 0 and len(search.inflight) < lookahead and search.idle_asks < MAX_IDLE_ASKS:
            pending = search.ask()
            if pending is not None:
                queue.append(pending)
            # An exhaustive ask pops an enqueued config whatever becomes of it; a TPE ask uses the room
            # unless it was idle (infeasible, a repeat): measured here, deferred to a twin, or surplus.
            if search.exhaustive or not search.last_ask_idle:
                room -= 1

    try:
        for search in active:
            refill(search)
            search.report()
        while True:
            if not queue:
                # Idle: resolved twins and other workers' results may have reopened room in a budget.
                for search in active:
                    queue.extend(search.poll_deferred())
                    refill(search)
                if queue:
                    continue
                if any(search.deferred for search in active):
                    time.sleep(0.2)
                    continue
                break
            pending = next((item for item in queue if item.ready()), queue[0])
            queue.remove(pending)
            search = pending.search
            give_up = None if search.best_us is None else GIVE_UP_FACTOR * search.best_us
            seed = sampler_seed(search.name, ctx.options.seed) + pending.trial.number
            measurement = evaluate(search.workload(), pending.config, pending.compiled, ctx.timer, seed, give_up)
            variant = search.workload().compile_job(pending.config).variant
            ctx.trials_evaluated += 1
            ctx.phase_seconds["compile wait"] += measurement.compile_wait_seconds
            ctx.phase_seconds["gate and first launch"] += measurement.gate_seconds
            ctx.phase_seconds["timing"] += measurement.timing_seconds
            if variant not in ctx.variants_seen:
                ctx.variants_seen.add(variant)
                ctx.slow_first_launches += measurement.gate_seconds > SLOW_FIRST_LAUNCH_S
            if search.record(pending, measurement):
                index = searches.index(search)
                for neighbour in searches[max(0, index - 1) : index + 2]:
                    if neighbour is not search and not neighbour.is_final():
                        neighbour.offer(pending.config, f"best of B={search.batch}")
                        refill(neighbour)
            refill(search)
            search.report()
        for search in active:
            if search.finalizable():
                search.finalize()
            search.release()
    except BaseException as error:
        for search in active:
            search.abandon(
                "interrupted" if isinstance(error, KeyboardInterrupt) else f"{type(error).__name__}: {error}"
            )
        raise


# ---------------------------------------------------------------------------------------------------
# Worker
# ---------------------------------------------------------------------------------------------------
def make_context(options: TuneOptions, storage: Any, reporter: Reporter) -> Context:
    import torch

    from layoutgen.tuning.compile import default_compile_workers
    from layoutgen.tuning.timing import CudaGraphTimer, WallClockTimer, copy_bandwidth_tbps, device_l2_bytes
    from layoutgen.tuning_db import CPU_INTERPRETER_DEVICE, current_device

    if options.interpret:
        return Context(options, storage, torch.device("cpu"), CPU_INTERPRETER_DEVICE, "none", WallClockTimer(),
                       CompilePool(0), 0, None, reporter)  # fmt: skip
    found = current_device()
    if found is None:
        raise RuntimeError("no CUDA device is visible; tune on a GPU, or run the pipeline on CPU with --interpret")
    name, capability = found
    device = torch.device("cuda", torch.cuda.current_device())
    l2_bytes = device_l2_bytes(device)
    workers = (
        options.compile_workers if options.compile_workers is not None else default_compile_workers(options.workers)
    )
    pool = CompilePool(workers)
    copy_tbps = copy_bandwidth_tbps(device)
    return Context(options, storage, device, name, capability, CudaGraphTimer(), pool, l2_bytes, copy_tbps, reporter)


def record_family(ctx: Context, target: Target, buckets: list[int]) -> None:
    """Write a family's decisions as soon as it is searched: a run that dies later (a lent GPU host taken
    back, SIGKILL) keeps them, and a re-run skips them even without the study storage."""
    if ctx.options.db_dir is None:
        return
    from pathlib import Path

    from layoutgen.tuning.runner import collect
    from layoutgen.tuning_db import record

    names = [study_name(ctx.device_name, target, batch) for batch in buckets]
    _, entries = collect(ctx.storage, names, [target], buckets, ctx.device_name)
    if entries:
        record(Path(ctx.options.db_dir), ctx.device_name, ctx.compute_capability, entries)


def phase_summary(ctx: Context, seconds: float) -> str:
    """Where the search's wall time went, per evaluated trial: what to shorten when a grid takes too long."""
    per_trial = {name: 1e3 * value / ctx.trials_evaluated for name, value in ctx.phase_seconds.items()}
    rest = 1e3 * seconds / ctx.trials_evaluated - sum(per_trial.values())
    parts = ", ".join(f"{name} {value:.1f}" for name, value in per_trial.items())
    return (
        f"{ctx.trials_evaluated} trials in {seconds:.0f} s; ms per trial: {parts}, the rest (sampler, storage, "
        f"final re-timing) {rest:.1f}"
    )


def device_identity(options: TuneOptions) -> tuple[str, str]:
    from layoutgen.tuning_db import CPU_INTERPRETER_DEVICE, current_device

    if options.interpret:
        return CPU_INTERPRETER_DEVICE, "none"
    found = current_device()
    if found is None:
        raise RuntimeError("no CUDA device is visible; tune on a GPU, or run the pipeline on CPU with --interpret")
    return found


def run_worker(options: TuneOptions, worker_index: int, reporter: Reporter, storage: Any = None) -> int:
    """Search every family of the run (starting at this worker's share); returns the gate failures."""
    from layoutgen.tuning.plan import make_targets
    from layoutgen.tuning.storage import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage if storage is not None else open_storage(options.storage)
    ctx = make_context(options, storage, reporter)
    skip = set(options.skip)
    families = [
        (target, [b for b in options.buckets if study_name(ctx.device_name, target, b) not in skip])
        for target in make_targets(options)
    ]
    families = [(target, buckets) for target, buckets in families if buckets]  # all decided: nothing to compile
    start = (worker_index * len(families)) // max(1, options.workers)
    ordered = families[start:] + families[:start]
    budget_per_family = None if options.time_budget_s is None else options.time_budget_s / max(1, len(families))
    started = time.perf_counter()
    try:
        for target, buckets in ordered:
            deadline = None if budget_per_family is None else time.monotonic() + budget_per_family
            search_family(ctx, target, buckets, deadline)
            record_family(ctx, target, buckets)
            if ctx.device.type == "cuda":
                import torch

                torch.cuda.empty_cache()
    finally:
        ctx.pool.close()
    if ctx.trials_evaluated:
        reporter.info(phase_summary(ctx, time.perf_counter() - started))
    if ctx.pool.workers and ctx.variants_seen:
        reporter.info(
            f"compile pool: {ctx.pool.submitted} kernel variants compiled ahead; {ctx.slow_first_launches} of "
            f"{len(ctx.variants_seen)} first launches took over {SLOW_FIRST_LAUNCH_S} s (compiled in this process)"
        )
    return ctx.gate_failures
