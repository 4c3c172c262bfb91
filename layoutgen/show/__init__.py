"""Byte maps of a layout: which logical element owns every byte of every buffer, and how two layouts differ.

The shared machinery of `layoutgen show` / `layoutgen diff`, for every family: a family describes one
layout at one drawing shape as a `ByteLayout` (`Family.byte_layout`: its buffers, a strided view per kind
of logical element, and its words), and this package builds the map (`model`), states generic facts
(`facts`) and renders it as rich text (`text`), a picture (`png`, matplotlib imported lazily:
`layoutgen[plot]`) and JSON (`json`).  `diff` answers the porting question: where does the same logical
element land in two layouts of one family.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from layoutgen.show import png
from layoutgen.show.diff import DiffRun, LayoutDiff, diff_byte_layouts, diff_renderable, diff_summary, diff_to_json
from layoutgen.show.facts import BufferFacts, Facts, facts
from layoutgen.show.json import to_json
from layoutgen.show.model import (
    MAX_MAP_BYTES,
    Buffer,
    BufferInfo,
    ByteLayout,
    ByteMap,
    Kind,
    Legend,
    LegendEntry,
    Look,
    Placement,
    Run,
    axes_label,
    build_byte_map,
    check_drawing_size,
    format_range,
)
from layoutgen.show.png import write_png
from layoutgen.show.text import render_text, renderable, text_console


def byte_layout(spec: Any, shape: Mapping[str, int], dtype: str) -> ByteLayout:
    """The `ByteLayout` of `spec` at a drawing shape, from the spec's family."""
    from layoutgen.family import get_family

    return get_family(spec.family).byte_layout(spec, shape, dtype)


def byte_map(spec: Any, shape: Mapping[str, int], dtype: str) -> ByteMap:
    """Owner of every byte of every buffer of `spec` at `shape` (the family's drawing extents) and `dtype`."""
    return build_byte_map(byte_layout(spec, shape, dtype))


def diff_layouts(spec_a: Any, spec_b: Any, shape: Mapping[str, int], dtype: str) -> LayoutDiff:
    """Where each logical element lands in `spec_a` and in `spec_b` (two specs of one family) at one shape."""
    if spec_a.family != spec_b.family:
        raise ValueError(f"{spec_a.name} is a {spec_a.family} spec and {spec_b.name} a {spec_b.family} spec")
    found = diff_byte_layouts(byte_layout(spec_a, shape, dtype), byte_layout(spec_b, shape, dtype))
    fields = differing_fields(spec_a, spec_b)
    user_side = set(found.layout_a.user_side_fields)
    return dataclasses.replace(
        found,
        differing_fields=tuple(field for field in fields if field.split(".")[0] not in user_side),
        user_side_fields=tuple(field for field in fields if field.split(".")[0] in user_side),
    )


def differing_fields(spec_a: Any, spec_b: Any) -> tuple[str, ...]:
    """The dotted spec fields whose values differ, the name and the summary aside."""

    def flat(value: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(value, dict):
            return {key: leaf for name, item in value.items() for key, leaf in flat(item, f"{prefix}{name}.").items()}
        return {prefix.rstrip("."): value}

    a, b = (flat(spec.model_dump(mode="json", exclude={"name", "summary"})) for spec in (spec_a, spec_b))
    return tuple(sorted(key for key in a.keys() | b.keys() if a.get(key) != b.get(key)))


__all__ = [
    "MAX_MAP_BYTES",
    "Buffer",
    "BufferFacts",
    "BufferInfo",
    "ByteLayout",
    "ByteMap",
    "DiffRun",
    "Facts",
    "Kind",
    "LayoutDiff",
    "Legend",
    "LegendEntry",
    "Look",
    "Placement",
    "Run",
    "axes_label",
    "build_byte_map",
    "byte_layout",
    "byte_map",
    "check_drawing_size",
    "diff_byte_layouts",
    "diff_layouts",
    "diff_renderable",
    "diff_summary",
    "diff_to_json",
    "facts",
    "format_range",
    "png",
    "render_text",
    "renderable",
    "text_console",
    "to_json",
    "write_png",
]
