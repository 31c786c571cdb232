"""runs: how a completed run's answer ended (a whole answer, or cut off, out of budget ...)."""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    """Add runs.ended_by."""
    op.add_column("runs", sa.Column("ended_by", sa.String(32)))
