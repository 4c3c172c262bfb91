"""The byte map for tools: the family's header fields, the buffers, the facts, and one run per line."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from layoutgen.show.facts import facts_as_dict
from layoutgen.show.model import ByteMap, Run


def run_as_dict(run: Run, axes: Mapping[str, str]) -> dict[str, Any]:
    """One run with a half-open [start, stop) range along every axis of the layout (null where its buffer
    has no such axis), axes in the layout's order."""
    ranges = {axis: None if (index := run.range(axis)) is None else list(index) for axis in axes}
    return {"buffer": run.buffer, "offset": run.offset, "length": run.length, "kind": run.kind, **ranges}


def one_item_per_line(header: Mapping[str, Any], items: list[dict[str, Any]], items_key: str) -> str:
    """A JSON object whose fields take one line each and whose last field, a list, one line per item:
    readable, and a changed run is a changed line in a diff."""
    lines = ["{"] + [f"  {json.dumps(key)}: {json.dumps(value)}," for key, value in header.items()]
    rows = [f"    {json.dumps(item)}" for item in items]
    return "\n".join([*lines, f"  {json.dumps(items_key)}: [", ",\n".join(rows), "  ]", "}"]) + "\n"


def to_json(bmap: ByteMap) -> str:
    header = {
        **bmap.layout.json_header,
        "buffers": [
            {
                "name": info.name,
                "axes": list(info.axes),
                "extents": list(info.extents),
                "dtype": info.dtype,
                "elem_bytes": info.elem_bytes,
                "bytes": info.nbytes,
            }
            for info in bmap.buffers
        ],
        "facts": facts_as_dict(bmap),
    }
    return one_item_per_line(header, [run_as_dict(run, bmap.layout.axis_letters) for run in bmap.runs], "runs")
