"""DcpExchange over NCCL, one GPU per rank: the CPU checks, plus CUDA-graph capture and replay of the
whole pack -> all_to_all_single -> combine step."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the shared checks live in tests/
import test_distributed as shared

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.multigpu,
    pytest.mark.skipif(
        torch.cuda.device_count() < 2 or not dist.is_nccl_available(),
        reason=f"needs >= 2 CUDA GPUs and NCCL; found {torch.cuda.device_count()} GPU(s)",
    ),
]


def check_graph_replay(checks: shared.Checks, spec: str, N: int, device: torch.device) -> None:
    """Capture one step at B=3 and replay it on fresh inputs copied into the captured tensors."""
    from layoutgen import DcpExchange

    H, B = 3 * N, 3
    exchange = DcpExchange(spec, None, B_max=shared.B_MAX, H=H, D=shared.D, dtype=torch.bfloat16, device=device)
    outs, lses = shared.make_partials(N, B, H, torch.bfloat16, device, seed=7, empty_shards=False)
    static_out, static_lse = outs[checks.rank].clone(), lses[checks.rank].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: validation, Triton compilation, NCCL communicator set-up
        exchange(static_out, static_lse, return_lse=True)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        merged, merged_lse = exchange(static_out, static_lse, return_lse=True)
    for replay, empty_shards in enumerate((False, True)):
        outs, lses = shared.make_partials(N, B, H, torch.bfloat16, device, seed=20 + replay, empty_shards=empty_shards)
        static_out.copy_(outs[checks.rank])
        static_lse.copy_(lses[checks.rank])
        graph.replay()
        torch.cuda.synchronize()
        checks.merged_matches(f"{spec} graph replay {replay}", merged, merged_lse, outs, lses, N, "e")


def _gpu_worker(rank: int, N: int, store: str) -> None:
    os.environ.pop("TRITON_INTERPRET", None)  # real kernels, even when pytest itself runs interpreted
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl", init_method=f"file://{store}", rank=rank, world_size=N, timeout=timedelta(seconds=300), device_id=device
    )
    try:
        failures = shared.run_checks(rank, N, device)
        checks = shared.Checks(rank)
        for spec in shared.ALL_TO_ALL_SPECS:
            check_graph_replay(checks, spec, N, device)
        failures += checks.failures
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if failures:
        raise AssertionError("\n".join(failures))


@pytest.mark.parametrize("N", [n for n in (2, 3, 4) if n <= torch.cuda.device_count()] or [2])
def test_exchange_over_nccl(N: int, tmp_path: Path) -> None:
    mp.spawn(_gpu_worker, args=(N, str(tmp_path / "store")), nprocs=N, join=True)
