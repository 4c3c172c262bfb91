"""End-to-end DCP decode step across ranks: pack + all_to_all_single + combine, layoutgen vs sglang.

One process per GPU (NCCL), or per CPU rank with gloo (`--cpu`, a smoke test under the Triton
interpreter whose times mean nothing).  Per (spec, B) every rank runs both steps on the same static
buffers and the same NCCL calls:

* ours: `layoutgen.DcpExchange` (generated pack, one `all_to_all_single` per buffer, generated combine);
* sglang 0.5.23: its `dcp_pack_a2a_send` into those buffers, the same `exchange`, its
  `dcp_lse_combine_triton` on the receive views (kernels loaded by path, see `baselines.py`).

Both results are checked on every rank against the float64 merge of all ranks' shards before timing.
GPU times are CUDA-graph replay medians of whole steps (the graph holds `--calls` steps), taken on
rank 0 after a barrier; the collectives keep the ranks in step.  Rank 0 writes JSON and a markdown
table with the device, NCCL version and `nvidia-smi topo -m`.

Usage: python benchmarks/bench_dcp_e2e.py --out benchmarks/results [--world-size N]
       TRITON_INTERPRET=1 python benchmarks/bench_dcp_e2e.py --cpu --world-size 2 --out /tmp/e2e
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))

SPECS = ("pynccl_a2a", "pynccl_a2a_aligned", "vllm_a2a")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _time_steps(step: Any, cpu: bool, calls: int, replays: int) -> float:
    """Median µs per step."""
    if cpu:
        samples = []
        for _ in range(replays):
            start = time.perf_counter()
            step()
            samples.append((time.perf_counter() - start) * 1e6)
        return statistics.median(samples)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            step()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        dist.barrier()
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) * 1000 / calls)
    return statistics.median(samples)


def _measure_point(
    module: Any,
    exchange: Any,
    sglang: Any,
    B: int,
    rank: int,
    world: int,
    generator: torch.Generator,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Check both steps against the float64 merge of every rank's shard, then time them."""
    from layoutgen.dcp import reference
    from layoutgen.dcp.tolerances import combine_error

    H, D, dtype, device = args.H, args.D, torch.bfloat16, exchange.device
    out = torch.randn(B, H, D, generator=generator).to(dtype).to(device)
    lse = (torch.randn(B, H, generator=generator) * 4).to(device)
    gathered_out = [torch.empty(B, H, D, device=device) for _ in range(world)]
    gathered_lse = [torch.empty(B, H, device=device) for _ in range(world)]
    dist.all_gather(gathered_out, out.float())
    dist.all_gather(gathered_lse, lse)
    want, _ = reference.merge_shards([o.cpu() for o in gathered_out], [x.cpu() for x in gathered_lse], rank)
    scale = max(float(o.abs().max()) for o in gathered_out)
    merged_out = torch.empty(B, H // world, D, dtype=dtype, device=device)
    send, recv = exchange.batch_buffers(B)

    def ours() -> None:
        exchange(out, lse, merged_out=merged_out)

    def theirs() -> torch.Tensor:
        sglang.dcp_pack_a2a_send(out, lse, send.payload_view(B), send.lse_view(B))
        module.exchange(send, recv, None)
        return sglang.dcp_lse_combine_triton(recv.payload_view(B), recv.lse_view(B))[0]

    ours()
    errors = {"layoutgen": combine_error(merged_out.cpu(), want, scale)}
    variants: dict[str, Any] = {"layoutgen": ours}
    if sglang is not None:
        errors["sglang"] = combine_error(theirs().cpu(), want, scale)
        variants["sglang"] = theirs
    bad = {name: ratio for name, ratio in errors.items() if ratio > 1.0}
    if bad:
        raise AssertionError(f"rank {rank}: {module.SPEC_NAME} B={B} outside tolerance: {bad}")
    row: dict[str, Any] = {"spec": module.SPEC_NAME, "N": world, "B": B, "H": H, "D": D}
    for name, step in variants.items():
        row[f"{name}_us"] = _time_steps(step, args.cpu, args.calls, args.replays)
    return row


def _worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    if args.cpu:
        os.environ["TRITON_INTERPRET"] = "1"
    from baselines import load_sglang_dcp_kernels

    import layoutgen

    backend = "gloo" if args.cpu else "nccl"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    device = torch.device("cpu") if args.cpu else torch.device("cuda", rank)
    if not args.cpu:
        torch.cuda.set_device(device)
    try:
        sglang = load_sglang_dcp_kernels()
    except FileNotFoundError as error:
        if rank == 0:
            print(f"sglang baseline unavailable: {error}", file=sys.stderr)
        sglang = None
    generator = torch.Generator().manual_seed(1234 + rank)
    rows = []
    for spec in args.specs:
        module = layoutgen.load(spec)
        exchange = layoutgen.DcpExchange(
            module, None, B_max=max(args.batches), H=args.H, D=args.D, dtype=torch.bfloat16, device=device
        )
        for B in args.batches:
            row = _measure_point(module, exchange, sglang, B, rank, world, generator, args)
            rows.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
    if rank == 0:
        _write(rows, args, world)
    dist.barrier()
    dist.destroy_process_group()


def _environment(cpu: bool) -> dict[str, Any]:
    import triton

    import layoutgen

    env: dict[str, Any] = {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "layoutgen": layoutgen.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if cpu:
        env["device"] = "cpu (gloo, Triton interpreter: smoke test, times are meaningless)"
        return env
    env["device"] = torch.cuda.get_device_name()
    env["cuda"] = torch.version.cuda
    env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    env["nvlink_multicast"] = os.environ.get("NCCL_NVLS_ENABLE", "unset")
    try:
        env["topology"] = subprocess.run(
            ["nvidia-smi", "topo", "-m"], capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        env["topology"] = "nvidia-smi not found"
    return env


def _write(rows: list[dict[str, Any]], args: argparse.Namespace, world: int) -> None:
    env = _environment(args.cpu)
    result = {"environment": env, "rows": rows}
    lines = [
        f"# DCP decode step end to end, N = {world}: layoutgen vs sglang 0.5.23",
        "",
        f"{env['device']}; torch {env['torch']}, triton {env['triton']}, layoutgen {env['layoutgen']}"
        + (f", CUDA {env['cuda']}, NCCL {env['nccl']}" if "nccl" in env else "")
        + f"; {env['date']}. Step = pack + all_to_all_single per buffer + combine, "
        + ("wall clock, eager." if args.cpu else f"CUDA-graph replay median over {args.calls} steps per graph."),
        "",
        "| spec | N | B | H | D | layoutgen µs | sglang µs | speed-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ours, theirs = row["layoutgen_us"], row.get("sglang_us")
        lines.append(
            f"| {row['spec']} | {row['N']} | {row['B']} | {row['H']} | {row['D']} | {ours:.2f} | "
            + (f"{theirs:.2f} | {theirs / ours:.2f}x |" if theirs else "– | – |")
        )
    if "topology" in env:
        lines += ["", "```", env["topology"].rstrip(), "```"]
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"bench_dcp_e2e_N{world}" + ("_cpu" if args.cpu else "")
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--world-size", type=int, default=None, help="ranks (default: every visible GPU)")
    parser.add_argument("--cpu", action="store_true", help="gloo on CPU under the Triton interpreter (smoke test)")
    parser.add_argument("--specs", nargs="*", default=list(SPECS))
    parser.add_argument("--batches", nargs="*", type=int, default=None)
    parser.add_argument("--H", type=int, default=None)
    parser.add_argument("--D", type=int, default=None)
    parser.add_argument("--calls", type=int, default=20, help="steps per captured graph")
    parser.add_argument("--replays", type=int, default=20)
    args = parser.parse_args()
    if args.cpu:
        args.batches = args.batches or [1, 3]
        args.H, args.D = args.H or 8, args.D or 16
        world = args.world_size or 2
    else:
        if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
            print("bench_dcp_e2e.py needs >= 2 CUDA GPUs (or --cpu for the smoke test)", file=sys.stderr)
            return 2
        # NVLink multicast stays off: it can take a shared host's GPUs out of service.
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        args.batches = args.batches or [1, 8, 64, 256]
        args.H, args.D = args.H or 128, args.D or 512
        world = args.world_size or torch.cuda.device_count()
    if args.H % world:
        print(f"H={args.H} is not divisible by the world size {world}", file=sys.stderr)
        return 2
    mp.spawn(_worker, args=(world, _free_port(), args), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
