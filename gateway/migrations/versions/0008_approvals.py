"""Approvals: runs paused for a user's yes, standing approvals, and buttons on outbox parts."""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    """Create approvals and approval_grants; add outbox.choices."""
    op.create_table(
        "approvals",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("session_key", sa.String(255), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("requester", sa.String(255), nullable=False),
        sa.Column("calls", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("scope", sa.String(16)),
        sa.Column("decided_by", sa.String(255)),
        sa.Column("reason", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("decided_at", sa.Float),
    )
    op.create_index("ix_approvals_session", "approvals", ["session_key", "status"])
    op.create_index("ix_approvals_expiry", "approvals", ["status", "expires_at"])
    op.create_table(
        "approval_grants",
        sa.Column("user_key", sa.String(255), primary_key=True),
        sa.Column("session_key", sa.String(255), primary_key=True),
        sa.Column("pattern", sa.String(255), primary_key=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.add_column("outbox", sa.Column("choices", sa.Text))
