"""Layout specs: the Pydantic models of DESIGN §3, YAML loading and validation.

A spec says where every byte of a decode-context-parallel exchange lives.  It is
the single source of truth: the reference, the code generator, the tuner and the
runtime all read the validated model, never the YAML.

Every rule of the schema is a validator here, and every failure becomes a
:class:`SpecError` whose lines name the file, the field and the fix.
"""

from __future__ import annotations

import functools
import hashlib
import json
import keyword
import sys
from collections.abc import Hashable, Mapping
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

#: Logical axes of the payload buffer (DESIGN §3).
PAYLOAD_AXES: tuple[str, ...] = ("peer", "batch", "head", "dim")
#: Logical axes of a separate stats buffer.
STATS_AXES: tuple[str, ...] = ("peer", "batch", "head", "slot")
#: Specs larger than this are not layout specs; refusing them bounds parsing work.
MAX_SPEC_BYTES = 64 * 1024
#: A report lists at most this many problems (a file of 6000 unknown keys stays one screen).
MAX_PROBLEMS_SHOWN = 10
#: YAML nesting deeper than this is refused before it is built (a spec is 3 deep; PyYAML composes recursively).
MAX_YAML_DEPTH = 16
NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
# Names that would shadow a module the generated code (or its importer) needs, that Python or pytest import on
# their own when found on the path, or that Windows treats as devices whatever the extension.
_RESERVED_NAMES = (
    frozenset(sys.stdlib_module_names)
    | {"torch", "triton", "layoutgen", "generated", "numpy", "jinja2", "pydantic", "pydantic_core", "yaml"}
    | {"typer", "click", "rich", "filelock", "optuna", "platformdirs"}
    | {"sitecustomize", "usercustomize", "conftest", "setup"}
    | {"con", "prn", "aux", "nul"}
    | {f"{device}{number}" for device in ("com", "lpt") for number in range(10)}
)


class Transport(str, Enum):
    ALL_TO_ALL_SINGLE = "all_to_all_single"
    EXTERNAL = "external"


class PayloadDtype(str, Enum):
    INPUT = "input"  # the dtype of `out`
    FLOAT32 = "float32"


class StatsPlacement(str, Enum):
    ROW_TAIL = "row_tail"
    SEPARATE = "separate"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


def _check_permutation(axes: tuple[str, ...], expected: tuple[str, ...]) -> tuple[str, ...]:
    if sorted(axes) != sorted(expected):
        raise ValueError(f"must be a permutation of {list(expected)} (outer to inner, each once), got {list(axes)}")
    return axes


class PayloadSpec(_Model):
    axes: tuple[str, ...] = Field(description="permutation of peer, batch, head, dim; outer to inner")
    dtype: PayloadDtype = Field(description="wire dtype: `input` (same as `out`) or `float32`")

    @field_validator("axes")
    @classmethod
    def _axes_are_a_permutation(cls, axes: tuple[str, ...]) -> tuple[str, ...]:
        return _check_permutation(axes, PAYLOAD_AXES)


class StatsSpec(_Model):
    placement: StatsPlacement
    axes: tuple[str, ...] | None = Field(default=None, description="separate only")
    # Strict: YAML's `yes`, "2" or 1.0 are not word counts.
    slots: StrictInt | None = Field(default=None, description="separate only: float32 words per entry")
    slot: StrictInt | None = Field(default=None, description="separate only: the word holding the LSE")

    @field_validator("axes")
    @classmethod
    def _axes_are_a_permutation(cls, axes: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if axes is None else _check_permutation(axes, STATS_AXES)

    @model_validator(mode="after")
    def _fields_match_placement(self) -> StatsSpec:
        if self.placement is StatsPlacement.ROW_TAIL:
            for field in ("axes", "slots", "slot"):
                if getattr(self, field) is not None:
                    raise _FieldError(
                        f"stats.{field}",
                        "is only for placement: separate; remove it "
                        "(row_tail stores the LSE after the D payload elements of each row)",
                    )
            return self
        if self.axes is None:
            raise _FieldError(
                "stats.axes",
                "placement: separate needs `axes`, a permutation of "
                f"{list(STATS_AXES)}; add e.g. `axes: [peer, batch, head, slot]`",
            )
        slots = 1 if self.slots is None else self.slots
        slot = 0 if self.slot is None else self.slot
        if not 1 <= slots <= 64:
            raise _FieldError("stats.slots", f"must be between 1 and 64, got {slots}")
        if not 0 <= slot < slots:
            raise _FieldError("stats.slot", f"must be in [0, slots) = [0, {slots}), got {slot}")
        object.__setattr__(self, "slots", slots)
        object.__setattr__(self, "slot", slot)
        return self


class LayoutSpec(_Model):
    """One wire layout, exactly as DESIGN §3 defines it."""

    name: str = Field(pattern=NAME_PATTERN, description="generated module name")
    summary: str = Field(max_length=2000, description="free text; never reaches code except as a quoted literal")
    transport: Transport
    payload: PayloadSpec
    stats: StatsSpec
    align_bytes: StrictInt | None = Field(default=None, description="row_tail only: row length multiple")

    @field_validator("name")
    @classmethod
    def _name_is_not_reserved(cls, name: str) -> str:
        if keyword.iskeyword(name) or keyword.issoftkeyword(name) or name in _RESERVED_NAMES:
            raise ValueError(
                f"'{name}' is a Python keyword or a reserved name (a module Python, pytest or the generated code "
                "imports, or a Windows device); choose another name, e.g. 'my_backend_a2a'"
            )
        return name

    @model_validator(mode="after")
    def _cross_field_rules(self) -> LayoutSpec:
        row_tail = self.stats.placement is StatsPlacement.ROW_TAIL
        if row_tail:
            align = 4 if self.align_bytes is None else self.align_bytes
            if align < 4 or align > 256 or align & (align - 1):
                raise _FieldError("align_bytes", f"must be a power of two between 4 and 256, got {self.align_bytes}")
            object.__setattr__(self, "align_bytes", align)
            if self.payload.dtype is PayloadDtype.INPUT and self.payload.axes[-1] != "dim":
                raise _FieldError(
                    "payload.axes",
                    "row_tail with dtype: input needs `dim` innermost (the LSE's 4 bytes follow "
                    f"the row's D elements); got {list(self.payload.axes)}. Move `dim` last or use dtype: float32",
                )
        elif self.align_bytes is not None:
            raise _FieldError("align_bytes", "is only for stats.placement: row_tail; remove it")
        if self.transport is Transport.ALL_TO_ALL_SINGLE:
            buffers = [("payload.axes", self.payload.axes)]
            if self.stats.axes is not None:
                buffers.append(("stats.axes", self.stats.axes))
            for field, axes in buffers:
                if axes[0] != "peer":
                    raise _FieldError(
                        field,
                        "transport all_to_all_single needs `peer` outermost so each peer's chunk is "
                        f"contiguous; got {list(axes)}. Put `peer` first or use transport: external",
                    )
        return self

    @property
    def row_tail(self) -> bool:
        return self.stats.placement is StatsPlacement.ROW_TAIL

    @functools.cached_property
    def _layout_hash(self) -> str:
        canonical = self.model_dump(mode="json", exclude={"summary"})
        blob = json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()

    def layout_hash(self) -> str:
        """sha256 of everything that decides bytes and code, i.e. all but `summary`."""
        return self._layout_hash


class _FieldError(ValueError):
    """A cross-field rule that blames one field; `SpecError` reports its path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class SpecError(ValueError):
    """A spec that cannot be used. `str()` is a short, complete, user-facing report."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = [f"{_shown(source, limit=1000)}: invalid layout spec"]  # a file name may hold a newline
        lines += [f"  {field}: {message}" for field, message in problems[:MAX_PROBLEMS_SHOWN]]
        if len(problems) > MAX_PROBLEMS_SHOWN:
            lines.append(f"  ... and {len(problems) - MAX_PROBLEMS_SHOWN} more problem(s)")
        super().__init__("\n".join(lines))


_FIX_HINTS: dict[str, str] = {
    "extra_forbidden": "unknown key; remove it (see DESIGN §3 for the schema)",
    "missing": "required; add it",
}


def _shown(text: str, limit: int = 80) -> str:
    """Text that may quote the spec (unknown keys, values, the file name) as a report shows it: control and
    format characters escaped, so it stays on its line and draws as written; at most `limit` characters."""
    printable = "".join(char if char.isprintable() else ascii(char)[1:-1] for char in text)
    return printable if len(printable) <= limit else printable[: limit - 3] + "..."


def _problems_from(error: ValidationError) -> list[tuple[str, str]]:
    problems = []
    for item in error.errors(include_url=False):
        ctx_error = (item.get("ctx") or {}).get("error")
        if isinstance(ctx_error, _FieldError):
            problems.append((ctx_error.field, _shown(ctx_error.message, limit=400)))
            continue
        field = _shown(".".join(str(part) for part in item["loc"])) or "(top level)"
        message = _FIX_HINTS.get(item["type"], item["msg"].removeprefix("Value error, "))
        if item["type"] == "string_pattern_mismatch":
            message = f"must match {NAME_PATTERN} (lower-case letter, then lower-case letters, digits, _)"
        problems.append((field, _shown(message, limit=400)))  # messages may quote the spec's own values
    return problems


def parse_spec(data: Any, source: str = "<spec>") -> LayoutSpec:
    """Validate already-parsed YAML/JSON data; raise :class:`SpecError`."""
    if not isinstance(data, Mapping):
        raise SpecError(source, [("(top level)", f"must be a mapping of keys, got {type(data).__name__}")])
    try:
        return LayoutSpec.model_validate(dict(data))
    except ValidationError as error:
        raise SpecError(source, _problems_from(error)) from None


class _StrictLoader(yaml.SafeLoader):
    """Safe loader that also refuses aliases (no billion-laughs expansion), nesting deeper than
    MAX_YAML_DEPTH (PyYAML would recurse until RecursionError) and duplicate keys."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.constructor.ConstructorError(
                None, None, "YAML aliases are not allowed in layout specs; write the value out", event.start_mark
            )
        if self._depth >= MAX_YAML_DEPTH:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"nested deeper than {MAX_YAML_DEPTH} levels; a layout spec is 3 levels deep",
                self.peek_event().start_mark,
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

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


def parse_spec_text(text: str, source: str = "<spec>") -> LayoutSpec:
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise SpecError(source, [("(file)", f"larger than {MAX_SPEC_BYTES} bytes; a layout spec is ~20 lines")])
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as error:
        raise SpecError(source, [("(yaml)", _shown(" ".join(str(error).split()), limit=400))]) from None
    except ValueError as error:  # e.g. an integer longer than Python's int-from-text limit
        raise SpecError(source, [("(yaml)", _shown(" ".join(str(error).split()), limit=200))]) from None
    return parse_spec(data, source)


def load_spec(path: str | Path) -> LayoutSpec:
    """Read and validate one YAML spec file; raise :class:`SpecError` naming the file."""
    path = Path(path)
    try:
        # Never more than the limit plus one byte: /dev/zero or a huge file is refused, not read into memory.
        with path.open("rb") as stream:
            raw = stream.read(MAX_SPEC_BYTES + 1)
        if len(raw) > MAX_SPEC_BYTES:
            raise SpecError(str(path), [("(file)", f"larger than {MAX_SPEC_BYTES} bytes; a layout spec is ~20 lines")])
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise SpecError(str(path), [("(file)", "no such file; check the path")]) from None
    except IsADirectoryError:
        raise SpecError(str(path), [("(file)", "is a directory; pass a .yaml file")]) from None
    except (OSError, UnicodeDecodeError) as error:
        raise SpecError(str(path), [("(file)", f"cannot be read: {error}")]) from None
    return parse_spec_text(text, str(path))


def bundled_spec_dir() -> Path:
    return Path(__file__).resolve().parent / "specs"


def bundled_spec_paths() -> list[Path]:
    return sorted(bundled_spec_dir().glob("*.yaml"))


def bundled_specs() -> dict[str, LayoutSpec]:
    """Every built-in spec by name."""
    specs = {}
    for path in bundled_spec_paths():
        spec = load_spec(path)
        if spec.name != path.stem:
            raise SpecError(str(path), [("name", f"must equal the file name '{path.stem}'")])
        specs[spec.name] = spec
    return specs
