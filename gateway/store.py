"""Durable state: sessions, transcripts, inbox, runs, outbox, memory and todos.

SQLAlchemy 2 Core, written once as synchronous units of work that ``gateway.db`` runs in
one transaction each (SQLite on its own thread with group commit, PostgreSQL through
asyncpg). Hot statements are built once with bound parameters. Times are stored as UTC
unix seconds. Every method that changes state commits before it returns.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gateway.db import Database
from gateway.schema import (
    inbox_t,
    insert_ignoring_conflicts,
    messages_t,
    outbox_files_t,
    outbox_t,
    run_usage_t,
    runs_t,
    sessions_t,
    upgrade,
)
from gateway.shared_limits import charge_user
from gateway.store_rows import (
    Acceptance,
    ChatMessage,
    FilePart,
    InboxRow,
    NewRun,
    OutboxPart,
    OutboxRow,
    RunCompletion,
    RunRow,
    RunUsage,
    SessionRef,
)
from platforms.base import Choice

logger = logging.getLogger(__name__)

# The rows are defined in gateway/store_rows.py and re-exported here, where callers have always found them.
__all__ = [
    "Acceptance",
    "ChatMessage",
    "InboxRow",
    "NewRun",
    "OutboxPart",
    "OutboxRow",
    "RunCompletion",
    "RunRow",
    "RunUsage",
    "SessionRef",
]

def dumps(value: Any) -> str:
    """Compact JSON as stored in text columns."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


FINAL_RUN_STATES = ("completed", "failed", "cancelled")


# -- statements built once (bound parameters are named b_* where a column has the same name) ----


_INBOX_BY_KEY = sa.select(inbox_t.c.id, inbox_t.c.run_id).where(inbox_t.c.dedupe_key == sa.bindparam("b_key"))
_REPLAY_MARKER = sa.select(inbox_t.c.payload).where(inbox_t.c.dedupe_key == sa.bindparam("b_key"),
                                                    inbox_t.c.status == "pruned",
                                                    inbox_t.c.updated_at >= sa.bindparam("b_since"))
_INBOX_STATUS = (inbox_t.update().where(inbox_t.c.id == sa.bindparam("b_id"))
                 .values(status=sa.bindparam("b_status"), updated_at=sa.bindparam("b_now")))
_UNFINISHED = ("pending", "running")
_INBOX_CLOSE = (inbox_t.update().where(inbox_t.c.id == sa.bindparam("b_id"), inbox_t.c.status.in_(_UNFINISHED))
                .values(status="done", updated_at=sa.bindparam("b_now")))
_INBOX_UNFINISHED = sa.select(inbox_t).where(inbox_t.c.status.in_(_UNFINISHED)).order_by(inbox_t.c.id)
_INBOX_NEXT_RUN = (sa.select(inbox_t).where(inbox_t.c.session_key == sa.bindparam("b_key"),
                                            inbox_t.c.status.in_(_UNFINISHED), inbox_t.c.kind != "command")
                   .order_by(inbox_t.c.id).limit(1))
_INBOX_WAITING = (sa.select(inbox_t.c.session_key, inbox_t.c.kind, inbox_t.c.id)
                  .where(inbox_t.c.status.in_(_UNFINISHED), inbox_t.c.updated_at < sa.bindparam("b_before"))
                  .order_by(inbox_t.c.id).limit(sa.bindparam("b_limit")))
_RUN_INSERT = runs_t.insert()
_RUN_START = (runs_t.update().where(runs_t.c.id == sa.bindparam("b_id"), runs_t.c.status.not_in(FINAL_RUN_STATES))
              .values(status="running", started_at=sa.func.coalesce(runs_t.c.started_at, sa.bindparam("b_now")),
                      attempts=runs_t.c.attempts + 1))
_RUN_FINISH = (runs_t.update().where(runs_t.c.id == sa.bindparam("b_id"), runs_t.c.status.not_in(FINAL_RUN_STATES))
               .values(status=sa.bindparam("b_status"), result=sa.bindparam("b_result"),
                       error=sa.bindparam("b_error"), tool_calls=sa.bindparam("b_tool_calls"),
                       model_calls=sa.bindparam("b_model_calls"), model_seconds=sa.bindparam("b_model_seconds"),
                       ended_by=sa.bindparam("b_ended_by"), finished_at=sa.bindparam("b_now")))
_RUNS = (sa.select(runs_t, run_usage_t.c.model.label("usage_model"), run_usage_t.c.user_key,
                  run_usage_t.c.prompt_tokens, run_usage_t.c.completion_tokens)
         .select_from(runs_t.outerjoin(run_usage_t, run_usage_t.c.run_id == runs_t.c.id)))
_RUN_BY_ID = _RUNS.where(runs_t.c.id == sa.bindparam("b_id"))
_RUN_ATTEMPTS = (sa.select(runs_t.c.attempts)
                 .where(runs_t.c.id == sa.bindparam("b_id"), runs_t.c.status.not_in(FINAL_RUN_STATES))
                 .with_for_update())
_RUN_GIVE_BACK = (runs_t.update()
                  .where(runs_t.c.id == sa.bindparam("b_id"), runs_t.c.status.not_in(FINAL_RUN_STATES),
                         runs_t.c.attempts > 0)
                  .values(attempts=runs_t.c.attempts - 1))
_SESSION_EPOCH = sa.select(sessions_t.c.epoch).where(sessions_t.c.key == sa.bindparam("b_key"))
_HISTORY = (sa.select(messages_t).where(messages_t.c.session_key == sa.bindparam("b_key"),
                                        messages_t.c.epoch == sa.bindparam("b_epoch"))
            .order_by(messages_t.c.id.desc()).limit(sa.bindparam("b_limit")))
_MESSAGES_INSERT = messages_t.insert()
_USAGE_INSERT = run_usage_t.insert()
_LAST_USER = (sa.select(messages_t.c.id, messages_t.c.content)
              .where(messages_t.c.session_key == sa.bindparam("b_key"), messages_t.c.epoch == sa.bindparam("b_epoch"),
                     messages_t.c.role == "user")
              .order_by(messages_t.c.id.desc()).limit(1))
_OUTBOX_INSERT = outbox_t.insert().returning(*outbox_t.c, sort_by_parameter_order=True)
_OUTBOX_PENDING = (sa.select(outbox_t).where(outbox_t.c.status == "pending").order_by(outbox_t.c.id)
                   .limit(sa.bindparam("b_limit")))

_earlier = outbox_t.alias("earlier")
# A part can be claimed when it is pending, nobody else holds a live claim on it, and it is the
# first pending part of its lane (so parts of one chat go out in order, whichever process sends).
# SKIP LOCKED (PostgreSQL): a part another process is claiming right now is skipped, not waited for.
_OUTBOX_CLAIMABLE = (
    sa.select(outbox_t.c.id)
    .where(outbox_t.c.id == sa.bindparam("b_id"), outbox_t.c.status == "pending",
           sa.or_(outbox_t.c.claimed_by.is_(None), outbox_t.c.claimed_by == sa.bindparam("b_owner"),
                  outbox_t.c.claim_until < sa.bindparam("b_now")),
           ~sa.exists().where(_earlier.c.lane == outbox_t.c.lane, _earlier.c.status == "pending",
                              _earlier.c.id < outbox_t.c.id))
    .with_for_update(skip_locked=True).scalar_subquery())
_OUTBOX_CLAIM = (
    outbox_t.update().where(outbox_t.c.id == _OUTBOX_CLAIMABLE)
    .values(claimed_by=sa.bindparam("b_owner"), claim_until=sa.bindparam("b_until"),
            in_doubt=outbox_t.c.in_doubt + sa.case(
                (sa.and_(outbox_t.c.claimed_by.is_not(None), outbox_t.c.claimed_by != sa.bindparam("b_owner")), 1),
                else_=0))
    .returning(*outbox_t.c))
_LANE_HAS_EARLIER = (sa.select(outbox_t.c.id).where(outbox_t.c.lane == sa.bindparam("b_lane"),
                                                   outbox_t.c.status == "pending",
                                                   outbox_t.c.id < sa.bindparam("b_id")).limit(1))
_OUTBOX_TAKE = (outbox_t.update().where(outbox_t.c.id.in_(sa.bindparam("b_ids", expanding=True)))
                .values(claimed_by=sa.bindparam("b_owner"), claim_until=sa.bindparam("b_until")))
_OUTBOX_ABANDON = (outbox_t.update().where(outbox_t.c.status == "pending", outbox_t.c.claimed_by.is_not(None),
                                           outbox_t.c.claimed_by != sa.bindparam("b_owner"))
                   .values(claim_until=0.0))
_UNCLAIM = {"claimed_by": None, "claim_until": None}
_OUTBOX_SENT = (outbox_t.update().where(outbox_t.c.id == sa.bindparam("b_id"))
                .values(status="sent", platform_message_id=sa.bindparam("b_message_id"),
                        sent_at=sa.bindparam("b_now"), attempts=outbox_t.c.attempts + 1, **_UNCLAIM))
_OUTBOX_RETRY = (outbox_t.update().where(outbox_t.c.id == sa.bindparam("b_id"))
                 .values(next_attempt_at=sa.bindparam("b_at"), last_error=sa.bindparam("b_error"),
                         attempts=outbox_t.c.attempts + 1, **_UNCLAIM))
_OUTBOX_FAILED = (outbox_t.update().where(outbox_t.c.id == sa.bindparam("b_id"))
                  .values(status="failed", last_error=sa.bindparam("b_error"), attempts=outbox_t.c.attempts + 1,
                          **_UNCLAIM))
_OUTBOX_DEPTH = sa.select(sa.func.count()).select_from(outbox_t).where(outbox_t.c.status == "pending")


def _outbox_values(parts: Sequence[OutboxPart], now: float) -> list[dict[str, Any]]:
    """The outbox rows of ``parts``; attempts, in_doubt and the claim start as the columns' defaults (0, 0, NULL)."""
    return [{"dedupe_key": p.dedupe_key, "run_id": p.run_id, "platform": p.platform, "chat_id": p.chat_id,
             "thread_id": p.thread_id, "reply_to": p.reply_to, "edit_message_id": p.edit_message_id,
             "part_index": p.part_index, "parts_total": p.parts_total, "text": p.text, "status": "pending",
             "lane": p.lane or f"{p.platform}:{p.chat_id}", "next_attempt_at": now, "created_at": now,
             "choices": json.dumps([c.to_dict() for c in p.choices]) if p.choices else None,
             "file": p.file.describe() if p.file else None, "file_sha256": p.file.sha256 if p.file else None}
            for p in parts]


def _store_parts(conn: Connection, parts: Sequence[OutboxPart], now: float, claim: Claim | None,
                 skip_existing: bool) -> list[OutboxRow]:
    """Insert parts (``skip_existing``: leave out dedupe keys stored before); with ``claim``, the new
    parts of each lane are claimed for their sender at once when nothing earlier waits in that lane."""
    values = _outbox_values(parts, now)
    files = {p.file.sha256: p.file.data for p in parts if p.file is not None and p.file.data is not None}
    if files:
        insert = insert_ignoring_conflicts(conn.dialect.name, outbox_files_t, "sha256", returning=False)
        conn.execute(insert, [{"sha256": sha256, "data": data, "created_at": now} for sha256, data in files.items()])
    if skip_existing:
        insert = insert_ignoring_conflicts(conn.dialect.name, outbox_t, "dedupe_key")
        rows = [r for r in (conn.execute(insert, v).first() for v in values) if r is not None]
    else:
        rows = list(conn.execute(_OUTBOX_INSERT, values)) if values else []
    stored = [_outbox_row(r) for r in rows]
    if claim is not None:
        lanes: dict[str, list[OutboxRow]] = {}
        for row in stored:
            lanes.setdefault(row.lane, []).append(row)
        for lane, lane_rows in lanes.items():
            if conn.execute(_LANE_HAS_EARLIER, {"b_lane": lane, "b_id": lane_rows[0].id}).first() is None:
                conn.execute(_OUTBOX_TAKE, {"b_ids": [r.id for r in lane_rows], "b_owner": claim.owner,
                                            "b_until": now + claim.ttl})
                for row in lane_rows:
                    row.claimed_by, row.claim_until = claim.owner, now + claim.ttl
    return stored


def _append_messages(conn: Connection, key: str | None, epoch: int | None, messages: Sequence[ChatMessage],
                     run_id: str | None, now: float) -> None:
    if not messages or key is None or epoch is None:
        return
    conn.execute(_MESSAGES_INSERT, [
        {"session_key": key, "epoch": epoch, "role": m.role, "content": m.content,
         "tool_calls": dumps(m.tool_calls) if m.tool_calls else None, "tool_call_id": m.tool_call_id,
         "run_id": run_id, "created_at": now} for m in messages])


def _finish_run(conn: Connection, done: RunCompletion, now: float, claim: Claim | None) -> list[OutboxRow] | None:
    params = {"b_id": done.run_id, "b_status": done.status, "b_result": done.result, "b_error": done.error,
              "b_tool_calls": dumps(done.tool_calls), "b_model_calls": done.model_calls,
              "b_model_seconds": done.model_seconds, "b_ended_by": done.ended_by, "b_now": now}
    if conn.execute(_RUN_FINISH, params).rowcount == 0:
        return None
    if done.inbox_id is not None:
        conn.execute(_INBOX_STATUS, {"b_id": done.inbox_id, "b_status": "done", "b_now": now})
    if done.steered:  # each ends as the run that took it did, with nothing of its own to deliver
        conn.execute(_RUN_FINISH, [{**params, "b_id": m.run_id, "b_result": None, "b_tool_calls": "[]",
                                    "b_model_calls": 0, "b_model_seconds": 0.0, "b_ended_by": "steered"}
                                   for m in done.steered])
        conn.execute(_INBOX_STATUS, [{"b_id": m.inbox_id, "b_status": "done", "b_now": now} for m in done.steered])
    _append_messages(conn, done.session_key, done.epoch, done.transcript, done.run_id, now)
    if (u := done.usage) is not None and (u.prompt_tokens or u.completion_tokens):
        conn.execute(_USAGE_INSERT, {"run_id": done.run_id, "kind": u.kind, "session_key": done.session_key or "",
                                     "epoch": done.epoch, "user_key": u.user_key, "model": u.model,
                                     "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                                     "created_at": now})
    if done.charge is not None:
        charge_user(conn, done.charge, now)
    for effect in done.effects:
        effect(conn)
    return _store_parts(conn, done.deliveries, now, claim, skip_existing=False)


@dataclass(slots=True, frozen=True)
class Replay:
    """A second dedupe key with a window: an event is also a duplicate of the event that carried ``key`` within
    the last ``window`` seconds (a sender whose own id is unsigned: a hash of the body it signed). The key is kept
    as a marker row (status ``pruned``, the first event's ids as payload), renewed by each event accepted with it,
    so the window slides; retention removes markers with the other dedupe records."""

    key: str
    at: float
    """When the event arrived, by the clock that verified it."""
    window: float


REPLAY_MARKER = "replay"  # the inbox kind of a Replay's marker row


def _replayed(conn: Connection, replay: Replay) -> Acceptance | None:
    row = conn.execute(_REPLAY_MARKER, {"b_key": replay.key, "b_since": replay.at - replay.window}).first()
    if row is None:
        return None
    first = json.loads(row.payload)
    return Acceptance(int(first["inbox_id"]), first["run_id"], duplicate=True)


# Built once: compiling a statement per webhook cost the store thread a third of its time (bench/RESULTS.md, 9).
_REPLAY_DELETE = inbox_t.delete().where(inbox_t.c.dedupe_key == sa.bindparam("b_key"))
_INBOX_INSERT = inbox_t.insert()


def _mark_replay(conn: Connection, replay: Replay, acceptance: Acceptance, platform: str, session_key: str) -> None:
    conn.execute(_REPLAY_DELETE, {"b_key": replay.key})  # a marker past its window
    conn.execute(_INBOX_INSERT, {
        "dedupe_key": replay.key, "platform": platform, "kind": REPLAY_MARKER, "session_key": session_key,
        "status": "pruned", "payload": dumps({"inbox_id": acceptance.inbox_id, "run_id": acceptance.run_id}),
        "run_id": None, "created_at": replay.at, "updated_at": replay.at})


def accept_event(conn: Connection, *, dedupe_key: str, platform: str, kind: str, session_key: str,
                 payload: dict[str, Any], run: NewRun | None = None, started: bool = False,
                 replay: Replay | None = None) -> Acceptance:
    """``Store.accept`` as a unit of work (a command accepts a run together with its other effects)."""
    now = time.time()
    if replay is not None and (earlier := _replayed(conn, replay)) is not None:
        return earlier
    inserted = conn.execute(insert_ignoring_conflicts(conn.dialect.name, inbox_t, "dedupe_key"), {
        "dedupe_key": dedupe_key, "platform": platform, "kind": kind, "session_key": session_key,
        "payload": dumps(payload), "status": "running" if started else "pending", "run_id": run.id if run else None,
        "created_at": now, "updated_at": now}).first()
    if inserted is None:
        first = conn.execute(_INBOX_BY_KEY, {"b_key": dedupe_key}).one()
        return Acceptance(int(first.id), first.run_id, duplicate=True)
    if run is not None:
        conn.execute(_RUN_INSERT, {
            "id": run.id, "kind": run.kind, "source": run.source, "session_key": session_key,
            "status": "running" if started else "queued", "toolsets": dumps(run.toolsets),
            "prompt": run.prompt, "deliver_to": run.deliver_to, "tool_calls": "[]",
            "attempts": int(started), "created_at": now, "started_at": now if started else None})
    accepted = Acceptance(int(inserted.id), run.id if run else None, duplicate=False)
    if replay is not None:
        _mark_replay(conn, replay, accepted, platform, session_key)
    return accepted


def bump_epoch(conn: Connection, key: str) -> int:
    """Start the session's next conversation (``/new``); the new epoch (0 for a session never stored)."""
    conn.execute(sessions_t.update().where(sessions_t.c.key == key)
                 .values(epoch=sessions_t.c.epoch + 1, updated_at=time.time()))
    return int(conn.execute(_SESSION_EPOCH, {"b_key": key}).scalar() or 0)


def last_user_message(conn: Connection, key: str) -> tuple[int, int, str] | None:
    """(epoch, message id, text) of the current conversation's last user message, or None."""
    epoch = conn.execute(_SESSION_EPOCH, {"b_key": key}).scalar()
    if epoch is None:
        return None
    row = conn.execute(_LAST_USER, {"b_key": key, "b_epoch": epoch}).first()
    return (int(epoch), int(row.id), row.content or "") if row is not None else None


def drop_messages_from(conn: Connection, key: str, epoch: int, first_id: int) -> int:
    """Remove the conversation's messages from ``first_id`` on (``/undo``, ``/retry``); how many."""
    return int(conn.execute(messages_t.delete().where(messages_t.c.session_key == key, messages_t.c.epoch == epoch,
                                                      messages_t.c.id >= first_id)).rowcount)


def _session_epoch(conn: Connection, ref: SessionRef, now: float) -> int:
    epoch = conn.execute(_SESSION_EPOCH, {"b_key": ref.key}).scalar()
    if epoch is not None:
        return int(epoch)
    conn.execute(insert_ignoring_conflicts(conn.dialect.name, sessions_t, "key"), {
        "key": ref.key, "platform": ref.platform, "chat_id": ref.chat_id, "user_id": ref.user_id,
        "thread_id": ref.thread_id, "epoch": 0, "created_at": now, "updated_at": now})
    return int(conn.execute(_SESSION_EPOCH, {"b_key": ref.key}).scalar_one())


_SESSION_STATE = sa.select(sessions_t.c.epoch, sessions_t.c.updated_at, sessions_t.c.last_reset).where(
    sessions_t.c.key == sa.bindparam("b_key"))
_RUN_CREATED = sa.select(runs_t.c.created_at).where(runs_t.c.id == sa.bindparam("b_id"))


def _chat_session(conn: Connection, ref: SessionRef, run_id: str, rule: ResetRule | None,
                  now: float) -> tuple[int, SessionReset | None]:
    """The epoch a chat run uses, creating the session on first use. The run's message (its acceptance time)
    is the session's latest activity; with ``rule``, a session idle too long before it starts a new conversation
    first, recorded with the run's id so that a start of the same run again finds it (gateway/session_reset.py)."""
    row = conn.execute(_SESSION_STATE, {"b_key": ref.key}).first()
    if row is None:
        return _session_epoch(conn, ref, now), None
    last = json.loads(row.last_reset) if row.last_reset else None
    if last is not None and last["run"] == run_id:
        return int(row.epoch), SessionReset(last["reason"], last["idle"])
    at = float(conn.execute(_RUN_CREATED, {"b_id": run_id}).scalar_one())
    reason = rule(row.updated_at, at) if rule is not None else None
    if reason is None:
        if at > row.updated_at:
            conn.execute(sessions_t.update().where(sessions_t.c.key == ref.key).values(updated_at=at))
        return int(row.epoch), None
    reset = SessionReset(reason, at - row.updated_at)
    moved = conn.execute(sessions_t.update().where(sessions_t.c.key == ref.key, sessions_t.c.epoch == row.epoch)
                         .values(epoch=row.epoch + 1, updated_at=at,
                                 last_reset=dumps({"run": run_id, "reason": reason, "idle": reset.idle_seconds})))
    if moved.rowcount == 0:  # a /new got there first: that is the run's new conversation
        return int(conn.execute(_SESSION_EPOCH, {"b_key": ref.key}).scalar_one()), None
    return int(row.epoch) + 1, reset


def _history(conn: Connection, key: str, epoch: int, limit: int) -> list[ChatMessage]:
    rows = conn.execute(_HISTORY, {"b_key": key, "b_epoch": epoch, "b_limit": limit}).all()
    return [ChatMessage(r.role, r.content, json.loads(r.tool_calls) if r.tool_calls else None, r.tool_call_id)
            for r in reversed(rows)]


@dataclass(slots=True, frozen=True)
class Claim:
    """A sender taking parts for ``ttl`` seconds (``owner`` names the process)."""

    owner: str
    ttl: float


@dataclass(slots=True)
class RunContext:
    """What a run starts from: its session's epoch and recent transcript (None/[] without history), and the
    conversation the reset policy started for it, if it did."""

    epoch: int | None
    history: list[ChatMessage]
    reset: SessionReset | None = None


@dataclass(slots=True, frozen=True)
class SessionReset:
    """A new conversation the reset policy started for a run: ``reason`` (the rule's word for why) and how long
    the session had been idle before the run's message."""

    reason: str
    idle_seconds: float


ResetRule = Callable[[float, float], str | None]
"""The reset policy (gateway/session_reset.py): given a session's last activity and a message's acceptance time
(unix seconds), why that message starts a new conversation, or None."""


class Store:
    """The gateway's database, one method per unit of work."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.dialect = db.dialect

    @classmethod
    async def open(cls, url: str) -> Store:
        """Connect, create or migrate the schema, and return the store."""
        db = Database.connect(url)
        try:
            await upgrade(db)
        except BaseException:
            await db.close()
            raise
        return cls(db)

    async def close(self) -> None:
        """Finish queued work and release the connections."""
        await self.db.close()

    async def ping(self) -> bool:
        """Whether the database answers."""
        try:
            await self.db.read(lambda conn: conn.execute(sa.select(1)).scalar())
            return True
        except Exception as exc:
            logger.warning("store ping failed: %s", exc)
            return False

    # -- inbox -----------------------------------------------------------

    async def accept(self, dedupe_key: str, platform: str, kind: str, session_key: str,
                     payload: dict[str, Any], run: NewRun | None = None, *, started: bool = False,
                     replay: Replay | None = None) -> Acceptance:
        """Persist an event (and its run) once; a repeated dedupe key (or ``replay``'s key within its window)
        returns the first acceptance.

        ``started``: the run starts as it is accepted (as ``start_run`` would record it, for a run that needs
        no session history), which saves its caller a transaction.
        """
        event = functools.partial(accept_event, dedupe_key=dedupe_key, platform=platform, kind=kind,
                                  session_key=session_key, payload=payload, run=run, started=started, replay=replay)
        return await self.db.write(event, urgent=True, quick=True)  # the platform waits for it

    async def unfinished_inbox(self) -> list[InboxRow]:
        """Accepted events whose processing has not finished, oldest first."""
        return [_inbox_row(r) for r in await self.db.read(lambda conn: conn.execute(_INBOX_UNFINISHED).all())]

    async def next_run_event(self, session_key: str) -> InboxRow | None:
        """The session's oldest accepted run event that has not finished (commands excluded)."""
        row = await self.db.read(lambda conn: conn.execute(_INBOX_NEXT_RUN, {"b_key": session_key}).first())
        return _inbox_row(row) if row is not None else None

    async def waiting_events(self, before: float, limit: int = 1000) -> list[tuple[str, str, int]]:
        """(session key, kind, inbox id) of unfinished events not touched since ``before``, oldest first."""
        params = {"b_before": before, "b_limit": limit}
        rows = await self.db.read(lambda conn: conn.execute(_INBOX_WAITING, params).all())
        return [(r.session_key, r.kind, int(r.id)) for r in rows]

    async def get_inbox(self, inbox_id: int) -> InboxRow | None:
        """One inbox event, or None."""
        query = sa.select(inbox_t).where(inbox_t.c.id == inbox_id)
        row = await self.db.read(lambda conn: conn.execute(query).first())
        return _inbox_row(row) if row is not None else None

    async def inbox_of_run(self, session_key: str, run_id: str) -> int | None:
        """The id of the inbox event that started the run (of that session: found by the session's index)."""
        query = sa.select(inbox_t.c.id).where(inbox_t.c.session_key == session_key, inbox_t.c.run_id == run_id)
        return await self.db.read(lambda conn: conn.execute(query).scalar())

    async def set_inbox_status(self, inbox_id: int, status: str) -> None:
        """Move an inbox event to ``status``."""
        params = {"b_id": inbox_id, "b_status": status, "b_now": time.time()}
        await self.db.write(lambda conn: conn.execute(_INBOX_STATUS, params))

    async def count_inbox(self, status: str | None = None) -> int:
        """Number of accepted events (optionally with one status; replay markers are not events)."""
        query = sa.select(sa.func.count()).select_from(inbox_t).where(inbox_t.c.kind != REPLAY_MARKER)
        if status is not None:
            query = query.where(inbox_t.c.status == status)
        return int(await self.db.read(lambda conn: conn.execute(query).scalar_one()))

    async def unfinished_background(self, session_prefix: str) -> list[tuple[str, str]]:
        """(task id, inbox status) of the background tasks (``/background``) in sessions whose key starts with
        ``session_prefix`` that have not finished, oldest first (only unfinished events are read: few)."""
        query = (sa.select(inbox_t.c.payload, inbox_t.c.status)
                 .where(inbox_t.c.status.in_(_UNFINISHED), inbox_t.c.kind == "background",
                        inbox_t.c.session_key.startswith(session_prefix, autoescape=True))
                 .order_by(inbox_t.c.id))
        rows = await self.db.read(lambda conn: conn.execute(query).all())
        return [(json.loads(r.payload)["source"], r.status) for r in rows]

    # -- runs ------------------------------------------------------------

    async def start_run(self, run_id: str, inbox_id: int | None, session: SessionRef | None = None,
                        history_limit: int = 0, reset_rule: ResetRule | None = None) -> RunContext | None:
        """Mark a run (and its inbox event) as running, counting the attempt; with ``session`` (a chat run's),
        also return the session's epoch (creating the session on first use, starting a new conversation first
        when ``reset_rule`` says so) and its last ``history_limit`` messages, all in one transaction. None
        (nothing written) when the run has already finished."""
        now = time.time()

        def work(conn: Connection) -> RunContext | None:
            if conn.execute(_RUN_START, {"b_id": run_id, "b_now": now}).rowcount == 0:
                return None
            if inbox_id is not None:
                conn.execute(_INBOX_STATUS, {"b_id": inbox_id, "b_status": "running", "b_now": now})
            if session is None:
                return RunContext(None, [])
            epoch, reset = _chat_session(conn, session, run_id, reset_rule, now)
            return RunContext(epoch, _history(conn, session.key, epoch, history_limit) if history_limit else [],
                              reset)

        return await self.db.write(work, quick=True)

    async def finish_run(self, done: RunCompletion, claim: Claim | None = None) -> list[OutboxRow] | None:
        """Record a run's end atomically: status, transcript, token usage, inbox state and deliveries (claimed for
        ``claim``'s sender when they are first in their lane).

        Returns the deliveries as stored, or None (writing nothing) when the run had already
        finished, so a resumed run can never deliver twice.
        """
        now = time.time()
        return await self.db.write(lambda conn: _finish_run(conn, done, now, claim), quick=True)

    async def give_back_attempt(self, run_id: str) -> None:
        """Uncount the current attempt of an unfinished run that the gateway itself stopped (a graceful
        shutdown past the drain timeout): only attempts ended by the process dying count as poison."""
        def work(conn: Connection) -> None:
            conn.execute(_RUN_GIVE_BACK, {"b_id": run_id})

        await self.db.write(work, quick=True)

    async def give_up_run(self, run_id: str, max_attempts: int, completion: Callable[[int], RunCompletion],
                          claim: Claim | None = None) -> list[OutboxRow] | None:
        """Instead of starting an unfinished run once more, end it when it was started ``max_attempts`` times
        already: ``completion(attempts)`` (pure; it may be called again if the transaction is) says how, and it is
        recorded as ``finish_run`` records, in the same transaction as the check. Returns its deliveries as
        stored, or None (nothing written) when the run may start again or has already finished."""
        now = time.time()

        def work(conn: Connection) -> list[OutboxRow] | None:
            attempts = conn.execute(_RUN_ATTEMPTS, {"b_id": run_id}).scalar()
            if attempts is None or attempts < max_attempts:
                return None
            return _finish_run(conn, completion(int(attempts)), now, claim)

        return await self.db.write(work, quick=True)

    async def get_run(self, run_id: str) -> RunRow | None:
        """One run, or None."""
        row = await self.db.read(lambda conn: conn.execute(_RUN_BY_ID, {"b_id": run_id}).first())
        return _run_row(row) if row else None

    async def list_runs(self, limit: int = 20, status: str | None = None) -> list[RunRow]:
        """Most recent runs first."""
        query = _RUNS.order_by(runs_t.c.created_at.desc()).limit(limit)
        if status:
            query = query.where(runs_t.c.status == status)
        return [_run_row(r) for r in await self.db.read(lambda conn: conn.execute(query).all())]

    async def count_runs(self, status: str | None = None) -> int:
        """Number of runs (optionally with one status)."""
        query = sa.select(sa.func.count()).select_from(runs_t)
        if status is not None:
            query = query.where(runs_t.c.status == status)
        return int(await self.db.read(lambda conn: conn.execute(query).scalar_one()))

    # -- sessions and transcripts -----------------------------------------

    async def session_epoch(self, key: str, platform: str, chat_id: str, user_id: str | None,
                            thread_id: str | None) -> int:
        """The session's current epoch, creating the session on first use."""
        ref, now = SessionRef(key, platform, chat_id, user_id, thread_id), time.time()
        return await self.db.write(lambda conn: _session_epoch(conn, ref, now))

    async def reset_session(self, key: str) -> int:
        """Start a fresh conversation (``/new``): bump the epoch; returns the new one."""
        return await self.db.write(functools.partial(bump_epoch, key=key))

    async def last_user_message(self, key: str) -> tuple[int, int, str] | None:
        """(epoch, message id, text) of the session's last user message in its current conversation."""
        return await self.db.read(functools.partial(last_user_message, key=key))

    async def history(self, key: str, epoch: int, limit: int) -> list[ChatMessage]:
        """The last ``limit`` transcript messages of the session's epoch, oldest first."""
        return await self.db.read(lambda conn: _history(conn, key, epoch, limit))

    # -- outbox ----------------------------------------------------------

    async def enqueue(self, parts: Sequence[OutboxPart], inbox_id: int | None = None,
                      claim: Claim | None = None,
                      effects: Sequence[Callable[[Connection], object]] = ()) -> list[OutboxRow] | None:
        """Persist deliveries outside a run (command replies), closing the inbox event and applying ``effects``
        (a command's changes) in the same step.

        Returns the parts as stored, or None when they were already enqueued (a replayed event).
        """
        now = time.time()

        def work(conn: Connection) -> list[OutboxRow] | None:
            if inbox_id is not None and conn.execute(_INBOX_CLOSE, {"b_id": inbox_id, "b_now": now}).rowcount == 0:
                return None  # the event was handled before (a replay): its effects and reply are stored
            for effect in effects:
                effect(conn)
            return _store_parts(conn, parts, now, claim, skip_existing=True) or None

        return await self.db.write(work, quick=True)

    async def pending_outbox(self, limit: int = 500) -> list[OutboxRow]:
        """Undelivered parts, oldest first."""
        rows = await self.db.read(lambda conn: conn.execute(_OUTBOX_PENDING, {"b_limit": limit}).all())
        return [_outbox_row(r) for r in rows]

    async def claim_outbox(self, outbox_id: int, owner: str, ttl: float) -> OutboxRow | None:
        """Take a part for sending (for ``ttl`` seconds); None when it is not this process's to send now:
        already sent, claimed by a live sender, or not the first pending part of its lane.

        Taking over a claim that a dead sender left behind counts ``in_doubt`` up: the platform may
        already have that part.
        """
        now = time.time()
        params = {"b_id": outbox_id, "b_owner": owner, "b_now": now, "b_until": now + ttl}
        row = await self.db.write(lambda conn: conn.execute(_OUTBOX_CLAIM, params).first(), quick=True)
        return _outbox_row(row) if row is not None else None

    async def expire_claims(self, live: set[str]) -> int:
        """Expire the claims of senders not in ``live`` (dead replicas); returns how many."""
        expire = (outbox_t.update().where(outbox_t.c.status == "pending", outbox_t.c.claimed_by.is_not(None),
                                          outbox_t.c.claimed_by.not_in(live), outbox_t.c.claim_until > 0)
                  .values(claim_until=0.0))
        return int(await self.db.write(lambda conn: conn.execute(expire).rowcount))

    async def abandon_claims(self, owner: str) -> int:
        """Expire every claim not held by ``owner``: for a single gateway starting up, whose earlier
        incarnations are dead. Returns the number of parts concerned."""
        return int(await self.db.write(lambda conn: conn.execute(_OUTBOX_ABANDON, {"b_owner": owner}).rowcount))

    async def mark_sent(self, outbox_id: int, platform_message_id: str | None) -> None:
        """Record a successful delivery."""
        params = {"b_id": outbox_id, "b_message_id": platform_message_id, "b_now": time.time()}
        await self.db.write(lambda conn: conn.execute(_OUTBOX_SENT, params), quick=True)

    async def mark_retry(self, outbox_id: int, next_attempt_at: float, error: str) -> None:
        """Record a transient failure and when to try again."""
        params = {"b_id": outbox_id, "b_at": next_attempt_at, "b_error": error[:2000]}
        await self.db.write(lambda conn: conn.execute(_OUTBOX_RETRY, params))

    async def mark_failed(self, outbox_id: int, error: str) -> None:
        """Give up on a delivery."""
        params = {"b_id": outbox_id, "b_error": error[:2000]}
        await self.db.write(lambda conn: conn.execute(_OUTBOX_FAILED, params))

    async def outbox_rows(self, run_id: str | None = None) -> list[OutboxRow]:
        """Every outbox row (optionally of one run), in order: for inspection and tests."""
        query = sa.select(outbox_t).order_by(outbox_t.c.id)
        if run_id is not None:
            query = query.where(outbox_t.c.run_id == run_id)
        return [_outbox_row(r) for r in await self.db.read(lambda conn: conn.execute(query).all())]

    async def outbox_file(self, sha256: str) -> bytes | None:
        """The bytes of a file an outbox part sends; None once pruned."""
        query = sa.select(outbox_files_t.c.data).where(outbox_files_t.c.sha256 == sha256)
        data = await self.db.read(lambda conn: conn.execute(query).scalar_one_or_none())
        return bytes(data) if data is not None else None

    async def outbox_depth(self) -> int:
        """Number of undelivered parts."""
        return int(await self.db.read(lambda conn: conn.execute(_OUTBOX_DEPTH).scalar_one()))


def _inbox_row(r: Any) -> InboxRow:
    return InboxRow(r.id, r.dedupe_key, r.platform, r.kind, r.session_key, json.loads(r.payload), r.status, r.run_id)


def _run_row(r: Any) -> RunRow:
    return RunRow(r.id, r.kind, r.source, r.session_key, r.status, json.loads(r.toolsets), r.prompt, r.deliver_to,
                  r.result, r.error, json.loads(r.tool_calls or "[]"), r.model_calls, r.attempts, r.created_at,
                  r.started_at, r.finished_at, r.model_seconds, r.ended_by,
                  None if r.usage_model is None else RunUsage(r.kind, r.user_key, r.usage_model, r.prompt_tokens,
                                                              r.completion_tokens))


def _outbox_row(r: Any) -> OutboxRow:
    return OutboxRow(r.id, r.dedupe_key, r.run_id, r.platform, r.chat_id, r.thread_id, r.reply_to, r.edit_message_id,
                     r.part_index, r.parts_total, r.text, r.status, r.attempts, r.next_attempt_at,
                     r.platform_message_id, r.last_error, r.lane, r.in_doubt, r.claimed_by, r.claim_until,
                     tuple(Choice.from_dict(c) for c in json.loads(r.choices)) if r.choices else (),
                     FilePart.described(r.file, r.file_sha256) if r.file else None)
