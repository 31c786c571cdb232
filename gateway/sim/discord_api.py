"""Discord simulator: the gateway websocket and the REST API on aiohttp, for tests and the offline demo.

Point discord.py at it with ``discord.http.Route.BASE = sim.api_base_url`` and either
``discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(sim.gateway_url)`` or a client that asks
``GET /gateway/bot``. The gateway speaks v10 JSON (optionally zlib-stream): HELLO, heartbeat ACKs,
IDENTIFY (bad token: close 4004), READY with ``resume_gateway_url`` pointing back here, GUILD_CREATE,
sequenced dispatches, RESUME replaying what the client missed, op 7 and op 9. Sessions survive a cut
connection, as on Discord, and end when the client closes with 1000/1001.

Drivers (``user_sends_dm``, ``user_sends`` ...) play users; readers (``rest_calls``, ``bot_messages``,
``received`` ...) show what the bot did; ``fail_next`` / ``drop_next`` and the gateway controls
(``withhold_acks``, ``suspend_delivery``, ``cut_connections``, ``send_reconnect``,
``invalidate_sessions``, ``reject_identify``) inject faults. Message components, button presses and slash
commands (``user_presses``, ``user_invokes`` ...) are in gateway/sim/discord_interactions.py; attachments, the
CDN and multipart uploads in gateway/sim/discord_files.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import re
import secrets
import time
import zlib
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import aiohttp
from aiohttp import web

from gateway.sim.discord_files import (
    CDN_PATH,
    CDN_ROUTE,
    MAX_REQUEST_SIZE,
    VOICE_MESSAGE_FLAG,
    AttachmentSpec,
    FilesMixin,
    UploadedPart,
    read_body,
)
from gateway.sim.discord_interactions import (
    INTERACTION_ROUTES,
    INTERACTION_UNAUTHENTICATED,
    TEXT_PARAMS,
    InteractionsMixin,
)
from platforms.reaction_rules import DISCORD_CUSTOM_EMOJI, reaction_problem

__all__ = [
    "ALICE_ID",
    "BOB_ID",
    "BOT_ID",
    "DEFAULT_TOKEN",
    "GENERAL_ID",
    "GUILD_ID",
    "HELPER_BOT_ID",
    "RANDOM_ID",
    "AttachmentSpec",
    "Connection",
    "DiscordSimulator",
    "GatewayOp",
    "RestCall",
    "snowflake",
]

_log = logging.getLogger(__name__)

JSON = dict[str, Any]
T = TypeVar("T")

DEFAULT_TOKEN = "MTAwMA.simulated.discord-bot-token"
BOT_ID = 1000
ALICE_ID = 2001
BOB_ID = 2002
HELPER_BOT_ID = 2999
GUILD_ID = 3000
GENERAL_ID = 3001
RANDOM_ID = 3002
API_VERSION = 10
MAX_CONTENT_LENGTH = 2000
NONCE_TTL = 300.0  # Discord dedupes an enforced nonce "for a few minutes"
DISCORD_EPOCH_MS = 1_420_070_400_000
MESSAGE_CONTENT_INTENT = 1 << 15

_CHANNEL_TEXT, _CHANNEL_DM, _CHANNEL_PUBLIC_THREAD = 0, 1, 11
_MESSAGE_DEFAULT, _MESSAGE_REPLY = 0, 19
_USER_MENTION = re.compile(r"<@!?(\d+)>")
_ROLE_MENTION = re.compile(r"<@&(\d+)>")
_EVERYONE = re.compile(r"@(everyone|here)\b")
_RESUME_PATH = "/resume-gateway"


def snowflake(ms: float | None = None, increment: int = 0) -> int:
    """A Discord id for the time ``ms`` (Unix milliseconds, default now)."""
    now = time.time() * 1000 if ms is None else ms
    return (int(now) - DISCORD_EPOCH_MS) << 22 | (increment & 0xFFF)


def _iso(ts: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if ts is None else ts, UTC).isoformat()


# --------------------------------------------------------------------------- records


@dataclass(slots=True, eq=False)
class RestCall:
    """One REST request: ``route`` names the endpoint ("create_message" ...), ``path`` follows the API base.

    ``outcome`` is ``pending``, ``ok``, ``error``, ``dropped`` (connection closed, no effect) or
    ``applied_dropped`` (took effect, then the connection closed before the answer).
    """

    route: str
    method: str
    path: str
    query: dict[str, str]
    body: Any
    headers: dict[str, str]
    t: float
    status: int | None = None
    outcome: str = "pending"
    response: Any = None
    files: tuple[UploadedPart, ...] = ()
    """A multipart request's file parts (``body`` is then its ``payload_json``)."""


@dataclass(slots=True, frozen=True)
class GatewayOp:
    """A payload a client sent on the gateway."""

    connection: int
    op: int
    d: Any
    t: float


@dataclass(slots=True, eq=False)
class Connection:
    """One gateway websocket, as the simulator saw it."""

    id: int
    path: str
    query: dict[str, str]
    opened_at: float
    compressed: bool
    session_id: str | None = None
    closed_at: float | None = None
    close_code: int | None = None
    acks_withheld: bool = False
    delivering: bool = True
    sent: list[JSON] = field(default_factory=list)
    """Every payload written to the client, in order."""
    _ws: web.WebSocketResponse | None = field(default=None, repr=False)
    _transport: asyncio.BaseTransport | None = field(default=None, repr=False)
    _queue: asyncio.Queue[JSON | _Close] = field(default_factory=asyncio.Queue, repr=False)
    _compressor: Any = field(default=None, repr=False)

    @property
    def open(self) -> bool:
        return self.closed_at is None

    @property
    def resumed_url(self) -> bool:
        """Whether the client connected through the READY ``resume_gateway_url``."""
        return self.path == _RESUME_PATH

    @property
    def last_seq(self) -> int | None:
        """The sequence number of the last dispatch written to the client."""
        return next((p["s"] for p in reversed(self.sent) if p.get("s") is not None), None)


@dataclass(slots=True, frozen=True)
class _Close:
    code: int
    reason: str = ""
    abrupt: bool = False


@dataclass(slots=True, eq=False)
class _Session:
    id: str
    shard: tuple[int, int]
    intents: int
    seq: int = 0
    log: list[JSON] = field(default_factory=list)
    conn: Connection | None = None
    valid: bool = True


@dataclass(slots=True)
class _Fault:
    kind: Literal["error", "drop", "drop_after"]
    status: int = 0
    body: JSON | None = None
    headers: dict[str, str] = field(default_factory=dict)


class _ApiError(Exception):
    def __init__(self, status: int, code: int, message: str, errors: JSON | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body: JSON = {"message": message, "code": code}
        if errors:
            self.body["errors"] = errors


_Handler = Callable[..., Awaitable[Any]]
_ROUTES: tuple[tuple[str, re.Pattern[str], str], ...] = tuple(
    (method, re.compile(pattern), name)
    for method, pattern, name in (
        ("GET", r"/users/@me", "get_me"),
        ("GET", r"/oauth2/applications/@me", "app_info"),
        ("GET", r"/gateway", "gateway"),
        ("GET", r"/gateway/bot", "gateway_bot"),
        ("POST", r"/users/@me/channels", "create_dm"),
        ("GET", r"/users/(?P<user_id>\d+)", "get_user"),
        ("GET", r"/channels/(?P<channel_id>\d+)", "get_channel"),
        ("GET", r"/channels/(?P<channel_id>\d+)/messages", "channel_messages"),
        ("POST", r"/channels/(?P<channel_id>\d+)/messages", "create_message"),
        ("PATCH", r"/channels/(?P<channel_id>\d+)/messages/(?P<message_id>\d+)", "edit_message"),
        ("DELETE", r"/channels/(?P<channel_id>\d+)/messages/(?P<message_id>\d+)", "delete_message"),
        ("PUT", r"/channels/(?P<channel_id>\d+)/messages/(?P<message_id>\d+)/reactions/(?P<emoji>[^/]+)/@me",
         "add_reaction"),
        ("DELETE", r"/channels/(?P<channel_id>\d+)/messages/(?P<message_id>\d+)/reactions/(?P<emoji>[^/]+)/@me",
         "remove_own_reaction"),
        ("POST", r"/channels/(?P<channel_id>\d+)/typing", "typing"),
        *INTERACTION_ROUTES,
    )
)
_ROUTE_NAMES = frozenset(name for _, _, name in _ROUTES) | {CDN_ROUTE}
_UNAUTHENTICATED = frozenset({"gateway"}) | INTERACTION_UNAUTHENTICATED


def _response(status: int, body: Any = None, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON answer with Content-Type exactly ``application/json`` (discord.py parses nothing else)."""
    if body is None:
        return web.Response(status=status, headers=headers)
    return web.Response(body=json.dumps(body).encode(), status=status,
                        headers={"Content-Type": "application/json", **(headers or {})})


def _ratelimit_headers(route: str, remaining: int, reset_after: float) -> dict[str, str]:
    return {
        "X-RateLimit-Limit": "5",
        "X-RateLimit-Remaining": str(remaining),
        "X-RateLimit-Reset": f"{time.time() + reset_after:.3f}",
        "X-RateLimit-Reset-After": f"{reset_after:.3f}",
        "X-RateLimit-Bucket": f"sim-{route}",
    }


class DiscordSimulator(FilesMixin, InteractionsMixin):
    """A Discord gateway and REST API on an ephemeral local port, with drivers, readers and faults.

    One guild (``GUILD_ID``) with text channels ``GENERAL_ID`` and ``RANDOM_ID``; users Alice
    (``ALICE_ID``), Bob (``BOB_ID``) and another bot (``HELPER_BOT_ID``). ``heartbeat_interval`` (ms)
    goes out in HELLO; ``zlib`` answers clients that ask for zlib-stream with compressed frames.
    """

    def __init__(self, token: str = DEFAULT_TOKEN, *, bot_name: str = "hermes", heartbeat_interval: int = 41250,
                 zlib: bool = False, recommended_shards: int = 1) -> None:
        super().__init__()
        self.token = token
        self.heartbeat_interval = heartbeat_interval
        self.zlib = zlib
        self.recommended_shards = recommended_shards
        self.replay_overlap = 0
        """Extra already-delivered events to replay on each RESUME (at-least-once redelivery)."""
        self.refuse_connections = False
        """Answer gateway connection attempts with 503 (the gateway is unreachable)."""
        self.bot_user: JSON = self._user_json(BOT_ID, bot_name, bot=True)
        self._users: dict[int, JSON] = {
            BOT_ID: self.bot_user,
            ALICE_ID: self._user_json(ALICE_ID, "alice"),
            BOB_ID: self._user_json(BOB_ID, "bob"),
            HELPER_BOT_ID: self._user_json(HELPER_BOT_ID, "helper-bot", bot=True),
        }
        self._guilds: dict[int, JSON] = {GUILD_ID: {"id": GUILD_ID, "name": "Hermes HQ", "owner_id": ALICE_ID}}
        self._channels: dict[int, JSON] = {}
        for cid, name, position in ((GENERAL_ID, "general", 0), (RANDOM_ID, "random", 1)):
            self._channels[cid] = {"id": str(cid), "type": _CHANNEL_TEXT, "guild_id": str(GUILD_ID), "name": name,
                                   "position": position, "permission_overwrites": [], "parent_id": None,
                                   "topic": None, "nsfw": False, "rate_limit_per_user": 0, "last_message_id": None,
                                   "flags": 0}
        self._dm_of_user: dict[int, int] = {}
        self._messages: dict[int, JSON] = {}  # id -> current state (edits applied)
        self._history: dict[int, list[int]] = defaultdict(list)  # channel id -> message ids in order
        self._bot_created: list[int] = []
        self._edits: list[tuple[int, str]] = []
        self._deleted: list[int] = []
        self._reactions: dict[int, list[str]] = defaultdict(list)  # message id -> the bot's emoji, in order
        self._nonces: dict[tuple[int, str], tuple[int, float]] = {}
        self._calls: list[RestCall] = []
        self._faults: dict[str, deque[_Fault]] = defaultdict(deque)
        self._received: list[GatewayOp] = []
        self._connections: list[Connection] = []
        self._sessions: dict[str, _Session] = {}
        self._identify_rejections = 0
        self._last_id = 0
        self._ids = itertools.count(1)
        self._change = asyncio.Event()
        self._writers: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None
        self._host = "127.0.0.1"
        self._port = 0

    # ----------------------------------------------------------------- lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on ``host:port`` (0 = ephemeral). State survives stop() and a new start()."""
        if self._runner is not None:
            raise RuntimeError("DiscordSimulator is already running")
        app = web.Application(client_max_size=MAX_REQUEST_SIZE)
        app.router.add_get("/gateway", self._handle_gateway)
        app.router.add_get(_RESUME_PATH, self._handle_gateway)
        app.router.add_route("*", "/api/v{version:\\d+}/{path:.*}", self._handle_rest)
        app.router.add_get(CDN_PATH, self._handle_cdn)
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        self._runner = runner
        self._host = host
        self._port = runner.addresses[0][1]

    async def stop(self) -> None:
        """Close every gateway connection (1001 going away) and the server."""
        if self._runner is None:
            return
        for conn in self._open_connections():
            conn._queue.put_nowait(_Close(1001, "going away"))
        if self._writers:
            await asyncio.wait(set(self._writers), timeout=2.0)
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def __aenter__(self) -> DiscordSimulator:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        """Root URL of the server, e.g. ``http://127.0.0.1:PORT``."""
        return f"http://{self._host}:{self._port}"

    @property
    def api_base_url(self) -> str:
        """For ``discord.http.Route.BASE``."""
        return f"{self.url}/api/v{API_VERSION}"

    @property
    def gateway_url(self) -> str:
        """For ``DiscordWebSocket.DEFAULT_GATEWAY``; also what ``GET /gateway/bot`` answers."""
        return f"ws://{self._host}:{self._port}/gateway"

    @property
    def resume_gateway_url(self) -> str:
        """What READY names as ``resume_gateway_url`` (a second path, so tests can see it was used)."""
        return f"ws://{self._host}:{self._port}{_RESUME_PATH}"

    # ----------------------------------------------------------------- readers

    @property
    def rest_calls(self) -> list[RestCall]:
        """Every REST request in arrival order, in-flight ones included."""
        return list(self._calls)

    def calls_of(self, route: str) -> list[RestCall]:
        """REST requests to one route ("create_message", "edit_message", "typing" ...)."""
        return [c for c in self._calls if c.route == route]

    def messages(self, channel_id: int) -> list[JSON]:
        """The channel as users see it now: every message, both sides, edits applied."""
        return [self._messages[mid] for mid in self._history[channel_id]]

    def bot_messages(self, channel_id: int | None = None) -> list[JSON]:
        """Messages the bot created and did not delete (each once, whatever retries happened), current state, in
        order."""
        found = (self._messages[mid] for mid in self._bot_created if mid in self._messages)
        return [m for m in found if channel_id is None or int(m["channel_id"]) == channel_id]

    @property
    def edits(self) -> list[tuple[int, str]]:
        """(message id, new content) for every successful edit."""
        return list(self._edits)

    @property
    def deleted(self) -> list[int]:
        """Ids of the messages the bot deleted, in order."""
        return list(self._deleted)

    def bot_reactions(self, message_id: int) -> list[str]:
        """The emoji the bot reacts with on a message now."""
        return list(self._reactions.get(message_id, []))

    def received(self, op: int | None = None) -> list[GatewayOp]:
        """Payloads clients sent on the gateway (all, or one opcode)."""
        return [r for r in self._received if op is None or r.op == op]

    @property
    def identifies(self) -> list[GatewayOp]:
        return self.received(2)

    @property
    def resumes(self) -> list[GatewayOp]:
        return self.received(6)

    @property
    def connections(self) -> list[Connection]:
        return list(self._connections)

    def dm_channel_id(self, user_id: int = ALICE_ID) -> int:
        """The DM channel between the bot and a user (created on first use)."""
        if user_id not in self._dm_of_user:
            cid = self._new_id()
            self._dm_of_user[user_id] = cid
            self._channels[cid] = {"id": str(cid), "type": _CHANNEL_DM, "last_message_id": None, "flags": 0,
                                   "recipients": [self._users[user_id]]}
        return self._dm_of_user[user_id]

    async def wait_for(self, predicate: Callable[[], T | None], timeout: float = 5.0) -> T:
        """Return the first truthy ``predicate()``, re-checked on every change; TimeoutError after ``timeout``."""

        async def _wait() -> T:
            while True:
                event = self._change
                if value := predicate():
                    return value
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), 0.05)

        return await asyncio.wait_for(_wait(), timeout)

    async def wait_for_bot_messages(self, n: int = 1, channel_id: int | None = None,
                                    timeout: float = 5.0) -> list[JSON]:
        """Wait until the bot created at least ``n`` messages (in ``channel_id``); return them all."""

        def ready() -> list[JSON] | None:
            found = self.bot_messages(channel_id)
            return found if len(found) >= n else None

        return await self.wait_for(ready, timeout)

    async def wait_for_op(self, op: int, n: int = 1, timeout: float = 5.0) -> GatewayOp:
        """Wait until clients sent opcode ``op`` ``n`` times; return the n-th."""

        def ready() -> GatewayOp | None:
            found = self.received(op)
            return found[n - 1] if len(found) >= n else None

        return await self.wait_for(ready, timeout)

    async def wait_for_ready(self, n: int = 1, timeout: float = 5.0) -> Connection:
        """Wait until ``n`` connections carry a session (READY or RESUMED sent); return the n-th."""

        def ready() -> Connection | None:
            found = [c for c in self._connections if c.session_id is not None]
            return found[n - 1] if len(found) >= n else None

        return await self.wait_for(ready, timeout)

    # ----------------------------------------------------------------- REST faults

    def fail_next(self, route: str, n: int = 1, *, status: int = 429, retry_after: float = 1.0,
                  is_global: bool = False, message: str | None = None, code: int = 0) -> None:
        """Answer the next ``n`` calls of ``route`` ("*" = any) with an error, without effect.

        429 carries Discord's body (``retry_after``, ``global``) and headers (``Retry-After``,
        ``X-RateLimit-*``, and ``Via``: without it discord.py takes a 429 for a Cloudflare ban).
        """
        headers: dict[str, str] = {}
        if status == 429:
            body: JSON = {"message": message or "You are being rate limited.", "retry_after": retry_after,
                          "global": is_global, "code": code}
            headers = {**_ratelimit_headers(route, 0, retry_after), "Retry-After": str(math.ceil(retry_after)),
                       "X-RateLimit-Scope": "global" if is_global else "user", "Via": "1.1 google"}
            if is_global:
                headers["X-RateLimit-Global"] = "true"
        else:
            body = {"message": message or f"{status}: simulated failure", "code": code}
        for _ in range(n):
            self._faults[self._fault_key(route)].append(_Fault("error", status, body, headers))

    def drop_next(self, route: str, n: int = 1, *, after_apply: bool = False) -> None:
        """Close the connection without answering the next ``n`` calls of ``route``.

        ``after_apply=True``: the call takes effect (the message is posted) and only the answer is lost.
        """
        kind: Literal["drop", "drop_after"] = "drop_after" if after_apply else "drop"
        for _ in range(n):
            self._faults[self._fault_key(route)].append(_Fault(kind))

    def clear_faults(self) -> None:
        self._faults.clear()

    def _fault_key(self, route: str) -> str:
        if route != "*" and route not in _ROUTE_NAMES:
            raise ValueError(f"unknown route {route!r}; known: {', '.join(sorted(_ROUTE_NAMES))}")
        return route

    def _take_fault(self, route: str) -> _Fault | None:
        for key in (route, "*"):
            queue = self._faults.get(key)
            if queue:
                return queue.popleft()
        return None

    # ----------------------------------------------------------------- gateway controls

    def withhold_acks(self) -> int:
        """Zombie the connections open now: no more heartbeat ACKs and no dispatches (they wait in the
        session for a RESUME). New connections work normally. Returns how many were affected."""
        affected = self._open_connections()
        for conn in affected:
            conn.acks_withheld = True
            conn.delivering = False
        return len(affected)

    def suspend_delivery(self) -> int:
        """Keep the connections open now but stop delivering dispatches on them: events get sequence
        numbers and wait in the session, as on a dying link. Returns how many were affected."""
        affected = self._open_connections()
        for conn in affected:
            conn.delivering = False
        return len(affected)

    def cut_connections(self, *, code: int = 4000, reason: str = "", abrupt: bool = False) -> int:
        """Close every open connection: a close frame with ``code``, or (``abrupt``) a dropped socket.

        Sessions stay resumable. Returns how many were closed.
        """
        affected = self._open_connections()
        for conn in affected:
            conn._queue.put_nowait(_Close(code, reason, abrupt))
        return len(affected)

    def send_reconnect(self) -> int:
        """Send op 7 RECONNECT on every open connection."""
        affected = self._open_connections()
        for conn in affected:
            conn._queue.put_nowait({"op": 7, "d": None})
        return len(affected)

    def invalidate_sessions(self, *, resumable: bool = False) -> int:
        """Send op 9 INVALID SESSION on every open connection; unless ``resumable`` the sessions end."""
        affected = self._open_connections()
        for conn in affected:
            if not resumable:
                self._end_session(conn.session_id)
            conn._queue.put_nowait({"op": 9, "d": resumable})
        return len(affected)

    def expire_detached_sessions(self) -> int:
        """End every session no open connection belongs to (a client that died and will not RESUME), as
        Discord does once its resume window passes; their events stop being logged. Returns how many ended."""
        detached = [s for s in self._sessions.values() if s.valid and (s.conn is None or not s.conn.open)]
        for session in detached:
            session.valid = False
            session.log.clear()
        return len(detached)

    def reject_identify(self, n: int = 1) -> None:
        """Answer the next ``n`` IDENTIFYs with op 9 INVALID SESSION (not resumable) instead of READY."""
        self._identify_rejections += n

    # ----------------------------------------------------------------- drivers

    def add_user(self, user_id: int, name: str) -> None:
        """Make one more user known (the drivers write as known users only)."""
        self._users.setdefault(user_id, self._user_json(user_id, name))

    def user_sends_dm(self, content: str, *, user_id: int = ALICE_ID, reply_to: int | None = None,
                      attachments: Sequence[AttachmentSpec] = ()) -> JSON:
        """A user writes to the bot in their DM channel."""
        return self.user_sends(content, channel_id=self.dm_channel_id(user_id), user_id=user_id,
                               reply_to=reply_to, attachments=attachments)

    def user_sends(self, content: str, *, channel_id: int = GENERAL_ID, user_id: int = ALICE_ID,
                   mention_bot: bool = False, reply_to: int | None = None, ping_reply: bool = True,
                   attachments: Sequence[AttachmentSpec] = ()) -> JSON:
        """A user posts in a channel, thread or DM. ``mention_bot`` prefixes ``<@BOT_ID>``; ``reply_to``
        makes it a reply (which pings the replied-to author unless ``ping_reply`` is false)."""
        channel = self._channel(channel_id)
        if mention_bot:
            content = f"<@{BOT_ID}> {content}"
        reference = self._messages.get(reply_to) if reply_to is not None else None
        if reply_to is not None and reference is None:
            raise ValueError(f"no message {reply_to} to reply to")
        files = self._user_attachments(channel_id, attachments)
        allowed = None if ping_reply else {"parse": ["users", "roles", "everyone"], "replied_user": False}
        voice = any(s.voice_fields() for s in attachments)
        return self._post(channel, self._users[user_id], content, reference=reference, allowed=allowed,
                          replied_user=ping_reply, attachments=files,
                          fields={"flags": VOICE_MESSAGE_FLAG} if voice else None)

    def create_thread(self, name: str = "topic", *, parent_id: int = GENERAL_ID, owner_id: int = ALICE_ID) -> int:
        """A user starts a public thread under a text channel (THREAD_CREATE); returns the thread id."""
        parent = self._channel(parent_id)
        tid = self._new_id()
        self._channels[tid] = {
            "id": str(tid), "type": _CHANNEL_PUBLIC_THREAD, "guild_id": parent["guild_id"], "parent_id": str(parent_id),
            "owner_id": str(owner_id), "name": name, "last_message_id": None, "rate_limit_per_user": 0,
            "message_count": 0, "member_count": 1, "flags": 0,
            "thread_metadata": {"archived": False, "auto_archive_duration": 1440, "archive_timestamp": _iso(),
                                "locked": False},
        }
        self._dispatch("THREAD_CREATE", {**self._channels[tid], "newly_created": True}, GUILD_ID)
        return tid

    # ----------------------------------------------------------------- model

    @staticmethod
    def _user_json(user_id: int, name: str, *, bot: bool = False) -> JSON:
        user: JSON = {"id": str(user_id), "username": name, "discriminator": "0", "global_name": name.title(),
                      "avatar": None, "public_flags": 0}
        if bot:
            user["bot"] = True
        return user

    def _new_id(self) -> int:
        self._last_id = max(snowflake(), self._last_id + 1)
        return self._last_id

    def _changed(self) -> None:
        self._change.set()
        self._change = asyncio.Event()

    def _channel(self, channel_id: int) -> JSON:
        channel = self._channels.get(channel_id)
        if channel is None:
            raise _ApiError(404, 10003, "Unknown Channel")
        return channel

    def _guild_of(self, channel: JSON) -> int | None:
        return int(channel["guild_id"]) if channel.get("guild_id") else None

    def _mentions(self, content: str, allowed: JSON | None, replied: JSON | None,
                  replied_user: bool) -> tuple[list[JSON], list[str], bool]:
        """Who a message pings, by Discord's ``allowed_mentions`` rules (absent: parse everything)."""
        parse = set(allowed.get("parse", [])) if allowed is not None else {"users", "roles", "everyone"}
        listed_users = set((allowed or {}).get("users", []))
        listed_roles = set((allowed or {}).get("roles", []))
        users = [uid for uid in dict.fromkeys(_USER_MENTION.findall(content))
                 if ("users" in parse or uid in listed_users) and int(uid) in self._users]
        if replied is not None and replied_user and replied["author"]["id"] not in users:
            users.append(replied["author"]["id"])
        roles = [rid for rid in dict.fromkeys(_ROLE_MENTION.findall(content))
                 if "roles" in parse or rid in listed_roles]
        everyone = "everyone" in parse and _EVERYONE.search(content) is not None
        return [self._users[int(uid)] for uid in users], roles, everyone

    def _post(self, channel: JSON, author: JSON, content: str, *, reference: JSON | None = None,
              allowed: JSON | None = None, replied_user: bool = True, attachments: Sequence[JSON] = (),
              nonce: str | None = None, fields: JSON | None = None) -> JSON:
        """Store a new message (``fields`` override or add message fields) and dispatch MESSAGE_CREATE."""
        mid = self._new_id()
        mentions, roles, everyone = self._mentions(content, allowed, reference, replied_user)
        message: JSON = {
            "id": str(mid), "channel_id": channel["id"], "author": author, "content": content, "timestamp": _iso(),
            "edited_timestamp": None, "tts": False, "mention_everyone": everyone, "mentions": mentions,
            "mention_roles": roles, "attachments": list(attachments), "embeds": [], "components": [],
            "pinned": False, "type": _MESSAGE_REPLY if reference else _MESSAGE_DEFAULT, "flags": 0,
        }
        message.update(fields or {})
        if nonce is not None:
            message["nonce"] = nonce
        if reference is not None:
            message["message_reference"] = {"type": 0, "message_id": reference["id"],
                                            "channel_id": reference["channel_id"],
                                            **({"guild_id": channel["guild_id"]} if channel.get("guild_id") else {})}
            message["referenced_message"] = dict(reference)
        self._messages[mid] = message
        self._history[int(channel["id"])].append(mid)
        channel["last_message_id"] = str(mid)
        guild_id = self._guild_of(channel)
        event = dict(message)
        if guild_id is not None:
            event["guild_id"] = str(guild_id)
            event["member"] = {"roles": [], "joined_at": _iso(), "deaf": False, "mute": False, "flags": 0}
        self._dispatch("MESSAGE_CREATE", event, guild_id)
        self._changed()
        return message

    # ----------------------------------------------------------------- gateway

    def _open_connections(self) -> list[Connection]:
        return [c for c in self._connections if c.open]

    def _shard_of(self, guild_id: int | None, shard_count: int) -> int:
        return 0 if guild_id is None else (guild_id >> 22) % shard_count

    def _dispatch(self, event_type: str, data: JSON, guild_id: int | None) -> None:
        for session in self._sessions.values():
            if session.valid and self._shard_of(guild_id, session.shard[1]) == session.shard[0]:
                self._emit(session, event_type, data)

    def _emit(self, session: _Session, event_type: str, data: JSON) -> None:
        if event_type == "MESSAGE_CREATE" and self._content_hidden(session, data):
            data = {**data, "content": "", "attachments": [], "embeds": []}
        session.seq += 1
        payload = {"op": 0, "t": event_type, "s": session.seq, "d": data}
        session.log.append(payload)
        conn = session.conn
        if conn is not None and conn.open and conn.delivering:
            conn._queue.put_nowait(payload)

    @staticmethod
    def _content_hidden(session: _Session, message: JSON) -> bool:
        """Without the message content intent, guild messages that do not mention the bot arrive empty."""
        if session.intents & MESSAGE_CONTENT_INTENT or "guild_id" not in message:
            return False
        return message["author"]["id"] != str(BOT_ID) and all(u["id"] != str(BOT_ID) for u in message["mentions"])

    def _end_session(self, session_id: str | None) -> None:
        session = self._sessions.get(session_id or "")
        if session is not None:
            session.valid = False

    def _guild_create(self, guild_id: int) -> JSON:
        guild = self._guilds[guild_id]
        channels = [c for c in self._channels.values() if c.get("guild_id") == str(guild_id)]
        return {
            "id": str(guild_id), "name": guild["name"], "icon": None, "owner_id": str(guild["owner_id"]),
            "roles": [{"id": str(guild_id), "name": "@everyone", "permissions": "1071698660929", "position": 0,
                       "color": 0, "hoist": False, "managed": False, "mentionable": False, "flags": 0}],
            "emojis": [], "stickers": [], "features": [], "voice_states": [], "presences": [],
            "channels": [c for c in channels if c["type"] == _CHANNEL_TEXT],
            "threads": [c for c in channels if c["type"] == _CHANNEL_PUBLIC_THREAD],
            "members": [{"user": self.bot_user, "roles": [], "joined_at": _iso(), "deaf": False, "mute": False,
                         "flags": 0}],
            "member_count": len(self._users), "joined_at": _iso(), "large": False, "unavailable": False,
            "verification_level": 0, "default_message_notifications": 0, "explicit_content_filter": 0,
            "mfa_level": 0, "nsfw_level": 0, "premium_tier": guild.get("premium_tier", 0), "system_channel_flags": 0,
            "preferred_locale": "en-US", "afk_timeout": 300,
        }

    async def _handle_gateway(self, request: web.Request) -> web.StreamResponse:
        if self.refuse_connections:
            return _response(503, {"message": "gateway unavailable", "code": 0})
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        compressed = self.zlib and request.query.get("compress") == "zlib-stream"
        conn = Connection(next(self._ids), request.path, dict(request.query), time.monotonic(), compressed, _ws=ws,
                          _transport=request.transport, _compressor=zlib.compressobj() if compressed else None)
        self._connections.append(conn)
        writer = asyncio.create_task(self._write(conn), name=f"discord-sim:conn{conn.id}")
        self._writers.add(writer)
        writer.add_done_callback(self._writers.discard)
        conn._queue.put_nowait({"op": 10, "d": {"heartbeat_interval": self.heartbeat_interval}})
        self._changed()
        try:
            async for msg in ws:
                if msg.type is not aiohttp.WSMsgType.TEXT:
                    continue
                try:
                    payload = json.loads(msg.data)
                except ValueError:
                    conn._queue.put_nowait(_Close(4002, "Decode error"))
                    continue
                self._on_payload(conn, payload)
        finally:
            self._closed(conn, ws.close_code, by_client=True)
        return ws

    def _closed(self, conn: Connection, code: int | None, *, by_client: bool) -> None:
        if conn.closed_at is not None:
            return
        conn.closed_at = time.monotonic()
        conn.close_code = code
        session = self._sessions.get(conn.session_id or "")
        if session is not None and session.conn is conn:
            session.conn = None
            if by_client and code in (1000, 1001):  # a client closing normally ends its session, as on Discord
                session.valid = False
        conn._queue.put_nowait(_Close(1000))  # lets the writer finish
        self._changed()

    async def _write(self, conn: Connection) -> None:
        ws = conn._ws
        assert ws is not None
        try:
            while True:
                item = await conn._queue.get()
                if isinstance(item, _Close):
                    self._closed(conn, item.code, by_client=False)  # first: the client's close reply follows
                    if item.abrupt and conn._transport is not None:
                        conn._transport.abort()
                    elif not ws.closed:
                        await ws.close(code=item.code, message=item.reason.encode())
                    return
                if ws.closed:
                    continue
                data = json.dumps(item)
                if conn._compressor is not None:
                    c = conn._compressor
                    await ws.send_bytes(c.compress(data.encode()) + c.flush(zlib.Z_SYNC_FLUSH))
                else:
                    await ws.send_str(data)
                conn.sent.append(item)
                self._changed()
        except (ConnectionError, RuntimeError) as exc:
            _log.debug("gateway connection %s write ended: %s", conn.id, exc)
            self._closed(conn, ws.close_code, by_client=False)

    def _on_payload(self, conn: Connection, payload: JSON) -> None:
        op, d = payload.get("op"), payload.get("d")
        self._received.append(GatewayOp(conn.id, op, d, time.monotonic()))
        self._changed()
        if op == 1:
            if not conn.acks_withheld:
                conn._queue.put_nowait({"op": 11})
        elif op == 2:
            self._identify(conn, d or {})
        elif op == 6:
            self._resume(conn, d or {})
        elif op not in (3, 4, 8):
            conn._queue.put_nowait(_Close(4001, "Unknown opcode"))

    def _identify(self, conn: Connection, d: JSON) -> None:
        if d.get("token") != self.token:
            conn._queue.put_nowait(_Close(4004, "Authentication failed."))
            return
        if conn.session_id is not None:
            conn._queue.put_nowait(_Close(4005, "Already authenticated."))
            return
        if self._identify_rejections > 0:
            self._identify_rejections -= 1
            conn._queue.put_nowait({"op": 9, "d": False})
            return
        shard_id, shard_count = d.get("shard") or (0, 1)
        session = _Session(secrets.token_hex(16), (int(shard_id), int(shard_count)), int(d.get("intents") or 0))
        self._sessions[session.id] = session
        session.conn = conn
        conn.session_id = session.id
        guilds = [gid for gid in self._guilds if self._shard_of(gid, session.shard[1]) == session.shard[0]]
        ready = {
            "v": API_VERSION, "user": self.bot_user, "guilds": [{"id": str(g), "unavailable": True} for g in guilds],
            "session_id": session.id, "resume_gateway_url": self.resume_gateway_url, "private_channels": [],
            "relationships": [], "application": {"id": str(BOT_ID), "flags": 0}, "shard": list(session.shard),
        }
        self._emit(session, "READY", ready)
        for gid in guilds:
            self._emit(session, "GUILD_CREATE", self._guild_create(gid))
        self._changed()

    def _resume(self, conn: Connection, d: JSON) -> None:
        if d.get("token") != self.token:
            conn._queue.put_nowait(_Close(4004, "Authentication failed."))
            return
        session = self._sessions.get(str(d.get("session_id")))
        if session is None or not session.valid:
            conn._queue.put_nowait({"op": 9, "d": False})
            return
        old = session.conn
        if old is not None and old is not conn and old.open:
            old._queue.put_nowait(_Close(4000, "Session resumed elsewhere"))
        session.conn = conn
        conn.session_id = session.id
        after = int(d.get("seq") or 0) - self.replay_overlap
        for payload in session.log:
            if payload["s"] > after:
                conn._queue.put_nowait(payload)
        self._emit(session, "RESUMED", {})
        self._changed()

    # ----------------------------------------------------------------- REST

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bot {self.token}"

    async def _handle_rest(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["path"]
        match = next(((name, m) for method, pattern, name in _ROUTES
                      if method == request.method and (m := pattern.fullmatch(path))), None)
        body, files = await read_body(request)
        call = RestCall(match[0] if match else "unknown", request.method, path, dict(request.query), body,
                        dict(request.headers), time.monotonic(), files=files)
        self._calls.append(call)
        self._changed()
        if match is None:
            return self._finish(call, 404, {"message": "404: Not Found", "code": 0})
        route, m = match
        if route not in _UNAUTHENTICATED and not self._authorized(request):
            return self._finish(call, 401, {"message": "401: Unauthorized", "code": 0})
        fault = self._take_fault(route)
        if fault is not None and fault.kind == "error":
            return self._finish(call, fault.status, fault.body, fault.headers)
        if fault is not None and fault.kind == "drop":
            return await self._drop(request, call, applied=False)
        handler: _Handler = getattr(self, f"_rest_{route}")
        try:
            status, result = await handler(call, **{k: v if k == "emoji" or k in TEXT_PARAMS else int(v)
                                                    for k, v in m.groupdict().items()})
        except _ApiError as exc:
            return self._finish(call, exc.status, exc.body)
        if fault is not None and fault.kind == "drop_after":
            return await self._drop(request, call, applied=True)
        return self._finish(call, status, result)

    def _finish(self, call: RestCall, status: int, body: Any, headers: dict[str, str] | None = None) -> web.Response:
        call.status = status
        call.outcome = "ok" if status < 400 else "error"
        call.response = body
        self._changed()
        return _response(status, body, headers or _ratelimit_headers(call.route, 4, 1.0))

    async def _drop(self, request: web.Request, call: RestCall, *, applied: bool) -> web.Response:
        call.outcome = "applied_dropped" if applied else "dropped"
        self._changed()
        if request.transport is not None:
            request.transport.abort()
        await asyncio.sleep(1)  # handler_cancellation ends the handler here
        return web.Response(status=500)

    _api_error = _ApiError  # for the interactions mixin

    async def _rest_get_me(self, call: RestCall) -> tuple[int, Any]:
        return 200, {**self.bot_user, "verified": True, "mfa_enabled": False, "flags": 0}

    async def _rest_app_info(self, call: RestCall) -> tuple[int, Any]:
        return 200, {"id": str(BOT_ID), "name": self.bot_user["username"], "description": "", "icon": None,
                     "bot_public": True, "bot_require_code_grant": False, "verify_key": "0" * 64,
                     "owner": self._users[ALICE_ID], "flags": 0, "bot": self.bot_user}

    async def _rest_gateway(self, call: RestCall) -> tuple[int, Any]:
        return 200, {"url": self.gateway_url}

    async def _rest_gateway_bot(self, call: RestCall) -> tuple[int, Any]:
        return 200, {"url": self.gateway_url, "shards": self.recommended_shards,
                     "session_start_limit": {"total": 1000, "remaining": 1000 - len(self.identifies),
                                             "reset_after": 86_400_000, "max_concurrency": 1}}

    async def _rest_create_dm(self, call: RestCall) -> tuple[int, Any]:
        recipient = int((call.body or {}).get("recipient_id") or 0)
        if recipient not in self._users or recipient == BOT_ID:
            raise _ApiError(400, 50007, "Cannot send messages to this user")
        return 200, self._channels[self.dm_channel_id(recipient)]

    async def _rest_get_user(self, call: RestCall, user_id: int) -> tuple[int, Any]:
        if user_id not in self._users:
            raise _ApiError(404, 10013, "Unknown User")
        return 200, self._users[user_id]

    async def _rest_get_channel(self, call: RestCall, channel_id: int) -> tuple[int, Any]:
        return 200, self._channel(channel_id)

    async def _rest_channel_messages(self, call: RestCall, channel_id: int) -> tuple[int, Any]:
        self._channel(channel_id)
        try:
            limit = int(call.query.get("limit", 50))
            after = int(call.query["after"]) if "after" in call.query else None
            before = int(call.query["before"]) if "before" in call.query else None
        except ValueError:
            raise _ApiError(400, 50035, "Invalid Form Body") from None
        if not 1 <= limit <= 100:
            raise _ApiError(400, 50035, "Invalid Form Body",
                            {"limit": {"_errors": [{"code": "NUMBER_TYPE_MAX", "message": "Must be 1-100."}]}})
        ids = self._history[channel_id]
        if after is not None:
            picked = [i for i in ids if i > after][:limit]  # the oldest ones after `after`
        else:
            picked = [i for i in ids if before is None or i < before][-limit:]
        return 200, [self._messages[i] for i in reversed(picked)]  # newest first, as Discord answers

    def _check_content(self, content: Any) -> str:
        if content is not None and not isinstance(content, str):
            raise _ApiError(400, 50035, "Invalid Form Body")
        if content and len(content) > MAX_CONTENT_LENGTH:
            raise _ApiError(400, 50035, "Invalid Form Body", {"content": {"_errors": [
                {"code": "BASE_TYPE_MAX_LENGTH", "message": f"Must be {MAX_CONTENT_LENGTH} or fewer in length."}]}})
        return content or ""

    async def _rest_create_message(self, call: RestCall, channel_id: int) -> tuple[int, Any]:
        channel = self._channel(channel_id)
        body = call.body if isinstance(call.body, dict) else {}
        content = self._check_content(body.get("content"))
        if not content and not call.files:
            raise _ApiError(400, 50006, "Cannot send an empty message")
        components = self._components(body.get("components"))
        nonce = body.get("nonce")
        now = time.monotonic()
        if nonce is not None and body.get("enforce_nonce"):
            seen = self._nonces.get((channel_id, str(nonce)))
            if seen is not None and now - seen[1] < NONCE_TTL:
                return 200, self._messages[seen[0]]
        reference = None
        ref = body.get("message_reference")
        if isinstance(ref, dict) and ref.get("message_id") is not None:
            reference = self._messages.get(int(ref["message_id"]))
            if reference is None and ref.get("fail_if_not_exists", True):
                raise _ApiError(400, 50035, "Invalid Form Body", {"message_reference": {"_errors": [
                    {"code": "MESSAGE_REFERENCE_UNKNOWN_MESSAGE", "message": "Unknown message"}]}})
        allowed = body.get("allowed_mentions")
        attachments = self._uploads(channel, call.files)
        message = self._post(channel, self.bot_user, content, reference=reference, allowed=allowed,
                             replied_user=bool((allowed or {}).get("replied_user", allowed is None)),
                             attachments=attachments, nonce=None if nonce is None else str(nonce),
                             fields={"components": components})
        mid = int(message["id"])
        self._bot_created.append(mid)
        if nonce is not None:
            self._nonces[(channel_id, str(nonce))] = (mid, now)
        return 200, message

    async def _rest_edit_message(self, call: RestCall, channel_id: int, message_id: int) -> tuple[int, Any]:
        channel, message = self._message_in(channel_id, message_id)
        if message["author"]["id"] != self.bot_user["id"]:
            raise _ApiError(403, 50005, "Cannot edit a message authored by another user")
        body = call.body if isinstance(call.body, dict) else {}
        if "content" in body:
            content = self._check_content(body["content"])
            reference = message.get("referenced_message")
            mentions, roles, everyone = self._mentions(content, body.get("allowed_mentions"), reference, False)
            message.update(content=content, mentions=mentions, mention_roles=roles, mention_everyone=everyone)
        if "components" in body:
            message["components"] = self._components(body["components"])
        message["edited_timestamp"] = _iso()
        self._edits.append((message_id, message["content"]))
        event = dict(message)
        if (guild_id := self._guild_of(channel)) is not None:
            event["guild_id"] = str(guild_id)
        self._dispatch("MESSAGE_UPDATE", event, guild_id)
        return 200, message

    def _message_in(self, channel_id: int, message_id: int) -> tuple[JSON, JSON]:
        channel = self._channel(channel_id)
        message = self._messages.get(message_id)
        if message is None or int(message["channel_id"]) != channel_id:
            raise _ApiError(404, 10008, "Unknown Message")
        return channel, message

    async def _rest_delete_message(self, call: RestCall, channel_id: int, message_id: int) -> tuple[int, Any]:
        channel, message = self._message_in(channel_id, message_id)
        if message["author"]["id"] != self.bot_user["id"]:  # the bot has no Manage Messages here
            raise _ApiError(403, 50013, "Missing Permissions")
        del self._messages[message_id]
        self._history[channel_id].remove(message_id)
        self._deleted.append(message_id)
        guild_id = self._guild_of(channel)
        event: JSON = {"id": str(message_id), "channel_id": str(channel_id)}
        if guild_id is not None:
            event["guild_id"] = str(guild_id)
        self._dispatch("MESSAGE_DELETE", event, guild_id)
        return 204, None

    @staticmethod
    def _emoji(raw: str) -> str:
        """A reaction's emoji from the path: Unicode, or a custom ``name:id`` (none exist here: Unknown Emoji)."""
        if DISCORD_CUSTOM_EMOJI.fullmatch(raw) or reaction_problem("discord", raw):
            raise _ApiError(400, 10014, "Unknown Emoji")
        return raw

    async def _rest_add_reaction(self, call: RestCall, channel_id: int, message_id: int,
                                 emoji: str) -> tuple[int, Any]:
        self._message_in(channel_id, message_id)
        emoji = self._emoji(emoji)
        if emoji not in self._reactions[message_id]:
            self._reactions[message_id].append(emoji)
        return 204, None

    async def _rest_remove_own_reaction(self, call: RestCall, channel_id: int, message_id: int,
                                        emoji: str) -> tuple[int, Any]:
        self._message_in(channel_id, message_id)
        emoji = self._emoji(emoji)
        if emoji in self._reactions[message_id]:  # removing a reaction that is not there is no error
            self._reactions[message_id].remove(emoji)
        return 204, None

    async def _rest_typing(self, call: RestCall, channel_id: int) -> tuple[int, Any]:
        self._channel(channel_id)
        return 204, None
