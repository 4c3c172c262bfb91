"""Checks on user tensors that every family's argument validation uses (run once per plan, never cached).

A family's public function calls them while it plans a call: `check_runnable(kernel, *tensors)` before the
first launch (CPU tensors without TRITON_INTERPRET=1 get the fix, not Triton's "0 active drivers"),
`describe(tensor)` in its error messages, `check_config(config, ConfigType)` for an explicit `config=`,
`needs_int64` to pick 64-bit offsets, and an `OverlapGuard.of(buffers, call_tensors, disjoint)` kept in the
plan, whose `may_overlap(call_tensors)` says on each cached call whether to validate again.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from layoutgen.config import LaunchConfig

INT32_LIMIT = 2**31


def describe(tensor: torch.Tensor) -> str:
    return f"shape {tuple(tensor.shape)}, strides {tuple(tensor.stride())}, {tensor.dtype} on {tensor.device}"


def usable_device(device: Any, label: str) -> torch.device | None:
    """`device` (None: torch's default) as a torch.device this process can allocate on, else an error naming
    `label` and the fix (instead of torch's bare assertion from a CPU-only build)."""
    if device is None:
        return None
    try:
        where = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"{label}: device must be a torch.device or a name such as 'cuda' or 'cpu'; got {device!r}"
        ) from error
    if where.type not in ("cuda", "cpu"):
        raise ValueError(
            f"{label}: layoutgen's kernels run on CUDA devices (and on CPU under the Triton interpreter); got "
            f"device {where}: pass device='cuda' or device='cpu'"
        )
    if where.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"{label}: device {where} is not available here (torch.cuda.is_available() is False: a CPU-only "
                "torch build, or no GPU visible); pass device='cpu' (kernels then need TRITON_INTERPRET=1) or "
                "run on a machine with a CUDA GPU"
            )
        count = torch.cuda.device_count()
        if where.index is not None and where.index >= count:
            raise ValueError(f"{label}: device {where} does not exist; this process sees {count} CUDA device(s)")
    return where


def required_device(device: Any, label: str) -> torch.device:
    """`usable_device` where a device must be named; 'cuda' as the current CUDA device, with its index (what
    the tensors allocated there report, and the call's tensors are compared with)."""
    where = usable_device(device, label)
    if where is None:
        raise TypeError(f"{label} needs a device (e.g. 'cuda' or 'cpu'), got None")
    if where.type == "cuda" and where.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return where


def as_int(value: Any) -> Any:
    """`value` as an int where it is an integer of another type (a NumPy integer scalar: an engine's batch
    arrays hold them), else `value` itself for the caller's check to refuse: a bool (NumPy's has no
    __index__), a float, or a tensor (reading a GPU tensor's value would wait for the GPU)."""
    if isinstance(value, (int, torch.Tensor)):  # bool is an int
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value


def type_name(value: Any) -> str:
    """`value`'s type as an error message names it: `int` for a builtin, `numpy.bool` for another module's."""
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def positive_int(label: str, value: Any) -> int:
    """A size argument: an int >= 1 (not a bool; a NumPy integer is taken as its int)."""
    value = as_int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{label} must be an int, got {type_name(value)}")
    if value < 1:
        raise ValueError(f"{label} must be >= 1, got {value}")
    return value


def check_config(config: Any, kind: type[LaunchConfig]) -> None:
    if not isinstance(config, kind):
        raise TypeError(f"config must be a {kind.__module__}.{kind.__name__} or None, got {type(config).__name__}")


def _max_offset(tensor: torch.Tensor) -> int:
    return sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True) if size > 0)


def _injective(dims: Iterable[tuple[int, int]]) -> bool:
    """Whether (stride, extent) dims address every index at its own offset: sorted by stride, each stride
    exceeds the largest offset the smaller ones reach (the standard no-internal-overlap test; conservative)."""
    reach = 0
    for stride, size in sorted(dims):
        if stride <= reach:
            return False
        reach += stride * (size - 1)
    return True


def overlaps_itself(tensor: torch.Tensor) -> bool:
    """Whether two positions of `tensor` may share an element (e.g. an expand()ed view); conservative."""
    if tensor.numel() == 0:
        return False
    return not _injective(
        (stride, size) for size, stride in zip(tensor.shape, tensor.stride(), strict=True) if size > 1
    )


def byte_span(tensor: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) bytes of `tensor` in its storage's address space (an empty span for no elements)."""
    if tensor.numel() == 0:
        return (0, 0)
    start = tensor.data_ptr()
    return start, start + (_max_offset(tensor) + 1) * tensor.element_size()


def _spans_meet(first: torch.Tensor, second: torch.Tensor) -> bool:
    a, b = byte_span(first), byte_span(second)
    return a[0] < a[1] and b[0] < b[1] and a[0] < b[1] and b[0] < a[1]


def _sliced_relation(first: torch.Tensor, second: torch.Tensor) -> bool | None:
    """For two non-empty tensors laid out alike -- the same element size and rank, the same strides where both
    extend, extents that differ in at most one dim d -- as slices of one union view along d (packed qkv's q, k
    and v): True when they share an element, False when they share none, None when this test cannot tell.

    The union keeps their strides and covers both index ranges along d; when it addresses every index at its
    own offset (`_injective`) and the address gap is a whole number of d's strides, the two share an element
    exactly when their index ranges along d meet."""
    item = first.element_size()
    gap = second.data_ptr() - first.data_ptr()
    if item != second.element_size() or first.dim() != second.dim() or gap % item:
        return None
    gap //= item
    shape_a, shape_b, strides_a, strides_b = first.shape, second.shape, first.stride(), second.stride()
    dims = range(first.dim())
    if any(shape_a[e] > 1 and shape_b[e] > 1 and strides_a[e] != strides_b[e] for e in dims):
        return None
    differing = [e for e in dims if shape_a[e] != shape_b[e]]
    if len(differing) > 1:
        return None
    for d in differing or dims:
        extent_a, extent_b = shape_a[d], shape_b[d]
        # Along d the union takes the stride of a tensor that extends along it; where neither does, either
        # stride serves (a single index's offset does not depend on it).
        if extent_a > 1:
            candidates: tuple[int, ...] = (strides_a[d],)
        elif extent_b > 1:
            candidates = (strides_b[d],)
        else:
            candidates = (strides_a[d], strides_b[d])
        for stride in candidates:
            if stride <= 0 or gap % stride:
                continue
            shift = gap // stride  # second's index range along d is [shift, shift + extent_b)
            low, high = min(0, shift), max(extent_a, shift + extent_b)
            others = [(strides_a[e], shape_a[e]) for e in dims if e != d and shape_a[e] > 1]
            if _injective([(stride, high - low), *others]):
                return shift < extent_a and shift + extent_b > 0
    return None


def overlap(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether two tensors may share an element: their address spans intersect and their layouts do not
    prove them apart (`_sliced_relation`: disjoint slices of one tensor, such as a packed qkv's q, k and v,
    are apart).  Conservative: True may be a false alarm, False never is."""
    return _spans_meet(first, second) and _sliced_relation(first, second) is not False


def shares_memory(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether two tensors provably share an element (the same first address, or slices of one view whose
    index ranges meet): an error says "share memory" only then, else that they may overlap."""
    if not _spans_meet(first, second):
        return False
    return first.data_ptr() == second.data_ptr() or _sliced_relation(first, second) is True


def overlap_relation(first: torch.Tensor, second: torch.Tensor) -> str:
    """How an error words two tensors that `overlap` flags: "shares memory with" only where that is proven."""
    if shares_memory(first, second):
        return "shares memory with"
    return "may overlap (their address ranges intersect, and their strides do not prove them apart)"


def _relative(starts: tuple[int, ...], lengths: tuple[int, ...]) -> tuple[int, ...]:
    """Addresses relative to the first non-empty tensor's (0 for empty tensors, whose address is arbitrary)."""
    base = next((start for start, length in zip(starts, lengths) if length), 0)  # noqa: B905
    return tuple(start - base if length else 0 for start, length in zip(starts, lengths))  # noqa: B905


@dataclass(frozen=True)
class OverlapGuard:
    """What a cached plan's overlap checks saw, for its later calls: the tensors of a plan key keep their
    geometry but not their addresses, so a call's tensors at new addresses may overlap memory the first
    call's did not.  `fixed` holds the byte spans of the buffers (whose addresses the plan owns), `lengths`
    each call tensor's span length, `disjoint` whether the call's tensors must not overlap one another
    (outputs).  `may_overlap` is the cached path's test: one data_ptr() per tensor and a few comparisons;
    when it says yes the call is validated again, and the validation names what overlaps."""

    fixed: tuple[tuple[int, int], ...]
    lengths: tuple[int, ...]
    disjoint: bool
    # The fixed spans' hull: a tensor outside it (the usual case) costs one comparison.
    hull: tuple[int, int] = (0, 0)
    # Spans that meet need not share an element (packed qkv: q, k and v are slices of one tensor, their
    # spans interleave).  Where `of` proved the planned call's tensors apart by their layouts (`overlap`),
    # a later call whose spans meet is apart too when its tensors sit where the planned call's did
    # (`proven_starts`, also against the buffers) or, meeting none of the buffers, at the same addresses
    # relative to one another (`proven_offsets`): the plan key fixes their geometry, so no re-plan.
    proven_starts: tuple[int, ...] | None = None
    proven_offsets: tuple[int, ...] | None = None

    @classmethod
    def of(cls, buffers: Iterable[torch.Tensor], tensors: Iterable[torch.Tensor], disjoint: bool) -> OverlapGuard:
        buffers, tensors = list(buffers), list(tensors)
        fixed = tuple(span for span in map(byte_span, buffers) if span[0] < span[1])
        hull = (min(s for s, _ in fixed), max(e for _, e in fixed)) if fixed else (0, 0)
        lengths = tuple(end - start for start, end in map(byte_span, tensors))
        starts = tuple(tensor.data_ptr() for tensor in tensors)
        apart = not disjoint or not any(overlap(a, b) for i, a in enumerate(tensors) for b in tensors[:i])
        clear = apart and not any(overlap(tensor, buffer) for tensor in tensors for buffer in buffers)
        proven_offsets = _relative(starts, lengths) if disjoint and apart else None
        return cls(fixed, lengths, disjoint, hull, starts if clear else None, proven_offsets)

    def may_overlap(self, tensors: Sequence[torch.Tensor]) -> bool:
        # Written for the hot path, timed with three tensors (CPU, Python 3.11, medians of 50k calls): 0.54 us
        # for inputs (disjoint False; 0.61 before this loop had its own branch), 0.92 for outputs, of which
        # 0.3 are the data_ptr() calls; no generator, no strict zip (`lengths` has one entry per tensor of the
        # plan).  A hit costs `_unproven` (about 0.6 more; packed qkv's outputs take it on every call).
        low, high = self.hull
        if not self.disjoint:
            for tensor, length in zip(tensors, self.lengths):  # noqa: B905
                start = tensor.data_ptr()
                if start < high and low < start + length and length and self._hits_fixed(start, start + length):
                    return self._unproven(tensors)
            return False
        seen: list[tuple[int, int]] = []
        for tensor, length in zip(tensors, self.lengths):  # noqa: B905
            start = tensor.data_ptr()
            end = start + length
            if start < high and low < end and length and self._hits_fixed(start, end):
                return self._unproven(tensors)
            if length:
                for first, stop in seen:
                    if start < stop and first < end:
                        return self._unproven(tensors)
                seen.append((start, end))
        return False

    def _hits_fixed(self, start: int, end: int) -> bool:
        return any(start < stop and first < end for first, stop in self.fixed)

    def _unproven(self, tensors: Sequence[torch.Tensor]) -> bool:
        """Spans met: whether the call's tensors sit elsewhere than where `of` proved them apart."""
        starts = tuple(tensor.data_ptr() for tensor, _ in zip(tensors, self.lengths))  # noqa: B905
        if starts == self.proven_starts:
            return False
        low, high = self.hull
        for start, length in zip(starts, self.lengths):  # noqa: B905
            if length and start < high and low < start + length and self._hits_fixed(start, start + length):
                return True
        return self.proven_offsets is None or _relative(starts, self.lengths) != self.proven_offsets


def needs_int64(*tensors: torch.Tensor) -> bool:
    """Whether some element offset of these tensors does not fit the kernels' int32 index arithmetic."""
    return any(_max_offset(t) >= INT32_LIMIT or t.numel() >= INT32_LIMIT for t in tensors)


def check_runnable(kernel: Any, *tensors: torch.Tensor) -> None:
    """CPU tensors run only under the Triton interpreter: say so, instead of Triton's "0 active drivers"."""
    from layoutgen.runtime.launch import is_jit_function

    cpu = sorted({str(t.device) for t in tensors if t.device.type == "cpu"})
    if cpu and is_jit_function(kernel):
        raise RuntimeError(
            f"the tensors are on {', '.join(cpu)}, and Triton runs kernels on CPU tensors only under its "
            "interpreter: set TRITON_INTERPRET=1 before triton is first imported (e.g. `TRITON_INTERPRET=1 "
            "python script.py`), or pass CUDA tensors"
        )


def check_plain(label: str, tensor: torch.Tensor, context: str = "") -> None:
    """Refuse what the kernels cannot read as memory (TypeError naming `label`, after `context` such as
    "scatter: ", and the fix): a nested or sparse tensor, whose shape and strides do not describe its elements,
    and a view with torch's lazy negation or conjugation bit (`x.conj().imag`), whose values are not the bytes
    the kernel would read."""
    if tensor.is_nested:
        raise TypeError(f"{context}{label} must be a regular tensor, got a nested tensor: pass one padded tensor")
    if tensor.layout is not torch.strided:
        raise TypeError(
            f"{context}{label} must be a dense tensor, got a {str(tensor.layout).removeprefix('torch.')} tensor "
            f"of shape {list(tensor.shape)}: convert it with .to_dense()"
        )
    for bit, is_set, resolve in (
        ("negation", tensor.is_neg(), "resolve_neg"),
        ("conjugation", tensor.is_conj(), "resolve_conj"),
    ):
        if is_set:
            raise TypeError(
                f"{context}{label} is a view with torch's lazy {bit} bit set (e.g. x.conj().imag): its values are "
                f"not the bytes in memory the kernels read; call .{resolve}() on it"
            )


def check_one_device(named: dict[str, torch.Tensor | None], buffers: list[torch.Tensor]) -> None:
    """A custom op's fake kernel also serves a direct call with one tensor on the meta device (torch sends the
    whole call there), which would otherwise return having written nothing: every tensor must be on the
    buffers' device (ValueError naming it)."""
    device = buffers[0].device if buffers else None
    for name, tensor in named.items():
        if tensor is not None and device is not None and tensor.device != device:
            raise ValueError(f"{name} is on {tensor.device} but the buffers are on {device}")
    for position, tensor in enumerate(buffers):
        if tensor.device != device:
            raise ValueError(f"buffers[{position}] is on {tensor.device} but buffers[0] is on {device}")
