"""Kernels never touch bytes they do not own, and numerics hold at the edges (issue 8, guarantees 3 and 4).

Guards: every buffer of a pack or combine is a view into the middle of a larger, canary-filled allocation
(the buffers object holds exactly the dense tensors alloc() would, at odd offsets), and so are `out`/`lse`;
after the kernels run, every guard byte holds its canary and the inputs are unchanged.  `combine(out=...)`
with unusual strides is handled, or refused (self-overlapping views) without touching memory.

Numerics: denormal payloads, N = 1, empty shards with NaN/inf/huge garbage, LSEs of +-1e4 and +-3e38, all
mixed: combine matches the float64 reference within `layoutgen.tolerances` (plus one subnormal spacing of
the output dtype where the result is subnormal), never NaN; all-empty rows are exactly 0 with LSE -inf.

The long run: `pytest -m slow tests/test_hardening_kernels.py`.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import pytest
import torch
from conftest import CANARY, NAN_BYTE, fill_bytes, random_inputs, requires_interpreter, strided_inputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layoutgen.dcp import reference
from layoutgen.dcp.layout import LayoutBuffers, Shape, buffer_shapes, wire_dtype
from layoutgen.dcp.tolerances import COMBINE_ATOL_SCALED, COMBINE_RTOL, combine_error, lse_error
from layoutgen.loader import generated_dir, load_path

pytestmark = [requires_interpreter, pytest.mark.usefixtures("no_log_warnings")]

SPEC_NAMES = ("flashinfer_mnnvl", "npu_like", "pynccl_a2a", "pynccl_a2a_aligned", "vllm_a2a")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
GUARD_EXAMPLES, GUARD_EXAMPLES_SLOW = 8, 150
MIX_EXAMPLES, MIX_EXAMPLES_SLOW = 6, 150
FAST = {"deadline": None, "derandomize": True, "suppress_health_check": list(HealthCheck)}
SLOW = {"deadline": None, "suppress_health_check": list(HealthCheck)}
INF, NAN = float("inf"), float("nan")


# ---------------------------------------------------------------------------------------------
# Guarded memory
# ---------------------------------------------------------------------------------------------
class Guarded:
    """A view of `shape`/`dtype` at byte `lead` of a `fill`-filled uint8 allocation with `tail` bytes after."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, lead: int, tail: int, fill: int) -> None:
        size = math.prod(shape) * dtype.itemsize
        self.storage = torch.full((lead + size + tail,), fill, dtype=torch.uint8)
        self.lead, self.end, self.fill = lead, lead + size, fill
        self.view = self.storage[lead : self.end].view(dtype).view(shape)

    def assert_guards_hold(self, label: str) -> None:
        for name, guard in (("before", self.storage[: self.lead]), ("after", self.storage[self.end :])):
            touched = (guard != self.fill).nonzero().flatten()
            assert touched.numel() == 0, f"{label}: {touched.numel()} guard bytes {name} the buffer were written"


def guarded_buffers(
    spec: Any, N: int, B_max: int, H: int, D: int, dtype: torch.dtype, leads: list[int], tail: int, fill: int
) -> tuple[LayoutBuffers, list[Guarded]]:
    """The buffers alloc() would return, each a view into a larger `fill`-filled allocation."""
    shape = Shape(N, B_max, H, D, dtype)
    guards, tensors = [], {}
    for (name, (_, extents, buffer_dtype)), lead in zip(buffer_shapes(spec, shape).items(), leads, strict=False):
        guard = Guarded(extents, buffer_dtype, lead, tail, fill)
        guards.append(guard)
        tensors[name] = guard.view
    return LayoutBuffers(spec, shape, tensors), guards


def snapshot(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Copies of the whole storage behind each tensor (to prove a kernel did not write its inputs)."""
    return [torch.frombuffer(bytearray(bytes(t.untyped_storage())), dtype=torch.uint8) for t in tensors]


def same_storage(tensors: tuple[torch.Tensor, ...], before: list[torch.Tensor]) -> bool:
    return all(torch.equal(after, saved) for after, saved in zip(snapshot(*tensors), before, strict=True))


def random_partials(N: int, B: int, h: int, D: int, dtype: torch.dtype, generator: torch.Generator) -> Any:
    return torch.randn(N, B, h, D, generator=generator).to(dtype), torch.randn(N, B, h, generator=generator) * 4


def within_contract(got: torch.Tensor, want: torch.Tensor, scale: float, subnormal_slack: float = 0.0) -> float:
    """`tolerances.combine_error` with `subnormal_slack` added to the absolute tolerance (a subnormal result
    has only absolute precision: its spacing); <= 1 passes, inf on a special-value mismatch or NaN."""
    if subnormal_slack == 0.0:
        return combine_error(got, want, scale)
    got64 = got.to(torch.float64)
    same_special = (got64 == want) | (torch.isnan(got64) & torch.isnan(want))
    finite = torch.isfinite(got64) & torch.isfinite(want)
    if not bool((same_special | finite).all()):
        return INF
    allowed = COMBINE_RTOL[got.dtype] * want.abs() + COMBINE_ATOL_SCALED * max(scale, 1e-30) + subnormal_slack
    return float((torch.where(finite, (got64 - want).abs(), 0.0) / allowed).max()) if got.numel() else 0.0


def subnormal_spacing(dtype: torch.dtype) -> float:
    info = torch.finfo(dtype)
    return info.tiny * info.eps


# ---------------------------------------------------------------------------------------------
# Guard regions around every buffer (hypothesis)
# ---------------------------------------------------------------------------------------------
@st.composite
def guarded_problems(draw: Any) -> dict[str, Any]:
    N = draw(st.integers(1, 4))
    B_max = draw(st.integers(1, 4))
    return {
        "spec": draw(st.sampled_from(SPEC_NAMES)),
        "dtype": draw(st.sampled_from(DTYPES)),
        "N": N,
        "h": draw(st.integers(1, 3)),
        "D": draw(st.sampled_from([4, 6, 8, 12, 20])),
        "B_max": B_max,
        "B": draw(st.integers(1, B_max)),
        # Offsets in 4-byte words: aligned for every element type, mostly not to 16 bytes.
        "leads": [4 * draw(st.integers(0, 9)) for _ in range(2)],
        "tail": 4 * draw(st.integers(1, 9)),
        "inputs": draw(st.sampled_from(["contiguous", "out_slice", "out_heads_outer", "lse_transposed", "all"])),
        "out": draw(st.sampled_from(["none", "guarded", "dim_step_2", "heads_outer"])),
        "base": draw(st.sampled_from(["e", "2"])),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def check_guarded(problem: dict[str, Any], module: ModuleType) -> None:
    spec, dtype, N, h, B, B_max = (
        module.SPEC,
        problem["dtype"],
        problem["N"],
        problem["h"],
        problem["B"],
        problem["B_max"],
    )
    D = problem["D"]
    if spec.row_tail and D * wire_dtype(spec, dtype).itemsize % 4:
        D += 1
    H = N * h
    generator = torch.Generator().manual_seed(problem["seed"])
    label = f"{spec.name} {dtype} N={N} B={B}/{B_max} H={H} D={D} {problem}"

    # pack: into guarded send buffers, from inputs with NaN around them (strided_inputs)
    out, lse = strided_inputs(*random_inputs(B, H, D, dtype, generator), problem["inputs"])
    inputs_before = snapshot(out, lse)
    send, send_guards = guarded_buffers(spec, N, B_max, H, D, dtype, problem["leads"], problem["tail"], CANARY)
    want = fill_bytes(LayoutBuffers.allocate(spec, N, B_max, H, D, dtype), CANARY)
    module.pack(out, lse, send)
    reference.pack(out, lse, want)
    for guard in send_guards:
        guard.assert_guards_hold(f"pack {label}")
    for name, tensor in send.tensors.items():
        assert torch.equal(tensor.view(torch.uint8), want.tensors[name].view(torch.uint8)), f"pack {name} {label}"
    assert same_storage((out, lse), inputs_before), f"pack wrote its inputs: {label}"

    # combine: guarded receive buffers (NaN in every byte a transport does not deliver), guarded out
    partial_out, partial_lse = random_partials(N, B, h, D, dtype, generator)
    partial_lse[0, 0, 0] = -INF  # an empty shard, with garbage behind it
    partial_out[0, 0, 0] = NAN
    recv, recv_guards = guarded_buffers(spec, N, B_max, H, D, dtype, problem["leads"][::-1], problem["tail"], NAN_BYTE)
    recv.payload_view(B).copy_(partial_out.to(wire_dtype(spec, dtype)))
    recv.lse_view(B).copy_(partial_lse)
    recv_before = snapshot(*recv.tensors.values())
    target, out_guard, out_storage = None, None, None
    if problem["out"] == "guarded":
        out_guard = Guarded((B, h, D), dtype, problem["leads"][0] + dtype.itemsize, problem["tail"], NAN_BYTE)
        target = out_guard.view
    elif problem["out"] == "dim_step_2":
        out_storage = torch.full((B, h, 2 * D), NAN, dtype=dtype)
        target = out_storage[:, :, ::2]
    elif problem["out"] == "heads_outer":
        out_storage = torch.full((h + 1, B, D), NAN, dtype=dtype)
        target = out_storage[1:].permute(1, 0, 2)
    got, got_lse = module.combine(recv, B, lse_base=problem["base"], out=target, return_lse=True)
    merged, merged_lse = reference.merge_partials(partial_out, partial_lse, problem["base"])
    scale = float(torch.nan_to_num(partial_out.double(), nan=0.0).abs().max())
    assert not bool(torch.isnan(got).any()), f"NaN reached the output: {label}"
    assert combine_error(got, merged, scale) <= 1.0, label
    assert got_lse is not None and lse_error(got_lse, merged_lse) <= 1.0, label
    for guard in recv_guards:
        guard.assert_guards_hold(f"combine {label}")
    assert same_storage(tuple(recv.tensors.values()), recv_before), f"combine wrote its receive buffers: {label}"
    if out_guard is not None:
        out_guard.assert_guards_hold(f"combine out {label}")
        assert got.data_ptr() == out_guard.view.data_ptr()
    elif target is not None and out_storage is not None:
        assert_written_only_through(out_storage, target, label)


def assert_written_only_through(storage: torch.Tensor, view: torch.Tensor, label: str) -> None:
    """Every element of the NaN-filled `storage` outside `view` is still NaN."""
    flat = storage.view(-1)
    written = torch.zeros(flat.numel(), dtype=torch.bool)
    written.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(True)
    assert bool(torch.isnan(flat[~written]).all()), f"combine wrote outside `out`: {label}"


@settings(max_examples=GUARD_EXAMPLES, **FAST)
@given(problem=guarded_problems())
def test_pack_and_combine_leave_every_guard_byte(problem: dict[str, Any], spec_modules: dict[str, ModuleType]) -> None:
    check_guarded(problem, spec_modules[problem["spec"]])


@pytest.mark.slow
@settings(max_examples=GUARD_EXAMPLES_SLOW, **SLOW)
@given(problem=guarded_problems())
def test_guard_bytes_long_run(problem: dict[str, Any], spec_modules: dict[str, ModuleType]) -> None:
    check_guarded(problem, spec_modules[problem["spec"]])


def test_the_guards_catch_a_pack_that_writes_past_its_buffer(tmp_path: Any, generator: torch.Generator) -> None:
    # The check must be able to fail: a dim mask off by one writes one element past the last row.
    source = (generated_dir() / "vllm_a2a.py").read_text(encoding="utf-8")
    broken = source.replace("(dim_4d < HEAD_DIM)", "(dim_4d <= HEAD_DIM)")
    assert broken.count("(dim_4d <= HEAD_DIM)") == 1, "the pack template changed: update this mutation"
    (tmp_path / "vllm_a2a.py").write_text(broken, encoding="utf-8")
    module = load_path(tmp_path / "vllm_a2a.py")
    N, B, H, D = 2, 2, 4, 12  # a 16-wide dim tile: the broken mask lets element D through
    out, lse = random_inputs(B, H, D, torch.bfloat16, generator)
    bufs, guards = guarded_buffers(module.SPEC, N, B, H, D, torch.bfloat16, [8, 8], 8, CANARY)
    module.pack(out, lse, bufs)
    with pytest.raises(AssertionError, match="guard bytes after the buffer were written"):
        guards[0].assert_guards_hold("mutated pack")


# ---------------------------------------------------------------------------------------------
# Unusual views: handled, or refused without touching memory
# ---------------------------------------------------------------------------------------------
N_, B_, h_, D_ = 2, 3, 2, 8


def _recv(module: ModuleType, dtype: torch.dtype, generator: torch.Generator) -> tuple[LayoutBuffers, Any]:
    partial_out, partial_lse = random_partials(N_, B_, h_, D_, dtype, generator)
    bufs = fill_bytes(module.alloc(N_, B_, N_ * h_, D_, dtype), NAN_BYTE)
    bufs.payload_view(B_).copy_(partial_out.to(wire_dtype(module.SPEC, dtype)))
    bufs.lse_view(B_).copy_(partial_lse)
    return bufs, reference.merge_partials(partial_out, partial_lse)


def _view(kind: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(storage, out view [B, h, D]) of the given kind; the storage is NaN wherever the view does not reach."""
    if kind == "transposed-last-stride-not-1":
        storage = torch.full((D_ + 2, h_, B_ + 1), NAN, dtype=dtype)
        return storage, storage[1 : 1 + D_, :, :B_].permute(2, 1, 0)
    if kind == "batch-innermost-interleaved":
        storage = torch.full((B_ * h_ * D_ + 5,), NAN, dtype=dtype)
        return storage, storage.as_strided((B_, h_, D_), (1, B_ * D_, B_), 2)
    if kind == "sliced-every-third":
        storage = torch.full((B_ + 1, h_ * 2, 3 * D_), NAN, dtype=dtype)
        return storage, storage[1:, ::2, 1::3]
    storage = torch.full((B_ * h_ * D_,), NAN, dtype=dtype)
    if kind == "expanded-batch":
        return storage, storage[: h_ * D_].view(1, h_, D_).expand(B_, h_, D_)
    if kind == "expanded-dim":
        return storage, storage[: B_ * h_].view(B_, h_, 1).expand(B_, h_, D_)
    if kind == "overlapping-rows":
        return storage, storage.as_strided((B_, h_, D_), (h_ * D_ // 2, D_ // 2, 1))
    raise ValueError(kind)


HANDLED = ("transposed-last-stride-not-1", "batch-innermost-interleaved", "sliced-every-third")
REFUSED = ("expanded-batch", "expanded-dim", "overlapping-rows")


@pytest.mark.parametrize("kind", HANDLED)
@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "flashinfer_mnnvl"])
def test_combine_writes_views_with_unusual_strides_and_nothing_else(
    spec_name: str, kind: str, spec_modules: dict[str, ModuleType], generator: torch.Generator
) -> None:
    dtype = torch.float16
    bufs, (want, _) = _recv(spec_modules[spec_name], dtype, generator)
    storage, out = _view(kind, dtype)
    if kind == "transposed-last-stride-not-1":
        assert out.stride(-1) != 1
    got, _ = spec_modules[spec_name].combine(bufs, B_, out=out)
    assert got.data_ptr() == out.data_ptr() and combine_error(out, want, 4.0) <= 1.0
    assert_written_only_through(storage, out, kind)


@pytest.mark.parametrize("kind", REFUSED)
def test_combine_refuses_a_self_overlapping_out_and_writes_nothing(
    kind: str, spec_modules: dict[str, ModuleType], generator: torch.Generator
) -> None:
    module = spec_modules["vllm_a2a"]
    bufs, _ = _recv(module, torch.float16, generator)
    storage, out = _view(kind, torch.float16)
    before = storage.clone()
    with pytest.raises(ValueError, match=r"out must not overlap itself .* got shape \(3, 2, 8\), strides"):
        module.combine(bufs, B_, out=out)
    assert torch.equal(storage.view(torch.int16), before.view(torch.int16))


@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "vllm_a2a"])
def test_pack_reads_broadcast_inputs(spec_name: str, spec_modules: dict[str, ModuleType], generator: Any) -> None:
    # Inputs may overlap themselves (stride 0): pack only reads them.
    module = spec_modules[spec_name]
    B, H, D = 3, 4, 8
    row, row_lse = random_inputs(1, H, D, torch.bfloat16, generator)
    out, lse = row.expand(B, H, D), row_lse.expand(B, H)
    ours = fill_bytes(module.alloc(2, B, H, D, torch.bfloat16))
    theirs = fill_bytes(LayoutBuffers.allocate(module.SPEC, 2, B, H, D, torch.bfloat16))
    module.pack(out, lse, ours)
    reference.pack(out.contiguous(), lse.contiguous(), theirs)
    for name in ours.tensors:
        assert torch.equal(ours.tensors[name].view(torch.uint8), theirs.tensors[name].view(torch.uint8))


@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "pynccl_a2a_aligned"])
def test_a_row_tail_payload_off_a_4_byte_boundary_is_refused(
    spec_name: str, spec_modules: dict[str, ModuleType], generator: torch.Generator
) -> None:
    # The LSE is a float32 word inside bf16 rows: a GPU faults on a misaligned 4-byte store.
    module = spec_modules[spec_name]
    bufs, guards = guarded_buffers(module.SPEC, 2, 2, 4, 8, torch.bfloat16, [2], 8, CANARY)
    out, lse = random_inputs(2, 4, 8, torch.bfloat16, generator)
    with pytest.raises(ValueError, match=r"must start at a 4-byte aligned address"):
        module.pack(out, lse, bufs)
    with pytest.raises(ValueError, match=r"must start at a 4-byte aligned address"):
        module.combine(bufs, 2)
    assert bool((guards[0].storage == CANARY).all())


# ---------------------------------------------------------------------------------------------
# Numerics at the edges
# ---------------------------------------------------------------------------------------------
def combine_partials(
    module: ModuleType, partial_out: torch.Tensor, partial_lse: torch.Tensor, dtype: torch.dtype, base: str = "e"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """(got, got_lse, want, want_lse, scale): the generated combine and the float64 reference."""
    N, B, h, D = partial_out.shape
    bufs = fill_bytes(module.alloc(N, B, N * h, D, dtype), NAN_BYTE)
    bufs.payload_view(B).copy_(partial_out.to(wire_dtype(module.SPEC, dtype)))
    bufs.lse_view(B).copy_(partial_lse)
    got, got_lse = module.combine(bufs, B, lse_base=base, return_lse=True)
    want, want_lse = reference.combine(bufs, B, base, return_lse=True)
    lse = bufs.lse_view(B)
    taking_part = bufs.payload_view(B).to(torch.float64)[~(torch.isnan(lse) | (lse.abs() == INF))]
    scale = float(taking_part.abs().max()) if taking_part.numel() else 0.0
    assert got_lse is not None and not bool(torch.isnan(got).any()), "NaN reached the output"
    return got, got_lse, want, want_lse, scale


# The Triton interpreter's bf16 <-> fp32 conversion (triton/runtime/interpreter.py `_convert_float`) loses
# bf16 subnormals; GPUs convert them exactly.  So under the interpreter a bf16 subnormal result may be off
# by up to the smallest normal; everywhere else by one subnormal spacing of the output dtype.
def _subnormal_slack(dtype: torch.dtype) -> float:
    if dtype == torch.bfloat16 and not torch.cuda.is_available():
        return torch.finfo(dtype).tiny
    return subnormal_spacing(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("spec_name", ["vllm_a2a", "npu_like"])
def test_denormal_payloads(spec_name: str, dtype: torch.dtype, spec_modules: dict[str, ModuleType]) -> None:
    generator = torch.Generator().manual_seed(5)
    info = torch.finfo(dtype)
    N, B, h, D = 3, 2, 2, 8
    # Subnormals of the activation dtype (for npu_like the float32 wire holds them exactly), a few normals.
    partial_out = (torch.randint(-60, 61, (N, B, h, D), generator=generator).double() * info.tiny / 64).to(dtype)
    partial_out[:, 0, 0, 0] = info.tiny * 3
    assert bool((partial_out.abs() < info.tiny).any())
    partial_lse = torch.randn(N, B, h, generator=generator) * 4
    got, got_lse, want, want_lse, scale = combine_partials(spec_modules[spec_name], partial_out, partial_lse, dtype)
    assert within_contract(got, want, scale, _subnormal_slack(dtype)) <= 1.0
    assert lse_error(got_lse, want_lse) <= 1.0


SINGLE_PEER = [(lse, garbage) for lse in (-INF, NAN, INF) for garbage in (NAN, INF, -INF, 3e38)]
SINGLE_PEER += [(lse, None) for lse in (1e4, -1e4, 3e38, -3e38, 0.5)]


@pytest.mark.parametrize(("lse", "garbage"), SINGLE_PEER, ids=[f"lse={l}-payload={g}" for l, g in SINGLE_PEER])
def test_a_single_peer(lse: float, garbage: float | None, spec_modules: dict[str, ModuleType]) -> None:
    module = spec_modules["pynccl_a2a"]
    generator = torch.Generator().manual_seed(7)
    partial_out, partial_lse = random_partials(1, 2, 2, 8, torch.float32, generator)
    partial_lse[0, 0, :] = lse
    empty = garbage is not None
    if garbage is not None:
        partial_out[0, 0, :] = garbage  # what an empty shard's payload may hold
    got, got_lse, _, _, _ = combine_partials(module, partial_out, partial_lse, torch.float32)
    if empty:
        assert torch.equal(got[0], torch.zeros_like(got[0])) and bool((got_lse[0] == -INF).all())
    else:
        assert torch.equal(got[0], partial_out[0, 0]) and bool((got_lse[0] == lse).all())
    assert torch.equal(got[1], partial_out[0, 1]) and torch.equal(got_lse[1], partial_lse[0, 1])


#: LSE kinds of a mixture: None keeps the random normal value; the +-1e4 ones get noise added.
LSE_KINDS = {"normal": None, "+1e4": 1e4, "-1e4": -1e4, "+3e38": 3e38, "-3e38": -3e38, "-inf": -INF, "nan": NAN}
LSE_KINDS |= {"+inf": INF}
EMPTY_KINDS = ("-inf", "nan", "+inf")
GARBAGE = (NAN, INF, -INF)


@st.composite
def mixtures(draw: Any) -> tuple[Any, ...]:
    """Per (peer, row, head): an LSE kind, and payloads normal, subnormal or large; garbage in empty shards."""
    dtype = draw(st.sampled_from(DTYPES))
    N, B, h, D = (
        draw(st.integers(1, 4)),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 3)),
        draw(st.sampled_from([4, 8])),
    )
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    info = torch.finfo(dtype)
    partial_out, _ = random_partials(N, B, h, D, torch.float64, generator)
    partial_lse = torch.randn(N, B, h, generator=generator, dtype=torch.float64) * 4
    for peer in range(N):
        for b in range(B):
            for head in range(h):
                kind = draw(st.sampled_from(sorted(LSE_KINDS)))
                if LSE_KINDS[kind] is not None:
                    noise = float(torch.randn(1, generator=generator)) if kind in ("+1e4", "-1e4") else 0.0
                    partial_lse[peer, b, head] = LSE_KINDS[kind] + noise
                if kind in EMPTY_KINDS:
                    partial_out[peer, b, head] = draw(st.sampled_from(GARBAGE))
                    continue
                magnitude = draw(st.sampled_from(["normal", "subnormal", "large"]))
                if magnitude == "subnormal":
                    partial_out[peer, b, head] *= info.tiny / 8
                elif magnitude == "large":  # the largest safe magnitude: N of them sum without overflow
                    partial_out[peer, b, head] = partial_out[peer, b, head].sign() * info.max / (2 * N)
    if draw(st.booleans()):
        partial_lse[:, 0, 0] = torch.tensor([NAN, -INF, INF, -INF][:N], dtype=torch.float64)
        partial_out[:, 0, 0] = NAN
    return dtype, partial_out.to(dtype), partial_lse.float(), draw(st.sampled_from(["e", "2"]))


def check_mixture(mixture: tuple[Any, ...], spec_modules: dict[str, ModuleType], spec_name: str) -> None:
    dtype, partial_out, partial_lse, base = mixture
    got, got_lse, want, want_lse, scale = combine_partials(
        spec_modules[spec_name], partial_out, partial_lse, dtype, base
    )
    assert within_contract(got, want, scale, _subnormal_slack(dtype)) <= 1.0
    assert lse_error(got_lse, want_lse) <= 1.0
    all_empty = want_lse == -INF
    assert bool((got[all_empty] == 0).all()) and bool((got_lse[all_empty] == -INF).all())


@settings(max_examples=MIX_EXAMPLES, **FAST)
@given(mixture=mixtures(), spec_name=st.sampled_from(SPEC_NAMES))
def test_mixed_edge_cases_match_the_reference(mixture: Any, spec_name: str, spec_modules: Any) -> None:
    check_mixture(mixture, spec_modules, spec_name)


@pytest.mark.slow
@settings(max_examples=MIX_EXAMPLES_SLOW, **SLOW)
@given(mixture=mixtures(), spec_name=st.sampled_from(SPEC_NAMES))
def test_mixed_edge_cases_long_run(mixture: Any, spec_name: str, spec_modules: Any) -> None:
    check_mixture(mixture, spec_modules, spec_name)


@pytest.mark.parametrize("N", [2, 3, 4], ids=["N2", "N3", "N4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_payloads_at_the_dtype_maximum(dtype: torch.dtype, N: int, spec_modules: dict[str, ModuleType]) -> None:
    # The accumulator holds the weighted mean, never the sum of N weighted partials: no float32 overflow.
    partial_out = torch.full((N, 1, 1, 4), torch.finfo(dtype).max, dtype=dtype)
    got, _, want, _, scale = combine_partials(spec_modules["vllm_a2a"], partial_out, torch.zeros(N, 1, 1), dtype)
    assert bool(torch.isfinite(got).all()) and combine_error(got, want, scale) <= 1.0
