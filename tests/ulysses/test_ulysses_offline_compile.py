"""Random valid Ulysses specs compile for sm_90 at both offset widths (`layoutgen.tuning.offline`).

The byte-exact tests run these specs under the interpreter, which executes the kernels' Python and cannot
see what only Triton's compiler checks (one type per variable across an `if`'s branches, constexpr
rules); the bundled specs' kernels are compiled in `tests/test_offline_compile.py`, these cover the
template branches only other layouts reach (a shared wire with its tensor axis inside seq, batch axes,
external transports, one to three tensors of either head count).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import compile_offline_in_subprocess, render_module
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from test_ulysses_kernels import FOUR_ALTERNATING, GQA_HEAD_INNERMOST, INTERLEAVED
from ulysses_cases import spec_data

from layoutgen.spec import parse_spec

SPECS = 4


# Hypothesis's first example is the simplest (one tensor, no batch, ...): two more are drawn at random.  No
# shrinking: each example is a subprocess of compiles, and the failing compile's own message names the kernel.
@settings(max_examples=3, deadline=None, derandomize=True, phases=(Phase.explicit, Phase.generate))
@given(drawn=st.lists(spec_data(), min_size=SPECS, max_size=SPECS))
def test_random_specs_compile_for_sm90_with_32_and_64_bit_offsets(
    drawn: list[dict[str, Any]], tmp_path_factory: Any
) -> None:
    directory: Path = tmp_path_factory.mktemp("offline")
    paths = []
    for index, data in enumerate(drawn):
        spec = parse_spec({**data, "name": f"random_ulysses_{index}"}, source="<hypothesis>")
        paths.append(render_module(spec, directory).__file__)
    result = compile_offline_in_subprocess(paths)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert len([line for line in result.stdout.splitlines() if line.startswith("ok ")]) == SPECS * 4 * 2


def test_alternating_tensors_and_kv_boxes_compile_for_sm90_with_32_and_64_bit_offsets(tmp_path: Path) -> None:
    """The interleaved (`tl.interleave`) and split (`tl.split`) boxes of two and four tensors; k/v boxes of
    their own heads where head is innermost."""
    layouts = (INTERLEAVED, FOUR_ALTERNATING, GQA_HEAD_INNERMOST)
    paths = [render_module(parse_spec(data, source="<test>"), tmp_path).__file__ for data in layouts]
    result = compile_offline_in_subprocess(paths)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert len([line for line in result.stdout.splitlines() if line.startswith("ok ")]) == len(layouts) * 4 * 2
