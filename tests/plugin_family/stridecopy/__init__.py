"""stridecopy: copy `src [R, C]` into `dst`, dense in the spec's `order` ([row, col] or [col, row])."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, Literal

import torch
from pydantic import field_validator

from layoutgen.config import LaunchConfig, next_pow2
from layoutgen.family import Check, Family, GridAxis, KernelDecl, SearchSpace, SpaceExtents, VerifyReport
from layoutgen.spec import SpecBase
from layoutgen.tuning.compile import CompileJob
from layoutgen.tuning.objective import CANARY, Target, Workload


class CopySpec(SpecBase):
    family: Literal["stridecopy"] = "stridecopy"
    order: tuple[str, ...]

    @field_validator("order")
    @classmethod
    def _a_permutation(cls, order: tuple[str, ...]) -> tuple[str, ...]:
        if sorted(order) != ["col", "row"]:
            raise ValueError(f"must be [row, col] or [col, row], got {list(order)}")
        return order


@dataclass(frozen=True)
class CopyConfig(LaunchConfig):
    kernel: ClassVar[str] = "copy"
    block_row: int
    block_col: int
    num_warps: int = 1
    num_stages: int = 1


COPY = KernelDecl(
    name="copy",
    template="copy.py.jinja",
    config_type=CopyConfig,
    space=SearchSpace(blocks=(("block_row", "row"), ("block_col", "col")), num_warps=(1, 2), min_tile_bytes=16),
    timing={"outputs": "one destination per rotating set"},
    summary="copy src [R, C] into dst in the spec's order",
)


def reference(src: torch.Tensor, order: tuple[str, ...]) -> torch.Tensor:
    return src.clone() if order == ("row", "col") else src.t().contiguous()


class CopyWorkload(Workload):
    def __init__(self, target: Target, bucket: int, device: Any, l2_bytes: int) -> None:
        super().__init__(target, bucket, device, l2_bytes)
        self.rows, self.cols = bucket, target.problem.extent("C")

    def _tensors(self, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        src = torch.randn(self.rows, self.cols, generator=generator)
        shape = (self.rows, self.cols) if self.problem.spec.order == ("row", "col") else (self.cols, self.rows)
        return src, torch.empty(shape).view(torch.uint8).fill_(CANARY).view(torch.float32)

    def compile_job(self, config: LaunchConfig) -> CompileJob:
        args = (("rows", self.rows), ("cols", self.cols))
        return CompileJob(self.target.module_path, "copy", args, tuple(sorted(config.as_dict().items())), args)

    def gate(self, config: LaunchConfig, seed: int) -> str | None:
        src, dst = self._tensors(seed)
        self.target.module._launch_copy(src, dst, config)
        same = torch.equal(dst.view(torch.uint8), reference(src, self.problem.spec.order).view(torch.uint8))
        return None if same else "copy differs from the reference"

    def timing_launch(self, config: LaunchConfig) -> Callable[[int], None]:
        sets = [self._tensors(index) for index in range(self.sets)]
        return lambda index: self.target.module._launch_copy(*sets[index], config)


class StrideCopy(Family):
    name = "stridecopy"
    summary = "a strided copy (the test family)"
    spec_model = CopySpec
    kernels = (COPY,)
    key_extents = ("C",)
    grid_axes = (GridAxis("C", (64,), (5,), "columns"),)
    bucket = GridAxis("R", (64,), (3,), "rows")
    dtypes = ("float32",)
    default_dtypes = ("float32",)
    show_shape: ClassVar[Mapping[str, int]] = {"R": 2, "C": 3}

    def render_context(self, spec: Any) -> dict[str, Any]:
        return {"transposed": spec.order == ("col", "row")}

    def verify(self, module: ModuleType, device: str) -> VerifyReport:
        # Faults on demand for tests/test_build_verification.py: a spec named crash_* dies as a kernel writing far
        # outside its buffers can make the interpreter die; one named raise_* raises.
        if module.SPEC.name.startswith("crash_"):
            os.kill(os.getpid(), signal.SIGSEGV)
        if module.SPEC.name.startswith("raise_"):
            raise RuntimeError("the family's verify broke")
        src = torch.randn(3, 5, device=device)
        got = module.copy(src)
        passed = torch.equal(got.view(torch.uint8), reference(src, module.SPEC.order).view(torch.uint8))
        return VerifyReport(module.SPEC.name, self.name, (Check("copy", passed, "bytes identical"),), ())

    def key_shapes(self, spec: Any, kernel: str, point: Mapping[str, int], dtype: str) -> dict[str, int] | None:
        return {"C": point["C"]}

    def workload(self, target: Any, bucket: int, device: Any, l2_bytes: int) -> Any:
        return CopyWorkload(target, bucket, device, l2_bytes)

    def default_config(self, problem: Any, bucket: int) -> Any:
        return CopyConfig(block_row=min(next_pow2(bucket), 16), block_col=min(next_pow2(problem.extent("C")), 16))

    def bytes_moved(self, problem: Any, bucket: int) -> int:
        return 2 * 4 * bucket * problem.extent("C")

    def space_extents(self, problem: Any, bucket: int) -> SpaceExtents:
        return SpaceExtents({"row": bucket, "col": problem.extent("C")}, problem.spec.order[-1], 4)

    def compile_variant(self, module: ModuleType, job: Mapping[str, Any], kernel_proxy: Any) -> None:
        src = torch.empty(job["rows"], job["cols"], device="meta")
        module._launch_copy(src, torch.empty_like(src), CopyConfig.from_dict(job["config"]), kernel=kernel_proxy)

    def offline_jobs(self, spec: Any) -> list[tuple[str, dict[str, Any]]]:
        # 32-bit offsets only: this copy has no 64-bit path.
        return [
            (
                "32-bit",
                {"kernel": "copy", "config": CopyConfig(block_row=4, block_col=8).as_dict(), "rows": 5, "cols": 7},
            )
        ]

    def byte_layout(self, spec: Any, shape: Mapping[str, int], dtype: str) -> Any:
        from layoutgen.show.model import Buffer, ByteLayout, Kind, Legend, Look, Placement, axes_label

        rows, cols = shape["R"], shape["C"]
        axes = spec.order
        dst = torch.empty((rows, cols) if axes == ("row", "col") else (cols, rows))
        view = dst if axes == ("row", "col") else dst.t()
        letters = {"row": "r", "col": "c"}
        return ByteLayout(
            name=spec.name,
            shape_text=f"R={rows}, C={cols}, float32",
            buffers=(Buffer("dst", dst, axes),),
            placements=(Placement("element", view, ("row", "col")),),
            kinds=(Kind("element", Look.COLOURED, store_fact=True),),
            axis_letters=letters,
            colour_axis="row",
            label=lambda run: " ".join(axes_label(run, ("row", "col"), letters)),
            legend=Legend("rows", (), "r row, c column"),
            summary=lambda bmap, found: f"{rows * cols} elements, order {'/'.join(axes)}.",
            elements_phrase=lambda counts: f"{counts['element']} elements",
            json_header={"spec": spec.name},
            shape_json={"R": rows, "C": cols},
        )


FAMILY = StrideCopy()
