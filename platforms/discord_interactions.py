"""Discord's native interactivity for the adapter in platforms/discord.py: choice buttons, the slash-command menu,
and the interaction tokens that let a reply answer a slash command, kept where a restart finds them.

A button's ``custom_id`` carries what a press sends: ``hermes:<text>`` when that fits Discord's 100 characters,
else ``hermes#<digest>``, whose text is saved in the adapter's state under the digest before the message goes
out (and, without a state store or should the entry be gone, recovered from the pressed button's label).

A slash command is answered by editing its deferred response (``PATCH /webhooks/{app}/{token}/messages/@original``);
the token that takes, valid 15 minutes, is saved per interaction in the adapter's state (or, without a state
store, kept in memory) and never logged. At DEBUG discord.py logs the gateway's events and the webhook
adapter's URLs, tokens included: a filter on those loggers blanks them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import aiohttp
import discord
from discord import app_commands

from platforms.base import Choice, MenuCommand, PlatformState

__all__ = ["INTERACTION_PREFIX", "NETWORK_ERRORS", "Interactions", "PendingCommand", "Said", "interaction_id",
           "publish_menu", "slash_commands"]

logger = logging.getLogger(__name__)

NETWORK_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)
"""What a request to Discord raises when the network, not Discord, failed."""

INTERACTION_PREFIX = "interaction:"
"""``MessageEvent.message_id`` of a slash command: ``send(reply_to=...)`` with it answers the command."""
_CHOICE_PREFIX = "hermes:"
_TOKEN_PREFIX = "hermes#"
_CHOICE_KEY = "discord:choice:"
_INTERACTION_KEY = "discord:interaction:"
_MAX_CUSTOM_ID = 100
_MAX_LABEL = 80
_MAX_DESCRIPTION = 100
_TOKEN_LIFETIME = timedelta(minutes=15)
_MAX_MEMORY = 10_000  # choice texts and interactions kept in memory (all of them without a state store)
_STYLES = {"primary": discord.ButtonStyle.primary, "danger": discord.ButtonStyle.danger,
           "default": discord.ButtonStyle.secondary}
_NOTES = {("closing", False): "The gateway is restarting; press again in a moment.",
          ("failed", False): "That press could not be taken; press again in a moment.",
          ("closing", True): "The gateway is restarting; run the command again in a moment.",
          ("failed", True): "That command could not be taken; run it again in a moment."}
_TOKENS = re.compile(r"(/(?:webhooks|interactions)/\d+/|['\"]token['\"]:\s*['\"])[^/?\s'\"]+")
"""A token in a webhook or interaction URL, or as the ``token`` of a logged payload (an INTERACTION_CREATE)."""


class _BlankTokens(logging.Filter):
    """Blanks tokens in what discord.py logs: gateway events (interactions carry theirs) and webhook URLs."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if _TOKENS.search(message):
            record.msg, record.args = _TOKENS.sub(r"\1***", message), None
        return True


for _logger in ("discord.gateway", "discord.webhook.async_"):
    logging.getLogger(_logger).addFilter(_BlankTokens())


def interaction_id(message_id: str | None) -> int | None:
    """The interaction id in a message id of the form ``interaction:<id>``, else None."""
    if not message_id or not message_id.startswith(INTERACTION_PREFIX):
        return None
    value = message_id[len(INTERACTION_PREFIX):]
    return int(value) if value.isdigit() else None


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@app_commands.describe(args="the rest of the command line")
async def _menu_entry(interaction: discord.Interaction, args: str | None = None) -> None:
    """Never called: discord.py defines a command by its callback's signature (here one optional string option,
    ``args``), but invocations reach the adapter's ``on_interaction`` (see ``DiscordAdapter._interaction``)."""


def slash_commands(commands: Sequence[MenuCommand]) -> list[app_commands.Command[Any, ..., None]]:
    """One chat-input command per menu entry (description cut to Discord's 100 characters); names Discord
    refuses (1-32 lower-case letters, digits, ``-`` or ``_``) and repeated names are skipped and logged."""
    built: dict[str, app_commands.Command[Any, ..., None]] = {}
    for entry in commands:
        if entry.name in built:
            logger.warning("discord: slash command %r is listed twice; keeping the first", entry.name)
            continue
        try:
            built[entry.name] = app_commands.Command(name=entry.name, callback=_menu_entry,
                                                     description=_cut(entry.description.strip() or entry.name,
                                                                      _MAX_DESCRIPTION))
        except ValueError as exc:
            logger.warning("discord: skipping slash command %r: %s", entry.name, exc)
    return list(built.values())


async def publish_menu(tree: app_commands.CommandTree[Any], commands: Sequence[MenuCommand],
                       guild_ids: Sequence[str], timeout: float) -> None:
    """Register ``slash_commands(commands)`` through ``tree`` (a bulk overwrite: commands no longer listed go),
    in each of ``guild_ids`` or, without any, globally. Failures are logged."""
    menu = slash_commands(commands)
    for guild in [discord.Object(int(g)) for g in guild_ids] or [None]:
        tree.clear_commands(guild=guild)
        for command in menu:
            try:
                tree.add_command(command, guild=guild)
            except app_commands.AppCommandError as exc:  # beyond Discord's 100 commands
                logger.warning("discord: skipping slash command %r: %s", command.name, exc)
        where = f"in guild {guild.id}" if guild is not None else "globally"
        try:
            synced = await asyncio.wait_for(tree.sync(guild=guild), timeout)
        except (discord.HTTPException, discord.RateLimited, *NETWORK_ERRORS) as exc:
            logger.error("discord: could not register the slash commands %s: %r", where, exc)
            continue
        logger.info("discord: registered %d slash commands %s", len(synced), where)


@dataclass(frozen=True, slots=True)
class Said:
    """What an interaction says, for the adapter to place in its chat: the event's id, text, message id and
    metadata."""

    event_id: str
    text: str
    message_id: str | None
    metadata: dict[str, str]


@dataclass(slots=True)
class PendingCommand:
    """A slash command the bot may still answer through its token (rebuilt on the REST client)."""

    interaction: discord.Interaction
    answered_by: str | None
    """The delivery that replaced the deferred response already (None: not yet)."""
    message_id: int | None
    """The response message, once answered."""

    def answers(self, delivery_id: str | None) -> bool:
        """Whether a part of ``delivery_id`` should edit @original: nothing did yet, or this delivery (a retry)."""
        return self.answered_by is None or (delivery_id is not None and self.answered_by == delivery_id)


class Interactions:
    """Choice texts and slash-command tokens of one adapter, in its state store (``state``) when it has one."""

    def __init__(self) -> None:
        self.state: PlatformState | None = None
        self._choices: dict[str, str] = {}
        self._commands: dict[int, dict[str, Any]] = {}

    # -- buttons -----------------------------------------------------------

    async def view(self, choices: Sequence[Choice]) -> discord.ui.View:
        """The buttons for ``choices`` (rows of five), each style mapped, texts too long for a custom id saved."""
        view = discord.ui.View(timeout=None)
        taken: set[str] = set()
        for index, choice in enumerate(choices):
            custom_id = _CHOICE_PREFIX + choice.text
            if len(custom_id) > _MAX_CUSTOM_ID or custom_id in taken:
                digest = hashlib.blake2b(f"{index}\n{choice.text}".encode(), digest_size=16).hexdigest()
                await self._keep_choice(digest, choice.text)
                custom_id = _TOKEN_PREFIX + digest
            taken.add(custom_id)
            view.add_item(discord.ui.Button(label=_cut(choice.label, _MAX_LABEL), custom_id=custom_id,
                                            style=_STYLES.get(choice.style, discord.ButtonStyle.secondary)))
        # Only rendered: the sending client receives no presses, so the view must not wait in its view store.
        view.stop()
        return view

    async def _keep_choice(self, digest: str, text: str) -> None:
        if self._choices.get(digest) == text:
            return
        if self.state is not None:
            await self.state.save(_CHOICE_KEY + digest, text)
        self._choices[digest] = text  # a digest names one text forever: caching it is safe with replicas too
        _trim(self._choices)

    async def pressed_text(self, interaction: discord.Interaction) -> str | None:
        """What the pressed button sends, or None for a component that is not one of ours."""
        custom_id = str((interaction.data or {}).get("custom_id", ""))
        if custom_id.startswith(_CHOICE_PREFIX):
            return custom_id[len(_CHOICE_PREFIX):]
        if not custom_id.startswith(_TOKEN_PREFIX):
            return None
        digest = custom_id[len(_TOKEN_PREFIX):]
        text = self._choices.get(digest)
        if text is None and self.state is not None:
            try:
                text = await self.state.load(_CHOICE_KEY + digest)
            except Exception as exc:  # the label below is the next best thing
                logger.warning("discord: could not load the text of button %s (%r)", custom_id, exc)
        return text or _button_label(interaction.message, custom_id)

    # -- interactions ------------------------------------------------------

    @staticmethod
    async def acknowledge(interaction: discord.Interaction, timeout: float) -> bool:
        """Defer the response: a press with DEFERRED_UPDATE_MESSAGE (6), a command with
        DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE (5, "thinking..."). Returns whether Discord took it."""
        try:
            await asyncio.wait_for(interaction.response.defer(), timeout)
        except (discord.HTTPException, discord.InteractionResponded, *NETWORK_ERRORS) as exc:
            logger.warning("discord: could not acknowledge interaction %s: %r", interaction.id, exc)
            return False
        return True

    async def read(self, interaction: discord.Interaction) -> Said | None:
        """A press: the pressed choice's text; a command (its token kept for the reply): ``/<name> <args>`` with
        message id ``interaction:<id>``. None for a component that is not one of ours."""
        data: Any = interaction.data or {}
        if interaction.type is discord.InteractionType.application_command:
            await self.remember(interaction)
            args = next((str(o.get("value", "")) for o in data.get("options", ()) if o.get("name") == "args"), "")
            return Said(f"command:{interaction.id}", f"/{data.get('name')} {args}".strip(),
                        f"{INTERACTION_PREFIX}{interaction.id}", {})
        text = await self.pressed_text(interaction)
        if text is None or interaction.message is None:
            logger.info("discord: ignoring a press on component %r, not one of ours", data.get("custom_id"))
            return None
        return Said(f"press:{interaction.id}", text, None, {"pressed_message_id": str(interaction.message.id)})

    @staticmethod
    async def tell(interaction: discord.Interaction, why: Literal["closing", "failed"], timeout: float) -> None:
        """Ask the user to try again: the presser in an ephemeral follow-up, a command's invoker in its response
        (a deferred response cannot turn ephemeral). Failures are logged."""
        command = interaction.type is discord.InteractionType.application_command
        note = _NOTES[why, command]
        try:
            if command:
                await asyncio.wait_for(interaction.edit_original_response(content=note), timeout)
            else:
                await asyncio.wait_for(interaction.followup.send(note, ephemeral=True), timeout)
        except (discord.HTTPException, *NETWORK_ERRORS) as exc:
            logger.info("discord: could not ask the user of interaction %s to try again: %r", interaction.id, exc)

    @staticmethod
    async def withdraw(interaction: discord.Interaction, timeout: float) -> None:
        """Delete a deferred response nothing will answer (a refused command); failures are logged."""
        try:
            await asyncio.wait_for(interaction.delete_original_response(), timeout)
        except (discord.HTTPException, *NETWORK_ERRORS) as exc:
            logger.info("discord: could not remove the response to refused command %s: %r", interaction.id, exc)

    async def answer(self, client: discord.Client, iid: int, text: str, view: discord.ui.View | None,
                     mentions: discord.AllowedMentions, delivery_id: str | None,
                     timeout: float) -> discord.Message | int | None:
        """Answer slash command ``iid`` by replacing its deferred response (PATCH .../messages/@original; being
        idempotent, a retried or in-doubt part repeats it) and return the response message. Where a channel
        message should go instead, the message it replies to: None when the command is unknown here or its token
        expired, the earlier answer when another delivery answered it already. Raises discord.py's errors other
        than an expired or unknown token, and the state store's."""
        pending = await self.recall(client, iid)
        if pending is None:
            return None
        if not pending.answers(delivery_id):
            return pending.message_id
        edit = pending.interaction.edit_original_response
        try:
            message = await asyncio.wait_for(edit(content=text, allowed_mentions=mentions, view=view)
                                             if view is not None else edit(content=text, allowed_mentions=mentions),
                                             timeout)
        except discord.HTTPException as exc:
            if exc.status not in (401, 404):
                raise
            logger.info("discord: slash command %s can no longer be answered (HTTP %s); posting in the channel",
                        iid, exc.status)
            return None
        try:
            await self.answered(pending, delivery_id, message.id)
        except Exception as exc:  # a part of another delivery may then edit it once more
            logger.warning("discord: could not record the answer to slash command %s (%r)", iid, exc)
        return message

    # -- slash command tokens ----------------------------------------------

    async def remember(self, interaction: discord.Interaction) -> None:
        """Keep what answering this slash command takes (its token); a failure is logged and the reply then goes
        to the channel."""
        try:
            await self._save(interaction, None, None)
        except Exception as exc:
            logger.warning("discord: could not save slash command %s for its reply (%r); it will be answered in "
                           "the channel", interaction.id, exc)

    async def recall(self, client: discord.Client, iid: int) -> PendingCommand | None:
        """The slash command ``iid`` as the REST ``client`` can answer it, or None (unknown, or its token expired)."""
        if self.state is None:
            record = self._commands.get(iid)
        else:  # not cached: another replica may have answered it since
            text = await self.state.load(_INTERACTION_KEY + str(iid))
            record = json.loads(text) if text else None
        if record is None:
            return None
        # No public constructor rebuilds an interaction from its id and token; this is the one discord.py's own
        # gateway parser uses, on the REST client's state, so edit_original_response works after a restart.
        interaction = discord.Interaction(data=record, state=client._connection)  # type: ignore[arg-type]
        if interaction.is_expired():
            return None
        message_id = record.get("message_id")
        return PendingCommand(interaction, record.get("answered_by"), int(message_id) if message_id else None)

    async def answered(self, pending: PendingCommand, delivery_id: str | None, message_id: int) -> None:
        """Record that ``delivery_id`` replaced the deferred response with message ``message_id``."""
        await self._save(pending.interaction, delivery_id or "", message_id)

    async def _save(self, interaction: discord.Interaction, answered_by: str | None, message_id: int | None) -> None:
        record = {"id": str(interaction.id), "type": interaction.type.value, "token": interaction.token,
                  "version": interaction.version, "application_id": str(interaction.application_id),
                  "attachment_size_limit": interaction.filesize_limit, "answered_by": answered_by,
                  "message_id": None if message_id is None else str(message_id)}
        if self.state is not None:
            await self.state.save(_INTERACTION_KEY + str(interaction.id), json.dumps(record))
            return
        self._commands[interaction.id] = record
        oldest = discord.utils.time_snowflake(datetime.now(UTC) - _TOKEN_LIFETIME)
        for stale in [i for i in self._commands if i < oldest]:
            del self._commands[stale]
        _trim(self._commands)


def _trim(cache: dict[Any, Any]) -> None:
    while len(cache) > _MAX_MEMORY:
        del cache[next(iter(cache))]


def _button_label(message: discord.Message | None, custom_id: str) -> str | None:
    for row in message.components if message is not None else ():
        for item in getattr(row, "children", ()):
            if isinstance(item, discord.Button) and item.custom_id == custom_id:
                return item.label
    return None
