"""``hermes-gateway demo``: the whole gateway, offline, on the embedded defaults.

Starts the scripted model, a local "CI system" (a status page plus a callback receiver)
and simulators of Telegram, Slack and Discord; runs the gateway against them; fires three
signed GitHub webhooks (good, forged, duplicate); has one conversation on each chat
platform; and prints what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import uuid
from typing import Any

import aiohttp
from aiohttp import web

from gateway.app import Gateway
from gateway.config import parse_config
from gateway.sim.callback_sink import CallbackSink
from gateway.sim.discord_api import ALICE_ID, DiscordSimulator
from gateway.sim.model_server import ScriptedModel, rules, tool_call
from gateway.sim.slack_api import DEFAULT_USER as SLACK_USER
from gateway.sim.slack_api import SlackSimulator
from gateway.sim.telegram_api import DEFAULT_USER_ID as TELEGRAM_USER
from gateway.sim.telegram_api import TelegramSimulator
from platforms.webhook_signatures import sign

STATUS_PAGE = ("<html><head><title>CI status</title></head><body><h1>Build #42</h1>"
               "<p>All 118 tests passed on main in 3m12s.</p></body></html>")


class _LocalCI(CallbackSink):
    """The callback receiver, plus a status page the agent reads with web_extract."""

    def __init__(self) -> None:
        super().__init__("/results")
        self.app.router.add_get("/status", self._status)

    async def _status(self, _request: web.Request) -> web.Response:
        return web.Response(text=STATUS_PAGE, content_type="text/html")


def _demo_config(home: str, model_url: str, ci: str, secret: str) -> dict[str, Any]:
    return {
        "model": {"base_url": model_url, "api_key": "demo-key", "name": "scripted-model", "stream": False},
        "http": {"port": 0, "api_token": "demo-api-token"},
        "store": {"url": f"sqlite:///{home}/state.db"},
        "gateway": {"workspace": f"{home}/workspace"},
        "web": {"allow_private_networks": ["127.0.0.1/32"]},
        "platforms": {
            "webhook": {"routes": {"github": {
                "secret": secret, "scheme": "github", "events": ["push"],
                "prompt": "A push landed on {payload.repository.full_name} by {payload.pusher.name}: "
                          "{payload.head_commit.message}. Check the CI status page and summarise.",
                "deliver_to": "callback:ci"}}},
            "callback": {"targets": {"ci": {"url": f"{ci}/results", "secret": "demo-callback-secret"}}},
        },
    }


def _show(title: str, status: int, body: Any) -> None:
    print(f"  {title:<28} -> HTTP {status} {json.dumps(body)}")


def _chat_config(tg: TelegramSimulator, slack: SlackSimulator, discord: DiscordSimulator) -> dict[str, Any]:
    return {
        "platforms": {
            "telegram": {"enabled": True, "token": tg.token, "base_url": tg.base_url,
                         "base_file_url": tg.base_file_url, "poll_timeout": 2},
            "slack": {"enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
                      "api_base_url": slack.base_url},
            "discord": {"enabled": True, "token": discord.token, "api_base_url": discord.api_base_url,
                        "gateway_url": discord.gateway_url, "guild_ready_timeout": 0.05},
        },
        "auth": {"platforms": {"telegram": {"allowed_users": [str(TELEGRAM_USER)]},
                               "slack": {"allowed_users": [SLACK_USER]},
                               "discord": {"allowed_users": [str(ALICE_ID)]}}},
    }


async def run_demo() -> int:
    """Run the demo; returns the process exit code."""
    ci = _LocalCI()
    secret = uuid.uuid4().hex
    tg, slack, discord = TelegramSimulator(), SlackSimulator(), DiscordSimulator()
    async with contextlib.AsyncExitStack() as stack:
        home = stack.enter_context(tempfile.TemporaryDirectory(prefix="hermes-demo-"))
        os.environ.setdefault("HERMES_GATEWAY_HOME", home)
        for server in (ci, tg, slack, discord):
            await server.start()
            stack.push_async_callback(server.stop)
        responder = rules((r"UNTRUSTED WEBHOOK PAYLOAD",
                           tool_call("web_extract", {"urls": [f"{ci.base_url}/status"], "max_chars": 400})))
        model = await stack.enter_async_context(ScriptedModel(responder))
        base = _demo_config(home, model.base_url, ci.base_url, secret)
        chat = _chat_config(tg, slack, discord)
        base["platforms"].update(chat["platforms"])
        gateway = Gateway(parse_config({**base, "auth": chat["auth"]}))
        await gateway.start()
        try:
            ok = await _fire(gateway.port or 0, secret, ci)
            ok = await _chat(tg, slack, discord) and ok
        finally:
            await gateway.stop(drain_timeout=5)
    print("demo finished: " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


async def _chat(tg: TelegramSimulator, slack: SlackSimulator, discord: DiscordSimulator) -> bool:
    print("\nchat platforms (each through its real client library against a local simulator):")
    tg.user_sends('remember that I like tea [[tool:memory {"action": "add", "text": "likes tea"}]]')
    tg_reply = (await tg.wait_for_messages(1, TELEGRAM_USER, timeout=15))[-1].text
    print(f"  telegram DM          -> {tg_reply[:100]!r}")
    await slack.wait_for_sockets(1, timeout=15)
    action = await slack.user_mentions_bot('plan the launch [[tool:todo {"action": "add", "items": ["ship it"]}]]')
    (slack_reply,) = await slack.wait_for_messages(1, thread_ts=action.ts, timeout=15)
    print(f"  slack mention        -> threaded reply {slack_reply.text[:90]!r}")
    await asyncio.wait_for(discord.wait_for_ready(), 15)
    discord.user_sends_dm("hello from Discord")
    discord_reply = (await discord.wait_for_bot_messages(1, timeout=15))[-1]["content"]
    print(f"  discord DM           -> {discord_reply[:100]!r}")
    return (tg_reply.startswith("Done:") and slack_reply.text.startswith("Done:")
            and discord_reply == "Echo: hello from Discord")


async def _fire(port: int, secret: str, ci: _LocalCI) -> bool:
    url = f"http://127.0.0.1:{port}/webhooks/github"
    payload = {"ref": "refs/heads/main", "repository": {"full_name": "acme/rocket"},
               "pusher": {"name": "ana"}, "head_commit": {"message": "Fix the launch countdown"}}
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", "X-GitHub-Event": "push",
               **sign("github", secret, body, delivery_id=str(uuid.uuid4()))}
    print(f"hermes-gateway demo: three signed GitHub webhooks against a gateway on 127.0.0.1:{port}")
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=body, headers=headers) as r:
            first = await r.json()
            _show("good signature", r.status, first)
        forged = {**headers, "X-Hub-Signature-256": "sha256=" + "0" * 64, "X-GitHub-Delivery": str(uuid.uuid4())}
        async with http.post(url, data=body, headers=forged) as r:
            _show("forged signature", r.status, await r.json())
        async with http.post(url, data=body, headers=headers) as r:
            dup = await r.json()
            _show("same delivery again", r.status, dup)
        await ci.wait_for(1, timeout=20)
        auth = {"Authorization": "Bearer demo-api-token"}
        async with http.get(f"http://127.0.0.1:{port}/runs/{first['run_id']}", headers=auth) as r:
            run = await r.json()
    print(f"\nrun {run['id']}: {run['status']} after {run['model_calls']} model calls")
    for call in run["tool_calls"]:
        print(f"  tool {call['name']}({call['arguments']}) in {call['seconds'] * 1000:.1f} ms")
        print(f"    -> {call['result'][:160]}...")
    print(f"  result: {run['result'][:200]}")
    print(f"\ndelivered to the CI callback: {len(ci.received)} message(s)")
    for msg in ci.received:
        print(f"  [{msg['webhook-id']}] {msg['text'][:160]}")
    return (run["status"] == "completed" and dup["run_id"] == first["run_id"] and len(ci.received) == 1
            and "All 118 tests passed" in run["tool_calls"][0]["result"])
