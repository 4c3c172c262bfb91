"""The multi-worker claim protocol: how workers sharing a study's storage never time one config twice.

A worker asks Optuna for a trial, then claims it (user attribute `claim`: worker id and time).  Trials
that compete for one config, or for the last of a budget, are ordered by their claims: the first claimed
wins, the others copy its result (`repeat`) or give way (`surplus`).  A RUNNING trial whose worker is gone
(a dead process on this host, an old claim from another host, or never claimed) is failed as
`interrupted` and its config tried again.

Trial outcomes (user attribute `result["outcome"]`): measured, compile_failed, launch_failed,
gate_failed (these are "evaluated" and count toward the budget), repeat (a copy of an evaluated twin),
infeasible (pruned before any compile), surplus (another worker claimed the last of the budget first),
interrupted (Ctrl-C or a dead worker; the config is tried again on the next run).

A study's decision is claimed the same way, so that of the workers that find its search complete at once
exactly one re-times the finalists and stores the decision (`FinalizeClaim`); the others wait for it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

EVALUATED = ("measured", "compile_failed", "launch_failed", "gate_failed")
#: A RUNNING trial of another host whose claim is this old belongs to a dead worker.
STALE_AFTER_S = 900.0
#: A worker claims a trial right after asking for it (milliseconds, even on a remote PostgreSQL); one
#: still unclaimed after this long was asked by a worker interrupted in between (Ctrl-C), so a re-run
#: need not wait a minute to take it over.
UNCLAIMED_STALE_AFTER_S = 10.0
#: How often a worker waiting for the decision another worker is making looks again (a decision re-times a
#: few configs: seconds).
FINALIZE_POLL_S = 0.2


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def result_of(trial: FrozenTrial) -> dict[str, Any]:
    return dict(trial.user_attrs.get("result") or {})


def outcome_of(trial: FrozenTrial) -> str | None:
    return result_of(trial).get("outcome")


def claim_order(trial: FrozenTrial) -> tuple[float, int]:
    """Claims order trials that compete for one config or the last of a budget: first claimed wins."""
    claim = trial.user_attrs.get("claim")
    return (float(claim["at"]), trial.number) if claim else (float("inf"), trial.number)


def params_key(params: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((name, int(value)) for name, value in params.items()))


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
    return _worker_gone(claim, now)


def _worker_gone(claim: Mapping[str, Any], now: float) -> bool:
    """Whether the worker of a claim ({"worker": host:pid, "at": time}) is gone: a dead process on this
    host, or a claim older than STALE_AFTER_S (another host)."""
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


class FinalizeClaim:
    """One worker's claim on deciding one study, held in the study storage itself.

    A claim is a study named `<study>|finalizing|<attempt>`: Optuna refuses to create a study whose name is
    taken, atomically in every storage (a journal's records have one order, a database a unique index), so of
    workers creating the same attempt exactly one succeeds.  A lock file would serialise only the workers of
    one host, and studies are shared between hosts (PostgreSQL).  A claim whose worker is gone (`is_stale`'s
    rules) is superseded by the next attempt; the holder removes every attempt up to its own once the
    decision is stored or it gives up, so a finished study leaves no claim behind.
    """

    def __init__(self, storage: Any, study: str, worker: str) -> None:
        self.storage = storage
        self.study = study
        self.worker = worker
        self.held: int | None = None
        #: When this worker first saw an attempt without its holder (a claim created, its holder not yet
        #: written): a holder killed in between leaves it so, and it is gone after UNCLAIMED_STALE_AFTER_S.
        self._unclaimed_since: dict[int, float] = {}

    def name(self, attempt: int) -> str:
        return f"{self.study}|finalizing|{attempt}"

    def acquire(self) -> bool:
        """Take the claim: True when this worker holds it now, False while another worker's is live."""
        attempt = 0
        while self._study_id(attempt) is not None:
            attempt += 1
        if attempt and not self._holder_gone(attempt - 1):
            return False
        try:
            study_id = self.storage.create_new_study([StudyDirection.MINIMIZE], self.name(attempt))
        except optuna.exceptions.DuplicatedStudyError:
            return False  # another worker created this attempt first
        self.held = attempt
        self.storage.set_study_user_attr(study_id, "claim", {"worker": self.worker, "at": time.time()})
        return True

    def release(self) -> None:
        """Remove this worker's claim and the attempts it superseded."""
        if self.held is None:
            return
        for attempt in range(self.held + 1):
            study_id = self._study_id(attempt)
            if study_id is not None:
                with contextlib.suppress(KeyError):  # removed meanwhile by a worker that superseded it too
                    self.storage.delete_study(study_id)
        self.held = None

    def _study_id(self, attempt: int) -> int | None:
        try:
            return int(self.storage.get_study_id_from_name(self.name(attempt)))
        except KeyError:
            return None

    def _holder_gone(self, attempt: int) -> bool:
        study_id = self._study_id(attempt)
        if study_id is None:
            return False  # released just now: the caller looks again
        try:
            claim = self.storage.get_study_user_attrs(study_id).get("claim")
        except KeyError:
            return False
        now = time.time()
        if not claim:
            return now - self._unclaimed_since.setdefault(attempt, now) > UNCLAIMED_STALE_AFTER_S
        return _worker_gone(claim, now)
