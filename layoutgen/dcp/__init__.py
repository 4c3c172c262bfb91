"""The DCP family: decode-context-parallel pack and combine of partial attention results.

Every rank holds a shard of the KV cache and computes, for all H heads, a partial attention output
`out [B, H, D]` and its log-sum-exp `lse [B, H]`; heads are exchanged so that rank p receives every
peer's partials for its head block and merges them with LSE weights.  `pack` scatters `out`/`lse` into a
transport's send buffers, `combine` merges the N received partials.  A spec says where every byte lives
(docs/design.md §3); this package holds everything that speaks those words, and `FAMILY` is what the
shared machinery calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any, ClassVar

from layoutgen.dcp.config import CombineConfig, PackConfig, combine_load_axis
from layoutgen.dcp.constants import SHOW_ALIASES, SHOW_SHAPE
from layoutgen.dcp.spec import DcpSpec, PayloadDtype
from layoutgen.family import Family, GridAxis, KernelDecl, SearchSpace, SpaceExtents, VerifyReport

_TILE_CAPS = {"batch": 16}  # batch rows are not contiguous in any bundled destination: deep blocks only add registers
_INNERMOST_CAPS = {"batch": 256}  # ... unless batch is the destination's innermost axis (stores coalesce along it)
#: (H, D) of the default grid: DeepSeek-style MLA decode (H 16 and 128, D 512) and plain attention (H 32, D 128).
DEFAULT_HEADS_AND_DIMS: tuple[tuple[int, int], ...] = ((16, 512), (128, 512), (32, 128))
LSE_BYTES = 4

PACK = KernelDecl(
    name="pack",
    template="pack.py.jinja",
    config_type=PackConfig,
    space=SearchSpace(
        blocks=(("block_peer", "peer"), ("block_batch", "batch"), ("block_head", "head"), ("block_dim", "dim")),
        caps=_TILE_CAPS,
        innermost_caps=_INNERMOST_CAPS,
    ),
    timing={"inputs": "out and lse per rotating set", "outputs": "each rotating set's own send buffers"},
    exact=True,
    summary="scatter out [B, H, D] and lse [B, H] into the send buffers",
)
COMBINE = KernelDecl(
    name="combine",
    template="combine.py.jinja",
    config_type=CombineConfig,
    space=SearchSpace(
        blocks=(("block_batch", "batch"), ("block_head", "head"), ("block_dim", "dim")),
        caps=_TILE_CAPS,
        innermost_caps=_INNERMOST_CAPS,
    ),
    timing={
        "inputs": "received buffers per rotating set, natural-log LSEs, no merged LSE out",
        "outputs": "one output shared by every rotating set",
    },
    exact=False,
    # Combine reads what the exchange has just written into the receive buffers, which at small batch is still
    # in the L2; ranked by rotated inputs alone the tuner kept configs that lose there: pynccl_a2a_aligned
    # N 8, B 64 took 3.05 us L2-resident (sglang 2.88) where 1 x 16 heads x 128 x 8 warps took 2.59, and
    # 3.99 against 4.10 rotated (benchmarks/results/archive/probe_space_pynccl_a2a_aligned*_H200.json).
    resident_timing=True,
    summary="merge the N received partials into [B, H/N, D] (and the merged LSE)",
)


class DcpFamily(Family):
    name = "dcp"
    summary = "decode-context-parallel exchange of partial attention results: pack and combine"
    spec_model = DcpSpec
    kernels = (PACK, COMBINE)
    key_extents = ("N", "Hl", "D")
    grid_axes = (
        GridAxis("N", (2, 4, 8), (2,), "peers (ranks) exchanging heads", alias="N"),
        GridAxis("H", (16, 128, 32), (4,), "heads of out, all ranks' (divisible by N)", alias="heads"),
        GridAxis("D", (512, 128), (8,), "head dim", alias="D"),
    )
    bucket = GridAxis("B", tuple(1 << k for k in range(13)), (1, 3), "live batch rows", alias="batch")
    dtypes = ("bfloat16", "float16", "float32")
    #: E: how many of the B live rows are drawn as rows of empty requests (pack's `empty=`), the last ones.
    show_shape: ClassVar[Mapping[str, int]] = SHOW_SHAPE
    show_aliases: ClassVar[Mapping[str, str]] = SHOW_ALIASES

    def render_context(self, spec: Any) -> dict[str, Any]:
        from layoutgen.dcp.render import module_context

        return module_context(spec)

    def verify(self, module: ModuleType, device: str) -> VerifyReport:
        from layoutgen.dcp.verify import verify_module

        return verify_module(module, device)

    def grid_points(self, given: Mapping[str, list[int]], interpret: bool) -> list[dict[str, int]]:
        """Without N, H or D given: the (H, D) pairs of MLA decode and plain attention at every N; otherwise
        the product of what was given with the defaults of the rest."""
        if given.get("H") or given.get("D"):
            return super().grid_points(given, interpret)
        pairs = ((4, 8),) if interpret else DEFAULT_HEADS_AND_DIMS
        peers = given.get("N") or ((2,) if interpret else (2, 4, 8))
        return [{"N": N, "H": H, "D": D} for H, D in pairs for N in peers]

    def key_shapes(self, spec: Any, kernel: str, point: Mapping[str, int], dtype: str) -> dict[str, int] | None:
        if self.shape_problem(spec, kernel, point, dtype) is not None:
            return None  # e.g. H not divisible by N, or a row-tail spec with an odd D
        return {"N": point["N"], "Hl": point["H"] // point["N"], "D": point["D"]}

    def shape_problem(self, spec: Any, kernel: str, point: Mapping[str, int], dtype: str) -> str | None:
        import torch

        from layoutgen.dcp.layout import Shape, check_shape

        try:
            check_shape(spec, Shape(point["N"], 1, point["H"], point["D"], getattr(torch, dtype)))
        except (TypeError, ValueError) as error:
            return str(error)
        return None

    def _sizes(self, problem: Any) -> tuple[int, int, int, int, int]:
        """N, heads per peer, D, activation and wire element sizes of a problem."""
        elem = {"bfloat16": 2, "float16": 2, "float32": 4}[problem.dtype]
        wire = 4 if problem.spec.payload.dtype is PayloadDtype.FLOAT32 else 1 if problem.spec.fp8 else elem
        return problem.extent("N"), problem.extent("Hl"), problem.extent("D"), elem, wire

    def workload(self, target: Any, bucket: int, device: Any, l2_bytes: int) -> Any:
        from layoutgen.dcp.workload import DcpWorkload

        return DcpWorkload(target, bucket, device, l2_bytes)

    def default_config(self, problem: Any, bucket: int) -> Any:
        from layoutgen.dcp.config import default_combine_config, default_pack_config

        N, heads_per_peer, D, _, wire = self._sizes(problem)
        make = {"pack": default_pack_config, "combine": default_combine_config}[problem.kernel]
        return make(problem.spec, N, heads_per_peer, D, bucket, wire)

    def bytes_moved(self, problem: Any, bucket: int) -> int:
        """pack reads out + lse and writes the payload and stats bytes it owns (one word per entry, two for
        a (max, sum) spec, and an fp8 spec's float32 scale per block); combine reads N partials, their stats
        words and scales, and writes out."""
        from layoutgen.dcp.layout import scale_blocks

        N, heads_per_peer, D, elem, wire = self._sizes(problem)
        words = problem.spec.stats.words + scale_blocks(problem.spec, D)
        if problem.kernel == "pack":
            return bucket * N * heads_per_peer * (D * (elem + wire) + LSE_BYTES * (1 + words))
        return bucket * heads_per_peer * (N * (D * wire + LSE_BYTES * words) + D * elem)

    def space_extents(self, problem: Any, bucket: int) -> SpaceExtents:
        N, heads_per_peer, D, elem, wire = self._sizes(problem)
        extents = {"peer": N, "batch": bucket, "head": heads_per_peer, "dim": D}
        if problem.kernel == "pack":
            from layoutgen.dcp.config import pack_pairs_axis, pack_search_floor

            # An fp8 pack's dim block covers whole scale blocks (the launcher refuses less) unless it walks them
            # in chunks: without this floor 263 of the 273 configs of a block-D spec's space (N 8, H 128,
            # D 512, dim innermost) were launches that fail.
            floors = {"dim": pack_search_floor(problem.spec, D)} if problem.spec.fp8 else {}
            pairs_axis = pack_pairs_axis(problem.spec)
            if pairs_axis is not None:
                # A run of (X, peer) pairs is the tile's innermost axis: its length is block_X (block_peer 1).
                extents = {**extents, "peer": 1, pairs_axis: extents[pairs_axis] * N}
                return SpaceExtents(extents, pairs_axis, wire, 1, floors)
            return SpaceExtents(extents, problem.spec.payload.axes[-1], wire, 1, floors)
        # Each output element loads N partials.  A payload with batch innermost (or outside a peer innermost) is
        # loaded along batch: without its innermost cap the space stopped at 16 rows, under its defaults (128
        # rows, 32 on fp8 wires or with the peers in the tile).
        return SpaceExtents(extents, "dim", elem, N, source_innermost=combine_load_axis(problem.spec))

    def compile_variant(self, module: ModuleType, job: Mapping[str, Any], kernel_proxy: Any) -> None:
        import torch

        from layoutgen.dcp.layout import LayoutBuffers
        from layoutgen.runtime.tensors import needs_int64

        kernel, config_type = job["kernel"], self.kernel(job["kernel"]).config_type
        dtype, batch = getattr(torch, job["dtype"]), job["batch"]
        N, H, D = job["N"], job["H"], job["D"]
        config = config_type.from_dict(job["config"])
        bufs = LayoutBuffers.allocate(module.SPEC, N, job["capacity"], H, D, dtype, "meta")
        if kernel == "pack":
            out = torch.empty(batch, H, D, dtype=dtype, device="meta")
            lse = torch.empty(batch, H, dtype=torch.float32, device="meta")
            index_64 = needs_int64(out, lse, *bufs.tensors.values())
            module._launch_pack(out, lse, bufs, batch, config, index_64, kernel=kernel_proxy)
            for masked, from_max_sum in job.get("pack_forms", ()):
                # The contract-v2 variants the workload's gate runs too (an empty mask, (max, sum) inputs).
                empty = torch.empty(batch, dtype=torch.bool, device="meta") if masked else None
                sums = torch.empty(batch, H, dtype=torch.float32, device="meta") if from_max_sum else None
                module._launch_pack(
                    out, lse, bufs, batch, config, index_64, kernel=kernel_proxy, sums=sums, empty=empty
                )
        else:
            out = torch.empty(batch, H // N, D, dtype=dtype, device="meta")
            index_64 = needs_int64(out, *bufs.tensors.values())
            module._launch_combine(bufs, batch, out, None, False, config, index_64, kernel=kernel_proxy)

    def offline_jobs(self, spec: Any) -> list[tuple[str, dict[str, Any]]]:
        """Both kernels with their heuristic defaults at N 2, H 128, D 512 and B 5 (32-bit offsets) or 32784
        (2.1e9 elements of out: 64-bit offsets); pack also in its masked and (max, sum) forms."""
        import torch

        from layoutgen.tuning.objective import capacity_for
        from layoutgen.tuning.problem import Problem

        N, H, D = 2, 128, 512
        jobs = []
        for width, batch in {"32-bit": 5, "64-bit": 32784}.items():
            capacity = capacity_for(batch, torch.device("cuda"))  # what the tuner allocates on a GPU
            for decl in self.kernels:
                problem = Problem(spec, decl.name, (("N", N), ("Hl", H // N), ("D", D)), "bfloat16")
                job = {"kernel": decl.name, "config": self.default_config(problem, batch).as_dict(), "N": N, "H": H,
                       "D": D, "dtype": "bfloat16", "batch": batch, "capacity": capacity}  # fmt: skip
                if decl.name == "pack":
                    job["pack_forms"] = ((True, False), (False, True), (True, True))  # empty mask, (max, sum), both
                jobs.append((width, job))
        return jobs

    def byte_layout(self, spec: Any, shape: Mapping[str, int], dtype: str) -> Any:
        from layoutgen.dcp.show import byte_layout

        return byte_layout(spec, shape, dtype)


FAMILY = DcpFamily()
