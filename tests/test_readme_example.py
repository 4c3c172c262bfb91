"""Every code block of the README runs as written, and its statements of fact hold.

Each fenced block is claimed by one test below (`test_every_block_is_claimed_by_a_test` fails for a block
nobody runs): Python blocks run on CPU under the Triton interpreter (the process-group ones on two gloo
ranks), the CLI walk-through runs in a temporary directory, GPU commands run with `--dry-run`, and the
fresh-machine commands are lines of `.ci/run`, which CI executes.  The counts, constants and test names
the README states are compared with the code, the committed tuning database and the test files.
"""

from __future__ import annotations

import ast
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO_ROOT

README = REPO_ROOT / "README.md"
TESTS = REPO_ROOT / "tests"


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


def readme_blocks() -> list[tuple[str, str, str]]:
    """(section heading, language, code) of every fenced block, in order."""
    blocks, section = [], "(top)"
    lines = readme_text().splitlines(keepends=True)
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("## "):
            section = line[3:].strip()
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence:
            end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
            blocks.append((section, fence.group(1), "".join(lines[index + 1 : end])))
            index = end
        index += 1
    return blocks


def block(section: str, language: str, number: int = 0) -> str:
    found = [code for heading, lang, code in readme_blocks() if heading == section and lang == language]
    if len(found) <= number:
        raise AssertionError(f"README.md has no {language or 'plain'} block #{number} under {section!r}")
    return found[number]


#: (section, language, number within that section and language) -> the test that runs the block.
CLAIMED = {
    ("(top)", "bash", 0): "test_the_fresh_machine_commands_are_what_ci_runs",
    ("Use it", "python", 0): "test_the_process_group_blocks_run_on_two_gloo_ranks",
    ("Use it from an inference engine", "python", 0): "test_readme_engine_example_runs",
    ("The spec", "yaml", 0): "test_the_spec_block_is_the_bundled_spec",
    ("The spec", "", 0): "test_the_error_block_is_what_build_prints",
    ("Add a backend in five minutes", "yaml", 0): "test_the_five_minute_walk_through",
    ("Add a backend in five minutes", "", 0): "test_the_five_minute_walk_through",
    ("Tuning", "bash", 0): "test_the_tuning_commands_plan_with_dry_run",
    ("Distributed exchange", "python", 0): "test_the_process_group_blocks_run_on_two_gloo_ranks",
    (
        "DCP contract v2: empty rows, (max, sum) statistics, an output scale",
        "python",
        0,
    ): "test_the_family_examples_run",
    ("Sequence parallelism (Ulysses)", "python", 0): "test_the_family_examples_run",
    ("fp8 on the wire", "python", 0): "test_the_family_examples_run",
}


def test_every_block_is_claimed_by_a_test() -> None:
    seen: dict[tuple[str, str], int] = {}
    present = set()
    for section, language, _ in readme_blocks():
        number = seen.get((section, language), 0)
        seen[(section, language)] = number + 1
        present.add((section, language, number))
    assert present == set(CLAIMED), f"unclaimed: {present - set(CLAIMED)}; gone: {set(CLAIMED) - present}"
    assert all(name in globals() for name in CLAIMED.values())


def child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "NO_COLOR": "1", "COLUMNS": "80", **extra}
    env.pop("LAYOUTGEN_DEBUG", None)
    return env


def run_main(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *, stderr: bool = True
) -> tuple[int, str]:
    """`layoutgen ARGS` through the real entry point in this process: (exit code, stdout + stderr, or stdout
    alone: warnings that a process reports once may land on stderr in whichever test comes first)."""
    from layoutgen.cli import main

    monkeypatch.delenv("LAYOUTGEN_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["layoutgen", *args])
    try:
        main()
        code: Any = 0
    except SystemExit as exited:
        code = exited.code
    out, err = capsys.readouterr()
    return (code if isinstance(code, int) else 0 if code is None else 1), out + err if stderr else out


# ---------------------------------------------------------------------------------------------
# The blocks
# ---------------------------------------------------------------------------------------------
def test_the_fresh_machine_commands_are_what_ci_runs() -> None:
    commands = [line for line in block("(top)", "bash").splitlines() if line.strip() and not line.startswith("#")]
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert len(commands) == 3
    for command in commands:
        assert command in ci, f".ci/run does not run the README command {command!r}"
    pins = set(re.findall(r'"(torch==[^"]+|triton==[^"]+)"', block("(top)", "bash")))
    assert pins and pins <= set(re.findall(r'"(torch==[^"]+|triton==[^"]+)"', "\n".join(ci)))
    assert "--index-url https://download.pytorch.org/whl/cpu" in readme_text()  # the CPU build, anywhere


def test_readme_engine_example_runs(tmp_path: Path) -> None:
    code = block("Use it from an inference engine", "python")
    assert "mod.pack(" in code and "mod.combine(" in code and "assert " in code  # it checks its own result
    # A fresh interpreter: TRITON_INTERPRET must be set before the generated kernels are defined.
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"README example failed:\n{result.stdout}\n{result.stderr}"
    assert list(tmp_path.iterdir()) == []  # the example writes nothing


@pytest.mark.parametrize(
    "section",
    [
        "DCP contract v2: empty rows, (max, sum) statistics, an output scale",
        "fp8 on the wire",
        "Sequence parallelism (Ulysses)",
    ],
)
def test_the_family_examples_run(section: str, tmp_path: Path) -> None:
    code = block(section, "python")
    assert "assert " in code  # it checks its own result
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"README example under {section!r} failed:\n{result.stdout}\n{result.stderr}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_process_group_blocks_run_on_two_gloo_ranks(tmp_path: Path) -> None:
    """ "Use it" and "Distributed exchange" as one script, as torchrun would start it on two ranks (the
    environment it sets), on CPU: gloo and the interpreter."""
    script = tmp_path / "step.py"
    script.write_text(block("Use it", "python") + "\n" + block("Distributed exchange", "python"), encoding="utf-8")
    port = str(_free_port())
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=child_env(
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE="2",
                CUDA_VISIBLE_DEVICES="",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    for rank, process in enumerate(ranks):
        try:
            out, err = process.communicate(timeout=300)
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == 0, f"rank {rank}:\n{out}\n{err}"


def test_the_spec_block_is_the_bundled_spec() -> None:
    from layoutgen.spec import bundled_specs, parse_spec_text

    shown = parse_spec_text(block("The spec", "yaml"), "README.md")
    assert shown == bundled_specs()["pynccl_a2a"]


def _matches(expected: str, actual: str) -> None:
    """`actual` says what the README block `expected` shows: line by line, where ` ...` at a line's end stands
    for the rest of that line and a line of `...` alone for any lines."""
    lines = actual.splitlines()
    at = 0
    for want in expected.splitlines():
        if want.strip() == "...":
            continue
        prefix = want[: -len(" ...")] if want.endswith(" ...") else None
        while at < len(lines) and not (lines[at].startswith(prefix) if prefix is not None else lines[at] == want):
            at += 1
        assert at < len(lines), f"README line {want!r} is not in the output:\n{actual}"
        at += 1


def test_the_error_block_is_what_build_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = block("The spec", "")
    command, expected = shown.splitlines()[0], "\n".join(shown.splitlines()[1:])
    assert command.startswith("$ layoutgen ")
    spec = yaml.safe_load(block("The spec", "yaml"))
    spec.update(name="my_backend", payload={**spec["payload"], "axes": ["batch", "peer", "head", "dim"]})
    assert "axes: [batch, peer, head, dim]" in readme_text()  # what the README says was changed
    (tmp_path / "my_backend.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code, output = run_main(command.split()[2:], capsys, monkeypatch)
    assert code == 2
    _matches(expected, output)
    assert not (tmp_path / "mydir").exists()


def test_the_five_minute_walk_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    import layoutgen

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAYOUTGEN_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "my_backend.yaml").write_text(block("Add a backend in five minutes", "yaml"), encoding="utf-8")
    section = readme_text().split("## Add a backend in five minutes", 1)[1].split("\n## ", 1)[0]
    commands = [" ".join(c.split()) for c in re.findall(r"`(layoutgen [^`]+)`", section)]
    show = next(c for c in commands if c.startswith("layoutgen show my_backend.yaml --N"))
    code, drawing = run_main(show.split()[1:], capsys, monkeypatch, stderr=False)
    assert code == 0, drawing
    _matches(block("Add a backend in five minutes", ""), drawing)
    for command in ("layoutgen diff pynccl_a2a my_backend.yaml", "layoutgen build --spec my_backend.yaml --out mydir"):
        assert command in commands
        code, output = run_main(command.split()[1:], capsys, monkeypatch, stderr=False)
        assert code == 0, output
    lines = output.splitlines()  # the build's: a spec nobody bundled, verified against the reference
    assert lines[-1] == "1 written, 0 unchanged in mydir" and "my_backend" in lines  # written once verified
    rows = [line.split()[:2] for line in lines[lines.index("my_backend") + 1 : -1]]
    assert rows == [["ok", "pack"], ["ok", "combine"]] * 2  # the reference's checks, then the sm_90 compiles
    assert "bytes identical" in output and "compiles for sm_90 with 32- and 64-bit offsets" in output
    assert sorted(path.name for path in (tmp_path / "mydir").iterdir()) == ["my_backend.py"]
    assert 'load("mydir/my_backend.py")' in section
    module = layoutgen.load("mydir/my_backend.py")
    bufs = module.alloc(2, 3, 4, 4, torch.bfloat16, device="cpu")
    module.pack(torch.randn(2, 4, 4, dtype=torch.bfloat16), torch.randn(2, 4), bufs)
    assert "layoutgen tune --spec my_backend.yaml" in commands
    code, output = run_main(["tune", "--spec", "my_backend.yaml", "--dry-run"], capsys, monkeypatch)
    assert code == 0 and "my_backend pack " in output, output


def test_the_tuning_commands_plan_with_dry_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each command as written plus `--dry-run`: its options, specs and grid are valid.  Each study's search
    plan is stubbed (enumerating every space of the default grids takes seconds; tests/test_tuning.py checks
    the plans)."""
    from layoutgen.tuning import plan, prepare  # noqa: F401  (prepare binds the real search_plan before the stub)

    monkeypatch.setattr(plan, "search_plan", lambda problem, bucket, options: plan.SearchPlan("tpe", 100, 24))
    commands = [line.split("#")[0].split() for line in block("Tuning", "bash").splitlines() if line.strip()]
    assert len(commands) == 4 and all(command[:2] == ["layoutgen", "tune"] for command in commands)
    for command in commands:
        args = [*command[1:], *([] if "--dry-run" in command else ["--dry-run"])]
        code, output = run_main(args, capsys, monkeypatch)
        assert code == 0 and re.search(r"^\d+ studies, \d+ measured trials planned$", output, re.MULTILINE), output


# ---------------------------------------------------------------------------------------------
# Statements of fact
# ---------------------------------------------------------------------------------------------
def test_the_dcp_grid_counts_match_the_code_and_the_committed_database() -> None:
    from layoutgen.dcp import FAMILY
    from layoutgen.tuning.plan import TuneOptions, make_targets, target_buckets
    from layoutgen.tuning_db import read_database

    text = " ".join(readme_text().split())
    found = re.search(r"(\d+) shapes x (\d+) specs x (\d+) kernels x (\d+) buckets = (\d+) studies", text)
    assert found, "README no longer states the DCP grid's size"
    shapes, specs, kernels, buckets, studies = map(int, found.groups())
    named = re.search(r"for the four original specs \(([^)]*)\)", text)
    original = sorted(re.findall(r"`(\w+)`", named.group(1))) if named else []
    assert specs == len(original) == 4
    options = TuneOptions(specs=tuple(original), db_dir=None, interpret=False)
    targets = make_targets(options)
    planned = sum(len(target_buckets(options, target)) for target in targets)
    assert kernels == len(FAMILY.kernels) and buckets == len(FAMILY.bucket.defaults)
    assert shapes * specs * kernels == len(targets) and shapes * specs * kernels * buckets == studies == planned
    held = re.search(r"`tuning_db/NVIDIA_H200.json` holds those (\d+) decisions", text)
    entries = read_database(REPO_ROOT / "tuning_db" / "NVIDIA_H200.json").entries
    assert held and int(held.group(1)) == len(entries)


def test_the_tuning_constants_are_the_codes() -> None:
    from layoutgen.dcp import FAMILY
    from layoutgen.tuning import decision, plan, procedure

    text = " ".join(readme_text().split())
    space = FAMILY.kernels[0].space
    stated = {
        r"others with (\d+) trials of multivariate TPE": plan.DEFAULT_TPE_TRIALS,
        r"Spaces of at most (\d+) feasible points": plan.DEFAULT_EXHAUSTIVE_LIMIT,
        r"(\d+) replays, median with p20/p80": procedure.REPEATS,
        r"twice the L2 cache, at most (\d+)": procedure.MAX_ROTATING_SETS,
        r"Buffers hold B rounded up to (\d+) rows": procedure.CAPACITY_ROUNDING,
        r"a CUDA graph of back-to-back calls \(~(\d+) µs of work\)": int(procedure.GRAPH_TARGET_US),
        r"more than the noise \((\d+)%": round(100 * decision.NOISE_FLOOR),
        r"narrower than a (\d+)-byte sector": space.sector_bytes,
        r"more than (\d+) tile elements per thread": space.max_elements_per_thread,
        r"under (\d+) bytes loaded per thread": space.min_bytes_per_thread,
        r"`num_warps` 1 … (\d+)": max(space.num_warps),
    }
    for pattern, value in stated.items():
        found = re.search(pattern, text)
        assert found, f"README no longer says {pattern!r}"
        assert int(found.group(1)) == value, f"README says {found.group(0)!r}; the code has {value}"
    assert "under 1 KiB loaded per program" in text and space.min_tile_bytes == 1024
    assert "the three fastest configs of the search" in text and decision.FINALISTS == 3
    assert (
        "three trials per study in flight" in text and plan.TuneOptions.__dataclass_fields__["lookahead"].default == 3
    )
    for kernel in FAMILY.kernels:
        assert kernel.space.num_stages == (1,), "README: num_stages 1"


def _test_functions(path: Path) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def _expects_failure(function: ast.FunctionDef) -> bool:
    return any("xfail" in ast.unparse(node) for node in [*function.decorator_list, *ast.walk(function)])


def test_the_tests_named_in_the_guarantees_exist_and_are_expected_to_pass() -> None:
    section = readme_text().split("## Guarantees", 1)[1].split("\n## ", 1)[0]
    named: list[tuple[str, str]] = []
    current = None
    for file_name, test_name in re.findall(r"`((?:\w+/)?test_\w+\.py)?::(test_\w+)`", section):
        current = file_name or current
        assert current is not None, f"::{test_name} names no file"
        named.append((current, test_name))
    assert len(named) > 40
    missing, expected_to_fail = [], []
    for file_name, test_name in named:
        functions = _test_functions(TESTS / file_name) if (TESTS / file_name).is_file() else {}
        if test_name not in functions:
            missing.append(f"{file_name}::{test_name}")
        elif _expects_failure(functions[test_name]):
            expected_to_fail.append(f"{file_name}::{test_name}")
    assert not missing, f"the Guarantees name tests that do not exist: {missing}"
    assert not expected_to_fail, f"the Guarantees name tests marked xfail: {expected_to_fail}"
    bare = re.findall(r"\(`(test_\w+)`", section)
    assert not bare, f"tests named without their file: {bare}"


def test_the_examples_rank_lines_come_one_per_rank_in_order(tmp_path: Path) -> None:
    example = REPO_ROOT / "examples" / "dcp_decode_step.py"
    assert "python examples/dcp_decode_step.py" in readme_text()
    result = subprocess.run(
        [sys.executable, str(example), "--batch", "2", "--head-dim", "8", "--device", "cpu"],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(" ", 2)[:2] for line in lines] == [["rank", "0/2"], ["rank", "1/2"]], result.stdout
    assert all(line.endswith(": OK") for line in lines)


def test_the_example_runs_an_fp8_spec_and_refuses_another_family(tmp_path: Path) -> None:
    # An fp8 wire is judged by its own rounding bound (README, "fp8 on the wire"), not the bf16 one's.
    example = REPO_ROOT / "examples" / "dcp_decode_step.py"

    def run(*arguments: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(example), "--batch", "3", "--head-dim", "32", "--device", "cpu", *arguments]
        return subprocess.run(
            command, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=300, check=False
        )

    result = run("--spec", "vllm_a2a_fp8")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line.endswith(": OK") for line in result.stdout.splitlines()] == [True, True], result.stdout
    result = run("--spec", "ulysses_qkv_gqa")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "is a ulysses spec; this example runs DCP specs" in result.stderr
