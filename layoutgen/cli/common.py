"""What every `layoutgen` subcommand shares: the consoles, the error type, spec resolution, shapes.

Subcommands import from here, never from each other or from `layoutgen.cli` (the app imports them).
Nothing here knows a family's words: shape extents and their option aliases come from the families.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.console import Console

console = Console(highlight=False)
errors = Console(stderr=True, soft_wrap=True, highlight=False)  # one error per line: paths never wrap
debug = {"on": False}


class OutputClosed(Exception):
    """The reader of stdout went away (`layoutgen ... | head`): not an error, the command just ends."""


class GuardedStdout:
    """sys.stdout while a command runs: a closed pipe surfaces as OutputClosed, which no library takes for
    its own error (click turns a broken pipe into exit 1, rich into exit 1 too), so the entry point can end
    the command with exit 0.  Everything else is the wrapped stream's."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self.stream.write(text))
        except BrokenPipeError:
            raise OutputClosed from None

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            raise OutputClosed from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class CommandFailed(Exception):
    """A failure already explained to the user; carries the exit code (2: bad input, 1: a real failure)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def bad_input(message: str) -> CommandFailed:
    return CommandFailed(message, code=2)


def say(text: str, style: str | None = None, *, err: bool = False, wrap: bool = True) -> None:
    """Print user-facing text that may hold paths, names or exception messages: never read as markup.
    `wrap=False` keeps a line whole (a table row is one line for grep, the terminal wraps it if it must)."""
    (errors if err else console).print(text, style=style, markup=False, highlight=False, soft_wrap=not wrap or None)


def resolve_spec(text: str) -> Any:
    """A bundled spec by name, else a YAML file; a SpecError names the file and field."""
    from layoutgen.spec import NAME_PATTERN, bundled_spec_paths, bundled_specs, load_spec

    path = Path(text)
    if re.fullmatch(NAME_PATTERN, text) and not path.is_file():
        specs = bundled_specs()
        if text in specs:
            return specs[text]
        known = ", ".join(p.stem for p in bundled_spec_paths())
        raise bad_input(f"no bundled spec named '{text}' and no file of that name; bundled specs: {known}")
    return load_spec(path)


def resolve_spec_source(text: str) -> tuple[Any, Path]:
    """(spec, its file) for a bundled spec name or a YAML path (what `build --spec` takes)."""
    from layoutgen.spec import NAME_PATTERN, bundled_spec_paths

    if re.fullmatch(NAME_PATTERN, text) and not Path(text).is_file():
        for path in bundled_spec_paths():
            if path.stem == text:
                return resolve_spec(text), path
    spec = resolve_spec(text)
    return spec, Path(text)


def parse_shape(items: Iterable[str], option: str = "--shape") -> dict[str, list[int]]:
    """`["N=2,4", "D=512"]` -> {"N": [2, 4], "D": [512]}; a malformed item is a bad-input error."""
    shape: dict[str, list[int]] = {}
    for item in items:
        name, separator, values = item.partition("=")
        name = name.strip()
        try:
            numbers = [int(value) for value in values.split(",") if value.strip()]
        except ValueError:
            numbers = []
        if not separator or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or not numbers:
            raise bad_input(f"{option} takes NAME=VALUE[,VALUE...], e.g. {option} N=4; got {item!r}")
        if any(number < 1 for number in numbers):
            raise bad_input(f"{option} {name}: extents are positive integers; got {item!r}")
        shape.setdefault(name, []).extend(numbers)
    return shape


def single_values(shape: dict[str, list[int]], defaults: dict[str, int], what: str) -> dict[str, int]:
    """One value per extent (a drawing is one shape), defaults for the rest; unknown extents are errors."""
    unknown = set(shape) - set(defaults)
    if unknown:
        raise bad_input(f"{what} has no extent {', '.join(sorted(unknown))}; its extents: {', '.join(defaults)}")
    values = dict(defaults)
    for name, numbers in shape.items():
        if len(numbers) != 1:
            raise bad_input(f"--shape {name}: a drawing takes one value, got {numbers}")
        values[name] = numbers[0]
    return values


def family_aliases(command: str) -> dict[str, str]:
    """Option alias -> extent name for `command`, collected from every registered family (e.g. DCP's
    `--heads` is `--shape H=`); `tune` also maps each family's bucket alias to `--bucket`."""
    from layoutgen.family import families

    aliases: dict[str, str] = {}
    try:
        registered = families()
    except Exception:  # a broken plug-in family must not take the CLI down: its aliases are just missing
        return aliases
    for family in registered:
        if command == "tune":
            for axis in family.grid_axes:
                if axis.alias:
                    aliases[f"--{axis.alias}"] = axis.name
            if family.bucket.alias:
                aliases[f"--{family.bucket.alias}"] = "--bucket"
        elif command in ("show", "diff"):
            aliases.update({f"--{alias}": name for alias, name in family.show_aliases.items()})
    return aliases


#: `tune` options that take several values: `--spec a b` is read as `--spec a --spec b`.
LIST_OPTIONS = frozenset({"--spec", "--kernel", "--dtype", "--bucket", "--shape"})
#: Flags the top-level app takes wherever they stand on the command line.
GLOBAL_FLAGS = frozenset({"--debug"})


def expand_arguments(args: list[str]) -> list[str]:
    """Rewrite a command line into what typer parses.

    * `--debug` anywhere moves before the subcommand;
    * a family's alias becomes `--shape`: `show X --heads 8` is `show X --shape H=8`, `tune --N 2 4` is
      `tune --shape N=2,4`, and `tune --batch 1 64` is `tune --bucket 1 --bucket 64`;
    * `tune --spec a b` is `tune --spec a --spec b` (tune takes no positional argument, so every bare word
      after a list option is one of its values).
    """
    front = [arg for arg in args if arg in GLOBAL_FLAGS]
    rest = [arg for arg in args if arg not in GLOBAL_FLAGS]
    command_at = next((index for index, arg in enumerate(rest) if not arg.startswith("-")), None)
    if command_at is None:
        return front + rest
    command = rest[command_at]
    aliases = family_aliases(command)
    expanded = front + rest[: command_at + 1]
    tail = rest[command_at + 1 :]
    index = 0
    while index < len(tail):
        arg = tail[index]
        option, equals, inline = arg.partition("=")
        if option in aliases and option not in LIST_OPTIONS:
            values = [inline] if equals else []
            index += 1
            while index < len(tail) and not tail[index].startswith("-") and (command == "tune" or not values):
                values.append(tail[index])
                index += 1
            if aliases[option] == "--bucket":
                expanded += [item for value in values for item in ("--bucket", value)]
            else:
                expanded += ["--shape", f"{aliases[option]}={','.join(values)}"]
            continue
        expanded.append(arg)
        index += 1
        if command == "tune" and arg in LIST_OPTIONS:
            first = True
            while index < len(tail) and not tail[index].startswith("-"):
                if not first:
                    expanded.append(arg)
                expanded.append(tail[index])
                first = False
                index += 1
    return expanded


def check_writable_dir(directory: Path, what: str) -> None:
    """`directory` exists (or can be created) and takes new files: tried with a temporary file in it or in its
    nearest existing parent, which covers permissions, read-only file systems and paths under a regular file."""
    import tempfile

    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise bad_input(f"{what}: {existing} is {'not a directory' if existing == directory else 'a file'}")
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".layoutgen-probe-"):
            pass
    except OSError as error:
        raise bad_input(f"{what}: cannot write to {existing} ({error.strerror or error})") from None
