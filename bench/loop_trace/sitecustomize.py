"""Benchmark-only iteration tracer for a gateway subprocess (``bench_loop_lag --trace-iterations``).

Put on ``PYTHONPATH`` with ``HERMES_BENCH_LOOP_TRACE=<file>``, it wraps asyncio's ``_run_once`` (private:
a diagnostic, never loaded by the gateway itself) and appends one JSON line per event-loop iteration whose
callbacks ran over 5 ms: when it ended, on which thread, its callbacks' wall and thread-CPU time, and how many
ran. That tells a loop stalled by one long callback from one running hundreds of short ones. Each thread's
loop is timed on its own (the async tools' bridge loops run on tool threads at the same time).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from asyncio import base_events, events

_PATH = os.environ.get("HERMES_BENCH_LOOP_TRACE")
_THRESHOLD = 0.005

if _PATH and "gateway" in sys.orig_argv:
    _out = open(_PATH, "a", buffering=1)  # noqa: SIM115 (open for the process's life, line-buffered)
    _run = events.Handle._run
    _run_once = base_events.BaseEventLoop._run_once
    _local = threading.local()  # per loop thread: its callbacks' wall, CPU, count in this iteration

    def _traced_run(self: events.Handle) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            _run(self)
        finally:
            current = _local.current
            current[0] += time.perf_counter() - wall
            current[1] += time.thread_time() - cpu
            current[2] += 1

    def _traced_run_once(self: base_events.BaseEventLoop) -> None:
        current = _local.current = [0.0, 0.0, 0.0]
        _run_once(self)
        if current[0] > _THRESHOLD:
            _out.write(json.dumps({"t": time.time(), "thread": threading.current_thread().name,
                                   "wall_ms": round(current[0] * 1000, 2), "cpu_ms": round(current[1] * 1000, 2),
                                   "callbacks": int(current[2])}) + "\n")

    events.Handle._run = _traced_run  # type: ignore[method-assign]
    base_events.BaseEventLoop._run_once = _traced_run_once  # type: ignore[method-assign]
