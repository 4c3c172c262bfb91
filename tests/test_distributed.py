"""DcpExchange across real processes: gloo on CPU, spawned ranks, Triton interpreter.

One spawn per world size runs every check for that size (spawning and importing
Triton cost more than the checks). `run_checks` is shared with the NCCL test in
tests/gpu/test_distributed_gpu.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from layoutgen.dcp import tolerances
from layoutgen.dcp.reference import merge_shards
from layoutgen.dcp.spec import Transport
from layoutgen.spec import bundled_specs

ALL_TO_ALL_SPECS = sorted(
    name
    for name, spec in bundled_specs().items()
    if spec.family == "dcp" and not spec.max_sum and spec.transport is Transport.ALL_TO_ALL_SINGLE
)
EXTERNAL_SPEC = "flashinfer_mnnvl"
D = 12  # not a power of two; even, as the row-tail specs need for bf16
B_MAX = 5


def make_partials(
    N: int, B: int, H: int, dtype: torch.dtype, device: Any, seed: int, empty_shards: bool
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every rank's `out [B, H, D]` and `lse [B, H]`, identical on every rank (same seed).

    With `empty_shards`, sequence b has b keys spread round-robin over the ranks, so rank r holds none
    when b <= r: its LSE is -inf and its payload NaN (an empty partial's payload is garbage). Sequence 0
    is empty everywhere (merged output 0, LSE -inf).
    """
    generator = torch.Generator().manual_seed(seed)
    outs = [torch.randn(B, H, D, generator=generator).to(dtype) for _ in range(N)]
    lses = [torch.rand(B, H, generator=generator) * 6 - 3 for _ in range(N)]
    if empty_shards:
        for rank in range(N):
            for sequence in range(B):
                if sequence <= rank:
                    lses[rank][sequence] = float("-inf")
                    outs[rank][sequence] = float("nan")
    return [o.to(device) for o in outs], [lse.to(device) for lse in lses]


def emulated_exchange(spec_name: str, group: Any = None) -> Callable[[dict, dict], None]:
    """What an external transport does, with torch.distributed: peer outermost, all_to_all_single, back."""
    spec = bundled_specs()[spec_name]

    def exchange(send: dict[str, torch.Tensor], recv: dict[str, torch.Tensor]) -> None:
        for name, tensor in send.items():
            axes = spec.payload.axes if name == "payload" else spec.stats.axes
            assert axes is not None
            peer_dim = axes.index("peer")
            outgoing = tensor.movedim(peer_dim, 0).contiguous()
            incoming = torch.empty_like(outgoing)
            dist.all_to_all_single(incoming.view(torch.uint8), outgoing.view(torch.uint8), group=group)
            recv[name].copy_(incoming.movedim(0, peer_dim))

    return exchange


class Checks:
    """Collects failures so that every rank finishes its collectives before anything is raised."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failures: list[str] = []

    def expect(self, condition: bool, message: str) -> None:
        if not condition:
            self.failures.append(f"rank {self.rank}: {message}")

    def expect_raises(self, kind: type[Exception], words: list[str], action: Callable[[], Any], what: str) -> None:
        try:
            action()
        except kind as error:
            missing = [w for w in words if w not in str(error)]
            self.expect(not missing, f"{what}: message {str(error)!r} lacks {missing}")
        except Exception as error:
            self.failures.append(f"rank {self.rank}: {what}: raised {type(error).__name__}: {error}")
        else:
            self.failures.append(f"rank {self.rank}: {what}: did not raise {kind.__name__}")

    def merged_matches(
        self,
        label: str,
        merged: torch.Tensor,
        merged_lse: torch.Tensor | None,
        outs: list[torch.Tensor],
        lses: list[torch.Tensor],
        N: int,
        lse_base: str,
        spec: Any = None,
    ) -> None:
        outs = [o.cpu() for o in outs]
        if spec is not None and spec.fp8:
            # What the wire carries: each row quantised per block and dequantised (the quantisation error is
            # the wire's, bounded in benchmarks/results/fp8_accuracy.md; here only the kernels are judged).
            outs = [wire_values(spec, o) for o in outs]
        ref, ref_lse = merge_shards(outs, [lse.cpu() for lse in lses], self.rank, lse_base)
        heads = outs[0].shape[1] // N
        block = slice(self.rank * heads, (self.rank + 1) * heads)
        scale = float(torch.nan_to_num(torch.stack([o[:, block].float().cpu() for o in outs])).abs().max())
        self.expect(tuple(merged.shape) == tuple(ref.shape), f"{label}: shape {tuple(merged.shape)} != {ref.shape}")
        self.expect(not bool(torch.isnan(merged).any()), f"{label}: merged output holds NaN")
        error = tolerances.combine_error(merged.cpu(), ref, scale)
        self.expect(error <= 1, f"{label}: combine error {error:.3g} x tolerance")
        if merged_lse is not None:
            lse_error = tolerances.lse_error(merged_lse.cpu(), ref_lse)
            self.expect(lse_error <= 1, f"{label}: LSE error {lse_error:.3g} x tolerance")


def wire_values(spec: Any, out: torch.Tensor) -> torch.Tensor:
    """out [B, H, D] as an fp8 spec's combine reads it back: quantised per block of each row, dequantised."""
    from layoutgen.dcp import quant
    from layoutgen.dcp.layout import wire_dtype

    codes, scales = quant.quantise(out.float(), spec.scale_block_of(out.shape[-1]), wire_dtype(spec, out.dtype))
    return quant.dequantise(codes, scales)


def buffer_pointers(exchange: Any) -> dict[str, int]:
    return {
        f"{side}.{name}": tensor.data_ptr()
        for side, bufs in (("send", exchange.send), ("recv", exchange.recv))
        for name, tensor in bufs.tensors.items()
    }


def check_spec(checks: Checks, spec: str, N: int, device: Any, exchange_fn: Any = None, lse_base: str = "e") -> None:
    """Merged results against the reference over three calls with changing B, empty shards in two."""
    from layoutgen import DcpExchange

    H = 3 * N  # three heads per rank: odd
    exchange = DcpExchange(
        spec,
        None,
        B_max=B_MAX,
        H=H,
        D=D,
        dtype=torch.bfloat16,
        device=device,
        lse_base=lse_base,
        exchange_fn=exchange_fn,
    )
    pointers = buffer_pointers(exchange)
    for call, (B, empty_shards, return_lse) in enumerate(((B_MAX, False, True), (2, True, True), (4, True, False))):
        outs, lses = make_partials(N, B, H, torch.bfloat16, device, seed=100 * N + call, empty_shards=empty_shards)
        # The call without LSE writes into a caller's tensor, as a CUDA-graph user may ask; the first call's LSE
        # goes into one too.
        merged_out = None if return_lse else torch.empty(B, 3, D, dtype=torch.bfloat16, device=device)
        merged_lse_out = torch.empty(B, 3, device=device) if call == 0 else None
        result = exchange(
            outs[checks.rank],
            lses[checks.rank],
            return_lse=return_lse,
            merged_out=merged_out,
            merged_lse_out=merged_lse_out,
        )
        merged, merged_lse = result if return_lse else (result, None)
        checks.expect(isinstance(merged, torch.Tensor), f"{spec}: return_lse={return_lse} gave {type(result)}")
        checks.expect(merged_out is None or merged is merged_out, f"{spec}: merged_out was not used")
        checks.expect(merged_lse_out is None or merged_lse is merged_lse_out, f"{spec}: merged_lse_out was not used")
        checks.merged_matches(f"{spec} N={N} B={B}", merged, merged_lse, outs, lses, N, lse_base, bundled_specs()[spec])
        send, _ = exchange.batch_buffers(B)
        checks.expect(
            send.tensors["payload"].data_ptr() == pointers["send.payload"],
            f"{spec}: the B={B} send view does not start at the static buffer",
        )
    checks.expect(buffer_pointers(exchange) == pointers, f"{spec}: buffers were reallocated between calls")


def check_errors(checks: Checks, N: int, device: Any) -> None:
    from layoutgen import DcpExchange

    H = 2 * N
    checks.expect_raises(
        ValueError,
        ["H=", "divisible"],
        lambda: DcpExchange("vllm_a2a", None, B_max=2, H=N + 1, D=D, dtype=torch.bfloat16, device=device),
        "H not divisible by the world size",
    )
    exchange = DcpExchange("vllm_a2a", None, B_max=2, H=H, D=D, dtype=torch.bfloat16, device=device)
    good_out = torch.randn(2, H, D, device=device).to(torch.bfloat16)
    good_lse = torch.randn(2, H, device=device)
    checks.expect_raises(
        ValueError,
        ["B=3", "B_max=2"],
        lambda: exchange(torch.randn(3, H, D, device=device).to(torch.bfloat16), torch.randn(3, H, device=device)),
        "B > B_max",
    )
    checks.expect_raises(
        TypeError, ["out", "bfloat16", "float16"], lambda: exchange(good_out.half(), good_lse), "wrong out dtype"
    )
    checks.expect_raises(
        TypeError, ["lse", "float32"], lambda: exchange(good_out, good_lse.double()), "wrong lse dtype"
    )
    checks.expect_raises(
        ValueError, ["lse", "[B=2, H="], lambda: exchange(good_out, good_lse[:, :-1]), "wrong lse shape"
    )
    checks.expect_raises(
        ValueError, ["out", "meta"], lambda: exchange(good_out.to("meta"), good_lse.to("meta")), "wrong device"
    )
    h = H // N
    bf16 = {"device": device, "dtype": torch.bfloat16}
    merged_outs = {
        "merged_out of the wrong shape": (
            ValueError,
            ["merged_out", f"[2, {h}, {D}]"],
            torch.empty(2, h + 1, D, **bf16),
        ),
        "merged_out not a tensor": (TypeError, ["merged_out", "list"], [torch.empty(2, h, D, **bf16)]),
        "merged_out of the wrong dtype": (
            TypeError,
            ["merged_out", "bfloat16", "float32"],
            torch.empty(2, h, D, device=device),
        ),
        "merged_out expanded": (
            ValueError,
            ["merged_out", "overlap itself"],
            torch.empty(1, h, D, **bf16).expand(2, h, D),
        ),
    }
    for label, (error, words, merged_out) in merged_outs.items():
        checks.expect_raises(
            error, words, lambda merged_out=merged_out: exchange(good_out, good_lse, merged_out=merged_out), label
        )
    merged = torch.empty(2, h, D, **bf16)
    merged_lse_outs = {
        "merged_lse_out of the wrong shape": (
            ValueError,
            ["merged_lse_out", f"[2, {h}]", f"({2}, {h + 1})"],
            torch.empty(2, h + 1, device=device),
        ),
        "merged_lse_out of the wrong dtype": (
            ValueError,
            ["merged_lse_out", "float32", "torch.float64"],
            torch.empty(2, h, device=device, dtype=torch.float64),
        ),
        "merged_lse_out not contiguous": (
            ValueError,
            ["merged_lse_out", "contiguous"],
            torch.empty(h, 2, device=device).t(),
        ),
        "merged_lse_out not a tensor": (TypeError, ["merged_lse_out", "list"], [[0.0] * h] * 2),
        "merged_lse_out over merged_out": (
            ValueError,
            ["merged_lse_out must not share memory with merged_out"],
            merged.view(-1)[: 4 * h].view(torch.float32).view(2, h),
        ),
    }
    for label, (error, words, merged_lse_out) in merged_lse_outs.items():
        checks.expect_raises(
            error,
            words,
            lambda merged_lse_out=merged_lse_out: exchange(
                good_out, good_lse, merged_out=merged, merged_lse_out=merged_lse_out
            ),
            label,
        )
    wide = DcpExchange("vllm_a2a", None, B_max=4, H=H, D=D, dtype=torch.bfloat16, device=device)
    tokens_out = torch.randn(2, 2, H, D, device=device).to(torch.bfloat16)
    across = torch.empty(2, 2, h, D, **bf16).transpose(0, 1)  # R and T swapped: no [4, h, D] view
    checks.expect_raises(
        ValueError,
        ["merged_out", "viewable as [R*T=4"],
        lambda: wide(tokens_out, torch.randn(2, 2, H, device=device), merged_out=across),
        "merged_out [R, T, h, D] whose rows are not one stride apart",
    )
    # A group without this rank: every rank takes part in creating it, only rank 0 belongs to it.
    rank_zero_only = dist.new_group([0])
    if checks.rank != 0:
        checks.expect_raises(
            ValueError,
            ["not a member"],
            lambda: DcpExchange("vllm_a2a", rank_zero_only, B_max=2, H=H, D=D, dtype=torch.bfloat16, device=device),
            "group without this rank",
        )
    checks.expect_raises(
        ValueError,
        ["differ between ranks", "B_max"],
        lambda: DcpExchange(
            "vllm_a2a", None, B_max=2 + (checks.rank == 0), H=H, D=D, dtype=torch.bfloat16, device=device
        ),
        "ranks built with different B_max",
    )


def check_world_size_one(checks: Checks, device: Any) -> None:
    # One rank packs and combines without an exchange, under the empty-shard rules of any N: an LSE of
    # -inf (its payload NaN, as engines leave it), NaN or +inf merges to 0 and -inf.
    import layoutgen
    from layoutgen import DcpExchange

    solo, _ = dist.new_subgroups(group_size=1)
    exchange = DcpExchange("pynccl_a2a", solo, B_max=4, H=4, D=D, dtype=torch.bfloat16, device=device)
    out = torch.randn(4, 4, D, device=device).to(torch.bfloat16)
    lse = torch.randn(4, 4, device=device)
    lse[1, 2], lse[2, 0], lse[3, 3] = float("-inf"), float("nan"), float("inf")
    out[1, 2] = float("nan")
    merged, merged_lse = exchange(out, lse, return_lse=True)
    module = layoutgen.load("pynccl_a2a")
    bufs = module.alloc(1, 4, 4, D, torch.bfloat16, device)
    module.pack(out, lse, bufs)
    want, want_lse = module.combine(bufs, 4, return_lse=True)
    checks.expect(exchange.recv is exchange.send, "world size 1: combine must read the buffers pack wrote")
    checks.expect(torch.equal(merged, want) and torch.equal(merged_lse, want_lse), "world size 1 != pack + combine")
    emptied = [(1, 2), (2, 0), (3, 3)]
    checks.expect(
        all(bool((merged[r, h] == 0).all()) and float(merged_lse[r, h]) == float("-inf") for r, h in emptied),
        "world size 1: an LSE of -inf, NaN or +inf must merge to 0 and LSE -inf",
    )
    live = torch.isfinite(lse)
    checks.expect(torch.equal(merged[live], out[live]), "world size 1: a live partial must come back as it was")


def check_v2_world_size_one(checks: Checks, device: Any) -> None:
    from layoutgen import DcpExchange
    from layoutgen.dcp import reference

    solo, _ = dist.new_subgroups(group_size=1)
    exchange = DcpExchange("trtllm_helix_nccl", solo, B_max=3, H=4, D=D, dtype=torch.float32, device=device)
    out = torch.randn(3, 4, D, device=device)
    maximum, total = torch.randn(3, 4, device=device), torch.rand(3, 4, device=device) + 0.5
    total[0, 1], maximum[2, 3] = 0.0, float("nan")  # empty entries: a zero sum, a NaN max
    out[0, 1] = float("nan")
    empty = torch.tensor([False, True, False], device=device)
    merged, merged_lse = exchange(out, max_sum=(maximum, total), empty=empty, scale=2.0, return_lse=True)
    masked = reference.masked_inputs(out.cpu(), [maximum.cpu(), total.cpu()], empty.cpu())
    want, want_lse = reference.merge_shards_max_sum([masked[0]], [masked[1][0]], [masked[1][1]], 0, scale=2.0)
    error = tolerances.combine_error(merged.cpu(), want, float(out.nan_to_num().abs().max()) * 2)
    checks.expect(error <= 1, f"world size 1: (max, sum), empty and scale: combine error {error:.3g} x tolerance")
    lse_error = tolerances.lse_error(merged_lse.cpu(), want_lse)
    checks.expect(lse_error <= 1, f"world size 1: (max, sum): LSE error {lse_error:.3g} x tolerance")
    checks.expect(
        bool((merged[1] == 0).all()) and bool((merged[0, 1] == 0).all()) and bool((merged[2, 3] == 0).all()),
        "world size 1: an empty request, a zero sum and a NaN max must merge to 0",
    )
    # Was: accepted once the pair's checks were cached (the stacked tensor listed into the pair's key).
    checks.expect_raises(
        TypeError,
        ["max_sum must be a (max, sum) pair", "got Tensor"],
        lambda: exchange(out, max_sum=torch.stack([maximum, total]), empty=empty, scale=2.0, return_lse=True),
        "world size 1: a stacked max_sum after a (max, sum) call",
    )


def check_v2(checks: Checks, spec: str, N: int, device: Any, exchange_fn: Any = None) -> None:
    """Contract v2 through DcpExchange: out [R, T, H, D] with empty requests (a different set per rank, one
    empty everywhere), (max, sum) statistics, an output scale; against the float64 merge of the masked
    shards.  The merged result has out's leading shape."""
    from layoutgen import DcpExchange
    from layoutgen.dcp import reference

    R, T, H = 3, 2, 2 * N
    exchange = DcpExchange(
        spec, None, B_max=R * T, H=H, D=D, dtype=torch.float16, device=device, exchange_fn=exchange_fn
    )
    generator = torch.Generator().manual_seed(7 * N)
    outs = [torch.randn(R, T, H, D, generator=generator).to(torch.float16) for _ in range(N)]
    maxes = [torch.randn(R, T, H, generator=generator) * 3 for _ in range(N)]
    sums = [1 + 4 * torch.rand(R, T, H, generator=generator) for _ in range(N)]
    empties = [torch.tensor([rank == 0, False, True]) for rank in range(N)]
    mine = checks.rank
    merged, merged_lse = exchange(
        outs[mine].to(device),
        max_sum=(maxes[mine].to(device), sums[mine].to(device)),
        empty=empties[mine].to(device),
        scale=0.5,
        return_lse=True,
    )
    masked = [reference.masked_inputs(outs[r], [maxes[r], sums[r]], empties[r]) for r in range(N)]
    want, want_lse = reference.merge_shards_max_sum(
        [m[0] for m in masked], [m[1][0] for m in masked], [m[1][1] for m in masked], mine, scale=0.5
    )
    h = H // N
    checks.expect(tuple(merged.shape) == (R, T, h, D), f"{spec} v2: merged shape {tuple(merged.shape)}")
    checks.expect(tuple(merged_lse.shape) == (R, T, h), f"{spec} v2: merged LSE shape {tuple(merged_lse.shape)}")
    scale = max(float(o.abs().max()) for o in outs) * 0.5
    error = tolerances.combine_error(merged.cpu().reshape(R * T, h, D), want, scale)
    checks.expect(error <= 1, f"{spec} v2: combine error {error:.3g} x tolerance")
    lse_error = tolerances.lse_error(merged_lse.cpu().reshape(R * T, h), want_lse)
    checks.expect(lse_error <= 1, f"{spec} v2: LSE error {lse_error:.3g} x tolerance")
    checks.expect(
        bool((merged[2] == 0).all()) and bool((merged_lse[2] == float("-inf")).all()),
        f"{spec} v2: a request empty on every rank must merge to 0 and -inf",
    )


def check_compiled_exchange(checks: Checks, N: int, device: Any) -> None:
    # pack -> exchange -> combine, and DcpExchange, traced whole (fullgraph) for a row-tail spec, whose
    # buffer check reads an address a traced tensor does not have: the same bits as eager.
    import layoutgen
    from layoutgen import DcpExchange

    module = layoutgen.load("pynccl_a2a")
    H = 2 * N
    send, recv = (module.alloc(N, 4, H, D, torch.bfloat16, device) for _ in range(2))
    generator = torch.Generator().manual_seed(11 + checks.rank)
    out = torch.randn(3, H, D, generator=generator).to(device=device, dtype=torch.bfloat16)
    lse = (torch.randn(3, H, generator=generator) * 3).to(device)

    def step(o: torch.Tensor, l: torch.Tensor) -> torch.Tensor:
        module.pack(o, l, send)
        module.exchange(send, recv)
        return module.combine(recv, 3)[0]

    want = step(out, lse)
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(out, lse)
    checks.expect(torch.equal(got, want), "pack -> exchange -> combine under torch.compile differs from eager")
    exchange = DcpExchange("pynccl_a2a", None, B_max=4, H=H, D=D, dtype=torch.bfloat16, device=device)
    want, want_lse = exchange(out, lse, True)
    got, got_lse = torch.compile(lambda o, l: exchange(o, l, True), fullgraph=True, backend="aot_eager")(out, lse)
    checks.expect(
        torch.equal(got, want) and torch.equal(got_lse, want_lse), "DcpExchange under torch.compile differs from eager"
    )


def run_checks(rank: int, N: int, device: Any) -> list[str]:
    checks = Checks(rank)
    for spec in ALL_TO_ALL_SPECS:
        check_spec(checks, spec, N, device)
    # FlashInfer's layout needs D * 2 bytes % 16 == 0 only on the real transport; the emulation moves any D.
    check_spec(checks, EXTERNAL_SPEC, N, device, exchange_fn=emulated_exchange(EXTERNAL_SPEC), lse_base="2")
    if N in (2, 3):
        check_v2(checks, "trtllm_helix_nccl", N, device)
        check_v2(checks, "trtllm_helix_native_v2", N, device, exchange_fn=emulated_exchange("trtllm_helix_native_v2"))
    if N == 2:
        check_v2(checks, "pynccl_a2a", N, device)
        check_spec(checks, "vllm_a2a", N, device, exchange_fn=emulated_exchange("vllm_a2a"))
        check_errors(checks, N, device)
        check_world_size_one(checks, device)
        check_v2_world_size_one(checks, device)
        check_compiled_exchange(checks, N, device)
    return checks.failures


def _cpu_worker(rank: int, N: int, store: str) -> None:
    os.environ["TRITON_INTERPRET"] = "1"  # before any generated module (and so its kernels) is imported
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=N, timeout=timedelta(seconds=120)
    )
    try:
        failures = run_checks(rank, N, "cpu")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if failures:
        raise AssertionError("\n".join(failures))


@pytest.mark.parametrize("N", [2, 3, 4])
def test_exchange_across_processes(N: int, tmp_path: Path) -> None:
    mp.spawn(_cpu_worker, args=(N, str(tmp_path / "store")), nprocs=N, join=True)


def test_external_spec_needs_exchange_fn() -> None:
    from layoutgen import DcpExchange

    with pytest.raises(ValueError, match=r"transport external: pass exchange_fn.*flashinfer_mnnvl_exchange"):
        DcpExchange(EXTERNAL_SPEC, None, B_max=2, H=4, D=16, dtype=torch.bfloat16, device="cpu")


def test_needs_initialised_process_group() -> None:
    from layoutgen import DcpExchange

    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        DcpExchange("vllm_a2a", None, B_max=2, H=4, D=16, dtype=torch.bfloat16, device="cpu")


def test_package_import_does_not_load_distributed() -> None:
    code = (
        "import sys, layoutgen\n"
        "assert 'layoutgen.dcp.distributed' not in sys.modules and 'torch' not in sys.modules\n"
        "from layoutgen.dcp.distributed import DcpExchange\n"
        "assert layoutgen.DcpExchange is DcpExchange\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _fake_flashinfer(monkeypatch: pytest.MonkeyPatch, alltoall: Callable[..., Any]) -> None:
    package, comm, dcp_alltoall = (
        types.ModuleType(n) for n in ("flashinfer", "flashinfer.comm", "flashinfer.comm.dcp_alltoall")
    )
    dcp_alltoall.decode_cp_a2a_alltoall = alltoall  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer", package)
    monkeypatch.setitem(sys.modules, "flashinfer.comm", comm)
    monkeypatch.setitem(sys.modules, "flashinfer.comm.dcp_alltoall", dcp_alltoall)


def test_flashinfer_adapter_names_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from layoutgen.dcp.distributed import flashinfer_mnnvl_exchange

    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r"flashinfer-python"):
        flashinfer_mnnvl_exchange(torch.zeros(2, 8, dtype=torch.int64), 0, 2)


def test_flashinfer_adapter_names_missing_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    from layoutgen.dcp.distributed import flashinfer_mnnvl_exchange

    _fake_flashinfer(monkeypatch, lambda *args: args[:2])
    with pytest.raises(RuntimeError, match=r"compute capability 9\.0.*SM90"):
        flashinfer_mnnvl_exchange(torch.zeros(2, 8, dtype=torch.int64), 0, 2)


def test_flashinfer_adapter_copies_results_into_recv(monkeypatch: pytest.MonkeyPatch) -> None:
    import layoutgen.dcp.distributed as distributed

    calls = []

    def alltoall(partial_o: torch.Tensor, stats: torch.Tensor, workspace: torch.Tensor, rank: int, size: int, pdl: Any):
        calls.append((partial_o, stats, workspace, rank, size, pdl))
        return partial_o.flip(-2) * 2, stats.flip(-2) + 1  # stands in for "what the peers sent"

    _fake_flashinfer(monkeypatch, alltoall)
    monkeypatch.setattr(distributed, "_require_sm90", lambda device: None)
    workspace = torch.zeros(2, 8, dtype=torch.int64)
    exchange = distributed.flashinfer_mnnvl_exchange(workspace, 1, 2, enable_pdl=False)
    send = {"payload": torch.randn(3, 4, 2, 8).to(torch.bfloat16), "stats": torch.randn(3, 4, 2, 2)}
    recv = {name: torch.full_like(t, float("nan")) for name, t in send.items()}
    exchange(send, recv)
    assert len(calls) == 1
    partial_o, stats, got_workspace, rank, size, pdl = calls[0]
    assert partial_o is send["payload"] and stats is send["stats"] and got_workspace is workspace
    assert (rank, size, pdl) == (1, 2, False)
    assert torch.equal(recv["payload"], send["payload"].flip(-2) * 2)
    assert torch.equal(recv["stats"], send["stats"].flip(-2) + 1)
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        exchange({"payload": send["payload"][..., :4], "stats": send["stats"]}, recv)
