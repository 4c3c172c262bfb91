"""The DCP family's drawing defaults, kept apart so that `layoutgen.dcp.show` need not import the package."""

from __future__ import annotations

from collections.abc import Mapping

#: The drawing shape's extents with their defaults; E: how many of the B live rows are drawn as rows of empty
#: requests (pack's `empty=`), the last ones.
SHOW_SHAPE: Mapping[str, int] = {"N": 4, "B": 2, "H": 8, "D": 16, "E": 0}
#: CLI aliases of the drawing shape's extents.
SHOW_ALIASES: Mapping[str, str] = {"N": "N", "batch": "B", "heads": "H", "D": "D", "empty": "E"}
