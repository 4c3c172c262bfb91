"""SIGTERM as Ctrl-C: a job limit or `timeout` stops a run the way an interrupt does, so in-flight work is
marked interrupted, what was decided is still written, and temporary files are removed; and an interrupt that
CPython could not raise is not reported as an error.  Imports nothing heavy: the console script's entry
module uses it during start-up."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt in the main thread."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
