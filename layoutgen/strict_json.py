"""JSON as layoutgen reads its own files: a key given twice in one object is an error.

Python's `json` keeps the last of duplicated keys without a word: in a tuning database a second "entries"
block would hide the first from dispatch, and the next `record` would write the file without it.
"""

from __future__ import annotations

import json
from typing import Any


class DuplicateKey(ValueError):
    """A key given twice in one JSON object; `key` is that key."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key[:200]!r} appears twice in one object")
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise DuplicateKey(key)
        data[key] = value
    return data


def loads(text: str) -> Any:
    """`json.loads`, raising DuplicateKey for a key given twice in one object."""
    return json.loads(text, object_pairs_hook=_unique)
