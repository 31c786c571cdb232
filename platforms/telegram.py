"""Telegram through python-telegram-bot: long polling or a webhook, each update stored before it is confirmed.

PTB's ``Updater`` confirms an update as soon as it is queued, before anything stored it, so the adapter
polls by hand: ``getUpdates``, hand each update to the gateway, and only then move the offset past it (the
next ``getUpdates`` confirms). ``event_id`` is the ``update_id``, so a redelivered update is dropped by the
gateway's inbox. In webhook mode the gateway's HTTP server answers Telegram with 200 only after the update
is stored; any other answer makes Telegram deliver it again.

Sending needs only getMe. Receiving (``start_receiving`` / ``stop_receiving``) is the polling loop, or in
webhook mode setWebhook plus a route that answers 503 while the adapter is not receiving.

Choices are inline keyboard buttons. A press (a ``callback_query`` update) is answered at once and goes to the
gateway as a message from the presser; the update is confirmed, like any other, once the gateway took it.

Files (platforms/telegram_files.py): ``fetch_attachment`` is getFile plus a download capped at the limit,
``send_file`` a sendPhoto / sendDocument / sendVoice / sendAudio upload, delivered at least once as text is.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dtm
import hmac
import logging
import os
import re
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from aiohttp import web
from telegram import (
    BotCommand,
    BotCommandScopeAllGroupChats,
    BotCommandScopeAllPrivateChats,
    BotCommandScopeDefault,
    CallbackQuery,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    LinkPreviewOptions,
    Message,
    MessageEntity,
    ReactionTypeEmoji,
    ReplyParameters,
    Update,
)
from telegram.constants import BotCommandLimit, ChatAction, ChatType, InlineKeyboardButtonLimit, ParseMode
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
)
from telegram.ext import AIORateLimiter, Application
from telegram.request import HTTPXRequest

from platforms.base import (
    Accepted,
    AdapterState,
    Attachment,
    AttachmentKind,
    BasePlatformAdapter,
    Choice,
    MenuCommand,
    MessageEvent,
    OnMessage,
    SendResult,
    choices_as_text,
    utf16_len,
)
from platforms.rich_text import telegram_length, telegram_text, to_telegram_html
from platforms.telegram_files import AttachmentDownloader, FilesMixin

__all__ = ["TelegramAdapter", "TelegramSettings"]

logger = logging.getLogger(__name__)

# python-telegram-bot 22 returns time periods (RetryAfter.retry_after ...) as int seconds and warns on every read,
# its own included, until a process opts into the timedelta its next major version returns; opt in (an operator's
# own PTB_TIMEDELTA still wins). The adapter reads either form.
os.environ.setdefault("PTB_TIMEDELTA", "true")

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
_BACKOFF_INITIAL = 0.5
_BACKOFF_MAX = 30.0
_STOP_GRACE = 5.0  # seconds stop_receiving lets an update being handed over finish
_CONFIRM_TIMEOUT = 2.0
_POOL_SIZE = 256  # PTB's default for API calls
# Idle connections kept open. httpx keeps all by default and checks every idle one on each request, which
# grew to ~2 s of loop time per 200-run burst (bench/RESULTS.md, section 3).
IDLE_CONNECTIONS_KEPT = 32
_NO_PREVIEW = LinkPreviewOptions(is_disabled=True)
_CHAT_TYPES: dict[str, Literal["dm", "group"]] = {ChatType.PRIVATE: "dm", ChatType.GROUP: "group",
                                         ChatType.SUPERGROUP: "group"}
# Rejections of the formatted text that the same text as plain text avoids.
_FORMAT_ERRORS = ("can't parse entities", "message is too long", "text is empty")
_NOT_MODIFIED = "message is not modified"
_TOO_LARGE = "request entity too large"  # 413 from the Bot API's front end: an upload over its limit
_TOKEN_REJECTED = "telegram: the bot token was rejected (getMe returned 401); check platforms.telegram.token"
_NOT_FOUND = ("telegram: the Bot API answered 404 Not Found; check platforms.telegram.base_url "
              "(and platforms.telegram.token)")
# A button carries its choice's text as callback_data when Telegram takes it (1-64 bytes); a longer label goes
# as this prefix and the choice's index, and is read back from the pressed message's own keyboard.
_INDEX_TOKEN = "choice:"
_PAIRED_LABEL = 14  # two buttons this short share a row
_TOO_OLD = "This message is too old to act on; please ask again."
_GONE = "This choice is no longer available."
_COMMAND_NAME = re.compile(r"[a-z0-9_]{1,32}")  # what setMyCommands takes
_MENU_SCOPES = (BotCommandScopeDefault(), BotCommandScopeAllPrivateChats(), BotCommandScopeAllGroupChats())


class _HandledFloodControl(logging.Filter):
    """Drops AIORateLimiter's ERROR-with-traceback for each 429 it passes on: the outbox retries those."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Rate limit hit after maximum of 0 retries")


_FLOOD_FILTER = _HandledFloodControl()


@dataclass(frozen=True, slots=True)
class TelegramSettings:
    """What the adapter needs from ``platforms.telegram`` (secrets already revealed)."""

    token: str
    base_url: str = "https://api.telegram.org/bot"
    base_file_url: str = "https://api.telegram.org/file/bot"
    mode: Literal["polling", "webhook"] = "polling"
    webhook_url: str | None = None
    webhook_secret: str | None = None
    webhook_path: str = "/telegram/webhook"
    poll_timeout: int = 30
    group_trigger: Literal["mention", "always"] = "mention"
    edited_messages: Literal["ignore", "handle"] = "ignore"
    max_attachment_bytes: int = 20 * 1024 * 1024
    parse_mode: Literal["markdown", "html", "plain"] = "html"
    overall_per_second: float = 30.0
    group_per_minute: float = 20.0


def _transient(exc: TelegramError) -> bool:
    """Worth retrying the same request later (BadRequest subclasses NetworkError but is final)."""
    return isinstance(exc, RetryAfter | Conflict) or (isinstance(exc, NetworkError) and not isinstance(exc, BadRequest))


def _retry_seconds(exc: RetryAfter) -> float:
    """``retry_after`` in seconds, whether PTB gives it as a timedelta (PTB_TIMEDELTA, PTB 23) or as int seconds."""
    wait = exc.retry_after
    return wait.total_seconds() if isinstance(wait, dtm.timedelta) else float(wait)


def _send_failure(exc: TelegramError) -> SendResult:
    """A failed send or edit as the outbox needs it: retry only what may succeed later."""
    if isinstance(exc, RetryAfter):
        wait = _retry_seconds(exc)
        return SendResult(False, error=f"flood control: retry in {wait:g} s", retryable=True, retry_after=wait)
    if isinstance(exc, ChatMigrated):
        return SendResult(False, error=f"the group is now the supergroup {exc.new_chat_id}")
    if isinstance(exc, InvalidToken | BadRequest | Forbidden) or _TOO_LARGE in exc.message.lower():
        return SendResult(False, error=exc.message)
    return SendResult(False, error=exc.message, retryable=True)


def _startup_error(exc: TelegramError) -> str:
    cause = exc.__cause__ if isinstance(exc.__cause__, TelegramError) else exc
    if isinstance(exc, InvalidToken):
        return _NOT_FOUND if "not found" in cause.message.lower() else _TOKEN_REJECTED
    return f"telegram: could not start: {exc.message}"


def _chat_ref(chat_id: str) -> int | str:
    """Numeric chat ids as int (the rate limiter groups by them); ``@channel`` names as they are."""
    return int(chat_id) if chat_id.lstrip("-").isdigit() else chat_id


def _thread_kwargs(metadata: Mapping[str, str] | None) -> dict[str, Any]:
    thread = (metadata or {}).get("thread_id")
    return {"message_thread_id": int(thread)} if thread else {}


def _attachments(msg: Message) -> tuple[Attachment, ...]:
    found: list[Attachment] = []
    if msg.photo:
        largest = msg.photo[-1]
        found.append(Attachment("photo", largest.file_id, None, "image/jpeg", largest.file_size))
    media: tuple[tuple[AttachmentKind, Any], ...] = (
        ("document", msg.document), ("voice", msg.voice), ("audio", msg.audio), ("video", msg.video))
    for kind, item in media:
        if item is not None:
            found.append(Attachment(kind, item.file_id, getattr(item, "file_name", None), item.mime_type,
                                    item.file_size))
    return tuple(found)


def _topic(msg: Message) -> str | None:
    """The forum topic a message is in, as ``thread_id``."""
    return str(msg.message_thread_id) if msg.is_topic_message and msg.message_thread_id else None


def _callback_data(index: int, choice: Choice) -> str | None:
    """What a choice's button carries: its text when Telegram takes that, else (a label) an index token; None for
    a command too long to carry."""
    text = choice.text
    if (text and len(text.encode()) <= InlineKeyboardButtonLimit.MAX_CALLBACK_DATA
            and not text.startswith(_INDEX_TOKEN)):
        return text
    return None if choice.command else f"{_INDEX_TOKEN}{index}"


def _keyboard(choices: Sequence[Choice]) -> tuple[InlineKeyboardMarkup | None, list[Choice]]:
    """The inline keyboard for ``choices`` (one button a row, two short ones sharing one) and the choices no
    button can carry."""
    rows: list[list[InlineKeyboardButton]] = []
    uncarried: list[Choice] = []
    for index, choice in enumerate(choices):
        data = _callback_data(index, choice)
        if data is None:
            uncarried.append(choice)
            continue
        button = InlineKeyboardButton(choice.label, callback_data=data)
        if (rows and len(rows[-1]) == 1 and len(rows[-1][0].text) <= _PAIRED_LABEL
                and len(choice.label) <= _PAIRED_LABEL):
            rows[-1].append(button)
        else:
            rows.append([button])
    return (InlineKeyboardMarkup(rows) if rows else None), uncarried


def _pressed_text(message: Message, data: str | None) -> str | None:
    """The text of the choice whose button carries ``data`` on ``message``; None when the message shows none."""
    markup = message.reply_markup
    for row in markup.inline_keyboard if markup is not None and data else ():
        for button in row:
            if button.callback_data == data:
                return button.text if data.startswith(_INDEX_TOKEN) else data
    return None


def _menu_entry(command: MenuCommand) -> BotCommand:
    """A menu entry as setMyCommands takes it: a description of 1-256 characters (the name when it has none)."""
    description = command.description.strip() or command.name
    limit = BotCommandLimit.MAX_DESCRIPTION
    return BotCommand(command.name, description if len(description) <= limit else description[:limit - 1] + "…")


def _strip_mention(text: str, username: str) -> str:
    """``text`` without a leading ``@username`` and the separators after it."""
    handle = "@" + username
    rest = text[len(handle):]
    if not text.lower().startswith(handle.lower()) or (rest[:1].isalnum() or rest[:1] == "_"):
        return text
    return rest.lstrip(" \t\n,:;")


class TelegramAdapter(FilesMixin, BasePlatformAdapter):
    """A Telegram bot on a hand-driven ``telegram.ext.Application`` (never run_polling/run_webhook)."""

    name = "telegram"
    max_message_length = 4096
    length_fn = utf16_len
    can_edit = True
    can_delete = True
    can_react = True
    can_buttons = True

    def __init__(self, settings: TelegramSettings) -> None:
        super().__init__()
        self.settings = settings
        if settings.parse_mode == "html":  # parts are measured as Telegram counts them: the rendered text
            self.length_fn = telegram_length
        self.bot_username: str | None = None
        builder = (Application.builder().token(settings.token).base_url(settings.base_url)
                   .base_file_url(settings.base_file_url).updater(None).job_queue(None)
                   .request(HTTPXRequest(connection_pool_size=_POOL_SIZE, httpx_kwargs={"limits": httpx.Limits(
                       max_connections=_POOL_SIZE, max_keepalive_connections=IDLE_CONNECTIONS_KEPT)})))
        if settings.overall_per_second or settings.group_per_minute:
            # max_retries=0: a 429 comes back to the outbox, which keeps the part durable and retries it
            # after retry_after without holding up other chats (PTB would sleep inside the call).
            builder = builder.rate_limiter(AIORateLimiter(overall_max_rate=settings.overall_per_second,
                                                          group_max_rate=settings.group_per_minute, max_retries=0))
            logging.getLogger("telegram.ext.AIORateLimiter").addFilter(_FLOOD_FILTER)  # adding twice is a no-op
        self._app = builder.build()
        self._downloads = AttachmentDownloader(self._app.bot, settings.max_attachment_bytes)
        self._allowed_updates = ["message", "callback_query"] + (
            ["edited_message"] if settings.edited_messages == "handle" else [])
        self._on_message: OnMessage | None = None
        self._ready = asyncio.Event()  # getMe done: the bot can send and read updates
        self._init_task: asyncio.Task[None] | None = None
        self._receive_task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._offset: int | None = None
        self._long_polling = False

    # -- lifecycle -------------------------------------------------------------------------------

    def http_routes(self) -> list[web.RouteDef]:
        """The webhook endpoint, in webhook mode."""
        if self.settings.mode != "webhook":
            return []
        return [web.post(self.settings.webhook_path, self._handle_webhook)]

    async def connect(self, on_message: OnMessage, *, receive: bool = True) -> None:
        """getMe, then with `receive` start receiving; a Bot API that is unreachable is retried in the background.

        Raises RuntimeError (state FAILED) when the token is rejected or the webhook is refused for good.
        """
        self._on_message = on_message
        self._set_state(AdapterState.CONNECTING)
        if not await self._try_initialize():
            self._init_task = self._spawn(self._keep_initializing(), "telegram-init")
        if receive:
            await self.start_receiving()

    async def start_receiving(self) -> None:
        """Polling mode: start the getUpdates loop. Webhook mode: setWebhook, then the route takes updates.

        Raises RuntimeError (state FAILED) when Telegram refuses the webhook for good; an unreachable Bot
        API is retried in the background.
        """
        if self._receiving:
            return
        set_up = self._ready.is_set() and await self._try_setup()
        self._receiving = True
        self._stop = asyncio.Event()
        if not (set_up and self.settings.mode == "webhook"):
            self._receive_task = self._spawn(self._receive(set_up), "telegram-receive")

    async def stop_receiving(self) -> None:
        """Stop polling at once (an update being handed over may finish) and confirm what was stored.

        In webhook mode the route answers 503 from now on, so Telegram delivers again; the webhook stays
        set, since other replicas may still serve it.
        """
        if not self._receiving:
            return
        self._receiving = False
        self._stop.set()
        task, self._receive_task = self._receive_task, None
        if task is not None:
            if self._long_polling:
                task.cancel()
            _, pending = await asyncio.wait({task}, timeout=_STOP_GRACE)
            for late in pending:
                late.cancel()
                await asyncio.wait({late})
        if self._offset is not None and self.state is AdapterState.CONNECTED:
            with contextlib.suppress(TelegramError):
                await self._app.bot.get_updates(offset=self._offset, timeout=0, limit=1,
                                                read_timeout=_CONFIRM_TIMEOUT, allowed_updates=self._allowed_updates)
        if self.state is AdapterState.CONNECTING and self._ready.is_set():
            self._set_state(AdapterState.CONNECTED)  # what failed was receiving; sending works

    async def disconnect(self) -> None:
        """Stop receiving (see `stop_receiving`) and retrying getMe, then close."""
        await self.stop_receiving()
        self._on_message = None
        task, self._init_task = self._init_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
        await self._app.shutdown()
        await self._app.bot.shutdown()  # also when initialize never got past getMe
        await self._downloads.close()
        self._set_state(AdapterState.DISCONNECTED)

    async def _attempt(self, call: Awaitable[object], method: str) -> bool:
        """Await one startup call; False after a transient failure (state CONNECTING, error recorded).

        Raises RuntimeError (state FAILED) when Telegram refuses it for good.
        """
        try:
            await call
        except TelegramError as exc:
            if not _transient(exc):
                message = _startup_error(exc)
                self._set_state(AdapterState.FAILED, message)
                raise RuntimeError(message) from None
            logger.warning("telegram: %s failed (%s); retrying", method, exc.message)
            self._set_state(AdapterState.CONNECTING, f"telegram: Bot API unreachable: {exc.message}")
            return False
        self._set_state(AdapterState.CONNECTED)
        return True

    async def _try_initialize(self) -> bool:
        """getMe (what sending and reading updates need); False after a transient failure."""
        if not await self._attempt(self._app.initialize(), "getMe"):
            return False
        self.bot_username = self._app.bot.username
        self._ready.set()
        logger.info("telegram: connected as @%s", self.bot_username)
        return True

    async def _try_setup(self) -> bool:
        """setWebhook, or in polling mode deleteWebhook; False after a transient failure."""
        bot = self._app.bot
        if self.settings.mode == "webhook":
            done = await self._attempt(bot.set_webhook(self.settings.webhook_url or "",
                                                       secret_token=self.settings.webhook_secret,
                                                       allowed_updates=self._allowed_updates), "setWebhook")
        else:
            done = await self._attempt(bot.delete_webhook(), "deleteWebhook")
        if done:
            logger.info("telegram: receiving (%s)", self.settings.mode)
        return done

    async def _keep_initializing(self) -> None:
        """Retry getMe with backoff until it succeeds or is refused for good (disconnect cancels this)."""
        delay = _BACKOFF_INITIAL
        while True:
            await asyncio.sleep(delay)
            try:
                if await self._try_initialize():
                    return
            except RuntimeError as exc:
                logger.error("%s", exc)
                return
            delay = min(delay * 2, _BACKOFF_MAX)

    async def _receive(self, set_up: bool) -> None:
        """Set up receiving once getMe is done (retrying while the Bot API is unreachable), then poll."""
        delay = _BACKOFF_INITIAL
        while not set_up:
            if self.state is AdapterState.FAILED or await self._pause(delay):
                return
            if self._ready.is_set():
                try:
                    set_up = await self._try_setup()
                except RuntimeError as exc:
                    logger.error("%s", exc)
                    return
                delay = min(delay * 2, _BACKOFF_MAX)
        if self.settings.mode == "polling":
            await self._poll()

    async def _pause(self, seconds: float) -> bool:
        """Sleep, cut short by stop_receiving; returns whether receiving is stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        return self._stop.is_set()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("telegram: task %s died", task.get_name(), exc_info=task.exception())
            self._set_state(AdapterState.FAILED, f"telegram: {task.get_name()} stopped: {task.exception()}")

    # -- inbound ---------------------------------------------------------------------------------

    async def _poll(self) -> None:
        """Poll until disconnected, backing off after failures (honouring retry_after); never spins."""
        delay = _BACKOFF_INITIAL
        while not self._stop.is_set():
            try:
                if await self._poll_once():
                    delay = _BACKOFF_INITIAL
                    continue
                wait = delay
            except InvalidToken as exc:
                message = _startup_error(exc)
                logger.error("%s", message)
                self._set_state(AdapterState.FAILED, message)
                return
            except TelegramError as exc:
                wait = _retry_seconds(exc) if isinstance(exc, RetryAfter) else delay
                logger.warning("telegram: getUpdates failed (%s); retrying in %.1fs", exc.message, wait)
                self._set_state(AdapterState.CONNECTING, f"telegram: getUpdates failed: {exc.message}")
            delay = min(delay * 2, _BACKOFF_MAX)
            if await self._pause(wait):
                return

    async def _poll_once(self) -> bool:
        """One getUpdates, then each update handed over before the offset moves past it.

        False when the gateway could not take an update: it stays unconfirmed and comes again.
        """
        self._long_polling = True
        try:
            updates = await self._app.bot.get_updates(offset=self._offset, timeout=self.settings.poll_timeout,
                                                      allowed_updates=self._allowed_updates)
        finally:
            self._long_polling = False
        if self.state is not AdapterState.CONNECTED:
            self._set_state(AdapterState.CONNECTED)
        for update in updates:
            if self._stop.is_set():
                break
            try:
                await self._deliver(update)
            except Exception:
                logger.exception("telegram: could not hand over update %s; it will be redelivered", update.update_id)
                return False
            self._offset = update.update_id + 1
        return True

    async def _deliver(self, update: Update) -> Accepted | None:
        """Offer an update to the gateway; an update that cannot be read is logged and skipped."""
        on_message = self._on_message
        if update.callback_query is not None:
            return await self._deliver_press(update.callback_query, on_message)
        try:
            event = self.to_event(update)
        except Exception:  # one malformed update must not block every later one
            logger.exception("telegram: update %s could not be read; skipped", update.update_id)
            return None
        if event is None or on_message is None:
            return None
        return await on_message(event)

    async def _handle_webhook(self, request: web.Request) -> web.Response:
        if self._on_message is None or not self._receiving or not self._ready.is_set():
            return web.Response(status=503, text="not accepting updates right now")  # Telegram delivers again
        given = request.headers.get(SECRET_HEADER, "").encode()
        if not hmac.compare_digest(given, (self.settings.webhook_secret or "").encode()):
            logger.info("telegram: webhook request with a wrong or missing secret refused")
            return web.Response(status=403, text="wrong secret token")
        try:
            data = await request.json()
            update = Update.de_json(data, self._app.bot) if isinstance(data, dict) else None
        except (ValueError, TypeError, KeyError, AttributeError):
            update = None
        if update is None:
            return web.Response(status=400, text="not a Telegram update")
        try:
            await self._deliver(update)
        except Exception:  # not stored: Telegram delivers it again
            logger.exception("telegram: could not hand over update %s", update.update_id)
            return web.Response(status=503, text="could not store the update")
        return web.Response(status=200)

    async def _deliver_press(self, query: CallbackQuery, on_message: OnMessage | None) -> Accepted | None:
        """Answer a button press at once (whatever the gateway does with it) and offer it to the gateway."""
        try:
            event, notice = self.press_event(query)
        except Exception:  # one malformed press must not block every later update
            logger.exception("telegram: callback query %s could not be read; skipped", query.id)
            event, notice = None, None
        answering = asyncio.create_task(self._answer(query.id, notice))
        try:
            return await on_message(event) if event is not None and on_message is not None else None
        finally:
            await answering

    async def _answer(self, query_id: str, text: str | None) -> None:
        """answerCallbackQuery, so the presser's client stops waiting; a failure costs only that (a press offered
        again after a restart was answered before, and Telegram refuses a second answer)."""
        try:
            await self._app.bot.answer_callback_query(query_id, text=text)
        except TelegramError as exc:
            logger.info("telegram: answerCallbackQuery %s failed: %s", query_id, exc.message)

    def press_event(self, query: CallbackQuery) -> tuple[MessageEvent | None, str | None]:
        """The MessageEvent for a button press (None when the bot should not act on it) and the short notice its
        answer shows the presser, if any."""
        message, user = query.message, query.from_user
        # Too old for the bot to see (PTB parses it as a Message dated 0), or a message sent in inline mode.
        if not isinstance(message, Message) or not message.is_accessible:
            return None, _TOO_OLD
        chat_type = _CHAT_TYPES.get(message.chat.type)
        if user.is_bot or chat_type is None:
            return None, None
        text = _pressed_text(message, query.data)
        if text is None:  # the buttons were removed (the choice was made) or never carried this
            return None, _GONE
        return MessageEvent(
            platform=self.name, event_id=f"press:{query.id}", chat_id=str(message.chat.id), chat_type=chat_type,
            user_id=str(user.id), user_name=user.username or user.full_name, text=text, message_id=None,
            thread_id=_topic(message), mentions_bot=True,
            metadata={"pressed_message_id": str(message.message_id)}), None

    def to_event(self, update: Update) -> MessageEvent | None:
        """The MessageEvent for an update, or None when the bot should not answer it."""
        msg, edited = update.message, False
        if msg is None and self.settings.edited_messages == "handle" and update.edited_message is not None:
            msg, edited = update.edited_message, True
        if msg is None or msg.from_user is None:
            return None
        # Bots are ignored (as on Discord and Slack), but not Telegram's bot-shaped stand-ins for a message
        # written on behalf of a chat (an anonymous admin, someone writing as their channel): those carry the
        # chat as sender_chat, which is then the sender.
        sender_chat = msg.sender_chat
        if msg.from_user.is_bot and sender_chat is None:
            return None
        chat_type = _CHAT_TYPES.get(msg.chat.type)
        text = msg.text or msg.caption or ""
        attachments = _attachments(msg)
        if chat_type is None or not (text or attachments):
            return None
        bot = self._app.bot
        username = self.bot_username or ""
        entities = msg.parse_entities() if msg.text else msg.parse_caption_entities()
        mentioned = any(
            (e.type == MessageEntity.MENTION and value.lower() == f"@{username}".lower())
            or (e.type == MessageEntity.TEXT_MENTION and e.user is not None and e.user.id == bot.id)
            for e, value in entities.items())
        reply = msg.reply_to_message
        if reply is not None and msg.is_topic_message and reply.message_id == msg.message_thread_id:
            reply = None  # inside a forum topic every message "replies" to the topic's first message
        replied_to_bot = reply is not None and reply.from_user is not None and reply.from_user.id == bot.id
        if chat_type == "group":
            command = any(e.type == MessageEntity.BOT_COMMAND and e.offset == 0
                          and value.partition("@")[2].lower() in ("", username.lower())
                          for e, value in entities.items())
            if self.settings.group_trigger == "mention" and not (mentioned or replied_to_bot or command):
                return None
            text = _strip_mention(text, username) if username else text
        user = msg.from_user
        user_id, user_name = ((str(sender_chat.id), sender_chat.username or sender_chat.title) if sender_chat
                              else (str(user.id), user.username or user.full_name))
        return MessageEvent(
            platform=self.name, event_id=str(update.update_id), chat_id=str(msg.chat.id), chat_type=chat_type,
            user_id=user_id, user_name=user_name, text=text,
            message_id=str(msg.message_id),
            thread_id=_topic(msg),
            reply_to_message_id=str(reply.message_id) if reply is not None else None,
            mentions_bot=mentioned or replied_to_bot, attachments=attachments,
            metadata={"edited": "true"} if edited else {})

    # -- outbound --------------------------------------------------------------------------------

    async def send(self, chat_id: str, content: str, reply_to: str | None = None,
                   metadata: Mapping[str, str] | None = None) -> SendResult:
        """sendMessage, formatted per ``parse_mode``, threaded under ``reply_to`` and in the topic.

        A part in doubt (``metadata["in_doubt"]``) is sent again: the Bot API can neither look it up nor drop
        a repeat, so a part is delivered at least once."""
        return await self._send(chat_id, content, reply_to, metadata, None)

    async def send_choices(self, chat_id: str, content: str, choices: Sequence[Choice], reply_to: str | None = None,
                           metadata: Mapping[str, str] | None = None) -> SendResult:
        """``send`` with the choices as inline keyboard buttons; a choice whose command is too long for a button's
        64 bytes is listed as text instead."""
        keyboard, uncarried = _keyboard(choices)
        if uncarried:
            content = f"{content}\n\n{choices_as_text(uncarried)}"
        return await self._send(chat_id, content, reply_to, metadata, keyboard)

    async def set_commands(self, commands: Sequence[MenuCommand]) -> None:
        """setMyCommands for every chat, private chats and group chats (narrower scopes set earlier would hide
        the default list). Names Telegram refuses are left out and logged; failures are logged, never raised."""
        refused = [c.name for c in commands if not _COMMAND_NAME.fullmatch(c.name)]
        if refused:
            logger.warning("telegram: the command menu leaves out %s (Telegram takes 1-32 of a-z, 0-9 and _)",
                           ", ".join(refused))
        menu = [_menu_entry(c) for c in commands if _COMMAND_NAME.fullmatch(c.name)]
        for scope in _MENU_SCOPES:
            try:
                await self._app.bot.set_my_commands(menu, scope=scope)
            except TelegramError as exc:
                logger.warning("telegram: setMyCommands (%s) failed: %s", scope.type, exc.message)

    async def _send(self, chat_id: str, content: str, reply_to: str | None, metadata: Mapping[str, str] | None,
                    keyboard: InlineKeyboardMarkup | None) -> SendResult:
        options: dict[str, Any] = {"link_preview_options": _NO_PREVIEW}
        if keyboard is not None:
            options["reply_markup"] = keyboard
        return await self._post(self._app.bot.send_message, "sendMessage", chat_id, content, reply_to, metadata,
                                options)

    async def _post(self, call: Callable[..., Awaitable[Message]], method: str, chat_id: str, content: str,
                    reply_to: str | None, metadata: Mapping[str, str] | None, options: dict[str, Any],
                    field: Literal["text", "caption"] = "text") -> SendResult:
        """One new message through ``call`` (the Bot API's ``method``) with ``content`` formatted as its ``field``,
        threaded under ``reply_to`` and in the topic; Telegram's errors as the outbox needs them."""
        kwargs: dict[str, Any] = {"chat_id": _chat_ref(chat_id), **_thread_kwargs(metadata), **options}
        if reply_to:
            kwargs["reply_parameters"] = ReplyParameters(int(reply_to), allow_sending_without_reply=True)
        try:
            msg = await self._formatted(call, content, kwargs, field)
        except TelegramError as exc:
            logger.info("telegram: %s to %s failed: %s", method, chat_id, exc.message)
            return _send_failure(exc)
        return SendResult(True, message_id=str(msg.message_id))

    async def edit_message(self, chat_id: str, message_id: str, content: str,
                           metadata: Mapping[str, str] | None = None) -> SendResult:
        """editMessageText; an edit to the text the message already shows counts as done. Buttons the message
        had are removed (an edit without reply_markup drops the inline keyboard, also when the text stays)."""
        kwargs: dict[str, Any] = {"chat_id": _chat_ref(chat_id), "message_id": int(message_id),
                                  "link_preview_options": _NO_PREVIEW}
        try:
            await self._formatted(self._app.bot.edit_message_text, content, kwargs)
        except TelegramError as exc:
            if isinstance(exc, BadRequest) and _NOT_MODIFIED in exc.message.lower():
                return SendResult(True, message_id=message_id)
            logger.info("telegram: editMessageText in %s failed: %s", chat_id, exc.message)
            return _send_failure(exc)
        return SendResult(True, message_id=message_id)

    async def delete_message(self, chat_id: str, message_id: str,
                             metadata: Mapping[str, str] | None = None) -> SendResult:
        """deleteMessage of a message the bot sent."""
        try:
            await self._app.bot.delete_message(chat_id=_chat_ref(chat_id), message_id=int(message_id))
        except TelegramError as exc:
            logger.info("telegram: deleteMessage in %s failed: %s", chat_id, exc.message)
            return _send_failure(exc)
        return SendResult(True, message_id=message_id)

    async def send_typing(self, chat_id: str, metadata: Mapping[str, str] | None = None) -> None:
        """sendChatAction typing (in the topic, if any); failures only cost the indicator."""
        try:
            await self._app.bot.send_chat_action(_chat_ref(chat_id), ChatAction.TYPING, **_thread_kwargs(metadata))
        except TelegramError as exc:
            logger.debug("telegram: sendChatAction to %s failed: %s", chat_id, exc.message)

    async def set_reaction(self, chat_id: str, message_id: str, emoji: str | None, previous: str | None = None,
                           metadata: Mapping[str, str] | None = None) -> SendResult:
        """setMessageReaction: a bot has one reaction per message, so setting one replaces the last (no ``previous``
        needed); None sets none."""
        reaction = [ReactionTypeEmoji(emoji)] if emoji else []
        try:
            await self._app.bot.set_message_reaction(_chat_ref(chat_id), int(message_id), reaction)
        except TelegramError as exc:
            logger.info("telegram: setMessageReaction in %s failed: %s", chat_id, exc.message)
            return _send_failure(exc)
        return SendResult(True, message_id=message_id)

    async def _formatted(self, call: Callable[..., Awaitable[Any]], content: str, kwargs: dict[str, Any],
                         field: Literal["text", "caption"] = "text") -> Any:
        """``call`` with ``content`` formatted as its ``field`` (text or caption); formatting Telegram rejects is
        resent as plain text (what the formatting showed, or the Markdown itself when that is blank)."""
        mode = self.settings.parse_mode
        plain = content
        if mode == "html":
            text, parse_mode = to_telegram_html(content), ParseMode.HTML
            plain = shown if (shown := telegram_text(text)).strip() else content
        else:
            text, parse_mode = content, (ParseMode.MARKDOWN if mode == "markdown" else None)
        try:
            return await call(**{field: text}, parse_mode=parse_mode, **kwargs)
        except BadRequest as exc:
            if parse_mode is None or not any(fragment in exc.message.lower() for fragment in _FORMAT_ERRORS):
                raise
            logger.info("telegram: formatted text rejected (%s); sending it as plain text", exc.message)
        return await call(**{field: plain}, **kwargs)
