"""Webhook runs through the whole gateway, against three floors measured in the same invocation.

Path: signed POST -> HTTP ingress, signature check, durable inbox, 202 -> agent loop (the scripted model
asks for one ``read_file`` call, then answers) -> outbox -> signed POST to a callback sink. The gateway
runs as a subprocess (``python -m gateway run``) so its CPU time is its own; so do the floor relays
(``bench/relay.py``: the same hops with only an inbox insert; the model called through the openai SDK's
``chat.completions.create`` (``relay-openai``, the SDK floor), through the SDK client the way the gateway calls
it (``relay-openai-post``), or with raw aiohttp (``relay-raw``)).

Closed loop at ``--concurrency`` for ``--duration`` seconds gives runs/s and CPU ms per run; then an
open loop at ``--open-fraction`` of the gateway's maximum gives ack, end-to-end and gateway-added latency
(end-to-end minus the run's ``model_seconds``). ``--profile`` instead runs the gateway under pyinstrument
(or ``--profiler cprofile``) and writes the profile to ``bench/results/``.

With ``--rounds N`` the targets are measured N times in alternation; the tables show medians, and a ratio
is the median of the ratios within each round (the shared VM's speed drifts by ±20% over minutes).

    python -m bench.bench_webhook [--latencies 0,0.2] [--duration 10] [--rounds 3] [--profile [--profiler cprofile]]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path
from statistics import median
from typing import Any

import aiohttp

from bench.common import (
    API_TOKEN,
    MODEL_KEY,
    RESULTS_DIR,
    BenchSink,
    LoadResult,
    ServiceProcess,
    WebhookClient,
    WebhookRun,
    closed_loop,
    cpu_seconds,
    gateway_argv,
    latency_ms,
    open_loop,
    print_table,
    save_results,
    webhook_responder,
    write_gateway_config,
)
from gateway.sim.model_server import ScriptedModel

FLOORS = {"relay-openai": "openai", "relay-openai-post": "post", "relay-raw": "raw"}  # target: column name
TARGETS = ("gateway", *FLOORS)
_WARMUP_SECONDS = 1.5


def _service(target: str, home: Path, model_url: str, sink_url: str, *, stream: bool, profiler: str | None = None,
             profile_to: Path | None = None) -> ServiceProcess:
    home.mkdir(parents=True, exist_ok=True)
    if target == "gateway":
        config = write_gateway_config(home, model_url, sink_url, stream=stream)
        return ServiceProcess(target, gateway_argv(config, profiler, profile_to), home / "stderr.log")
    client = target.removeprefix("relay-")
    return ServiceProcess(target, [sys.executable, "-m", "bench.relay", "--client", client, "--model-url", model_url,
                                   "--sink-url", sink_url, "--db", str(home / "relay.db")], home / "stderr.log")


async def _model_seconds(session: aiohttp.ClientSession, service: ServiceProcess, sink: BenchSink,
                         runs: list[WebhookRun]) -> list[float]:
    """Time each run spent in the model: the relay reports it to the sink; the gateway in ``GET /runs/{id}``."""
    if service.name != "gateway":
        return [float(sink.bodies[r.run_id]["model_seconds"]) for r in runs]
    gate = asyncio.Semaphore(16)

    async def one(run: WebhookRun) -> float:
        async with gate, session.get(f"{service.base_url}/runs/{run.run_id}",
                                     headers={"Authorization": f"Bearer {API_TOKEN}"},
                                     timeout=aiohttp.ClientTimeout(total=30)) as resp:
            return float((await resp.json())["model_seconds"])

    return list(await asyncio.gather(*(one(r) for r in runs)))


def _latencies(runs: list[WebhookRun], model_seconds: list[float]) -> dict[str, Any]:
    return {"ack": latency_ms([r.ack_seconds for r in runs]), "e2e": latency_ms([r.e2e_seconds for r in runs]),
            "added": latency_ms([r.e2e_seconds - m for r, m in zip(runs, model_seconds, strict=True)]),
            "model": latency_ms(model_seconds)}


async def _measure(target: str, service: ServiceProcess, session: aiohttp.ClientSession, sink: BenchSink,
                   args: argparse.Namespace, open_rate: float | None) -> dict[str, Any]:
    client = WebhookClient(session, service.base_url, sink)
    await closed_loop(client.run, args.concurrency, _WARMUP_SECONDS)
    cpu_before, harness_before = service.cpu_seconds(), cpu_seconds(os.getpid())
    closed: LoadResult[WebhookRun] = await closed_loop(client.run, args.concurrency, args.duration)
    cpu, harness = service.cpu_seconds() - cpu_before, cpu_seconds(os.getpid()) - harness_before
    out: dict[str, Any] = {
        "target": target, "runs": len(closed.results), "errors": len(closed.errors), "seconds": closed.elapsed,
        "runs_per_s": closed.rate, "cpu_ms_per_run": cpu * 1000 / max(1, len(closed.results)),
        "service_cpu_pct": 100 * cpu / closed.elapsed, "harness_cpu_pct": 100 * harness / closed.elapsed,
        "closed_e2e": latency_ms([r.e2e_seconds for r in closed.results]), "error_samples": closed.errors[:3]}
    rate = open_rate if open_rate is not None else args.open_fraction * closed.rate
    if args.open_duration > 0 and rate > 0:
        opened = await open_loop(client.run, rate, args.open_duration)
        model = await _model_seconds(session, service, sink, opened.results)
        out["open"] = {"offered_rate": opened.offered_rate, "runs": len(opened.results), "errors": len(opened.errors),
                       **_latencies(opened.results, model)}
    return out


async def _one_latency(latency: float, args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    async with ScriptedModel(webhook_responder, api_key=MODEL_KEY, latency=latency) as model:
        sink = BenchSink()
        await sink.start()
        connector = aiohttp.TCPConnector(limit=2000)
        try:
            async with aiohttp.ClientSession(connector=connector) as session:
                open_rate: float | None = args.open_rate
                for round_no, target in ((r, t) for r in range(args.rounds) for t in args.targets):
                    assert model.base_url is not None
                    service = _service(target, tmp / f"{target}-{int(latency * 1000)}ms", model.base_url, sink.url,
                                       stream=args.stream)
                    await service.start()
                    try:
                        row = await _measure(target, service, session, sink, args, open_rate)
                    finally:
                        await service.stop()
                        model.requests.clear()
                        sink.reset()
                    if args.open_rate is None and (target == "gateway" or open_rate is None):
                        open_rate = args.open_fraction * row["runs_per_s"]
                    rows.append({"model_latency_ms": latency * 1000, "round": round_no, **row})
                    print(f"  round {round_no + 1} {target:<13} model {latency * 1000:>4.0f} ms: "
                          f"{row['runs_per_s']:7.1f} runs/s, "
                          f"{row['cpu_ms_per_run']:6.2f} ms CPU/run ({row['errors']} errors)", flush=True)
        finally:
            await sink.stop()
    return rows


def _median_row(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One target's rounds as one row: the median of each figure, errors summed."""
    row = {key: median(r[key] for r in rounds)
           for key in ("runs_per_s", "cpu_ms_per_run", "service_cpu_pct", "harness_cpu_pct")}
    row["errors"] = sum(r["errors"] for r in rounds)
    opens = [r["open"] for r in rounds if "open" in r]
    if opens:
        row["open"] = {"offered_rate": median(o["offered_rate"] for o in opens),
                       "errors": sum(o["errors"] for o in opens),
                       **{kind: {q: median(o[kind][q] for o in opens) for q in ("p50_ms", "p99_ms")}
                          for kind in ("ack", "e2e", "added")}}
    return row


def _paired(rows: list[dict[str, Any]], floor: list[dict[str, Any]], key: str) -> list[float]:
    """``key`` of each round of ``rows`` over the same round of ``floor`` (measured minutes apart at most)."""
    floors = {r["round"]: r[key] for r in floor}
    return [r[key] / floors[r["round"]] for r in rows if floors.get(r["round"])]


def _report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Print the tables: per target the median over rounds, ratios as the median of same-round ratios."""
    ratios: dict[str, Any] = {}
    table, lat_table, rounds_notes = [], [], []
    for latency in sorted({r["model_latency_ms"] for r in rows}):
        group = {t: [r for r in rows if r["model_latency_ms"] == latency and r["target"] == t]
                 for t in dict.fromkeys(r["target"] for r in rows if r["model_latency_ms"] == latency)}
        floors = {name: group.get(name, []) for name in FLOORS}
        for name, measured in group.items():
            row = _median_row(measured)
            paired = {f: (_paired(measured, fl, "cpu_ms_per_run"), _paired(measured, fl, "runs_per_s"))
                      for f, fl in floors.items()}
            cells = {f: [f"{median(values):.2f}x" if values else "-" for values in pair] for f, pair in paired.items()}
            table.append([name, f"{latency:.0f}", row["runs_per_s"], row["cpu_ms_per_run"],
                          *(c for f in FLOORS for c in cells[f]),
                          f"{row['service_cpu_pct']:.0f}/{row['harness_cpu_pct']:.0f}", row["errors"]])
            if "open" in row:
                o = row["open"]
                lat_table.append([name, f"{latency:.0f}", o["offered_rate"], o["ack"]["p50_ms"], o["ack"]["p99_ms"],
                                  o["e2e"]["p50_ms"], o["e2e"]["p99_ms"], o["added"]["p50_ms"], o["added"]["p99_ms"],
                                  o["errors"]])
            if name == "gateway":
                ratios[f"{latency:.0f}ms"] = {f"cpu_vs_{f}": pair[0] for f, pair in paired.items()} | {
                    f"runs_per_s_vs_{f}": pair[1] for f, pair in paired.items()}
                rounds_notes += [f"  {latency:.0f} ms model, gateway CPU/{short} by round: "
                                 + " ".join(f"{v:.2f}x" for v in paired[floor][0])
                                 for floor, short in FLOORS.items() if len(measured) > 1 and paired[floor][0]]
    title = "Closed loop: throughput and CPU per run (ratios: ours / floor"
    title += ", medians over rounds; a ratio is the median of same-round ratios)" if rounds_notes else ")"
    print_table(title, ["target", "model ms", "runs/s", "CPU ms/run",
                        *(f"{kind}/{short}" for short in FLOORS.values() for kind in ("CPU", "rps")),
                        "CPU% svc/harness", "errors"], table)
    print("  CPU% = share of one core used by the process under test / by this benchmark process (load generator,\n"
          "  scripted model and sink); near 100 the harness, not the target, limits runs/s.")
    for note in rounds_notes:
        print(note)
    if lat_table:
        print_table("Open loop at a fixed rate (same offered rate for every target); latencies in ms",
                    ["target", "model ms", "rate/s", "ack p50", "ack p99", "e2e p50", "e2e p99", "added p50",
                     "added p99", "errors"], lat_table)
    return ratios


async def _profiled_gateway(args: argparse.Namespace, home: Path, saved: Path, load: bool) -> int:
    """Start the gateway under ``--profiler``, optionally drive the closed loop, stop; returns the runs done."""
    async with ScriptedModel(webhook_responder, api_key=MODEL_KEY) as model:
        sink = BenchSink()
        await sink.start()
        try:
            assert model.base_url is not None
            service = _service("gateway", home, model.base_url, sink.url, stream=args.stream,
                               profiler=args.profiler, profile_to=saved)
            await service.start()
            try:
                if not load:
                    await asyncio.sleep(1.0)  # `gateway run` installs its SIGTERM handler just after "listening"
                    return 0
                async with aiohttp.ClientSession() as http:
                    result = await closed_loop(WebhookClient(http, service.base_url, sink).run, args.concurrency,
                                               args.duration)
                print(f"profiled {len(result.results)} runs at {result.rate:.1f} runs/s (slowed by the profiler)")
                return len(result.results)
            finally:
                await service.stop()
        finally:
            await sink.stop()


async def _profile(args: argparse.Namespace, tmp: Path) -> None:
    """Profile the gateway under the 0 ms closed loop; save the profile and summarise it."""
    suffix = {"pyinstrument": "pyisession", "cprofile": "pstats"}[args.profiler]
    RESULTS_DIR.mkdir(exist_ok=True)
    saved = RESULTS_DIR / f"webhook_profile.{suffix}"
    if args.profiler == "pyinstrument":
        await _profiled_gateway(args, tmp / "load", saved, load=True)
        _summarise_pyinstrument(saved, args.profile_top)
        return
    baseline = tmp / "idle.pstats"
    await _profiled_gateway(args, tmp / "idle", baseline, load=False)  # start-up and shutdown alone
    runs = await _profiled_gateway(args, tmp / "load", saved, load=True)
    _summarise_cprofile(saved, baseline, runs, args.profile_top)
    print(f"pstats: {saved}")


def _summarise_pyinstrument(saved: Path, top: int) -> None:
    from pyinstrument.renderers import ConsoleRenderer, HTMLRenderer
    from pyinstrument.session import Session

    profile = Session.load(saved)
    html = saved.with_suffix(".html")
    html.write_text(HTMLRenderer().render(profile), encoding="utf-8")
    print("\nWall-clock self time by frame (pyinstrument samples the main thread; frames of code running in\n"
          "SQLAlchemy's greenlets are attributed to where the greenlet switched, so idle time shows up there):")
    print("\n".join(ConsoleRenderer(flat=True, show_all=True, time="percent_of_total").render(profile)
                    .splitlines()[:top]))
    print(f"\nHTML: {html}")


def _self_time_by_package(saved: Path) -> dict[str, float]:
    import pstats

    root = str(RESULTS_DIR.parent.parent) + "/"
    by_package: dict[str, float] = {}
    entries = pstats.Stats(str(saved)).stats.items()  # type: ignore[attr-defined]
    for (file, _line, func), (_cc, _nc, self_time, _cum, _callers) in entries:
        if file == "~":
            key = "(idle: epoll)" if "poll" in func else f"builtin {func.removeprefix('<').removesuffix('>')}"
        elif "site-packages/" in file:
            key = file.split("site-packages/", 1)[1].split("/", 1)[0]
        elif file.startswith(root):
            key = "ours: " + file[len(root):].split("/", 1)[0]
        else:
            key = "stdlib: " + Path(file).name
        by_package[key] = by_package.get(key, 0.0) + self_time
    return by_package


def _summarise_cprofile(saved: Path, baseline: Path, runs: int, top: int) -> None:
    loaded, idle = _self_time_by_package(saved), _self_time_by_package(baseline)
    work = {k: v - idle.get(k, 0.0) for k, v in loaded.items() if k != "(idle: epoll)"}
    busy = sum(v for v in work.values() if v > 0)
    print_table(f"Main-thread self time under load by package (cProfile, start-up/shutdown subtracted; "
                f"{runs} runs; cProfile inflates pure-Python call-heavy code)",
                ["package", "ms per run", "share %"],
                [[k, 1000 * v / max(1, runs), 100 * v / busy]
                 for k, v in sorted(work.items(), key=lambda kv: -kv[1])[:top]])


def main(argv: list[str] | None = None) -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latencies", default="0,0.2", help="model latencies in seconds, comma-separated")
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"subset of {','.join(TARGETS)}")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure the targets this many times, alternating (the machine's speed drifts)")
    parser.add_argument("--concurrency", type=int, default=50, help="closed-loop workers")
    parser.add_argument("--duration", type=float, default=10.0, help="closed-loop seconds per target")
    parser.add_argument("--open-duration", type=float, default=5.0, help="open-loop seconds per target (0: skip)")
    parser.add_argument("--open-fraction", type=float, default=0.5, help="open-loop rate as a share of max")
    parser.add_argument("--open-rate", type=float, default=None,
                        help="fixed open-loop rate per second instead (to compare builds at the same load)")
    parser.add_argument("--no-stream", dest="stream", action="store_false",
                        help="gateway with model.stream=false (default: the product default, true)")
    parser.add_argument("--profile", action="store_true", help="profile the gateway instead of benchmarking it")
    parser.add_argument("--profiler", choices=["pyinstrument", "cprofile"], default="pyinstrument",
                        help="pyinstrument (HTML report) or cprofile (CPU self time by package)")
    parser.add_argument("--profile-top", type=int, default=30, help="lines of the profile summary to print")
    args = parser.parse_args(argv)
    args.targets = [t for t in args.targets.split(",") if t]
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory(prefix="hermes-bench-webhook-") as tmp:
        if args.profile:
            asyncio.run(_profile(args, Path(tmp)))
            return
        rows: list[dict[str, Any]] = []
        for latency in (float(x) for x in args.latencies.split(",")):
            rows += asyncio.run(_one_latency(latency, args, Path(tmp)))
    ratios = _report(rows)
    save_results("webhook", {"concurrency": args.concurrency, "duration_s": args.duration, "rounds": args.rounds,
                             "open_fraction": args.open_fraction, "gateway_stream": args.stream,
                             "ratios": ratios, "rows": rows})


if __name__ == "__main__":
    main()
