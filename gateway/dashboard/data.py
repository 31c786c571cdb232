"""What the dashboard shows, read from the running gateway and its store; and the actions it takes, each through
the code path the chat commands and the CLI use."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gateway.approvals import end_conversation
from gateway.config import Config
from gateway.coordination import Coordinator
from gateway.cron import CronService
from gateway.dashboard.metrics_history import MetricsHistory, metric_value
from gateway.metrics import Metrics
from gateway.pairing import PendingCode, notify_approved
from gateway.router import Router
from gateway.schema import runs_t, session_settings_t, sessions_t
from gateway.session_settings import clear_title
from gateway.status import work_counts
from gateway.store import FINAL_RUN_STATES, OutboxRow, RunRow, Store, bump_epoch
from platforms.base import BasePlatformAdapter
from platforms.webhook import RecentDelivery, WebhookAdapter

RUN_STATUSES = ("queued", "running", "completed", "failed", "cancelled")
RUN_KINDS = ("chat", "webhook", "cron", "api")
LIST_LIMIT = 200


@dataclass(slots=True)
class DashboardContext:
    """The parts of a started gateway the dashboard reads and acts through."""

    cfg: Config
    store: Store
    router: Router
    cron: CronService
    adapters: Mapping[str, BasePlatformAdapter]
    metrics: Metrics
    coordinator: Coordinator
    history: MetricsHistory = field(init=False)

    def __post_init__(self) -> None:
        self.history = MetricsHistory(self.metrics)


@dataclass(frozen=True, slots=True)
class RunFilter:
    """The runs page's filters (empty: any)."""

    platform: str = ""
    kind: str = ""
    route: str = ""
    status: str = ""

    @classmethod
    def of(cls, query: Mapping[str, str]) -> RunFilter:
        """The filters of a query string; unknown kinds and statuses are ignored."""
        kind, status = query.get("kind", ""), query.get("status", "")
        return cls(query.get("platform", "").strip(), kind if kind in RUN_KINDS else "",
                   query.get("route", "").strip(), status if status in RUN_STATUSES else "")


def _runs(conn: Connection, where: RunFilter, limit: int) -> list[dict[str, Any]]:
    c = runs_t.c
    query = (sa.select(c.id, c.kind, c.source, c.session_key, c.status, c.prompt, c.deliver_to, c.created_at,
                       c.started_at, c.finished_at).order_by(c.created_at.desc()).limit(limit))
    if where.platform:  # where the run came from (its session), or where its answer goes
        query = query.where(sa.or_(c.session_key.startswith(f"{where.platform}:", autoescape=True),
                                   c.deliver_to.startswith(f"{where.platform}:", autoescape=True)))
    if where.kind:
        query = query.where(c.kind == where.kind)
    if where.route:
        query = query.where(c.kind == "webhook", c.source == where.route)
    if where.status:
        query = query.where(c.status == where.status)
    return [dict(row._mapping) for row in conn.execute(query)]


async def list_runs(store: Store, where: RunFilter, limit: int = LIST_LIMIT) -> list[dict[str, Any]]:
    """The latest runs that pass the filters, newest first."""
    return await store.db.read(lambda conn: _runs(conn, where, limit))


async def run_statuses(store: Store, limit: int = LIST_LIMIT) -> dict[str, str]:
    """Run id -> status of the latest runs (what the live runs list follows)."""
    rows = await store.db.read(lambda conn: conn.execute(
        sa.select(runs_t.c.id, runs_t.c.status).order_by(runs_t.c.created_at.desc()).limit(limit)).all())
    return {row.id: row.status for row in rows}


def _in_flight(conn: Connection) -> dict[str, dict[str, int]]:
    rows = conn.execute(sa.select(runs_t.c.kind, runs_t.c.status, sa.func.count())
                        .where(runs_t.c.status.in_(("queued", "running")))
                        .group_by(runs_t.c.kind, runs_t.c.status)).all()
    out: dict[str, dict[str, int]] = {}
    for kind, status, count in rows:
        out.setdefault(kind, {"running": 0, "queued": 0})[status] = int(count)
    return out


def role(coordinator: Coordinator) -> str:
    """``sole`` (the only gateway on its database), ``leader`` or ``replica``."""
    return "sole" if coordinator.sole else "leader" if coordinator.is_leader else "replica"


async def overview(ctx: DashboardContext) -> dict[str, Any]:
    """The overview's figures: adapters, work in progress per kind, outbox, loop lag, error rate, role."""
    counts = await work_counts(ctx.store)
    per_kind = await ctx.store.db.read(_in_flight)
    replicas = await ctx.coordinator.live_replicas()
    rate = ctx.history.error_rate()
    lag = metric_value(ctx.metrics.loop_lag, "hermes_event_loop_lag_seconds")
    return {
        "adapters": [{"platform": name, "state": str(s["state"]), "receiving": bool(s["receiving"]),
                      "last_error": s["last_error"] or ""}
                     for name, adapter in sorted(ctx.adapters.items()) for s in (adapter.status(),)],
        "stats": {"runs-in-flight": counts.runs_running, "queued": counts.runs_queued,
                  "outbox-pending": counts.outbox_pending, "outbox-in-doubt": counts.outbox_in_doubt,
                  "loop-lag": f"{1000 * lag:.1f} ms",
                  "error-rate": rate.text, "role": role(ctx.coordinator)},
        "per_kind": per_kind, "finished_last_hour": rate.finished,
        "replicas": len(replicas) if replicas is not None else None,
        "cron": {"active": counts.cron_active, "due": counts.cron_due},
    }


def _sessions(conn: Connection, platform: str, limit: int) -> list[dict[str, Any]]:
    s = sessions_t.c
    query = (sa.select(s.key, s.platform, s.chat_id, s.user_id, s.thread_id, s.epoch, s.updated_at,
                       session_settings_t.c.title)
             .select_from(sessions_t.outerjoin(session_settings_t, session_settings_t.c.session_key == s.key))
             .order_by(s.platform, s.updated_at.desc()).limit(limit))
    if platform:
        query = query.where(s.platform == platform)
    return [dict(row._mapping) for row in conn.execute(query)]


async def list_sessions(store: Store, platform: str = "", limit: int = LIST_LIMIT) -> list[dict[str, Any]]:
    """Sessions by platform, the latest active first within each."""
    return await store.db.read(lambda conn: _sessions(conn, platform, limit))


def _new_conversation(conn: Connection, key: str) -> bool:
    if conn.execute(sa.select(sessions_t.c.key).where(sessions_t.c.key == key)).first() is None:
        return False
    # What /new stores (gateway/commands/core.py), in one transaction.
    bump_epoch(conn, key)
    clear_title(conn, key)
    end_conversation(conn, key)
    return True


async def reset_session(store: Store, key: str) -> bool:
    """Start the session's next conversation, as ``/new`` does; False for an unknown session."""
    return await store.db.write(lambda conn: _new_conversation(conn, key))


async def approve_code(ctx: DashboardContext, code: str, operator: str) -> tuple[bool, str]:
    """Approve a pairing code and tell its user (as ``/pair approve`` does)."""
    result = await ctx.router.pairing.approve(code, f"dashboard:{operator}")
    if result.ok and result.code is not None:
        ctx.router.outbox.submit(await notify_approved(ctx.store, result.code) or [])
    return result.ok, result.message


async def pending_codes(ctx: DashboardContext) -> list[PendingCode]:
    """Pairing codes waiting for approval."""
    return await ctx.router.pairing.pending(time.time())


def webhook_deliveries(ctx: DashboardContext) -> dict[str, list[RecentDelivery]]:
    """Per configured webhook route, the adapter's last answers, newest first."""
    adapter = ctx.adapters.get("webhook")
    recent = adapter.recent if isinstance(adapter, WebhookAdapter) else {}
    return {name: list(reversed(recent.get(name, ()))) for name in ctx.cfg.platforms.webhook.routes}


PREVIEW_CHARS = 500


def _preview(text: str | None, limit: int = PREVIEW_CHARS) -> str:
    text = text or ""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _arguments(raw: Any) -> str:
    """A tool call's arguments as indented JSON (as stored when they are not JSON)."""
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return str(raw)
    return json.dumps(value, ensure_ascii=False, indent=1)


def run_detail(row: RunRow, parts: list[OutboxRow], live: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's page data: its row, its tool calls (stored when it ended; while it runs, those announced so far),
    model calls and tokens, and its delivery parts; ``settled`` once it ended and no part is pending."""
    calls = [{"name": c.get("name", "?"), "arguments": _arguments(c.get("arguments", "")),
              "result": _preview(str(c.get("result", ""))), "seconds": c.get("seconds"),
              "error": bool(c.get("error"))} for c in row.tool_calls]
    if not calls:
        calls = [{"name": t.get("name", "?"), "arguments": t.get("line", ""), "result": None, "seconds": None,
                  "error": False} for t in live]
    deliveries = [{"index": p.part_index + 1, "total": p.parts_total, "platform": p.platform, "chat_id": p.chat_id,
                   "state": p.status, "in_doubt": bool(p.in_doubt), "attempts": p.attempts,
                   "error": p.last_error or "", "text": _preview(p.text, 200)} for p in parts]
    final = row.status in FINAL_RUN_STATES
    return {"id": row.id, "kind": row.kind, "source": row.source, "session_key": row.session_key,
            "status": row.status, "prompt": row.prompt, "result": row.result, "error": row.error,
            "created_at": row.created_at, "started_at": row.started_at, "finished_at": row.finished_at,
            "model_calls": row.model_calls, "model_seconds": row.model_seconds, "usage": row.usage,
            "tool_calls": calls, "deliveries": deliveries, "final": final,
            "settled": final and all(d["state"] != "pending" for d in deliveries)}
