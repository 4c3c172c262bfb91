"""`layoutgen build`: render specs into Triton modules (atomic, only when changed) and verify them."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from layoutgen.cli.common import CommandFailed, bad_input, check_writable_dir, console, resolve_spec_source, say
from layoutgen.tuning.offline import ARCH


def _spec_sources(spec_files: list[str] | None) -> tuple[list[tuple[Any, Path]], bool]:
    from layoutgen.spec import bundled_spec_paths, bundled_specs

    if not spec_files:
        bundled = bundled_specs()
        return [(bundled[p.stem], p) for p in bundled_spec_paths()], True
    sources: dict[Path, tuple[Any, Path]] = {}
    for text in spec_files:
        spec, path = resolve_spec_source(text)
        sources.setdefault(path.resolve(), (spec, path))  # one spec named twice is built once
    return list(sources.values()), False


def _refuse_spec_files_into_checkout(sources: list[tuple[Any, Path]]) -> None:
    """Without --out only bundled specs are built: the checkout's generated/ holds their modules alone, so a
    spec file's module there would replace a bundled one or be an orphan that `build --check` fails on."""
    from layoutgen.spec import bundled_spec_paths

    bundled = {path.resolve(): path.stem for path in bundled_spec_paths()}
    for spec, path in sources:
        if path.resolve() in bundled:
            continue
        if spec.name in bundled.values():
            consequence = f"would replace the module of the bundled spec '{spec.name}'"
        else:
            consequence = "would be a module `layoutgen build --check` reports as stale"
        raise bad_input(
            f"--spec {path}: its module goes to a directory of your own: pass --out DIR (generated/{spec.name}.py "
            f"in the checkout holds the bundled specs' modules only and {consequence})"
        )


def _default_out_dir() -> Path:
    from layoutgen.loader import source_root

    root = source_root()
    if root is None:
        raise bad_input("no source checkout found for the bundled specs' generated/ directory; pass --out DIR")
    return root / "generated"


def _refuse_inside_package(out_dir: Path) -> None:
    """A module written into the installed package could replace one of its own modules."""
    package = Path(__file__).resolve().parent.parent
    try:
        Path(out_dir).resolve().relative_to(package)
    except ValueError:
        return
    raise bad_input(f"--out {out_dir} is inside the layoutgen package ({package}); write generated modules elsewhere")


def build(
    spec: Annotated[
        list[str] | None,
        typer.Option(
            "--spec",
            metavar="NAME|FILE",
            help="A bundled spec name or a spec YAML file (repeatable). Default: every bundled spec.",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", metavar="DIR", help="Output directory. Default: the checkout's generated/."),
    ] = None,
    check: Annotated[bool, typer.Option("--check", help="Write nothing; fail listing stale files.")] = False,
    verify: Annotated[
        bool, typer.Option("--verify/--no-verify", help="Check each module against its family's reference.")
    ] = True,
) -> None:
    """Render specs into Triton modules (atomic, only when changed), then verify them against the reference."""
    from layoutgen import codegen

    sources, bundled = _spec_sources(spec)
    if out is None:
        _refuse_spec_files_into_checkout(sources)
    out_dir = out if out is not None else _default_out_dir()
    if out is not None:
        _refuse_inside_package(out_dir)
    owns_directory = bundled and out is None
    try:
        planned = codegen.plan_outputs(sources, out_dir, with_init=owns_directory)
    except ValueError as error:
        raise bad_input(str(error)) from None
    if check:
        problems = codegen.stale_files(planned, out_dir, owns_directory)
        if problems:
            for problem in problems:
                say(problem, "red", err=True)
            raise CommandFailed(f"{len(problems)} generated file(s) out of date; run `layoutgen build`", code=1)
        say(f"{len(planned)} generated file(s) up to date in {out_dir}", "green", wrap=False)
        return
    check_writable_dir(out_dir, f"--out {out_dir}" if out is not None else f"the checkout's {out_dir}")
    try:
        written = [item.path for item in planned if codegen.write_if_changed(item.path, item.content)]
    except OSError as error:
        raise bad_input(f"cannot write to {out_dir}: {error.strerror or error}") from error
    say(f"{len(written)} written, {len(planned) - len(written)} unchanged in {out_dir}", wrap=False)
    if verify:
        verify_modules([item.path for item in planned if item.spec is not None])


def verify_modules(paths: list[Path]) -> None:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    from layoutgen.family import get_family
    from layoutgen.loader import load_path

    where = f"{device}{', Triton interpreter' if device == 'cpu' else ''}"
    # Importing a module would write __pycache__/ next to it: `build --out D` writes D/<name>.py and nothing else.
    write_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        reports = []
        for path in paths:
            with warnings.catch_warnings():
                # The interpreter's numpy log(0) for all-empty rows is the contract (-inf), not a fault.
                warnings.simplefilter("ignore", RuntimeWarning)
                module = load_path(path)
                reports.append(get_family(module.SPEC.family).verify(module, device))
    finally:
        sys.dont_write_bytecode = write_bytecode
    reports = _with_offline_compiles(paths, reports)
    say(f"verified against each family's torch reference ({where}):")
    kernel_width = max((len(check.kernel) for report in reports for check in report.checks), default=0)
    for report in reports:
        say(report.spec_name, "bold")
        console.print(checks_table(report, kernel_width))
    failed = [failure for report in reports for failure in report.failures]
    if failed:
        for failure in failed[:20]:
            say(failure, "red", err=True)
        raise CommandFailed(f"{len(failed)} verification failure(s)", code=1)


def _with_offline_compiles(paths: list[Path], reports: list[Any]) -> list[Any]:
    """Each report with a row per kernel for its compile for sm_90 at 32- and 64-bit offsets (the modules whose
    family declares `offline_jobs`): the interpreter runs a kernel's Python and never sees what only Triton's
    compiler refuses, and a GPU run compiles only the shapes it meets."""
    import dataclasses

    from layoutgen.family import Check, Family, get_family
    from layoutgen.tuning.offline import check_in_subprocesses, unavailable

    # Only the modules of families that declare offline jobs go to a compile process.
    declares = {r.family: type(get_family(r.family)).offline_jobs is not Family.offline_jobs for r in reports}
    wanted = [str(path) for path, report in zip(paths, reports, strict=True) if declares[report.family]]
    reason = unavailable() if wanted else None
    if reason is not None:
        say(f"not compiled for sm_{ARCH}: {reason}", "yellow")
        return reports
    compiled = check_in_subprocesses(wanted) if wanted else {}
    updated = []
    for path, report in zip(paths, reports, strict=True):
        results = compiled.get(str(path))
        if results is None:
            updated.append(report)
            continue
        checks, failures = [], []
        for kernel in dict.fromkeys(result["kernel"] for result in results):
            mine = [result for result in results if result["kernel"] == kernel]
            errors = [result for result in mine if result["error"]]
            if errors:
                last_line = (errors[0]["error"].strip().splitlines() or [""])[-1]
                failed = ", ".join(result["width"] for result in errors)
                checks.append(Check(kernel, False, f"does not compile for sm_{ARCH} ({failed}): {last_line}"))
                failures += [
                    f"{report.spec_name} {kernel} ({e['width']}) does not compile: {e['error'][-1500:]}" for e in errors
                ]
                continue
            widths = [result["width"].removesuffix("-bit") for result in mine]  # "32", "64"
            offsets = "- and ".join(widths) + "-bit"  # "32- and 64-bit"
            checks.append(Check(kernel, True, f"compiles for sm_{ARCH} with {offsets} offsets"))
        updated.append(
            dataclasses.replace(report, checks=(*report.checks, *checks), failures=(*report.failures, *failures))
        )
    return updated


def checks_table(report: Any, kernel_width: int) -> Table:
    """A spec's checks, one row each: result, kernel, detail.  Under the spec's own line, so that no name is
    shortened at 80 columns; only the detail wraps, within its column, on a narrow terminal."""
    table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 1))
    table.add_column("indent", width=1)
    table.add_column("result", no_wrap=True, min_width=len("FAILED"))
    table.add_column("kernel", no_wrap=True, min_width=kernel_width)
    table.add_column("detail", overflow="fold")
    for check in report.checks:
        passed = Text("ok", style="green") if check.passed else Text("FAILED", style="red")
        table.add_row("", passed, Text(check.kernel), Text(check.detail))
    return table
