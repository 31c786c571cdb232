"""Schema version 1: the tables as the first release created them (nothing to do: the baseline)."""

revision = "0001"
down_revision = None


def upgrade() -> None:
    """A database at version 1 already has this schema."""
