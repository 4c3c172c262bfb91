"""Small code-building helpers for family templates: stride expressions, offset sums, broadcast indices,
boxes interleaved and split.

They turn an axis order (outer to inner) into the Python/Triton expressions a specialised kernel bakes
in; no family's vocabulary appears here, only axis names handed in.
"""

from __future__ import annotations

from collections.abc import Sequence


def stride_expressions(axes: tuple[str, ...] | list[str], extents: dict[str, str]) -> dict[str, str]:
    """Dense C-order strides as expressions: upper-case (constexpr) factors grouped, the run-time ones outside."""
    strides = {}
    for position, axis in enumerate(axes):
        inner = [extents[a] for a in axes[position + 1 :]]
        constant = [name for name in inner if name.isupper()]
        runtime = [name for name in inner if not name.isupper()]
        factors = runtime + ([f"({' * '.join(constant)})" if len(constant) > 1 else constant[0]] if constant else [])
        strides[axis] = " * ".join(factors) if factors else "1"
    return strides


def offset_sum(axes: tuple[str, ...] | list[str], strides: dict[str, str], prefix: str, names: dict[str, str]) -> str:
    """`index * stride` terms in destination order (axes missing from `names` are skipped)."""
    terms = []
    for axis in axes:
        if axis not in names:
            continue
        stride = strides[axis]
        terms.append(names[axis] if stride == "1" else f"{names[axis]} * {prefix}_stride_{axis}")
    return " + ".join(terms)


def wrap_sum(expression: str, indent: int) -> str:
    """Break a long sum into one term per line inside parentheses (readable generated code)."""
    if len(expression) + indent <= 90:
        return expression
    pad = " " * (indent + 4)
    return "(\n" + pad + ("\n" + pad + "+ ").join(expression.split(" + ")) + "\n" + " " * indent + ")"


def broadcast_index(axes: list[str]) -> dict[str, str]:
    """Per axis, the indexing that lifts its 1-D index vector into the tile's rank (`[:, None, None]`)."""
    rank = len(axes)
    return {axis: "[" + ", ".join(":" if j == i else "None" for j in range(rank)) + "]" for i, axis in enumerate(axes)}


def escape_comment(text: str) -> str:
    """`text` for one comment line of generated code: line breaks and other non-ASCII escaped."""
    return text.encode("unicode_escape").decode("ascii")


def interleave_tree(boxes: Sequence[str]) -> str:
    """Boxes of a power-of-two count interleaved element by element along their last axis, the first's
    element first: the even-numbered boxes' interleave with the odd-numbered ones' (a, b, c, d: a0 b0 c0 d0
    a1 ...)."""
    if len(boxes) == 1:
        return boxes[0]
    return f"tl.interleave({interleave_tree(boxes[0::2])}, {interleave_tree(boxes[1::2])})"


def split_tree(loaded: str, boxes: Sequence[str], block_shape: Sequence[str]) -> list[str]:
    """Statements that undo `interleave_tree`: the box `loaded` (the last of `block_shape` times len(boxes)
    long) split into `boxes`, evens then odds, until each holds one tensor's elements."""
    if len(boxes) == 1:
        return [f"{boxes[0]} = {loaded}"]
    half = len(boxes) // 2
    last = block_shape[-1] if half == 1 else f"{half} * {block_shape[-1]}"
    shape = ", ".join([*block_shape[:-1], last, "2"])
    if half == 1:
        return [f"{boxes[0]}, {boxes[1]} = tl.split(tl.reshape({loaded}, [{shape}]))"]
    evens, odds = f"{loaded}_even", f"{loaded}_odd"
    return [
        f"{evens}, {odds} = tl.split(tl.reshape({loaded}, [{shape}]))",
        *split_tree(evens, boxes[0::2], block_shape),
        *split_tree(odds, boxes[1::2], block_shape),
    ]
