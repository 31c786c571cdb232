"""Files in the outbox (a part may carry a file, its caption the part's text; the bytes stored by content), and
voice replies per session."""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    """Add outbox.file, outbox.file_sha256 and session_settings.voice; create outbox_files."""
    op.add_column("outbox", sa.Column("file", sa.Text))
    op.add_column("outbox", sa.Column("file_sha256", sa.String(64)))
    op.add_column("session_settings", sa.Column("voice", sa.String(8)))
    op.create_table(
        "outbox_files",
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
