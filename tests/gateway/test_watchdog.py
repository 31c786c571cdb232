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


async def _stalls(watchdog: LoopWatchdog, *seconds: float) -> None:
    """Run the watchdog through stalls of these lengths (blocking the loop), each followed by a quiet moment."""
    watchdog.start()
    try:
        await asyncio.sleep(0.06)
        for stall in seconds:
            time.sleep(stall)
            await asyncio.sleep(0.1)  # the detector sees the loop back within warn_after / 2
    finally:
        await watchdog.stop()


def _reports(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gateway.watchdog"]


async def test_the_first_stall_is_one_line_naming_its_length_and_place(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.watchdog"):
        await _stalls(LoopWatchdog(Metrics(), warn_after=0.05), 0.2)
    [report] = _reports(caplog)
    assert "\n" not in report, report
    assert report.startswith("event loop blocked for "), report
    # the whole stall past the sample's due time (not the 50 ms after which it was noticed), and where it was
    millis = int(report.split()[4])
    assert 150 <= millis < 1000, report
    assert "tests/gateway/test_watchdog.py:" in report and "in _stalls" in report, report
    assert "(gateway.loop_lag_warn_ms: 50)" in report


async def test_a_repeated_stall_logs_the_loop_stack(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.watchdog"):
        await _stalls(LoopWatchdog(Metrics(), warn_after=0.05), 0.2, 0.2)
    first, second = _reports(caplog)
    assert "stack" not in first
    assert "stall 2, main thread stack:\n" in second and "time.sleep(stall)" in second, second


async def test_at_debug_the_first_stall_has_its_stack(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="gateway.watchdog"):
        await _stalls(LoopWatchdog(Metrics(), warn_after=0.05), 0.2)
    [report] = _reports(caplog)
    assert "stall 1, main thread stack:\n" in report and "test_watchdog.py" in report


async def test_an_idle_loop_is_no_stall_below_the_idle_interval(caplog: pytest.LogCaptureFixture) -> None:
    # A threshold under the 50 ms idle sampling interval: the loop waiting in select is not blocked.
    with caplog.at_level(logging.WARNING, logger="gateway.watchdog"):
        await _stalls(LoopWatchdog(Metrics(), warn_after=0.04), 0.0, 0.0, 0.0)
    assert _reports(caplog) == []


async def test_a_hang_is_reported_with_its_stack_before_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.watchdog"):
        started = time.time()
        await _stalls(LoopWatchdog(Metrics(), warn_after=0.05, hang_after=0.3), 0.6)
        ended = time.time()
    hang, end = (r for r in caplog.records if r.name == "gateway.watchdog")
    assert "so far" in hang.getMessage() and "main thread stack:\n" in hang.getMessage()
    assert started + 0.3 <= hang.created < started + 0.06 + 0.6 <= ended  # logged while the loop was stuck
    assert "stack" not in end.getMessage() and "event loop blocked for" in end.getMessage()
