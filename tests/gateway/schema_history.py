"""Turning a current database back into one an earlier gateway left: the schema of version N, recorded the way
gateways before Alembic recorded it (``meta.schema_version`` only, no ``alembic_version``)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gateway.schema import meta_t

# What each version added, undone newest first (the reverse of gateway/migrations/versions).
_UNDO: dict[int, list[str]] = {
    10: ["DROP INDEX ix_sessions_user", "DROP TABLE IF EXISTS messages_search",
         "DROP INDEX IF EXISTS ix_messages_search"],
    9: ["DROP TABLE outbox_files", "ALTER TABLE outbox DROP COLUMN file", "ALTER TABLE outbox DROP COLUMN file_sha256",
        "ALTER TABLE session_settings DROP COLUMN voice"],
    8: ["DROP TABLE approvals", "DROP TABLE approval_grants", "ALTER TABLE outbox DROP COLUMN choices"],
    7: ["DROP INDEX ix_run_usage_created"],
    6: ["DROP TABLE user_rate_limits", "DROP TABLE user_usage"],
    5: ["DROP TABLE session_settings", "DROP TABLE user_settings", "DROP TABLE run_usage",
        "ALTER TABLE sessions DROP COLUMN last_reset"],
    4: ["DROP TABLE session_summaries"],
    3: ["ALTER TABLE runs DROP COLUMN ended_by"],
    2: ["DROP INDEX ix_outbox_lane", "DROP INDEX ix_inbox_session",
        *(f"ALTER TABLE outbox DROP COLUMN {c}" for c in ("lane", "claimed_by", "claim_until", "in_doubt"))],
}
# And on SQLite only (PostgreSQL has no such objects, nor this syntax).
_UNDO_SQLITE: dict[int, list[str]] = {
    10: [f"DROP TRIGGER messages_search_{event}" for event in ("insert", "delete", "update")],
}


def back_to(conn: Connection, version: int) -> None:
    """Make the database a version-``version`` one from before Alembic (its data kept where the schema has
    room for it)."""
    current = int(conn.execute(sa.select(meta_t.c.value).where(meta_t.c.key == "schema_version")).scalar_one())
    for step in range(current, version, -1):
        for statement in [*_UNDO[step], *(_UNDO_SQLITE.get(step, []) if conn.dialect.name == "sqlite" else [])]:
            conn.exec_driver_sql(statement)
    conn.exec_driver_sql("DROP TABLE alembic_version")
    conn.execute(meta_t.update().where(meta_t.c.key == "schema_version").values(value=str(version)))
