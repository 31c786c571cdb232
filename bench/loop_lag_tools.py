"""Benchmark-only tools, loaded by ``bench_loop_lag`` into the gateway as a plugin file (toolset ``plugin-bench``).

A no-op, a blocking sleep, an async sleep (run through the ``model_tools`` bridge on the worker thread's
own loop) and a CPU-bound pure-Python loop. Every tool takes ``seconds`` (the sleeps) and ``ms`` (the
CPU loop).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

from tools.registry import ToolRegistry

TOOLS = {"noop": "bench_noop", "blocking": "bench_block_sleep", "async": "bench_async_sleep",
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
    """Pure-Python work (holds the GIL, unlike hashing large buffers) for ``ms`` milliseconds of this thread's CPU."""
    deadline = time.thread_time() + float(args.get("ms", 20)) / 1000
    digest = b""
    while time.thread_time() < deadline:
        for _ in range(200):
            digest = hashlib.sha256(digest).digest()[:8]
    return digest.hex()


def register(registry: ToolRegistry) -> None:
    """Plugin hook: register the four tools in ``plugin-bench``."""
    schema = {"type": "object", "properties": {"seconds": {"type": "number"}, "ms": {"type": "number"}}}
    handlers = {"noop": _noop, "blocking": _block_sleep, "async": _async_sleep, "cpu": _cpu_loop}
    for kind, name in TOOLS.items():
        registry.register(name, "plugin-bench", {"name": name, "description": f"Benchmark tool ({kind}).",
                                                 "parameters": schema}, handlers[kind], is_async=kind == "async")
