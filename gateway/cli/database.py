"""``store``: the database's schema version and migrations (``store current``, ``store migrate``), and its size
(``store stats``, ``store prune``, ``store vacuum``).

The gateway migrates its database when it starts; ``store migrate`` does it ahead of a rollout (back the
database up first: there are no downgrades), ``store current`` only looks. The gateway prunes by
``store.retention`` in the background; ``store prune`` does one pass now (``--dry-run``: counts only).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gateway.cli.common import config_parent, load_store, print_json

T = TypeVar("T")

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


async def _with_store(url: str, work: Callable[[Any], Awaitable[T]]) -> T:
    """``work(store)`` on the store at ``url`` (opened and migrated, then closed)."""
    from gateway.store import Store

    store = await Store.open(url)
    try:
        return await work(store)
    finally:
        await store.close()


def _cmd_prune(args: argparse.Namespace) -> int:
    from gateway.retention import prune

    settings = load_store(args).store
    report = asyncio.run(_with_store(settings.url, lambda store: prune(store, settings.retention,
                                                                       dry_run=args.dry_run, pause=0.0)))
    if args.json:
        print_json({"dry_run": args.dry_run, "rows": report.rows, "batches": report.batches,
                    "vacuumed_pages": report.vacuumed_pages})
        return 0
    verb = "would prune" if args.dry_run else "pruned"
    print(f"{verb} {report.total} rows: " + ", ".join(f"{k} {n}" for k, n in report.rows.items())
          + ("" if args.dry_run else f" ({report.batches} batches, {report.vacuumed_pages} pages handed back)"))
    return 0


def _size(value: int | None) -> str:
    return "-" if value is None else f"{value / 1048576:.2f} MiB"


def _cmd_stats(args: argparse.Namespace) -> int:
    from gateway.retention import stats

    out = asyncio.run(_with_store(load_store(args).store.url, stats))
    if args.json:
        print_json(out)
        return 0
    width = max(len(name) for name in out["tables"])
    for name, table in out["tables"].items():
        print(f"{name:<{width}}  {table['rows']:>10} rows  {_size(table['bytes']):>12}")
    if out["dialect"] == "postgresql":
        print(f"database: {_size(out['database_bytes'])}")
    else:
        print(f"file: {_size(out['file_bytes'])}, log: {_size(out['wal_bytes'])}, {out['pages']} pages "
              f"({out['free_pages']} free), auto_vacuum {out['auto_vacuum']}")
    return 0


def _cmd_vacuum(args: argparse.Namespace) -> int:
    from gateway.retention import vacuum

    print(asyncio.run(vacuum(load_store(args).store.url)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``store current|migrate|stats|prune|vacuum``."""
    store = sub.add_parser("store", help="the database: schema version, migrations, size and pruning").add_subparsers(
        dest="store_command", required=True)
    current = store.add_parser("current", parents=[config_parent()], help="the database's schema version")
    current.add_argument("--json", action="store_true", help="print a JSON object")
    current.set_defaults(func=_cmd_current)
    migrate = store.add_parser("migrate", parents=[config_parent()],
                               help="migrate the database's schema now (back it up first)")
    migrate.set_defaults(func=_cmd_migrate)
    stats = store.add_parser("stats", parents=[config_parent()], help="rows and bytes per table, size on disk")
    stats.add_argument("--json", action="store_true", help="print a JSON object")
    stats.set_defaults(func=_cmd_stats)
    prune = store.add_parser("prune", parents=[config_parent()],
                             help="prune what store.retention says is old and finished, now")
    prune.add_argument("--dry-run", action="store_true", help="count what would go; delete nothing")
    prune.add_argument("--json", action="store_true", help="print a JSON object")
    prune.set_defaults(func=_cmd_prune)
    vacuum = store.add_parser("vacuum", parents=[config_parent()],
                              help="SQLite: switch to incremental auto-vacuum (once) and shrink the file; "
                                   "PostgreSQL: VACUUM (ANALYZE)")
    vacuum.set_defaults(func=_cmd_vacuum)
