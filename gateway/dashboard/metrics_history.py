"""The last hour of a few of the gateway's own metrics, sampled once a minute, for the overview's sparklines.

Counters are kept as read (cumulative); the series are their per-minute differences. Nothing is stored: the ring
starts empty with the process, like the metrics it reads.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.metrics import MetricWrapperBase

from gateway.metrics import Metrics

logger = logging.getLogger(__name__)

SAMPLE_SECONDS = 60.0
SAMPLES = 61  # an hour of minutes, and the sample the first one is measured from


def metric_value(metric: MetricWrapperBase, sample: str, **labels: str) -> float:
    """The sum of ``metric``'s samples named ``sample`` whose labels include ``labels``."""
    return sum(s.value for family in metric.collect() for s in family.samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


@dataclass(frozen=True, slots=True)
class Sample:
    """The metrics' values at one moment (counters cumulative since the process started)."""

    at: float
    runs: float
    failed: float
    lag_sum: float
    lag_count: float
    outbox: float
    in_flight: float


@dataclass(frozen=True, slots=True)
class ErrorRate:
    """Runs that finished in the window and how many of them failed."""

    finished: int
    failed: int

    @property
    def text(self) -> str:
        """``12.5 %`` of the finished runs, or ``-`` when none finished."""
        return f"{100 * self.failed / self.finished:.1f} %" if self.finished else "-"


class MetricsHistory:
    """A ring of samples; ``run`` samples at start and then every ``interval`` seconds until cancelled."""

    def __init__(self, metrics: Metrics, interval: float = SAMPLE_SECONDS, size: int = SAMPLES,
                 clock: Callable[[], float] = time.time) -> None:
        self.metrics = metrics
        self.interval = interval
        self.clock = clock
        self.samples: deque[Sample] = deque(maxlen=size)

    def read(self) -> Sample:
        """The metrics now."""
        m = self.metrics
        return Sample(self.clock(), metric_value(m.runs, "hermes_runs_total"),
                      metric_value(m.runs, "hermes_runs_total", status="failed"),
                      metric_value(m.loop_lag_histogram, "hermes_event_loop_lag_histogram_seconds_sum"),
                      metric_value(m.loop_lag_histogram, "hermes_event_loop_lag_histogram_seconds_count"),
                      metric_value(m.outbox_depth, "hermes_outbox_depth"),
                      metric_value(m.runs_in_flight, "hermes_runs_in_flight"))

    def sample(self) -> None:
        """Add the metrics now to the ring."""
        self.samples.append(self.read())

    async def run(self) -> None:
        """Sample now and then every interval (an owned task: the dashboard cancels it at shutdown)."""
        while True:
            try:
                self.sample()
            except Exception:  # a metric read must never end the sampler
                logger.exception("dashboard: sampling the metrics failed")
            await asyncio.sleep(self.interval)

    def series(self) -> dict[str, list[float]]:
        """Per interval, the current one so far last: runs finished, runs failed, mean loop lag (ms); and at each
        sample and now: outbox parts pending, runs in flight."""
        points = [*self.samples, self.read()]
        pairs = list(itertools.pairwise(points))
        lag = [1000 * (b.lag_sum - a.lag_sum) / (b.lag_count - a.lag_count) if b.lag_count > a.lag_count else 0.0
               for a, b in pairs]
        return {"runs": [b.runs - a.runs for a, b in pairs], "failed": [b.failed - a.failed for a, b in pairs],
                "loop_lag_ms": lag, "outbox": [s.outbox for s in points],
                "in_flight": [s.in_flight for s in points]}

    def error_rate(self) -> ErrorRate:
        """Failed runs among those finished since the oldest sample (at most an hour ago)."""
        now = self.read()
        base = self.samples[0] if self.samples else Sample(now.at, 0, 0, 0, 0, 0, 0)
        return ErrorRate(int(now.runs - base.runs), int(now.failed - base.failed))


def sparkline(values: list[float], width: int = 120, height: int = 28) -> str:
    """SVG polyline points for ``values`` scaled into ``width`` x ``height`` (the top is the largest value)."""
    if not values:
        return ""
    values = values if len(values) > 1 else values * 2
    top = max(max(values), 1e-9)
    step = width / (len(values) - 1)
    return " ".join(f"{i * step:.1f},{height - 1 - (height - 2) * max(v, 0) / top:.1f}" for i, v in enumerate(values))
