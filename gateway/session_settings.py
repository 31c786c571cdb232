"""What a chat changed about its session and its user with commands: model, title, busy mode, tool progress
(per session), spoken answers (/voice) and the home channel (per user). Unset values fall back to the configuration."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gateway.schema import insert_ignoring_conflicts, session_settings_t, user_settings_t
from gateway.store import Store

SESSION_FIELDS = ("model", "title", "busy", "verbose", "voice")


@dataclass(slots=True, frozen=True)
class SessionSettings:
    """A session's own choices; None means the configured default."""

    model: str | None = None
    title: str | None = None
    busy: str | None = None
    verbose: str | None = None
    voice: str | None = None


@dataclass(slots=True, frozen=True)
class HomeChannel:
    """Where a user's notifications without a target go."""

    platform: str
    chat_id: str
    thread_id: str | None = None


def _upsert(conn: Connection, table: sa.Table, key_column: str, key: str, values: dict[str, Any]) -> None:
    now = time.time()
    updated = conn.execute(table.update().where(table.c[key_column] == key).values(**values, updated_at=now))
    if updated.rowcount == 0:
        conn.execute(insert_ignoring_conflicts(conn.dialect.name, table, key_column),
                     {key_column: key, **values, "updated_at": now})


def clear_title(conn: Connection, key: str) -> None:
    """Forget the session's title (its conversation starts over with ``/new``)."""
    conn.execute(session_settings_t.update().where(session_settings_t.c.session_key == key)
                 .values(title=None, updated_at=time.time()))


class SettingsStore:
    """Session and user settings on the gateway's database."""

    def __init__(self, store: Store) -> None:
        self.db = store.db

    async def session(self, session_key: str) -> SessionSettings:
        """The session's settings (all None when it never changed any)."""
        query = sa.select(*(session_settings_t.c[f] for f in SESSION_FIELDS)).where(
            session_settings_t.c.session_key == session_key)
        row = await self.db.read(lambda conn: conn.execute(query).first())
        return SessionSettings(*row) if row is not None else SessionSettings()

    async def set_session(self, session_key: str, **values: str | None) -> None:
        """Change some of the session's settings (None: back to the default)."""
        unknown = set(values) - set(SESSION_FIELDS)
        if unknown:
            raise ValueError(f"unknown session settings: {', '.join(sorted(unknown))}")
        await self.db.write(lambda conn: _upsert(conn, session_settings_t, "session_key", session_key, values))

    async def home(self, user_key: str) -> HomeChannel | None:
        """The user's home channel, if they set one with /sethome."""
        query = sa.select(user_settings_t.c.home_platform, user_settings_t.c.home_chat_id,
                          user_settings_t.c.home_thread_id).where(user_settings_t.c.user_key == user_key)
        row = await self.db.read(lambda conn: conn.execute(query).first())
        return HomeChannel(row[0], row[1], row[2]) if row is not None and row[0] else None

    async def set_home(self, user_key: str, home: HomeChannel) -> None:
        """Make ``home`` the user's home channel."""
        values = {"home_platform": home.platform, "home_chat_id": home.chat_id, "home_thread_id": home.thread_id}
        await self.db.write(lambda conn: _upsert(conn, user_settings_t, "user_key", user_key, values))
