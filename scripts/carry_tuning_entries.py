"""Carry tuning entries across a kernel-source change that leaves the code they were timed with unchanged.

An entry is current only while its kernel's source hash matches (docs/design.md §7), and nothing is bumped by
hand. Some changes alter the source of every kernel of a kind and none of the code the tuner timed: a cast
under `if INDEX_64:` is folded away at every tuned shape (all far below 2**31 elements). For each entry of a
bundled spec whose source hash is that of `generated/<spec>.py` at the git revision REV (or of DIR/<spec>.py)
and is not the current module's, this compiles offline for sm_90 (`layoutgen.tuning.offline`) what the tuner
compiled for the entry, from both sources: its family's workload's compile job (the config at the entry's
shape and bucket, the capacity the tuner allocates, a DCP pack's masked form). Where the SASS (`cuobjdump -sass`), the resource usage (`cuobjdump -res-usage`: registers, shared
memory, stack) and the launch metadata (warps, stages, shared memory) of every compile are identical, the
timing stands and the entry takes the current source hash; every other entry is left as it was, stale, for
`layoutgen tune`. The databases are rewritten under their lock and atomically.

Usage:
    python scripts/carry_tuning_entries.py --from-rev HEAD [--dry-run] tuning_db/NVIDIA_H200.json ...
    python scripts/carry_tuning_entries.py --from-dir OLD_GENERATED tuning_db/NVIDIA_H200.json ...
Exit status 1 where some entry tuned with those sources compiles to other code now (it is listed, left stale).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: (spec, kernel, variant_args, config): the jobs one compile serves, as the tuner's compile pool groups them.
CompileKey = tuple[str, str, tuple[Any, ...], tuple[tuple[str, int], ...]]


def compile_job(entry: Any, module: Any) -> Any:
    """The `CompileJob` the tuner's compile pool built for `entry`: its family's own workload's, on a CUDA device
    (whose capacity rounding the tuner timed with)."""
    import torch

    from layoutgen.tuning.objective import Target
    from layoutgen.tuning.problem import Problem

    problem = Problem(module.SPEC, entry.key.kernel, entry.key.extents, entry.key.dtype)
    # The L2 size sets only the timing's rotating inputs, nothing the compile job holds.
    workload = problem.family.workload(Target(problem, module), entry.key.bucket, torch.device("cuda"), 2**26)
    return workload.compile_job(problem.decl.config_type.from_dict(entry.config))


def compiled_code(module_path: str, job: Mapping[str, Any]) -> list[str]:
    """The SASS, resource usage and launch metadata of every kernel the job's launcher compiles (run in a
    child process without TRITON_INTERPRET)."""
    import triton

    from layoutgen.loader import load_path
    from layoutgen.tuning.offline import compile_offline_all

    module = load_path(Path(module_path))
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    found = []
    with tempfile.TemporaryDirectory() as directory:
        for index, compiled in enumerate(compile_offline_all(module, job)):
            cubin = Path(directory) / f"kernel{index}.cubin"
            cubin.write_bytes(compiled.asm["cubin"])
            listings = [
                subprocess.run([tools / "cuobjdump", flag, cubin], capture_output=True, text=True, check=True).stdout
                for flag in ("-sass", "-res-usage")
            ]
            # cuobjdump names the file it read; the listings are compared, not where they were written.
            listings = [text.replace(str(cubin), "kernel.cubin") for text in listings]
            metadata = compiled.metadata
            launch = f"warps {metadata.num_warps} stages {metadata.num_stages} shared {metadata.shared}"
            found.append("\n".join([*listings, launch]))
    return found


def module_at(rev: str, spec: str, directory: Path) -> Path | None:
    """`generated/<spec>.py` as it was at `rev`, written into `directory` (None where it did not exist)."""
    shown = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:generated/{spec}.py"], capture_output=True, text=True, check=False
    )
    if shown.returncode != 0:
        return None
    path = directory / f"{spec}.py"
    path.write_text(shown.stdout, encoding="utf-8")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("databases", nargs="+", type=Path)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-rev", help="the git revision whose generated/ the entries were tuned with")
    source.add_argument("--from-dir", type=Path, help="a directory of the generated modules they were tuned with")
    parser.add_argument("--dry-run", action="store_true", help="report, write nothing")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="carry_old_") as directory:
        return carry(args, Path(directory))


def carry(args: argparse.Namespace, old_directory: Path) -> int:
    from filelock import FileLock

    from layoutgen.files import replace_atomically
    from layoutgen.loader import load, load_path
    from layoutgen.spec import bundled_specs
    from layoutgen.tuning_db import LOCK_TIMEOUT_S, lock_path, read_database

    old_modules: dict[str, Any] = {}
    candidates: dict[Path, dict[str, tuple[CompileKey, str, Any]]] = {}
    jobs: dict[CompileKey, tuple[str, str, dict[str, Any]]] = {}
    bundled = bundled_specs()
    for path in args.databases:
        candidates[path] = {}
        for name, entry in read_database(path).entries.items():
            spec = entry.key.spec
            if spec not in bundled:  # a user's spec: its modules are not in generated/
                continue
            current = load(spec).SOURCE_HASHES[entry.key.kernel]
            if entry.source_hash == current:
                continue
            if spec not in old_modules:
                if args.from_dir:
                    old_path = args.from_dir / f"{spec}.py" if (args.from_dir / f"{spec}.py").is_file() else None
                else:
                    old_path = module_at(args.from_rev, spec, old_directory)
                old_modules[spec] = (old_path, load_path(old_path)) if old_path else None
            if old_modules[spec] is None or old_modules[spec][1].SOURCE_HASHES[entry.key.kernel] != entry.source_hash:
                print(f"stale, not from {args.from_rev or args.from_dir}: {path.name} {name}")
                continue
            job = compile_job(entry, old_modules[spec][1])
            key: CompileKey = (spec, job.kernel, job.variant_args, job.config)
            jobs[key] = (str(old_modules[spec][0]), str(load(spec).__file__), job.variant_job)
            candidates[path][name] = (key, current, entry)

    # Fresh interpreters without TRITON_INTERPRET: under it `@triton.jit` gives functions that cannot compile.
    os.environ.pop("TRITON_INTERPRET", None)
    same: dict[CompileKey, bool] = {}
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.workers, mp_context=spawn) as pool:
        futures = {
            key: (pool.submit(compiled_code, old, job), pool.submit(compiled_code, new, job))
            for key, (old, new, job) in jobs.items()
        }
        for done, (key, (old_future, new_future)) in enumerate(futures.items(), 1):
            same[key] = old_future.result() == new_future.result()
            if done % 50 == 0 or done == len(futures):
                print(f"compiled {done} of {len(futures)} configs", flush=True)

    failed = 0
    for path, entries in candidates.items():
        carried = {name: (current, entry) for name, (key, current, entry) in entries.items() if same[key]}
        for name, (key, _, _) in entries.items():
            if not same[key]:
                failed += 1
                print(f"different code, left stale: {path.name} {name}")
        print(f"{path}: {len(carried)} of {len(entries)} entries carried")
        if args.dry_run or not carried:
            continue
        with FileLock(str(lock_path(path)), timeout=LOCK_TIMEOUT_S):
            database = read_database(path)
            for name, (current, judged) in carried.items():
                if database.entries.get(name) == judged:  # a tuner may have replaced it since: that one stays
                    database.entries[name] = judged.model_copy(update={"source_hash": current})
            replace_atomically(path, database.to_json())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
