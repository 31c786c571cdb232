"""Per-user limits in the store, shared by restarts and replicas: the inbound message buckets and the usage the
hourly budgets count."""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    """Create user_rate_limits and user_usage."""
    op.create_table(
        "user_rate_limits",
        sa.Column("user_key", sa.String(255), primary_key=True),
        sa.Column("tokens", sa.Float, nullable=False),
        sa.Column("refilled_at", sa.Float, nullable=False),
    )
    op.create_table(
        "user_usage",
        sa.Column("user_key", sa.String(255), primary_key=True),
        sa.Column("minute", sa.Integer, primary_key=True),
        sa.Column("model_calls", sa.Integer, nullable=False),
        sa.Column("tokens", sa.Integer, nullable=False),
    )
