"""What every `layoutgen` subcommand shares: the consoles, the error type, spec resolution, shapes.

Subcommands import from here, never from each other or from `layoutgen.cli` (the app imports them).
Nothing here knows a family's words: shape extents and their option aliases come from the families.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from typer.models import OptionInfo

console = Console(highlight=False)
errors = Console(stderr=True, soft_wrap=True, highlight=False)  # one error per line: paths never wrap
debug = {"on": False}
#: What the command under way adds to "interrupted" / "terminated" once it has started work that a re-run resumes.
#: Every way a run can stop prints it: the command's own handler, and the entry point's, which ends the run when a
#: Ctrl-C landed where CPython could not raise it (a __del__, a weakref callback) and the command went on.
stop_note: dict[str, str | None] = {"text": None}


def stopped_message(terminated: bool) -> str:
    """The line a stopped run ends with: the signal's word, then the command's note if it set one."""
    word = "terminated" if terminated else "interrupted"
    return word if stop_note["text"] is None else f"{word}: {stop_note['text']}"


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


def printable(text: str) -> str:
    """`text` with the bytes of a path that are not UTF-8 (which Python holds as lone surrogates) shown as
    `\\xff` escapes: a UTF-8 stream refuses the surrogates themselves, and the command would fail printing."""
    if not any("\ud800" <= char <= "\udfff" for char in text):
        return text
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def say(text: str, style: str | None = None, *, err: bool = False, wrap: bool = True) -> None:
    """Print user-facing text that may hold paths, names or exception messages: never read as markup.
    `wrap=False` keeps a line whole (a table row is one line for grep, the terminal wraps it if it must)."""
    (errors if err else console).print(
        printable(text), style=style, markup=False, highlight=False, soft_wrap=not wrap or None
    )


def resolve_spec(text: str) -> Any:
    """A bundled spec by name, else a YAML file; a SpecError names the file and field."""
    from layoutgen.spec import NAME_PATTERN, bundled_spec_paths, bundled_specs, load_spec

    path = Path(text)
    if re.fullmatch(NAME_PATTERN, text) and not path.is_file():
        specs = bundled_specs()
        if text in specs:
            return specs[text]
        if path.is_dir():  # `--spec specs`, a folder of specs: no spec file either
            raise bad_input(f"{text} is a directory, not a spec: pass a spec YAML file in it ({text}/NAME.yaml)")
        known = ", ".join(p.stem for p in bundled_spec_paths())
        raise bad_input(f"no bundled spec named '{text}' and no file of that name; bundled specs: {known}")
    if path.suffix == ".py":
        raise bad_input(_not_a_spec(path))
    return load_spec(path)


def _not_a_spec(path: Path) -> str:
    """Why a .py file is no spec here, and, for a generated module, the spec YAML its header names."""
    from layoutgen.files import GENERATED_MARK, regular_file_problem

    first = ""
    if regular_file_problem(path) is None:  # never opens a FIFO, which could block
        try:
            with path.open("rb") as file:
                first = file.readline(1000).decode("utf-8", "replace")
        except OSError:
            pass
    source = re.match(re.escape(GENERATED_MARK) + r"\S+ from (.+) \(spec sha256 ", first)
    what = "a module generated by layoutgen" if first.startswith(GENERATED_MARK) else "a Python file"
    built_from = f"; this one was built from {_spec_file_named(path, source.group(1))}, pass that" if source else ""
    return (
        f"{path} is {what}, not a spec: build, show and diff take a bundled spec name or a spec YAML file"
        f"{built_from} (`layoutgen tune --spec` takes generated modules too)"
    )


def _spec_file_named(module: Path, header_name: str) -> str:
    """The spec file a module's header names, as a path from here: the header writes a user's spec by its path
    from the module's directory (`codegen.display_name`); as written where that names no file (a bundled
    spec's path in the package, a file name alone, a file since moved)."""
    beside = module.parent / header_name
    return os.path.relpath(beside) if beside.is_file() else header_name


def resolve_spec_source(text: str) -> tuple[Any, Path]:
    """(spec, its file) for a bundled spec name or a YAML path (what `build --spec` takes)."""
    from layoutgen.spec import NAME_PATTERN, bundled_spec_paths

    if re.fullmatch(NAME_PATTERN, text) and not Path(text).is_file():
        for path in bundled_spec_paths():
            if path.stem == text:
                return resolve_spec(text), path
    spec = resolve_spec(text)
    return spec, Path(text)


def parse_shape(items: Iterable[str], option: str = "--shape", may_be_zero: Iterable[str] = ()) -> dict[str, list[int]]:
    """`["N=2,4", "D=512"]` -> {"N": [2, 4], "D": [512]}; a malformed item is a bad-input error.  Extents are
    positive, but those named in `may_be_zero` (e.g. a drawing's empty rows, 0 by default) may be 0."""
    zero_ok = frozenset(may_be_zero)
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
        if any(number < (0 if name in zero_ok else 1) for number in numbers):
            what = "a non-negative integer" if name in zero_ok else "positive integers"
            raise bad_input(
                f"{option} {name}: {'this extent is' if name in zero_ok else 'extents are'} {what}; got {item!r}"
            )
        shape.setdefault(name, []).extend(numbers)
    return shape


def single_values(shape: dict[str, list[int]], defaults: dict[str, int], what: str) -> dict[str, int]:
    """One value per extent (a drawing is one shape), defaults for the rest; unknown extents are errors."""
    unknown = set(shape) - set(defaults)
    if unknown:
        names = ", ".join(_as_given(name) for name in sorted(unknown))
        raise bad_input(f"{what} has no extent {names}; its extents: {', '.join(defaults)}")
    values = dict(defaults)
    for name, numbers in shape.items():
        if len(numbers) != 1:
            raise bad_input(f"--shape {name}: a drawing takes one value, got {numbers}")
        values[name] = numbers[0]
    return values


#: The commands that read families' option aliases.
ALIAS_COMMANDS = ("tune", "show", "diff")


@dataclass
class FamilyAliases:
    """The families' option aliases of one command (`tune`: grid axes, and bucket aliases read as `--bucket`;
    `show`/`diff`: drawing extents).  An alias that is one of the command's own options is ignored, and one
    that two families declare for different extents applies to neither: `problems` says why, per alias."""

    #: Alias -> the extent it sets (or "--bucket").
    usable: dict[str, str] = field(default_factory=dict)
    #: Alias -> extent -> the families declaring it (what the help lists).
    declared: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    #: Alias -> why the command line may not use it.
    problems: dict[str, str] = field(default_factory=dict)
    #: Aliases ignored because they are the command's own options: one warning each, and a note for the help.
    warnings: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    #: "family 'x' did not load: why" of every family that did not load (its aliases are unknown).
    unloaded: list[str] = field(default_factory=list)
    #: The usable aliases this command line used.
    used: set[str] = field(default_factory=set)

    def help_text(self, buckets: bool = False) -> str:
        """The aliases of `--shape` (or of `--bucket`) as the help lists them."""
        parts = []
        for alias, targets in sorted(self.declared.items()):
            if (set(targets) == {"--bucket"}) != buckets or alias not in self.usable:
                continue
            ((target, owners),) = targets.items()
            what = "" if buckets else f" = {target}"
            parts.append(f"{alias}{what} ({', '.join(owners)})")
        text = f" Aliases: {', '.join(parts)}." if parts else ""
        if buckets:
            return text
        notes = [
            *self.ignored,
            *self.problems.values(),
            *(f"{line}: its aliases are unknown" for line in self.unloaded),
        ]
        return text + "".join(f" {note}." for note in notes)


#: The aliases `expand_arguments` found for the command line being run, by command: `tune --help` lists them.
_found: dict[str, FamilyAliases] = {}


def _as_given(extent: str) -> str:
    """An extent as the command line gave it: `--empty (E)` where a family's alias stood for it."""
    aliases = [alias for found in _found.values() for alias in found.used if found.usable.get(alias) == extent]
    return f"{aliases[0]} ({extent})" if aliases else extent


def alias_help(command: str, buckets: bool = False) -> str:
    """The aliases of `command` for its help (see `FamilyAliases.help_text`).  Read when typer builds the
    commands, after `expand_arguments` collected them: the families load only for the commands that use them."""
    found = _found.get(command)
    if found is None:
        return " Families' aliases work too: see `layoutgen families`."
    return found.help_text(buckets)


class FamilyAliasHelp(OptionInfo):
    """An option whose help ends with what the registered families declare (`common.alias_help`), not with
    words written here: typer reads `help` when it builds the command, after `expand_arguments` collected the
    aliases of the families this command line sees."""

    @classmethod
    def wrapping(cls, option: OptionInfo, tail: Callable[[], str]) -> FamilyAliasHelp:
        wrapped = cls.__new__(cls)
        wrapped.__dict__.update(option.__dict__)  # every setting typer.Option gave it, its own defaults included
        wrapped.tail = tail
        return wrapped

    tail: Callable[[], str]

    @property
    def help(self) -> str:
        return str(self.__dict__.get("help") or "") + self.tail()

    @help.setter
    def help(self, text: str | None) -> None:
        self.__dict__["help"] = text


def family_aliases(command: str, own_options: frozenset[str] = frozenset()) -> FamilyAliases:
    """The option aliases of `command` that the registered families declare (e.g. DCP's `--heads` is
    `--shape H=`), less those that are among `own_options` or that two families declare for different extents.
    A family that does not load takes only its own aliases away."""
    from layoutgen.family import family_names, get_family

    found = FamilyAliases()
    if command not in ALIAS_COMMANDS:
        return found
    try:
        names = family_names()
    except Exception as error:  # a malformed LAYOUTGEN_FAMILIES: no family's aliases are known
        found.unloaded.append(f"the families did not load ({error})")
        return found
    for name in names:
        try:
            family = get_family(name)
        except Exception as error:  # a broken plug-in family must not take the others' aliases down
            found.unloaded.append(f"family {name!r} did not load ({type(error).__name__}: {error})")
            continue
        if command == "tune":
            pairs = [(axis.alias, axis.name) for axis in family.grid_axes if axis.alias]
            pairs += [(family.bucket.alias, "--bucket")] if family.bucket.alias else []
        else:
            pairs = list(family.show_aliases.items())
        for alias, target in pairs:
            found.declared.setdefault(f"--{alias}", {}).setdefault(target, []).append(name)
    for alias, targets in found.declared.items():
        if alias in own_options:
            for target, owners in targets.items():
                axis = "its size buckets" if target == "--bucket" else f"its extent {target}"
                found.warnings.append(
                    f"family {', '.join(map(repr, owners))} declares the alias {alias} for {axis}, but {alias} is "
                    f"an option of `layoutgen {command}`: the alias is ignored (rename it in the family)"
                )
                found.ignored.append(f"{alias} ({', '.join(owners)}: {target}) is ignored, an option of {command}")
        elif len(targets) > 1:
            meanings = "; ".join(f"{target} in {'/'.join(owners)}" for target, owners in sorted(targets.items()))
            spelled = " or ".join(
                "--bucket V" if target == "--bucket" else f"--shape {target}=V" for target in sorted(targets)
            )
            found.problems[alias] = (
                f"{alias} names different extents in different families ({meanings}), so it applies to none: "
                f"write {spelled}"
            )
        else:
            (found.usable[alias],) = targets
    return found


def check_bucket_aliases(command: str, families: Iterable[str]) -> None:
    """Refuse a family's bucket alias (DCP's `--batch`) on a command line that also tunes another family's
    specs, whose buckets count another size: `--bucket` means each family's own."""
    found = _found.get(command)
    if found is None:
        return
    for alias in sorted(found.used):
        if found.usable[alias] != "--bucket":
            continue
        owners = found.declared[alias]["--bucket"]
        others = sorted(set(families) - set(owners))
        if others:
            raise bad_input(
                f"{alias} is the {'/'.join(owners)} family's name for its size buckets, and some specs given are of "
                f"the {'/'.join(others)} family, whose buckets count another size: write --bucket V (each family's "
                "own size), or tune the families apart"
            )


def check_unused_extents(given: Iterable[str], specs: Iterable[Any]) -> None:
    """Refuse a given extent that no spec of the run (each once) uses (`Family.unused_extents`): it'd be ignored."""
    from layoutgen.family import get_family

    unused = [get_family(spec.family).unused_extents(spec) for spec in {s.name: s for s in specs}.values()]
    for name in given:
        if unused and all(name in reasons for reasons in unused):
            raise bad_input(f"--shape {name}: {'; '.join(reasons[name] for reasons in unused)}; leave {name} out")


def command_options(command: str) -> frozenset[str]:
    """Every option `layoutgen COMMAND` declares, read from the app of `layoutgen.cli` (looked up, not imported:
    the app imports this module); empty where that app is not loaded."""
    import sys

    app = getattr(sys.modules.get("layoutgen.cli"), "app", None)
    if app is None:
        return frozenset()
    import typer.main

    command_object = getattr(typer.main.get_command(app), "commands", {}).get(command)
    if command_object is None:
        return frozenset()
    options = {option for param in command_object.params for option in (*param.opts, *param.secondary_opts)}
    return frozenset(option for option in options if option.startswith("-")) | {"--help"}


#: `tune` options that take several values: `--spec a b` is read as `--spec a --spec b`.
LIST_OPTIONS = frozenset({"--spec", "--kernel", "--dtype", "--bucket", "--shape"})
#: The repeatable options of the commands that take no positional argument, read the same way (the README
#: writes them `[--spec NAME|FILE ...]`); `show` and `diff` take positional specs, so theirs are not.
LIST_OPTIONS_OF = {
    "tune": LIST_OPTIONS,
    "build": frozenset({"--spec"}),
    "db": frozenset({"--db", "--spec", "--kernel", "--shape"}),
}
#: Flags the top-level app takes wherever they stand on the command line.
GLOBAL_FLAGS = frozenset({"--debug"})


def expand_arguments(args: list[str]) -> list[str]:
    """Rewrite a command line into what typer parses.

    * `--debug` anywhere moves before the subcommand;
    * a family's alias becomes `--shape`: `show X --heads 8` is `show X --shape H=8`, `tune --N 2 4` is
      `tune --shape N=2,4`, and `tune --batch 1 64` is `tune --bucket 1 --bucket 64`;
    * `tune --spec a b` is `tune --spec a --spec b`, and so are `build --spec a b` and `db show --db A B` (these
      take no positional argument, so every bare word after a list option is one of its values).
    """
    front = [arg for arg in args if arg in GLOBAL_FLAGS]
    rest = [arg for arg in args if arg not in GLOBAL_FLAGS]
    command_at = next((index for index, arg in enumerate(rest) if not arg.startswith("-")), None)
    if command_at is None:
        return front + rest
    command = rest[command_at]
    own_options = command_options(command) if command in ALIAS_COMMANDS else frozenset()
    reserved = own_options | LIST_OPTIONS | GLOBAL_FLAGS
    found = family_aliases(command, reserved)
    _found[command] = found
    for warning in found.warnings:
        say(f"warning: {warning}", err=True)
    aliases = found.usable
    list_options = LIST_OPTIONS_OF.get(command, frozenset())
    expanded = front + rest[: command_at + 1]
    tail = rest[command_at + 1 :]
    index = 0
    while index < len(tail):
        arg = tail[index]
        option, equals, inline = arg.partition("=")
        if option in found.problems and option not in reserved:
            raise bad_input(found.problems[option])
        if found.unloaded and own_options and option.startswith("--") and option not in {"--", *reserved, *aliases}:
            # Not "No such option": the option may be the alias of the family that did not load.
            raise bad_input(
                f"{option} is no option of `layoutgen {command}` and no alias of a family that loaded; "
                + "; ".join(found.unloaded)
            )
        if option in aliases:
            found.used.add(option)
            values = [inline] if equals else []
            index += 1
            # A negative number is a value (refused by parse_shape as one), not an option click cannot find.
            while index < len(tail) and _a_value(tail[index]) and (command == "tune" or not values):
                values.append(tail[index])
                index += 1
            if aliases[option] == "--bucket":
                expanded += [item for value in values for item in ("--bucket", value)]
            else:
                expanded += ["--shape", f"{aliases[option]}={','.join(values)}"]
            continue
        expanded.append(arg)
        index += 1
        if arg in list_options:
            first = True
            while index < len(tail) and not tail[index].startswith("-"):
                if not first:
                    expanded.append(arg)
                expanded.append(tail[index])
                first = False
                index += 1
    return expanded


def _a_value(arg: str) -> bool:
    return not arg.startswith("-") or re.fullmatch(r"-\d+", arg) is not None
