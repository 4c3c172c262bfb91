"""Eleventh hardening pass: a mutation audit of the references and the verification built on them
(`dcp/reference.py`, `ulysses/reference.py`, `verification.py`, `dcp/verify.py`, `ulysses/verify.py`,
`dcp/tolerances.py`).  Each test fails under a small mutation that every earlier test let through.

The verification tests run `verify_module` on stand-in modules whose kernels are the torch reference itself
(so they run in milliseconds), with one planted fault each:

* dcp verify: no `-inf` (empty) shard in the random data (a combine that turns an empty partial into NaN
  passed); the pass threshold `ratio > 1` raised; the combine tolerance's scale inflated; base 2 never
  combined; the merged LSE never compared; the plain pack's byte comparison dropped; `same_bytes` with `any`
  over the buffers instead of `all`; buffers filled with 0 instead of the canary (a pack that writes bytes
  it does not own passed); the masked pack's failure not counted by the pack check; every row_tail shape
  skipped; the masked (max, sum) pack checked with sums all 1; the combine check always passing.
* ulysses verify (no test called it): the scatter and gather comparisons never firing, a check always
  passing, the round trip through identity attention dropped, and shapes with H_kv == H only.
* verification.py: a raising family's report named by the file's stem and family "?" instead of the spec's;
  a child's exit status 0 reported as "signal 0"; the crash's stderr tail taken from the head; the stderr
  of a clean child swallowed; `on_device` heard once per child; a child dying before any module respawned
  per module; the child not switching the Triton interpreter on when there is no GPU.
* ulysses reference: extra tensor names, wrong dtypes and wrong `out` tensors accepted; an exchange of fewer
  buffers than N, or of buffers of another shape, accepted.
* dcp reference, against an independent float64 oracle: each emptiness rule of a (max, sum) entry (NaN or
  +inf max; NaN, 0, negative or +inf sum) dropped, the empty entries' sums kept, the stats taken in float32,
  the output's `scale` dropped or applied to the LSE; the float32-share cut-off computed in the other base or
  by the float64 weight; `merge_shards_max_sum` taking the wrong head block; `masked_inputs` filling the sum
  with 1 or not zeroing the payload; `pack` taking both `lse` and `max_sum`.
* dcp tolerances: each rtol and atol loosened, the atol not scaled by the largest partial, |got| added to the
  allowance, the shape check dropped, and "any entry matches" for "every entry matches".

Two defects it found are fixed, each with a test here that fails on the code before: a NaN matching a NaN made
the tolerance ratio NaN (which hid any violation beside it), and `build` on a GPU skipped the masked pack.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import NPU_LIKE_SPEC_FIELDS, generated_module, make_spec

from layoutgen import verification
from layoutgen.dcp import reference
from layoutgen.dcp import verify as dcp_verify
from layoutgen.dcp.layout import LayoutBuffers
from layoutgen.dcp.tolerances import combine_error, lse_error
from layoutgen.family import Check, VerifyReport
from layoutgen.ulysses import reference as ulysses_reference
from layoutgen.ulysses import verify as ulysses_verify
from layoutgen.ulysses.layout import Shape, UlyssesBuffers, tensor_shape

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

INF = float("inf")


# --- dcp verify on a stand-in module whose kernels are the reference ---------------------------------------


PackFault = Callable[[LayoutBuffers, torch.Tensor | None], None]
CombineFault = Callable[[torch.Tensor, torch.Tensor, LayoutBuffers, int, str], tuple[torch.Tensor, torch.Tensor]]


def dcp_stand_in(spec: Any, pack_fault: PackFault | None = None, combine_fault: CombineFault | None = None) -> Any:
    """A module of `spec` whose pack and combine are the reference (combine rounded to the wire's dtype), with a
    planted fault: `pack_fault(bufs, empty)` after the pack, `combine_fault(got, got_lse, bufs, B, base)`."""

    def alloc(N: int, B_max: int, H: int, D: int, dtype: torch.dtype, device: Any = None) -> LayoutBuffers:
        return LayoutBuffers.allocate(spec, N, B_max, H, D, dtype, device)

    def pack(out: torch.Tensor, lse: Any = None, bufs: Any = None, *, empty: Any = None, max_sum: Any = None) -> None:
        reference.pack(out, lse, bufs, empty=empty, max_sum=max_sum)
        if pack_fault is not None:
            pack_fault(bufs, empty)

    def combine(bufs: LayoutBuffers, B: int, *, lse_base: str = "e", return_lse: bool = False) -> Any:
        merged, merged_lse = reference.combine(bufs, B, lse_base, return_lse=True)
        assert merged_lse is not None
        got, got_lse = merged.to(bufs.dtype), merged_lse.to(torch.float32)
        if combine_fault is not None:
            got, got_lse = combine_fault(got, got_lse, bufs, B, lse_base)
        return got, got_lse

    return types.SimpleNamespace(SPEC=spec, alloc=alloc, pack=pack, combine=combine)


def with_pack(spec: Any, pack: Callable[..., None]) -> Any:
    """The stand-in module of `spec` with `pack` for its pack."""
    module = dcp_stand_in(spec)
    module.pack = pack
    return module


def pack_ignoring_the_mask(
    out: torch.Tensor, lse: Any = None, bufs: Any = None, *, empty: Any = None, max_sum: Any = None
) -> None:
    reference.pack(out, lse, bufs, max_sum=max_sum)


def check_of(report: VerifyReport, kernel: str) -> Check:
    return next(check for check in report.checks if check.kernel == kernel)


@pytest.mark.parametrize("name", ["pynccl_a2a", "vllm_a2a", "trtllm_helix_native_v2"])
def test_dcp_verify_passes_the_reference_itself(name: str) -> None:
    report = dcp_verify.verify_module(dcp_stand_in(generated_module(name).SPEC))
    assert report.ok, report.failures
    assert "in 5 shapes" in check_of(report, "pack").detail


def test_dcp_verify_feeds_an_empty_shard_to_combine() -> None:
    """A combine that turns an empty (-inf) partial into NaN fails (mutation: the -inf shard dropped); the
    combine check says so (mutation: the combine check always passing)."""

    def nan_on_empty(got: torch.Tensor, got_lse: torch.Tensor, bufs: LayoutBuffers, B: int, base: str) -> Any:
        empty_row = (bufs.lse_view(B) == -INF).any(dim=0)
        return got.masked_fill(empty_row[..., None], float("nan")), got_lse

    report = dcp_verify.verify_module(dcp_stand_in(generated_module("vllm_a2a").SPEC, combine_fault=nan_on_empty))
    assert not report.ok
    assert not check_of(report, "combine").passed and check_of(report, "pack").passed
    assert any(f.startswith("combine (base e) outside tolerance") for f in report.failures), report.failures


def test_dcp_verify_fails_a_combine_two_to_three_tolerances_off() -> None:
    """A float32 combine off by 1e-4 (about 2.5 times atol * scale) fails (mutations: the pass threshold raised
    to 4; the tolerance's scale inflated 1000-fold)."""

    def offset(got: torch.Tensor, got_lse: torch.Tensor, bufs: LayoutBuffers, B: int, base: str) -> Any:
        return (got + 1e-4 if got.dtype == torch.float32 else got), got_lse

    report = dcp_verify.verify_module(dcp_stand_in(generated_module("vllm_a2a").SPEC, combine_fault=offset))
    assert not check_of(report, "combine").passed
    assert report.failures and all("float32" in f for f in report.failures), report.failures


def test_dcp_verify_combines_in_base_2_too() -> None:
    """A combine that always merges in base e fails in base 2 only (mutation: only base e checked)."""

    def base_e(got: torch.Tensor, got_lse: torch.Tensor, bufs: LayoutBuffers, B: int, base: str) -> Any:
        merged, merged_lse = reference.combine(bufs, B, "e", return_lse=True)
        assert merged_lse is not None
        return merged.to(got.dtype), merged_lse.to(torch.float32)

    report = dcp_verify.verify_module(dcp_stand_in(generated_module("vllm_a2a").SPEC, combine_fault=base_e))
    assert not report.ok
    assert all("(base 2)" in f for f in report.failures), report.failures


def test_dcp_verify_compares_the_merged_lse() -> None:
    """An LSE 1e-3 off with a correct output fails (mutation: only the output compared)."""

    def lse_off(got: torch.Tensor, got_lse: torch.Tensor, bufs: LayoutBuffers, B: int, base: str) -> Any:
        return got, got_lse + 1e-3

    report = dcp_verify.verify_module(dcp_stand_in(generated_module("pynccl_a2a").SPEC, combine_fault=lse_off))
    assert not check_of(report, "combine").passed


def test_dcp_verify_compares_the_plain_pack_and_every_buffer() -> None:
    """A plain pack (no mask) whose stats buffer is one bit off fails the pack check, its payload being exact
    (mutations: the plain pack's comparison dropped; `same_bytes` true when any one buffer matches)."""

    def flip_stats(bufs: LayoutBuffers, empty: torch.Tensor | None) -> None:
        if empty is None:
            bufs.tensors["stats"].view(torch.uint8).view(-1)[0] ^= 1

    report = dcp_verify.verify_module(dcp_stand_in(generated_module("vllm_a2a").SPEC, pack_fault=flip_stats))
    assert not check_of(report, "pack").passed
    assert any(f.startswith("pack differs from the reference") for f in report.failures), report.failures


def test_dcp_verify_fills_the_buffers_with_the_canary() -> None:
    """A pack that zeroes whole buffers (bytes of rows B..B_max it does not own) fails (mutation: the buffers
    filled with 0, which the zeroing reproduces)."""

    def zeroing_pack(out: torch.Tensor, lse: Any = None, bufs: Any = None, **keywords: Any) -> None:
        for tensor in bufs.tensors.values():
            tensor.zero_()
        reference.pack(out, lse, bufs, **keywords)

    report = dcp_verify.verify_module(with_pack(generated_module("vllm_a2a").SPEC, zeroing_pack))
    assert not check_of(report, "pack").passed
    assert any(f.startswith("pack differs from the reference") for f in report.failures), report.failures


def test_dcp_verify_fails_a_pack_that_ignores_the_empty_mask() -> None:
    """The masked pack's failure fails the pack check (mutation: only "pack differs" failures counted)."""
    report = dcp_verify.verify_module(with_pack(generated_module("vllm_a2a").SPEC, pack_ignoring_the_mask))
    assert not check_of(report, "pack").passed
    assert check_of(report, "combine").passed
    assert report.failures and all(f.startswith("pack with an empty mask") for f in report.failures)


def test_dcp_verify_checks_the_max_sum_pack_with_sums_other_than_one() -> None:
    """A (max, sum) spec's pack that stores the max with sum 1 (drops the sum) fails (mutation: the random sums
    all 1, which that pack reproduces)."""

    def sumless_pack(
        out: torch.Tensor, lse: Any = None, bufs: Any = None, *, empty: Any = None, max_sum: Any = None
    ) -> None:
        if max_sum is not None:
            lse, max_sum = max_sum[0], None
        reference.pack(out, lse, bufs, empty=empty, max_sum=max_sum)

    report = dcp_verify.verify_module(with_pack(generated_module("trtllm_helix_native_v2").SPEC, sumless_pack))
    assert not check_of(report, "pack").passed
    assert any(f.startswith("pack with an empty mask") for f in report.failures), report.failures


def test_dcp_verify_checks_row_tail_specs_whose_rows_are_whole_words() -> None:
    """pynccl_a2a (LSE in the row tail; every verification shape's row is whole 4-byte words) is checked in all
    5 shapes: a broken combine fails (mutation: row_tail specs skipped in every shape)."""

    def broken(got: torch.Tensor, got_lse: torch.Tensor, bufs: LayoutBuffers, B: int, base: str) -> Any:
        return -got, got_lse

    report = dcp_verify.verify_module(dcp_stand_in(generated_module("pynccl_a2a").SPEC, combine_fault=broken))
    assert not check_of(report, "combine").passed
    assert "in 5 shapes" in check_of(report, "pack").detail


# --- ulysses verify on a stand-in module whose kernels are the reference ----------------------------------


def ulysses_stand_in(spec: Any, fault: str | None = None, honour_h_kv: bool = True) -> Any:
    """A module of `spec` whose four kernels are the reference; `fault` names the kernel whose result (the send
    buffer, or the first tensor returned) has one element negated; `honour_h_kv=False` sizes buffers by H."""

    def allocator(direction: str) -> Callable[..., UlyssesBuffers]:
        def alloc(N: int, S_local: int, H: int, D: int, dtype: torch.dtype, device: Any = None, **kw: int) -> Any:
            H_kv = kw.get("H_kv", H) if honour_h_kv else H
            shape = Shape(N=N, S_local=S_local, H=H, H_kv=H_kv, D=D, dtype=dtype, B=kw.get("B", 1))
            return UlyssesBuffers.allocate(spec, direction, shape, device)

        return alloc

    def scatterer(kernel: str, direction: str) -> Callable[..., None]:
        def scatter(*arguments: Any) -> None:
            *tensors, send = arguments
            names = [t.name for t in spec.direction(direction).tensors]
            getattr(ulysses_reference, kernel)(dict(zip(names, tensors, strict=True)), send)
            if fault == kernel:
                first = next(iter(send.tensors.values())).view(-1)
                first[0] = -first[0]

        return scatter

    def gatherer(kernel: str) -> Callable[..., Any]:
        def gather(recv: UlyssesBuffers) -> Any:
            results = list(getattr(ulysses_reference, kernel)(recv).values())
            if fault == kernel:
                results[0] = results[0].clone()
                results[0].view(-1)[0] = -results[0].view(-1)[0]
            return tuple(results) if len(results) > 1 else results[0]

        return gather

    return types.SimpleNamespace(
        SPEC=spec,
        alloc=allocator("to_attention"),
        alloc_out=allocator("from_attention"),
        scatter=scatterer("scatter", "to_attention"),
        scatter_out=scatterer("scatter_out", "from_attention"),
        gather=gatherer("gather"),
        gather_out=gatherer("gather_out"),
    )


@pytest.mark.parametrize("name", ["yunchang_ulysses", "ulysses_qkv_gqa"])
def test_ulysses_verify_passes_the_reference_itself(name: str) -> None:
    report = ulysses_verify.verify_module(ulysses_stand_in(generated_module(name).SPEC))
    assert report.ok, report.failures
    assert [check.kernel for check in report.checks] == list(ulysses_verify.KERNELS)
    assert check_of(report, "gather_out").detail.endswith("round trip exact")


@pytest.mark.parametrize("kernel", ["scatter", "gather", "scatter_out", "gather_out"])
def test_ulysses_verify_fails_the_one_kernel_that_differs(kernel: str) -> None:
    """One negated element in one kernel's result fails that kernel's check (mutations: the scatter or gather
    comparison never firing; every check passing)."""
    report = ulysses_verify.verify_module(ulysses_stand_in(generated_module("ulysses_qkv_gqa").SPEC, kernel))
    assert not report.ok
    assert not check_of(report, kernel).passed
    assert any(f.startswith(f"{kernel} differs from the reference") for f in report.failures), report.failures


def test_ulysses_verify_reports_a_broken_round_trip() -> None:
    """A scatter that corrupts a shard breaks the round trip back to it, and the report says so (mutation: the
    round-trip comparison dropped)."""
    report = ulysses_verify.verify_module(ulysses_stand_in(generated_module("yunchang_ulysses").SPEC, "scatter"))
    assert any("does not return q's shard as out after the round trip" in f for f in report.failures), report.failures
    assert "round trip exact" not in check_of(report, "gather_out").detail


def test_ulysses_verify_uses_fewer_kv_heads_than_heads() -> None:
    """A GQA module whose alloc ignores H_kv is refused (mutation: every shape with H_kv == H, where it passes)."""
    with pytest.raises(ValueError, match="must have shape"):
        ulysses_verify.verify_module(ulysses_stand_in(generated_module("ulysses_qkv_gqa").SPEC, honour_h_kv=False))


# --- ulysses reference: the argument checks ----------------------------------------------------------------


def ulysses_problem(name: str, generator: torch.Generator) -> tuple[Any, Shape, dict[str, torch.Tensor]]:
    """(spec, shape N=3 S_local=1 B=1 H=9 H_kv=3 D=6 bfloat16, a rank's random shards, no zeros) of a bundled spec."""
    spec = generated_module(name).SPEC
    shape = Shape(N=3, S_local=1, H=9, H_kv=3, D=6, dtype=torch.bfloat16, B=1)
    shards = {
        t.name: (torch.randn(tensor_shape(spec, shape, t, "local"), generator=generator) + 0.5).to(torch.bfloat16)
        for t in spec.to_attention.tensors
    }
    return spec, shape, shards


def test_ulysses_scatter_refuses_an_extra_tensor_and_a_wrong_dtype(generator: torch.Generator) -> None:
    """Mutations: the name check a subset test; the dtype check dropped (the copy would convert silently)."""
    spec, shape, shards = ulysses_problem("ulysses_qkv_gqa", generator)
    send = UlyssesBuffers.allocate(spec, "to_attention", shape)
    with pytest.raises(ValueError, match="must map the tensors"):
        ulysses_reference.scatter({**shards, "extra": shards["q"]}, send)
    with pytest.raises(ValueError, match=r"and dtype torch\.bfloat16"):
        ulysses_reference.scatter({**shards, "q": shards["q"].float()}, send)
    wrong = {**shards, "k": shards["k"].new_ones(shards["k"].shape[0], *shards["k"].shape[1:-1], 1)}
    with pytest.raises(ValueError, match="must have shape"):
        ulysses_reference.scatter(wrong, send)


def test_ulysses_gather_refuses_an_out_of_the_wrong_shape(generator: torch.Generator) -> None:
    """Mutation: `out` not checked (copy_ broadcasts a [.., 1] tensor's dim, or fails with a torch error)."""
    spec, shape, shards = ulysses_problem("yunchang_ulysses", generator)
    sends = [UlyssesBuffers.allocate(spec, "to_attention", shape) for _ in range(shape.N)]
    for send in sends:
        ulysses_reference.scatter(shards, send)
    recv = ulysses_reference.exchange(sends)[1]
    want = ulysses_reference.gather(recv)
    out = {name: torch.empty_like(tensor) for name, tensor in want.items()}
    ulysses_reference.gather(recv, out)
    assert all(torch.equal(out[name], want[name]) for name in want)
    with pytest.raises(ValueError, match=r"out\["):
        ulysses_reference.gather(recv, {**out, "q": out["q"].float()})


def test_ulysses_exchange_refuses_too_few_ranks_and_mixed_shapes(generator: torch.Generator) -> None:
    """Mutations: only more buffers than N refused; the buffers' shape not compared."""
    spec, shape, _ = ulysses_problem("yunchang_ulysses", generator)
    sends = [UlyssesBuffers.allocate(spec, "to_attention", shape) for _ in range(shape.N)]
    with pytest.raises(ValueError, match="N=3"):
        ulysses_reference.exchange(sends[:2])
    other = UlyssesBuffers.allocate(spec, "to_attention", dataclasses.replace(shape, S_local=2))
    with pytest.raises(ValueError, match="rank 2"):
        ulysses_reference.exchange([*sends[:2], other])


# --- verification.py ---------------------------------------------------------------------------------------


def test_a_raising_verify_names_the_spec_and_its_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module that loaded and whose family's verify raised is reported under the spec's name and family, not
    the file's stem and "?" (mutations: the stem always; the family always "?")."""
    from layoutgen import codegen
    from layoutgen.family import get_family

    spec = make_spec(**{**NPU_LIKE_SPEC_FIELDS, "name": "raising_spec"})
    path = tmp_path / "another_stem.py"
    codegen.write_if_changed(path, codegen.render(spec, "test_spec.yaml"))

    def raising(self: Any, module: Any, device: str) -> VerifyReport:
        raise RuntimeError("planted")

    monkeypatch.setattr(type(get_family("dcp")), "verify", raising)
    report = verification.verify_path(path, "cpu")
    assert (report.spec_name, report.family, report.ok) == ("raising_spec", "dcp", False)
    assert report.failures == ("raising_spec: verification raised RuntimeError: planted",)


@pytest.mark.parametrize(("code", "how"), [(0, "exit status 0"), (3, "exit status 3"), (-11, "signal SIGSEGV")])
def test_a_crash_report_names_the_exit_status_or_signal(code: int, how: str) -> None:
    """Mutation: an exit status of 0 (a child that stopped early without a signal) reported as "signal 0"."""
    report = verification.crashed_report(Path("mod.py"), code, "")
    assert report.failures == (f"mod: the verification process died ({how}" + ("" if code >= 0 else
                               "; a kernel that reads or writes outside its buffers can do this") + ")",)  # fmt: skip


def fake_children(monkeypatch: pytest.MonkeyPatch, runs: list[tuple[int, int, str]]) -> list[list[Path]]:
    """Replace the child process: run i reports `runs[i][0]` modules as passed (hearing the device unless that
    is -1), then ends with status `runs[i][1]` and stderr `runs[i][2]`.  Returns the paths each run got."""
    calls: list[list[Path]] = []

    def run_child(paths: list[Path], on_device: Callable[[str], None]) -> tuple[list[VerifyReport], int, str]:
        finished, code, stderr = runs[len(calls)]
        calls.append(list(paths))
        if finished >= 0:
            on_device("cpu")
        reports = [VerifyReport(p.stem, "dcp", (Check("pack", True, "ok"),), ()) for p in paths[: max(finished, 0)]]
        return reports, code, stderr

    monkeypatch.setattr(verification, "_run_child", run_child)
    return calls


def test_a_crash_quotes_the_last_stderr_lines_and_the_device_is_heard_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutations: the tail taken from the head of stderr; `on_device` called by every child; a clean child's
    stderr not passed on."""
    stderr = "\n".join(f"line {i}" for i in range(30))
    calls = fake_children(monkeypatch, [(1, -11, stderr), (1, 0, "the second child's warning\n")])
    heard: list[str] = []
    paths = [Path("a.py"), Path("b.py"), Path("c.py")]
    reports = verification.verify_in_subprocess(paths, heard.append)
    assert heard == ["cpu"]
    assert calls == [paths, paths[2:]]
    assert [r.ok for r in reports] == [True, False, True]
    detail = reports[1].failures[0]
    assert "line 29" in detail and "line 18" in detail and "line 17" not in detail
    assert "the second child's warning" in capsys.readouterr().err


def test_a_child_dying_before_the_device_fails_every_module_in_one_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation: a child that died before anything respawned once per module."""
    calls = fake_children(monkeypatch, [(-1, 1, "ImportError: x")] * 3)
    paths = [Path("a.py"), Path("b.py"), Path("c.py")]
    reports = verification.verify_in_subprocess(paths, lambda device: None)
    assert len(calls) == 1
    assert [r.spec_name for r in reports] == ["a", "b", "c"] and not any(r.ok for r in reports)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the child picks the interpreter only without CUDA")
def test_the_child_switches_the_interpreter_on_without_a_gpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutation: TRITON_INTERPRET not set by the child (the kernels would not run on the CPU)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert verification.main([]) == 0
    assert os.environ.get("TRITON_INTERPRET") == "1"
    line = capsys.readouterr().out
    assert line.startswith(verification.MARK) and json.loads(line[len(verification.MARK) :]) == {"device": "cpu"}


# --- dcp reference: the float64 merge against an independent oracle -----------------------------------------


def oracle_merge(
    out: torch.Tensor, maximum: torch.Tensor, total: torch.Tensor, base: str, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The contract restated in float64, entry by entry: empty when the max is NaN or infinite or the sum is
    NaN, <= 0 or +inf; `w_i = s_i * base^(m_i - M)` over the rest; all empty gives 0 and -inf."""
    N, B, h, D = out.shape
    merged = torch.zeros(B, h, D, dtype=torch.float64)
    merged_lse = torch.full((B, h), -INF, dtype=torch.float64)
    power = (lambda x: 2.0**x) if base == "2" else (lambda x: float(torch.tensor(x, dtype=torch.float64).exp()))
    log = (lambda x: float(torch.tensor(x, dtype=torch.float64).log2())) if base == "2" else (
        lambda x: float(torch.tensor(x, dtype=torch.float64).log()))  # fmt: skip
    for b in range(B):
        for j in range(h):
            live = []
            for i in range(N):
                m, s = float(maximum[i, b, j]), float(total[i, b, j])
                if not (m != m or abs(m) == INF or not s > 0 or s == INF):
                    live.append(i)
            if not live:
                continue
            top = max(float(maximum[i, b, j]) for i in live)
            weights = {i: float(total[i, b, j]) * power(float(maximum[i, b, j]) - top) for i in live}
            total_weight = sum(weights.values())
            merged[b, j] = scale * sum(weights[i] * out[i, b, j].double() for i in live) / total_weight
            merged_lse[b, j] = top + log(total_weight)
    return merged, merged_lse


def random_partials(
    generator: torch.Generator, N: int = 4, B: int = 2, h: int = 3, D: int = 5
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 partials `[N, B, h, D]`, max ~ 3 N(0, 1) and sum in [0.5, 4.5) `[N, B, h]`; no zeros."""
    out = torch.randn(N, B, h, D, generator=generator) + 0.25
    maximum = torch.randn(N, B, h, generator=generator) * 3
    total = 0.5 + 4 * torch.rand(N, B, h, generator=generator)
    return out, maximum, total


def assert_merge(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert got[0].dtype == torch.float64 and got[1].dtype == torch.float64
    assert torch.allclose(got[0], want[0], rtol=1e-12, atol=1e-300), (got[0] - want[0]).abs().max()
    finite = want[1].isfinite()
    assert torch.equal(got[1].isfinite(), finite) and bool((got[1][~finite] == -INF).all())
    assert torch.allclose(got[1][finite], want[1][finite], rtol=1e-12, atol=0), (got[1] - want[1]).abs().max()


@pytest.mark.parametrize("base", ["e", "2"])
def test_merge_max_sum_with_every_kind_of_empty_entry_against_float64(base: str, generator: torch.Generator) -> None:
    """Entries with a NaN or +inf max, or a NaN, 0, negative or +inf sum, contribute nothing (their payload NaN);
    a row of only such entries is 0 with LSE -inf; `scale` scales the output, not the LSE; every step in
    float64 (mutations: each emptiness rule dropped in turn; the empty entries' sums kept; float32 stats; the
    weight sum rounded to float32; the LSE scaled)."""
    out, maximum, total = random_partials(generator)
    nan = float("nan")
    for i, b, j, m, s in [(0, 0, 0, nan, 2.0), (1, 0, 1, INF, 2.0), (2, 0, 2, 1.0, 0.0), (3, 0, 0, 1.0, nan),
                          (1, 0, 2, 1.0, INF), (2, 0, 1, 1.0, -1.5),
                          (0, 1, 1, nan, 1.0), (1, 1, 1, INF, 1.0), (2, 1, 1, 0.5, 0.0), (3, 1, 1, -INF, 0.0)]:  # fmt: skip
        maximum[i, b, j], total[i, b, j] = m, s
        out[i, b, j] = nan
    got = reference.merge_max_sum(out, maximum, total, base, scale=0.75)
    assert_merge(got, oracle_merge(out, maximum, total, base, 0.75))
    assert torch.equal(got[0][1, 1], torch.zeros(5, dtype=torch.float64)) and got[1][1, 1] == -INF


@pytest.mark.parametrize("base", ["e", "2"])
def test_merge_partials_of_float32_lses_is_float64(base: str, generator: torch.Generator) -> None:
    """B=1, odd heads, D=7: the merge of float32 LSEs agrees with the float64 oracle to 1e-12 (mutation: the
    LSEs taken to float32, which costs about 1e-7)."""
    out, lse, _ = random_partials(generator, N=3, B=1, h=5, D=7)
    lse[1, 0, 3] = -INF
    out[1, 0, 3] = float("nan")
    got = reference.merge_partials(out, lse, base, scale=1.5)
    assert_merge(got, oracle_merge(out, lse, torch.ones_like(lse), base, 1.5))


def test_a_partial_counts_unless_its_float32_share_underflows_in_its_base() -> None:
    """A partial 120 below the top: its share 2^-120 is a float32 number in base 2 (it counts, its huge payload
    shows), e^-120 is not (it is dropped, the merge is exactly the other payload).  Mutations: the share
    computed in the other base; a zero share counted (`>= 0`)."""
    out = torch.tensor([1.0, 3e38]).view(2, 1, 1, 1)
    lse = torch.tensor([0.0, -120.0]).view(2, 1, 1)
    merged_e, _ = reference.merge_partials(out, lse, "e")
    assert merged_e.item() == 1.0
    merged_2, _ = reference.merge_partials(out, lse, "2")
    huge = float(out[1, 0, 0, 0])
    assert merged_2.item() == pytest.approx((1.0 + 2.0**-120 * huge) / (1.0 + 2.0**-120), rel=1e-12)
    merged_far, _ = reference.merge_partials(out, torch.tensor([0.0, -160.0]).view(2, 1, 1), "2")
    assert merged_far.item() == 1.0


def test_merge_shards_max_sum_takes_the_ranks_head_block(generator: torch.Generator) -> None:
    """N=3, H=6, [R=2, T=1] rows: rank r merges heads r*2 .. r*2+1 of every rank (mutation: the block starting
    at head r)."""
    N, H, D = 3, 6, 3
    outs = [torch.randn(2, 1, H, D, generator=generator) for _ in range(N)]
    maxes = [torch.randn(2, 1, H, generator=generator) * 2 for _ in range(N)]
    sums = [1 + torch.rand(2, 1, H, generator=generator) for _ in range(N)]
    for rank in range(N):
        block = slice(rank * 2, rank * 2 + 2)
        want = oracle_merge(
            torch.stack([o.reshape(2, H, D)[:, block] for o in outs]),
            torch.stack([m.reshape(2, H)[:, block] for m in maxes]),
            torch.stack([s.reshape(2, H)[:, block] for s in sums]),
            "e",
            1.0,
        )
        assert_merge(reference.merge_shards_max_sum(outs, maxes, sums, rank), want)


def test_masked_inputs_zero_the_empty_requests_and_empty_their_stats(generator: torch.Generator) -> None:
    """out [R=3, T=2, H=3, D=5] with request 1 empty: its two rows get +0.0 and (max, sum) = (-inf, 0), the
    others are unchanged (mutations: the sum filled with 1; the payload not zeroed)."""
    out = torch.randn(3, 2, 3, 5, generator=generator).to(torch.bfloat16)
    maximum = torch.randn(3, 2, 3, generator=generator)
    total = 1 + torch.rand(3, 2, 3, generator=generator)
    new_out, (new_max, new_sum) = reference.masked_inputs(out, [maximum, total], torch.tensor([False, True, False]))
    keep = torch.tensor([True, True, False, False, True, True])
    assert new_out.shape == (6, 3, 5) and new_out.dtype == torch.bfloat16
    assert torch.equal(new_out[keep], out.reshape(6, 3, 5)[keep])
    assert torch.equal(new_out[~keep], torch.zeros(2, 3, 5, dtype=torch.bfloat16))
    assert not bool(new_out[~keep].signbit().any())
    assert torch.equal(new_max[keep], maximum.reshape(6, 3)[keep]) and bool((new_max[~keep] == -INF).all())
    assert torch.equal(new_sum[keep], total.reshape(6, 3)[keep]) and bool((new_sum[~keep] == 0).all())


def test_pack_takes_exactly_one_of_lse_and_max_sum(generator: torch.Generator) -> None:
    """Mutation: both given accepted (the lse silently ignored for an lse-form spec)."""
    spec = generated_module("vllm_a2a").SPEC
    out = torch.randn(1, 2, 3, generator=generator)
    lse = torch.randn(1, 2, generator=generator)
    bufs = LayoutBuffers.allocate(spec, 2, 1, 2, 3, torch.float32)
    with pytest.raises(ValueError, match="exactly one"):
        reference.pack(out, lse, bufs, max_sum=(lse, torch.ones_like(lse)))
    with pytest.raises(ValueError, match="exactly one"):
        reference.pack(out, None, bufs)


# --- dcp tolerances: the written policy at its edges ---------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "ulp"), [(torch.bfloat16, 2.0**-7), (torch.float16, 2.0**-10), (torch.float32, 2.0**-23)]
)
def test_combine_error_allows_one_ulp_of_bf16_and_fp16_and_eight_of_float32(
    dtype: torch.dtype, ulp: float, generator: torch.Generator
) -> None:
    """References in [1, 2) (D=7, odd): 1 (bf16, fp16) or 8 (float32) units in the last place pass, twice that
    fails, with a negligible atol (scale 0).  Mutations: each rtol loosened; |got| added to the allowance."""
    allowed_ulps = 8 if dtype == torch.float32 else 1
    ref = (1 + torch.rand(3, 7, generator=generator)).to(dtype).to(torch.float64)
    ref = torch.where(ref >= 2, 1.5, ref)
    within = (ref + allowed_ulps * ulp).to(dtype)
    beyond = (ref + 2 * allowed_ulps * ulp).to(dtype)
    assert torch.equal(within.double() - ref, torch.full_like(ref, allowed_ulps * ulp))
    assert combine_error(within, ref, 0.0) <= 1.0
    assert combine_error(beyond, ref, 0.0) > 1.0


def test_combine_atol_is_scaled_by_the_largest_partial_and_lse_atol_is_absolute() -> None:
    """|got - ref| = 5e-5 at ref 0: passes with scale 10 (atol 1e-4), fails with scale 1 (atol 1e-5); an LSE 2e-5
    off at 0 fails (mutations: atol not scaled; either atol loosened)."""
    ref = torch.zeros(4, dtype=torch.float64)
    got = torch.full((4,), 5e-5, dtype=torch.float32)
    assert combine_error(got, ref, 10.0) == pytest.approx(0.5, rel=1e-6)
    assert combine_error(got, ref, 1.0) == pytest.approx(5.0, rel=1e-6)
    assert lse_error(torch.full((4,), 2e-5), ref) == pytest.approx(2.0, rel=1e-6)


def test_lse_error_allows_2_to_the_minus_20_relative() -> None:
    """LSE 1000: 1.5 * 2^-20 relative off fails, 0.5 * 2^-20 passes (mutation: LSE rtol loosened)."""
    ref = torch.tensor([1000.0, -1000.0], dtype=torch.float64)
    assert 1.0 < lse_error((ref * (1 + 1.5 * 2.0**-20)).float(), ref) < 2.0
    assert lse_error((ref * (1 + 0.5 * 2.0**-20)).float(), ref) <= 1.0


def test_error_ratios_on_special_values_and_shapes() -> None:
    """-inf where the reference has -inf matches; a NaN, an inf of the other sign or a finite value against an
    infinity, or a NaN against a finite value, anywhere in the tensor is inf; so is another shape, even a
    broadcastable one (mutations: any one matching entry enough; the shape check dropped)."""
    nan = float("nan")
    ref = torch.tensor([0.5, -INF, 1.25], dtype=torch.float64)
    assert lse_error(ref.float(), ref) == 0.0
    for bad in ([0.5, nan, 1.25], [0.5, INF, 1.25], [0.5, -1e30, 1.25], [nan, -INF, 1.25], [0.5, -INF, -INF]):
        assert lse_error(torch.tensor(bad), ref) == INF, bad
    assert combine_error(ref.float(), ref, 1.0) == 0.0
    assert combine_error(torch.full((3, 4), 0.5), torch.full((4,), 0.5, dtype=torch.float64), 1.0) == INF
    assert lse_error(torch.full((1,), 0.5), torch.full((4,), 0.5, dtype=torch.float64)) == INF


# --- two defects the audit found, fixed with these tests (each fails on the code before) -------------------


def test_matching_nans_pass_and_cannot_hide_a_violation() -> None:
    """`_ratio` counted NaN against NaN as a match, then divided by a NaN allowance: the ratio came out NaN, and
    `ratio > 1` is False for NaN, so a real violation in the same tensor passed verification."""
    reference_values = torch.tensor([0.5, float("nan"), -INF, 1.25], dtype=torch.float64)
    assert lse_error(reference_values.float(), reference_values) == 0.0
    assert combine_error(reference_values.bfloat16(), reference_values, 1.0) == 0.0
    wrong = reference_values.float().clone()
    wrong[0] = 9.0
    assert lse_error(wrong, reference_values) > 1.0
    assert combine_error(wrong.bfloat16(), reference_values, 1.0) > 1.0


def test_dcp_verify_checks_the_masked_pack_on_any_device() -> None:
    """The masked [R, T] pack was checked only where the device was the string "cpu", so `build` on a GPU
    never checked it (nor the (max, sum) pack); a device named any other way checks it too."""
    module = with_pack(generated_module("vllm_a2a").SPEC, pack_ignoring_the_mask)
    report = dcp_verify.verify_module(module, device="cpu:0")
    assert not check_of(report, "pack").passed
    assert report.failures and all(f.startswith("pack with an empty mask") for f in report.failures)
