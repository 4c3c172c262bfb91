"""The DCP family's tuning workload: gate buffers and rotating timing inputs of one problem and batch bucket.

The gate draws fresh random inputs for every trial (special LSE values and a NaN payload behind an empty
shard included) and compares the candidate with `layoutgen.dcp.reference`: pack byte for byte over the
whole buffers (canary-filled, so a byte the layout does not own must stay untouched), combine within
`layoutgen.dcp.tolerances` against the float64 merge (unowned bytes hold NaN, so a combine that reads
them is caught).  A pack config is gated twice: as timed (lse in, no mask) and in the contract-v2 form the
spec serves (an empty mask with a masked row, and (max, sum) in for a max_sum spec), which is one more
compile of the same config; the tuning key, and so the database, is the same for both forms.  A combine of
a max_sum spec is gated with (max, sum) stats and their empty entries.  An fp8 spec's pack is gated on
inputs with an all-zero, a huge and a non-finite block too, its combine with random codes and block scales
(NaN codes and scales behind the empty entries).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from layoutgen.config import LaunchConfig
from layoutgen.dcp import reference
from layoutgen.dcp.layout import LayoutBuffers
from layoutgen.dcp.tolerances import combine_error
from layoutgen.runtime.tensors import needs_int64
from layoutgen.tuning.compile import CompileJob, integer_class
from layoutgen.tuning.objective import CANARY, NAN_BYTE, Target, Workload


class DcpWorkload(Workload):
    """One (target, batch bucket) of a DCP kernel on one device."""

    def __init__(self, target: Target, bucket: int, device: Any, l2_bytes: int) -> None:
        super().__init__(target, bucket, device, l2_bytes)
        self.batch = bucket
        self.N = target.problem.extent("N")
        self.H = self.N * target.problem.extent("Hl")
        self.D = target.problem.extent("D")
        self.dtype: torch.dtype = getattr(torch, target.problem.dtype)
        self._gate_buffers: dict[str, Any] | None = None
        self._timing_sets: list[dict[str, Any]] | None = None
        self._timing_result: torch.Tensor | None = None

    # -- shared pieces ---------------------------------------------------------------------------
    def _alloc(self) -> LayoutBuffers:
        return LayoutBuffers.allocate(self.problem.spec, self.N, self.capacity, self.H, self.D, self.dtype, self.device)

    def compile_job(self, config: LaunchConfig) -> CompileJob:
        shape = (("N", self.N), ("H", self.H), ("D", self.D), ("dtype", self.problem.dtype))
        sizes: tuple[tuple[str, Any], ...] = (("capacity", self.capacity), ("batch", self.batch))
        if self.problem.kernel == "pack":
            sizes = (*sizes, ("pack_forms", (self._v2_pack_form(),)))
        config_items = tuple(sorted(config.as_dict().items()))
        variant = (*shape, integer_class(self.capacity))
        return CompileJob(self.target.module_path, self.problem.kernel, (*shape, *sizes), config_items, variant)

    def _random_inputs(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.randn(self.batch, self.H, self.D, generator=generator, device=self.device).to(self.dtype)
        lse = torch.randn(self.batch, self.H, generator=generator, device=self.device) * 4
        return out, lse

    def _v2_pack_form(self) -> tuple[bool, bool]:
        """(masked, from max_sum) of the gate's second pack: an empty mask, and (max, sum) in for a max_sum spec."""
        return True, bool(self.problem.spec.max_sum)

    def _launcher(self, config: LaunchConfig, tensors: dict[str, Any]) -> Callable[[], None]:
        """One launch through the module's `_launch_*` function (looked up per call, so a test can swap it):
        the kernel and its grid exactly as the public API runs them, without the dispatch layer, whose
        host-side cost a CUDA graph does not see anyway.  Combine: natural-log LSEs, no merged LSE out."""
        module = self.target.module
        batch = self.batch
        if self.problem.kernel == "pack":
            out, lse, bufs = tensors["out"], tensors["lse"], tensors["bufs"]
            index_64 = needs_int64(out, lse, *bufs.tensors.values())
            extra = {key: tensors[key] for key in ("sums", "empty") if tensors.get(key) is not None}
            return lambda: module._launch_pack(out, lse, bufs, batch, config, index_64, **extra)
        bufs, result = tensors["bufs"], tensors["result"]
        index_64 = needs_int64(result, *bufs.tensors.values())
        return lambda: module._launch_combine(bufs, batch, result, None, False, config, index_64)

    # -- gate ------------------------------------------------------------------------------------
    def gate(self, config: LaunchConfig, seed: int) -> str | None:
        """Run `config` on fresh random inputs; None when it matches the reference, else what differs."""
        generator = torch.Generator(device=self.device).manual_seed(seed)
        if self.problem.kernel == "pack":
            return self._gate_pack(config, generator)
        return self._gate_combine(config, generator)

    def _gate_pack(self, config: LaunchConfig, generator: torch.Generator) -> str | None:
        if self._gate_buffers is None:
            self._gate_buffers = {"candidate": self._alloc(), "reference": self._alloc()}
        candidate, expected = self._gate_buffers["candidate"], self._gate_buffers["reference"]
        out, lse = self._random_inputs(generator)
        lse[0, 0] = float("-inf")
        lse[-1, -1] = float("inf")
        lse[self.batch // 2, self.H // 2] = float("nan")
        if self.problem.spec.fp8:
            # Blocks the quantisation treats apart: all zero (scale 1), huge (outside the fast path's range),
            # and non-finite elements (code 0x7F, the scale from the finite ones).
            out[0, 0] = 0.0
            huge = 1e32 if self.dtype != torch.float16 else 1.0  # float16 cannot leave the fast path's range
            out[-1, -1] = (out[-1, -1].float() * huge).to(self.dtype)
            out[self.batch // 2, 0, 0] = float("nan")
            out[self.batch // 2, -1, -1] = float("-inf")
        mismatch = self._compare_pack(config, candidate, expected, {"out": out, "lse": lse})
        if mismatch is not None:
            return mismatch
        # The contract-v2 form: the last row empty (NaN behind it: the pack must write zeros, not copy), and
        # (max, sum) in for a max_sum spec.
        masked, from_max_sum = self._v2_pack_form()
        empty = torch.zeros(self.batch, dtype=torch.bool, device=self.device)
        empty[-1] = masked
        out[-1] = float("nan")
        inputs: dict[str, Any] = {"out": out, "lse": lse, "empty": empty}
        if from_max_sum:
            total = 1 + 8 * torch.rand(lse.shape, generator=generator, device=self.device)
            total[0, -1] = 0.0
            inputs["sums"] = total
        return self._compare_pack(config, candidate, expected, inputs)

    def _compare_pack(
        self, config: LaunchConfig, candidate: LayoutBuffers, expected: LayoutBuffers, inputs: dict[str, Any]
    ) -> str | None:
        for bufs in (candidate, expected):
            for tensor in bufs.tensors.values():
                tensor.view(torch.uint8).fill_(CANARY)
        self._launcher(config, {**inputs, "bufs": candidate})()
        out, lse, sums, empty = inputs["out"], inputs["lse"], inputs.get("sums"), inputs.get("empty")
        if sums is None:
            reference.pack(out, lse, expected, empty=empty)
        else:
            reference.pack(out, None, expected, empty=empty, max_sum=(lse, sums))
        form = "" if empty is None else " (masked" + (", from (max, sum))" if sums is not None else ")")
        for name, tensor in candidate.tensors.items():
            got, want = tensor.reshape(-1).view(torch.uint8), expected.tensors[name].reshape(-1).view(torch.uint8)
            if not torch.equal(got, want):
                differing = (got != want).nonzero().flatten()
                return (
                    f"pack{form} wrote different bytes than the reference into {name!r}: {differing.numel()} of "
                    f"{got.numel()} bytes differ, first at byte {int(differing[0])}"
                )
        return None

    def _gate_combine(self, config: LaunchConfig, generator: torch.Generator) -> str | None:
        if self._gate_buffers is None:
            self._gate_buffers = {
                "received": self._alloc(),
                "result": torch.empty(self.batch, self.H // self.N, self.D, dtype=self.dtype, device=self.device),
            }
        received, result = self._gate_buffers["received"], self._gate_buffers["result"]
        for tensor in received.tensors.values():
            tensor.view(torch.uint8).fill_(NAN_BYTE)
        payload = received.payload_view(self.batch)
        payload.copy_(torch.randn(payload.shape, generator=generator, device=self.device))
        if self.problem.spec.fp8:  # codes of |x| < 4 (randn) and positive block scales
            scales = received.scale_view(self.batch)
            scales.copy_(torch.rand(scales.shape, generator=generator, device=self.device) + 0.01)
        stats = received.stats_views(self.batch)
        first = stats["max"] if "max" in stats else stats["lse"]
        first.copy_(torch.randn(first.shape, generator=generator, device=self.device) * 4)
        # Empty shards: one partial (garbage payload), a whole row, and the NaN / +inf LSEs that count as empty.
        first[0, 0, 0] = float("-inf")
        payload[0, 0, 0].fill_(float("nan"))
        first[:, -1, -1] = float("-inf")
        first[-1, self.batch // 2, 0] = float("nan")
        first[0, -1, 0] = float("inf")
        if "sum" in stats:
            # Sums of exponentials; a zero sum (with a finite max and a NaN payload) is an empty entry too.
            stats["sum"].copy_(1 + 8 * torch.rand(first.shape, generator=generator, device=self.device))
            stats["sum"][0, 0, 0] = 0.0
            stats["sum"][-1, 0, -1] = 0.0
            payload[-1, 0, -1].fill_(float("nan"))
        result.view(torch.uint8).fill_(NAN_BYTE)
        self._launcher(config, {"bufs": received, "result": result})()
        want, _ = reference.combine(received, self.batch, "e")
        taking_part = first.isfinite() & (stats["sum"] > 0) if "sum" in stats else first.isfinite()
        valid = taking_part.unsqueeze(-1).expand_as(payload)
        partials = reference.received_partials(received, self.batch)
        scale = float(partials.float().abs().where(valid, 0.0).max())
        ratio = combine_error(result, want, scale)
        if not ratio <= 1.0:
            return f"combine outside the tolerance of layoutgen.tolerances: {ratio:.3g}x the allowed error"
        return None

    # -- timing ----------------------------------------------------------------------------------
    def timing_launch(self, config: LaunchConfig) -> Callable[[int], None]:
        """Launch `config` on rotating set `index`."""
        if self._timing_sets is None:
            self._timing_sets = [self._timing_set(index) for index in range(self.sets)]
        launchers = [self._launcher(config, tensors) for tensors in self._timing_sets]
        return lambda index: launchers[index]()

    def _timing_set(self, index: int) -> dict[str, Any]:
        generator = torch.Generator(device=self.device).manual_seed(1000 + index)
        bufs = self._alloc()
        if self.problem.kernel == "pack":
            out, lse = self._random_inputs(generator)
            return {"out": out, "lse": lse, "bufs": bufs}
        payload = bufs.payload_view(self.batch)
        payload.copy_(torch.randn(payload.shape, generator=generator, device=self.device))
        if self.problem.spec.fp8:
            scales = bufs.scale_view(self.batch)
            scales.copy_(torch.rand(scales.shape, generator=generator, device=self.device) + 0.01)
        for name, words in bufs.stats_views(self.batch).items():
            values = torch.randn(words.shape, generator=generator, device=self.device)
            words.copy_(values * 4 if name != "sum" else 1 + values.abs())
        if self._timing_result is None:  # one output for every set (the combine kernel's declared timing)
            shape = (self.batch, self.H // self.N, self.D)
            self._timing_result = torch.empty(shape, dtype=self.dtype, device=self.device)
        return {"bufs": bufs, "result": self._timing_result}
