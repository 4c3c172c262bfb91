"""Regenerate the golden outputs of `layoutgen show` / `layoutgen diff` in tests/golden/.

    python scripts/regen_golden.py          # rewrite tests/golden/ from the current code
    python scripts/regen_golden.py --check  # write nothing; exit 1 listing files that differ

tests/test_show.py runs the same CASES through the same `run_case` and compares; it never writes.
Review `git diff tests/golden/` after regenerating: a changed byte map is a changed layout.
"""

from __future__ import annotations

import sys
from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "tests" / "golden"
BUNDLED = (
    "pynccl_a2a",
    "pynccl_a2a_aligned",
    "flashinfer_mnnvl",
    "vllm_a2a",
    "trtllm_helix_nccl",
    "trtllm_helix_native_v1",
    "trtllm_helix_native_v2",
    "pynccl_a2a_fp8",
    "vllm_a2a_fp8",
)
#: Odd heads per peer, D not a power of two, padding that is not the LSE's own width.
AWKWARD_SHAPE = ["--N", "2", "--batch", "1", "--heads", "6", "--D", "10", "--dtype", "float16"]
#: Two live rows, the last of them a row of an empty request (pack's `empty=`).
EMPTY_ROW = ["--N", "2", "--batch", "2", "--heads", "4", "--D", "8", "--empty", "1"]

#: Layout pairs whose diff is kept twice: the default summary (`diff_A_B.txt`) and with every run
#: (`diff_A_B_runs.txt`).
DIFF_PAIRS = (
    ("pynccl_a2a", "pynccl_a2a_aligned"),
    ("pynccl_a2a", "vllm_a2a"),
    ("pynccl_a2a", "flashinfer_mnnvl"),
    ("vllm_a2a", "flashinfer_mnnvl"),
    ("vllm_a2a", "vllm_a2a"),
    ("trtllm_helix_nccl", "trtllm_helix_native_v2"),
)

#: golden file name -> `layoutgen` arguments, as typed on a command line (family aliases such as --heads included)
CASES: dict[str, list[str]] = {
    **{f"show_{name}.txt": ["show", name] for name in BUNDLED},
    **{f"show_{name}.json": ["show", name, "--json"] for name in BUNDLED},
    "show_pynccl_a2a_aligned_awkward.txt": ["show", "pynccl_a2a_aligned", *AWKWARD_SHAPE],
    "show_flashinfer_mnnvl_float32.txt": ["show", "flashinfer_mnnvl", "--N", "2", "--batch", "1", "--dtype", "float32"],
    **{f"diff_{a}_{b}.txt": ["diff", a, b] for a, b in DIFF_PAIRS},
    **{f"diff_{a}_{b}_runs.txt": ["diff", a, b, "--runs"] for a, b in DIFF_PAIRS},
    "diff_pynccl_a2a_flashinfer_mnnvl.json": ["diff", "pynccl_a2a", "flashinfer_mnnvl", "--json"],
    "show_pynccl_a2a_empty_row.txt": ["show", "pynccl_a2a", *EMPTY_ROW],
    "show_trtllm_helix_native_v2_empty_row.txt": ["show", "trtllm_helix_native_v2", *EMPTY_ROW],
    "show_pynccl_a2a_fp8_empty_row.txt": ["show", "pynccl_a2a_fp8", *EMPTY_ROW],
    "diff_pynccl_a2a_fp8_vllm_a2a_fp8.txt": ["diff", "pynccl_a2a_fp8", "vllm_a2a_fp8"],
}

#: Plain output whatever the caller's terminal settings: no colour, the CLI's fixed width.
PLAIN_ENV: dict[str, str | None] = {
    "NO_COLOR": "1",
    "FORCE_COLOR": None,
    "TTY_COMPATIBLE": None,
    "TTY_INTERACTIVE": None,
    "COLUMNS": None,
    "LINES": None,
}


def run_case(args: list[str]) -> str:
    """stdout of `layoutgen ARGS`, run in-process through typer's test runner after the rewriting `main` does
    (a family's aliases become `--shape`)."""
    from typer.testing import CliRunner

    from layoutgen.cli import app
    from layoutgen.cli.common import expand_arguments

    result = CliRunner().invoke(app, expand_arguments(args), env=PLAIN_ENV)
    if result.exit_code != 0:
        raise RuntimeError(f"layoutgen {' '.join(args)} exited {result.exit_code}: {result.output}{result.exception!r}")
    return result.stdout


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print(__doc__, file=sys.stderr)
        return 2
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    stale = []
    for name, args in CASES.items():
        path = GOLDEN_DIR / name
        text = run_case(args)
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path)
        if not check:
            path.write_text(text, encoding="utf-8")
    strays = sorted(set(GOLDEN_DIR.iterdir()) - {GOLDEN_DIR / name for name in CASES})
    for path in stale:
        print(f"{'differs' if check else 'wrote'}: {path}")
    for path in strays:
        print(f"not a golden case (delete it): {path}")
    return 1 if check and (stale or strays) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
