"""The chaos test's traffic: chat messages on Telegram, Slack and Discord (some with a photo or a document, some
asking for a file back) and signed webhooks, with the retries and duplicates each platform really produces."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import aiohttp

from gateway.sim.discord_api import GENERAL_ID
from gateway.sim.discord_files import AttachmentSpec
from gateway.sim.slack_api import Delivery
from gateway.sim.telegram_api import Origin
from platforms.webhook_signatures import sign, verify
from tests.chaos.world import (
    ASK_FOR_FILE,
    DISCORD_USERS,
    DOCUMENT,
    DOCUMENT_NAME,
    PHOTO,
    SLACK_USERS,
    TELEGRAM_USERS,
    WEBHOOK_ROUTES,
    World,
)

PLATFORMS = ("telegram", "slack", "discord", "webhook")
CHATS = ("telegram", "slack", "discord")
MEDIA_SHARE = 0.15  # of chat messages: a photo or a document with the message as its caption
FILE_SHARE = 0.1  # of chat messages: ask for a file, which the answer sends


class _Attached(NamedTuple):
    data: bytes
    name: str
    mime: str


_MEDIA = {"photo": _Attached(PHOTO, "photo.jpg", "image/jpeg"),
          "document": _Attached(DOCUMENT, DOCUMENT_NAME, "application/pdf")}
_PREFIX = {"telegram": "tg", "slack": "sl", "discord": "dc", "webhook": "wh"}
_WEBHOOK_TIMEOUT = aiohttp.ClientTimeout(total=5)


@dataclass(slots=True)
class Input:
    """One message the driver sent: how the gateway's inbox names it and where its answer must appear."""

    seq: int
    platform: str
    token: str
    dedupe_key: str
    reply_platform: str
    reply_chat: str
    run_id: str | None = None  # webhooks: the run id the gateway answered with
    sent_at: float = field(default_factory=time.time)
    media: str | None = None  # "photo" or "document": what the message carries
    wants_file: bool = False  # the message asks for a file: its answer sends one


@dataclass(slots=True)
class Offered:
    """Repeats the driver offered on purpose (the platforms add their own after each kill)."""

    slack_retries: int = 0
    discord_reconnects: int = 0
    webhook_repeats: int = 0
    webhook_retries: int = 0


class Driver:
    """Plays the users and the webhook senders; every input it sends is recorded in ``inputs``."""

    def __init__(self, world: World, rng: random.Random) -> None:
        self.world = world
        self.rng = rng
        self.inputs: list[Input] = []
        self.offered = Offered()
        self.problems: list[str] = []  # answers no platform client would accept (seen by the webhook sender)
        self._seq = itertools.count(1)
        self._slack: list[Delivery] = []
        self._webhooks: list[tuple[Input, str, bytes, str]] = []  # accepted: input, route, body, delivery id
        self._tasks: set[asyncio.Task[None]] = set()

    async def send(self, platform: str | None = None, *, wants_file: bool | None = None) -> Input:
        """Send one new message on ``platform`` (random if None); a chat message carries a photo or a document,
        and asks for a file back, at random unless ``wants_file`` says."""
        platform = platform or self.rng.choice(PLATFORMS)
        seq = next(self._seq)
        token = f"{_PREFIX[platform]}-{seq:05d}"
        if platform == "webhook":
            inp = self._webhook(seq, token)
        else:
            media = self.rng.choice(sorted(_MEDIA)) if self.rng.random() < MEDIA_SHARE else None
            wants_file = self.rng.random() < FILE_SHARE if wants_file is None else wants_file
            text = f"msg {token} {ASK_FOR_FILE}" if wants_file else f"msg {token}"
            if platform == "telegram":
                inp = self._telegram(seq, token, text, media)
            elif platform == "slack":
                inp = await self._slack_message(seq, token, text, media)
            else:
                inp = self._discord(seq, token, text, media)
            inp.media, inp.wants_file = media, wants_file
        self.inputs.append(inp)
        return inp

    async def burst(self, n: int, platform: str | None = None, *, wants_file: bool | None = None) -> None:
        """``n`` messages at once."""
        for _ in range(n):
            await self.send(platform, wants_file=wants_file)

    async def warm_up(self) -> list[Input]:
        """One message in each Discord chat, so the gateway follows them (and backfills them after a restart),
        and one on every other platform."""
        inputs = []
        for user in DISCORD_USERS:
            for dm in (True, False):
                seq = next(self._seq)
                inputs.append(self._discord(seq, f"dc-{seq:05d}", f"msg dc-{seq:05d}", None, user, dm))
        self.inputs.extend(inputs)
        for platform in ("telegram", "slack", "webhook"):
            inputs.append(await self.send(platform))
        return inputs

    async def offer_duplicate(self) -> None:
        """Offer something again: a Slack retry of an event, a Discord RESUME replay, a webhook redelivery."""
        kind = self.rng.choice(("slack", "discord", "webhook"))
        if kind == "slack" and self._slack:
            await self.world.slack.redeliver(self.rng.choice(self._slack[-50:]), "timeout")
            self.offered.slack_retries += 1
        elif kind == "discord":
            # op 7: discord.py reconnects and RESUMEs; the simulator replays events it already delivered
            if self.world.discord.send_reconnect():
                self.offered.discord_reconnects += 1
        elif self._webhooks:
            inp, route, body, delivery_id = self.rng.choice(self._webhooks[-50:])
            self.offered.webhook_repeats += 1
            self._spawn(self._post_until_accepted(inp, route, body, delivery_id, repeat=True))

    async def run(self, stop: asyncio.Event, gap: tuple[float, float] = (0.05, 0.15)) -> None:
        """Steady traffic until ``stop``: mostly new messages, sometimes a repeat."""
        while not stop.is_set():
            if self.rng.random() < 0.08:
                await self.offer_duplicate()
            else:
                await self.send()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rng.uniform(*gap))

    async def settle(self, timeout: float) -> list[Input]:
        """Wait until every webhook sender got its 2xx; returns the inputs still not accepted at the timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._tasks and (left := deadline - loop.time()) > 0:
            await asyncio.wait(set(self._tasks), timeout=left)  # a sender may spawn a redelivery meanwhile
        for task in list(self._tasks):
            task.cancel()
        return [i for i in self.inputs if i.platform == "webhook" and i.run_id is None]

    # -- platforms ---------------------------------------------------------------------------------

    def _telegram(self, seq: int, token: str, text: str, media: str | None) -> Input:
        sim = self.world.telegram
        user = self.rng.choice(TELEGRAM_USERS)
        who: Origin = {"user_id": user, "first_name": f"User{user}", "username": f"user{user}"}
        if self.rng.random() < 0.25:
            text, who["chat_type"] = f"@{sim.bot_user['username']} {text}", "group"
        attached = _MEDIA.get(media or "")
        if attached is None:
            update = sim.user_sends(text, **who)
        elif media == "photo":
            update = sim.user_sends_photo(attached.data, text, **who)
        else:
            update = sim.user_sends_document(attached.data, attached.name, attached.mime, text, **who)
        chat = update["message"]["chat"]["id"]
        return Input(seq, "telegram", token, f"telegram:{update['update_id']}", "telegram", str(chat))

    async def _slack_message(self, seq: int, token: str, text: str, media: str | None) -> Input:
        sim = self.world.slack
        user = self.rng.choice(SLACK_USERS)
        attached = _MEDIA.get(media or "")
        files = [sim.user_file(attached.name, attached.data, attached.mime, user=user)] if attached else []
        if self.rng.random() < 0.25:
            action = await sim.user_mentions_bot(text, user=user, files=files)  # answered in a thread of the channel
        else:
            action = await sim.user_sends_dm(text, user=user, files=files)
        delivery = action.delivery  # app_mention for a mention; the message event for it is not answered
        self._slack.append(delivery)
        assert action.message is not None
        return Input(seq, "slack", token, f"slack:{delivery.event_id}", "slack", action.message.channel)

    def _discord(self, seq: int, token: str, text: str, media: str | None, user: int | None = None,
                 dm: bool | None = None) -> Input:
        sim = self.world.discord
        user = user if user is not None else self.rng.choice(DISCORD_USERS)
        dm = dm if dm is not None else self.rng.random() >= 0.3
        attached = _MEDIA.get(media or "")
        files = [AttachmentSpec(attached.name, attached.mime, data=attached.data)] if attached else []
        if dm:
            message = sim.user_sends_dm(text, user_id=user, attachments=files)
        else:
            message = sim.user_sends(text, channel_id=GENERAL_ID, user_id=user, mention_bot=True, attachments=files)
        return Input(seq, "discord", token, f"discord:{message['id']}", "discord", str(message["channel_id"]))

    def _webhook(self, seq: int, token: str) -> Input:
        route = self.rng.choice(sorted(WEBHOOK_ROUTES))
        scheme = WEBHOOK_ROUTES[route][0]
        delivery_id = str(uuid.UUID(int=self.rng.getrandbits(128)))
        if scheme == "standard-webhooks":
            delivery_id = f"msg_{delivery_id.replace('-', '')}"
        body = json.dumps({"token": token, "ref": "refs/heads/main"}).encode()
        secret = WEBHOOK_ROUTES[route][1]
        # The inbox's key as the verifier gives it (GitHub: its delivery id; replayed bodies are caught apart).
        key = verify(scheme, secret, body, sign(scheme, secret, body, delivery_id=delivery_id)).key
        inp = Input(seq, "webhook", token, f"webhook:{route}:{key}", "callback", "sink")
        self._spawn(self._post_until_accepted(inp, route, body, delivery_id, repeat=False))
        return inp

    async def _post_until_accepted(self, inp: Input, route: str, body: bytes, delivery_id: str, *,
                                   repeat: bool) -> None:
        """POST the delivery until it is acknowledged (202, or 200 for a repeat), as GitHub does: a connection
        error or any other status means "not accepted", and the same delivery is sent again."""
        scheme, secret = WEBHOOK_ROUTES[route]
        backoff = 0.1
        while True:
            gateway = self.world.gateway
            answer: tuple[int, dict[str, str]] | None = None
            if gateway is not None and gateway.port:
                headers = {"Content-Type": "application/json", "X-GitHub-Event": "push",
                           **sign(scheme, secret, body, delivery_id=delivery_id)}
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with self.world.http.post(f"{gateway.url}/webhooks/{route}", data=body, headers=headers,
                                                    timeout=_WEBHOOK_TIMEOUT) as r:
                        answer = (r.status, await r.json(content_type=None) if r.status in (200, 202) else {})
            if answer is not None and answer[0] in (200, 202):
                self._accepted(inp, route, body, delivery_id, answer[0], answer[1].get("run_id"), repeat)
                return
            self.offered.webhook_retries += 1
            await asyncio.sleep(backoff * self.rng.uniform(0.5, 1.0))  # the sender's retry backoff
            backoff = min(backoff * 2, 1.0)

    def _accepted(self, inp: Input, route: str, body: bytes, delivery_id: str, status: int, run_id: str | None,
                  repeat: bool) -> None:
        if repeat and status == 202:
            self.problems.append(f"webhook {inp.token}: a repeat of delivery {delivery_id} was accepted as new (202)")
        if inp.run_id is None:
            inp.run_id = run_id
            self._webhooks.append((inp, route, body, delivery_id))
            if self.rng.random() < 0.15:  # the sender redelivers it later (GitHub's "Redeliver")
                self.offered.webhook_repeats += 1
                self._spawn(self._redeliver_later(self.rng.uniform(0.2, 2.0), inp, route, body, delivery_id))
        elif run_id != inp.run_id:
            self.problems.append(f"webhook {inp.token}: delivery {delivery_id} answered with run {run_id}, "
                                 f"first with run {inp.run_id}")

    async def _redeliver_later(self, delay: float, inp: Input, route: str, body: bytes, delivery_id: str) -> None:
        await asyncio.sleep(delay)  # when the sender chooses to redeliver, not a wait for the gateway
        await self._post_until_accepted(inp, route, body, delivery_id, repeat=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
