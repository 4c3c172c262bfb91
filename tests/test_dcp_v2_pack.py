"""DCP contract v2 pack (the brief's DESIGN.md §8.3): empty rows fused into pack, [R, T, H, D] rows, (max, sum) stats.

Every case packs random inputs (no zeros) into canary-filled buffers and checks, byte for byte:

* the generated kernel against `layoutgen.dcp.reference.pack` (every byte; the LSE words of an lse spec
  packed from (max, sum) within one float32 ulp, the contract's allowance for `max + log(sum)`);
* the reference against the layout built here from the design text alone (no `LayoutBuffers` views);
* the rows of empty requests: payload bytes all zero (+0.0), LSE / max words 0xFF800000 (-inf), sum words 0,
  whatever garbage (NaN, +inf) the inputs hold there; every byte the layout does not own keeps its canary.

The shape space (spec x dtype x N x stats input x mask x rows x heads x D x strides) is covered pairwise,
as in tests/test_pack.py; the specs are the DCP bundled ones (three of them (max, sum)) and five written
here to reach the corners: (max, sum) in a row tail (bf16 rows; float32 batch-innermost rows), swapped
(max, sum) slots outside the innermost axis, batch-innermost bf16 payload with batch-innermost stats, and
peer innermost with batch or head outside it, and head innermost with peer outside it (runs of pairs).
"""

from __future__ import annotations

import itertools
from types import ModuleType
from typing import Any

import pytest
import torch
from conftest import CANARY, NPU_LIKE_SPEC_FIELDS, make_spec, pairwise, render_module, requires_interpreter

from layoutgen.dcp import reference
from layoutgen.dcp.config import PackConfig
from layoutgen.dcp.layout import LSE_BYTES, LayoutBuffers, row_length, stats_words, wire_dtype
from layoutgen.dcp.spec import DcpSpec, PayloadDtype
from layoutgen.spec import bundled_specs

pytestmark = requires_interpreter

INF, NAN = float("inf"), float("nan")
NEG_INF_BITS = -8388608  # 0xFF800000 as an int32

#: Specs beyond the bundled ones (fields as YAML would give them).
V2_SPEC_FIELDS: dict[str, dict[str, Any]] = {
    "npu_like": NPU_LIKE_SPEC_FIELDS,
    "tail_max_sum": {
        "name": "tail_max_sum",
        "transport": "all_to_all_single",
        "payload": {"axes": ["peer", "batch", "head", "dim"], "dtype": "input"},
        "stats": {"placement": "row_tail", "form": "max_sum"},
        "align_bytes": 16,
    },
    "npu_max_sum": {
        "name": "npu_max_sum",
        "transport": "all_to_all_single",
        "payload": {"axes": ["peer", "head", "dim", "batch"], "dtype": "float32"},
        "stats": {"placement": "row_tail", "form": "max_sum"},
    },
    "slots_swapped": {
        "name": "slots_swapped",
        "transport": "external",
        "payload": {"axes": ["head", "batch", "peer", "dim"], "dtype": "input"},
        "stats": {
            "placement": "separate",
            "form": "max_sum",
            "axes": ["peer", "slot", "batch", "head"],
            "slots": 3,
            "max_slot": 2,
            "sum_slot": 0,
        },
    },
    # peer innermost with batch, then head, right outside it: the pack tiles runs of (batch, peer) and of
    # (head, peer) pairs (`pack_pairs_axis`), stats along batch in the second.
    "batch_peer_pairs": {
        "name": "batch_peer_pairs",
        "transport": "external",
        "payload": {"axes": ["head", "dim", "batch", "peer"], "dtype": "input"},
        "stats": {
            "placement": "separate",
            "form": "max_sum",
            "axes": ["slot", "head", "batch", "peer"],
            "slots": 2,
            "max_slot": 0,
            "sum_slot": 1,
        },
    },
    "head_peer_pairs": {
        "name": "head_peer_pairs",
        "transport": "external",
        "payload": {"axes": ["batch", "dim", "head", "peer"], "dtype": "float32"},
        "stats": {"placement": "separate", "axes": ["head", "slot", "peer", "batch"], "slots": 2, "slot": 1},
    },
    # head innermost with peer right outside it: runs of (peer, head) pairs, the global heads.
    "peer_head_pairs": {
        "name": "peer_head_pairs",
        "transport": "external",
        "payload": {"axes": ["batch", "dim", "peer", "head"], "dtype": "input"},
        "stats": {"placement": "separate", "axes": ["batch", "peer", "head", "slot"], "slots": 2, "slot": 0},
    },
    "batch_inner_bf16": {
        "name": "batch_inner_bf16",
        "transport": "all_to_all_single",
        "payload": {"axes": ["peer", "head", "dim", "batch"], "dtype": "input"},
        "stats": {"placement": "separate", "axes": ["peer", "head", "slot", "batch"], "slots": 2, "slot": 1},
    },
    # Stats with peer at stride 1 (one slot, or slot outside peer) under a payload with batch innermost: the
    # combine loads a row's N entries as one batch x head x peer tile and picks each peer's weight from it
    # (`stats_peer_tile`), in both stats forms.
    "stats_peer_inner": {
        "name": "stats_peer_inner",
        "transport": "external",
        "payload": {"axes": ["peer", "dim", "head", "batch"], "dtype": "input"},
        "stats": {
            "placement": "separate",
            "form": "max_sum",
            "axes": ["head", "batch", "slot", "peer"],
            "slots": 4,
            "max_slot": 1,
            "sum_slot": 3,
        },
    },
    "stats_peer_inner_lse": {
        "name": "stats_peer_inner_lse",
        "transport": "external",
        "payload": {"axes": ["head", "dim", "peer", "batch"], "dtype": "input"},
        "stats": {"placement": "separate", "axes": ["head", "slot", "batch", "peer"], "slots": 1, "slot": 0},
    },
}
#: (fp8 specs are tests/test_dcp_fp8_pack.py's: their payload bytes are codes, not the inputs.)
DCP_BUNDLED = sorted(name for name, spec in bundled_specs().items() if spec.family == "dcp" and not spec.fp8)
SPEC_NAMES = (*DCP_BUNDLED, *sorted(V2_SPEC_FIELDS))


def load_v2_modules(directory: Any, spec_modules: dict[str, ModuleType]) -> dict[str, ModuleType]:
    """The DCP bundled modules, and the specs above rendered into `directory`."""
    loaded = {name: spec_modules[name] for name in DCP_BUNDLED}
    for name, fields in V2_SPEC_FIELDS.items():
        loaded[name] = spec_modules[name] if name in spec_modules else render_module(make_spec(**fields), directory)
    return loaded


@pytest.fixture(scope="module")
def v2_modules(tmp_path_factory: pytest.TempPathFactory, spec_modules: dict[str, ModuleType]) -> dict[str, ModuleType]:
    return load_v2_modules(tmp_path_factory.mktemp("dcp_v2"), spec_modules)


# ---------------------------------------------------------------------------------------------
# The layout from the design text alone, and the statistics a pack stores
# ---------------------------------------------------------------------------------------------
def stored_stats(spec: DcpSpec, stats: dict[str, torch.Tensor], masked: torch.Tensor) -> dict[str, torch.Tensor]:
    """The float32 words a pack stores per row and head, [B, H] each, restated from the brief's DESIGN.md §8.3: an lse spec
    stores the LSE (from (max, sum): max + log(sum), -inf where sum <= 0 or NaN), a (max, sum) spec the pair
    (from an LSE: (lse, 1)); rows of empty requests get -inf (and a sum of 0)."""
    if spec.max_sum:
        if "lse" in stats:
            words = {"max": stats["lse"], "sum": torch.ones_like(stats["lse"])}
        else:
            words = {"max": stats["max"], "sum": stats["sum"]}
        fills = {"max": -INF, "sum": 0.0}
    else:
        if "lse" in stats:
            words = {"lse": stats["lse"]}
        else:
            wide = stats["max"].double() + stats["sum"].double().log()
            words = {"lse": torch.where(stats["sum"] > 0, wide, -INF).float()}
        fills = {"lse": -INF}
    return {name: torch.where(masked[:, None], fills[name], value.float()) for name, value in words.items()}


def expected_bytes(
    spec: DcpSpec, out: torch.Tensor, words: dict[str, torch.Tensor], N: int, B_max: int, masked: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Every buffer's bytes after a pack into canary-filled buffers, from the design text: logical
    [peer, batch, head, ...] blocks, rows >= B left alone, permuted to the spec's axis order."""
    B, H, D = out.shape
    h = H // N
    wire = wire_dtype(spec, out.dtype)
    values = torch.where(masked[:, None, None], torch.zeros((), dtype=out.dtype), out)
    payload = values.reshape(B, N, h, D).permute(1, 0, 2, 3).to(wire)  # [peer, batch, head, dim]
    logical = {name: w.reshape(B, N, h).permute(1, 0, 2) for name, w in words.items()}  # [peer, batch, head]
    order = stats_words(spec)
    buffers: dict[str, torch.Tensor] = {}
    if spec.row_tail:
        row = row_length(spec, D, wire.itemsize)
        if spec.payload.dtype is PayloadDtype.FLOAT32:
            rows = torch.zeros((N, B_max, h, row), dtype=torch.float32)
            rows.view(torch.uint8).fill_(CANARY)
            rows[:, :B, :, :D] = payload
            for k, name in enumerate(order):  # element D: the LSE or the max; D + 1: the sum
                rows[:, :B, :, D + k] = logical[name]
            buffers["payload"] = to_axes(rows, spec.payload.axes, ("peer", "batch", "head", "dim"))
        else:
            row_bytes = torch.full((N, B_max, h, row * wire.itemsize), CANARY, dtype=torch.uint8)
            body = payload.contiguous().view(torch.uint8)
            tail = [logical[name].contiguous().unsqueeze(-1).view(torch.uint8) for name in order]
            row_bytes[:, :B, :, : D * wire.itemsize + LSE_BYTES * len(order)] = torch.cat([body, *tail], dim=-1)
            buffers["payload"] = to_axes(row_bytes, spec.payload.axes, ("peer", "batch", "head", "dim"))
    else:
        slots = (spec.stats.max_slot, spec.stats.sum_slot) if spec.max_sum else (spec.stats.slot,)
        data = torch.zeros((N, B_max, h, D), dtype=wire)
        data.view(torch.uint8).fill_(CANARY)
        data[:, :B] = payload
        buffers["payload"] = to_axes(data, spec.payload.axes, ("peer", "batch", "head", "dim"))
        assert spec.stats.axes is not None and spec.stats.slots is not None
        stats = torch.zeros((N, B_max, h, spec.stats.slots), dtype=torch.float32)
        stats.view(torch.uint8).fill_(CANARY)
        for slot, name in zip(slots, order, strict=True):
            stats[:, :B, :, slot] = logical[name]
        buffers["stats"] = to_axes(stats, spec.stats.axes, ("peer", "batch", "head", "slot"))
    return {name: tensor.reshape(-1).view(torch.uint8) for name, tensor in buffers.items()}


def to_axes(tensor: torch.Tensor, axes: tuple[str, ...], logical: tuple[str, ...]) -> torch.Tensor:
    return tensor.permute([logical.index(axis) for axis in axes]).contiguous()


def fill(bufs: LayoutBuffers, byte: int = CANARY) -> LayoutBuffers:
    for tensor in bufs.tensors.values():
        tensor.view(torch.uint8).fill_(byte)
    return bufs


def flat_bytes(bufs: LayoutBuffers) -> dict[str, torch.Tensor]:
    return {name: tensor.reshape(-1).view(torch.uint8) for name, tensor in bufs.tensors.items()}


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
def random_max_sum(shape: tuple[int, ...], generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Running maxima ~ 4 N(0, 1) and sums of exponentials in [1, 9), as attention leaves them."""
    return torch.randn(shape, generator=generator) * 4, 1 + 8 * torch.rand(shape, generator=generator)


def strided_copy(tensor: torch.Tensor, role: str, kind: str) -> torch.Tensor:
    """`tensor` (role "out" [.., H, D], "stat" [.., H] or "mask" [R]) in memory with other strides and NaN
    around it (kind "strided"), or a plain copy ("contiguous")."""
    if kind == "contiguous":
        return tensor.clone()
    if role == "mask":
        wide = torch.zeros(2 * tensor.shape[0], dtype=tensor.dtype)[::2]
    elif role == "out":
        # a D-window of wider rows, every other leading row (so [R, T, H, D] is not flattenable to rows)
        shape = list(tensor.shape)
        storage = torch.full([2 * shape[0], *shape[1:-1], shape[-1] + 3], NAN, dtype=tensor.dtype)
        wide = storage[::2, ..., 1 : 1 + shape[-1]]
    else:
        # heads outermost in memory
        storage = torch.full([tensor.shape[-1], *tensor.shape[:-1]], NAN, dtype=tensor.dtype)
        wide = storage.permute(*range(1, tensor.dim()), 0)
    wide.copy_(tensor)
    return wide


def inputs_for(case: dict[str, Any], H: int, D: int, dtype: torch.dtype, generator: torch.Generator) -> dict[str, Any]:
    """out, its stats ("lse" or "max"/"sum") and the empty mask of one case; garbage (NaN payload, +inf LSE,
    NaN max, a zero sum) in the rows of empty requests, which the pack must not copy."""
    R, T = case["rows"]
    lead = (R,) if T == 0 else (R, T)
    out = torch.randn(*lead, H, D, generator=generator).to(dtype)
    if case["input"] == "lse":
        stats = {"lse": torch.randn(*lead, H, generator=generator) * 4}
    else:
        maximum, total = random_max_sum((*lead, H), generator)
        total.view(-1)[0] = 0.0  # -inf once turned into an LSE
        stats = {"max": maximum, "sum": total}
    mask = {"none": None, "some": torch.arange(R) % 2 == 1, "all": torch.ones(R, dtype=torch.bool)}[case["mask"]]
    if case["mask"] == "some" and not 0 < int(mask.sum()) < R:
        raise ValueError(f"case {case}: 'some' must empty some requests and leave others")  # was: R = 1, none
    if mask is not None:
        out[mask] = NAN
        for name, garbage in (("lse", INF), ("max", NAN), ("sum", 0.0)):
            if name in stats:
                stats[name][mask] = garbage
    strides = case["strides"]
    out = strided_copy(out, "out", strides)
    stats = {name: strided_copy(value, "stat", strides) for name, value in stats.items()}
    if mask is not None:
        mask = strided_copy(mask, "mask", strides)
    return {"out": out, "stats": stats, "empty": mask}


def run_pack(module: ModuleType, bufs: LayoutBuffers, inputs: dict[str, Any], config: Any = None) -> None:
    stats = inputs["stats"]
    if "lse" in stats:
        module.pack(inputs["out"], stats["lse"], bufs, empty=inputs["empty"], config=config)
    else:
        module.pack(
            inputs["out"], bufs=bufs, max_sum=(stats["max"], stats["sum"]), empty=inputs["empty"], config=config
        )


def reference_pack(bufs: LayoutBuffers, inputs: dict[str, Any]) -> None:
    stats = inputs["stats"]
    if "lse" in stats:
        reference.pack(inputs["out"], stats["lse"], bufs, empty=inputs["empty"])
    else:
        reference.pack(inputs["out"], None, bufs, empty=inputs["empty"], max_sum=(stats["max"], stats["sum"]))


def assert_lse_within_one_ulp(got: torch.Tensor, want: torch.Tensor, label: str) -> None:
    """float32 words equal, or adjacent representable values (the same sign: their bit patterns differ by 1)."""
    got_bits, want_bits = got.view(torch.int32).long(), want.view(torch.int32).long()
    same = got_bits == want_bits
    near = torch.isfinite(want) & ((got_bits - want_bits).abs() <= 1) & ((got < 0) == (want < 0))
    assert bool((same | near).all()), f"{label}: an LSE word is more than one float32 ulp off"


def check_case(module: ModuleType, case: dict[str, Any], generator: torch.Generator, config: Any = None) -> None:
    spec = module.SPEC
    N, h, dtype = case["N"], case["h"], case["dtype"]
    D = case["D"]
    if spec.row_tail and D * wire_dtype(spec, dtype).itemsize % 4:
        D += 1
    H = N * h
    R, T = case["rows"]
    B = R * max(T, 1)
    B_max = B + case["spare"]
    inputs = inputs_for(case, H, D, dtype, generator)
    label = f"{spec.name} {case}"
    ours = fill(module.alloc(N, B_max, H, D, dtype))
    theirs = fill(LayoutBuffers.allocate(spec, N, B_max, H, D, dtype))
    run_pack(module, ours, inputs, config)
    reference_pack(theirs, inputs)
    converted = not spec.max_sum and "max" in inputs["stats"]
    if converted:  # max + log(sum): within one float32 ulp, then the words are set equal for the byte check
        assert_lse_within_one_ulp(ours.lse_view(B), theirs.lse_view(B), label)
        ours.lse_view(B).copy_(theirs.lse_view(B))
    for name, got in flat_bytes(ours).items():
        want = flat_bytes(theirs)[name]
        differing = (got != want).nonzero().flatten()
        assert differing.numel() == 0, f"{label}: {name} differs from the reference at byte {int(differing[0])}"

    # The reference against the design text.
    tokens = max(T, 1)
    flat_out = inputs["out"].reshape(B, H, D)
    flat_stats = {name: value.reshape(B, H) for name, value in inputs["stats"].items()}
    empty = inputs["empty"]
    masked = torch.zeros(B, dtype=torch.bool) if empty is None else empty.repeat_interleave(tokens)
    words = stored_stats(spec, flat_stats, masked)
    for name, want in expected_bytes(spec, flat_out, words, N, B_max, masked).items():
        assert torch.equal(flat_bytes(theirs)[name], want), f"{label}: the reference's {name} is not the design's"

    # Rows of empty requests, and the canary outside the owned bytes.
    if bool(masked.any()):
        payload = ours.payload_view(B)[:, masked]
        assert bool((payload.contiguous().view(torch.uint8) == 0).all()), f"{label}: an empty row's payload is not +0.0"
        for name, view in ours.stats_views(B).items():
            bits = view[:, masked].contiguous().view(torch.int32)
            assert bool((bits == (0 if name == "sum" else NEG_INF_BITS)).all()), f"{label}: empty row {name} word"
    owned = N * B * h * (D * wire_dtype(spec, dtype).itemsize + LSE_BYTES * spec.stats.words)
    changed = sum(int((b != CANARY).sum()) for b in flat_bytes(ours).values())
    assert changed <= owned, f"{label}: {changed} bytes lost the canary, the layout owns {owned}"


# ---------------------------------------------------------------------------------------------
# Pairwise cases
# ---------------------------------------------------------------------------------------------
FACTORS: dict[str, tuple[Any, ...]] = {
    "spec": SPEC_NAMES,
    "dtype": (torch.bfloat16, torch.float16, torch.float32),
    "N": (1, 2, 3, 4),
    "input": ("lse", "max_sum"),
    "mask": ("none", "some", "all"),
    # (R, T): T = 0 is out [B, H, D] with B = R; otherwise out [R, T, H, D].
    "rows": ((1, 0), (3, 0), (1, 1), (3, 2), (2, 3)),
    "h": (1, 3),
    "D": (8, 13, 24),  # 13 only where the layout allows an odd D (else 14)
    "strides": ("contiguous", "strided"),
    "spare": (0, 2),  # B_max - B
}


def _impossible(a: str, value_a: Any, b: str, value_b: Any) -> bool:
    """One request cannot have some of its requests empty and others not."""
    return (a, b) == ("mask", "rows") and value_a == "some" and value_b[0] == 1


CASES = pairwise(FACTORS, excluded=_impossible)


def case_id(case: dict[str, Any]) -> str:
    R, T = case["rows"]
    dtype = str(case["dtype"]).removeprefix("torch.")
    return (
        f"{case['spec']}-{dtype}-N{case['N']}-{case['input']}-mask_{case['mask']}-R{R}T{T}-h{case['h']}-D{case['D']}-"
        f"{case['strides']}-spare{case['spare']}"
    )


def test_the_pairwise_cover_is_complete() -> None:
    for a, b in itertools.combinations(FACTORS, 2):
        possible = {(va, vb) for va, vb in itertools.product(FACTORS[a], FACTORS[b]) if not _impossible(a, va, b, vb)}
        assert {(c[a], c[b]) for c in CASES} == possible, (a, b)
    assert len(CASES) <= 90


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_v2_pack_is_byte_exact(case: dict[str, Any], v2_modules: dict[str, ModuleType], generator: Any) -> None:
    check_case(v2_modules[case["spec"]], case, generator)


# Blocks that do not divide the extents, several peers, rows and heads per tile: the masks stay per row.
V2_CONFIGS = (
    PackConfig(block_batch=2, block_head=2, block_dim=16, block_peer=2),
    PackConfig(block_batch=4, block_head=1, block_dim=8, block_peer=4, num_warps=2),
)


@pytest.mark.parametrize("reads", ["every_row", "live_rows"])
@pytest.mark.parametrize("config", V2_CONFIGS, ids=["tile2x2x16x2", "tile4x1x8x4"])
@pytest.mark.parametrize("spec_name", SPEC_NAMES)
def test_masked_pack_with_explicit_tiles(
    spec_name: str,
    config: PackConfig,
    reads: str,
    v2_modules: dict[str, ModuleType],
    generator: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Both ways of writing empty rows: every row read and zeros stored over the empty ones (calls below the
    # launcher's threshold), and the empty rows not read at all (calls from it up; forced here by a threshold
    # of 0 bytes).  NaN behind the empty rows catches a form that copies them.
    module = v2_modules[spec_name]
    if reads == "live_rows":
        monkeypatch.setattr(module, "_SKIP_EMPTY_READS_BYTES", 0)
    case = {
        "dtype": torch.bfloat16,
        "N": 3,
        "input": "max_sum",
        "mask": "some",
        "rows": (5, 0),
        "h": 3,
        "D": 24,
        "strides": "contiguous",
        "spare": 1,
    }
    check_case(module, case, generator, config)


@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "npu_like"])
def test_calls_from_the_threshold_up_do_not_read_empty_rows(
    spec_name: str, v2_modules: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    module = v2_modules[spec_name]
    N, B, H, D = 2, 4, 4, 16
    row_bytes = H * D * 2
    monkeypatch.setattr(module, "_SKIP_EMPTY_READS_BYTES", 3 * row_bytes)
    seen: list[tuple[bool, bool]] = []

    class Recorder:
        def __getitem__(self, grid: Any) -> Any:
            return lambda *args, **constexprs: seen.append((constexprs["HAS_EMPTY"], constexprs["SKIP_EMPTY_READS"]))

    out = torch.randn(B, H, D).to(torch.bfloat16)
    lse, empty = torch.randn(B, H), torch.tensor([False, True, False, True])
    bufs = module.alloc(N, B, H, D, torch.bfloat16)
    for batch, mask in ((2, empty[:2]), (3, empty[:3]), (4, empty), (4, None)):
        config = PackConfig(block_batch=2, block_head=2, block_dim=16)
        module._launch_pack(out[:batch], lse[:batch], bufs, batch, config, False, kernel=Recorder(), empty=mask)
    assert seen == [(True, False), (True, True), (True, True), (False, False)]


@pytest.mark.parametrize("spec_name", ["vllm_a2a", "trtllm_helix_native_v2", "npu_like", "batch_inner_bf16"])
def test_whole_and_partial_batch_tiles(spec_name: str, v2_modules: dict[str, ModuleType], generator: Any) -> None:
    # Batch-innermost layouts store whole tiles of rows without the run-time bound (16-byte stores) and the
    # last partial tile with it: 9 rows in tiles of 4 are two whole tiles and one of a single row.
    config = PackConfig(block_batch=4, block_head=1, block_dim=8, block_peer=1)
    for mask in ("none", "some"):
        case = {
            "dtype": torch.float16,
            "N": 2,
            "input": "lse",
            "mask": mask,
            "rows": (9, 0),
            "h": 2,
            "D": 12,
            "strides": "contiguous",
            "spare": 3,
        }
        check_case(v2_modules[spec_name], case, generator, config)


def test_an_empty_mask_of_all_false_gives_the_unmasked_bytes(v2_modules: dict[str, ModuleType], generator: Any) -> None:
    module = v2_modules["pynccl_a2a"]
    N, R, T, H, D = 2, 3, 2, 4, 16
    out = torch.randn(R, T, H, D, generator=generator).to(torch.bfloat16)
    lse = torch.randn(R, T, H, generator=generator)
    plain, masked = (fill(module.alloc(N, R * T, H, D, torch.bfloat16)) for _ in range(2))
    module.pack(out, lse, plain)
    module.pack(out, lse, masked, empty=torch.zeros(R, dtype=torch.bool))
    assert all(torch.equal(a, b) for a, b in zip(flat_bytes(plain).values(), flat_bytes(masked).values(), strict=True))
    # ... and out [R, T, H, D] is out [R * T, H, D]: row r * T + t.
    flat = fill(module.alloc(N, R * T, H, D, torch.bfloat16))
    module.pack(out.reshape(R * T, H, D), lse.reshape(R * T, H), flat)
    assert all(torch.equal(a, b) for a, b in zip(flat_bytes(plain).values(), flat_bytes(flat).values(), strict=True))


def test_lse_from_max_sum_is_within_one_ulp_at_the_edges(v2_modules: dict[str, ModuleType]) -> None:
    """max + log(sum) where float32 arithmetic would cancel (max = -log(sum)), at large |max|, for tiny and
    huge sums, sum <= 0 or NaN (-inf), and non-finite maxima (+inf stays +inf, NaN stays NaN)."""
    module = v2_modules["vllm_a2a"]
    total = torch.tensor([2.0, 7.389056, 1e-30, 3e37, 0.0, -1.0, NAN, 1.5, 1.5, 1.0, 5.0, 1.0])
    maximum = torch.tensor([-0.6931472, -2.0, 5.0, -80.0, 1.0, 1.0, 1.0, 1e4, -3e4, INF, -INF, NAN])
    H = maximum.numel()
    out = torch.randn(1, H, 8).to(torch.bfloat16)
    bufs = fill(module.alloc(1, 1, H, 8, torch.bfloat16))
    module.pack(out, bufs=bufs, max_sum=(maximum[None], total[None]))
    got = bufs.lse_view(1)[0, 0]
    want = reference.lse_from_max_sum(maximum, total)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    finite = ~torch.isnan(want)
    assert_lse_within_one_ulp(got[finite], want[finite], "edges")
    assert got[4] == got[5] == got[6] == -INF and got[9] == INF


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"empty": torch.ones(3, dtype=torch.bool)}, r"empty must be a torch.bool tensor \[R=2\]"),
        ({"empty": torch.ones(2, dtype=torch.uint8)}, "torch.bool"),
        ({"lse": None}, "exactly one of lse"),
        ({"max_sum": (torch.zeros(2, 4), torch.ones(2, 4))}, "exactly one of lse"),
        ({"lse": None, "max_sum": (torch.zeros(2, 4),)}, r"\(max, sum\) pair"),
        (
            {"lse": None, "max_sum": (torch.zeros(2, 4), torch.ones(2, 3))},
            r"max_sum\[1\] \(sum\) must have shape \[B=2, H=4\]",
        ),
        ({"lse": None, "max_sum": (torch.zeros(2, 4, dtype=torch.float64), torch.ones(2, 4))}, "float32"),
        ({"out": torch.zeros(2, 1, 4, 8, dtype=torch.bfloat16)}, r"lse must have shape \[R=2, T=1, H=4\]"),
        ({"out": torch.zeros(2, 3, 3, 4, 8, dtype=torch.bfloat16)}, r"\[R, T, H=4, D=8\]"),
    ],
)
def test_v2_arguments_are_checked(change: dict[str, Any], match: str, v2_modules: dict[str, ModuleType]) -> None:
    module = v2_modules["vllm_a2a"]
    args: dict[str, Any] = {"out": torch.zeros(2, 4, 8, dtype=torch.bfloat16), "lse": torch.zeros(2, 4)}
    args.update(change)
    bufs = module.alloc(2, 4, 4, 8, torch.bfloat16)
    with pytest.raises((TypeError, ValueError), match=match):
        module.pack(args.pop("out"), args.pop("lse"), bufs, **args)


def test_a_stacked_max_sum_is_refused_after_a_pair_was_planned(v2_modules: dict[str, ModuleType]) -> None:
    # Was: refused on a fresh plan, then accepted once the (max, sum) pair's plan was cached (the fast path
    # unpacked the [2, B, H] tensor into the pair's key).
    module = v2_modules["vllm_a2a"]
    bufs = module.alloc(2, 4, 4, 8, torch.bfloat16)
    out, maximum, total = torch.randn(2, 4, 8).to(torch.bfloat16), torch.randn(2, 4), torch.rand(2, 4) + 0.5
    module.pack(out, bufs=bufs, max_sum=(maximum, total))
    for _ in range(2):
        with pytest.raises(TypeError, match=r"max_sum must be a \(max, sum\) pair .* got Tensor"):
            module.pack(out, bufs=bufs, max_sum=torch.stack([maximum, total]))


def test_rows_beyond_b_max_are_refused(v2_modules: dict[str, ModuleType]) -> None:
    module = v2_modules["vllm_a2a"]
    bufs = module.alloc(2, 5, 4, 8, torch.bfloat16)
    with pytest.raises(ValueError, match=r"6 rows \(3 x 2\).*B_max=5"):
        module.pack(torch.zeros(3, 2, 4, 8, dtype=torch.bfloat16), torch.zeros(3, 2, 4), bufs)


def test_the_masked_pack_reads_the_mask_inside_the_kernel(v2_modules: dict[str, ModuleType], generator: Any) -> None:
    """One plan serves every mask value (the mask is a kernel argument, never read on the host): changing
    the flags in place between calls changes the bytes, as a CUDA graph replay would see it."""
    module = v2_modules["flashinfer_mnnvl"]
    N, R, H, D = 2, 4, 4, 8
    out = torch.randn(R, H, D, generator=generator).to(torch.bfloat16)
    lse = torch.randn(R, H, generator=generator)
    empty = torch.zeros(R, dtype=torch.bool)
    bufs = fill(module.alloc(N, R, H, D, torch.bfloat16))
    plan = module._dispatch.pack_plan(out, lse, bufs, None, empty)
    for flags in ([False, True, False, True], [True, False, False, False]):
        empty.copy_(torch.tensor(flags))
        module.pack(out, lse, bufs, empty=empty)
        assert module._dispatch.pack_plan(out, lse, bufs, None, empty) is plan
        want = fill(LayoutBuffers.allocate(module.SPEC, N, R, H, D, torch.bfloat16))
        reference.pack(out, lse, want, empty=empty)
        assert all(torch.equal(a, b) for a, b in zip(flat_bytes(bufs).values(), flat_bytes(want).values(), strict=True))


@pytest.mark.parametrize(
    ("spec_name", "mutation"),
    [
        # the empty row's payload copied instead of zeroed
        ("vllm_a2a", ("tl.store(destination, tl.zeros_like(values), mask=mask & row_empty)", "pass")),
        # the LSE of an empty row left as it came
        ("pynccl_a2a", ('lse_values = tl.where(stats_row_empty, float("-inf"), lse_values)', "pass")),
        # the sum word written over the max word
        (
            "trtllm_helix_nccl",
            (
                "tl.store(max_pointer + 1, sum_values, mask=lse_mask)",
                "tl.store(max_pointer, sum_values, mask=lse_mask)",
            ),
        ),
        # the mask read for the wrong request of an [R, T] row
        (
            "flashinfer_mnnvl",
            ("empty_ptr + (batch_4d // TOKENS) * empty_stride", "empty_ptr + (batch_4d % TOKENS) * empty_stride"),
        ),
    ],
)
def test_the_checks_catch_a_broken_v2_pack(
    spec_name: str, mutation: tuple[str, str], tmp_path: Any, generator: Any
) -> None:
    from layoutgen.loader import generated_dir, load_path

    source = (generated_dir() / f"{spec_name}.py").read_text(encoding="utf-8")
    before, after = mutation
    assert source.count(before) >= 1, "the pack template changed: update this mutation"
    (tmp_path / f"{spec_name}.py").write_text(source.replace(before, after), encoding="utf-8")
    module = load_path(tmp_path / f"{spec_name}.py")
    case = {
        "dtype": torch.bfloat16,
        "N": 2,
        "input": "max_sum" if module.SPEC.max_sum else "lse",
        "mask": "some",
        "rows": (3, 2),
        "h": 2,
        "D": 8,
        "strides": "contiguous",
        "spare": 0,
    }
    with pytest.raises(AssertionError):
        check_case(module, case, generator)


@pytest.mark.parametrize(
    ("axes", "form"),
    [(["batch", "dim", "head", "peer"], "lse"), (["batch", "dim", "peer", "head"], "max_sum")],
    ids=["head-peer-pairs", "peer-head-pairs"],
)
def test_packs_of_pairs_with_the_stats_in_the_row_tail(axes: list[str], form: str, tmp_path: Any) -> None:
    """Runs of (head, peer) and (peer, head) pairs whose stats live in the payload rows' tail: the tail's offset
    takes the payload's strides of the pair's two axes, which the pairs' own offset does not (both failed to
    build, a stride undefined, until the kernel defined every payload stride).  Verified as `build` does."""
    from layoutgen.dcp.verify import verify_module

    stats: dict[str, Any] = {"placement": "row_tail", **({"form": "max_sum"} if form == "max_sum" else {})}
    spec = make_spec(
        name="row_tail_pairs", transport="external", payload={"axes": axes, "dtype": "float32"}, stats=stats
    )
    report = verify_module(render_module(spec, tmp_path))
    assert report.ok, report.failures
