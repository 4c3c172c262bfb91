"""The DCP family's spec: where every byte of a decode-context-parallel exchange lives.

The pydantic model of docs/design.md §3.1 and §4.2 (the project brief's §8.3), a `layoutgen.spec.SpecBase`,
so YAML loading, strictness and error reports are the shared ones.  Every rule of the schema is a validator
here; a rule that blames one field raises `FieldError` naming it.

Stats forms (the brief's §8.3, docs/design.md §4.2): `lse` (the default) keeps one float32 word per (peer,
batch, head), the log-sum-exp; `max_sum` keeps two, the running max `m` and the sum of exponentials `s`
(TensorRT-LLM helix), so that `lse = m + log(s)`.  A `max_sum` stats buffer names the two words' slots
(`max_slot`, `sum_slot`); in a row tail the max comes first and the sum right after it.

fp8 on the wire (§8.3 of the project brief, docs/design.md §4.3): `payload.dtype: float8_e4m3fn` or
`float8_e5m2` quantises the payload per block of `payload.scale_block` elements of a row (a power of two
dividing D; unset: one block of D elements per row) with one float32 scale per block.  The scales travel
with the stats: in a row tail they follow the stats words (one float32 word per block, in block order); with
separate stats they are a float32 `scales` buffer of their own, axes `payload.scale_axes` (a permutation of
peer, batch, head, block; default [peer, batch, head, block]).
"""

from __future__ import annotations

import functools
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from layoutgen.config import MAX_TILE_ELEMENTS
from layoutgen.family import content_hash
from layoutgen.spec import FieldError, SpecBase, Transport

#: Logical axes of the payload buffer.
PAYLOAD_AXES: tuple[str, ...] = ("peer", "batch", "head", "dim")
#: Logical axes of a separate stats buffer.
STATS_AXES: tuple[str, ...] = ("peer", "batch", "head", "slot")
#: Logical axes of an fp8 spec's scales buffer (separate stats): one float32 scale per block of a row.
SCALE_AXES: tuple[str, ...] = ("peer", "batch", "head", "block")
#: The smallest scale block: a float32 scale per 16 fp8 elements already adds a quarter to the payload bytes.
MIN_SCALE_BLOCK = 16
#: The largest: one program quantises a whole block, and a launch config's tile holds at most
#: `layoutgen.config.MAX_TILE_ELEMENTS` elements.
MAX_SCALE_BLOCK = MAX_TILE_ELEMENTS


class PayloadDtype(str, Enum):
    INPUT = "input"  # the dtype of `out`
    FLOAT32 = "float32"
    FLOAT8_E4M3FN = "float8_e4m3fn"  # quantised per block with float32 scales (largest finite 448)
    FLOAT8_E5M2 = "float8_e5m2"  # likewise (largest finite 57344)

    @property
    def fp8(self) -> bool:
        return self in (PayloadDtype.FLOAT8_E4M3FN, PayloadDtype.FLOAT8_E5M2)


#: Largest finite value of each fp8 wire dtype: a block's scale is its amax over this (§8.3).
FP8_MAX: dict[PayloadDtype, float] = {PayloadDtype.FLOAT8_E4M3FN: 448.0, PayloadDtype.FLOAT8_E5M2: 57344.0}


class StatsPlacement(str, Enum):
    ROW_TAIL = "row_tail"
    SEPARATE = "separate"


class StatsForm(str, Enum):
    LSE = "lse"  # one float32 word per entry: the log-sum-exp
    MAX_SUM = "max_sum"  # two float32 words per entry: the max, then the sum of exponentials


#: Stats fields of the contract v2; left out of the layout hash while unset, so that every spec written
#: before them keeps its hash (and its tuning entries and generated module).
V2_STATS_FIELDS: tuple[str, ...] = ("form", "max_slot", "sum_slot")
#: Payload fields of fp8 specs; likewise left out of the hash while unset.
FP8_PAYLOAD_FIELDS: tuple[str, ...] = ("scale_block", "scale_axes")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


def _check_permutation(axes: tuple[str, ...], expected: tuple[str, ...]) -> tuple[str, ...]:
    if sorted(axes) != sorted(expected):
        raise ValueError(f"must be a permutation of {list(expected)} (outer to inner, each once), got {list(axes)}")
    return axes


class PayloadSpec(_Model):
    axes: tuple[str, ...] = Field(description="permutation of peer, batch, head, dim; outer to inner")
    dtype: PayloadDtype = Field(
        description="wire dtype: `input` (same as `out`), `float32`, or `float8_e4m3fn` / `float8_e5m2` (scaled)"
    )
    scale_block: StrictInt | None = Field(
        default=None, description="fp8 only: elements per float32 scale, a power of two dividing D (unset: D)"
    )
    scale_axes: tuple[str, ...] | None = Field(
        default=None, description="fp8 with separate stats only: the scales buffer's axes (peer, batch, head, block)"
    )

    @field_validator("axes")
    @classmethod
    def _axes_are_a_permutation(cls, axes: tuple[str, ...]) -> tuple[str, ...]:
        return _check_permutation(axes, PAYLOAD_AXES)

    @field_validator("scale_axes")
    @classmethod
    def _scale_axes_are_a_permutation(cls, axes: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if axes is None else _check_permutation(axes, SCALE_AXES)

    @model_validator(mode="after")
    def _scale_fields_need_fp8(self) -> PayloadSpec:
        if not self.dtype.fp8:
            for field in FP8_PAYLOAD_FIELDS:
                if getattr(self, field) is not None:
                    raise FieldError(
                        f"payload.{field}",
                        f"is only for an fp8 payload (dtype: float8_e4m3fn or float8_e5m2); remove it, or set "
                        f"one of those dtypes (got dtype: {self.dtype.value})",
                    )
            return self
        block = self.scale_block
        if block is not None and (block < MIN_SCALE_BLOCK or block > MAX_SCALE_BLOCK or block & (block - 1)):
            raise FieldError(
                "payload.scale_block",
                f"must be a power of two from {MIN_SCALE_BLOCK} to {MAX_SCALE_BLOCK} (elements of a row per float32 "
                f"scale, quantised by one program; it must also divide D), got {block}; leave it out for one scale "
                "per row",
            )
        return self


class StatsSpec(_Model):
    placement: StatsPlacement
    form: StatsForm | None = Field(default=None, description="lse (default) or max_sum")
    axes: tuple[str, ...] | None = Field(default=None, description="separate only")
    # Strict: YAML's `yes`, "2" or 1.0 are not word counts.
    slots: StrictInt | None = Field(default=None, description="separate only: float32 words per entry")
    slot: StrictInt | None = Field(default=None, description="separate, form lse only: the word holding the LSE")
    max_slot: StrictInt | None = Field(default=None, description="separate, form max_sum only: the max's word")
    sum_slot: StrictInt | None = Field(default=None, description="separate, form max_sum only: the sum's word")

    @field_validator("axes")
    @classmethod
    def _axes_are_a_permutation(cls, axes: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if axes is None else _check_permutation(axes, STATS_AXES)

    @property
    def stats_form(self) -> StatsForm:
        """The form, `lse` when the spec does not say."""
        return self.form or StatsForm.LSE

    @property
    def words(self) -> int:
        """float32 words of statistics per (peer, batch, head) entry: 1 (lse) or 2 (max, sum)."""
        return 2 if self.stats_form is StatsForm.MAX_SUM else 1

    @model_validator(mode="after")
    def _fields_match_placement(self) -> StatsSpec:
        max_sum = self.stats_form is StatsForm.MAX_SUM
        if self.placement is StatsPlacement.ROW_TAIL:
            for field in ("axes", "slots", "slot", "max_slot", "sum_slot"):
                if getattr(self, field) is not None:
                    where = (
                        "the max and the sum after the D payload elements of each row, in that order"
                        if max_sum
                        else "the LSE after the D payload elements of each row"
                    )
                    raise FieldError(
                        f"stats.{field}", f"is only for placement: separate; remove it (row_tail stores {where})"
                    )
            return self
        if self.axes is None:
            raise FieldError(
                "stats.axes",
                "placement: separate needs `axes`, a permutation of "
                f"{list(STATS_AXES)}; add e.g. `axes: [peer, batch, head, slot]`",
            )
        if not max_sum:
            for field in ("max_slot", "sum_slot"):
                if getattr(self, field) is not None:
                    raise FieldError(
                        f"stats.{field}",
                        "is only for form: max_sum; remove it, or add `form: max_sum` (use `slot` for the LSE)",
                    )
            slots = 1 if self.slots is None else self.slots
            slot = 0 if self.slot is None else self.slot
            if not 1 <= slots <= 64:
                raise FieldError("stats.slots", f"must be between 1 and 64, got {slots}")
            if not 0 <= slot < slots:
                given = "" if self.slots is not None else f" (slots not given: 1; add `slots: {slot + 1}`)"
                raise FieldError("stats.slot", f"must be in [0, slots) = [0, {slots}), got {slot}{given}")
            object.__setattr__(self, "slots", slots)
            object.__setattr__(self, "slot", slot)
            return self
        if self.slot is not None:
            raise FieldError(
                "stats.slot",
                "form: max_sum stores two words per entry; remove `slot` and name them with `max_slot` and "
                "`sum_slot` (defaults 0 and 1)",
            )
        slots = 2 if self.slots is None else self.slots
        if not 2 <= slots <= 64:
            raise FieldError("stats.slots", f"form: max_sum needs two words per entry: between 2 and 64, got {slots}")
        max_slot = 0 if self.max_slot is None else self.max_slot
        sum_slot = 1 if self.sum_slot is None else self.sum_slot
        for field, value in (("max_slot", max_slot), ("sum_slot", sum_slot)):
            if not 0 <= value < slots:
                given = "" if self.slots is not None else f" (slots not given: 2; add `slots: {value + 1}`)"
                raise FieldError(f"stats.{field}", f"must be in [0, slots) = [0, {slots}), got {value}{given}")
        if max_slot == sum_slot:
            # Blame the field the spec wrote: a clash with the other field's default is fixed by writing that one.
            if self.sum_slot is None:
                field, other, note = "max_slot", "sum_slot", "; sum_slot is not given (default 1): add `sum_slot: 0`"
            else:
                field, other, note = "sum_slot", "max_slot", ""
                if self.max_slot is None:
                    note = f"; max_slot is not given (default 0): add `max_slot: {1 if sum_slot == 0 else 0}`"
            raise FieldError(
                f"stats.{field}", f"must differ from {other} ({max_slot}): the max and the sum are two words{note}"
            )
        object.__setattr__(self, "slots", slots)
        object.__setattr__(self, "max_slot", max_slot)
        object.__setattr__(self, "sum_slot", sum_slot)
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
        if self.payload.dtype.fp8:
            if row_tail and self.payload.axes[-1] != "dim":
                raise FieldError(
                    "payload.axes",
                    "row_tail with an fp8 payload needs `dim` innermost (the stats and the float32 scales follow "
                    f"the row's D elements); got {list(self.payload.axes)}. Move `dim` last or use placement: separate",
                )
            if row_tail and self.payload.scale_axes is not None:
                raise FieldError(
                    "payload.scale_axes",
                    "is only for placement: separate; remove it (row_tail stores the scales after the stats words "
                    "of each row)",
                )
            if not row_tail and self.payload.scale_axes is None:
                object.__setattr__(self.payload, "scale_axes", SCALE_AXES)
        if self.transport is Transport.ALL_TO_ALL_SINGLE:
            buffers = [("payload.axes", self.payload.axes)]
            if self.stats.axes is not None:
                buffers.append(("stats.axes", self.stats.axes))
            if self.payload.scale_axes is not None:
                buffers.append(("payload.scale_axes", self.payload.scale_axes))
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

    @property
    def max_sum(self) -> bool:
        """Whether the stats are (max, sum) pairs (TensorRT-LLM helix) rather than one LSE word."""
        return self.stats.stats_form is StatsForm.MAX_SUM

    @property
    def fp8(self) -> bool:
        """Whether the payload travels as fp8 with float32 block scales."""
        return self.payload.dtype.fp8

    @property
    def fp8_max(self) -> float:
        """The fp8 wire dtype's largest finite value (448 or 57344)."""
        return FP8_MAX[self.payload.dtype]

    @property
    def fp8_chunks(self) -> bool:
        """Whether this fp8 spec's pack may split a scale block into chunks of its tile along dim (two
        passes over them: the amax, then the codes): a payload whose innermost axis is not `dim`.  There a
        store runs along heads, peers or rows, so a box of whole blocks (512 dims at block D) left runs of a
        few bytes (37% of the copy ceiling, issue 21)."""
        return self.fp8 and self.payload.axes[-1] != "dim"

    def scale_block_of(self, head_dim: int) -> int:
        """Elements per scale block at head dim D: `payload.scale_block`, or D when unset."""
        return self.payload.scale_block or head_dim

    @functools.cached_property
    def _layout_hash(self) -> str:
        # The contract-v2 stats fields count only when set (form: lse is the default, so it counts as unset):
        # a spec that does not use them keeps the hash it had before they existed.
        data: dict[str, Any] = self.model_dump(mode="json", exclude={"summary"})
        stats = data["stats"]
        for field in V2_STATS_FIELDS:
            if stats.get(field) is None or (field == "form" and stats[field] == StatsForm.LSE.value):
                stats.pop(field, None)
        for field in FP8_PAYLOAD_FIELDS:
            if data["payload"].get(field) is None:
                data["payload"].pop(field, None)
        return content_hash(data)
