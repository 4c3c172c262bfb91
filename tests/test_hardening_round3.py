"""Third hardening pass, from an adversarial review: each test is a defect a reviewer hit, fixed.

CLI cases run the real entry point in this process (`test_cli_polish.run_main`); kernel cases run under the
Triton interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import requires_interpreter
from test_cli_polish import assert_one_line_error, run_main

import layoutgen
from layoutgen.runtime.tensors import OverlapGuard

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")


@needs_no_gpu
@pytest.mark.parametrize("spec_name", ["pynccl_a2a", "deepspeed_ulysses"])
def test_alloc_on_a_cuda_device_without_cuda_says_so(spec_name: str) -> None:
    # Instead of torch's bare "Torch not compiled with CUDA enabled" assertion.
    module = layoutgen.load(spec_name)
    extra: dict[str, Any] = {"B": 1} if module.SPEC.family == "ulysses" else {}
    with pytest.raises(RuntimeError, match=r"alloc: device cuda:0 is not available here.*device='cpu'"):
        module.alloc(2, 4, 4, 8, torch.bfloat16, "cuda:0", **extra)
    with pytest.raises(ValueError, match=r"alloc: device must be a torch.device or a name"):
        module.alloc(2, 4, 4, 8, torch.bfloat16, "gpu-please", **extra)


@needs_no_gpu
def test_an_exchange_on_a_cuda_device_without_cuda_says_so() -> None:
    from layoutgen import DcpExchange

    with pytest.raises(RuntimeError, match="DcpExchange: device cuda is not available here"):
        DcpExchange("vllm_a2a", B_max=2, H=4, D=8, dtype=torch.bfloat16, device="cuda")


@requires_interpreter
def test_pack_names_buffers_given_in_the_place_of_lse() -> None:
    module = layoutgen.load("trtllm_helix_nccl")
    bufs = module.alloc(2, 2, 4, 8, torch.bfloat16)
    out, maximum, total = torch.randn(2, 4, 8).to(torch.bfloat16), torch.randn(2, 4), torch.rand(2, 4) + 1
    with pytest.raises(TypeError, match=r"buffers came in lse's place.*pack\(out, bufs=bufs, max_sum="):
        module.pack(out, bufs, max_sum=(maximum, total))
    module.pack(out, bufs=bufs, max_sum=(maximum, total))


@requires_interpreter
def test_an_empty_mask_of_another_dtype_is_a_type_error() -> None:
    module = layoutgen.load("vllm_a2a")
    bufs = module.alloc(2, 2, 4, 8, torch.bfloat16)
    out, lse = torch.randn(2, 4, 8).to(torch.bfloat16), torch.randn(2, 4)
    with pytest.raises(TypeError, match=r"empty must be a torch.bool tensor \[R=2\].*torch.uint8"):
        module.pack(out, lse, bufs, empty=torch.zeros(2, dtype=torch.uint8))


def test_the_overlap_guard_sees_buffers_and_outputs_at_new_addresses() -> None:
    buffers = [torch.empty(64), torch.empty(32)]
    tensors = [torch.empty(4, 4), torch.empty(8)]
    guard = OverlapGuard.of(buffers, tensors, disjoint=True)
    assert not guard.may_overlap(tensors)
    assert guard.may_overlap([buffers[1][:16].view(4, 4), tensors[1]]), "a tensor inside a buffer"
    assert guard.may_overlap([tensors[0], tensors[0].view(-1)[8:16]]), "two outputs sharing memory"
    assert not OverlapGuard.of(buffers, tensors, disjoint=False).may_overlap([tensors[0], tensors[0].view(-1)[:8]])
    assert not guard.may_overlap([torch.empty(4, 4), torch.empty(0)]), "an empty tensor touches nothing"


def test_diff_of_layouts_with_other_elements_says_what_differs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kinds both hold are compared; the scales only the fp8 wire holds are named, in words.
    code, out, err = run_main(["diff", "pynccl_a2a", "pynccl_a2a_fp8"], capsys, monkeypatch)
    assert code == 0, err
    assert "Not compared: only pynccl_a2a_fp8 holds scale." in " ".join(out.split()), out
    assert "{" not in out, "the message shows Python dicts"


def test_tune_on_a_grid_no_spec_can_hold_is_bad_input(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Was "nothing to tune: every study of this run is decided in the database" and exit 0.
    code, _, err = run_main(["tune", "--dry-run", "--spec", "pynccl_a2a", "--shape", "N=3"], capsys, monkeypatch)
    assert_one_line_error(code, err, "no study to plan", "N=3", "divisible by N")


def test_tune_names_a_storage_url_it_cannot_open(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    args = ["tune", "--interpret", "--spec", "pynccl_a2a", "--kernel", "pack", "--N", "2", "--heads", "2"]
    args += ["--D", "8", "--db", str(tmp_path), "--storage", "nosuchdialect://x/y"]
    code, _, err = run_main(args, capsys, monkeypatch)
    assert_one_line_error(code, err, "--storage nosuchdialect://x/y", "cannot open it as an Optuna database")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["build", "--spec", "pynccl_a2a", "--out", "{file}", "--no-verify"], ("--out", "is not a directory")),
        (["tune", "--dry-run", "--spec", "pynccl_a2a", "--storage", "{file}/x.journal"], ("--storage",)),
        (["tune", "--dry-run", "--spec", "pynccl_a2a", "--db", "{file}"], ("--db", "is not a directory")),
        (["show", "pynccl_a2a", "--png", "{file}/x.png"], ("--png", "is not a directory")),
    ],
    ids=["build --out", "tune --storage (dry run)", "tune --db (dry run)", "show --png"],
)
def test_a_file_where_a_directory_belongs_is_named(
    args: list[str],
    words: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    if args[0] == "show":
        pytest.importorskip("matplotlib")
    in_the_way = tmp_path / "afile"
    in_the_way.write_text("a file\n")
    code, out, err = run_main([arg.format(file=in_the_way) for arg in args], capsys, monkeypatch)
    assert_one_line_error(code, err, *words)
    assert not out.strip(), "something was printed before the refusal"


@pytest.mark.parametrize(
    ("args", "words"),
    [([], "the following arguments are required"), (["nosuch"], "no generated module for spec 'nosuch'")],
)
def test_the_offline_compile_command_refuses_bad_arguments(args: list[str], words: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "layoutgen.tuning.offline", *args], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_db_prune_and_show_say_what_they_found(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    code, out, _ = run_main(["db", "prune", "--db", str(tmp_path)], capsys, monkeypatch)
    assert code == 0 and "no database files in" in out
    misnamed = tmp_path / "NVIDIA_A100.json"
    misnamed.write_bytes((Path(__file__).resolve().parent.parent / "tuning_db" / "NVIDIA_H200.json").read_bytes())
    code, out, _ = run_main(["db", "show", "--db", str(tmp_path), "--device", "NVIDIA A100"], capsys, monkeypatch)
    assert code == 0 and "which belongs in NVIDIA_H200.json" in " ".join(out.split()), out


def test_the_reference_exchange_moves_each_buffer_along_its_own_peer_axis() -> None:
    # An external fp8 spec may put peer elsewhere in its scales than in its stats: the reference exchange
    # took the stats' axes for the scales too (a ValueError here, a wrong exchange where the extents agree).
    from layoutgen.dcp import reference
    from layoutgen.dcp.layout import LayoutBuffers, buffer_shapes
    from layoutgen.spec import parse_spec_text

    spec = parse_spec_text(
        "name: fp8_scales_apart\nsummary: scales with peer second\ntransport: external\n"
        "payload: {axes: [peer, batch, head, dim], dtype: float8_e4m3fn, scale_axes: [batch, peer, head, block]}\n"
        "stats: {placement: separate, axes: [peer, batch, head, slot], slots: 1}\n"
    )
    generator = torch.Generator().manual_seed(3)
    send = [LayoutBuffers.allocate(spec, 2, 3, 4, 16, torch.bfloat16) for _ in range(2)]
    for bufs in send:
        for tensor in bufs.tensors.values():
            tensor.view(torch.uint8).copy_(torch.randint(0, 256, tensor.view(torch.uint8).shape, generator=generator))
    recv = reference.exchange(send)
    for name, (axes, _, _) in buffer_shapes(spec, send[0].shape).items():
        peer = axes.index("peer")
        for dst in range(2):
            for src in range(2):
                got = recv[dst].tensors[name].select(peer, src).view(torch.uint8)
                assert torch.equal(got, send[src].tensors[name].select(peer, dst).view(torch.uint8)), (name, dst, src)


def test_a_generated_module_imports_from_a_folder_on_the_path(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Its spec is parsed again at import; its name read as "a module this environment can import" once its
    # own folder was on sys.path, and the import failed.
    import yaml

    from layoutgen.dcp import FAMILY

    data = {**yaml.safe_load((FAMILY.spec_dir / "vllm_a2a.yaml").read_text()), "name": "zzz_backend_a2a"}
    (tmp_path / "zzz.yaml").write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    code, _, err = run_main(
        ["build", "--spec", str(tmp_path / "zzz.yaml"), "--out", str(out), "--no-verify"], capsys, monkeypatch
    )
    assert code == 0, err
    result = subprocess.run(
        [sys.executable, "-c", "import zzz_backend_a2a; print(zzz_backend_a2a.SPEC.name)"],
        capture_output=True, text=True, check=False, cwd=tmp_path,
        env={**__import__("os").environ, "PYTHONPATH": f"{out}:{Path(__file__).resolve().parent.parent}"},
    )  # fmt: skip
    assert result.returncode == 0 and result.stdout.strip() == "zzz_backend_a2a", result.stderr


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("dcp=some_plugin", ("'dcp' is layoutgen's built-in family", "another name")),
        ("mine=no_such_module_anywhere", ("the module no_such_module_anywhere of family 'mine' does not import",)),
        ("not-a-pair", ("NAME=MODULE pairs",)),
    ],
)
def test_layoutgen_families_problems_are_one_line_bad_input(
    value: str, words: tuple[str, ...], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A built-in family was silently replaced; an import failure read as an internal error (exit 1).
    from layoutgen.settings import settings

    monkeypatch.setenv("LAYOUTGEN_FAMILIES", value)
    monkeypatch.setattr(settings, "_cache", {}, raising=False)
    code, _, err = run_main(["families"], capsys, monkeypatch)
    assert_one_line_error(code, err, "LAYOUTGEN_FAMILIES", *words)


@pytest.mark.parametrize("which", ["database", "journal"])
def test_a_report_never_replaces_the_database_or_the_journal(
    which: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    db, journal = tmp_path / "db", tmp_path / "s.journal"
    report = db / "cpu-interpreter.json" if which == "database" else journal
    args = ["tune", "--interpret", "--spec", "pynccl_a2a", "--db", str(db), "--storage", str(journal)]
    code, _, err = run_main([*args, "--report", str(report)], capsys, monkeypatch)
    assert_one_line_error(code, err, f"--report {report}", "markdown file")
    assert not report.exists()


# ---------------------------------------------------------------------------------------------
# tune --workers K: a signal to the parent alone reaches the workers
# ---------------------------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(word) for word in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except (FileNotFoundError, ProcessLookupError):
        return False


@requires_interpreter
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads the workers' pids from /proc (Linux)")
def test_sigterm_to_the_tuner_alone_stops_its_workers(tmp_path: Path) -> None:
    """`kill PID` (or a job limit signalling the main process only) reached the parent of `--workers 2`, which
    then waited while its workers tuned on; now it passes the signal on, and each worker marks its trials
    interrupted and exits (a second signal, the terminal's Ctrl-C and the parent's, is ignored)."""
    import signal
    import time

    import optuna
    from conftest import default_stop_signals
    from test_hardening_round2 import child_env

    journal = tmp_path / "studies.journal"
    command = [sys.executable, "-m", "layoutgen.cli", "tune", "--interpret", "--spec", "pynccl_a2a", "--kernel",
               "pack", "--shape", "N=2", "--shape", "H=4", "--shape", "D=8", "--bucket", "3", "5", "6", "7", "9",
               "10", "--trials", "12", "--workers", "2", "--storage", str(journal), "--db", str(tmp_path / "db")]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=tmp_path, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_stop_signals,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            workers = _children(process.pid)
            if len(workers) == 2 and journal.exists() and b'"measured"' in journal.read_bytes():
                break
            time.sleep(0.1)
        assert process.poll() is None and len(workers) == 2, "the run ended before its workers measured"
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143 and err.strip().splitlines()[-1].startswith("terminated"), err
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers), "a worker tuned on after its parent was terminated"
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    studies = optuna.get_all_study_summaries(storage)
    # (A trial asked for in the instant the signal landed can stay RUNNING: the next run marks it interrupted,
    # as after a Ctrl-C.)
    finals = [optuna.load_study(study_name=s.study_name, storage=storage).user_attrs.get("final") for s in studies]
    assert not all(finals), "every study was decided: the workers were not stopped"
