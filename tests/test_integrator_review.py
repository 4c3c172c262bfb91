"""What an engine integrator's review found (thirty-second pass): NumPy integers taken as sizes, errors that
name the real difference, and the docstrings that say what pack and combine do with (max, sum) and fp8."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import generated_module, requires_interpreter
from test_cli_polish import run_main

from layoutgen.dcp import reference
from layoutgen.ulysses.layout import Shape as UlyssesShape

np = pytest.importorskip("numpy")

N, H, D, B_MAX = 2, 6, 24, 5  # heads per peer 3 (odd), D not a power of two


@pytest.fixture(autouse=True)
def _clean(clean_dispatch: object) -> None:
    """No cached plans from other tests."""


def test_alloc_takes_numpy_integers_as_ints() -> None:
    module = generated_module("vllm_a2a")
    bufs = module.alloc(np.int64(N), np.int32(B_MAX), np.int64(H), np.uint16(D), torch.bfloat16)
    assert (bufs.N, bufs.B_max, bufs.H, bufs.D) == (N, B_MAX, H, D)
    assert all(type(value) is int for value in (bufs.N, bufs.B_max, bufs.H, bufs.D))
    shapes = {name: tuple(t.shape) for name, t in bufs.tensors.items()}
    assert shapes == {name: tuple(t.shape) for name, t in module.alloc(N, B_MAX, H, D, torch.bfloat16).tensors.items()}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (np.bool_(True), "N must be an int, got numpy.bool"),
        (np.float64(2.0), "N must be an int, got numpy.float64"),
        (torch.tensor(2), "N must be an int, got torch.Tensor"),
        (True, "N must be an int, got bool"),
    ],
)
def test_alloc_still_refuses_what_is_not_an_integer(value: object, message: str) -> None:
    with pytest.raises(TypeError, match=re.escape(message)):
        generated_module("vllm_a2a").alloc(value, B_MAX, H, D, torch.bfloat16)


@requires_interpreter
def test_combine_takes_a_numpy_batch_and_gives_the_same_bits() -> None:
    module = generated_module("pynccl_a2a")
    B = 3
    torch.manual_seed(5)
    outs = [torch.randn(B, H, D, dtype=torch.bfloat16) for _ in range(N)]
    lses = [torch.randn(B, H) for _ in range(N)]
    send = [module.alloc(N, B_MAX, H, D, torch.bfloat16) for _ in range(N)]
    for rank in range(N):
        module.pack(outs[rank], lses[rank], send[rank])
    recv = reference.exchange(send)
    want, want_lse = module.combine(recv[0], B, return_lse=True)
    for batch in (np.int64(B), np.int32(B)):
        got, got_lse = module.combine(recv[0], batch, return_lse=True)
        assert got.shape == (B, H // N, D) and got_lse is not None
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
        assert torch.equal(got_lse.view(torch.int32), want_lse.view(torch.int32))
    # B = 0 as a NumPy integer: an empty result, as with 0.
    empty, _ = module.combine(recv[0], np.int64(0))
    assert empty.shape == (0, H // N, D)
    assert recv[0].payload_view(np.int64(2)).shape == recv[0].payload_view(2).shape


@requires_interpreter
@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"return_lse": np.bool_(True)}, TypeError, "return_lse must be a bool; got numpy.bool"),
        ({"B": np.float64(2.0)}, ValueError, "B must be an int in [0, B_max=5]; got np.float64(2.0)"),
        ({"B": np.int64(6)}, ValueError, "B must be an int in [0, B_max=5]; got 6"),
    ],
)
def test_combine_names_numpy_values_it_refuses(changes: dict[str, object], error: type, message: str) -> None:
    module = generated_module("pynccl_a2a")
    arguments: dict[str, object] = {"B": 2, **changes}
    batch = arguments.pop("B")
    with pytest.raises(error, match=re.escape(message)):
        module.combine(module.alloc(N, B_MAX, H, D, torch.bfloat16), batch, **arguments)


def test_ulysses_shape_takes_numpy_integers() -> None:
    shape = UlyssesShape.of(N=np.int64(2), S_local=np.int32(3), H=np.int64(4), H_kv=np.int64(2), D=np.int64(8),
                            dtype=torch.bfloat16, B=np.int64(1))  # fmt: skip
    assert all(type(getattr(shape, name)) is int for name in ("N", "S_local", "H", "H_kv", "D", "B"))
    module = generated_module("ulysses_qkv_gqa")
    bufs = module.alloc(np.int64(2), np.int64(3), np.int64(4), np.int64(8), torch.bfloat16, H_kv=np.int64(2))
    assert (bufs.N, bufs.S_local) == (2, 3)


def test_exchange_objects_take_numpy_sizes(one_rank_group: None) -> None:
    from layoutgen import DcpExchange
    from layoutgen.ulysses.distributed import UlyssesExchange

    dcp = DcpExchange(
        "vllm_a2a", None, B_max=np.int64(4), H=np.int64(4), D=np.int64(16), dtype=torch.bfloat16, device="cpu"
    )
    assert (dcp.B_max, dcp.H, dcp.D) == (4, 4, 16) and type(dcp.B_max) is int
    ulysses = UlyssesExchange(
        "ulysses_qkv_gqa", S_max=np.int64(3), H=np.int64(4), H_kv=np.int64(2), D=np.int64(4), dtype=torch.bfloat16,
        device="cpu",
    )  # fmt: skip
    assert ulysses.S_max == 3 and type(ulysses.S_max) is int and ulysses.shape.H == 4


def test_exchange_names_the_field_send_and_receive_buffers_differ_in() -> None:
    module = generated_module("vllm_a2a")
    send = module.alloc(N, B_MAX, H, D, torch.bfloat16)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "send_bufs and recv_bufs must be allocated alike (the same N, B_max, H, D and dtype); they differ in "
            "dtype torch.bfloat16 vs torch.float16"
        ),
    ):
        module.exchange(send, module.alloc(N, B_MAX, H, D, torch.float16))
    with pytest.raises(ValueError, match=re.escape("they differ in B_max 5 vs 4, D 24 vs 8")):
        module.exchange(send, module.alloc(N, 4, H, 8, torch.bfloat16))


@pytest.mark.parametrize(
    ("spec", "hint"),
    [
        ("flashinfer_mnnvl", "with FlashInfer MNNVL's all-to-all: layoutgen.dcp.distributed.flashinfer_mnnvl_exchange"),
        ("trtllm_helix_native_v1", "with your transport's all-to-all (TensorRT-LLM helix's for its native layouts)"),
    ],
)
def test_an_external_spec_without_exchange_fn_gets_a_hint_for_its_own_layout(spec: str, hint: str) -> None:
    from layoutgen import DcpExchange

    with pytest.raises(ValueError) as refused:
        DcpExchange(spec, None, B_max=2, H=4, D=16, dtype=torch.bfloat16, device="cpu")
    message = str(refused.value)
    assert hint in message and "a group of one needs it too" in message
    if spec != "flashinfer_mnnvl":
        assert "flashinfer_mnnvl_exchange" not in message


def test_the_docstrings_say_the_base_of_a_packed_max_sum_and_what_combine_takes() -> None:
    lse_module, fp8_module = generated_module("pynccl_a2a"), generated_module("pynccl_a2a_fp8")
    for module in (lse_module, fp8_module):
        assert 'max + ln(sum), a base-e LSE: combine\n    them with lse_base="e"' in module.pack.__doc__
        assert "`out`: None (a new tensor) or a [B, H/N, D] tensor" in module.combine.__doc__
        assert "`config=None` takes the tuned config" in module.combine.__doc__
        assert "R * T after a pack of [R, T, H, D] out" in module.combine.__doc__
    assert "quantised" not in lse_module.pack.__doc__
    assert "each block of a row's D elements is stored as fp8 codes" in fp8_module.pack.__doc__
    assert "ln(sum)" not in generated_module("trtllm_helix_nccl").pack.__doc__


@requires_interpreter
def test_max_sum_packed_into_an_lse_spec_is_a_base_e_lse() -> None:
    """What the docstring says, as bits: the stored word is max + ln(sum), whatever base the caller meant."""
    module = generated_module("vllm_a2a")
    torch.manual_seed(7)
    out = torch.randn(2, H, D, dtype=torch.bfloat16)
    maximum, total = torch.randn(2, H), 1 + torch.rand(2, H)
    bufs = module.alloc(N, B_MAX, H, D, torch.bfloat16)
    module.pack(out, bufs=bufs, max_sum=(maximum, total))
    stored = bufs.word_view(2, 0)  # [N, B, H/N]
    expected = (maximum.double() + total.double().log()).float().view(2, N, H // N).transpose(0, 1)
    assert torch.equal(stored, expected)
    assert not torch.equal(
        stored, (maximum.double() + total.double().log2()).float().view(2, N, H // N).transpose(0, 1)
    )


@requires_interpreter
def test_dcp_exchange_under_fullgraph_takes_prepared_batches_and_names_an_unprepared_one(one_rank_group: None) -> None:
    from layoutgen import DcpExchange

    exchange = DcpExchange("pynccl_a2a", None, B_max=4, H=4, D=16, dtype=torch.bfloat16, device="cpu")
    exchange.prepare(np.int64(2), 3)
    compiled = torch.compile(lambda o, l: exchange(o, l, True), fullgraph=True, backend="aot_eager")
    torch.manual_seed(3)
    for B in (2, 3):
        out, lse = torch.randn(B, 4, 16, dtype=torch.bfloat16), torch.randn(B, 4)
        (got, got_lse), (want, want_lse) = compiled(out, lse), exchange(out, lse, True)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)) and torch.equal(got_lse, want_lse)
    with pytest.raises(Exception, match=re.escape("DcpExchange: B=1 has no views yet")) as refused:
        compiled(torch.randn(1, 4, 16, dtype=torch.bfloat16), torch.randn(1, 4))
    assert "exchange.prepare(1)" in str(refused.value)
    exchange.prepare()  # every B up to B_max
    assert sorted(exchange._views) == [1, 2, 3, 4]


@requires_interpreter
def test_ulysses_exchange_under_fullgraph_takes_prepared_lengths_and_names_an_unprepared_one(
    one_rank_group: None,
) -> None:
    from layoutgen.ulysses.distributed import UlyssesExchange

    exchange = UlyssesExchange("ulysses_qkv_gqa", S_max=4, H=2, H_kv=1, D=8, dtype=torch.float32, device="cpu")
    exchange.prepare(3)
    compiled = torch.compile(exchange.to_attention, fullgraph=True, backend="aot_eager")
    tensors = [torch.randn(3, heads, 8) for heads in (2, 1, 1)]
    got, want = compiled(*tensors), exchange.to_attention(*tensors)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    with pytest.raises(Exception, match=re.escape("UlyssesExchange: S_local=2 has no views yet")):
        compiled(*[torch.randn(2, heads, 8) for heads in (2, 1, 1)])
    exchange.prepare()
    assert sorted(exchange._views) == [(d, s) for d in ("from_attention", "to_attention") for s in (1, 2, 3, 4)]


def test_tune_refuses_dcp_s_batch_alias_for_a_ulysses_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--batch` is DCP's bucket (rows); a Ulysses spec's buckets are S_local: the alias must not pass for it."""
    common = ["--interpret", "--db", str(tmp_path), "--dry-run"]
    code, _, err = run_main(["tune", "--spec", "ulysses_qkv_gqa", "--batch", "4", *common], capsys, monkeypatch)
    flat = " ".join(err.split())
    assert code == 2 and "Traceback" not in err, err
    assert "--batch is the dcp family's name for its size buckets" in flat and "write --bucket V" in flat, flat
    code, out, err = run_main(["tune", "--spec", "ulysses_qkv_gqa", "--seq", "4", *common], capsys, monkeypatch)
    assert code == 0 and "S_local=4" in out, err
    code, out, err = run_main(["tune", "--spec", "pynccl_a2a", "--batch", "4", *common], capsys, monkeypatch)
    assert code == 0 and "B=4" in out, err


@requires_interpreter
def test_ulysses_exchange_refusals_name_the_call_made_and_the_sizes_it_was_built_for(one_rank_group: None) -> None:
    from layoutgen.ulysses.distributed import UlyssesExchange

    exchange = UlyssesExchange("ulysses_qkv_gqa", S_max=4, H=2, H_kv=1, D=8, dtype=torch.float32, device="cpu")
    shards = [torch.randn(3, heads, 8, dtype=torch.bfloat16) for heads in (2, 1, 1)]
    with pytest.raises(TypeError) as refused:
        exchange.to_attention(*shards)
    message = str(refused.value)
    assert message.startswith("to_attention: q must be torch.float32"), message
    assert "scatter" not in message and "built for dtype torch.float32, B=1, H=2, H_kv=1, D=8" in message
    with pytest.raises(ValueError, match=r"^from_attention: .*H=2, H_kv=1, D=8: build another for other sizes$"):
        exchange.from_attention(torch.randn(3, 1, 8))  # one head where this rank's block holds 2
    with pytest.raises(ValueError, match=r"^to_attention: q has no rows; a shard needs at least one"):
        exchange.to_attention(*[torch.randn(0, heads, 8) for heads in (2, 1, 1)])
    with pytest.raises(ValueError, match=r"^from_attention: out has no rows"):
        exchange.from_attention(torch.randn(0, 2, 8))
