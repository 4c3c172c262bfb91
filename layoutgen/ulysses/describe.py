"""How the generated Ulysses modules' docstrings name a layout: each tensor's extents in its axis order."""

from __future__ import annotations

from collections.abc import Sequence

from layoutgen.ulysses.spec import DirectionSpec, TensorSpec

#: Symbols of the docstrings, per side.
_SYMBOL = {
    "local": {"batch": "B", "seq": "S_local", "dim": "D"},
    "attention": {"batch": "B", "seq": "S", "dim": "D"},
    "wire": {"peer": "N", "batch": "B", "seq": "S_local", "dim": "D"},
}


def heads_symbol(tensor: TensorSpec, side: str) -> str:
    return tensor.heads.value if side == "local" else f"{tensor.heads.value}/N"


def describe_tensor(axes: Sequence[str], tensor: TensorSpec, side: str) -> str:
    """e.g. `[S_local, B, H, D]`: the tensor's extents in its axis order."""
    symbols = {**_SYMBOL[side], "head": heads_symbol(tensor, side)}
    return "[" + ", ".join(symbols[axis] for axis in axes) + "]"


def describe_tensors(axes: Sequence[str], tensors: Sequence[TensorSpec], side: str) -> str:
    """e.g. `q [S_local, H, D]; k, v [S_local, H_kv, D]`: tensors of equal shape grouped."""
    groups: dict[str, list[str]] = {}
    for tensor in tensors:
        groups.setdefault(describe_tensor(axes, tensor, side), []).append(tensor.name)
    return "; ".join(f"{', '.join(names)} {shape}" for shape, names in groups.items())


def describe_wire(direction: DirectionSpec) -> str:
    """The wire buffers of a direction, e.g. `q, k, v [N, S_local, H/N, D] (one buffer each)`, or for a shared
    buffer `wire [N, tensor]: along tensor q [S_local, H/N, D], then k, v [S_local, H_kv/N, D]`."""
    if not direction.shared:
        return describe_tensors(direction.wire, direction.tensors, "wire") + " (one buffer each)"
    position = direction.wire.index("tensor")
    # A head axis outside `tensor` is every tensor's (the spec requires their head counts equal there).
    symbols = {**_SYMBOL["wire"], "head": heads_symbol(direction.tensors[0], "wire")}
    outer = [symbols[axis] for axis in direction.wire[:position]]
    inner = direction.wire[position + 1 :]
    blocks = describe_tensors(inner, direction.tensors, "wire").replace("; ", ", then ")
    return f"wire [{', '.join([*outer, 'tensor'])}]: along tensor {blocks}"
