"""outbox: ordering lanes, claims (who is sending a part) and the in-doubt count; inbox by session."""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    """Add the outbox's lane and claim columns (lanes filled from the chats), and the two indexes."""
    op.add_column("outbox", sa.Column("lane", sa.String(800), nullable=False, server_default=""))
    op.add_column("outbox", sa.Column("claimed_by", sa.String(64)))
    op.add_column("outbox", sa.Column("claim_until", sa.Float))
    op.add_column("outbox", sa.Column("in_doubt", sa.Integer, nullable=False, server_default="0"))
    op.execute("UPDATE outbox SET lane = platform || ':' || chat_id")
    op.create_index("ix_outbox_lane", "outbox", ["lane", "status", "id"])
    op.create_index("ix_inbox_session", "inbox", ["session_key", "status", "id"])
