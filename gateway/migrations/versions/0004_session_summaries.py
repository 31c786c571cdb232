"""session_summaries: a session's compressed earlier conversation and its last reported prompt size."""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    """Create session_summaries."""
    op.create_table(
        "session_summaries",
        sa.Column("session_key", sa.String(255), primary_key=True),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("summary", sa.Text),
        sa.Column("through_id", sa.Integer, nullable=False),
        sa.Column("prompt_tokens", sa.Integer),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
