"""The session reset policy: a chat's conversation starts afresh by itself, as with ``/new``, when its next
message comes ``sessions.reset_after_idle_minutes`` after the last one, or after ``sessions.daily_reset_hour``
passed since the last one; the reply to that message starts with a notice saying so.

The decision is taken when the message's run starts, in the transaction that starts it (``Store.start_run``),
from two stored times: the session's last activity (``sessions.updated_at``: its last chat message, or ``/new``)
and the message's acceptance (``runs.created_at``), never the clock at the start. Invariant: a run resets its
session at most once, and a run started again (after a crash, on another replica) uses the epoch of its first
start. The start that resets records the run's id with the reset (``sessions.last_reset``) in the same
transaction; a later start of the same run finds it and gets that reset back, with its notice. Were that first
transaction lost, nothing of it was written and the same two times give the same decision again.

Cron and webhook runs have no chat session (their runs start without one) and never reset a chat's; memory notes
belong to the user, not the conversation, and are kept.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from gateway.config import Config
from gateway.store import SessionReset

IDLE = "idle"
DAILY = "daily"


@dataclass(slots=True, frozen=True)
class ResetPolicy:
    """When a chat message starts a new conversation (``sessions`` in the config)."""

    idle_seconds: float | None
    daily_hour: int | None
    zone: ZoneInfo

    @classmethod
    def from_config(cls, cfg: Config) -> ResetPolicy | None:
        """The configured policy; None when conversations never reset by themselves."""
        s = cfg.sessions
        if s.reset_after_idle_minutes is None and s.daily_reset_hour is None:
            return None
        idle = s.reset_after_idle_minutes * 60.0 if s.reset_after_idle_minutes is not None else None
        return cls(idle, s.daily_reset_hour, ZoneInfo(s.timezone or cfg.cron.timezone))

    def reason(self, last_active: float, at: float) -> str | None:
        """Why a message accepted at ``at`` (unix seconds) starts a new conversation of a session last active at
        ``last_active``: ``IDLE``, ``DAILY``, or None when it continues the conversation."""
        if self.idle_seconds is not None and at - last_active > self.idle_seconds:
            return IDLE
        if self.daily_hour is not None and last_active < self.last_daily_reset(at) <= at:
            return DAILY
        return None

    def last_daily_reset(self, at: float) -> float:
        """The latest daily reset time at or before ``at``: the reset hour in the zone, today or yesterday (on a
        day whose clocks skip that hour, the moment the clocks reach it)."""
        assert self.daily_hour is not None
        local = dt.datetime.fromtimestamp(at, self.zone)
        day = local.date() if local.hour >= self.daily_hour else local.date() - dt.timedelta(days=1)
        return dt.datetime.combine(day, dt.time(self.daily_hour), self.zone).timestamp()

    def notice(self, reset: SessionReset) -> str:
        """The line the reply starts with."""
        why = (f"the daily reset at {self.daily_hour:02d}:00 passed" if reset.reason == DAILY and self.daily_hour
               is not None else f"the last one was idle for {_duration(reset.idle_seconds)}")
        return f"(New conversation: {why}. /help for commands.)"


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 120:
        return f"{minutes} min"
    hours = minutes // 60
    return f"{hours} h" if hours < 48 else f"{hours // 24} days"
