"""GPU clocks, power and temperature, sampled by `nvidia-smi` in the background while a benchmark runs.

Small kernels are a launch plus a memory latency, and both scale with the clocks the GPU runs at, which
it chooses itself (idle 345 MHz, up to 1980 MHz on the H200).  A benchmark that records the clocks next
to its timings can tell a faster kernel from a faster GPU.  Nothing here changes a clock (the lent GPUs'
settings must be left alone); `nvidia-smi` only reads them.

    with ClockSampler() as clocks:
        start = time.time(); ...; end = time.time()
        clocks.window(start, end)  # {"sm_mhz": ..., "mem_mhz": ..., "power_w": ..., "temp_c": ..., "samples": n}
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import threading
import time
from typing import Any

FIELDS = ("sm_mhz", "mem_mhz", "power_w", "temp_c")
QUERY = "clocks.sm,clocks.mem,power.draw,temperature.gpu"
INTERVAL_MS = 20


class ClockSampler:
    """Samples the visible GPU every INTERVAL_MS milliseconds in a background `nvidia-smi` process."""

    def __init__(self, interval_ms: int = INTERVAL_MS) -> None:
        self.interval_ms = interval_ms
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.problem: str | None = None
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> ClockSampler:
        executable = shutil.which("nvidia-smi")
        if executable is None:
            self.problem = "nvidia-smi not found"
            return self
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
        command = [executable, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", f"-lms={self.interval_ms}"]
        self._process = subprocess.Popen(
            [*command, f"--id={visible}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        process = self._process
        if process is None or process.stdout is None:
            return
        for line in process.stdout:
            values = [part.strip() for part in line.split(",")]
            try:
                numbers = [float(value) for value in values]
            except ValueError:
                continue  # "[N/A]" for a field this GPU does not report
            if len(numbers) == len(FIELDS):
                self.samples.append((time.time(), dict(zip(FIELDS, numbers, strict=True))))
        if process.poll() not in (None, 0) and not self.samples and process.stderr is not None:
            self.problem = process.stderr.read().strip() or "nvidia-smi exited"

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=10)

    def window(self, start: float, end: float) -> dict[str, Any]:
        """Medians of the samples taken between two `time.time()` readings (the nearest sample if none)."""
        inside = [values for moment, values in self.samples if start <= moment <= end]
        if not inside and self.samples:
            middle = (start + end) / 2
            inside = [min(self.samples, key=lambda sample: abs(sample[0] - middle))[1]]
        if not inside:
            return {"samples": 0, "problem": self.problem or "no samples"}
        summary: dict[str, Any] = {name: statistics.median(v[name] for v in inside) for name in FIELDS}
        summary["sm_mhz_min"] = min(v["sm_mhz"] for v in inside)
        summary["samples"] = len(inside)
        return summary
