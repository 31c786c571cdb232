"""DM pairing: a stranger who DMs the bot gets a short code; an admin approves it.

Codes are 8 characters from an alphabet without look-alikes, valid for a limited time,
at most a few pending per platform, at most one code message per user per hour, and
approvals lock for an hour after 5 failures. Pairing never applies in groups and never
overrides an explicit denylist (the router checks both before offering a code).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gateway.config import cli_command
from gateway.schema import approved_users_t, insert_ignoring_conflicts, pairing_codes_t, pairing_failures_t
from gateway.store import OutboxPart, OutboxRow, Store

ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I
CODE_LENGTH = 8
CODE_MESSAGE_INTERVAL = 3600.0
MAX_FAILED_APPROVALS = 5
LOCKOUT_SECONDS = 3600.0

def normalize_code(text: str) -> str:
    """Codes are shown as ``ABCD-EFGH``; accept any case, dashes and spaces."""
    return "".join(ch for ch in text.upper() if ch.isalnum())


def format_code(code: str) -> str:
    """``ABCDEFGH`` -> ``ABCD-EFGH``."""
    return f"{code[:4]}-{code[4:]}"


def approve_command(code: str, config_source: Path | None) -> str:
    """The shell command that approves ``code`` on the store of the config loaded from ``config_source``,
    exactly as an operator types it (``--config`` only when discovery would not find that file)."""
    return cli_command(f"pairing approve {format_code(code)}", config_source)


@dataclass(slots=True, frozen=True)
class PendingCode:
    """A code waiting for approval."""

    code: str
    platform: str
    user_id: str
    user_name: str | None
    chat_id: str
    expires_at: float


class ApprovedUser(NamedTuple):
    """A user an admin approved (and nobody revoked since)."""

    platform: str
    user_id: str
    user_name: str | None
    approved_by: str


@dataclass(slots=True, frozen=True)
class Approval:
    """The outcome of an approval attempt; ``code`` is set when it succeeded."""

    ok: bool
    message: str
    code: PendingCode | None = None


class PairingStore:
    """Pairing state in the gateway's database (shared by the daemon and the CLI)."""

    def __init__(self, store: Store, ttl: float = 3600.0, max_pending: int = 3) -> None:
        self.db = store.db
        self.ttl = ttl
        self.max_pending = max_pending

    async def issue(self, platform: str, user_id: str, user_name: str | None, chat_id: str,
                    now: float | None = None) -> str | None:
        """A new code for this user, or None when one must not be sent (rate or capacity)."""
        now = time.time() if now is None else now

        def work(conn: Connection) -> str | None:
            recent = conn.execute(sa.select(sa.func.count()).select_from(pairing_codes_t).where(
                pairing_codes_t.c.platform == platform, pairing_codes_t.c.user_id == user_id,
                pairing_codes_t.c.created_at > now - CODE_MESSAGE_INTERVAL)).scalar_one()
            if recent:
                return None
            pending = conn.execute(sa.select(sa.func.count()).select_from(pairing_codes_t).where(
                pairing_codes_t.c.platform == platform, pairing_codes_t.c.status == "pending",
                pairing_codes_t.c.expires_at > now)).scalar_one()
            if pending >= self.max_pending:
                return None
            code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LENGTH))
            conn.execute(pairing_codes_t.insert().values(
                code=code, platform=platform, user_id=user_id, user_name=user_name, chat_id=chat_id,
                status="pending", created_at=now, expires_at=now + self.ttl))
            return code

        return await self.db.write(work)

    async def approve(self, code_text: str, approver: str, now: float | None = None) -> Approval:
        """Approve a code: the user it was issued to may chat from now on."""
        now = time.time() if now is None else now
        code = normalize_code(code_text)

        def work(conn: Connection) -> Approval:
            failures = conn.execute(sa.select(sa.func.count()).select_from(pairing_failures_t).where(
                pairing_failures_t.c.at > now - LOCKOUT_SECONDS)).scalar_one()
            if failures >= MAX_FAILED_APPROVALS:
                return Approval(False, "Too many failed approvals; pairing is locked for an hour.")
            row = conn.execute(sa.select(pairing_codes_t).where(pairing_codes_t.c.code == code)).first()
            problem = None
            if row is None:
                problem = "No such pairing code."
            elif row.status != "pending":
                problem = f"That code was already {row.status}."
            elif row.expires_at <= now:
                problem = "That code has expired; the user can DM the bot again in an hour for a new one."
            if problem is not None:
                conn.execute(pairing_failures_t.insert().values(at=now))
                return Approval(False, problem)
            conn.execute(pairing_codes_t.update().where(pairing_codes_t.c.code == code).values(status="approved"))
            # a user approved before through another code keeps that approval
            conn.execute(insert_ignoring_conflicts(conn.dialect.name, approved_users_t, ("platform", "user_id")), {
                "platform": row.platform, "user_id": row.user_id, "user_name": row.user_name,
                "approved_by": approver, "approved_at": now})
            pending = PendingCode(row.code, row.platform, row.user_id, row.user_name, row.chat_id, row.expires_at)
            return Approval(True, f"Approved {row.platform} user {row.user_id} ({row.user_name or 'unknown'}).",
                            pending)

        return await self.db.write(work)

    async def is_approved(self, platform: str, user_id: str) -> bool:
        """Whether the user was approved (and not revoked)."""
        query = sa.select(approved_users_t.c.user_id).where(
            approved_users_t.c.platform == platform, approved_users_t.c.user_id == user_id)
        return await self.db.read(lambda conn: conn.execute(query).first()) is not None

    async def pending(self, now: float | None = None) -> list[PendingCode]:
        """Codes waiting for approval, oldest first."""
        now = time.time() if now is None else now
        query = (sa.select(pairing_codes_t).where(pairing_codes_t.c.status == "pending",
                                                  pairing_codes_t.c.expires_at > now)
                 .order_by(pairing_codes_t.c.created_at))
        rows = await self.db.read(lambda conn: conn.execute(query).all())
        return [PendingCode(r.code, r.platform, r.user_id, r.user_name, r.chat_id, r.expires_at) for r in rows]

    async def approved(self) -> list[ApprovedUser]:
        """Approved users, first approved first."""
        query = sa.select(approved_users_t).order_by(approved_users_t.c.approved_at)
        rows = await self.db.read(lambda conn: conn.execute(query).all())
        return [ApprovedUser(r.platform, r.user_id, r.user_name, r.approved_by) for r in rows]

    async def deny(self, code_text: str) -> bool:
        """Refuse a pending code: it can no longer be approved (the user gets no new code within the hour)."""
        update = (pairing_codes_t.update().where(pairing_codes_t.c.code == normalize_code(code_text),
                                                 pairing_codes_t.c.status == "pending").values(status="denied"))
        return bool(await self.db.write(lambda conn: conn.execute(update).rowcount))

    async def revoke(self, platform: str, user_id: str) -> bool:
        """Withdraw an approval."""
        delete = approved_users_t.delete().where(approved_users_t.c.platform == platform,
                                                 approved_users_t.c.user_id == user_id)
        return bool(await self.db.write(lambda conn: conn.execute(delete).rowcount))


APPROVED_NOTICE = "You're approved: you can chat with me now."


async def notify_approved(store: Store, code: PendingCode) -> list[OutboxRow] | None:
    """Tell the approved user, through the outbox (works from the CLI too: the daemon delivers it).

    Returns the stored part (None if it was stored before)."""
    return await store.enqueue([OutboxPart(f"paired:{code.code}", code.platform, code.chat_id, APPROVED_NOTICE)])
