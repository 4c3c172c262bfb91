"""The framework claim: adding a family is one package and one registry line, and the shared machinery
knows no family.

`tests/plugin_family/stridecopy` is a throw-away family (a strided copy); the first test copies it into a
temporary directory, registers it there, and runs build, verification, a tune under the interpreter,
dispatch from the database it wrote, and `show`, without touching shared code.  The others read the
package's source: no import cycles, no shared module importing a family, no module far above 400 lines.
"""

from __future__ import annotations

import ast
import io
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, requires_interpreter
from rich.console import Console
from typer.testing import CliRunner

from layoutgen import family as family_registry

PACKAGE = REPO_ROOT / "layoutgen"
PLUGIN = Path(__file__).resolve().parent / "plugin_family" / "stridecopy"


@pytest.fixture
def stridecopy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The test family, importable from a temporary directory and registered for this test only."""
    packages = tmp_path / "packages"
    shutil.copytree(PLUGIN, packages / "stridecopy")
    monkeypatch.syspath_prepend(str(packages))
    monkeypatch.setenv("LAYOUTGEN_CACHE_DIR", str(tmp_path / "cache"))
    family_registry.register("stridecopy", "stridecopy")
    try:
        yield packages
    finally:
        family_registry.unregister("stridecopy")
        for name in [name for name in sys.modules if name == "stridecopy" or name.startswith("stridecopy.")]:
            del sys.modules[name]


SPEC_TEXT = """\
family: stridecopy
name: transposed_copy
summary: a transposing copy, to prove a family can live outside layoutgen
order: [col, row]
"""


@requires_interpreter
def test_a_family_from_a_temporary_directory_builds_verifies_tunes_dispatches_and_draws(
    stridecopy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from layoutgen.cli import app
    from layoutgen.cli.common import expand_arguments
    from layoutgen.loader import load_path
    from layoutgen.runtime import configs
    from layoutgen.show import byte_map, render_text, renderable
    from layoutgen.spec import load_spec
    from layoutgen.tuning import plan, runner
    from layoutgen.tuning_db import read_database

    spec_file = tmp_path / "transposed_copy.yaml"
    spec_file.write_text(SPEC_TEXT)
    out = tmp_path / "out"
    built = CliRunner().invoke(app, expand_arguments(["build", "--spec", str(spec_file), "--out", str(out)]))
    assert built.exit_code == 0, built.output
    assert "transposed_copy" in built.output and "bytes identical" in built.output
    # Its offline compile ran in a child process that found the family registered here.
    assert "compiles for sm_90 with 32-bit offsets" in built.output, built.output

    module = load_path(out / "transposed_copy.py")
    source = torch.randn(5, 7)[:, ::1]
    assert torch.equal(module.copy(source), source.t())

    options = plan.TuneOptions(
        specs=(str(spec_file),),
        storage=str(tmp_path / "studies.journal"),
        db_dir=str(tmp_path / "db"),
        interpret=True,
        trials=2,
        exhaustive_limit=8,
        lookahead=1,
    )
    summary = runner.run(options, Console(file=io.StringIO(), width=120))
    assert summary.gate_failures == 0 and summary.unfinished == 0 and summary.db_path is not None
    (entry,) = read_database(summary.db_path).entries.values()
    assert entry.key.as_str() == "stridecopy|transposed_copy|copy|C=5|float32|R=3"

    monkeypatch.setenv("LAYOUTGEN_TUNING_DB", str(summary.db_path.parent))
    configs.reset()
    decl = module._get_family("stridecopy").kernel("copy")
    chosen = configs.resolve_config(
        "stridecopy", "transposed_copy", decl, torch.device("cpu"), {"C": 5}, "float32", 3,
        module.SPEC_HASH, module.SOURCE_HASHES["copy"], lambda: pytest.fail("dispatch fell back to the default"),
    )  # fmt: skip
    assert chosen.as_dict() == entry.config
    configs.reset()

    drawing = render_text(renderable(byte_map(load_spec(spec_file), {"R": 2, "C": 3}, "float32")))
    assert "transposed_copy" in drawing and "r0..1 c0" in drawing
    shown = CliRunner().invoke(app, expand_arguments(["show", str(spec_file), "--shape", "C=2"]))
    assert shown.exit_code == 0 and "6 elements" not in shown.output and "4 elements" in shown.output


def test_a_family_registered_by_the_environment_is_listed(stridecopy: Path) -> None:
    env = {**os.environ, "LAYOUTGEN_FAMILIES": "stridecopy=stridecopy", "PYTHONPATH": str(stridecopy)}
    result = subprocess.run(
        [sys.executable, "-m", "layoutgen.cli", "families"], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "stridecopy: a strided copy (the test family)" in result.stdout
    assert "dcp: decode-context-parallel" in result.stdout


def test_unknown_and_misregistered_families_are_clear_errors() -> None:
    from layoutgen.spec import SpecError, parse_spec

    with pytest.raises(SpecError, match="family: unknown family 'nope'; known families: dcp"):
        parse_spec({"family": "nope", "name": "x_y", "summary": "s"})
    with pytest.raises(ValueError, match="already registered"):
        family_registry.register("dcp", "somewhere.else")
    with pytest.raises(ValueError, match="must match"):
        family_registry.register("Bad Name", "x")


# ---------------------------------------------------------------------------------------------------------
# The package's structure, read from its source
# ---------------------------------------------------------------------------------------------------------
def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """Every layoutgen module `module` imports (at import time or inside functions), except under
    `if TYPE_CHECKING:`.  `from package import submodule` depends on the submodule, not on the rest of the
    package's `__init__`."""
    found: set[str] = set()
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skipped |= {id(child) for child in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("layoutgen")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.startswith("layoutgen"):
                submodules = {f"{target}.{alias.name}" for alias in node.names} & modules
                found |= submodules
                if len(submodules) < len(node.names):
                    found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    sources = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for module, path in sources.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = _imports(tree, module, path.name == "__init__.py", set(sources))
        graph[module] = {name for name in imported if name in sources}
        graph[module].discard(module)
    return graph


def test_the_package_has_no_import_cycles() -> None:
    graph = import_graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_shared_modules_import_no_family() -> None:
    families = {f"layoutgen.{name}" for name in ("dcp", "ulysses")} | {
        module.rsplit(".", 1)[0] for module in family_registry.BUILTIN_FAMILIES.values()
    }
    families |= set(family_registry.BUILTIN_FAMILIES.values())
    offenders = {
        module: sorted(target for target in targets if any(target.startswith(f) for f in families))
        for module, targets in import_graph().items()
        if not any(module == f or module.startswith(f + ".") for f in families)
    }
    assert not {module: targets for module, targets in offenders.items() if targets}


def test_no_module_is_far_above_400_lines() -> None:
    sizes = {
        path.relative_to(REPO_ROOT): len(path.read_text(encoding="utf-8").splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    assert not {str(path): lines for path, lines in sizes.items() if lines > 450}


def test_layoutgen_variables_are_read_only_in_the_settings_module() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "settings.py" and path.parent == PACKAGE:
            continue
        text = path.read_text(encoding="utf-8")
        for line_number, line in enumerate(text.splitlines(), 1):
            if "LAYOUTGEN_" in line and ("environ" in line or "getenv" in line):
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{line_number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_the_readme_documents_every_variable_the_settings_declare() -> None:
    """README's environment table holds each variable's row as the settings word it (`layoutgen.settings`)."""
    from layoutgen.settings import VARIABLES

    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    missing = [variable.name for variable in VARIABLES if f"| `{variable.name}` | {variable.help} |" not in readme]
    assert not missing, f"README's environment table lacks, or words otherwise than layoutgen.settings, {missing}"
