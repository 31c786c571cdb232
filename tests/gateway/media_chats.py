"""One chat per platform for the media tests: the real gateway with the platform's real adapter against its
simulator, driven the same way (a user sends a photo, a document, a voice note; what the bot sent back)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gateway.app import Gateway
from gateway.config import parse_config
from gateway.sim.model_server import ScriptedModel
from gateway.sim.telegram_api import DEFAULT_USER_ID, TelegramSimulator
from tests.conftest import base_config, deep_merge

TIMEOUT = 15.0


@dataclass(frozen=True, slots=True)
class SentFile:
    """A file the bot sent: its name, bytes and caption (what the user sees of it), and how it was shown."""

    name: str
    data: bytes
    caption: str
    shown_as: str
    """photo, document, voice or audio where the platform tells them apart; "file" elsewhere."""


class MediaChat(Protocol):
    """A user's chat with the bot on one platform."""

    platform: str
    gateways: list[Gateway]
    """Every gateway ``start`` started (``open_chat`` stops them)."""

    async def start(self, overrides: dict[str, Any] | None = None) -> Gateway:
        """Start a gateway on the chat's simulator (config overrides merged in); stopped by the fixture."""
        ...

    async def send_text(self, text: str) -> None:
        """The user writes ``text``."""
        ...

    async def send_photo(self, data: bytes, caption: str | None = None) -> None:
        """The user sends a photo (a JPEG), with or without a caption."""
        ...

    async def send_document(self, data: bytes, name: str, mime: str, caption: str | None = None) -> None:
        """The user sends a file as a document."""
        ...

    async def send_voice(self, data: bytes) -> None:
        """The user sends a voice note (OGG/Opus)."""
        ...

    def fail_downloads(self, n: int) -> None:
        """The platform fails the next ``n`` attachment downloads (a server error)."""
        ...

    async def texts(self, n: int) -> list[str]:
        """The bot's text messages to the user, once there are at least ``n`` (in order, as the user sees them)."""
        ...

    def files(self) -> list[SentFile]:
        """The files the bot sent to the user, in order."""
        ...


def media_config(home: Path, model: ScriptedModel, platform: dict[str, Any], overrides: dict[str, Any] | None) -> Any:
    """The tests' base config on ``model`` with a platform's section, then the test's overrides."""
    raw = deep_merge(base_config(home, model.base_url or "", "http://127.0.0.1:9/results"), platform)
    return parse_config(deep_merge(raw, overrides or {}), env={"HERMES_GATEWAY_HOME": str(home)})


class TelegramMediaChat:
    """A private chat with the bot on the Telegram simulator."""

    platform = "telegram"

    def __init__(self, sim: TelegramSimulator, model: ScriptedModel, home: Path) -> None:
        self.sim, self.model, self.home = sim, model, home
        self.gateways: list[Gateway] = []

    async def start(self, overrides: dict[str, Any] | None = None) -> Gateway:
        """See ``MediaChat``."""
        cfg = media_config(self.home, self.model, {"platforms": {"telegram": {
            "enabled": True, "token": self.sim.token, "base_url": self.sim.base_url,
            "base_file_url": self.sim.base_file_url}}}, overrides)
        gateway = Gateway(cfg)
        self.gateways.append(gateway)
        await gateway.start()
        return gateway

    async def send_text(self, text: str) -> None:
        """See ``MediaChat``."""
        self.sim.user_sends(text)

    async def send_photo(self, data: bytes, caption: str | None = None) -> None:
        """See ``MediaChat``."""
        self.sim.user_sends_photo(data, caption)

    async def send_document(self, data: bytes, name: str, mime: str, caption: str | None = None) -> None:
        """See ``MediaChat``."""
        self.sim.user_sends_document(data, name, mime, caption)

    async def send_voice(self, data: bytes) -> None:
        """See ``MediaChat``."""
        self.sim.user_sends_voice(data)

    def fail_downloads(self, n: int) -> None:
        """See ``MediaChat``."""
        self.sim.fail_next_download(500, n)

    async def texts(self, n: int) -> list[str]:
        """See ``MediaChat``."""
        sent = await self.sim.wait_for_messages(n, DEFAULT_USER_ID, timeout=TIMEOUT)
        return [s.text or "" for s in sent]

    def files(self) -> list[SentFile]:
        """See ``MediaChat``."""
        found = []
        for sent in self.sim.sent_media(DEFAULT_USER_ID):
            [upload] = sent.files.values()
            shown_as = sent.method.removeprefix("send").lower()
            found.append(SentFile(upload.filename or "", upload.data, sent.text or "", shown_as))
        return found


@asynccontextmanager
async def telegram_chat(model: ScriptedModel, home: Path) -> AsyncIterator[TelegramMediaChat]:
    """A private chat on a Telegram simulator started here."""
    async with TelegramSimulator() as sim:
        yield TelegramMediaChat(sim, model, home)


@asynccontextmanager
async def open_chat(platform: str, model: ScriptedModel, home: Path) -> AsyncIterator[MediaChat]:
    """A chat on ``platform``'s simulator (``<platform>_chat`` in tests/gateway/media_chat_<platform>.py, Telegram's
    here) with gateways on ``model``; every gateway it started stops on exit."""
    module = sys.modules[__name__] if platform == "telegram" else importlib.import_module(
        f"tests.gateway.media_chat_{platform}")
    async with getattr(module, f"{platform}_chat")(model, home) as driver:
        try:
            yield driver
        finally:
            for gateway in driver.gateways:
                await gateway.stop(drain_timeout=1)
