"""A simulator of Relay, the tiny JSON-over-HTTP chat service of the example platform plugin
(examples/plugins/relay), on 127.0.0.1.

The protocol, bearer token on every request:

- ``GET /v1/updates?after=ID&timeout=S``: the messages with an id above ``after`` (oldest first), waiting up to
  ``S`` seconds (at most 30) for one: ``{"messages": [{"id", "chat", "chat_type", "user", "name", "text"}]}``.
  A client acknowledges what it has taken by asking for ``after`` its last id.
- ``POST /v1/messages`` ``{"chat", "text", "reply_to"?}`` with an optional ``Idempotency-Key`` header (a repeat
  returns the first message's id): ``{"id"}``.

Tests push users' messages with ``user_says`` and read the bot's in ``sent``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from aiohttp import web

_MAX_WAIT = 30.0


@dataclass(frozen=True, slots=True)
class RelayMessage:
    """A message the bot posted."""

    id: str
    chat: str
    text: str
    reply_to: str | None


class RelaySimulator:
    """The Relay service: users' messages queued for long polls, the bot's posts recorded."""

    def __init__(self, token: str = "relay-token-0123") -> None:
        self.token = token
        self.sent: list[RelayMessage] = []
        self.polls = 0
        self._inbox: list[dict[str, Any]] = []
        self._keys: dict[str, str] = {}
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.app = web.Application()
        self.app.router.add_get("/v1/updates", self._updates)
        self.app.router.add_post("/v1/messages", self._messages)

    async def start(self) -> None:
        """Listen on an ephemeral port of 127.0.0.1 (``url``)."""
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        """Stop listening (open long polls end)."""
        if self._runner is not None:
            await self._runner.cleanup()

    async def user_says(self, text: str, *, chat: str = "room-1", user: str = "u1", name: str = "Ada",
                        chat_type: str = "dm") -> int:
        """Queue a user's message for the next poll; its id."""
        async with self._changed:
            message = {"id": len(self._inbox) + 1, "chat": chat, "chat_type": chat_type, "user": user,
                       "name": name, "text": text}
            self._inbox.append(message)
            self._changed.notify_all()
        return message["id"]

    async def wait_for(self, predicate: Any, timeout: float = 15.0) -> list[RelayMessage]:
        """Wait until ``predicate(sent)`` holds; the bot's messages so far."""
        async def _wait() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: predicate(self.sent))
        await asyncio.wait_for(_wait(), timeout)
        return list(self.sent)

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    async def _updates(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "unauthorized"}, status=401)
        try:
            after = int(request.query.get("after", "0"))
            wait = min(float(request.query.get("timeout", "0")), _MAX_WAIT)
        except ValueError:
            return web.json_response({"error": "after and timeout must be numbers"}, status=400)
        self.polls += 1

        def pending() -> list[dict[str, Any]]:
            return [m for m in self._inbox if m["id"] > after]

        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait_for(lambda: bool(pending())), wait)
            return web.json_response({"messages": pending()})

    async def _messages(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "unauthorized"}, status=401)
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("chat"), str) or not isinstance(body.get("text"),
                                                                                                   str):
            return web.json_response({"error": "chat and text are required strings"}, status=400)
        key = request.headers.get("Idempotency-Key")
        async with self._changed:
            if key is not None and key in self._keys:
                return web.json_response({"id": self._keys[key]})
            message = RelayMessage(f"b{len(self.sent) + 1}", body["chat"], body["text"], body.get("reply_to"))
            self.sent.append(message)
            if key is not None:
                self._keys[key] = message.id
            self._changed.notify_all()
        return web.json_response({"id": message.id})
