"""`layoutgen build`: render specs into Triton modules, verify them, and write those that pass (atomic, only when
changed)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from layoutgen.cli.common import (
    CommandFailed,
    bad_input,
    console,
    resolve_spec_source,
    say,
)
from layoutgen.cli.paths import check_directory_path, check_writable_dir
from layoutgen.family import FamilyDeclarationError
from layoutgen.files import GENERATED_MARK
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


def _refuse_spec_files_into_checkout(sources: list[tuple[Any, Path]], out: str | None) -> None:
    """Into the checkout's generated/ (no --out, or an --out that is that directory) only bundled specs are
    built: it holds their modules alone, so a spec file's module there would replace a bundled one or be an
    orphan that `build --check` fails on."""
    from layoutgen.spec import bundled_spec_paths

    bundled = {path.resolve(): path.stem for path in bundled_spec_paths()}
    for spec, path in sources:
        if path.resolve() in bundled:
            continue
        if spec.name in bundled.values():
            consequence = f"would replace the module of the bundled spec '{spec.name}'"
        else:
            consequence = "would be a module `layoutgen build --check` reports as stale"
        named = "" if out is None else f" other than {out}, which is the checkout's generated/"
        raise bad_input(
            f"--spec {path}: its module goes to a directory of your own: pass --out DIR{named} (generated/"
            f"{spec.name}.py in the checkout holds the bundled specs' modules only and {consequence})"
        )


def _is_default_out(out: str | None, out_dir: Path) -> bool:
    """Whether the build writes into the checkout's generated/: no --out, or an --out naming that directory
    (by any path: relative, absolute, through a symlink)."""
    if out is None:
        return True
    from layoutgen.loader import source_root

    root = source_root()
    if root is None or not out_dir.is_dir():
        return False
    try:
        return os.path.samefile(out_dir, root / "generated")
    except OSError:
        return False


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
        str | None,  # text, not Path: Path("") is ".", and `--out ""` must not mean the working directory
        typer.Option("--out", metavar="DIR", help="Output directory. Default: the checkout's generated/."),
    ] = None,
    check: Annotated[bool, typer.Option("--check", help="Write nothing; fail listing stale files.")] = False,
    verify: Annotated[
        bool, typer.Option("--verify/--no-verify", help="Check each module against its family's reference.")
    ] = True,
) -> None:
    """Render specs into Triton modules, verify them against the reference, write those that pass (atomic, only
    when changed)."""
    from layoutgen import codegen

    if out == "":
        raise bad_input("--out needs a directory, e.g. --out generated_mine")
    sources, bundled = _spec_sources(spec)
    out_dir = Path(out) if out is not None else _default_out_dir()
    where = f"--out {out_dir}" if out is not None else f"the checkout's {out_dir}"
    if out is not None:
        check_directory_path(out_dir, where)  # a link to nothing, a loop or a long name: before resolving it
        _refuse_inside_package(out_dir)
    # The checkout's generated/ named by --out is the default directory: the same rules, however it is named.
    default_out = _is_default_out(out, out_dir)
    if default_out:
        _refuse_spec_files_into_checkout(sources, out)
    owns_directory = bundled and default_out
    try:
        planned = codegen.plan_outputs(sources, out_dir, with_init=owns_directory)
    except ValueError as error:
        raise bad_input(str(error)) from None
    except FamilyDeclarationError as error:  # a family's templates or context at fault: its author's fix
        raise CommandFailed(str(error), code=1) from None
    if check:
        check_directory_path(out_dir, where)  # a file there is bad input, as without --check, not "stale"
        problems = codegen.stale_files(planned, out_dir, owns_directory)
        if problems:
            for problem in problems:
                say(problem, "red", err=True)
            rebuild = _build_command(spec, out)
            orphans = [problem for problem in problems if problem.endswith("delete it")]
            fixes = [f"run `{rebuild}`"] if len(orphans) < len(problems) else []
            fixes += ["delete the files that a line above says to delete"] if orphans else []
            raise CommandFailed(f"{len(problems)} generated file(s) out of date; {' and '.join(fixes)}", code=1)
        say(f"{len(planned)} generated file(s) up to date in {out_dir}", "green", wrap=False)
        return
    check_writable_dir(out_dir, where)
    _refuse_directories_in_the_way(planned)
    _refuse_files_not_generated(planned)
    if not verify:
        written = _write(planned, out_dir)
        say(f"{len(written)} written, {len(planned) - len(written)} unchanged in {out_dir}", wrap=False)
        return
    from layoutgen.cli.environment import check_forced_configs

    check_forced_configs()  # the verification launches kernels with config=None, which LAYOUTGEN_CONFIG forces
    modules = [item for item in planned if item.spec is not None]
    reports = _verify_staged(modules)
    failed = {report.spec_name for report in reports if not report.ok}
    passed = [item for item in planned if item.spec is None or item.spec.name not in failed]
    written = _write(passed, out_dir)
    rejected = [item for item in modules if item.spec.name in failed]
    not_written = f", {len(rejected)} not written (failed verification)" if rejected else ""
    say(f"{len(written)} written, {len(passed) - len(written)} unchanged{not_written} in {out_dir}", wrap=False)
    if rejected:
        for item in rejected:
            say(_withdraw(item), "red", err=True)
        names = ", ".join(item.spec.name for item in rejected)
        raise CommandFailed(
            f"verification failed for {names}: fix the spec or its family's templates and run the build again "
            "(--no-verify writes a module unverified)",
            code=1,
        )


def _build_command(specs: list[str] | None, out: str | None) -> str:
    """The `layoutgen build` that rewrites what `--check` found stale: the same --spec and --out."""
    import shlex

    words = ["layoutgen", "build"]
    for text in specs or ():
        words += ["--spec", shlex.quote(text)]
    if out is not None:
        words += ["--out", shlex.quote(out)]
    return " ".join(words)


def _refuse_directories_in_the_way(items: list[Any]) -> None:
    """A directory where a module goes cannot be replaced by it: said before anything is verified or written,
    naming that path (not only --out)."""
    for item in items:
        if item.path.is_dir() and not item.path.is_symlink():  # a symlink is replaced, its target left alone
            raise bad_input(f"cannot write {item.path}: it is a directory; remove it or pass another --out")


def _refuse_files_not_generated(items: list[Any]) -> None:
    """A file in a module's place that layoutgen did not generate (someone's `mylib.py` next to a spec named
    `mylib`) is never replaced: said before anything is verified or written, naming that file."""
    from layoutgen import codegen

    for item in items:
        if item.spec is not None and os.path.lexists(item.path) and codegen.not_generated(item.path):
            raise bad_input(
                f"cannot write {item.path}: it is {codegen.NOT_GENERATED} (its first line is not "
                f"'{GENERATED_MARK.strip()} ...'), so it is not replaced; move it or rename the spec "
                f"'{item.spec.name}' (its `name:`), or pass another --out"
            )


def _write(items: list[Any], out_dir: Path) -> list[Path]:
    """Write each planned file whose text changed; the paths written."""
    from layoutgen import codegen

    written = []
    for item in items:
        try:
            if codegen.write_if_changed(item.path, item.content):
                written.append(item.path)
        except OSError as error:
            raise bad_input(f"cannot write {item.path}: {error.strerror or error}") from error
    return written


def _verify_staged(modules: list[Any]) -> list[Any]:
    """Verify the text each module is about to get, imported from a fresh private temporary directory: a module
    joins --out only once it passed, and what was verified is exactly the text written (never a module the
    loader, which caches by path and file version, imported from --out earlier in this process)."""
    import tempfile

    try:
        staging = tempfile.TemporaryDirectory(prefix="layoutgen-build-")
    except OSError as error:
        raise bad_input(
            f"cannot create a directory to verify the modules in, in {tempfile.gettempdir()} "
            f"({error.strerror or error}); set TMPDIR to a writable directory, or pass --no-verify"
        ) from None
    with staging as directory:
        paths = []
        for item in modules:
            path = Path(directory) / item.path.name
            try:
                path.write_text(item.content, encoding="utf-8")
            except OSError as error:
                raise bad_input(
                    f"cannot write {path} to verify it ({error.strerror or error}); set TMPDIR to a directory "
                    "with free space, or pass --no-verify"
                ) from None
            paths.append(path)
        return verify_modules(paths)


def _withdraw(item: Any) -> str:
    """Make sure the output of a module that failed verification holds no module that failed: the same text
    already there is removed, a different one (which this build did not verify) is kept.  What was done."""
    from layoutgen import codegen

    try:
        removed = codegen.remove_if_unchanged(item.path, item.content)
    except OSError as error:
        reason = error.strerror or error
        return f"{item.spec.name}: cannot remove {item.path}, which holds this failing module ({reason}); delete it"
    if removed:
        return f"{item.spec.name}: removed {item.path}, which held this failing module"
    if os.path.lexists(item.path):
        return f"{item.spec.name}: {item.path} not replaced: the module it held stays (not this spec's current one)"
    return f"{item.spec.name}: {item.path} not written"


def verify_modules(paths: list[Path]) -> list[Any]:
    """Run each module against its family's torch reference (in a child process, which a kernel writing outside
    its buffers may kill: `layoutgen.verification`) and compile it offline; print a table per module and each
    failure, and return the reports."""
    from layoutgen.verification import verify_in_subprocess

    def header(device: str) -> None:
        where = f"{device}{', Triton interpreter' if device == 'cpu' else ''}"
        say(f"verifying against each family's torch reference ({where}):")

    reports = _with_offline_compiles(paths, verify_in_subprocess(paths, header))
    kernel_width = max((len(check.kernel) for report in reports for check in report.checks), default=0)
    for report in reports:
        say(report.spec_name, "bold")
        console.print(checks_table(report, kernel_width))
    failed = [failure for report in reports for failure in report.failures]
    for failure in failed[:20]:
        say(failure, "red", err=True)
    return reports


def _with_offline_compiles(paths: list[Path], reports: list[Any]) -> list[Any]:
    """Each report with a row per kernel for its compile for sm_90 at 32- and 64-bit offsets (the modules whose
    family declares `offline_jobs`): the interpreter runs a kernel's Python and never sees what only Triton's
    compiler refuses, and a GPU run compiles only the shapes it meets."""
    import dataclasses

    from layoutgen.family import Check, Family, get_family
    from layoutgen.tuning.offline import check_in_subprocesses, unavailable
    from layoutgen.verification import UNKNOWN_FAMILY

    # Only the modules of families that declare offline jobs go to a compile process (not a module that never
    # loaded or whose verification died: its report names no family).
    declares = {
        r.family: r.family != UNKNOWN_FAMILY and type(get_family(r.family)).offline_jobs is not Family.offline_jobs
        for r in reports
    }
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
