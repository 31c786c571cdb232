"""Webhook throughput with 1, 2 and 3 gateway replicas on one PostgreSQL database.

The same webhook path as ``bench_webhook`` (signed POST, inbox, one ``read_file`` tool call, answer to a
callback sink), with the load spread round-robin over the replicas. Each replica count gets a fresh
database. In the same run, one gateway on SQLite is the baseline: the ratios say what the shared
database and the coordination (session locks, outbox claims, the inbox sweep) cost per run. On a
2-core machine the replicas share the cores with each other, PostgreSQL and the load generator: the
point is correctness and no contention collapse, not linear scaling.

    python -m bench.bench_replicas --pg-url postgresql://USER:PASSWORD@HOST/DB [--replicas 1,2,3]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import (
    MODEL_KEY,
    BenchSink,
    ServiceProcess,
    WebhookClient,
    WebhookRun,
    closed_loop,
    cpu_seconds,
    gateway_argv,
    print_table,
    ratio,
    save_results,
    scratch_database,
    webhook_responder,
    write_gateway_config,
)
from gateway.sim.model_server import ScriptedModel

_WARMUP_SECONDS = 1.5


async def _measure(label: str, store_url: str, replicas: int, home: Path, model_url: str, sink: BenchSink,
                   session: aiohttp.ClientSession, args: argparse.Namespace) -> dict[str, Any]:
    home.mkdir(parents=True, exist_ok=True)
    config = write_gateway_config(home, model_url, sink.url, stream=False, overrides={"store": {"url": store_url}})
    services = [ServiceProcess(f"{label}-{i}", gateway_argv(config), home / f"stderr-{i}.log")
                for i in range(replicas)]
    await asyncio.gather(*(s.start() for s in services))
    try:
        clients = itertools.cycle([WebhookClient(session, s.base_url, sink) for s in services])

        async def one() -> WebhookRun:
            return await next(clients).run()

        await closed_loop(one, args.concurrency, _WARMUP_SECONDS)
        before, harness_before = [s.cpu_seconds() for s in services], cpu_seconds(os.getpid())
        result = await closed_loop(one, args.concurrency, args.duration)
        cpu = sum(s.cpu_seconds() - b for s, b in zip(services, before, strict=True))
        harness = cpu_seconds(os.getpid()) - harness_before
    finally:
        await asyncio.gather(*(s.stop() for s in services))
        sink.reset()
    runs = len(result.results)
    row = {"label": label, "replicas": replicas, "runs": runs, "errors": len(result.errors),
           "runs_per_s": result.rate, "cpu_ms_per_run": cpu * 1000 / max(1, runs),
           "gateways_cpu_pct": 100 * cpu / result.elapsed, "harness_cpu_pct": 100 * harness / result.elapsed,
           "error_samples": result.errors[:3]}
    print(f"  {label:<16} {row['runs_per_s']:7.1f} runs/s, {row['cpu_ms_per_run']:6.2f} ms CPU/run "
          f"({row['errors']} errors)", flush=True)
    return row


async def _main(args: argparse.Namespace) -> None:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hermes-bench-replicas-") as tmp:
        async with ScriptedModel(webhook_responder, api_key=MODEL_KEY) as model:
            assert model.base_url is not None
            sink = BenchSink()
            await sink.start()
            try:
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2000)) as session:
                    rows.append(await _measure("sqlite, 1", f"sqlite:///{tmp}/sqlite/state.db", 1,
                                               Path(tmp) / "sqlite", model.base_url, sink, session, args))
                    for n in args.replicas:
                        async with scratch_database(args.pg_url, "hermes_bench") as url:
                            rows.append(await _measure(f"postgresql, {n}", url, n, Path(tmp) / f"pg{n}",
                                                       model.base_url, sink, session, args))
            finally:
                await sink.stop()
    base, one_pg = rows[0], rows[1]
    print_table(f"Webhook runs, closed loop at concurrency {args.concurrency}, {args.duration:.0f} s per row "
                "(round-robin over the replicas; model 0 ms, one tool call)",
                ["store, replicas", "runs/s", "CPU ms/run (all)", "runs/s vs sqlite", "CPU vs sqlite",
                 "runs/s vs 1 pg", "CPU% gateways/harness", "errors"],
                [[r["label"], r["runs_per_s"], r["cpu_ms_per_run"], ratio(r["runs_per_s"], base["runs_per_s"]),
                  ratio(r["cpu_ms_per_run"], base["cpu_ms_per_run"]), ratio(r["runs_per_s"], one_pg["runs_per_s"]),
                  f"{r['gateways_cpu_pct']:.0f}/{r['harness_cpu_pct']:.0f}", r["errors"]] for r in rows])
    save_results("replicas", {"concurrency": args.concurrency, "duration": args.duration, "rows": rows})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default=os.environ.get("HERMES_TEST_PG_URL"),
                        help="a PostgreSQL URL whose user may create databases (default: $HERMES_TEST_PG_URL)")
    parser.add_argument("--replicas", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3])
    parser.add_argument("--concurrency", type=int, default=48)
    parser.add_argument("--duration", type=float, default=10.0)
    args = parser.parse_args()
    if not args.pg_url:
        parser.error("--pg-url (or $HERMES_TEST_PG_URL) is required: .ci/start-postgres prints one")
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
