"""The Telegram Bot API simulator, exercised with the real python-telegram-bot (no mocks)."""

from __future__ import annotations

import asyncio
import datetime as dtm
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from telegram import (
    Bot,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    Message,
    ReactionTypeCustomEmoji,
    ReactionTypeEmoji,
    ReplyParameters,
    Update,
)
from telegram.constants import ReactionEmoji
from telegram.error import BadRequest, Conflict, Forbidden, InvalidToken, NetworkError, RetryAfter
from telegram.ext import AIORateLimiter, Application, ContextTypes, ExtBot, MessageHandler, filters
from telegram.helpers import escape_markdown

from gateway.sim.telegram_api import (
    ANONYMOUS_ADMIN_ID,
    CHANNEL_BOT_ID,
    DEFAULT_CHANNEL_ID,
    DEFAULT_GROUP_ID,
    DEFAULT_SUPERGROUP_ID,
    DEFAULT_USER_ID,
    TELEGRAM_SERVICE_ID,
    EntityParseError,
    TelegramSimulator,
    parse_entities,
)

CHAT = DEFAULT_USER_ID  # the default user's private chat


@pytest.fixture
async def sim() -> AsyncIterator[TelegramSimulator]:
    async with TelegramSimulator() as s:
        yield s


@pytest.fixture
async def bot(sim: TelegramSimulator) -> AsyncIterator[Bot]:
    async with Bot(sim.token, base_url=sim.base_url, base_file_url=sim.base_file_url) as b:
        yield b


@pytest.fixture
def chat(sim: TelegramSimulator) -> int:
    """The default user has written to the bot, so the bot may answer in their private chat."""
    sim.user_sends("hi")
    return CHAT


# ------------------------------------------------------------------ wire


async def test_get_me_is_the_first_call(sim: TelegramSimulator, bot: Bot) -> None:
    me = await bot.get_me()
    assert (me.id, me.username, me.is_bot) == (123456, "hermes_bot", True)
    assert [c.method for c in sim.calls] == ["getMe", "getMe"]  # Bot.initialize() + get_me()
    method, params = sim.calls[0]
    assert (method, params) == ("getMe", {})


async def test_wrong_token_unknown_method_and_body_encodings(sim: TelegramSimulator) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{sim.base_url}999:wrong/getMe") as resp:
            assert resp.status == 401
            assert await resp.json() == {"ok": False, "error_code": 401, "description": "Unauthorized"}
        async with http.post(sim.api_url("noSuchMethod")) as resp:
            assert resp.status == 404
            assert await resp.json() == {"ok": False, "error_code": 404, "description": "Not Found"}

        sim.user_sends("hi")
        markup = '{"inline_keyboard": [[{"text": "ok", "callback_data": "1"}]]}'
        form = {"chat_id": str(CHAT), "text": "123", "reply_markup": markup}
        async with http.post(sim.api_url("sendMessage"), data=form) as resp:
            body = await resp.json()
            assert body["ok"] is True and body["result"]["text"] == "123"  # a string stays a string
            assert body["result"]["reply_markup"]["inline_keyboard"][0][0]["text"] == "ok"
        async with http.post(sim.api_url("sendmessage"), json={"chat_id": CHAT, "text": "json"}) as resp:
            assert (await resp.json())["result"]["text"] == "json"  # method names are case-insensitive
        async with http.get(sim.api_url("sendMessage"), params={"chat_id": CHAT, "text": "query"}) as resp:
            assert (await resp.json())["result"]["message_id"] == 4

    assert [(c.method, c.status) for c in sim.calls] == [
        ("getMe", 401), ("noSuchMethod", 404), ("sendMessage", 200), ("sendMessage", 200), ("sendMessage", 200),
    ]  # fmt: skip
    assert sim.calls[2].params["chat_id"] == CHAT and sim.calls[2].params["reply_markup"]["inline_keyboard"]

    with pytest.raises(InvalidToken):
        async with Bot("999:wrong", base_url=sim.base_url):
            pass


# ------------------------------------------------------------------ sending


async def test_send_message_returns_a_realistic_message(sim: TelegramSimulator, bot: Bot, chat: int) -> None:
    msg = await bot.send_message(chat, "hello", reply_parameters=ReplyParameters(message_id=1))
    assert isinstance(msg, Message)
    assert msg.message_id == 2  # the user's "hi" was 1: ids count per chat
    assert msg.from_user is not None and msg.from_user.id == bot.id
    assert (msg.chat.id, msg.chat.type, msg.text) == (chat, "private", "hello")
    assert msg.reply_to_message is not None and msg.reply_to_message.text == "hi"
    assert isinstance(msg.date, dtm.datetime)

    sent = sim.sent_messages(chat)
    assert [(s.message_id, s.text) for s in sent] == [(2, "hello")]
    assert sent[0].params["reply_parameters"] == {"message_id": 1}

    with pytest.raises(BadRequest, match=r"(?i)message to be replied not found"):
        await bot.send_message(chat, "x", reply_to_message_id=99)
    with pytest.raises(BadRequest, match=r"(?i)chat not found"):
        await bot.send_message(424242, "nobody wrote from here")
    sim.user_blocks_bot(chat)
    with pytest.raises(Forbidden, match=r"(?i)bot was blocked by the user"):
        await bot.send_message(chat, "hello?")


async def test_forum_topic_thread_is_echoed(sim: TelegramSimulator, bot: Bot) -> None:
    update = sim.user_sends("@hermes_bot /ask now", chat_type="supergroup", message_thread_id=7)
    incoming = update["message"]
    assert incoming["chat"] == {"id": DEFAULT_SUPERGROUP_ID, "type": "supergroup", "title": incoming["chat"]["title"],
                                "is_forum": True}  # fmt: skip
    assert [e["type"] for e in incoming["entities"]] == ["mention", "bot_command"]

    msg = await bot.send_message(DEFAULT_SUPERGROUP_ID, "answer", message_thread_id=7)
    assert msg.message_thread_id == 7 and msg.is_topic_message
    assert sim.sent_messages()[0].message_thread_id == 7


async def test_markdown_v2_validation(sim: TelegramSimulator, bot: Bot, chat: int) -> None:
    with pytest.raises(BadRequest, match=r"(?i)can't parse entities: Character '\.' is reserved"):
        await bot.send_message(chat, "Done. See (below)!", parse_mode="MarkdownV2")
    with pytest.raises(BadRequest, match=r"(?i)Can't find end of Bold entity at byte offset 0"):
        await bot.send_message(chat, "*unclosed", parse_mode="MarkdownV2")

    ok = await bot.send_message(chat, escape_markdown("Done. See (below)!", version=2), parse_mode="MarkdownV2")
    assert ok.text == "Done. See (below)!"
    rich = await bot.send_message(chat, "*bold* and `x_y` 😀 _it_\\.", parse_mode="MarkdownV2")
    assert rich.text == "bold and x_y 😀 it."
    assert [(e.type, e.offset, e.length) for e in rich.entities] == [("bold", 0, 4), ("code", 9, 3), ("italic", 16, 2)]
    assert sim.sent_messages()[-1].raw_text == "*bold* and `x_y` 😀 _it_\\."


def test_parse_entities_matches_telegram_rules() -> None:
    assert parse_entities("[a](http://x.y/\\))", "MarkdownV2") == (
        "a", [{"type": "text_link", "offset": 0, "length": 1, "url": "http://x.y/)"}],
    )  # fmt: skip
    assert parse_entities("```py\nx = 1\n```", "MarkdownV2")[1] == [
        {"type": "pre", "offset": 0, "length": 6, "language": "py"}
    ]
    assert parse_entities(">quoted\nplain", "MarkdownV2") == (
        "quoted\nplain", [{"type": "blockquote", "offset": 0, "length": 6}],
    )  # fmt: skip
    assert parse_entities("<b>x</b> &amp; <a href='http://h'>y</a>", "HTML") == (
        "x & y",
        [{"type": "bold", "offset": 0, "length": 1}, {"type": "text_link", "offset": 4, "length": 1, "url": "http://h"}],
    )
    for bad in ("a > b", "x|y", "_open"):
        with pytest.raises(EntityParseError):
            parse_entities(bad, "MarkdownV2")
    for bad, why in (("<br>", 'Unsupported start tag "br"'), ("<b>x", "Can't find end tag"),
                     ("<b><i>x</b></i>", "Unmatched end tag"), ("</i>", "Unexpected end tag")):  # fmt: skip
        with pytest.raises(EntityParseError, match=why):
            parse_entities(bad, "HTML")


async def test_html_and_length_limits(bot: Bot, chat: int) -> None:
    msg = await bot.send_message(chat, "<b>bold</b> &lt;tag&gt;", parse_mode="HTML")
    assert msg.text == "bold <tag>"
    with pytest.raises(BadRequest, match=r'(?i)Unsupported start tag "br"'):
        await bot.send_message(chat, "line<br>line", parse_mode="HTML")
    with pytest.raises(BadRequest, match=r"(?i)message text is empty"):
        await bot.send_message(chat, "")
    await bot.send_message(chat, "x" * 4096)
    with pytest.raises(BadRequest, match=r"(?i)message is too long"):
        await bot.send_message(chat, "x" * 4097)
    await bot.send_message(chat, "😀" * 2048)  # 4096 UTF-16 code units
    with pytest.raises(BadRequest, match=r"(?i)message is too long"):
        await bot.send_message(chat, "😀" * 2049)


async def test_edit_message_text_and_chat_action(sim: TelegramSimulator, bot: Bot, chat: int) -> None:
    await bot.send_chat_action(chat, "typing")
    msg = await bot.send_message(chat, "draft")
    edited = await bot.edit_message_text("final", chat_id=chat, message_id=msg.message_id)
    assert isinstance(edited, Message) and edited.text == "final" and edited.edit_date is not None
    with pytest.raises(BadRequest, match=r"(?i)message is not modified"):
        await bot.edit_message_text("final", chat_id=chat, message_id=msg.message_id)
    with pytest.raises(BadRequest, match=r"(?i)message can't be edited"):
        await bot.edit_message_text("not mine", chat_id=chat, message_id=1)

    assert [a.params["action"] for a in sim.chat_actions(chat)] == ["typing"]
    assert [e.text for e in sim.edits(chat)] == ["final"]
    assert [m.get("text") for m in sim.chat_history(chat)] == ["hi", "final"]


# ------------------------------------------------------------------ updates


async def test_long_poll_blocks_until_a_user_writes(sim: TelegramSimulator, bot: Bot) -> None:
    poll = asyncio.create_task(bot.get_updates(timeout=10))
    await sim.wait_for_call("getUpdates", timeout=2)
    await asyncio.sleep(0.2)
    assert not poll.done()

    t0 = time.monotonic()
    sent = sim.user_sends("/start", first_name="Bob")
    updates = await asyncio.wait_for(poll, 2)
    assert time.monotonic() - t0 < 1.0
    assert [u.update_id for u in updates] == [sent["update_id"]]
    message = updates[0].message
    assert message is not None and message.text == "/start" and message.from_user.first_name == "Bob"
    assert message.entities[0].type == "bot_command"

    # Not confirmed yet: redelivered. Confirming with offset = last id + 1 drops it.
    assert [u.update_id for u in await bot.get_updates(timeout=0)] == [sent["update_id"]]
    assert await bot.get_updates(offset=sent["update_id"] + 1, timeout=0) == ()
    assert sim.pending_updates == []

    a, b = sim.user_sends("one"), sim.user_sends("two")
    assert b["update_id"] == a["update_id"] + 1
    t0 = time.monotonic()
    assert [u.update_id for u in await asyncio.wait_for(bot.get_updates(timeout=10, limit=1), 2)] == [a["update_id"]]
    assert time.monotonic() - t0 < 1.0  # pending updates come back at once


async def test_edits_clicks_and_allowed_updates(sim: TelegramSimulator, bot: Bot, chat: int) -> None:
    sim.user_edits(1, "hi (edited)")
    keyboard = InlineKeyboardMarkup([[InlineKeyboardButton("A", callback_data="a")]])
    reply = await bot.send_message(chat, "pick", reply_markup=keyboard)
    sim.user_clicks(reply.message_id, "a")
    sim.push_update({"message_reaction": {"chat": {"id": chat, "type": "private"}}})  # not delivered by default
    updates = await bot.get_updates(timeout=0)
    assert [u.effective_message.text if u.effective_message else None for u in updates] == [
        "hi", "hi (edited)", "pick",
    ]  # fmt: skip
    assert updates[1].edited_message is not None
    query = updates[2].callback_query
    assert query is not None and query.data == "a"
    assert await query.answer("noted")
    assert sim.callback_answers[0].params["text"] == "noted"

    sim.user_sends("ignored")
    assert await bot.get_updates(offset=updates[-1].update_id + 1, allowed_updates=["callback_query"], timeout=0) == ()


async def test_messages_from_bots_and_on_behalf_of_chats(sim: TelegramSimulator, bot: Bot) -> None:
    sim.user_sends("beep", chat_type="group", user_id=5005, username="other_bot", is_bot=True)
    sim.user_sends("from the admins", chat_type="supergroup", on_behalf_of="group")
    sim.user_sends("as my channel", chat_type="supergroup", on_behalf_of="channel", channel_title="News")
    sim.user_sends("new post", chat_type="supergroup", on_behalf_of="linked_channel", channel_id=-1005)
    robot, anonymous, as_channel, forwarded = [u.message for u in await bot.get_updates(timeout=0)]

    assert robot.from_user.is_bot and robot.sender_chat is None and robot.chat.id == DEFAULT_GROUP_ID
    assert (anonymous.from_user.id, anonymous.from_user.is_bot, anonymous.from_user.username) == (
        ANONYMOUS_ADMIN_ID, True, "GroupAnonymousBot")
    assert anonymous.sender_chat == anonymous.chat and anonymous.chat.id == DEFAULT_SUPERGROUP_ID
    assert (as_channel.from_user.id, as_channel.from_user.is_bot) == (CHANNEL_BOT_ID, True)
    assert (as_channel.sender_chat.id, as_channel.sender_chat.type, as_channel.sender_chat.title) == (
        DEFAULT_CHANNEL_ID, "channel", "News")
    assert (forwarded.from_user.id, forwarded.from_user.is_bot) == (TELEGRAM_SERVICE_ID, False)
    assert forwarded.is_automatic_forward and forwarded.sender_chat.id == -1005
    assert forwarded.forward_origin.chat.id == -1005 and forwarded.forward_origin.message_id == 1
    with pytest.raises(ValueError, match="on behalf of a chat"):
        sim.user_sends("no such thing in a DM", on_behalf_of="group")


async def test_stop_wakes_a_pending_long_poll(sim: TelegramSimulator, bot: Bot) -> None:
    poll = asyncio.create_task(bot.get_updates(timeout=30))
    await sim.wait_for_call("getUpdates", timeout=2)
    t0 = time.monotonic()
    await asyncio.wait_for(sim.stop(), 2)
    assert time.monotonic() - t0 < 0.5
    assert await asyncio.wait_for(poll, 1) == ()


async def test_newer_poll_and_webhook_conflict_with_a_poll(sim: TelegramSimulator, bot: Bot) -> None:
    async with Bot(sim.token, base_url=sim.base_url) as other:
        first = asyncio.create_task(bot.get_updates(timeout=10))
        await sim.wait_for_call("getUpdates", timeout=2)
        assert await other.get_updates(timeout=0) == ()
        with pytest.raises(Conflict, match=r"(?i)terminated by other getUpdates request"):
            await asyncio.wait_for(first, 2)

    await bot.set_webhook("http://127.0.0.1:9/hook")
    with pytest.raises(Conflict, match=r"(?i)webhook is active"):
        await bot.get_updates(timeout=0)
    assert await bot.delete_webhook()
    assert await bot.get_updates(timeout=0) == ()


# ------------------------------------------------------------------ faults


async def test_429_raises_retry_after(
    sim: TelegramSimulator, bot: Bot, chat: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "true")  # PTB 22 warns when retry_after is read as int
    sim.fail_next("sendMessage", retry_after=3)
    with pytest.raises(RetryAfter) as caught:
        await bot.send_message(chat, "too fast")
    assert caught.value.retry_after == dtm.timedelta(seconds=3)
    assert sim.calls[-1].response == {
        "ok": False, "error_code": 429, "description": "Too Many Requests: retry after 3",
        "parameters": {"retry_after": 3},
    }  # fmt: skip
    assert sim.sent_messages() == []
    await bot.send_message(chat, "later")  # one fault, one call


async def test_rate_limiter_retry_comes_after_retry_after(
    sim: TelegramSimulator, chat: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "true")
    sim.fail_next("sendMessage", retry_after=1)
    # ExtBot is what Application builds; AIORateLimiter retries a 429 after retry_after (+0.1 s).
    async with ExtBot(sim.token, base_url=sim.base_url, rate_limiter=AIORateLimiter(max_retries=1)) as ext:
        await ext.send_message(chat, "eventually")
    first, second = sim.calls_of("sendMessage")
    assert (first.status, second.status) == (429, 200)
    assert second.t - first.t >= 1.0
    assert [s.text for s in sim.sent_messages()] == ["eventually"]


async def test_5xx_drops_and_slowness(sim: TelegramSimulator, bot: Bot, chat: int) -> None:
    sim.fail_next("sendMessage", error_code=502)
    with pytest.raises(NetworkError, match=r"(?i)Bad Gateway"):
        await bot.send_message(chat, "a")

    sim.drop_next("sendMessage")
    with pytest.raises(NetworkError):
        await bot.send_message(chat, "b")
    assert sim.sent_messages() == [] and sim.calls[-1].outcome == "dropped"

    sim.drop_next("sendMessage", after_apply=True)
    with pytest.raises(NetworkError):
        await bot.send_message(chat, "c")
    assert [s.text for s in sim.sent_messages()] == ["c"]  # delivered although the bot saw an error
    assert sim.sent_messages()[0].call.outcome == "applied_dropped"

    sim.slow_next("sendChatAction", 0.3)
    t0 = time.monotonic()
    await bot.send_chat_action(chat, "typing")
    assert time.monotonic() - t0 >= 0.3


# ------------------------------------------------------------------ webhook and files


async def test_webhook_delivery_with_secret_and_retry() -> None:
    received: list[tuple[str | None, dict]] = []

    async def hook(request: web.Request) -> web.Response:
        received.append((request.headers.get("X-Telegram-Bot-Api-Secret-Token"), await request.json()))
        return web.Response(status=500 if len(received) == 1 else 200)

    app = web.Application()
    app.router.add_post("/tg", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/tg"
    try:
        async with TelegramSimulator(webhook_retry_initial=0.05) as sim, Bot(sim.token, base_url=sim.base_url) as bot:
            assert await bot.set_webhook(url, secret_token="s3cret", max_connections=5)
            update = sim.user_sends("via webhook")
            await sim.wait_for(lambda: len(sim.deliveries) >= 2 and not sim.pending_updates, timeout=3)

            assert [(d.status, d.attempt) for d in sim.deliveries] == [(500, 1), (200, 2)]
            assert sim.deliveries[1].t - sim.deliveries[0].t >= 0.05
            assert [secret for secret, _ in received] == ["s3cret", "s3cret"]
            assert received[1][1] == update
            info = await bot.get_webhook_info()
            assert (info.url, info.pending_update_count, info.max_connections) == (url, 0, 5)
            assert info.last_error_message == "Wrong response from the webhook: 500 Internal Server Error"
    finally:
        await runner.cleanup()


async def test_get_file_and_download(sim: TelegramSimulator, bot: Bot) -> None:
    photo = b"\xff\xd8\xff" + bytes(range(256)) * 4
    sim.user_sends_photo(photo, caption="look")
    sim.user_sends_document(b"report body", file_name="report.txt")
    photo_update, doc_update = await bot.get_updates(timeout=0)
    assert photo_update.message is not None and photo_update.message.caption == "look"
    big = photo_update.message.photo[-1]
    assert await (await bot.get_file(big.file_id)).download_as_bytearray() == bytearray(photo)
    assert doc_update.message is not None and doc_update.message.document is not None
    doc_file = await bot.get_file(doc_update.message.document.file_id)
    assert doc_file.file_path is not None and doc_file.file_path.startswith(sim.base_file_url)
    assert bytes(await doc_file.download_as_bytearray()) == b"report body"

    sent = await bot.send_document(DEFAULT_USER_ID, document=b"generated", filename="out.csv", caption="*here*",
                                   parse_mode="MarkdownV2")  # fmt: skip
    assert sent.document is not None and sent.document.file_name == "out.csv" and sent.caption == "here"
    assert sim.sent_media()[0].files["document"].data == b"generated"
    assert await (await bot.get_file(sent.document.file_id)).download_as_bytearray() == bytearray(b"generated")
    with pytest.raises(BadRequest, match=r"(?i)invalid file_id"):
        await bot.get_file("nope")


# ------------------------------------------------------------------ Application


async def test_application_polling_receives_and_replies(sim: TelegramSimulator) -> None:
    app = Application.builder().token(sim.token).base_url(sim.base_url).base_file_url(sim.base_file_url).build()
    seen: list[str] = []

    async def echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.message is not None and update.message.text is not None
        seen.append(update.message.text)
        await update.message.reply_text(f"echo: {update.message.text}")

    app.add_handler(MessageHandler(filters.TEXT, echo))
    async with app:
        await app.updater.start_polling(timeout=5)
        await app.start()
        await sim.wait_for_call("getUpdates", timeout=2)
        update = sim.user_sends("hello app")
        replies = await sim.wait_for_messages(1, chat_id=CHAT, timeout=3)
        await app.updater.stop()
        await app.stop()

    assert seen == ["hello app"] and replies[0].text == "echo: hello app"
    methods = [c.method for c in sim.calls]
    assert methods[:3] == ["getMe", "deleteWebhook", "getUpdates"]
    polls = sim.calls_of("getUpdates")
    assert polls[0].params["timeout"] == 5 and polls[0].params["offset"] == 0
    assert (polls[-1].params["offset"], polls[-1].params["timeout"]) == (update["update_id"] + 1, 0)
    assert any(c.outcome == "cancelled" for c in polls)  # the long poll PTB abandoned on stop
    assert sim.pending_updates == []


# ------------------------------------------------------------------ reactions


async def test_set_message_reaction_replaces_the_bots_reaction_with_an_allowed_emoji(
        sim: TelegramSimulator, bot: Bot) -> None:
    mid = sim.user_sends("hi")["message"]["message_id"]
    assert await bot.set_message_reaction(CHAT, mid, ReactionEmoji.EYES) is True
    assert sim.reaction_calls(CHAT)[0].params["reaction"] == [{"type": "emoji", "emoji": "👀"}]  # a JSON array
    assert await bot.set_message_reaction(CHAT, mid, [ReactionTypeEmoji(ReactionEmoji.THUMBS_UP)]) is True
    assert sim.bot_reaction(CHAT, mid) == ["👍"]  # replaced, not added
    for reaction, error in (("✅", "reaction_invalid"), (ReactionTypeCustomEmoji("5368324170671202286"),
                                                         "reaction_invalid"), (["👍", "👀"], "reactions_too_many")):
        with pytest.raises(BadRequest, match=f"(?i){error}"):  # PTB capitalizes the description
            await bot.set_message_reaction(CHAT, mid, reaction)
    with pytest.raises(BadRequest, match=r"(?i)message to react not found"):
        await bot.set_message_reaction(CHAT, mid + 100, "👍")
    assert await bot.set_message_reaction(CHAT, mid) is True  # no reaction: the bot's is removed
    assert sim.bot_reaction(CHAT, mid) == []
    assert sim.reactions_shown(CHAT) == [["👀"], ["👍"], []]
