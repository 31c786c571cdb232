"""Telegram buttons and command menus: the real adapter and python-telegram-bot against the Bot API simulator."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from telegram import Bot, BotCommand
from telegram.error import BadRequest

from gateway.sim.telegram_api import DEFAULT_GROUP_ID, DEFAULT_SUPERGROUP_ID, TelegramSimulator
from platforms.base import Accepted, Choice, GatewayClosing, MenuCommand, MessageEvent
from platforms.telegram import TelegramAdapter
from tests.platforms import test_telegram
from tests.platforms.test_telegram import ALICE, BOB, HOOK_SECRET, World, _bot_texts, _free_port, _quiet, _settings

world = test_telegram.world
adapter = test_telegram.adapter

APPROVAL = [Choice("Approve once", "/approve once 3f2a", "primary"), Choice("Always", "/approve always 3f2a"),
            Choice("Deny", "/deny 3f2a", "danger")]


@dataclass
class _Gateway:
    """Stands in for the gateway's on_message: records each offer; refuses (None) or raises GatewayClosing
    ``closing`` times first when told to."""

    refuse: bool = False
    closing: int = 0
    offered: list[MessageEvent] = field(default_factory=list)

    async def __call__(self, event: MessageEvent) -> Accepted | None:
        self.offered.append(event)
        if self.closing:
            self.closing -= 1
            raise GatewayClosing("shutting down")
        return None if self.refuse else Accepted(None, False)


@pytest.fixture
async def gateway_stand_in(world: World) -> AsyncIterator[tuple[TelegramAdapter, _Gateway]]:
    stand_in = _Gateway()
    bot = TelegramAdapter(_settings(world.sim, poll_timeout=5))
    await bot.connect(stand_in)
    yield bot, stand_in
    await bot.disconnect()


def _answer(sim: TelegramSimulator, update: dict) -> dict | None:
    """The parameters of the accepted answer to the callback query of ``update`` (None: not answered)."""
    answer = sim.interactive.answer_to(update["callback_query"]["id"])
    return None if answer is None else answer.params


async def test_choices_show_as_a_keyboard_and_a_press_arrives_as_a_message_from_the_presser(
        world: World, adapter: tuple[TelegramAdapter, list[MessageEvent]]) -> None:
    bot, events = adapter
    sim = world.sim
    assert TelegramAdapter.can_buttons
    asked = sim.user_sends("@hermes_bot delete the logs?", chat_type="supergroup", message_thread_id=3)
    await sim.wait_for(lambda: len(events) == 1)

    sent = await bot.send_choices(str(DEFAULT_SUPERGROUP_ID), "Run **rm -r logs**?", APPROVAL,
                                  reply_to=str(asked["message"]["message_id"]), metadata={"thread_id": "3"})
    assert sent.success and sent.message_id is not None
    [message] = sim.sent_messages(DEFAULT_SUPERGROUP_ID)
    # Formatted, threaded and replying as send does; two short labels share a row.
    assert (message.text, message.parse_mode, message.message_thread_id) == ("Run rm -r logs?", "HTML", 3)
    assert message.params["reply_parameters"]["message_id"] == asked["message"]["message_id"]
    assert sim.keyboard(DEFAULT_SUPERGROUP_ID, int(sent.message_id)) == [
        [{"text": "Approve once", "callback_data": "/approve once 3f2a"},
         {"text": "Always", "callback_data": "/approve always 3f2a"}],
        [{"text": "Deny", "callback_data": "/deny 3f2a"}]]

    press = sim.user_presses(int(sent.message_id), "Always", chat_type="supergroup", message_thread_id=3,
                             user_id=BOB, username="bob", first_name="Bob")
    await sim.wait_for(lambda: len(events) == 2 and not sim.pending_updates)
    event = events[1]
    assert event == MessageEvent(
        platform="telegram", event_id=f"press:{press['callback_query']['id']}", chat_id=str(DEFAULT_SUPERGROUP_ID),
        chat_type="group", user_id=str(BOB), user_name="bob", text="/approve always 3f2a", message_id=None,
        thread_id="3", reply_to_message_id=None, mentions_bot=True, attachments=(), received_at=event.received_at,
        metadata={"pressed_message_id": sent.message_id})
    assert _answer(sim, press) == {"callback_query_id": press["callback_query"]["id"]}  # no notice to show

    # In a private chat, without a username: the presser's full name.
    sim.user_sends("hi", username=None, first_name="Alice", chat_type="private")
    dm = await bot.send_choices(str(ALICE), "Which one?", [Choice("Red"), Choice("Blue")])
    dm_press = sim.user_presses(int(dm.message_id or 0), "Blue", username=None)
    await sim.wait_for(lambda: len(events) == 4)
    assert (events[3].event_id, events[3].chat_type, events[3].user_name, events[3].text, events[3].thread_id,
            events[3].metadata) == (f"press:{dm_press['callback_query']['id']}", "dm", "Alice", "Blue", None,
                                    {"pressed_message_id": dm.message_id})
    await sim.wait_for(lambda: _answer(sim, dm_press) is not None)


async def test_a_label_too_long_for_a_button_is_read_back_from_the_pressed_message(
        world: World, adapter: tuple[TelegramAdapter, list[MessageEvent]]) -> None:
    bot, events = adapter
    sim = world.sim
    sim.user_sends("hi")
    long_label = "Übersetze es ins Französische, bitte"  # 36 characters, 38 bytes
    wide = "ü" * 40  # 40 characters but 80 bytes: over Telegram's 64
    token_like = "choice:0"  # a label that looks like a token is carried as one, so it cannot be mistaken
    long_command = Choice("Approve for this session", "/approve session " + "f" * 64)
    sent = await bot.send_choices(str(ALICE), "Pick", [Choice(long_label), Choice(wide), Choice(token_like),
                                                       long_command])
    assert sent.success
    rows = sim.keyboard(ALICE, int(sent.message_id or 0))
    assert [b["callback_data"] for row in rows for b in row] == [long_label, "choice:1", "choice:2"]
    # A command no button can carry is listed as text the user can type instead.
    assert sim.sent_messages(ALICE)[0].text == f"Pick\n\n• {long_command.label}: {long_command.command}"

    for label in (wide, token_like, long_label):
        sim.user_presses(int(sent.message_id or 0), label)
    await sim.wait_for(lambda: len(events) == 4 and not sim.pending_updates)
    assert [e.text for e in events[1:]] == [wide, token_like, long_label]
    assert len(sim.callback_answers) == 3


async def test_an_edit_removes_the_keyboard_even_when_the_text_stays(
        world: World, adapter: tuple[TelegramAdapter, list[MessageEvent]]) -> None:
    bot, events = adapter
    sim = world.sim
    sim.user_sends("hi")
    first = await bot.send_choices(str(ALICE), "Allow **this**?", APPROVAL)
    second = await bot.send_choices(str(ALICE), "And that?", APPROVAL)
    first_id, second_id = int(first.message_id or 0), int(second.message_id or 0)

    assert (await bot.edit_message(str(ALICE), str(first_id), "Allow **this**?")).success  # same text
    assert (await bot.edit_message(str(ALICE), str(second_id), "Approved once.")).success
    assert sim.keyboard(ALICE, first_id) == [] and sim.keyboard(ALICE, second_id) == []
    assert _bot_texts(sim, ALICE) == ["Allow this?", "Approved once."]
    assert len(sim.edits(ALICE)) == 2
    # Without buttons, an edit to the same text again is "not modified", which counts as done.
    assert (await bot.edit_message(str(ALICE), str(first_id), "Allow **this**?")).success
    with pytest.raises(ValueError, match="no callback button"):
        sim.user_presses(first_id, "Deny")

    # A press a client sent from its stale view, after the buttons went: answered, no event.
    message = sim.chat_history(ALICE)[1]
    stale = sim.push_update({"callback_query": {"id": "stale-1", "from": sim.chat_history(ALICE)[0]["from"],
                                                "message": message, "chat_instance": "1", "data": "/deny 3f2a"}})
    await sim.wait_for(lambda: not sim.pending_updates)
    await sim.wait_for(lambda: sim.calls_of("answerCallbackQuery"))
    assert sim.calls_of("answerCallbackQuery")[0].params == {
        "callback_query_id": stale["callback_query"]["id"], "text": "This choice is no longer available."}
    await _quiet(0.1)
    assert [e.text for e in events] == ["hi"]


async def test_a_press_the_gateway_refuses_is_answered_all_the_same(world: World) -> None:
    """Through the real gateway: an unauthorized presser gets the spinner stopped and nothing else; an
    authorized one runs the button's command."""
    gateway = await world.start()
    sim, bot = world.sim, gateway.adapters["telegram"]
    sim.add_chat(DEFAULT_GROUP_ID, "group")
    sent = await bot.send_choices(str(DEFAULT_GROUP_ID), "Menu", [Choice("Status", "/status")])
    message_id = int(sent.message_id or 0)

    stranger = sim.user_presses(message_id, "Status", chat_type="group", user_id=6666, username="mallory")
    await sim.wait_for(lambda: _answer(sim, stranger) is not None and not sim.pending_updates)
    await _quiet()
    assert gateway.store is not None and await gateway.store.count_inbox() == 0
    assert len(sim.sent_messages(DEFAULT_GROUP_ID)) == 1

    alice = sim.user_presses(message_id, "Status", chat_type="group")
    await sim.wait_for_messages(2, DEFAULT_GROUP_ID)
    assert _answer(sim, alice) is not None and await gateway.store.count_inbox() == 1
    assert world.model.requests == []  # a command, answered by the gateway itself


async def test_presses_on_inaccessible_messages_and_from_bots_are_answered_without_an_event(
        world: World, gateway_stand_in: tuple[TelegramAdapter, _Gateway]) -> None:
    bot, stand_in = gateway_stand_in
    sim = world.sim
    sim.add_chat(ALICE)
    sent = await bot.send_choices(str(ALICE), "Old question", [Choice("Yes"), Choice("No")])
    old = sim.user_presses(int(sent.message_id or 0), "Yes", inaccessible=True)
    robot = sim.user_presses(int(sent.message_id or 0), "No", is_bot=True, username="other_bot")
    await sim.wait_for(lambda: not sim.pending_updates and len(sim.callback_answers) == 2)
    assert _answer(sim, old) == {"callback_query_id": old["callback_query"]["id"],
                                 "text": "This message is too old to act on; please ask again."}
    assert _answer(sim, robot) == {"callback_query_id": robot["callback_query"]["id"]}
    await _quiet(0.1)
    assert stand_in.offered == []


async def test_a_press_offered_while_the_gateway_closes_is_not_confirmed_and_comes_again(
        world: World, gateway_stand_in: tuple[TelegramAdapter, _Gateway]) -> None:
    bot, stand_in = gateway_stand_in
    sim = world.sim
    sim.add_chat(ALICE)
    sent = await bot.send_choices(str(ALICE), "Go?", [Choice("Go", "/go")])
    stand_in.closing = 1
    press = sim.user_presses(int(sent.message_id or 0), "Go")
    update_id = press["update_id"]
    await sim.wait_for(lambda: len(stand_in.offered) == 2, timeout=5)
    await sim.wait_for(lambda: not sim.pending_updates)
    # Offered twice as the same event (the inbox drops a repeat), confirmed only after it was taken.
    assert [e.event_id for e in stand_in.offered] == [f"press:{press['callback_query']['id']}"] * 2
    delivered = [c for c in sim.calls_of("getUpdates")
                 if any(u["update_id"] == update_id for u in (c.response or {}).get("result", []))]
    assert len(delivered) == 2
    # Answered at the first offer; Telegram refuses a second answer to the same query, which changes nothing.
    def answers() -> list[int | None]:
        return [a.status for a in sim.calls_of("answerCallbackQuery")]

    await sim.wait_for(lambda: len(answers()) == 2 and None not in answers())
    assert answers() == [200, 400] and len(sim.callback_answers) == 1
    assert bot.state.value == "connected"


async def test_in_webhook_mode_a_press_not_taken_is_refused_with_503_and_delivered_again(world: World) -> None:
    sim, stand_in = world.sim, _Gateway(closing=1)
    port = _free_port()
    bot = TelegramAdapter(_settings(sim, mode="webhook", webhook_url=f"http://127.0.0.1:{port}/telegram/webhook",
                                    webhook_secret=HOOK_SECRET))
    app = web.Application()
    app.add_routes(bot.http_routes())
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await bot.connect(stand_in)
    try:
        sim.add_chat(ALICE)
        sent = await bot.send_choices(str(ALICE), "Go?", [Choice("Go", "/go")])
        press = sim.user_presses(int(sent.message_id or 0), "Go")
        await sim.wait_for(lambda: not sim.pending_updates)
        assert [d.status for d in sim.deliveries if d.update_id == press["update_id"]] == [503, 200]
        assert [e.text for e in stand_in.offered] == ["/go", "/go"] and len(sim.callback_answers) == 1
        assert sim.calls_of("setWebhook")[0].params["allowed_updates"] == ["message", "callback_query"]
    finally:
        await bot.disconnect()
        await runner.cleanup()


async def test_set_commands_publishes_three_scopes_and_leaves_out_names_telegram_refuses(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    sim = world.sim
    bot = TelegramAdapter(_settings(sim))
    await bot.connect(test_telegram._never_called, receive=False)
    try:
        with caplog.at_level(logging.WARNING, logger="platforms.telegram"):
            await bot.set_commands([MenuCommand("status", "Show the session's status"),
                                    MenuCommand("reload-mcp", "Reload MCP servers"),
                                    MenuCommand("Help", "Capitalised"), MenuCommand("new", "x" * 300),
                                    MenuCommand("usage", " ")])
        expected = [{"command": "status", "description": "Show the session's status"},
                    {"command": "new", "description": "x" * 255 + "…"},
                    {"command": "usage", "description": "usage"}]
        for scope in ("default", "all_private_chats", "all_group_chats"):
            assert sim.interactive.commands_for(scope) == expected
        assert len(sim.commands) == 3
        assert "leaves out reload-mcp, Help" in caplog.text

        # A failure is logged, never raised, and the other scopes are still set.
        sim.fail_next("setMyCommands", error_code=502)
        await bot.set_commands([MenuCommand("stop", "Stop the run")])
        assert sim.interactive.commands_for("default") == expected
        assert sim.interactive.commands_for("all_group_chats") == [{"command": "stop", "description": "Stop the run"}]
        assert "setMyCommands (default) failed" in caplog.text
    finally:
        await bot.disconnect()


async def test_the_simulator_refuses_what_the_bot_api_refuses(world: World) -> None:
    """Command names and callback data beyond Telegram's limits; getMyCommands and deleteMyCommands per scope."""
    sim = world.sim
    sim.add_chat(ALICE)
    async with Bot(sim.token, base_url=sim.base_url) as api:
        with pytest.raises(BadRequest, match=r"(?i)BOT_COMMAND_INVALID"):
            await api.set_my_commands([BotCommand("reload-mcp", "Reload")])
        with pytest.raises(BadRequest, match=r"(?i)BUTTON_DATA_INVALID"):
            await api.send_message(ALICE, "x", reply_markup={"inline_keyboard": [[
                {"text": "wide", "callback_data": "ü" * 33}]]})  # type: ignore[arg-type]
        await api.set_my_commands([BotCommand("status", "Status")], language_code="de")
        assert [c.command for c in await api.get_my_commands(language_code="de")] == ["status"]
        assert await api.get_my_commands() == ()
        assert await api.delete_my_commands(language_code="de")
        assert sim.commands == {}


async def test_a_part_in_doubt_is_sent_again_with_its_buttons_as_send_does(
        world: World, adapter: tuple[TelegramAdapter, list[MessageEvent]]) -> None:
    """The Bot API can neither look a message up nor drop a repeat: a part in doubt is delivered at least once,
    with choices or without."""
    bot, _ = adapter
    sim = world.sim
    sim.user_sends("hi")
    meta = {"delivery_id": "run:r1:0", "run_id": "r1", "part_index": "0", "parts_total": "1"}
    for send in (lambda m: bot.send(str(ALICE), "plain", metadata=m),
                 lambda m: bot.send_choices(str(ALICE), "choose", [Choice("A"), Choice("B")], metadata=m)):
        sim.drop_next("sendMessage", after_apply=True)  # shown, but the answer is lost
        lost = await send(meta)
        assert not lost.success and lost.retryable
        again = await send({**meta, "in_doubt": "1"})
        assert again.success
    assert [m.text for m in sim.sent_messages(ALICE)] == ["plain", "plain", "choose", "choose"]
    assert [bool(sim.keyboard(ALICE, m.message_id or 0)) for m in sim.sent_messages(ALICE)] == [
        False, False, True, True]
