"""Main-loop watchdog: measures event-loop lag and reports where the loop was stuck.

A coroutine on the loop samples lag (how late a short sleep wakes up) into the
metrics; a thread watches the loop's heartbeat and, when the loop has not beaten
for longer than the threshold, logs the main thread's current stack.
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


class LoopWatchdog:
    """Owns the lag sampler task and the stall-detector thread."""

    def __init__(self, metrics: Metrics, warn_after: float, interval: float = 0.05) -> None:
        self.metrics = metrics
        self.warn_after = warn_after
        self.interval = interval
        self._beat = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._loop_thread_id = threading.get_ident()
        self.max_lag = 0.0

    def start(self) -> None:
        """Start sampling on the running loop and the detector thread."""
        self._loop_thread_id = threading.get_ident()
        self._task = asyncio.create_task(self._sample(), name="loop-watchdog")
        self._thread = threading.Thread(target=self._detect, name="loop-stall-detector", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Stop both."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 2)

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(self.interval)
            lag = max(0.0, loop.time() - before - self.interval)
            self._beat = time.monotonic()
            self.metrics.loop_lag.set(lag)
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
