"""Every bundled kernel compiles for the H200 (sm_90) at both offset widths, on a machine without a GPU.

The interpreter the other tests run under executes a kernel's Python and cannot see what only Triton's
compiler checks: the tensor-major Ulysses scatter and gather failed to compile their 64-bit path on the
H200 (`program_in_tensor` int32 in one branch, int64 in the other) while every CPU test passed.
`layoutgen.tuning.offline` compiles each kernel through its own launcher on `meta` tensors, with the
heuristic default config, at a small odd shape (32-bit offsets) and one past 2**31 elements (64-bit).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import compile_offline_in_subprocess, make_spec, render_module
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from test_dcp_fp8_pack import fp8_spec_data
from test_dcp_v2_specs import v2_spec_data

from layoutgen.spec import bundled_specs


@pytest.mark.parametrize("family", ["dcp", "ulysses"])
def test_every_bundled_kernel_compiles_for_sm90_with_32_and_64_bit_offsets(family: str) -> None:
    names = [name for name, spec in bundled_specs().items() if spec.family == family]
    result = compile_offline_in_subprocess(names)
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    kernels = 2 if family == "dcp" else 4
    assert len([line for line in lines if line.startswith("ok ")]) == len(names) * kernels * 2, result.stdout


RANDOM_SPECS = 4


# Hypothesis's first example is the simplest (one tensor, no batch, ...): two more are drawn at random.  No
# shrinking: each example is a subprocess of compiles, and the failing compile's own message names the kernel.
@settings(max_examples=3, deadline=None, derandomize=True, phases=(Phase.explicit, Phase.generate))
@given(
    v2=st.lists(v2_spec_data(), min_size=RANDOM_SPECS, max_size=RANDOM_SPECS),
    fp8=st.lists(fp8_spec_data(), min_size=RANDOM_SPECS, max_size=RANDOM_SPECS),
)
def test_random_dcp_specs_compile_for_sm90_with_32_and_64_bit_offsets(
    v2: list[dict[str, Any]], fp8: list[dict[str, Any]], tmp_path_factory: Any
) -> None:
    """Random contract-v2 and fp8 specs (every stats form and placement, payload order, transport, fp8 scale
    layout): pack in its masked and (max, sum) forms, combine."""
    directory: Path = tmp_path_factory.mktemp("offline")
    paths = [
        render_module(make_spec(**{**data, "name": f"drawn_{index}"}), directory).__file__
        for index, data in enumerate([*v2, *fp8])
    ]
    result = compile_offline_in_subprocess(paths)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert len([line for line in result.stdout.splitlines() if line.startswith("ok ")]) == len(paths) * 2 * 2
