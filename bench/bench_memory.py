"""Gateway memory: RSS when idle, after many sessions, and across a soak (flat is the goal).

One gateway subprocess (``python -m gateway run``) with the Telegram adapter polling the Telegram
simulator and the signed webhook route delivering to a callback sink, all on 127.0.0.1. Phases:

1. idle: RSS a few seconds after start;
2. sessions: ``--sessions`` distinct sessions each exchange one message (``--via telegram``: a DM of a
   new user each; ``--via webhook``: a webhook run each, which is its own session), ``--concurrency`` at
   a time;
3. soak: ``--soak`` seconds of mixed traffic (returning Telegram users, so histories grow, plus webhooks),
   RSS sampled every ``--sample`` seconds; the slope of a least-squares line says whether it is flat.

    python -m bench.bench_memory [--sessions 10000] [--soak 60] [--via telegram|webhook]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import (
    MODEL_KEY,
    BenchSink,
    BenchTelegram,
    ServiceProcess,
    WebhookClient,
    closed_loop,
    gateway_argv,
    print_table,
    save_results,
    write_gateway_config,
)
from gateway.sim.model_server import ScriptedModel

_SETTLE_SECONDS = 3.0


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) samples, in MiB per minute."""
    if len(samples) < 2:
        return float("nan")
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_m = sum(m for _, m in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    return 60 * sum((t - mean_t) * (m - mean_m) for t, m in samples) / var if var else float("nan")


async def _settled_rss(service: ServiceProcess) -> float:
    await asyncio.sleep(_SETTLE_SECONDS)
    return service.rss_mb()


async def _soak(service: ServiceProcess, traffic: list[Callable[[], Awaitable[Any]]], seconds: float,
                every: float, forget: Callable[[], None]) -> dict[str, Any]:
    samples: list[tuple[float, float]] = []
    started = time.perf_counter()

    async def sample() -> None:
        while time.perf_counter() - started < seconds:
            samples.append((time.perf_counter() - started, service.rss_mb()))
            forget()
            await asyncio.sleep(every)

    results = await asyncio.gather(sample(), *(closed_loop(one, 4, seconds) for one in traffic))
    loads = results[1:]
    samples.append((time.perf_counter() - started, service.rss_mb()))
    half = [s for s in samples if s[0] >= seconds / 2]
    return {"seconds": seconds, "exchanges": sum(len(r.results) for r in loads),
            "errors": sum(len(r.errors) for r in loads), "rss_start_mb": samples[0][1], "rss_end_mb": samples[-1][1],
            "rss_max_mb": max(m for _, m in samples), "slope_mb_per_min": slope_mb_per_min(samples),
            "slope_second_half_mb_per_min": slope_mb_per_min(half), "samples": samples}


async def _run(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with ScriptedModel(api_key=MODEL_KEY) as model:
        assert model.base_url is not None
        sink, sim = BenchSink(), BenchTelegram()
        await sink.start()
        await sim.start()
        config = write_gateway_config(home, model.base_url, sink.url, telegram=sim)
        service = ServiceProcess("gateway", gateway_argv(config), home / "stderr.log")
        try:
            await service.start()
            out["idle_rss_mb"] = await _settled_rss(service)
            print(f"  idle: {out['idle_rss_mb']:.1f} MiB", flush=True)
            async with aiohttp.ClientSession() as http:
                webhooks = WebhookClient(http, service.base_url, sink)
                users = itertools.count(1)

                async def new_user() -> Any:
                    return await sim.say(next(users), "hello, I am new here", 120.0)

                one = new_user if args.via == "telegram" else webhooks.run
                started = time.perf_counter()
                result = await closed_loop(one, args.concurrency, args.max_seconds, max_count=args.sessions)
                model.requests.clear()
                forget = _forgetter(sim, sink, model)
                forget()
                out["sessions"] = {"via": args.via, "sessions": len(result.results), "errors": len(result.errors),
                                   "error_samples": result.errors[:3], "seconds": time.perf_counter() - started,
                                   "rss_mb": await _settled_rss(service)}
                print(f"  after {len(result.results)} sessions: {out['sessions']['rss_mb']:.1f} MiB", flush=True)
                if args.soak > 0:
                    returning = itertools.cycle(range(1, min(args.sessions, 500) + 1))

                    async def returning_user() -> Any:
                        return await sim.say(next(returning) + 50_000_000, "and another thing", 120.0)

                    out["soak"] = await _soak(service, [returning_user, webhooks.run], args.soak, args.sample,
                                              forget)
                    out["soak"]["rss_after_mb"] = await _settled_rss(service)
        finally:
            await service.stop()
            await sim.stop()
            await sink.stop()
            out["gateway_log_problems"] = service.log_problems()
    return out


def _forgetter(sim: BenchTelegram, sink: BenchSink, model: ScriptedModel) -> Callable[[], None]:
    """Keep the simulators' own records from growing during long runs."""
    def forget() -> None:
        sim.forget()
        sink.reset()
        model.requests.clear()
    return forget


def main(argv: list[str] | None = None) -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=10_000, help="distinct sessions in phase 2")
    parser.add_argument("--via", choices=["telegram", "webhook"], default="telegram", help="how sessions are made")
    parser.add_argument("--concurrency", type=int, default=50, help="sessions in progress at once")
    parser.add_argument("--max-seconds", type=float, default=900.0, help="time bound of phase 2")
    parser.add_argument("--soak", type=float, default=60.0, help="soak seconds (0: skip)")
    parser.add_argument("--sample", type=float, default=2.0, help="RSS sampling interval during the soak (s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="hermes-bench-memory-") as tmp:
        out = asyncio.run(_run(args, Path(tmp)))
    rows = [["idle (after start)", out["idle_rss_mb"], "-", "-"]]
    if "sessions" in out:
        s = out["sessions"]
        rows.append([f"after {s['sessions']} sessions via {s['via']} ({s['errors']} errors)", s["rss_mb"],
                     s["rss_mb"] - out["idle_rss_mb"], "-"])
    if "soak" in out:
        k = out["soak"]
        rows.append([f"soak {k['seconds']:.0f} s: {k['exchanges']} exchanges ({k['errors']} errors)",
                     k["rss_end_mb"], k["rss_end_mb"] - k["rss_start_mb"],
                     f"{k['slope_mb_per_min']:+.2f} (2nd half {k['slope_second_half_mb_per_min']:+.2f})"])
    print_table("Gateway RSS (MiB), gateway subprocess", ["phase", "RSS MiB", "delta MiB", "slope MiB/min"], rows)
    for problem in out["gateway_log_problems"]:
        print(f"  gateway log: {problem}")
    save_results("memory", {"args": vars(args), **out})


if __name__ == "__main__":
    main()
