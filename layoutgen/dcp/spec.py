"""The DCP family's spec: where every byte of a decode-context-parallel exchange lives.

The pydantic model of docs/design.md §3 (a `layoutgen.spec.SpecBase`, so YAML loading, strictness and
error reports are the shared ones).  Every rule of the schema is a validator here; a rule that blames
one field raises `FieldError` naming it.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from layoutgen.spec import FieldError, SpecBase

#: Logical axes of the payload buffer.
PAYLOAD_AXES: tuple[str, ...] = ("peer", "batch", "head", "dim")
#: Logical axes of a separate stats buffer.
STATS_AXES: tuple[str, ...] = ("peer", "batch", "head", "slot")


class Transport(str, Enum):
    ALL_TO_ALL_SINGLE = "all_to_all_single"
    EXTERNAL = "external"


class PayloadDtype(str, Enum):
    INPUT = "input"  # the dtype of `out`
    FLOAT32 = "float32"


class StatsPlacement(str, Enum):
    ROW_TAIL = "row_tail"
    SEPARATE = "separate"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


def _check_permutation(axes: tuple[str, ...], expected: tuple[str, ...]) -> tuple[str, ...]:
    if sorted(axes) != sorted(expected):
        raise ValueError(f"must be a permutation of {list(expected)} (outer to inner, each once), got {list(axes)}")
    return axes


class PayloadSpec(_Model):
    axes: tuple[str, ...] = Field(description="permutation of peer, batch, head, dim; outer to inner")
    dtype: PayloadDtype = Field(description="wire dtype: `input` (same as `out`) or `float32`")

    @field_validator("axes")
    @classmethod
    def _axes_are_a_permutation(cls, axes: tuple[str, ...]) -> tuple[str, ...]:
        return _check_permutation(axes, PAYLOAD_AXES)


class StatsSpec(_Model):
    placement: StatsPlacement
    axes: tuple[str, ...] | None = Field(default=None, description="separate only")
    # Strict: YAML's `yes`, "2" or 1.0 are not word counts.
    slots: StrictInt | None = Field(default=None, description="separate only: float32 words per entry")
    slot: StrictInt | None = Field(default=None, description="separate only: the word holding the LSE")

    @field_validator("axes")
    @classmethod
    def _axes_are_a_permutation(cls, axes: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if axes is None else _check_permutation(axes, STATS_AXES)

    @model_validator(mode="after")
    def _fields_match_placement(self) -> StatsSpec:
        if self.placement is StatsPlacement.ROW_TAIL:
            for field in ("axes", "slots", "slot"):
                if getattr(self, field) is not None:
                    raise FieldError(
                        f"stats.{field}",
                        "is only for placement: separate; remove it "
                        "(row_tail stores the LSE after the D payload elements of each row)",
                    )
            return self
        if self.axes is None:
            raise FieldError(
                "stats.axes",
                "placement: separate needs `axes`, a permutation of "
                f"{list(STATS_AXES)}; add e.g. `axes: [peer, batch, head, slot]`",
            )
        slots = 1 if self.slots is None else self.slots
        slot = 0 if self.slot is None else self.slot
        if not 1 <= slots <= 64:
            raise FieldError("stats.slots", f"must be between 1 and 64, got {slots}")
        if not 0 <= slot < slots:
            raise FieldError("stats.slot", f"must be in [0, slots) = [0, {slots}), got {slot}")
        object.__setattr__(self, "slots", slots)
        object.__setattr__(self, "slot", slot)
        return self


class DcpSpec(SpecBase):
    """One DCP wire layout, exactly as docs/design.md §3 defines it."""

    family: Literal["dcp"] = "dcp"
    transport: Transport
    payload: PayloadSpec
    stats: StatsSpec
    align_bytes: StrictInt | None = Field(default=None, description="row_tail only: row length multiple")

    @model_validator(mode="after")
    def _cross_field_rules(self) -> DcpSpec:
        row_tail = self.stats.placement is StatsPlacement.ROW_TAIL
        if row_tail:
            align = 4 if self.align_bytes is None else self.align_bytes
            if align < 4 or align > 256 or align & (align - 1):
                raise FieldError("align_bytes", f"must be a power of two between 4 and 256, got {self.align_bytes}")
            object.__setattr__(self, "align_bytes", align)
            if self.payload.dtype is PayloadDtype.INPUT and self.payload.axes[-1] != "dim":
                raise FieldError(
                    "payload.axes",
                    "row_tail with dtype: input needs `dim` innermost (the LSE's 4 bytes follow "
                    f"the row's D elements); got {list(self.payload.axes)}. Move `dim` last or use dtype: float32",
                )
        elif self.align_bytes is not None:
            raise FieldError("align_bytes", "is only for stats.placement: row_tail; remove it")
        if self.transport is Transport.ALL_TO_ALL_SINGLE:
            buffers = [("payload.axes", self.payload.axes)]
            if self.stats.axes is not None:
                buffers.append(("stats.axes", self.stats.axes))
            for field, axes in buffers:
                if axes[0] != "peer":
                    raise FieldError(
                        field,
                        "transport all_to_all_single needs `peer` outermost so each peer's chunk is "
                        f"contiguous; got {list(axes)}. Put `peer` first or use transport: external",
                    )
        return self

    @property
    def row_tail(self) -> bool:
        return self.stats.placement is StatsPlacement.ROW_TAIL
