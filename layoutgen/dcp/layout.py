"""Buffer geometry of a spec at a concrete shape, and the buffers object.

`LayoutBuffers` is what a generated module's `alloc` returns and what the
reference packs into: dense C-contiguous tensors in the order of the spec's
axes, plus the strided logical views `payload_view(B) -> [N, B, H/N, D]` and,
per stats word, `[N, B, H/N]` float32: `lse_view(B)` for an `lse`-form spec,
`max_view(B)` and `sum_view(B)` for a `max_sum` one (`stats_views(B)` gives
whichever the spec has, by name).  The views are derived from the spec alone,
so the reference and every generated module agree on where each byte lives.

An fp8 spec adds `scale_view(B) -> [N, B, H/N, blocks]` float32: one scale per block of `scale_block`
elements of a row, in the row tail after the stats words (row_tail) or in a `scales` buffer of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from layoutgen.config import next_pow2
from layoutgen.dcp.spec import MAX_SCALE_BLOCK, PAYLOAD_AXES, SCALE_AXES, STATS_AXES, DcpSpec, PayloadDtype
from layoutgen.runtime.tensors import as_int, type_name

#: Activation dtypes a pack accepts for `out` (docs/design.md §4).
INPUT_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)
LSE_BYTES = 4
#: The stats words of each form, in their order in a row tail.
STATS_WORDS: dict[bool, tuple[str, ...]] = {False: ("lse",), True: ("max", "sum")}
SCALE_BYTES = 4
#: The torch dtype of each fp8 wire dtype.
FP8_DTYPES: dict[PayloadDtype, torch.dtype] = {
    PayloadDtype.FLOAT8_E4M3FN: torch.float8_e4m3fn,
    PayloadDtype.FLOAT8_E5M2: torch.float8_e5m2,
}


def stats_words(spec: DcpSpec) -> tuple[str, ...]:
    """Names of the float32 stats words per (peer, batch, head) entry: ("lse",) or ("max", "sum")."""
    return STATS_WORDS[spec.max_sum]


def wire_dtype(spec: DcpSpec, dtype: torch.dtype) -> torch.dtype:
    """The payload buffer's element type for activations of `dtype`."""
    if spec.payload.dtype is PayloadDtype.FLOAT32:
        return torch.float32
    return FP8_DTYPES.get(spec.payload.dtype, dtype)


def scale_blocks(spec: DcpSpec, head_dim: int) -> int:
    """Float32 scales per row: D / scale_block for an fp8 spec, 0 otherwise."""
    return head_dim // spec.scale_block_of(head_dim) if spec.fp8 else 0


def row_length(spec: DcpSpec, head_dim: int, elem_size: int) -> int:
    """Extent of the payload's `dim` axis in elements: D, or D + the row tail (4 bytes per stats word, then,
    for an fp8 spec, 4 bytes per scale) rounded up to align_bytes."""
    if not spec.row_tail:
        return head_dim
    align = spec.align_bytes or LSE_BYTES
    row_bytes = head_dim * elem_size + LSE_BYTES * spec.stats.words + SCALE_BYTES * scale_blocks(spec, head_dim)
    row_bytes = -(-row_bytes // align) * align
    return row_bytes // elem_size


@dataclass(frozen=True)
class Shape:
    """The problem a set of buffers is sized for."""

    N: int
    B_max: int
    H: int
    D: int
    dtype: torch.dtype

    @property
    def heads_per_peer(self) -> int:
        return self.H // self.N


def check_shape(spec: DcpSpec, shape: Shape) -> None:
    """Raise ValueError/TypeError naming the argument when `shape` cannot be laid out by `spec`."""
    for label, value in (("N", shape.N), ("B_max", shape.B_max), ("H", shape.H), ("D", shape.D)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{label} must be an int, got {type_name(value)}")
        if value < 1:
            raise ValueError(f"{label} must be >= 1, got {value}")
    if shape.H % shape.N:
        raise ValueError(f"H (number of heads) must be divisible by N (peers): H={shape.H}, N={shape.N}")
    if shape.dtype not in INPUT_DTYPES:
        raise TypeError(f"dtype must be one of {[str(d) for d in INPUT_DTYPES]}, got {shape.dtype}")
    elem_size = wire_dtype(spec, shape.dtype).itemsize
    if spec.fp8 and shape.D % spec.scale_block_of(shape.D):
        raise ValueError(
            f"spec '{spec.name}' quantises blocks of scale_block={spec.payload.scale_block} elements, which must "
            f"divide D; got D={shape.D}. Use a D that is a multiple of {spec.payload.scale_block}, or another spec"
        )
    if spec.fp8 and not spec.fp8_chunks and next_pow2(spec.scale_block_of(shape.D)) > MAX_SCALE_BLOCK:
        raise ValueError(
            f"spec '{spec.name}' quantises each row of D={shape.D} elements under one scale (payload.scale_block "
            f"unset), and one program holds a whole scale block, at most {MAX_SCALE_BLOCK} elements (rounded up to "
            f"a power of two): set payload.scale_block to a power of two dividing D, or use D <= {MAX_SCALE_BLOCK}"
        )
    if spec.row_tail and (shape.D * elem_size) % LSE_BYTES:
        raise ValueError(
            f"spec '{spec.name}' stores its stats in the row tail, which needs D * element size to be a "
            f"multiple of 4 bytes; got D={shape.D} with {wire_dtype(spec, shape.dtype)} "
            f"({shape.D * elem_size} bytes). Use a D divisible by {LSE_BYTES // math.gcd(LSE_BYTES, elem_size)}, or a "
            "spec with stats placement: separate"
        )


def buffer_shapes(spec: DcpSpec, shape: Shape) -> dict[str, tuple[tuple[str, ...], tuple[int, ...], torch.dtype]]:
    """Name -> (axes, extents, dtype) of every buffer, outer to inner."""
    wire = wire_dtype(spec, shape.dtype)
    extents = {
        "peer": shape.N,
        "batch": shape.B_max,
        "head": shape.heads_per_peer,
        "dim": row_length(spec, shape.D, wire.itemsize),
    }
    buffers = {"payload": (spec.payload.axes, tuple(extents[a] for a in spec.payload.axes), wire)}
    if not spec.row_tail:
        if spec.stats.axes is None or spec.stats.slots is None:  # filled in by the spec's validator
            raise RuntimeError(f"spec {spec.name}: a separate stats buffer without axes or slots")
        extents["slot"] = spec.stats.slots
        buffers["stats"] = (spec.stats.axes, tuple(extents[a] for a in spec.stats.axes), torch.float32)
        if spec.fp8:
            scale_axes = spec.payload.scale_axes or SCALE_AXES
            extents["block"] = scale_blocks(spec, shape.D)
            buffers["scales"] = (scale_axes, tuple(extents[a] for a in scale_axes), torch.float32)
    return buffers


class LayoutBuffers:
    """Dense buffers of one spec at one shape (send side or receive side: same layout)."""

    def __init__(self, spec: DcpSpec, shape: Shape, tensors: dict[str, torch.Tensor]) -> None:
        self.spec = spec
        self.shape = shape
        self.tensors = tensors
        self.spec_name = spec.name
        self.layout_hash = spec.layout_hash()

    @classmethod
    def allocate(
        cls,
        spec: DcpSpec,
        N: int,
        B_max: int,
        H: int,
        D: int,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> LayoutBuffers:
        # NumPy integers as ints (anything else stays for check_shape to refuse).
        shape = Shape(as_int(N), as_int(B_max), as_int(H), as_int(D), dtype)
        check_shape(spec, shape)
        tensors = {
            name: torch.empty(extents, dtype=buffer_dtype, device=device)
            for name, (_, extents, buffer_dtype) in buffer_shapes(spec, shape).items()
        }
        return cls(spec, shape, tensors)

    N = property(lambda self: self.shape.N)
    B_max = property(lambda self: self.shape.B_max)
    H = property(lambda self: self.shape.H)
    D = property(lambda self: self.shape.D)
    dtype = property(lambda self: self.shape.dtype)

    @property
    def device(self) -> torch.device:
        return self.tensors["payload"].device

    def _check_batch(self, B: int) -> None:
        B = as_int(B)
        if isinstance(B, bool) or not isinstance(B, int) or not 0 <= B <= self.B_max:
            raise ValueError(f"B must be an int in [0, B_max={self.B_max}], got {B!r}")

    def _logical_payload(self) -> torch.Tensor:
        axes = self.spec.payload.axes
        return self.tensors["payload"].permute([axes.index(a) for a in PAYLOAD_AXES])

    def payload_view(self, B: int) -> torch.Tensor:
        """[N, B, H/N, D] strided view of the payload elements (wire dtype)."""
        self._check_batch(B)
        return self._logical_payload()[:, :B, :, : self.D]

    def word_view(self, B: int, word: int) -> torch.Tensor:
        """[N, B, H/N] strided float32 view of stats word `word` (0: the LSE or the max, 1: the sum)."""
        self._check_batch(B)
        if not 0 <= word < self.spec.stats.words:
            raise ValueError(f"spec '{self.spec.name}' has {self.spec.stats.words} stats word(s); no word {word}")
        if self.spec.row_tail:
            payload = self.tensors["payload"]
            if payload.dtype == torch.float32:
                return self._logical_payload()[:, :B, :, self.D + word]
            # dim is innermost (validated): reinterpret the tail's bytes as float32 words.
            per_word = LSE_BYTES // payload.element_size()
            start = self.D + word * per_word
            tail = payload[..., start : start + per_word].view(torch.float32)[..., 0]
            outer = self.spec.payload.axes[:-1]
            return tail.permute([outer.index(a) for a in PAYLOAD_AXES[:-1]])[:, :B]
        axes = self.spec.stats.axes or STATS_AXES
        stats = self.tensors["stats"].permute([axes.index(a) for a in STATS_AXES])
        slot = (self.spec.stats.max_slot, self.spec.stats.sum_slot)[word] if self.spec.max_sum else self.spec.stats.slot
        return stats[:, :B, :, slot]

    def scale_view(self, B: int) -> torch.Tensor:
        """[N, B, H/N, blocks] strided float32 view of an fp8 spec's block scales."""
        self._check_batch(B)
        if not self.spec.fp8:
            raise ValueError(f"spec '{self.spec.name}' has a {self.spec.payload.dtype.value} payload: it has no scales")
        blocks = scale_blocks(self.spec, self.D)
        if self.spec.row_tail:
            # dim is innermost (validated); the scales' float32 words follow the stats words.
            start = self.D + LSE_BYTES * self.spec.stats.words
            tail = self.tensors["payload"][..., start : start + SCALE_BYTES * blocks].view(torch.float32)
            outer = self.spec.payload.axes[:-1]
            return tail.permute([*(outer.index(a) for a in PAYLOAD_AXES[:-1]), 3])[:, :B]
        axes = self.spec.payload.scale_axes or SCALE_AXES
        return self.tensors["scales"].permute([axes.index(a) for a in SCALE_AXES])[:, :B]

    def lse_view(self, B: int) -> torch.Tensor:
        """[N, B, H/N] strided float32 view of the LSE words (an `lse`-form spec)."""
        if self.spec.max_sum:
            raise ValueError(
                f"spec '{self.spec.name}' keeps (max, sum) stats, not an LSE: use max_view(B) and sum_view(B)"
            )
        return self.word_view(B, 0)

    def max_view(self, B: int) -> torch.Tensor:
        """[N, B, H/N] strided float32 view of the max words (a `max_sum` spec)."""
        self._require_max_sum("max_view")
        return self.word_view(B, 0)

    def sum_view(self, B: int) -> torch.Tensor:
        """[N, B, H/N] strided float32 view of the sum words (a `max_sum` spec)."""
        self._require_max_sum("sum_view")
        return self.word_view(B, 1)

    def stats_views(self, B: int) -> dict[str, torch.Tensor]:
        """Every stats word's [N, B, H/N] view by name: {"lse": ...} or {"max": ..., "sum": ...}."""
        return {name: self.word_view(B, word) for word, name in enumerate(stats_words(self.spec))}

    def _require_max_sum(self, method: str) -> None:
        if not self.spec.max_sum:
            raise ValueError(f"spec '{self.spec.name}' keeps one LSE word per entry: use lse_view(B), not {method}")

    def __repr__(self) -> str:
        shapes = ", ".join(f"{name}={tuple(t.shape)}" for name, t in self.tensors.items())
        return (
            f"LayoutBuffers(spec={self.spec_name!r}, N={self.N}, B_max={self.B_max}, H={self.H}, "
            f"D={self.D}, dtype={self.dtype}, {shapes})"
        )
