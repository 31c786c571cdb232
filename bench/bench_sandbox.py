"""Tool sandbox: what a sandboxed call costs, and what it buys the gateway's event loop.

1. **Round trip** (in this process). ``registry.dispatch`` of the same tools with no sandbox installed
   (``tools.sandbox: none``: the handler runs on the calling thread) and through the worker pool the
   gateway builds (``gateway.tool_sandbox.start_sandbox``, ``tools.sandbox: bwrap``): an echo tool from a
   plugin file (``bench/loop_lag_tools.py``, loaded into this process and, from ``plugins.dir``, into every
   worker), ``read_file`` of a one-line file and ``search_files`` over 20 small files. ``--n`` calls one
   after another (``search_files``: a fifth of that), then as many from ``--threads`` threads at once;
   ``--rounds`` rounds alternate the two sides, after a warm-up that starts the workers. Per-call p50 / p90
   / p99 in microseconds, the sandbox's added p50, calls/s and this process's CPU per call (the workers' own
   CPU is not in it); also the pool's start (the isolation probe, then the first workers ready).
2. **Loop lag** (two gateway subprocesses as ``bench_loop_lag`` runs them: the Telegram simulator, webhooks
   at ``--webhook-rate`` meanwhile). One gateway with ``tools.sandbox: none``, one with the sandbox, started
   together and warmed up (calls of a 0.2 s sleep, twice ``--workers`` at once: every worker starts); then
   ``--storm-rounds`` rounds in which their storms alternate (each round starting with the other side), so
   both sides see the same minutes of the VM: ``--calls`` concurrent runs whose one tool is a no-op (the
   control: the gateway's own work), a CPU-bound pure-Python loop (``--cpu-ms`` of CPU) or a backtracking
   regular expression (one Python ``re`` match sized here to take ``--regex-ms``: C code that holds the GIL
   for the whole match). Lag p50 / p99 / max of the rounds' samples together, from the gateway's own watchdog
   histogram (``bench_loop_lag``'s reading), the share of samples within 5 ms, runs/s until the last answer,
   the gateway's CPU and its sandbox workers' CPU (its descendant processes).

    python -m bench.bench_sandbox [--n 1000] [--threads 4] [--rounds 3] [--calls 200] [--cpu-ms 20] [--regex-ms 30]
                                  [--storm-rounds 2] [--workers 4] [--trace-iterations]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import psutil

from bench.bench_loop_lag import add_storm_arguments, long_iterations, pooled_lag, storm_gateway, trace_env
from bench.common import BENCH_FILE, percentile, print_table, ratio, save_results
from bench.loop_lag_tools import TOOLS, regex_size
from gateway.config import parse_config
from gateway.tool_sandbox import start_sandbox, stop_sandbox
from tools.plugins import load_plugins
from tools.registry import registry
from tools.sandbox import SandboxPool

SIDES = ("in-process", "sandbox")
STORMS = ("noop", "cpu", "regex")
_SEARCH_FILES = 20
_SEARCH_LINES = 50


# -- 1. round trip -------------------------------------------------------------------------------------

def _workspace(home: Path) -> Path:
    """A workspace with the one-line file and a small tree for ``search_files``."""
    workspace = home / "workspace"
    tree = workspace / "tree"
    tree.mkdir(parents=True)
    (workspace / BENCH_FILE).write_text("build 42: all 118 tests passed\n", encoding="utf-8")
    for i in range(_SEARCH_FILES):
        lines = [f"line {j} of file {i}: nothing to see" for j in range(_SEARCH_LINES)]
        lines[i % _SEARCH_LINES] = f"line {i} of file {i}: the needle"
        (tree / f"notes_{i:02d}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return workspace


def _cases() -> list[tuple[str, str, dict[str, Any], int]]:
    """(label, tool, arguments, share of ``--n``) of the round-trip calls."""
    return [("echo (plugin tool)", TOOLS["echo"], {"text": "hello from the benchmark"}, 1),
            ("read_file, one line", "read_file", {"path": BENCH_FILE}, 1),
            (f"search_files, {_SEARCH_FILES} files", "search_files", {"pattern": "needle", "path": "tree"}, 5)]


def _timed(call: Callable[[], str], n: int) -> list[float]:
    latencies = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - started)
    return latencies


def _concurrently(call: Callable[[], str], n: int, threads: int) -> tuple[list[float], float]:
    """``n`` calls split over ``threads`` threads started together; (latencies, wall seconds)."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)

    def worker(i: int) -> None:
        barrier.wait()
        latencies[i] = _timed(call, n // threads)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in pool:
        thread.join()
    return [s for part in latencies for s in part], time.perf_counter() - started


def _round_trip(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    """Part 1: the same calls with no sandbox and through the pool, ``--rounds`` alternating rounds."""
    workspace = _workspace(home)
    plugins = home / "plugins"
    plugins.mkdir()
    shutil.copy(Path(__file__).with_name("loop_lag_tools.py"), plugins / "bench.py")
    cfg = parse_config({"gateway": {"workspace": str(workspace)}, "store": {"url": f"sqlite:///{home}/state.db"},
                        "plugins": {"dir": str(plugins), "entry_points": False},
                        "tools": {"sandbox": args.sandbox, "workers": args.workers}})
    registry.discover_builtin_tools()
    loaded = load_plugins(plugins, entry_points=False)
    ctx = {"session_key": "bench", "user_key": "telegram:1", "platform": "telegram", "chat_id": "1",
           "thread_id": None, "is_admin": False, "run_id": "bench", "workspace": str(workspace)}
    started = time.perf_counter()
    pool: SandboxPool | None = start_sandbox(cfg)
    probed = time.perf_counter()
    try:
        if pool is None or pool.isolation.level not in ("bwrap", "uid"):
            raise SystemExit(f"no sandbox to measure: {pool.isolation.describe() if pool else 'tools.sandbox none'}")
        deadline = time.monotonic() + 30
        while pool.stats()["idle"] < 2 and time.monotonic() < deadline:  # start() launches one of each kind
            time.sleep(0.005)
        ready = time.perf_counter()
        runners = {"in-process": None, "sandbox": pool}
        samples: dict[tuple[str, str, str], list[float]] = {}
        cpu: dict[tuple[str, str, str], float] = {}
        walls: dict[tuple[str, str], float] = {}
        results: dict[tuple[str, str], str] = {}
        for side, runner in runners.items():  # warm-up: the first calls import, cache and start workers
            registry.sandbox = runner
            for label, tool, tool_args, _ in _cases():
                results[side, label] = registry.dispatch(tool, tool_args, **ctx)
                _concurrently(lambda t=tool, a=tool_args: registry.dispatch(t, a, **ctx), 25 * args.threads,
                              args.threads)
        for _ in range(args.rounds):
            for side, runner in runners.items():
                registry.sandbox = runner
                for label, tool, tool_args, share in _cases():
                    n = args.n // share

                    def call(t: str = tool, a: dict[str, Any] = tool_args) -> str:
                        return registry.dispatch(t, a, **ctx)

                    cpu_before = time.process_time()
                    samples.setdefault((side, label, "sequential"), []).extend(_timed(call, n))
                    cpu_middle = time.process_time()
                    latencies, wall = _concurrently(call, n, args.threads)
                    cpu_after = time.process_time()
                    samples.setdefault((side, label, "threads"), []).extend(latencies)
                    for key, spent in (((side, label, "sequential"), cpu_middle - cpu_before),
                                       ((side, label, "threads"), cpu_after - cpu_middle)):
                        cpu[key] = cpu.get(key, 0.0) + spent
                    walls[side, label] = walls.get((side, label), 0.0) + wall
        stats = pool.stats()
    finally:
        stop_sandbox(pool)
        loaded.unload()
    rows = []
    for label, *_ in _cases():
        for pattern in ("sequential", "threads"):
            shown = pattern if pattern == "sequential" else f"{args.threads} threads"
            base = percentile(samples["in-process", label, pattern], 50) * 1e6
            for side in SIDES:
                lat = samples[side, label, pattern]
                p50 = percentile(lat, 50) * 1e6
                rows.append({"call": label, "pattern": shown,
                             "side": side, "n": len(lat), "p50_us": p50, "p90_us": percentile(lat, 90) * 1e6,
                             "p99_us": percentile(lat, 99) * 1e6, "added_p50_us": p50 - base,
                             "calls_per_s": (len(lat) / walls[side, label] if pattern == "threads"
                                             else len(lat) / sum(lat)),
                             "cpu_us_per_call": cpu[side, label, pattern] / len(lat) * 1e6})
    same = {label: results["in-process", label] == results["sandbox", label] for label, *_ in _cases()}
    return {"isolation": pool.isolation.describe(), "probe_ms": (probed - started) * 1000,
            "workers_ready_ms": (ready - probed) * 1000, "pool": stats, "same_results": same, "rows": rows}


# -- 2. loop lag -----------------------------------------------------------------------------------------

def _sandbox_cpu(pid: int) -> float:
    """CPU seconds of the process's descendants (the sandbox workers and their bubblewrap parents), live and
    reaped."""
    try:
        process = psutil.Process(pid)
        own = process.cpu_times()
        total = own.children_user + own.children_system
        children = process.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0.0
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = child.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


async def _storms(args: argparse.Namespace, home: Path, size: int) -> dict[str, Any]:
    """Part 2: both gateways started together and warmed up, then ``--storm-rounds`` rounds of their storms
    alternating (the same minutes of the VM; each round starts with the other side)."""
    windows: list[dict[str, Any]] = []
    modes = {"in-process": "none", "sandbox": args.sandbox}
    traces = {side: home / side / "iterations.jsonl" for side in modes} if args.trace_iterations else {}
    async with AsyncExitStack() as stack:
        gateways = {}
        for side, mode in modes.items():
            (home / side).mkdir()
            gateways[side] = await stack.enter_async_context(storm_gateway(
                home / side, args, {"sandbox": mode, "workers": args.workers},
                trace_env(traces[side]) if traces else None))
        for side, gateway in gateways.items():  # every worker started (calls that wait), code imported
            await gateway.window(f"warm-up ({side})", ("blocking",), webhooks=False, calls=2 * args.workers,
                                 tool_args={"seconds": 0.2})
        for i in range(args.storm_rounds):
            order = list(gateways.items()) if i % 2 == 0 else list(reversed(gateways.items()))
            for kind in STORMS:
                for side, gateway in order:
                    before = _sandbox_cpu(gateway.service.pid)
                    row = await gateway.window(f"{kind} ({side})", (kind,), tool_args={"ms": args.cpu_ms, "size": size})
                    windows.append({**row, "side": side, "kind": kind, "round": i + 1,
                                    "sandbox_cpu_s": _sandbox_cpu(gateway.service.pid) - before})
        problems = {side: gateway.service.log_problems() for side, gateway in gateways.items()}
    traced = {side: [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
              for side, path in traces.items()}
    rows = []
    for kind in STORMS:
        for side in modes:
            mine = [w for w in windows if w["kind"] == kind and w["side"] == side]
            row = {"kind": kind, "side": side, "calls": sum(w["calls"] for w in mine),
                   "storm_seconds": sum(w["storm_seconds"] for w in mine),
                   "lag": pooled_lag([w["lag"] for w in mine]), "p99_per_round": [w["lag"]["p99_ms"] for w in mine],
                   "webhook_ack_p99_ms": max(w["webhook_ack"]["p99_ms"] for w in mine),
                   "gateway_cpu_s": sum(w["gateway_cpu_s"] for w in mine),
                   "sandbox_cpu_s": sum(w["sandbox_cpu_s"] for w in mine), "errors": sum(w["errors"] for w in mine)}
            if traced:
                its = [long_iterations(traced[side], *w["wall_clock"]) for w in mine]
                row["long_iterations"] = {k: sum(it[k] for it in its) for k in ("over_5ms", "over_10ms", "busy_ms",
                                                                                 "cpu_ms")}
            rows.append(row)
    return {"rows": rows, "windows": windows, "gateway_log_problems": problems}


# -- output -----------------------------------------------------------------------------------------------

def _share_within(lag: dict[str, Any], seconds: float) -> float:
    """The share of lag samples at most ``seconds`` (a bucket bound)."""
    counts = lag["counts"]
    n = counts[-1][1] if counts else 0
    return next((c for bound, c in counts if bound >= seconds), n) / n if n else float("nan")


def _print_round_trip(args: argparse.Namespace, out: dict[str, Any]) -> None:
    print_table(f"Round trip of registry.dispatch, us per call ({out['isolation']}; tools.workers={args.workers}; "
                f"{args.rounds} rounds of {args.n} calls per row, search_files {args.n // 5})",
                ["call", "pattern", "side", "p50", "p90", "p99", "added p50", "calls/s", "CPU us/call here"],
                [[r["call"], r["pattern"], r["side"], r["p50_us"], r["p90_us"], r["p99_us"],
                  "-" if r["side"] == SIDES[0] else f"{r['added_p50_us']:+.0f}", r["calls_per_s"],
                  r["cpu_us_per_call"]] for r in out["rows"]])
    print(f"  pool start: isolation probe {out['probe_ms']:.0f} ms, first two workers ready "
          f"{out['workers_ready_ms']:.0f} ms later; workers started {out['pool']['started']}, "
          f"killed {out['pool']['killed']}; same results on both sides: {out['same_results']}")


def _print_storms(args: argparse.Namespace, out: dict[str, Any], size: int, regex_ms: float) -> None:
    rows = out["rows"]
    print_table(f"Main-loop lag during {args.calls} concurrent runs, one tool call each (cpu: {args.cpu_ms:g} ms of "
                f"pure Python; regex: re match of {size} chars, {regex_ms:.1f} ms here), tools.sandbox none vs "
                f"{args.sandbox} (tools.workers={args.workers}); {args.storm_rounds} rounds pooled; lag from the "
                f"gateway's watchdog, ms; seconds until the last answer",
                ["storm", "side", "seconds", "runs/s", "lag p50", "lag p99", "p99 per round", "lag max", "<= 5 ms",
                 "ack p99", "gateway CPU s", "sandbox CPU s", "errors"],
                [[r["kind"], r["side"], r["storm_seconds"], r["calls"] / r["storm_seconds"], r["lag"]["p50_ms"],
                  r["lag"]["p99_ms"], " / ".join(f"{v:.3g}" for v in r["p99_per_round"]),
                  r["lag"]["max_ms"] if r["lag"]["max_exact"] else f"<={r['lag']['max_ms']:.4g}",
                  f"{_share_within(r['lag'], 0.005):.0%}", r["webhook_ack_p99_ms"], r["gateway_cpu_s"],
                  r["sandbox_cpu_s"], r["errors"]] for r in rows])
    by = {(r["kind"], r["side"]): r for r in rows}

    def p99(kind: str, side: str) -> float:
        return float(by[kind, side]["lag"]["p99_ms"])

    def rate(kind: str, side: str) -> float:
        return float(by[kind, side]["calls"] / by[kind, side]["storm_seconds"])

    print_table("Sandbox / in-process, and each storm's lag p99 / its side's no-op storm",
                ["storm", "lag p99", "runs/s", "gateway CPU", "p99/no-op in-process", "p99/no-op sandbox"],
                [[kind, ratio(p99(kind, "sandbox"), p99(kind, "in-process")),
                  ratio(rate(kind, "sandbox"), rate(kind, "in-process")),
                  ratio(by[kind, "sandbox"]["gateway_cpu_s"], by[kind, "in-process"]["gateway_cpu_s"]),
                  ratio(p99(kind, "in-process"), p99("noop", "in-process")),
                  ratio(p99(kind, "sandbox"), p99("noop", "sandbox"))] for kind in STORMS])
    if args.trace_iterations:
        print_table("Main-loop iterations whose callbacks ran over 5 ms (traced, all rounds; ms)",
                    ["storm", "side", "over 5 ms", "over 10 ms", "wall ms in them", "CPU ms in them"],
                    [[r["kind"], r["side"], *(r["long_iterations"][k] for k in ("over_5ms", "over_10ms", "busy_ms",
                                                                                 "cpu_ms"))] for r in rows])
    for side, problems in out["gateway_log_problems"].items():
        for problem in problems:
            print(f"  gateway log ({side}): {problem}")


def main(argv: list[str] | None = None) -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="round-trip calls per row and round")
    parser.add_argument("--threads", type=int, default=4, help="threads calling at once in the round trip")
    parser.add_argument("--rounds", type=int, default=3, help="alternating round-trip rounds")
    parser.add_argument("--sandbox", choices=("auto", "bwrap", "uid"), default="bwrap",
                        help="the tools.sandbox compared with none")
    parser.add_argument("--workers", type=int, default=4, help="tools.workers (per kind)")
    parser.add_argument("--regex-ms", type=float, default=30.0, help="CPU milliseconds of one regex match (sized here)")
    parser.add_argument("--storm-rounds", type=int, default=2, help="rounds of the storms (samples pooled)")
    parser.add_argument("--trace-iterations", action="store_true",
                        help="trace the gateways' loop iterations over 5 ms (bench/loop_trace; adds overhead)")
    parser.add_argument("--only", choices=("round-trip", "storms"), help="run one part only")
    add_storm_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    load_before = os.getloadavg()
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="hermes-bench-sandbox-") as tmp:
        if args.only != "storms":
            out["round_trip"] = _round_trip(args, Path(tmp) / "round-trip")
            _print_round_trip(args, out["round_trip"])
        if args.only != "round-trip":
            size, regex_ms = regex_size(args.regex_ms)
            out["regex"] = {"size": size, "ms_here": regex_ms}
            out["storms"] = asyncio.run(_storms(args, Path(tmp), size))
    out["load_average"] = {"before": load_before, "after": os.getloadavg()}
    if "storms" in out:
        _print_storms(args, out["storms"], out["regex"]["size"], out["regex"]["ms_here"])
    print(f"  load average (1/5/15 min) before {' '.join(f'{v:.2f}' for v in load_before)}, "
          f"after {' '.join(f'{v:.2f}' for v in out['load_average']['after'])}")
    save_results("sandbox", {"args": vars(args), **out})


if __name__ == "__main__":
    main()
