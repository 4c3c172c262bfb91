"""Run-time support every family's generated modules share: config choice, plan cache, direct launch.

* `configs`  which config a `config=None` call gets: forced, tuned (tuning database), default
* `plans`    the per-buffers plan cache and `reset_caches`
* `launch`   launching a compiled kernel without Triton's per-call argument specialisation
* `tensors`  checks on user tensors (overlap, 64-bit indexing, the interpreter)
* `exchange` one `all_to_all_single` per buffer

A family's own runtime (its argument checks and public functions) builds on these.
"""

from __future__ import annotations

from layoutgen.runtime.configs import LayoutgenWarning, database_dirs
from layoutgen.runtime.plans import reset_caches

__all__ = ["LayoutgenWarning", "database_dirs", "reset_caches"]
