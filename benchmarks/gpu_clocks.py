"""The SM clock and board power of one GPU while a benchmark times it, so that a row says at what
clock it ran: a card held at its power limit lowers its clock, and a kernel that draws more power
(tensor and special-function pipes busy together) loses more of it; a call timed from an idle GPU
and the same calls queued back to back right after a quiet spin do not run at the same clock.

`ClockSampler` samples in a thread, through NVML (`pynvml`, one query per period) where it
imports, else through one long-lived `nvidia-smi --loop-ms` process; each sample is stamped with
`time.perf_counter()` on arrival, and `mean(t0, t1)` averages those taken between two readings of
that clock. The power is the board's reading, which NVML averages over about the last second on
recent cards (its `nvmlDeviceGetPowerUsage`): a window shorter than that reads between the draw
and what came before. Without either source it stays inactive and `mean` gives (None, None).
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time


class ClockSampler:
    def __init__(self, index: int = 0, period_s: float = 0.01) -> None:
        self.index, self.period_s = index, period_s
        self.samples: list[tuple[float, float, float]] = []   # (perf_counter, SM MHz, W)
        self.source: str | None = None
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None

    def start(self) -> ClockSampler:
        target = self._nvml() or self._smi()
        if target is not None:
            self._thread = threading.Thread(target=target, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=5)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def mean(self, t0: float, t1: float) -> tuple[float | None, float | None]:
        """Mean SM MHz and W of the samples that arrived between perf_counter readings t0 and t1."""
        got = [(mhz, w) for t, mhz, w in list(self.samples) if t0 <= t <= t1]
        if not got:
            return None, None
        return statistics.fmean(m for m, _ in got), statistics.fmean(w for _, w in got)

    def _nvml(self):
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
        except pynvml.NVMLError:   # no driver library or no such device: try nvidia-smi
            return None
        self.source = "nvml"

        def loop() -> None:
            while not self._halt.is_set():
                mhz = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
                watts = pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3
                self.samples.append((time.perf_counter(), float(mhz), watts))
                time.sleep(self.period_s)
        return loop

    def _smi(self):
        cmd = ["nvidia-smi", f"--id={self.index}", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
               f"--loop-ms={max(1, round(self.period_s * 1e3))}"]
        try:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return None
        self.source = "nvidia-smi"

        def loop() -> None:
            for line in self._proc.stdout:
                try:
                    mhz, watts = (float(x) for x in line.split(","))
                except ValueError:   # "[N/A]" or a partial line
                    continue
                self.samples.append((time.perf_counter(), mhz, watts))
        return loop
