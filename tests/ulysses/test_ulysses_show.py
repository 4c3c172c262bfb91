"""`layoutgen show` / `diff` for Ulysses specs: every byte of both wires is one tensor's element, the map's
claims agree with the bytes the naive torch path writes, labels name the tensor and its indices, and bad
drawing shapes are clear errors."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from typer.testing import CliRunner
from ulysses_cases import BUNDLED, spec_data

from layoutgen.cli import app
from layoutgen.cli.common import expand_arguments
from layoutgen.show import ByteMap, byte_map, diff_layouts, render_text, renderable
from layoutgen.spec import bundled_specs, parse_spec
from layoutgen.ulysses import reference
from layoutgen.ulysses.layout import Shape, tensor_block, tensor_shape
from layoutgen.ulysses.show import PREFIX, drawing_shape
from layoutgen.ulysses.spec import UlyssesSpec

#: A drawing shape whose per-peer extents all differ (N 2, S_local 3, H/N 5, H_kv/N 4, D 7, B 6), so that a map
#: naming one axis's index for another's fails.
CHECK_SHAPE = {"N": 2, "S_local": 3, "H": 10, "H_kv": 8, "D": 7, "B": 6}
#: Wire coordinates of one element: (kind, {axis: index}) with axes peer, batch, seq, head, dim and, in a shared
#: wire, tensor (the element's place in the concatenation of every tensor's block).
Coordinates = tuple[str, dict[str, int]]


@pytest.mark.parametrize("name", BUNDLED)
def test_every_byte_of_both_wires_is_one_element(name: str) -> None:
    spec = bundled_specs()[name]
    bmap = byte_map(spec, {"N": 2, "S_local": 3, "H": 4, "H_kv": 2, "D": 4}, "bfloat16")
    assert sum(run.length for run in bmap.runs) == sum(info.nbytes for info in bmap.buffers)
    kinds = {run.kind for run in bmap.runs}
    assert kinds == {f"before.{t.name}" for t in spec.to_attention.tensors} | {
        f"after.{t.name}" for t in spec.from_attention.tensors
    }


def naive_wires(spec: UlyssesSpec, shape: Shape) -> tuple[dict[str, torch.Tensor], Callable[[int], Coordinates]]:
    """Both directions' send buffers as the naive torch path writes them (reshape, permute, `.contiguous()`,
    `torch.cat`; not the wire views the map is drawn from), keyed as the map names them, from tensors whose
    float32 elements are distinct integer codes; and the decoder from a code to its element's wire
    coordinates (peer p gets head block p before attention, row block p after it)."""
    wires: dict[str, torch.Tensor] = {}
    owners: list[tuple[int, int, str, str, tuple[str, ...], tuple[int, ...]]] = []  # (first code, count, ...)
    next_code = 1
    for direction, side, naive in (
        ("to_attention", "local", reference.naive_scatter),
        ("from_attention", "attention", reference.naive_scatter_out),
    ):
        axes = spec.local if side == "local" else spec.attention
        tensors = {}
        for tensor in spec.direction(direction).tensors:
            extents = tensor_shape(spec, shape, tensor, side)
            count = math.prod(extents)
            tensors[tensor.name] = torch.arange(next_code, next_code + count, dtype=torch.float32).reshape(extents)
            owners.append((next_code, count, f"{PREFIX[direction]}.{tensor.name}", direction, axes, extents))
            next_code += count
        for buffer, values in naive(spec, shape, tensors).items():
            wires[f"{PREFIX[direction]}.{buffer}"] = values

    blocks = {}  # kind -> (first index along a shared wire's `tensor` axis, the block's axes and extents)
    for direction_name in ("to_attention", "from_attention"):
        direction = spec.direction(direction_name)
        if direction.shared:
            start = 0
            for tensor in direction.tensors:
                inner, extents = tensor_block(direction, shape, tensor)
                blocks[f"{PREFIX[direction_name]}.{tensor.name}"] = (start, inner, extents)
                start += math.prod(extents)

    def decode(code: int) -> Coordinates:
        first, _, kind, direction, axes, extents = next(o for o in owners if o[0] <= code < o[0] + o[1])
        where = {axis: int(index) for axis, index in zip(axes, np.unravel_index(code - first, extents), strict=True)}
        if direction == "to_attention":
            per_peer = extents[axes.index("head")] // shape.N
            where["peer"], where["head"] = divmod(where["head"], per_peer)
        else:
            where["peer"], where["seq"] = divmod(where["seq"], shape.S_local)
        if kind in blocks:
            start, inner, inner_extents = blocks[kind]
            where["tensor"] = start + int(np.ravel_multi_index([where[axis] for axis in inner], inner_extents))
        return kind, where

    return wires, decode


def check_map_against_naive_path(bmap: ByteMap, spec: UlyssesSpec, shape: Shape) -> None:
    """Every run's bytes hold elements of the tensor its kind names, at the indices its ranges claim along
    every element axis its buffer has, in memory order along the innermost; every element once."""
    wires, decode = naive_wires(spec, shape)
    seen: set[tuple[str, tuple[tuple[str, int], ...]]] = set()
    for run in bmap.runs:
        codes = wires[run.buffer].reshape(-1)[run.offset // 4 : (run.offset + run.length) // 4].tolist()
        assert run.length % 4 == 0 and len(codes) == run.length // 4, f"{run} runs past its buffer's end"
        innermost = bmap.buffer(run.buffer).axes[-1]
        for position, code in enumerate(codes):
            assert code == int(code) and code > 0, f"{run}: byte {position * 4} holds no element"
            kind, where = decode(int(code))
            assert kind == run.kind, f"{run}: element {position} belongs to {kind}"
            for axis, (start, stop) in run.ranges.items():
                assert axis in where, f"{run}: the check knows no axis {axis!r}"
                assert start <= where[axis] < stop, f"{run}: element {position} has {axis} {where[axis]}"
                if axis == innermost:
                    assert where[axis] == start + position, f"{run}: element {position} out of memory order"
            seen.add((kind, tuple(sorted(where.items()))))
    assert len(seen) == sum(tensor.numel() for tensor in wires.values()), "an element is missing or drawn twice"


def check_shape_of(spec: UlyssesSpec) -> tuple[dict[str, int], Shape]:
    shape = {key: value for key, value in CHECK_SHAPE.items() if key != "B" or spec.has_batch}
    return shape, dataclasses.replace(drawing_shape(spec, shape), dtype=torch.float32)


@pytest.mark.parametrize("name", BUNDLED)
def test_byte_map_agrees_with_the_naive_path(name: str) -> None:
    spec = bundled_specs()[name]
    shape, sized = check_shape_of(spec)
    check_map_against_naive_path(byte_map(spec, shape, "float32"), spec, sized)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=spec_data())
def test_byte_map_of_any_spec_agrees_with_the_naive_path(data: dict[str, Any]) -> None:
    spec = parse_spec(data, source="<hypothesis>")
    assert isinstance(spec, UlyssesSpec)
    shape, sized = check_shape_of(spec)
    check_map_against_naive_path(byte_map(spec, shape, "float32"), spec, sized)


def test_naive_path_check_catches_a_wrong_map() -> None:
    """The check can fail: two runs of one buffer with their peers swapped, a shared wire's runs one element
    off along `tensor`, and a run past its buffer's end."""
    spec = bundled_specs()["yunchang_ulysses"]
    shape, sized = check_shape_of(spec)
    runs = list(byte_map(spec, shape, "float32").runs)
    first = next(i for i, run in enumerate(runs) if run.range("peer") == (0, 1))
    second = next(i for i, run in enumerate(runs) if run.buffer == runs[first].buffer and run.range("peer") == (1, 2))
    runs[first], runs[second] = (
        dataclasses.replace(runs[first], ranges={**runs[first].ranges, "peer": (1, 2)}),
        dataclasses.replace(runs[second], ranges={**runs[second].ranges, "peer": (0, 1)}),
    )
    with pytest.raises(AssertionError, match="has peer"):
        check_map_against_naive_path(
            dataclasses.replace(byte_map(spec, shape, "float32"), runs=tuple(runs)), spec, sized
        )
    gqa = bundled_specs()["ulysses_qkv_gqa"]
    shape, sized = check_shape_of(gqa)
    bmap = byte_map(gqa, shape, "float32")
    shifted = [dataclasses.replace(run, ranges={**run.ranges, "tensor": (run.ranges["tensor"][0] + 1,
               run.ranges["tensor"][1] + 1)}) if "tensor" in run.ranges else run for run in bmap.runs]  # fmt: skip
    with pytest.raises(AssertionError, match=r"has tensor|out of memory order"):
        check_map_against_naive_path(dataclasses.replace(bmap, runs=tuple(shifted)), gqa, sized)
    past_the_end = [*bmap.runs[:-1], dataclasses.replace(bmap.runs[-1], offset=bmap.runs[-1].offset + 4096)]
    with pytest.raises(AssertionError, match="past its buffer's end"):
        check_map_against_naive_path(dataclasses.replace(bmap, runs=tuple(past_the_end)), gqa, sized)


def test_the_drawing_names_tensors_peers_and_rows() -> None:
    spec = bundled_specs()["yunchang_ulysses"]
    text = render_text(renderable(byte_map(spec, {"N": 2, "B": 2, "S_local": 1, "H": 2, "D": 4}, "float32")))
    assert "before.q [peer 2, seq 1, batch 2, head 1, dim 4] float32" in text
    assert "q p1 b1 s0 h0 d0..3" in text and "after.out [peer 2, head 1, seq 1, batch 2, dim 4]" in text
    gqa = render_text(renderable(byte_map(bundled_specs()["ulysses_qkv_gqa"], {}, "bfloat16")))
    assert "q p0, 16 elements" in gqa and "k p0, 8 elements" in gqa


def test_diff_and_the_cli() -> None:
    specs = bundled_specs()
    diff = diff_layouts(specs["deepspeed_ulysses"], specs["yunchang_ulysses"], {"B": 2}, "bfloat16")
    assert diff is not None
    result = CliRunner().invoke(app, expand_arguments(["show", "deepspeed_ulysses", "--seq", "1", "--heads", "2"]))
    assert result.exit_code == 0, result.output
    assert "out p1 b0 s0 h0 d0..3" in result.output and "S_local=1" in result.output


def test_bad_drawing_shapes_are_clear_errors() -> None:
    spec = bundled_specs()["ulysses_qkv_gqa"]
    with pytest.raises(ValueError, match="a Ulysses drawing has no extent X"):
        byte_map(spec, {"X": 1}, "bfloat16")
    with pytest.raises(ValueError, match="has no batch axis; leave B out"):
        byte_map(spec, {"B": 2}, "bfloat16")
    with pytest.raises(ValueError, match=r"H_kv \(heads\) must be divisible by N"):
        byte_map(spec, {"N": 2, "H_kv": 3}, "bfloat16")
    with pytest.raises(ValueError, match="dtype must be one of"):
        byte_map(spec, {}, "int8")
