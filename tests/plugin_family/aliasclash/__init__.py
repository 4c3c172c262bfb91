"""aliasclash: the test family `stridecopy` with CLI aliases that collide, for `tests/test_plugin_family_tuning.py`:
its grid axis C takes `--heads` (DCP's and Ulysses' alias of H) and its bucket R takes `--workers` (an option of
`layoutgen tune`).  Importable beside `stridecopy`, whose kernels it keeps."""

from __future__ import annotations

from stridecopy import StrideCopy

from layoutgen.family import GridAxis


class AliasClash(StrideCopy):
    name = "aliasclash"
    summary = "a strided copy whose aliases collide (the test family)"
    grid_axes = (GridAxis("C", (64,), (5,), "columns", alias="heads"),)
    bucket = GridAxis("R", (64,), (3,), "rows", alias="workers")


FAMILY = AliasClash()
