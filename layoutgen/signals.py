"""SIGTERM as Ctrl-C: a job limit or `timeout` stops a run the way an interrupt does, so in-flight work is
marked interrupted, what was decided is still written, and temporary files are removed; an interrupt is never
raised into an import; and one that CPython could not raise is not reported as an error.  Imports nothing the
`layoutgen` package has not imported already: the console script's entry module uses it during start-up."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

#: How soon a signal deferred out of an import is sent again.  Imports of the CLI's libraries take 0.15-2 s,
#: so a deferred Ctrl-C ends the run at most this long after the import is over.
REDELIVERY_S = 0.05

_redeliveries: list[threading.Timer] = []


#: Whether the last KeyboardInterrupt of a `sigterm_interrupts` block came from SIGTERM (the exit says so).
_terminated = {"by_sigterm": False}


def terminated_by_sigterm() -> bool:
    return _terminated["by_sigterm"]


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt in the main thread (`terminated_by_sigterm()` then
    says it was SIGTERM, for the exit code: 143, not Ctrl-C's 130), deferred out of an import as the CLI's
    handler and `interrupted_once` defer it."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if inside_import(frame):
            deliver_again_soon(signum)
            return
        _terminated["by_sigterm"] = True
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        cancel_redeliveries()
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def interrupted_once() -> Iterator[None]:
    """Within the block, the first SIGINT or SIGTERM raises KeyboardInterrupt in the main thread (deferred out
    of an import, like the CLI's handler), and every later one is ignored, so the cleanup it starts (trials
    marked interrupted in the study storage) is not cut short: a tuning worker can get the terminal's Ctrl-C
    and the one its parent forwards."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if inside_import(frame):
            deliver_again_soon(signum)
            return
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _terminated["by_sigterm"] = signum == signal.SIGTERM
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        cancel_redeliveries()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def swallowed_interrupt_hook(stopped: dict[str, int | None], report: Callable[[Any], object]) -> Callable[[Any], None]:
    """A `sys.unraisablehook` for a run whose signal handler records the signal in `stopped`.  A signal that
    lands while CPython runs a callback it cannot raise from (importlib's module-lock weakref callback in the
    middle of an import, a __del__) has its KeyboardInterrupt reported as "Exception ignored in ..." with a
    traceback, and the run goes on to its next step, where `stopped` ends it with the one word.  Only that
    report is silenced; everything else goes to `report`."""

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and stopped["by"] is not None:
            return
        report(unraisable)

    return hook


def inside_import(frame: FrameType | None) -> bool:
    """Whether `frame` runs under an import: module-level code, and the callbacks of a C extension's
    initialisation.  A KeyboardInterrupt raised there can abort the process instead of unwinding it: torch's
    import runs Python from C++ (`torch._C._autograd_init`, through pybind11), and an exception leaving that
    Python ends in std::terminate (SIGABRT: seen in CI, a SIGTERM 0.5 s into `layoutgen build`)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib."):
            return True
        frame = frame.f_back
    return False


def deliver_again_soon(signum: int) -> None:
    """Send `signum` to this process again in REDELIVERY_S, from a daemon thread: a signal a handler deferred
    out of an import reaches it again, until it lands outside one."""
    timer = threading.Timer(REDELIVERY_S, os.kill, (os.getpid(), signum))
    timer.daemon = True
    _redeliveries.append(timer)
    timer.start()


def cancel_redeliveries() -> None:
    """Drop the signals `deliver_again_soon` has not sent yet (the run is ending anyway)."""
    while _redeliveries:
        _redeliveries.pop().cancel()
