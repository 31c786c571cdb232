"""Retention: pruning what is old and finished, in small batches off the hot path (``store.retention``).

What goes, each kind after its own window (``RetentionSettings``):

- **events** (``cron_fires`` for cron's): a finished inbox event (status ``done``) whose run has ended, with that
  run. Its dedupe key is the gateway's memory of the event: while it is younger than ``dedupe`` the row stays as
  a compact record (payload emptied, status ``pruned``, the run deleted), so a platform redelivering the event
  still finds it; then the row goes. Unfinished events and runs are never touched.
- **transcripts**: messages older than the window, whole runs at a time (a run's messages share one time). The
  model then sees less of a long conversation (its compression summary still covers what it had folded in); a
  session's summary goes once its conversation has no messages left.
- **outbox**: parts sent, and parts that failed without doubt, older than the window. Pending parts and failed
  parts the platform may have received (``in_doubt``) stay.
- **usage**: ``run_usage`` rows older than the window, but never the current or the previous month (``/usage``).
- expired pairing codes and failed-approval records once they no longer count for rate limits or lockouts.
- **tool_results**: long tool results stored in the workspace (``ResultPruner``, on every replica: each may have
  its own workspace), a run's directory once its last result is older than the window.

Each batch is one short write (``batch_size`` rows, found by key ranges and the status indexes, so no batch
scans the table); the loop runs on the leader only and yields between batches. On SQLite the freed pages are
then handed back to the file system with ``PRAGMA incremental_vacuum`` (a database created before retention
needs one ``hermes-gateway store vacuum`` to switch to incremental auto-vacuum).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gateway.config import Config, ConfigError
from gateway.config.sections import LimitsSettings
from gateway.config.store import RetentionSettings
from gateway.db import Database, SqliteDatabase, normalize_url
from gateway.pairing import CODE_MESSAGE_INTERVAL, LOCKOUT_SECONDS
from gateway.schema import (
    approvals_t,
    inbox_t,
    messages_t,
    metadata,
    outbox_files_t,
    outbox_t,
    pairing_codes_t,
    pairing_failures_t,
    platform_state_t,
    run_usage_t,
    runs_t,
    session_summaries_t,
    user_rate_limits_t,
    user_usage_t,
)
from gateway.shared_limits import BUDGET_MINUTES
from gateway.store import FINAL_RUN_STATES, Store
from tools.result_store import prune_results

logger = logging.getLogger(__name__)

BATCH_PAUSE = 0.05  # seconds between two batches: other writers go first
VACUUM_STEP = 512  # SQLite pages handed back per write (2 MiB at the default page size)
VACUUM_RESERVE = 0.1  # free pages kept for new rows, as a share of the file, before any are handed back
KINDS = ("events", "dedupe", "transcripts", "summaries", "outbox", "files", "usage", "approvals", "interactions",
         "pairing", "limits")


@dataclass(slots=True)
class PruneReport:
    """Rows pruned (or, for a dry run, that would be) per kind, and the write batches used."""

    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    batches: int = 0
    vacuumed_pages: int = 0

    @property
    def total(self) -> int:
        """Rows in all."""
        return sum(self.rows.values())


def dedupe_windows(cfg: Config) -> dict[str, float]:
    """The configured sources' own redelivery or replay windows (seconds), by config key."""
    windows: dict[str, float] = {}
    for name, route in cfg.platforms.webhook.routes.items():
        key = f"platforms.webhook.routes.{name}"
        windows[f"{key}.tolerance_seconds"] = float(route.tolerance_seconds)
        if route.scheme == "github":
            windows[f"{key}.replay_window_seconds"] = float(route.replay_window_seconds)
    if cfg.platforms.discord.enabled:
        windows["platforms.discord.backfill_window"] = cfg.platforms.discord.backfill_window
    return windows


def check_dedupe_window(cfg: Config) -> None:
    """Raise ``ConfigError`` when ``store.retention.dedupe`` is shorter than a source's own window."""
    kept = cfg.store.retention.dedupe
    short = {key: w for key, w in dedupe_windows(cfg).items() if kept is not None and w > kept}
    if short:
        key, window = max(short.items(), key=lambda kv: kv[1])
        raise ConfigError("store.retention.dedupe", f"{kept:g}s is shorter than {key} ({window:g}s): an event "
                          "redelivered within that window after its dedupe key was pruned would run again",
                          f"set store.retention.dedupe to at least {window:g}s (e.g. {window / 3600:g}h)")


def _month_start(now: float, months_back: int) -> float:
    day = datetime.fromtimestamp(now, UTC).date().replace(day=1)
    for _ in range(months_back):
        day = (day - timedelta(days=1)).replace(day=1)
    return datetime(day.year, day.month, 1, tzinfo=UTC).timestamp()


@dataclass(slots=True, frozen=True)
class _Cutoffs:
    """Unix times: rows of a kind older than its cutoff may go (None: kept forever)."""

    events: float | None
    cron_fires: float | None
    dedupe_events: float | None
    dedupe_cron: float | None
    transcripts: float | None
    outbox: float | None
    usage: float | None
    pairing_codes: float
    pairing_failures: float
    now: float

    @classmethod
    def at(cls, rules: RetentionSettings, now: float) -> _Cutoffs:
        def before(seconds: float | None) -> float | None:
            return None if seconds is None else now - seconds

        def dedupe_after(kept: float | None) -> float | None:  # the row itself: after both windows
            return None if kept is None or rules.dedupe is None else now - max(kept, rules.dedupe)

        usage = before(rules.usage)
        if usage is not None:  # /usage reads the current and the previous month, in any time zone
            usage = min(usage, _month_start(now, 1) - 86400)
        return cls(before(rules.events), before(rules.cron_fires), dedupe_after(rules.events),
                   dedupe_after(rules.cron_fires), before(rules.transcripts), before(rules.outbox), usage,
                   now - CODE_MESSAGE_INTERVAL, now - LOCKOUT_SECONDS, now)


def _per_platform(cron: float | None, other: float | None) -> Any:
    """``inbox.updated_at`` older than the cutoff of the row's kind (cron fires or other events)."""
    parts = [sa.and_(inbox_t.c.platform == "cron", inbox_t.c.updated_at < cron)] if cron is not None else []
    if other is not None:
        parts.append(sa.and_(inbox_t.c.platform != "cron", inbox_t.c.updated_at < other))
    return sa.or_(*parts) if parts else None


_RUN_UNFINISHED = sa.exists().where(runs_t.c.id == inbox_t.c.run_id, runs_t.c.status.not_in(FINAL_RUN_STATES))
_PRUNED = "pruned"  # an inbox row kept only for its dedupe key
INTERACTION_STATE_PREFIX = "discord:interaction:"
"""platform_state keys of Discord interaction tokens (platforms/discord_interactions.py writes them)."""


@dataclass(slots=True, frozen=True)
class _Kind:
    """One kind of row to prune: which rows (``where``), found how (``key`` ascending, from rows matching
    ``scope`` so an index serves the search), up to the first row of the scope newer than ``newest``
    (``age``: the column that keeps key order), and what else goes with a batch (``apply``)."""

    name: str
    table: sa.Table
    key: sa.Column[Any]
    where: Any
    scope: Any = None
    age: sa.Column[Any] | None = None
    newest: float | None = None
    apply: Callable[[Connection, list[Any]], None] | None = None


def _compact(conn: Connection, ids: list[Any]) -> None:
    """Events past their window: their runs go, the rows stay as compact dedupe records."""
    run_ids = sa.select(inbox_t.c.run_id).where(inbox_t.c.id.in_(ids), inbox_t.c.run_id.is_not(None))
    conn.execute(runs_t.delete().where(runs_t.c.id.in_(run_ids), runs_t.c.status.in_(FINAL_RUN_STATES)))
    conn.execute(inbox_t.update().where(inbox_t.c.id.in_(ids)).values(status=_PRUNED, payload="{}"))


def _limit_kinds(cut: _Cutoffs, limits: LimitsSettings | None) -> list[_Kind]:
    """Users' limit rows that no longer limit anything: minutes of usage past the hourly budgets' hour, and
    buckets refilled to full by now (a missing bucket is a full one). Without the limits (the CLI reads only the
    store's config), buckets stay."""
    kinds = [_Kind("limits", user_usage_t, user_usage_t.c.user_key,
                   user_usage_t.c.minute < int(cut.now // 60) - BUDGET_MINUTES)]
    if limits is not None:
        b, rate = user_rate_limits_t, limits.user_messages_per_minute / 60
        full = b.c.tokens + (cut.now - b.c.refilled_at) * rate >= limits.user_burst
        kinds.append(_Kind("limits", b, b.c.user_key, full))
    return kinds


def _kinds(cut: _Cutoffs) -> list[_Kind]:
    kinds: list[_Kind] = []
    events = _per_platform(cut.cron_fires, cut.events)
    done = inbox_t.c.status == "done"
    newest = max((c for c in (cut.events, cut.cron_fires) if c is not None), default=None)
    if events is not None:
        kinds.append(_Kind("events", inbox_t, inbox_t.c.id, sa.and_(done, events, ~_RUN_UNFINISHED), done,
                           inbox_t.c.created_at, newest, _compact))
    dedupe = _per_platform(cut.dedupe_cron, cut.dedupe_events)
    if dedupe is not None:
        pruned = inbox_t.c.status == _PRUNED
        kinds.append(_Kind("dedupe", inbox_t, inbox_t.c.id, sa.and_(pruned, dedupe), pruned, inbox_t.c.created_at,
                           max(c for c in (cut.dedupe_events, cut.dedupe_cron) if c is not None)))
    if cut.transcripts is not None:
        kinds.append(_Kind("transcripts", messages_t, messages_t.c.id, messages_t.c.created_at < cut.transcripts,
                           None, messages_t.c.created_at, cut.transcripts))
        s = session_summaries_t
        left = sa.exists().where(messages_t.c.session_key == s.c.session_key, messages_t.c.epoch == s.c.epoch)
        kinds.append(_Kind("summaries", s, s.c.session_key, sa.and_(s.c.updated_at < cut.transcripts, ~left)))
    if cut.outbox is not None:
        sent = outbox_t.c.status == "sent"
        failed = sa.and_(outbox_t.c.status == "failed", outbox_t.c.in_doubt == 0)
        kinds.append(_Kind("outbox", outbox_t, outbox_t.c.id, sa.and_(sent, outbox_t.c.sent_at < cut.outbox), sent,
                           outbox_t.c.created_at, cut.outbox))
        kinds.append(_Kind("outbox", outbox_t, outbox_t.c.id, sa.and_(failed, outbox_t.c.created_at < cut.outbox),
                           outbox_t.c.status == "failed", outbox_t.c.created_at, cut.outbox))
    # A sent file's bytes go once no undelivered part needs them (they are written with their parts, in one
    # transaction, so none is ever missing while its part waits).
    files = outbox_files_t
    waiting = sa.exists().where(outbox_t.c.file_sha256 == files.c.sha256, outbox_t.c.status == "pending")
    kinds.append(_Kind("files", files, files.c.sha256, ~waiting))
    if cut.usage is not None:
        kinds.append(_Kind("usage", run_usage_t, run_usage_t.c.run_id, run_usage_t.c.created_at < cut.usage))
    if cut.events is not None:  # answered approval requests go with the events they answered
        answered = sa.and_(approvals_t.c.status != "pending", approvals_t.c.decided_at < cut.events)
        kinds.append(_Kind("approvals", approvals_t, approvals_t.c.id, answered))
    # Discord interaction tokens kept for answering slash commands after a restart: dead after 15 minutes.
    state = platform_state_t
    kinds.append(_Kind("interactions", state, state.c.key, sa.and_(state.c.key.like(f"{INTERACTION_STATE_PREFIX}%"),
                                                                   state.c.updated_at < cut.now - 86400)))
    kinds.append(_Kind("pairing", pairing_codes_t, pairing_codes_t.c.code,
                       pairing_codes_t.c.expires_at < cut.pairing_codes))
    kinds.append(_Kind("pairing", pairing_failures_t, pairing_failures_t.c.id,
                       pairing_failures_t.c.at < cut.pairing_failures))
    return kinds


def _bound(conn: Connection, kind: _Kind) -> Any:
    """The first key of the kind's scope that is newer than its cutoff: rows before it are the candidates
    (keys grow with time), so a batch never walks the recent part of the table."""
    if kind.age is None or kind.newest is None:
        return None
    query = sa.select(kind.key).where(kind.age >= kind.newest).order_by(kind.key).limit(1)
    return conn.execute(query.where(kind.scope) if kind.scope is not None else query).scalar()


def _candidates(kind: _Kind, bound: Any, limit: int) -> Any:
    query = sa.select(kind.key).where(kind.where)
    if bound is not None:
        query = query.where(kind.key < bound)
    return query.order_by(kind.key).limit(limit)


def _prune_batch(conn: Connection, kind: _Kind, bound: Any, limit: int) -> int:
    ids = list(conn.execute(_candidates(kind, bound, limit)).scalars())
    if ids:
        if kind.apply is not None:
            kind.apply(conn, ids)
        else:
            conn.execute(kind.table.delete().where(kind.key.in_(ids)))
    return len(ids)


def _count(conn: Connection, kind: _Kind) -> int:
    return int(conn.execute(sa.select(sa.func.count()).select_from(kind.table).where(kind.where)).scalar_one())


async def prune(store: Store, rules: RetentionSettings, *, now: float | None = None, dry_run: bool = False,
                pause: float = BATCH_PAUSE, limits: LimitsSettings | None = None) -> PruneReport:
    """Prune every kind once, in batches of ``rules.batch_size`` rows, each its own short write; a dry run
    only counts. ``now`` is the time the windows are measured back from; ``limits``: the gateway's, for users'
    rate-limit buckets."""
    cut = _Cutoffs.at(rules, time.time() if now is None else now)
    report = PruneReport()
    db = store.db
    for kind in _kinds(cut) + _limit_kinds(cut, limits):
        if dry_run:
            report.rows[kind.name] += await db.read(lambda conn, kind=kind: _count(conn, kind))
            continue
        bound = await db.read(lambda conn, kind=kind: _bound(conn, kind))
        while True:
            done = await db.write(functools.partial(_prune_batch, kind=kind, bound=bound, limit=rules.batch_size))
            report.batches += 1
            report.rows[kind.name] += done
            if done < rules.batch_size:
                break
            await asyncio.sleep(pause)
    if not dry_run and db.dialect == "sqlite":
        report.vacuumed_pages = await _hand_back_pages(db, pause)
    return report


def _free_pages(conn: Connection) -> tuple[int, int, int]:
    """(auto_vacuum mode, page count, free pages) of a SQLite database."""
    return tuple(int(conn.exec_driver_sql(f"PRAGMA {p}").scalar_one())  # type: ignore[return-value]
                 for p in ("auto_vacuum", "page_count", "freelist_count"))


def _vacuum_step(conn: Connection, pages: int) -> int:
    # Python's sqlite3 steps a statement that returns no rows once: one page per PRAGMA incremental_vacuum.
    for _ in range(pages):
        conn.exec_driver_sql("PRAGMA incremental_vacuum(1)")
    return pages


async def _hand_back_pages(db: Database, pause: float) -> int:
    """With incremental auto-vacuum: give free pages beyond a reserve back to the file system, a few at a time."""
    handed = 0
    while True:
        mode, total, free = await db.read(_free_pages)
        excess = free - int(total * VACUUM_RESERVE)
        if mode != 2 or excess <= 0:
            return handed
        handed += await db.write(functools.partial(_vacuum_step, pages=min(excess, VACUUM_STEP)))
        await asyncio.sleep(pause)


class Pruner:
    """The background loop: a prune every ``rules.interval`` seconds while this replica leads."""

    def __init__(self, store: Store, rules: RetentionSettings, limits: LimitsSettings | None = None) -> None:
        self.store = store
        self.rules = rules
        self.limits = limits
        self.last: PruneReport | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        """Whether the loop runs."""
        return self._task is not None

    def start(self) -> None:
        """Start the loop (its first prune at once)."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="retention")

    async def stop(self) -> None:
        """Stop the loop (a batch in progress commits or rolls back as a whole)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            try:
                self.last = report = await prune(self.store, self.rules, limits=self.limits)
                if report.total:
                    logger.info("retention: pruned %s in %d batches",
                                ", ".join(f"{n} {k}" for k, n in report.rows.items() if n), report.batches)
            except Exception:
                logger.exception("retention: prune failed (retried in %gs)", self.rules.interval)
            await asyncio.sleep(self.rules.interval)


class ResultPruner:
    """Every ``rules.interval`` seconds, the long tool results stored in ``workspace`` (``tools.result_store``) that
    are older than ``rules.tool_results`` go. On every replica, not only the leader: each may have its own
    workspace."""

    def __init__(self, workspace: Path, rules: RetentionSettings) -> None:
        self.workspace = workspace
        self.rules = rules
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the loop (its first prune at once); nothing to do when results are kept forever."""
        if self._task is None and self.rules.tool_results is not None:
            self._task = asyncio.create_task(self._loop(self.rules.tool_results), name="retention-tool-results")

    async def stop(self) -> None:
        """Stop the loop."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _loop(self, window: float) -> None:
        while True:
            try:
                removed = await asyncio.to_thread(prune_results, self.workspace, window)
                if removed:
                    logger.info("retention: removed the stored tool results of %d runs", removed)
            except Exception:
                logger.exception("retention: pruning stored tool results failed (retried in %gs)", self.rules.interval)
            await asyncio.sleep(self.rules.interval)


# -- stats and vacuum (hermes-gateway store stats|vacuum) ---------------------------------------------------------


def _sqlite_path(db: Database) -> str | None:
    path = db.engine.url.database if isinstance(db, SqliteDatabase) else None
    return path if path and path != ":memory:" else None


def _table_stats(conn: Connection) -> dict[str, dict[str, int | None]]:
    names = [t.name for t in metadata.sorted_tables if sa.inspect(conn).has_table(t.name)]
    sizes: dict[str, int] = {}
    if conn.dialect.name == "postgresql":
        for name in names:
            sizes[name] = int(conn.execute(sa.text("SELECT pg_total_relation_size(CAST(:t AS regclass))"),
                                           {"t": name}).scalar_one())
    else:
        with contextlib.suppress(sa.exc.OperationalError):  # SQLite built without the dbstat table
            for row in conn.exec_driver_sql(
                    "SELECT coalesce(i.tbl_name, d.name), sum(d.pgsize) FROM dbstat d "
                    "LEFT JOIN sqlite_schema i ON i.name = d.name GROUP BY 1"):
                sizes[row[0]] = int(row[1])
    return {name: {"rows": int(conn.execute(sa.select(sa.func.count()).select_from(metadata.tables[name]))
                               .scalar_one()), "bytes": sizes.get(name)} for name in names}


async def stats(store: Store) -> dict[str, Any]:
    """Rows and bytes per table, and the database's size on disk."""
    db = store.db
    out: dict[str, Any] = {"dialect": db.dialect, "tables": await db.read(_table_stats)}
    if db.dialect == "postgresql":
        out["database_bytes"] = await db.read(
            lambda conn: int(conn.execute(sa.text("SELECT pg_database_size(current_database())")).scalar_one()))
        return out
    mode, total, free = await db.read(_free_pages)
    path = _sqlite_path(db)
    out.update(auto_vacuum={0: "none", 1: "full", 2: "incremental"}.get(mode, str(mode)), pages=total,
               free_pages=free, file_bytes=file_size(path) if path else None,
               wal_bytes=file_size(f"{path}-wal") if path else None)
    return out


def file_size(path: str) -> int:
    """A file's size in bytes (0 when it does not exist)."""
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def _sqlite_vacuum(path: str) -> str:
    import sqlite3

    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            conn.execute("VACUUM")  # rebuilds the file: the mode takes effect, every free page is dropped
            done = "switched to incremental auto-vacuum and rebuilt the file"
        else:
            conn.executescript("PRAGMA incremental_vacuum;")  # executescript steps it to the end
            done = "handed every free page back"
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return done
    finally:
        conn.close()


async def vacuum(url: str) -> str:
    """SQLite: switch to incremental auto-vacuum (a one-time ``VACUUM``) or hand every free page back;
    PostgreSQL: ``VACUUM (ANALYZE)`` of the gateway's tables. Returns what was done."""
    url = normalize_url(url)
    if url.startswith("sqlite"):
        path = url.split(":///", 1)[-1].split("?", 1)[0]
        return await asyncio.to_thread(_sqlite_vacuum, path)
    import asyncpg

    conn = await asyncpg.connect("postgresql://" + url.split("://", 1)[1])
    try:
        present = {r["tablename"] for r in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}
        tables = [t.name for t in metadata.sorted_tables if t.name in present]
        for name in tables:  # outside a transaction, one table at a time
            await conn.execute(f'VACUUM (ANALYZE) "{name}"')
    finally:
        await conn.close()
    return f"VACUUM (ANALYZE) of {len(tables)} tables"
