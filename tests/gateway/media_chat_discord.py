"""The Discord chat of the media tests: a user's DM with the bot, the real gateway and discord.py adapter against the
Discord simulator (its gateway websocket, REST API and CDN)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from discord.gateway import DiscordWebSocket
from discord.http import Route

from gateway.app import Gateway
from gateway.sim.discord_api import ALICE_ID, AttachmentSpec, DiscordSimulator
from gateway.sim.discord_files import CDN_ROUTE, voice_message
from gateway.sim.model_server import ScriptedModel
from platforms.base import AdapterState
from tests.gateway.media_chats import TIMEOUT, SentFile, media_config

JSON = dict[str, Any]
QUOTE_MARKER = re.compile(r"^(?:>>>|>) ", re.MULTILINE)
"""Discord's block quote syntax: the user sees the quoted text beside a bar, without the marker."""


class DiscordMediaChat:
    """Alice's DM with the bot on the Discord simulator (a ``MediaChat``)."""

    platform = "discord"

    def __init__(self, sim: DiscordSimulator, model: ScriptedModel, home: Path) -> None:
        self.sim, self.model, self.home = sim, model, home
        self.channel_id = sim.dm_channel_id(ALICE_ID)
        self.gateways: list[Gateway] = []

    async def start(self, overrides: dict[str, Any] | None = None) -> Gateway:
        """See ``MediaChat``; returns once the Discord adapter is connected (the guilds known)."""
        cfg = media_config(self.home, self.model, {
            "platforms": {"discord": {"enabled": True, "token": self.sim.token, "api_base_url": self.sim.api_base_url,
                                      "guild_ready_timeout": 0.05}},
            "auth": {"platforms": {"discord": {"allowed_users": [str(ALICE_ID)]}}}}, overrides)
        gateway = Gateway(cfg)
        self.gateways.append(gateway)
        await gateway.start()
        adapter = gateway.adapters["discord"]
        await self.sim.wait_for(lambda: adapter.state is AdapterState.CONNECTED, timeout=TIMEOUT)
        return gateway

    async def send_text(self, text: str) -> None:
        """See ``MediaChat``."""
        self.sim.user_sends_dm(text)

    async def send_photo(self, data: bytes, caption: str | None = None) -> None:
        """See ``MediaChat``: a JPEG attached to a message whose text is the caption."""
        self.sim.user_sends_dm(caption or "", attachments=[AttachmentSpec("photo.jpg", "image/jpeg", data=data)])

    async def send_document(self, data: bytes, name: str, mime: str, caption: str | None = None) -> None:
        """See ``MediaChat``."""
        self.sim.user_sends_dm(caption or "", attachments=[AttachmentSpec(name, mime, data=data)])

    async def send_voice(self, data: bytes) -> None:
        """See ``MediaChat``: a voice message as Discord's clients record one."""
        self.sim.user_sends_dm("", attachments=[voice_message(data)])

    def fail_downloads(self, n: int) -> None:
        """See ``MediaChat``: the CDN answers 500."""
        self.sim.fail_next(CDN_ROUTE, n, status=500)

    async def texts(self, n: int) -> list[str]:
        """See ``MediaChat``: the bot's messages in the DM that carry no file, block quotes shown without their
        markers (as Discord renders them)."""
        await self.sim.wait_for(lambda: len(self._text_messages()) >= n, timeout=TIMEOUT)
        return [QUOTE_MARKER.sub("", m["content"]) for m in self._text_messages()]

    def files(self) -> list[SentFile]:
        """See ``MediaChat``: each file with its message's text as the caption."""
        captions = [m["content"] for m in self.sim.bot_messages(self.channel_id) for _ in m["attachments"]]
        return [SentFile(f.filename, f.data, caption, "file")
                for f, caption in zip(self.sim.bot_files(self.channel_id), captions, strict=True)]

    def _text_messages(self) -> list[JSON]:
        return [m for m in self.sim.bot_messages(self.channel_id) if not m["attachments"]]


@asynccontextmanager
async def discord_chat(model: ScriptedModel, home: Path) -> AsyncIterator[DiscordMediaChat]:
    """A DM on a Discord simulator started here; discord.py's process-wide URLs, which the adapter points at the
    simulator, are put back on exit."""
    api_base, gateway_url = Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
    try:
        async with DiscordSimulator(heartbeat_interval=500) as sim:
            yield DiscordMediaChat(sim, model, home)
    finally:
        Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY = api_base, gateway_url
