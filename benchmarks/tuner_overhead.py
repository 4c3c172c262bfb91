"""What `layoutgen tune` spends per study besides the GPU: Optuna's sampler, the study storage, bookkeeping.

Runs the real search (`runner.run`: studies, TPE asks, claims, records, the final decision, the database)
on one compiled family of the default grid, with compile, gate and timing replaced by a synthetic cost
surface, so what is left is the orchestration a GPU run pays between kernel timings.  No GPU needed.

Usage:  python benchmarks/tuner_overhead.py --storage /dev/shm/lg-overhead.journal [--kernel pack]
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def synthetic_us(config: Any) -> float:
    """A smooth surface with one optimum: the TPE search behaves as on a real space."""
    values = config.as_dict()
    blocks = sum(abs(math.log2(v) - 2) for name, v in values.items() if name.startswith("block"))
    return 5.0 + 0.3 * blocks + abs(math.log2(values["num_warps"]) - 1)


def install_synthetic_objective() -> None:
    from layoutgen.dcp import FAMILY
    from layoutgen.dcp.workload import DcpWorkload
    from layoutgen.tuning import decision, objective, search, worker
    from layoutgen.tuning.timing import Timing

    def evaluate(workload: Any, config: Any, compiled: Any, timer: Any, seed: int, give_up_us: Any = None) -> Any:
        value = synthetic_us(config)
        return objective.Measurement("ok", timing=Timing(value, value * 0.99, value * 1.01, 50, 10))

    class SyntheticTimer:
        description = "synthetic"

        def time_interleaved(self, launches: list[Any], sets: int, estimate: float) -> list[Timing]:
            return [Timing(5.0, 4.95, 5.05, 100, 10) for _ in launches]

    class SyntheticWorkload(DcpWorkload):
        """The family's compile jobs (the search asks for them); no buffers, nothing launched."""

        def timing_launch(self, config: Any) -> Any:
            return lambda index: None

    original_context = worker.make_context

    def make_context(options: Any, storage: Any, reporter: Any) -> Any:
        context = original_context(options, storage, reporter)
        context.timer = SyntheticTimer()
        return context

    search.evaluate = evaluate
    decision.evaluate = evaluate
    worker.make_context = make_context
    FAMILY.workload = SyntheticWorkload  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--storage", required=True, help="journal file or storage URL (a fresh one per run)")
    parser.add_argument("--kernel", default="pack", choices=("pack", "combine"))
    args = parser.parse_args()
    os.environ["TRITON_INTERPRET"] = "1"  # no GPU: the family's module is imported, never launched
    from rich.console import Console

    from layoutgen.dcp import FAMILY
    from layoutgen.tuning import plan, runner

    install_synthetic_objective()
    options = plan.TuneOptions(
        specs=("pynccl_a2a",), kernels=(args.kernel,), grid=(("N", (4,)), ("H", (128,)), ("D", (512,))),
        buckets=FAMILY.bucket.defaults,
        trials=plan.DEFAULT_TPE_TRIALS, exhaustive_limit=plan.DEFAULT_EXHAUSTIVE_LIMIT, storage=args.storage,
        db_dir=None, interpret=True, workers=1, lookahead=3,
    )  # fmt: skip
    # One bucket first so that imports and the module load are not counted.
    runner.run(dataclasses.replace(options, storage=args.storage + ".warm", buckets=(1,)), Console(file=io.StringIO()))
    started = time.perf_counter()
    summary = runner.run(options, Console(file=io.StringIO()))
    seconds = time.perf_counter() - started
    trials = sum(row.trials for row in summary.rows)
    print(
        f"{args.kernel} N=4 H=128 D=512: {len(summary.rows)} studies, {trials} trials in {seconds:.2f} s: "
        f"{seconds / len(summary.rows) * 1e3:.0f} ms per study, {seconds / trials * 1e3:.1f} ms per trial"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
