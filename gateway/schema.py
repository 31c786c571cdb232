"""The database schema: every table, and the steps from each earlier schema version to this one.

Modules that keep their own state (cron jobs, pairing codes) add their tables to ``metadata``;
``migrate`` creates whatever a database lacks and runs the version steps in order.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 5
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
    sa.Index("ix_outbox_status", "status", "id"),
    sa.Index("ix_outbox_lane", "lane", "status", "id"),
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
)

platform_state_t = sa.Table(
    "platform_state", metadata,
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)

meta_t = sa.Table(
    "meta", metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)


@functools.cache
def insert_ignoring_conflicts(dialect: str, table: sa.Table, key: str | tuple[str, ...]) -> Any:
    """``INSERT ... ON CONFLICT (key) DO NOTHING RETURNING *`` for the dialect: no row back on a conflict."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    columns = [key] if isinstance(key, str) else list(key)
    return insert(table).on_conflict_do_nothing(index_elements=columns).returning(*table.c)


# -- schema versions ---------------------------------------------------------


def _v2_outbox_claims(conn: Connection) -> None:
    """outbox: ordering lanes, claims (who is sending a part) and the in-doubt count; inbox by session."""
    for column in ("lane VARCHAR(800) NOT NULL DEFAULT ''", "claimed_by VARCHAR(64)", "claim_until FLOAT",
                   "in_doubt INTEGER NOT NULL DEFAULT 0"):
        conn.exec_driver_sql(f"ALTER TABLE outbox ADD COLUMN {column}")
    conn.exec_driver_sql("UPDATE outbox SET lane = platform || ':' || chat_id")
    next(ix for ix in outbox_t.indexes if ix.name == "ix_outbox_lane").create(conn)
    next(ix for ix in inbox_t.indexes if ix.name == "ix_inbox_session").create(conn)


def _v3_runs_ended_by(conn: Connection) -> None:
    """runs: how a completed run's answer ended (a whole answer, or cut off, out of budget ...)."""
    conn.exec_driver_sql("ALTER TABLE runs ADD COLUMN ended_by VARCHAR(32)")


def _v4_session_summaries(conn: Connection) -> None:
    """session_summaries: a session's compressed earlier conversation and its last reported prompt size."""
    session_summaries_t.create(conn, checkfirst=True)


def _v5_conversation(conn: Connection) -> None:
    """session_settings, user_settings, run_usage: per-session model/title/busy/verbose, home channels, usage;
    sessions: the reset policy's last reset."""
    for table in (session_settings_t, user_settings_t, run_usage_t):
        table.create(conn, checkfirst=True)
    if "last_reset" not in {c["name"] for c in sa.inspect(conn).get_columns("sessions")}:  # (tests set v5 back)
        conn.exec_driver_sql("ALTER TABLE sessions ADD COLUMN last_reset TEXT")


_MIGRATIONS = {2: _v2_outbox_claims, 3: _v3_runs_ended_by, 4: _v4_session_summaries, 5: _v5_conversation}


def migrate(conn: Connection) -> None:
    """Bring the schema to SCHEMA_VERSION; concurrent starts of several processes take turns."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
    meta_t.create(conn, checkfirst=True)
    row = conn.execute(sa.select(meta_t.c.value).where(meta_t.c.key == "schema_version")).first()
    version = int(row[0]) if row is not None else None
    if version is not None and version > SCHEMA_VERSION:
        raise RuntimeError(f"database schema v{version} is newer than this gateway (v{SCHEMA_VERSION})")
    for step in range((version or SCHEMA_VERSION) + 1, SCHEMA_VERSION + 1):
        logger.info("migrating the database schema to v%d: %s", step, _MIGRATIONS[step].__doc__)
        _MIGRATIONS[step](conn)
    metadata.create_all(conn)  # a fresh database, and tables of modules added since (checkfirst)
    if version is None:
        conn.execute(meta_t.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))
    elif version != SCHEMA_VERSION:
        conn.execute(meta_t.update().where(meta_t.c.key == "schema_version").values(value=str(SCHEMA_VERSION)))
