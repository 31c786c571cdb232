"""Main-loop lag while tools run: does tool code ever stall the gateway's event loop?

A gateway subprocess (``python -m gateway run``) with the Telegram adapter polling the Telegram Bot API
simulator and the signed webhook route, all on 127.0.0.1. Its benchmark tools are a plugin file
(``bench/loop_lag_tools.py`` copied into ``plugins.dir``, toolset ``plugin-bench`` for Telegram): a
no-op, a blocking sleep, an async sleep (through the ``model_tools`` bridge) and a CPU-bound pure-Python
loop. For each storm, ``--calls`` new Telegram users at once each ask for one tool call (the scripted
model follows a ``[[tool:...]]`` directive, then answers with the result) while signed webhooks arrive
at ``--webhook-rate`` per second for ``--webhook-seconds``, sent from their own thread and event loop
here so their ack latency is not held up by the simulators. The last storm splits the calls evenly
between the three kinds. The tools run on the gateway's tool threads (``tools.sandbox: none``, as in every
figure of this bench before the sandbox; ``--sandbox`` changes it, and ``bench_sandbox`` compares the two).

The gateway measures its own lag: its watchdog samples the loop every 5 ms while busy (50 ms while
idle) into ``hermes_event_loop_lag_histogram_seconds``. The histogram is read from ``/metrics`` before
and after each window; p50 and p99 of the difference are interpolated within a bucket (as PromQL's
``histogram_quantile``), the max is exact when ``hermes_event_loop_lag_max_seconds`` rose during the
window and otherwise the top bucket's bound (shown as ``<=``). Controls in the same run: an idle gateway
(``--idle-seconds``, no traffic), webhooks alone, and the no-op storm (the gateway's own work for that
many runs).

``--trace-iterations`` also loads ``bench/loop_trace/sitecustomize.py`` into the gateway and prints, per
window, its event-loop iterations whose callbacks ran over 5 ms: how many, how long, and how many callbacks
each ran (one slow callback, or hundreds of short ones).

``--agent-workers N`` sets ``gateway.agent_workers`` (default: the product's, one per core; 0 runs the agent
loops in the gateway's process; ``bench_overload`` compares the two).

    python -m bench.bench_loop_lag [--calls 200] [--sleep 1.0] [--cpu-ms 20] [--webhook-rate 20] [--sandbox none]
                                   [--agent-workers N] [--trace-iterations]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from statistics import median
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.common import (
    MODEL_KEY,
    BenchSink,
    BenchTelegram,
    LoadResult,
    ServiceProcess,
    WebhookClient,
    WebhookRun,
    gateway_argv,
    latency_ms,
    open_loop,
    print_table,
    save_results,
    write_gateway_config,
)
from bench.loop_lag_tools import TOOLS
from gateway.sim.model_server import ScriptedModel
from tools.sandbox import MODES

KINDS = ("blocking", "async", "cpu")
TRACER_DIR = Path(__file__).with_name("loop_trace")
LAG = "hermes_event_loop_lag_histogram_seconds"
LAG_MAX = "hermes_event_loop_lag_max_seconds"


class LagReading:
    """One scrape of the gateway's lag metrics: cumulative histogram buckets and the max gauge."""

    def __init__(self, exposition: str) -> None:
        self.buckets: list[tuple[float, float]] = []  # (upper bound, cumulative count), ascending
        self.max = 0.0
        for family in text_string_to_metric_families(exposition):
            if family.name == LAG:
                self.buckets = sorted((float(s.labels["le"]), s.value) for s in family.samples
                                      if s.name == LAG + "_bucket")
            elif family.name == LAG_MAX:
                self.max = family.samples[0].value

    def since(self, before: LagReading) -> dict[str, Any]:
        """Lag p50 / p99 / max (ms) of the samples taken between ``before`` and this reading."""
        counts = [(bound, count - old) for (bound, count), (_, old) in zip(self.buckets, before.buckets, strict=True)]
        n = counts[-1][1] if counts else 0.0
        exact = self.max > before.max
        top = next((bound for bound, c in counts if c == n), math.inf)  # the first bucket holding every sample
        return _lag_summary(counts, self.max if exact else min(before.max, top), exact)


def _lag_summary(counts: Sequence[tuple[float, float]], high: float, exact: bool) -> dict[str, Any]:
    n = counts[-1][1] if counts else 0.0
    return {"n": int(n), "p50_ms": 1000 * _quantile(0.5, counts), "p99_ms": 1000 * _quantile(0.99, counts),
            "max_ms": 1000 * high, "max_exact": exact, "counts": [list(c) for c in counts],
            "buckets": {f"{bound:g}": c for bound, c in counts if c}}


def pooled_lag(lags: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Lag p50 / p99 / max (ms) of the samples of several windows of one gateway together."""
    counts = [(rows[0][0], sum(c for _, c in rows)) for rows in zip(*(lag["counts"] for lag in lags), strict=True)]
    top = max(lags, key=lambda lag: lag["max_ms"])
    return _lag_summary(counts, top["max_ms"] / 1000, top["max_exact"])


def _quantile(q: float, counts: Sequence[tuple[float, float]]) -> float:
    """The ``q`` quantile (0 < q <= 1) of cumulative bucket counts ending with ``+Inf``, linear within its
    bucket as PromQL's ``histogram_quantile``."""
    n = counts[-1][1] if counts else 0.0
    if not n:
        return float("nan")
    rank, low, below = q * n, 0.0, 0.0
    for bound, count in counts[:-1]:
        if count >= rank:
            return low + (bound - low) * (rank - below) / (count - below)
        low, below = bound, count
    return low  # in the +Inf bucket: its lower bound


def trace_env(trace: Path) -> dict[str, str]:
    """The environment that loads the iteration tracer (``bench/loop_trace``) into a gateway, writing ``trace``."""
    return {"PYTHONPATH": os.pathsep.join([str(TRACER_DIR), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "HERMES_BENCH_LOOP_TRACE": str(trace)}


def long_iterations(traced: Sequence[dict[str, Any]], since: float, until: float) -> dict[str, Any]:
    """Summary of the main loop's traced iterations over 5 ms that ended between ``since`` and ``until`` (epoch
    seconds); iterations of other threads' loops (the async tools' bridge loops) are left out."""
    rows = [r for r in traced if since <= r["t"] <= until and r["thread"] == "MainThread"]
    walls = [r["wall_ms"] for r in rows]
    callbacks = [r["callbacks"] for r in rows]
    return {"over_5ms": len(rows), "over_10ms": sum(w > 10 for w in walls), "max_ms": max(walls, default=0.0),
            "busy_ms": round(sum(walls), 1), "cpu_ms": round(sum(r["cpu_ms"] for r in rows), 1),
            "callbacks_p50": median(callbacks) if rows else 0,
            "callbacks_max": max(callbacks, default=0)}


def _webhooks_in_thread(base_url: str, rate: float, seconds: float) -> LoadResult[WebhookRun]:
    """Signed webhooks at ``rate`` per second for ``seconds``, from this thread's own event loop."""
    async def send() -> LoadResult[WebhookRun]:
        async with aiohttp.ClientSession() as http:
            return await open_loop(WebhookClient(http, base_url).post, rate, seconds)
    return asyncio.run(send())


class StormGateway:
    """A gateway subprocess with the benchmark tools, and the simulators a storm drives (``storm_gateway``)."""

    def __init__(self, args: argparse.Namespace, service: ServiceProcess, http: aiohttp.ClientSession,
                 sim: BenchTelegram, model: ScriptedModel, sink: BenchSink) -> None:
        self.args = args
        self.service = service
        self.http = http
        self.sim = sim
        self.model = model
        self.sink = sink
        self._windows = 0

    async def read_lag(self) -> LagReading:
        """One scrape of the gateway's lag metrics."""
        async with self.http.get(self.service.base_url + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as resp:
            return LagReading(await resp.text())

    async def window(self, name: str, kinds: Sequence[str] = (), *, webhooks: bool = True,
                     tool_args: dict[str, Any] | None = None, idle_seconds: float = 0.0,
                     calls: int | None = None) -> dict[str, Any]:
        """One measured window after ``--settle`` quiet seconds: a storm of ``calls`` (``--calls``) runs whose
        one tool call cycles through ``kinds`` (none: no chat traffic) with ``tool_args``, webhooks meanwhile
        or not; with neither, ``idle_seconds`` of nothing. Prints its lag line."""
        args, service, sim = self.args, self.service, self.sim
        await asyncio.sleep(args.settle)
        self._windows += 1
        first_user = self._windows * 100_000
        before, cpu_before = await self.read_lag(), service.cpu_seconds()
        started, wall_started = time.perf_counter(), time.time()
        hooks = (asyncio.ensure_future(asyncio.to_thread(_webhooks_in_thread, service.base_url, args.webhook_rate,
                                                         args.webhook_seconds)) if webhooks else None)
        directives = {k: f'[[tool:{TOOLS[k]} {json.dumps(tool_args or {})}]]' for k in kinds}
        count = (args.calls if calls is None else calls) if kinds else 0
        outcomes = await asyncio.gather(*(sim.say(first_user + i, directives[kinds[i % len(kinds)]], args.timeout)
                                          for i in range(count)), return_exceptions=True)
        storm_seconds = time.perf_counter() - started
        acks: LoadResult[WebhookRun] = await hooks if hooks is not None else LoadResult()
        if not kinds and not webhooks:
            await asyncio.sleep(idle_seconds)
        elapsed = time.perf_counter() - started
        after, cpu = await self.read_lag(), service.cpu_seconds() - cpu_before
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        sim.forget()
        self.model.requests.clear()
        self.sink.reset()
        lag = after.since(before)
        print(f"  {name:<20} lag p50/p99/max {lag['p50_ms']:6.2f} / {lag['p99_ms']:6.2f} / {lag['max_ms']:6.1f} ms "
              f"over {lag['n']} samples; {elapsed:.1f} s; gateway CPU {cpu:.2f} s", flush=True)
        return {"storm": name, "calls": len(outcomes), "seconds": elapsed, "storm_seconds": storm_seconds,
                "gateway_cpu_s": cpu, "errors": len(failures) + len(acks.errors),
                "error_samples": [f"{type(f).__name__}: {f}" for f in failures[:2]] + acks.errors[:2],
                "lag": lag, "webhook_ack": latency_ms([r.ack_seconds for r in acks.results]),
                "wall_clock": (wall_started, time.time())}


@asynccontextmanager
async def storm_gateway(home: Path, args: argparse.Namespace, tools: Mapping[str, Any] | None = None,
                        env: Mapping[str, str] | None = None) -> AsyncIterator[StormGateway]:
    """A gateway subprocess in ``home`` (``bench/loop_lag_tools.py`` as its plugin, toolset ``plugin-bench`` for
    Telegram, ``tools`` as its config's ``tools`` section) with the scripted model, the sink and the Telegram
    simulator; stopped on exit."""
    plugins = home / "plugins"
    plugins.mkdir()
    shutil.copy(Path(__file__).with_name("loop_lag_tools.py"), plugins / "bench.py")
    async with ScriptedModel(api_key=MODEL_KEY) as model:
        assert model.base_url is not None
        sink, sim = BenchSink(), BenchTelegram()
        await sink.start()
        await sim.start()
        workers = {} if args.agent_workers is None else {"agent_workers": args.agent_workers}
        config = write_gateway_config(home, model.base_url, sink.url, telegram=sim, overrides={
            "gateway": {"tool_threads": args.tool_threads, **workers},
            "plugins": {"dir": str(plugins), "entry_points": False},
            "toolsets": {"telegram": "plugin-bench"},
            "tools": dict(tools or {})})
        service = ServiceProcess("gateway", gateway_argv(config), home / "stderr.log", env)
        try:
            await service.start()
            async with aiohttp.ClientSession() as http:
                yield StormGateway(args, service, http, sim, model, sink)
        finally:
            await service.stop()
            await sim.stop()
            await sink.stop()


def add_storm_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a storm (also ``bench_sandbox``'s)."""
    parser.add_argument("--calls", type=int, default=200, help="concurrent tool calls per storm")
    parser.add_argument("--cpu-ms", type=float, default=20.0, help="CPU milliseconds of each CPU-bound call")
    parser.add_argument("--tool-threads", type=int, default=256, help="gateway.tool_threads")
    parser.add_argument("--agent-workers", type=int, default=None,
                        help="gateway.agent_workers (default: the product's, one per core; 0: the agent loops in "
                             "the gateway's own process)")
    parser.add_argument("--webhook-rate", type=float, default=20.0, help="webhooks per second during a storm")
    parser.add_argument("--webhook-seconds", type=float, default=2.0, help="how long webhooks keep arriving")
    parser.add_argument("--settle", type=float, default=2.0, help="quiet seconds before each window")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for one answer")


async def run_storms(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    """The idle and webhooks-only controls, then each storm, on one gateway in ``home``: their windows (with the
    traced long iterations under ``--trace-iterations``) and the gateway's log problems."""
    trace = home / "iterations.jsonl" if args.trace_iterations else None
    env = trace_env(trace) if trace else {}
    rows: list[dict[str, Any]] = []
    async with storm_gateway(home, args, {"sandbox": args.sandbox}, env) as gateway:
        webhooks = args.webhook_rate > 0
        storms: list[tuple[str, ...]] = [(), *([()] if webhooks else []), ("noop",), *((k,) for k in KINDS), KINDS]
        for i, kinds in enumerate(storms):
            name = "+".join(kinds) or ("webhooks only" if i else "idle")
            rows.append(await gateway.window(name, kinds, webhooks=webhooks and i > 0,
                                             tool_args={"seconds": args.sleep, "ms": args.cpu_ms},
                                             idle_seconds=args.idle_seconds))
    if trace is not None:
        traced = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
        for row in rows:
            row["long_iterations"] = long_iterations(traced, *row["wall_clock"])
    return {"windows": rows, "gateway_log_problems": gateway.service.log_problems()}


def build_parser() -> argparse.ArgumentParser:
    """The command line's options (also how ``bench_overload`` gets this bench's defaults)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_storm_arguments(parser)
    parser.add_argument("--sleep", type=float, default=1.0, help="seconds each sleeping tool sleeps")
    parser.add_argument("--idle-seconds", type=float, default=3.0, help="length of the idle control window")
    parser.add_argument("--sandbox", choices=MODES, default="none",
                        help="tools.sandbox (none: the tools run on the gateway's tool threads, as this bench has "
                             "always measured; bench_sandbox compares both)")
    parser.add_argument("--trace-iterations", action="store_true",
                        help="trace the gateway's loop iterations over 5 ms (bench/loop_trace; adds overhead)")
    return parser


def main(argv: list[str] | None = None) -> None:
    """Command line entry point."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="hermes-bench-lag-") as tmp:
        out = asyncio.run(run_storms(args, Path(tmp)))
    out["load_average"] = {"before": load_before, "after": os.getloadavg()}
    rows = out["windows"]
    print_table(f"Main-loop lag of a gateway subprocess (Telegram adapter + webhooks) during {args.calls} concurrent "
                f"tool calls (tool_threads={args.tool_threads}, tools.sandbox: {args.sandbox}, agent_workers: "
                f"{'default' if args.agent_workers is None else args.agent_workers}), from its own watchdog "
                f"histogram; ms",
                ["storm", "seconds", "lag p50", "lag p99", "lag max", "ack p50", "ack p99", "errors"],
                [[r["storm"], r["seconds"], r["lag"]["p50_ms"], r["lag"]["p99_ms"],
                  r["lag"]["max_ms"] if r["lag"]["max_exact"] else f"<={r['lag']['max_ms']:.4g}",
                  r["webhook_ack"]["p50_ms"], r["webhook_ack"]["p99_ms"], r["errors"]] for r in rows])
    if args.trace_iterations:
        print_table("Loop iterations whose callbacks ran over 5 ms (traced; ms)",
                    ["storm", "over 5 ms", "over 10 ms", "longest", "ms in them", "CPU ms in them", "callbacks p50",
                     "callbacks max"],
                    [[r["storm"], *(r["long_iterations"][k] for k in ("over_5ms", "over_10ms", "max_ms", "busy_ms",
                                                                      "cpu_ms", "callbacks_p50", "callbacks_max"))]
                     for r in rows])
    print(f"  load average (1/5/15 min) before {' '.join(f'{v:.2f}' for v in load_before)}, "
          f"after {' '.join(f'{v:.2f}' for v in out['load_average']['after'])}")
    for problem in out["gateway_log_problems"]:
        print(f"  gateway log: {problem}")
    save_results("loop_lag", {"args": vars(args), **out})


if __name__ == "__main__":
    main()
