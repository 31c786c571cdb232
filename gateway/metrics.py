"""Prometheus metrics, one registry per gateway instance (so several can share a process in tests)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# Loop lag: steps of 1, 1.5, 2, 3, 5, 7 per decade from 0.1 ms to 1 s (a percentile lies within a bucket at most
# 1.7x wide), then 2 and 5 s.
LOOP_LAG_BUCKETS = (0.0001, 0.00015, 0.0002, 0.0003, 0.0005, 0.0007, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.007,
                    0.01, 0.015, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 1, 2, 5)


class Metrics:
    """The gateway's metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events = Counter("hermes_events_total", "Inbound events by platform and outcome",
                              ["platform", "outcome"], registry=r)
        self.runs = Counter("hermes_runs_total", "Finished runs by kind and status", ["kind", "status"], registry=r)
        self.run_latency = Histogram("hermes_run_seconds", "Run duration (start to finish)", ["kind"],
                                     buckets=_LATENCY_BUCKETS, registry=r)
        self.model_latency = Histogram("hermes_model_call_seconds", "Model call latency",
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self.model_errors = Counter("hermes_model_errors_total", "Model call failures by error type", ["error"],
                                    registry=r)
        self.tool_latency = Histogram("hermes_tool_call_seconds", "Tool call latency by tool", ["tool"],
                                      buckets=_LATENCY_BUCKETS, registry=r)
        self.outbox_depth = Gauge("hermes_outbox_depth", "Undelivered message parts", registry=r)
        self.deliveries = Counter("hermes_deliveries_total", "Delivery attempts by platform and outcome",
                                  ["platform", "outcome"], registry=r)
        self.leader = Gauge("hermes_leader", "1 while this replica is the elected leader (always 1 on SQLite)",
                            registry=r)
        self.agent_workers = Gauge("hermes_agent_workers", "Agent worker processes ready for runs' loops",
                                   registry=r)
        self.agent_worker_restarts = Counter("hermes_agent_worker_restarts_total",
                                             "Agent worker processes replaced after they died", registry=r)
        self.runs_in_flight = Gauge("hermes_runs_in_flight", "Runs executing now", ["kind"], registry=r)
        self.loop_lag = Gauge("hermes_event_loop_lag_seconds", "Main event loop lag (last sample)", registry=r)
        self.loop_lag_max = Gauge("hermes_event_loop_lag_max_seconds", "Largest main loop lag since start",
                                  registry=r)
        self.loop_lag_histogram = Histogram("hermes_event_loop_lag_histogram_seconds",
                                            "Main event loop lag, every sample (how late a timer fires)",
                                            buckets=LOOP_LAG_BUCKETS, registry=r)
        self.cron_jobs = Gauge("hermes_cron_jobs", "Cron jobs by state", ["state"], registry=r)
        self.cron_fires = Counter("hermes_cron_fires_total", "Cron fires claimed, by trigger "
                                  "(scheduled, catch_up after downtime, manual)", ["trigger"], registry=r)
        self.cron_misfires = Counter("hermes_cron_misfires_total", "Cron jobs that missed fire times, by outcome "
                                     "(ran_once, skipped, expired)", ["action"], registry=r)
        self.cron_failures = Counter("hermes_cron_failures_total", "Failed cron runs", registry=r)
        self.cron_fire_lag = Histogram("hermes_cron_fire_lag_seconds", "Scheduled fire time to claimed fire",
                                       buckets=_LATENCY_BUCKETS, registry=r)

    def watch_sandbox(self, stats: Callable[[], Mapping[str, Any]]) -> None:
        """Export the tool sandbox's counters (``SandboxPool.stats``), read at every scrape."""
        self.registry.register(_SandboxCollector(stats))

    def watch_admission(self, limits: Callable[[], Iterable[tuple[str, int, int, int]]]) -> None:
        """Export admission control's limits (gateway/admission.py) as (kind, limit, in flight, waiting), read at
        every scrape."""
        self.registry.register(_AdmissionCollector(limits))

    def render(self) -> bytes:
        """Prometheus text exposition."""
        return generate_latest(self.registry)


class _SandboxCollector(Collector):
    """The sandbox pool keeps its own counts (it lives below the gateway); this reads them at scrape time."""

    def __init__(self, stats: Callable[[], Mapping[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        calls = CounterMetricFamily("hermes_sandbox_calls", "Sandboxed tool calls by outcome", labels=["outcome"])
        for outcome, count in sorted(stats["calls"].items()):
            calls.add_metric([outcome], count)
        yield calls
        yield CounterMetricFamily("hermes_sandbox_workers_started", "Sandbox workers started",
                                  value=stats["started"])
        yield CounterMetricFamily("hermes_sandbox_workers_killed", "Sandbox workers killed at a limit or cancel",
                                  value=stats["killed"])
        yield GaugeMetricFamily("hermes_sandbox_workers_idle", "Sandbox workers waiting for a call",
                                value=stats["idle"])


class _AdmissionCollector(Collector):
    """Admission control's limits change every interval and its routes' limits come and go: read them at scrape
    time."""

    def __init__(self, limits: Callable[[], Iterable[tuple[str, int, int, int]]]) -> None:
        self._limits = limits

    def collect(self) -> Iterator[Metric]:
        kinds = "by kind (chat, cron, webhook: all routes, webhook:<route>)"
        families = [GaugeMetricFamily("hermes_admission_limit", f"Runs allowed at once now, {kinds}", labels=["kind"]),
                    GaugeMetricFamily("hermes_admission_in_flight", f"Runs holding a slot, {kinds}", labels=["kind"]),
                    GaugeMetricFamily("hermes_admission_waiting", f"Runs waiting for a slot, {kinds}",
                                      labels=["kind"])]
        for kind, *values in self._limits():
            for family, value in zip(families, values, strict=True):
                family.add_metric([kind], value)
        yield from families
