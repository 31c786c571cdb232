"""Chat throughput and concurrency: many users in DMs, each message a run with history.

Platforms ``telegram``, ``slack`` and ``discord``: the real adapter (python-telegram-bot long polling,
slack-bolt Socket Mode, discord.py gateway websocket) in a gateway subprocess (``python -m gateway run``)
configured for that platform alone, against the platform's simulator in this process; the CPU figure is
the gateway's alone. Platform ``double``: an in-process Telegram-like adapter (:class:`bench.common.ChatDouble`)
injected into an in-process gateway; the CPU figure then covers gateway, scripted model and load generator
together. The model streams (the default), so each answer is a preview message edited into the final text;
a reply counts when the final text is posted.

1. ``--users`` users each send ``--messages`` messages, one after the other (the next once the answer
   arrived), with a 0 ms model: messages/s and reply latency (sent -> final answer delivered). Each
   platform of ``--platform`` in turn (``all``: telegram, slack and discord), one table row each.
2. ``--inflight-users`` users send one message each to a model answering after ``--slow-latency``
   seconds: the peak of ``hermes_runs_in_flight`` and of concurrent model requests, with
   ``gateway.max_concurrent_runs`` = ``--max-runs``.

Phase 1 uses ``--platform`` (default telegram), phase 2 ``--inflight-platform`` (default double, the
core's own concurrency without a platform adapter's intake in the way).

    python -m bench.bench_chat [--platform telegram slack discord|all|double] [--users 1000] [--messages 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import (
    MODEL_KEY,
    BenchDiscord,
    BenchSink,
    BenchSlack,
    BenchTelegram,
    ChatDouble,
    ServiceProcess,
    SimulatedChat,
    cpu_seconds,
    gateway_argv,
    latency_ms,
    print_table,
    save_results,
    write_gateway_config,
)
from gateway.app import Gateway
from gateway.config import parse_config
from gateway.sim.model_server import ScriptedModel

Say = Callable[[int, str, float], Awaitable[tuple[float, float, float]]]


def chat_config(home: Path, model_url: str, max_runs: int, overrides: dict[str, Any] | None = None) -> Any:
    """Gateway config for in-process chat benchmarks: every user of the double is allowed."""
    data: dict[str, Any] = {
        "model": {"base_url": model_url, "api_key": MODEL_KEY, "name": "scripted-model", "max_retries": 0,
                  "timeout": 120},
        "http": {"host": "127.0.0.1", "port": 0},
        "store": {"url": f"sqlite:///{home}/state.db"},
        "gateway": {"workspace": str(home / "workspace"), "max_concurrent_runs": max_runs,
                    "loop_lag_warn_ms": 2000},
        "auth": {"platforms": {"telegram": {"allow_all": True}}},
    }
    for section, values in (overrides or {}).items():
        data[section] = {**data.get(section, {}), **values}
    return parse_config(data, env={"HERMES_GATEWAY_HOME": str(home)})


async def start_chat_gateway(home: Path, model_url: str, max_runs: int,
                             overrides: dict[str, Any] | None = None) -> tuple[Gateway, ChatDouble]:
    """An in-process gateway whose only chat platform is a :class:`ChatDouble`."""
    chat = ChatDouble()
    gateway = Gateway(chat_config(home, model_url, max_runs, overrides), adapters={"telegram": chat})
    await gateway.start()
    return gateway, chat


@dataclass
class _Chat:
    """What a phase needs from either platform."""

    say: Say
    runs_in_flight: Callable[[], Awaitable[float]]
    cpu_seconds: Callable[[], float]


@contextlib.asynccontextmanager
async def _double(home: Path, model_url: str, max_runs: int, overrides: dict[str, Any]) -> AsyncIterator[_Chat]:
    gateway, chat = await start_chat_gateway(home, model_url, max_runs, overrides)

    async def in_flight() -> float:
        return gateway.metrics.registry.get_sample_value("hermes_runs_in_flight", {"kind": "chat"}) or 0.0

    try:
        yield _Chat(chat.say, in_flight, lambda: cpu_seconds(os.getpid()))
    finally:
        await gateway.stop(drain_timeout=5)


_SIMULATORS: dict[str, Callable[[], SimulatedChat]] = {"telegram": BenchTelegram, "slack": BenchSlack,
                                                        "discord": BenchDiscord}


@contextlib.asynccontextmanager
async def _simulated(platform: str, home: Path, model_url: str, max_runs: int,
                     overrides: dict[str, Any]) -> AsyncIterator[_Chat]:
    """A gateway subprocess whose one chat platform is ``platform``'s real adapter on its simulator."""
    sim, sink = _SIMULATORS[platform](), BenchSink()
    await sim.start()
    await sink.start()
    home.mkdir(parents=True, exist_ok=True)
    config = write_gateway_config(home, model_url, sink.url, chats=[sim],
                                  overrides={"gateway": {"max_concurrent_runs": max_runs}, **overrides})
    service = ServiceProcess("gateway", gateway_argv(config), home / "stderr.log")
    try:
        await service.start()
        async with aiohttp.ClientSession() as http:
            async def in_flight() -> float:
                return await service.gauge(http, "hermes_runs_in_flight", 'kind="chat"')

            await service.wait_ready(http)  # a Discord event sent before READY is lost
            yield _Chat(sim.say, in_flight, service.cpu_seconds)
    finally:
        await service.stop()
        await sim.stop()
        await sink.stop()
        for problem in service.log_problems():
            print(f"  {platform} gateway log: {problem}")


async def _conversations(chat: _Chat, users: int, messages: int) -> dict[str, Any]:
    replies: list[float] = []
    acks: list[float] = []
    errors: list[str] = []

    async def user(u: int) -> None:
        for i in range(messages):
            try:
                sent, accepted, answered = await chat.say(u, f"message {i} from user {u}", 120.0)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                return
            acks.append(accepted - sent)
            replies.append(answered - sent)

    cpu0, started = chat.cpu_seconds(), time.perf_counter()
    await asyncio.gather(*(user(u) for u in range(1, users + 1)))
    elapsed, cpu = time.perf_counter() - started, chat.cpu_seconds() - cpu0
    return {"users": users, "messages_per_user": messages, "messages": len(replies), "errors": len(errors),
            "error_samples": errors[:3], "seconds": elapsed, "messages_per_s": len(replies) / elapsed,
            "cpu_ms_per_message": cpu * 1000 / max(1, len(replies)), "ack": latency_ms(acks),
            "reply": latency_ms(replies)}


async def _in_flight(chat: _Chat, model: ScriptedModel, users: int) -> dict[str, Any]:
    peak_runs = 0.0
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak_runs
        while not done.is_set():
            peak_runs = max(peak_runs, await chat.runs_in_flight())
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    started = time.perf_counter()
    outcomes = await asyncio.gather(*(chat.say(10_000_000 + u, "hello", 120.0) for u in range(users)),
                                    return_exceptions=True)
    elapsed = time.perf_counter() - started
    done.set()
    await sampler
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    replies = [o[2] - o[0] for o in outcomes if not isinstance(o, BaseException)]
    return {"users": users, "model_latency_s": model.latency, "peak_runs_in_flight": peak_runs,
            "peak_model_requests_in_flight": model.peak_in_flight, "seconds": elapsed, "errors": len(failures),
            "error_samples": [f"{type(f).__name__}: {f}" for f in failures[:3]], "reply": latency_ms(replies)}


_Platform = Callable[[Path, str, int, dict[str, Any]], contextlib.AbstractAsyncContextManager[_Chat]]
_PLATFORMS: dict[str, _Platform] = {"double": _double,
                                   **{name: functools.partial(_simulated, name) for name in _SIMULATORS}}
_WHERE = {"telegram": "Telegram adapter (python-telegram-bot, long polling) + simulator, gateway subprocess",
          "slack": "Slack adapter (slack-bolt, Socket Mode) + simulator, gateway subprocess",
          "discord": "Discord adapter (discord.py, gateway websocket) + simulator, gateway subprocess",
          "double": "in-process gateway + ChatDouble"}
_ALL = "all"  # every real adapter on its simulator


def _platforms(chosen: list[str]) -> list[str]:
    """``--platform`` values in order, ``all`` expanded, each once."""
    expanded = [name for c in chosen for name in (_SIMULATORS if c == _ALL else [c])]
    return list(dict.fromkeys(expanded))


async def _run(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.users:
        by_platform: dict[str, Any] = {}
        for name in _platforms(args.platform):
            async with ScriptedModel(api_key=MODEL_KEY) as model:
                assert model.base_url is not None
                platform = {"platforms": {name: {"reactions": args.reactions == "on"}}} if name in _SIMULATORS else {}
                async with _PLATFORMS[name](home / f"fast-{name}", model.base_url, args.max_runs, platform) as chat:
                    by_platform[name] = await _conversations(chat, args.users, args.messages)
            by_platform[name]["load_average_1m"] = os.getloadavg()[0]
        out["conversations_by_platform"] = by_platform
    if args.inflight_users:
        async with ScriptedModel(api_key=MODEL_KEY, latency=args.slow_latency) as model:
            assert model.base_url is not None
            async with _PLATFORMS[args.inflight_platform](home / "slow", model.base_url, args.max_runs, {}) as chat:
                out["in_flight"] = await _in_flight(chat, model, args.inflight_users)
    return out


def _report(args: argparse.Namespace, out: dict[str, Any]) -> None:
    if "conversations_by_platform" in out:
        _report_conversations(out["conversations_by_platform"])
    if "in_flight" in out:
        f = out["in_flight"]
        print_table(f"Runs in flight ({_WHERE[args.inflight_platform]}) with a {f['model_latency_s']:.0f} s model, "
                    f"{f['users']} users at once (gateway.max_concurrent_runs={args.max_runs})",
                    ["users", "peak runs in flight", "peak model requests", "seconds", "reply p50 ms",
                     "reply p99 ms", "errors"],
                    [[f["users"], f["peak_runs_in_flight"], f["peak_model_requests_in_flight"], f["seconds"],
                      f["reply"]["p50_ms"], f["reply"]["p99_ms"], f["errors"]]])


def _report_conversations(by_platform: dict[str, dict[str, Any]]) -> None:
    first = next(iter(by_platform.values()))
    print_table(f"Chat, 0 ms model: {first['users']} users x {first['messages_per_user']} messages per platform "
                "(each user waits for an answer before the next)",
                ["platform", "messages", "msg/s", "CPU ms/msg*", "ack p50", "ack p99", "reply p50", "reply p99",
                 "reply max", "errors", "load 1m"],
                [[name, c["messages"], c["messages_per_s"], c["cpu_ms_per_message"], c["ack"]["p50_ms"],
                  c["ack"]["p99_ms"], c["reply"]["p50_ms"], c["reply"]["p99_ms"], c["reply"]["max_ms"],
                  c["errors"], c["load_average_1m"]] for name, c in by_platform.items()])
    for name, c in by_platform.items():
        print(f"  {name}: {_WHERE[name]}" + "".join(f"\n    error: {e}" for e in c["error_samples"]))
    print("  * CPU of the gateway process; for double, of the whole benchmark process (gateway, scripted model, "
          f"load generator).\n  Latencies in ms; with {first['users']} users waiting at once, reply latency is "
          "mostly queueing. load 1m: the machine's load average after the platform's run.")


def main(argv: list[str] | None = None) -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", nargs="+", choices=[*sorted(_PLATFORMS), _ALL], default=["telegram"],
                        help="throughput phase, one platform after the other: telegram, slack, discord (real "
                             "adapter + simulator, gateway subprocess), all (those three) or double (in-process)")
    parser.add_argument("--inflight-platform", choices=sorted(_PLATFORMS), default="double",
                        help="slow-model phase platform (default double: the core's own concurrency)")
    parser.add_argument("--users", type=int, default=1000, help="users in the throughput phase (0: skip)")
    parser.add_argument("--messages", type=int, default=5, help="messages per user, sent one after the other")
    parser.add_argument("--inflight-users", type=int, default=1500, help="users of the slow-model phase (0: skip)")
    parser.add_argument("--slow-latency", type=float, default=3.0, help="model latency of the slow phase (s)")
    parser.add_argument("--max-runs", type=int, default=2000, help="gateway.max_concurrent_runs")
    parser.add_argument("--reactions", choices=("on", "off"), default="on",
                        help="platforms.<p>.reactions of the simulated platforms (status reactions cost API calls)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="hermes-bench-chat-") as tmp:
        out = asyncio.run(_run(args, Path(tmp)))
    _report(args, out)
    save_results("chat", {"platforms": _platforms(args.platform), "inflight_platform": args.inflight_platform,
                          "max_concurrent_runs": args.max_runs, **out})

if __name__ == "__main__":
    main()
