"""The Ulysses family: the sequence-parallel all-to-all around attention (DeepSpeed-Ulysses, yunchang/xDiT).

N ranks each hold a sequence shard `x [S_local, H, D]` of every tensor (q, k, v before attention; the
attention output after it), all heads.  Attention needs the whole sequence for a block of heads, so an
all-to-all regroups: rank p receives, from every peer s, the rows of s's shard for heads
`[p*H/N, (p+1)*H/N)` and lays them out as `[S = N*S_local, H/N, D]`, row `s*S_local + i` being row i of
peer s, in whatever layout its attention kernel wants.  After attention the same regrouping runs
backwards.  Four kernels per spec, all pure data movement (byte-exact against `reference`):

* `scatter`      shards (local layout) -> send buffers             before attention
* `gather`       receive buffers -> attention layout
* `scatter_out`  attention output (attention layout) -> send buffers   after attention
* `gather_out`   receive buffers -> shards (local layout)

The spec (YAML; unknown keys are refused, every rule below is a validator naming the field and the fix):

```yaml
family: ulysses
name: ulysses_qkv_gqa            # [a-z][a-z0-9_]{0,63}; the generated module's name
summary: q, k and v in one all_to_all_single; GQA k/v.   # free text, never reaches code
transport: all_to_all_single     # all_to_all_single | external
local: [seq, head, dim]          # a rank's shard, outer -> inner
attention: [seq, head, dim]      # what attention reads (q, k, v) and writes (its output)
to_attention:                    # scatter and gather
  tensors: [{name: q, heads: H}, {name: k, heads: H_kv}, {name: v, heads: H_kv}]
  wire: [peer, tensor, seq, head, dim]
from_attention:                  # scatter_out and gather_out
  tensors: [{name: out, heads: H}]
  wire: [peer, seq, head, dim]
```

* `local` and `attention`: permutations of `seq, head, dim`, plus `batch` anywhere when the tensors have
  a batch axis (then every layout of the spec has one).  Extents: local `[S_local, H or H_kv, D]`,
  attention `[S = N*S_local, H/N or H_kv/N, D]`, batch B.  The user's tensors have these axes in this
  order with any strides, the last one 1.
* `tensors`: the tensors a direction moves together (1 to 8, in this order): a name
  (`[a-z][a-z0-9]{0,15}`, the keyword scatter takes it by) and its head count, `H` or `H_kv` -- both
  shape parameters (`alloc(..., H_kv=...)`), both divisible by N.
* `wire`: a permutation of `peer, seq, head, dim` (plus `batch` when the spec has it) and optionally
  `tensor`.  Extents: peer N, seq S_local, head H/N or H_kv/N, dim D.  Peer p's chunk of a send buffer
  holds what rank p gets; of a receive buffer, what rank p sent.  Without `tensor` every tensor has its
  own buffer (named after it); with `tensor` one buffer `wire` carries them all: along the `tensor`
  axis, each tensor's block of the axes inside it, one tensor after another (`[peer, tensor, ...]`: each
  peer's chunk holds q, then k, then v; `[peer, seq, tensor, head, dim]`: each row holds q's heads, then
  k's, then v's).  Tensors with different head counts need `head` inside `tensor`.
* `all_to_all_single` needs `peer` outermost in both wires (each peer's chunk contiguous; one
  `all_to_all_single` per buffer); `external` leaves the exchange to the caller.
* Buffers are dense and C-contiguous; the wire holds the tensors' own dtype (bfloat16, float16 or
  float32), byte for byte.

A generated module (`layoutgen.load("ulysses_qkv_gqa")`) for the spec above:

```python
send, recv = (mod.alloc(N, S_local, H, D, dtype, device, H_kv=H_kv) for _ in range(2))  # B=... with batch
mod.scatter(q, k, v, send)          # shards [S_local, H, D], [S_local, H_kv, D]: any strides, the last 1
mod.exchange(send, recv, group)     # one all_to_all_single per buffer
q, k, v = mod.gather(recv)          # [S, H/N, D], [S, H_kv/N, D]; out=(q, k, v) writes into given tensors
send_out, recv_out = (mod.alloc_out(N, S_local, H, D, dtype, device, H_kv=H_kv) for _ in range(2))
mod.scatter_out(out, send_out)      # attention output [S, H/N, D]
mod.exchange(send_out, recv_out, group)
mine = mod.gather_out(recv_out)     # [S_local, H, D]
mod.attention_views(recv)           # where a wire already holds a side's layout: views, no copy
```

Every kernel call takes `config=None` (LAYOUTGEN_CONFIG, else the tuning database, else the heuristic
default) and becomes a `torch.ops.layoutgen.ulysses_*` custom op under torch.compile;
`layoutgen.ulysses.distributed.UlyssesExchange` runs both directions on static buffers.

`FAMILY` is what the shared machinery calls.  The default tuning grid: N 2, 4, 8 x (H, D) in
{(8, 64), (64, 128)} (H_kv = max(N, H/4) for H_kv-headed tensors) x S_local 1, 4, ..., 65536 (powers of
four; dispatch maps a live B*S_local to the smallest tuned bucket >= it): 54 studies per spec and kernel,
1080 for the five bundled specs' four kernels.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any, ClassVar

from layoutgen.family import Family, GridAxis, KernelDecl, SearchSpace, SpaceExtents, VerifyReport
from layoutgen.ulysses.config import GatherConfig, GatherOutConfig, ScatterConfig, ScatterOutConfig
from layoutgen.ulysses.spec import UlyssesSpec

#: (H, D) of the default grid: a small-head model (H 8, D 64: H/N = 1 at N = 8) and a large one (64 x 128).
DEFAULT_HEADS_AND_DIMS: tuple[tuple[int, int], ...] = ((8, 64), (64, 128))
#: Every kernel tiles the same five logical axes.
_BLOCKS = (
    ("block_peer", "peer"),
    ("block_batch", "batch"),
    ("block_seq", "seq"),
    ("block_head", "head"),
    ("block_dim", "dim"),
)
# Rows of a sequence are contiguous only when seq is the destination's innermost axis: deep seq blocks
# elsewhere only add registers.
_CAPS = {"seq": 64, "batch": 16, "peer": 8}
_INNERMOST_CAPS = {"seq": 1024, "batch": 256}


def _kernel(name: str, template: str, config: Any, summary: str, timing: dict[str, str]) -> KernelDecl:
    space = SearchSpace(blocks=_BLOCKS, caps=_CAPS, innermost_caps=_INNERMOST_CAPS)
    return KernelDecl(name, template, config, space, timing, exact=True, summary=summary)


SCATTER = _kernel(
    "scatter",
    "scatter.py.jinja",
    ScatterConfig,
    "shards (local layout) -> send buffers, before attention",
    {"inputs": "shards per rotating set", "outputs": "one set of send buffers for every rotating set"},
)
GATHER = _kernel(
    "gather",
    "gather.py.jinja",
    GatherConfig,
    "receive buffers -> attention layout [S, H/N, D]",
    {"inputs": "receive buffers per rotating set", "outputs": "one set of attention tensors for every rotating set"},
)
SCATTER_OUT = _kernel(
    "scatter_out",
    "scatter_out.py.jinja",
    ScatterOutConfig,
    "attention output -> send buffers, after attention",
    {"inputs": "attention outputs per rotating set", "outputs": "one set of send buffers for every rotating set"},
)
GATHER_OUT = _kernel(
    "gather_out",
    "gather_out.py.jinja",
    GatherOutConfig,
    "receive buffers -> shards (local layout)",
    {"inputs": "receive buffers per rotating set", "outputs": "one set of shards for every rotating set"},
)


class UlyssesFamily(Family):
    name = "ulysses"
    summary = "sequence-parallel all-to-all around attention: scatter, gather and their reverse"
    spec_model = UlyssesSpec
    kernels = (SCATTER, GATHER, SCATTER_OUT, GATHER_OUT)
    key_extents = ("N", "Hl", "Hl_kv", "D")
    grid_axes = (
        GridAxis("N", (2, 4, 8), (2,), "ranks exchanging sequence shards", alias="N"),
        GridAxis("H", (8, 64), (4,), "heads of q and the attention output (divisible by N)", alias="heads"),
        GridAxis("H_kv", (), (2,), "heads of k and v (GQA; default max(N, H/4))", alias="heads-kv"),
        GridAxis("D", (64, 128), (8,), "head dim", alias="D"),
    )
    bucket = GridAxis(
        "S_local", tuple(4**k for k in range(9)), (1, 3), "tokens per rank (B x S_local with a batch axis)", alias="seq"
    )
    dtypes = ("bfloat16", "float16", "float32")
    show_shape: ClassVar[Mapping[str, int]] = {"N": 2, "B": 1, "S_local": 2, "H": 4, "H_kv": 2, "D": 4}
    show_aliases: ClassVar[Mapping[str, str]] = {
        "N": "N",
        "batch": "B",
        "seq": "S_local",
        "heads": "H",
        "heads-kv": "H_kv",
        "D": "D",
    }

    def render_context(self, spec: Any) -> dict[str, Any]:
        from layoutgen.ulysses.render import module_context

        return module_context(spec)

    def verify(self, module: ModuleType, device: str) -> VerifyReport:
        from layoutgen.ulysses.verify import verify_module

        return verify_module(module, device)

    def grid_points(self, given: Mapping[str, list[int]], interpret: bool) -> list[dict[str, int]]:
        """Without H or D given: the (H, D) pairs of the default grid at every N; otherwise the product of
        what was given with the defaults of the rest.  H_kv, unless given, is max(N, H / 4)."""
        if given.get("H") or given.get("D"):
            heads = given.get("H") or ((4,) if interpret else (8, 64))
            dims = given.get("D") or ((8,) if interpret else (64, 128))
            pairs = [(H, D) for H in heads for D in dims]
        else:
            pairs = [(4, 8)] if interpret else list(DEFAULT_HEADS_AND_DIMS)
        peers = given.get("N") or ((2,) if interpret else (2, 4, 8))
        points = []
        for H, D in pairs:
            for N in peers:
                for H_kv in given.get("H_kv") or (max(N, H // 4),):
                    points.append({"N": N, "H": H, "H_kv": H_kv, "D": D})
        return points

    def key_shapes(self, spec: Any, kernel: str, point: Mapping[str, int], dtype: str) -> dict[str, int] | None:
        from layoutgen.ulysses.layout import key_extents

        if self.shape_problem(spec, kernel, point, dtype) is not None:
            return None  # e.g. H not divisible by N
        return key_extents(spec, kernel, self._point_shape(point, dtype))

    def shape_problem(self, spec: Any, kernel: str, point: Mapping[str, int], dtype: str) -> str | None:
        from layoutgen.ulysses.layout import check_shape

        try:
            check_shape(spec, self._point_shape(point, dtype))
        except (TypeError, ValueError) as error:
            return str(error)
        return None

    def _point_shape(self, point: Mapping[str, int], dtype: str) -> Any:
        """The shape a grid point is checked at: one sequence row (the bucket is the run-time size)."""
        import torch

        from layoutgen.ulysses.layout import Shape

        H = point["H"]
        return Shape(N=point["N"], S_local=1, H=H, H_kv=point.get("H_kv", H), D=point["D"], dtype=getattr(torch, dtype))

    def workload(self, target: Any, bucket: int, device: Any, l2_bytes: int) -> Any:
        from layoutgen.ulysses.workload import UlyssesWorkload

        return UlyssesWorkload(target, bucket, device, l2_bytes)

    def _problem_shape(self, problem: Any, bucket: int) -> Any:
        """The shape a problem is tuned at: B = 1, S_local = the bucket."""
        import torch

        from layoutgen.ulysses.layout import Shape

        N = problem.extent("N")
        return Shape(
            N=N,
            S_local=bucket,
            H=N * problem.extent("Hl"),
            H_kv=N * problem.extent("Hl_kv"),
            D=problem.extent("D"),
            dtype=getattr(torch, problem.dtype),
        )

    def default_config(self, problem: Any, bucket: int) -> Any:
        from layoutgen.ulysses.config import runtime_default

        return runtime_default(problem.spec, problem.kernel, self._problem_shape(problem, bucket))

    def bytes_moved(self, problem: Any, bucket: int) -> int:
        """Every element of the direction's tensors is read once and written once."""
        from layoutgen.ulysses.layout import KERNEL_DIRECTION

        shape = self._problem_shape(problem, bucket)
        tensors = problem.spec.direction(KERNEL_DIRECTION[problem.kernel]).tensors
        elements = sum(shape.B * shape.S_local * shape.heads(t.heads) * shape.D for t in tensors)
        return 2 * elements * shape.dtype.itemsize

    def space_extents(self, problem: Any, bucket: int) -> SpaceExtents:
        from layoutgen.ulysses.config import box_extents
        from layoutgen.ulysses.layout import tile_axes

        shape = self._problem_shape(problem, bucket)
        extents = box_extents(problem.spec, problem.kernel, shape)
        innermost = tile_axes(problem.spec, problem.kernel)[-1]
        return SpaceExtents(extents, innermost, shape.dtype.itemsize, 1)

    def compile_variant(self, module: ModuleType, job: Mapping[str, Any], kernel_proxy: Any) -> None:
        from layoutgen.ulysses.workload import launch_on_meta

        launch_on_meta(module, job, kernel_proxy)

    def offline_jobs(self, spec: Any) -> list[tuple[str, dict[str, Any]]]:
        """Every kernel with its heuristic default at N 2, S_local 3, H 6, H_kv 2, D 24 (32-bit offsets) and at
        N 2, S_local 266240, H = H_kv = 64, D 128 (2.2e9 elements in every tensor: 64-bit offsets)."""
        import torch

        from layoutgen.ulysses.config import runtime_default
        from layoutgen.ulysses.layout import Shape
        from layoutgen.ulysses.spec import HeadCount

        gqa = spec.uses(HeadCount.H_KV)
        jobs = []
        for width, (N, S_local, H, H_kv, D) in {"32-bit": (2, 3, 6, 2, 24), "64-bit": (2, 266240, 64, 64, 128)}.items():
            values = {"N": N, "S_local": S_local, "B": 1, "H": H, "H_kv": H_kv if gqa else H, "D": D}
            shape = Shape(**values, dtype=torch.bfloat16)
            for decl in self.kernels:
                config = runtime_default(spec, decl.name, shape).as_dict()
                jobs.append((width, {"kernel": decl.name, "config": config, **values, "dtype": "bfloat16"}))
        return jobs

    def unused_extents(self, spec: Any) -> Mapping[str, str]:
        from layoutgen.ulysses.spec import HeadCount

        return {} if spec.uses(HeadCount.H_KV) else {"H_kv": f"spec '{spec.name}' has no H_kv-headed tensors"}

    def byte_layout(self, spec: Any, shape: Mapping[str, int], dtype: str) -> Any:
        from layoutgen.ulysses.show import byte_layout

        return byte_layout(spec, shape, dtype)


FAMILY = UlyssesFamily()
