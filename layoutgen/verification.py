"""`layoutgen build`'s verification of generated modules against their families' references, in a child process.

A kernel that reads or writes far outside its buffers does not raise: under the Triton interpreter it can
crash the process (SIGSEGV), on a GPU it leaves the CUDA context unusable for every later kernel.  So the
modules are verified in a child (`python -m layoutgen.verification PATH ...`), one after another; a module
whose verification kills the child is reported as failed, naming the signal, and a fresh child goes on with
the ones after it.  A family's `verify` that raises fails its module with the exception's message.

The child writes one protocol line per event on stdout (anything else a family prints passes through); its
stderr reaches the parent's stderr once it ends, or, when it died, the failure of the module it was on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, cast

from layoutgen.family import Check, VerifyReport

#: Starts every protocol line of the child (a unit separator, then a word no family prints).
MARK = "\x1flayoutgen-verification "
#: The last stderr lines a crash report quotes.
STDERR_LINES = 12
#: The family of a report whose module never loaded (no offline compile follows for it).
UNKNOWN_FAMILY = "?"


def verify_path(path: Path, device: str) -> VerifyReport:
    """Load one generated module and run its family's `verify`; an exception fails the module (the spec name is
    the file's stem when the module did not load)."""
    from layoutgen.family import get_family
    from layoutgen.loader import load_path

    spec: Any = None
    try:
        with warnings.catch_warnings():
            # The interpreter's numpy log(0) for all-empty rows is the contract (-inf), not a fault.
            warnings.simplefilter("ignore", RuntimeWarning)
            module = load_path(path)
            spec = module.SPEC
            return get_family(spec.family).verify(module, device)
    except Exception as error:
        name = path.stem if spec is None else spec.name
        message = f"{name}: verification raised {type(error).__name__}: {error}"
        return VerifyReport(name, UNKNOWN_FAMILY if spec is None else spec.family, (Check("(all)", False, message),),
                            (message,))  # fmt: skip


def report_to_json(report: VerifyReport) -> dict[str, Any]:
    return dataclasses.asdict(report)


def report_from_json(data: dict[str, Any]) -> VerifyReport:
    checks = tuple(Check(str(c["kernel"]), bool(c["passed"]), str(c["detail"])) for c in data["checks"])
    return VerifyReport(str(data["spec_name"]), str(data["family"]), checks, tuple(map(str, data["failures"])))


def crashed_report(path: Path, returncode: int, stderr_tail: str) -> VerifyReport:
    """The report of a module whose verification ended the child process."""
    if returncode >= 0:
        how = f"exit status {returncode}"
    else:
        try:
            how = f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"signal {-returncode}"
        how += "; a kernel that reads or writes outside its buffers can do this"
    message = f"{path.stem}: the verification process died ({how})"
    detail = f"{message}; its last output:\n{stderr_tail}" if stderr_tail else message
    return VerifyReport(path.stem, UNKNOWN_FAMILY, (Check("(all)", False, message),), (detail,))


def _emit(kind: str, value: Any) -> None:
    sys.stdout.write(f"{MARK}{json.dumps({kind: value})}\n")
    sys.stdout.flush()


def main(arguments: list[str]) -> int:
    """The child: pick the device (CUDA, else the Triton interpreter on the CPU), then verify each path."""
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # before any module's kernels are defined
    device = "cuda" if torch.cuda.is_available() else "cpu"
    _emit("device", device)
    for argument in arguments:  # a child that dies was on the module after its last report
        _emit("report", report_to_json(verify_path(Path(argument), device)))
    return 0


def _run_child(paths: list[Path], on_device: Callable[[str], None]) -> tuple[list[VerifyReport], int, str]:
    """One child over `paths`: the reports it finished, its return code and its stderr."""
    from layoutgen.tuning.compile import child_environment

    environment = {**os.environ, **child_environment()}
    command = [sys.executable, "-m", "layoutgen.verification", *map(str, paths)]
    reports: list[VerifyReport] = []
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as stderr:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=environment)
        try:
            for line in cast(IO[str], child.stdout):  # a pipe: stdout=PIPE
                if not line.startswith(MARK):
                    sys.stdout.write(line)  # what a family's code printed
                    continue
                event = json.loads(line[len(MARK) :])
                if "device" in event:
                    on_device(str(event["device"]))
                elif "report" in event:
                    reports.append(report_from_json(event["report"]))
            returncode = child.wait()
        except BaseException:
            child.kill()  # an interrupt of the build ends its verification too
            child.wait()
            raise
        stderr.seek(0)
        return reports, returncode, stderr.read()


def verify_in_subprocess(paths: list[Path], on_device: Callable[[str], None]) -> list[VerifyReport]:
    """Each path's report, in order, from as many children as crashes need (`on_device` hears the device once)."""
    heard: list[str] = []

    def device_once(device: str) -> None:
        if not heard:
            heard.append(device)
            on_device(device)

    reports: list[VerifyReport] = []
    while len(reports) < len(paths):
        remaining = paths[len(reports) :]
        finished, returncode, stderr = _run_child(remaining, device_once)
        reports += finished
        if len(finished) == len(remaining):
            sys.stderr.write(stderr)
            break
        tail = "\n".join(stderr.strip().splitlines()[-STDERR_LINES:])
        if not heard:  # died before verifying anything: every module would do the same
            return reports + [crashed_report(path, returncode, tail) for path in remaining]
        reports.append(crashed_report(remaining[len(finished)], returncode, tail))
    return reports


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
