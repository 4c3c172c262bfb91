"""What `layoutgen db show/check/prune` say of one tuning entry: current, stale (and why), invalid, or not a
bundled spec's.

An entry is judged as dispatch would judge it: one whose key dispatch can never look up (a family that is
not its spec's, a kernel, dtype or extents the family does not have, or in another order) is invalid; one
measured against other code or software is stale; one whose config its kernel refuses for its shape
(`layoutgen.runtime.configs.entry_config`, what dispatch runs) is invalid.  An entry of a spec that is not
bundled is checked as far as its family allows: dispatch of a module built from that spec reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from layoutgen.family import Family
    from layoutgen.tuning_db import Expected, TuningEntry, TuningKey

#: Why an entry can be stale that no machine changes: what `prune` removes (the software versions are the
#: machine's, so an entry tuned with another torch stays for the machines that run it).
CONTENT_REASONS = ("spec", "kernel source", "search space", "timing procedure")
INVALID = "invalid"
NOT_BUNDLED = "not bundled"


@dataclass(frozen=True)
class BundledSpec:
    """A bundled spec and what a current entry of each of its kernels must record."""

    spec: Any
    expected: Mapping[str, Expected]


def bundled() -> dict[str, BundledSpec]:
    """Every bundled spec by name, its expectations computed as `layoutgen build` renders the kernels."""
    from layoutgen.codegen import source_hashes
    from layoutgen.family import get_family
    from layoutgen.spec import bundled_specs
    from layoutgen.tuning.procedure import space_hash, timing_hash
    from layoutgen.tuning_db import Expected, entry_versions

    versions = entry_versions()
    found = {}
    for name, spec in bundled_specs().items():
        family = get_family(spec.family)
        expected = {}
        for kernel, source in source_hashes(spec).items():
            decl = family.kernel(kernel)
            expected[kernel] = Expected(spec.layout_hash(), source, space_hash(decl), timing_hash(decl), versions)
        found[name] = BundledSpec(spec, expected)
    return found


def _key_problem(key: TuningKey, family: Family) -> str | None:
    """Why dispatch can never look `key` up in `family` (it asks for the family's kernel, dtype and key extents
    in their order), or None."""
    kernels = [kernel.name for kernel in family.kernels]
    if key.kernel not in kernels:
        return f"family {family.name!r} has no kernel {key.kernel!r} (its kernels: {', '.join(kernels)})"
    if key.dtype not in family.dtypes:
        return f"family {family.name!r} takes no dtype {key.dtype!r} (its dtypes: {', '.join(family.dtypes)})"
    names = tuple(name for name, _ in key.extents)
    if names != family.key_extents:
        return f"its extents {', '.join(names)} are not the {family.name} key's {', '.join(family.key_extents)}"
    if key.bucket_name != family.bucket.name:
        return f"its size is {key.bucket_name}, not the {family.name} key's {family.bucket.name}"
    return None


def entry_state(entry: TuningEntry, specs: Mapping[str, BundledSpec]) -> tuple[str, str]:
    """(state, why): "current", "stale <reason>", "invalid" or "not bundled", and why unless current."""
    from layoutgen.family import get_family
    from layoutgen.runtime.configs import entry_config
    from layoutgen.tuning_db import current_problems

    key = entry.key
    known = specs.get(key.spec)
    if known is not None and known.spec.family != key.family:
        return INVALID, f"spec '{key.spec}' is a {known.spec.family} spec, not {key.family}; dispatch never looks it up"
    try:
        family = get_family(key.family)
    except ValueError:  # a family registered elsewhere
        return NOT_BUNDLED, f"not a bundled spec, of a family ({key.family}) not registered here: it cannot be checked"
    problem = _key_problem(key, family)
    if problem is None and known is not None and key.kernel not in known.expected:
        problem = f"spec '{key.spec}' renders no kernel {key.kernel!r}"
    if problem is not None:
        return INVALID, f"{problem}; dispatch never looks it up"
    # Tuned for another spec or kernel, its config is no longer judged by the spec's rules; tuned with another
    # triton or torch, it is current on a machine that runs those, so its config is judged first.
    problems = [] if known is None else current_problems(entry, known.expected[key.kernel])
    content = [problem for problem in problems if problem[0] in CONTENT_REASONS]
    if content:
        return f"stale {content[0][0]}", content[0][1]
    try:
        entry_config(entry, family.kernel(key.kernel), None if known is None else known.spec)
    except (TypeError, ValueError) as error:
        return INVALID, f"{error}; dispatch warns and runs the default"
    if known is None:
        return NOT_BUNDLED, (
            "not a bundled spec: whether it is current cannot be checked here (dispatch of a module built from "
            "the spec reads it)"
        )
    if problems:
        return f"stale {problems[0][0]}", problems[0][1]
    return "current", ""


def prunable(entry: TuningEntry, specs: Mapping[str, BundledSpec]) -> bool:
    """Whether `prune` removes `entry`: a bundled spec's, of its family and kernel, that can never be current
    again on any machine.  Anything else stays, an entry of a spec built from a file included."""
    from layoutgen.tuning_db import current_problems

    known = specs.get(entry.key.spec)
    if known is None or known.spec.family != entry.key.family or entry.key.kernel not in known.expected:
        return False
    reasons = {reason for reason, _ in current_problems(entry, known.expected[entry.key.kernel])}
    return bool(reasons & set(CONTENT_REASONS))


def spec_names(values: list[str]) -> set[str]:
    """`db show --spec` values as the spec names entries record: a name as it is (bundled or not: the database
    holds entries of specs built from any YAML), a spec YAML or a generated module by the spec it holds, as
    `build` and `tune` take them."""
    import re
    from pathlib import Path

    from layoutgen.cli.common import bad_input
    from layoutgen.files import generated_by_layoutgen, regular_file_problem
    from layoutgen.spec import NAME_PATTERN, load_spec

    names = set()
    for text in values:
        path = Path(text)
        if re.fullmatch(NAME_PATTERN, text) and not path.is_file():
            names.add(text)
            continue
        problem = regular_file_problem(path)
        fix = "pass a spec name, a spec .yaml or a module `layoutgen build` generated"
        if problem is not None:
            raise bad_input(f"--spec {text}: not a spec name (lower-case letters, digits, _) and {problem}; {fix}")
        if path.suffix in (".yaml", ".yml"):
            names.add(load_spec(path).name)  # a SpecError is the usual report (exit 2)
        elif path.suffix == ".py" and generated_by_layoutgen(path):
            names.add(_generated_spec_name(path))
        else:
            raise bad_input(f"--spec {text}: not a spec .yaml or a generated .py module; {fix}")
    return names


def _generated_spec_name(path: Any) -> str:
    from layoutgen.cli.common import bad_input
    from layoutgen.loader import load_path

    try:
        return str(load_path(path).SPEC.name)
    except Exception as error:  # whatever importing the module raises: the file is what the user passed
        raise bad_input(
            f"--spec {path}: the generated module does not load ({type(error).__name__}: {error})"
        ) from None
