"""GPU only: the exchange objects under torch.compile(fullgraph=True, inductor) on a one-rank NCCL group: a
prepared size gives eager's bits, an unprepared one raises naming it."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.filterwarnings("ignore::layoutgen.runtime.LayoutgenWarning"),
]


@pytest.fixture
def nccl_group_of_one() -> Iterator[None]:
    import torch.distributed as dist

    if not dist.is_nccl_available():
        pytest.skip("needs NCCL")
    torch.cuda.set_device(0)
    with tempfile.TemporaryDirectory() as directory:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        dist.init_process_group("nccl", init_method=f"file://{directory}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def test_dcp_exchange_compiles_whole_for_prepared_batches(nccl_group_of_one: None) -> None:
    from layoutgen import DcpExchange

    exchange = DcpExchange("vllm_a2a", None, B_max=64, H=32, D=512, dtype=torch.bfloat16, device="cuda")
    exchange.prepare(8, 64)
    compiled = torch.compile(lambda o, l: exchange(o, l, True), fullgraph=True)
    generator = torch.Generator().manual_seed(2)
    for B in (8, 64):
        out = torch.randn(B, 32, 512, generator=generator).to(torch.bfloat16).cuda()
        lse = (torch.randn(B, 32, generator=generator) * 3).cuda()
        (got, got_lse), (want, want_lse) = compiled(out, lse), exchange(out, lse, True)
        torch.cuda.synchronize()
        assert torch.equal(got, want) and torch.equal(got_lse, want_lse), B
    out, lse = torch.randn(5, 32, 512, device="cuda").to(torch.bfloat16), torch.randn(5, 32, device="cuda")
    with pytest.raises(Exception, match=re.escape("DcpExchange: B=5 has no views yet")):
        compiled(out, lse)


def test_ulysses_exchange_compiles_whole_for_prepared_lengths(nccl_group_of_one: None) -> None:
    from layoutgen.ulysses.distributed import UlyssesExchange

    exchange = UlyssesExchange("ulysses_qkv_gqa", S_max=512, H=32, H_kv=8, D=128, dtype=torch.bfloat16, device="cuda")
    exchange.prepare(128, 512)
    compiled = torch.compile(exchange.to_attention, fullgraph=True)
    for S_local in (128, 512):
        tensors = [torch.randn(S_local, heads, 128, device="cuda").to(torch.bfloat16) for heads in (32, 8, 8)]
        got, want = compiled(*tensors), exchange.to_attention(*tensors)
        torch.cuda.synchronize()
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), S_local
    with pytest.raises(Exception, match=re.escape("UlyssesExchange: S_local=7 has no views yet")):
        compiled(*[torch.randn(7, heads, 128, device="cuda").to(torch.bfloat16) for heads in (32, 8, 8)])
