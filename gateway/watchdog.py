"""Main-loop watchdog: measures event-loop lag and reports where the loop was stuck.

A timer callback on the loop samples lag (how late a timer fires) into the metrics: every sample
into a histogram, the last one and the largest into gauges. It samples every 5 ms while the process
is busy (tool threads included: they contend for the GIL) and every 50 ms while it is idle, where
each extra wake-up would only cost CPU: on the 2-core benchmark VM an idle gateway uses 0.3-0.4 % of
a core with this sampler, as with a fixed 50 ms one, and 2.3-3 % with a fixed 5 ms one. A stall
shows up as the lag of the sample that came due during it (the part of the stall after that due
time). Lag includes the loop's timer granularity: epoll waits in whole milliseconds, so on a busy
loop a timer may fire up to 1 ms late.

A thread watches the loop's heartbeat and, when the loop has not beaten for longer than the
threshold, logs the main thread's current stack.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback

from gateway.metrics import Metrics

logger = logging.getLogger(__name__)


BUSY_INTERVAL = 0.005
IDLE_INTERVAL = 0.05
# Busy: the process used more CPU than this share of one core since the last sample (a 5 ms sampler
# alone uses about 2 %).
BUSY_CPU_SHARE = 0.05


class LoopWatchdog:
    """Owns the lag sampler (a timer callback that re-arms itself) and the stall-detector thread."""

    def __init__(self, metrics: Metrics, warn_after: float, busy_interval: float = BUSY_INTERVAL,
                 idle_interval: float = IDLE_INTERVAL) -> None:
        self.metrics = metrics
        self.warn_after = warn_after
        self.busy_interval = busy_interval
        self.idle_interval = idle_interval
        self._beat = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due = self._last = self._cpu = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._loop_thread_id = threading.get_ident()
        self.max_lag = 0.0

    def start(self) -> None:
        """Start sampling on the running loop and the detector thread."""
        self._loop_thread_id = threading.get_ident()
        self._loop = asyncio.get_running_loop()
        self._last, self._cpu = self._loop.time(), time.process_time()
        self._due = self._last + self.busy_interval
        self._timer = self._loop.call_at(self._due, self._tick)
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
        self._due = now + (self.busy_interval if busy else self.idle_interval)
        self._timer = self._loop.call_at(self._due, self._tick)
        self._beat = time.monotonic()
        self.metrics.loop_lag.set(lag)
        self.metrics.loop_lag_histogram.observe(lag)
        if lag > self.max_lag:
            self.max_lag = lag
            self.metrics.loop_lag_max.set(lag)

    def _detect(self) -> None:
        reported = False
        while not self._stop.wait(self.warn_after / 2):
            stalled = time.monotonic() - self._beat
            if stalled > self.warn_after and not reported:
                frame = sys._current_frames().get(self._loop_thread_id)
                stack = "".join(traceback.format_stack(frame)) if frame else "(no frame)"
                logger.warning("event loop blocked for %.0f ms; main thread stack:\n%s", stalled * 1000, stack)
                reported = True
            elif stalled <= self.warn_after:
                reported = False
