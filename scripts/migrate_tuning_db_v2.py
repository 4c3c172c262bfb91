"""Convert a schema-1 tuning database (layoutgen 0.1, DCP only) to schema 2, in place or to --out.

    python scripts/migrate_tuning_db_v2.py tuning_db/NVIDIA_H200.json [--out FILE] [--check]

Schema 1 keyed entries by (spec, kernel, N, heads per peer, D, dtype, batch bucket) and recorded the spec
hash, the kernel's source hash, the rotating input sets and the kernel's timing rule. Schema 2 keys them
by family too, with the shape as named extents, and an entry records everything it is current against
(`layoutgen.tuning_db`). Each entry is converted by content, never by assertion:

* spec: the entry's hash must equal the schema-1 hash of today's bundled spec (the same canonical JSON
  without the `family` key the spec model gained); then it gets today's spec hash.
* kernel source: the entry's hash must equal the schema-1 hash of today's rendered kernel. Schema 1
  hashed the rendered kernels cut at the combine marker: the pack part ended with the two blank lines
  before that marker, the combine part ran to the end; today's units are those texts less the blank
  lines (`legacy_source_hash`). Then it gets today's source hash.
* search space: the schema-1 tuner treated every entry of the current spec and source, timing rule and
  rotating sets as decided in its space (SPACE_VERSION 5), which today's declaration reproduces field
  for field (`layoutgen/dcp/__init__.py`); such an entry gets today's space hash.
* timing: rule 1 for pack and rule 2 for combine are the procedures `KernelDecl.timing` declares today
  (pack writes each rotating set's own send buffers, combine one output for every set); an entry of
  that rule gets today's timing hash.
* versions: the file's triton and torch versions (one writer wrote them all), as major.minor.

An entry that fails a check keeps a hash that can never match (`legacy:<what>`), so dispatch reports it
as stale and a re-tune replaces it; the script says how many, and why.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from layoutgen.codegen import render_kernels
from layoutgen.dcp import FAMILY
from layoutgen.family import content_hash
from layoutgen.files import FileRefused, read_bounded, replace_atomically
from layoutgen.spec import bundled_specs
from layoutgen.tuning.procedure import space_hash, timing_hash
from layoutgen.tuning_db import (
    MAX_DATABASE_BYTES,
    SCHEMA_VERSION,
    TuningDatabase,
    TuningEntry,
    TuningKey,
    major_minor,
)

#: The schema-1 timing rule of each kernel that today's declared procedure reproduces.
CURRENT_RULES = {"pack": 1, "combine": 2}


def legacy_spec_hash(spec: Any) -> str:
    return content_hash(spec.model_dump(mode="json", exclude={"summary", "family"}))


def legacy_source_hash(kernel: str, unit: str) -> str:
    return hashlib.sha256((unit + "\n\n" if kernel == "pack" else unit).encode()).hexdigest()


def convert(data: dict[str, Any]) -> tuple[TuningDatabase, Counter[str]]:
    if data.get("schema_version") != 1:
        raise ValueError(f"expected a schema-1 file, got schema_version {data.get('schema_version')!r}")
    specs = bundled_specs()
    file_versions = data.get("versions") or {}
    versions = {name: major_minor(str(file_versions.get(name, "unknown"))) for name in ("triton", "torch")}
    units = {name: render_kernels(spec) for name, spec in specs.items() if spec.family == "dcp"}
    outcome: Counter[str] = Counter()
    entries = {}
    for name, old in data["entries"].items():
        old_key = old["key"]
        spec, kernel = specs.get(old_key["spec"]), old_key["kernel"]
        decl = FAMILY.kernel(kernel)
        current = spec is not None and spec.family == "dcp"
        spec_ok = current and old["spec_hash"] == legacy_spec_hash(spec)
        source_ok = spec_ok and old["source_hash"] == legacy_source_hash(kernel, units[old_key["spec"]][kernel])
        timing_ok = old.get("timing_rule") == CURRENT_RULES[kernel]
        space_ok = source_ok and timing_ok and old.get("rotating_sets") is not None
        outcome["current" if space_ok else "stale"] += 1
        for what, passed in (("spec", spec_ok), ("kernel source", source_ok), ("timing rule", timing_ok)):
            if not passed:
                outcome[f"stale {what}"] += 1
        key = TuningKey(
            family="dcp",
            spec=old_key["spec"],
            kernel=kernel,
            extents=(("N", old_key["N"]), ("Hl", old_key["heads_per_peer"]), ("D", old_key["D"])),
            dtype=old_key["dtype"],
            bucket_name="B",
            bucket=old_key["batch_bucket"],
        )
        entry = TuningEntry(
            key=key,
            config=old["config"],
            median_us=old["median_us"],
            p20_us=old["p20_us"],
            p80_us=old["p80_us"],
            default_us=old["default_us"],
            trials=old["trials"],
            spec_hash=spec.layout_hash() if spec_ok and spec is not None else f"legacy:{old['spec_hash']}",
            source_hash=hashlib.sha256(units[old_key["spec"]][kernel].encode()).hexdigest()
            if source_ok
            else f"legacy:{old['source_hash']}",
            space_hash=space_hash(decl) if space_ok else "legacy:schema-1 space",
            timing_hash=timing_hash(decl) if timing_ok else f"legacy:timing rule {old.get('timing_rule')}",
            versions=versions,
            measured_at=old["measured_at"],
            rotating_sets=old.get("rotating_sets") or 1,
        )
        if entry.key.as_str() in entries:
            raise ValueError(f"two schema-1 entries map to {entry.key.as_str()} (one is {name})")
        entries[entry.key.as_str()] = entry
    database = TuningDatabase(
        schema_version=SCHEMA_VERSION,
        device_name=data["device_name"],
        compute_capability=data["compute_capability"],
        versions=file_versions,
        entries=dict(sorted(entries.items())),
    )
    return database, outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="a schema-1 tuning database (tuning_db/<device>.json)")
    parser.add_argument("--out", type=Path, help="write here instead of replacing FILE")
    parser.add_argument("--check", action="store_true", help="convert and report, write nothing")
    args = parser.parse_args(argv)
    try:
        data = json.loads(read_bounded(args.file, MAX_DATABASE_BYTES))
        database, outcome = convert(data)
    except (FileRefused, ValueError, KeyError) as error:
        print(f"error: {args.file}: {error}", file=sys.stderr)
        return 2
    summary = ", ".join(f"{count} {what}" for what, count in sorted(outcome.items()))
    print(f"{args.file}: {len(database.entries)} entries converted to schema {SCHEMA_VERSION} ({summary})")
    if not args.check:
        target = args.out or args.file
        replace_atomically(target, database.to_json())
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
