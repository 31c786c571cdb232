"""Discord through discord.py: gateway events in, REST sends out.

Two ``discord.Client``s (never ``client.run()``): one only logged in over REST, through which every send
goes, and, while the adapter receives, a gateway client logged in by ``start_receiving`` whose
``connect()`` runs as a task the adapter owns. They are separate because discord.py cannot close just the
websocket of a client: ``close()`` also closes its HTTP session, ``connect()`` reconnects after a normal
close, and cancelling it during a handshake leaves a websocket open with its heartbeat thread running.
Closing the whole gateway client closes everything it opened, and sends never notice. Where clients
connect is process-wide in discord.py: ``discord.http.Route.BASE`` (the REST base) and
``discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY`` (the websocket) are class attributes, so the
adapter sets them on connect and restores them on disconnect; one Discord bot per process. Without a
configured ``gateway_url`` the adapter asks ``GET /gateway/bot`` at login, as Discord recommends, so a
self-hosted or simulated API base alone is enough.

Delivery: Discord has no acknowledgement for gateway events. RESUME replays what a live session missed
and ``event_id`` is the message id, so replays are dropped by the gateway's inbox. After a new IDENTIFY
(a restart, or a session Discord invalidated) nothing is replayed, so the adapter backfills: for every
channel it has talked in (remembered in ``state_file``) it fetches the messages newer than the last one
it handled, at most ``backfill_window`` seconds old, and feeds them through the same path and dedupe.

Threads are channels on Discord. An event from a thread has ``chat_id`` = the parent channel and
``thread_id`` = the thread: allowlists naming a channel cover its threads, sessions stay per thread
(``discord:group:<channel>:<thread>:<user>``), and replies go to the thread (``thread_id`` wins).

Interactions (platforms/discord_interactions.py): ``send_choices`` puts buttons under a message; a press
(INTERACTION_CREATE type 3) is acknowledged at once with a deferred update and arrives as a message from the
presser. ``set_commands`` publishes the slash-command menu; an invocation is acknowledged with a deferred
response and arrives as ``/<name> <args>`` whose ``message_id`` is ``interaction:<id>``: the reply part naming
it edits that response, while its token is valid, instead of posting in the channel.

Files (platforms/discord_files.py): ``fetch_attachment`` downloads an event's attachment from Discord's CDN (its
own hosts only), ``send_file`` posts a message carrying one file, as exactly once as ``send`` (the same nonce).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import discord
import yarl
from discord import app_commands
from discord.gateway import DiscordWebSocket
from discord.http import Route

from platforms.base import (
    AdapterState,
    Attachment,
    AttachmentKind,
    BasePlatformAdapter,
    ChatType,
    Choice,
    GatewayClosing,
    MenuCommand,
    MessageEvent,
    OnMessage,
    SendResult,
)
from platforms.discord_cursors import Cursors
from platforms.discord_files import AttachmentDownloader, FilesMixin
from platforms.discord_interactions import NETWORK_ERRORS, Interactions, interaction_id, publish_menu
from platforms.rich_text import discord_length, to_discord

__all__ = ["DISCORD_API", "DiscordAdapter", "DiscordSettings", "DiscordStartupError", "delivery_nonce"]

logger = logging.getLogger(__name__)

DISCORD_API = "https://discord.com/api/v10"
TOKEN_REJECTED = "discord: the bot token was rejected (401 on /users/@me); check platforms.discord.token"
_LOGIN_TIMEOUT = 30.0
_CLOSE_TIMEOUT = 10.0
_TASK_GRACE = 1.0  # how long stopping waits for a task to end by itself (the client after close(), a backfill)
_REQUEST_MARGIN = 30.0  # a request may wait out a rate limit up to max_ratelimit_timeout, then this long
_MAX_IDENTIFY_BACKOFF = 300.0
_MAX_HELD = 10_000  # live messages held back while catching up; beyond that they are handed over at once
_CURSOR_FLUSH_INTERVAL = 1.0
_HANDLED_TYPES = frozenset({discord.MessageType.default, discord.MessageType.reply})
_FATAL_CLOSE_CODES = {
    4004: "the gateway rejected the bot token (close 4004); check platforms.discord.token",
    4010: "invalid shard (close 4010); check platforms.discord.shard_count and shard_ids",
    4011: "Discord requires sharding for this bot (close 4011); set platforms.discord.shard_count",
    4012: "invalid gateway API version (close 4012); platforms.discord.api_base_url must be a v10 API",
    4013: "invalid intents (close 4013)",
    4014: ("the bot may not use the message content intent (close 4014); enable it in the Developer "
           "Portal under Bot > Privileged Gateway Intents"),
}


class DiscordStartupError(RuntimeError):
    """Discord could not be started; the message names the cause and the setting to check."""


@dataclass(frozen=True, slots=True)
class DiscordSettings:
    """What the adapter needs from ``platforms.discord`` (see deploy/config.example.yaml)."""

    token: str
    api_base_url: str = DISCORD_API
    gateway_url: str | None = None
    shard_count: int | None = None
    shard_ids: tuple[int, ...] | None = None
    respond_in_guilds: Literal["mention", "always"] = "mention"
    allowed_guilds: frozenset[str] = frozenset()
    allowed_channels: frozenset[str] = frozenset()
    allow_mentions: bool = False
    max_ratelimit_timeout: float = 30.0
    heartbeat_timeout: float = 60.0
    guild_ready_timeout: float = 2.0
    reconnect_backoff: float = 5.0
    backfill_window: float = 3600.0
    state_file: Path | None = None
    command_guilds: tuple[str, ...] = ()
    """Guild ids to register the slash commands in (instant, per guild); empty: globally."""


def delivery_nonce(delivery_id: str) -> str:
    """The message nonce for an outbox delivery: stable, so Discord drops a retried send (24 of 25 chars)."""
    return hashlib.blake2b(delivery_id.encode(), digest_size=12).hexdigest()


def _snowflake(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _attachment_kind(attachment: discord.Attachment) -> AttachmentKind:
    kind = (attachment.content_type or "").split("/", 1)[0]
    if kind == "image":
        return "photo"
    if kind == "audio":
        return "voice" if attachment.is_voice_message() else "audio"
    return "video" if kind == "video" else "document"


class _IdentifyBackoff:
    """Delay before each re-IDENTIFY of a shard: ``base`` doubling per consecutive one, capped, jittered.

    A shard that went longer than the cap without re-identifying starts over at ``base``.
    """

    def __init__(self, base: float, cap: float = _MAX_IDENTIFY_BACKOFF) -> None:
        self._base = base
        self._cap = cap
        self._shards: dict[int | None, tuple[int, float]] = {}

    def delay(self, shard_id: int | None) -> float:
        now = time.monotonic()
        count, last = self._shards.get(shard_id, (0, -math.inf))
        if now - last > self._cap:
            count = 0
        self._shards[shard_id] = (count + 1, now)
        return min(self._cap, self._base * 2**count) * random.uniform(0.75, 1.0)


class _Hooks:
    """Routes the gateway client's hooks and events to the adapter (mixed into Client and AutoShardedClient)."""

    def __init__(self, adapter: DiscordAdapter, **options: Any) -> None:
        self._adapter = adapter
        super().__init__(**options)

    async def setup_hook(self) -> None:
        await self._adapter._find_gateway(self)  # type: ignore[arg-type]

    async def before_identify_hook(self, shard_id: int | None, *, initial: bool = False) -> None:
        # Replaces discord.py's flat 5 s: a re-IDENTIFY storm backs off exponentially.
        if not initial:
            await asyncio.sleep(self._adapter._identify_backoff.delay(shard_id))

    async def on_connect(self) -> None:  # READY: a new session (ready is dispatched once guilds arrived)
        self._adapter._session_started(self)  # type: ignore[arg-type]

    async def on_resumed(self) -> None:
        self._adapter._connected(self, new_session=False)  # type: ignore[arg-type]

    async def on_disconnect(self) -> None:
        self._adapter._disconnected(self)  # type: ignore[arg-type]

    async def on_message(self, message: discord.Message) -> None:
        await self._adapter._live(self, message)  # type: ignore[arg-type]

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        await self._adapter._interaction(interaction)


class _Client(_Hooks, discord.Client):
    async def on_ready(self) -> None:
        self._adapter._connected(self, new_session=True)


class _ShardedClient(_Hooks, discord.AutoShardedClient):
    async def on_shard_ready(self, _shard_id: int) -> None:  # on_ready comes only once, for all shards
        self._adapter._connected(self, new_session=True)



class DiscordAdapter(FilesMixin, BasePlatformAdapter):
    """A Discord bot: DMs, guild channels (when mentioned or replied to, or always) and threads."""

    name = "discord"
    max_message_length = 2000
    can_edit = True
    can_delete = True
    can_react = True
    can_buttons = True
    length_fn = discord_length  # the Markdown as sent (tables as code blocks), in UTF-16 units

    def __init__(self, settings: DiscordSettings) -> None:
        super().__init__()
        self.settings = settings
        self.bot_username: str | None = None
        if settings.allow_mentions:  # users and roles may be pinged, never @everyone/@here
            self._mentions = discord.AllowedMentions(everyone=False, users=True, roles=True, replied_user=True)
        else:
            self._mentions = discord.AllowedMentions.none()
        self._identify_backoff = _IdentifyBackoff(settings.reconnect_backoff)
        self._request_timeout = settings.max_ratelimit_timeout + _REQUEST_MARGIN
        self._rest: discord.Client | None = None  # logged in over REST only: every send goes through it
        self._tree: app_commands.CommandTree[discord.Client] | None = None  # the REST client's: publishes the menu
        self._client: discord.Client | None = None  # the gateway client, while receiving
        self._task: asyncio.Task[None] | None = None  # its connect()
        self._on_message: OnMessage | None = None
        self._saved_endpoints: tuple[str, yarl.URL] | None = None
        self._intake = asyncio.Lock()
        self._cursors = Cursors(settings.state_file)
        self._cursors_dirty = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._backfills: set[asyncio.Task[None]] = set()
        # Live messages held back while catching up after a (re)connect: a new session's backfill, or a
        # resume's replay, goes first, so a chat's messages are handed over in order and the backfill
        # cursors do not move past what the backfill still has to fetch. None: not catching up.
        self._held: list[discord.Message] | None = None
        self._catching_up: asyncio.Task[None] | None = None
        self._backfill_again = False
        self._backfill_owed = False  # a new session started and its on_ready (which backfills) has not come
        self._interactions = Interactions()
        self._menu: list[MenuCommand] | None = None  # set_commands before connect: published once logged in
        self._downloads = AttachmentDownloader(settings.api_base_url)

    # -- lifecycle -------------------------------------------------------

    async def connect(self, on_message: OnMessage, *, receive: bool = True) -> None:
        """Log in over REST (what sending needs); with `receive`, also open the gateway connection.

        Raises DiscordStartupError (state FAILED) if logging in fails.
        """
        if self._rest is not None:
            raise RuntimeError("discord adapter is already connected")
        self._on_message = on_message
        self._set_state(AdapterState.CONNECTING)
        self._apply_endpoints()
        self._cursors.state = self._interactions.state = self.state_store
        await self._cursors.load()
        rest = discord.Client(intents=discord.Intents.none(), allowed_mentions=self._mentions,
                              max_ratelimit_timeout=self.settings.max_ratelimit_timeout)
        try:
            await self._login(rest)
        except DiscordStartupError:
            self._restore_endpoints()
            raise
        assert rest.user is not None
        self._rest, self.bot_username = rest, rest.user.name
        self._tree = app_commands.CommandTree(rest)
        logger.info("discord: logged in as %s (%s)", rest.user.name, rest.user.id)
        self._set_state(AdapterState.CONNECTED)
        self._flusher = asyncio.create_task(self._flush_cursors(), name="discord-cursors")
        if self._menu is not None:
            await publish_menu(self._tree, self._menu, self.settings.command_guilds, self._request_timeout)
        if receive:
            await self.start_receiving()

    async def start_receiving(self) -> None:
        """Log a gateway client in and run its ``connect()`` as a task; raises DiscordStartupError (state FAILED)."""
        if self._client is not None:
            return
        self._set_state(AdapterState.CONNECTING)
        client = self._build_client()
        await self._login(client)
        self._client = client
        self._held = []
        self._task = asyncio.create_task(client.connect(), name="discord-gateway")
        self._task.add_done_callback(self._client_ended)
        self._receiving = True

    async def stop_receiving(self) -> None:
        """Close the gateway client (websocket and its own REST session); sends keep going over REST.

        Messages already received are still handed over; a backfill stops before its next message.
        """
        if self._client is None:
            return
        self._receiving = False
        await self._stop_client()
        if self._state in (AdapterState.CONNECTING, AdapterState.DISCONNECTED):
            self._set_state(AdapterState.CONNECTED)  # what was down was the gateway; sending works

    async def disconnect(self) -> None:
        """Close the gateway connection and the REST client; save the backfill state."""
        await self.stop_receiving()
        rest, self._rest, self._tree = self._rest, None, None
        if rest is not None:
            await self._close(rest)
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
            self._flusher = None
        await self._cursors.save()
        await self._downloads.close()
        self._restore_endpoints()
        if self._state != AdapterState.FAILED:
            self._set_state(AdapterState.DISCONNECTED)

    def _build_client(self) -> discord.Client:
        s = self.settings
        options: dict[str, Any] = {
            "intents": discord.Intents(guilds=True, guild_messages=True, dm_messages=True, message_content=True),
            "allowed_mentions": self._mentions,
            "max_ratelimit_timeout": s.max_ratelimit_timeout,
            "heartbeat_timeout": s.heartbeat_timeout,
            "guild_ready_timeout": s.guild_ready_timeout,
            "chunk_guilds_at_startup": False,
        }
        if s.shard_count is None:
            return _Client(self, **options)
        shard_ids = list(s.shard_ids) if s.shard_ids is not None else None
        return _ShardedClient(self, shard_count=s.shard_count, shard_ids=shard_ids, **options)

    def _apply_endpoints(self) -> None:
        if self._saved_endpoints is None:
            self._saved_endpoints = (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY)
        Route.BASE = self.settings.api_base_url.rstrip("/")
        if self.settings.gateway_url is not None:
            DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(self.settings.gateway_url)

    def _restore_endpoints(self) -> None:
        if self._saved_endpoints is not None:
            Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY = self._saved_endpoints
            self._saved_endpoints = None

    async def _login(self, client: discord.Client) -> None:
        """``client.login()``; on failure the client is closed and DiscordStartupError raised (state FAILED)."""
        try:
            await asyncio.wait_for(client.login(self.settings.token), _LOGIN_TIMEOUT)
        except Exception as exc:
            message = self._login_error(exc)
            self._set_state(AdapterState.FAILED, message)
            await self._close(client)
            raise DiscordStartupError(message) from None

    async def _find_gateway(self, client: discord.Client) -> None:
        """Called by the gateway client once the token was accepted, before it opens the websocket."""
        if self.settings.gateway_url is None:
            _, url, _ = await client.http.get_bot_gateway()
            DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(url)

    def _login_error(self, exc: Exception) -> str:
        api = self.settings.api_base_url
        if isinstance(exc, TimeoutError):
            return f"discord: no answer from {api} within {_LOGIN_TIMEOUT:.0f} s; check platforms.discord.api_base_url"
        if isinstance(exc, discord.LoginFailure):
            return TOKEN_REJECTED
        if isinstance(exc, discord.GatewayNotFound):
            return (f"discord: GET /gateway/bot failed at {api}; check platforms.discord.api_base_url, "
                    f"or set platforms.discord.gateway_url")
        if isinstance(exc, discord.HTTPException):
            return f"discord: login failed with HTTP {exc.status} from {api}; check platforms.discord.api_base_url"
        return f"discord: cannot reach {api} ({exc!r}); check platforms.discord.api_base_url and the network"

    def _client_ended(self, task: asyncio.Task[None]) -> None:
        if task is not self._task or task.cancelled():
            return  # stopped by stop_receiving
        exc = task.exception()
        if exc is None:
            self._set_state(AdapterState.DISCONNECTED, "discord: the gateway connection ended")
            return
        code = getattr(exc, "code", None)
        if isinstance(exc, discord.PrivilegedIntentsRequired):
            code = 4014
        detail = _FATAL_CLOSE_CODES.get(code) if isinstance(code, int) else None
        message = f"discord: {detail}" if detail else f"discord: the gateway connection failed: {exc!r}"
        logger.error("%s", message)
        self._set_state(AdapterState.FAILED, message)

    async def _stop_client(self) -> None:
        client, task = self._client, self._task
        self._client, self._task = None, None
        if self._backfills:  # each one notices at its next message; a hand-over is never cut off halfway
            _, late = await asyncio.wait(self._backfills, timeout=_TASK_GRACE)
            for backfill in late:
                backfill.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        self._drop_held()
        if client is not None:
            await self._close(client)
        if task is not None:
            await asyncio.wait({task}, timeout=_TASK_GRACE)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    @staticmethod
    async def _close(client: discord.Client) -> None:
        try:
            await asyncio.wait_for(client.close(), _CLOSE_TIMEOUT)
        except Exception as exc:
            logger.warning("discord: the client did not close cleanly: %r", exc)

    def _session_started(self, client: discord.Client) -> None:
        """READY: nothing is replayed into a new session, so its backfill must go before any live message."""
        if client is self._client:
            self._backfill_owed = True
            if self._held is None:
                self._held = []

    def _connected(self, client: discord.Client, *, new_session: bool) -> None:
        if client is not self._client:
            return
        self._set_state(AdapterState.CONNECTED)
        if new_session:
            self._backfill_owed = False
        elif self._backfill_owed:
            return  # resumed before the new session's on_ready: that one catches up
        backfill = new_session and self.settings.backfill_window > 0
        if self._catching_up is not None and not self._catching_up.done():
            # The running catch-up releases what is held when it ends; a new session backfills once more.
            self._backfill_again = self._backfill_again or backfill
            return
        task = self._catching_up = asyncio.create_task(self._catch_up(client, backfill), name="discord-catch-up")
        self._backfills.add(task)
        task.add_done_callback(self._backfill_done)

    def _disconnected(self, client: discord.Client) -> None:
        if client is not self._client:
            return
        if self._held is None:
            self._held = []  # the next session's backfill, or the resume's replay, goes first
        if self._state != AdapterState.FAILED:
            self._set_state(AdapterState.DISCONNECTED, "discord: gateway connection lost; reconnecting")

    async def _catch_up(self, client: discord.Client, backfill: bool) -> None:
        """Backfill (a new session), then hand over the live messages held back meanwhile, in order.

        A session that starts meanwhile (a resume, or a new IDENTIFY) does not cut in: its replayed or
        live messages wait in the same hold, and a new session's backfill runs here once more."""
        while client is self._client:
            self._backfill_again = False
            if backfill:
                await self._backfill(client)
            while self._held and client is self._client and not self._backfill_again:
                await self._handle(self._held.pop(0), client.user)
            if not self._backfill_again:
                break
            backfill = True
        if client is self._client and not self._held:
            self._held = None

    def _drop_held(self) -> None:
        """Receiving stops before the catch-up ended: a later backfill fetches the held messages, in order
        (their channels are followed from just before them)."""
        for message in self._held or ():
            if self._cursors.follow(message.channel.id, message.id, message.guild is None):
                self._cursors_dirty.set()
        self._held = None

    async def _live(self, client: discord.Client, message: discord.Message) -> None:
        """A message from the gateway: handed over now, or held while catching up."""
        if client is self._client and self._held is not None and len(self._held) < _MAX_HELD:
            self._held.append(message)
            return
        await self._handle(message, client.user)

    def _backfill_done(self, task: asyncio.Task[None]) -> None:
        self._backfills.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("discord: backfill failed", exc_info=task.exception())

    # -- inbound ---------------------------------------------------------

    async def _handle(self, message: discord.Message, me: discord.ClientUser | None) -> None:
        """One gateway or backfilled message: normalize, hand over, remember how far this channel got."""
        on_message = self._on_message
        if on_message is None or me is None:
            return
        event = self._event_for(message, me)
        async with self._intake:  # one at a time, in arrival order
            if event is not None:
                try:
                    await on_message(event)
                except Exception:
                    logger.exception("discord: could not hand over message %s in channel %s",
                                     message.id, message.channel.id)
                    return
            if self._cursors.note(message.channel.id, message.id, message.guild is None, track=event is not None):
                self._cursors_dirty.set()

    def _event_for(self, message: discord.Message, me: discord.ClientUser) -> MessageEvent | None:
        """The event for a message addressed to the bot, or None (bots, system messages, not addressed)."""
        if message.author.bot or message.author.id == me.id or message.type not in _HANDLED_TYPES:
            return None
        channel = message.channel
        mentioned = me.id in message.raw_mentions or any(u.id == me.id for u in message.mentions)
        replied = self._replies_to(message, me)
        place = self._place(channel, message.guild.id if message.guild is not None else None)
        if place is None:
            return None
        chat_type, chat_id, thread_id, metadata = place
        if chat_type == "group" and self.settings.respond_in_guilds == "mention" and not (mentioned or replied):
            return None
        attachments = tuple(
            Attachment(kind=_attachment_kind(a), file_id=str(a.id), name=a.filename, mime_type=a.content_type,
                       size=a.size, url=a.url) for a in message.attachments)
        text = re.sub(rf"^\s*<@!?{me.id}>\s*", "", message.content)  # attachments alone: "" (the run describes them)
        reference = message.reference.message_id if message.reference else None
        return MessageEvent(
            platform=self.name, event_id=str(message.id), chat_id=chat_id, chat_type=chat_type,
            user_id=str(message.author.id), user_name=message.author.display_name, text=text,
            message_id=str(message.id), thread_id=thread_id,
            reply_to_message_id=str(reference) if reference else None, mentions_bot=mentioned or replied,
            attachments=attachments, received_at=message.created_at.astimezone(UTC), metadata=metadata)

    def _place(self, channel: Any, guild_id: int | None) -> tuple[ChatType, str, str | None, dict[str, str]] | None:
        """(chat type, chat id, thread id, metadata) of an event in ``channel``, or None where the guild filters
        refuse it (counted as rejected)."""
        metadata = {"channel_id": str(channel.id)}
        if guild_id is None:
            return "dm", str(channel.id), None, metadata
        metadata["guild_id"] = str(guild_id)
        parent = channel.parent_id if isinstance(channel, discord.Thread) else None
        chat_id = str(parent or channel.id)
        thread_id = str(channel.id) if parent else None
        s = self.settings
        if s.allowed_guilds and str(guild_id) not in s.allowed_guilds:
            self._rejected("guild_not_allowed")
            return None
        if s.allowed_channels and chat_id not in s.allowed_channels and thread_id not in s.allowed_channels:
            self._rejected("channel_not_allowed")
            return None
        return "group", chat_id, thread_id, metadata

    async def _interaction(self, interaction: discord.Interaction) -> None:
        """A button press or a slash command: acknowledged at once (Discord allows 3 s), then handed over like a
        message in that channel; a refused command's "thinking..." response is taken away, and a user whose
        interaction the gateway could not take (closing, or failing) is told to try again.

        Handled in the client's ``on_interaction`` rather than by persistent views or a CommandTree dispatching
        to callbacks: presses on buttons sent before a restart or by another replica, and invocations of a menu
        published earlier, must all be acknowledged and handed over, and the client publishing the menu (the
        REST one) is not the one receiving. Discord never redelivers an interaction, so one whose
        acknowledgement failed (the user sees "interaction failed" and may try again) is not handed over.
        """
        on_message = self._on_message
        command = interaction.type is discord.InteractionType.application_command
        if on_message is None or not (command or interaction.type is discord.InteractionType.component):
            return
        if not await self._interactions.acknowledge(interaction, self._request_timeout):
            return
        said = await self._interactions.read(interaction)
        place = self._place(interaction.channel, interaction.guild_id) if said and interaction.channel else None
        accepted, failed = None, None
        if said is not None and place is not None:
            chat_type, chat_id, thread_id, where = place
            event = MessageEvent(
                platform=self.name, event_id=said.event_id, chat_id=chat_id, chat_type=chat_type,
                user_id=str(interaction.user.id), user_name=interaction.user.display_name, text=said.text,
                message_id=said.message_id, thread_id=thread_id, mentions_bot=True,
                received_at=interaction.created_at.astimezone(UTC), metadata={**said.metadata, **where})
            async with self._intake:
                try:
                    accepted = await on_message(event)
                except GatewayClosing:
                    logger.warning("discord: interaction %s arrived while the gateway was closing; it is lost "
                                   "(Discord does not deliver it again), the user is asked to try again",
                                   interaction.id)
                    failed = "closing"
                except Exception:
                    logger.exception("discord: could not hand over interaction %s in channel %s", interaction.id,
                                     interaction.channel_id)
                    failed = "failed"
        if failed is not None:
            await self._interactions.tell(interaction, failed, self._request_timeout)
        elif command and accepted is None:
            await self._interactions.withdraw(interaction, self._request_timeout)

    @staticmethod
    def _replies_to(message: discord.Message, me: discord.ClientUser) -> bool:
        ref = message.reference
        if ref is None:
            return False
        replied = ref.resolved if isinstance(ref.resolved, discord.Message) else ref.cached_message
        return replied is not None and replied.author.id == me.id

    async def _backfill(self, client: discord.Client) -> None:
        """Feed what arrived while no session was listening: newer than each channel's cursor, within the window.

        Stops before the next message once ``client`` no longer receives (its cursors stay where they are).
        """
        oldest = discord.utils.time_snowflake(datetime.now(UTC) - timedelta(seconds=self.settings.backfill_window))
        fed = 0
        for channel_id, last, dm in self._cursors.items():
            if client is not self._client:
                return
            channel: Any = (client.get_partial_messageable(channel_id, type=discord.ChannelType.private) if dm
                            else client.get_channel(channel_id))
            if channel is None:
                continue  # a guild channel this session cannot see (left, deleted, or its guild unavailable)
            try:
                missed = await asyncio.wait_for(self._missed(channel, max(last, oldest)), self._request_timeout)
            except (discord.HTTPException, *NETWORK_ERRORS) as exc:
                logger.warning("discord: backfill of channel %s failed: %r", channel_id, exc)
                continue
            for message in missed:  # outside the timeout: a hand-over is never cut off halfway
                if client is not self._client:
                    return
                await self._handle(message, client.user)
                fed += 1
        if fed:
            logger.info("discord: backfilled %d messages", fed)

    @staticmethod
    async def _missed(channel: discord.abc.Messageable, after: int) -> list[discord.Message]:
        # every page: the backfill window bounds how far back this reaches
        return [m async for m in channel.history(limit=None, after=discord.Object(after), oldest_first=True)]

    async def _flush_cursors(self) -> None:
        while True:
            await self._cursors_dirty.wait()
            self._cursors_dirty.clear()
            await self._cursors.save()
            await asyncio.sleep(_CURSOR_FLUSH_INTERVAL)

    # -- outbound --------------------------------------------------------

    def _channel(self, chat_id: str, metadata: Mapping[str, str] | None) -> discord.PartialMessageable | SendResult:
        client = self._rest
        if client is None:
            return SendResult(success=False, error="discord: not connected",
                              retryable=self._state != AdapterState.FAILED)
        target = _snowflake((metadata or {}).get("thread_id")) or _snowflake(chat_id)
        if target is None:
            return SendResult(success=False, error=f"discord: {chat_id!r} is not a channel id")
        return client.get_partial_messageable(target)

    async def send(self, chat_id: str, content: str, reply_to: str | None = None,
                   metadata: Mapping[str, str] | None = None) -> SendResult:
        """Post one message (to the thread when metadata names one), replying to ``reply_to`` if it still exists;
        a ``reply_to`` of ``interaction:<id>`` answers that slash command (see ``Interactions.answer``)."""
        return await self._post(chat_id, content, reply_to, metadata, None)

    async def send_choices(self, chat_id: str, content: str, choices: Sequence[Choice], reply_to: str | None = None,
                           metadata: Mapping[str, str] | None = None) -> SendResult:
        """Post one message with a button per choice, as exactly once as ``send`` (same nonce)."""
        try:
            view = await self._interactions.view(choices)
        except Exception as exc:  # the state store could not keep a long choice text: try again later
            return SendResult(success=False, error=f"discord: could not prepare the buttons: {exc!r}", retryable=True)
        return await self._post(chat_id, content, reply_to, metadata, view)

    async def _post(self, chat_id: str, content: str, reply_to: str | None, metadata: Mapping[str, str] | None,
                    view: discord.ui.View | None) -> SendResult:
        channel = self._channel(chat_id, metadata)
        if isinstance(channel, SendResult):
            return channel
        text = to_discord(content)
        reply = _snowflake(reply_to)
        if (iid := interaction_id(reply_to)) is not None and self._rest is not None:
            try:  # answer the slash command; else post in the channel, replying to what this names
                answer = await self._interactions.answer(self._rest, iid, text, view, self._mentions,
                                                         (metadata or {}).get("delivery_id"), self._request_timeout)
            except (discord.RateLimited, discord.HTTPException, *NETWORK_ERRORS) as exc:
                return self._failure(exc, chat_id)
            except Exception as exc:  # the state store: try again later
                return SendResult(success=False, error=f"discord: could not load slash command {iid}: {exc!r}",
                                  retryable=True)
            if isinstance(answer, discord.Message):
                return SendResult(success=True, message_id=str(answer.id))
            reply = answer
        options = self._send_options(channel, reply, metadata)
        if view is not None:
            options["view"] = view
        return await self._request(lambda: channel.send(text, **options), chat_id)

    def _send_options(self, channel: discord.PartialMessageable, reply: int | None,
                      metadata: Mapping[str, str] | None) -> dict[str, Any]:
        """``channel.send`` options of a new message: mentions, the reply, the delivery's nonce."""
        options: dict[str, Any] = {"allowed_mentions": self._mentions}
        if reply is not None:
            options["reference"] = discord.MessageReference(message_id=reply, channel_id=channel.id,
                                                            fail_if_not_exists=False)
        if delivery_id := (metadata or {}).get("delivery_id"):
            options["nonce"] = delivery_nonce(delivery_id)  # discord.py sends it with enforce_nonce
        return options

    async def set_commands(self, commands: Sequence[MenuCommand]) -> None:
        """Publish the slash-command menu (see ``publish_menu``), globally or in each of ``command_guilds``;
        before ``connect``, once logged in. Failures are logged."""
        self._menu = list(commands)
        if self._tree is not None:
            await publish_menu(self._tree, self._menu, self.settings.command_guilds, self._request_timeout)

    async def edit_message(self, chat_id: str, message_id: str, content: str,
                           metadata: Mapping[str, str] | None = None) -> SendResult:
        """Replace the text of a message the bot sent (PATCH), removing its buttons."""
        partial = self._message(chat_id, message_id, metadata)
        if isinstance(partial, SendResult):
            return partial
        return await self._request(lambda: partial.edit(content=to_discord(content), allowed_mentions=self._mentions,
                                                        view=None), chat_id)

    def _message(self, chat_id: str, message_id: str,
                 metadata: Mapping[str, str] | None) -> discord.PartialMessage | SendResult:
        channel = self._channel(chat_id, metadata)
        if isinstance(channel, SendResult):
            return channel
        mid = _snowflake(message_id)
        if mid is None:
            return SendResult(success=False, error=f"discord: {message_id!r} is not a message id")
        return channel.get_partial_message(mid)

    async def delete_message(self, chat_id: str, message_id: str,
                             metadata: Mapping[str, str] | None = None) -> SendResult:
        """Delete a message the bot sent (DELETE /channels/{id}/messages/{mid})."""
        message = self._message(chat_id, message_id, metadata)
        if isinstance(message, SendResult):
            return message
        return await self._request(message.delete, chat_id, message_id)

    async def set_reaction(self, chat_id: str, message_id: str, emoji: str | None, previous: str | None = None,
                           metadata: Mapping[str, str] | None = None) -> SendResult:
        """Add ``emoji`` as the bot's reaction (PUT .../reactions/{emoji}/@me), then remove ``previous`` (DELETE
        .../reactions/{previous}/@me): Discord keeps every reaction until it is removed. A slash command
        (``interaction:<id>``) has no message to react on: nothing to do."""
        if interaction_id(message_id) is not None:
            return SendResult(success=True, message_id=message_id)
        message = self._message(chat_id, message_id, metadata)
        if isinstance(message, SendResult):
            return message
        me = self._rest.user if self._rest is not None else None
        if me is None:
            return SendResult(success=False, error="discord: not logged in", retryable=True)
        result = SendResult(success=True, message_id=message_id)
        if emoji:
            result = await self._request(lambda: message.add_reaction(emoji), chat_id, message_id)
        if result.success and previous and previous != emoji:
            result = await self._request(lambda: message.remove_reaction(previous, me), chat_id, message_id)
        return result

    async def send_typing(self, chat_id: str, metadata: Mapping[str, str] | None = None) -> None:
        """Show "typing..." for about ten seconds (POST /channels/{id}/typing); failures are only logged."""
        channel = self._channel(chat_id, metadata)
        if isinstance(channel, SendResult):
            return
        try:
            await asyncio.wait_for(channel.typing(), self._request_timeout)
        except (discord.HTTPException, *NETWORK_ERRORS) as exc:
            logger.debug("discord: typing in %s failed: %r", chat_id, exc)

    async def _request(self, call: Callable[[], Awaitable[discord.Message | None]], chat_id: str,
                       message_id: str | None = None) -> SendResult:
        """Run one REST call (``message_id``: the message it is about, when it answers none); discord.py's limiter
        waits out 429s up to max_ratelimit_timeout."""
        try:
            message = await asyncio.wait_for(call(), self._request_timeout)
        except (discord.RateLimited, discord.HTTPException, *NETWORK_ERRORS) as exc:
            return self._failure(exc, chat_id)
        return SendResult(success=True, message_id=str(message.id) if message is not None else message_id)

    @staticmethod
    def _failure(exc: Exception, chat_id: str) -> SendResult:
        """The outbox's decision for a failed REST call."""
        if isinstance(exc, discord.RateLimited):  # the wait would exceed max_ratelimit_timeout: the outbox waits
            return SendResult(success=False, error=f"discord: rate limited for {exc.retry_after:.1f} s",
                              retryable=True, retry_after=exc.retry_after)
        if not isinstance(exc, discord.HTTPException):
            return SendResult(success=False, error=f"discord: network error: {exc!r}", retryable=True)
        detail = f"HTTP {exc.status} (code {exc.code}): {exc.text or exc.response.reason}"
        if exc.status == 413:  # an upload over Discord's limit (lower than the cached guild's boosts said)
            return SendResult(success=False, error=f"discord: the file is too large to upload here ({detail})")
        error = f"discord: {detail}"
        if exc.status == 429 or exc.status >= 500:  # 429 here: one discord.py would not wait out (no Via header)
            return SendResult(success=False, error=error, retryable=True)
        if exc.status in (401, 403):
            logger.error("%s in channel %s; check the token and the bot's permissions", error, chat_id)
        return SendResult(success=False, error=error)
