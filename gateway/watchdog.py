"""Main-loop watchdog: measures event-loop lag and reports where the loop was stuck.

A timer callback on the loop samples lag (how late a timer fires) into the metrics: every sample
into a histogram, the last one and the largest into gauges. It samples every 5 ms while the process
is busy (tool threads included: they contend for the GIL) and every 50 ms while it is idle, where
each extra wake-up would only cost CPU: on the 2-core benchmark VM an idle gateway uses 0.3-0.4 % of
a core with this sampler, as with a fixed 50 ms one, and 2.3-3 % with a fixed 5 ms one. A stall
shows up as the lag of the sample that came due during it (the part of the stall after that due
time). Lag includes the loop's timer granularity: epoll waits in whole milliseconds, so on a busy
loop a timer may fire up to 1 ms late.

A thread watches how late the next sample is. When it is later than the threshold, the thread takes
the main thread's stack then (while the loop is still stuck) and, once the loop is back, logs one line:
how long the stall was and where (the innermost frame of the gateway's own code). The whole stack follows
only from the second stall on (a stall that repeats is worth reading), or at DEBUG; a stall that goes on
for ``hang_after`` seconds (default 5) is reported with its stack at once, without waiting for its end.

The samples are also kept in a bounded window: ``lag_p99()`` gives admission control (gateway/admission.py)
the 99th percentile since its last call.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from gateway.metrics import Metrics

logger = logging.getLogger(__name__)


BUSY_INTERVAL = 0.005
IDLE_INTERVAL = 0.05
# Busy: the process used more CPU than this share of one core since the last sample (a 5 ms sampler
# alone uses about 2 %).
BUSY_CPU_SHARE = 0.05
HANG_AFTER = 5.0
WINDOW = 4096  # lag samples kept for lag_p99(): 20 s of a busy loop
_ROOT = str(Path(__file__).resolve().parent.parent)


@dataclass(slots=True)
class _Stall:
    """A stall in progress: where the loop was when the detector saw it, and whether a hang was reported."""

    where: str
    stack: str
    hang_reported: bool = False


def _where(frame: FrameType | None) -> str:
    """The innermost frame of the gateway's own code (else the innermost one) as ``path:line in function``."""
    summary = traceback.extract_stack(frame) if frame else []
    ours = [f for f in summary if f.filename.startswith(_ROOT) and "site-packages" not in f.filename]
    if not (ours or summary):
        return "(no frame)"
    f = (ours or summary)[-1]
    return f"{f.filename.removeprefix(_ROOT + '/')}:{f.lineno} in {f.name}"


class LoopWatchdog:
    """Owns the lag sampler (a timer callback that re-arms itself) and the stall-detector thread."""

    def __init__(self, metrics: Metrics, warn_after: float, busy_interval: float = BUSY_INTERVAL,
                 idle_interval: float = IDLE_INTERVAL, hang_after: float = HANG_AFTER) -> None:
        self.metrics = metrics
        self.warn_after = warn_after
        self.hang_after = hang_after
        self.busy_interval = busy_interval
        self.idle_interval = idle_interval
        self._deadline = time.monotonic() + busy_interval  # when the next sample is due, as the detector sees it
        self._stall_lag = 0.0  # the lag of the last sample later than warn_after
        self._stalls = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due = self._last = self._cpu = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._loop_thread_id = threading.get_ident()
        self.max_lag = 0.0
        self._window: deque[float] = deque(maxlen=WINDOW)

    def start(self) -> None:
        """Start sampling on the running loop and the detector thread."""
        self._loop_thread_id = threading.get_ident()
        self._loop = asyncio.get_running_loop()
        self._last, self._cpu = self._loop.time(), time.process_time()
        self._due = self._last + self.busy_interval
        self._timer = self._loop.call_at(self._due, self._tick)
        self._deadline = time.monotonic() + self.busy_interval
        self._thread = threading.Thread(target=self._detect, name="loop-stall-detector", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Stop both."""
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 2)

    def _tick(self) -> None:
        assert self._loop is not None
        now, cpu = self._loop.time(), time.process_time()
        lag = max(0.0, now - self._due)
        busy = cpu - self._cpu > BUSY_CPU_SHARE * (now - self._last)
        self._last, self._cpu = now, cpu
        interval = self.busy_interval if busy else self.idle_interval
        self._due = now + interval
        self._timer = self._loop.call_at(self._due, self._tick)
        if lag > self.warn_after:
            self._stall_lag = lag  # before the deadline moves: the detector reads it once the stall is over
        self._deadline = time.monotonic() + interval
        self.metrics.loop_lag.set(lag)
        self.metrics.loop_lag_histogram.observe(lag)
        self._window.append(lag)
        if lag > self.max_lag:
            self.max_lag = lag
            self.metrics.loop_lag_max.set(lag)

    def lag_p99(self) -> float | None:
        """The 99th percentile of the lag samples since the last call (None: no sample yet); starts a new window."""
        samples = sorted(self._window)
        self._window.clear()
        return samples[math.ceil(0.99 * len(samples)) - 1] if samples else None

    def _detect(self) -> None:
        stall: _Stall | None = None
        while not self._stop.wait(self.warn_after / 2):
            late = time.monotonic() - self._deadline
            if late > self.warn_after:
                if stall is None:
                    frame = sys._current_frames().get(self._loop_thread_id)
                    stack = "".join(traceback.format_stack(frame)) if frame else "(no frame)"
                    stall = _Stall(_where(frame), stack)
                    self._stall_lag = 0.0
                elif late > self.hang_after and not stall.hang_reported:
                    logger.warning("event loop blocked for %.1f s so far at %s; main thread stack:\n%s", late,
                                   stall.where, stall.stack)
                    stall.hang_reported = True
            elif stall is not None:
                self._report(stall, max(self._stall_lag, self.warn_after))
                stall = None

    def _report(self, stall: _Stall, seconds: float) -> None:
        """One line for the first stall; the stack too when stalls repeat (or at DEBUG)."""
        self._stalls += 1
        line = (f"event loop blocked for {seconds * 1000:.0f} ms at {stall.where} "
                f"(gateway.loop_lag_warn_ms: {self.warn_after * 1000:.0f})")
        if (self._stalls > 1 or logger.isEnabledFor(logging.DEBUG)) and not stall.hang_reported:
            logger.warning("%s; stall %d, main thread stack:\n%s", line, self._stalls, stall.stack)
        else:
            logger.warning("%s", line)
