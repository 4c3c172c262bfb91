"""GPU probe: the masked pack's two ways of writing empty rows, against the unmasked pack.

For each spec and point, with the database's pack config (as dispatch picks it), timed interleaved (A, B, C,
A, ... CUDA-graph replays, one graph each, inputs rotated as `bench_dcp_v2.py` rotates them, so drift
between them cancels):

* `unmasked`: `empty=None`;
* `stores`: every row read, two predicated stores (the values where the row is live, zeros where it is
  empty): the generated launcher's choice below `_SKIP_EMPTY_READS_BYTES`;
* `skip`: the payload load predicated on the row being live (`other=0`), one store: an empty row is never
  read, but the load waits for its flag: the launcher's choice from `_SKIP_EMPTY_READS_BYTES` up.

Each form is forced by setting the module's `_SKIP_EMPTY_READS_BYTES` (0 or unreachable) around its launch
and checked byte for byte against `layoutgen.dcp.reference` before it is timed.  `--empty-every K` (repeatable)
empties every K-th request (0: none empty, a mask of all False); `--point N:B:H:D` (repeatable) replaces
`bench_dcp_v2.py`'s grid.

`--compare LABEL=DIR` times the committed module's unmasked and masked packs (its launcher's own form)
against the masked pack of `DIR/<spec>.py`, a module of the same spec rendered from another template, all in
one config: the database's entry for whichever module's kernel hash it holds (so a template change can be
weighed before its re-tune), else the default.  `archive/probe_pack_flag_H200.json` weighed a scalar flag
per tile of one request (then the generated modules, "masked") against the committed flag per row ("per_row",
rendered before the change into the folder named): slower, dropped (notes_H200.md, eighth pass).

Usage (GPU): python benchmarks/probe_pack_mask.py --out /tmp/probe.json [--spec S ...] [--quick] [--point ...]
Earlier runs: benchmarks/results/archive/probe_pack_mask*_H200.json.  The first, `probe_pack_mask_H200.json`,
was made before the launcher chose between the forms (by this script's first version, which rewrote the
generated module's text); it also timed a third form, one store of `where(empty, 0, values)`: slower than
`stores` at 48 of 80 points, by up to 12%.  `--space` times the masked pack over the tuner's space instead
(`--sample K` configs of it per point) and re-times the best against the database's config, interleaved.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import layoutgen
from layoutgen.dcp import reference

REPO = Path(__file__).resolve().parent.parent
#: The module's threshold that forces each masked form.
FORMS = {"stores": 1 << 62, "skip": 0}


def measure(bench: Any, module: Any, N: int, B: int, H: int, D: int, empty_every: int) -> dict[str, Any]:
    from bench_dcp_v2 import _filled, _same, pack_inputs

    device, dtype = bench.device, torch.bfloat16
    nbytes, sets, outs, lses, empty = pack_inputs(bench, module, N, B, H, D, empty_every)
    config, source = bench.config(module, "pack", N, H, D, B)
    index_64 = False
    threshold = module._SKIP_EMPTY_READS_BYTES
    runs = {}
    for label in ("unmasked", *FORMS):
        mask = None if label == "unmasked" else empty
        sends = [module.alloc(N, B, H, D, dtype, device) for _ in range(sets)]
        expected = _filled(module.alloc(N, B, H, D, dtype, device))
        _filled(sends[0])

        def run(i: int, sends: list[Any] = sends, mask: Any = mask, label: str = label) -> None:
            module._SKIP_EMPTY_READS_BYTES = FORMS.get(label, threshold)
            try:
                module._launch_pack(outs[i], lses[i], sends[i], B, config, index_64, empty=mask)
            finally:
                module._SKIP_EMPTY_READS_BYTES = threshold

        reference.pack(outs[0], lses[0], expected, empty=mask)
        run(0)
        if not _same(sends[0], expected):
            raise AssertionError(f"{module.SPEC_NAME} {label} pack differs from the reference at {N} {B} {H} {D}")
        runs[label] = run
    timings = bench.timer.time_interleaved(list(runs.values()), sets, max(1.0, nbytes / 3.5e6))
    row: dict[str, Any] = {"spec": module.SPEC_NAME, "N": N, "B": B, "H": H, "D": D, "empty_every": empty_every}
    row.update({"config": source, "bytes": nbytes, "payload_bytes": B * H * D * 2})
    row["us"] = {label: timing.median_us for label, timing in zip(runs, timings, strict=True)}
    row["over_unmasked"] = {label: us / row["us"]["unmasked"] for label, us in row["us"].items()}
    return row


def write_rows(out: Path, rows: list[dict[str, Any]], **fields: Any) -> None:
    """The probe's JSON (date, environment, `fields`, the rows so far), rewritten after every point."""
    from bench_dcp_v2 import environment

    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(),
        **fields,
        "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


def measure_compare(bench: Any, module: Any, other: Any, label: str, N: int, B: int, H: int, D: int) -> dict[str, Any]:
    """`module`'s unmasked and masked packs and `other`'s masked pack (every 4th request empty), interleaved
    in one config (see the module docstring), each checked byte for byte first."""
    from bench_dcp_v2 import _filled, _same, pack_inputs

    nbytes, sets, outs, lses, empty = pack_inputs(bench, module, N, B, H, D)
    config, source = bench.config(module, "pack", N, H, D, B)
    if source != "tuned":
        config, source = bench.config(other, "pack", N, H, D, B)
    runs = {}
    for name, launcher, mask in (("unmasked", module, None), ("masked", module, empty), (label, other, empty)):
        sends = [module.alloc(N, B, H, D, torch.bfloat16, bench.device) for _ in range(sets)]
        expected = _filled(module.alloc(N, B, H, D, torch.bfloat16, bench.device))
        _filled(sends[0])

        def run(i: int, sends: list[Any] = sends, launcher: Any = launcher, mask: Any = mask) -> None:
            launcher._launch_pack(outs[i], lses[i], sends[i], B, config, False, empty=mask)

        reference.pack(outs[0], lses[0], expected, empty=mask)
        run(0)
        if not _same(sends[0], expected):
            raise AssertionError(f"{module.SPEC_NAME} {name} pack differs from the reference at {N} {B} {H} {D}")
        runs[name] = run
    timings = bench.timer.time_interleaved(list(runs.values()), sets, max(1.0, nbytes / 3.5e6))
    row: dict[str, Any] = {"spec": module.SPEC_NAME, "N": N, "B": B, "H": H, "D": D, "config": source}
    row.update({"block_batch": config.block_batch, "bytes": nbytes})
    row["us"] = {name: timing.median_us for name, timing in zip(runs, timings, strict=True)}
    row["over_unmasked"] = {name: us / row["us"]["unmasked"] for name, us in row["us"].items()}
    return row


def compare_main(bench: Any, args: Any, points: list[Any]) -> int:
    from bench_dcp_v2 import HELIX_SPECS, LSE_SPECS

    from layoutgen.loader import load_path

    label, _, folder = args.compare.partition("=")
    rows: list[dict[str, Any]] = []
    for name in args.spec or (*LSE_SPECS, *HELIX_SPECS):
        module = layoutgen.load(name)
        other = load_path(Path(folder) / f"{name}.py", module_name=f"layoutgen_probe_{label}_{name}")
        if not rows:
            measure_compare(bench, module, other, label, *points[0])  # a process's first timings run fast
        for point in points:
            row = measure_compare(bench, module, other, label, *point)
            rows.append(row)
            ratios = "  ".join(f"{key} {ratio:.3f}" for key, ratio in row["over_unmasked"].items())
            print(f"{name} N={point[0]} B={point[1]} H={point[2]} D={point[3]} bb={row['block_batch']} "
                  f"({row['config']}): unmasked {row['us']['unmasked']:.2f} us  {ratios}", flush=True)  # fmt: skip
            write_rows(args.out, rows, compare=label)
    for key in ("masked", label):
        ratios = [row["over_unmasked"][key] for row in rows]
        print(f"{key}: worst {max(ratios):.3f}, above 1.03 at {sum(r > 1.03 for r in ratios)} of {len(ratios)}")
    return 0


def search_masked(
    bench: Any, module: Any, N: int, B: int, H: int, D: int, pool: Any, sample: int = 0
) -> dict[str, Any]:
    """The masked pack (every 4th request empty, the launcher's form) timed in every config of the space;
    then the unmasked and masked packs in the database's config and the masked one in the best config found,
    re-timed interleaved."""
    from bench_dcp_v2 import pack_inputs
    from probe_combine import space_configs

    nbytes, sets, outs, lses, empty = pack_inputs(bench, module, N, B, H, D)
    sends = [module.alloc(N, B, H, D, torch.bfloat16, bench.device) for _ in range(sets)]
    tuned, source = bench.config(module, "pack", N, H, D, B)
    estimate = max(1.0, nbytes / 3.5e6)

    def launcher(config: Any, mask: Any) -> Any:
        def run(i: int) -> None:
            module._launch_pack(outs[i], lses[i], sends[i], B, config, False, empty=mask)

        return run

    times = {}
    for config in space_configs(module, N, B, H, D, pool, kernel="pack", sample=sample).values():
        times[config] = bench.timer.time(launcher(config, empty), sets, estimate).median_us
    best = min(times, key=lambda c: times[c])
    final = bench.timer.time_interleaved(
        [launcher(tuned, None), launcher(tuned, empty), launcher(best, empty), launcher(best, None)], sets, estimate
    )
    labels = ("unmasked_tuned", "masked_tuned", "masked_best", "unmasked_at_masked_best")
    row: dict[str, Any] = {"spec": module.SPEC_NAME, "N": N, "B": B, "H": H, "D": D, "config": source}
    row.update({"tuned_config": tuned.as_dict(), "masked_best_config": best.as_dict(), "configs": len(times)})
    row["us"] = {label: timing.median_us for label, timing in zip(labels, final, strict=True)}
    row["over_unmasked"] = {label: us / row["us"]["unmasked_tuned"] for label, us in row["us"].items()}
    return row


def main() -> int:
    from bench_dcp_v2 import HELIX_SPECS, LSE_SPECS, Bench, grid

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write (after every point)")
    parser.add_argument("--spec", action="append", help="a bundled DCP spec (repeatable; default: bench_dcp_v2's)")
    parser.add_argument("--quick", action="store_true", help="bench_dcp_v2.py --quick's batch sizes")
    parser.add_argument("--point", action="append", default=[], metavar="N:B:H:D", help="a point (repeatable)")
    parser.add_argument("--empty-every", action="append", type=int, help="every K-th request empty (default 4)")
    parser.add_argument("--db", type=Path, default=REPO / "tuning_db", help="tuning database directory")
    parser.add_argument("--space", action="store_true", help="the masked pack over the tuner's whole space instead")
    parser.add_argument("--sample", type=int, default=0, help="--space: at most this many configs per point")
    parser.add_argument("--compare", metavar="LABEL=DIR", help="against the masked pack of DIR/<spec>.py instead")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    bench = Bench(False, args.db)
    points = [tuple(int(v) for v in point.split(":")) for point in args.point] or grid(args.quick, False)
    rows: list[dict[str, Any]] = []
    if args.space:
        return space_main(bench, args, points)
    if args.compare:
        if "=" not in args.compare or not Path(args.compare.partition("=")[2]).is_dir():
            parser.error(f"--compare {args.compare}: expected LABEL=DIR, DIR a folder of generated modules")
        return compare_main(bench, args, points)
    for name in args.spec or (*LSE_SPECS, *HELIX_SPECS):
        module = layoutgen.load(name)
        if not rows:
            measure(bench, module, *points[0], 4)  # a process's first timings run fast: thrown away
        for point in points:
            for empty_every in args.empty_every or [4]:
                row = measure(bench, module, *point, empty_every)
                rows.append(row)
                ratios = "  ".join(f"{label} {ratio:.3f}" for label, ratio in row["over_unmasked"].items())
                print(
                    f"{name} N={point[0]} B={point[1]} H={point[2]} D={point[3]} empty_every={empty_every}: "
                    f"unmasked {row['us']['unmasked']:.2f} us  {ratios}",
                    flush=True,
                )
                write_rows(args.out, rows, threshold_bytes=module._SKIP_EMPTY_READS_BYTES)
    for label in FORMS:
        ratios = [row["over_unmasked"][label] for row in rows]
        print(f"{label}: worst {max(ratios):.3f}, above 1.03 at {sum(r > 1.03 for r in ratios)} of {len(ratios)}")
    return 0


def space_main(bench: Any, args: Any, points: list[Any]) -> int:
    from bench_dcp_v2 import HELIX_SPECS, LSE_SPECS

    from layoutgen.tuning.compile import CompilePool, default_compile_workers

    pool = CompilePool(default_compile_workers(1))
    rows: list[dict[str, Any]] = []
    for name in args.spec or (*LSE_SPECS, *HELIX_SPECS):
        module = layoutgen.load(name)
        if not rows:
            measure(bench, module, *points[0], 4)  # a process's first timings run fast: thrown away
        for point in points:
            row = search_masked(bench, module, *point, pool, args.sample)
            rows.append(row)
            ratios = "  ".join(f"{label} {ratio:.3f}" for label, ratio in row["over_unmasked"].items())
            print(f"{name} {point} ({row['configs']} configs): {ratios}", flush=True)
            write_rows(args.out, rows, space=True)
    pool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
