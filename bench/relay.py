"""The floor: a minimal webhook relay doing the same network hops as the gateway, and nothing else.

HMAC check, one inbox row in SQLite (WAL, synchronous=NORMAL), 202, then two model calls (tool turn,
final answer), the result stored, the answer POSTed to the sink. No dedupe beyond the unique key, no
outbox, no retries. Run as a subprocess so its CPU is measured alone:

    python -m bench.relay --client openai|openai-post|raw --model-url URL --sink-url URL --db PATH

``openai`` calls the model through ``chat.completions.create`` (the SDK floor); ``openai-post`` through the
same client the way the gateway does (``post_chat_completion``: without the SDK's request transform).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import signal
import sqlite3
import time
import uuid
from typing import Any

import aiohttp
from aiohttp import web

import model_tools
from bench.common import BENCH_FILE, BENCH_TOOLSET, MODEL_KEY, WEBHOOK_SECRET
from gateway.agent import DEFAULT_SYSTEM_PROMPT
from gateway.agent_loop import build_client, post_chat_completion
from gateway.config import ModelSettings
from gateway.runs import WEBHOOK_SYSTEM_NOTE
from tools.registry import registry

_SYSTEM = DEFAULT_SYSTEM_PROMPT + "\n\n" + WEBHOOK_SYSTEM_NOTE  # the gateway's prompt: the same request size


class _Relay:
    def __init__(self, client_kind: str, model_url: str, sink_url: str, db: str) -> None:
        self.client_kind = client_kind
        self.model_url = model_url.rstrip("/")
        self.sink_url = sink_url
        self.db = sqlite3.connect(db, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS inbox (id TEXT PRIMARY KEY, delivery TEXT UNIQUE, "
                        "payload TEXT, result TEXT)")
        self.http = aiohttp.ClientSession()
        self.openai = build_client(ModelSettings(base_url=model_url, api_key=MODEL_KEY, max_retries=0)) \
            if client_kind.startswith("openai") else None
        self.tasks: set[asyncio.Task[None]] = set()
        registry.discover_builtin_tools()  # the same tool definitions the gateway sends: same request size
        self.tools = model_tools.get_tool_definitions([BENCH_TOOLSET])

    async def close(self) -> None:
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.openai is not None:
            await self.openai.close()
        await self.http.close()
        self.db.close()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        expected = "sha256=" + hmac.new(WEBHOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, request.headers.get("X-Hub-Signature-256", "")):
            return web.json_response({"error": "bad signature"}, status=401)
        run_id = uuid.uuid4().hex
        try:
            self.db.execute("INSERT INTO inbox (id, delivery, payload) VALUES (?, ?, ?)",
                            (run_id, request.headers.get("X-GitHub-Delivery", run_id), body.decode()))
        except sqlite3.IntegrityError:
            return web.json_response({"duplicate": True}, status=200)
        task = asyncio.create_task(self._run(run_id, body.decode()))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return web.json_response({"run_id": run_id}, status=202)

    async def _complete(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        if self.openai is not None:
            body = {"model": "scripted-model", "messages": messages, "tools": self.tools}
            response = await (post_chat_completion(self.openai, body) if self.client_kind == "openai-post"
                              else self.openai.chat.completions.create(**body))
            msg = response.choices[0].message
            calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                                   "arguments": c.function.arguments}}
                     for c in msg.tool_calls or []]
            return {"role": "assistant", "content": msg.content, **({"tool_calls": calls} if calls else {})}
        async with self.http.post(f"{self.model_url}/chat/completions",
                                  json={"model": "scripted-model", "messages": messages, "tools": self.tools},
                                  headers={"Authorization": f"Bearer {MODEL_KEY}"}) as resp:
            data = await resp.json()
        msg = data["choices"][0]["message"]
        return {k: v for k, v in msg.items() if k in ("role", "content", "tool_calls") and v is not None}

    async def _run(self, run_id: str, payload: str) -> None:
        messages: list[dict[str, Any]] = [{"role": "system", "content": _SYSTEM},
                                          {"role": "user", "content": f"Summarise this push:\n{payload}"}]
        model_seconds = 0.0
        answer: dict[str, Any] = {}
        for _ in range(2):
            started = time.perf_counter()
            answer = await self._complete(messages)
            model_seconds += time.perf_counter() - started
            messages.append(answer)
            if not answer.get("tool_calls"):
                break
            messages += [{"role": "tool", "tool_call_id": c["id"], "content": f"{BENCH_FILE}: ok"}
                         for c in answer["tool_calls"]]
        text = answer.get("content") or ""
        self.db.execute("UPDATE inbox SET result = ? WHERE id = ?", (text, run_id))
        async with self.http.post(self.sink_url, json={"run_id": run_id, "text": text,
                                                       "model_seconds": model_seconds}) as resp:
            await resp.read()


async def _serve(args: argparse.Namespace) -> None:
    relay = _Relay(args.client, args.model_url, args.sink_url, args.db)
    app = web.Application()
    app.router.add_post("/webhooks/{route}", relay.handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"relay ({args.client}): listening on http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    with contextlib.suppress(Exception):
        await relay.close()


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", choices=["openai", "openai-post", "raw"], required=True,
                        help="openai: AsyncOpenAI on DefaultAioHttpClient (as the gateway) through "
                             "chat.completions.create; openai-post: the same client called as the gateway does; "
                             "raw: plain aiohttp")
    parser.add_argument("--model-url", required=True, help="the scripted model's base URL (.../v1)")
    parser.add_argument("--sink-url", required=True, help="where answers are POSTed")
    parser.add_argument("--db", required=True, help="SQLite file for the inbox")
    asyncio.run(_serve(parser.parse_args()))


if __name__ == "__main__":
    main()
