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
from collections.abc import Mapping
from enum import Enum
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from layoutgen.family import (
    BUILTIN_FAMILIES,
    BUILTIN_SCHEMA_DOC,
    DEFAULT_FAMILY,
    FAMILY_NAME_PATTERN,
    UnknownFamilyError,
    bundled_families,
    content_hash,
    family_names,
    get_family,
)
from layoutgen.files import FileRefused, generated_by_layoutgen, read_bounded
from layoutgen.spec_yaml import StrictLoader

#: Specs larger than this are not layout specs; refusing them bounds parsing work.
MAX_SPEC_BYTES = 64 * 1024
#: A report lists at most this many problems (a file of 6000 unknown keys stays one screen).
MAX_PROBLEMS_SHOWN = 10
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


def _yaml_word(key: Any) -> str:
    """A key that is not text as YAML would write it (`null`, `true`, `3`), where the file's spelling is unknown."""
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


def _key_problem(item: Any, key_texts: Mapping[Any, str]) -> tuple[str, str]:
    """A key YAML read as null, a boolean, a number or a date (pydantic's "Keys should be strings"): named as
    the file wrote it, not as Python prints the value."""
    key = item.get("input")
    written = key_texts.get((type(key), key)) or _yaml_word(key)
    parents = [str(part) for part in item["loc"][:-1]]
    if key is None:
        what = "null"
    elif isinstance(key, bool):
        what = f"the boolean {_yaml_word(key)}"
    elif isinstance(key, int | float):
        what = f"the number {key}"
    else:
        what = f"a {type(key).__name__}"
    field = _shown(".".join([*parents, written]))
    message = f"YAML reads the key {written} as {what}, not as a word: keys are field names; remove it, or quote it"
    return field, _shown(message, limit=400)


def _problems_from(error: ValidationError, schema: str, key_texts: Mapping[Any, str]) -> list[tuple[str, str]]:
    """One (field, message) per pydantic error; `schema`: where the spec's family documents its keys;
    `key_texts`: how the YAML wrote keys that are not text."""
    problems = []
    for item in error.errors(include_url=False):
        ctx_error = (item.get("ctx") or {}).get("error")
        if isinstance(ctx_error, FieldError):
            problems.append((ctx_error.field, _shown(ctx_error.message, limit=400)))
            continue
        if item["type"] == "invalid_key":
            problems.append(_key_problem(item, key_texts))
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


def parse_spec(
    data: Any, source: str = "<spec>", *, built: bool = False, key_texts: Mapping[Any, str] | None = None
) -> Any:
    """Validate already-parsed YAML/JSON data with its family's model; raise :class:`SpecError` (and nothing
    else: a registered family that fails to load is a SpecError too).  `built`: the spec of a generated module
    (checked when it was built; `source` is its import name, reported as its file), whose name is not held
    against it as taken.  `key_texts`: how the YAML wrote keys that are not text (`~`, `yes`), by (type, value)."""
    if built:
        source = _module_file(source)
    if not isinstance(data, Mapping):
        raise SpecError(source, [("(top level)", f"must be a mapping of keys, got {type(data).__name__}")])
    family_name = data.get("family", DEFAULT_FAMILY)
    if not isinstance(family_name, str) or not re.fullmatch(FAMILY_NAME_PATTERN, family_name):
        raise SpecError(source, [("family", f"must be a family name such as {DEFAULT_FAMILY!r}; got {family_name!r}")])
    try:
        family = get_family(family_name)
    except UnknownFamilyError as error:
        if built:
            raise _unregistered_family(source, family_name) from None
        raise SpecError(source, [("family", f"{error}; {_how_to_register(family_name)}")]) from None
    except ValueError as error:  # SettingError: LAYOUTGEN_FAMILIES, which names its entry and the fix
        raise SpecError(source, [("family", str(error))]) from None
    except Exception as error:  # a family registered in code whose module does not import or holds no FAMILY
        raise SpecError(source, [("family", _did_not_load(family_name, error))]) from error
    try:
        return family.spec_model.model_validate(dict(data), context={"built": built})
    except ValidationError as error:
        problems = _problems_from(error, family.schema_reference(), key_texts or {})
        if "family" not in data:
            problems = _family_hint(data, family_name) + problems
        if built:  # a module built by another layoutgen, or edited: the rules here refuse its spec
            raise SpecError(source, problems, _STALE_MODULE) from None
        raise SpecError(source, problems) from None
    except Exception as error:  # a family's validator raising what pydantic does not wrap (a TypeError, say)
        problem = f"the {family_name} family's spec model raised {type(error).__name__}: {_shown(str(error), 300)}"
        raise SpecError(source, [("(spec)", problem)]) from error


_STALE_MODULE = (
    "cannot import this generated module: its spec does not validate with this layoutgen; rebuild it from its spec "
    "(layoutgen build --spec FILE.yaml --out DIR)"
)


def _module_file(module_name: str) -> str:
    """A generated module's file, from its import name while its body runs (the name is an internal one)."""
    module = sys.modules.get(module_name)
    return getattr(module, "__file__", None) or module_name


def _how_to_register(family: str) -> str:
    from layoutgen.settings import FAMILIES

    return (
        f"a family outside layoutgen is registered with {FAMILIES.name}={family}=PACKAGE in the environment or "
        f"layoutgen.family.register({family!r}, 'PACKAGE') in Python (PACKAGE: the importable package whose FAMILY "
        "is that family)"
    )


def _did_not_load(family: str, error: Exception) -> str:
    return (
        f"the family {family!r} is registered but did not load ({type(error).__name__}: {_shown(str(error), 300)}); "
        "fix its package, or the register() call that names it"
    )


def _unregistered_family(path: str, family: str) -> SpecError:
    """A generated module (at `path`) importing while its family is not registered in this process: name the
    file and how to register the family."""
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
        for family in _loadable_families()
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


def _loadable_families() -> list[Any]:
    """The registered families that load: one that does not (a plug-in not installed here) is no hint for a
    spec of another family, and its failure must not hide that spec's own problems."""
    try:
        names = family_names()
    except ValueError:  # a malformed LAYOUTGEN_FAMILIES: the built-in families still hint
        names = sorted(BUILTIN_FAMILIES)
    loaded = []
    for name in names:
        try:
            loaded.append(get_family(name))
        except Exception:  # whatever the plug-in's import raises; the family itself reports it when a spec names it
            continue
    return loaded


def _yaml_problem(error: yaml.YAMLError, source: str) -> str:
    """A YAML error on one line, naming `source` rather than PyYAML's "<unicode string>"."""
    text = " ".join(str(error).split()).replace('"<unicode string>"', source).replace("<unicode string>", source)
    return _shown(text, limit=400)


def parse_spec_text(text: str, source: str = "<spec>") -> Any:
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise SpecError(source, [("(file)", f"larger than {MAX_SPEC_BYTES} bytes; a layout spec is ~20 lines")])
    key_texts: dict[Any, str] = {}
    try:
        loader = StrictLoader(text, key_texts)  # its reader checks the characters here already
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as error:
        raise SpecError(source, [("(yaml)", _yaml_problem(error, source))]) from None
    except (ValueError, RecursionError) as error:  # e.g. an integer longer than Python's int-from-text limit
        raise SpecError(source, [("(yaml)", _shown(" ".join(str(error).split()), limit=200))]) from None
    if data is None:  # nothing but blanks, comments, document markers or a lone `null`
        what = "" if not text.strip(" \t\r\n-.") else " (it holds no keys, only comments or null)"
        problem = f"the file is empty{what}; a spec is a mapping of keys (name, summary, ...: see {SCHEMA_DOC})"
        raise SpecError(source, [("(top level)", problem)])
    return parse_spec(data, source, key_texts=key_texts)


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
