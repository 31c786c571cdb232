"""A user's Telegram chat with the gateway for end-to-end tests: the real gateway and python-telegram-bot adapter
against the Telegram simulator, the scripted model holding chosen answers until the test lets them go."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.app import Gateway
from gateway.config import parse_config
from gateway.sim.model_server import JSON, ScriptedModel, Turn, default_responder, last_user_text
from gateway.sim.telegram_api import DEFAULT_USER_ID, Sent, TelegramSimulator
from gateway.store import Store
from tests.conftest import base_config, deep_merge

CHAT = DEFAULT_USER_ID  # a DM: the chat id is the user's
SESSION = f"telegram:dm:{CHAT}"


@dataclass
class Script:
    """The model's answers by the last message's text, when that is a user's: a turn, which waits for its gate
    (an ``asyncio.Event``) when it has one. Anything else gets the default responder (``Echo: <text>``)."""

    answers: dict[str, tuple[Turn, asyncio.Event | None]] = field(default_factory=dict)

    def on(self, user_text: str, turn: Turn, *, held: bool = False) -> asyncio.Event:
        """Answer ``user_text`` with ``turn``; held until the returned gate is set when ``held``."""
        gate = asyncio.Event()
        if not held:
            gate.set()
        self.answers[user_text] = (turn, gate)
        return gate

    async def __call__(self, request: JSON) -> Turn:
        last = (request.get("messages") or [{}])[-1]
        scripted = self.answers.get(last_user_text(request)) if last.get("role") == "user" else None
        if scripted is None:
            return default_responder(request)
        turn, gate = scripted
        if gate is not None:
            await gate.wait()
        return turn

    def release_all(self) -> None:
        """Let every held answer go (at the end of a test)."""
        for _, gate in self.answers.values():
            if gate is not None:
                gate.set()


@dataclass
class TelegramChat:
    """One user's DM with the gateway; ``start`` (again, for a restart) runs a gateway on the same database."""

    sim: TelegramSimulator
    model: ScriptedModel
    script: Script
    home: Path
    gateways: list[Gateway] = field(default_factory=list)

    async def start(self, overrides: dict[str, Any] | None = None) -> Gateway:
        cfg = base_config(self.home, self.model.base_url or "", "http://127.0.0.1:9/results")
        cfg = deep_merge(cfg, {"platforms": {"telegram": {
            "enabled": True, "token": self.sim.token, "base_url": self.sim.base_url,
            "base_file_url": self.sim.base_file_url, "tool_progress": "off", "reactions": True}}})
        gateway = Gateway(parse_config(deep_merge(cfg, overrides or {}), env={"HERMES_GATEWAY_HOME": str(self.home)}))
        self.gateways.append(gateway)
        await gateway.start()
        return gateway

    @property
    def gateway(self) -> Gateway:
        return self.gateways[-1]

    @property
    def store(self) -> Store:
        store = self.gateway.store
        assert store is not None
        return store

    async def says(self, text: str) -> int:
        """The user sends ``text``; returns once the gateway has taken it (accepted and handed on: the adapter
        confirms an update only after that). The message's id."""
        update = self.sim.user_sends(text)
        await self.sim.wait_for(lambda: update not in self.sim.pending_updates, timeout=10)
        return int(update["message"]["message_id"])

    def bot_messages(self) -> list[Sent]:
        return self.sim.sent_messages(CHAT)

    def texts(self) -> list[str]:
        """What the bot sent to the chat, in order."""
        return [s.text or "" for s in self.bot_messages()]

    async def wait_for_text(self, text: str, timeout: float = 10.0) -> Sent:
        """The bot's message ``text`` (waiting for it)."""
        return await self.sim.wait_for(lambda: next((s for s in self.bot_messages() if s.text == text), None),
                                       timeout=timeout)

    async def command(self, text: str) -> str:
        """Send a command; its reply (the bot's next message)."""
        before = len(self.bot_messages())
        await self.says(text)
        sent = await self.sim.wait_for_messages(before + 1, CHAT, timeout=10)
        return sent[before].text or ""


@contextlib.asynccontextmanager
async def telegram_chat(home: Path) -> AsyncIterator[TelegramChat]:
    """A Telegram DM with a scripted model, its gateways (started by the test) stopped at the end."""
    script = Script()
    async with TelegramSimulator() as sim, ScriptedModel(script) as model:
        chat = TelegramChat(sim, model, script, home)
        try:
            yield chat
        finally:
            script.release_all()
            for gateway in chat.gateways:
                await gateway.stop(drain_timeout=1)
