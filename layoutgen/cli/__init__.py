"""The `layoutgen` command: the app and its entry point; each subcommand lives in its own module.

User errors (bad specs, missing files, unwritable directories, bad options) print a short message and
exit 2; real failures (a verification or correctness-gate failure, a database that cannot be read)
exit 1; Ctrl-C exits 130 and SIGTERM 143 after cleaning up.  `--debug` (anywhere on the command line,
or LAYOUTGEN_DEBUG=1) shows the traceback.  No user-supplied text is ever read as rich markup.
"""

from __future__ import annotations

import shlex
import signal
import sys
import threading
from typing import Annotated, Any, NoReturn

import typer

from layoutgen.cli import build as build_command
from layoutgen.cli import db as db_command
from layoutgen.cli import families as families_command
from layoutgen.cli import show as show_command
from layoutgen.cli import tune as tune_command
from layoutgen.cli.common import (
    CommandFailed,
    GuardedStdout,
    OutputClosed,
    debug,
    errors,
    expand_arguments,
    say,
    stop_note,
    stopped_message,
)
from layoutgen.settings import SettingError
from layoutgen.signals import cancel_redeliveries, deliver_again_soon, inside_import, swallowed_interrupt_hook
from layoutgen.spec import SpecError

__all__ = ["CommandFailed", "app", "main"]

app = typer.Typer(
    name="layoutgen",
    help="Generate, verify, tune and dispatch layout-parameterised Triton kernels, one kernel family at a time.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(asked: bool) -> None:
    if asked:
        from layoutgen import __version__

        say(f"layoutgen {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    debug_flag: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
    version: Annotated[
        bool,
        typer.Option("--version", help="Print layoutgen's version and exit.", callback=_print_version, is_eager=True),
    ] = False,
) -> None:
    from layoutgen.settings import DEBUG

    debug["on"] = debug_flag  # first: a refusal of the variable's value below is reported without a traceback
    debug["on"] = debug_flag or DEBUG.read()  # a value that is no yes or no is refused (SettingError: exit 2)


app.command("build")(build_command.build)
app.command("show")(show_command.show)
app.command("diff")(show_command.diff)
app.command("tune")(tune_command.tune)
app.command("families")(families_command.families)
app.add_typer(db_command.app, name="db")

#: The signal that stopped the run, if any: SIGINT (exit 130) or SIGTERM (exit 143).
_stopped: dict[str, int | None] = {"by": None}


def _on_signal(signum: int, frame: Any) -> None:
    # Remember the signal: a library may swallow the KeyboardInterrupt (typer returns 130 outside standalone
    # mode) or turn it into another error; the exit says why anyway.
    _stopped["by"] = int(signum)
    if inside_import(frame):  # raising there can abort the process (layoutgen.signals.inside_import)
        deliver_again_soon(signum)
        return
    raise KeyboardInterrupt


def _forget_caught_interrupts() -> None:
    # CPython marks a KeyboardInterrupt that leaves exec() of a string as unhandled and then ends the process
    # by SIGINT at exit, though the interrupt was caught here: dataclasses and namedtuple exec such strings
    # while a library is imported or a class is made.  Every exec() of a string clears the mark first.
    exec("None", {})


def _exit_stopped() -> NoReturn:
    cancel_redeliveries()
    terminated = _stopped["by"] == signal.SIGTERM
    say(stopped_message(terminated), "red", err=True)
    _forget_caught_interrupts()
    sys.exit(143 if terminated else 130)


def main() -> None:
    """Entry point: run the app, turning expected errors into one-line messages (never wrapped by the console's
    width: a message is one line for grep and logs however long its paths are) and Ctrl-C / SIGTERM into
    exit 130 / 143 after the code under way has cleaned up."""
    _stopped["by"] = None
    stop_note["text"] = None
    watch = threading.current_thread() is threading.main_thread()
    previous: dict[signal.Signals, Any] = {}
    if watch:
        for stop in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(stop) not in (signal.SIG_IGN, None):
                previous[stop] = signal.signal(stop, _on_signal)
    stdout, sys.stdout = sys.stdout, GuardedStdout(sys.stdout)
    report = sys.unraisablehook
    sys.unraisablehook = swallowed_interrupt_hook(_stopped, report)
    try:
        _run()
    finally:
        cancel_redeliveries()
        sys.stdout = stdout
        sys.unraisablehook = report
        for stop, handler in previous.items():
            signal.signal(stop, handler)


def _run() -> None:
    try:
        returned = app(args=expand_arguments(sys.argv[1:]), standalone_mode=False)
    except CommandFailed as failure:
        if _stopped["by"] is not None:
            _exit_stopped()
        errors.print("error: ", style="red", end="", markup=False)
        say(str(failure), err=True)
        sys.exit(failure.code)
    except (SpecError, SettingError) as error:
        if debug["on"]:
            raise
        errors.print("error: ", style="red", end="", markup=False)
        say(str(error), err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        _exit_stopped()
    except OutputClosed:
        _closed_pipe()
    except (typer.Exit, SystemExit) as done:
        code = getattr(done, "exit_code", getattr(done, "code", 0))
        if code in (0, None) and _stopped["by"] is not None:
            _exit_stopped()
        sys.exit(code)
    except Exception as error:  # a usage error from typer's click, or an unexpected failure
        if _stopped["by"] is not None:
            _exit_stopped()
        # typer >= 0.29 vendors click, so usage errors are recognised by their interface, not their class.
        show, exit_code = getattr(error, "show", None), getattr(error, "exit_code", None)
        if callable(show) and isinstance(exit_code, int):
            _hint_spec_option(error)
            show()
            sys.exit(exit_code)
        if debug["on"]:
            raise
        errors.print("error: ", style="red", end="", markup=False)
        say(f"{type(error).__name__}: {error}  (rerun with --debug for the traceback)", err=True)
        sys.exit(1)
    # Outside standalone mode typer returns the code of a typer.Exit (130 for a Ctrl-C) instead of exiting.
    if returned == 130 or _stopped["by"] is not None:
        _exit_stopped()
    if isinstance(returned, int) and not isinstance(returned, bool) and returned:
        sys.exit(returned)
    _flush_or_closed()


def _hint_spec_option(error: Exception) -> None:
    """`layoutgen build my.yaml`: `show` and `diff` take their specs as arguments, `build` and `tune` after
    `--spec`, so click's "Got unexpected extra argument(s) (my.yaml)" also says where the spec goes."""
    context, message = getattr(error, "ctx", None), getattr(error, "message", None)
    command = getattr(context, "command", None)
    if not isinstance(message, str) or not message.startswith("Got unexpected extra argument") or command is None:
        return
    if any("--spec" in getattr(param, "opts", ()) for param in command.params):
        # Click joins the extra arguments with spaces: one of them is named only where that is unambiguous.
        extra = message[message.rfind("(") + 1 : message.rfind(")")]
        example = shlex.quote(extra) if extra and " " not in extra else "FILE"
        hint = f"{command.name} takes each spec after --spec, e.g. layoutgen {command.name} --spec {example}"
        error.message = f"{message}; {hint}"  # type: ignore[attr-defined]


def _flush_or_closed() -> None:
    try:
        sys.stdout.flush()
    except OutputClosed:
        _closed_pipe()


def _closed_pipe() -> NoReturn:
    """The reader of our output went away (`| head`): not an error.  Point stdout at /dev/null so that the
    interpreter's final flush of what is still buffered does not fail again, and exit 0."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (a test's captured stdout): nothing to redirect
        pass
    sys.exit(0)
