"""Every bundled kernel compiles for the H200 (sm_90) at both offset widths, on a machine without a GPU.

The interpreter the other tests run under executes a kernel's Python and cannot see what only Triton's
compiler checks: the tensor-major Ulysses scatter and gather failed to compile their 64-bit path on the
H200 (`program_in_tensor` int32 in one branch, int64 in the other) while every CPU test passed.
`layoutgen.tuning.offline` compiles each kernel through its own launcher on `meta` tensors, with the
heuristic default config, at a small odd shape (32-bit offsets) and one past 2**31 elements (64-bit).
"""

from __future__ import annotations

import os
import subprocess
import sys
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


def compile_script_offline(body: str, module_path: str) -> subprocess.CompletedProcess[str]:
    """Run `body` in a fresh interpreter (compiled, not interpreted) with `module` loaded from `module_path` and
    `torch`, `capacity_for` and `compile_offline` imported."""
    script = (
        "import sys, pathlib, torch\n"
        "from layoutgen.loader import load_path\n"
        "from layoutgen.tuning.objective import capacity_for\n"
        "from layoutgen.tuning.offline import compile_offline\n"
        "module = load_path(pathlib.Path(sys.argv[1]))\n"
    ) + body
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    command = [sys.executable, "-c", script, module_path]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)


def test_fp8_packs_that_walk_scale_blocks_in_chunks_compile_with_32_and_64_bit_offsets(tmp_path: Path) -> None:
    """The two-pass form of a transposing fp8 pack at both offset widths: with peer innermost its default config
    at D 512 (128 of a row's 512 dims per chunk), every pack form and combine; with batch innermost, whose
    default now takes a row of one scale whole (twentieth pass), a box of 32 rows x 128 dims in four chunks
    (the earlier default, in the tuner's space), every pack form."""
    from layoutgen.dcp.config import default_pack_config

    def spec_of(name: str, axes: list[str]) -> Any:
        return make_spec(
            name=name,
            transport="external",
            payload={"axes": axes, "dtype": "float8_e5m2"},
            stats={"placement": "separate", "axes": ["peer", "batch", "head", "slot"], "form": "max_sum"},
        )

    peer_inner = spec_of("chunks_peer", ["batch", "dim", "head", "peer"])
    assert peer_inner.fp8_chunks and default_pack_config(peer_inner, 2, 64, 512, 32784, 2).block_dim < 512
    result = compile_offline_in_subprocess([render_module(peer_inner, tmp_path).__file__])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert len([line for line in result.stdout.splitlines() if line.startswith("ok ")]) == 2 * 2

    batch_inner = spec_of("chunks_batch", ["peer", "head", "dim", "batch"])
    assert batch_inner.fp8_chunks and default_pack_config(batch_inner, 2, 64, 512, 32784, 2).block_dim == 512
    script = (
        "config = dict(block_peer=1, block_batch=32, block_head=1, block_dim=128, num_warps=4)\n"
        "for B in (5, 32784):\n"
        "    job = dict(kernel='pack', config=config, N=2, H=128, D=512, dtype='bfloat16', batch=B,\n"
        "               capacity=capacity_for(B, torch.device('cuda')), pack_forms=[(True, False), (False, True)])\n"
        "    compile_offline(module, job, 90)\n"
        "    print('ok', B)\n"
    )
    result = compile_script_offline(script, render_module(batch_inner, tmp_path).__file__)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.split("\n")[:2] == ["ok 5", "ok 32784"], result.stdout


def test_fp8_packs_that_store_words_compile_with_32_and_64_bit_offsets(tmp_path: Path) -> None:
    """The word path of a batch-innermost fp8 pack (one pass, 64 rows: `WORDS`) compiles to 16-byte stores at
    B 1024 and at B 32784 (element offsets past 2^31: int64 row arithmetic), under the launcher's 64-register
    cap at 32 tile elements per thread and without it at 64 (where the cap spilled)."""
    spec = make_spec(
        name="words_batch",
        transport="external",
        payload={"axes": ["peer", "head", "dim", "batch"], "dtype": "float8_e4m3fn", "scale_block": 16},
        stats={"placement": "separate", "axes": ["peer", "head", "slot", "batch"]},
    )
    path = render_module(spec, tmp_path).__file__
    script = (
        "config = dict(block_peer=1, block_batch=64, block_head=1, block_dim=64, num_warps=4)\n"
        "for B in (1024, 32784):\n"
        "    job = dict(kernel='pack', config=config, N=8, H=128, D=512, dtype='bfloat16', batch=B,\n"
        "               capacity=capacity_for(B, torch.device('cuda')))\n"
        "    compiled = compile_offline(module, job, 90)\n"
        "    print('ok', B, 'STG.E.128' if 'st.global.v4' in compiled.asm['ptx'] else 'no vector stores')\n"
        "    print('maxnreg 64' if '.maxnreg 64' in compiled.asm['ptx'] else 'no cap')\n"
        "wide = dict(config, block_dim=128)\n"
        "job = dict(kernel='pack', config=wide, N=8, H=128, D=512, dtype='bfloat16', batch=1024,\n"
        "           capacity=capacity_for(1024, torch.device('cuda')))\n"
        "print('maxnreg 64' if '.maxnreg' in compile_offline(module, job, 90).asm['ptx'] else 'no cap')\n"
    )
    result = compile_script_offline(script, path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.split("\n")[:5]
    assert lines == ["ok 1024 STG.E.128", "maxnreg 64", "ok 32784 STG.E.128", "maxnreg 64", "no cap"], result.stdout


def test_build_reports_a_kernel_that_does_not_compile_and_fails(tmp_path: Path) -> None:
    """`layoutgen build`'s verification adds the offline compile: the bundled qkv module with the 64-bit fix
    taken out (its program id left int32) fails at scatter and gather, 64-bit, with the compiler's reason."""
    from layoutgen.cli.build import _with_offline_compiles
    from layoutgen.family import VerifyReport
    from layoutgen.loader import generated_dir

    fix = "    if INDEX_64:\n        program = program.to(tl.int64)"
    source = (generated_dir() / "ulysses_qkv_gqa.py").read_text(encoding="utf-8")
    assert source.count(fix) == 2  # scatter's and gather's tensor-major walk
    broken = tmp_path / "ulysses_qkv_gqa.py"
    broken.write_text(source.replace(fix, "    if INDEX_64:\n        pass"), encoding="utf-8")
    report = VerifyReport("ulysses_qkv_gqa", "ulysses", (), ())
    (checked,) = _with_offline_compiles([broken], [report])
    failed = {check.kernel: check.detail for check in checked.checks if not check.passed}
    assert sorted(failed) == ["gather", "scatter"], checked.checks
    assert all("(64-bit)" in detail and "Mismatched type for program_in_tensor" in detail for detail in failed.values())
    assert len(checked.failures) == 2 and not checked.ok
    assert sorted(check.kernel for check in checked.checks if check.passed) == ["gather_out", "scatter_out"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ulysses_qkv_gqa.py"]  # no __pycache__ beside it


def test_build_skips_the_compiles_where_triton_cannot_compile_for_nvidia(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Triton without the NVIDIA toolchain (e.g. a ROCm build) says so once and leaves the reports as they are."""
    from layoutgen.cli.build import _with_offline_compiles
    from layoutgen.family import VerifyReport
    from layoutgen.loader import generated_dir
    from layoutgen.tuning import offline

    monkeypatch.setattr(offline, "unavailable", lambda: "this Triton has no NVIDIA backend")
    report = VerifyReport("ulysses_qkv_gqa", "ulysses", (), ())
    assert _with_offline_compiles([generated_dir() / "ulysses_qkv_gqa.py"], [report]) == [report]
    assert "not compiled for sm_90: this Triton has no NVIDIA backend" in capsys.readouterr().out
