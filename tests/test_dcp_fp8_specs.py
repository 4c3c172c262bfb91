"""The fp8 spec fields (issue 22): `payload.dtype: float8_e4m3fn | float8_e5m2`, `payload.scale_block`,
`payload.scale_axes`; every rule a validator naming the field and the fix; the hashes of the specs written
before them unchanged; `show` draws the scales."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import make_spec

from layoutgen.dcp.layout import LayoutBuffers, buffer_shapes, row_length, scale_blocks
from layoutgen.dcp.spec import SCALE_AXES
from layoutgen.spec import SpecError, bundled_specs

BASE: dict[str, Any] = {
    "name": "fp8_spec",
    "transport": "all_to_all_single",
    "payload": {"axes": ["peer", "batch", "head", "dim"], "dtype": "float8_e4m3fn"},
    "stats": {"placement": "row_tail"},
}
SEPARATE = {"placement": "separate", "axes": ["peer", "batch", "head", "slot"]}


def spec_with(**changes: Any) -> Any:
    data = {**BASE, **changes}
    return make_spec(**data)


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        (
            {"payload": {**BASE["payload"], "dtype": "input", "scale_block": 32}},
            "payload.scale_block",
            "only for an fp8",
        ),
        ({"payload": {**BASE["payload"], "scale_block": 24}}, "payload.scale_block", "power of two from 16 to 65536"),
        ({"payload": {**BASE["payload"], "scale_block": 8}}, "payload.scale_block", "power of two from 16 to 65536"),
        ({"payload": {**BASE["payload"], "scale_block": 2**70}}, "payload.scale_block", "quantised by one program"),
        (
            {"payload": {**BASE["payload"], "scale_axes": ["peer", "batch", "head", "block"]}},
            "payload.scale_axes",
            "only for placement: separate",
        ),
        (
            {"payload": {**BASE["payload"], "axes": ["peer", "batch", "dim", "head"]}},
            "payload.axes",
            "needs `dim` innermost",
        ),
        (
            {"payload": {**BASE["payload"], "scale_axes": ["batch", "peer", "head", "block"]}, "stats": SEPARATE},
            "payload.scale_axes",
            "needs `peer` outermost",
        ),
        (
            {"payload": {**BASE["payload"], "scale_axes": ["peer", "batch", "head"]}, "stats": SEPARATE},
            "payload.scale_axes",
            "permutation",
        ),
        ({"payload": {**BASE["payload"], "dtype": "float8_e4m3"}}, "payload.dtype", ""),
    ],
)
def test_fp8_fields_are_validated(changes: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(SpecError) as raised:
        spec_with(**changes)
    text = str(raised.value)
    assert field in text and message in text, text


def test_fp8_layouts() -> None:
    tail = spec_with(payload={**BASE["payload"], "scale_block": 32}, align_bytes=16)
    assert tail.fp8 and tail.fp8_max == 448.0 and tail.scale_block_of(128) == 32 and scale_blocks(tail, 128) == 4
    # a row: 128 codes, the LSE word, 4 scales = 148 bytes, rounded up to 16
    assert row_length(tail, 128, 1) == 160
    shapes = buffer_shapes(tail, LayoutBuffers.allocate(tail, 2, 3, 4, 128, torch.bfloat16).shape)
    assert shapes == {"payload": (("peer", "batch", "head", "dim"), (2, 3, 2, 160), torch.float8_e4m3fn)}
    separate = spec_with(payload={**BASE["payload"], "dtype": "float8_e5m2"}, stats=SEPARATE)
    assert separate.payload.scale_axes == SCALE_AXES and separate.fp8_max == 57344.0
    bufs = LayoutBuffers.allocate(separate, 2, 3, 4, 24, torch.float16)
    assert {name: (tuple(t.shape), t.dtype) for name, t in bufs.tensors.items()} == {
        "payload": ((2, 3, 2, 24), torch.float8_e5m2),
        "stats": ((2, 3, 2, 1), torch.float32),
        "scales": ((2, 3, 2, 1), torch.float32),
    }
    assert bufs.scale_view(2).shape == (2, 2, 2, 1)
    with pytest.raises(ValueError, match="has no scales"):
        LayoutBuffers.allocate(bundled_specs()["vllm_a2a"], 2, 3, 4, 24, torch.float16).scale_view(2)


def test_fp8_fields_leave_the_older_specs_hashes_alone() -> None:
    """The hashes the committed tuning database and generated modules were made with (before fp8)."""
    known = {
        "flashinfer_mnnvl": "07bc0d08768e",
        "pynccl_a2a": "8a63ca2cc9e3",
        "pynccl_a2a_aligned": "10cc1ab13cc8",
        "trtllm_helix_native_v1": "6cf9426a0198",
        "trtllm_helix_nccl": "87f3b7ba501c",
        "vllm_a2a": "26cd21f2faae",
    }
    specs = bundled_specs()
    assert {name: specs[name].layout_hash()[:12] for name in known} == known


def test_the_bundled_fp8_specs() -> None:
    specs = bundled_specs()
    pynccl, vllm = specs["pynccl_a2a_fp8"], specs["vllm_a2a_fp8"]
    assert pynccl.fp8 and pynccl.row_tail and pynccl.payload.axes == specs["pynccl_a2a"].payload.axes
    assert vllm.fp8 and not vllm.row_tail and vllm.stats.axes == specs["vllm_a2a"].stats.axes
    assert vllm.payload.scale_axes == ("peer", "batch", "head", "block")


def test_show_draws_the_scales() -> None:
    from layoutgen.show import byte_map
    from layoutgen.show.facts import facts

    for name in ("pynccl_a2a_fp8", "vllm_a2a_fp8"):
        bmap = byte_map(bundled_specs()[name], {"N": 2, "B": 2, "H": 4, "D": 32, "E": 1}, "bfloat16")
        scales = [run for run in bmap.runs if run.kind == "scale"]
        assert sum(run.length for run in scales) == 2 * 2 * 2 * 4  # N x B x heads per peer x 4 bytes
        text = bmap.layout.summary(bmap, facts(bmap))
        assert "one float32 scale per block of 32 elements" in text and "zero codes with scale 1" in text
        labels = [bmap.layout.label(run) for run in scales]
        assert labels[0] in ("p0 b0 h0 scale", "p0 b0 h0 k0 scale") and any(
            label.endswith("scale 1") or "(1 from b1)" in label for label in labels
        )
