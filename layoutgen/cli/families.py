"""`layoutgen families`: the kernel families this installation knows, their kernels, tuning keys and grids."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from layoutgen.cli.common import say


def families(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for tools instead of text.")] = False,
) -> None:
    """List the kernel families: what each one's specs describe, its kernels, tuning key and default grid."""
    import json

    from layoutgen.family import families as registered

    described = [family.describe() for family in registered()]
    if as_json:
        sys.stdout.write(json.dumps(described, indent=2) + "\n")  # never wrapped: tools parse it
        return
    for entry in described:
        say(f"{entry['family']}: {entry['summary']}", "bold")
        for kernel, summary in entry["kernels"].items():
            say(f"  kernel {kernel}: {summary}")
        say(f"  tuning key: spec, kernel, {', '.join(entry['key'])}")
        points = entry["grid"]
        axes = ", ".join(points[0]) if points else ""
        tuples = ", ".join(f"({', '.join(map(str, point.values()))})" for point in points)
        buckets = "; ".join(f"{name} {' '.join(map(str, values))}" for name, values in entry["buckets"].items())
        say(f"  default grid: ({axes}) in {tuples}; at {buckets}")
