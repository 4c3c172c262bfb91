#!/usr/bin/env bash
# The device runs of this release, as they were made (two calls of at most 10 minutes on one lent H200).
#   bash benchmarks/gpu_session.sh tune OUT     GPU tests, then the re-tune of the DCP and Ulysses grids below
#   bash benchmarks/gpu_session.sh bench OUT    the benchmarks, with the database the first call wrote
#   bash benchmarks/gpu_session.sh fp8 OUT      what the fp8 wire still needs: its GPU tests, its pack's tune, its benchmark
#   bash benchmarks/gpu_session.sh rebench OUT  every DCP layout against sglang after the v2 kernels, Ulysses' small sizes
#   bash benchmarks/gpu_session.sh retune OUT   the DCP buckets the tune step left out (B 8, 256; H 16; D 128), fp8 combine
#   bash benchmarks/gpu_session.sh final OUT    the DCP benchmarks again, with the database retune wrote
#   bash benchmarks/gpu_session.sh fill OUT     the studies retune's time limits cut (vllm_a2a, tuned last), then bench_dcp
#   bash benchmarks/gpu_session.sh probe OUT    combine's whole space at the points still slower than sglang (rotated and
#                                               L2-resident), the dispatch check, the large Ulysses sizes with the new tune
#   bash benchmarks/gpu_session.sh combine OUT  every DCP combine entry again, now also timed L2-resident (its timing hash changed)
#   bash benchmarks/gpu_session.sh warm OUT     bench_dcp.py's rotated and L2-resident grid with that database
#   bash benchmarks/gpu_session.sh points OUT   the combine points warm left under sglang, re-tuned with 96 trials; bench_dcp again
#   bash benchmarks/gpu_session.sh v2 OUT       bench_dcp_v2.py with the re-tuned combine database
#   bash benchmarks/gpu_session.sh dispatch OUT dispatch picks every entry of the committed database on the GPU
#   bash benchmarks/gpu_session.sh ulysses OUT  bench_ulysses.py's large sizes, every variant writing one output
#   bash benchmarks/gpu_session.sh mask OUT     three ways for the masked pack to write empty rows, against the unmasked
#                                               pack (interleaved); bench_ulysses.py's small sizes under the one-output rule
#   bash benchmarks/gpu_session.sh threshold OUT the contract-v2 GPU tests; the masked pack's two forms from 1 to 8 MiB
#                                               read, every 4th request empty and none (where the launcher switches)
#   bash benchmarks/gpu_session.sh pack OUT      every DCP pack entry of the lse and (max, sum) specs again (the masked
#                                               pack's launcher changed its kernel's source hash), the dispatch check
#   bash benchmarks/gpu_session.sh dcp OUT       bench_dcp.py's rotated and L2-resident grid alone (after pack: v2, then dcp)
#   bash benchmarks/gpu_session.sh space OUT     the masked pack over 48 configs of the space at B <= 8 points still over 3%
#   bash benchmarks/gpu_session.sh gpu OUT       every GPU test (in 12 workers where .whl/ carries pytest-xdist and execnet)
#   bash benchmarks/gpu_session.sh checkup OUT   (twenty-seventh pass) every GPU test (as `gpu`), dispatch_overhead.py (its
#                                               table was last written by layoutgen 0.1.0), the dispatch check
#   bash benchmarks/gpu_session.sh exhaustive OUT pynccl_a2a_aligned combine at N 8, B 64 over its whole space (the probes
#                                               hold a config faster than sglang rotated and L2-resident there that TPE
#                                               missed); bench_dcp.py on that layout (and on EXHAUSTIVE_SPEC, another
#                                               bundled spec searched the same way instead: vllm_a2a, twenty-third pass;
#                                               EXHAUSTIVE_N and EXHAUSTIVE_BUCKET pick another point: N 4, B 1 for
#                                               pynccl_a2a_aligned, thirty-fifth pass, which headtohead read 0.98x
#                                               sglang L2-resident; run in the thirty-eighth: the
#                                               default, 1.29 µs, is the fastest of its 112 configs)
#   bash benchmarks/gpu_session.sh prefetch OUT  combine with every partial loaded before the weights (probe_prefetch/,
#                                               rendered from the changed template) against the committed kernel, 40
#                                               configs of the space and the small grid, rotated and L2-resident
#   bash benchmarks/gpu_session.sh dram OUT      the DRAM-bound Ulysses points where torch.compile beat our kernels: copy
#                                               shapes, compile (and its code), 40 configs of the space
#   bash benchmarks/gpu_session.sh hints OUT     the Ulysses copy with its loads marked evict_first / evict_last (probe_hints/,
#                                               rendered from the changed _copy.jinja) against the committed one
#   bash benchmarks/gpu_session.sh uretune OUT   every Ulysses entry again (its timing now writes one output for every
#                                               rotating set: the hash changed), more trials than the default 24
#   bash benchmarks/gpu_session.sh ubench OUT    bench_ulysses.py's large and small sizes with that database
#   bash benchmarks/gpu_session.sh uexhaustive OUT the two Ulysses scatters of N 4, S_local 4096 furthest from the copy
#                                               (ulysses_qkv_gqa, yunchang_ulysses_head_major) over their whole
#                                               space (759 configs; 48 TPE trials kept the default); bench_ulysses.py
#   bash benchmarks/gpu_session.sh umajor OUT    the Ulysses scatters and gathers again (their programs now walk one tensor
#                                               after another: the source hash changed), then bench_ulysses.py
#   bash benchmarks/gpu_session.sh even OUT      the Ulysses copy without bounds where every block divides its extent
#                                               (probe_even/, rendered from the changed _copy.jinja) against the
#                                               committed one, 17 configs each, at six points
#   bash benchmarks/gpu_session.sh uout OUT      the three single-tensor Ulysses kernels compile led at N 4, S_local 4096
#                                               over their whole space; the small sizes' head counts; bench_ulysses.py
#   bash benchmarks/gpu_session.sh ufinal OUT    ulysses_qkv_gqa scatter N 4, S_local 4096 over its whole space, the
#                                               N 8 / H 16 studies uout's limit cut, bench_ulysses.py, the dispatch
#                                               check, every GPU test
#   bash benchmarks/gpu_session.sh index64 OUT   the 64-bit test of the tensor-major programs after its fix, the scatter
#                                               and gather entries the fix made stale (12 trials), bench_ulysses.py
#   bash benchmarks/gpu_session.sh flag OUT      the contract-v2 GPU tests; the masked pack of generated/ against that of
#                                               probe_rowflag/ (the specs rendered before a pack template change; the
#                                               eighth pass: a scalar flag per tile, dropped), at B <= 8 and B 64
#   bash benchmarks/gpu_session.sh chunks OUT    (ninth pass) the fp8 pack that walks scale blocks in chunks where the
#                                               payload transposes: its GPU tests, the tuner on the two fp8 layouts of
#                                               bench_unseen_specs.py it was written for, bench_unseen_specs.py's DCP half
#   bash benchmarks/gpu_session.sh fp8tune OUT   the bundled fp8 packs over the DCP grid (their source hash changed with the
#                                               chunked form: every entry is stale)
#   bash benchmarks/gpu_session.sh chunkbench OUT bench_unseen_specs.py, bench_dcp_v2.py and the dispatch check with
#                                               fp8tune's database and the chunked pack's new defaults
#   bash benchmarks/gpu_session.sh fp8fill OUT    the vllm_a2a_fp8 studies fp8tune's limits cut (pack and combine at H 16 /
#                                               D 512 and H 32 / D 128), bench_dcp_v2.py, the dispatch check
#   bash benchmarks/gpu_session.sh fp8probe OUT  (tenth pass) probe_fp8_transpose.py: the transposing fp8 packs over a
#                                               grid of boxes, then ncu on three defaults (the pass also timed the
#                                               chunk prefetch, archive/probe_chunk_prefetch.diff, now in the template)
#   bash benchmarks/gpu_session.sh fp8nt OUT     spec 7 with its codes stored along dim (no transpose; wrong bytes, timed
#                                               unchecked: archive/probe_fp8_nt.diff), and ncu's pipes and instructions
#   bash benchmarks/gpu_session.sh tenth OUT     the fp8 GPU tests and bench_unseen_specs.py after the chunk prefetch
#   bash benchmarks/gpu_session.sh words OUT     the batch-innermost fp8 pack's 32-bit words: GPU tests, spec 7's grid, unseen
#                                               (the eleventh pass's capmask and useq steps, which timed
#                                               archive/probe_combine_capacity_bound.diff and
#                                               archive/probe_ulysses_seq_specialised.diff, removed: both adopted)
#   bash benchmarks/gpu_session.sh maxnreg OUT   (eleventh pass) the transposing fp8 packs under ptxas register caps 64-80
#   bash benchmarks/gpu_session.sh regcap OUT    (eleventh pass) the transposing fp8 packs' register cap over four seeds,
#                                               bench_unseen_specs.py, the fp8 and Ulysses GPU tests
#   bash benchmarks/gpu_session.sh regdefaults OUT their new defaults on the same specs, bench_unseen_specs.py, GPU tests
#   bash benchmarks/gpu_session.sh boxes OUT     (twelfth pass) the Ulysses kernels of bench_unseen_specs.py's specs 13, 15
#                                               and 17 over boxes of the default rule and of the tuner's space;
#                                               bench_unseen_specs.py's Ulysses half; the Ulysses GPU tests
#   bash benchmarks/gpu_session.sh allboxes OUT  (thirteenth pass) the Ulysses kernels of all eight specs of the sample over
#                                               tiles of 1-16 KiB and 2, 4, 8 warps; spec 17's gather with H_kv = H
#   bash benchmarks/gpu_session.sh joined OUT    (thirteenth pass) tensors alternating innermost on the wire moved as one box
#                                               (tl.interleave / tl.split): spec 15's scatter and gather over tiles and
#                                               warps, bench_unseen_specs.py's Ulysses half, the Ulysses GPU tests
#   bash benchmarks/gpu_session.sh farthest OUT  (thirteenth pass) the two Ulysses kernels of the sample farthest from the copy
#                                               (spec 13's gather_out, spec 17's gather) over 60 configs of the tuner's space
#   bash benchmarks/gpu_session.sh dense OUT     (thirteenth pass) k/v boxes of their own heads and the stride outside a dense
#                                               short innermost axis at compile time: the kernels it renders for (specs
#                                               13 and 17) over tiles and warps, bench_unseen_specs.py's Ulysses half,
#                                               the Ulysses GPU tests
#   bash benchmarks/gpu_session.sh unseen14 OUT  (fourteenth pass) the Ulysses kernels of all eight specs over runs of 32
#                                               and 64 bytes; bench_unseen_specs.py's transposing DCP combines over 48
#                                               configs of the tuner's space and 24 boxes along batch
#                                               (probe_unseen_dcp.py); bench_unseen_specs.py's DCP half
#   bash benchmarks/gpu_session.sh fifteen OUT   (fifteenth pass) a plain copy into padded rows (probe_row_padding.py);
#                                               the dim-innermost pack defaults of this tree and of OLD_TREE (a copy of
#                                               the previous package, first on PYTHONPATH) at B 1-1024; bench_unseen_specs.py's
#                                               DCP half; the DCP GPU tests
#   bash benchmarks/gpu_session.sh sixteen OUT   (sixteenth pass) the transposing fp8 combines, their scales loaded as a
#                                               3-D tile, against OLD_TREE's: seed 0's specs 1 and 7 over boxes, the
#                                               other seeds' defaults; the Ulysses programs' order along seq
#                                               (ORDER_TREE, a variant that reads PROBE_SEQ_GROUP) on spec 13
#                                               (a call returns at most 8 files: tar OUT before it ends)
#   bash benchmarks/gpu_session.sh peer OUT      (seventeenth pass) combines with `peer` innermost: the four probe specs of
#                                               benchmarks/specs/ with this tree and with archive/probe_peer_tile_combine.diff
#                                               and archive/probe_peer_inner_combine_default.diff (each applied to a copy),
#                                               B 64 and 1024, defaults and a grid; OUT.tgz (their packs' defaults:
#                                               archive/probe_unseen_dcp_peer_pack_H200.*)
#   bash benchmarks/gpu_session.sh seventeen OUT (seventeenth pass) the peers-in-tile combine as adopted: the probe specs of
#                                               benchmarks/specs/ at B 64 and 1024, defaults and a grid; OLD_TREE's on
#                                               bf16 [batch, head, dim, peer]; the GPU combine tests; OUT.tgz
#   bash benchmarks/gpu_session.sh eighteen OUT  (eighteenth pass) packs of runs of (batch, peer) and (head, peer) pairs: three
#                                               probe specs at B 64 and 1024, defaults and 12 configs of the space, and
#                                               OLD_TREE's box defaults; the contract-v2 GPU tests; OUT.tgz
#   bash benchmarks/gpu_session.sh eighteen_fp8 OUT (eighteenth pass) the same for the two fp8 probe specs of pairs, and
#                                               the fp8 GPU tests of layouts with peer innermost; OUT.tgz
#   bash benchmarks/gpu_session.sh eighteen_grid OUT (eighteenth pass) the pairs packs still under 80% over boxes of
#                                               64-256 pairs (fp8 blocks of 16 and 64; bf16 head pairs); OUT.tgz
#   bash benchmarks/gpu_session.sh nineteen OUT  (nineteenth pass) peer and head as one axis of global heads: spec 13's
#                                               gather_out as generated, over the default rule's boxes and 12 of the
#                                               space; the merged kernels of seeds 2 and 5; bench_unseen_specs.py's
#                                               Ulysses half; the Ulysses GPU tests; OUT.tgz
#   bash benchmarks/gpu_session.sh nineteen_dcp OUT (nineteenth pass) DCP packs of (peer, head) pairs: bf16 [batch, dim, peer,
#                                               head] at H 32 and 128 and seed 0's spec 1 (fp8, the same order), B 64 and
#                                               1024, defaults and 8 of the space, and OLD_TREE's box defaults; the GPU
#                                               tests of those packs; OUT.tgz
#   bash benchmarks/gpu_session.sh twenty OUT   (twentieth pass) the four drawn transposing fp8 packs under 80% over boxes
#                                               that extend the destination's run past one axis (more peers, batch rows or
#                                               whole rows in one pass at 16 warps), with and without register caps; OUT.tgz
#   bash benchmarks/gpu_session.sh twenty_rows OUT (twentieth pass) batch-innermost fp8 packs with blocks of 256 or 512 taken
#                                               whole: seed 3's spec 3 (one scale per row) and a probe spec in blocks of
#                                               256 over boxes of rows x dims x warps, the new defaults; the fp8 GPU
#                                               tests; OUT.tgz
#   bash benchmarks/gpu_session.sh twenty_combine OUT (twentieth pass) the combine of bf16 [batch, dim, peer, head] with the peers
#                                               in the tile (archive/probe_peer_head_tile_combine.diff on a copy, not
#                                               adopted) at H 32 and 128, B 64 and 1024: default, 6 of the space and a
#                                               grid, and this tree's per-peer loop; the GPU combine tests of peers in
#                                               the tile and the fp8 GPU tests of batch-innermost packs; OUT.tgz
#   bash benchmarks/gpu_session.sh batchfirst OUT (twentieth pass) vllm_a2a's combine with its programs walking batch fastest
#                                               (sglang's grid order; a variant of the generated module written into OUT)
#                                               beside the committed one and sglang, rotated at five points and
#                                               L2-resident at N 8, B 64
#   bash benchmarks/gpu_session.sh fp8combine OUT (twentieth pass) seed 0's fp8 combines under 55% (specs 1 and 7) over dim
#                                               blocks of 64-256 beside their defaults, B 1024
#   bash benchmarks/gpu_session.sh fp8combine2 OUT (twentieth pass) the same boxes on the drawn fp8 combines with batch innermost
#                                               of seeds 1-3 at B 1024, and seed 0's spec 7 at B 64
#   bash benchmarks/gpu_session.sh fp8combine3 OUT (twentieth pass) the fp8 batch-innermost combines' default of its tree (32 x 128 x 1
#                                               at B 1024; fp8combine4 then moved it to 32 x 64 x 1) against the old box
#                                               (32 x 32 x 1) at B 256 and 1024
#   bash benchmarks/gpu_session.sh fp8combine4 OUT (twentieth pass) the five fp8 batch-innermost combines at B 1024 over 32 rows x
#                                               64 or 128 dims x 1 or 2 warps (the tuner's space allows 64 per thread)
#   bash benchmarks/gpu_session.sh twentyone OUT (twenty-first pass) the fp8 batch-innermost combines with blocks of at least 128
#                                               (seed 3's specs 3 and 9) at their new default (32 x 128 x 1 from B 1024)
#                                               beside 32 x 64 x 1, B 512 and 1024; the fp8 GPU combine tests
#   bash benchmarks/gpu_session.sh unseen_dcp OUT bench_unseen_specs.py's DCP rows again (the Ulysses rows kept from
#                                               the committed JSON)
#   bash benchmarks/gpu_session.sh stats_tile OUT (twenty-first pass) combines whose stats hold peer at stride 1, this tree (a
#                                               row's N entries loaded as one tile) against OLD_TREE's (a load per
#                                               peer), with payloads whose stats layout differs only (the aligned
#                                               controls, unchanged code); the GPU combine tests of that form.
#                                               STATS_TILE_SPECS, _BATCHES, _LABEL: other spec files, batches, label
#   bash benchmarks/gpu_session.sh twentytwo OUT (twenty-second pass) the drawn head-innermost fp8 packs with small boxes of heads
#                                               over rows or peers x 16 heads x 16-128 dims x 2 or 4 warps (a run of
#                                               several rows or peers of 16 heads, a whole sector of scales where they
#                                               hold batch innermost), B 64 and 1024; OUT.tgz
#   bash benchmarks/gpu_session.sh twentytwo_scales OUT (twenty-second pass) head-innermost fp8 packs whose scales hold batch
#                                               or peer innermost: this tree's default (a sector of scales per program)
#                                               beside boxes of 1-8 rows or peers, five probe specs of benchmarks/specs/
#                                               (blocks of 16, 32, 64; dim next to head; peer innermost), B 64 and
#                                               1024; the fp8 GPU pack tests; OUT.tgz
#   bash benchmarks/gpu_session.sh twentytwo_check OUT (twenty-second pass; run in the twenty-third, on an H100) the
#                                               adopted default (scales along batch only, blocks of 64 in 4 rows x 64
#                                               dims) on blocks of 64 and 32 beside the old box; the fp8 GPU tests of
#                                               the head-innermost layout with batch-innermost scales
#   bash benchmarks/gpu_session.sh smallb OUT  (twenty-fourth pass) the dim-innermost combines' default at small batches
#                                               (under one wave of programs) beside four-warp tiles, six bundled specs
#                                               at B 1-32, with sglang (run before and after the default changed)
#   bash benchmarks/gpu_session.sh chints OUT  (twenty-ninth pass) vllm_a2a's combine with its partial loads marked
#                                               evict_first or .cg, beside the committed module, at N 8, B 64 (under
#                                               sglang rotated) and two points around it, rotated and L2-resident;
#                                               then every GPU test (as `gpu`; not with CHINTS_PROBES_ONLY=1)
#   bash benchmarks/gpu_session.sh fresh OUT   (twenty-ninth pass) probe_fresh_combine.py: vllm_a2a's combine, committed and
#                                               evict_first, on receive buffers just written by an exchange-like copy
#   bash benchmarks/gpu_session.sh lift OUT    (thirtieth pass) with LIFT_PROBE=1, the helix combines with the tiny-sum lift
#                                               (a multiply per peer) beside SHIFT_TREE's (a folder of the helix modules
#                                               of d3f2121: a lowered shift, dropped) and OLD_TREE's (of 1a35e17: no
#                                               lift), three points (run on the H100 and the H200); then, on an H200,
#                                               the three re-tuned over the DCP grid (their source hashes changed) and
#                                               the database check
#   bash benchmarks/gpu_session.sh hostv2 OUT  (thirty-first pass) dispatch_overhead.py with the contract-v2 rows (masked pack,
#                                               pack from (max, sum), scaled combine, combine with its LSE) on pynccl_a2a
#                                               and trtllm_helix_native_v2, three runs each (the host's noise is large)
#   bash benchmarks/gpu_session.sh smalldefaults OUT (thirty-first pass) the default pack and combine beside small boxes at
#                                               B 1 and 8 (N 8, H 128, D 512) for pynccl_a2a (rows 4-byte aligned),
#                                               pynccl_a2a_aligned and vllm_a2a: is the default's gap to the H200's
#                                               tuned configs there (default_us in the database) real? Then hostv2
#   bash benchmarks/gpu_session.sh maskwarps OUT (thirty-first pass) probe_mask_warps.py: plain, masked and masked with spread
#                                               flags, one box at 1-8 warps, rotated and back to back, B 1 and 8
#   bash benchmarks/gpu_session.sh turns OUT  (thirty-second pass) bench_dcp_v2.py with the masked pack timed in turn
#                                               beside the unmasked one, which is timed twice (this run's noise), twice
#   bash benchmarks/gpu_session.sh headtohead OUT (thirty-third pass) bench_dcp_v2.py's whole grid (the masked pack in
#                                               turn), then bench_dcp.py --quick --warm with ours and sglang's kernels
#                                               timed in turn (OUT/v2, OUT/dcp: the committed results' runs)
#   bash benchmarks/gpu_session.sh liftbench OUT bench_dcp_v2.py with lift's database (copy OUT/NVIDIA_H200.json into
#                                               tuning_db/ first where the tree is carried afresh)
#   bash benchmarks/gpu_session.sh h100tune OUT (thirty-ninth pass, on an H100) a first database for the H100: every bundled
#                                               DCP spec's pack and combine over the H200's grid (H 128 / D 512 at N 2, 4,
#                                               8, B 1 ... 4096; H 16 / D 512 and H 32 / D 128 at N 2, 8, B 8, 1024)
#   bash benchmarks/gpu_session.sh h100bench OUT the studies h100tune's limits cut (resumed), the dispatch check, then
#                                               bench_dcp.py --quick --warm on the H100 with that database
#                                               (run in the thirty-ninth: 468 decisions over h100tune, h100bench and
#                                               h100tune twice more; tune_H100.md)
#   bash benchmarks/gpu_session.sh h100utune OUT (fortieth pass, on an H100) every bundled Ulysses spec's kernels over the
#                                               H200's Ulysses grid (H 32 at N 4, 8, S_local 16, 1024, 4096; H 64 at
#                                               N 2, 8, S_local 1024, 16384; bench_ulysses.py's two small points)
#   bash benchmarks/gpu_session.sh h100ubench OUT the studies h100utune's limits cut (resumed), the database and dispatch
#                                               checks, then bench_ulysses.py --quick with that database
#   bash benchmarks/gpu_session.sh h100usmall OUT bench_ulysses.py --small with it
#   bash benchmarks/gpu_session.sh maskvariants OUT (fortieth pass) the masked pack of generated/ against three rewrites of
#                                               its flag and stores (benchmarks/probe_pack_rewrites.py over, oneflag,
#                                               both), at the B <= 8 points the tuned configs of both cards left over
#                                               1.03x
#   bash benchmarks/gpu_session.sh maskroles OUT (fortieth pass) the same against two more: split (a program for the live
#                                               rows and one for the empty rows of each tile) and gate (the stats' flag
#                                               loaded only where the stats are stored), each run twice
# OUT: a folder for logs and results. The lent machine has torch and Triton but not pydantic or optuna:
# `.whl/` carries them as wheels (see /work/.library/device/README.md), installed first.
set -uo pipefail
step=$1
out=$2
mkdir -p "$out"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
    [ -f .whl/sglang_dcp_kernels.py ] && export LAYOUTGEN_SGLANG_DCP_KERNELS=$PWD/.whl/sglang_dcp_kernels.py
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee "$out/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/device.txt"
# The bundled specs by family (one line each: DCP, Ulysses, DCP with an fp8 wire), from one import.
{ read -r dcp_specs; read -r ulysses_specs; read -r fp8_specs; } < <(python3 -c "
from layoutgen.spec import bundled_specs
specs = bundled_specs().items()
print(' '.join(n for n, s in specs if s.family == 'dcp'))
print(' '.join(n for n, s in specs if s.family == 'ulysses'))
print(' '.join(n for n, s in specs if s.family == 'dcp' and s.fp8))")
# One DCP kernel (or all) over the grid the re-tunes below cover: H 128 / D 512 at N 2, 4, 8 and buckets 1 ... 4096, then
# H 16 / D 512 and H 32 / D 128 at N 2, 8 and buckets 8, 1024; reports $out/REPORT_{h128,h16,d128}.md.
#   tune_dcp_grid KERNEL REPORT "SPECS" SECONDS_H128 SECONDS_EACH_SMALL   (KERNEL "": every kernel)
tune_dcp_grid() {
    local kernel=$1 report=$2 specs=$3
    timeout "$4" python3 -m layoutgen.cli tune --spec $specs ${kernel:+--kernel "$kernel"} --shape N=2,4,8 --shape H=128 \
        --shape D=512 --bucket 1 8 64 256 1024 4096 --db tuning_db --report "$out/${report}_h128.md" 2>&1 | tail -2
    timeout "$5" python3 -m layoutgen.cli tune --spec $specs ${kernel:+--kernel "$kernel"} --shape N=2,8 --shape H=16 --shape D=512 \
        --bucket 8 1024 --db tuning_db --report "$out/${report}_h16.md" 2>&1 | tail -2
    timeout "$5" python3 -m layoutgen.cli tune --spec $specs ${kernel:+--kernel "$kernel"} --shape N=2,8 --shape H=32 --shape D=128 \
        --bucket 8 1024 --db tuning_db --report "$out/${report}_d128.md" 2>&1 | tail -2
}
# Every Ulysses kernel over the grid of the H200's database: H 32 at N 4, 8 and S_local 16, 1024, 4096; H 64 at N 2, 8
# and S_local 1024, 16384; then bench_ulysses.py's small points (N 2, H 32, S_local 1; N 8, H 16, S_local 64).
# Reports $out/REPORT_{h32,h64,small_n2,small_n8}.md.
#   tune_ulysses_grid REPORT SECONDS_H32 SECONDS_EACH_SMALL SECONDS_H64
tune_ulysses_grid() {
    local report=$1
    timeout "$2" python3 -m layoutgen.cli tune --spec $ulysses_specs --shape N=4,8 --shape H=32 --shape D=128 \
        --bucket 16 1024 4096 --trials 48 --db tuning_db --report "$out/${report}_h32.md" 2>&1 | tail -2
    timeout "$3" python3 -m layoutgen.cli tune --spec $ulysses_specs --shape N=2 --shape H=32 --shape D=128 \
        --bucket 1 --trials 48 --db tuning_db --report "$out/${report}_small_n2.md" 2>&1 | tail -2
    timeout "$3" python3 -m layoutgen.cli tune --spec $ulysses_specs --shape N=8 --shape H=16 --shape D=128 \
        --bucket 64 --trials 48 --db tuning_db --report "$out/${report}_small_n8.md" 2>&1 | tail -2
    timeout "$4" python3 -m layoutgen.cli tune --spec $ulysses_specs --shape N=2,8 --shape H=64 --shape D=128 \
        --bucket 1024 16384 --trials 32 --db tuning_db --report "$out/${report}_h64.md" 2>&1 | tail -2
}
# The packaged database file of this machine's GPU (tuning_db/NVIDIA_H200.json on an H200).
device_database() {
    python3 -c "import torch; from layoutgen.tuning_db import device_file_name
print('tuning_db/' + device_file_name(torch.cuda.get_device_name()))"
}
# The database a step wrote, its check, then bench_ulysses.py's large and small sizes with it.
#   save_and_bench_ulysses SECONDS_LARGE SECONDS_SMALL
save_and_bench_ulysses() {
    cp tuning_db/NVIDIA_H200.json "$out/"
    python3 -m layoutgen.cli db check 2>&1 | tail -1
    timeout "$1" python3 benchmarks/bench_ulysses.py --quick --out "$out" 2>&1 | tail -1
    timeout "$2" python3 benchmarks/bench_ulysses.py --small --out "$out" 2>&1 | tail -1
}
# bench_unseen_specs.py's seed-0 specs 1 ([batch, dim, peer, head], one scale per row) and 7 ([peer, head, dim,
# batch], blocks of 16), the transposing fp8 packs, as spec files in DIR.
#   unseen_fp8_specs DIR
unseen_fp8_specs() {
    mkdir -p "$1"
    python3 -c "
import sys, yaml
sys.path.insert(0, 'benchmarks')
from bench_unseen_specs import sample_specs
specs = sample_specs(12, 0, 0)
for index in (1, 7):
    with open(f'$1/unseen_dcp_{index:02d}.yaml', 'w') as handle:
        yaml.safe_dump(specs[index][0], handle, sort_keys=False)"
}
# vllm_a2a's generated module with its combine's partial loads marked evict_first, and .cg, as DIR/evict_first.py
# and DIR/cg.py (twenty-ninth pass).
#   hinted_combines DIR
hinted_combines() {
    mkdir -p "$1"
    local load='partial = tl.load(partial_pointer, mask=mask, other=0.0)'
    sed "s/$load/partial = tl.load(partial_pointer, mask=mask, other=0.0, eviction_policy=\"evict_first\")/" \
        generated/vllm_a2a.py > "$1/evict_first.py"
    sed "s/$load/partial = tl.load(partial_pointer, mask=mask, other=0.0, cache_modifier=\".cg\")/" \
        generated/vllm_a2a.py > "$1/cg.py"
    grep -c 'evict_first\|"\.cg"' "$1/evict_first.py" "$1/cg.py"
}
case "$step" in
tune)
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu tests/ulysses/test_ulysses_gpu.py 2>&1 | tee "$out/gpu_tests.log" | tail -5
    # DCP: every bundled spec (the kernels changed: every entry is stale) at MLA decode H 128, D 512.
    timeout 300 python3 -m layoutgen.cli tune --spec $dcp_specs --shape N=2,4,8 --shape H=128 --shape D=512 \
        --bucket 1 8 64 256 1024 4096 --db tuning_db --report "$out/tune_dcp.md" 2>&1 | tail -3
    # Ulysses: N 2 and 8, H 64 (H_kv 16), D 128, three sequence lengths per rank.
    timeout 150 python3 -m layoutgen.cli tune --spec $ulysses_specs --shape N=2,8 --shape H=64 --shape D=128 \
        --bucket 16 1024 16384 --db tuning_db --report "$out/tune_ulysses.md" 2>&1 | tail -3
    cp tuning_db/NVIDIA_H200.json "$out/"
    ;;
bench)
    timeout 200 python3 benchmarks/bench_dcp_v2.py --quick --out "$out" 2>&1 | tail -4
    timeout 200 python3 benchmarks/bench_dcp.py --quick --warm --out "$out" 2>&1 | tail -4
    timeout 150 python3 benchmarks/bench_ulysses.py --quick --out "$out" 2>&1 | tail -4
    ;;
fp8)
    # 240 s: on a fresh machine the first 120 s compiled and ran only 12 of the 27 tests.
    timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_dcp_fp8_gpu.py 2>&1 | tee "$out/gpu_tests_fp8.log" | tail -5
    timeout 240 python3 -m layoutgen.cli tune --spec $fp8_specs --kernel pack --shape N=2,4,8 --shape H=128 --shape D=512 \
        --bucket 1 64 1024 4096 --db tuning_db --report "$out/tune_dcp_fp8.md" 2>&1 | tail -3
    cp tuning_db/NVIDIA_H200.json "$out/"
    timeout 200 python3 benchmarks/bench_dcp_v2.py --quick --out "$out" 2>&1 | tail -4
    ;;
retune)
    # rebench found the B 8 points dispatching B 64's configs (up to 1.15x slower than the default) and the
    # H 16 / D 128 rows of the grid untuned: their buckets, for every DCP spec.
    timeout 150 python3 -m layoutgen.cli tune --spec $dcp_specs --shape N=2,4,8 --shape H=128 --shape D=512 \
        --bucket 8 256 --db tuning_db --report "$out/tune_dcp_b8_b256.md" 2>&1 | tail -2
    timeout 120 python3 -m layoutgen.cli tune --spec $dcp_specs --shape N=2,8 --shape H=16 --shape D=512 \
        --bucket 8 1024 --db tuning_db --report "$out/tune_dcp_h16.md" 2>&1 | tail -2
    timeout 120 python3 -m layoutgen.cli tune --spec $dcp_specs --shape N=2,8 --shape H=32 --shape D=128 \
        --bucket 8 1024 --db tuning_db --report "$out/tune_dcp_d128.md" 2>&1 | tail -2
    timeout 90 python3 -m layoutgen.cli tune --spec $fp8_specs --kernel combine --shape N=2,4,8 --shape H=128 --shape D=512 \
        --bucket 1 64 1024 4096 --db tuning_db --report "$out/tune_dcp_fp8_combine.md" 2>&1 | tail -2
    cp tuning_db/NVIDIA_H200.json "$out/"
    ;;
final)
    timeout 200 python3 benchmarks/bench_dcp.py --quick --warm --out "$out" 2>&1 | tail -2
    timeout 300 python3 benchmarks/bench_dcp_v2.py --quick --out "$out" 2>&1 | tail -2
    ;;
fill)
    four="pynccl_a2a pynccl_a2a_aligned vllm_a2a flashinfer_mnnvl"
    timeout 80 python3 -m layoutgen.cli tune --spec vllm_a2a --shape N=2,4,8 --shape H=128 --shape D=512 \
        --bucket 1 8 64 256 1024 4096 --db tuning_db --report "$out/tune_fill_h128.md" 2>&1 | tail -2
    timeout 60 python3 -m layoutgen.cli tune --spec $four --shape N=2,8 --shape H=16 --shape D=512 \
        --bucket 8 1024 --db tuning_db --report "$out/tune_fill_h16.md" 2>&1 | tail -2
    timeout 40 python3 -m layoutgen.cli tune --spec vllm_a2a --shape N=2,8 --shape H=32 --shape D=128 \
        --bucket 8 1024 --db tuning_db --report "$out/tune_fill_d128.md" 2>&1 | tail -2
    cp tuning_db/NVIDIA_H200.json "$out/"
    timeout 120 python3 benchmarks/bench_dcp.py --quick --warm --out "$out" 2>&1 | tail -2
    ;;
probe)
    # The points bench_dcp.py found slower than sglang: pynccl_a2a and pynccl_a2a_aligned N 8 B 64 L2-resident,
    # vllm_a2a N 8 B 64 and pynccl_a2a_aligned N 4 B 8 rotated.  The first point is timed twice (a warm-up).
    for run in pynccl_a2a:--resident pynccl_a2a_aligned:--resident vllm_a2a: pynccl_a2a_aligned:; do
        spec=${run%%:*} mode=${run#*:}
        timeout 85 python3 benchmarks/probe_combine.py --module cur=generated/$spec.py --space $mode \
            --point 4:8:128:512 --point 8:64:128:512 --out "$out/probe_space_${spec}${mode:+_resident}.json" 2>&1 | tail -3
    done
    timeout 40 python3 scripts/check_dispatch_gpu.py 2>&1 | tee "$out/dispatch_check_H200.log" | tail -2
    timeout 150 python3 benchmarks/bench_ulysses.py --quick --out "$out" 2>&1 | tail -4
    ;;
combine)
    tune_dcp_grid combine tune_combine "$dcp_specs" 330 70
    cp tuning_db/NVIDIA_H200.json "$out/"
    python3 -m layoutgen.cli db check 2>&1 | tail -3
    ;;
warm)
    # First the 12 studies the combine step's time limits cut (vllm_a2a and trtllm_helix_nccl, tuned last).
    timeout 60 python3 -m layoutgen.cli tune --spec vllm_a2a trtllm_helix_nccl --kernel combine --shape N=2,8 --shape H=16 \
        --shape D=512 --bucket 8 1024 --db tuning_db --report "$out/tune_combine_h16_rest.md" 2>&1 | tail -1
    timeout 60 python3 -m layoutgen.cli tune --spec vllm_a2a trtllm_helix_nccl --kernel combine --shape N=2,8 --shape H=32 \
        --shape D=128 --bucket 8 1024 --db tuning_db --report "$out/tune_combine_d128_rest.md" 2>&1 | tail -1
    cp tuning_db/NVIDIA_H200.json "$out/"
    python3 -m layoutgen.cli db check 2>&1 | tail -1
    timeout 420 python3 benchmarks/bench_dcp.py --quick --warm --out "$out" 2>&1 | tail -4
    ;;
points)
    # warm found combine under sglang at N 8, B 64 (pynccl_a2a_aligned, vllm_a2a) and N 4, B 1 (aligned); the
    # space has configs faster than sglang in both cache states there that 24 TPE trials did not reach.
    timeout 120 python3 -m layoutgen.cli tune --spec pynccl_a2a_aligned vllm_a2a --kernel combine --shape N=8 --shape H=128 \
        --shape D=512 --bucket 64 --trials 96 --retune --db tuning_db --report "$out/tune_combine_n8_b64.md" 2>&1 | tail -1
    timeout 60 python3 -m layoutgen.cli tune --spec pynccl_a2a_aligned --kernel combine --shape N=4 --shape H=128 \
        --shape D=512 --bucket 1 --trials 96 --retune --db tuning_db --report "$out/tune_combine_n4_b1.md" 2>&1 | tail -1
    cp tuning_db/NVIDIA_H200.json "$out/"
    timeout 300 python3 benchmarks/bench_dcp.py --quick --warm --out "$out" 2>&1 | tail -2
    ;;
v2)
    timeout 330 python3 benchmarks/bench_dcp_v2.py --quick --out "$out" 2>&1 | tail -2
    ;;
ulysses)
    timeout 200 python3 benchmarks/bench_ulysses.py --quick --out "$out" 2>&1 | tail -2
    ;;
dispatch)
    timeout 60 python3 scripts/check_dispatch_gpu.py 2>&1 | tee "$out/dispatch_check_H200.log" | tail -2
    ;;
mask)
    timeout 300 python3 benchmarks/probe_pack_mask.py --quick --spec pynccl_a2a --spec vllm_a2a --spec flashinfer_mnnvl \
        --spec trtllm_helix_native_v1 --out "$out/probe_pack_mask_H200.json" 2>&1 | tail -4
    timeout 200 python3 benchmarks/bench_ulysses.py --small --out "$out" 2>&1 | tail -2
    ;;
threshold)
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_dcp_v2_gpu.py 2>&1 | tee "$out/gpu_tests_v2.log" | tail -3
    points=""
    for N in 2 8; do
        for B in 8 16 24 32 48 64; do points="$points --point $N:$B:128:512"; done
        for B in 64 128 256 512; do points="$points --point $N:$B:16:512"; done
        for B in 128 256 512 1024; do points="$points --point $N:$B:32:128"; done
    done
    timeout 400 python3 benchmarks/probe_pack_mask.py --spec pynccl_a2a --spec flashinfer_mnnvl --spec trtllm_helix_native_v1 \
        $points --empty-every 4 --empty-every 0 --out "$out/probe_pack_mask_threshold_H200.json" 2>&1 | tail -3
    ;;
pack)
    lse_specs=$(for spec in $dcp_specs; do case " $fp8_specs " in *" $spec "*) ;; *) printf '%s ' "$spec" ;; esac; done)
    tune_dcp_grid pack tune_pack "$lse_specs" 330 80
    cp tuning_db/NVIDIA_H200.json "$out/"
    python3 -m layoutgen.cli db check 2>&1 | tail -3
    timeout 60 python3 scripts/check_dispatch_gpu.py 2>&1 | tee "$out/dispatch_check_H200.log" | tail -2
    ;;
dcp)
    timeout 540 python3 benchmarks/bench_dcp.py --quick --warm --out "$out" 2>&1 | tail -3
    ;;
space)
    timeout 420 python3 benchmarks/probe_pack_mask.py --space --sample 48 --spec trtllm_helix_nccl --spec flashinfer_mnnvl \
        --point 8:1:128:512 --point 4:8:128:512 --point 8:8:16:512 --out "$out/probe_pack_mask_space_H200.json" 2>&1 | tail -8
    ;;
flag)
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_dcp_v2_gpu.py 2>&1 | tee "$out/gpu_tests_v2.log" | tail -3
    points=""
    for N in 2 4 8; do for B in 1 8; do points="$points --point $N:$B:128:512"; done; done
    for N in 2 8; do points="$points --point $N:8:16:512 --point $N:8:32:128 --point $N:64:128:512"; done
    timeout 400 python3 benchmarks/probe_pack_mask.py --compare per_row=probe_rowflag $points \
        --out "$out/probe_pack_flag_H200.json" 2>&1 | tail -3
    ;;
gpu)
    # The 2**32-element buffers (4-17 GiB each) first and alone: beside 11 other workers they would skip for memory.
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_index64_gpu.py 2>&1 \
        | tee "$out/gpu_tests_index64.log" | tail -2
    # With pytest-xdist in .whl/, 12 workers share the GPU: the suite is compile-bound (212 s on an H100, 23rd pass).
    workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 12")
    timeout 400 python3 -m pytest -q -p no:cacheprovider $workers tests/gpu tests/ulysses/test_ulysses_gpu.py \
        --ignore=tests/gpu/test_index64_gpu.py \
        tests/test_tuning.py::test_gpu_pipeline_times_with_cuda_graphs_and_the_compile_pool 2>&1 \
        | tee "$out/gpu_tests.log" | tail -4
    ;;
maskwarps)
    timeout 300 python3 benchmarks/probe_mask_warps.py --out "$out/probe_mask_warps.json" --point 4:8:128:512 \
        --point 8:1:128:512 --point 8:8:16:512 2>&1 | tail -24
    ;;
smalldefaults)
    small="--specs= --bundled pynccl_a2a,pynccl_a2a_aligned,vllm_a2a --batches 1,8 --sample 0"
    timeout 220 python3 benchmarks/probe_unseen_dcp.py --out "$out" --label small_pack $small --kernel pack \
        --grid 1:1,2,4:256,512:1,4:1,2 2>&1 | tail -2
    timeout 160 python3 benchmarks/probe_unseen_dcp.py --out "$out" --label small_combine $small --kernel combine \
        --grid 1:1,2:128,256,512:1,4 2>&1 | tail -2
    ;&
hostv2)
    for run in 1 2 3; do
        for spec in pynccl_a2a trtllm_helix_native_v2; do
            timeout 80 python3 benchmarks/dispatch_overhead.py --spec $spec --out "$out/run$run" 2>&1 | tail -3
        done
    done
    ;;
turns)
    timeout 250 python3 benchmarks/bench_dcp_v2.py --quick --out "$out" 2>&1 | grep -A2 "^Worst"
    timeout 200 python3 benchmarks/bench_dcp_v2.py --quick --no-fp8 --out "$out/again" 2>&1 | grep -A2 "^Worst"
    ;;
headtohead)
    mkdir -p "$out/v2" "$out/dcp"
    timeout 240 python3 benchmarks/bench_dcp_v2.py --out "$out/v2" 2>&1 | grep -A2 "^Worst"
    timeout 290 python3 benchmarks/bench_dcp.py --quick --warm --out "$out/dcp" 2>&1 \
        | grep -E "^ \"[a-z_]+/(pack|combine)\"|slower_beyond|min_in_turn|min_warm_in"
    ;;
checkup)
    workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 12")
    timeout 400 python3 -m pytest -q -p no:cacheprovider $workers tests/gpu tests/ulysses/test_ulysses_gpu.py \
        tests/test_tuning.py::test_gpu_pipeline_times_with_cuda_graphs_and_the_compile_pool 2>&1 \
        | tee "$out/gpu_tests.log" | tail -4
    timeout 90 python3 benchmarks/dispatch_overhead.py --out "$out" 2>&1 | tail -4
    timeout 60 python3 scripts/check_dispatch_gpu.py 2>&1 | tee "$out/dispatch_check_H200.log" | tail -2
    ;;
exhaustive)
    spec=${EXHAUSTIVE_SPEC:-pynccl_a2a_aligned}
    peers=${EXHAUSTIVE_N:-8}
    bucket=${EXHAUSTIVE_BUCKET:-64}
    timeout 280 python3 -m layoutgen.cli tune --spec "$spec" --kernel combine --shape N=$peers --shape H=128 \
        --shape D=512 --bucket $bucket --exhaustive-limit 1000 --retune --db tuning_db \
        --report "$out/tune_combine_${spec}_n${peers}_b${bucket}_exhaustive.md" 2>&1 | tail -2
    cp tuning_db/NVIDIA_H200.json "$out/"
    python3 -m layoutgen.cli db check 2>&1 | tail -1
    timeout 200 python3 benchmarks/bench_dcp.py --quick --warm --specs $(printf "%s\n" "$spec" pynccl_a2a_aligned | sort -u) --out "$out" 2>&1 | tail -2
    ;;
prefetch)
    for spec in vllm_a2a pynccl_a2a; do
        timeout 110 python3 benchmarks/probe_combine.py --module cur=generated/$spec.py --module prefetch=probe_prefetch/$spec.py \
            --space --sample 40 --point 8:64:128:512 --point 4:8:128:512 --point 2:1:128:512 --point 8:1024:128:512 \
            --out "$out/probe_prefetch_$spec.json" 2>&1 | tail -5
        timeout 90 python3 benchmarks/probe_combine.py --module cur=generated/$spec.py --module prefetch=probe_prefetch/$spec.py \
            --space --sample 40 --resident --point 8:64:128:512 --point 4:8:128:512 --point 2:1:128:512 \
            --out "$out/probe_prefetch_${spec}_resident.json" 2>&1 | tail -4
    done
    ;;
dram)
    timeout 200 python3 benchmarks/probe_ulysses_dram.py --spec ulysses_qkv_gqa --kernel scatter --point 4:4096:32:8:128 \
        --out "$out/probe_ulysses_dram_qkv_scatter.json" 2>&1 | tail -3
    timeout 150 python3 benchmarks/probe_ulysses_dram.py --spec ulysses_qkv_gqa --kernel gather_out --point 4:4096:32:8:128 \
        --out "$out/probe_ulysses_dram_qkv_gather_out.json" 2>&1 | tail -3
    ;;
hints)
    for run in ulysses_qkv_gqa:scatter:4:4096:32:8:128 ulysses_qkv_gqa:gather_out:4:4096:32:8:128 \
        ulysses_qkv_gqa:scatter:8:1024:32:8:128 yunchang_ulysses:scatter:4:4096:32:32:128; do
        IFS=: read -r spec kernel point <<< "$run"
        timeout 110 python3 benchmarks/probe_ulysses_dram.py --spec $spec --kernel $kernel --point "$point" --sample 20 \
            --module first=probe_hints/first/$spec.py --module last=probe_hints/last/$spec.py \
            --out "$out/probe_ulysses_hints_${spec}_${kernel}_${point//:/_}.json" 2>&1 | tail -3
    done
    ;;
uretune)
    timeout 330 python3 -m layoutgen.cli tune --spec $ulysses_specs --shape N=4,8 --shape H=32 --shape D=128 \
        --bucket 16 1024 4096 --trials 48 --db tuning_db --report "$out/tune_ulysses_h32.md" 2>&1 | tail -2
    timeout 230 python3 -m layoutgen.cli tune --spec $ulysses_specs --shape N=2,8 --shape H=64 --shape D=128 \
        --bucket 1024 16384 --trials 32 --db tuning_db --report "$out/tune_ulysses_h64.md" 2>&1 | tail -2
    cp tuning_db/NVIDIA_H200.json "$out/"
    python3 -m layoutgen.cli db check 2>&1 | tail -3
    ;;
ubench)
    timeout 280 python3 benchmarks/bench_ulysses.py --quick --out "$out" 2>&1 | tail -2
    timeout 250 python3 benchmarks/bench_ulysses.py --small --out "$out" 2>&1 | tail -2
    ;;
uexhaustive)
    for spec in ulysses_qkv_gqa yunchang_ulysses_head_major; do
        timeout 210 python3 -m layoutgen.cli tune --spec $spec --kernel scatter --shape N=4 --shape H=32 --shape D=128 \
            --bucket 4096 --exhaustive-limit 1000 --retune --db tuning_db --report "$out/tune_ulysses_${spec}_exhaustive.md" 2>&1 | tail -1
    done
    cp tuning_db/NVIDIA_H200.json "$out/"
    python3 -m layoutgen.cli db check 2>&1 | tail -1
    timeout 120 python3 benchmarks/bench_ulysses.py --quick --out "$out" 2>&1 | tail -1
    ;;
umajor)
    timeout 150 python3 -m layoutgen.cli tune --spec $ulysses_specs --kernel scatter --kernel gather --shape N=4,8 \
        --shape H=32 --shape D=128 --bucket 16 1024 4096 --trials 48 --db tuning_db --report "$out/tune_ulysses_h32.md" 2>&1 | tail -1
    timeout 100 python3 -m layoutgen.cli tune --spec $ulysses_specs --kernel scatter --kernel gather --shape N=2,8 \
        --shape H=64 --shape D=128 --bucket 1024 16384 --trials 32 --db tuning_db --report "$out/tune_ulysses_h64.md" 2>&1 | tail -1
    save_and_bench_ulysses 70 60
    ;;
even)
    # The Ulysses copy with its bounds dropped where every block divides its extent (probe_even/: the modules
    # `layoutgen build --out probe_even` renders with results/archive/probe_even_copy.diff applied) against the
    # committed one, at the points compile led and two more.
    for run in yunchang_ulysses:scatter_out:4:4096:32:32:128 yunchang_ulysses:gather_out:4:4096:32:32:128 \
        deepspeed_ulysses_head_major:gather_out:4:4096:32:32:128 ulysses_qkv_gqa:scatter:4:4096:32:8:128 \
        ulysses_qkv_gqa:gather:8:1024:32:8:128 yunchang_ulysses:scatter:8:64:16:16:128; do
        IFS=: read -r spec kernel point <<< "$run"
        timeout 100 python3 benchmarks/probe_ulysses_dram.py --spec $spec --kernel $kernel --point "$point" --sample 16 \
            --module even=probe_even/$spec.py --out "$out/probe_even_${spec}_${kernel}_${point//:/_}.json" 2>&1 | tail -1
    done
    ;;
uout)
    # The three single-tensor kernels compile led at N 4, S_local 4096 over their whole space (the even probe:
    # no sampled config reached compile there), then the small sizes' head counts (N 2 / H 32 at S_local 1,
    # N 8 / H 16 at 64: no entry had them, so dispatch ran the heuristic default), then the benchmarks.
    for run in yunchang_ulysses:scatter_out yunchang_ulysses:gather_out deepspeed_ulysses_head_major:gather_out; do
        IFS=: read -r spec kernel <<< "$run"
        timeout 150 python3 -m layoutgen.cli tune --spec $spec --kernel $kernel --shape N=4 --shape H=32 --shape D=128 \
            --bucket 4096 --exhaustive-limit 1000 --retune --db tuning_db --report "$out/tune_${spec}_${kernel}_exhaustive.md" 2>&1 | tail -1
    done
    timeout 100 python3 -m layoutgen.cli tune --spec $ulysses_specs --shape N=2 --shape H=32 --shape D=128 --bucket 1 \
        --trials 48 --db tuning_db --report "$out/tune_ulysses_small_n2.md" 2>&1 | tail -1
    timeout 100 python3 -m layoutgen.cli tune --spec $ulysses_specs --shape N=8 --shape H=16 --shape D=128 --bucket 64 \
        --trials 48 --db tuning_db --report "$out/tune_ulysses_small_n8.md" 2>&1 | tail -1
    save_and_bench_ulysses 70 60
    ;;
ufinal)
    # ulysses_qkv_gqa scatter at N 4, S_local 4096 over its whole space (its last exhaustive search ran before its
    # programs became tensor-major), the N 8 / H 16 studies uout's time limit cut, the benchmarks, the dispatch
    # check and every GPU test.
    timeout 130 python3 -m layoutgen.cli tune --spec ulysses_qkv_gqa --kernel scatter --shape N=4 --shape H=32 --shape D=128 \
        --bucket 4096 --exhaustive-limit 1000 --retune --db tuning_db --report "$out/tune_ulysses_qkv_gqa_scatter_exhaustive.md" 2>&1 | tail -1
    timeout 100 python3 -m layoutgen.cli tune --spec $ulysses_specs --shape N=8 --shape H=16 --shape D=128 --bucket 64 \
        --trials 48 --db tuning_db --report "$out/tune_ulysses_small_n8.md" 2>&1 | tail -1
    save_and_bench_ulysses 60 50
    timeout 60 python3 scripts/check_dispatch_gpu.py 2>&1 | tee "$out/dispatch_check_H200.log" | tail -2
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu tests/ulysses/test_ulysses_gpu.py 2>&1 | tee "$out/gpu_tests.log" | tail -4
    ;;
index64)
    # The tensor-major programs' 64-bit path failed to compile (the GPU tests after ufinal): its test again, then the
    # scatter and gather entries its fix made stale (12 TPE trials: each study measures the stale entry's config
    # first), then the benchmarks.
    timeout 60 python3 -m pytest -q -p no:cacheprovider tests/ulysses/test_ulysses_gpu.py -k 64_bit 2>&1 | tee "$out/gpu_tests_index64.log" | tail -1
    for grid in "N=4,8 H=32 16,1024,4096 100" "N=2,8 H=64 1024,16384 70" "N=2 H=32 1 35" "N=8 H=16 64 35"; do
        read -r peers heads buckets seconds <<< "$grid"
        timeout "$seconds" python3 -m layoutgen.cli tune --spec $ulysses_specs --kernel scatter --kernel gather --shape "$peers" \
            --shape "$heads" --shape D=128 --bucket ${buckets//,/ } --trials 12 --db tuning_db \
            --report "$out/tune_ulysses_${peers//[=,]/_}_${heads//=/_}.md" 2>&1 | tail -1
    done
    save_and_bench_ulysses 60 50
    ;;
chunks)
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_dcp_fp8_gpu.py -k "chunks or mla_width or (byte_exact_on_the_gpu and inner)" 2>&1 \
        | tee "$out/gpu_tests_fp8.log" | tail -3
    # bench_unseen_specs.py's two transposing fp8 specs, as spec files for the tuner, into a database of their own.
    unseen_fp8_specs "$out/unseen_specs"
    mkdir -p "$out/unseen_db"
    timeout 150 python3 -m layoutgen.cli tune --spec "$out"/unseen_specs/*.yaml --kernel pack --shape N=8 --shape H=128 \
        --shape D=512 --bucket 1 64 1024 --db "$out/unseen_db" --report "$out/tune_unseen_fp8_pack.md" 2>&1 | tail -2
    timeout 200 python3 benchmarks/bench_unseen_specs.py --dcp 12 --ulysses 0 --out "$out" 2>&1 | tail -3
    ;;
fp8tune)
    tune_dcp_grid pack tune_dcp_fp8_pack "$fp8_specs" 240 45
    cp tuning_db/NVIDIA_H200.json "$out/"
    ;;
fp8fill)
    # The vllm_a2a_fp8 studies of H 16 / D 512 and H 32 / D 128 that fp8tune's limits cut, its combine there; then
    # bench_dcp_v2.py and the dispatch check with that database.
    for grid in "H=16 D=512" "H=32 D=128"; do
        read -r heads width <<< "$grid"
        timeout 70 python3 -m layoutgen.cli tune --spec vllm_a2a_fp8 --shape N=2,8 --shape "$heads" --shape "$width" \
            --bucket 8 1024 --db tuning_db --report "$out/tune_vllm_a2a_fp8_${heads//=/_}_${width//=/_}.md" 2>&1 | tail -1
    done
    cp tuning_db/NVIDIA_H200.json "$out/"
    timeout 200 python3 benchmarks/bench_dcp_v2.py --quick --out "$out" 2>&1 | tail -2
    timeout 60 python3 scripts/check_dispatch_gpu.py 2>&1 | tee "$out/dispatch_check_H200.log" | tail -2
    ;;
chunkbench)
    # After fp8tune and the chunked pack's defaults from chunks' tune: every unseen spec, bench_dcp_v2.py, dispatch.
    timeout 240 python3 benchmarks/bench_unseen_specs.py --out "$out" 2>&1 | tail -8
    timeout 230 python3 benchmarks/bench_dcp_v2.py --quick --out "$out" 2>&1 | tail -4
    timeout 60 python3 scripts/check_dispatch_gpu.py 2>&1 | tee "$out/dispatch_check_H200.log" | tail -2
    ;;
fp8probe)
    which ncu && ncu --version | tail -1
    timeout 260 python3 benchmarks/probe_fp8_transpose.py --out "$out" --label committed 2>&1 | tail -8
    for target in unseen_dcp_07:1024:1,64,1,64,4 unseen_dcp_07_bf16:1024:1,64,1,64,4 unseen_dcp_01:1024:1,1,16,128,4; do
        timeout 60 ncu --clock-control none -k regex:_pack_kernel -c 1 --section SpeedOfLight \
            --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
            python3 benchmarks/probe_fp8_transpose.py --out /tmp/ncu --ncu "$target" > "$out/ncu_${target%%:*}.txt" 2>&1
        grep -E "DRAM Throughput|Memory Throughput|Duration|Registers|Achieved Occupancy|L2 Hit" "$out/ncu_${target%%:*}.txt" | head -12
    done
    ;;
fp8nt)
    # The upper bound of a pack that did not transpose its codes: spec 7's module with the codes stored along dim
    # (archive/probe_fp8_nt.diff: wrong bytes, the same count), timed without the check; then ncu's pipe and
    # instruction view of the default.
    (cd benchmarks && python3 -c "
import pathlib, probe_fp8_transpose as probe
from bench_unseen_specs import render
render(probe.specs()['unseen_dcp_07'], pathlib.Path('$out/nt'))")
    patch -s -p1 -d "$out/nt" < benchmarks/results/archive/probe_fp8_nt.diff
    timeout 200 python3 benchmarks/probe_fp8_transpose.py --out "$out" --label nt --only unseen_dcp_07 --points 1024 \
        --modules "$out/nt" --no-check 2>&1 | tail -2
    timeout 90 ncu --clock-control none -k regex:_pack_kernel -c 1 --section ComputeWorkloadAnalysis \
        --section InstructionStats --section WarpStateStats --section SourceCounters \
        python3 benchmarks/probe_fp8_transpose.py --out /tmp/ncu --ncu unseen_dcp_07:1024:1,64,1,64,4 > "$out/ncu_pipes_07.txt" 2>&1
    tail -5 "$out/ncu_pipes_07.txt"
    ;;
tenth)
    # After the chunk prefetch landed in the template: the fp8 GPU tests of the chunked form, every unseen spec.
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_dcp_fp8_gpu.py 2>&1 \
        | tee "$out/gpu_tests_fp8.log" | tail -3
    timeout 300 python3 benchmarks/bench_unseen_specs.py --out "$out" 2>&1 | tail -8
    ;;
words)
    # The batch-innermost pack storing four rows' codes per 32-bit word: its GPU tests, spec 7 over the probe's
    # grid, then bench_unseen_specs.py's DCP half.
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_dcp_fp8_gpu.py -k "words or chunks" 2>&1 \
        | tee "$out/gpu_tests_words.log" | tail -2
    timeout 130 python3 benchmarks/probe_fp8_transpose.py --out "$out" --label words --only unseen_dcp_07 2>&1 | tail -2
    timeout 130 python3 benchmarks/bench_unseen_specs.py --dcp 12 --ulysses 0 --out "$out" 2>&1 | tail -3
    ;;
maxnreg)
    # ptxas's register cap on the transposing fp8 packs (before the launcher had one: 0 here is no cap): offline
    # (sm_90) spec 7's default box fits 64 registers instead of 96 with no spills (5 -> 8 programs per SM).
    timeout 300 python3 benchmarks/probe_fp8_transpose.py --out "$out" --label maxnreg \
        --only unseen_dcp_07,unseen_dcp_01 --maxnreg 0,64,72,80 \
        --box unseen_dcp_07:1,64,1,64,2 --box unseen_dcp_07:1,32,1,128,4 --box unseen_dcp_07:1,64,1,128,4 \
        --box unseen_dcp_07:1,64,1,64,8 --box unseen_dcp_01:1,1,16,128,8 --box unseen_dcp_01:1,1,16,512,8 2>&1 | tail -4
    ;;
regcap)
    # (Eleventh pass.) The transposing fp8 packs' register cap (64 at 32 tile elements per thread, the
    # launcher's rule) on seed 0's two and the nine of seeds 1-3: each default and two boxes, with the
    # launcher's cap and with none; then bench_unseen_specs.py (both families) and the fp8 and Ulysses GPU tests.
    batch_inner="unseen_dcp_07 unseen_dcp_s1_03 unseen_dcp_s2_03 unseen_dcp_s3_03 unseen_dcp_s3_09"
    head_inner="unseen_dcp_01 unseen_dcp_s1_09 unseen_dcp_s2_05 unseen_dcp_s2_07 unseen_dcp_s3_05 unseen_dcp_s3_11"
    boxes=()
    for name in $batch_inner; do boxes+=(--box "$name:1,64,1,64,4" --box "$name:1,32,1,128,4"); done
    for name in $head_inner; do boxes+=(--box "$name:1,1,16,512,8" --box "$name:1,1,16,256,4"); done
    only=$(echo $batch_inner $head_inner | tr ' ' ',')
    timeout 200 python3 benchmarks/probe_fp8_transpose.py --out "$out" --label regcap --only "$only" \
        --draw 1:3,1:9,2:3,2:5,2:7,3:3,3:5,3:9,3:11 --maxnreg auto,0 "${boxes[@]}" 2>&1 | tail -24
    timeout 240 python3 benchmarks/bench_unseen_specs.py --out "$out" 2>&1 | tail -8
    timeout 330 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_dcp_fp8_gpu.py tests/ulysses/test_ulysses_gpu.py \
        2>&1 | tee "$out/gpu_tests_regcap.log" | tail -2  # (its first limit, 130 s, cut them: regdefaults ran them)
    ;;
regdefaults)
    # (Eleventh pass.) The new defaults of the transposing fp8 packs (32 x 128 with batch innermost, 16 x 512 x
    # 8 warps with head innermost in blocks of at least 128) on regcap's 11 specs, each default alone (no spec
    # is named `none`); bench_unseen_specs.py (both families, with the combines' capacity bound and the Ulysses
    # S_local specialisation adopted); the fp8, Ulysses and contract-v2 GPU tests (about 4 minutes). The pass
    # made it as two calls: the GPU tests' first limit cut them, and the first probe left the drawn specs out.
    timeout 120 python3 benchmarks/probe_fp8_transpose.py --out "$out" --label regdefaults \
        --only unseen_dcp_01,unseen_dcp_07,unseen_dcp_s1_03,unseen_dcp_s1_09,unseen_dcp_s2_03,unseen_dcp_s2_05,unseen_dcp_s2_07,unseen_dcp_s3_03,unseen_dcp_s3_05,unseen_dcp_s3_09,unseen_dcp_s3_11 \
        --draw 1:3,1:9,2:3,2:5,2:7,3:3,3:5,3:9,3:11 --box none:1,1,1,1,1 2>&1 | tail -22
    timeout 240 python3 benchmarks/bench_unseen_specs.py --out "$out" 2>&1 | tail -8
    timeout 330 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_dcp_fp8_gpu.py tests/ulysses/test_ulysses_gpu.py \
        tests/gpu/test_dcp_v2_gpu.py 2>&1 | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" \
        | tee "$out/gpu_tests_regdefaults.log" | tail -2
    ;;
boxes)
    # (Twelfth pass.) The default box takes 128 bytes along both sides' contiguous axes (it took them along the
    # source only where the innermost axis moved), and interleaved tensors are copied box by box in one program.
    timeout 330 python3 benchmarks/probe_ulysses_boxes.py --out "$out" --specs 13,15,17 --space 10 2>&1 | tail -3
    timeout 120 python3 benchmarks/bench_unseen_specs.py --family ulysses --out "$out" 2>&1 | tail -8
    timeout 120 python3 -m pytest -v -p no:cacheprovider tests/ulysses/test_ulysses_gpu.py 2>&1 \
        | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" | tee "$out/gpu_tests_boxes.log" | tail -2
    ;;
allboxes)
    # (Thirteenth pass.) Warps and tile sizes of the default rule over all eight specs (the twelfth pass probed
    # three), then what GQA's masked k/v boxes cost spec 17's gather: the same kernel with k and v at H heads.
    timeout 400 python3 benchmarks/probe_ulysses_boxes.py --out "$out" --specs 12,13,14,15,16,17,18,19 \
        --runs 128 --tiles 1024,2048,4096,8192,16384 --warps 2,8 --label all 2>&1 | tail -3
    timeout 60 python3 benchmarks/probe_ulysses_boxes.py --out "$out" --specs 17 --kernels gather --runs 128 \
        --tiles 4096,8192,16384 --warps 8 --h-kv 32 --label hkv32 2>&1 | tail -3
    ;;
joined)
    # (Thirteenth pass.) A shared wire with `tensor` innermost, its tensors copied together: one box of the wire.
    timeout 120 python3 benchmarks/probe_ulysses_boxes.py --out "$out" --specs 15 --kernels scatter,gather \
        --runs 128 --tiles 2048,4096,8192,16384 --warps 2,8,16 --label joined 2>&1 | tail -3
    timeout 150 python3 benchmarks/bench_unseen_specs.py --family ulysses --out "$out" \
        --keep benchmarks/results/bench_unseen_specs_NVIDIA_H200.json 2>&1 | tail -8
    timeout 150 python3 -m pytest -v -p no:cacheprovider tests/ulysses/test_ulysses_gpu.py 2>&1 \
        | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" | tee "$out/gpu_tests_joined.log" | tail -2
    ;;
farthest)
    # (Thirteenth pass.) What tuning could give the two kernels no default box brings near the copy.
    timeout 150 python3 benchmarks/probe_ulysses_boxes.py --out "$out" --specs 13 --kernels gather_out \
        --runs 128 --tiles 8192 --warps 8 --space 60 --label farthest13 2>&1 | tail -2
    timeout 150 python3 benchmarks/probe_ulysses_boxes.py --out "$out" --specs 17 --kernels gather \
        --runs 128 --tiles 8192 --warps 8 --space 60 --label farthest17 2>&1 | tail -2
    ;;
dense)
    # (Thirteenth pass.) Where head is innermost on a side: k/v boxes of their own heads, the stride outside it
    # known at compile time when the tensors are dense there.
    timeout 150 python3 benchmarks/probe_ulysses_boxes.py --out "$out" --specs 13,17 --runs 128 \
        --tiles 2048,4096,8192,16384 --warps 2,8 --label dense 2>&1 | tail -2
    timeout 150 python3 benchmarks/bench_unseen_specs.py --family ulysses --out "$out" \
        --keep benchmarks/results/bench_unseen_specs_NVIDIA_H200.json 2>&1 | tail -8
    timeout 200 python3 -m pytest -v -p no:cacheprovider tests/ulysses/test_ulysses_gpu.py 2>&1 \
        | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" | tee "$out/gpu_tests_dense.log" | tail -2
    ;;
unseen14)
    # (Fourteenth pass.) How far the untuned transposing combines sit from what their space holds, and whether
    # shorter runs (spec 13's gather_out: 77% with 32 bytes along seq in a 1 KiB box) help the other kernels.
    # The pass ran these as four calls, in this order.
    timeout 230 python3 benchmarks/probe_ulysses_boxes.py --out "$out" --specs 12,13,14,15,16,17,18,19 \
        --runs 32,64 --tiles 1024,2048,8192 --warps 4 --label runs14 2>&1 | tail -2
    timeout 500 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs 0,1,3,5,7,8,9 --kernel combine \
        --sample 48 --label unseen14 2>&1 | tail -9
    timeout 330 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs 7,9,5 --kernel combine --sample 0 \
        --grid 32,64,128,256:1:8,16,32:1,4 --label grid14 2>&1 | tail -4
    # After the new batch-innermost combine default:
    timeout 420 python3 benchmarks/bench_unseen_specs.py --family dcp --out "$out" \
        --keep benchmarks/results/bench_unseen_specs_NVIDIA_H200.json 2>&1 | tail -4
    ;;
fifteen)
    # (Fifteenth pass.) Why row-tail layouts padded past their stats pack under 80%, and the dim-innermost pack
    # defaults measured against the rule before them, side by side.
    timeout 120 python3 benchmarks/probe_row_padding.py --out "$out" 2>&1 | tail -14
    specs="--specs 2,4,6,10,11 --bundled pynccl_a2a,pynccl_a2a_aligned,vllm_a2a,flashinfer_mnnvl,pynccl_a2a_fp8,vllm_a2a_fp8"
    timeout 170 python3 benchmarks/probe_unseen_dcp.py --out "$out" $specs --batches 1,8,64,256,1024 --kernel pack \
        --sample 0 --label defaults_new15 2>&1 | tail -1
    if [ -n "${OLD_TREE:-}" ]; then
        PYTHONPATH=/tmp/site:$OLD_TREE:$PWD timeout 170 python3 benchmarks/probe_unseen_dcp.py --out "$out" $specs \
            --batches 1,8,64,256,1024 --kernel pack --sample 0 --label defaults_old15 2>&1 | tail -1
    fi
    timeout 230 python3 benchmarks/bench_unseen_specs.py --family dcp --out "$out" \
        --keep benchmarks/results/bench_unseen_specs_NVIDIA_H200.json 2>&1 | tail -3
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_dcp_v2_gpu.py tests/gpu/test_dcp_fp8_gpu.py \
        2>&1 | tee "$out/gpu_tests.log" | tail -3
    ;;
sixteen)
    # (Sixteenth pass.) The fp8 combines whose payload's innermost axis is not dim, this tree against OLD_TREE.
    for tree in new old; do
        path=$PYTHONPATH
        [ "$tree" = old ] && path=/tmp/site:$OLD_TREE:$PWD
        PYTHONPATH=$path timeout 110 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs 7 --kernel combine \
            --sample 0 --grid 32,64,128:1:16,32:1,2,4 --label comb16_${tree}_s7 2>&1 | tail -1
        PYTHONPATH=$path timeout 70 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs 1 --kernel combine \
            --sample 0 --grid 2,4,8:16:32,64:1,2 --label comb16_${tree}_s1 2>&1 | tail -1
        for drawn in 0:1,7 1:3,9 2:3,5,7 3:3,5,9,11; do
            PYTHONPATH=$path timeout 40 python3 benchmarks/probe_unseen_dcp.py --out "$out" --seed "${drawn%%:*}" \
                --specs "${drawn#*:}" --batches 64,1024 --kernel combine --sample 0 \
                --label comb16_${tree}_seed${drawn%%:*} 2>&1 | tail -1
        done
    done
    if [ -n "${ORDER_TREE:-}" ]; then
        for group in 1 4 16 1048576; do
            PROBE_SEQ_GROUP=$group PYTHONPATH=/tmp/site:$ORDER_TREE:$PWD timeout 60 python3 benchmarks/probe_ulysses_boxes.py \
                --out "$out" --specs 13 --runs 32,128 --tiles 1024,8192 --warps 4 --label order$group 2>&1 | tail -1
        done
    fi
    ;;
peer)
    # Combines with `peer` innermost (the fp8 one in blocks of 16 ran at 9% of the copy, sixteenth pass): this
    # tree, then each prepared variant applied to a copy of the package (tile: every peer's partial of an
    # element loaded as one vector, reduced in registers; box: the default box from the axis outside peer).
    specs=""
    for file in benchmarks/specs/probe_*.yaml; do specs="$specs --spec-file $file"; done
    # 70 boxes per spec did not finish in 120 s per tree (compiles included): a dozen around the defaults.
    grid="--grid 1,4,32:1,2:32,128:4,8"
    timeout 170 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs "" $specs --kernel combine \
        --batches 64,1024 --sample 0 $grid --label peer_committed 2>&1 | tail -1
    for variant in tile box; do
        tree=$(mktemp -d)
        cp -r layoutgen "$tree/"
        case $variant in
            tile) patch -s -p1 -d "$tree" < benchmarks/results/archive/probe_peer_tile_combine.diff ;;
            box) patch -s -p1 -d "$tree" < benchmarks/results/archive/probe_peer_inner_combine_default.diff ;;
        esac
        PYTHONPATH=/tmp/site:$tree:$PWD timeout 170 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs "" \
            $specs --kernel combine --batches 64,1024 --sample 0 $grid --label peer_$variant 2>&1 | tail -1
    done
    tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
    ;;
seventeen)
    specs=""
    for file in benchmarks/specs/probe_*.yaml; do specs="$specs --spec-file $file"; done
    grid="--grid 1,4,32:1,2:32,128:4,8"
    timeout 200 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs "" $specs --kernel combine \
        --batches 64,1024 --sample 0 $grid --label peer_adopted 2>&1 | tail -1
    PYTHONPATH=/tmp/site:$OLD_TREE:$PWD timeout 100 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs "" \
        --spec-file benchmarks/specs/probe_bf16_peer_inner_dim.yaml --kernel combine --batches 64,1024 --sample 0 \
        $grid --label peer_dim_loop 2>&1 | tail -1
    timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_dcp_v2_gpu.py \
        "tests/gpu/test_dcp_fp8_gpu.py::test_fp8_combine_on_the_gpu" > "$out/gpu_tests.log" 2>&1
    tail -3 "$out/gpu_tests.log"
    tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
    ;;
eighteen)
    specs=""
    for name in bf16_peer_inner_batch bf16_peer_inner_head f32_peer_inner_head; do
        specs="$specs --spec-file benchmarks/specs/probe_$name.yaml"
    done
    timeout 200 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs "" $specs --kernel pack \
        --batches 64,1024 --sample 12 --label pairs 2>&1 | tail -1
    PYTHONPATH=/tmp/site:$OLD_TREE:$PWD timeout 100 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs "" \
        $specs --kernel pack --batches 64,1024 --sample 0 --label pairs_box 2>&1 | tail -1
    timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_dcp_v2_gpu.py > "$out/gpu_tests.log" 2>&1
    tail -3 "$out/gpu_tests.log"
    tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
    ;;
eighteen_fp8)
    specs="--spec-file benchmarks/specs/probe_fp8_peer_inner_blocks.yaml --spec-file benchmarks/specs/probe_fp8_peer_inner_head.yaml"
    timeout 200 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs "" $specs --kernel pack \
        --batches 64,1024 --sample 12 --label pairs_fp8 2>&1 | tail -1
    PYTHONPATH=/tmp/site:$OLD_TREE:$PWD timeout 100 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs "" \
        $specs --kernel pack --batches 64,1024 --sample 0 --label pairs_fp8_box 2>&1 | tail -1
    timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_dcp_fp8_gpu.py -k "peer" \
        > "$out/gpu_tests_fp8.log" 2>&1
    tail -3 "$out/gpu_tests_fp8.log"
    tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
    ;;
eighteen_grid)
    S=benchmarks/specs
    probe() {  # LABEL SPEC GRID
        timeout 150 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs "" --spec-file "$S/probe_$2.yaml" \
            --kernel pack --batches 64,1024 --sample 0 --grid "$3" --label "$1" 2>&1 | tail -2
    }
    probe pairs_grid_fp8_batch fp8_peer_inner_blocks 64,128,256:1:16,32,64:4,8:1
    probe pairs_grid_fp8_head fp8_peer_inner_head 1,2:64,128:32,64:4,8:1
    probe pairs_grid_bf16_head bf16_peer_inner_head 1,2,4:64,128:32,64,128:4:1
    tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
    ;;
nineteen)
    # (probe_ulysses_pairs.py, the hand-written forms, ran alone first: archive/probe_ulysses_pairs_H200.json.)
    timeout 150 python3 benchmarks/probe_ulysses_boxes.py --out "$out" --specs 13 --kernels gather_out --space 12 \
        --label global19 2>&1 | tail -1
    for seed_spec in 2:15 5:19; do
        timeout 100 python3 benchmarks/probe_ulysses_boxes.py --out "$out" --seed "${seed_spec%%:*}" \
            --specs "${seed_spec##*:}" --kernels gather_out --label "global19_seed${seed_spec%%:*}" 2>&1 | tail -1
    done
    timeout 150 python3 benchmarks/bench_unseen_specs.py --family ulysses --out "$out" \
        --keep benchmarks/results/bench_unseen_specs_NVIDIA_H200.json 2>&1 | tail -8
    timeout 150 python3 -m pytest -v -p no:cacheprovider tests/ulysses/test_ulysses_gpu.py 2>&1 \
        | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" > "$out/gpu_tests_ulysses.log"
    tail -2 "$out/gpu_tests_ulysses.log"
    tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
    ;;
nineteen_dcp)
    spec="--spec-file benchmarks/specs/probe_bf16_head_inner_peer_next.yaml"
    for heads in 32 128; do
        timeout 90 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs "" $spec --kernel pack \
            --batches 64,1024 --heads "$heads" --sample 8 --label "peer_head_pairs_h$heads" 2>&1 | tail -2
        PYTHONPATH=/tmp/site:$OLD_TREE:$PWD timeout 60 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs "" \
            $spec --kernel pack --batches 64,1024 --heads "$heads" --sample 0 --label "peer_head_box_h$heads" 2>&1 | tail -2
    done
    timeout 120 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs 1 --kernel pack --batches 64,1024 \
        --sample 8 --label spec1_pairs 2>&1 | tail -2
    PYTHONPATH=/tmp/site:$OLD_TREE:$PWD timeout 60 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs 1 \
        --kernel pack --batches 64,1024 --sample 0 --label spec1_box 2>&1 | tail -2
    timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_dcp_v2_gpu.py \
        tests/gpu/test_dcp_fp8_gpu.py -k "pairs or head_inner" > "$out/gpu_tests_pairs.log" 2>&1
    tail -3 "$out/gpu_tests_pairs.log"
    tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
    ;;
twenty)
    probe="timeout 140 python3 benchmarks/probe_fp8_transpose.py --out $out --points ${POINTS:-1024} --draw 2:5,3:3,3:11"
    $probe --label s0_01 --only unseen_dcp_01 --maxnreg auto,0,96 \
        --box unseen_dcp_01:2,1,16,512,16 --box unseen_dcp_01:2,1,16,512,8 --box unseen_dcp_01:1,1,16,512,16 \
        --box unseen_dcp_01:4,1,16,512,16 2>&1 | tail -3
    $probe --label s2_05 --only unseen_dcp_s2_05 --maxnreg auto,64 \
        --box unseen_dcp_s2_05:2,1,16,64,4 --box unseen_dcp_s2_05:2,1,16,128,8 --box unseen_dcp_s2_05:4,1,16,32,4 \
        --box unseen_dcp_s2_05:4,1,16,64,8 --box unseen_dcp_s2_05:8,1,16,16,4 --box unseen_dcp_s2_05:8,1,16,32,8 \
        --box unseen_dcp_s2_05:8,1,16,16,2 2>&1 | tail -3
    $probe --label s3_11 --only unseen_dcp_s3_11 --maxnreg auto,64 \
        --box unseen_dcp_s3_11:1,2,16,64,4 --box unseen_dcp_s3_11:1,2,16,128,8 --box unseen_dcp_s3_11:1,4,16,32,4 \
        --box unseen_dcp_s3_11:1,4,16,64,8 --box unseen_dcp_s3_11:1,8,16,16,4 --box unseen_dcp_s3_11:1,8,16,32,8 \
        --box unseen_dcp_s3_11:1,8,16,16,2 2>&1 | tail -3
    $probe --label s3_03 --only unseen_dcp_s3_03 --maxnreg auto,0 \
        --box unseen_dcp_s3_03:1,16,1,512,8 --box unseen_dcp_s3_03:1,32,1,512,16 --box unseen_dcp_s3_03:1,16,1,512,16 \
        --box unseen_dcp_s3_03:1,8,1,512,4 --box unseen_dcp_s3_03:1,8,1,512,8 2>&1 | tail -3
    tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
    ;;
twenty_rows)
    probe="timeout 150 python3 benchmarks/probe_unseen_dcp.py --out $out --kernel pack --sample 0"
    $probe --seed 3 --specs 3 --batches 64,1024 --grid 16,32:1:128,256,512:4,8,16 --label s3_03_rows 2>&1 | tail -2
    $probe --seed 3 --specs 3 --batches 1,8 --grid 1,4,8:1,2,16:128,512:4,8 --label s3_03_small 2>&1 | tail -2
    $probe --specs "" --spec-file benchmarks/specs/probe_fp8_batch_inner_block256.yaml --batches 64,1024 \
        --grid 16,32:1:128,256:4,8,16 --label block256_rows 2>&1 | tail -2
    timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_dcp_fp8_gpu.py \
        > "$out/gpu_tests_fp8.log" 2>&1
    tail -3 "$out/gpu_tests_fp8.log"
    tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
    ;;
twenty_combine)
    # The variant (archive/probe_peer_head_tile_combine.diff, not adopted) applied to a copy of the package,
    # then this tree's per-peer loop (OLD_TREE in the run that measured it).
    tree=$(mktemp -d)
    cp -r layoutgen "$tree/"
    patch -s -p1 -d "$tree" < benchmarks/results/archive/probe_peer_head_tile_combine.diff
    spec=(--specs "" --spec-file benchmarks/specs/probe_bf16_head_inner_peer_next.yaml --kernel combine --batches 64,1024)
    grids=([32]=2,4,8:4:32,64:2,4 [128]=1,2:16:16,32:2,4,8)
    for heads in 32 128; do
        PYTHONPATH=/tmp/site:$tree:$PWD timeout 110 python3 benchmarks/probe_unseen_dcp.py --out "$out" "${spec[@]}" \
            --heads "$heads" --sample 6 --grid "${grids[$heads]}" --label "peer_head_tile_h$heads" 2>&1 | tail -2
        timeout 50 python3 benchmarks/probe_unseen_dcp.py --out "$out" "${spec[@]}" \
            --heads "$heads" --sample 0 --label "peer_head_loop_h$heads" 2>&1 | tail -2
    done
    timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_dcp_v2_gpu.py -k peer_innermost \
        > "$out/gpu_tests_combine.log" 2>&1
    tail -3 "$out/gpu_tests_combine.log"
    timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_dcp_fp8_gpu.py -k "batch_inner or chunks or words" \
        > "$out/gpu_tests_fp8.log" 2>&1
    tail -3 "$out/gpu_tests_fp8.log"
    tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
    ;;
batchfirst)
    python3 - generated/vllm_a2a.py "$out/vllm_a2a_batch_first.py" <<'PY'
import sys
from pathlib import Path

source, target = Path(sys.argv[1]), Path(sys.argv[2])
text = source.read_text()
old_kernel = """    program = tl.program_id(0)
    dim_block = program % ((HEAD_DIM + BLOCK_DIM - 1) // BLOCK_DIM)
    program = program // ((HEAD_DIM + BLOCK_DIM - 1) // BLOCK_DIM)
    head_block = program % ((HEADS_PER_PEER + BLOCK_HEAD - 1) // BLOCK_HEAD)
    program = program // ((HEADS_PER_PEER + BLOCK_HEAD - 1) // BLOCK_HEAD)
    batch_block = program
"""
new_kernel = """    batch_block = tl.program_id(0)
    program = tl.program_id(1)
    dim_block = program % ((HEAD_DIM + BLOCK_DIM - 1) // BLOCK_DIM)
    head_block = program // ((HEAD_DIM + BLOCK_DIM - 1) // BLOCK_DIM)
"""
old_grid = """    programs = (
        triton.cdiv(batch, config.block_batch)
        * triton.cdiv(heads_per_peer, config.block_head)
        * triton.cdiv(head_dim, config.block_dim)
    )
    kernel[(programs,)]("""
new_grid = """    programs = triton.cdiv(heads_per_peer, config.block_head) * triton.cdiv(head_dim, config.block_dim)
    kernel[(triton.cdiv(batch, config.block_batch), programs)]("""
assert text.count(old_kernel) == 1 and text.count(old_grid) == 1
target.write_text(text.replace(old_kernel, new_kernel).replace(old_grid, new_grid))
PY
    modules=(--module committed=generated/vllm_a2a.py --module batch_first="$out/vllm_a2a_batch_first.py")
    timeout 300 python3 benchmarks/probe_combine.py "${modules[@]}" --point 8:64:128:512 --point 8:8:128:512 \
        --point 8:256:128:512 --point 2:64:128:512 --point 4:64:128:512 --out "$out/probe_combine_batch_first.json" \
        2>&1 | tail -8
    timeout 120 python3 benchmarks/probe_combine.py "${modules[@]}" --resident --point 8:64:128:512 \
        --out "$out/probe_combine_batch_first_resident.json" 2>&1 | tail -3
    ;;
fp8combine)
    # The fp8 combines under 55% of the copy (seed 0's specs 1 and 7): wider dim blocks, whose rows' block
    # scales then load as whole sectors, beside the defaults.
    probe="timeout 200 python3 benchmarks/probe_unseen_dcp.py --out $out --kernel combine --sample 0 --batches 1024"
    $probe --specs 7 --grid 32,64:1:64,128,256:1,4 --label fp8_combine_s7 2>&1 | tail -1
    $probe --specs 1 --grid 2,4:16:64,128,256:2,4 --label fp8_combine_s1 2>&1 | tail -1
    ;;
fp8combine2)
    # The wider boxes on the other drawn fp8 combines with batch innermost (seeds 1-3), and spec 7 at B 64.
    probe="timeout 100 python3 benchmarks/probe_unseen_dcp.py --out $out --kernel combine --sample 0"
    for draw in 1:3 2:3 3:3 3:9; do
        $probe --seed "${draw%%:*}" --specs "${draw##*:}" --batches 1024 --grid 32,64:1:64,128:1,4 \
            --label "fp8_combine_s${draw%%:*}_${draw##*:}" 2>&1 | tail -1
    done
    $probe --specs 7 --batches 64 --grid 16,32,64:1:64,128:1,4 --label fp8_combine_s7_b64 2>&1 | tail -1
    ;;
fp8combine3)
    # The default of the fp8 combines with batch innermost on the tree it ran on (dims widened to 128 where the
    # grid held four waves) at B 256 and 1024 on seed 0's spec 7 and seed 3's spec 3.
    probe="timeout 100 python3 benchmarks/probe_unseen_dcp.py --out $out --kernel combine --sample 0 --batches 256,1024"
    $probe --specs 7 --grid 32:1:32:1 --label fp8_combine_default_s0_7 2>&1 | tail -2
    $probe --seed 3 --specs 3 --grid 32:1:32:1 --label fp8_combine_default_s3_3 2>&1 | tail -2
    ;;
fp8combine4)
    # Boxes of at most 64 elements per thread (the tuner's space) beside 32 x 128 x 1, the same five specs, B 1024.
    probe="timeout 60 python3 benchmarks/probe_unseen_dcp.py --out $out --kernel combine --sample 0 --batches 1024"
    for draw in 0:7 1:3 2:3 3:3 3:9; do
        $probe --seed "${draw%%:*}" --specs "${draw##*:}" --grid 32:1:64,128:1,2 \
            --label "fp8_combine_64pt_s${draw%%:*}_${draw##*:}" 2>&1 | tail -1
    done
    ;;
twentyone)
    timeout 200 python3 benchmarks/probe_unseen_dcp.py --out "$out" --kernel combine --sample 0 --batches 512,1024 \
        --seed 3 --specs 3,9 --grid 32:1:64,128:1 --label fp8_combine_wide_blocks 2>&1 | tail -2
    timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_dcp_fp8_gpu.py -k combine \
        > "$out/gpu_tests_fp8_combine.log" 2>&1
    tail -3 "$out/gpu_tests_fp8_combine.log"
    ;;
stats_tile)
    files=""
    names=${STATS_TILE_SPECS:-probe_s1_01_asis probe_s1_01_aligned probe_s0_01_asis probe_s0_01_aligned probe_dim_inner_stats_peer}
    for name in $names; do
        files="$files --spec-file benchmarks/specs/$name.yaml"
    done
    for tree in old new; do
        path=/tmp/site:$PWD
        [ "$tree" = old ] && path=/tmp/site:$OLD_TREE:$PWD
        PYTHONPATH=$path timeout 150 python3 benchmarks/probe_unseen_dcp.py --out "$out" --specs "" $files \
            --kernel combine --sample 0 --batches "${STATS_TILE_BATCHES:-64,1024}" --label "stats_tile_$tree${STATS_TILE_LABEL:-}" \
            2>&1 | tail -12 | cut -c1-40,190-260
    done
    timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_dcp_v2_gpu.py -k peer_innermost_combine \
        tests/gpu/test_dcp_fp8_gpu.py > "$out/gpu_tests_stats_tile.log" 2>&1
    tail -3 "$out/gpu_tests_stats_tile.log"
    ;;
twentytwo)
    probe="timeout 130 python3 benchmarks/probe_unseen_dcp.py --out $out --kernel pack --sample 0 --batches 64,1024"
    for draw in 3:11 4:1; do  # [peer, dim, batch, head]: batch rows lengthen the stored runs
        $probe --seed "${draw%%:*}" --specs "${draw##*:}" --grid 1,4,8,16:16:16,32,64,128:2,4 \
            --label "fp8_head_runs_s${draw%%:*}_${draw##*:}" 2>&1 | tail -1
    done
    for draw in 0:1 2:5; do  # [batch, dim, peer, head]: peers lengthen them
        $probe --seed "${draw%%:*}" --specs "${draw##*:}" --grid 1:16:16,32,64,128:2,4:1,4,8,16 \
            --label "fp8_head_runs_s${draw%%:*}_${draw##*:}" 2>&1 | tail -1
    done
    # [peer, batch, dim, head], one scale per row held batch innermost: rows fill the scales' sectors only.
    $probe --seed 2 --specs 7 --grid 1,8:16:128,512:4,8 --label fp8_head_runs_s2_7 2>&1 | tail -1
    tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
    ;;
twentytwo_scales)
    scales_probe() {
        timeout 100 python3 benchmarks/probe_unseen_dcp.py --out "$out" --kernel pack --sample 0 --batches 64,1024 \
            --specs "" --spec-file "benchmarks/specs/$1.yaml" --grid "$2" --label "$1" 2>&1 | tail -1
    }
    for name in probe_s4_01_asis probe_fp8_scales_batch_inner_block16 probe_fp8_scales_batch_inner_block64 \
        probe_fp8_scales_batch_inner_dim_next; do
        scales_probe "$name" 1,4,8:16:32,64,128:2,4
    done
    scales_probe probe_fp8_scales_peer_inner 1:16:32,64,128:2,4:1,4,8
    timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_dcp_fp8_gpu.py -k pack \
        > "$out/gpu_tests_fp8_pack.log" 2>&1
    tail -3 "$out/gpu_tests_fp8_pack.log"
    tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
    ;;
twentytwo_check)
    for name in probe_fp8_scales_batch_inner_block64 probe_s4_01_asis; do
        timeout 60 python3 benchmarks/probe_unseen_dcp.py --out "$out" --kernel pack --sample 0 --batches 64,1024 \
            --specs "" --spec-file "benchmarks/specs/$name.yaml" --grid 1:16:128:4 --label "${name}_adopted" 2>&1 | tail -1
    done
    timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_dcp_fp8_gpu.py \
        -k fp8_head_inner_scales_batch > "$out/gpu_tests_fp8_sector_scales.log" 2>&1
    tail -3 "$out/gpu_tests_fp8_sector_scales.log"
    ;;
unseen_dcp)
    timeout 540 python3 benchmarks/bench_unseen_specs.py --family dcp \
        --keep benchmarks/results/bench_unseen_specs_NVIDIA_H200.json --out "$out" 2>&1 | tail -3
    ;;
rebench)

    # The two layouts the bench step's 200 s left out first; each spec's rows are written as it ends.
    timeout 400 python3 benchmarks/bench_dcp.py --quick --warm --out "$out" \
        --specs pynccl_a2a_aligned flashinfer_mnnvl pynccl_a2a vllm_a2a 2>&1 | tail -4
    timeout 170 python3 benchmarks/bench_ulysses.py --small --out "$out" 2>&1 | tail -4
    ;;
chints)
    variants=/tmp/chints
    hinted_combines "$variants"
    for cache in rotated resident; do
        flag=$([ $cache = resident ] && echo --resident)
        timeout 170 python3 benchmarks/probe_combine.py --module committed=generated/vllm_a2a.py \
            --module evict_first="$variants/evict_first.py" --module cg="$variants/cg.py" \
            --module committed_again=generated/vllm_a2a.py --point 8:64:128:512 --point 4:64:128:512 \
            --point 8:256:128:512 $flag --out "$out/probe_combine_hints_$cache.json" 2>&1 | tail -4
    done
    [ -n "${CHINTS_PROBES_ONLY:-}" ] && exit 0
    workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 12")
    timeout 240 python3 -m pytest -q -p no:cacheprovider $workers tests/gpu tests/ulysses/test_ulysses_gpu.py \
        tests/test_tuning.py::test_gpu_pipeline_times_with_cuda_graphs_and_the_compile_pool 2>&1 \
        | tee "$out/gpu_tests.log" | tail -4
    ;;
fresh)
    hinted_combines /tmp/chints
    timeout 300 python3 benchmarks/probe_fresh_combine.py --module committed=generated/vllm_a2a.py \
        --module evict_first=/tmp/chints/evict_first.py --point 8:64:128:512 --point 4:64:128:512 \
        --point 8:256:128:512 --point 8:1024:128:512 --out "$out/probe_fresh_combine.json" 2>&1 | tail -6
    ;;
lift)
    [ -n "${LIFT_PROBE:-}" ] && for spec in trtllm_helix_native_v2 trtllm_helix_nccl; do
        timeout 60 python3 benchmarks/probe_combine.py --module multiply=generated/$spec.py \
            --module shift="${SHIFT_TREE:?the helix modules of d3f2121}/$spec.py" \
            --module prelift="${OLD_TREE:?the helix modules of 1a35e17}/$spec.py" \
            --module multiply_again=generated/$spec.py --point 8:8:128:512 --point 8:64:128:512 \
            --point 8:1024:128:512 --out "$out/probe_lift_$spec.json" 2>&1 | tail -3
    done
    nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || exit 0
    helix="trtllm_helix_nccl trtllm_helix_native_v1 trtllm_helix_native_v2"
    tune_dcp_grid combine tune_helix_combine "$helix" 300 60
    cp tuning_db/NVIDIA_H200.json "$out/"
    python3 -m layoutgen.cli db check 2>&1 | tail -2
    ;;
liftbench)
    timeout 500 python3 benchmarks/bench_dcp_v2.py --quick --out "$out" 2>&1 | tail -3
    ;;
h100tune)
    device_db=$(device_database)
    tune_dcp_grid "" tune_h100 "$dcp_specs" 360 80
    cp "$device_db" "$out/"
    ;;
h100bench)
    device_db=$(device_database)
    tune_dcp_grid "" tune_h100_resumed "$dcp_specs" 120 40
    cp "$device_db" "$out/"
    python3 -m layoutgen.cli db check 2>&1 | tail -3
    timeout 60 python3 scripts/check_dispatch_gpu.py 2>&1 | tee "$out/dispatch_check.log" | tail -2
    timeout 300 python3 benchmarks/bench_dcp.py --quick --warm --out "$out" 2>&1 | tail -3
    ;;
h100utune)
    device_db=$(device_database)
    tune_ulysses_grid tune_ulysses_h100 270 55 160
    cp "$device_db" "$out/"
    ;;
h100ubench)
    device_db=$(device_database)
    tune_ulysses_grid tune_ulysses_h100_resumed 90 25 60
    cp "$device_db" "$out/"
    python3 -m layoutgen.cli db check 2>&1 | tail -3
    timeout 60 python3 scripts/check_dispatch_gpu.py 2>&1 | tee "$out/dispatch_check.log" | tail -2
    timeout 290 python3 benchmarks/bench_ulysses.py --quick --out "$out" 2>&1 | tail -3
    ;;
h100usmall)
    timeout 300 python3 benchmarks/bench_ulysses.py --small --out "$out" 2>&1 | tail -3
    ;;
maskvariants)
    points="--point 2:8:128:512 --point 4:8:128:512 --point 8:8:128:512 --point 8:1:128:512 --point 8:8:16:512"
    specs="--spec trtllm_helix_native_v2 --spec flashinfer_mnnvl --spec vllm_a2a --spec pynccl_a2a"
    for variant in over oneflag both; do
        python3 benchmarks/probe_pack_rewrites.py $variant probe_$variant
        timeout 170 python3 benchmarks/probe_pack_mask.py --compare $variant=probe_$variant $specs $points \
            --out "$out/probe_pack_$variant.json" 2>&1 | tail -2
    done
    ;;
maskroles)
    python3 benchmarks/probe_pack_rewrites.py split probe_split
    python3 benchmarks/probe_pack_rewrites.py gate probe_gate
    points="--point 2:8:128:512 --point 4:8:128:512 --point 8:8:128:512 --point 8:1:128:512 --point 8:8:16:512"
    for run in 1 2; do
        timeout 200 python3 benchmarks/probe_pack_mask.py --compare split=probe_split --spec trtllm_helix_native_v2 \
            --spec flashinfer_mnnvl --spec vllm_a2a --spec pynccl_a2a $points --point 2:1:128:512 --point 4:1:128:512 \
            --out "$out/probe_pack_split_$run.json" 2>&1 | tail -2
    done
    for run in 1 2; do
        timeout 150 python3 benchmarks/probe_pack_mask.py --compare gate=probe_gate --spec trtllm_helix_native_v2 \
            --spec trtllm_helix_nccl --spec flashinfer_mnnvl --spec vllm_a2a $points \
            --out "$out/probe_pack_gate_$run.json" 2>&1 | tail -2
    done
    ;;
smallb)
    points=""
    for point in 2:1:128:512 4:1:128:512 8:1:128:512 2:8:128:512 4:8:128:512 8:8:128:512 8:16:128:512 8:32:128:512 \
        2:8:16:512 8:8:16:512 2:8:32:128 8:8:32:128; do points="$points --point $point"; done
    for spec in vllm_a2a pynccl_a2a_aligned pynccl_a2a trtllm_helix_native_v1 flashinfer_mnnvl pynccl_a2a_fp8; do
        echo "== $spec"
        timeout 105 python3 benchmarks/probe_combine.py --module cur=generated/$spec.py $points \
            --out "$out/probe_small_combine_$spec.json" 2>&1 | tail -12
    done
    ;;
esac
