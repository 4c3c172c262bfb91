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
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

EVALUATED = ("measured", "compile_failed", "launch_failed", "gate_failed")
#: A RUNNING trial of another host whose claim is this old belongs to a dead worker.
STALE_AFTER_S = 900.0
#: A worker claims a trial right after asking for it (milliseconds, even on a remote PostgreSQL); one
#: still unclaimed after this long was asked by a worker interrupted in between (Ctrl-C), so a re-run
#: need not wait a minute to take it over.
UNCLAIMED_STALE_AFTER_S = 10.0
#: Minimum gain over the default, as a fraction, for a winner to be written (timing noise floor).


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
