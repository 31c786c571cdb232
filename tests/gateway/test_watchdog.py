"""The main-loop watchdog: lag histogram on /metrics, adaptive sampling interval, stall report."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import Metrics
from gateway.watchdog import LoopWatchdog

LAG = "hermes_event_loop_lag_histogram_seconds"


def lag_buckets(exposition: str) -> dict[float, float]:
    """Cumulative sample counts of the lag histogram by upper bound (``inf`` included)."""
    family = next(f for f in text_string_to_metric_families(exposition) if f.name == LAG)
    return {float(s.labels["le"]): s.value for s in family.samples if s.name == LAG + "_bucket"}


async def test_a_stall_lands_in_the_top_buckets_and_on_metrics(make_gateway) -> None:
    h = await make_gateway()
    await asyncio.sleep(0.1)  # a few samples first
    time.sleep(0.12)  # the stall under test; the next sample is due within 50 ms of its start
    await asyncio.sleep(0.06)
    async with h.http.get(f"{h.base_url}/metrics") as r:
        exposition = await r.text()
    buckets = lag_buckets(exposition)
    assert buckets[float("inf")] >= 2
    assert buckets[float("inf")] - buckets[0.05] >= 1, buckets  # at least 70 ms of the stall left after a due time
    assert buckets[0.001] >= 1  # the quiet samples before it
    # Parsed, not searched for "... 0.0": a max of 0.07 s starts with that text too.
    [lag_max] = [s.value for f in text_string_to_metric_families(exposition) for s in f.samples
                 if s.name == "hermes_event_loop_lag_max_seconds"]
    assert lag_max > 0.05, lag_max  # the stall sample above
    assert "hermes_event_loop_lag_seconds " in exposition  # the documented gauges stay


async def test_samples_every_5_ms_while_busy_and_every_50_ms_while_idle() -> None:
    metrics = Metrics()
    watchdog = LoopWatchdog(metrics, warn_after=10.0)
    watchdog.start()

    def samples() -> float:
        return metrics.registry.get_sample_value(LAG + "_count") or 0.0

    try:
        await asyncio.sleep(0.1)
        before = samples()
        await asyncio.sleep(0.5)
        idle = samples() - before
        before, end = samples(), time.perf_counter() + 0.5
        while time.perf_counter() < end:  # the process busy in 1 ms slices, the loop free in between
            spin = time.perf_counter() + 0.001
            while time.perf_counter() < spin:
                pass
            await asyncio.sleep(0)
        busy = samples() - before
    finally:
        await watchdog.stop()
    assert 5 <= idle <= 13, idle
    assert busy >= 40, busy


async def test_a_stall_longer_than_the_threshold_logs_the_loop_stack(caplog: pytest.LogCaptureFixture) -> None:
    watchdog = LoopWatchdog(Metrics(), warn_after=0.05)
    watchdog.start()
    try:
        with caplog.at_level(logging.WARNING, logger="gateway.watchdog"):
            await asyncio.sleep(0.06)
            time.sleep(0.2)  # the stall under test
            await asyncio.sleep(0.01)
    finally:
        await watchdog.stop()
    warning = next(r.getMessage() for r in caplog.records if "event loop blocked" in r.getMessage())
    assert "test_a_stall_longer_than_the_threshold_logs_the_loop_stack" in warning
