"""Gateway memory: RSS when idle, after many sessions, and across a soak at a steady rate (flat is the goal).

One gateway subprocess (``python -m gateway run``) with the Telegram adapter polling the Telegram
simulator and the signed webhook route delivering to a callback sink, all on 127.0.0.1. Phases:

1. idle: RSS a few seconds after start;
2. sessions: ``--sessions`` distinct sessions each exchange one message (``--via telegram``: a DM of a
   new user each; ``--via webhook``: a webhook run each, which is its own session), ``--concurrency`` at
   a time (0: skip);
3. soak: ``--messages`` Telegram messages spread round-robin over ``--users`` distinct users (new ones,
   not phase 2's), started at a steady ``--rate`` per second whatever the answers take, plus signed
   webhooks at ``--webhook-rate``. Every user comes back ``messages / users`` times, so histories grow
   past ``model.history_messages`` and are trimmed; one message in five asks the model for a tool call.
   A user's next message starts ``users / rate`` seconds after the previous one: keep that above the
   reply time (one pending message per chat).
   RSS is sampled every ``--sample`` seconds and printed every ``--report`` seconds; the slope of a
   least-squares line over the whole soak and over its second half says whether memory is flat.
   With ``--retention SECONDS`` the gateway prunes finished events, transcripts and sent parts after that long
   and their dedupe records after ``--dedupe`` seconds (``store.retention``, every ``--prune-interval``): the
   database's size (file and log) is sampled too, and its slope once the dedupe window has passed says
   whether it is flat.

    python -m bench.bench_memory [--sessions 10000] [--messages 50000 --users 5000 --rate 35] [--name soak]
                                 [--retention 120 --dedupe 600 --prune-interval 30]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import (
    BENCH_FILE,
    BENCH_TOOL,
    MODEL_KEY,
    ROUTE,
    BenchSink,
    BenchTelegram,
    ServiceProcess,
    WebhookClient,
    closed_loop,
    gateway_argv,
    latency_ms,
    print_table,
    save_results,
    webhook_platform,
    write_gateway_config,
)
from gateway.retention import file_size
from gateway.sim.model_server import ScriptedModel

_SETTLE_SECONDS = 3.0
_SOAK_USER_BASE = 50_000_000  # soak users' ids start here, apart from phase 2's new users
# Filled by a soak user's first five exchanges (two messages each, four with a tool call), so later runs
# read a cut and trimmed history, as in a long-lived gateway.
_HISTORY_MESSAGES = 10
_TOOL_DIRECTIVE = f'[[tool:{BENCH_TOOL} {{"path": "{BENCH_FILE}"}}]]'


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


@dataclass(slots=True)
class _Steady:
    """Operations started at a steady rate (open loop), at most ``max_inflight`` at once."""

    done: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # seconds, since the last report
    inflight: int = 0
    behind: float = 0.0  # seconds the schedule slipped because ``max_inflight`` operations were running

    async def run(self, one: Callable[[int], Awaitable[float]], count: int, rate: float, max_inflight: int) -> None:
        """Start ``one(i)`` for i in 0..count-1 at ``rate`` per second; returns once all have ended.

        ``one`` returns its latency in seconds and must bound its own wait.
        """
        if count <= 0 or rate <= 0:
            return
        tasks: set[asyncio.Task[None]] = set()
        room = asyncio.Semaphore(max_inflight)
        started = time.perf_counter()

        async def op(i: int) -> None:
            try:
                self.latencies.append(await one(i))
                self.done += 1
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                self.inflight -= 1
                room.release()

        for i in range(count):
            delay = started + self.behind + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            waited = time.perf_counter()
            await room.acquire()
            self.behind += time.perf_counter() - waited
            self.inflight += 1
            task = asyncio.create_task(op(i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.gather(*list(tasks))


@dataclass(slots=True)
class _Sample:
    seconds: float
    rss_mb: float
    messages: int
    webhooks: int
    inflight: int
    db_mb: float


_REPORT_HEADER = ("min", "messages", "webhooks", "in flight", "CPU %", "RSS MiB", "DB MiB", "reply p50 ms",
                  "reply p99 ms")


def _db_mb(home: Path) -> float:
    """The SQLite store's size on disk (database file and its log), MiB."""
    return sum(file_size(str(home / name)) for name in ("state.db", "state.db-wal")) / 1048576


async def _soak(args: argparse.Namespace, service: ServiceProcess, sim: BenchTelegram, webhooks: WebhookClient,
                forget: Callable[[], None], home: Path) -> dict[str, Any]:
    """Phase 3: the steady-rate soak, with an RSS time series."""
    chat, hooks = _Steady(), _Steady()
    duration = args.messages / args.rate
    users = args.users

    async def message(i: int) -> float:
        user, round_ = _SOAK_USER_BASE + i % users, i // users
        text = f"message {round_} of user {user}" + (f" {_TOOL_DIRECTIVE}" if (user + round_) % 5 == 0 else "")
        sent, _, answered = await sim.say(user, text, args.timeout)
        return answered - sent

    async def webhook(_i: int) -> float:
        return (await webhooks.run()).e2e_seconds

    samples: list[_Sample] = []
    reports: list[list[float]] = []
    started = time.perf_counter()
    print(f"  soak: {args.messages} messages over {users} users at {args.rate:g}/s "
          f"(~{duration / 60:.1f} min), webhooks at {args.webhook_rate:g}/s", flush=True)
    print("  " + " ".join(f"{h:>12}" for h in _REPORT_HEADER), flush=True)

    def report(point: _Sample, window: tuple[float, float]) -> tuple[float, float]:
        """Print and keep one row of the time series; returns the new window start (seconds, CPU seconds)."""
        cpu = service.cpu_seconds()
        busy = 100 * (cpu - window[1]) / (point.seconds - window[0]) if point.seconds > window[0] else float("nan")
        reply = latency_ms(chat.latencies)
        chat.latencies.clear()
        hooks.latencies.clear()
        row = [round(point.seconds / 60, 2), point.messages, point.webhooks, point.inflight, round(busy, 0),
               round(point.rss_mb, 1), round(point.db_mb, 1), round(reply["p50_ms"], 0), round(reply["p99_ms"], 0)]
        reports.append(row)
        print("  " + " ".join(f"{v:>12}" for v in row), flush=True)
        return point.seconds, cpu

    async def sample() -> None:
        window, next_report = (0.0, service.cpu_seconds()), 0.0
        while True:
            now = time.perf_counter() - started
            point = _Sample(now, service.rss_mb(), chat.done, hooks.done, chat.inflight + hooks.inflight,
                            _db_mb(home))
            samples.append(point)
            forget()
            if now >= next_report:
                window, next_report = report(point, window), next_report + args.report
            await asyncio.sleep(args.sample)

    sampler = asyncio.create_task(sample())
    try:
        await asyncio.gather(chat.run(message, args.messages, args.rate, args.max_inflight),
                             hooks.run(webhook, round(duration * args.webhook_rate), args.webhook_rate,
                                       args.max_inflight))
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
    elapsed = time.perf_counter() - started
    samples.append(_Sample(elapsed, service.rss_mb(), chat.done, hooks.done, 0, _db_mb(home)))
    series = [(s.seconds, s.rss_mb) for s in samples]
    sessions_at = next((s for s in samples if s.messages >= users), samples[-1])
    # every kind pruned at least once after its window (the dedupe records' is the longest)
    window = max(args.retention, args.dedupe) + args.prune_interval if args.retention else elapsed
    flat = [(s.seconds, s.db_mb) for s in samples if s.seconds >= window]
    return {"messages": chat.done, "users": users, "webhooks": hooks.done, "rate": args.rate,
            "webhook_rate": args.webhook_rate, "seconds": elapsed, "errors": len(chat.errors) + len(hooks.errors),
            "error_samples": (chat.errors + hooks.errors)[:3], "schedule_slip_seconds": chat.behind,
            "rss_start_mb": samples[0].rss_mb, "rss_all_sessions_mb": sessions_at.rss_mb,
            "all_sessions_at_seconds": sessions_at.seconds, "rss_end_mb": samples[-1].rss_mb,
            "rss_max_mb": max(s.rss_mb for s in samples), "slope_mb_per_min": slope_mb_per_min(series),
            "slope_second_half_mb_per_min": slope_mb_per_min([p for p in series if p[0] >= elapsed / 2]),
            "slope_after_all_sessions_mb_per_min": slope_mb_per_min(
                [p for p in series if p[0] >= sessions_at.seconds]),
            "db_start_mb": samples[0].db_mb, "db_end_mb": samples[-1].db_mb,
            "db_max_mb": max(s.db_mb for s in samples), "db_slope_mb_per_min": slope_mb_per_min(
                [(s.seconds, s.db_mb) for s in samples]),
            "db_window_seconds": window, "db_at_window_mb": flat[0][1] if flat else None,
            "db_slope_after_window_mb_per_min": slope_mb_per_min(flat),
            "report_columns": list(_REPORT_HEADER), "report": reports,
            "samples": [[round(s.seconds, 1), round(s.rss_mb, 2), s.messages, s.webhooks, s.inflight,
                         round(s.db_mb, 2)] for s in samples]}


async def _run(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with ScriptedModel(api_key=MODEL_KEY) as model:
        assert model.base_url is not None
        sink, sim = BenchSink(), BenchTelegram()
        await sink.start()
        await sim.start()
        overrides: dict[str, Any] = {"model": {"history_messages": _HISTORY_MESSAGES}}
        if args.retention:
            kept = f"{args.retention:g}s"
            overrides["store"] = {"retention": {
                "events": kept, "cron_fires": kept, "transcripts": kept, "outbox": kept,
                "dedupe": f"{args.dedupe:g}s", "interval": f"{args.prune_interval:g}s"}}
            hook = webhook_platform("callback:sink")  # its replay window within the dedupe window
            hook["routes"][ROUTE]["replay_window_seconds"] = int(args.dedupe)
            overrides["platforms"] = {"webhook": hook}
        config = write_gateway_config(home, model.base_url, sink.url, telegram=sim, overrides=overrides)
        service = ServiceProcess("gateway", gateway_argv(config), home / "stderr.log")
        forget = _forgetter(sim, sink, model)
        try:
            await service.start()
            out["idle_rss_mb"] = await _settled_rss(service)
            print(f"  idle: {out['idle_rss_mb']:.1f} MiB", flush=True)
            async with aiohttp.ClientSession() as http:
                webhooks = WebhookClient(http, service.base_url, sink, timeout=args.timeout)
                if args.sessions > 0:
                    users = itertools.count(1)

                    async def new_user() -> Any:
                        return await sim.say(next(users), "hello, I am new here", args.timeout)

                    one = new_user if args.via == "telegram" else webhooks.run
                    started = time.perf_counter()
                    result = await closed_loop(one, args.concurrency, args.max_seconds, max_count=args.sessions)
                    forget()
                    out["sessions"] = {"via": args.via, "sessions": len(result.results),
                                       "errors": len(result.errors), "error_samples": result.errors[:3],
                                       "seconds": time.perf_counter() - started,
                                       "rss_mb": await _settled_rss(service)}
                    print(f"  after {len(result.results)} sessions: {out['sessions']['rss_mb']:.1f} MiB", flush=True)
                if args.messages > 0:
                    out["soak"] = await _soak(args, service, sim, webhooks, forget, home)
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
    parser.add_argument("--sessions", type=int, default=10_000, help="distinct sessions in phase 2 (0: skip)")
    parser.add_argument("--via", choices=["telegram", "webhook"], default="telegram", help="how sessions are made")
    parser.add_argument("--concurrency", type=int, default=50, help="phase 2 sessions in progress at once")
    parser.add_argument("--max-seconds", type=float, default=900.0, help="time bound of phase 2")
    parser.add_argument("--messages", type=int, default=3000, help="soak: Telegram messages in all (0: skip)")
    parser.add_argument("--users", type=int, default=500, help="soak: distinct Telegram users (sessions)")
    parser.add_argument("--rate", type=float, default=35.0, help="soak: Telegram messages started per second")
    parser.add_argument("--webhook-rate", type=float, default=2.0, help="soak: signed webhooks per second")
    parser.add_argument("--max-inflight", type=int, default=2000, help="soak: operations in progress at most")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for one answer")
    parser.add_argument("--sample", type=float, default=2.0, help="soak: RSS sampling interval (s)")
    parser.add_argument("--report", type=float, default=30.0, help="soak: seconds between printed samples")
    parser.add_argument("--retention", type=float, default=0.0,
                        help="soak: store.retention of events, transcripts and sent parts, seconds (0: defaults)")
    parser.add_argument("--dedupe", type=float, default=600.0, help="with --retention: store.retention.dedupe (s)")
    parser.add_argument("--prune-interval", type=float, default=30.0,
                        help="with --retention: store.retention.interval (s)")
    parser.add_argument("--name", default="memory", help="results file: bench/results/NAME.json")
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
        rows.append([f"soak: once all {k['users']} soak users had one exchange", k["rss_all_sessions_mb"],
                     k["rss_all_sessions_mb"] - k["rss_start_mb"], f"{k['slope_after_all_sessions_mb_per_min']:+.2f}"
                     " from here"])
        rows.append([f"soak {k['seconds'] / 60:.1f} min: {k['messages']} messages, {k['webhooks']} webhooks "
                     f"({k['errors']} errors)", k["rss_end_mb"], k["rss_end_mb"] - k["rss_start_mb"],
                     f"{k['slope_mb_per_min']:+.2f} (2nd half {k['slope_second_half_mb_per_min']:+.2f})"])
        rows.append(["soak: settled after the load", k["rss_after_mb"], k["rss_after_mb"] - k["rss_start_mb"], "-"])
    print_table("Gateway RSS (MiB), gateway subprocess", ["phase", "RSS MiB", "delta MiB", "slope MiB/min"], rows)
    if "soak" in out:
        k = out["soak"]
        print_table("Store size on disk (MiB): state.db + its log", ["point", "MiB", "slope MiB/min"], [
            ["soak start", k["db_start_mb"], "-"],
            [f"after the longest retention window ({k['db_window_seconds']:g} s)", k["db_at_window_mb"],
             f"{k['db_slope_after_window_mb_per_min']:+.3f} from here"],
            ["soak end", k["db_end_mb"], f"{k['db_slope_mb_per_min']:+.3f} whole soak"],
            ["max", k["db_max_mb"], "-"]])
    for problem in out["gateway_log_problems"]:
        print(f"  gateway log: {problem}")
    save_results(args.name, {"args": vars(args), **out})


if __name__ == "__main__":
    main()
