"""run_usage by time: retention finds the rows past its window without reading the whole table."""

from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    """Index run_usage.created_at."""
    op.create_index("ix_run_usage_created", "run_usage", ["created_at"])
