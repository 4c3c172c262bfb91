"""The `layoutgen` command.

User errors (bad specs, missing files, unwritable directories) print a short
message and exit non-zero; `--debug` shows the traceback.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from layoutgen import cli_show, cli_tune
from layoutgen.cli_db import app as db_app
from layoutgen.spec import SpecError

app = typer.Typer(
    name="layoutgen",
    help="Generate, verify, tune and dispatch layout-parameterised DCP pack/combine kernels.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
errors = Console(stderr=True, soft_wrap=True)  # one error per line: paths and messages never wrap
_debug = {"on": False}

F = TypeVar("F", bound=Callable[..., Any])


class CommandFailed(Exception):
    """A failure already explained to the user; carries the exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@app.callback()
def _options(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    _debug["on"] = debug or os.environ.get("LAYOUTGEN_DEBUG", "") not in ("", "0")


def _spec_sources(spec_files: list[Path] | None) -> tuple[list[tuple[Any, Path]], bool]:
    from layoutgen.spec import bundled_spec_paths, bundled_specs, load_spec

    if not spec_files:
        bundled = bundled_specs()
        return [(bundled[p.stem], p) for p in bundled_spec_paths()], True
    return [(load_spec(path), path) for path in spec_files], False


def _default_out_dir() -> Path:
    from layoutgen.loader import source_root

    root = source_root()
    if root is None:
        raise CommandFailed(
            "no source checkout found for the bundled specs' generated/ directory; pass --out DIR", code=2
        )
    return root / "generated"


@app.command()
def build(
    spec: Annotated[
        list[Path] | None,
        typer.Option("--spec", help="A spec YAML file (repeatable). Default: every bundled spec."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Output directory. Default: the checkout's generated/.")
    ] = None,
    check: Annotated[bool, typer.Option("--check", help="Write nothing; fail listing stale files.")] = False,
    verify: Annotated[
        bool, typer.Option("--verify/--no-verify", help="Check each module against the reference.")
    ] = True,
) -> None:
    """Render specs into Triton modules (atomic, only when changed), then verify them against the reference."""
    from layoutgen import codegen

    sources, bundled = _spec_sources(spec)
    out_dir = out if out is not None else _default_out_dir()
    owns_directory = bundled and out is None
    planned = codegen.plan_outputs(sources, out_dir, with_init=owns_directory)
    if check:
        problems = codegen.stale_files(planned, out_dir, owns_directory)
        if problems:
            for problem in problems:
                errors.print(escape(problem), style="red")
            raise CommandFailed(f"{len(problems)} generated file(s) out of date; run `layoutgen build`", code=1)
        console.print(f"[green]{len(planned)} generated file(s) up to date in {out_dir}[/green]")
        return
    try:
        written = [item.path for item in planned if codegen.write_if_changed(item.path, item.content)]
    except OSError as error:
        raise CommandFailed(f"cannot write to {out_dir}: {error.strerror or error}", code=2) from error
    console.print(f"{len(written)} written, {len(planned) - len(written)} unchanged in {out_dir}")
    if verify:
        _verify([item.path for item in planned if item.spec is not None])


def _verify(paths: list[Path]) -> None:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    from layoutgen.loader import load_path
    from layoutgen.verify import verify_module

    table = Table(
        title=f"verification against layoutgen.reference ({device}{', interpreter' if device == 'cpu' else ''})"
    )
    for column in ("spec", "buffers", "shapes checked", "pack exact", "combine max error"):
        table.add_column(column)
    failed: list[str] = []
    # Importing a module would write __pycache__/ next to it: `build --out D` writes D/<name>.py and nothing else.
    write_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        results = []
        for path in paths:
            with warnings.catch_warnings():
                # The interpreter's numpy log(0) for all-empty rows is the contract (-inf), not a fault.
                warnings.simplefilter("ignore", RuntimeWarning)
                results.append(verify_module(load_path(path), device=device))
    finally:
        sys.dont_write_bytecode = write_bytecode
    for result in results:
        table.add_row(
            result.spec_name,
            escape(result.buffers),
            str(result.shapes_checked),
            "[green]yes[/green]" if result.pack_exact else "[red]NO[/red]",
            f"{result.combine_max_error:.2e}" + ("" if result.combine_ok else " [red](out of tolerance)[/red]"),
        )
        failed += result.failures
    console.print(table)
    if failed:
        for failure in failed[:20]:
            errors.print(escape(failure), style="red")
        raise CommandFailed(f"{len(failed)} verification failure(s)", code=1)


cli_show.register(app)
cli_tune.register(app)
app.add_typer(db_app, name="db")


_interrupts = {"seen": False}


def _on_interrupt(signum: int, frame: Any) -> None:
    # Remember the Ctrl-C: a library may swallow the KeyboardInterrupt (typer returns 130 outside standalone
    # mode) or turn it into another error (an import interrupted half-way); the exit says "interrupted" anyway.
    _interrupts["seen"] = True
    signal.default_int_handler(signum, frame)


def _exit_interrupted() -> NoReturn:
    errors.print("[red]interrupted[/red]")
    sys.exit(130)


def main() -> None:
    """Entry point: run the app, turning expected errors into one-line messages (never wrapped by the console's
    width: a message is one line for grep and logs however long its paths are) and Ctrl-C into exit 130."""
    _interrupts["seen"] = False
    watch = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) not in (
        signal.SIG_IGN,
        None,
    )
    previous = signal.signal(signal.SIGINT, _on_interrupt) if watch else None
    try:
        _run()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _run() -> None:
    try:
        returned = app(args=cli_tune.expand_list_options(sys.argv[1:]), standalone_mode=False)
    except CommandFailed as failure:
        if _interrupts["seen"]:
            _exit_interrupted()
        errors.print("[red]error:[/red] ", end="")
        errors.print(str(failure), markup=False, highlight=False)
        sys.exit(failure.code)
    except SpecError as error:
        if _debug["on"]:
            raise
        errors.print("[red]error:[/red] ", end="")
        errors.print(str(error), markup=False, highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        _exit_interrupted()
    except (typer.Exit, SystemExit) as done:
        code = getattr(done, "exit_code", getattr(done, "code", 0))
        if code in (0, None) and _interrupts["seen"]:
            _exit_interrupted()
        sys.exit(code)
    except Exception as error:  # a usage error from typer's click, or an unexpected failure
        if _interrupts["seen"]:
            _exit_interrupted()
        # typer >= 0.29 vendors click, so usage errors are recognised by their interface, not their class.
        show, exit_code = getattr(error, "show", None), getattr(error, "exit_code", None)
        if callable(show) and isinstance(exit_code, int):
            show()
            sys.exit(exit_code)
        if _debug["on"]:
            raise
        errors.print("[red]error:[/red] ", end="")
        errors.print(f"{type(error).__name__}: {error}  (rerun with --debug for the traceback)", markup=False)
        sys.exit(1)
    # Outside standalone mode typer returns the code of a typer.Exit (130 for a Ctrl-C) instead of exiting.
    if returned == 130 or _interrupts["seen"]:
        _exit_interrupted()
    if isinstance(returned, int) and not isinstance(returned, bool) and returned:
        sys.exit(returned)


if __name__ == "__main__":
    # `python -m layoutgen.cli` runs this file as `__main__`, a second copy of the module; the commands raise
    # `layoutgen.cli.CommandFailed`, which only the canonical module's main() recognises.
    from layoutgen.cli import main as entry_point

    entry_point()
