"""Alembic's environment: migrate on the connection (and in the transaction) ``gateway.schema.migrate`` holds."""

from __future__ import annotations

from alembic import context

from gateway.schema import metadata

# SQLite cannot alter most of a table in place: batch mode rebuilds a table where a revision needs it.
context.configure(connection=context.config.attributes["connection"], target_metadata=metadata,
                  render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
