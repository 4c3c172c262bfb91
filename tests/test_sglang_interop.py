"""Interop with the system the seed layouts come from: sglang 0.5.23's own kernels.

sglang's `dcp_pack_a2a_send` writes into buffers allocated by the generated
`pynccl_a2a` and `flashinfer_mnnvl` modules, called exactly as sglang's
`comm.py` calls it for its a2a (pynccl) and fi_a2a (FlashInfer MNNVL) paths;
the bytes must equal what the generated pack writes.  sglang's
`dcp_lse_combine_triton` reading the exchanged buffers must agree with the
generated combine.  The kernels file is loaded by path (see
benchmarks/baselines.py); the test skips only when no copy of it can be found.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from conftest import (
    REPO_ROOT,
    assert_same_bytes,
    fill_bytes,
    generated_module,
    random_inputs,
    requires_interpreter,
    strided_inputs,
)

from layoutgen.dcp import reference
from layoutgen.dcp.tolerances import combine_error, lse_error

pytestmark = [requires_interpreter, pytest.mark.usefixtures("no_log_warnings")]


def _load_baselines():
    name = "layoutgen_benchmarks_baselines"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / "baselines.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sglang():
    baselines = _load_baselines()
    try:
        return baselines.load_sglang_dcp_kernels()
    except FileNotFoundError as missing:
        pytest.skip(f"sglang's dcp_kernels.py is not available: {missing}")


def _lse_pack_dim(dtype: torch.dtype) -> int:
    """sglang's `lpd`: output-dtype elements per float32 LSE word."""
    return 4 // dtype.itemsize


def _sglang_pack_pynccl(sglang, out, lse, bufs):
    # sglang/srt/layers/dcp/comm.py, dcp_a2a_lse_reduce: send_combined [N, B_max, H/N, D + lpd].
    send_combined = bufs.tensors["payload"]
    D = out.shape[-1]
    lpd = _lse_pack_dim(out.dtype)
    send_words = send_combined.view(torch.float32)
    sglang.dcp_pack_a2a_send(out, lse, send_combined[:, :, :, :D], send_words[:, :, :, D // lpd])


def _sglang_pack_flashinfer(sglang, out, lse, bufs):
    # comm.py, _dcp_fi_a2a_lse_reduce: partial_o [B, H/N, N, D], softmax_stats [B, H/N, N, 2].
    partial_o, softmax_stats = bufs.tensors["payload"], bufs.tensors["stats"]
    sglang.dcp_pack_a2a_send(out, lse, partial_o.permute(2, 0, 1, 3), softmax_stats[..., 0].permute(2, 0, 1))


def _sglang_receive_views(spec_name, recv, B):
    """The views sglang hands to dcp_lse_combine_triton on the receive side."""
    D = recv.D
    if spec_name == "pynccl_a2a":
        recv_combined = recv.tensors["payload"]
        lpd = _lse_pack_dim(recv.dtype)
        return recv_combined[:, :B, :, :D], recv_combined.view(torch.float32)[:, :B, :, D // lpd]
    o_out, stats_out = recv.tensors["payload"], recv.tensors["stats"]
    return o_out.permute(2, 0, 1, 3)[:, :B], stats_out[..., 0].permute(2, 0, 1)[:, :B]


SGLANG_PACK = {"pynccl_a2a": _sglang_pack_pynccl, "flashinfer_mnnvl": _sglang_pack_flashinfer}
# (N, B, B_max, H/N, D, dtype, lse strides); D % lpd == 0 as sglang requires.
PACK_PROBLEMS = (
    (2, 4, 4, 8, 16, torch.bfloat16, "contiguous"),
    (4, 1, 3, 3, 40, torch.float16, "lse_transposed"),
    (3, 2, 5, 1, 10, torch.float32, "contiguous"),
    (1, 3, 3, 2, 24, torch.bfloat16, "lse_transposed"),
)


@pytest.mark.parametrize("problem", PACK_PROBLEMS, ids=lambda p: f"N{p[0]}-B{p[1]}-Bmax{p[2]}-h{p[3]}-D{p[4]}-{p[5]}")
@pytest.mark.parametrize("spec_name", sorted(SGLANG_PACK))
def test_sglang_pack_writes_the_bytes_our_pack_writes(spec_name, problem, sglang, generator):
    N, B, B_max, heads_per_peer, D, dtype, strides = problem
    module = generated_module(spec_name)
    H = N * heads_per_peer
    out, lse = strided_inputs(*random_inputs(B, H, D, dtype, generator), strides)
    ours = fill_bytes(module.alloc(N, B_max, H, D, dtype))
    theirs = fill_bytes(module.alloc(N, B_max, H, D, dtype))
    module.pack(out, lse, ours)
    SGLANG_PACK[spec_name](sglang, out, lse, theirs)
    assert_same_bytes(ours, theirs, f"{spec_name}: layoutgen vs sglang")


# Power-of-two D: sglang's combine tiles the whole head dim with one tl.arange.
COMBINE_PROBLEMS = ((3, 2, 4, 2, 16, torch.bfloat16), (2, 3, 3, 3, 64, torch.float16), (4, 1, 2, 1, 32, torch.float32))


@pytest.mark.parametrize(
    "problem", COMBINE_PROBLEMS, ids=lambda p: f"N{p[0]}-B{p[1]}-Bmax{p[2]}-h{p[3]}-D{p[4]}-{p[5]}"
)
@pytest.mark.parametrize("spec_name", sorted(SGLANG_PACK))
def test_sglang_combine_agrees_with_ours_after_sglang_pack(spec_name, problem, sglang, generator):
    N, B, B_max, heads_per_peer, D, dtype = problem
    module = generated_module(spec_name)
    H = N * heads_per_peer
    outs, lses, sends = [], [], []
    for rank in range(N):
        out, lse = random_inputs(B, H, D, dtype, generator)
        lse[0, rank % H] = float("-inf")  # sglang's combine also treats -inf as empty (finite payload)
        outs.append(out)
        lses.append(lse)
        bufs = fill_bytes(module.alloc(N, B_max, H, D, dtype))
        SGLANG_PACK[spec_name](sglang, out, lse, bufs)
        sends.append(bufs)
    scale = max(float(o.abs().max()) for o in outs)
    for rank, recv in enumerate(reference.exchange(sends)):
        for base in ("e", "2"):
            want, want_lse = reference.merge_shards(outs, lses, rank, base)
            ours, ours_lse = module.combine(recv, B, lse_base=base, return_lse=True)
            recv_output, recv_lse = _sglang_receive_views(spec_name, recv, B)
            # sglang writes its LSE output with the strides of recv_lse, so give it a dense copy.
            theirs, theirs_lse = sglang.dcp_lse_combine_triton(
                recv_output, recv_lse.contiguous(), is_lse_base_on_e=base == "e", return_lse=True
            )
            assert combine_error(ours, want, scale) <= 1.0
            assert combine_error(theirs, want, scale) <= 1.0, "sglang's own combine vs the float64 merge"
            assert combine_error(ours, theirs.to(torch.float64), scale) <= 1.0
            assert lse_error(ours_lse, want_lse) <= 1.0 and lse_error(theirs_lse, want_lse) <= 1.0


def test_loader_names_the_missing_file(tmp_path, monkeypatch):
    baselines = _load_baselines()
    monkeypatch.setenv(baselines.SGLANG_DCP_KERNELS_ENV, str(tmp_path / "nowhere.py"))
    with pytest.raises(FileNotFoundError, match=r"nowhere\.py"):
        baselines.load_sglang_dcp_kernels()
    not_kernels = tmp_path / "other.py"
    not_kernels.write_text("x = 1\n")
    with pytest.raises(ImportError, match="does not define dcp_pack_a2a_send"):
        baselines.load_sglang_dcp_kernels(not_kernels)
