"""The `layoutgen` console script: Ctrl-C and SIGTERM handled from the first moment, then the CLI.

Importing the CLI (typer, rich, pydantic, jinja2; torch for most commands) takes 0.15-2 s, and a signal in
that time used to end the process with a KeyboardInterrupt traceback (or kill it outright, by SIGINT).
This module imports nothing but `signal`, `sys` and `layoutgen.signals` (whose own imports the `layoutgen`
package has made already) before it installs its handlers, so from here on a Ctrl-C at any moment prints
`interrupted` and exits 130, and a SIGTERM prints `terminated` and exits 143 -- when the signal lands inside
an import, once that import returns: raising into one can abort the process (`layoutgen.signals`).
`layoutgen.cli.main` installs its own handlers once imported; these then cover only the start-up and
the moments around it.  (What runs before this module -- the interpreter's start and the `layoutgen`
package's own import, 15-30 ms together on an idle machine, measured -- is out of any Python handler's
reach.)
"""

from __future__ import annotations

import signal
import sys
from typing import Any, NoReturn

from layoutgen.signals import inside_import, swallowed_interrupt_hook

#: The signal that stopped the start-up, if any.
_stopped: dict[str, int | None] = {"by": None}
_EXITS = {int(signal.SIGINT): (130, "interrupted"), int(signal.SIGTERM): (143, "terminated")}


def _on_signal(signum: int, frame: Any) -> None:
    # Remember the signal: an import that catches everything may swallow the KeyboardInterrupt, or fail later
    # with another error; the exit says why anyway.
    _stopped["by"] = int(signum)
    for stop in _EXITS:  # the run ends now: a second Ctrl-C must not interrupt the way out
        signal.signal(stop, signal.SIG_IGN)
    if inside_import(frame):  # raising there can abort the process; main() exits when the import returns
        return
    raise KeyboardInterrupt


def _forget_caught_interrupts() -> None:
    # CPython marks a KeyboardInterrupt that leaves exec() of a string as unhandled (run_eval_code_obj in
    # Python/pythonrun.c) and ends the process by SIGINT at exit even though the interrupt was caught:
    # dataclasses and namedtuple exec generated code during imports, and 5 of 40 interrupts 0.035-0.06 s
    # into `build` died so after printing "interrupted".  Every exec() of a string clears the mark first.
    exec("None", {})


def _exit_stopped(signum: int | None) -> NoReturn:
    _forget_caught_interrupts()
    code, word = _EXITS.get(signum if signum is not None else int(signal.SIGINT), _EXITS[int(signal.SIGINT)])
    try:
        sys.stderr.write(word + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed: the exit status still tells
        pass
    sys.exit(code)


def main() -> None:
    """Run the `layoutgen` command, exiting 130 (Ctrl-C) or 143 (SIGTERM) when stopped during start-up."""
    for stop in _EXITS:
        if signal.getsignal(stop) is not signal.SIG_IGN:  # `nohup` and `&` in scripts ignore SIGINT on purpose
            signal.signal(stop, _on_signal)
    report = sys.unraisablehook
    try:
        try:
            sys.unraisablehook = swallowed_interrupt_hook(_stopped, report)
            from layoutgen.cli import main as run_cli
        except KeyboardInterrupt:
            _exit_stopped(_stopped["by"])
        except BaseException:
            if _stopped["by"] is not None:  # the import failed because it was interrupted
                _exit_stopped(_stopped["by"])
            raise
        if _stopped["by"] is not None:  # an import swallowed the KeyboardInterrupt
            _exit_stopped(_stopped["by"])
        try:
            run_cli()
        except KeyboardInterrupt:  # before the CLI installed its own handlers, or after it restored ours
            _exit_stopped(_stopped["by"])
    finally:
        _forget_caught_interrupts()  # the CLI exits 130 or 143 itself after catching an interrupt
        sys.unraisablehook = report


if __name__ == "__main__":
    main()
