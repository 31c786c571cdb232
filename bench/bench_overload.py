"""Overload and agent workers (issue #28): the gateway with its agent loops in worker processes against the same
gateway with them in its own process (``agent_workers: 0``), and adaptive admission against fixed limits.

Gateway subprocesses (``python -m gateway run``) with the signed webhook route delivering to a callback sink, the
route's rate limit raised and otherwise the default configuration but for what each contender sets
(``bench/overload_harness.py``); the scripted model and the sink in this process, webhooks posted from a process
of their own. CPU is the gateway's whole process tree (its agent and sandbox workers too). Scenarios
(``--scenarios``, all by default):

1. ``throughput``: closed loop (``--concurrency`` workers), 0 ms model, one ``read_file`` call per run: runs/s and
   CPU ms per run with ``--workers`` agent workers and in-process, with admission on and off (``--admission``),
   and the relays of ``bench_webhook`` (floors); ``--rounds`` alternating rounds.
2. ``burst``: webhooks offered open loop at ``--burst-factor`` times the workers' closed-loop maximum for
   ``--burst-seconds``, the same rate for every contender: adaptive admission (with workers, and in-process) and
   admission off at fixed ceilings (``--fixed``). Ack latency, main-loop lag (the gateway's own histogram) over the
   window, runs completed per second from the first post to the last delivery, and every accepted webhook
   delivered exactly once.
3. ``at-once``: the default configuration, a ``--slow-latency`` model, ``--at-once`` webhooks posted at once: peak
   model requests and runs in flight, time from the first post to the last delivery. Each run makes one model
   call (a plain answer; ``--slow-tool``: a tool call and an answer, two model calls).
4. ``chat``: Telegram chats (the simulator) at ``--chat-rate`` messages per second, each from a new user, on an
   idle gateway and during webhook storms at ``--chat-storms`` times the maximum: reply latency, and where it went
   (intake, queue, run, delivery, from the gateway's store).
5. ``storms``: ``bench_loop_lag``'s storms (200 concurrent tool calls) with the workers and in-process.

Each measurement holds a lock file (one benchmark at a time), waits for a quiet machine and notes the load average.
``--admission-set KEY=VALUE`` tunes the adaptive gateways' ``gateway.admission`` (e.g. ``lag_target_ms=20``).

    python -m bench.bench_overload [--scenarios throughput,burst,at-once,chat,storms] [--burst-seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from statistics import median
from typing import Any

import aiohttp
import yaml

from bench.bench_loop_lag import build_parser as loop_lag_parser
from bench.bench_loop_lag import run_storms
from bench.common import (
    BENCH_FILE,
    BENCH_TOOL,
    MODEL_KEY,
    RESULTS_DIR,
    BenchSink,
    BenchTelegram,
    ServiceProcess,
    WebhookClient,
    closed_loop,
    cpu_seconds,
    latency_ms,
    machine_info,
    open_loop,
    print_table,
    webhook_responder,
)
from bench.overload_harness import (
    Contender,
    Peaks,
    Poster,
    accounting,
    bench_lock,
    delivered,
    gateway_service,
    loadavg,
    loop_thread,
    machine_cpu,
    read_lag,
    run_stages,
    started,
    tree_cpu,
)
from gateway.sim.model_server import ScriptedModel, rules, text, tool_call
from tools.sandbox import MODES

SCENARIOS = ("throughput", "burst", "at-once", "chat", "storms")
RELAYS = ("relay-openai", "relay-openai-post")
_WARMUP = 1.5


class Bench:
    """One invocation: its options, the HTTP session, the poster process and the temporary directory."""

    def __init__(self, args: argparse.Namespace, http: aiohttp.ClientSession, poster: Poster, tmp: Path) -> None:
        self.args, self.http, self.poster, self.tmp = args, http, poster, tmp
        self.workers = Contender(f"workers-{args.workers}", args.workers, tuning=args.admission_set)
        self.in_process = Contender("in-process", 0, tuning=args.admission_set)
        self.max_rate: float | None = None

    @contextlib.asynccontextmanager
    async def gateway(self, contender: Contender, model: ScriptedModel, sink: BenchSink, label: str,
                      **config: Any) -> AsyncIterator[ServiceProcess]:
        """``contender``'s gateway on ``model`` and ``sink``, started and ready."""
        assert model.base_url is not None
        service = gateway_service(contender, self.tmp / f"{label}-{contender.name}", model.base_url, sink.url,
                                  **config)
        async with started(service, self.http, contender.workers, stop_timeout=10) as running:
            yield running


# -- 1. throughput -------------------------------------------------------------------------------------

def _relay(name: str, home: Path, model_url: str, sink_url: str) -> ServiceProcess:
    home.mkdir(parents=True, exist_ok=True)
    return ServiceProcess(name, [sys.executable, "-m", "bench.relay", "--client", name.removeprefix("relay-"),
                                 "--model-url", model_url, "--sink-url", sink_url, "--db", str(home / "relay.db")],
                          home / "stderr.log")


async def _closed(bench: Bench, service: ServiceProcess, sink: BenchSink,
                  model: ScriptedModel | None = None) -> dict[str, Any]:
    """Warm up, then the closed loop: runs/s and CPU per run of ``service``'s process tree (and with ``model``,
    the gateway's admission limit and runs in flight meanwhile)."""
    client = WebhookClient(bench.http, service.base_url, sink)
    await closed_loop(client.run, bench.args.concurrency, _WARMUP)
    async with contextlib.AsyncExitStack() as stack:
        peaks = None if model is None else await stack.enter_async_context(Peaks(service, bench.http, model))
        (own0, kids0), harness0, machine0 = tree_cpu(service.pid), cpu_seconds(os.getpid()), machine_cpu()
        loop0, wait0 = loop_thread(service.pid)
        result = await closed_loop(client.run, bench.args.concurrency, bench.args.duration)
        (own1, kids1), harness1, machine1 = tree_cpu(service.pid), cpu_seconds(os.getpid()), machine_cpu()
        loop1, wait1 = loop_thread(service.pid)
    limits = peaks.limits if peaks is not None else []
    runs, seconds = max(1, len(result.results)), result.elapsed
    own, kids, harness = own1 - own0, kids1 - kids0, harness1 - harness0
    return {"runs": len(result.results), "errors": len(result.errors), "error_samples": result.errors[:3],
            "seconds": seconds, "runs_per_s": result.rate, "cpu_ms_per_run": 1000 * (own + kids) / runs,
            "main_cpu_ms_per_run": 1000 * own / runs, "workers_cpu_ms_per_run": 1000 * kids / runs,
            "cpu_cores": (own + kids) / seconds, "loop_cores": (loop1 - loop0) / seconds,
            "loop_waiting": (wait1 - wait0) / seconds,
            "harness_cores": harness / seconds,
            "other_cores": (machine1 - machine0 - own - kids - harness) / seconds,
            "admission_limit_median": median(limits) if limits else float("nan"),
            "e2e": latency_ms([r.e2e_seconds for r in result.results])}


_OFF = " (admission off)"  # the name suffix of a contender measured with admission off


async def throughput(bench: Bench) -> dict[str, Any]:
    """Scenario 1: the closed loop of each contender (with each ``--admission`` setting) and floor, ``--rounds``
    times in alternation."""
    args = bench.args
    contenders = [dataclasses.replace(c, name=c.name + ("" if on else _OFF), admission=on)
                  for on in args.admission for c in (bench.workers, bench.in_process)]
    rows: list[dict[str, Any]] = []
    async with ScriptedModel(webhook_responder, api_key=MODEL_KEY) as model:
        assert model.base_url is not None
        sink = BenchSink()
        await sink.start()
        try:
            for round_no, target in itertools.product(range(args.rounds), [*contenders, *args.floors]):
                name = target if isinstance(target, str) else target.name
                with bench_lock(f"throughput {name}", bench.args.quiet_cores) as load:
                    if isinstance(target, str):
                        service = _relay(target, bench.tmp / f"{target}-{round_no}", model.base_url, sink.url)
                        await service.start()
                        try:
                            row = await _closed(bench, service, sink)
                        finally:
                            await service.stop()
                    else:
                        async with bench.gateway(target, model, sink, f"throughput-{round_no}") as service:
                            row = await _closed(bench, service, sink, model)
                sink.reset()
                rows.append({"target": name, "round": round_no, "load": load, **row})
                print(f"  round {round_no + 1} {name:<30} {row['runs_per_s']:7.1f} runs/s, "
                      f"{row['cpu_ms_per_run']:6.2f} ms CPU/run ({row['main_cpu_ms_per_run']:.2f} main), "
                      f"{row['errors']} errors, load {load['before']}", flush=True)
        finally:
            await sink.stop()
    by_round = {(r["target"], r["round"]): r["runs_per_s"] for r in rows}
    paired = {(suffix or " (admission on)").strip(" ()"): [
        by_round[bench.workers.name + suffix, n] / by_round["in-process" + suffix, n] for n in range(args.rounds)]
        for suffix in ("" if on else _OFF for on in args.admission)}
    if True in args.admission:
        bench.max_rate = median(r["runs_per_s"] for r in rows if r["target"] == bench.workers.name)
    return {"concurrency": args.concurrency, "duration_s": args.duration, "rows": rows,
            "workers_vs_in_process_runs_per_s": paired}


def _report_throughput(out: dict[str, Any]) -> None:
    keys = {"runs_per_s": "runs/s", "cpu_ms_per_run": "CPU ms/run", "main_cpu_ms_per_run": "main ms/run",
            "workers_cpu_ms_per_run": "children ms/run", "cpu_cores": "cores", "loop_cores": "loop thread cores",
            "loop_waiting": "loop waiting for a core", "harness_cores": "harness cores", "other_cores": "other cores",
            "admission_limit_median": "limit p50"}
    by_target: dict[str, list[dict[str, Any]]] = {}
    for row in out["rows"]:
        by_target.setdefault(row["target"], []).append(row)
    medians = {t: {k: median(r[k] for r in rows) for k in keys} | {"e2e": median(r["e2e"]["p50_ms"] for r in rows)}
               for t, rows in by_target.items()}

    def in_process(target: str) -> float:  # the in-process gateway with the same admission setting
        return medians["in-process" + (_OFF if target.endswith(_OFF) else "")]["runs_per_s"]

    print_table(f"1. Closed loop at concurrency {out['concurrency']}, 0 ms model, one read_file per run (medians over "
                "rounds; CPU of the process tree; the relays against the in-process gateway with admission on)",
                ["target", "runs/s", "vs in-process", *list(keys.values())[1:], "e2e p50 ms", "errors", "load"],
                [[t, m["runs_per_s"], f"{m['runs_per_s'] / in_process(t):.2f}x", *(m[k] for k in list(keys)[1:]),
                  m["e2e"], sum(r["errors"] for r in by_target[t]), by_target[t][0]["load"]["before"]]
                 for t, m in medians.items()])
    for setting, ratios in out["workers_vs_in_process_runs_per_s"].items():
        print(f"  runs/s workers / in-process by round, {setting}: " + " ".join(f"{v:.2f}x" for v in ratios))


# -- 2. burst ------------------------------------------------------------------------------------------

async def _max_rate(bench: Bench) -> float:
    """The workers contender's closed-loop maximum (scenario 1's when it ran with admission on)."""
    if bench.args.burst_rate:
        return bench.args.burst_rate / bench.args.burst_factor
    if bench.max_rate is None:
        async with ScriptedModel(webhook_responder, api_key=MODEL_KEY) as model:
            sink = BenchSink()
            await sink.start()
            try:
                with bench_lock("burst max rate", bench.args.quiet_cores):
                    async with bench.gateway(bench.workers, model, sink, "max-rate") as service:
                        bench.max_rate = (await _closed(bench, service, sink))["runs_per_s"]
            finally:
                await sink.stop()
        print(f"  max rate of {bench.workers.name}: {bench.max_rate:.1f} runs/s", flush=True)
    return bench.max_rate


async def _offered(bench: Bench, service: ServiceProcess, sink: BenchSink, model: ScriptedModel, rate: float,
                   seconds: float) -> dict[str, Any]:
    """``rate`` webhooks per second for ``seconds``, then until every accepted one is delivered."""
    client = WebhookClient(bench.http, service.base_url, sink)
    await closed_loop(client.run, bench.args.concurrency, _WARMUP)
    await asyncio.sleep(2.0)  # the warm-up's runs end; admission settles
    sink.reset()
    async with Peaks(service, bench.http, model) as peaks:
        lag0, (main0, kids0), t0 = await read_lag(service, bench.http), tree_cpu(service.pid), time.perf_counter()
        machine0, harness0 = machine_cpu(), cpu_seconds(os.getpid()) + cpu_seconds(bench.poster.pid)
        wall0, (loop0, wait0) = time.time(), loop_thread(service.pid)
        posts = await bench.poster.post(service.base_url, round(rate * seconds), rate)
        lag1, t1, (loop1, wait1) = await read_lag(service, bench.http), time.perf_counter(), loop_thread(service.pid)
        accepted = {run_id for status, run_id, _, _ in posts if status == 202}
        last = await delivered(sink, accepted, bench.args.drain_timeout)
        lag2, (main2, kids2), t2 = await read_lag(service, bench.http), tree_cpu(service.pid), time.perf_counter()
        machine2, harness2 = machine_cpu(), cpu_seconds(os.getpid()) + cpu_seconds(bench.poster.pid)
        loop2, _ = loop_thread(service.pid)
    await asyncio.sleep(1.0)  # a late second delivery would show as a duplicate
    out = accounting(posts, sink)
    first, cpu, elapsed = min((p[2] for p in posts), default=t0), main2 + kids2 - main0 - kids0, t2 - t0
    in_window = sum(1 for r in accepted if sink.arrivals.get(r, float("inf")) <= t1)
    makespan = last - first
    return {"offered_rate": rate, "seconds": seconds, "window_s": t1 - t0, "drained_s": makespan, **out,
            "runs_per_s_window": in_window / (t1 - first), "runs_per_s": out["delivered"] / makespan,
            "lag_window": {k: v for k, v in lag1.since(lag0).items() if k != "counts"},
            "lag_all": {k: v for k, v in lag2.since(lag0).items() if k != "counts"},
            "cpu_ms_per_run": 1000 * cpu / max(1, out["delivered"]), "main_cores": (main2 - main0) / elapsed,
            "loop_cores": (loop2 - loop0) / elapsed, "loop_cores_window": (loop1 - loop0) / (t1 - t0),
            "loop_waiting_window": (wait1 - wait0) / (t1 - t0),
            "children_cores": (kids2 - kids0) / elapsed,
            "harness_cores": (harness2 - harness0) / elapsed,
            "other_cores": (machine2 - machine0 - cpu - (harness2 - harness0)) / elapsed,
            "peaks": peaks.peaks, "stages": run_stages(service.log_path.parent / "state.db", "webhook", wall0),
            "admission_limit": {"min": min(peaks.limits, default=0), "median": median(peaks.limits or [0]),
                                "max": max(peaks.limits, default=0)}}


async def burst(bench: Bench) -> dict[str, Any]:
    """Scenario 2: the same open-loop rate, ``--burst-factor`` times the maximum, against every contender."""
    args = bench.args
    rate = args.burst_factor * await _max_rate(bench)
    contenders = [bench.workers, *(Contender(f"fixed-{c}", args.workers, False, c) for c in args.fixed),
                  bench.in_process]
    rows = []
    async with ScriptedModel(webhook_responder, api_key=MODEL_KEY) as model:
        sink = BenchSink()
        await sink.start()
        try:
            for contender in contenders:
                with bench_lock(f"burst {contender.name}", bench.args.quiet_cores) as load:
                    async with bench.gateway(contender, model, sink, "burst") as service:
                        row = await _offered(bench, service, sink, model, rate, args.burst_seconds)
                rows.append({"target": contender.name, "load": load, **row})
                print(f"  {contender.name:<12} {row['accepted']} accepted, {row['runs_per_s']:.1f} runs/s, ack p99 "
                      f"{row['ack']['p99_ms']:.1f} ms, lag p99 {row['lag_window']['p99_ms']:.1f} ms, drained in "
                      f"{row['drained_s']:.1f} s, load {load['before']} -> {load['after']}", flush=True)
                sink.reset()
        finally:
            await sink.stop()
    return {"max_rate": rate / args.burst_factor, "offered_rate": rate, "rows": rows}


def _report_burst(out: dict[str, Any]) -> None:
    rows = out["rows"]
    best = max((r for r in rows if r["target"].startswith("fixed-")), key=lambda r: r["runs_per_s"], default=None)
    print_table(f"2. Open loop at {out['offered_rate']:.0f} webhooks/s ({out['offered_rate'] / out['max_rate']:.1f}x "
                f"the max of {out['max_rate']:.0f}/s) for {rows[0]['seconds']:.0f} s, then until drained; ms",
                ["target", "accepted", "ack p50", "ack p99", "lag p99 window", "lag p99 all", "runs/s",
                 "vs best fixed", "runs/s window", "drained s", "e2e p99 s", "CPU ms/run", "loop cores window/all",
                 "loop waiting", "cores main/children", "other cores", "limit med/max", "lost", "dup", "load"],
                [[r["target"], r["accepted"], r["ack"]["p50_ms"], r["ack"]["p99_ms"], r["lag_window"]["p99_ms"],
                  r["lag_all"]["p99_ms"], r["runs_per_s"],
                  f"{r['runs_per_s'] / best['runs_per_s']:.2f}x" if best else "-", r["runs_per_s_window"],
                  r["drained_s"], r["e2e"]["p99_ms"] / 1000, r["cpu_ms_per_run"],
                  f"{r['loop_cores_window']:.2f}/{r['loop_cores']:.2f}", r["loop_waiting_window"],
                  f"{r['main_cores']:.2f}/{r['children_cores']:.2f}", r["other_cores"],
                  f"{r['admission_limit']['median']:.0f}/{r['admission_limit']['max']:.0f}", r["missing"],
                  r["duplicates"], r["load"]["before"]] for r in rows])
    print("  from the store, p50 / p99 ms: " + "; ".join(
        f"{r['target']} queue {r['stages']['queue']['p50_ms']:.0f} / {r['stages']['queue']['p99_ms']:.0f}, run "
        f"{r['stages']['run']['p50_ms']:.1f} / {r['stages']['run']['p99_ms']:.1f}" for r in rows))
    refused = {r["target"]: r["statuses"] for r in rows if set(r["statuses"]) != {"202"}}
    if refused:
        print(f"  statuses other than 202: {refused}")


# -- 3. all at once ------------------------------------------------------------------------------------

async def at_once(bench: Bench) -> dict[str, Any]:
    """Scenario 3: ``--at-once`` webhooks posted together on the default configuration with a slow model."""
    args = bench.args
    responder = webhook_responder if args.slow_tool else (lambda _request: text("Done: the countdown is fixed."))
    rows = []
    async with ScriptedModel(responder, api_key=MODEL_KEY, latency=args.slow_latency) as model:
        sink = BenchSink()
        await sink.start()
        try:
            fixed = Contender(f"{bench.workers.name}, admission off", args.workers, False)
            for contender in (bench.workers, bench.in_process, fixed):
                with bench_lock(f"at-once {contender.name}", bench.args.quiet_cores) as load:
                    async with bench.gateway(contender, model, sink, "at-once") as service:
                        await asyncio.sleep(1.0)
                        async with Peaks(service, bench.http, model, interval=0.1) as peaks:
                            posts = await bench.poster.post(service.base_url, args.at_once)
                            accepted = {run_id for status, run_id, _, _ in posts if status == 202}
                            last = await delivered(sink, accepted, args.drain_timeout)
                        await asyncio.sleep(1.0)
                row = {"target": contender.name, "load": load, **accounting(posts, sink), "peaks": peaks.peaks,
                       "admission_limits": peaks.limits,
                       "last_ack_s": max(p[3] for p in posts) - min(p[2] for p in posts),
                       "last_delivery_s": last - min(p[2] for p in posts)}
                rows.append(row)
                print(f"  {contender.name:<12} peak {row['peaks'].get('model_requests_in_flight', 0):.0f} model "
                      f"requests in flight, last delivery at {row['last_delivery_s']:.2f} s, load {load['before']}",
                      flush=True)
                sink.reset()
        finally:
            await sink.stop()
    return {"webhooks": args.at_once, "model_latency_s": args.slow_latency,
            "model_calls_per_run": 2 if args.slow_tool else 1, "rows": rows}


def _report_at_once(out: dict[str, Any]) -> None:
    print_table(f"3. {out['webhooks']} webhooks posted at once, default config, {out['model_latency_s']:.0f} s model, "
                f"{out['model_calls_per_run']} model call(s) per run",
                ["target", "accepted", "peak model reqs", "peak runs in flight", "peak admission limit",
                 "last ack s", "ack p99 ms", "e2e p50 s", "last delivery s", "lost", "dup", "load"],
                [[r["target"], r["accepted"], r["peaks"].get("model_requests_in_flight", 0),
                  r["peaks"].get("runs_in_flight", 0), r["peaks"].get("admission_limit", "-"), r["last_ack_s"],
                  r["ack"]["p99_ms"], r["e2e"]["p50_ms"] / 1000, r["last_delivery_s"], r["missing"], r["duplicates"],
                  r["load"]["before"]]
                 for r in out["rows"]])


# -- 4. chat during a storm ----------------------------------------------------------------------------

async def _chat_load(sim: BenchTelegram, users: Iterator[int], rate: float, seconds: float,
                     db: Path | None = None) -> dict[str, Any]:
    """Chat messages at ``rate`` per second for ``seconds``, each from a new user: reply latency, and with ``db``
    (the gateway's store) where it went."""
    sent: dict[str, float] = {}

    async def one() -> tuple[float, float, float]:
        user = next(users)
        sent[f"telegram:dm:{user}"] = time.time()
        return await sim.say(user, "hello there", 120.0)

    result = await open_loop(one, rate, seconds)
    sim.forget()
    return {"messages": len(result.results), "errors": len(result.errors), "error_samples": result.errors[:2],
            "reply": latency_ms([answered - sent for sent, _, answered in result.results]),
            **({"stages": run_stages(db, "chat", sent=sent)} if db else {})}


async def _chat_storms(bench: Bench, service: ServiceProcess, sim: BenchTelegram, sink: BenchSink,
                       model: ScriptedModel, users: Iterator[int], max_rate: float) -> dict[str, Any]:
    """The chat load on the idle gateway, then during webhooks at each ``--chat-storms`` factor of ``max_rate``
    (starting ``--chat-lead`` seconds before it; each storm's webhooks delivered before the next)."""
    args, db = bench.args, service.log_path.parent / "state.db"
    await _chat_load(sim, users, args.chat_rate, 2.0)  # warm-up
    out = {"idle": await _chat_load(sim, users, args.chat_rate, args.chat_seconds, db)}
    for i, factor in enumerate(args.chat_storms):
        rate = factor * max_rate
        storm = asyncio.ensure_future(bench.poster.post(
            service.base_url, round(rate * (args.chat_seconds + args.chat_lead)), rate))
        async with Peaks(service, bench.http, model) as peaks:
            await asyncio.sleep(args.chat_lead)
            out[f"storm {factor:g}x"] = {**await _chat_load(sim, users, args.chat_rate, args.chat_seconds, db),
                                         "webhook_rate": rate, "peaks": peaks.peaks}
            posts = await storm
        if i < len(args.chat_storms) - 1:
            await delivered(sink, {run_id for status, run_id, _, _ in posts if status == 202}, args.drain_timeout)
        sink.reset()
    return out


async def chat(bench: Bench) -> dict[str, Any]:
    """Scenario 4: chat reply latency on an idle gateway, then during webhook storms."""
    max_rate = await _max_rate(bench)
    responder = rules(("Push to", tool_call(BENCH_TOOL, {"path": BENCH_FILE})))
    rows = []
    async with ScriptedModel(responder, api_key=MODEL_KEY) as model:
        sink, sim = BenchSink(), BenchTelegram()
        await sink.start()
        await sim.start()
        users = itertools.count(1)
        try:
            for contender in (bench.workers, bench.in_process):
                with bench_lock(f"chat {contender.name}", bench.args.quiet_cores) as load:
                    async with bench.gateway(contender, model, sink, "chat", telegram=sim) as service:
                        windows = await _chat_storms(bench, service, sim, sink, model, users, max_rate)
                rows.append({"target": contender.name, "load": load, "windows": windows})
                print(f"  {contender.name:<12} reply p99 " + ", ".join(f"{name} {w['reply']['p99_ms']:.1f} ms"
                                                                  for name, w in windows.items())
                      + f", load {load['before']}", flush=True)
        finally:
            await sim.stop()
            await sink.stop()
    return {"chat_rate": bench.args.chat_rate, "chat_seconds": bench.args.chat_seconds, "max_rate": max_rate,
            "rows": rows}


def _report_chat(out: dict[str, Any]) -> None:
    rows = []
    for r in out["rows"]:
        idle = r["windows"]["idle"]["reply"]["p99_ms"]
        for name, w in r["windows"].items():
            stages = w.get("stages", {})
            rows.append([r["target"], name, w.get("webhook_rate", 0.0), w["reply"]["p50_ms"], w["reply"]["p99_ms"],
                         f"{w['reply']['p99_ms'] / idle:.2f}x",
                         *(stages[k]["p50_ms"] if k in stages else "-" for k in ("intake", "queue", "run", "delivery")),
                         w["messages"], w["errors"], r["load"]["before"]])
    print_table(f"4. Telegram chat replies at {out['chat_rate']:.0f} messages/s for {out['chat_seconds']:.0f} s on an "
                f"idle gateway and during webhook storms (max {out['max_rate']:.0f}/s); ms; stages: p50 from the store",
                ["target", "window", "webhooks/s", "reply p50", "reply p99", "p99 / idle", "intake", "queue", "run",
                 "delivery", "messages", "errors", "load"], rows)


# -- 5. the tool storms --------------------------------------------------------------------------------

async def storms(bench: Bench) -> dict[str, Any]:
    """Scenario 5: ``bench_loop_lag``'s storms with the workers, then in-process."""
    rows = {}
    for workers in (bench.args.workers, 0):
        lag_args = loop_lag_parser().parse_args(["--calls", str(bench.args.storm_calls), "--agent-workers",
                                                 str(workers), "--sandbox", bench.args.storm_sandbox])
        name = bench.workers.name if workers else "in-process"
        home = bench.tmp / f"storms-{name}"
        home.mkdir()
        with bench_lock(f"storms {name}", bench.args.quiet_cores) as load:
            rows[name] = {"load": load, **await run_storms(lag_args, home)}
    return {"calls": bench.args.storm_calls, "sandbox": bench.args.storm_sandbox, "by_target": rows}


def _report_storms(out: dict[str, Any]) -> None:
    (a, wa), (b, wb) = out["by_target"].items()
    print_table(f"5. Main-loop lag during {out['calls']} concurrent tool calls (bench_loop_lag, tools.sandbox: "
                f"{out['sandbox']}), {a} / {b}; ms",
                ["storm", f"{a} p50", f"{a} p99", f"{b} p50", f"{b} p99", "p99 ratio", f"{a} CPU s", f"{b} CPU s"],
                [[x["storm"], x["lag"]["p50_ms"], x["lag"]["p99_ms"], y["lag"]["p50_ms"], y["lag"]["p99_ms"],
                  f"{x['lag']['p99_ms'] / y['lag']['p99_ms']:.2f}x", x["gateway_cpu_s"], y["gateway_cpu_s"]]
                 for x, y in zip(wa["windows"], wb["windows"], strict=True)])
    print(f"  load average: {a} {wa['load']['before']} -> {wa['load']['after']}, {b} {wb['load']['before']} -> "
          f"{wb['load']['after']}; gateway CPU is the main process's")


# -- main ----------------------------------------------------------------------------------------------

_RUN: dict[str, Callable[[Bench], Any]] = {"throughput": throughput, "burst": burst, "at-once": at_once, "chat": chat,
                                           "storms": storms}
_REPORT: dict[str, Callable[[dict[str, Any]], None]] = {
    "throughput": _report_throughput, "burst": _report_burst, "at-once": _report_at_once, "chat": _report_chat,
    "storms": _report_storms}


async def _main(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    poster = Poster(args.connections)
    out: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2000)) as http:
            bench = Bench(args, http, poster, tmp)
            for name in args.scenarios:
                print(f"{name} (load {loadavg()})", flush=True)
                started_at = time.perf_counter()
                out[name] = {**await _RUN[name](bench), "minutes": (time.perf_counter() - started_at) / 60}
    finally:
        poster.close()
    return out


def _save(out: dict[str, Any]) -> None:
    """``bench/results/overload.json``: this invocation's scenarios replace their earlier entries (the others
    stay, so a scenario can be recorded by an invocation of its own); each entry has its date and command."""
    path = RESULTS_DIR / "overload.json"
    saved = json.loads(path.read_text()) if path.exists() else {"benchmark": "overload", "scenarios": {}}
    command = " ".join(["python -m bench.bench_overload", *sys.argv[1:]])
    git = {"head": _git("rev-parse", "--short", "HEAD"),
           "changed": _git("status", "--porcelain", "--", "gateway", "platforms", "tools").splitlines()}
    for name, data in out.items():
        saved["scenarios"][name] = {"machine": machine_info(), "command": command, "git": git, **data}
    RESULTS_DIR.mkdir(exist_ok=True)
    path.write_text(json.dumps(saved, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"\nresults written to {path}")


def _git(*args: str) -> str:
    """What ``git`` says about the code measured (its output, stripped; empty when it fails)."""
    done = subprocess.run(["git", *args], cwd=RESULTS_DIR.parent.parent, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def _settings(pairs: list[str]) -> dict[str, Any]:
    """``a.b=VALUE`` pairs as nested mappings (values read as YAML: numbers, booleans, strings)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        *path, last = key.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(value)
    return out


def main(argv: list[str] | None = None) -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"subset of {','.join(SCENARIOS)}")
    parser.add_argument("--workers", type=int, default=2, help="agent workers of the workers contender")
    parser.add_argument("--concurrency", type=int, default=50, help="closed-loop workers (throughput, warm-ups)")
    parser.add_argument("--duration", type=float, default=6.0, help="closed-loop seconds per target")
    parser.add_argument("--rounds", type=int, default=3,
                        help="throughput: measure the targets this many times, alternating (the VM's speed drifts)")
    parser.add_argument("--admission", default="on,off",
                        help="throughput: admission settings measured, each for both gateways (off: fixed limits at "
                             "the ceilings)")
    parser.add_argument("--floors", default=",".join(RELAYS), help="throughput: relays measured too (comma-separated)")
    parser.add_argument("--burst-seconds", type=float, default=60.0, help="burst: seconds of offered load")
    parser.add_argument("--burst-factor", type=float, default=2.0, help="burst and chat: offered rate / max rate")
    parser.add_argument("--burst-rate", type=float, default=None, help="burst and chat: this rate instead")
    parser.add_argument("--fixed", default="16,64,256", help="burst: ceilings tried with admission off")
    parser.add_argument("--drain-timeout", type=float, default=300.0, help="seconds to wait for every delivery")
    parser.add_argument("--connections", type=int, default=256,
                        help="the poster's connections (the gateway's http.max_connections is 512)")
    parser.add_argument("--at-once", type=int, default=1000, help="at-once: webhooks posted together")
    parser.add_argument("--slow-latency", type=float, default=3.0, help="at-once: model latency (s)")
    parser.add_argument("--slow-tool", action="store_true", help="at-once: a tool call and an answer per run")
    parser.add_argument("--chat-rate", type=float, default=10.0, help="chat: messages per second")
    parser.add_argument("--chat-seconds", type=float, default=20.0, help="chat: seconds of chat per window")
    parser.add_argument("--chat-storms", default="0.5,2",
                        help="chat: webhook storms during the chat, as factors of the max rate (ascending)")
    parser.add_argument("--chat-lead", type=float, default=2.0, help="chat: seconds of storm before the chat")
    parser.add_argument("--admission-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a gateway.admission setting of the adaptive gateways (repeatable; e.g. lag_target_ms=10, "
                             "webhook.floor=4)")
    parser.add_argument("--quiet-cores", type=float, default=0.5,
                        help="before each measurement, wait (up to 30 min) until other processes keep fewer cores "
                             "busy than this")
    parser.add_argument("--storm-calls", type=int, default=200, help="storms: concurrent tool calls per storm")
    parser.add_argument("--storm-sandbox", choices=MODES, default="none",
                        help="storms: tools.sandbox (none, as bench_loop_lag: the tools on the gateway's threads)")
    args = parser.parse_args(argv)
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    args.floors = [f for f in args.floors.split(",") if f]
    args.fixed = [int(c) for c in args.fixed.split(",") if c]
    args.chat_storms = sorted(float(f) for f in args.chat_storms.split(",") if f)
    args.admission_set = _settings(args.admission_set)
    if set(admission := args.admission.split(",")) - {"on", "off"}:
        parser.error("--admission takes on, off or on,off")
    args.admission = [a == "on" for a in admission]
    if unknown := (set(args.scenarios) - set(SCENARIOS)) | (set(args.floors) - set(RELAYS)):
        parser.error(f"unknown scenarios or floors: {', '.join(sorted(unknown))}")
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="hermes-bench-overload-") as tmp:
        out = asyncio.run(_main(args, Path(tmp)))
    for name, data in out.items():
        _REPORT[name](data)
    _save(out)


if __name__ == "__main__":
    main()
