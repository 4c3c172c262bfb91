"""`layoutgen show` and `layoutgen diff`: draw a layout's bytes, and compare two layouts element by element.

Registered on the main app by `layoutgen.cli` (see `register`).
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from layoutgen.spec import NAME_PATTERN, LayoutSpec

if TYPE_CHECKING:
    from layoutgen.show import Problem


class DtypeName(str, Enum):
    bfloat16 = "bfloat16"
    float16 = "float16"
    float32 = "float32"


SpecArgument = Annotated[str, typer.Argument(help="A bundled spec name (e.g. pynccl_a2a) or a spec YAML file.")]
PeersOption = Annotated[int, typer.Option("--N", min=1, help="Peers (ranks) exchanging heads.")]
BatchOption = Annotated[
    int, typer.Option("--batch", min=1, help="Live batch rows B; buffers hold B + 1 so an unused row shows.")
]
HeadsOption = Annotated[int, typer.Option("--heads", min=1, help="Heads H, divisible by N.")]
DimOption = Annotated[int, typer.Option("--D", min=1, help="Head dim D.")]
DtypeOption = Annotated[DtypeName, typer.Option("--dtype", help="Activation dtype of `out`.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for tools instead of the drawing.")]


def resolve_spec(text: str) -> LayoutSpec:
    """A bundled spec by name, else a YAML file; a SpecError names the file and field."""
    import re

    from layoutgen.spec import bundled_spec_paths, bundled_specs, load_spec

    path = Path(text)
    if re.fullmatch(NAME_PATTERN, text) and not path.is_file():
        specs = bundled_specs()
        if text in specs:
            return specs[text]
        from layoutgen.cli import CommandFailed

        known = ", ".join(p.stem for p in bundled_spec_paths())
        raise CommandFailed(f"no bundled spec named '{text}' and no file of that name; bundled specs: {known}", code=2)
    return load_spec(path)


def _problem(N: int, batch: int, heads: int, head_dim: int, dtype: DtypeName) -> Problem:
    from layoutgen.show import problem_from

    return problem_from(N, batch, heads, head_dim, dtype.value)


def _user_error(error: Exception) -> Exception:
    from layoutgen.cli import CommandFailed

    return CommandFailed(str(error), code=2)


def show(
    spec: SpecArgument,
    N: PeersOption = 4,
    batch: BatchOption = 2,
    heads: HeadsOption = 8,
    head_dim: DimOption = 16,
    dtype: DtypeOption = DtypeName.bfloat16,
    png: Annotated[
        Path | None, typer.Option("--png", help="Also write the drawing as a PNG (needs layoutgen[plot]).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Draw every buffer of a spec byte by byte: which peer, batch row, head and element sits where."""
    from layoutgen import show as show_module

    layout = resolve_spec(spec)
    try:
        bmap = show_module.byte_map(layout, _problem(N, batch, heads, head_dim, dtype))
    except (ValueError, TypeError) as error:
        raise _user_error(error) from None
    if as_json:
        sys.stdout.write(show_module.to_json(bmap))
    else:
        show_module.text_console().print(show_module.renderable(bmap))
    if png is not None:
        try:
            size = show_module.write_png(bmap, png)
        except ImportError as error:
            raise _user_error(error) from None
        except OSError as error:
            from layoutgen.cli import CommandFailed

            raise CommandFailed(f"cannot write {png}: {error.strerror or error}", code=2) from error
        typer.echo(f"wrote {png} ({size} bytes)", err=True)


def diff(
    spec_a: Annotated[str, typer.Argument(help="Layout A: a bundled spec name or a spec YAML file.")],
    spec_b: Annotated[str, typer.Argument(help="Layout B: a bundled spec name or a spec YAML file.")],
    N: PeersOption = 4,
    batch: BatchOption = 2,
    heads: HeadsOption = 8,
    head_dim: DimOption = 16,
    dtype: DtypeOption = DtypeName.bfloat16,
    as_json: JsonOption = False,
) -> None:
    """Where the same logical element (peer, batch, head, d or lse) lands in layout A and in layout B."""
    from layoutgen import show as show_module

    layout_a, layout_b = resolve_spec(spec_a), resolve_spec(spec_b)
    try:
        result = show_module.diff_layouts(layout_a, layout_b, _problem(N, batch, heads, head_dim, dtype))
    except (ValueError, TypeError) as error:
        raise _user_error(error) from None
    if as_json:
        sys.stdout.write(show_module.diff_to_json(result))
    else:
        show_module.text_console().print(show_module.diff_renderable(result))


def register(app: typer.Typer) -> None:
    app.command("show")(show)
    app.command("diff")(diff)
