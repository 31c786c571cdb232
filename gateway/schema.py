"""The database schema: every table, and migrating a database to it (the revisions are in gateway/migrations).

Every table is here, whichever modules a process imports: a database is created (and compared with its
revisions) from this one ``metadata``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from gateway.db import Database

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 10
MIGRATION_LOCK_KEY = 0x4845524D4553  # pg_advisory_xact_lock key: one migrating process at a time

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
    sa.Column("updated_at", sa.Float, nullable=False),  # the last activity: a chat message's run, or /new
    # The reset policy's last reset (gateway/session_reset.py), as JSON: the run that made it, why, the idle seconds.
    sa.Column("last_reset", sa.Text),
    sa.Index("ix_sessions_user", "platform", "user_id"),  # a user's own sessions (gateway/session_search.py)
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

# Full-text search over what users and the assistant said (gateway/session_search.py), which Alembic neither creates
# nor compares (its names start with MESSAGE_SEARCH_NAMES). SQLite: an FTS5 index of messages.content (external
# content: the text is stored once), kept in step by triggers; a revision that rebuilds messages (batch mode) must
# create them again. PostgreSQL: a GIN index of the tsvector of the text's first 100,000 characters (a tsvector holds
# at most 1 MB: a longer message could not be stored). Both use no language's stemming or stop words.
SEARCHED_ROLES = ("user", "assistant")
MESSAGE_SEARCH_NAMES = ("messages_search", "ix_messages_search")
PG_MESSAGE_VECTOR = "to_tsvector('simple', left(content, 100000))"  # a query must name the index's expression
_ROLES = ", ".join(f"'{role}'" for role in SEARCHED_ROLES)
_MESSAGE_SEARCH_DDL: dict[str, tuple[str, ...]] = {
    "sqlite": (
        "CREATE VIRTUAL TABLE messages_search USING fts5(content, content='messages', content_rowid='id')",
        f"CREATE TRIGGER messages_search_insert AFTER INSERT ON messages WHEN new.role IN ({_ROLES}) BEGIN "
        "INSERT INTO messages_search (rowid, content) VALUES (new.id, new.content); END",
        f"CREATE TRIGGER messages_search_delete AFTER DELETE ON messages WHEN old.role IN ({_ROLES}) BEGIN "
        "INSERT INTO messages_search (messages_search, rowid, content) VALUES ('delete', old.id, old.content); END",
        "CREATE TRIGGER messages_search_update AFTER UPDATE OF role, content ON messages BEGIN "
        "INSERT INTO messages_search (messages_search, rowid, content) "
        f"SELECT 'delete', old.id, old.content WHERE old.role IN ({_ROLES}); "
        f"INSERT INTO messages_search (rowid, content) SELECT new.id, new.content WHERE new.role IN ({_ROLES}); END",
    ),
    "postgresql": (
        f"CREATE INDEX ix_messages_search ON messages USING gin ({PG_MESSAGE_VECTOR}) WHERE role IN ({_ROLES})",
    ),
}


def create_message_search(conn: Connection, *, backfill: bool) -> None:
    """Create the message search of the connection's dialect; ``backfill``: also index the messages stored."""
    for statement in _MESSAGE_SEARCH_DDL[conn.dialect.name]:
        conn.exec_driver_sql(statement)
    if backfill and conn.dialect.name == "sqlite":  # a PostgreSQL index covers the rows it is created on
        conn.exec_driver_sql("INSERT INTO messages_search (rowid, content) "
                             f"SELECT id, content FROM messages WHERE role IN ({_ROLES})")


sa.event.listen(messages_t, "after_create", lambda _table, conn, **_kw: create_message_search(conn, backfill=False))
sa.event.listen(messages_t, "before_drop", sa.DDL("DROP TABLE IF EXISTS messages_search").execute_if(dialect="sqlite"))

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
    sa.Index("ix_inbox_session", "session_key", "status", "id"),
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
    # How a completed run's answer ended (agent.RunOutcome.ended_by): "answer", or why it stopped short.
    sa.Column("ended_by", sa.String(32)),
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
    # Parts of one lane go out in order: a chat (platform:chat_id), or one run's parts where the
    # platform has no chat order to keep (callback targets).
    sa.Column("lane", sa.String(800), nullable=False),
    # Who is sending the part right now (a gateway process id) and until when that claim holds.
    sa.Column("claimed_by", sa.String(64)),
    sa.Column("claim_until", sa.Float),
    # Times a sender took the part over from one that died mid-send: the platform may already have it.
    sa.Column("in_doubt", sa.Integer, nullable=False, default=0),
    # Buttons under the message (JSON list of platforms.base.Choice), or NULL.
    sa.Column("choices", sa.Text),
    # A file sent with the part (``text`` its caption): JSON kind, name, mime type and size, its bytes in
    # outbox_files under file_sha256; NULL for text.
    sa.Column("file", sa.Text),
    sa.Column("file_sha256", sa.String(64)),
    sa.Index("ix_outbox_status", "status", "id"),
    sa.Index("ix_outbox_lane", "lane", "status", "id"),
)

# A run paused on tool calls that need a user's yes (gateway/approvals.py): what waits, who may answer, until when.
approvals_t = sa.Table(
    "approvals", metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("session_key", sa.String(255), nullable=False),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("target", sa.Text, nullable=False),  # JSON Target of the chat that was asked
    sa.Column("requester", sa.String(255), nullable=False),  # user key
    sa.Column("calls", sa.Text, nullable=False),  # JSON: the pending tool calls and why each needs approval
    sa.Column("status", sa.String(16), nullable=False),  # pending | approved | denied | expired
    sa.Column("scope", sa.String(16)),  # once | session | always, when approved
    sa.Column("decided_by", sa.String(255)),
    sa.Column("reason", sa.Text),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("decided_at", sa.Float),
    sa.Index("ix_approvals_session", "session_key", "status"),
    sa.Index("ix_approvals_expiry", "status", "expires_at"),
)

# Standing approvals: a user's "session" (session_key set) or "always" (session_key '') answer to a pattern.
approval_grants_t = sa.Table(
    "approval_grants", metadata,
    sa.Column("user_key", sa.String(255), primary_key=True),
    sa.Column("session_key", sa.String(255), primary_key=True),
    sa.Column("pattern", sa.String(255), primary_key=True),
    sa.Column("created_at", sa.Float, nullable=False),
)

# The bytes of files the outbox sends, by content (several parts may send the same file); written in the transaction
# that stores their parts, so every replica can send them; pruned once no undelivered part needs them.
outbox_files_t = sa.Table(
    "outbox_files", metadata,
    sa.Column("sha256", sa.String(64), primary_key=True),
    sa.Column("data", sa.LargeBinary, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
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

# A session's conversation folded into a summary (gateway/session_summary.py): what the model wrote for its
# messages up to through_id, and the prompt size the model server last reported for the session.
session_summaries_t = sa.Table(
    "session_summaries", metadata,
    sa.Column("session_key", sa.String(255), primary_key=True),
    sa.Column("epoch", sa.Integer, nullable=False),
    sa.Column("summary", sa.Text),
    sa.Column("through_id", sa.Integer, nullable=False, default=0),
    sa.Column("prompt_tokens", sa.Integer),
    sa.Column("updated_at", sa.Float, nullable=False),
)

# What a chat changed about its session with commands (gateway/session_settings.py): the model it uses, its title,
# what a message does while a run is busy, how tool progress is shown. NULL: the configured default.
session_settings_t = sa.Table(
    "session_settings", metadata,
    sa.Column("session_key", sa.String(255), primary_key=True),
    sa.Column("model", sa.String(255)),
    sa.Column("title", sa.String(255)),
    sa.Column("busy", sa.String(16)),
    sa.Column("verbose", sa.String(16)),
    sa.Column("voice", sa.String(8)),  # "on": answers are also spoken (/voice)
    sa.Column("updated_at", sa.Float, nullable=False),
)

# Per user (platform:user id): the home channel that cron jobs and notifications without a target go to.
user_settings_t = sa.Table(
    "user_settings", metadata,
    sa.Column("user_key", sa.String(255), primary_key=True),
    sa.Column("home_platform", sa.String(32)),
    sa.Column("home_chat_id", sa.String(255)),
    sa.Column("home_thread_id", sa.String(255)),
    sa.Column("updated_at", sa.Float, nullable=False),
)

# Tokens each run used, as the model server reported them (``/usage``; prices are applied when read).
run_usage_t = sa.Table(
    "run_usage", metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("session_key", sa.String(255), nullable=False),
    sa.Column("epoch", sa.Integer),  # the session's conversation (a chat run's; NULL for webhook and cron runs)
    sa.Column("user_key", sa.String(255)),
    sa.Column("model", sa.String(255), nullable=False),
    sa.Column("prompt_tokens", sa.Integer, nullable=False, default=0),
    sa.Column("completion_tokens", sa.Integer, nullable=False, default=0),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Index("ix_run_usage_user", "user_key", "created_at"),
    sa.Index("ix_run_usage_session", "session_key", "epoch"),
    sa.Index("ix_run_usage_created", "created_at"),  # retention
)

# Each user's inbound message bucket (gateway/limits.py), shared by restarts and replicas: its tokens as of
# refilled_at (unix seconds); processes take tokens from it a few at a time.
user_rate_limits_t = sa.Table(
    "user_rate_limits", metadata,
    sa.Column("user_key", sa.String(255), primary_key=True),
    sa.Column("tokens", sa.Float, nullable=False),
    sa.Column("refilled_at", sa.Float, nullable=False),
)

# Model calls and tokens of each user's finished runs per minute (unix seconds // 60), for the hourly budgets
# (gateway/limits.py); written with the run's completion, rows older than an hour dropped as the user's next is.
user_usage_t = sa.Table(
    "user_usage", metadata,
    sa.Column("user_key", sa.String(255), primary_key=True),
    sa.Column("minute", sa.Integer, primary_key=True),
    sa.Column("model_calls", sa.Integer, nullable=False),
    sa.Column("tokens", sa.Integer, nullable=False),
)

platform_state_t = sa.Table(
    "platform_state", metadata,
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)

# Scheduled jobs (gateway/cron_store.py).
cron_jobs_t = sa.Table(
    "cron_jobs", metadata,
    sa.Column("id", sa.String(16), primary_key=True),
    sa.Column("owner", sa.String(255), nullable=False, index=True),
    sa.Column("name", sa.String(200), nullable=False, default=""),
    sa.Column("prompt", sa.Text, nullable=False),
    sa.Column("schedule", sa.Text, nullable=False),
    sa.Column("timezone", sa.String(64), nullable=False),
    sa.Column("origin_platform", sa.String(32), nullable=False),
    sa.Column("origin_chat_id", sa.String(255), nullable=False),
    sa.Column("origin_thread_id", sa.String(255)),
    sa.Column("session_key", sa.String(255)),
    sa.Column("repeat", sa.Integer),
    sa.Column("deliver", sa.String(512), nullable=False),
    sa.Column("notify", sa.String(16), nullable=False),
    sa.Column("misfire", sa.String(16), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("fires", sa.Integer, nullable=False, default=0),
    sa.Column("next_fire_at", sa.Float),
    sa.Column("last_fire_at", sa.Float),
    sa.Column("last_run_id", sa.String(64)),
    sa.Column("last_status", sa.String(16)),
    sa.Column("last_error", sa.Text),
    sa.Column("last_result", sa.Text),
    sa.Column("consecutive_failures", sa.Integer, nullable=False, default=0),
    sa.Column("last_misfire", sa.Text),
    sa.Column("paused_reason", sa.Text),
    sa.Column("run_requested_at", sa.Float),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)


# DM pairing (gateway/pairing.py): codes issued, users approved, failed approvals (for the lockout).
pairing_codes_t = sa.Table(
    "pairing_codes", metadata,
    sa.Column("code", sa.String(16), primary_key=True),
    sa.Column("platform", sa.String(32), nullable=False),
    sa.Column("user_id", sa.String(255), nullable=False),
    sa.Column("user_name", sa.String(255)),
    sa.Column("chat_id", sa.String(255), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Index("ix_pairing_user", "platform", "user_id"),
)


approved_users_t = sa.Table(
    "approved_users", metadata,
    sa.Column("platform", sa.String(32), primary_key=True),
    sa.Column("user_id", sa.String(255), primary_key=True),
    sa.Column("user_name", sa.String(255)),
    sa.Column("approved_by", sa.String(255), nullable=False),
    sa.Column("approved_at", sa.Float, nullable=False),
)


pairing_failures_t = sa.Table(
    "pairing_failures", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Float, nullable=False),
)

meta_t = sa.Table(
    "meta", metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)


@functools.cache
def insert_ignoring_conflicts(dialect: str, table: sa.Table, key: str | tuple[str, ...], *,
                              returning: bool = True) -> Any:
    """``INSERT ... ON CONFLICT (key) DO NOTHING RETURNING *`` for the dialect: no row back on a conflict
    (``returning=False``: nothing back at all)."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    columns = [key] if isinstance(key, str) else list(key)
    statement = insert(table).on_conflict_do_nothing(index_elements=columns)
    return statement.returning(*table.c) if returning else statement


# -- migrations (gateway/migrations: Alembic) -------------------------------------------------------------------


def _revision(version: int) -> str:
    return f"{version:04d}"


HEAD_REVISION = _revision(SCHEMA_VERSION)
_alembic_version_t = sa.Table("alembic_version", sa.MetaData(), sa.Column("version_num", sa.String(32)))


def current_revision(conn: Connection) -> tuple[int | None, str | None]:
    """The database's ``meta.schema_version`` and Alembic revision (None where absent)."""
    tables = set(sa.inspect(conn).get_table_names())
    version = (conn.execute(sa.select(meta_t.c.value).where(meta_t.c.key == "schema_version")).scalar()
               if "meta" in tables else None)
    revision = conn.execute(sa.select(_alembic_version_t.c.version_num)).scalar() \
        if "alembic_version" in tables else None
    return (int(version) if version is not None else None), revision


def migrate(conn: Connection) -> None:
    """Bring the schema to ``SCHEMA_VERSION`` with the Alembic revisions (in the caller's transaction): a new
    database gets every table and the head revision; one from before Alembic (``meta.schema_version`` only) is
    stamped at its version first. Several processes starting at once take turns (see ``upgrade``)."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
    version, revision = current_revision(conn)
    if version is not None and version > SCHEMA_VERSION:
        raise RuntimeError(f"database schema v{version} is newer than this gateway (v{SCHEMA_VERSION})")
    if revision == HEAD_REVISION and version == SCHEMA_VERSION:
        return  # the common start: nothing to do, and Alembic is not even imported
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its step-by-step INFO lines: ours says what happens
    from alembic import command  # imported only when there is something to migrate
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", "gateway:migrations")
    cfg.attributes["connection"] = conn
    if version is None and revision is None:  # a new database
        metadata.create_all(conn)
        command.stamp(cfg, HEAD_REVISION)
    else:
        if revision is None:
            command.stamp(cfg, _revision(version or 1))
        logger.info("migrating the database schema from v%s to v%d", version, SCHEMA_VERSION)
        command.upgrade(cfg, HEAD_REVISION)
        metadata.create_all(conn)  # tables of modules that came without a revision (checkfirst)
    meta_t.create(conn, checkfirst=True)
    if version is None:
        conn.execute(meta_t.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))
    else:
        conn.execute(meta_t.update().where(meta_t.c.key == "schema_version").values(value=str(SCHEMA_VERSION)))


@contextlib.contextmanager
def _file_lock(db: Database) -> Iterator[None]:
    """On a SQLite file: an exclusive lock beside it while the schema is migrated, so a second process waits
    for the first's whole migration (however long) rather than failing after SQLite's busy timeout."""
    path = db.engine.url.database if db.dialect == "sqlite" else None
    if not path or path == ":memory:":
        yield
        return
    with open(f"{path}.migrate-lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


async def upgrade(db: Database) -> None:
    """Migrate the database's schema (``migrate``), one process at a time: PostgreSQL's advisory lock is taken
    in the migration's transaction, a SQLite file's lock around it (acquired off the event loop)."""
    lock = _file_lock(db)
    await asyncio.to_thread(lock.__enter__)
    try:
        await db.write(migrate)
    finally:
        lock.__exit__(None, None, None)
