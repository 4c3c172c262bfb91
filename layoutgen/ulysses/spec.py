"""The Ulysses family's spec: where every element of a sequence-parallel all-to-all lives.

A `layoutgen.spec.SpecBase` model (YAML loading, strictness and error reports are the shared ones); the
schema is documented in `layoutgen.ulysses` (the package docstring).  Every rule is a validator here; a
rule that blames one field raises `FieldError` naming it and the fix.
"""

from __future__ import annotations

import keyword
import re
from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from layoutgen.spec import FieldError, SpecBase, Transport

#: Logical axes of a rank's shard (`local`) and of what attention reads and writes (`attention`); `batch`
#: is optional, and present in every layout of a spec or in none.
TENSOR_AXES: tuple[str, ...] = ("batch", "seq", "head", "dim")
#: Logical axes of a wire buffer: `peer` indexes the other rank; `tensor` (optional) makes one buffer carry
#: every tensor of the direction, each tensor's block of the axes inside it one after another.
WIRE_AXES: tuple[str, ...] = ("peer", "batch", "seq", "head", "dim", "tensor")
#: Tensors per direction: enough for q, k, v plus a few extras (e.g. a gate), few enough to stay one kernel.
MAX_TENSORS = 8
TENSOR_NAME_PATTERN = r"^[a-z][a-z0-9]{0,15}$"
#: Names the generated code uses itself, next to the tensors' names (`<name>`, `<name>_ptr`, ...).
#: The bare names the generated launchers and public functions use beside their tensor parameters (a tensor
#: named like one would shadow it); tests/ulysses/test_ulysses_spec.py reads every generated module for them.
RESERVED_TENSOR_NAMES = frozenset(
    {"blocks", "bufs", "config", "kernel", "grid", "outer", "program", "result", "tile", "tiles", "tl", "torch",
     "triton", "wire"}
)  # fmt: skip


class HeadCount(str, Enum):
    """Which of the two head counts a tensor has: `H` (e.g. q and the attention output) or `H_kv` (GQA k, v)."""

    H = "H"
    H_KV = "H_kv"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


def _check_axes(axes: tuple[str, ...], required: tuple[str, ...], optional: tuple[str, ...]) -> tuple[str, ...]:
    allowed = required + optional
    unknown = [axis for axis in axes if axis not in allowed]
    missing = [axis for axis in required if axis not in axes]
    repeated = sorted({axis for axis in axes if axes.count(axis) > 1})
    if unknown or missing or repeated:
        problems = []
        if unknown:
            problems.append(f"unknown {unknown}")
        if missing:
            problems.append(f"missing {missing}")
        if repeated:
            problems.append(f"repeated {repeated}")
        extra = f", plus optionally {list(optional)}" if optional else ""
        raise ValueError(
            f"must list the axes {list(required)}{extra}, each once, outer to inner; got {list(axes)} "
            f"({'; '.join(problems)})"
        )
    return axes


class TensorSpec(_Model):
    name: str = Field(description="the tensor's name: a keyword argument of scatter and a buffer name")
    heads: HeadCount = Field(description="H or H_kv: the tensor's number of heads, a shape parameter")

    @field_validator("name")
    @classmethod
    def _name_is_an_identifier(cls, name: str) -> str:
        if not re.fullmatch(TENSOR_NAME_PATTERN, name):
            raise ValueError(
                f"must match {TENSOR_NAME_PATTERN} (a lower-case letter, then lower-case letters or digits); "
                f"got {name!r}, e.g. 'q'"
            )
        if keyword.iskeyword(name) or keyword.issoftkeyword(name) or name in RESERVED_TENSOR_NAMES:
            raise ValueError(f"'{name}' is a Python keyword or a name the generated code uses; choose another")
        return name


class DirectionSpec(_Model):
    """The tensors one direction moves together and the wire buffer(s) they travel in."""

    tensors: tuple[TensorSpec, ...] = Field(description="moved together, in this order")
    wire: tuple[str, ...] = Field(description="permutation of peer, [batch], seq, head, dim, [tensor]")

    @field_validator("tensors")
    @classmethod
    def _tensors_are_few_and_distinct(cls, tensors: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...]:
        if not 1 <= len(tensors) <= MAX_TENSORS:
            raise ValueError(f"must list between 1 and {MAX_TENSORS} tensors, got {len(tensors)}")
        names = [tensor.name for tensor in tensors]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"names must differ; {repeated} appear more than once")
        return tensors

    @field_validator("wire")
    @classmethod
    def _wire_axes(cls, axes: tuple[str, ...]) -> tuple[str, ...]:
        return _check_axes(axes, ("peer", "seq", "head", "dim"), ("batch", "tensor"))

    @property
    def shared(self) -> bool:
        """One buffer for every tensor (the wire has a `tensor` axis), else one buffer per tensor."""
        return "tensor" in self.wire


class UlyssesSpec(SpecBase):
    """One Ulysses layout: the shard, the attention side and the wire of both directions."""

    family: Literal["ulysses"]
    transport: Transport
    local: tuple[str, ...] = Field(description="each rank's shard: permutation of [batch], seq, head, dim")
    attention: tuple[str, ...] = Field(description="what attention reads and writes: the same axes")
    to_attention: DirectionSpec = Field(description="scatter (local -> wire) and gather (wire -> attention)")
    from_attention: DirectionSpec = Field(description="scatter_out (attention -> wire), gather_out (wire -> local)")

    @field_validator("local", "attention")
    @classmethod
    def _tensor_axes(cls, axes: tuple[str, ...]) -> tuple[str, ...]:
        return _check_axes(axes, ("seq", "head", "dim"), ("batch",))

    @model_validator(mode="after")
    def _cross_field_rules(self) -> UlyssesSpec:
        batch = "batch" in self.local
        for field, axes in (
            ("attention", self.attention),
            ("to_attention.wire", self.to_attention.wire),
            ("from_attention.wire", self.from_attention.wire),
        ):
            if ("batch" in axes) != batch:
                fix = "add `batch`" if batch else "remove `batch` (or add it to `local` and every other layout)"
                have = "has" if batch else "has no"
                raise FieldError(field, f"`local` {have} a batch axis, and every layout must agree; {fix}")
        for direction in ("to_attention", "from_attention"):
            spec: DirectionSpec = getattr(self, direction)
            field = f"{direction}.wire"
            if self.transport is Transport.ALL_TO_ALL_SINGLE and spec.wire[0] != "peer":
                raise FieldError(
                    field,
                    "transport all_to_all_single needs `peer` outermost so that each peer's chunk is contiguous; "
                    f"got {list(spec.wire)}. Put `peer` first or use transport: external",
                )
            counts = {tensor.heads for tensor in spec.tensors}
            if spec.shared and len(counts) > 1 and spec.wire.index("head") < spec.wire.index("tensor"):
                heads = ", ".join(f"{tensor.name}: {tensor.heads.value}" for tensor in spec.tensors)
                raise FieldError(
                    field,
                    f"the tensors have different head counts ({heads}), so `head` must come after `tensor` "
                    f"(each tensor's block inside the tensor axis holds its own heads); got {list(spec.wire)}",
                )
        return self

    @property
    def has_batch(self) -> bool:
        return "batch" in self.local

    def direction(self, name: str) -> DirectionSpec:
        if name not in DIRECTIONS:
            raise ValueError(f"direction must be one of {list(DIRECTIONS)}, got {name!r}")
        spec: DirectionSpec = getattr(self, name)
        return spec

    def uses(self, heads: HeadCount) -> bool:
        """Whether some tensor of either direction has `heads` heads."""
        return any(t.heads is heads for d in DIRECTIONS for t in self.direction(d).tensors)


DIRECTIONS: tuple[str, ...] = ("to_attention", "from_attention")
