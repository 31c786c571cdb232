"""Durable state: sessions, transcripts, inbox, runs, outbox, memory and todos.

SQLAlchemy 2 async Core; portable SQL only (SQLite through aiosqlite by default,
PostgreSQL through asyncpg), so the same code serves both. Times are stored as
UTC unix seconds. Every method that changes state commits before it returns.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1

metadata = sa.MetaData()

sessions_t = sa.Table(
    "sessions", metadata,
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("platform", sa.String(32), nullable=False),
    sa.Column("chat_id", sa.String(255), nullable=False),
    sa.Column("user_id", sa.String(255)),
    sa.Column("thread_id", sa.String(255)),
    sa.Column("epoch", sa.Integer, nullable=False, default=0),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)

messages_t = sa.Table(
    "messages", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("session_key", sa.String(255), nullable=False),
    sa.Column("epoch", sa.Integer, nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("content", sa.Text),
    sa.Column("tool_calls", sa.Text),
    sa.Column("tool_call_id", sa.String(128)),
    sa.Column("run_id", sa.String(64)),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Index("ix_messages_session", "session_key", "epoch", "id"),
)

inbox_t = sa.Table(
    "inbox", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("dedupe_key", sa.String(512), nullable=False, unique=True),
    sa.Column("platform", sa.String(32), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("session_key", sa.String(255), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("run_id", sa.String(64)),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Index("ix_inbox_status", "status", "id"),
)

runs_t = sa.Table(
    "runs", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("source", sa.String(255), nullable=False),
    sa.Column("session_key", sa.String(255), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("toolsets", sa.Text, nullable=False),
    sa.Column("prompt", sa.Text, nullable=False),
    sa.Column("deliver_to", sa.String(512)),
    sa.Column("result", sa.Text),
    sa.Column("error", sa.Text),
    sa.Column("tool_calls", sa.Text),
    sa.Column("model_calls", sa.Integer, nullable=False, default=0),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("started_at", sa.Float),
    sa.Column("finished_at", sa.Float),
    sa.Column("model_seconds", sa.Float),
)

outbox_t = sa.Table(
    "outbox", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("dedupe_key", sa.String(512), nullable=False, unique=True),
    sa.Column("run_id", sa.String(64)),
    sa.Column("platform", sa.String(32), nullable=False),
    sa.Column("chat_id", sa.String(512), nullable=False),
    sa.Column("thread_id", sa.String(255)),
    sa.Column("reply_to", sa.String(255)),
    sa.Column("edit_message_id", sa.String(255)),
    sa.Column("part_index", sa.Integer, nullable=False, default=0),
    sa.Column("parts_total", sa.Integer, nullable=False, default=1),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("next_attempt_at", sa.Float, nullable=False),
    sa.Column("platform_message_id", sa.String(255)),
    sa.Column("last_error", sa.Text),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("sent_at", sa.Float),
    sa.Index("ix_outbox_status", "status", "id"),
)

memory_t = sa.Table(
    "memory", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("user_key", sa.String(255), nullable=False, index=True),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

todos_t = sa.Table(
    "todos", metadata,
    sa.Column("session_key", sa.String(255), primary_key=True),
    sa.Column("items", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)

meta_t = sa.Table(
    "meta", metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)


# -- rows ----------------------------------------------------------------

@dataclass(slots=True)
class InboxRow:
    """An accepted event."""

    id: int
    dedupe_key: str
    platform: str
    kind: str
    session_key: str
    payload: dict[str, Any]
    status: str
    run_id: str | None


@dataclass(slots=True)
class Acceptance:
    """The outcome of offering an event to the inbox."""

    inbox_id: int
    run_id: str | None
    duplicate: bool


@dataclass(slots=True)
class RunRow:
    """One agent run (chat, webhook or cron)."""

    id: str
    kind: str
    source: str
    session_key: str
    status: str
    toolsets: list[str]
    prompt: str
    deliver_to: str | None
    result: str | None
    error: str | None
    tool_calls: list[dict[str, Any]]
    model_calls: int
    attempts: int
    created_at: float
    started_at: float | None
    finished_at: float | None
    model_seconds: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON form for ``GET /runs/{id}`` and the CLI."""
        out: dict[str, Any] = {k: getattr(self, k) for k in self.__slots__}
        if self.started_at is not None and self.finished_at is not None:
            out["duration_seconds"] = round(self.finished_at - self.started_at, 6)
        return out


@dataclass(slots=True)
class NewRun:
    """What is known about a run when its triggering event is accepted."""

    id: str
    kind: str
    source: str
    toolsets: list[str]
    prompt: str
    deliver_to: str | None = None


@dataclass(slots=True)
class ChatMessage:
    """One transcript entry in OpenAI message form."""

    role: str
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """The message as the chat-completions API expects it."""
        msg: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        if self.tool_call_id:
            msg["tool_call_id"] = self.tool_call_id
        return msg


@dataclass(slots=True)
class OutboxPart:
    """One message part to deliver."""

    dedupe_key: str
    platform: str
    chat_id: str
    text: str
    thread_id: str | None = None
    reply_to: str | None = None
    edit_message_id: str | None = None
    part_index: int = 0
    parts_total: int = 1
    run_id: str | None = None


@dataclass(slots=True)
class OutboxRow:
    """A persisted delivery and its state."""

    id: int
    dedupe_key: str
    run_id: str | None
    platform: str
    chat_id: str
    thread_id: str | None
    reply_to: str | None
    edit_message_id: str | None
    part_index: int
    parts_total: int
    text: str
    status: str
    attempts: int
    next_attempt_at: float
    platform_message_id: str | None
    last_error: str | None


@dataclass(slots=True)
class RunCompletion:
    """Everything written atomically when a run ends."""

    run_id: str
    inbox_id: int | None
    status: str
    result: str | None = None
    error: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    model_calls: int = 0
    model_seconds: float = 0.0
    session_key: str | None = None
    epoch: int | None = None
    transcript: list[ChatMessage] = field(default_factory=list)
    deliveries: list[OutboxPart] = field(default_factory=list)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def normalize_url(url: str) -> str:
    """Map ``sqlite://`` / ``postgresql://`` URLs to their async drivers."""
    for plain, driver in (("sqlite://", "sqlite+aiosqlite://"), ("postgresql://", "postgresql+asyncpg://"),
                          ("postgres://", "postgresql+asyncpg://")):
        if url.startswith(plain):
            return driver + url[len(plain):]
    return url


class Store:
    """Async access to the gateway's database."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name

    @classmethod
    async def open(cls, url: str) -> Store:
        """Connect, create or migrate the schema, and return the store."""
        url = normalize_url(url)
        kwargs: dict[str, Any] = {}
        if url.startswith("sqlite"):
            path = url.split(":///", 1)[-1]
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            kwargs["connect_args"] = {"timeout": 10}
        else:
            kwargs.update(pool_size=10, max_overflow=10, pool_pre_ping=True)
        engine = create_async_engine(url, **kwargs)
        if engine.dialect.name == "sqlite":
            sa_event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        store = cls(engine)
        try:
            await store._migrate()
        except BaseException:
            await engine.dispose()
            raise
        return store

    async def close(self) -> None:
        """Dispose of the connection pool."""
        await self.engine.dispose()

    async def _migrate(self) -> None:
        async with self.engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
            row = (await conn.execute(sa.select(meta_t.c.value).where(meta_t.c.key == "schema_version"))).first()
            if row is None:
                await conn.execute(meta_t.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))
            elif int(row[0]) > SCHEMA_VERSION:
                raise RuntimeError(f"database schema v{row[0]} is newer than this gateway (v{SCHEMA_VERSION})")

    async def ping(self) -> bool:
        """Whether the database answers."""
        try:
            async with self.engine.connect() as conn:
                await conn.execute(sa.select(1))
            return True
        except Exception as exc:
            logger.warning("store ping failed: %s", exc)
            return False

    # -- inbox -----------------------------------------------------------

    async def accept(self, dedupe_key: str, platform: str, kind: str, session_key: str,
                     payload: dict[str, Any], run: NewRun | None = None) -> Acceptance:
        """Persist an event (and its run) once; a repeated dedupe key returns the first acceptance."""
        now = time.time()
        try:
            async with self.engine.begin() as conn:
                result = await conn.execute(inbox_t.insert().values(
                    dedupe_key=dedupe_key, platform=platform, kind=kind, session_key=session_key,
                    payload=_dumps(payload), status="pending", run_id=run.id if run else None,
                    created_at=now, updated_at=now))
                inbox_id = int(result.inserted_primary_key[0])
                if run is not None:
                    await conn.execute(runs_t.insert().values(
                        id=run.id, kind=run.kind, source=run.source, session_key=session_key, status="queued",
                        toolsets=_dumps(run.toolsets), prompt=run.prompt, deliver_to=run.deliver_to,
                        tool_calls="[]", model_calls=0, attempts=0, created_at=now))
            return Acceptance(inbox_id, run.id if run else None, duplicate=False)
        except IntegrityError:
            async with self.engine.connect() as conn:
                row = (await conn.execute(sa.select(inbox_t.c.id, inbox_t.c.run_id)
                                          .where(inbox_t.c.dedupe_key == dedupe_key))).first()
            if row is None:  # the conflict was not on the dedupe key
                raise
            return Acceptance(int(row.id), row.run_id, duplicate=True)

    async def unfinished_inbox(self) -> list[InboxRow]:
        """Accepted events whose processing has not finished, oldest first."""
        async with self.engine.connect() as conn:
            rows = (await conn.execute(sa.select(inbox_t).where(inbox_t.c.status.in_(("pending", "running")))
                                       .order_by(inbox_t.c.id))).all()
        return [InboxRow(r.id, r.dedupe_key, r.platform, r.kind, r.session_key, json.loads(r.payload),
                         r.status, r.run_id) for r in rows]

    async def set_inbox_status(self, inbox_id: int, status: str) -> None:
        """Move an inbox event to ``status``."""
        async with self.engine.begin() as conn:
            await conn.execute(inbox_t.update().where(inbox_t.c.id == inbox_id)
                               .values(status=status, updated_at=time.time()))

    async def count_inbox(self, status: str | None = None) -> int:
        """Number of inbox rows (optionally with one status)."""
        query = sa.select(sa.func.count()).select_from(inbox_t)
        if status is not None:
            query = query.where(inbox_t.c.status == status)
        async with self.engine.connect() as conn:
            return int((await conn.execute(query)).scalar_one())

    # -- runs ------------------------------------------------------------

    async def start_run(self, run_id: str, inbox_id: int | None) -> None:
        """Mark a run (and its inbox event) as running, counting the attempt."""
        now = time.time()
        async with self.engine.begin() as conn:
            await conn.execute(runs_t.update().where(runs_t.c.id == run_id).values(
                status="running", started_at=sa.func.coalesce(runs_t.c.started_at, now),
                attempts=runs_t.c.attempts + 1))
            if inbox_id is not None:
                await conn.execute(inbox_t.update().where(inbox_t.c.id == inbox_id)
                                   .values(status="running", updated_at=now))

    async def finish_run(self, done: RunCompletion) -> bool:
        """Record a run's end atomically: status, transcript, inbox state and deliveries.

        Returns False (writing nothing) when the run had already finished, so a
        resumed run can never deliver twice.
        """
        now = time.time()
        async with self.engine.begin() as conn:
            updated = await conn.execute(
                runs_t.update().where(runs_t.c.id == done.run_id,
                                      runs_t.c.status.not_in(("completed", "failed", "cancelled")))
                .values(status=done.status, result=done.result, error=done.error,
                        tool_calls=_dumps(done.tool_calls), model_calls=done.model_calls,
                        model_seconds=done.model_seconds, finished_at=now))
            if updated.rowcount == 0:
                return False
            if done.inbox_id is not None:
                await conn.execute(inbox_t.update().where(inbox_t.c.id == done.inbox_id)
                                   .values(status="done", updated_at=now))
            await self._append_messages(conn, done.session_key, done.epoch, done.transcript, done.run_id, now)
            await self._insert_outbox(conn, done.deliveries, now)
        return True

    async def get_run(self, run_id: str) -> RunRow | None:
        """One run, or None."""
        async with self.engine.connect() as conn:
            row = (await conn.execute(sa.select(runs_t).where(runs_t.c.id == run_id))).first()
        return _run_row(row) if row else None

    async def list_runs(self, limit: int = 20, status: str | None = None) -> list[RunRow]:
        """Most recent runs first."""
        query = sa.select(runs_t).order_by(runs_t.c.created_at.desc()).limit(limit)
        if status:
            query = query.where(runs_t.c.status == status)
        async with self.engine.connect() as conn:
            return [_run_row(r) for r in (await conn.execute(query)).all()]

    async def count_runs(self, status: str | None = None) -> int:
        """Number of runs (optionally with one status)."""
        query = sa.select(sa.func.count()).select_from(runs_t)
        if status is not None:
            query = query.where(runs_t.c.status == status)
        async with self.engine.connect() as conn:
            return int((await conn.execute(query)).scalar_one())

    # -- sessions and transcripts -----------------------------------------

    async def session_epoch(self, key: str, platform: str, chat_id: str, user_id: str | None,
                            thread_id: str | None) -> int:
        """The session's current epoch, creating the session on first use."""
        async with self.engine.begin() as conn:
            row = (await conn.execute(sa.select(sessions_t.c.epoch).where(sessions_t.c.key == key))).first()
            if row is not None:
                return int(row.epoch)
        now = time.time()
        try:
            async with self.engine.begin() as conn:
                await conn.execute(sessions_t.insert().values(
                    key=key, platform=platform, chat_id=chat_id, user_id=user_id, thread_id=thread_id,
                    epoch=0, created_at=now, updated_at=now))
        except IntegrityError:
            pass  # created concurrently
        return 0

    async def reset_session(self, key: str) -> int:
        """Start a fresh conversation (``/new``): bump the epoch; returns the new one."""
        async with self.engine.begin() as conn:
            await conn.execute(sessions_t.update().where(sessions_t.c.key == key)
                               .values(epoch=sessions_t.c.epoch + 1, updated_at=time.time()))
            row = (await conn.execute(sa.select(sessions_t.c.epoch).where(sessions_t.c.key == key))).first()
        return int(row.epoch) if row else 0

    async def history(self, key: str, epoch: int, limit: int) -> list[ChatMessage]:
        """The last ``limit`` transcript messages of the session's epoch, oldest first."""
        query = (sa.select(messages_t).where(messages_t.c.session_key == key, messages_t.c.epoch == epoch)
                 .order_by(messages_t.c.id.desc()).limit(limit))
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [ChatMessage(r.role, r.content, json.loads(r.tool_calls) if r.tool_calls else None,
                            r.tool_call_id) for r in reversed(rows)]

    async def _append_messages(self, conn: AsyncConnection, key: str | None, epoch: int | None,
                               messages: Sequence[ChatMessage], run_id: str | None, now: float) -> None:
        if not messages or key is None or epoch is None:
            return
        await conn.execute(messages_t.insert(), [
            {"session_key": key, "epoch": epoch, "role": m.role, "content": m.content,
             "tool_calls": _dumps(m.tool_calls) if m.tool_calls else None, "tool_call_id": m.tool_call_id,
             "run_id": run_id, "created_at": now} for m in messages])

    # -- outbox ----------------------------------------------------------

    async def _insert_outbox(self, conn: AsyncConnection, parts: Iterable[OutboxPart], now: float) -> None:
        rows = [{"dedupe_key": p.dedupe_key, "run_id": p.run_id, "platform": p.platform, "chat_id": p.chat_id,
                 "thread_id": p.thread_id, "reply_to": p.reply_to, "edit_message_id": p.edit_message_id,
                 "part_index": p.part_index, "parts_total": p.parts_total, "text": p.text, "status": "pending",
                 "attempts": 0, "next_attempt_at": now, "created_at": now} for p in parts]
        if rows:
            await conn.execute(outbox_t.insert(), rows)

    async def enqueue(self, parts: Sequence[OutboxPart], inbox_id: int | None = None) -> bool:
        """Persist deliveries outside a run (command replies), closing the inbox event in the same step.

        Returns False when these deliveries were already enqueued (a replayed event).
        """
        now = time.time()
        try:
            async with self.engine.begin() as conn:
                await self._insert_outbox(conn, parts, now)
                if inbox_id is not None:
                    await conn.execute(inbox_t.update().where(inbox_t.c.id == inbox_id)
                                       .values(status="done", updated_at=now))
        except IntegrityError:
            if inbox_id is not None:
                await self.set_inbox_status(inbox_id, "done")
            return False
        return True

    async def pending_outbox(self, limit: int = 500) -> list[OutboxRow]:
        """Undelivered parts, oldest first."""
        query = (sa.select(outbox_t).where(outbox_t.c.status == "pending").order_by(outbox_t.c.id).limit(limit))
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [_outbox_row(r) for r in rows]

    async def mark_sent(self, outbox_id: int, platform_message_id: str | None) -> None:
        """Record a successful delivery."""
        async with self.engine.begin() as conn:
            await conn.execute(outbox_t.update().where(outbox_t.c.id == outbox_id).values(
                status="sent", platform_message_id=platform_message_id, sent_at=time.time(),
                attempts=outbox_t.c.attempts + 1))

    async def mark_retry(self, outbox_id: int, next_attempt_at: float, error: str) -> None:
        """Record a transient failure and when to try again."""
        async with self.engine.begin() as conn:
            await conn.execute(outbox_t.update().where(outbox_t.c.id == outbox_id).values(
                next_attempt_at=next_attempt_at, last_error=error[:2000], attempts=outbox_t.c.attempts + 1))

    async def mark_failed(self, outbox_id: int, error: str) -> None:
        """Give up on a delivery."""
        async with self.engine.begin() as conn:
            await conn.execute(outbox_t.update().where(outbox_t.c.id == outbox_id).values(
                status="failed", last_error=error[:2000], attempts=outbox_t.c.attempts + 1))

    async def outbox_rows(self, run_id: str | None = None) -> list[OutboxRow]:
        """Every outbox row (optionally of one run), in order: for inspection and tests."""
        query = sa.select(outbox_t).order_by(outbox_t.c.id)
        if run_id is not None:
            query = query.where(outbox_t.c.run_id == run_id)
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [_outbox_row(r) for r in rows]

    async def outbox_depth(self) -> int:
        """Number of undelivered parts."""
        async with self.engine.connect() as conn:
            return int((await conn.execute(sa.select(sa.func.count()).select_from(outbox_t)
                                           .where(outbox_t.c.status == "pending"))).scalar_one())


def _run_row(r: Any) -> RunRow:
    return RunRow(r.id, r.kind, r.source, r.session_key, r.status, json.loads(r.toolsets), r.prompt, r.deliver_to,
                  r.result, r.error, json.loads(r.tool_calls or "[]"), r.model_calls, r.attempts, r.created_at,
                  r.started_at, r.finished_at, r.model_seconds)


def _outbox_row(r: Any) -> OutboxRow:
    return OutboxRow(r.id, r.dedupe_key, r.run_id, r.platform, r.chat_id, r.thread_id, r.reply_to, r.edit_message_id,
                     r.part_index, r.parts_total, r.text, r.status, r.attempts, r.next_attempt_at,
                     r.platform_message_id, r.last_error)


class ToolStateStore:
    """Memory notes and todo lists for the tools, on the same database."""

    def __init__(self, store: Store) -> None:
        self.engine = store.engine

    async def add_note(self, user_key: str, text: str) -> tuple[int, float]:
        """Store a note; returns (id, created_at)."""
        now = time.time()
        async with self.engine.begin() as conn:
            result = await conn.execute(memory_t.insert().values(user_key=user_key, text=text, created_at=now))
        return int(result.inserted_primary_key[0]), now

    async def list_notes(self, user_key: str) -> list[tuple[int, str, float]]:
        """The user's notes as (id, text, created_at), oldest first."""
        query = sa.select(memory_t.c.id, memory_t.c.text, memory_t.c.created_at).where(
            memory_t.c.user_key == user_key).order_by(memory_t.c.id)
        async with self.engine.connect() as conn:
            return [(int(r.id), r.text, r.created_at) for r in (await conn.execute(query)).all()]

    async def remove_note(self, user_key: str, note_id: int) -> bool:
        """Delete one of the user's notes."""
        async with self.engine.begin() as conn:
            result = await conn.execute(memory_t.delete().where(memory_t.c.user_key == user_key,
                                                                memory_t.c.id == note_id))
        return bool(result.rowcount)

    async def load_todos(self, session_key: str) -> list[dict[str, str]]:
        """The session's todo items as dicts."""
        async with self.engine.connect() as conn:
            row = (await conn.execute(sa.select(todos_t.c["items"])
                                      .where(todos_t.c.session_key == session_key))).first()
        return json.loads(row[0]) if row else []

    async def save_todos(self, session_key: str, items: list[dict[str, str]]) -> None:
        """Replace the session's todo items."""
        now = time.time()
        async with self.engine.begin() as conn:
            updated = await conn.execute(todos_t.update().where(todos_t.c.session_key == session_key)
                                         .values(items=_dumps(items), updated_at=now))
            if updated.rowcount == 0:
                await conn.execute(todos_t.insert().values(session_key=session_key, items=_dumps(items),
                                                           updated_at=now))
