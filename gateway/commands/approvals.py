"""``/approve [once|session|always] [ID]`` and ``/deny [ID] [reason]``: answers to a tool call waiting for approval
(gateway/approvals.py). The prompt's buttons send the same commands."""

from __future__ import annotations

import re

from sqlalchemy.engine import Connection

from gateway.approvals import (
    APPROVED,
    DENIED,
    PENDING,
    SCOPES,
    Approval,
    decision_note,
    display_name,
    get_approval,
    latest_pending,
    prompt_message_id,
)
from gateway.commands.base import CommandContext, command

_APPROVAL_ID = re.compile(r"[0-9a-f]{12}")


async def _find(ctx: CommandContext, approval_id: str | None) -> Approval | None:
    """The approval named, or the newest one waiting in this conversation; the prompt's message is noted for the
    reply to replace (``CommandContext.also_replace``)."""
    def read(conn: Connection) -> tuple[Approval | None, str | None]:
        found = get_approval(conn, approval_id) if approval_id else latest_pending(conn, ctx.session_key)
        return found, prompt_message_id(conn, found.run_id) if found is not None else None
    approval, ctx.also_replace = await ctx.host.store.db.read(read)
    return approval


def _refusal(ctx: CommandContext, approval: Approval | None) -> str | None:
    """Why the sender cannot answer ``approval`` now, or None."""
    e = ctx.event
    if approval is None or (approval.origin["platform"], approval.origin["chat_id"]) != (e.platform, e.chat_id):
        return "Nothing here is waiting for approval."
    if approval.status != PENDING:
        by = f" by {approval.decided_by}" if approval.decided_by else ""
        return f"That was already answered: {approval.status}{by}."
    if f"{e.platform}:{e.user_id}" != approval.requester and not ctx.host.is_admin(e.platform, e.user_id):
        o = approval.origin
        name = display_name(o["platform"], o["user_id"], o.get("user_name"))
        return f"Only {name} or an admin can answer this approval."
    return None


@command("approve", "let a waiting tool call run (/approve [once|session|always] [ID])")
async def _approve(ctx: CommandContext) -> str:
    words = ctx.args.lower().split()
    scope = next((w for w in words if w in SCOPES), "once")
    approval_id = next((w for w in words if _APPROVAL_ID.fullmatch(w)), None)
    if any(w not in SCOPES and not _APPROVAL_ID.fullmatch(w) for w in words):
        return "Usage: /approve [once|session|always] [ID] (without an ID: the newest waiting here)."
    approval = await _find(ctx, approval_id)
    refusal = _refusal(ctx, approval)
    if refusal is not None or approval is None:
        return refusal or ""
    who = display_name(ctx.event.platform, ctx.event.user_id, ctx.event.user_name)
    ctx.host.answer_approval(ctx, approval, APPROVED, scope)
    ctx.replace_pressed = True
    return decision_note(approval, APPROVED, who, scope)


@command("deny", "refuse a waiting tool call; the model is told (/deny [ID] [reason])")
async def _deny(ctx: CommandContext) -> str:
    first, _, rest = ctx.args.strip().partition(" ")
    approval_id = first.lower() if _APPROVAL_ID.fullmatch(first.lower()) else None
    reason = (rest if approval_id else ctx.args).strip()[:300] or None
    approval = await _find(ctx, approval_id)
    refusal = _refusal(ctx, approval)
    if refusal is not None or approval is None:
        return refusal or ""
    who = display_name(ctx.event.platform, ctx.event.user_id, ctx.event.user_name)
    ctx.host.answer_approval(ctx, approval, DENIED, reason=reason)
    ctx.replace_pressed = True
    return decision_note(approval, DENIED, who, reason=reason)
