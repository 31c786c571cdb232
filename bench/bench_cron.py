"""Cron scheduler benchmark: loading jobs at startup, and fire lag with every job due at once.

Each figure is measured against a baseline from the same run: startup with no jobs, and one job
firing alone. Fire lag is the time from a job's scheduled fire time until its claim is committed to
the inbox, taken from the scheduler's own "fired" log record (written right after the claim). Two
bursts: jobs due at whole seconds spread over one minute (the target, p99 < 1 s), and every job due
at the same second (the worst case, e.g. a thousand "daily at 09:00" jobs). Each fire's run goes
through the scripted model and is delivered to a chat double, competing with later claims for the
event loop and the database; the store is SQLite in a temporary directory.

    python -m bench.bench_cron [--jobs 1000] [--window 60] [--lead 3]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: python bench/bench_cron.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ChatDouble, latency_ms, print_table, ratio, save_results
from gateway.app import Gateway
from gateway.config import parse_config
from gateway.cron_store import CronStore
from gateway.sim.model_server import ScriptedModel
from gateway.store import Store
from tools.cronjob_tools import CronJob, Schedule, first_fire, resolve_timezone

_ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo")


class _ClaimLog(logging.Handler):
    """Collects the time of every claimed scheduled fire from gateway.cron's log."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lags: list[float] = []
        self._logger = logging.getLogger("gateway.cron")
        self._level = self._logger.level
        self._logger.setLevel(logging.INFO)
        self._logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the lag of every "fired ... (scheduled)" record."""
        args = record.args
        if isinstance(args, tuple) and record.msg.startswith("cron job %s fired") and args[2] == "scheduled":
            self.lags.append(record.created - datetime.fromisoformat(str(args[1])).timestamp())

    def close(self) -> None:
        """Detach from the logger."""
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)
        super().close()


def _config(home: Path, model_url: str) -> Any:
    return parse_config({
        "model": {"base_url": model_url, "api_key": "bench", "name": "scripted-model", "max_retries": 0,
                  "stream": False},
        "http": {"host": "127.0.0.1", "port": 0},
        "store": {"url": f"sqlite:///{home}/state.db"},
        "gateway": {"workspace": str(home / "workspace"), "loop_lag_warn_ms": 5000},
        "cron": {"max_jobs_per_user": 100_000},
        "logging": {"level": "WARNING"},
    }, env={"HERMES_GATEWAY_HOME": str(home)})


def _job(n: int, schedule: Schedule, zone: str, now: datetime) -> CronJob:
    return CronJob(id=f"b{n:06d}{secrets.token_hex(2)}", owner=f"telegram:{n % 50}", prompt=f"bench job {n}",
                   schedule=schedule, timezone=zone, origin_platform="telegram", origin_chat_id=str(n % 50),
                   next_fire_at=first_fire(schedule, resolve_timezone(zone), now), created_at=now, updated_at=now)


def _recurring(count: int, now: datetime) -> list[CronJob]:
    """A realistic mix: daily and weekday crontabs in several zones, and hourly intervals."""
    jobs = []
    for n in range(count):
        zone = _ZONES[n % len(_ZONES)]
        if n % 3 == 2:
            schedule = Schedule("interval", seconds=3600, start=(now + timedelta(minutes=30 + n % 29)).replace(
                microsecond=0))
        else:
            schedule = Schedule("cron", expr=f"{n % 60} {n % 24} * * {'1-5' if n % 2 else '*'}")
        jobs.append(_job(n, schedule, zone, now))
    return jobs


async def _insert(home: Path, jobs: list[CronJob]) -> None:
    store = await Store.open(f"sqlite:///{home}/state.db")
    try:
        await CronStore(store).insert_many(jobs)
    finally:
        await store.close()


async def _started(home: Path, model: ScriptedModel) -> tuple[Gateway, float]:
    gateway = Gateway(_config(home, model.base_url), adapters={"telegram": ChatDouble()})
    await gateway.start()
    assert gateway.cron is not None
    return gateway, gateway.cron.load_seconds


async def _load(count: int, tmp: Path, model: ScriptedModel) -> dict[str, float]:
    """Milliseconds the scheduler needs to load jobs at startup: none, then ``count``."""
    out: dict[str, float] = {}
    for label, n in (("baseline_0_jobs", 0), (f"{count}_jobs", count)):
        home = tmp / f"load-{n}"
        home.mkdir()
        await _insert(home, _recurring(n, datetime.now(UTC)))
        gateway, seconds = await _started(home, model)
        await gateway.stop(drain_timeout=1)
        out[label] = seconds * 1000
    return out


async def _burst(count: int, window: int, lead: float, tmp: Path, model: ScriptedModel) -> dict[str, Any]:
    """Fire ``count`` one-shot jobs due at whole seconds spread over ``window`` seconds."""
    home = tmp / f"burst-{count}-{window}"
    home.mkdir()
    first = (datetime.now(UTC) + timedelta(seconds=lead)).replace(microsecond=0)
    now = datetime.now(UTC)
    await _insert(home, [_job(n, Schedule("once", at=first + timedelta(seconds=n * window // count)), "UTC", now)
                         for n in range(count)])
    last = first + timedelta(seconds=(count - 1) * window // count)
    claims = _ClaimLog()
    gateway, _ = await _started(home, model)
    store = gateway.store
    assert store is not None
    try:
        deadline = time.monotonic() + lead + window + 120
        while len(claims.lags) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        while await store.count_runs("completed") < count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        drained = time.time() - last.timestamp()
        return {"jobs": count, "window_s": window, "claimed": len(claims.lags),
                "runs_completed": await store.count_runs("completed"),
                "drained_after_last_due_s": round(drained, 2), **latency_ms(claims.lags)}
    finally:
        claims.close()
        await gateway.stop(drain_timeout=1)


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    model = ScriptedModel(lambda request: "ok")
    await model.start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-cron-") as tmp_dir:
            tmp = Path(tmp_dir)
            load = await _load(args.jobs, tmp, model)
            alone = await _burst(1, 0, args.lead, tmp, model)
            minute = await _burst(args.jobs, args.window, args.lead, tmp, model)
            second = await _burst(args.jobs, 0, args.lead, tmp, model)
    finally:
        await model.stop()
    return {"load_ms": load, "fire_lag": {"baseline_1_job": alone, "same_minute": minute, "same_second": second},
            "target": {"fire_lag_p99_ms": 1000, "scenario": "same_minute", "met": minute["p99_ms"] < 1000}}


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark, print the tables and write ``bench/results/cron.json``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs to load and to fire at once")
    parser.add_argument("--window", type=int, default=60, help="seconds the same-minute burst is spread over")
    parser.add_argument("--lead", type=float, default=3.0, help="seconds between startup and the burst")
    args = parser.parse_args(argv)
    results = asyncio.run(_bench(args))
    load = results["load_ms"]
    jobs_key = f"{args.jobs}_jobs"
    print_table("Startup: loading cron jobs", ["jobs", "load ms", "vs 0 jobs"],
                [[0, load["baseline_0_jobs"], "1.00x"], [args.jobs, load[jobs_key],
                                                         ratio(load[jobs_key], load["baseline_0_jobs"])]])
    lag = results["fire_lag"]
    print_table("Fire lag (scheduled time -> claim committed to the inbox)",
                ["scenario", "jobs", "claimed", "p50 ms", "p99 ms", "max ms", "p99 vs 1 job", "runs done",
                 "drained s"],
                [[name, row["jobs"], row["claimed"], row["p50_ms"], row["p99_ms"], row["max_ms"],
                  ratio(row["p99_ms"], lag["baseline_1_job"]["p99_ms"]), row["runs_completed"],
                  row["drained_after_last_due_s"]] for name, row in lag.items()])
    print(f"\ntarget p99 < 1000 ms with {args.jobs} jobs due in the same minute: "
          f"{'met' if results['target']['met'] else 'NOT met'}")
    save_results("cron", results)


if __name__ == "__main__":
    main()
