"""What the tuner tunes: a problem (family, spec, kernel, shape as named extents, dtype) per size bucket.

One name per specialisation: `Problem.key(bucket)` is the tuning-database key, `label` what reports and
progress bars show, `study_name` (in `plan`) the Optuna study; all three come from the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from layoutgen.family import Family, KernelDecl, get_family


@dataclass(frozen=True)
class Problem:
    """Everything a compiled kernel is specialised for, the size bucket aside."""

    spec: Any
    kernel: str
    #: The family's key extents, in its key order, e.g. (("N", 4), ("Hl", 32), ("D", 512)).
    extents: tuple[tuple[str, int], ...]
    dtype: str

    def __post_init__(self) -> None:
        family = self.family
        family.kernel(self.kernel)  # raises for a kernel the family does not have
        if tuple(name for name, _ in self.extents) != family.key_extents:
            raise ValueError(f"{family.name} problems have extents {family.key_extents}, got {self.extents}")
        for name, value in self.extents:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.dtype not in family.dtypes:
            raise ValueError(f"dtype must be one of {list(family.dtypes)}, got {self.dtype!r}")

    @property
    def family(self) -> Family:
        return get_family(self.spec.family)

    @property
    def decl(self) -> KernelDecl:
        return self.family.kernel(self.kernel)

    def extent(self, name: str) -> int:
        return dict(self.extents)[name]

    @property
    def label(self) -> str:
        shape = " ".join(f"{name}={value}" for name, value in self.extents)
        return f"{self.spec.name} {self.kernel} {shape} {self.dtype}"

    def key(self, bucket: int) -> Any:
        from layoutgen.tuning_db import TuningKey

        return TuningKey(
            family=self.spec.family,
            spec=self.spec.name,
            kernel=self.kernel,
            extents=self.extents,
            dtype=self.dtype,
            bucket_name=self.family.bucket.name,
            bucket=bucket,
        )
