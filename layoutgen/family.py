"""Kernel families: the interface a family implements, and the registry that finds families by name.

layoutgen's shared machinery -- spec loading, rendering, module loading, the plan cache and direct
launch, the tuner, the tuning database, `show`/`diff` and the CLI -- knows no family's words.  Everything
that does (logical axes, buffers, kernels and their arguments, the torch reference and its tolerances,
defaults and search spaces, tuning workloads, byte-map vocabulary, distributed helpers) lives in one
package per family, which exposes one `Family` object as its module attribute `FAMILY`.

Adding a family is one package (the folder) plus one line in `BUILTIN_FAMILIES`; a family that lives
outside layoutgen registers with `register()` or `LAYOUTGEN_FAMILIES` (see `layoutgen.settings`).

Nothing here imports torch or Triton; a family is imported the first time it is asked for.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

if TYPE_CHECKING:
    from layoutgen.config import LaunchConfig
    from layoutgen.show.model import ByteLayout
    from layoutgen.spec import SpecBase
    from layoutgen.tuning.objective import Target, Workload
    from layoutgen.tuning.problem import Problem

#: The families that ship with layoutgen: name -> the package that holds its `FAMILY`.
BUILTIN_FAMILIES: dict[str, str] = {
    "dcp": "layoutgen.dcp",
    "ulysses": "layoutgen.ulysses",
}
#: The family of a spec that names none (every spec written before families existed is a DCP spec).
DEFAULT_FAMILY = "dcp"
#: Where a built-in family's spec schema is written down (`Family.schema_doc` overrides it).
BUILTIN_SCHEMA_DOC = "docs/design.md §3"
FAMILY_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"


def content_hash(data: Any) -> str:
    """sha256 of the canonical JSON of `data`: what an invalidation key is derived from."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# ----------------------------------------------------------------------------------------------------------
# Declarations a family makes about each of its kernels
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SearchSpace:
    """What one kernel template lets the tuner choose, and the rules that prune it before any compile.

    A power-of-two block along each tiled logical axis (`blocks`: config field, axis), `num_warps` and
    `num_stages`.  The pruning rules are the shared ones of `layoutgen.tuning.space`, parameterised here
    so that the declaration (and so its hash, which every tuning-database entry records) says all of it.
    """

    blocks: tuple[tuple[str, str], ...]
    num_warps: tuple[int, ...] = (1, 2, 4, 8, 16)
    num_stages: tuple[int, ...] = (1,)
    #: Largest block per axis (beyond the axis's own next power of two).
    caps: Mapping[str, int] = field(default_factory=dict)
    #: Caps that apply instead while the axis is the destination's innermost (stores coalesce along it).
    innermost_caps: Mapping[str, int] = field(default_factory=dict)
    #: A row segment along the innermost axis spans at least this many bytes (one DRAM sector).
    sector_bytes: int = 32
    #: At most this many tile elements per thread (values plus addresses must fit in registers).
    max_elements_per_thread: int = 64
    #: Beyond one warp, each thread loads at least this many bytes.
    min_bytes_per_thread: int = 16
    #: Each program loads at least this many bytes (unless the whole problem is smaller).
    min_tile_bytes: int = 1024
    #: Largest tile, in elements.
    max_tile_elements: int = 1 << 16

    def declaration(self) -> dict[str, Any]:
        data = asdict(self)
        data["caps"], data["innermost_caps"] = dict(self.caps), dict(self.innermost_caps)
        return data


class FamilyDeclarationError(TypeError):
    """A family's declarations contradict one another: a bug of the family, not of a spec or a call."""


class UnknownFamilyError(ValueError):
    """No family is registered under the name asked for (`get_family`)."""


@dataclass(frozen=True)
class KernelDecl:
    """One kernel of a family, as the shared machinery sees it."""

    #: The kernel's name: the generated module's public function, the tuning key's kernel, the CLI's --kernel.
    name: str
    #: Its template in the family's `templates/` folder; rendered on its own, so its source hash covers
    #: exactly its code.
    template: str
    #: The launch-config type its launcher takes (a `layoutgen.config.LaunchConfig` subclass).
    config_type: type[LaunchConfig]
    space: SearchSpace
    #: How the family's workload times it, beyond the shared timer (e.g. where its outputs go): hashed into
    #: every tuning-database entry with the shared timer's own constants.
    timing: Mapping[str, Any]
    #: True for pure data movement (verified byte for byte), False for arithmetic judged by a tolerance.
    exact: bool = True
    #: Where one call's bytes fit in the L2, also time every candidate with its inputs L2-resident (one input
    #: set, as right after the kernel that wrote them) and rank by the geometric mean of the two cache states
    #: (`layoutgen.tuning.timing.time_states`); other sizes are timed rotated only.
    resident_timing: bool = False
    #: One line for `layoutgen families` and the verification table.
    summary: str = ""


@dataclass(frozen=True)
class GridAxis:
    """One dimension of a family's default tuning grid (e.g. peers N), with its CLI alias."""

    name: str
    defaults: tuple[int, ...]
    interpret: tuple[int, ...]
    help: str
    #: `layoutgen tune --<alias> 2 4` is read as `--shape <name>=2,4`.
    alias: str | None = None


@dataclass(frozen=True)
class Check:
    """One verified kernel of one spec: `build` prints one line per check."""

    kernel: str
    passed: bool
    #: What was compared and how close it came, e.g. "bytes identical in 5 shapes" or "max 0.41 of tolerance".
    detail: str


@dataclass(frozen=True)
class VerifyReport:
    spec_name: str
    family: str
    checks: tuple[Check, ...]
    failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.failures and all(check.passed for check in self.checks)


# ----------------------------------------------------------------------------------------------------------
# The interface
# ----------------------------------------------------------------------------------------------------------
class Family(ABC):
    """A family of layout-parameterised kernels.  Subclass it in a package and expose one instance as the
    package's `FAMILY`; the shared machinery calls nothing but what is declared here."""

    #: The spec's `family:` value.
    name: ClassVar[str]
    summary: ClassVar[str]
    #: The pydantic model of the family's specs (a `layoutgen.spec.SpecBase` subclass).
    spec_model: ClassVar[type[SpecBase]]
    kernels: ClassVar[tuple[KernelDecl, ...]]
    #: Names of the extents a tuning key is specific to, in key order (e.g. ("N", "Hl", "D")).
    key_extents: ClassVar[tuple[str, ...]]
    #: The default tuning grid's axes (not the key's: e.g. total heads H where the key holds H/N) ...
    grid_axes: ClassVar[tuple[GridAxis, ...]]
    #: ... and its size bucket: runtime dispatch maps a live size to the smallest tuned bucket >= it.
    bucket: ClassVar[GridAxis]
    #: Activation dtypes the kernels take, by name (torch attribute names), the grid's default first.
    dtypes: ClassVar[tuple[str, ...]]
    default_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16",)

    # -- where its files are -------------------------------------------------------------------------------
    @property
    def package_dir(self) -> Path:
        module = importlib.import_module(type(self).__module__)
        return Path(module.__file__ or "").resolve().parent

    @property
    def template_dir(self) -> Path:
        return self.package_dir / "templates"

    @property
    def spec_dir(self) -> Path:
        """The family's example specs (`<name>.yaml`).  A built-in family's are layoutgen's bundled specs (built
        into generated/ by `layoutgen build`, checked by `build --check` and `db check`, loaded by name).  An
        out-of-tree family's are not: `layoutgen build --spec FILE.yaml --out DIR`, then use them by path."""
        return self.package_dir / "specs"

    #: Where the schema of this family's specs is written down, for spec errors to point at (a file of the
    #: family's package or a URL).  None: layoutgen's docs/design.md §3 for a built-in family, else the
    #: family's `spec_model` class.
    schema_doc: ClassVar[str | None] = None

    def schema_reference(self) -> str:
        """What a spec error of this family says to read for its schema."""
        if self.schema_doc:
            return self.schema_doc
        if BUILTIN_FAMILIES.get(self.name) == type(self).__module__:
            return BUILTIN_SCHEMA_DOC
        model = self.spec_model
        return f"the {self.name} family's spec model {model.__module__}.{model.__qualname__}"

    def kernel(self, name: str) -> KernelDecl:
        for declared in self.kernels:
            if declared.name == name:
                return declared
        known = ", ".join(k.name for k in self.kernels)
        raise ValueError(f"family {self.name!r} has no kernel {name!r}; its kernels: {known}")

    # -- rendering -----------------------------------------------------------------------------------------
    #: The module template (in `templates/`): `layoutgen.codegen.render_module` renders it with
    #: `render_context(spec)` plus these names, which the context must not use itself:
    #:   header          the "# Code generated by layoutgen ... DO NOT EDIT." line: the file's first line
    #:   spec_constants  Python statements defining SPEC_NAME, SPEC_HASH, SOURCE_HASHES (per kernel), SPEC_SUMMARY
    #:                   and SPEC = _parse_spec(...): the module must `from layoutgen.spec import parse_spec as
    #:                   _parse_spec` above them (import time then re-validates the spec, and a module of an
    #:                   unregistered family says how to register it)
    #:   name            the spec's name
    #:   family          the family's name
    #:   kernels         kernel name -> its rendered unit (`_<kernel>_kernel` and `_launch_<kernel>(...,
    #:                   kernel=_<kernel>_kernel)`), to place verbatim
    #: The public functions around the units are the family's own (docs/design.md §2.1 lists the shared helpers
    #: they call).
    module_template: ClassVar[str] = "module.py.jinja"

    @abstractmethod
    def render_context(self, spec: Any) -> dict[str, Any]:
        """Everything the family's templates need, derived from the spec alone (never its summary)."""

    # -- verification (`layoutgen build`) ---------------------------------------------------------------------
    @abstractmethod
    def verify(self, module: ModuleType, device: str) -> VerifyReport:
        """Run the generated module on small random problems against the family's torch reference."""

    # -- tuning -------------------------------------------------------------------------------------------
    @abstractmethod
    def key_shapes(self, spec: Any, kernel: str, point: Mapping[str, int], dtype: str) -> dict[str, int] | None:
        """The key extents of one grid point (e.g. N=4, H=128, D=512 -> N=4, Hl=32, D=512), or None when the
        spec cannot hold that point (the tuner skips it; `shape_problem` says why)."""

    def shape_problem(self, spec: Any, kernel: str, point: Mapping[str, int], dtype: str) -> str | None:
        """Why the spec cannot hold a grid point `key_shapes` skips (None: it can, or the family does not say):
        the tuner names it when no point of a run's grid is left."""
        return None

    @abstractmethod
    def workload(self, target: Target, bucket: int, device: Any, l2_bytes: int) -> Workload:
        """Gate buffers and rotating timing inputs of one target (a problem and its generated module) at one
        bucket (`layoutgen.tuning.objective.Workload`)."""

    def grid_points(self, given: Mapping[str, list[int]], interpret: bool) -> list[dict[str, int]]:
        """The grid points to tune: the product over `grid_axes` of the given values (axes not given: defaults,
        or under the interpreter their tiny values)."""
        points: list[dict[str, int]] = [{}]
        for axis in self.grid_axes:
            values = given.get(axis.name) or (axis.interpret if interpret else axis.defaults)
            points = [{**point, axis.name: value} for point in points for value in values]
        return points

    @abstractmethod
    def bytes_moved(self, problem: Problem, bucket: int) -> int:
        """DRAM bytes one call must move (what the tuner's TB/s and rotating input sets are computed from)."""

    @abstractmethod
    def default_config(self, problem: Problem, bucket: int) -> LaunchConfig:
        """The heuristic config `config=None` falls back to (and the tuner's first candidate)."""

    @abstractmethod
    def space_extents(self, problem: Problem, bucket: int) -> SpaceExtents:
        """What the shared pruning rules need to know of a problem (see `SpaceExtents`)."""

    @abstractmethod
    def compile_variant(self, module: ModuleType, job: Mapping[str, Any], kernel_proxy: Any) -> None:
        """Run the kernel's launcher with `meta` tensors for the variant `job` (`Workload.compile_job`) and
        `kernel_proxy` as the kernel: the tuner's compile pool compiles without launching."""

    def offline_jobs(self, spec: Any) -> list[tuple[str, dict[str, Any]]]:
        """(offset width, compile job) pairs `layoutgen build` compiles for sm_90 without a GPU (`tuning.offline`):
        every kernel at a small shape and at one past 2**31 elements.  The interpreter never sees what only
        Triton's compiler refuses; a family that declares none (the default) is compiled only where it runs."""
        return []

    # -- show / diff ---------------------------------------------------------------------------------------
    @abstractmethod
    def byte_layout(self, spec: Any, shape: Mapping[str, int], dtype: str) -> ByteLayout:
        """The buffers of `spec` at a drawing shape and where each logical element lives in them."""

    #: The drawing shape's extents with their defaults, e.g. {"N": 4, "B": 2, "H": 8, "D": 16}.
    show_shape: ClassVar[Mapping[str, int]]
    #: CLI aliases of the drawing shape's extents: `show --<alias> V` is read as `--shape <extent>=V`.
    show_aliases: ClassVar[Mapping[str, str]] = {}

    def unused_extents(self, spec: Any) -> Mapping[str, str]:
        """Drawing or grid extents `spec` has no use for, with why: refused when given for no spec that uses them."""
        return {}

    def describe(self) -> dict[str, Any]:
        """What `layoutgen families` prints."""
        return {
            "family": self.name,
            "summary": self.summary,
            "kernels": {
                k.name: k.summary + ("; tuned L2-resident and rotated" if k.resident_timing else "")
                for k in self.kernels
            },
            "key": [*self.key_extents, "dtype", self.bucket.name],
            # The points themselves: a family may pair its axes' values rather than take their product.
            "grid": self.grid_points({}, interpret=False),
            "buckets": {self.bucket.name: list(self.bucket.defaults)},
        }


@dataclass(frozen=True)
class SpaceExtents:
    """A problem as the shared pruning rules see it: the extent of every tiled axis at the bucket, the
    destination's innermost axis (stores coalesce along it), the bytes of one element moved, how many
    source elements each destination element loads (N for a merge of N partials, 1 for a copy), and the
    smallest block the kernel accepts along an axis, or the smallest worth searching (an fp8 pack's dim block
    holds whole scale blocks, or chunks of at least 16 elements where it walks them in chunks), and the
    source's innermost axis where it is another (loads coalesce along it: the innermost caps apply there too)."""

    extents: Mapping[str, int]
    innermost: str
    elem_bytes: int
    loads_per_element: int = 1
    floors: Mapping[str, int] = field(default_factory=dict)
    source_innermost: str | None = None


# ----------------------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------------------
_lock = threading.Lock()
_registered: dict[str, str] = {}
_families: dict[str, Family] = {}


def register(name: str, module: str) -> None:
    """Register the family `name` whose package (importable as `module`) exposes `FAMILY`."""
    if not re.fullmatch(FAMILY_NAME_PATTERN, name):
        raise ValueError(f"family name {name!r} must match {FAMILY_NAME_PATTERN}")
    with _lock:
        if _known().get(name, module) != module:
            raise ValueError(f"family {name!r} is already registered as {_known()[name]}; pick another name")
        _registered[name] = module


def unregister(name: str) -> None:
    """Forget a family registered with `register` (tests)."""
    with _lock:
        _registered.pop(name, None)
        _families.pop(name, None)


def _from_environment() -> dict[str, str]:
    from layoutgen.settings import SettingError, settings

    families = dict(settings.families)
    for name, module in families.items():
        if not re.fullmatch(FAMILY_NAME_PATTERN, name):  # checked here, where the pattern lives
            raise SettingError(
                f"LAYOUTGEN_FAMILIES: the family name {name!r} must match {FAMILY_NAME_PATTERN} (what a spec's "
                "`family:` can name: a lower-case letter, then lower-case letters, digits, _); rename it"
            )
        if name in BUILTIN_FAMILIES and module != BUILTIN_FAMILIES[name]:
            raise SettingError(
                f"LAYOUTGEN_FAMILIES names {name}={module}, but {name!r} is layoutgen's built-in family "
                f"({BUILTIN_FAMILIES[name]}); give your family another name"
            )
    return families


def _known() -> dict[str, str]:
    return {**BUILTIN_FAMILIES, **_from_environment(), **_registered}


def registered_outside() -> dict[str, str]:
    """The families this process knows beyond the built-in ones (`LAYOUTGEN_FAMILIES` and `register`), as
    `LAYOUTGEN_FAMILIES` would name them: what a child process needs to load the same specs."""
    return {name: module for name, module in _known().items() if name not in BUILTIN_FAMILIES}


def family_names() -> list[str]:
    return sorted(_known())


def get_family(name: str) -> Family:
    """The family registered as `name`; ValueError naming the known ones otherwise."""
    family = _families.get(name)
    if family is not None:
        return family
    known = _known()
    if name not in known:
        raise UnknownFamilyError(f"unknown family {name!r}; known families: {', '.join(sorted(known))}")
    try:
        module = importlib.import_module(known[name])
    except Exception as error:  # whatever the module raises on import
        from layoutgen.settings import SettingError

        if name not in _from_environment():
            raise
        raise SettingError(
            f"LAYOUTGEN_FAMILIES: the module {known[name]} of family {name!r} does not import ({type(error).__name__}: "
            f"{error}); fix the module, or the entry {name}={known[name]} (the variable's, or the register() call "
            "that a parent process passed on to this one)"
        ) from error
    family = getattr(module, "FAMILY", None)
    if not isinstance(family, Family) or family.name != name:
        _refuse_module(name, known[name], family)
    with _lock:
        _families[name] = family
    return family


def _refuse_module(name: str, module: str, family: Any) -> NoReturn:
    """The module registered as family `name` exposes no `Family` of that name: a SettingError naming the entry
    where `LAYOUTGEN_FAMILIES` registered it (bad input, exit 2), else TypeError / ValueError."""
    if not isinstance(family, Family):
        problem = f"module {module} of family {name!r} must expose a layoutgen.family.Family as FAMILY"
    else:
        problem = f"module {module} is registered as family {name!r} but its FAMILY is {family.name!r}"
    if name not in _from_environment():
        raise TypeError(problem) if not isinstance(family, Family) else ValueError(problem)
    from layoutgen.settings import SettingError

    entry = f"{name}={module}"
    if not isinstance(family, Family):
        fix = f"fix the entry {entry}: MODULE is a package that exposes FAMILY"
    elif BUILTIN_FAMILIES.get(family.name) == module:
        fix = f"remove the entry {entry}: the built-in family {family.name!r} needs none"
    else:
        fix = f"write the entry as {family.name}={module}"
    raise SettingError(f"LAYOUTGEN_FAMILIES: {problem}; {fix}")


def families() -> list[Family]:
    return [get_family(name) for name in family_names()]


def bundled_families() -> list[Family]:
    """The families whose `spec_dir` makes up layoutgen's bundled specs: the built-in ones only, so that
    registering a family changes neither layoutgen's generated/ nor what `build --check` and `db` cover."""
    return [get_family(name) for name in sorted(BUILTIN_FAMILIES)]
