"""The whole exchange in one process: N ranks pack -> reference exchange -> combine on every rank
equals the merge computed directly from all ranks' unexchanged shards."""

from __future__ import annotations

import pytest
import torch
from conftest import fill_bytes, random_inputs, requires_interpreter, strided_inputs

from layoutgen.dcp import reference
from layoutgen.dcp.tolerances import combine_error, lse_error

pytestmark = [requires_interpreter, pytest.mark.usefixtures("no_log_warnings")]

SPEC_NAMES = ("flashinfer_mnnvl", "npu_like", "pynccl_a2a", "pynccl_a2a_aligned", "vllm_a2a")
# (N, B, B_max, H/N, D, dtype, input strides)
PROBLEMS = (
    (3, 2, 4, 3, 24, torch.bfloat16, "all"),
    (4, 3, 3, 1, 10, torch.float32, "out_heads_outer"),
)


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"N{p[0]}-B{p[1]}-Bmax{p[2]}-h{p[3]}-D{p[4]}-{p[6]}")
@pytest.mark.parametrize("spec_name", SPEC_NAMES)
def test_pack_exchange_combine_equals_the_merge_of_all_shards(spec_name, problem, spec_modules, generator):
    N, B, B_max, heads_per_peer, D, dtype, strides = problem
    module = spec_modules[spec_name]
    H = N * heads_per_peer
    outs, lses = [], []
    for _ in range(N):
        out, lse = random_inputs(B, H, D, dtype, generator)
        outs.append(out)
        lses.append(lse)
    lses[0][0, 0] = float("-inf")  # rank 0 saw no keys for this (row, head)
    outs[0][0, 0] = float("nan")
    lses[1][B - 1, H - 1] = float("nan")
    for rank in range(N):  # one (row, head) where every rank is empty
        lses[rank][B - 1, 0] = float("-inf")
    sends = []
    for rank in range(N):
        bufs = fill_bytes(module.alloc(N, B_max, H, D, dtype))
        module.pack(*strided_inputs(outs[rank], lses[rank], strides), bufs)
        sends.append(bufs)
    received = reference.exchange(sends)
    for rank in range(N):
        for base in ("e", "2"):
            got, got_lse = module.combine(received[rank], B, lse_base=base, return_lse=True)
            want, want_lse = reference.merge_shards(outs, lses, rank, base)
            scale = max(float(torch.nan_to_num(o.double(), nan=0.0).abs().max()) for o in outs)
            assert combine_error(got, want, scale) <= 1.0, f"rank {rank}, base {base}"
            assert lse_error(got_lse, want_lse) <= 1.0, f"rank {rank}, base {base}"
        if rank == 0:  # global head 0 is rank 0's local head 0, empty on every rank in row B - 1
            assert torch.equal(got[B - 1, 0], torch.zeros(D, dtype=dtype))
            assert got_lse[B - 1, 0] == float("-inf")
