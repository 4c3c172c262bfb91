"""The search of one compiled family of studies inside a worker.

The studies of one (spec, kernel, shape, dtype) advance together, because they share compiled kernels:
the size is a run-time argument.  Each study keeps a few trials in flight whose configs compile ahead
on a process pool while the GPU times others; a new best is enqueued into the neighbouring buckets'
studies.  TPE is multivariate with the constant liar (in-flight trials count as bad), so parallel trials
spread out.  A config already measured in the study is not re-timed: the trial copies the stored value.
Trials are claimed in storage (`claims`), so workers sharing a study (`--workers`, PostgreSQL) do not
time the same config twice.  When a study's budget is spent, `decision.decide` settles it; a worker that can
ask no more of a study another worker still measures waits for those trials (`others_running`) to decide it too.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from layoutgen.config import LaunchConfig
from layoutgen.tuning.claims import (
    EVALUATED,
    FINALIZE_POLL_S,
    STALE_AFTER_S,
    FinalizeClaim,
    claim_order,
    fail_trial,
    is_stale,
    outcome_of,
    params_key,
    result_of,
)
from layoutgen.tuning.compile import CompileError
from layoutgen.tuning.context import Context
from layoutgen.tuning.decision import decide
from layoutgen.tuning.objective import Measurement, Target, Workload, evaluate, naming_the_size
from layoutgen.tuning.plan import run_study_name, sampler_seed
from layoutgen.tuning.prepare import make_sampler
from layoutgen.tuning.space import BoundSpace, bind

#: A candidate slower than this multiple of the study's best stops timing after MIN_REPEATS samples.
GIVE_UP_FACTOR = 1.5
#: A first launch this slow compiled the kernel instead of loading it from Triton's cache.
SLOW_FIRST_LAUNCH_S = 0.25
#: Asks per study that produced nothing new (infeasible points, repeats) before the search gives up.
MAX_IDLE_ASKS = 64
#: How often a worker with nothing to measure looks again at the trials it waits for: a deferred twin's, or
#: another worker's in a study it can ask no more of.
WAIT_POLL_S = 0.2


# ---------------------------------------------------------------------------------------------------
# Search
# ---------------------------------------------------------------------------------------------------
@dataclass
class Pending:
    """A claimed trial whose config is compiling or waiting for the GPU."""

    search: BucketSearch
    trial: optuna.Trial
    config: LaunchConfig
    compiled: Future[CompileError | None] | None

    def ready(self) -> bool:
        return self.compiled is None or self.compiled.done()


@dataclass
class Deferred:
    """A claimed trial whose config an earlier-claimed twin is measuring."""

    trial: optuna.Trial
    config: LaunchConfig
    claim: dict[str, Any]
    twin: int


class BucketSearch:
    """The search of one study inside a worker."""

    def __init__(self, ctx: Context, target: Target, bucket: int, deadline: float | None) -> None:
        self.ctx = ctx
        self.target = target
        self.bucket = bucket
        self.deadline = deadline
        self.name = run_study_name(ctx.options, ctx.device_name, target, bucket)
        self.study = optuna.load_study(study_name=self.name, storage=ctx.storage)
        self.meta: dict[str, Any] = self.study.user_attrs["layoutgen"]
        self.study.sampler = make_sampler(self.name, ctx.options, self.meta["budget"])
        self.space: BoundSpace = bind(target.problem, bucket)
        self.ranges = self.space.param_ranges()
        self.inflight: dict[int, Pending] = {}
        self.deferred: dict[int, Deferred] = {}
        self.idle_asks = 0
        #: Whether the last ask used no budget (an infeasible point or a repeat of an evaluated config).
        self.last_ask_idle = False
        self._workload: Workload | None = None
        trials = self.trials()
        measured = [t for t in trials if outcome_of(t) == "measured" and t.value is not None]
        self.best_us: float | None = min((t.value for t in measured), default=None)  # type: ignore[type-var]
        self.evaluated_count = self.evaluated(trials)  # for progress; exact counts come from storage
        self.label = f"{target.problem.label} {target.problem.family.bucket.name}={bucket}"

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
        return sum(1 for t in (trials if trials is not None else self.trials()) if outcome_of(t) in EVALUATED)

    def is_final(self) -> bool:
        return bool(self.study.user_attrs.get("final"))

    def out_of_time(self) -> bool:
        """Whether the run's --time-budget share for this study's family has run out."""
        return self.deadline is not None and time.monotonic() > self.deadline

    def room(self, trials: list[FrozenTrial]) -> int:
        """How many more trials may be asked now: the enqueued configs of an exhaustive study, the budget
        left after evaluated and running trials (any worker's) of a TPE study."""
        if self.idle_asks >= MAX_IDLE_ASKS or self.out_of_time():
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
            family = self.target.problem.family
            self._workload = family.workload(self.target, self.bucket, self.ctx.device, self.ctx.l2_bytes)
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

    def route(self, trial: optuna.Trial, config: LaunchConfig, claim: dict[str, Any]) -> Pending | None:
        """Measure `trial` here, unless a twin (same config) was evaluated or claimed first."""
        key = params_key(trial.params)
        mine = (float(claim["at"]), trial.number)
        trials = self.trials()
        others = [t for t in trials if t.number != trial.number]
        twins = [t for t in others if params_key(t.params) == key]
        for twin in twins:
            if outcome_of(twin) in EVALUATED:
                self.idle_asks += 1
                self.last_ask_idle = True
                self.copy_from(trial, twin)
                return None
        claimed_before = [t for t in others if t.state == TrialState.RUNNING and claim_order(t) < mine]
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
        result = result_of(twin)
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
            if outcome_of(twin) in EVALUATED:
                del self.deferred[number]
                self.copy_from(deferred.trial, twin)
            elif twin.state.is_finished() or is_stale(twin, now):
                if not twin.state.is_finished():
                    fail_trial(
                        self.study, twin.number, "interrupted", "its worker is gone", result_of(twin).get("config")
                    )
                del self.deferred[number]
                pending = self.route(deferred.trial, deferred.config, deferred.claim)
                if pending is not None:
                    to_measure.append(pending)
        return to_measure

    def offer(self, config: LaunchConfig, source: str) -> None:
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
                states=list(self.workload().states),
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

    def others_running(self) -> bool:
        """Whether another worker (of this run, or a tuner sharing the storage) still measures trials of this
        undecided study: this one waits for them and decides the study with their results, rather than leave
        it undecided.  A trial whose worker is gone (`claims.is_stale`) is failed and, in an exhaustive study,
        its config enqueued again; one claimed over STALE_AFTER_S ago is not waited for (its worker hangs)."""
        if self.is_final():
            return False
        now, waiting = time.time(), False
        for trial in self.trials():
            if trial.state != TrialState.RUNNING:
                continue
            if is_stale(trial, now):
                fail_trial(
                    self.study, trial.number, "interrupted", "its worker is gone", result_of(trial).get("config")
                )
                params = trial.params or trial.system_attrs.get("fixed_params")
                if self.exhaustive and params:
                    self.study.enqueue_trial(params, user_attrs={"seed": "exhaustive"})
                waiting = True  # room reopened: this worker measures it
            elif now - claim_order(trial)[0] < STALE_AFTER_S:
                waiting = True
        return waiting

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

    def finalize(self) -> dict[str, Any] | None:
        """Re-time the finalists and the default together and decide what the database gets, unless another
        worker does: workers sharing the study may find it finalizable at the same moment, and of them only the
        one holding its claim decides; the others wait for that decision.  Returns the study's decision (None:
        the study takes more trials, e.g. a run asking for more began meanwhile)."""
        claim = FinalizeClaim(self.ctx.storage, self.name, self.ctx.worker)
        while not claim.acquire():
            final = self.study.user_attrs.get("final")
            if final:
                self.report(done=True)
                return dict(final)
            time.sleep(FINALIZE_POLL_S)
        try:
            # Again under the claim: another worker may have stored the decision since this one looked.
            with naming_the_size(self.target.problem, self.bucket):
                final = decide(self) if self.finalizable() else self.study.user_attrs.get("final")
        except BaseException:
            with contextlib.suppress(Exception):  # the storage may be what failed: the claim goes stale with us
                claim.release()
            raise
        claim.release()
        if final:
            self.report(done=True)
        return final


def search_family(ctx: Context, target: Target, buckets: list[int], deadline: float | None = None) -> None:
    """Advance every bucket study of one compiled family together, then finalize what is complete."""
    searches = [BucketSearch(ctx, target, bucket, deadline) for bucket in sorted(buckets)]
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
                # Every study looked at (stale trials failed), not just up to the first that waits.
                others = [search for search in active if search.others_running()]
                if others or any(search.deferred for search in active):
                    time.sleep(WAIT_POLL_S)
                    continue
                break
            pending = next((item for item in queue if item.ready()), queue[0])
            queue.remove(pending)
            search = pending.search
            give_up = None if search.best_us is None else GIVE_UP_FACTOR * search.best_us
            seed = sampler_seed(search.name, ctx.options.seed) + pending.trial.number
            with naming_the_size(search.target.problem, search.bucket):
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
                        neighbour.offer(pending.config, f"best of {search.label}")
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
