"""What an out-of-tree family's author meets: the documented interface, checked declarations, specs kept out
of layoutgen's bundled set, schema pointers of its own, and an import of its module that says how to register it.

Each test uses `tests/plugin_family/stridecopy`, copied into a temporary directory and registered there.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from conftest import REPO_ROOT
from typer.testing import CliRunner

from layoutgen import codegen
from layoutgen import family as family_registry
from layoutgen.tuning.problem import Problem

PLUGIN = Path(__file__).resolve().parent / "plugin_family" / "stridecopy"
SPEC_TEXT = """\
family: stridecopy
name: plugin_copy
summary: a copy of the test family's
order: [row, col]
"""


@pytest.fixture
def stridecopy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The test family's package, importable from a temporary directory (with a `specs/` folder of one spec)
    and registered for this test only."""
    packages = tmp_path / "packages"
    shutil.copytree(PLUGIN, packages / "stridecopy")
    (packages / "stridecopy" / "specs").mkdir()
    (packages / "stridecopy" / "specs" / "plugin_copy.yaml").write_text(SPEC_TEXT)
    monkeypatch.syspath_prepend(str(packages))
    monkeypatch.setenv("LAYOUTGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LAYOUTGEN_FAMILIES", raising=False)
    family_registry.register("stridecopy", "stridecopy")
    try:
        yield sys.modules[type(family_registry.get_family("stridecopy")).__module__]
    finally:
        family_registry.unregister("stridecopy")
        for name in [name for name in sys.modules if name == "stridecopy" or name.startswith("stridecopy.")]:
            del sys.modules[name]


# ---------------------------------------------------------------------------------------------------------
# 1. The documented interface is the one the code has
# ---------------------------------------------------------------------------------------------------------
def _module_template_names() -> set[str]:
    """The names `codegen.render_module` passes to the module template besides the family's context."""
    tree = ast.parse(inspect.getsource(codegen.render_module))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "render":
            receiver = node.func.value
            if isinstance(receiver, ast.Call) and "module_template" in ast.unparse(receiver):
                return {keyword.arg for keyword in node.keywords if keyword.arg is not None}
    raise AssertionError("codegen.render_module no longer renders Family.module_template")


def test_the_module_template_comment_lists_every_name_codegen_passes() -> None:
    source = (REPO_ROOT / "layoutgen" / "family.py").read_text(encoding="utf-8").splitlines()
    at = next(i for i, line in enumerate(source) if line.strip().startswith("module_template: ClassVar"))
    start = at
    while source[start - 1].strip().startswith("#:"):
        start -= 1
    comment = "\n".join(source[start:at])
    names = _module_template_names()
    assert names >= {"header", "spec_constants", "name", "family", "kernels"}
    assert not {name for name in names if f"#:   {name} " not in comment}, comment
    assert "_parse_spec" in comment and "render_context" in comment


def test_the_design_doc_says_what_a_family_writes_and_which_helpers_it_calls() -> None:
    design = (REPO_ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    section = design[design.index("### 2.1 The family interface") : design.index("## 3. Specs")]
    assert "Everything else is shared" not in section
    for helper in (
        "runtime.configs.resolve_config(family, spec_name, kernel, device, extents, dtype, size, spec_hash",
        "runtime.plans.plans_of",
        "runtime.launch.record_launches",
        "check_runnable(kernel, *tensors)",
        "OverlapGuard",
        "tuning.objective.Workload",
        "tuning.compile.CompileJob",
        "variant_args",
        "CANARY",
        "Family.module_template",
        "dcp/dispatch.py",
        "ulysses/dispatch.py",
    ):
        assert helper in section, helper
    from layoutgen.runtime.configs import resolve_config

    assert list(inspect.signature(resolve_config).parameters)[:10] == [
        "family", "spec_name", "kernel", "device", "extents", "dtype", "size", "spec_hash", "source_hash", "default",
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# 2. Declarations are checked where the tuner binds a space
# ---------------------------------------------------------------------------------------------------------
def _copy_problem() -> Problem:
    from layoutgen.spec import parse_spec_text

    return Problem(parse_spec_text(SPEC_TEXT), "copy", (("C", 5),), "float32")


def _with_space(module: ModuleType, monkeypatch: pytest.MonkeyPatch, **space: object) -> None:
    kernel = dataclasses.replace(module.COPY, space=dataclasses.replace(module.COPY.space, **space))
    monkeypatch.setattr(module.StrideCopy, "kernels", (kernel,))


def test_a_tiled_axis_without_an_extent_names_the_family_kernel_and_fix(
    stridecopy: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from layoutgen.family import FamilyDeclarationError
    from layoutgen.tuning.space import bind

    _with_space(stridecopy, monkeypatch, blocks=(("block_row", "rows"), ("block_col", "col")))
    with pytest.raises(FamilyDeclarationError) as raised:
        bind(_copy_problem(), 3)
    message = str(raised.value)
    assert "family 'stridecopy', kernel 'copy'" in message
    assert "SearchSpace.blocks tiles axis 'rows' (config field block_row), which has no extent" in message
    assert "space_extents()" in message and "row, col" in message


def test_an_innermost_axis_that_is_no_extent_is_refused(
    stridecopy: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from layoutgen.family import FamilyDeclarationError, SpaceExtents
    from layoutgen.tuning.space import bind

    def space_extents(self: object, problem: object, bucket: int) -> SpaceExtents:
        return SpaceExtents({"row": bucket, "col": 5}, "column", 4, floors={"cols": 2})

    monkeypatch.setattr(stridecopy.StrideCopy, "space_extents", space_extents)
    with pytest.raises(
        FamilyDeclarationError, match=re.escape("SpaceExtents.innermost 'column' is not an extent")
    ) as raised:
        bind(_copy_problem(), 3)
    assert "SpaceExtents.floors names axis 'cols'" in str(raised.value)


def test_a_space_that_contradicts_its_config_type_is_refused(
    stridecopy: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from layoutgen.family import FamilyDeclarationError
    from layoutgen.tuning.space import bind

    _with_space(stridecopy, monkeypatch, blocks=(("block_rows", "row"), ("block_col", "col")), caps={"dim": 8})
    with pytest.raises(FamilyDeclarationError) as raised:
        bind(_copy_problem(), 3)
    message = str(raised.value)
    assert "searches 'block_rows', which is not a field of CopyConfig" in message
    assert "leaves CopyConfig field 'block_row' unsearched" in message
    assert "caps names axis 'dim', which SearchSpace.blocks does not tile" in message


def test_the_shipped_families_declarations_pass() -> None:
    from layoutgen.tuning.space import check_declared_space

    for family in family_registry.bundled_families():
        for kernel in family.kernels:
            check_declared_space(family.name, kernel)


# ---------------------------------------------------------------------------------------------------------
# 3. A plugin's specs are not layoutgen's bundled specs
# ---------------------------------------------------------------------------------------------------------
def test_a_plugins_specs_stay_out_of_the_bundled_set_and_build_check(stridecopy: ModuleType) -> None:
    from layoutgen.cli import app
    from layoutgen.spec import bundled_spec_paths, bundled_specs

    assert family_registry.get_family("stridecopy").spec_dir.joinpath("plugin_copy.yaml").is_file()
    assert "plugin_copy" not in [path.stem for path in bundled_spec_paths()]
    assert "plugin_copy" not in bundled_specs()
    checked = CliRunner().invoke(app, ["build", "--check"])
    assert checked.exit_code == 0, checked.output
    assert "plugin_copy" not in checked.output


# ---------------------------------------------------------------------------------------------------------
# 4. A plugin's spec errors point at its own schema
# ---------------------------------------------------------------------------------------------------------
def test_spec_errors_point_at_the_familys_schema(stridecopy: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    from layoutgen.spec import SpecError, parse_spec_text

    with pytest.raises(SpecError) as raised:
        parse_spec_text(SPEC_TEXT + "colour: red\n")
    assert "the stridecopy family's spec model stridecopy.CopySpec" in str(raised.value)
    assert "docs/design.md" not in str(raised.value)

    monkeypatch.setattr(stridecopy.StrideCopy, "schema_doc", "https://example.org/stridecopy#spec")
    with pytest.raises(SpecError, match=re.escape("see https://example.org/stridecopy#spec for the schema")):
        parse_spec_text(SPEC_TEXT + "colour: red\n")
    with pytest.raises(SpecError, match=re.escape("see docs/design.md §3 for the schema")):
        parse_spec_text("family: ulysses\nname: x_y\nsummary: s\ncolour: red\n")


# ---------------------------------------------------------------------------------------------------------
# 5. A generated module of an unregistered family says how to register it
# ---------------------------------------------------------------------------------------------------------
def test_importing_a_module_of_an_unregistered_family_names_the_file_and_the_fix(
    stridecopy: ModuleType, tmp_path: Path
) -> None:
    from layoutgen.loader import load_path
    from layoutgen.spec import SpecError, parse_spec_text

    path = tmp_path / "out" / "plugin_copy.py"
    path.parent.mkdir()
    path.write_text(codegen.render(parse_spec_text(SPEC_TEXT), "plugin_copy.yaml"))
    family_registry.unregister("stridecopy")
    with pytest.raises(SpecError) as raised:
        load_path(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: cannot import this generated module")
    assert "layoutgen_generated_" not in message
    assert "layoutgen.family.register('stridecopy', 'PACKAGE')" in message
    assert "LAYOUTGEN_FAMILIES=stridecopy=PACKAGE" in message
