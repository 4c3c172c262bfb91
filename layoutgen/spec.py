"""Layout specs, whatever their family: strict YAML loading, the shared base model, and clear errors.

A spec file is YAML whose `family:` key (default `dcp`) names the kernel family that owns its schema.
This module reads the file (bounded, regular files only), parses it with a strict loader, finds the
family and validates the data with the family's pydantic model, a `SpecBase` subclass.  Every failure
is a `SpecError` whose lines name the file, the field and the fix.

The spec is the single source of truth: the reference, the code generator, the tuner and the runtime
all read the validated model, never the YAML.
"""

from __future__ import annotations

import functools
import keyword
import pkgutil
import re
import sys
from collections.abc import Hashable, Mapping
from enum import Enum
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from layoutgen.family import (
    BUILTIN_SCHEMA_DOC,
    DEFAULT_FAMILY,
    FAMILY_NAME_PATTERN,
    UnknownFamilyError,
    bundled_families,
    content_hash,
    families,
    get_family,
)
from layoutgen.files import FileRefused, generated_by_layoutgen, read_bounded

#: Specs larger than this are not layout specs; refusing them bounds parsing work.
MAX_SPEC_BYTES = 64 * 1024
#: A report lists at most this many problems (a file of 6000 unknown keys stays one screen).
MAX_PROBLEMS_SHOWN = 10
#: YAML nesting deeper than this is refused before it is built (a spec is ~4 deep; PyYAML composes recursively).
MAX_YAML_DEPTH = 16
NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
#: Where the schema of the built-in families is written down (a family's `schema_reference()` is what its
#: spec errors point at; this is the word for a spec whose family is not known yet).
SCHEMA_DOC = BUILTIN_SCHEMA_DOC
# Names that Python or pytest import on their own when found on the path, or that Windows treats as
# devices whatever the extension; importable modules are added by `reserved_names()`.
_ALWAYS_RESERVED = {"generated", "sitecustomize", "usercustomize", "conftest", "setup", "con", "prn", "aux", "nul"} | {
    f"{device}{number}" for device in ("com", "lpt") for number in range(10)
}


@functools.cache
def reserved_names() -> frozenset[str]:
    """Names a spec may not take: a generated `<name>.py` next to a script would shadow the module of that
    name.  Every top-level module importable in this environment (the standard library, the built-in
    modules, everything installed on sys.path outside the working directory but modules layoutgen generated,
    layoutgen's own modules) and the names above."""
    names = set(sys.stdlib_module_names) | set(sys.builtin_module_names) | _ALWAYS_RESERVED
    working = {"", "."} | {str(Path.cwd())}
    paths = [entry for entry in sys.path if entry not in working]
    names |= {module.name for module in pkgutil.iter_modules(paths) if not _generated_module(module)}
    names |= set(metadata.packages_distributions())  # editable installs live behind import hooks, not paths
    package = Path(__file__).resolve().parent
    names |= {module.name for module in pkgutil.walk_packages([str(package)])}
    names |= {part for module in list(names) for part in module.split(".")}
    return frozenset(name.lower() for name in names)


def _generated_module(module: pkgutil.ModuleInfo) -> bool:
    """Whether `module` is a layoutgen-generated `<name>.py` (or no module at all): a folder of built modules on
    the path (to import them) must not make their own specs' names, or a rebuild of them, read as taken.
    Building over one is what `layoutgen build` does anyway."""
    folder = getattr(module.module_finder, "path", None)
    if module.ispkg or not isinstance(folder, str):
        return False
    path = Path(folder) / f"{module.name}.py"
    if path.is_dir():  # pkgutil lists a folder named `x.py` as a module, which Python cannot import
        return True
    return generated_by_layoutgen(path) is True  # a compiled extension, or a file gone: a module like any other


class Transport(str, Enum):
    """How a spec's buffers travel between ranks: one `all_to_all_single` per buffer (layoutgen's exchange;
    the peer axis outermost in every buffer), or a transport the caller runs (`exchange_fn`)."""

    ALL_TO_ALL_SINGLE = "all_to_all_single"
    EXTERNAL = "external"


class FieldError(ValueError):
    """A cross-field rule that blames one field (`payload.axes`); `SpecError` reports its path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class SpecBase(BaseModel):
    """What every family's spec has: its family, its name and a free-text summary.

    Family models subclass it and add their fields; unknown keys are refused and models are frozen.
    The layout hash covers everything but the summary, so the summary can never change generated code.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)

    family: str = Field(default=DEFAULT_FAMILY, pattern=FAMILY_NAME_PATTERN, description="the kernel family")
    name: str = Field(pattern=NAME_PATTERN, description="generated module name")
    summary: str = Field(max_length=2000, description="free text; never reaches code except as a quoted literal")

    @field_validator("name")
    @classmethod
    def _name_is_not_reserved(cls, name: str, info: ValidationInfo) -> str:
        if (info.context or {}).get("built"):
            # A generated module's own spec, checked when it was built: once its folder is on sys.path the
            # module itself is importable, so the name would read as taken.
            return name
        if keyword.iskeyword(name) or keyword.issoftkeyword(name) or name in reserved_names():
            raise ValueError(
                f"'{name}' is a Python keyword or a reserved name (a module this Python environment can "
                "import, one Python or pytest imports on their own, or a Windows device): the generated "
                f"{name}.py would shadow it; choose another name, e.g. 'my_backend_a2a'"
            )
        return name

    @functools.cached_property
    def _layout_hash(self) -> str:
        return content_hash(self.model_dump(mode="json", exclude={"summary"}))

    def layout_hash(self) -> str:
        """sha256 of everything that decides bytes and code, i.e. all but `summary`."""
        return self._layout_hash


class SpecError(ValueError):
    """A spec that cannot be used. `str()` is a short, complete, user-facing report."""

    def __init__(self, source: str, problems: list[tuple[str, str]], headline: str = "invalid layout spec") -> None:
        self.source = source
        self.problems = problems
        lines = [f"{_shown(source, limit=1000)}: {headline}"]  # a file name may hold a newline
        lines += [f"  {field}: {message}" for field, message in problems[:MAX_PROBLEMS_SHOWN]]
        if len(problems) > MAX_PROBLEMS_SHOWN:
            lines.append(f"  ... and {len(problems) - MAX_PROBLEMS_SHOWN} more problem(s)")
        super().__init__("\n".join(lines))


_FIX_HINTS: dict[str, str] = {
    "extra_forbidden": "unknown key; remove it (see {schema} for the schema)",
    "missing": "required; add it",
}


#: pydantic's error types for a value of the wrong kind, which its messages word in Python's terms.
_WANTS_LIST = frozenset({"tuple_type", "list_type"})
_WANTS_MAPPING = frozenset({"model_type", "dict_type", "model_attributes_type"})
#: pydantic's error types whose message says what was wanted but not what the spec gave.
_SAYS_NOT_GIVEN = frozenset(
    {"int_type", "int_parsing", "int_from_float", "string_type", "bool_type", "float_type", "enum", "literal_error"}
)
#: YAML 1.1 reads these unquoted words as booleans: `summary: no` is false, not the text "no".
_YAML_BOOLEAN_HINT = "YAML reads yes/no/on/off/true/false unquoted as a boolean: quote the text"


def _given(item: Any) -> str:
    """The value a spec gave where another kind was wanted, as the report shows it."""
    value = item.get("input")
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"the boolean {'true' if value else 'false'}"
    kind = {str: "a string", int: "a number", float: "a number", list: "a list", dict: "a mapping"}
    return f"{kind.get(type(value), type(value).__name__)} {_shown(repr(value), limit=60)}"


def _shown(text: str, limit: int = 80) -> str:
    """Text that may quote the spec (unknown keys, values, the file name) as a report shows it: control and
    format characters escaped, so it stays on its line and draws as written; at most `limit` characters."""
    printable = "".join(char if char.isprintable() else ascii(char)[1:-1] for char in text)
    return printable if len(printable) <= limit else printable[: limit - 3] + "..."


def _problems_from(error: ValidationError, schema: str) -> list[tuple[str, str]]:
    """One (field, message) per pydantic error; `schema`: where the spec's family documents its keys."""
    problems = []
    for item in error.errors(include_url=False):
        ctx_error = (item.get("ctx") or {}).get("error")
        if isinstance(ctx_error, FieldError):
            problems.append((ctx_error.field, _shown(ctx_error.message, limit=400)))
            continue
        field = _shown(".".join(str(part) for part in item["loc"])) or "(top level)"
        message = _FIX_HINTS[item["type"]].format(schema=schema) if item["type"] in _FIX_HINTS else None
        message = message or item["msg"].removeprefix("Value error, ")
        if item["type"] in _WANTS_LIST:
            message = f"must be a list ([a, b, c], or one `- item` per line); got {_given(item)}"
        elif item["type"] in _WANTS_MAPPING:
            message = f"must be a mapping of keys (see {schema} for this field's keys); got {_given(item)}"
        elif item["type"] in _SAYS_NOT_GIVEN:
            message = f"{message}; got {_given(item)}"
            if item["type"] == "string_type" and isinstance(item.get("input"), bool):
                message = f"{message} ({_YAML_BOOLEAN_HINT})"
        if item["type"] == "string_pattern_mismatch" and item["loc"] == ("name",):
            message = f"must match {NAME_PATTERN} (lower-case letter, then lower-case letters, digits, _)"
        problems.append((field, _shown(message, limit=400)))  # messages may quote the spec's own values
    return problems


def parse_spec(data: Any, source: str = "<spec>", *, built: bool = False) -> Any:
    """Validate already-parsed YAML/JSON data with its family's model; raise :class:`SpecError`.  `built`: the
    spec of a generated module (checked when it was built), whose name is not held against it as taken."""
    if not isinstance(data, Mapping):
        raise SpecError(source, [("(top level)", f"must be a mapping of keys, got {type(data).__name__}")])
    family_name = data.get("family", DEFAULT_FAMILY)
    if not isinstance(family_name, str) or not re.fullmatch(FAMILY_NAME_PATTERN, family_name):
        raise SpecError(source, [("family", f"must be a family name such as {DEFAULT_FAMILY!r}; got {family_name!r}")])
    try:
        family = get_family(family_name)
    except ValueError as error:
        if built and isinstance(error, UnknownFamilyError):
            raise _unregistered_family(source, family_name) from None
        raise SpecError(source, [("family", str(error))]) from None
    try:
        return family.spec_model.model_validate(dict(data), context={"built": built})
    except ValidationError as error:
        problems = _problems_from(error, family.schema_reference())
        if "family" not in data:
            problems = _family_hint(data, family_name) + problems
        raise SpecError(source, problems) from None


def _unregistered_family(module_name: str, family: str) -> SpecError:
    """A generated module importing while its family is not registered in this process: name the module's
    file (its import name is an internal one) and how to register the family."""
    module = sys.modules.get(module_name)  # the importing module is in sys.modules while its body runs
    path = getattr(module, "__file__", None) or module_name
    fix = (
        f"its family {family!r} is not registered in this process; register it before importing the module: "
        f"layoutgen.family.register({family!r}, 'PACKAGE') in Python, or LAYOUTGEN_FAMILIES={family}=PACKAGE in "
        f"the environment (PACKAGE: the importable package whose FAMILY is the {family} family)"
    )
    return SpecError(path, [("family", fix)], "cannot import this generated module")


def _family_hint(data: Mapping[str, Any], assumed: str) -> list[tuple[str, str]]:
    """A spec without `family:` whose keys are all another family's: say which (its problems alone would
    only list the assumed family's missing keys)."""
    keys = set(data)
    matches = [
        family.name
        for family in families()
        if family.name != assumed and keys <= set(family.spec_model.model_fields) and keys - {"name", "summary"}
    ]
    if not matches:
        return []
    return [
        (
            "family",
            f"missing, so `{assumed}` was assumed; these keys are the {matches[0]} family's: add `family: {matches[0]}`",
        )
    ]


_PLAIN_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
_INT_TAG = "tag:yaml.org,2002:int"


class _StrictLoader(yaml.SafeLoader):
    """Safe loader that also refuses aliases (no billion-laughs expansion), explicit tags (`!!binary`,
    `!!int`, local tags, the non-specific `!`), integers written other than in plain decimal (YAML 1.1
    reads `020` as octal 16 and `1:30` as 90), nesting deeper than MAX_YAML_DEPTH (PyYAML would recurse
    until RecursionError) and duplicate keys."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.constructor.ConstructorError(
                None, None, "YAML aliases are not allowed in layout specs; write the value out", event.start_mark
            )
        event = self.peek_event()
        if getattr(event, "tag", None) is not None:  # untagged nodes have None; `! x` is a tag too
            raise yaml.constructor.ConstructorError(
                None, None, f"YAML tags ({event.tag}) are not allowed in layout specs; write the plain value",
                event.start_mark,
            )  # fmt: skip
        if self._depth >= MAX_YAML_DEPTH:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"nested deeper than {MAX_YAML_DEPTH} levels; a layout spec is about 4 levels deep",
                event.start_mark,
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: Any) -> Any:
        if not _PLAIN_INT.fullmatch(str(node.value)):
            raise yaml.constructor.ConstructorError(
                None, None, f"the integer {node.value!r} is not plain decimal (YAML reads leading zeros as octal "
                "and colons as base 60); write it as digits without a leading zero", node.start_mark,
            )  # fmt: skip
        return super().construct_yaml_int(node)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    "YAML merge keys (<<) are not allowed in layout specs; write the keys out",
                    key_node.start_mark,
                )
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                raise yaml.constructor.ConstructorError(
                    None, None, "a key is a list or a mapping; keys are plain words", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}; keep one", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(_INT_TAG, _StrictLoader.construct_yaml_int)


def _yaml_problem(error: yaml.YAMLError, source: str) -> str:
    """A YAML error on one line, naming `source` rather than PyYAML's "<unicode string>"."""
    text = " ".join(str(error).split()).replace('"<unicode string>"', source).replace("<unicode string>", source)
    return _shown(text, limit=400)


def parse_spec_text(text: str, source: str = "<spec>") -> Any:
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise SpecError(source, [("(file)", f"larger than {MAX_SPEC_BYTES} bytes; a layout spec is ~20 lines")])
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as error:
        raise SpecError(source, [("(yaml)", _yaml_problem(error, source))]) from None
    except (ValueError, RecursionError) as error:  # e.g. an integer longer than Python's int-from-text limit
        raise SpecError(source, [("(yaml)", _shown(" ".join(str(error).split()), limit=200))]) from None
    if data is None and not text.strip(" \t\r\n-."):  # nothing but blanks or document markers, not `null`
        problem = f"the file is empty; a spec is a mapping of keys (name, summary, ...: see {SCHEMA_DOC})"
        raise SpecError(source, [("(top level)", problem)])
    return parse_spec(data, source)


def load_spec(path: str | Path) -> Any:
    """Read and validate one YAML spec file; raise :class:`SpecError` naming the file."""
    path = Path(path)
    try:
        raw = read_bounded(path, MAX_SPEC_BYTES)
    except FileRefused as refused:
        headline = "spec file missing" if refused.reason == "no such file" else "cannot read the spec file"
        reason = refused.reason if refused.reason != "no such file" else "no such file; check the path"
        if refused.reason.startswith("is larger"):
            headline, reason = "invalid layout spec", f"larger than {MAX_SPEC_BYTES} bytes; a layout spec is ~20 lines"
        elif refused.reason == "is a directory":
            reason = "is a directory; pass a .yaml file"
        raise SpecError(str(path), [("(file)", reason)], headline) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecError(str(path), [("(file)", f"cannot be read: {error}")], "cannot read the spec file") from None
    return parse_spec_text(text, str(path))


def bundled_spec_paths() -> list[Path]:
    """layoutgen's bundled spec files, sorted by name: the built-in families' (`family.bundled_families`; an
    out-of-tree family's specs are built by path, see `Family.spec_dir`)."""
    paths = [path for family in bundled_families() for path in family.spec_dir.glob("*.yaml")]
    return sorted(paths, key=lambda path: path.stem)


def bundled_specs() -> dict[str, Any]:
    """Every built-in spec by name (each must carry its file's name and its folder's family)."""
    specs = {}
    for path in bundled_spec_paths():
        spec = load_spec(path)
        if spec.name != path.stem:
            raise SpecError(str(path), [("name", f"must equal the file name '{path.stem}'")])
        if spec.name in specs:
            raise SpecError(str(path), [("name", f"'{spec.name}' is bundled by two families; rename one")])
        specs[spec.name] = spec
    return specs


def bundled_spec_dirs() -> list[Path]:
    return [family.spec_dir for family in bundled_families()]
