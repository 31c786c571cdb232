"""Full-text search over stored conversations (``session_search``): the dialect's message search, filled with the
messages already stored, and an index of each user's sessions."""

from alembic import op

from gateway.schema import create_message_search

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    """Create ix_sessions_user and the message search (SQLite: messages_search and its triggers; PostgreSQL:
    ix_messages_search)."""
    op.create_index("ix_sessions_user", "sessions", ["platform", "user_id"])
    create_message_search(op.get_bind(), backfill=True)
