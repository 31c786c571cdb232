"""Tool-system micro-benchmarks: definitions cache, call overhead, dispatch with many tools.

- ``get_tool_definitions`` for the Telegram toolset and for a 500-tool plugin toolset, cached (the
  steady state of a run) and uncached (the cache cleared before each call);
- ``handle_function_call`` overhead over calling the handler directly, for a trivial sync tool and a
  trivial async tool (through the bridge: a worker thread's persistent loop, as in the gateway, and
  the new-thread path taken when a loop is already running);
- ``registry.dispatch`` and availability checks with 10 and with 500 registered tools.

Each figure is the median of ``--repeats`` rounds of ``--n`` calls, in microseconds per call.

    python -m bench.bench_tools [--n 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import model_tools
from bench.common import print_table, save_results
from tools.registry import ToolRegistry, registry
from toolsets import remove_source_toolset, set_source_toolset

_SCHEMA = {"type": "object", "properties": {"text": {"type": "string", "description": "Anything."},
                                              "count": {"type": "integer"}}}
MANY = "plugin-bench-many"


def _noop(args: dict[str, Any], **_ctx: Any) -> str:
    return "ok"


async def _anoop(args: dict[str, Any], **_ctx: Any) -> str:
    return "ok"


def _per_call_us(fn: Callable[[], Any], n: int, repeats: int) -> float:
    rounds = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - started) * 1e6 / n)
    return statistics.median(rounds)


def _register(reg: ToolRegistry, count: int, toolset: str) -> list[str]:
    names = [f"bench_tool_{i:03d}" for i in range(count)]
    for name in names:
        reg.register(name, toolset, {"name": name, "description": f"Benchmark tool {name}.", "parameters": _SCHEMA},
                     _noop)
    return names


def _definitions(n: int, repeats: int) -> list[list[Any]]:
    search = model_tools.ToolSearchConfig()
    rows = []
    for label, toolsets in (("hermes-telegram", ["hermes-telegram"]), ("500-tool plugin toolset", [MANY])):
        model_tools.get_tool_definitions(toolsets, tool_search=search)
        cached = _per_call_us(lambda t=toolsets: model_tools.get_tool_definitions(t, tool_search=search), n, repeats)

        def uncached(t: list[str] = toolsets) -> None:
            model_tools.clear_definition_cache()
            model_tools.get_tool_definitions(t, tool_search=search)

        cold = _per_call_us(uncached, max(1, n // 50), repeats)
        count = len(model_tools.get_tool_definitions(toolsets, tool_search=search))
        rows.append([f"get_tool_definitions({label}) -> {count} defs", cached, cold, f"{cold / cached:.0f}x"])
    return rows


def _calls(n: int, repeats: int) -> list[list[Any]]:
    allowed = frozenset({"bench_noop", "bench_anoop"})
    ctx = {"session_key": "s", "user_key": "u", "platform": "telegram", "chat_id": "1", "run_id": "r"}
    direct_sync = _per_call_us(lambda: _noop({}, **ctx), n, repeats)
    via_sync = _per_call_us(lambda: model_tools.handle_function_call("bench_noop", "{}", enabled_tools=allowed,
                                                                     **ctx), n, repeats)

    def in_worker(fn: Callable[[], Any]) -> float:
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(_per_call_us, fn, n, repeats).result()

    async def with_loop_running() -> float:
        return _per_call_us(lambda: model_tools.handle_function_call("bench_anoop", "{}", enabled_tools=allowed,
                                                                     **ctx), max(1, n // 10), repeats)

    loop = asyncio.new_event_loop()
    try:
        direct_async = _per_call_us(lambda: loop.run_until_complete(_anoop({}, **ctx)), n, repeats)
    finally:
        loop.close()
    via_async = in_worker(lambda: model_tools.handle_function_call("bench_anoop", "{}", enabled_tools=allowed, **ctx))
    nested = asyncio.run(with_loop_running())
    return [
        ["sync tool: handler called directly", direct_sync, "-", "-"],
        ["sync tool: handle_function_call", via_sync, "-", f"+{via_sync - direct_sync:.1f} us"],
        ["async tool: run_until_complete directly", direct_async, "-", "-"],
        ["async tool: handle_function_call, worker thread (gateway)", via_async, "-",
         f"+{via_async - direct_async:.1f} us"],
        ["async tool: handle_function_call, loop running (new thread)", nested, "-",
         f"+{nested - direct_async:.1f} us"],
    ]


def _dispatch(n: int, repeats: int) -> list[list[Any]]:
    rows = []
    for count in (10, 500):
        reg = ToolRegistry()
        names = _register(reg, count, "bench")
        target = names[count // 2]
        dispatch = _per_call_us(lambda r=reg, t=target: r.dispatch(t, {"text": "x"}), n, repeats)
        available = _per_call_us(lambda r=reg, ns=names: r.available(ns), max(1, n // 20), repeats)
        definitions = _per_call_us(lambda r=reg, ns=names: r.get_definitions(ns), max(1, n // 100), repeats)
        rows += [[f"registry.dispatch, {count} tools registered", dispatch, "-", "-"],
                 [f"registry.available(all {count})", available, "-", f"{available / count:.2f} us/tool"],
                 [f"registry.get_definitions(all {count})", definitions, "-", f"{definitions / count:.1f} us/tool"]]
    return rows


def main(argv: list[str] | None = None) -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="calls per round")
    parser.add_argument("--repeats", type=int, default=5, help="rounds (the median is reported)")
    args = parser.parse_args(argv)
    registry.discover_builtin_tools()
    registry.register("bench_noop", "plugin-bench", {"name": "bench_noop", "description": "No-op.",
                                                     "parameters": _SCHEMA}, _noop)
    registry.register("bench_anoop", "plugin-bench", {"name": "bench_anoop", "description": "Async no-op.",
                                                      "parameters": _SCHEMA}, _anoop, is_async=True)
    set_source_toolset(MANY, "500 benchmark tools.", _register(registry, 500, MANY))
    try:
        rows = _definitions(args.n, args.repeats) + _calls(args.n, args.repeats) + _dispatch(args.n, args.repeats)
    finally:
        registry.deregister_toolset(MANY)
        registry.deregister_toolset("plugin-bench")
        remove_source_toolset(MANY)
    print_table("Tool system, microseconds per call (median of rounds)",
                ["operation", "us/call", "uncached us", "note"], rows)
    save_results("tools", {"n": args.n, "repeats": args.repeats,
                           "rows": [dict(zip(["operation", "us_per_call", "uncached_us", "note"], r, strict=True))
                                    for r in rows]})


if __name__ == "__main__":
    main()
