"""Slack through slack-bolt (async): Socket Mode or the HTTP Events API.

Delivery is at least once: the app is built with ``process_before_response=True`` and every listener
only hands the event to ``on_message`` (the gateway's durable inbox), so bolt's ack (the Socket Mode
envelope ack, or the HTTP 200) follows the inbox write. Slack's retries of one event carry the same
``event_id``, which is the event's dedupe key, so a retry is acknowledged but never processed twice.

What is answered: mentions in channels (in a thread, so a thread is one session), direct messages,
replies in threads the bot is taking part in, the slash command (``/hermes new`` is ``/new``) and presses of
the Block Kit buttons ``send_choices`` posts. Replies are converted from Markdown to Slack's mrkdwn
(:func:`to_mrkdwn`). Files shared with the bot are fetched, and files sent, through platforms/slack_files.py.

A press is acknowledged before the gateway sees it: Slack shows the presser an error when the ack takes over
3 seconds and never delivers an interaction again, so the press is handed to ``on_message`` after the ack
(in a task the adapter owns) and, when the gateway cannot take it, the presser is told so through the
interaction's ``response_url``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncAck, AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncConnectionErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse
from slack_sdk.webhook.async_client import AsyncWebhookClient

from platforms.base import (
    AdapterState,
    Attachment,
    AttachmentKind,
    BasePlatformAdapter,
    ChatType,
    Choice,
    GatewayClosing,
    MessageEvent,
    OnMessage,
    SendResult,
    split_message,
)
from platforms.files import AttachmentUnavailable, OutgoingFile, OutgoingKind
from platforms.rich_text import mrkdwn_length, to_mrkdwn
from platforms.slack_files import UPLOAD_LIMIT, download, file_origins, private_url, upload

__all__ = ["CHOICE_ACTION_PREFIX", "MAX_PART_LENGTH", "SlackAdapter", "SlackSettings", "SlackStartupError",
           "to_mrkdwn"]

logger = logging.getLogger(__name__)
DELIVERY_EVENT = "hermes_delivery"  # message metadata type carrying the outbox delivery id
T = TypeVar("T")

# chat.postMessage truncates text over 40,000 characters, and Slack recommends at most 4,000 (longer
# messages collapse behind "Show more"): parts are cut at 4,000 characters of the mrkdwn actually posted.
MAX_PART_LENGTH = 4000
# Threads the bot takes part in, so replies there need no mention (oldest forgotten first).
MAX_ACTIVE_THREADS = 10_000
_HTTP_TIMEOUT = 15.0
_SOCKET_CONNECT_TIMEOUT = 30.0
_AUTH_ERRORS = frozenset({"invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired",
                          "not_allowed_token_type"})
_RETRYABLE_ERRORS = frozenset({"ratelimited", "internal_error", "fatal_error", "service_unavailable",
                               "request_timeout"})
# Answers meaning a method will not work for this app until it is reconfigured (a scope, the assistant feature):
# the adapter stops calling it for the rest of the process.
_UNAVAILABLE_ERRORS = frozenset({"missing_scope", "not_allowed", "not_allowed_token_type", "unknown_method",
                                 "method_deprecated", "no_permission"})
THINKING_STATUS = "is thinking…"
# Message subtypes that are still a person writing; every other subtype (edits, deletions, joins,
# bot_message ...) is not a new message for the assistant.
_USER_SUBTYPES = frozenset({"file_share", "thread_broadcast"})

# Buttons of send_choices: action ids "hermes_choice_0", "hermes_choice_1" ... in one actions block.
CHOICE_ACTION_PREFIX = "hermes_choice_"
_CHOICES_BLOCK_ID = "hermes_choices"
# Block Kit limits: section text, button label and button value (in characters).
_SECTION_TEXT_LIMIT = 3000
_BUTTON_LABEL_LIMIT = 75
_BUTTON_VALUE_LIMIT = 2000
_PRESS_DRAIN_TIMEOUT = 5.0  # how long disconnect waits for presses still being handed to the gateway
RESTARTING_NOTE = "The gateway is restarting; press again in a moment."
PRESS_FAILED_NOTE = "That press could not be taken; press again in a moment."


@dataclass(frozen=True, slots=True)
class SlackSettings:
    """Everything the adapter needs (the gateway builds it from ``platforms.slack``)."""

    bot_token: str
    app_token: str | None = None
    signing_secret: str | None = None
    mode: Literal["socket", "http"] = "socket"
    api_base_url: str = "https://slack.com/api/"
    events_path: str = "/slack/events"
    slash_command: str = "/hermes"
    reply_in_thread: bool = True
    ping_interval: float = 10.0
    assistant_status: bool = True


class SlackStartupError(RuntimeError):
    """Slack could not be started; the message names the platform and the setting to check."""


class SlackAdapter(BasePlatformAdapter):
    """Slack over slack-bolt's ``AsyncApp``; HTTP mode serves ``http_routes()`` on the gateway's server."""

    name = "slack"
    max_message_length = MAX_PART_LENGTH
    length_fn = mrkdwn_length
    can_edit = True
    can_delete = True
    can_react = True
    can_buttons = True

    def __init__(self, settings: SlackSettings) -> None:
        super().__init__()
        self.settings = settings
        self.bot_user_id: str | None = None
        self._on_message: OnMessage | None = None
        self._session: aiohttp.ClientSession | None = None
        self._app: AsyncApp | None = None
        self._sender: AsyncWebClient | None = None
        self._socket: AsyncSocketModeHandler | None = None
        self._threads: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._unavailable: dict[str, str] = {}  # method -> the error that made the adapter stop calling it
        self._presses: set[asyncio.Task[None]] = set()  # presses acked to Slack, being handed to the gateway
        self._file_origins = file_origins(settings.api_base_url)  # where the bot token may go for a download

    # ----------------------------------------------------------------- lifecycle

    def http_routes(self) -> list[web.RouteDef]:
        """The Events API endpoint in HTTP mode (nothing in Socket Mode)."""
        return [web.post(self.settings.events_path, self._handle_http)] if self.settings.mode == "http" else []

    async def connect(self, on_message: OnMessage, *, receive: bool = True) -> None:
        """Check the bot token (auth.test) and build the bolt app; with `receive`, also start receiving."""
        self._on_message = on_message
        self._set_state(AdapterState.CONNECTING)
        s = self.settings
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_HTTP_TIMEOUT))
        # Startup and socket calls may retry a dropped connection inside the SDK: they are idempotent.
        client = AsyncWebClient(token=s.bot_token, base_url=s.api_base_url, session=self._session,
                                retry_handlers=[AsyncConnectionErrorRetryHandler(max_retry_count=2)])
        # Posting has no SDK retries at all: the outbox owns retrying (it honours Retry-After, persists the
        # attempt and keeps the chat's parts in order), and a retry here would hold the chat's lane hostage.
        self._sender = AsyncWebClient(token=s.bot_token, base_url=s.api_base_url, session=self._session,
                                      retry_handlers=[])
        try:
            await self._authenticate(client)
            self._app = self._build_app(client)
        except Exception as exc:
            await self._release()
            raise self._failed(exc) from exc
        self._set_state(AdapterState.CONNECTED)
        logger.info("slack connected as %s (%s mode)", self.bot_user_id, s.mode)
        if receive:
            await self.start_receiving()

    async def start_receiving(self) -> None:
        """Socket Mode: open the socket. HTTP mode: the events route takes events (503 until then; Slack retries).

        Raises SlackStartupError (state FAILED) when the socket cannot be opened.
        """
        if self._receiving:
            return
        if self.settings.mode == "socket":
            try:
                await self._open_socket()
            except Exception as exc:
                await self._close_socket()
                raise self._failed(exc) from exc
        self._receiving = True
        self._set_state(AdapterState.CONNECTED)

    async def stop_receiving(self) -> None:
        """Close the socket or refuse HTTP events (503); sending keeps working.

        Envelopes are acknowledged only after ``on_message`` returned, so one not acknowledged when the
        socket closes is delivered again by Slack, like an HTTP event refused with 503.
        """
        self._receiving = False
        await self._close_socket()

    async def disconnect(self) -> None:
        """Close the socket and the HTTP session; the HTTP endpoint answers 503 from now on.

        Presses already acknowledged to Slack are first given a few seconds to reach the gateway (or to tell
        the presser it could not take them)."""
        await self.stop_receiving()
        await self._drain_presses()
        await self._release()
        if self._state != AdapterState.FAILED:
            self._set_state(AdapterState.DISCONNECTED)

    def _failed(self, exc: Exception) -> SlackStartupError:
        message = str(exc) if isinstance(exc, SlackStartupError) else f"slack: failed to start: {exc!r}"
        self._set_state(AdapterState.FAILED, message)
        return SlackStartupError(message)

    async def _drain_presses(self) -> None:
        if not self._presses:
            return
        _done, pending = await asyncio.wait(set(self._presses), timeout=_PRESS_DRAIN_TIMEOUT)
        for task in pending:
            logger.error("slack: a button press was still being handed over at shutdown; it is lost")
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _close_socket(self) -> None:
        socket, self._socket = self._socket, None
        if socket is not None:
            await socket.close_async()

    async def _release(self) -> None:
        session = self._session
        self._app = self._sender = self._session = None
        if session is not None:
            await session.close()

    async def _startup_call(self, call: Awaitable[T], method: str, token: Literal["bot_token", "app_token"]) -> T:
        """Await a startup API call, turning its failure into an error that names the setting to fix."""
        try:
            return await call
        except SlackApiError as exc:
            error = _error_code(exc)
            if error in _AUTH_ERRORS:
                what = "bot token" if token == "bot_token" else "app token"
                raise SlackStartupError(f"slack: the {what} was rejected ({method}: {error}); "
                                        f"check platforms.slack.{token}") from None
            raise SlackStartupError(f"slack: {method} failed ({error}); "
                                    "check platforms.slack.api_base_url and Slack's status") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise SlackStartupError(f"slack: cannot reach {self.settings.api_base_url} ({exc!r}); "
                                    "check platforms.slack.api_base_url and the network") from None

    async def _authenticate(self, client: AsyncWebClient) -> None:
        auth = await self._startup_call(client.auth_test(), "auth.test", "bot_token")
        self.bot_user_id = auth.get("user_id")

    def _build_app(self, client: AsyncWebClient) -> AsyncApp:
        app = AsyncApp(client=client, signing_secret=self.settings.signing_secret or "",
                       process_before_response=True, request_verification_enabled=self.settings.mode == "http")
        app.event("app_mention")(self._on_mention)
        app.event("message")(self._on_message_event)
        app.command(self.settings.slash_command)(self._on_command)
        app.action(re.compile(f"^{CHOICE_ACTION_PREFIX}"))(self._on_press)
        # Any other subscribed event is acknowledged and dropped: bolt would answer 404, and Slack retries
        # (and eventually disables) a subscription whose deliveries fail.
        app.event(re.compile(".*"))(self._ignore)
        return app

    async def _open_socket(self) -> None:
        s = self.settings
        assert self._app is not None and s.app_token
        self._socket = AsyncSocketModeHandler(self._app, s.app_token, ping_interval=s.ping_interval)
        sdk = self._socket.client
        # The SDK's connect() retries forever, so a bad app token would hang startup: ask for the first URL
        # here, where the error can be reported, and let connect() use it.
        sdk.wss_uri = await self._startup_call(sdk.issue_new_wss_url(), "apps.connections.open", "app_token")
        try:
            await asyncio.wait_for(self._socket.connect_async(), _SOCKET_CONNECT_TIMEOUT)
        except TimeoutError:
            raise SlackStartupError(f"slack: the Socket Mode connection did not open within "
                                    f"{_SOCKET_CONNECT_TIMEOUT:.0f}s") from None

    # ----------------------------------------------------------------- inbound

    async def _handle_http(self, request: web.Request) -> web.StreamResponse:
        """The Events API endpoint: bolt verifies the signature and dispatches."""
        app = self._app
        if app is None or not self._receiving:
            return web.json_response({"error": "slack is not receiving events here now"}, status=503)
        raw = await request.read()
        try:
            body = raw.decode("utf-8")
        except UnicodeDecodeError:
            # Slack signs UTF-8 text; bytes that are not UTF-8 cannot be a genuine request (bolt's own
            # to_bolt_request would fail on them with a 500, which Slack would keep retrying).
            return web.json_response({"error": "invalid request"}, status=401)
        if "X-Slack-Retry-Num" in request.headers:
            logger.info("slack retry %s (%s)", request.headers["X-Slack-Retry-Num"],
                        request.headers.get("X-Slack-Retry-Reason", "?"))
        bolt_request = AsyncBoltRequest(body=body, query=request.query_string,
                                        headers=request.headers)  # type: ignore[arg-type]
        return await to_aiohttp_response(await app.async_dispatch(bolt_request))

    async def _on_mention(self, body: dict[str, Any]) -> None:
        event = body["event"]
        if self._from_a_bot(event):
            return
        thread = event.get("thread_ts") or (event["ts"] if self.settings.reply_in_thread else None)
        await self._deliver(body, event, "group", thread, mentions_bot=True)

    async def _on_message_event(self, body: dict[str, Any]) -> None:
        event = body["event"]
        if event.get("subtype") not in (None, *_USER_SUBTYPES) or self._from_a_bot(event):
            return
        if event.get("channel_type") == "im":
            await self._deliver(body, event, "dm", event.get("thread_ts"),
                                mentions_bot=self._mention in (event.get("text") or ""))
            return
        thread = event.get("thread_ts")
        if thread is None or (event["channel"], thread) not in self._threads:
            return
        if self._mention in (event.get("text") or ""):
            return  # the app_mention event for this same message is the one answered
        await self._deliver(body, event, "group", thread, mentions_bot=False)

    async def _on_command(self, ack: AsyncAck, command: dict[str, Any]) -> None:
        text = (command.get("text") or "").strip()
        channel = command["channel_id"]
        event = MessageEvent(
            platform=self.name, event_id=f"command:{command['trigger_id']}", chat_id=channel,
            chat_type=_chat_type(channel), user_id=command["user_id"],
            user_name=command.get("user_name"), text=f"/{text}" if text else "/help",
            metadata={"team_id": command.get("team_id", ""), "command": command.get("command", "")})
        if await self._accept(event):
            await ack()  # shows nothing: the answer arrives as a normal message through the outbox
        else:
            await ack("You are not allowed to use this assistant here.")

    async def _on_press(self, ack: AsyncAck, body: dict[str, Any], action: dict[str, Any]) -> None:
        """A button of ``send_choices`` pressed: acknowledged at once, then handed over in an owned task (with
        ``process_before_response`` bolt sends the ack only when this listener returns)."""
        await ack()
        event = self._press_event(body, action)
        if event is None:
            logger.warning("slack: a press of %s not on a message was ignored", action.get("action_id"))
            return
        task = asyncio.get_running_loop().create_task(self._hand_over_press(event, body.get("response_url")))
        self._presses.add(task)
        task.add_done_callback(self._presses.discard)

    def _press_event(self, body: Mapping[str, Any], action: Mapping[str, Any]) -> MessageEvent | None:
        """The press as a message from the presser in the chat (and thread) of the message carrying the button."""
        container, message = body.get("container") or {}, body.get("message") or {}
        channel = container.get("channel_id") or (body.get("channel") or {}).get("id")
        message_ts = container.get("message_ts") or message.get("ts")
        user = body.get("user") or {}
        if container.get("type") != "message" or not channel or not message_ts or not user.get("id"):
            return None
        # A top-level message that has replies carries its own ts as thread_ts: it is not in a thread.
        thread = message.get("thread_ts") or container.get("thread_ts")
        return MessageEvent(
            platform=self.name, event_id=f"press:{action.get('action_ts')}:{message_ts}:{user['id']}",
            chat_id=channel, chat_type=_chat_type(channel), user_id=user["id"],
            user_name=user.get("username") or user.get("name"), text=action.get("value") or "",
            thread_id=thread if thread != message_ts else None,
            metadata={"pressed_message_id": message_ts})

    async def _hand_over_press(self, event: MessageEvent, response_url: str | None) -> None:
        """``on_message`` for an acknowledged press; Slack will not deliver it again, so a press the gateway
        could not take is logged and the presser told (ephemerally) to press again."""
        try:
            if await self._accept(event) and event.thread_id is not None:
                self._remember_thread(event.chat_id, event.thread_id)
            return
        except GatewayClosing:
            logger.warning("slack: a button press by %s in %s arrived while the gateway was closing; it is lost "
                           "(Slack does not deliver interactions again), the presser is asked to press again",
                           event.user_id, event.chat_id)
            note = RESTARTING_NOTE
        except Exception:
            logger.exception("slack: a button press by %s in %s could not be handed to the gateway",
                             event.user_id, event.chat_id)
            note = PRESS_FAILED_NOTE
        await self._respond(response_url, note)

    async def _respond(self, response_url: str | None, text: str) -> None:
        """An ephemeral note to the presser through the interaction's ``response_url``."""
        if not response_url or self._session is None:
            return
        hook = AsyncWebhookClient(response_url, timeout=int(_HTTP_TIMEOUT), session=self._session)
        try:
            answer = await hook.send(text=text, response_type="ephemeral", replace_original=False)
        except (aiohttp.ClientError, TimeoutError) as exc:
            logger.warning("slack: cannot post to the response_url (%r)", exc)
            return
        if answer.status_code != 200:
            logger.warning("slack: the response_url refused the note (%s %s)", answer.status_code, answer.body)

    async def _ignore(self) -> None:
        return None

    @property
    def _mention(self) -> str:
        return f"<@{self.bot_user_id}>"

    def _from_a_bot(self, event: Mapping[str, Any]) -> bool:
        return bool(event.get("bot_id")) or event.get("subtype") == "bot_message" or not event.get("user") \
            or event.get("user") == self.bot_user_id

    async def _deliver(self, body: Mapping[str, Any], event: Mapping[str, Any], chat_type: ChatType,
                       thread: str | None, *, mentions_bot: bool) -> None:
        channel = event["channel"]
        text = _strip_mention(event.get("text") or "", self.bot_user_id or "")
        message = MessageEvent(
            platform=self.name, event_id=body["event_id"], chat_id=channel, chat_type=chat_type,
            user_id=event["user"], user_name=None, text=text, message_id=event["ts"], thread_id=thread,
            reply_to_message_id=event.get("thread_ts"), mentions_bot=mentions_bot,
            attachments=tuple(_attachment(f) for f in event.get("files") or () if f.get("id")),
            metadata={"team_id": body.get("team_id", ""), "ts": event["ts"]})
        if await self._accept(message) and thread is not None:
            self._remember_thread(channel, thread)

    async def _accept(self, event: MessageEvent) -> bool:
        """Hand the event to the gateway; an exception propagates, so bolt answers 500 and Slack retries."""
        assert self._on_message is not None
        return await self._on_message(event) is not None

    def _remember_thread(self, channel: str, thread_ts: str) -> None:
        self._threads[(channel, thread_ts)] = None
        self._threads.move_to_end((channel, thread_ts))
        while len(self._threads) > MAX_ACTIVE_THREADS:
            self._threads.popitem(last=False)

    # ----------------------------------------------------------------- outbound

    async def send(self, chat_id: str, content: str, reply_to: str | None = None,
                   metadata: Mapping[str, str] | None = None) -> SendResult:
        """chat.postMessage in the thread named by ``metadata["thread_id"]`` (Slack has no quote-replies).

        The post carries the outbox delivery id as Slack message metadata; a part in doubt (its sender
        died mid-send) is first looked up by that id, so it is never shown twice.
        """
        return await self._post(chat_id, to_mrkdwn(content), metadata)

    async def send_choices(self, chat_id: str, content: str, choices: Sequence[Choice], reply_to: str | None = None,
                           metadata: Mapping[str, str] | None = None) -> SendResult:
        """``content`` as in ``send`` (threads, delivery id, the in-doubt lookup) with a Block Kit button per
        choice under it; a press comes back as a message (``_on_press``). A choice whose text is longer than a
        button's value may be makes them all text instead, like every choice on a platform without buttons."""
        if any(len(c.text) > _BUTTON_VALUE_LIMIT for c in choices):
            return await super().send_choices(chat_id, content, choices, reply_to, metadata)
        text = to_mrkdwn(content)
        return await self._post(chat_id, text, metadata, _choice_blocks(text, choices))

    async def _post(self, chat_id: str, text: str, metadata: Mapping[str, str] | None,
                    blocks: list[dict[str, Any]] | None = None) -> SendResult:
        """chat.postMessage of mrkdwn ``text`` (the notification fallback when there are ``blocks``)."""
        meta = metadata or {}
        thread, delivery = meta.get("thread_id"), meta.get("delivery_id")
        args: dict[str, Any] = {"channel": chat_id, "text": text, "unfurl_links": False, "unfurl_media": False}
        if blocks:
            args["blocks"] = blocks
        if thread:
            args["thread_ts"] = thread
        if delivery:
            args["metadata"] = {"event_type": DELIVERY_EVENT, "event_payload": {"delivery_id": delivery}}
            if meta.get("in_doubt") and (posted := await self._posted_before(chat_id, thread, delivery)):
                logger.info("slack: %s was already posted in %s before the restart (ts %s); not posting it again",
                            delivery, chat_id, posted)
                return SendResult(success=True, message_id=posted)
        result = await self._call(chat_id, lambda c: c.chat_postMessage(**args))
        if result.success and thread:
            self._remember_thread(chat_id, thread)
        return result

    async def _posted_before(self, chat_id: str, thread: str | None, delivery: str) -> str | None:
        """The ts of a message this app already posted for ``delivery`` (by its metadata), if any."""
        client = self._sender
        if client is None:
            return None
        try:
            if thread:
                response = await client.conversations_replies(channel=chat_id, ts=thread, limit=200,
                                                              include_all_metadata=True)
            else:
                response = await client.conversations_history(channel=chat_id, limit=100,
                                                              include_all_metadata=True)
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:  # e.g. no *:history scope
            logger.warning("slack: cannot look %s up in %s (%s); posting it again", delivery, chat_id, exc)
            return None
        for message in response.get("messages") or []:
            posted = message.get("metadata") or {}
            if (posted.get("event_type") == DELIVERY_EVENT
                    and (posted.get("event_payload") or {}).get("delivery_id") == delivery):
                return message.get("ts")
        return None

    async def edit_message(self, chat_id: str, message_id: str, content: str,
                           metadata: Mapping[str, str] | None = None) -> SendResult:
        """chat.update of a message the bot posted (``message_id`` is its ``ts``), removing any buttons.

        ``blocks=[]`` is what removes them: without ``blocks`` Slack keeps the message's blocks, which are
        shown instead of the new text."""
        return await self._call(chat_id, lambda c: c.chat_update(channel=chat_id, ts=message_id,
                                                                 text=to_mrkdwn(content), blocks=[]))

    async def delete_message(self, chat_id: str, message_id: str,
                             metadata: Mapping[str, str] | None = None) -> SendResult:
        """chat.delete of a message the bot posted (``message_id`` is its ``ts``)."""
        return await self._call(chat_id, lambda c: c.chat_delete(channel=chat_id, ts=message_id))

    async def send_typing(self, chat_id: str, metadata: Mapping[str, str] | None = None) -> None:
        """Slack shows bots no typing: in a thread, the AI-assistant status ("<app> is thinking…") when
        ``assistant_status`` allows; elsewhere, or once Slack refused it for this app, nothing. Slack clears the
        status when the app posts in the thread."""
        thread = (metadata or {}).get("thread_id")
        if not self.settings.assistant_status or not thread:
            return
        await self._optional(chat_id, "assistant.threads.setStatus", lambda c: c.assistant_threads_setStatus(
            channel_id=chat_id, thread_ts=thread, status=THINKING_STATUS))

    async def set_reaction(self, chat_id: str, message_id: str, emoji: str | None, previous: str | None = None,
                           metadata: Mapping[str, str] | None = None) -> SendResult:
        """reactions.add of ``emoji`` (a name), then reactions.remove of ``previous`` (Slack keeps every reaction).
        Once Slack refused reactions for this app (no reactions:write scope), nothing is called any more."""
        if emoji and (error := await self._optional(chat_id, "reactions.add", lambda c: c.reactions_add(
                channel=chat_id, timestamp=message_id, name=emoji))) not in (None, "already_reacted"):
            return SendResult(success=False, error=f"slack: reactions.add: {error}")
        if previous and previous != emoji and (error := await self._optional(
                chat_id, "reactions.remove", lambda c: c.reactions_remove(
                    channel=chat_id, timestamp=message_id, name=previous))) not in (None, "no_reaction"):
            return SendResult(success=False, error=f"slack: reactions.remove: {error}")
        return SendResult(success=True, message_id=message_id)

    # ----------------------------------------------------------------- files

    def upload_limit(self, kind: OutgoingKind, chat_id: str | None = None) -> int:
        """Slack's 1 GB, for every kind (all go as files)."""
        return UPLOAD_LIMIT

    async def fetch_attachment(self, attachment: Attachment, max_bytes: int) -> bytes:
        """A shared file's bytes from its private URL with the bot token, which goes to Slack's hosts only.

        A file the event named only by id is looked up with files.info first. Raises AttachmentTooLarge past
        ``max_bytes``, AttachmentUnavailable otherwise (retryable for the network, timeouts, 5xx and rate limits)."""
        client, session = self._sender, self._session
        if client is None or session is None:
            raise AttachmentUnavailable("slack is not connected", retryable=True)
        try:
            url = attachment.url or await private_url(client, attachment.file_id)
            return await download(session, self.settings.bot_token, self._file_origins, attachment, url, max_bytes)
        except SlackApiError as exc:
            failure = _failure(exc)
            raise AttachmentUnavailable(f"{failure.error} (files.info)", retryable=failure.retryable) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise AttachmentUnavailable(f"slack: the download failed: {exc!r}", retryable=True) from None

    async def send_file(self, chat_id: str, file: OutgoingFile, caption: str = "", reply_to: str | None = None,
                        metadata: Mapping[str, str] | None = None) -> SendResult:
        """Upload v2 (platforms/slack_files.py): ``file`` shared in the thread named by ``metadata["thread_id"]``
        with ``caption`` as its comment (mrkdwn, as ``send``); every kind goes as a file (Slack shows an image
        inline). ``message_id`` is the share message's ``ts``.

        Once per ``delivery_id``: an attempt after one that got as far as the upload (``in_doubt`` after a crash, or
        a retry after an answer lost on the way back) first looks that file up and does not share it again."""
        if file.size > UPLOAD_LIMIT:
            return SendResult(success=False, error=f"slack: {file.name} is over Slack's 1 GB limit")
        session = self._session
        if session is None:
            return SendResult(success=False, error="slack is not connected", retryable=True)
        meta = metadata or {}
        thread = meta.get("thread_id")
        comment = to_mrkdwn(caption) if caption else ""
        result = await self._guarded(chat_id, lambda client: upload(
            client, session, self.state_store, chat_id, file, comment=comment, thread=thread,
            delivery=meta.get("delivery_id")))
        if result.success and thread:
            self._remember_thread(chat_id, thread)
        return result

    async def _optional(self, chat_id: str, method: str,
                        request: Callable[[AsyncWebClient], Awaitable[AsyncSlackResponse]]) -> str | None:
        """A call that is nice to have: its error code (None: it worked). An answer meaning the app may not call
        ``method`` stops further calls of it (logged once); any other failure only costs this one."""
        client = self._sender
        if method in self._unavailable:
            return self._unavailable[method]
        if client is None:
            return "not connected"
        try:
            await request(client)
        except SlackApiError as exc:
            error = _error_code(exc)
            if error in _UNAVAILABLE_ERRORS:
                self._unavailable[method] = error
                logger.info("slack: %s is not available to this app (%s); not calling it again", method, error)
            else:
                logger.debug("slack: %s in %s failed: %s", method, chat_id, error)
            return error
        except (aiohttp.ClientError, TimeoutError) as exc:
            logger.debug("slack: %s in %s failed: %r", method, chat_id, exc)
            return "connection error"
        return None

    async def _call(self, chat_id: str, request: Callable[[AsyncWebClient], Awaitable[AsyncSlackResponse]]
                    ) -> SendResult:
        """A Web API call that posts or changes a message, named by the answer's ``ts``."""

        async def posted(client: AsyncWebClient) -> str | None:
            return (await request(client)).get("ts")

        return await self._guarded(chat_id, posted)

    async def _guarded(self, chat_id: str, request: Callable[[AsyncWebClient], Awaitable[str | None]]) -> SendResult:
        """``request``'s message id as a SendResult; Slack's errors and the network's as failures."""
        client = self._sender
        if client is None:
            return SendResult(success=False, error="slack is not connected", retryable=True)
        try:
            message_id = await request(client)
        except SlackApiError as exc:
            result = _failure(exc)
            logger.info("slack call in %s failed: %s", chat_id, result.error)
            return result
        except (aiohttp.ClientError, TimeoutError) as exc:
            return SendResult(success=False, error=f"slack: connection error: {exc!r}", retryable=True)
        return SendResult(success=True, message_id=message_id)


# --------------------------------------------------------------------------- helpers


def _error_code(exc: SlackApiError) -> str:
    data = exc.response.data if exc.response is not None else None
    error = data.get("error") if isinstance(data, dict) else None
    return error or f"HTTP {exc.response.status_code if exc.response is not None else '?'}"


def _failure(exc: SlackApiError) -> SendResult:
    status = exc.response.status_code
    error = _error_code(exc)
    if status == 429 or error == "ratelimited":
        retry_after = exc.response.headers.get("Retry-After")
        try:
            seconds = float(retry_after) if retry_after is not None else None
        except ValueError:
            seconds = None
        return SendResult(success=False, error="slack: rate limited", retryable=True, retry_after=seconds)
    return SendResult(success=False, error=f"slack: {error}", retryable=status >= 500 or error in _RETRYABLE_ERRORS)


def _chat_type(channel: str) -> ChatType:
    """Direct-message channel ids start with D; everything else is a group conversation."""
    return "dm" if channel.startswith("D") else "group"


def _choice_blocks(text: str, choices: Sequence[Choice]) -> list[dict[str, Any]]:
    """``text`` in section blocks (each within Slack's limit), then one button per choice in an actions block."""
    buttons: list[dict[str, Any]] = []
    for n, choice in enumerate(choices):
        label = choice.label
        if len(label) > _BUTTON_LABEL_LIMIT:
            label = label[:_BUTTON_LABEL_LIMIT - 1] + "…"
        button = {"type": "button", "action_id": f"{CHOICE_ACTION_PREFIX}{n}", "value": choice.text,
                  "text": {"type": "plain_text", "text": label, "emoji": True}}
        if choice.style != "default":
            button["style"] = choice.style
        buttons.append(button)
    sections = [{"type": "section", "text": {"type": "mrkdwn", "text": part}}
                for part in split_message(text, _SECTION_TEXT_LIMIT) if part.strip()]
    return [*sections, {"type": "actions", "block_id": _CHOICES_BLOCK_ID, "elements": buttons}]


def _strip_mention(text: str, bot_user_id: str) -> str:
    """The text without a leading ``<@BOT>`` (or ``<@BOT|name>``) mention."""
    return re.sub(rf"^\s*<@{re.escape(bot_user_id)}(?:\|[^>]*)?>[\s:,]*", "", text) if bot_user_id else text


def _attachment(file: Mapping[str, Any]) -> Attachment:
    mime = file.get("mimetype") or ""
    kind: AttachmentKind = ("voice" if file.get("subtype") == "slack_audio"  # a clip, whatever its container
                            else "photo" if mime.startswith("image/") else "audio" if mime.startswith("audio/")
                            else "video" if mime.startswith("video/") else "file")
    return Attachment(kind=kind, file_id=file["id"], name=file.get("name"), mime_type=mime or None,
                      size=file.get("size"), url=file.get("url_private_download") or file.get("url_private"))
