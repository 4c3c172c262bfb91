"""`layoutgen show` and `layoutgen diff`: draw a layout's bytes, and compare two layouts element by element."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from layoutgen.cli.common import (
    FamilyAliasHelp,
    alias_help,
    bad_input,
    check_unused_extents,
    parse_shape,
    resolve_spec,
    say,
    single_values,
)
from layoutgen.cli.paths import check_name_lengths, check_output_file

SpecArgument = Annotated[
    str, typer.Argument(metavar="SPEC", help="A bundled spec name (e.g. pynccl_a2a) or a spec YAML file.")
]


def _shape_option(command: str) -> Any:
    """`--shape` of `command`, its help ending with the aliases the families declare for it."""
    return FamilyAliasHelp.wrapping(
        typer.Option(
            "--shape",
            metavar="NAME=VALUE",
            help="One extent of the drawing, NAME=VALUE (repeatable), e.g. --shape N=2; extents not given take "
            "the family's drawing defaults.",
        ),
        lambda: alias_help(command),
    )


ShowShapeOption = Annotated[list[str] | None, _shape_option("show")]
DiffShapeOption = Annotated[list[str] | None, _shape_option("diff")]
DtypeOption = Annotated[
    str | None, typer.Option("--dtype", metavar="DTYPE", help="Activation dtype. Default: the family's.")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for tools instead of the drawing.")]


def _shape_of(specs: list[Any], shape: list[str] | None, dtype: str | None) -> tuple[dict[str, int], str]:
    """The drawing's extents and dtype for `specs` (one family's)."""
    from layoutgen.family import get_family

    family = get_family(specs[0].family)
    # An extent whose drawing default is 0 (DCP's empty rows) may be given as 0.
    zero_by_default = [name for name, value in family.show_shape.items() if value == 0]
    given = parse_shape(shape or [], may_be_zero=zero_by_default)
    values = single_values(given, dict(family.show_shape), f"the {family.name} family's drawing")
    check_unused_extents(given, specs)
    chosen = dtype or family.default_dtypes[0]
    if chosen not in family.dtypes:
        raise bad_input(f"--dtype {chosen}: the {family.name} family takes {', '.join(family.dtypes)}")
    return values, chosen


def show(
    spec: SpecArgument,
    shape: ShowShapeOption = None,
    dtype: DtypeOption = None,
    png: Annotated[
        str | None,  # text, not Path: Path("") is ".", which `--png ""` must not mean
        typer.Option(
            "--png", metavar="FILE", help="Also write the drawing as a PNG (needs matplotlib: layoutgen[plot])."
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Draw every buffer of a spec byte by byte: which logical element sits where."""
    from layoutgen import show as show_module

    layout = resolve_spec(spec)
    values, chosen = _shape_of([layout], shape, dtype)
    target = _png_target(png, Path(spec)) if png is not None else None
    if target is not None:
        try:
            show_module.png.require_matplotlib()  # fail before printing anything
        except ImportError as error:
            raise bad_input(str(error)) from None
    try:
        bmap = show_module.byte_map(layout, values, chosen)
        if target is not None:
            hint = "Draw a smaller shape (the pattern is the same at any size), or leave --png out for the text"
            show_module.png.check_png_size(bmap, hint)
    except (ValueError, TypeError) as error:
        raise bad_input(str(error)) from None
    if as_json:
        sys.stdout.write(show_module.to_json(bmap))
    else:
        show_module.text_console().print(show_module.renderable(bmap))
    if target is not None:
        try:
            size = show_module.png.write_png(bmap, target)
        except OSError as error:
            raise bad_input(f"cannot write {target}: {error.strerror or error}") from error
        say(f"wrote {target} ({size} bytes)", err=True)


def _png_target(text: str, spec_file: Path) -> Path:
    """The --png file, checked before anything is drawn: a name, not a directory, no device and not the spec
    being drawn, in a writable directory."""
    if not text:
        raise bad_input("--png needs a file name, e.g. --png layout.png")
    path = Path(text)
    check_name_lengths(path, f"--png {path}")
    if path.is_dir():
        raise bad_input(f"--png {path} is a directory; name a file, e.g. --png {path / 'layout.png'}")
    check_output_file(path, f"--png {path}", [spec_file])
    return path


def diff(
    spec_a: Annotated[str, typer.Argument(metavar="SPEC_A", help="Layout A: a bundled spec name or a spec YAML file.")],
    spec_b: Annotated[str, typer.Argument(metavar="SPEC_B", help="Layout B: a bundled spec name or a spec YAML file.")],
    shape: DiffShapeOption = None,
    dtype: DtypeOption = None,
    runs: Annotated[bool, typer.Option("--runs", help="List every run, not only the summary.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Where the same logical element lands in layout A and in layout B: a summary, every run with --runs."""
    from layoutgen import show as show_module

    layout_a, layout_b = resolve_spec(spec_a), resolve_spec(spec_b)
    if layout_a.family != layout_b.family:
        raise bad_input(
            f"{spec_a} is a {layout_a.family} spec and {spec_b} a {layout_b.family} spec: only layouts of one "
            "family hold the same logical elements"
        )
    values, chosen = _shape_of([layout_a, layout_b], shape, dtype)
    try:
        result = show_module.diff_layouts(layout_a, layout_b, values, chosen)
    except (ValueError, TypeError) as error:
        raise bad_input(str(error)) from None
    if as_json:
        sys.stdout.write(show_module.diff_to_json(result))
    else:
        show_module.text_console().print(show_module.diff_renderable(result, runs=runs))
