"""Slack simulator: the Web API, Socket Mode and signed Events API delivery, for tests and the offline demo.

Point slack-sdk / slack-bolt at it with ``AsyncWebClient(token=sim.bot_token, base_url=sim.base_url)``.
Web API methods (``auth.test``, ``chat.postMessage``, ``chat.update``, ``chat.delete``, ``conversations.history``,
``conversations.replies``, ``reactions.add``, ``reactions.remove``, ``assistant.threads.setStatus``,
``apps.connections.open``) take the
token as a Bearer header or a ``token`` parameter, and JSON, form or query bodies. ``apps.connections.open``
returns a ``ws://`` URL to the simulator's Socket Mode endpoint, which says ``hello``, sends envelopes and
tracks acks; an envelope whose socket dies before it is acked is redelivered (``retry_attempt`` + 1) on the
next connection, as Slack does. With ``request_url`` set, events go instead as signed HTTP POSTs to that URL.

Messages keep their Block Kit ``blocks``; ``user_presses_button`` delivers a ``block_actions`` interaction and
``responses`` records posts to its ``response_url`` (gateway/sim/slack_interactive.py).

Files (gateway/sim/slack_files.py): the upload v2 flow (``files.getUploadURLExternal``, the upload URL,
``files.completeUploadExternal``), ``files.info``, and private file URLs served to the bot token only; users share
files with ``files=[sim.user_file(...)]`` in the message drivers.

Drivers (``user_mentions_bot``, ``user_sends_dm``, ``user_replies_in_thread``, ``user_runs_command``,
``user_presses_button`` ...) play users; readers (``calls``, ``messages``, ``envelopes``, ``http_deliveries``)
show what happened;
``rate_limit_next`` / ``fail_next`` / ``server_error_next`` and the socket faults inject trouble.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import logging
import secrets
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qsl, urlencode

import aiohttp
from aiohttp import web

from gateway.sim.slack_files import FILE_SCOPES, FilesMixin, SimFile
from gateway.sim.slack_interactive import BlocksError, ResponseUrls, block_actions_payload, find_button, parse_blocks
from platforms.reaction_rules import SLACK_EMOJI_NAME

__all__ = [
    "BOT_SCOPES",
    "DEFAULT_APP_TOKEN",
    "DEFAULT_BOT_TOKEN",
    "DEFAULT_CHANNEL",
    "DEFAULT_SIGNING_SECRET",
    "DEFAULT_USER",
    "ApiCall",
    "Delivery",
    "Envelope",
    "HttpDelivery",
    "Message",
    "SlackSimulator",
    "SocketConnection",
    "UserAction",
]

_log = logging.getLogger(__name__)

JSON = dict[str, Any]
T = TypeVar("T")

DEFAULT_BOT_TOKEN = "xoxb-sim-0001-bot-token"
DEFAULT_APP_TOKEN = "xapp-1-A0HERMES-sim-app-token"
DEFAULT_SIGNING_SECRET = "sim-signing-secret-0123456789abcdef"
DEFAULT_USER = "U0USER1"
DEFAULT_CHANNEL = "C0GENERAL"
MAX_TEXT_LENGTH = 40_000
# Slack gives up on an Events API request after 3 seconds (and retries it with reason http_timeout).
HTTP_DELIVERY_TIMEOUT = 3.0

_APP_TOKEN_METHODS = frozenset({"apps.connections.open"})
# The OAuth scope a method needs beyond what every bot has; refused with missing_scope when not granted.
_REQUIRED_SCOPES = {"reactions.add": "reactions:write", "reactions.remove": "reactions:write",
                   "assistant.threads.setStatus": "assistant:write", **FILE_SCOPES}
BOT_SCOPES = frozenset({"app_mentions:read", "channels:history", "chat:write", "commands", "groups:history",
                        "im:history", "reactions:write", "assistant:write", "files:read", "files:write"})


# --------------------------------------------------------------------------- records


@dataclass(slots=True, eq=False)
class ApiCall:
    """One Web API request: recorded on arrival, completed when answered."""

    method: str
    params: JSON
    token: str | None
    t: float
    http_method: str = "POST"
    status: int | None = None
    response: JSON | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether Slack answered ``{"ok": true}``."""
        return bool(self.response and self.response.get("ok"))

    @property
    def error(self) -> str | None:
        """The ``error`` of a failed call."""
        return self.response.get("error") if self.response else None


@dataclass(slots=True, eq=False)
class Message:
    """A message in a channel, from a user (a driver) or the bot (``chat.postMessage``)."""

    channel: str
    ts: str
    text: str
    user: str
    thread_ts: str | None = None
    bot_id: str | None = None
    params: JSON = field(default_factory=dict)
    edits: list[str] = field(default_factory=list)
    t: float = field(default_factory=time.monotonic)
    metadata: JSON | None = None
    """Message metadata posted with it (``{"event_type", "event_payload"}``)."""
    reactions: dict[str, list[str]] = field(default_factory=dict)
    """Emoji name -> the users reacting with it, in order."""
    blocks: list[JSON] | None = None
    """The Block Kit blocks it shows now (kept by a ``chat.update`` without ``blocks``)."""
    files: list[JSON] | None = None
    """The files it shares (a ``file_share`` message)."""

    @property
    def final_text(self) -> str:
        """What the channel shows now: the latest edit, or the text as posted."""
        return self.edits[-1] if self.edits else self.text

    def to_event(self, team_id: str) -> JSON:
        """The message as a Slack message object."""
        event: JSON = {"type": "message", "user": self.user, "text": self.text, "ts": self.ts, "team": team_id}
        if self.bot_id:
            event["bot_id"] = self.bot_id
        if self.thread_ts:
            event["thread_ts"] = self.thread_ts
        if self.blocks:
            event["blocks"] = self.blocks
        if self.files:
            event.update(subtype="file_share", files=self.files, upload=True)
        return event


@dataclass(slots=True, eq=False)
class Envelope:
    """One Socket Mode envelope sent on one connection; ``acked_t`` is set when that connection acked it."""

    envelope_id: str
    type: str
    payload: JSON
    retry_attempt: int
    retry_reason: str
    socket_id: int
    sent_t: float
    delivery: Delivery
    acked_t: float | None = None
    ack_payload: JSON | None = None
    late_acks: list[float] = field(default_factory=list)
    lost_acks: int = 0
    redelivered: bool = False

    def to_wire(self) -> JSON:
        """The JSON frame on the socket."""
        return {"envelope_id": self.envelope_id, "type": self.type, "payload": self.payload,
                "accepts_response_payload": self.type != "events_api",
                "retry_attempt": self.retry_attempt, "retry_reason": self.retry_reason}


@dataclass(slots=True, eq=False)
class HttpDelivery:
    """One signed POST to the request URL; ``status`` is None when it failed or timed out."""

    url: str
    body: bytes
    headers: dict[str, str]
    t: float
    status: int | None = None
    response_body: str = ""
    elapsed: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        """A 2xx answer (Slack's definition of an acknowledged request)."""
        return self.status is not None and 200 <= self.status < 300

    def json(self) -> Any:
        """The response body parsed as JSON."""
        return json.loads(self.response_body)


@dataclass(slots=True, eq=False)
class Delivery:
    """One event (slash command, interaction) and every attempt to deliver it, over Socket Mode or HTTP."""

    kind: Literal["events_api", "slash_commands", "interactive"]
    payload: JSON
    envelopes: list[Envelope] = field(default_factory=list)
    http: list[HttpDelivery] = field(default_factory=list)

    @property
    def event_id(self) -> str | None:
        """The event's ``event_id`` (None for slash commands)."""
        return self.payload.get("event_id")

    @property
    def event(self) -> JSON:
        """The inner event of an ``event_callback`` (the payload itself for slash commands)."""
        return self.payload.get("event", self.payload)

    @property
    def acked(self) -> bool:
        """Whether any attempt was acknowledged."""
        return any(e.acked_t is not None for e in self.envelopes) or any(h.ok for h in self.http)

    @property
    def ack_seconds(self) -> float | None:
        """How long the first acknowledged attempt took to be acknowledged (None: none was)."""
        acked = [e.acked_t - e.sent_t for e in self.envelopes if e.acked_t is not None]
        return acked[0] if acked else next((h.elapsed for h in self.http if h.ok), None)

    @property
    def attempts(self) -> int:
        """How many times it was sent."""
        return len(self.envelopes) + len(self.http)

    @property
    def response(self) -> JSON | str | None:
        """What the app answered: the ack payload (Socket Mode) or the last HTTP body."""
        for e in reversed(self.envelopes):
            if e.acked_t is not None:
                return e.ack_payload
        return self.http[-1].response_body if self.http else None


@dataclass(slots=True, eq=False)
class UserAction:
    """What a user driver did: the message the user wrote (None for a slash command) and its deliveries."""

    message: Message | None
    deliveries: list[Delivery]

    @property
    def ts(self) -> str:
        """The message's ``ts``."""
        assert self.message is not None
        return self.message.ts

    @property
    def delivery(self) -> Delivery:
        """The first (main) delivery."""
        return self.deliveries[0]


@dataclass(slots=True, eq=False)
class SocketConnection:
    """One Socket Mode websocket."""

    id: int
    opened_t: float
    ws: web.WebSocketResponse
    transport: asyncio.BaseTransport | None
    closed_t: float | None = None
    envelopes: list[Envelope] = field(default_factory=list)
    received: list[JSON] = field(default_factory=list)

    @property
    def live(self) -> bool:
        """Open, as far as the simulator knows."""
        return self.closed_t is None and not self.ws.closed


@dataclass(slots=True)
class _Fault:
    status: int
    body: JSON | str
    headers: dict[str, str]
    after_apply: bool = False  # the call takes effect, only its answer is this fault


# --------------------------------------------------------------------------- the simulator


def _metadata(value: Any) -> JSON | None:
    """``metadata`` of chat.postMessage: an object in JSON bodies, a JSON string in forms."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise _ApiError("invalid_metadata_format") from None
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("event_type"), str):
        raise _ApiError("invalid_metadata_format")
    return {"event_type": value["event_type"], "event_payload": value.get("event_payload") or {}}


def _flag(value: Any) -> bool:
    """A boolean parameter from JSON (true) or a form (``"true"``, ``"1"``)."""
    return value is True or (isinstance(value, str) and value.lower() in ("true", "1"))


class _ApiError(Exception):
    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


class SlackSimulator(FilesMixin):
    """A Slack workspace with one installed app, on an ephemeral local port.

    Subscriptions follow a typical bot: ``app_mention`` plus ``message.channels/groups/im/mpim``, so a
    channel message mentioning the bot yields two events (``app_mention`` and ``message``) with
    different event ids, and the bot's own posts come back as ``message`` events (``echo_bot_messages``).
    """

    def __init__(
        self,
        *,
        bot_token: str = DEFAULT_BOT_TOKEN,
        app_token: str = DEFAULT_APP_TOKEN,
        signing_secret: str = DEFAULT_SIGNING_SECRET,
        team_id: str = "T0TEAM",
        api_app_id: str = "A0HERMES",
        bot_user_id: str = "U0BOT",
        bot_id: str = "B0BOT",
        echo_bot_messages: bool = True,
    ) -> None:
        super().__init__()
        self.bot_token = bot_token
        self.app_token = app_token
        self.signing_secret = signing_secret
        self.team_id = team_id
        self.api_app_id = api_app_id
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.echo_bot_messages = echo_bot_messages
        self.request_url: str | None = None
        """Set to an Events API URL to deliver by signed HTTP POST instead of Socket Mode."""
        self.scopes: set[str] = set(BOT_SCOPES)
        """The scopes the bot token was granted (remove one to see methods refused with missing_scope)."""
        self.responses = ResponseUrls(self._changed)
        """The ``response_url`` of every interaction and slash command, and what the app posted to them."""

        self._handlers: dict[str, Callable[[ApiCall], JSON]] = {
            "auth.test": self._auth_test,
            "apps.connections.open": self._connections_open,
            "chat.postMessage": self._post_message,
            "chat.update": self._update_message,
            "chat.delete": self._delete_message,
            "conversations.history": self._history,
            "conversations.replies": self._replies,
            "reactions.add": self._add_reaction,
            "reactions.remove": self._remove_reaction,
            "assistant.threads.setStatus": self._set_assistant_status,
            **self.file_handlers(),
        }
        self._calls: list[ApiCall] = []
        self._messages: dict[tuple[str, str], Message] = {}
        self._deleted: list[Message] = []
        self._deliveries: list[Delivery] = []
        self._sockets: list[SocketConnection] = []
        self._tickets: set[str] = set()
        self._pending: deque[tuple[Delivery, int, str]] = deque()  # (delivery, retry_attempt, retry_reason)
        self._faults: dict[str, deque[_Fault]] = defaultdict(deque)
        self._lose_acks = 0
        self._drop_on_lost_ack = False
        self._seq = itertools.count(1)
        self._ts_base = int(time.time())
        self._event = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._port: int | None = None

    # ----------------------------------------------------------------- lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Serve on ``host:port`` (0: a free port)."""
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._handle_api)
        app.router.add_get("/link/", self._handle_socket)
        app.router.add_post(ResponseUrls.path, self.responses.handle)
        app.router.add_routes(self.file_routes())
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self._port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._session = aiohttp.ClientSession()

    async def stop(self) -> None:
        """Close every socket, stop background deliveries and the server."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for conn in self._sockets:
            if conn.live:
                with contextlib.suppress(Exception):
                    await conn.ws.close(code=aiohttp.WSCloseCode.GOING_AWAY)
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> SlackSimulator:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        """The bound port."""
        assert self._port is not None, "start() first"
        return self._port

    @property
    def base_url(self) -> str:
        """The Web API base URL, with the trailing slash slack-sdk expects."""
        return f"http://127.0.0.1:{self.port}/api/"

    # ----------------------------------------------------------------- readers

    @property
    def calls(self) -> list[ApiCall]:
        """Every Web API request, in arrival order."""
        return list(self._calls)

    def calls_of(self, method: str) -> list[ApiCall]:
        """The requests of one method."""
        return [c for c in self._calls if c.method == method]

    def messages(self, channel: str | None = None, *, thread_ts: str | None = None, bot: bool | None = True
                 ) -> list[Message]:
        """Messages in posting order; by default the bot's. ``bot=None``: everyone's."""
        return [m for m in self._messages.values()
                if (channel is None or m.channel == channel) and (thread_ts is None or m.thread_ts == thread_ts)
                and (bot is None or (m.user == self.bot_user_id) == bot)]

    def bot_reactions(self, channel: str, ts: str) -> list[str]:
        """The emoji names the bot reacts with on a message now."""
        message = self._messages.get((channel, ts))
        return [name for name, users in message.reactions.items() if self.bot_user_id in users] if message else []

    @property
    def deleted(self) -> list[Message]:
        """The bot's messages removed by ``chat.delete``, in order."""
        return list(self._deleted)

    @property
    def deliveries(self) -> list[Delivery]:
        """Every event and slash command sent to the app, echoes of the bot's own posts included."""
        return list(self._deliveries)

    @property
    def envelopes(self) -> list[Envelope]:
        """Every Socket Mode envelope sent."""
        return [e for d in self._deliveries for e in d.envelopes]

    @property
    def http_deliveries(self) -> list[HttpDelivery]:
        """Every signed POST to the request URL."""
        return [h for d in self._deliveries for h in d.http]

    @property
    def sockets(self) -> list[SocketConnection]:
        """Every Socket Mode connection, open or closed."""
        return list(self._sockets)

    @property
    def live_sockets(self) -> list[SocketConnection]:
        """The open connections."""
        return [c for c in self._sockets if c.live]

    async def wait_for(self, predicate: Callable[[], T], timeout: float = 5.0) -> T:
        """Wait until ``predicate()`` is truthy and return its value (it may look at state outside the simulator)."""

        async def _wait() -> T:
            while not (value := predicate()):
                self._event.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._event.wait(), 0.02)
            return value

        return await asyncio.wait_for(_wait(), timeout)

    async def wait_for_messages(self, n: int = 1, channel: str | None = None, *, thread_ts: str | None = None,
                                timeout: float = 5.0) -> list[Message]:
        """Wait until the bot has posted at least ``n`` messages (in ``channel`` / ``thread_ts``)."""

        def enough() -> list[Message] | None:
            found = self.messages(channel, thread_ts=thread_ts)
            return found if len(found) >= n else None

        return await self.wait_for(enough, timeout)

    async def wait_for_sockets(self, n: int = 1, timeout: float = 5.0) -> SocketConnection:
        """Wait until ``n`` connections were opened in total and one is live; returns the newest live one."""
        return await self.wait_for(
            lambda: self.live_sockets[-1] if len(self._sockets) >= n and self.live_sockets else None, timeout)

    async def wait_for_ack(self, delivery: Delivery, timeout: float = 5.0) -> Delivery:
        """Wait until some attempt of ``delivery`` was acknowledged."""
        return await self.wait_for(lambda: delivery if delivery.acked else None, timeout)

    # ----------------------------------------------------------------- faults

    def fail_next(self, method: str, error: str, *, status: int = 200, count: int = 1,
                  headers: Mapping[str, str] | None = None) -> None:
        """Answer the next ``count`` calls of ``method`` with ``{"ok": false, "error": error}``."""
        for _ in range(count):
            self._faults[method].append(_Fault(status, {"ok": False, "error": error}, dict(headers or {})))

    def rate_limit_next(self, method: str, retry_after: int = 1, count: int = 1) -> None:
        """HTTP 429 ``ratelimited`` with ``Retry-After`` for the next ``count`` calls of ``method``."""
        self.fail_next(method, "ratelimited", status=429, count=count, headers={"Retry-After": str(retry_after)})

    def server_error_next(self, method: str, status: int = 503, count: int = 1, *, after_apply: bool = False
                          ) -> None:
        """A non-JSON 5xx (as a proxy in front of Slack answers) for the next ``count`` calls; ``after_apply``: each
        call takes effect and only its answer is lost."""
        for _ in range(count):
            self._faults[method].append(_Fault(status, "upstream connect error or disconnect", {}, after_apply))

    def lose_acks(self, n: int = 1, *, drop_socket: bool = False) -> None:
        """Treat the next ``n`` acks as lost in transit; ``drop_socket`` also kills the socket they came on."""
        self._lose_acks += n
        self._drop_on_lost_ack = drop_socket

    async def send_disconnect(self, reason: str = "refresh_requested") -> None:
        """Ask every open connection to reconnect, as Slack does before it recycles a socket."""
        frame = {"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-sim"}}
        for conn in self.live_sockets:
            await conn.ws.send_str(json.dumps(frame))

    async def drop_sockets(self, *, hard: bool = False) -> None:
        """Close every open connection: with a close frame, or (``hard``) by resetting the TCP connection."""
        for conn in self.live_sockets:
            if hard and conn.transport is not None:
                conn.transport.abort()
            else:
                await conn.ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"server going away")
            self._socket_closed(conn)

    # ----------------------------------------------------------------- signing and HTTP delivery

    def sign(self, body: bytes, timestamp: int | None = None, secret: str | None = None) -> dict[str, str]:
        """The ``X-Slack-Request-Timestamp`` and ``X-Slack-Signature`` headers for ``body``."""
        ts = str(int(time.time()) if timestamp is None else timestamp)
        key = (self.signing_secret if secret is None else secret).encode()
        digest = hmac.new(key, b"v0:" + ts.encode() + b":" + body, hashlib.sha256).hexdigest()
        return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": f"v0={digest}"}

    async def post_signed(
        self,
        body: bytes,
        *,
        url: str | None = None,
        content_type: str = "application/json",
        timestamp: int | None = None,
        signed_body: bytes | None = None,
        omit_signature: bool = False,
        retry_num: int | None = None,
        retry_reason: str | None = None,
    ) -> HttpDelivery:
        """POST ``body`` signed like Slack, with tampering knobs.

        ``signed_body`` signs other bytes than those sent; ``timestamp`` backdates the signature;
        ``omit_signature`` leaves both signature headers out; ``retry_num`` marks a Slack retry.
        """
        target = url or self.request_url
        assert target, "set request_url or pass url"
        headers = {"Content-Type": content_type, "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)"}
        if not omit_signature:
            headers.update(self.sign(body if signed_body is None else signed_body, timestamp))
        if retry_num is not None:
            headers["X-Slack-Retry-Num"] = str(retry_num)
            headers["X-Slack-Retry-Reason"] = retry_reason or "http_timeout"
        record = HttpDelivery(target, body, headers, time.monotonic())
        assert self._session is not None, "start() first"
        try:
            async with self._session.post(target, data=body, headers=headers,
                                          timeout=aiohttp.ClientTimeout(total=HTTP_DELIVERY_TIMEOUT)) as resp:
                record.response_body = await resp.text(errors="replace")
                record.status = resp.status
        except TimeoutError:
            record.error = "http_timeout"
        except aiohttp.ClientError as exc:
            record.error = f"connection_failed: {exc}"
        record.elapsed = time.monotonic() - record.t
        self._changed()
        return record

    async def verify_url(self, url: str | None = None) -> HttpDelivery:
        """Send the ``url_verification`` challenge Slack sends when a Request URL is saved."""
        payload = {"token": "sim-verification-token", "challenge": secrets.token_urlsafe(24),
                   "type": "url_verification"}
        return await self.post_signed(json.dumps(payload).encode(), url=url)

    # ----------------------------------------------------------------- user drivers

    async def user_mentions_bot(self, text: str, *, channel: str = DEFAULT_CHANNEL, user: str = DEFAULT_USER,
                                thread_ts: str | None = None, files: Sequence[SimFile] = ()) -> UserAction:
        """A user writes ``<@bot> text`` in a channel (optionally in a thread, sharing ``files``): app_mention +
        message events."""
        message = self._user_message(channel, user, f"<@{self.bot_user_id}> {text}", thread_ts, files)
        mention = {**self._event_fields(message), "type": "app_mention"}
        deliveries = [await self.deliver_event(mention),
                      await self.deliver_event({**self._event_fields(message), "channel_type": _channel_type(channel)})]
        return UserAction(message, deliveries)

    async def user_sends_dm(self, text: str, *, user: str = DEFAULT_USER, thread_ts: str | None = None,
                            files: Sequence[SimFile] = ()) -> UserAction:
        """A user writes to the bot in their direct-message channel (``dm_channel(user)``), sharing ``files``."""
        message = self._user_message(self.dm_channel(user), user, text, thread_ts, files)
        event = {**self._event_fields(message), "channel_type": "im"}
        return UserAction(message, [await self.deliver_event(event)])

    async def user_replies_in_thread(self, thread_ts: str, text: str, *, channel: str = DEFAULT_CHANNEL,
                                     user: str = DEFAULT_USER, files: Sequence[SimFile] = ()) -> UserAction:
        """A user replies in a thread without mentioning the bot (sharing ``files``): one ``message`` event."""
        message = self._user_message(channel, user, text, thread_ts, files)
        event = {**self._event_fields(message), "channel_type": _channel_type(channel)}
        return UserAction(message, [await self.deliver_event(event)])

    async def user_edits(self, action: UserAction, text: str) -> UserAction:
        """A user edits a message they wrote: a ``message_changed`` event."""
        assert action.message is not None
        message = action.message
        message.edits.append(text)
        event = {"type": "message", "subtype": "message_changed", "channel": message.channel,
                 "channel_type": _channel_type(message.channel), "hidden": True, "ts": self._next_ts(),
                 "message": {**message.to_event(self.team_id), "text": text},
                 "previous_message": message.to_event(self.team_id)}
        return UserAction(message, [await self.deliver_event(event)])

    async def user_deletes(self, action: UserAction) -> UserAction:
        """A user deletes a message they wrote: a ``message_deleted`` event."""
        assert action.message is not None
        message = action.message
        self._messages.pop((message.channel, message.ts), None)
        event = {"type": "message", "subtype": "message_deleted", "channel": message.channel,
                 "channel_type": _channel_type(message.channel), "hidden": True, "ts": self._next_ts(),
                 "deleted_ts": message.ts, "previous_message": message.to_event(self.team_id)}
        return UserAction(message, [await self.deliver_event(event)])

    async def other_bot_posts(self, text: str, *, channel: str = DEFAULT_CHANNEL, thread_ts: str | None = None,
                              bot_id: str = "B0OTHER") -> UserAction:
        """Another app's bot posts (``subtype: bot_message``), e.g. mentioning our bot."""
        message = Message(channel, self._next_ts(), text, "", thread_ts, bot_id)
        self._messages[(channel, message.ts)] = message
        event = {**message.to_event(self.team_id), "subtype": "bot_message", "channel": channel,
                 "channel_type": _channel_type(channel), "event_ts": message.ts}
        event.pop("user")
        return UserAction(message, [await self.deliver_event(event)])

    async def user_runs_command(self, command: str, text: str = "", *, channel: str = DEFAULT_CHANNEL,
                                user: str = DEFAULT_USER) -> UserAction:
        """A user runs a slash command; the app must ack it (its ack body is shown to the user only)."""
        payload = {
            "token": "sim-verification-token", "team_id": self.team_id, "team_domain": "sim",
            "channel_id": channel, "channel_name": "directmessage" if channel.startswith("D") else "general",
            "user_id": user, "user_name": user.lower(), "command": command, "text": text,
            "api_app_id": self.api_app_id, "is_enterprise_install": "false",
            "response_url": self.responses.mint(f"http://127.0.0.1:{self.port}"),
            "trigger_id": f"{next(self._seq)}.{self._ts_base}.{secrets.token_hex(16)}",
        }
        delivery = Delivery("slash_commands", payload)
        self._deliveries.append(delivery)
        await self._send(delivery, 0, "")
        return UserAction(None, [delivery])

    async def user_presses_button(self, message: Message, button: str, *, user: str = DEFAULT_USER) -> UserAction:
        """``user`` presses the button (by ``action_id`` or label) the bot's ``message`` shows now: a
        ``block_actions`` interaction; LookupError when the message is gone or shows no such button."""
        current = self._messages.get((message.channel, message.ts))
        if current is None or current.user != self.bot_user_id:
            raise LookupError(f"no bot message {message.ts} in {message.channel}")
        block_id, element = find_button(current.blocks, button)
        shown = {**self._bot_message_json(current), "text": current.final_text}
        if replies := sum(m.channel == current.channel and m.thread_ts == current.ts for m in self._messages.values()):
            shown.update(thread_ts=current.ts, reply_count=replies)  # a thread's parent carries its own ts
        payload = block_actions_payload(
            team_id=self.team_id, api_app_id=self.api_app_id, user=user, channel=current.channel,
            message=shown, block_id=block_id,
            button=element, response_url=self.responses.mint(f"http://127.0.0.1:{self.port}"),
            trigger_id=f"{next(self._seq)}.{self._ts_base}.{secrets.token_hex(16)}")
        delivery = Delivery("interactive", payload)
        self._deliveries.append(delivery)
        await self._send(delivery, 0, "")
        return UserAction(current, [delivery])

    def dm_channel(self, user: str) -> str:
        """The direct-message channel between ``user`` and the bot."""
        return f"D{user.removeprefix('U')}"

    # ----------------------------------------------------------------- delivery

    def event_callback(self, event: JSON) -> JSON:
        """Wrap an event in the ``event_callback`` envelope Slack sends, with a fresh ``event_id``."""
        return {
            "token": "sim-verification-token", "team_id": self.team_id, "context_team_id": self.team_id,
            "api_app_id": self.api_app_id, "event": event, "type": "event_callback",
            "event_id": f"Ev{next(self._seq):04d}{secrets.token_hex(4).upper()}",
            "event_time": int(time.time()),
            "authorizations": [{"enterprise_id": None, "team_id": self.team_id, "user_id": self.bot_user_id,
                                "is_bot": True, "is_enterprise_install": False}],
            "is_ext_shared_channel": False,
            "event_context": f"4-{secrets.token_hex(12)}",
        }

    async def deliver_event(self, event: JSON) -> Delivery:
        """Send an event to the app (Socket Mode, or HTTP when ``request_url`` is set)."""
        delivery = Delivery("events_api", self.event_callback(event))
        self._deliveries.append(delivery)
        await self._send(delivery, 0, "")
        return delivery

    async def redeliver(self, delivery: Delivery, reason: str = "http_timeout") -> None:
        """Send ``delivery`` again as Slack's next retry (``retry_attempt`` / ``X-Slack-Retry-Num`` + 1)."""
        await self._send(delivery, delivery.attempts, reason)

    async def _send(self, delivery: Delivery, retry_attempt: int, retry_reason: str) -> None:
        if self.request_url is None:
            self._pending.append((delivery, retry_attempt, retry_reason))
            await self._flush_pending()
            return
        if delivery.kind != "events_api":
            form = {"payload": json.dumps(delivery.payload)} if delivery.kind == "interactive" else delivery.payload
            body, content_type = urlencode(form).encode(), "application/x-www-form-urlencoded"
        else:
            body, content_type = json.dumps(delivery.payload).encode(), "application/json"
        retry = retry_attempt or None
        delivery.http.append(await self.post_signed(body, content_type=content_type, retry_num=retry,
                                                    retry_reason=retry_reason or None))
        self._changed()

    async def _flush_pending(self) -> None:
        while self._pending and (live := self.live_sockets):
            conn = live[-1]  # Slack spreads envelopes over connections; the newest one is as good as any
            delivery, attempt, reason = self._pending.popleft()
            envelope = Envelope(secrets.token_hex(18), delivery.kind, delivery.payload, attempt, reason, conn.id,
                                time.monotonic(), delivery)
            delivery.envelopes.append(envelope)
            conn.envelopes.append(envelope)
            try:
                await conn.ws.send_str(json.dumps(envelope.to_wire()))
            except (ConnectionError, RuntimeError):
                self._socket_closed(conn)
        self._changed()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ----------------------------------------------------------------- socket mode

    async def _handle_socket(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._tickets:
            return web.json_response({"ok": False, "error": "invalid_ticket"}, status=401)
        self._tickets.discard(ticket)
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        conn = SocketConnection(len(self._sockets) + 1, time.monotonic(), ws, request.transport)
        self._sockets.append(conn)
        await ws.send_str(json.dumps({
            "type": "hello", "num_connections": len(self.live_sockets),
            "debug_info": {"host": "applink-sim", "build_number": 1, "approximate_connection_time": 18060},
            "connection_info": {"app_id": self.api_app_id}}))
        await self._flush_pending()
        try:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    await self._on_socket_frame(conn, msg.data)
        finally:
            self._socket_closed(conn)
            # Redeliveries go out on whichever connection is (or next becomes) live.
            self._spawn(self._flush_pending())
        return ws

    async def _on_socket_frame(self, conn: SocketConnection, data: str) -> None:
        try:
            frame = json.loads(data)
        except ValueError:
            _log.warning("socket %s sent a non-JSON frame: %.80r", conn.id, data)
            return
        conn.received.append(frame)
        envelope_id = frame.get("envelope_id")
        envelope = next((e for d in self._deliveries for e in d.envelopes if e.envelope_id == envelope_id), None)
        if envelope is None:
            return
        now = time.monotonic()
        if self._lose_acks > 0:
            self._lose_acks -= 1
            envelope.lost_acks += 1
            if self._drop_on_lost_ack:
                await conn.ws.close(code=aiohttp.WSCloseCode.ABNORMAL_CLOSURE)
                self._socket_closed(conn)
        elif envelope.socket_id != conn.id or envelope.redelivered or envelope.acked_t is not None:
            envelope.late_acks.append(now)
        else:
            envelope.acked_t = now
            envelope.ack_payload = frame.get("payload")
        self._changed()

    def _socket_closed(self, conn: SocketConnection) -> None:
        if conn.closed_t is not None:
            return
        conn.closed_t = time.monotonic()
        for envelope in conn.envelopes:
            # Slack delivers events again, never an interaction (the user sees an error and presses again).
            if envelope.acked_t is None and not envelope.redelivered and envelope.type != "interactive":
                envelope.redelivered = True
                self._pending.append((envelope.delivery, envelope.delivery.attempts, "timeout"))
        self._changed()

    # ----------------------------------------------------------------- web api

    async def _read_params(self, request: web.Request) -> JSON:
        params: JSON = dict(request.query)
        body = await request.read()
        if not body:
            return params
        if request.content_type == "application/json":
            try:
                data = json.loads(body)
            except ValueError:
                raise web.HTTPBadRequest(text="invalid JSON body") from None
            if isinstance(data, dict):
                params.update(data)
        else:
            params.update(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        return params

    async def _handle_api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params = await self._read_params(request)
        header = request.headers.get("Authorization", "")
        token = header[7:] if header.startswith("Bearer ") else params.pop("token", None)
        call = ApiCall(method, params, token, time.monotonic(), request.method,
                       headers={k: v for k, v in request.headers.items() if k.lower() != "authorization"})
        self._calls.append(call)
        status, body, headers = self._answer(call)
        call.status = status
        call.response = body if isinstance(body, dict) else None
        self._changed()
        if isinstance(body, str):
            return web.Response(status=status, text=body, content_type="text/html", headers=headers)
        return web.Response(status=status, text=json.dumps(body), content_type="application/json",
                            headers=headers)

    def _answer(self, call: ApiCall) -> tuple[int, JSON | str, dict[str, str]]:
        handler = self._handlers.get(call.method)
        if handler is None:
            return 404, {"ok": False, "error": "unknown_method"}, {}
        if self._faults[call.method]:
            fault = self._faults[call.method].popleft()
            if fault.after_apply:
                self._apply(call, handler)
            return fault.status, fault.body, fault.headers
        return self._apply(call, handler)

    def _apply(self, call: ApiCall, handler: Callable[[ApiCall], JSON]) -> tuple[int, JSON | str, dict[str, str]]:
        """Authorize and run a call."""
        expected = self.app_token if call.method in _APP_TOKEN_METHODS else self.bot_token
        if not call.token:
            return 200, {"ok": False, "error": "not_authed"}, {}
        if call.token != expected:
            known = call.token in (self.app_token, self.bot_token)
            return 200, {"ok": False, "error": "not_allowed_token_type" if known else "invalid_auth"}, {}
        if (scope := _REQUIRED_SCOPES.get(call.method)) and scope not in self.scopes:
            return 200, {"ok": False, "error": "missing_scope", "needed": scope,
                         "provided": ",".join(sorted(self.scopes))}, {}
        try:
            return 200, {"ok": True, **handler(call)}, {}
        except (_ApiError, BlocksError) as exc:
            return 200, {"ok": False, "error": exc.error}, {}

    def _auth_test(self, _call: ApiCall) -> JSON:
        return {"url": "https://sim.slack.com/", "team": "Sim Workspace", "user": "hermes", "team_id": self.team_id,
                "user_id": self.bot_user_id, "bot_id": self.bot_id, "is_enterprise_install": False}

    def _connections_open(self, _call: ApiCall) -> JSON:
        ticket = secrets.token_hex(16)
        self._tickets.add(ticket)
        return {"url": f"ws://127.0.0.1:{self.port}/link/?ticket={ticket}&app_id={self.api_app_id}"}

    def _bot_message_json(self, message: Message) -> JSON:
        return {**message.to_event(self.team_id), "app_id": self.api_app_id}

    def _post_message(self, call: ApiCall) -> JSON:
        p = call.params
        channel, text = str(p.get("channel") or ""), p.get("text")
        if channel[:1] not in ("C", "G", "D"):
            raise _ApiError("channel_not_found")
        if not text and not p.get("blocks"):
            raise _ApiError("no_text")
        if len(text or "") > MAX_TEXT_LENGTH:
            raise _ApiError("msg_too_long")
        thread_ts = str(p["thread_ts"]) if p.get("thread_ts") else None
        message = self._bot_posts(channel, text or "", thread_ts, p, metadata=_metadata(p.get("metadata")),
                                  blocks=parse_blocks(p.get("blocks")) or None)
        return {"channel": channel, "ts": message.ts, "message": self._bot_message_json(message)}

    def _bot_posts(self, channel: str, text: str, thread_ts: str | None, params: JSON, **extra: Any) -> Message:
        """A new message of the bot (``extra``: its metadata, blocks or files), echoed as an event."""
        message = Message(channel, self._next_ts(), text, self.bot_user_id, thread_ts, self.bot_id, params, **extra)
        self._messages[(channel, message.ts)] = message
        if self.echo_bot_messages:
            echo = {**self._bot_message_json(message), "channel": channel, "event_ts": message.ts,
                    "channel_type": _channel_type(channel)}
            self._spawn(self.deliver_event(echo))
        return message

    def _own_message(self, call: ApiCall, refusal: str) -> tuple[str, str, Message]:
        """The channel, ts and message a call names, which must be the bot's own (else ``refusal``)."""
        channel, ts = str(call.params.get("channel") or ""), str(call.params.get("ts") or "")
        message = self._messages.get((channel, ts))
        if message is None:
            raise _ApiError("message_not_found")
        if message.user != self.bot_user_id:
            raise _ApiError(refusal)
        return channel, ts, message

    def _update_message(self, call: ApiCall) -> JSON:
        p = call.params
        channel, ts, message = self._own_message(call, "cant_update_message")
        text = p.get("text")
        if not text and not p.get("blocks"):
            raise _ApiError("no_text")
        if len(text or "") > MAX_TEXT_LENGTH:
            raise _ApiError("msg_too_long")
        blocks = parse_blocks(p.get("blocks"))
        previous = self._bot_message_json(message)
        message.edits.append(text or "")
        if blocks is not None:  # omitted: Slack keeps the blocks; [] removes them
            message.blocks = blocks or None
        current = {**self._bot_message_json(message), "text": text or "", "edited": {"user": self.bot_user_id}}
        if self.echo_bot_messages:
            self._spawn(self.deliver_event({
                "type": "message", "subtype": "message_changed", "hidden": True, "channel": channel,
                "channel_type": _channel_type(channel), "ts": self._next_ts(), "message": current,
                "previous_message": previous}))
        return {"channel": channel, "ts": ts, "text": text or "", "message": current}

    def _delete_message(self, call: ApiCall) -> JSON:
        channel, ts, message = self._own_message(call, "cant_delete_message")
        del self._messages[(channel, ts)]
        self._deleted.append(message)
        return {"channel": channel, "ts": ts}

    def _reacted(self, call: ApiCall) -> tuple[Message, str]:
        """The message (any author's) and the emoji name a reactions call names."""
        p = call.params
        channel, ts, name = str(p.get("channel") or ""), str(p.get("timestamp") or ""), str(p.get("name") or "")
        if not channel or not ts:
            raise _ApiError("no_item_specified")
        if channel[:1] not in ("C", "G", "D"):
            raise _ApiError("channel_not_found")
        message = self._messages.get((channel, ts))
        if message is None:
            raise _ApiError("message_not_found")
        if not SLACK_EMOJI_NAME.fullmatch(name):
            raise _ApiError("invalid_name")
        return message, name

    def _add_reaction(self, call: ApiCall) -> JSON:
        message, name = self._reacted(call)
        users = message.reactions.setdefault(name, [])
        if self.bot_user_id in users:
            raise _ApiError("already_reacted")
        users.append(self.bot_user_id)
        return {}

    def _remove_reaction(self, call: ApiCall) -> JSON:
        message, name = self._reacted(call)
        users = message.reactions.get(name, [])
        if self.bot_user_id not in users:
            raise _ApiError("no_reaction")
        users.remove(self.bot_user_id)
        if not users:
            del message.reactions[name]
        return {}

    def _set_assistant_status(self, call: ApiCall) -> JSON:
        p = call.params
        channel, thread_ts = str(p.get("channel_id") or ""), str(p.get("thread_ts") or "")
        if not channel or not thread_ts or "status" not in p:
            raise _ApiError("invalid_arguments")
        if channel[:1] not in ("C", "G", "D"):
            raise _ApiError("channel_not_found")
        if (channel, thread_ts) not in self._messages:
            raise _ApiError("thread_not_found")
        return {}

    def _listed(self, messages: list[Message], call: ApiCall) -> list[JSON]:
        with_metadata = _flag(call.params.get("include_all_metadata"))
        out = []
        for m in messages:
            item = {**m.to_event(self.team_id), "text": m.final_text}
            if m.bot_id:
                item["app_id"] = self.api_app_id
            if with_metadata and m.metadata is not None:
                item["metadata"] = m.metadata
            out.append(item)
        return out

    def _history(self, call: ApiCall) -> JSON:
        """The channel's top-level messages (thread replies excluded), newest first."""
        channel = str(call.params.get("channel") or "")
        limit = int(call.params.get("limit") or 100)
        top = [m for m in self._messages.values()
               if m.channel == channel and (m.thread_ts is None or m.thread_ts == m.ts)]
        top.sort(key=lambda m: float(m.ts), reverse=True)
        return {"messages": self._listed(top[:limit], call), "has_more": len(top) > limit}

    def _replies(self, call: ApiCall) -> JSON:
        """A thread: its parent, then the replies, oldest first."""
        channel, ts = str(call.params.get("channel") or ""), str(call.params.get("ts") or "")
        limit = int(call.params.get("limit") or 1000)
        thread = [m for m in self._messages.values()
                  if m.channel == channel and (m.ts == ts or m.thread_ts == ts)]
        if not thread:
            raise _ApiError("thread_not_found")
        thread.sort(key=lambda m: float(m.ts))
        return {"messages": self._listed(thread[:limit], call), "has_more": len(thread) > limit}

    # ----------------------------------------------------------------- helpers

    def _next_ts(self) -> str:
        n = next(self._seq)
        return f"{self._ts_base + n // 1_000_000}.{n % 1_000_000:06d}"

    def _user_message(self, channel: str, user: str, text: str, thread_ts: str | None,
                      files: Sequence[SimFile] = ()) -> Message:
        message = Message(channel, self._next_ts(), text, user, thread_ts)
        if files:
            message.files = self.files_event_json(files, channel, message.ts, thread_ts)
        self._messages[(channel, message.ts)] = message
        return message

    def _event_fields(self, message: Message) -> JSON:
        event: JSON = {**message.to_event(self.team_id), "channel": message.channel, "event_ts": message.ts,
                       "client_msg_id": secrets.token_hex(16)}
        if message.thread_ts:
            parent = self._messages.get((message.channel, message.thread_ts))
            event["parent_user_id"] = parent.user if parent else message.user
        return event

    def _changed(self) -> None:
        self._event.set()

    _api_error = _ApiError  # for the files mixin


def _channel_type(channel: str) -> str:
    return {"D": "im", "G": "group"}.get(channel[:1], "channel")
