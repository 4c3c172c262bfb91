"""What every family's distributed helper does at construction: join the process group, and make sure every
rank was built with the same arguments (one all_gather), and find the generated module it was given."""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import torch


def fingerprint(text: str) -> int:
    """A 60-bit integer of `text` (a spec's layout hash, a dtype's name) that an int64 all_gather carries."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:15], 16)


def generated_module(spec: Any, family: str, required: tuple[str, ...], helper: str) -> ModuleType:
    """The generated module of a family's spec given as a module, a bundled name or a generated .py path."""
    if isinstance(spec, ModuleType):
        missing = [name for name in ("SPEC", *required) if not hasattr(spec, name)]
        if missing or getattr(getattr(spec, "SPEC", None), "family", None) != family:
            raise TypeError(
                f"spec module {spec.__name__} is not a layoutgen generated module of the {family} family"
                + (f" (it lacks {', '.join(missing)})" if missing else "")
            )
        return spec
    if isinstance(spec, str | Path):
        from layoutgen.loader import load

        module = load(spec)
        if module.SPEC.family != family:
            raise ValueError(f"spec {str(spec)!r} is of the {module.SPEC.family} family; {helper} takes {family} specs")
        return module
    raise TypeError(
        "spec must be a bundled spec name, a generated module (layoutgen.load) or a path to a generated .py; "
        f"got {type(spec).__name__}"
    )


def check_group(group: Any, helper: str, action: str, member_fix: str) -> None:
    """Refuse a `group` this process cannot use: not a ProcessGroup (nor None, the default group), no process
    group initialised, or a group this rank is not a member of.  `action` completes "call init_process_group
    before ..."; `member_fix` tells a non-member what to do."""
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError(f"{helper} needs torch.distributed, which this build of torch does not include")
    # new_group() hands a process outside the group GroupMember.NON_GROUP_MEMBER (an int), not a ProcessGroup.
    non_member = group is dist.GroupMember.NON_GROUP_MEMBER
    if not (group is None or non_member or isinstance(group, dist.ProcessGroup)):
        raise TypeError(
            f"group must be a torch.distributed ProcessGroup (e.g. from torch.distributed.new_group) or None for "
            f"the default group; {helper} got {type(group).__name__} {group!r:.80}"
        )
    if not dist.is_initialized():
        raise RuntimeError(
            f"torch.distributed is not initialised: call torch.distributed.init_process_group (nccl on GPUs, "
            f"gloo on CPU) before {action}"
        )
    if non_member or dist.get_rank(group) < 0:
        raise ValueError(
            f"this process (global rank {dist.get_rank()}) is not a member of the group passed to {helper}; "
            + member_fix
        )


def join_group(group: Any, device: torch.device, helper: str, group_kind: str) -> tuple[int, int]:
    """(rank, world size) of this process in `group`, refusing what cannot work: no process group, a group
    this rank is not in, NCCL with a non-CUDA device."""
    import torch.distributed as dist

    check_group(group, helper, f"building a {helper}", f"pass the {group_kind} group this rank belongs to")
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    backend = str(dist.get_backend(group))  # "gloo", "nccl", or per device type: "cpu:gloo,cuda:nccl"
    if world_size > 1 and device.type != "cuda" and "nccl" in backend and "gloo" not in backend:
        raise ValueError(
            f"the group uses NCCL, which moves CUDA tensors only, but device is {device}; "
            "use a CUDA device or a gloo group"
        )
    return rank, world_size


# Construction-time agreement ---------------------------------------------------------------------------------
#
# Every rank of a group of several takes part in one all_gather of its construction arguments, also a rank
# whose arguments its own checks refused: otherwise its peers would wait in the collective until the group's
# timeout (30 min by default) or fail with the transport's "connection closed".  A row holds a refused flag,
# then a (kind, value) pair per field: a refused rank reads its fields from the raw arguments as far as it can.

_UNREADABLE, _INT, _FINGERPRINT = 0, 1, 2
_INT64 = range(-(2**63), 2**63)


def _encode(value: Any) -> tuple[int, int]:
    """A field as (kind, int64): ints as themselves, strings and dtypes as their fingerprint, anything else
    (an argument the checks refused, a spec that did not load) as unreadable."""
    if isinstance(value, int) and not isinstance(value, bool) and value in _INT64:
        return _INT, value
    if isinstance(value, str | torch.dtype):
        return _FINGERPRINT, fingerprint(str(value))
    return _UNREADABLE, 0


def _agreement_device(group: Any, device: Any) -> torch.device:
    """The same kind of device on every rank, whatever device each rank passed (a refused one included): the
    CPU, unless the group's only backend is NCCL (it moves CUDA tensors only)."""
    import torch.distributed as dist

    backend = str(dist.get_backend(group))  # "gloo", "nccl", or per device type: "cpu:gloo,cuda:nccl"
    if "nccl" not in backend or "gloo" in backend or not torch.cuda.is_available():
        return torch.device("cpu")
    try:
        chosen = torch.device(device)
    except (RuntimeError, TypeError):
        chosen = torch.device("cpu")  # a refused device: this process's current GPU below
    return chosen if chosen.type == "cuda" else torch.device("cuda", torch.cuda.current_device())


def _gather_rows(fields: Mapping[str, Any], refused: bool, group: Any, device: Any) -> list[list[int]]:
    import torch.distributed as dist

    row = [int(refused)] + [number for value in fields.values() for number in _encode(value)]
    mine = torch.tensor(row, dtype=torch.int64, device=_agreement_device(group, device))
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    return [tensor.tolist() for tensor in gathered]


def _differences(fields: Mapping[str, Any], mine: list[int], theirs: list[int], peer: int, rank: int) -> list[str]:
    """The fields two rows differ in, with both values where they are numbers (an unreadable field is not
    compared: the rank that could not read it says why in its own error)."""
    found = []
    for index, name in enumerate(fields):
        kind, value = mine[1 + 2 * index], mine[2 + 2 * index]
        their_kind, their_value = theirs[1 + 2 * index], theirs[2 + 2 * index]
        if _UNREADABLE in (kind, their_kind) or (kind, value) == (their_kind, their_value):
            continue
        shown = kind == their_kind == _INT
        found.append(f"{name} ({their_value} on rank {peer}, {value} on rank {rank})" if shown else name)
    return found


def check_ranks_agree(fields: Mapping[str, Any], group: Any, device: torch.device, helper: str) -> None:
    """One all_gather: every rank of `group` must have been built with the same `fields` (a rank built with
    other arguments would otherwise hang or exchange garbage on the first call), and none may have refused its
    arguments (see `tell_peers_of_refusal`)."""
    import torch.distributed as dist

    rows = _gather_rows(fields, False, group, device)
    rank = dist.get_rank(group)
    names = ", ".join(name.split(" (")[0] for name in fields)
    refused = [peer for peer, row in enumerate(rows) if row[0]]
    if refused:
        differing = _differences(fields, rows[rank], rows[refused[0]], refused[0], rank)
        raise ValueError(
            f"{helper} was not built: rank{'s' if len(refused) > 1 else ''} {', '.join(map(str, refused))} of the "
            f"group refused {'their' if len(refused) > 1 else 'its'} arguments (the error raised there says why)"
            + (f"; rank {refused[0]} also differs from this rank on {', '.join(differing)}" if differing else "")
            + f". Every rank must pass the same valid {names}"
        )
    for peer, theirs in enumerate(rows):
        differing = _differences(fields, rows[rank], theirs, peer, rank)
        if differing:
            raise ValueError(
                f"{helper} arguments differ between ranks: rank {peer} of the group disagrees with rank {rank} "
                f"on {', '.join(differing)}; every rank must pass the same {names}"
            )


def tell_peers_of_refusal(fields: Mapping[str, Any], group: Any, device: Any, helper: str) -> None:
    """This rank's checks refused its arguments, and the caller raises that error next: if this process is a
    member of an initialised `group` of several ranks, take part in the agreement all_gather marked refused, so
    that its peers raise (naming this rank) instead of waiting there."""
    import torch.distributed as dist

    try:
        check_group(group, helper, "", "")  # its messages are not shown: the caller raises its refusal
        if dist.get_world_size(group) < 2:
            return
    except (RuntimeError, TypeError, ValueError):
        return  # no collective this rank could take part in: its peers do not wait on it in this group
    try:
        _gather_rows(fields, True, group, device)
    except Exception as failure:  # the caller raises its refusal, which matters more: this is told beside it
        warnings.warn(
            f"{helper} could not tell the group's other ranks that this rank refused its arguments (they may wait "
            f"in the agreement all_gather until the group's timeout): {type(failure).__name__}: {failure}",
            RuntimeWarning,
            stacklevel=3,
        )
