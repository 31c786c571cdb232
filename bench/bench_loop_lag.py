"""Main-loop lag while tools run: does tool code ever stall the gateway's event loop?

An in-process gateway (``ChatDouble`` chat platform plus the signed webhook route) gets
benchmark-only tools, registered like a plugin (toolset ``plugin-bench``): a blocking sleep, an async
sleep (through the ``model_tools`` bridge) and a CPU-bound pure-Python loop, plus a no-op tool whose
storm is the control (the lag the gateway's own work for that many runs causes). For each storm,
``--calls`` chat users at once each make one tool call; meanwhile a ticker task samples the loop's lag
every ``--tick`` seconds and signed webhooks arrive at ``--webhook-rate`` per second, their ack latency
measured. The last storm splits the calls evenly between the three kinds.

    python -m bench.bench_loop_lag [--calls 200] [--sleep 1.0] [--cpu-ms 20]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.bench_chat import start_chat_gateway
from bench.common import (
    ChatDouble,
    LagProbe,
    WebhookClient,
    WebhookRun,
    latency_ms,
    open_loop,
    print_table,
    save_results,
    webhook_platform,
)
from gateway.app import Gateway
from gateway.sim.model_server import ScriptedModel, Turn, text, tool_call
from tools.registry import registry
from toolsets import remove_source_toolset, set_source_toolset

TOOLSET = "plugin-bench"
KINDS = ("blocking", "async", "cpu")
_TOOLS = {"noop": "bench_noop", "blocking": "bench_block_sleep", "async": "bench_async_sleep",
          "cpu": "bench_cpu_loop"}


def _noop(args: dict[str, Any], **_ctx: Any) -> str:
    return "ok"


def _block_sleep(args: dict[str, Any], **_ctx: Any) -> str:
    time.sleep(float(args.get("seconds", 1.0)))
    return "slept"


async def _async_sleep(args: dict[str, Any], **_ctx: Any) -> str:
    await asyncio.sleep(float(args.get("seconds", 1.0)))
    return "slept"


def _cpu_loop(args: dict[str, Any], **_ctx: Any) -> str:
    """Pure-Python work (holds the GIL, unlike hashing large buffers) for about ``ms`` milliseconds."""
    deadline = time.thread_time() + float(args.get("ms", 20)) / 1000
    digest = b""
    while time.thread_time() < deadline:
        for _ in range(200):
            digest = hashlib.sha256(digest).digest()[:8]
    return digest.hex()


def register_bench_tools() -> None:
    """Register the benchmark tools and their toolset (as a plugin would)."""
    schema = {"type": "object", "properties": {"seconds": {"type": "number"}, "ms": {"type": "number"}}}
    for kind, handler in (("noop", _noop), ("blocking", _block_sleep), ("async", _async_sleep), ("cpu", _cpu_loop)):
        name = _TOOLS[kind]
        registry.register(name, TOOLSET, {"name": name, "description": f"Benchmark tool ({kind}).",
                                          "parameters": schema}, handler, is_async=kind == "async")
    set_source_toolset(TOOLSET, "Benchmark-only tools.", list(_TOOLS.values()))


def unregister_bench_tools() -> None:
    """Undo :func:`register_bench_tools`."""
    registry.deregister_toolset(TOOLSET)
    remove_source_toolset(TOOLSET)


def _responder(sleep: float, cpu_ms: float) -> Any:
    """``storm <kind>`` from a user: call that kind's tool; anything else (or a tool result): answer."""
    def respond(request: dict[str, Any]) -> Turn:
        last = (request.get("messages") or [{}])[-1]
        content = str(last.get("content") or "")
        if last.get("role") == "user" and content.startswith("storm "):
            kind = content.split()[1]
            return tool_call(_TOOLS[kind], {"seconds": sleep, "ms": cpu_ms})
        return text("ok")
    return respond


async def _storm(gateway: Gateway, chat: ChatDouble, http: aiohttp.ClientSession, kinds: list[str],
                 args: argparse.Namespace, first_user: int) -> dict[str, Any]:
    probe = LagProbe(args.tick)
    client = WebhookClient(http, f"http://127.0.0.1:{gateway.port}")
    probe.start()
    started = time.perf_counter()
    calls = asyncio.gather(*(chat.say(first_user + i, f"storm {kinds[i % len(kinds)]}", timeout=120)
                             for i in range(args.calls)), return_exceptions=True)
    hooks = asyncio.ensure_future(open_loop(client.post, args.webhook_rate, args.webhook_seconds))
    outcomes = await calls
    elapsed = time.perf_counter() - started
    acks: Any = await hooks
    lags = await probe.stop()
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    runs: list[WebhookRun] = acks.results
    return {"storm": "+".join(kinds) if len(kinds) > 1 else kinds[0], "calls": args.calls, "seconds": elapsed,
            "errors": len(failures) + len(acks.errors),
            "error_samples": [f"{type(f).__name__}: {f}" for f in failures[:2]] + acks.errors[:2],
            "lag": latency_ms(lags), "webhook_ack": latency_ms([r.ack_seconds for r in runs]),
            "watchdog_max_lag_ms_so_far": 1000 * (gateway.metrics.registry.get_sample_value(
                "hermes_event_loop_lag_max_seconds") or 0.0)}


async def _run(args: argparse.Namespace, home: Path) -> list[dict[str, Any]]:
    register_bench_tools()
    rows: list[dict[str, Any]] = []
    try:
        async with ScriptedModel(_responder(args.sleep, args.cpu_ms), api_key="bench-model-key") as model:
            assert model.base_url is not None
            gateway, chat = await start_chat_gateway(home, model.base_url, max_runs=2000, overrides={
                "gateway": {"tool_threads": args.tool_threads},
                "toolsets": {"telegram": TOOLSET},
                "platforms": {"webhook": webhook_platform("none")},
                "limits": {"run_max_tool_calls": 5}})
            try:
                async with aiohttp.ClientSession() as http:
                    storms = [["noop"]] + [[k] for k in KINDS] + [list(KINDS)]
                    for i, kinds in enumerate(storms):
                        row = await _storm(gateway, chat, http, kinds, args, first_user=(i + 1) * 100_000)
                        rows.append(row)
                        print(f"  storm {row['storm']:<20} lag p99 {row['lag']['p99_ms']:7.2f} ms", flush=True)
            finally:
                await gateway.stop(drain_timeout=5)
    finally:
        unregister_bench_tools()
    return rows


def main(argv: list[str] | None = None) -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="concurrent tool calls per storm")
    parser.add_argument("--sleep", type=float, default=1.0, help="seconds each sleeping tool sleeps")
    parser.add_argument("--cpu-ms", type=float, default=20.0, help="CPU milliseconds of each CPU-bound call")
    parser.add_argument("--tool-threads", type=int, default=256, help="gateway.tool_threads")
    parser.add_argument("--tick", type=float, default=0.005, help="lag probe interval (s)")
    parser.add_argument("--webhook-rate", type=float, default=20.0, help="webhooks per second during a storm")
    parser.add_argument("--webhook-seconds", type=float, default=2.0, help="how long webhooks keep arriving")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="hermes-bench-lag-") as tmp:
        rows = asyncio.run(_run(args, Path(tmp)))
    print_table(f"Main-loop lag during {args.calls} concurrent tool calls (in-process gateway, "
                f"tool_threads={args.tool_threads}); ms",
                ["storm", "seconds", "lag p50", "lag p99", "lag max", "watchdog max*", "ack p50", "ack p99",
                 "errors"],
                [[r["storm"], r["seconds"], r["lag"]["p50_ms"], r["lag"]["p99_ms"], r["lag"]["max_ms"],
                  r["watchdog_max_lag_ms_so_far"], r["webhook_ack"]["p50_ms"], r["webhook_ack"]["p99_ms"], r["errors"]]
                 for r in rows])
    print("  * the gateway's own watchdog (hermes_event_loop_lag_max_seconds, 50 ms sampler): max since start")
    save_results("loop_lag", {"calls": args.calls, "sleep_s": args.sleep, "cpu_ms": args.cpu_ms,
                              "tool_threads": args.tool_threads, "tick_s": args.tick, "storms": rows})


if __name__ == "__main__":
    main()
