"""Benchmark-only tools, loaded by ``bench_loop_lag`` and ``bench_sandbox`` into the gateway (and its sandbox
workers) as a plugin file (toolset ``plugin-bench``).

A no-op, an echo, a blocking sleep, an async sleep (run through the ``model_tools`` bridge on the worker
thread's own loop), a CPU-bound pure-Python loop and a backtracking regular expression. The tools take
``seconds`` (the sleeps), ``ms`` (the CPU loop), ``size`` (the regex's input) and ``text`` (the echo).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from typing import Any

from tools.registry import ToolRegistry

TOOLS = {"noop": "bench_noop", "echo": "bench_echo", "blocking": "bench_block_sleep",
         "async": "bench_async_sleep", "cpu": "bench_cpu_loop", "regex": "bench_regex"}
# No "c" in the input: the match fails after trying every split of the run of "a"s between the three
# stars, ~size**3 / 6 steps, all inside one call into the C regex engine (the GIL held throughout).
_BACKTRACKING = re.compile(r"a*a*a*c")


def _noop(args: dict[str, Any], **_ctx: Any) -> str:
    return "ok"


def _echo(args: dict[str, Any], **_ctx: Any) -> str:
    return str(args.get("text", ""))


def _block_sleep(args: dict[str, Any], **_ctx: Any) -> str:
    time.sleep(float(args.get("seconds", 1.0)))
    return "slept"


async def _async_sleep(args: dict[str, Any], **_ctx: Any) -> str:
    await asyncio.sleep(float(args.get("seconds", 1.0)))
    return "slept"


def _cpu_loop(args: dict[str, Any], **_ctx: Any) -> str:
    """Pure-Python work (holds the GIL, unlike hashing large buffers) for ``ms`` milliseconds of this thread's CPU."""
    deadline = time.thread_time() + float(args.get("ms", 20)) / 1000
    digest = b""
    while time.thread_time() < deadline:
        for _ in range(200):
            digest = hashlib.sha256(digest).digest()[:8]
    return digest.hex()


def _regex(args: dict[str, Any], **_ctx: Any) -> str:
    """One failing match of a backtracking pattern over ``size`` characters (bounded: ~size**3 / 6 steps)."""
    return "match" if _BACKTRACKING.match("a" * int(args.get("size", 500))) else "no match"


def regex_size(ms: float) -> tuple[int, float]:
    """The ``size`` whose regex match takes about ``ms`` of CPU here, and what one match of it took (ms)."""
    def cost(size: int) -> float:
        started = time.thread_time()
        _regex({"size": size})
        return (time.thread_time() - started) * 1000

    size = 200
    for _ in range(3):  # the cost grows as size**3: three rescalings land within a few percent
        size = max(50, round(size * (ms / min(cost(size) for _ in range(3))) ** (1 / 3)))
    return size, min(cost(size) for _ in range(3))


def register(registry: ToolRegistry) -> None:
    """Plugin hook: register the tools in ``plugin-bench`` (sandboxed, the default isolation)."""
    schema = {"type": "object", "properties": {"seconds": {"type": "number"}, "ms": {"type": "number"},
                                               "size": {"type": "integer"}, "text": {"type": "string"}}}
    handlers = {"noop": _noop, "echo": _echo, "blocking": _block_sleep, "async": _async_sleep, "cpu": _cpu_loop,
                "regex": _regex}
    for kind, name in TOOLS.items():
        registry.register(name, "plugin-bench", {"name": name, "description": f"Benchmark tool ({kind}).",
                                                 "parameters": schema}, handlers[kind], is_async=kind == "async")
