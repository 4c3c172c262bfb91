"""Shared test support: interpreter set-up, marker handling, canary buffers, module loading.

Helpers here are plain functions (import them with `from conftest import ...`) or
fixtures; nothing is layout-specific, so every test module can use them.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

# Generated kernels are defined when their module is imported; on a machine without CUDA they
# can only run under the interpreter, which must be switched on before that import.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from layoutgen.dcp.layout import LSE_BYTES, LayoutBuffers, row_length, wire_dtype
from layoutgen.dcp.spec import DcpSpec, PayloadDtype
from layoutgen.spec import parse_spec

#: The byte every buffer is filled with before a kernel runs; bytes the layout does not own keep it.
CANARY = 0xA5
#: All-ones bytes are NaN in bf16, fp16 and fp32: garbage that must never reach a combine result.
NAN_BYTE = 0xFF

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
requires_interpreter = pytest.mark.skipif(
    not INTERPRETER, reason="CPU kernel tests run under the Triton interpreter: set TRITON_INTERPRET=1"
)
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

REPO_ROOT = Path(__file__).resolve().parent.parent

#: An NPU-like layout: float32 payload with batch innermost, LSE as element D of each float32 row.
NPU_LIKE_SPEC_FIELDS: dict[str, object] = {
    "name": "npu_like",
    "transport": "all_to_all_single",
    "payload": {"axes": ["peer", "head", "dim", "batch"], "dtype": "float32"},
    "stats": {"placement": "row_tail"},
}


# ---------------------------------------------------------------------------------------------
# Markers: `slow` runs only when selected (-m slow); `gpu` / `multigpu` skip without the hardware.
# ---------------------------------------------------------------------------------------------
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_expression = config.getoption("markexpr", "") or ""
    run_slow = "slow" in mark_expression
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "slow" in item.keywords and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow: select with -m slow"))
        if "gpu" in item.keywords and gpus < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "multigpu" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs two or more CUDA GPUs, found {gpus}"))


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def fresh_triton_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point Triton's on-disk cache at an empty per-test directory."""
    cache = tmp_path / "triton_cache"
    cache.mkdir()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    return cache


@pytest.fixture
def generator() -> torch.Generator:
    """A seeded CPU generator: every test draws reproducible random inputs."""
    return torch.Generator().manual_seed(20240611)


@pytest.fixture
def no_log_warnings() -> Iterator[None]:
    """The interpreter evaluates log(0) with numpy for all-empty rows; -inf is the contract, not a fault."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


# ---------------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------------
def generated_module(name: str) -> ModuleType:
    """The committed generated module of a bundled spec (imported once per process)."""
    import layoutgen

    return layoutgen.load(name)


def render_module(spec: DcpSpec, directory: Path, spec_file: str = "test_spec.yaml") -> ModuleType:
    """Render `spec` with codegen into `directory` and import it from there."""
    from layoutgen import codegen
    from layoutgen.loader import load_path

    path = directory / f"{spec.name}.py"
    codegen.write_if_changed(path, codegen.render(spec, spec_file))
    return load_path(path)


def make_spec(**fields: object) -> DcpSpec:
    """A validated spec from keyword fields (summary defaults to a fixed text)."""
    data = {"summary": "test spec", **fields}
    return parse_spec(data, source="<test>")


@pytest.fixture(scope="session")
def spec_modules(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModuleType]:
    """Every bundled spec's committed module, plus `npu_like` (float32, batch innermost) rendered to tmp."""
    from layoutgen.spec import bundled_specs

    loaded = {name: generated_module(name) for name in sorted(bundled_specs())}
    loaded["npu_like"] = render_module(make_spec(**NPU_LIKE_SPEC_FIELDS), tmp_path_factory.mktemp("npu_like"))
    return loaded


# ---------------------------------------------------------------------------------------------
# Buffers and inputs
# ---------------------------------------------------------------------------------------------
def fill_bytes(bufs: LayoutBuffers, byte: int = CANARY) -> LayoutBuffers:
    """Set every byte of every buffer to `byte` (returns `bufs`)."""
    for tensor in bufs.tensors.values():
        tensor.view(torch.uint8).fill_(byte)
    return bufs


def byte_views(bufs: LayoutBuffers) -> dict[str, torch.Tensor]:
    """Flat uint8 views of every buffer, by name."""
    return {name: tensor.reshape(-1).view(torch.uint8) for name, tensor in bufs.tensors.items()}


def assert_same_bytes(got: LayoutBuffers, want: LayoutBuffers, label: str = "") -> None:
    """Byte-identical buffers, with the first differing offset in the failure message."""
    assert set(got.tensors) == set(want.tensors), label
    for name, got_bytes in byte_views(got).items():
        want_bytes = byte_views(want)[name]
        if not torch.equal(got_bytes, want_bytes):
            differing = (got_bytes != want_bytes).nonzero().flatten()
            raise AssertionError(
                f"{label} buffer {name!r}: {differing.numel()} of {got_bytes.numel()} bytes differ, "
                f"first at byte {int(differing[0])} (got {int(got_bytes[differing[0]])}, "
                f"want {int(want_bytes[differing[0]])})"
            )


def expected_layout_bytes(
    spec: DcpSpec, out: torch.Tensor, lse: torch.Tensor, N: int, B_max: int, fill: int = CANARY
) -> dict[str, torch.Tensor]:
    """The buffers' bytes after packing `out [B, H, D]`, `lse [B, H]` into `fill`-filled buffers, built
    from the docs/design.md §3 text alone (no LayoutBuffers views): logical [peer, batch, head, ...] blocks,
    batch padded to B_max, permuted to the spec's axis order, made contiguous."""
    B, H, D = out.shape
    heads_per_peer = H // N
    wire = wire_dtype(spec, out.dtype)
    payload = out.reshape(B, N, heads_per_peer, D).permute(1, 0, 2, 3).to(wire)  # [peer, batch, head, dim]
    lse_logical = lse.reshape(B, N, heads_per_peer).permute(1, 0, 2).to(torch.float32)
    buffers: dict[str, torch.Tensor] = {}
    if spec.row_tail:
        row = row_length(spec, D, wire.itemsize)
        if spec.payload.dtype is PayloadDtype.FLOAT32:
            # One float32 element per position: D payload values, the LSE at element D, then padding.
            rows = torch.full((N, B_max, heads_per_peer, row), 0.0, dtype=torch.float32)
            rows.view(torch.uint8).fill_(fill)
            rows[:, :B, :, :D] = payload
            rows[:, :B, :, D] = lse_logical
            buffers["payload"] = _to_axes(rows, spec.payload.axes, ("peer", "batch", "head", "dim"))
        else:
            # dim is innermost: a row is D elements' bytes, the LSE's 4 bytes, padding bytes.
            row_bytes = torch.full((N, B_max, heads_per_peer, row * wire.itemsize), fill, dtype=torch.uint8)
            body = payload.contiguous().view(torch.uint8)
            tail = lse_logical.contiguous().unsqueeze(-1).view(torch.uint8)
            row_bytes[:, :B, :, : D * wire.itemsize + LSE_BYTES] = torch.cat([body, tail], dim=-1)
            buffers["payload"] = _to_axes(row_bytes, spec.payload.axes, ("peer", "batch", "head", "dim"))
    else:
        assert spec.stats.axes is not None and spec.stats.slots is not None and spec.stats.slot is not None
        data = torch.zeros((N, B_max, heads_per_peer, D), dtype=wire)
        data.view(torch.uint8).fill_(fill)
        data[:, :B] = payload
        buffers["payload"] = _to_axes(data, spec.payload.axes, ("peer", "batch", "head", "dim"))
        stats = torch.zeros((N, B_max, heads_per_peer, spec.stats.slots), dtype=torch.float32)
        stats.view(torch.uint8).fill_(fill)
        stats[:, :B, :, spec.stats.slot] = lse_logical
        buffers["stats"] = _to_axes(stats, spec.stats.axes, ("peer", "batch", "head", "slot"))
    return {name: tensor.reshape(-1).view(torch.uint8) for name, tensor in buffers.items()}


def _to_axes(tensor: torch.Tensor, axes: tuple[str, ...], logical: tuple[str, ...]) -> torch.Tensor:
    return tensor.permute([logical.index(axis) for axis in axes]).contiguous()


def owned_byte_count(spec: DcpSpec, N: int, B: int, H: int, D: int, dtype: torch.dtype) -> int:
    """How many bytes a pack of B rows assigns: every payload element and one LSE word per row."""
    return N * B * (H // N) * (D * wire_dtype(spec, dtype).itemsize + LSE_BYTES)


def assert_canary_outside(bufs: LayoutBuffers, expected_owned: int, byte: int = CANARY) -> None:
    """At most `expected_owned` bytes changed from the canary (the rest still hold it)."""
    changed = sum(int((flat != byte).sum()) for flat in byte_views(bufs).values())
    assert changed <= expected_owned, f"{changed} bytes lost the canary; the layout owns only {expected_owned}"


def random_inputs(
    B: int, H: int, D: int, dtype: torch.dtype, generator: torch.Generator, lse_scale: float = 4.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random `out [B, H, D]` (no zeros) and `lse [B, H]` float32."""
    out = torch.randn(B, H, D, generator=generator).to(dtype)
    lse = torch.randn(B, H, generator=generator) * lse_scale
    return out, lse


def strided_inputs(out: torch.Tensor, lse: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The same values as `out`, `lse` in tensors with non-trivial strides (last stride of `out` is 1);
    the memory around the views holds NaN, so a kernel that reads outside them is caught.

    kinds: contiguous | out_slice (a D-window of wider rows) | out_heads_outer (a permuted [H, B, D]) |
    out_every_other_row (batch step 2) | lse_transposed (a transposed [H, B]) | all (each at once).
    """
    B, H, D = out.shape
    new_out, new_lse = out, lse
    if kind == "out_slice":
        wide = torch.full((B, H, D + 5), float("nan"), dtype=out.dtype)
        new_out = wide[:, :, 3 : 3 + D]
    elif kind == "out_heads_outer":
        new_out = torch.full((H, B, D), float("nan"), dtype=out.dtype).permute(1, 0, 2)
    elif kind == "out_every_other_row":
        new_out = torch.full((2 * B, H, D), float("nan"), dtype=out.dtype)[::2]
    elif kind == "all":
        new_out = torch.full((H, 2 * B, D + 3), float("nan"), dtype=out.dtype).permute(1, 0, 2)[::2, :, 1 : 1 + D]
    elif kind not in ("contiguous", "lse_transposed"):
        raise ValueError(f"unknown stride kind {kind!r}")
    if kind in ("lse_transposed", "all"):
        new_lse = torch.full((H, B), float("nan"), dtype=lse.dtype).t()
    if new_out is not out:
        new_out.copy_(out)
    if new_lse is not lse:
        new_lse.copy_(lse)
    assert new_out.stride(-1) == 1 or D == 1
    return new_out, new_lse


STRIDE_KINDS = ("contiguous", "out_slice", "out_heads_outer", "out_every_other_row", "lse_transposed", "all")


@pytest.fixture
def clean_dispatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No cached plans or warnings, an empty packaged database, LAYOUTGEN_TUNING_DB = a fresh directory."""
    from layoutgen.runtime import configs, reset_caches

    monkeypatch.delenv("LAYOUTGEN_CONFIG", raising=False)
    db_dir = tmp_path / "db"
    db_dir.mkdir()
    monkeypatch.setenv("LAYOUTGEN_TUNING_DB", str(db_dir))
    packaged = tmp_path / "packaged"
    packaged.mkdir()
    monkeypatch.setattr(configs, "packaged_database_dir", lambda: packaged)
    reset_caches()
    yield db_dir
    reset_caches()


# ---------------------------------------------------------------------------------------------
# The DCP family in the shared tuner's terms
# ---------------------------------------------------------------------------------------------
def dcp_problem(spec: DcpSpec, kernel: str, N: int, heads_per_peer: int, D: int, dtype: str) -> Any:
    """A tuning problem of a DCP spec: key extents N, Hl (heads per peer), D."""
    from layoutgen.tuning.problem import Problem

    return Problem(spec, kernel, (("N", N), ("Hl", heads_per_peer), ("D", D)), dtype)


def dcp_key(spec_name: str, kernel: str, N: int, heads_per_peer: int, D: int, dtype: str, batch: int) -> Any:
    """The tuning-database key of a DCP specialisation."""
    from layoutgen.tuning_db import TuningKey

    return TuningKey(
        family="dcp",
        spec=spec_name,
        kernel=kernel,
        extents=(("N", N), ("Hl", heads_per_peer), ("D", D)),
        dtype=dtype,
        bucket_name="B",
        bucket=batch,
    )


def dcp_grid(N: int, H: int, D: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """TuneOptions.grid for one DCP shape."""
    return (("N", (N,)), ("H", (H,)), ("D", (D,)))


def pairwise(
    factors: dict[str, tuple[Any, ...]],
    seed: int = 21,
    candidates: int = 60,
    excluded: Callable[[str, Any, str, Any], bool] = lambda a, va, b, vb: False,
) -> list[dict[str, Any]]:
    """A small set of cases covering every pair of values of every two factors (greedy, seeded), but the pairs
    `excluded(factor_a, value_a, factor_b, value_b)` names (factors in `factors`' order), which no case holds."""
    names = list(factors)

    def impossible(a: str, va: int, b: str, vb: int) -> bool:
        return excluded(a, factors[a][va], b, factors[b][vb])

    uncovered = {
        (a, va, b, vb)
        for a, b in itertools.combinations(names, 2)
        for va in range(len(factors[a]))
        for vb in range(len(factors[b]))
        if not impossible(a, va, b, vb)
    }
    rng = random.Random(seed)
    cases = []
    while uncovered:
        a, va, b, vb = sorted(uncovered)[rng.randrange(len(uncovered))]
        best, best_gain = None, -1
        for _ in range(candidates):
            pick = {name: rng.randrange(len(factors[name])) for name in names}
            pick[a], pick[b] = va, vb
            if any(impossible(x, pick[x], y, pick[y]) for x, y in itertools.combinations(names, 2)):
                continue
            gain = sum((x, pick[x], y, pick[y]) in uncovered for x, y in itertools.combinations(names, 2))
            if gain > best_gain:
                best, best_gain = pick, gain
        assert best is not None
        uncovered -= {(x, best[x], y, best[y]) for x, y in itertools.combinations(names, 2)}
        cases.append({name: factors[name][best[name]] for name in names})
    return cases


def default_stop_signals() -> None:
    """A child's `preexec_fn`: SIGINT and SIGTERM at their defaults, as a terminal's foreground command has them,
    also where this run inherited them ignored (a shell's `cmd &` ignores SIGINT, and layoutgen keeps an
    inherited SIG_IGN on purpose)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def compile_offline_in_subprocess(specs: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """`python -m layoutgen.tuning.offline SPEC ...` (bundled names or module paths)."""
    # Compiled, not interpreted: the kernels must be JIT functions, so the interpreter stays off here.
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "layoutgen.tuning.offline", *specs]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)


@pytest.fixture
def fresh_dynamo_and_plans() -> None:
    """A fresh torch.compile state and no cached plans or configs (tests that trace and also call eagerly)."""
    from layoutgen.runtime import reset_caches

    torch._dynamo.reset()
    reset_caches()


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A gloo group of this process alone, for the exchange objects (destroyed after the test)."""
    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as directory:
        dist.init_process_group("gloo", init_method=f"file://{directory}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def _gloo_rank(rank: int, worker: Any, world: int, store: str, reports: Any, timeout_s: float) -> None:
    """One spawned rank: join the gloo group, run `worker(rank, problems)`, leave the group and report the
    problems (an exception the worker raised among them, after this rank's collectives)."""
    from datetime import timedelta

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))  # fmt: skip
    problems: list[str] = []
    try:
        worker(rank, problems)
    except Exception as error:  # reported to the parent
        problems.append(f"{type(error).__name__}: {error}")
    finally:
        dist.destroy_process_group()
    reports.put((rank, problems))


def expect_error(
    problems: list[str], label: str, action: Callable[[], Any], words: list[str], kind: type[Exception] = Exception
) -> None:
    """In a gloo worker: `action` must raise `kind` with every one of `words` in its message; anything else is
    appended to `problems`."""
    try:
        action()
    except kind as error:
        missing = [word for word in words if word not in str(error)]
        if missing:
            problems.append(f"{label}: {type(error).__name__}: {error} lacks {missing}")
    except Exception as error:
        problems.append(f"{label}: {type(error).__name__}: {error} (wanted {kind.__name__})")
    else:
        problems.append(f"{label}: no error")


def problems_of_gloo_ranks(worker: Any, world: int, timeout_s: float) -> dict[int, list[str]]:
    """Run `worker(rank, problems)` on `world` spawned processes joined in a gloo group (collectives time out
    after `timeout_s`); each appends what it found wrong to `problems`. Returns rank -> problems."""
    import torch.multiprocessing as mp

    reports = mp.get_context("spawn").Queue()
    with tempfile.TemporaryDirectory() as directory:
        mp.start_processes(_gloo_rank, args=(worker, world, os.path.join(directory, "store"), reports, timeout_s),
                           nprocs=world, start_method="spawn", join=True)  # fmt: skip
    return dict(reports.get(timeout=10) for _ in range(world))
