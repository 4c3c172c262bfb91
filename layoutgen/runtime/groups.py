"""What every family's distributed helper does at construction: join the process group, and make sure every
rank was built with the same arguments (one all_gather), and find the generated module it was given."""

from __future__ import annotations

import hashlib
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


def join_group(group: Any, device: torch.device, helper: str, group_kind: str) -> tuple[int, int]:
    """(rank, world size) of this process in `group`, refusing what cannot work: no process group, a group
    this rank is not in, NCCL with a non-CUDA device."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialised: call torch.distributed.init_process_group "
            f"(nccl on GPUs, gloo on CPU) before building a {helper}"
        )
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(
            f"this process (global rank {dist.get_rank()}) is not a member of the group passed to {helper}; "
            f"pass the {group_kind} group this rank belongs to"
        )
    world_size = dist.get_world_size(group)
    backend = str(dist.get_backend(group))  # "gloo", "nccl", or per device type: "cpu:gloo,cuda:nccl"
    if world_size > 1 and device.type != "cuda" and "nccl" in backend and "gloo" not in backend:
        raise ValueError(
            f"the group uses NCCL, which moves CUDA tensors only, but device is {device}; "
            "use a CUDA device or a gloo group"
        )
    return rank, world_size


def check_ranks_agree(fields: Mapping[str, int], group: Any, device: torch.device, helper: str) -> None:
    """One all_gather: every rank of `group` must have been built with the same `fields` (a rank built with
    other arguments would otherwise hang or exchange garbage on the first call)."""
    import torch.distributed as dist

    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    backend = str(dist.get_backend(group))
    where = device if device.type == "cuda" and "nccl" in backend else torch.device("cpu")
    mine = torch.tensor(list(fields.values()), dtype=torch.int64, device=where)
    gathered = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(gathered, mine, group=group)
    for peer, theirs in enumerate(gathered):
        differing = [name for name, a, b in zip(fields, mine.tolist(), theirs.tolist(), strict=True) if a != b]
        if differing:
            names = [name.split(" (")[0] for name in fields]
            raise ValueError(
                f"{helper} arguments differ between ranks: rank {peer} of the group disagrees with rank {rank} "
                f"on {', '.join(differing)}; every rank must pass the same {', '.join(names)}"
            )
