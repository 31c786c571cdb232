"""The Slack chat of the media tests (``open_chat("slack", ...)``): the user's direct messages with the bot on the Slack
simulator, through Socket Mode. Files are shared with the message that carries them (its text is the caption), a voice
note is an audio clip recorded in Slack, and a command is the app's slash command, as a Slack user runs it."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gateway.app import Gateway
from gateway.sim.model_server import ScriptedModel
from gateway.sim.slack_api import DEFAULT_USER, Message, SlackSimulator
from gateway.sim.slack_files import SimFile
from tests.gateway.media_chats import TIMEOUT, SentFile, media_config

SLASH_COMMAND = "/hermes"
"""The app's slash command (the adapter's default): ``/hermes voice on`` is the gateway's ``/voice on``."""
_QUOTE = re.compile(r"^> ?", re.MULTILINE)
_LINK = re.compile(r"<([^<>|]+)(?:\|([^<>]*))?>")


def shown_text(mrkdwn: str) -> str:
    """What Slack shows of ``mrkdwn`` as text: quote markers and link targets are not shown, entities are decoded."""
    linked = _LINK.sub(lambda m: m.group(2) or m.group(1), _QUOTE.sub("", mrkdwn))
    return html.unescape(linked)


class SlackMediaChat:
    """The user's direct-message channel with the bot on the Slack simulator."""

    platform = "slack"

    def __init__(self, sim: SlackSimulator, model: ScriptedModel, home: Path) -> None:
        self.sim, self.model, self.home = sim, model, home
        self.channel = sim.dm_channel(DEFAULT_USER)
        self.gateways: list[Gateway] = []

    async def start(self, overrides: dict[str, Any] | None = None) -> Gateway:
        """See ``MediaChat``."""
        cfg = media_config(self.home, self.model, {
            "platforms": {"slack": {"enabled": True, "bot_token": self.sim.bot_token, "app_token": self.sim.app_token,
                                    "signing_secret": self.sim.signing_secret, "api_base_url": self.sim.base_url,
                                    "ping_interval": 0.2}},
            "auth": {"platforms": {"slack": {"allowed_users": [DEFAULT_USER]}}}}, overrides)
        gateway = Gateway(cfg)
        self.gateways.append(gateway)
        await gateway.start()
        return gateway

    async def send_text(self, text: str) -> None:
        """See ``MediaChat``; ``/name args`` runs the app's slash command with ``name args``."""
        if text.startswith("/"):
            await self.sim.user_runs_command(SLASH_COMMAND, text[1:], channel=self.channel)
        else:
            await self.sim.user_sends_dm(text)

    async def send_photo(self, data: bytes, caption: str | None = None) -> None:
        """See ``MediaChat``."""
        await self._share(caption, self.sim.user_file("image.jpg", data, "image/jpeg"))

    async def send_document(self, data: bytes, name: str, mime: str, caption: str | None = None) -> None:
        """See ``MediaChat``."""
        await self._share(caption, self.sim.user_file(name, data, mime))

    async def send_voice(self, data: bytes) -> None:
        """See ``MediaChat``: an audio clip recorded in Slack."""
        await self._share(None, self.sim.user_audio_clip(data))

    def fail_downloads(self, n: int) -> None:
        """See ``MediaChat``."""
        self.sim.fail_download_next(500, n)

    async def texts(self, n: int) -> list[str]:
        """See ``MediaChat``: the bot's messages that share no file, as Slack shows their mrkdwn."""
        def enough() -> list[Message] | None:
            found = [m for m in self.sim.messages(self.channel) if not m.files]
            return found if len(found) >= n else None

        return [shown_text(m.final_text) for m in await self.sim.wait_for(enough, TIMEOUT)]

    def files(self) -> list[SentFile]:
        """See ``MediaChat``: each file of the bot's file shares, its caption the share's text."""
        uploaded = {f.id: f for f in self.sim.bot_files}
        return [SentFile(uploaded[shared["id"]].name, uploaded[shared["id"]].data or b"",
                         shown_text(message.final_text), "file")
                for message in self.sim.messages(self.channel) if message.files for shared in message.files]

    async def _share(self, text: str | None, file: SimFile) -> None:
        await self.sim.user_sends_dm(text or "", files=[file])


@asynccontextmanager
async def slack_chat(model: ScriptedModel, home: Path) -> AsyncIterator[SlackMediaChat]:
    """The user's direct messages with the bot on a Slack simulator started here."""
    async with SlackSimulator() as sim:
        yield SlackMediaChat(sim, model, home)
