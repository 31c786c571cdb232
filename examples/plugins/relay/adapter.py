"""The Relay platform adapter: long-polls Relay's ``/v1/updates`` and posts replies to ``/v1/messages``.

The same contract as the built-in adapters (``platforms.base.BasePlatformAdapter``): every message is handed
to ``on_message`` and acknowledged (the next poll asks for what comes after it) only once the gateway has
stored it; the cursor is kept in the gateway's platform state, so a restart resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

from platforms.base import AdapterState, BasePlatformAdapter, GatewayClosing, MessageEvent, OnMessage, SendResult

from .settings import RelaySettings

logger = logging.getLogger(__name__)

_CURSOR_KEY = "relay:cursor"


class RelayAdapter(BasePlatformAdapter):
    """A bot on a Relay service."""

    name = "relay"
    max_message_length = 4000

    def __init__(self, settings: RelaySettings) -> None:
        super().__init__()
        self.settings = settings
        self._on_message: OnMessage | None = None
        self._session: aiohttp.ClientSession | None = None
        self._poller: asyncio.Task[None] | None = None

    async def connect(self, on_message: OnMessage, *, receive: bool = True) -> None:
        """Open the HTTP session; with ``receive``, start polling."""
        self._on_message = on_message
        token = self.settings.token.get_secret_value()
        self._session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"})
        self._set_state(AdapterState.CONNECTED)
        if receive:
            await self.start_receiving()

    async def disconnect(self) -> None:
        """Stop polling and close the session."""
        await self.stop_receiving()
        if self._session is not None:
            await self._session.close()
        self._set_state(AdapterState.DISCONNECTED)

    async def start_receiving(self) -> None:
        """Start the long-poll loop (once)."""
        if self._poller is None:
            self._receiving = True
            self._poller = asyncio.create_task(self._poll(), name="relay-poll")

    async def stop_receiving(self) -> None:
        """Stop the long-poll loop; messages not yet acknowledged come again on the next poll."""
        self._receiving = False
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller

    async def _poll(self) -> None:
        assert self._session is not None and self._on_message is not None
        saved = await self.state_store.load(_CURSOR_KEY) if self.state_store is not None else None
        cursor = int(saved or 0)
        backoff = 1.0
        while True:
            try:
                async with self._session.get(
                        f"{self.settings.url}/v1/updates",
                        params={"after": str(cursor), "timeout": str(self.settings.poll_timeout)},
                        timeout=aiohttp.ClientTimeout(total=self.settings.poll_timeout + 10)) as resp:
                    resp.raise_for_status()
                    messages = (await resp.json())["messages"]
            except (aiohttp.ClientError, TimeoutError, KeyError, ValueError) as exc:
                self._set_state(AdapterState.CONNECTING, f"{type(exc).__name__}: {exc}")
                logger.warning("relay: polling failed (%s); again in %.0f s", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            backoff = 1.0
            self._set_state(AdapterState.CONNECTED)
            for message in messages:
                try:
                    await self._on_message(_event(message))
                except GatewayClosing:
                    return  # not acknowledged: the service hands it out again
                except Exception:  # one bad message never stops the platform: it comes again on the next poll
                    logger.exception("relay: message %s not taken", message.get("id"))
                    await asyncio.sleep(backoff)
                    break
                cursor = int(message["id"])
                if self.state_store is not None:
                    await self.state_store.save(_CURSOR_KEY, str(cursor))

    async def send(self, chat_id: str, content: str, reply_to: str | None = None,
                   metadata: Mapping[str, str] | None = None) -> SendResult:
        """Post one message; the outbox's delivery id is the idempotency key (a retry is not posted twice)."""
        if self._session is None:
            return SendResult(success=False, error="relay not connected", retryable=True)
        key = (metadata or {}).get("delivery_id")
        try:
            async with self._session.post(f"{self.settings.url}/v1/messages",
                                          json={"chat": chat_id, "text": content, "reply_to": reply_to},
                                          headers={"Idempotency-Key": key} if key else None,
                                          timeout=aiohttp.ClientTimeout(total=self.settings.request_timeout)
                                          ) as resp:
                if 200 <= resp.status < 300:
                    return SendResult(success=True, message_id=str((await resp.json())["id"]))
                retry_after = resp.headers.get("Retry-After")
                return SendResult(success=False, error=f"HTTP {resp.status}",
                                  retryable=resp.status == 429 or resp.status >= 500,
                                  retry_after=float(retry_after) if retry_after and retry_after.isdigit() else None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return SendResult(success=False, error=f"{type(exc).__name__}: {exc}", retryable=True)


def _event(message: dict[str, Any]) -> MessageEvent:
    return MessageEvent(platform="relay", event_id=str(message["id"]), chat_id=str(message["chat"]),
                        chat_type="group" if message.get("chat_type") == "group" else "dm",
                        user_id=str(message["user"]), user_name=message.get("name"), text=str(message["text"]),
                        message_id=str(message["id"]))
