"""Small code-building helpers for family templates: stride expressions, offset sums, broadcast indices.

They turn an axis order (outer to inner) into the Python/Triton expressions a specialised kernel bakes
in; no family's vocabulary appears here, only axis names handed in.
"""

from __future__ import annotations


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
    return text.encode("unicode_escape").decode("ascii")
