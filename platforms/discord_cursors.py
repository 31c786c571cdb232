"""Discord backfill cursors: the last handled message per channel, kept across restarts (see platforms/discord.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

from platforms.base import PlatformState

__all__ = ["Cursors"]

logger = logging.getLogger(__name__)

_MAX_TRACKED_CHANNELS = 200
_CURSORS_KEY = "discord:backfill-cursors"


class Cursors:
    """The last handled message id per channel the bot talks in, persisted for backfill after a restart:
    in the gateway's store when it provides one (``state``: shared by its replicas), else in ``path``."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self.state: PlatformState | None = None
        self._entries: dict[int, tuple[int, bool]] = {}  # channel id -> (last message id, is a DM)

    async def load(self) -> None:
        if self.state is None and self._path is None:
            return
        try:
            if self.state is not None:
                text = await self.state.load(_CURSORS_KEY)
            else:
                assert self._path is not None
                text = await asyncio.to_thread(self._path.read_text, encoding="utf-8")
            if text is None:
                return
            data = json.loads(text)
            self._entries = {int(cid): (int(e["last"]), bool(e["dm"])) for cid, e in data["channels"].items()}
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            logger.warning("discord: ignoring unreadable backfill state (%s)", exc)

    def follow(self, channel_id: int, before: int, dm: bool) -> bool:
        """Follow a channel not followed yet from just before message ``before``; returns whether it was new."""
        if channel_id in self._entries:
            return False
        return self.note(channel_id, before - 1, dm, track=True)

    def note(self, channel_id: int, message_id: int, dm: bool, *, track: bool) -> bool:
        """Record a handled message; ``track`` starts following the channel. Returns whether anything changed."""
        entry = self._entries.get(channel_id)
        if (entry is None and not track) or (entry is not None and entry[0] >= message_id):
            return False
        self._entries[channel_id] = (message_id, dm)
        if len(self._entries) > _MAX_TRACKED_CHANNELS:
            del self._entries[min(self._entries, key=lambda c: self._entries[c][0])]
        return True

    def items(self) -> list[tuple[int, int, bool]]:
        """(channel id, last message id, is a DM) for every followed channel."""
        return [(cid, last, dm) for cid, (last, dm) in self._entries.items()]

    async def save(self) -> None:
        if self.state is None and self._path is None:
            return
        data = {"channels": {str(cid): {"last": str(last), "dm": dm} for cid, (last, dm) in self._entries.items()}}
        try:
            if self.state is not None:
                await self.state.save(_CURSORS_KEY, json.dumps(data))
            else:
                await asyncio.to_thread(self._write, json.dumps(data))
        except Exception as exc:  # the next save tries again
            logger.warning("discord: could not save backfill state (%s)", exc)

    def _write(self, text: str) -> None:
        assert self._path is not None
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_name(self._path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self._path)
