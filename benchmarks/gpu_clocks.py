"""The SM clock and board power of one GPU while a benchmark times it, so that a row says at what
clock it ran: a card held at its power limit lowers its clock, and calls timed one at a time need
not run at the clock of the same calls queued back to back after a quiet spin
(results/attention-h100-tapa-gluon.md: cuDNN's forward+backward at 16k at 1612 MHz synced against
1858 queued, both 4k forwards at 1965 MHz either way).

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
from collections import deque


def device_uuid(device: int | None = None) -> str | None:
    """NVML's name ("GPU-<uuid>") of a torch CUDA device (default: the current one), which stays
    right under CUDA_VISIBLE_DEVICES where NVML's indices do not; None where torch has no uuid."""
    import torch

    try:
        props = torch.cuda.get_device_properties(torch.cuda.current_device() if device is None else device)
        return f"GPU-{props.uuid}"
    except (AttributeError, RuntimeError, AssertionError):
        return None


class ClockSampler:
    """Samples one GPU (`gpu`: "GPU-<uuid>" as `device_uuid` gives, else NVML's index 0)."""

    def __init__(self, gpu: str | None = None, period_s: float = 0.01) -> None:
        self.gpu, self.period_s = gpu, period_s
        # (perf_counter, SM MHz, W), the last 2**20 (about three hours at 10 ms)
        self.samples: deque[tuple[float, float, float]] = deque(maxlen=2**20)
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
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def mean(self, t0: float, t1: float) -> tuple[float | None, float | None]:
        """Mean SM MHz and W of the samples that arrived between perf_counter readings t0 and t1,
        widened by one period on each side (a window shorter than the period still gets one)."""
        lo, hi = t0 - self.period_s, t1 + self.period_s
        got = [(mhz, w) for t, mhz, w in list(self.samples) if lo <= t <= hi]
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
            handle = (pynvml.nvmlDeviceGetHandleByUUID(self.gpu) if self.gpu
                      else pynvml.nvmlDeviceGetHandleByIndex(0))
            pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
        except pynvml.NVMLError:   # no driver library or no such device: try nvidia-smi
            return None
        self.source = "nvml"

        def loop() -> None:
            while not self._halt.is_set():
                mhz = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
                try:
                    watts = pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3
                except pynvml.NVMLError:   # a board without a power reading
                    watts = float("nan")
                self.samples.append((time.perf_counter(), float(mhz), watts))
                time.sleep(self.period_s)
        return loop

    def _smi(self):
        cmd = ["nvidia-smi", f"--id={self.gpu or 0}", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
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
