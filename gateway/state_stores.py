"""Small state stores on the gateway's database: the tools' memory notes and todo lists, the adapters' state."""

from __future__ import annotations

import json
import time

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gateway.schema import insert_ignoring_conflicts, memory_t, platform_state_t, todos_t
from gateway.store import Store, dumps


class ToolStateStore:
    """Memory notes and todo lists for the tools, on the same database."""

    def __init__(self, store: Store) -> None:
        self.db = store.db

    async def add_note(self, user_key: str, text: str) -> tuple[int, float]:
        """Store a note; returns (id, created_at)."""
        now = time.time()
        insert = memory_t.insert().values(user_key=user_key, text=text, created_at=now).returning(memory_t.c.id)
        note_id = await self.db.write(lambda conn: conn.execute(insert).scalar_one())
        return int(note_id), now

    async def list_notes(self, user_key: str) -> list[tuple[int, str, float]]:
        """The user's notes as (id, text, created_at), oldest first."""
        query = sa.select(memory_t.c.id, memory_t.c.text, memory_t.c.created_at).where(
            memory_t.c.user_key == user_key).order_by(memory_t.c.id)
        rows = await self.db.read(lambda conn: conn.execute(query).all())
        return [(int(r.id), r.text, r.created_at) for r in rows]

    async def remove_note(self, user_key: str, note_id: int) -> bool:
        """Delete one of the user's notes."""
        delete = memory_t.delete().where(memory_t.c.user_key == user_key, memory_t.c.id == note_id)
        return bool(await self.db.write(lambda conn: conn.execute(delete).rowcount))

    async def load_todos(self, session_key: str) -> list[dict[str, str]]:
        """The session's todo items as dicts."""
        query = sa.select(todos_t.c["items"]).where(todos_t.c.session_key == session_key)
        row = await self.db.read(lambda conn: conn.execute(query).first())
        return json.loads(row[0]) if row else []

    async def save_todos(self, session_key: str, items: list[dict[str, str]]) -> None:
        """Replace the session's todo items."""
        now = time.time()

        def work(conn: Connection) -> None:
            updated = conn.execute(todos_t.update().where(todos_t.c.session_key == session_key)
                                   .values(items=dumps(items), updated_at=now))
            if updated.rowcount == 0:
                conn.execute(todos_t.insert().values(session_key=session_key, items=dumps(items), updated_at=now))

        await self.db.write(work)


class PlatformStateStore:
    """``platforms.base.PlatformState`` on the gateway's database (shared by its replicas)."""

    def __init__(self, store: Store) -> None:
        self.db = store.db

    async def load(self, key: str) -> str | None:
        """The value saved under ``key``, or None."""
        query = sa.select(platform_state_t.c.value).where(platform_state_t.c.key == key)
        return await self.db.read(lambda conn: conn.execute(query).scalar())

    async def save(self, key: str, value: str) -> None:
        """Replace the value under ``key``."""
        now = time.time()

        def work(conn: Connection) -> None:
            updated = conn.execute(platform_state_t.update().where(platform_state_t.c.key == key)
                                   .values(value=value, updated_at=now))
            if updated.rowcount == 0:
                conn.execute(insert_ignoring_conflicts(conn.dialect.name, platform_state_t, "key"),
                             {"key": key, "value": value, "updated_at": now})

        await self.db.write(work)
