"""Runtime dispatch: tuned configs and their fallbacks, LAYOUTGEN_CONFIG, plan caching, the error matrix,
and the direct-launch cache (with a stand-in for Triton's JITFunction, so it runs without a GPU)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from conftest import assert_same_bytes, dcp_key, fill_bytes, generated_module, requires_interpreter

from layoutgen import tuning_db
from layoutgen.dcp import FAMILY as DCP_FAMILY
from layoutgen.dcp import reference
from layoutgen.dcp.config import CombineConfig, PackConfig, default_combine_config, default_pack_config
from layoutgen.dcp.layout import LayoutBuffers
from layoutgen.runtime import LayoutgenWarning, configs, launch, reset_caches
from layoutgen.tuning_db import CPU_INTERPRETER_DEVICE, TuningEntry

pytestmark = [requires_interpreter, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

N, H, D, B_MAX = 2, 6, 24, 5  # heads per peer 3 (odd), D not a power of two
TUNED_PACK = {"block_batch": 1, "block_head": 2, "block_dim": 8, "num_warps": 2, "num_stages": 1, "block_peer": 1}
TUNED_COMBINE = {"block_batch": 1, "block_head": 1, "block_dim": 16, "num_warps": 1, "num_stages": 1}


@pytest.fixture
def module() -> ModuleType:
    return generated_module("vllm_a2a")


@pytest.fixture(autouse=True)
def _every_test_starts_clean(clean_dispatch: Path) -> Path:
    """Every test starts with no cached plans or warnings, an empty packaged DB and its own LAYOUTGEN_TUNING_DB."""
    return clean_dispatch


def entry(
    module: ModuleType, kernel: str, bucket: int, config: dict[str, int], *, spec_hash: str | None = None
) -> TuningEntry:
    current = configs.expected_for(DCP_FAMILY.kernel(kernel), module.SPEC_HASH, module.SOURCE_HASHES[kernel])
    return TuningEntry(
        key=dcp_key(module.SPEC_NAME, kernel, N, H // N, D, "bfloat16", bucket),
        config=config,
        median_us=2.0,
        p20_us=1.9,
        p80_us=2.2,
        default_us=3.0,
        trials=10,
        spec_hash=spec_hash or module.SPEC_HASH,
        source_hash=module.SOURCE_HASHES[kernel],
        space_hash=current.space_hash,
        timing_hash=current.timing_hash,
        versions=dict(current.versions),
        measured_at="2026-11-29T07:00:00+00:00",
        rotating_sets=1,
    )


def write_db(db_dir: Path, entries: list[TuningEntry], device: str = CPU_INTERPRETER_DEVICE) -> Path:
    return tuning_db.record(db_dir, device, "0.0", entries, {"layoutgen": "test"})


def inputs(B: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    out = torch.randn(B, H, D, generator=generator).to(torch.bfloat16)
    lse = torch.randn(B, H, generator=generator) * 3
    return out, lse


def pack_matches_reference(module: ModuleType, B: int, seed: int = 0, **kwargs: Any) -> LayoutBuffers:
    out, lse = inputs(B, seed)
    ours = fill_bytes(module.alloc(N, B_MAX, H, D, torch.bfloat16))
    theirs = fill_bytes(LayoutBuffers.allocate(module.SPEC, N, B_MAX, H, D, torch.bfloat16))
    module.pack(out, lse, ours, **kwargs)
    reference.pack(out, lse, theirs)
    assert_same_bytes(ours, theirs, f"B={B}")
    return ours


def combine_matches_reference(module: ModuleType, bufs: LayoutBuffers, B: int) -> None:
    got, got_lse = module.combine(bufs, B, return_lse=True)
    want, want_lse = reference.combine(bufs, B, "e", True)
    torch.testing.assert_close(got.double(), want.to(torch.bfloat16).double(), rtol=0, atol=2e-2)
    torch.testing.assert_close(got_lse.double(), want_lse, rtol=1e-5, atol=1e-5)


def layoutgen_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, LayoutgenWarning)]


def pack_config(module: ModuleType, B: int) -> PackConfig:
    out, lse = inputs(B)
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16)
    return module._dispatch.pack_plan(out, lse, bufs).config


def defaults(module: ModuleType, B: int) -> tuple[PackConfig, CombineConfig]:
    return (
        default_pack_config(module.SPEC, N, H // N, D, B, 2),
        default_combine_config(module.SPEC, N, H // N, D, B, 2),
    )


# --- tuned configs and fallbacks -----------------------------------------------------------------------------------


def test_tuned_configs_are_used_per_bucket(module: ModuleType, clean_dispatch: Path) -> None:
    write_db(clean_dispatch, [entry(module, "pack", 2, TUNED_PACK), entry(module, "combine", 2, TUNED_COMBINE)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bufs = pack_matches_reference(module, 2)
        combine_matches_reference(module, bufs, 2)
        assert pack_config(module, 1) == PackConfig(**TUNED_PACK)  # smallest bucket >= 1
        assert pack_config(module, 5) == PackConfig(**TUNED_PACK)  # beyond the largest bucket: the largest
        assert module._dispatch.combine_plan(bufs, 2, "e", None, False, None).config == CombineConfig(**TUNED_COMBINE)
    assert layoutgen_warnings(caught) == []
    assert PackConfig(**TUNED_PACK) != defaults(module, 2)[0]


def test_tuning_db_env_wins_over_the_packaged_database(module: ModuleType, clean_dispatch: Path) -> None:
    write_db(configs.packaged_database_dir(), [entry(module, "pack", 4, {**TUNED_PACK, "num_warps": 4})])
    write_db(clean_dispatch, [entry(module, "pack", 4, TUNED_PACK)])
    assert pack_config(module, 3) == PackConfig(**TUNED_PACK)


def test_packaged_database_answers_what_the_env_database_lacks(module: ModuleType, clean_dispatch: Path) -> None:
    write_db(configs.packaged_database_dir(), [entry(module, "pack", 4, TUNED_PACK)])
    write_db(clean_dispatch, [entry(module, "combine", 4, TUNED_COMBINE)])
    assert pack_config(module, 3) == PackConfig(**TUNED_PACK)


def test_stale_entry_warns_once_and_falls_back(module: ModuleType, clean_dispatch: Path) -> None:
    write_db(clean_dispatch, [entry(module, "pack", 8, TUNED_PACK, spec_hash="0" * 64)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pack_matches_reference(module, 2)
        pack_matches_reference(module, 3)  # a second shape on the same stale entry: no second warning
        assert pack_config(module, 2) == defaults(module, 2)[0]
    messages = layoutgen_warnings(caught)
    assert len(messages) == 1, messages
    assert "ignoring tuning entries like 'dcp|vllm_a2a|pack|N=2|Hl=3|D=24|bfloat16|B=8'" in messages[0]
    assert "another spec" in messages[0] and "re-run `layoutgen tune`" in messages[0]


def test_another_torch_warns_once_for_the_whole_file(module: ModuleType, clean_dispatch: Path) -> None:
    """A database tuned under another torch is stale everywhere: one warning, not one per shape and kernel."""
    old_torch = {**tuning_db.entry_versions(), "torch": "1.0"}
    pack_entry = entry(module, "pack", 8, TUNED_PACK).model_copy(update={"versions": old_torch})
    combine_entry = entry(module, "combine", 8, TUNED_COMBINE).model_copy(update={"versions": old_torch})
    other_shape = pack_entry.model_copy(update={"key": dcp_key("vllm_a2a", "pack", 4, 3, 24, "bfloat16", 8)})
    write_db(clean_dispatch, [pack_entry, combine_entry, other_shape])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert pack_config(module, 2) == defaults(module, 2)[0]
        bufs = pack_matches_reference(module, 2)
        combine_matches_reference(module, bufs, 2)
        assert module._dispatch.combine_plan(bufs, 2, "e", None, False, None).config == defaults(module, 2)[1]
        wider = module.alloc(4, B_MAX, 12, D, torch.bfloat16)  # the other shape: N 4, 3 heads per peer
        module._dispatch.pack_plan(torch.randn(2, 12, D).to(torch.bfloat16), torch.randn(2, 12), wider)
    messages = layoutgen_warnings(caught)
    assert len(messages) == 1, messages
    assert "tuned with torch 1.0, running" in messages[0] and "re-run `layoutgen tune`" in messages[0]


def test_a_changed_kernel_source_warns_once_per_kernel(module: ModuleType, clean_dispatch: Path) -> None:
    stale = {"source_hash": "0" * 64}
    write_db(
        clean_dispatch,
        [
            entry(module, "pack", 8, TUNED_PACK).model_copy(update=stale),
            entry(module, "pack", 4, TUNED_PACK).model_copy(update=stale),
            entry(module, "combine", 8, TUNED_COMBINE).model_copy(update=stale),
        ],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bufs = pack_matches_reference(module, 2)
        pack_matches_reference(module, 5)  # the other bucket of the same kernel: no second warning
        combine_matches_reference(module, bufs, 2)
    messages = layoutgen_warnings(caught)
    assert len(messages) == 2, messages
    assert all("another kernel source" in message for message in messages)
    assert "|pack|" in messages[0] and "|combine|" in messages[1]


def test_missing_shape_warns_once_and_falls_back(module: ModuleType, clean_dispatch: Path) -> None:
    other_shape = entry(module, "pack", 8, TUNED_PACK).model_copy(
        update={"key": dcp_key("vllm_a2a", "pack", 4, 3, 24, "bfloat16", 8)}
    )
    write_db(clean_dispatch, [other_shape])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bufs = pack_matches_reference(module, 1)
        pack_matches_reference(module, 4)
        combine_matches_reference(module, bufs, 1)
    messages = layoutgen_warnings(caught)
    assert len(messages) == 2, messages  # one for pack's shape, one for combine's
    assert "no current tuning entry for dcp|vllm_a2a|pack|N=2|Hl=3|D=24|bfloat16 (any size)" in messages[0]
    assert "heuristic default" in messages[0]


def test_missing_device_warns_once_and_falls_back(
    module: ModuleType, clean_dispatch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(configs, "device_name", lambda device: "NVIDIA Imaginary GPU")
    write_db(clean_dispatch, [entry(module, "pack", 8, TUNED_PACK)])  # for cpu-interpreter: not this device
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bufs = pack_matches_reference(module, 2)
        pack_matches_reference(module, 3)
        combine_matches_reference(module, bufs, 2)
    messages = layoutgen_warnings(caught)
    assert len(messages) == 1, messages
    assert "no tuning database NVIDIA_Imaginary_GPU.json for device 'NVIDIA Imaginary GPU'" in messages[0]
    assert "LAYOUTGEN_TUNING_DB" in messages[0]


def test_interpreter_without_a_database_is_silent(module: ModuleType) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pack_matches_reference(module, 2)
    assert layoutgen_warnings(caught) == []


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"schema_version": 2, "device_name": "cpu-interp', "is not valid JSON"),
        (json.dumps({"schema_version": 99, "device_name": "x", "compute_capability": "0.0"}), "schema_version 99"),
        (json.dumps({"schema_version": 2, "device_name": "x", "compute_capability": "0.0", "entries": 3}), "entries"),
        (json.dumps({"schema_version": 1, "device_name": "x", "compute_capability": "0.0"}), "migrate_tuning_db_v2"),
    ],
    ids=["corrupt", "wrong-schema-version", "wrong-field-type", "schema-1"],
)
def test_unreadable_database_is_reported_once_and_ignored(
    module: ModuleType, clean_dispatch: Path, content: str, problem: str
) -> None:
    path = clean_dispatch / tuning_db.device_file_name(CPU_INTERPRETER_DEVICE)
    path.write_text(content)
    write_db(
        configs.packaged_database_dir(),
        [entry(module, "pack", 8, TUNED_PACK), entry(module, "combine", 8, TUNED_COMBINE)],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bufs = pack_matches_reference(module, 2)
        pack_matches_reference(module, 3)
        combine_matches_reference(module, bufs, 2)
        assert pack_config(module, 2) == PackConfig(**TUNED_PACK)  # the next directory still answers
    messages = layoutgen_warnings(caught)
    assert len(messages) == 1, messages
    assert messages[0].startswith("ignoring the tuning database: tuning database ")
    assert str(path) in messages[0] and problem in messages[0]
    assert path.read_text() == content  # reading never rewrites


def test_invalid_tuned_config_is_ignored_with_a_warning(module: ModuleType, clean_dispatch: Path) -> None:
    write_db(clean_dispatch, [entry(module, "pack", 8, {**TUNED_PACK, "block_dim": 3})])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pack_matches_reference(module, 2)
    messages = layoutgen_warnings(caught)
    assert len(messages) == 1 and "block_dim must be a power of two" in messages[0], messages


# --- LAYOUTGEN_CONFIG -----------------------------------------------------------------------------------------------


def test_forced_config_wins_over_the_database(
    module: ModuleType, clean_dispatch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_db(clean_dispatch, [entry(module, "pack", 8, TUNED_PACK), entry(module, "combine", 8, TUNED_COMBINE)])
    monkeypatch.setenv("LAYOUTGEN_CONFIG", json.dumps({"pack": {"block_head": 1, "num_warps": 8}, "combine": {}}))
    bufs = pack_matches_reference(module, 3)
    combine_matches_reference(module, bufs, 3)
    default_pack, default_combine = defaults(module, 3)
    assert pack_config(module, 3) == PackConfig(**{**default_pack.as_dict(), "block_head": 1, "num_warps": 8})
    assert module._dispatch.combine_plan(bufs, 3, "e", None, True, None).config == default_combine


def test_explicit_config_argument_beats_everything(module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYOUTGEN_CONFIG", json.dumps({"pack": {"num_warps": 8}}))
    explicit = PackConfig(**TUNED_PACK)
    pack_matches_reference(module, 2, config=explicit)
    out, lse = inputs(2)
    assert (
        module._dispatch.pack_plan(out, lse, module.alloc(N, B_MAX, H, D, torch.bfloat16), explicit).config == explicit
    )


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("{pack}", "LAYOUTGEN_CONFIG is not valid JSON"),
        ('{"pack": 3}', "LAYOUTGEN_CONFIG['pack'] must be an object of config fields"),
        ('{"pack": {"warps": 4}}', "LAYOUTGEN_CONFIG['pack'] must hold fields among"),
        ('{"pack": {"block_dim": 3}}', "LAYOUTGEN_CONFIG forces an invalid pack config: pack config block_dim"),
    ],
)
def test_malformed_forced_config_is_an_error(
    module: ModuleType, monkeypatch: pytest.MonkeyPatch, value: str, problem: str
) -> None:
    monkeypatch.setenv("LAYOUTGEN_CONFIG", value)
    out, lse = inputs(2)
    with pytest.raises(ValueError, match=re.escape(problem)):
        module.pack(out, lse, module.alloc(N, B_MAX, H, D, torch.bfloat16))


# --- plan cache -------------------------------------------------------------------------------------------------------


def test_config_is_resolved_once_per_shape(module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    resolve = configs.resolve_config

    def counting(*args: Any) -> Any:
        calls.append(args[2].name)
        return resolve(*args)

    monkeypatch.setattr(configs, "resolve_config", counting)
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16)
    for seed in range(3):
        out, lse = inputs(2, seed)
        module.pack(out, lse, bufs)
        module.combine(bufs, 2)
    assert calls == ["pack", "combine"]
    out, lse = inputs(3)
    module.pack(out, lse, bufs)  # a new shape: a new plan
    assert calls == ["pack", "combine", "pack"]


def test_new_strides_dtype_and_buffers_get_new_plans(module: ModuleType) -> None:
    out, lse = inputs(3)
    bufs = fill_bytes(module.alloc(N, B_MAX, H, D, torch.bfloat16))
    module.pack(out, lse, bufs)
    wide = torch.empty(3, H, D + 8, dtype=torch.bfloat16)[..., :D]  # same shape, other row stride
    wide.copy_(out)
    strided_lse = torch.empty(H, 3).t()
    strided_lse.copy_(lse)
    again = fill_bytes(module.alloc(N, B_MAX, H, D, torch.bfloat16))
    module.pack(wide, strided_lse, again)
    assert_same_bytes(again, bufs, "strided inputs")
    half = module.alloc(N, B_MAX, H, D, torch.float16)
    theirs = fill_bytes(LayoutBuffers.allocate(module.SPEC, N, B_MAX, H, D, torch.float16))
    module.pack(out.half(), lse, fill_bytes(half))
    reference.pack(out.half(), lse, theirs)
    assert_same_bytes(half, theirs, "float16")
    with pytest.raises(TypeError, match=re.escape("out must be torch.bfloat16")):
        module.pack(out.half(), lse, bufs)  # the cached bf16 plan does not serve a float16 call


def test_reset_caches_drops_plans(module: ModuleType) -> None:
    out, lse = inputs(2)
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16)
    module.pack(out, lse, bufs)
    assert bufs.__dict__["_layoutgen_plans"]
    reset_caches()
    assert "_layoutgen_plans" not in bufs.__dict__


# --- error matrix -----------------------------------------------------------------------------------------------------


def _bufs(module: ModuleType, **changes: Any) -> LayoutBuffers:
    shape = {"N": N, "B_max": B_MAX, "H": H, "D": D, "dtype": torch.bfloat16, **changes}
    return module.alloc(shape["N"], shape["B_max"], shape["H"], shape["D"], shape["dtype"])


PACK_ERRORS: list[tuple[str, Any, type[Exception], str]] = [
    (
        "out dtype",
        lambda m, o, l, b: (o.float(), l, b),
        TypeError,
        "out must be torch.bfloat16 (the buffers' dtype); got shape (3, 6, 24), strides (144, 24, 1), torch.float32",
    ),
    (
        "out rank",
        lambda m, o, l, b: (o[0], l, b),
        ValueError,
        "out must have shape [B, H=6, D=24] (B <= 5); got shape (6, 24)",
    ),
    (
        "out heads",
        lambda m, o, l, b: (o[:, :4], l, b),
        ValueError,
        "out must have shape [B, H=6, D=24] (B <= 5); got shape (3, 4, 24)",
    ),
    (
        "out head dim",
        lambda m, o, l, b: (o[..., :16], l, b),
        ValueError,
        "out must have shape [B, H=6, D=24] (B <= 5); got shape (3, 6, 16)",
    ),
    (
        "out last stride",
        lambda m, o, l, b: (o.transpose(1, 2).contiguous().transpose(1, 2), l, b),
        ValueError,
        "out must have stride 1 along D (any other strides); got shape (3, 6, 24), strides (144, 1, 6)",
    ),
    (
        "out not a tensor",
        lambda m, o, l, b: (o.tolist(), l, b),
        TypeError,
        "out must be a torch.Tensor [B, H, D], got list",
    ),
    (
        "lse dtype",
        lambda m, o, l, b: (o, l.double(), b),
        TypeError,
        "lse must be float32; got shape (3, 6), strides (6, 1), torch.float64",
    ),
    ("lse shape", lambda m, o, l, b: (o, l[:2], b), ValueError, "lse must have shape [B=3, H=6]; got shape (2, 6)"),
    (
        "lse rank",
        lambda m, o, l, b: (o, l[..., None], b),
        ValueError,
        "lse must have shape [B=3, H=6]; got shape (3, 6, 1)",
    ),
    (
        "lse not a tensor",
        lambda m, o, l, b: (o, 1.0, b),
        TypeError,
        "lse must be a torch.Tensor [B, H] of float32, got float",
    ),
    ("lse device", lambda m, o, l, b: (o, l.to("meta"), b), ValueError, "lse is on meta but the buffers are on cpu"),
    ("out device", lambda m, o, l, b: (o.to("meta"), l, b), ValueError, "out is on meta but the buffers are on cpu"),
    (
        "B > B_max",
        lambda m, o, l, b: (o, l, _bufs(m, B_max=2)),
        ValueError,
        "out has B=3 rows but the buffers hold at most B_max=2; allocate larger buffers",
    ),
    (
        "buffers of another shape",
        lambda m, o, l, b: (o, l, _bufs(m, H=8)),
        ValueError,
        "out must have shape [B, H=8, D=24]",
    ),
    (
        "buffers of another dtype",
        lambda m, o, l, b: (o, l, _bufs(m, dtype=torch.float16)),
        TypeError,
        "out must be torch.float16 (the buffers' dtype)",
    ),
    (
        "buffers of another spec",
        lambda m, o, l, b: (o, l, generated_module("pynccl_a2a").alloc(N, B_MAX, H, D, torch.bfloat16)),
        ValueError,
        "bufs were allocated for spec 'pynccl_a2a', not 'vllm_a2a'; allocate them with this module's alloc()",
    ),
    (
        "buffers not from alloc",
        lambda m, o, l, b: (o, l, b.tensors),
        TypeError,
        "bufs must be the buffers object returned by alloc(), got dict",
    ),
]


@pytest.mark.parametrize(("case", "make", "error", "message"), PACK_ERRORS, ids=[c[0] for c in PACK_ERRORS])
def test_pack_rejects(module: ModuleType, case: str, make: Any, error: type[Exception], message: str) -> None:
    out, lse = inputs(3)
    bufs = _bufs(module)
    module.pack(out, lse, bufs)  # a cached plan for the good call must not hide the bad one
    with pytest.raises(error, match=re.escape(message)):
        module.pack(*make(module, out, lse, bufs))


def test_pack_rejects_replaced_buffer_tensors(module: ModuleType) -> None:
    out, lse = inputs(3)
    bufs = _bufs(module)
    bufs.tensors["stats"] = bufs.tensors["stats"][:1]
    with pytest.raises(
        ValueError,
        match=re.escape(
            "bufs.tensors['stats'] must be a contiguous torch.float32 tensor of shape (2, 5, 3, 1) on cpu; got shape (1, 5, 3, 1)"
        ),
    ):
        module.pack(out, lse, bufs)


def test_pack_rejects_a_config_of_the_wrong_kind(module: ModuleType) -> None:
    out, lse = inputs(3)
    with pytest.raises(
        TypeError, match=re.escape("config must be a layoutgen.dcp.config.PackConfig or None, got CombineConfig")
    ):
        module.pack(out, lse, _bufs(module), config=CombineConfig(block_batch=1, block_head=1, block_dim=8))
    with pytest.raises(
        TypeError, match=re.escape("config must be a layoutgen.dcp.config.PackConfig or None, got dict")
    ):
        module.pack(out, lse, _bufs(module), config=dict(TUNED_PACK))


COMBINE_ERRORS: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("B > B_max", {"B": 6}, ValueError, "B must be an int in [0, B_max=5]; got 6"),
    ("negative B", {"B": -1}, ValueError, "B must be an int in [0, B_max=5]; got -1"),
    ("bool B", {"B": True}, ValueError, "B must be an int in [0, B_max=5]; got True"),
    ("float B", {"B": 2.0}, ValueError, "B must be an int in [0, B_max=5]; got 2.0"),
    ("lse base", {"lse_base": "10"}, ValueError, "lse_base must be 'e' or '2'; got '10'"),
    ("return_lse", {"return_lse": "yes"}, TypeError, "return_lse must be a bool; got str"),
    (
        "out shape",
        {"out": torch.empty(2, 2, 24, dtype=torch.bfloat16)},
        ValueError,
        "out must have shape [2, 3, 24], dtype torch.bfloat16, device cpu; got shape (2, 2, 24)",
    ),
    (
        "out dtype",
        {"out": torch.empty(2, 3, 24)},
        ValueError,
        "out must have shape [2, 3, 24], dtype torch.bfloat16, device cpu; got shape (2, 3, 24), strides (72, 24, 1), torch.float32",
    ),
    ("out not a tensor", {"out": [0.0]}, TypeError, "out must be a torch.Tensor or None, got list"),
    (
        "config kind",
        {"config": PackConfig(block_batch=1, block_head=1, block_dim=8)},
        TypeError,
        "config must be a layoutgen.dcp.config.CombineConfig or None, got PackConfig",
    ),
]


@pytest.mark.parametrize(("case", "changes", "error", "message"), COMBINE_ERRORS, ids=[c[0] for c in COMBINE_ERRORS])
def test_combine_rejects(
    module: ModuleType, case: str, changes: dict[str, Any], error: type[Exception], message: str
) -> None:
    bufs = _bufs(module)
    arguments = {"B": 2, "lse_base": "e", "out": None, "return_lse": False, "config": None, **changes}
    B = arguments.pop("B")
    with pytest.raises(error, match=re.escape(message)):
        module.combine(bufs, B, **arguments)


def test_combine_rejects_foreign_buffers(module: ModuleType) -> None:
    with pytest.raises(ValueError, match=re.escape("bufs were allocated for spec 'pynccl_a2a', not 'vllm_a2a'")):
        module.combine(generated_module("pynccl_a2a").alloc(N, B_MAX, H, D, torch.bfloat16), 2)
    with pytest.raises(TypeError, match=re.escape("bufs must be the buffers object returned by alloc(), got NoneType")):
        module.combine(None, 2)


@pytest.mark.parametrize(
    ("shape", "error", "message"),
    [
        ({"H": 5}, ValueError, "H (number of heads) must be divisible by N (peers): H=5, N=2"),
        ({"N": 0}, ValueError, "N must be >= 1, got 0"),
        ({"D": 2.5}, TypeError, "D must be an int, got float"),
        (
            {"dtype": torch.int8},
            TypeError,
            "dtype must be one of ['torch.bfloat16', 'torch.float16', 'torch.float32'], got torch.int8",
        ),
    ],
)
def test_alloc_rejects(module: ModuleType, shape: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        _bufs(module, **shape)


# --- direct launch cache (no GPU: a stand-in JITFunction and launcher) ----------------------------------------------


class CudaLauncher:  # named as Triton's NVIDIA launcher, whose C entry point the direct path calls
    global_scratch_size = 0
    profile_scratch_size = 0
    launch_cooperative_grid = False
    launch_pdl = False

    def __init__(self, log: list[tuple[str, Any]], variant: int) -> None:
        self.log, self.variant = log, variant

    def launch(self, *arguments: Any) -> None:
        grid, stream, function, rest = arguments[:3], arguments[3], arguments[4], arguments[9:]
        assert rest[:4] == ("metadata", None, None, None)  # packed metadata, no launch metadata or hooks
        self.log.append(("direct", (grid, stream, function, self.variant, rest[4:])))


class FakeCompiled:
    def __init__(self, log: list[tuple[str, Any]], variant: int) -> None:
        self.run = CudaLauncher(log, variant)
        self.function = f"function-{variant}"
        self.packed_metadata = "metadata"


class FakeKernel:
    """Just enough of a JITFunction: arg_names, used_global_vals, pre_run_hooks and `kernel[grid](...)`."""

    arg_names = ("a_ptr", "b_ptr", "n", "stride", "BLOCK", "FLAG")

    def __init__(self, launcher_class: type | None = None) -> None:
        self.used_global_vals: dict[Any, Any] = {}
        self.pre_run_hooks: list[Any] = []
        self.log: list[tuple[str, Any]] = []
        self.compiled = 0
        self.launcher_class = launcher_class

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def run(*args: Any, **options: Any) -> FakeCompiled:
            self.compiled += 1
            self.log.append(("jit", (grid, args, options)))
            compiled = FakeCompiled(self.log, self.compiled)
            if self.launcher_class is not None:
                compiled.run = self.launcher_class(self.log, self.compiled)
            return compiled

        return run


def _launch(a: torch.Tensor, b: torch.Tensor, n: int, kernel: Any) -> None:
    kernel[(3, 2)](a, b, n, a.stride(0), num_warps=4, BLOCK=16, FLAG=True)


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    device = [0]
    monkeypatch.setattr(launch, "_cuda_current", lambda: (lambda: device[0], lambda index: 1000 + index))
    return device


def test_direct_launch_replays_the_recorded_arguments(fake_cuda: list[int]) -> None:
    kernel = FakeKernel()
    a, b = torch.zeros(4, 8), torch.zeros(8)
    direct = launch.record_launches(kernel, _launch, (a, b, 7), (a, b), (0, 1))
    assert direct is not None and kernel.log == []  # recording launches nothing
    direct((a, b))
    assert kernel.log == [("jit", ((3, 2, 1), (a, b, 7, 8, 16, True), {"num_warps": 4}))]
    c, d = torch.zeros(4, 8), torch.zeros(8)
    direct((c, d))  # other tensors, same alignment: the compiled kernel directly, with these tensors
    kind, (grid, stream, function, variant, arguments) = kernel.log[-1]
    assert (kind, grid, stream, function, variant) == ("direct", (3, 2, 1), 1000, "function-1", 1)
    assert arguments[0] is c and arguments[1] is d and arguments[2:] == (7, 8, 16, True)
    assert kernel.compiled == 1


def test_direct_launch_respecialises_on_alignment_and_device(fake_cuda: list[int]) -> None:
    kernel = FakeKernel()
    storage = torch.zeros(64)
    a, b = storage[:32].view(4, 8), storage[32:40]
    direct = launch.record_launches(kernel, _launch, (a, b, 7), (a, b), (0, 1))
    assert direct is not None
    direct((a, b))
    misaligned = storage[1:9]  # 4 bytes past a 16-byte boundary: Triton compiles another specialisation
    direct((a, misaligned))
    assert [entry[0] for entry in kernel.log] == ["jit", "jit"] and kernel.compiled == 2
    direct((a, misaligned))
    assert kernel.log[-1][0] == "direct" and kernel.log[-1][1][3] == 2
    direct((a, b))
    assert kernel.log[-1][0] == "direct" and kernel.log[-1][1][3] == 1
    # The residues swap places: (4, 0) is another specialisation than (0, 4), not the same packed key.
    direct((storage[1:33].view(4, 8), b))
    assert kernel.log[-1][0] == "jit" and kernel.compiled == 3
    fake_cuda[0] = 1  # another current device: its own compiled kernel
    direct((a, b))
    assert kernel.log[-1][0] == "jit" and kernel.compiled == 4


def test_direct_launch_defers_to_triton_with_hooks_or_globals(fake_cuda: list[int]) -> None:
    from triton import knobs

    kernel = FakeKernel()
    a, b = torch.zeros(4, 8), torch.zeros(8)
    direct = launch.record_launches(kernel, _launch, (a, b, 7), (a, b), (0, 1))
    assert direct is not None
    direct((a, b))
    direct((a, b))
    assert [entry[0] for entry in kernel.log] == ["jit", "direct"]

    def profiler_hook(metadata: Any) -> None:
        return None

    for chain in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        chain.add(profiler_hook)  # a profiler must see every launch: Triton's launcher calls the hooks
        try:
            direct((a, b))
        finally:
            chain.remove(profiler_hook)
    direct((a, b))
    assert [entry[0] for entry in kernel.log] == ["jit", "direct", "jit", "jit", "direct"]
    other = FakeKernel()
    other.used_global_vals = {("SCALE", 1): (2.0, {})}
    replay = launch.record_launches(other, _launch, (a, b, 7), (a, b), (0, 1))
    assert replay is not None
    replay((a, b))
    replay((a, b))
    assert [entry[0] for entry in other.log] == ["jit", "jit"]
    hooked = FakeKernel()
    hooked.pre_run_hooks = [profiler_hook]
    replay = launch.record_launches(hooked, _launch, (a, b, 7), (a, b), (0, 1))
    assert replay is not None
    replay((a, b))
    replay((a, b))
    assert [entry[0] for entry in hooked.log] == ["jit", "jit"]


def test_launch_with_a_tensor_that_is_not_a_call_tensor_is_not_replayed() -> None:
    kernel = FakeKernel()
    a, b = torch.zeros(4, 8), torch.zeros(8)
    assert launch.record_launches(kernel, _launch, (a, b.clone(), 7), (a, b), (0, 1)) is None


@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "pynccl_a2a_aligned", "vllm_a2a", "flashinfer_mnnvl"])
def test_replayed_launch_arguments_reproduce_the_kernels_results(spec_name: str, fake_cuda: list[int]) -> None:
    # The direct path passes every argument positionally in the kernel's signature order, constexprs
    # included; replaying that order through the (interpreted) kernel must write the reference bytes.
    module = generated_module(spec_name)
    out, lse = inputs(3, seed=11)
    bufs = fill_bytes(module.alloc(N, B_MAX, H, D, torch.bfloat16))
    want = fill_bytes(LayoutBuffers.allocate(module.SPEC, N, B_MAX, H, D, torch.bfloat16))
    reference.pack(out, lse, want)
    plan = module._dispatch.pack_plan(out, lse, bufs)
    arguments = (out, lse, bufs, plan.batch, plan.config, plan.index_64)
    replay = launch.record_launches(
        module._pack_kernel, module._launch_pack, arguments, (out, lse, *bufs.tensors.values()), (0, 1)
    )
    assert replay is not None
    replay((out, lse, *bufs.tensors.values()))
    assert_same_bytes(bufs, want, spec_name)

    merged, merged_lse = torch.empty(3, H // N, D, dtype=torch.bfloat16), torch.empty(3, H // N)
    combine_plan = module._dispatch.combine_plan(bufs, 3, "2", merged, True, None)
    arguments = (bufs, 3, merged, merged_lse, True, combine_plan.config, combine_plan.index_64)
    tensors = (*bufs.tensors.values(), merged, merged_lse)
    replay = launch.record_launches(
        module._combine_kernel, module._launch_combine, arguments, tensors, (len(bufs.tensors), len(bufs.tensors) + 1)
    )
    assert replay is not None
    replay(tensors)
    expected, expected_lse = module.combine(bufs, 3, lse_base="2", return_lse=True)
    assert torch.equal(merged, expected) and torch.equal(merged_lse, expected_lse)


def test_other_backends_launch_through_their_launcher_object(fake_cuda: list[int]) -> None:
    class OtherLauncher:  # e.g. HIP's: its C entry point takes other arguments; its __call__ is the protocol
        def __init__(self, log: list[tuple[str, Any]], variant: int) -> None:
            self.log = log

        def __call__(self, *arguments: Any) -> None:
            self.log.append(("launcher", arguments))

    kernel = FakeKernel(OtherLauncher)
    a, b = torch.zeros(4, 8), torch.zeros(8)
    direct = launch.record_launches(kernel, _launch, (a, b, 7), (a, b), (0, 1))
    assert direct is not None
    direct((a, b))
    direct((a, b))
    kind, arguments = kernel.log[-1]
    assert kind == "launcher" and kernel.compiled == 1
    assert arguments[:9] == (3, 2, 1, 1000, "function-1", "metadata", None, None, None)
    assert arguments[9] is a and arguments[10] is b and arguments[11:] == (7, 8, 16, True)
