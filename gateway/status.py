"""The gateway at a glance, for ``GET /api/status`` and ``hermes-gateway status``.

The store's counts of work in progress (read-only queries in one transaction, shared by every replica on the
database) beside what only the answering process knows: its version, uptime, adapters and tool sandbox.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gateway.schema import cron_jobs_t, outbox_t, runs_t
from gateway.store import Store
from tools.sandbox import Isolation


@dataclass(frozen=True, slots=True)
class WorkCounts:
    """Work the store holds now: runs started and waiting, cron jobs, undelivered message parts."""

    runs_running: int
    runs_queued: int
    cron_active: int
    cron_due: int
    """Active jobs whose next fire time has passed (the scheduler fires them within its sync interval)."""
    cron_next_at: float | None
    """The earliest future fire time of an active job (unix seconds)."""
    outbox_pending: int
    outbox_in_doubt: int
    """Pending parts whose earlier sender died mid-send: the platform may already have them."""


def _count_if(condition: sa.ColumnElement[bool]) -> sa.ColumnElement[Any]:
    return sa.func.coalesce(sa.func.sum(sa.case((condition, 1), else_=0)), 0)


def _work_counts(conn: Connection, now: float) -> WorkCounts:
    status = runs_t.c.status
    runs = conn.execute(sa.select(_count_if(status == "running"), _count_if(status == "queued"))
                        .where(status.in_(("running", "queued")))).one()
    next_at = cron_jobs_t.c.next_fire_at
    cron = conn.execute(sa.select(sa.func.count(), _count_if(next_at <= now),
                                  sa.func.min(sa.case((next_at > now, next_at))))
                        .where(cron_jobs_t.c.state == "active")).one()
    outbox = conn.execute(sa.select(sa.func.count(), _count_if(outbox_t.c.in_doubt > 0))
                          .where(outbox_t.c.status == "pending")).one()
    return WorkCounts(int(runs[0]), int(runs[1]), int(cron[0]), int(cron[1]),
                      float(cron[2]) if cron[2] is not None else None, int(outbox[0]), int(outbox[1]))


async def work_counts(store: Store, now: float | None = None) -> WorkCounts:
    """The store's counts as of ``now`` (unix seconds; default: the current time)."""
    at = time.time() if now is None else now
    return await store.db.read(lambda conn: _work_counts(conn, at))


def gateway_version() -> str:
    """The installed package's version ("unknown" when run from a source tree without metadata)."""
    try:
        return version("hermes-gateway")
    except PackageNotFoundError:
        return "unknown"


def _iso(unix: float | None) -> str | None:
    return datetime.fromtimestamp(unix, UTC).isoformat(timespec="seconds") if unix is not None else None


async def gateway_summary(store: Store, ready: bool, readiness: dict[str, Any], *, started_at: float,
                          isolation: Isolation | None) -> dict[str, Any]:
    """The JSON body of ``GET /api/status``: readiness and its detail, version, uptime, the store's work counts
    and the tool sandbox's level (``isolation`` None: tools run in the gateway, ``tools.sandbox: none``)."""
    now = time.time()
    counts = await work_counts(store, now)
    sandbox = ({"level": isolation.level, "reason": isolation.reason} if isolation is not None
               else {"level": "none", "reason": "disabled (tools.sandbox: none): tools run inside the gateway"})
    return {"version": gateway_version(), "started_at": _iso(started_at), "uptime_seconds": round(now - started_at, 1),
            "ready": ready, **readiness,
            "runs": {"running": counts.runs_running, "queued": counts.runs_queued},
            "cron": {"active": counts.cron_active, "due": counts.cron_due, "next_at": _iso(counts.cron_next_at)},
            "outbox": {"pending": counts.outbox_pending, "in_doubt": counts.outbox_in_doubt},
            "tool_sandbox": sandbox}

