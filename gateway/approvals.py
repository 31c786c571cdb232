"""Approvals: which tool calls wait for a chat user's yes, the durable pause, and the stored answers.

A call that needs approval is not run. Its run ends (``ended_by`` "approval") with a prompt carrying buttons, and an
``approvals`` row stored in the completion's transaction: the run's worker thread or sandbox slot is free while
it waits, and a restart keeps it waiting. The answer (``/approve``, ``/deny``, a button, or the expiry sweep) marks
the row decided with a compare-and-set and, in the same transaction, accepts one *resume* event for the chat
(dedupe key ``<platform>:approval:<id>``): its run runs the approved calls first, or tells the model they were
not run, and goes on. Whatever races (two presses, a press and the expiry, two replicas), one decision and one
resume are stored.

Runs nobody can ask (webhook, cron, background, API) deny what would need approval, unless their configuration
allows the pattern (``platforms.webhook.routes.<r>.approvals_allow``, ``approvals.cron_allow``).
"""

from __future__ import annotations

import fnmatch
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

import model_tools
from gateway.config import ApprovalMode, Config
from gateway.schema import approval_grants_t, approvals_t, insert_ignoring_conflicts, outbox_t
from gateway.store import Store
from platforms.base import Choice
from tools.approval_rules import Danger, classify
from tools.registry import EFFECT_RUNS_COMMANDS, ISOLATION_SANDBOX, registry

PENDING, APPROVED, DENIED, EXPIRED, WITHDRAWN = "pending", "approved", "denied", "expired", "withdrawn"
SCOPES = ("once", "session", "always")
ASKING_KINDS = frozenset({"chat"})
"""Run kinds with someone to ask: the chat's user sees the prompt. The others deny instead."""
_SHOWN_ARGUMENT_CHARS = 300


@dataclass(frozen=True, slots=True)
class Verdict:
    """What happens to one tool call: run it, ask the user first, or refuse it (``reason`` tells the model)."""

    action: Literal["run", "ask", "deny"]
    dangers: tuple[Danger, ...] = ()
    reason: str = ""


RUN = Verdict("run")


@dataclass(slots=True)
class Approval:
    """A stored approval request (a row of ``approvals``)."""

    id: str
    session_key: str
    run_id: str
    origin: dict[str, Any]
    """The chat asked and its user: platform, chat_id, chat_type, thread_id, user_id, user_name, kind, toolsets."""
    requester: str
    calls: list[dict[str, Any]]
    """The waiting tool calls, each {"id", "name", "arguments", "patterns", "reasons"}."""
    status: str
    expires_at: float
    scope: str | None = None
    decided_by: str | None = None
    reason: str | None = None

    def patterns(self) -> list[str]:
        """Every pattern the waiting calls matched, once each."""
        return list(dict.fromkeys(p for call in self.calls for p in call["patterns"]))

    def summary(self) -> str:
        """The waiting calls as one line each: ``tool: arguments``."""
        return "\n".join(describe_call(call["name"], call["arguments"]) for call in self.calls)


def describe_call(name: str, arguments: str) -> str:
    """A call as a user reads it: the terminal's command itself, other tools' arguments as sent (cut)."""
    try:
        args = json.loads(arguments)
    except ValueError:
        args = arguments
    shown = args["command"] if name == "terminal" and isinstance(args, dict) and "command" in args else arguments
    shown = str(shown)
    if len(shown) > _SHOWN_ARGUMENT_CHARS:
        shown = shown[:_SHOWN_ARGUMENT_CHARS] + "…"
    return f"{name}: `{shown}`"


def matches(pattern: str, grants: Sequence[str]) -> bool:
    """Whether a standing approval (``terminal:*``, ``*``, an exact pattern) covers ``pattern``."""
    return any(fnmatch.fnmatchcase(pattern, grant) for grant in grants)


class ApprovalPolicy:
    """Which calls need approval, from the configuration (``approvals``, webhook routes)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.settings = cfg.approvals

    def mode(self, kind: str, source: str, toolsets: Sequence[str]) -> ApprovalMode:
        """The mode of a run: its webhook route's, else the first of its toolsets configured, else ``mode``."""
        if kind == "webhook":
            route = self.cfg.platforms.webhook.routes.get(source)
            return route.approvals if route is not None else "dangerous"
        return next((self.settings.toolsets[t] for t in toolsets if t in self.settings.toolsets), self.settings.mode)

    def unattended_allow(self, kind: str, source: str) -> list[str]:
        """What a run nobody can ask may do anyway."""
        if kind == "webhook":
            route = self.cfg.platforms.webhook.routes.get(source)
            return list(route.approvals_allow) if route is not None else []
        return list(self.settings.cron_allow) if kind == "cron" else []

    def dangers(self, name: str, arguments: str, mode: ApprovalMode, workspace: str | None) -> list[Danger]:
        """Why a call needs approval under ``mode`` (empty: it runs). Unknown tools run into their own error."""
        entry = registry.get(name)
        if mode == "never" or entry is None:
            return []
        found: list[Danger] = []
        if name == "terminal":
            try:
                args = json.loads(arguments)
            except ValueError:
                args = None
            command = args.get("command") if isinstance(args, dict) else None
            if isinstance(command, str):
                found += classify(command, workspace=workspace, network=self.settings.network)
        effects = entry.effects if mode == "always" else entry.effects & set(self.settings.ask_for_effects)
        if EFFECT_RUNS_COMMANDS in entry.effects and entry.isolation == ISOLATION_SANDBOX and name != "terminal":
            # The classifier reads terminal commands only: what another sandboxed tool runs (execute_code's script,
            # and the tools the script calls) is opaque to it, so it asks in mode dangerous too. (delegate_task's
            # sub-agents have each of their calls judged.)
            effects |= {EFFECT_RUNS_COMMANDS}
        for effect in sorted(effects):
            # The classifier speaks for the terminal's commands; in mode always, every command asks.
            if name == "terminal" and effect == EFFECT_RUNS_COMMANDS and (found or mode != "always"):
                continue
            found.append(Danger(f"{name}:{effect}", f"{name} {effect.replace('_', ' ')}"))
        return found


class ApprovalGate:
    """Decides each tool call of one run (``Agent.run`` asks it before running a turn's calls)."""

    def __init__(self, policy: ApprovalPolicy, store: Store, *, kind: str, source: str, toolsets: Sequence[str],
                 user_key: str | None, session_key: str, workspace: str | None) -> None:
        self.policy = policy
        self.store = store
        self.kind = kind
        self.source = source
        self.user_key = user_key
        self.session_key = session_key
        self.workspace = workspace
        self.mode = policy.mode(kind, source, toolsets)
        self._grants: list[str] | None = None

    async def check(self, calls: Sequence[dict[str, Any]]) -> list[Verdict]:
        """A verdict per call, in order (a ``tool_call`` through tool search is judged as the tool it calls)."""
        return [await self._verdict(*model_tools.real_call(call["function"]["name"], call["function"]["arguments"]))
                for call in calls]

    async def _verdict(self, name: str, arguments: str) -> Verdict:
        dangers = self.policy.dangers(name, arguments, self.mode, self.workspace)
        if not dangers:
            return RUN
        if self.kind not in ASKING_KINDS or self.user_key is None:
            allowed = self.policy.unattended_allow(self.kind, self.source)
            left = tuple(d for d in dangers if not matches(d.pattern, allowed))
            if not left:
                return RUN
            why = "; ".join(d.reason for d in left)
            return Verdict("deny", left, f"Not run: a {self.kind} run cannot ask anyone to approve this ({why}). "
                                         f"An operator can allow {', '.join(d.pattern for d in left)} in the "
                                         "configuration.")
        grants = await self.grants()
        left = tuple(d for d in dangers if not matches(d.pattern, grants))
        return Verdict("ask", left) if left else RUN

    async def grants(self) -> list[str]:
        """The user's standing approvals here: the operator's ``trusted`` list, their "always" answers and this
        session's (read once per run)."""
        if self._grants is None:
            assert self.user_key is not None
            stored = await self.store.db.read(lambda conn: read_grants(conn, self.user_key or "", self.session_key))
            self._grants = [*self.policy.settings.trusted.get(self.user_key, []), *stored]
        return self._grants


# -- storage (units of work: run inside a command's or a completion's transaction) ---------------------------------

_BY_ID = sa.select(approvals_t).where(approvals_t.c.id == sa.bindparam("b_id"))
_LATEST_PENDING = (sa.select(approvals_t).where(approvals_t.c.session_key == sa.bindparam("b_session"),
                                                approvals_t.c.status == PENDING)
                   .order_by(approvals_t.c.created_at.desc()).limit(1))
_EXPIRED = (sa.select(approvals_t).where(approvals_t.c.status == PENDING,
                                         approvals_t.c.expires_at <= sa.bindparam("b_now"))
            .order_by(approvals_t.c.expires_at).limit(100))
_DECIDE = (approvals_t.update().where(approvals_t.c.id == sa.bindparam("b_id"), approvals_t.c.status == PENDING)
           .values(status=sa.bindparam("b_status"), scope=sa.bindparam("b_scope"),
                   decided_by=sa.bindparam("b_by"), reason=sa.bindparam("b_reason"),
                   decided_at=sa.bindparam("b_now")))


class AlreadyAnswered(Exception):
    """Raised inside a decision's transaction (rolling it back) when another answer was stored first."""


def prompt_message_id(conn: Connection, run_id: str) -> str | None:
    """The platform's id of the sent message that carries a run's buttons (the approval prompt), if sent."""
    return conn.execute(sa.select(outbox_t.c.platform_message_id).where(
        outbox_t.c.run_id == run_id, outbox_t.c.choices.is_not(None))).scalar()


def new_approval(session_key: str, run_id: str, origin: dict[str, Any], requester: str,
                 calls: list[dict[str, Any]], timeout_seconds: float) -> Approval:
    """A pending approval to store with its run's completion."""
    return Approval(uuid.uuid4().hex[:12], session_key, run_id, origin, requester, calls, PENDING,
                    time.time() + timeout_seconds)


def insert_approval(conn: Connection, approval: Approval) -> None:
    """Store a new pending approval."""
    conn.execute(approvals_t.insert().values(
        id=approval.id, session_key=approval.session_key, run_id=approval.run_id, target=json.dumps(approval.origin),
        requester=approval.requester, calls=json.dumps(approval.calls), status=PENDING, created_at=time.time(),
        expires_at=approval.expires_at))


def _approval(row: Any) -> Approval:
    return Approval(row.id, row.session_key, row.run_id, json.loads(row.target), row.requester, json.loads(row.calls),
                    row.status, row.expires_at, row.scope, row.decided_by, row.reason)


def get_approval(conn: Connection, approval_id: str) -> Approval | None:
    """One approval by id."""
    row = conn.execute(_BY_ID, {"b_id": approval_id}).first()
    return _approval(row) if row else None


def latest_pending(conn: Connection, session_key: str) -> Approval | None:
    """The session's newest approval still waiting."""
    row = conn.execute(_LATEST_PENDING, {"b_session": session_key}).first()
    return _approval(row) if row else None


def expired_approvals(conn: Connection, now: float) -> list[Approval]:
    """Pending approvals whose time ran out (oldest first, at most 100)."""
    return [_approval(r) for r in conn.execute(_EXPIRED, {"b_now": now}).all()]


def decide(conn: Connection, approval: Approval, status: str, decided_by: str | None, scope: str | None = None,
           reason: str | None = None) -> bool:
    """Record the answer if the approval is still pending (compare-and-set); with ``scope`` session or always,
    keep a standing approval of its patterns for the requester. False: it was answered already."""
    params = {"b_id": approval.id, "b_status": status, "b_scope": scope, "b_by": decided_by, "b_reason": reason,
              "b_now": time.time()}
    if conn.execute(_DECIDE, params).rowcount != 1:
        return False
    if status == APPROVED and scope in ("session", "always"):
        insert = insert_ignoring_conflicts(conn.dialect.name, approval_grants_t, ("user_key", "session_key", "pattern"))
        session = approval.session_key if scope == "session" else ""
        for pattern in approval.patterns():
            conn.execute(insert, {"user_key": approval.requester, "session_key": session, "pattern": pattern,
                                  "created_at": time.time()})
    return True


def end_conversation(conn: Connection, key: str) -> None:
    """``/new``: the session's waiting approvals are withdrawn (never answered, nothing resumes) and its "session"
    approvals end."""
    conn.execute(approvals_t.update().where(approvals_t.c.session_key == key, approvals_t.c.status == PENDING)
                 .values(status=WITHDRAWN, reason="a new conversation was started", decided_at=time.time()))
    conn.execute(approval_grants_t.delete().where(approval_grants_t.c.session_key == key))


def read_grants(conn: Connection, user_key: str, session_key: str) -> list[str]:
    """The patterns a user approved "always", and "session" in this session."""
    rows = conn.execute(sa.select(approval_grants_t.c.pattern).where(
        approval_grants_t.c.user_key == user_key, approval_grants_t.c.session_key.in_(["", session_key]))).all()
    return [r.pattern for r in rows]


# -- what the user and the model read ---------------------------------------------------------------------------

def display_name(platform: str, user_id: str, user_name: str | None) -> str:
    """How a prompt names a user: their name, else a mention the platform renders (Slack's message events carry
    no name), else their id."""
    if user_name:
        return user_name
    return f"<@{user_id}>" if platform in ("slack", "discord") else user_id


def prompt(approval: Approval, timeout_minutes: float) -> tuple[str, list[Choice]]:
    """The approval prompt and its buttons."""
    reasons = "\n".join(f"• {r}" for r in dict.fromkeys(r for call in approval.calls for r in call["reasons"]))
    o = approval.origin
    who = display_name(o["platform"], o["user_id"], o.get("user_name"))
    text = (f"⚠️ Approval needed before I run:\n{approval.summary()}\n{reasons}\n\n"
            f"Only {who} or an admin can answer (expires in {timeout_minutes:g} min; id {approval.id}).")
    choices = [Choice("Approve once", f"/approve once {approval.id}", "primary"),
               Choice("This session", f"/approve session {approval.id}"),
               Choice("Always", f"/approve always {approval.id}"),
               Choice("Deny", f"/deny {approval.id}", "danger")]
    return text, choices


def resume_text(approval: Approval, status: str, who: str | None, scope: str | None = None,
                reason: str | None = None, timeout_minutes: float = 0) -> str:
    """The resume event's message: what was decided, as the model (and the transcript) read it."""
    calls = approval.summary()
    if status == APPROVED:
        scope_note = {"session": " for this session", "always": " always"}.get(scope or "", "")
        return f"(Approved{scope_note} by {who}. The gateway ran the approved call; its result follows.)\n{calls}"
    if status == DENIED:
        because = f": {reason}" if reason else ""
        return f"(Denied by {who}{because}. This call was not run; do not retry it.)\n{calls}"
    return f"(Nobody answered within {timeout_minutes:g} minutes, so this call was not run.)\n{calls}"


def decision_note(approval: Approval, status: str, who: str | None, scope: str | None = None,
                  reason: str | None = None) -> str:
    """What the prompt's message shows once answered (its buttons removed)."""
    if status == APPROVED:
        return f"✅ Approved ({scope or 'once'}) by {who}:\n{approval.summary()}"
    because = f" ({reason})" if reason else ""
    if status == DENIED:
        return f"❌ Denied by {who}{because}:\n{approval.summary()}"
    return f"⌛ Expired without an answer:\n{approval.summary()}"
