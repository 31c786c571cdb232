"""The conversation: per-session choices, users' home channels, each run's token usage, the reset policy's last
reset of a session."""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    """Create session_settings, user_settings and run_usage; add sessions.last_reset."""
    op.create_table(
        "session_settings",
        sa.Column("session_key", sa.String(255), primary_key=True),
        sa.Column("model", sa.String(255)),
        sa.Column("title", sa.String(255)),
        sa.Column("busy", sa.String(16)),
        sa.Column("verbose", sa.String(16)),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "user_settings",
        sa.Column("user_key", sa.String(255), primary_key=True),
        sa.Column("home_platform", sa.String(32)),
        sa.Column("home_chat_id", sa.String(255)),
        sa.Column("home_thread_id", sa.String(255)),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "run_usage",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("session_key", sa.String(255), nullable=False),
        sa.Column("epoch", sa.Integer),
        sa.Column("user_key", sa.String(255)),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_run_usage_user", "run_usage", ["user_key", "created_at"])
    op.create_index("ix_run_usage_session", "run_usage", ["session_key", "epoch"])
    op.add_column("sessions", sa.Column("last_reset", sa.Text))
