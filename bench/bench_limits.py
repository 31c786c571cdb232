"""The inbound rate limit's hot path: the shared limiter (buckets in the store, gateway/limits.py) against a token
bucket per user in memory (the limiter before it; the floor), measured in the same run.

``--users`` users send ``--messages`` messages each, round robin, through ``InboundLimiter.check`` in one event
loop, in two workloads: *within limits* (every message admitted: the common case) and *flood* (a burst of 10,
then refusals). The figure is CPU time of this process (the SQLite store's thread included) per check, as a ratio
to the in-memory floor, and the store's write transactions per check. SQLite always; PostgreSQL too when
``HERMES_TEST_PG_URL`` is set (a scratch database on that server).

    python -m bench.bench_limits [--users 200] [--messages 50] [--allowance 1 5 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from typing import Any

from bench.common import print_table, ratio, save_results, scratch_database
from gateway.config import LimitsSettings
from gateway.limits import InboundLimiter
from gateway.store import Store
from platforms.ratelimit import TokenBucket

WORKLOADS = {"within limits": {"user_messages_per_minute": 1000.0, "user_burst": 100_000},
             "flood": {"user_messages_per_minute": 20.0, "user_burst": 10}}


def _keys(users: int, messages: int) -> list[str]:
    return [f"telegram:{u}" for _ in range(messages) for u in range(users)]


def _floor(keys: list[str], limits: dict[str, Any]) -> tuple[float, int]:
    """CPU seconds and admissions of one bucket per user in memory."""
    rate, burst = limits["user_messages_per_minute"] / 60, limits["user_burst"]
    buckets: dict[str, TokenBucket] = {}
    admitted = 0
    started = time.process_time()
    for key in keys:
        now = time.monotonic()
        bucket = buckets.get(key) or buckets.setdefault(key, TokenBucket(rate, burst, now))
        admitted += bucket.take(now) == 0
    return time.process_time() - started, admitted


async def _shared(url: str, keys: list[str], limits: dict[str, Any], allowance: int) -> tuple[float, int, int]:
    """CPU seconds, admissions and store writes of the shared limiter on a fresh store at ``url``."""
    store = await Store.open(url)
    try:
        await store.db.write(lambda conn: conn.exec_driver_sql("DELETE FROM user_rate_limits"))
        writes = 0
        write = store.db.write

        async def counted(work: Any, **kwargs: Any) -> Any:
            nonlocal writes
            writes += 1
            return await write(work, **kwargs)

        store.db.write = counted  # type: ignore[method-assign]
        limiter = InboundLimiter(LimitsSettings(**limits, local_allowance=allowance), store.db)
        admitted = 0
        started = time.process_time()
        for key in keys:
            admitted += (await limiter.check(key))[0]
        return time.process_time() - started, admitted, writes
    finally:
        await store.close()


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    keys = _keys(args.users, args.messages)
    rows: list[list[Any]] = []
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as home:
        stores = {"sqlite": f"sqlite:///{home}/state.db"}
        pg = os.environ.get("HERMES_TEST_PG_URL")
        async with (scratch_database(pg, "hermes_bench") if pg else _none()) as pg_url:
            if pg_url:
                stores["postgresql"] = pg_url
            for workload, limits in WORKLOADS.items():
                floor_cpu, floor_admitted = _floor(keys, limits)
                floor_us = floor_cpu / len(keys) * 1e6
                rows.append([workload, "memory (floor)", "-", floor_admitted, floor_us, "1.00x", 0.0])
                for backend, url in stores.items():
                    for allowance in args.allowance:
                        cpu, admitted, writes = await _shared(url, keys, limits, allowance)
                        us = cpu / len(keys) * 1e6
                        rows.append([workload, backend, allowance, admitted, us, ratio(us, floor_us),
                                     writes / len(keys)])
                        results.append({"workload": workload, "store": backend, "allowance": allowance,
                                        "checks": len(keys), "admitted": admitted, "cpu_us_per_check": us,
                                        "floor_cpu_us_per_check": floor_us, "writes_per_check": writes / len(keys)})
    print_table(f"inbound rate limit: {args.users} users x {args.messages} messages, round robin",
                ["workload", "limiter", "allowance", "admitted", "CPU us/check", "vs floor", "writes/check"], rows)
    return {"users": args.users, "messages": args.messages, "results": results}


class _none:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--messages", type=int, default=50)
    parser.add_argument("--allowance", type=int, nargs="+", default=[1, 5, 20])
    save_results("limits", asyncio.run(_bench(parser.parse_args())))


if __name__ == "__main__":
    main()
