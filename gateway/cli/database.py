"""``store``: the database's schema version, and migrating it (``store current``, ``store migrate``).

The gateway migrates its database when it starts; ``store migrate`` does it ahead of a rollout (back the
database up first: there are no downgrades), ``store current`` only looks.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from gateway.cli.common import config_parent, load_store, print_json

ORDER = 25


async def _current(url: str) -> dict[str, Any]:
    from gateway.db import Database
    from gateway.schema import HEAD_REVISION, SCHEMA_VERSION, current_revision

    db = Database.connect(url)
    try:
        version, revision = await db.read(current_revision)
    finally:
        await db.close()
    return {"schema_version": version, "revision": revision, "head": HEAD_REVISION,
            "gateway_schema_version": SCHEMA_VERSION,
            "up_to_date": version == SCHEMA_VERSION and revision == HEAD_REVISION}


def _describe(state: dict[str, Any], migrate_command: str) -> str:
    version, revision = state["schema_version"], state["revision"]
    if version is None:
        return "empty database: the gateway creates its tables when it starts (or: hermes-gateway store migrate)"
    at = f"schema v{version}" + (f" (revision {revision})" if revision else " (from before Alembic)")
    if state["up_to_date"]:
        return f"{at}: up to date"
    if version > state["gateway_schema_version"]:
        return f"{at}: newer than this gateway (v{state['gateway_schema_version']}); upgrade the gateway"
    return (f"{at}: this gateway migrates it to v{state['gateway_schema_version']} when it starts; to do it now, "
            f"back the database up, then run: {migrate_command}")


def _cmd_current(args: argparse.Namespace) -> int:
    from gateway.config import cli_command

    cfg = load_store(args)
    state = asyncio.run(_current(cfg.store.url))
    if args.json:
        print_json(state)
    else:
        print(_describe(state, cli_command("store migrate", cfg.source)))
    return 0


async def _migrate(url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    from gateway.store import Store

    before = await _current(url)
    await (await Store.open(url)).close()
    return before, await _current(url)


def _cmd_migrate(args: argparse.Namespace) -> int:
    before, after = asyncio.run(_migrate(load_store(args).store.url))
    if before["up_to_date"]:
        print(f"schema v{after['schema_version']} (revision {after['revision']}): already up to date")
    else:
        was = f"v{before['schema_version']}" if before["schema_version"] is not None else "an empty database"
        print(f"migrated {was} to schema v{after['schema_version']} (revision {after['revision']})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``store current`` and ``store migrate``."""
    store = sub.add_parser("store", help="the database: schema version and migrations").add_subparsers(
        dest="store_command", required=True)
    current = store.add_parser("current", parents=[config_parent()], help="the database's schema version")
    current.add_argument("--json", action="store_true", help="print a JSON object")
    current.set_defaults(func=_cmd_current)
    migrate = store.add_parser("migrate", parents=[config_parent()],
                               help="migrate the database's schema now (back it up first)")
    migrate.set_defaults(func=_cmd_migrate)
