"""The strict YAML loader every spec is read with (`layoutgen.spec.parse_spec_text`): PyYAML's safe loader
less the YAML features that make a spec mean something other than what it shows."""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Any

import yaml

#: YAML nesting deeper than this is refused before it is built (a spec is ~4 deep; PyYAML composes recursively).
MAX_YAML_DEPTH = 16
_PLAIN_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
_INT_TAG = "tag:yaml.org,2002:int"


class StrictLoader(yaml.SafeLoader):
    """Safe loader that also refuses aliases (no billion-laughs expansion), explicit tags (`!!binary`,
    `!!int`, local tags, the non-specific `!`), integers written other than in plain decimal (YAML 1.1
    reads `020` as octal 16 and `1:30` as 90), nesting deeper than MAX_YAML_DEPTH (PyYAML would recurse
    until RecursionError) and duplicate keys."""

    _depth = 0

    def __init__(self, stream: Any, key_texts: dict[Any, str] | None = None) -> None:
        #: Keys that YAML reads as something other than text (`~`, `yes`, `1`), as written: (type, value) -> text.
        self.key_texts: dict[Any, str] = {} if key_texts is None else key_texts
        super().__init__(stream)

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
            if not isinstance(key, str) and isinstance(key_node, yaml.ScalarNode):
                self.key_texts.setdefault((type(key), key), key_node.value or "~")  # `: x` has an empty null key
        return super().construct_mapping(node, deep=deep)


StrictLoader.add_constructor(_INT_TAG, StrictLoader.construct_yaml_int)
