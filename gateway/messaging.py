"""The ``send_message`` tool's backend: which chats a user may address, and sending there through the outbox.

A user (``platform:user_id``) may address, on platforms running in this gateway:

- ``home``: the chat they made their home channel with ``/sethome``;
- ``dm``: their direct chat with the bot on their platform: the chat of their latest stored direct-message session,
  or on Telegram, where a private chat's id is the user's id, that id;
- a target in ``messaging.targets`` that lists them in ``users`` (or ``*``); the admins (``auth.admins``) may use
  every target.

Runs nobody is chatting in send nothing unless allowed: scheduled runs with ``messaging.allow_cron`` (as their
owner), webhook runs with ``messaging.allow_webhooks`` (only to targets listing ``webhook:<route>``).

A message is stored in the outbox like a run's answer (split to the platform's limit, in its chat's order) under
keys made of the run's id and a digest of the target and the text: a run started again after a crash repeats its
tool calls, and the repeated send finds its parts stored and adds none.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping

import sqlalchemy as sa

from gateway.config import Config
from gateway.outbox import OutboxSender
from gateway.schema import sessions_t
from gateway.session_settings import SettingsStore
from gateway.store import OutboxPart, Store
from gateway.tool_state import LoopBridge
from platforms.base import BasePlatformAdapter
from tools.send_message_tool import MessageTarget, MessagingError, Sender, SentMessage, set_messaging_backend

# Platforms where a private chat's id is its user's id (Telegram's Bot API documents it).
_DM_IS_USER_ID = frozenset({"telegram"})


class Messenger:
    """Targets and sends on the gateway's store, outbox and running adapters."""

    def __init__(self, cfg: Config, store: Store, adapters: Mapping[str, BasePlatformAdapter],
                 outbox: OutboxSender) -> None:
        self.cfg = cfg
        self.store = store
        self.adapters = adapters
        self.outbox = outbox
        self.settings = SettingsStore(store)

    def _identity(self, sender: Sender) -> str:
        """Whom target permissions name: the user key; a webhook route's runs are ``webhook:<route>``; raises
        ``MessagingError`` for runs nobody is chatting in that the config does not let send."""
        settings = self.cfg.messaging
        if sender.source == "cron" and not settings.allow_cron:
            raise MessagingError("Scheduled runs may not send messages to other chats here (the operator can allow "
                                 "it with messaging.allow_cron). Your answer still goes to the job's chat.")
        if sender.source == "webhook":
            if not settings.allow_webhooks:
                raise MessagingError("Webhook runs may not send messages to other chats here (the operator can "
                                     "allow it with messaging.allow_webhooks).")
            return sender.user_key.removeprefix("webhook:")  # the event's user id is webhook:<route>
        return sender.user_key

    async def _dm(self, user_key: str) -> MessageTarget | None:
        platform, _, user_id = user_key.partition(":")
        query = (sa.select(sessions_t.c.chat_id)
                 .where(sessions_t.c.platform == platform, sessions_t.c.user_id == user_id,
                        sessions_t.c.key.startswith(f"{platform}:dm:", autoescape=True))
                 .order_by(sessions_t.c.updated_at.desc()).limit(1))
        chat = await self.store.db.read(lambda conn: conn.execute(query).scalar())
        if chat is None and platform in _DM_IS_USER_ID and user_id:
            chat = user_id
        return MessageTarget("dm", platform, chat, None, "your direct chat with me") if chat else None

    async def targets(self, sender: Sender) -> list[MessageTarget]:
        """The chats ``sender`` may address now (on platforms running here)."""
        identity = self._identity(sender)
        found: list[MessageTarget] = []
        if sender.source != "webhook":
            home = await self.settings.home(sender.user_key)
            if home is not None:
                found.append(MessageTarget("home", home.platform, home.chat_id, home.thread_id,
                                           "your home channel (set with /sethome)"))
            if (dm := await self._dm(sender.user_key)) is not None:
                found.append(dm)
        admin = identity in self.cfg.auth.admins
        for name, target in self.cfg.messaging.targets.items():
            # "*" is every user, not a webhook route: a payload's prompt must not reach a target nobody named it for.
            everyone = "*" in target.users and sender.source != "webhook"
            if admin or everyone or identity in target.users:
                found.append(MessageTarget(name, target.platform, target.chat_id, target.thread_id,
                                           target.description))
        return [t for t in found if t.platform in self.adapters]

    async def send(self, sender: Sender, name: str, text: str) -> SentMessage:
        """Store ``text`` for delivery to the target named ``name`` (once per run) and hand it to the outbox."""
        usable = {t.name: t for t in await self.targets(sender)}
        target = usable.get(name)
        if target is None:
            raise MessagingError(self._refusal(name, list(usable)))
        adapter = self.adapters[target.platform]
        chunks = adapter.split(text) or [text]
        digest = hashlib.sha256("\n".join((target.platform, target.chat_id, target.thread_id or "", text))
                                .encode()).hexdigest()[:32]
        # A platform that does not keep a chat's order gets the parts in a lane of their own, as a run's answer does.
        lane = None if adapter.ordered_per_chat else f"{target.platform}:{target.chat_id}:{sender.run_id}"
        parts = [OutboxPart(f"msg:{sender.run_id}:{digest}:{i}", target.platform, target.chat_id, chunk,
                            target.thread_id, part_index=i, parts_total=len(chunks), run_id=sender.run_id, lane=lane)
                 for i, chunk in enumerate(chunks)]
        stored = await self.store.enqueue(parts, claim=self.outbox.claim)
        if stored:
            self.outbox.submit(stored)
        return SentMessage(target, len(chunks), repeated=stored is None)

    def _refusal(self, name: str, usable: list[str]) -> str:
        choices = f"You may send to: {', '.join(usable)}." if usable else "There is no chat you may send to here."
        if name in self.cfg.messaging.targets:
            return (f"You may not send to {name!r}: only the admins and the users its configuration lists "
                    f"(messaging.targets.{name}.users) may, on a platform running here. {choices}")
        if name == "home":
            return f"You have no home channel here; make a chat your home with /sethome there. {choices}"
        if name == "dm":
            return f"I know no direct chat with you on this platform; write to me directly once. {choices}"
        return f"No target named {name!r}. {choices}"


class StoreMessagingBackend(LoopBridge[Messenger]):
    """``MessagingBackend`` on the gateway's store and outbox."""

    def targets(self, sender: Sender) -> list[MessageTarget]:
        """The chats ``sender`` may address."""
        return self._call(self.state.targets(sender))

    def send(self, sender: Sender, target: str, text: str) -> SentMessage:
        """Send ``text`` to the named target."""
        return self._call(self.state.send(sender, target, text))


def install_messaging(cfg: Config, store: Store, adapters: Mapping[str, BasePlatformAdapter], outbox: OutboxSender,
                      loop: asyncio.AbstractEventLoop) -> None:
    """Point the ``send_message`` tool at the gateway's store, adapters and outbox."""
    set_messaging_backend(StoreMessagingBackend(Messenger(cfg, store, adapters, outbox), loop))
