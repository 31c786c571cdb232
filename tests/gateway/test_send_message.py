"""send_message end to end through the Telegram Bot API simulator and the real python-telegram-bot adapter, with a
scripted model: a user's message reaches their home channel (/sethome) exactly once, also when the gateway stops
mid-run and the run is done again on the next start; a configured target the user may not address is refused and
gets nothing, while the user the operator listed reaches it."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gateway.app import Gateway
from gateway.sim.model_server import JSON, ScriptedModel, Turn, default_responder, last_user_text, tool_call
from gateway.sim.telegram_api import DEFAULT_GROUP_ID, DEFAULT_SUPERGROUP_ID, TelegramSimulator
from tests.gateway.conftest import StartTelegramGateway

ALICE, BOB = 1001, 1002
TELL = re.compile(r"tell (\w+): (.+)")


class Relay:
    """Calls send_message for "tell TARGET: TEXT"; after the tool's result (kept), answers "Done." once ``go`` is
    set (cleared: the run waits there)."""

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []
        self.shown = asyncio.Event()  # a tool result reached the model
        self.go = asyncio.Event()
        self.go.set()

    async def __call__(self, request: JSON) -> Turn:
        last = request["messages"][-1]
        if last["role"] == "tool":
            self.results.append(json.loads(last["content"]))
            self.shown.set()
            await self.go.wait()
            return Turn(content="Done.")
        if (told := TELL.fullmatch(last_user_text(request))) is not None:
            return tool_call("send_message", {"action": "send", "target": told[1], "message": told[2]})
        return default_responder(request)


Start = Callable[[], Awaitable[Gateway]]


@pytest.fixture
async def tg(store_url: str, telegram_gateway: StartTelegramGateway
             ) -> AsyncIterator[tuple[TelegramSimulator, Relay, Start]]:
    relay = Relay()
    async with TelegramSimulator() as sim, ScriptedModel(relay) as server:
        sim.add_chat(DEFAULT_SUPERGROUP_ID, "supergroup", title="Ops")

        async def start() -> Gateway:
            return await telegram_gateway(sim, server, {
                "store": {"url": store_url},
                "platforms": {"telegram": {"group_trigger": "always"}},
                "messaging": {"targets": {"ops": {"platform": "telegram", "chat_id": DEFAULT_SUPERGROUP_ID,
                                                  "description": "the ops room", "users": [f"telegram:{BOB}"]}}}})

        yield sim, relay, start


def _texts(sim: TelegramSimulator, chat: int) -> list[str]:
    return [s.text or "" for s in sim.sent_messages(chat)]


async def _answer(sim: TelegramSimulator, user: int, text: str) -> str:
    """``user`` writes ``text`` in their DM; the bot's next message there."""
    before = len(sim.sent_messages(user))
    sim.user_sends(text, user_id=user)
    return (await sim.wait_for_messages(before + 1, user, timeout=10))[before].text or ""


async def test_a_message_reaches_the_home_channel_once_even_when_its_run_is_redone(
        tg: tuple[TelegramSimulator, Relay, Start]) -> None:
    sim, relay, start = tg
    crashing = await start()
    sim.user_sends("/sethome", chat_id=DEFAULT_GROUP_ID, chat_type="group")
    await sim.wait_for(lambda: any("home channel" in t for t in _texts(sim, DEFAULT_GROUP_ID)), timeout=10)

    relay.go.clear()  # the run stops after its send, waiting for the model
    sim.user_sends("tell home: Deploy at noon", user_id=ALICE)
    await sim.wait_for(lambda: "Deploy at noon" in _texts(sim, DEFAULT_GROUP_ID), timeout=10)
    await asyncio.wait_for(relay.shown.wait(), 10)
    assert relay.results[-1]["sent"]["target"] == "home" and "note" not in relay.results[-1]
    first = relay.results[-1]
    await crashing.stop(drain_timeout=0.5)  # the run is cut short: unfinished, it is done again on the next start

    relay.go.set()
    gateway = await start()  # the unfinished run is done again: the model asks for the same send
    await sim.wait_for(lambda: "Done." in _texts(sim, ALICE), timeout=10)
    assert "already sent" in relay.results[-1]["note"] and relay.results[-1]["sent"] == first["sent"]
    assert gateway.outbox is not None and gateway.store is not None and await gateway.outbox.flush(5)
    assert _texts(sim, DEFAULT_GROUP_ID).count("Deploy at noon") == 1
    (part,) = [r for r in await gateway.store.outbox_rows() if r.text == "Deploy at noon"]
    assert part.dedupe_key.startswith(f"msg:{part.run_id}:") and part.status == "sent"
    run = await gateway.store.get_run(part.run_id or "")
    assert run is not None and (run.prompt, run.status) == ("tell home: Deploy at noon", "completed")


async def test_a_target_only_another_user_may_address_is_refused(tg: tuple[TelegramSimulator, Relay, Start]) -> None:
    sim, relay, start = tg
    gateway = await start()
    assert await _answer(sim, ALICE, "tell ops: let me in") == "Done."
    assert "You may not send to 'ops'" in relay.results[-1]["error"]
    assert await _answer(sim, BOB, "tell ops: db-1 is almost full") == "Done."
    assert relay.results[-1]["sent"] == {"target": "ops", "platform": "telegram", "description": "the ops room"}
    await sim.wait_for(lambda: _texts(sim, DEFAULT_SUPERGROUP_ID) == ["db-1 is almost full"], timeout=10)
    assert gateway.outbox is not None and await gateway.outbox.flush(5)
    assert _texts(sim, DEFAULT_SUPERGROUP_ID) == ["db-1 is almost full"]
