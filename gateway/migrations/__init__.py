"""The schema's history as Alembic revisions, run by ``gateway.schema.migrate`` when the store opens.

Revision ``000N`` brings a database to schema version N (``gateway.schema.SCHEMA_VERSION`` is the head). A new
revision is a file in ``versions/`` with the next number, ``down_revision`` the previous one, and an ``upgrade``
with the change frozen as it is on that day (never the live tables of ``gateway.schema``, which keep changing).
There are no downgrades: back the database up before a gateway version with a newer schema first starts.
"""
