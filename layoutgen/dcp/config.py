"""The DCP kernels' launch configs and their heuristic defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from layoutgen.config import LaunchConfig, grow_box, next_pow2
from layoutgen.dcp.spec import DcpSpec


@dataclass(frozen=True)
class _TileConfig(LaunchConfig):
    """The tile both DCP kernels share: a box of batch x head x dim (pack adds peers)."""

    block_batch: int
    block_head: int
    block_dim: int
    num_warps: int = 4
    num_stages: int = 1


@dataclass(frozen=True)
class PackConfig(_TileConfig):
    kernel: ClassVar[str] = "pack"
    block_peer: int = 1

    def check_problem(self, spec: Any, extents: Mapping[str, int]) -> None:
        check_pack_tile(spec, extents["D"], self)


@dataclass(frozen=True)
class CombineConfig(_TileConfig):
    kernel: ClassVar[str] = "combine"


CONFIG_TYPES: dict[str, type[LaunchConfig]] = {"pack": PackConfig, "combine": CombineConfig}


#: The narrowest chunk of a scale block the tuner tries for a pack that splits blocks (`DcpSpec.fp8_chunks`):
#: 16 elements, 32-byte loads of bf16 per row.
FP8_MIN_CHUNK = 16


def fp8_min_block_dim(spec: DcpSpec, D: int) -> int:
    """The narrowest pack tile along dim the launcher takes: for an fp8 spec whose pack quantises whole blocks in
    one pass, its scale block rounded up to a power of two (a block's amax needs all of its elements in one
    program); 1 for any other spec, a pack that splits blocks into chunks (`DcpSpec.fp8_chunks`) included."""
    return next_pow2(spec.scale_block_of(D)) if spec.fp8 and not spec.fp8_chunks else 1


def pack_search_floor(spec: DcpSpec, D: int) -> int:
    """The narrowest dim block the tuner's pack space holds: `fp8_min_block_dim`, and for a pack that splits
    scale blocks into chunks at least FP8_MIN_CHUNK (or the whole block, when smaller)."""
    if spec.fp8_chunks:
        return min(next_pow2(spec.scale_block_of(D)), FP8_MIN_CHUNK)
    return fp8_min_block_dim(spec, D)


def check_pack_tile(spec: DcpSpec, D: int, config: PackConfig) -> None:
    """ValueError naming the fix when `config`'s dim block splits an fp8 spec's scale blocks."""
    floor = fp8_min_block_dim(spec, D)
    if config.block_dim < floor:
        raise ValueError(
            f"pack config block_dim={config.block_dim} splits the scale blocks of spec '{spec.name}' "
            f"({spec.scale_block_of(D)} elements at D={D}) over programs, but a block's amax needs the whole "
            f"block in one program: use block_dim >= {floor}"
        )


def pack_pairs_axis(spec: DcpSpec) -> str | None:
    """The axis X whose pairs with peer a pack tiles as one flat run, or None: with peer innermost and batch or
    head right outside it, every run of the destination is a run of consecutive (X, peer) pairs (pair r is peer
    r % NUM_PEERS of X index r // NUM_PEERS), one vector of the tile.  A box of peers x X stored runs of
    NUM_PEERS elements: bf16 [head, dim, batch, peer], N 8, H 128, D 512 on the H200 packed at 50-62% of the
    copy ceiling at best, flat at 96-98% (probe_peer_pack.py, eighteenth pass).  The generated packs at their
    defaults, B 64 / 1024: that layout 43/49 -> 82/91%, bf16 [batch, dim, head, peer] 43/49 -> 73/93%, float32
    78/85 -> 86/92%, fp8 in blocks of 16 or 64 37-42 -> 56/76% (probe_unseen_dcp.py).
    With head innermost and peer right outside it the pairs are (peer, head): pair r is global head r
    (`pack_pairs_peer_outer`).  A box of peers x heads stored runs of H / N heads: bf16 [batch, dim, peer,
    head] at N 8, H 32 packed at 36% / 34% of the copy at B 64 / 1024 (8-byte runs), as pairs at 83% / 91%;
    at H 128 5.89 µs both ways at B 64 and 71.5 -> 68.4 µs at B 1024 (nineteenth pass).
    The config's block_X x block_peer is the run's length (the tuner varies block_X, with block_peer 1)."""
    axes = spec.payload.axes
    if pack_pairs_peer_outer(spec):
        return "head"
    if axes[-1] != "peer" or axes[-2] not in ("batch", "head"):
        return None
    return axes[-2]


def pack_pairs_peer_outer(spec: DcpSpec) -> bool:
    """Whether the pack's pairs are (peer, head), head innermost and peer right outside it: pair r is head
    r % HEADS_PER_PEER of peer r // HEADS_PER_PEER, the global head r of `out`.  Not on an fp8 wire: there the
    pairs lost to the box (bench_unseen_specs.py's seed 0 spec 1, one scale per row, N 8, H 128: 46% / 62% of
    the copy at B 64 / 1024 as a box, 33% / 55% as pairs at their default, 44% / 55% at the best of 8 configs),
    where the quantisation, not the stores, sets the pace."""
    axes = spec.payload.axes
    return axes[-1] == "head" and axes[-2] == "peer" and not spec.fp8


def _warps_for(tile_elements: int, elem_size: int) -> int:
    # One 16-byte access per thread per pass: 4 warps move 2 KiB; more warps only help big tiles.
    tile_bytes = tile_elements * elem_size
    return max(1, min(16, tile_bytes // 2048)) if tile_bytes >= 2048 else 1


#: Programs that fill one and two waves of an H200's (and an H100 SXM's) 132 SMs.
_ONE_WAVE = 132
_TWO_WAVES = 2 * _ONE_WAVE


def _spread_rows(spec: DcpSpec, blocks: dict[str, int], extents: dict[str, int], D: int) -> dict[str, int]:
    """`blocks` with fewer rows per program (outermost axis first, down to 16 rows) until the grid holds two
    waves, the dim block regrown up to the scale block with what the rows give back.  A program of a pack
    that splits blocks covers its rows' whole blocks, so the grid has no programs along dim to make up for
    few rows.  `default_pack_config` does not spread a batch-innermost box of whole blocks of 256 or 512 from
    32 rows down: its 16-byte runs were slower even below two waves."""
    row_axes = [axis for axis in spec.payload.axes if axis != "dim"]
    lanes = next_pow2(spec.scale_block_of(D))
    blocks = dict(blocks)

    def rows() -> int:
        return blocks["peer"] * blocks["batch"] * blocks["head"]

    def programs() -> int:
        row_programs = 1
        for axis in row_axes:
            row_programs *= -(-extents[axis] // blocks[axis])
        return row_programs * max(1, D // max(blocks["dim"], spec.scale_block_of(D)))

    while programs() < _TWO_WAVES and rows() > 16:
        axis = next(axis for axis in row_axes if blocks[axis] > 1)
        blocks[axis] //= 2
        blocks["dim"] = max(blocks["dim"], min(lanes, 4096 // rows()))
    return blocks


#: float32 scales in one 32-byte sector of the L2.
_SCALES_PER_SECTOR = 8


def _fill_scale_sectors(spec: DcpSpec, blocks: dict[str, int], extents: dict[str, int], D: int) -> dict[str, int]:
    """`blocks` holding up to a sector of batch rows (8 float32 scales) over whole scale blocks of at least 32
    dims, at most 4096 elements.  A head-innermost fp8 box of 16 heads holds one row: where the scales run
    along batch, each of its scales is a 4-byte write into a sector seven other programs also write.  H200,
    N 8, B 1024, H 128, D 512, `[peer, dim, batch, head]` with scales `[head, peer, block, batch]` (seed 4's
    spec 1 of bench_unseen_specs.py and its variants in benchmarks/specs/), against 1 x 16 heads x 128 dims:
    blocks of 16 35 -> 61% of the copy (8 rows x 32 dims), of 32 44 -> 63% (8 x 32), of 64 48 -> 59% (4 x 64;
    8 x 32 dims split its blocks: 50%); with dim next to head 67 -> 71%.  At B 64 32 -> 49%, 41 -> 48%,
    45 -> 44% and 49 -> 52%.  Scales with their blocks innermost keep one row (seed 3's spec 11: 67% with it,
    49% with 8 rows), and a box of 8 peers where the scales run along peer lost (49 -> 37%)."""
    blocks = dict(blocks)
    blocks["dim"] = min(blocks["dim"], max(32, spec.scale_block_of(D)))
    row_budget = max(1, 4096 // (blocks["peer"] * blocks["head"] * blocks["dim"]))
    blocks["batch"] = max(blocks["batch"], min(_SCALES_PER_SECTOR, next_pow2(extents["batch"]), row_budget))
    return blocks


def default_pack_config(spec: DcpSpec, N: int, heads_per_peer: int, D: int, B: int, elem_size: int) -> PackConfig:
    """A safe, reasonably fast starting point; the tuner replaces it per shape."""
    innermost = spec.payload.axes[-1]
    block_dim = min(next_pow2(D), 1024)
    pairs_axis = pack_pairs_axis(spec)
    if pairs_axis is not None:
        # Runs of (X, peer) pairs, loaded along dim.  The same probe, 42 boxes of 32-256 pairs x 32-128 dims x
        # 4 or 8 warps: 64 x 64 x 4 warps took 98% of the copy ceiling at B 64 and 92% at B 1024, where
        # 128 x 128 took 96% (80% at B 64); with fewer pairs than 64 the dim block grows to keep the tile.
        # An fp8 wire keeps 4096 elements (its float32 values live through the blocks' amax: 32 per thread).
        pairs = N * (B if pairs_axis == "batch" else heads_per_peer)
        large = pairs >= 4096 and not spec.fp8
        block_pairs = min(next_pow2(pairs), 128 if large else 64)
        pair_blocks = {"batch": block_pairs, "head": 1} if pairs_axis == "batch" else {"batch": 1, "head": block_pairs}
        return PackConfig(
            block_peer=1,
            block_batch=pair_blocks["batch"],
            block_head=pair_blocks["head"],
            block_dim=min(block_dim, max(64, (16384 if large else 4096) // block_pairs)),
            num_warps=4,
        )
    if spec.fp8_chunks:
        # An fp8 wire that transposes (batch, head or peer innermost) walks a scale block wider than the box in
        # chunks (`DcpSpec.fp8_chunks`).  The box grows from the destination's innermost axis outward after
        # taking its dims, at 32 elements per thread where the launcher caps the registers (see
        # pack_fp8.py.jinja).  H200, N 8, B 1024, H 128, D 512, the boxes of probe_fp8_transpose.py over 11
        # specs of bench_unseen_specs.py's seeds 0-3: batch innermost, 32 rows x 128 dims was the best or
        # within 2% of it for blocks of up to 128 (blocks of 128: 59.7 µs against 146.3 for 64 x 64, which
        # walks them in two chunks); head innermost with blocks of at least 128, 16 heads x 512 dims x 8 warps
        # (one scale per row 80.2 µs against 89.8 for 16 x 128 x 4 warps, 61.6 against 72.3 and 60.2 against
        # 72.8 on two others); with smaller blocks 16 x 128 x 4 warps stays (blocks of 16: 82.9 µs against
        # 100.0 for 16 x 512).  Batch innermost with blocks of 256 or 512 takes them whole too, 32 rows x the
        # block x 8 or 16 warps, and keeps its 32 rows where the grid is short of two waves (from B 32 up):
        # runs of 16 codes leave half of every L2 sector unwritten.  The same point, twentieth pass
        # (probe_unseen_dcp.py): one scale per row 85.0 µs against 122.6 for 32 x 128 in four chunks and 142.8
        # for 16 x 512 x 8 warps; at B 64 8.27 against 8.85, and 12.4 for the earlier default (16 x 256);
        # blocks of 256 64.0 µs (78% of the copy) against 139.7 in chunks, at B 64 6.2 against 10.6.
        extents = {"peer": N, "batch": B, "head": heads_per_peer, "dim": block_dim}
        lanes = next_pow2(spec.scale_block_of(D))
        wide = innermost == "batch" or (innermost == "head" and spec.scale_block_of(D) >= 128)
        whole_rows = innermost == "batch" and 128 < lanes <= 512
        batch_dims = lanes if whole_rows else 128
        dims, budget = {"batch": (batch_dims, 32 * batch_dims), "head": (512, 8192) if wide else (128, 2048)}.get(
            innermost, (128, 2048)
        )
        grown = grow_box(spec.payload.axes, extents, budget, floors={"dim": min(block_dim, dims)})
        blocks = grown if whole_rows and grown["batch"] >= 32 else _spread_rows(spec, grown, extents, D)
        scales_along_batch = spec.payload.scale_axes is not None and spec.payload.scale_axes[-1] == "batch"
        if innermost == "head" and not wide and scales_along_batch and B > 1:
            blocks = _fill_scale_sectors(spec, blocks, extents, D)
        tile = blocks["peer"] * blocks["batch"] * blocks["head"] * blocks["dim"]
        return PackConfig(
            block_peer=blocks["peer"],
            block_batch=blocks["batch"],
            block_head=blocks["head"],
            block_dim=blocks["dim"],
            num_warps=max(1, min(16, tile // 1024)) if wide else 4,
        )
    if innermost == "batch":
        # A transpose: `out` is contiguous along dim, the destination along batch.  The tile is rows x dims,
        # loaded along dim and stored along batch (Triton converts between the two through shared memory);
        # 64 rows make every stored run 256 bytes of float32 (128 of bf16) and at least 64 dims every loaded
        # run 128 bytes of bf16.  With fewer live rows the dim block grows to keep ~4096 elements per program
        # (at B = 1 a program reads a whole head row: 1 KiB of bf16 at D = 512).  Was 32 x 64 (2048
        # elements, 4 warps), which with 4-byte stores packed at 47% of the copy ceiling (issue 21).
        block_batch = min(next_pow2(B), 64)
        block_dim = min(block_dim, max(64, 4096 // block_batch))
        block_head, block_peer = 1, 1
    elif innermost in ("peer", "head"):
        # The destination is contiguous along its inner axes, `out` along dim: the box grows from the
        # destination's innermost axis outward (whole runs of heads or peers first), over at least 64 dims
        # (128-byte loads of bf16), to ~4096 elements.  A fixed 512 dims left 8 of 16 heads per store, 16
        # bytes: payload [peer, batch, dim, head] packed at 61% of the copy ceiling, 93% now (H200,
        # bench_unseen_specs.py).
        extents = {"peer": N, "batch": B, "head": heads_per_peer, "dim": block_dim}
        blocks = grow_box(spec.payload.axes, extents, 4096, floors={"dim": min(block_dim, 64)})
        block_peer, block_batch, block_head, block_dim = blocks["peer"], blocks["batch"], blocks["head"], blocks["dim"]
    else:
        return _dim_innermost_pack_config(spec, N, heads_per_peer, D, B, block_dim, elem_size)
    return PackConfig(
        block_peer=block_peer,
        block_batch=block_batch,
        block_head=block_head,
        block_dim=block_dim,
        num_warps=_warps_for(block_peer * block_batch * block_head * block_dim, elem_size),
    )


def _dim_innermost_pack_config(
    spec: DcpSpec, N: int, heads_per_peer: int, D: int, B: int, block_dim: int, elem_size: int
) -> PackConfig:
    """`dim` innermost on both sides: whole rows of D, the box grown from the destination's innermost row axis
    outward (rows that lie next to each other in the buffer).  H200, N 8, H 128, D 512, five drawn specs and
    six bundled ones timed with this rule and the one before it, 8 heads x 512 dims x 4 warps (8 on fp8
    wires), side by side (archive/probe_unseen_dcp_defaults_{old,new}15_NVIDIA_H200.md):

    * B > 64: 2048 elements, 8 per thread (32 on fp8 wires): 0.77-0.98x the time at B 1024, 0.80-0.99x at 256.
      Rows padded past their stats words, which leave part of an L2 sector unwritten in every row and cost a
      plain copy 21% (archive/probe_row_padding_NVIDIA_H200.md), went from 69-80% of the copy ceiling to 83-90%.
    * B <= 8: 1024 elements, 8 per thread (16 on fp8 wires; more programs shorten the one wave): 0.82-1.01x.
    * 8 < B <= 64: fp8 wires as above (0.87-0.99x); other wires keep the earlier 4096 elements of heads,
      since 2048 at 8 per thread took 1.00-1.06x there.
    On an fp8 wire a program holds whole scale blocks (their float32 values live through the block's amax).
    """
    if not spec.fp8 and 8 < B <= 64:
        block_head = min(next_pow2(heads_per_peer), max(1, 4096 // block_dim))
        return PackConfig(
            block_batch=1,
            block_head=block_head,
            block_dim=block_dim,
            num_warps=_warps_for(block_head * block_dim, elem_size),
        )
    budget = 1024 if B <= 8 else 2048
    # The floor is the dim extent too: a scale block past 1024 elements (block_dim's cap) stays whole.
    floor = max(block_dim, fp8_min_block_dim(spec, D))
    extents = {"peer": N, "batch": B, "head": heads_per_peer, "dim": floor}
    blocks = grow_box(spec.payload.axes, extents, max(budget, floor), floors={"dim": floor})
    tile = blocks["peer"] * blocks["batch"] * blocks["head"] * blocks["dim"]
    per_thread = (16 if B <= 8 else 32) if spec.fp8 else 8
    return PackConfig(
        block_peer=blocks["peer"],
        block_batch=blocks["batch"],
        block_head=blocks["head"],
        block_dim=blocks["dim"],
        num_warps=max(1, min(8, tile // (32 * per_thread))),
    )


def combine_load_axis(spec: DcpSpec) -> str:
    """The payload axis a combine's loads run along: its innermost, or with `peer` innermost the axis outside
    it (a program's loads of one element read every peer's bytes of a run of that axis together; the tuner's
    innermost caps follow it)."""
    axes = spec.payload.axes
    return axes[-2] if axes[-1] == "peer" else axes[-1]


def combine_peers_in_tile(spec: DcpSpec) -> bool:
    """Whether the combine loads every peer's partial of an element as one vector (the peers the tile's last
    axis, summed in registers) instead of one peer at a time.

    With peer innermost one peer at a time made each load one element N elements from the next.  H200, N 8,
    B 1024, H 128, D 512 (probe_unseen_dcp.py, seventeenth pass), best of 12 boxes: bf16 [head, dim, batch,
    peer] 79 -> 93% of the copy ceiling, fp8 [head, dim, batch, peer] in blocks of 16 58 -> 97%, float32
    [batch, dim, head, peer] at its default box 49 -> 91%.  With dim outside peer the loop stays: bf16
    [batch, head, dim, peer] 83 -> 66% at the default box, 71% at best; fp8 with one scale per row 67 -> 46%.
    """
    axes = spec.payload.axes
    return axes[-1] == "peer" and axes[-2] != "dim"


def default_combine_config(spec: DcpSpec, N: int, heads_per_peer: int, D: int, B: int, elem_size: int) -> CombineConfig:
    """Small one-warp tiles, grown only until a program loads about 2048 elements over its N peers.

    Each program loops over the N peers, so parallelism comes from many programs.  H200, bf16, D = 512
    (benchmarks/results/): 2 heads x 128 elements x 1 warp was the best of a 27-config grid for vllm_a2a
    at N = 8, B = 8 (1.88 µs) and B = 1024 (36.3 µs), where the earlier 4 x 512 x 4 warps took 2.94 µs
    at B = 8; with N = 2 the same small tile starves each program (H = 16, B = 1024: 11.4 µs against
    sglang's 7.8 µs with 512-element programs), hence the growth with 2048 / N.
    """
    heads, dims = next_pow2(heads_per_peer), next_pow2(D)
    if combine_peers_in_tile(spec) and combine_load_axis(spec) == "batch":
        # Every peer's partial in one vector, runs of batch outside it.  The same probe, 12 boxes: 32 x 1 x 32,
        # 4 warps took bf16 [head, dim, batch, peer] to 88% of the copy ceiling at B 1024 (the best, 8 warps,
        # 93%) and fp8 in blocks of 16 to 97%, where the generic default box (1 x 2 x 128) took 47 and 34%.
        # Head outside peer keeps the generic box (float32: 91%).
        return CombineConfig(block_batch=min(next_pow2(B), 32), block_head=1, block_dim=min(dims, 32), num_warps=4)
    if spec.payload.axes[-1] == "batch":
        # Loads coalesce along batch: a long run of rows, a narrow dim block.  H200, N 8, B 1024, H 128,
        # D 512, 24 boxes of 32-256 rows x 8-32 dims x 1 or 4 warps (probe_unseen_dcp.py, fourteenth pass):
        # 128 x 16 x 4 warps took bf16 [head, dim, peer, batch] from 55% of the copy ceiling (16 x 32 x 4)
        # to 94% and float32 [dim, peer, head, batch] from 89% (32 x 32 x 1) to 95%; fp8 wires lost nothing
        # to 32 x 32 x 1 in that grid but one box (50-52%, 60% once at 64 x 32 x 1), so they keep its rows and
        # warp.  Their dims widen to 64 where the grid holds eight waves: five drawn fp8 combines at B 1024
        # (twentieth pass) went from 37-51% of the copy to 42-63% (blocks of 16 50.8 -> 41.0 µs, one scale per
        # row 58.9 -> 51.3; blocks of 128 unchanged at 51%).  32 x 128 x 1 took 54-61% but holds 128 elements
        # per thread, outside the tuner's space; 32 x 128 x 2 fell to 21% on one of them.  At B 64 (128 programs
        # at 128 dims) every wider box was slower (5.66 µs against 6.5 and more).
        # Where a scale block spans 128 dims or more, 32 x 128 x 1 is the default from four waves of programs,
        # although it holds 128 elements per thread, past the space's rule (the tuner's finalists still race
        # it).  The two such drawn specs (twenty-first pass; seed 3's 3 and 9, one scale per row and blocks of
        # 128): B 1024 42 -> 55% and 52 -> 61% of the copy, B 512 32 -> 47% and 42 -> 56%; at B 256 one gained
        # (20.0 -> 15.5 µs) and one lost (12.5 -> 13.6), at B 64 both lost.  Offline (sm_90) both widths run
        # the same instructions per element; the wide box holds 255 registers against 168.
        if spec.fp8:
            rows = min(next_pow2(B), 32)

            def programs_at(width: int) -> int:
                return -(-B // rows) * heads_per_peer * -(-D // min(dims, width))

            if spec.scale_block_of(D) >= 128 and programs_at(128) >= 2 * _TWO_WAVES:
                block_dim = min(dims, 128)
            elif programs_at(64) >= 4 * _TWO_WAVES:
                block_dim = min(dims, 64)
            else:
                block_dim = min(dims, 32)
            return CombineConfig(block_batch=rows, block_head=1, block_dim=block_dim, num_warps=1)
        rows = min(next_pow2(B), 128)
        return CombineConfig(
            block_batch=rows, block_head=1, block_dim=min(dims, 16), num_warps=max(1, min(4, rows // 32))
        )
    if spec.payload.axes[-1] == "head":
        # Loads coalesce along head: a run of heads per row, a few rows, a narrow dim block.  Near the tuner's
        # picks on the H200 at N 8, B 1024, H 128, D 512: bf16 [peer, batch, dim, head] 4 x 16 x 32, 2 warps,
        # 41.3 µs (2 heads x 128 took 88.6); float32 [batch, peer, dim, head] 2 x 16 x 32, 1 warp, 70.2 (90.8).
        block_batch, block_head, block_dim = min(next_pow2(B), 4), min(heads, 16), min(dims, 32)
        warps = max(1, min(8, block_batch * block_head * block_dim // 1024))
        return CombineConfig(block_batch=block_batch, block_head=block_head, block_dim=block_dim, num_warps=warps)
    block_head, block_dim = min(2, heads), min(128, dims)

    def programs() -> int:
        return B * -(-heads_per_peer // block_head) * -(-D // block_dim)

    def grow_to_2048_over_peers(min_programs: int) -> None:
        nonlocal block_head, block_dim
        while block_head * block_dim * N < 2048 and programs() >= min_programs:
            if block_dim < min(512, dims):
                block_dim *= 2
            elif block_head < heads:
                block_head *= 2
            else:
                break

    if programs() < _ONE_WAVE:
        # Under one wave the combine is latency-bound: a program of 4 warps over about 2048 / N elements, split
        # back along heads until 32 programs run.  H100, the 7 points under a wave of a grid at B 1-32 (N 2-8;
        # H 128 and 16 with D 512, H 32 with D 128), six bundled specs (`gpu_session.sh smallb`, twenty-fourth
        # pass): 1.00-1.20x the one-warp 2 x 128 tile's speed at all 42 points (1.08x geometric mean), against
        # sglang 0.98-1.28x at the 28 it can combine, where the one-warp tile had 0.90x at worst.  The H200
        # database's picks at B 1 hold 4 warps in 17 of its 21 bf16 combines.  An fp8 wire keeps one warp on
        # tiles under 512 elements (N 8): 4 warps there took 1.54-1.60 µs against 1.49-1.57.  Tiles whose N
        # partials hold under 1024 elements (small heads or D) take fewer warps, so that each thread still loads
        # 16 bytes of bf16 (the tuner's space holds no less beyond one warp).
        grow_to_2048_over_peers(min_programs=0)
        while programs() < 32 and block_head > 1:
            block_head //= 2
        loaded = block_head * block_dim * N
        warps = 4 if loaded >= 1024 else 2 if loaded >= 512 else 1
        if spec.fp8 and block_head * block_dim < 512:
            warps = 1
        return CombineConfig(block_batch=1, block_head=block_head, block_dim=block_dim, num_warps=warps)
    grow_to_2048_over_peers(min_programs=4 * _ONE_WAVE)
    warps = max(1, min(8, block_head * block_dim // 256))
    return CombineConfig(block_batch=1, block_head=block_head, block_dim=block_dim, num_warps=warps)
