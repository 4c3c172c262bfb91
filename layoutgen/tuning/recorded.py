"""What the tuner and `layoutgen db check` say about recorded entries: the sizes a shape's smallest tuned bucket
serves, and entries dated ahead of the clock."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from layoutgen.tuning_db import TuningEntry, TuningKey


def smallest_buckets(entries: Iterable[TuningEntry], keys: Iterable[TuningKey]) -> dict[TuningKey, int]:
    """For each group of `keys` (their shape without the bucket) whose smallest bucket among `entries` is above
    1: that bucket, keyed by the group's first key.  Dispatch runs that bucket's config for every smaller size
    (`pick_bucket`), where a config tuned for many rows can lose to the default on a few (H100, vllm_a2a
    combine at N 8, H 128, D 512 with only bucket 64 tuned: 1.77 and 2.00 µs at B 1 and 8, the default 1.56
    and 1.67); the tuner says so."""
    smallest: dict[tuple[Any, ...], int] = {}
    for entry in entries:
        group = entry.key.group()
        smallest[group] = min(smallest.get(group, entry.key.bucket), entry.key.bucket)
    named: dict[tuple[Any, ...], tuple[TuningKey, int]] = {}
    for key in keys:
        if smallest.get(key.group(), 1) > 1:
            named.setdefault(key.group(), (key, smallest[key.group()]))
    return dict(named.values())


def future_entries(entries: Iterable[TuningEntry], slack_s: float = 3600.0) -> list[TuningEntry]:
    """Entries measured more than `slack_s` after now (a host clock ahead, a hand edit): the merge keeps such an
    entry over every later measurement until that time comes, so `record` callers and `db check` name them."""
    limit = datetime.now(timezone.utc).timestamp() + slack_s
    return [entry for entry in entries if entry.measured_time.timestamp() > limit]
