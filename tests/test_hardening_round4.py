"""Fourth hardening pass, from an adversarial review of the runtime API: each test is a defect a reviewer
hit, fixed.  Kernel cases run under the Triton interpreter; torch.compile cases use the eager backend (the
custom ops' real implementations run the kernels)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import fill_bytes, requires_interpreter

import layoutgen
from layoutgen.dcp import combine_plan, pack_plan, reference
from layoutgen.ulysses.distributed import UlyssesExchange

pytestmark = [
    requires_interpreter,
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.usefixtures("fresh_dynamo_and_plans"),
]

N, B_MAX, H, D = 2, 4, 8, 16


def partials(B: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, D, generator=generator).to(torch.bfloat16), torch.randn(B, H, generator=generator)


def compiled(function: Any, **options: Any) -> Any:
    return torch.compile(function, fullgraph=True, backend="eager", **options)


# --- pack: lse and max_sum together ------------------------------------------------------------------------


def test_lse_and_max_sum_together_are_refused_on_every_call() -> None:
    module = layoutgen.load("pynccl_a2a")
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16, device="cpu")
    out, lse = partials(3)
    maximum, total = torch.randn(3, H), 1 + torch.rand(3, H)
    module.pack(out, None, bufs, max_sum=(maximum, total))  # plans (max, sum) for these shapes
    for _ in range(2):  # the cached plan of the valid call must not let the pair through
        with pytest.raises(TypeError, match="pass exactly one of lse"):
            module.pack(out, lse, bufs, max_sum=(maximum, total))
    with pytest.raises(TypeError, match="pass exactly one of lse"):
        module._dispatch.pack_plan(out, lse, bufs, max_sum=(maximum, total))


def test_an_exchange_refuses_lse_and_max_sum_after_a_valid_call(one_rank_group: None) -> None:
    exchange = layoutgen.DcpExchange("pynccl_a2a", None, B_max=B_MAX, H=H, D=D, dtype=torch.bfloat16, device="cpu")
    out, lse = partials(3)
    maximum, total = torch.randn(3, H), 1 + torch.rand(3, H)
    exchange(out, max_sum=(maximum, total))
    with pytest.raises(TypeError, match="pass exactly one of lse"):
        exchange(out, lse, max_sum=(maximum, total))


# --- exchange into its own send buffers --------------------------------------------------------------------


@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "vllm_a2a_fp8", "ulysses_qkv_gqa"])
def test_exchanging_a_buffer_into_itself_is_refused(spec_name: str) -> None:
    # all_to_all_single from a buffer into itself gives some rank another rank's half-overwritten chunk.
    module = layoutgen.load(spec_name)
    extra: dict[str, Any] = {"H_kv": 2} if module.SPEC.family == "ulysses" else {}
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16, device="cpu", **extra)
    with pytest.raises(ValueError, match=r"send buffer '\w+' shares memory with receive buffer"):
        module.exchange(bufs, bufs)


# --- the combine op's out_lse ------------------------------------------------------------------------------


def test_the_combine_op_refuses_an_out_lse_over_out_or_the_buffers() -> None:
    module = layoutgen.load("pynccl_a2a")
    send = [module.alloc(N, B_MAX, H, D, torch.bfloat16, device="cpu") for _ in range(N)]
    for rank in range(N):
        module.pack(*partials(3, rank), send[rank])
    recv = reference.exchange(send)[0]
    tensors = list(recv.tensors.values())
    before = recv.tensors["payload"].clone()
    out = torch.empty(3, H // N, D, dtype=torch.bfloat16)
    over_out = out.view(-1)[: 3 * (H // N) * 2].view(torch.float32).view(3, H // N)
    over_payload = recv.tensors["payload"].view(-1)[: 3 * (H // N) * 2].view(torch.float32).view(3, H // N)
    for out_lse in (over_out, over_payload):
        with pytest.raises(ValueError, match="out_lse must not share memory with out or the buffers"):
            torch.ops.layoutgen.combine(tensors, out, out_lse, module.__name__, N, B_MAX, H, D, 3, "e", [])
    assert torch.equal(before.view(torch.uint8), recv.tensors["payload"].view(torch.uint8))


# --- torch.compile ----------------------------------------------------------------------------------------


def test_a_compiled_step_with_dynamic_shapes_and_scales_matches_eager() -> None:
    # Under dynamic shapes the tracer holds symbols for B and scale: checks on them must not break the graph.
    module = layoutgen.load("pynccl_a2a")
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16, device="cpu")

    def step(out: torch.Tensor, lse: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        module.pack(out, lse, bufs)
        return module.combine(bufs, out.shape[0], return_lse=True, scale=scale)

    dynamic = compiled(step, dynamic=True)
    varying_scale = compiled(step)
    for B, scale in ((3, 0.5), (1, 0.25), (4, 2.0)):
        out, lse = partials(B, B)
        want, want_lse = step(out, lse, scale)
        for function in (dynamic, varying_scale):
            got, got_lse = function(out, lse, scale)
            assert torch.equal(got, want) and torch.equal(got_lse, want_lse)
    with pytest.raises(ValueError, match="scale must be a finite number"):
        varying_scale(*partials(3), float("nan"))


@pytest.mark.parametrize(
    ("B", "return_lse", "message"),
    [(-1, False, r"B must be an int in \[0, B_max=4\]; got -1"), (3, 1, "return_lse must be a bool; got int")],
)
def test_compiled_combine_checks_b_and_return_lse(B: Any, return_lse: Any, message: str) -> None:
    module = layoutgen.load("pynccl_a2a")
    bufs = fill_bytes(module.alloc(N, B_MAX, H, D, torch.bfloat16, device="cpu"), 0)
    with pytest.raises(Exception, match=message):  # raised while tracing: torch wraps it, keeping the words
        compiled(lambda: module.combine(bufs, B, return_lse=return_lse))()


def test_compiled_calls_name_out_when_its_dtype_is_wrong() -> None:
    module = layoutgen.load("pynccl_a2a")
    bufs = fill_bytes(module.alloc(N, B_MAX, H, D, torch.bfloat16, device="cpu"), 0)
    lse = torch.randn(3, H)
    with pytest.raises(TypeError, match=r"out must be torch.bfloat16 \(the buffers' dtype\)"):
        compiled(lambda out: module.pack(out, lse, bufs))(torch.randn(3, H, D, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"out must have shape \[3, 4, 16\], dtype torch.bfloat16"):
        compiled(lambda out: module.combine(bufs, 3, out=out))(torch.empty(3, H // N, D))


def test_sources_that_require_grad_are_refused_in_grad_mode_eager_and_compiled() -> None:
    dcp = layoutgen.load("pynccl_a2a")
    bufs = dcp.alloc(N, B_MAX, H, D, torch.bfloat16, device="cpu")
    out, lse = partials(3)
    out.requires_grad_(True)
    ulysses = layoutgen.load("ulysses_qkv_gqa")
    send = ulysses.alloc(N, 3, 4, D, torch.bfloat16, device="cpu", H_kv=2)
    q = torch.randn(3, 4, D, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(3, 2, D, dtype=torch.bfloat16) for _ in range(2))
    calls = [
        ("pack: out requires grad", lambda: dcp.pack(out, lse, bufs)),
        ("pack: max_sum\\[1\\] requires grad", lambda: dcp.pack(out.detach(), None, bufs, max_sum=(lse, lse.exp().requires_grad_()))),
        ("scatter: q requires grad", lambda: ulysses.scatter(q, k, v, send)),
    ]  # fmt: skip
    for message, call in calls:
        with pytest.raises(RuntimeError, match=message):
            call()
        torch._dynamo.reset()
        with pytest.raises(Exception, match=message):
            compiled(call)()
        with torch.no_grad():
            call()  # inference: accepted


def test_a_compiled_exchange_plans_once_per_shape(one_rank_group: None, monkeypatch: pytest.MonkeyPatch) -> None:
    plans = {"pack": 0, "combine": 0}

    def counted(kind: str, function: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            plans[kind] += 1
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(pack_plan, "plan_pack", counted("pack", pack_plan.plan_pack))
    monkeypatch.setattr(combine_plan, "plan_combine", counted("combine", combine_plan.plan_combine))
    exchange = layoutgen.DcpExchange("pynccl_a2a", None, B_max=B_MAX, H=H, D=D, dtype=torch.bfloat16, device="cpu")
    out, lse = partials(3)
    want = exchange(out, lse)
    function = compiled(lambda out, lse: exchange(out, lse))
    for _ in range(3):
        assert torch.equal(function(out, lse), want)
    assert plans == {"pack": 1, "combine": 2}  # combine's second key: the traced call passes its own out


# --- numerics, and the exchange at B = 0 -------------------------------------------------------------------


def test_one_peer_of_a_max_sum_spec_returns_the_partial_within_one_unit() -> None:
    # README guarantee 4: exact for LSE specs; a (max, sum) spec's weight sum * (1/sum) may round by one unit.
    module = layoutgen.load("trtllm_helix_nccl")
    generator = torch.Generator().manual_seed(0)
    out = torch.randn(4, 4, D, generator=generator)
    maximum, total = torch.randn(4, 4, generator=generator), 1 + 5 * torch.rand(4, 4, generator=generator)
    bufs = module.alloc(1, 4, 4, D, torch.float32, device="cpu")
    module.pack(out, None, bufs, max_sum=(maximum, total))
    merged, _ = module.combine(bufs, 4)
    unit = torch.finfo(torch.float32).eps * out.abs()
    assert bool(((merged - out).abs() <= unit).all())


def test_an_exchange_of_no_rows_checks_scale_and_return_lse(one_rank_group: None) -> None:
    exchange = layoutgen.DcpExchange("pynccl_a2a", None, B_max=B_MAX, H=H, D=D, dtype=torch.bfloat16, device="cpu")
    out, lse = partials(0)
    for options, error, message in [
        ({"scale": float("nan")}, ValueError, "scale must be a finite number"),
        ({"scale": "x"}, TypeError, "scale must be a Python float"),
        ({"return_lse": 7}, TypeError, "return_lse must be a bool"),
    ]:
        with pytest.raises(error, match=message):
            exchange(out, lse, **options)
    merged, merged_lse = exchange(out, lse, return_lse=True)
    assert merged.shape == (0, H, D) and merged_lse.shape == (0, H)


# --- smaller refusals --------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "deepspeed_ulysses"])
def test_alloc_refuses_devices_the_kernels_cannot_run_on(spec_name: str) -> None:
    module = layoutgen.load(spec_name)
    extra: dict[str, Any] = {"B": 1} if module.SPEC.family == "ulysses" else {}
    with pytest.raises(ValueError, match=r"alloc: layoutgen's kernels run on CUDA devices.*got device meta"):
        module.alloc(N, B_MAX, H, D, torch.bfloat16, "meta", **extra)


def test_layoutgen_config_names_a_kernel_no_family_has(monkeypatch: pytest.MonkeyPatch) -> None:
    module = layoutgen.load("pynccl_a2a")
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16, device="cpu")
    monkeypatch.setenv("LAYOUTGEN_CONFIG", '{"comb": {"num_warps": 4}}')
    with pytest.raises(ValueError, match=r"LAYOUTGEN_CONFIG names kernel 'comb', which no family has.*combine"):
        module.pack(*partials(3), bufs)


def test_a_forced_fp8_pack_config_that_splits_scale_blocks_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    module = layoutgen.load("pynccl_a2a_fp8")
    bufs = module.alloc(N, B_MAX, H, 64, torch.bfloat16, device="cpu")
    monkeypatch.setenv("LAYOUTGEN_CONFIG", '{"pack": {"block_dim": 8}}')
    out = torch.randn(3, H, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"LAYOUTGEN_CONFIG forces an invalid pack config: .*block_dim >= 64"):
        module.pack(out, torch.randn(3, H), bufs)


def test_an_ulysses_exchange_refuses_h_kv_for_a_spec_without_such_tensors(one_rank_group: None) -> None:
    with pytest.raises(TypeError, match="has no H_kv-headed tensors: leave H_kv out"):
        UlyssesExchange("deepspeed_ulysses", None, S_max=4, H=4, D=D, dtype=torch.bfloat16, device="cpu", H_kv=3)


def test_an_ulysses_exchange_of_two_directions_says_so() -> None:
    module = layoutgen.load("ulysses_qkv_gqa")
    send = module.alloc(N, 3, 4, D, torch.bfloat16, device="cpu", H_kv=2)
    recv = module.alloc_out(N, 3, 4, D, torch.bfloat16, device="cpu", H_kv=2)
    with pytest.raises(ValueError, match="send holds the to_attention wire and recv the from_attention wire"):
        module.exchange(send, recv)


def test_load_refuses_what_is_not_a_generated_module(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"load\(\) takes a bundled spec name .* got int"):
        layoutgen.load(3)  # type: ignore[arg-type]
    script = tmp_path / "script.py"
    marker = tmp_path / "ran"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(ValueError, match="is not a module generated by layoutgen"):
        layoutgen.load(script)
    assert not marker.exists()  # refused before anything in it ran
