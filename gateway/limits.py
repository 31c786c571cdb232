"""Abuse limits: a token bucket per user for inbound messages, and budgets per run and per user.

The per-user state is kept in the store (gateway/shared_limits.py), so it survives restarts and holds across
replicas on one database:

- **Inbound rate**: each user's bucket is a row. A process takes up to ``limits.local_allowance`` tokens from it
  at a time (one write) and admits that many of the user's messages without the database; once they are used up
  it takes more, and after the store had none it refuses without asking again until the bucket can hold a whole
  token. Bound: over any interval, a user is admitted at most ``user_burst + rate × interval`` messages plus
  ``local_allowance - 1`` per process (tokens a replica took earlier and has not used yet). Unused tokens go back
  to the store when the gateway stops; a crash loses them (at most ``local_allowance - 1`` per user: fewer
  messages admitted, never more).
- **Hourly budgets**: a run reads its user's model calls and tokens of the last hour when it starts, and charges
  its own in the transaction that records its end. Runs of one user in flight at once (several replicas, a
  background task) do not see each other's usage until they end: each may overshoot by up to one run.

In-process state is bounded (least recently seen users are forgotten first, losing their unused tokens).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from gateway.config import LimitsSettings
from gateway.db import Database
from gateway.shared_limits import UserCharge, hour_usage, return_tokens, take_tokens

logger = logging.getLogger(__name__)

MAX_TRACKED_USERS = 10_000  # users remembered per structure (least recently seen out): a few MiB at most


V = TypeVar("V")


class _Lru(OrderedDict[str, V], Generic[V]):
    def touch(self, key: str, make: Callable[[], V]) -> V:
        value = self.get(key)
        if value is None:
            value = self[key] = make()
        self.move_to_end(key)
        while len(self) > MAX_TRACKED_USERS:
            self.popitem(last=False)
        return value


@dataclass(slots=True)
class _Allowance:
    tokens: int = 0  # taken from the user's stored bucket, not used yet
    empty_until: float = 0.0  # the stored bucket had no whole token; it cannot have one before this time


class InboundLimiter:
    """Per-user message rate over the stored buckets (see the module docstring for the bound); tells the caller
    when to send the one polite notice."""

    def __init__(self, cfg: LimitsSettings, db: Database, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.db = db
        self.clock = clock  # wall clock: the stored buckets are shared between processes
        self._allowances: _Lru[_Allowance] = _Lru()
        self._noticed: _Lru[bool] = _Lru()
        self._taking: dict[str, asyncio.Future[None]] = {}  # users whose tokens are being taken from the store

    async def check(self, user_key: str) -> tuple[bool, bool]:
        """(allowed, send_notice): the notice goes out once per limiting episode."""
        if await self._admit(user_key):
            self._noticed.pop(user_key, None)
            return True, False
        first = user_key not in self._noticed
        self._noticed.touch(user_key, lambda: True)
        return False, first

    async def _admit(self, user_key: str) -> bool:
        while True:
            allowance = self._allowances.touch(user_key, _Allowance)
            if allowance.tokens:
                allowance.tokens -= 1
                return True
            if self.clock() < allowance.empty_until:
                return False
            taking = self._taking.get(user_key)
            if taking is None:
                break
            await asyncio.wait([taking])  # one trip to the store per user at a time, then look again
        done = self._taking[user_key] = asyncio.get_running_loop().create_future()
        now = self.clock()
        try:
            taken, wait = await self.db.write(functools.partial(
                take_tokens, user_key=user_key, rate=self.cfg.user_messages_per_minute / 60,
                capacity=self.cfg.user_burst, most=self.cfg.local_allowance, now=now), urgent=True, quick=True)
        finally:
            del self._taking[user_key]
            done.set_result(None)
        allowance = self._allowances.touch(user_key, _Allowance)
        if not taken:
            allowance.empty_until = now + wait
            return False
        allowance.tokens += taken - 1
        return True

    async def give_back(self) -> None:
        """Return the tokens taken and not used to the store (when the gateway stops), in one transaction."""
        unused = {key: a.tokens for key, a in self._allowances.items() if a.tokens}
        self._allowances.clear()
        if not unused:
            return
        try:
            await self.db.write(functools.partial(return_tokens, unused=unused))
        except Exception as exc:  # as after a crash: those users are admitted fewer messages, never more
            logger.warning("could not return %d users' unused message tokens to the store: %s", len(unused), exc)


@dataclass(frozen=True, slots=True)
class Usage:
    """Model calls and tokens."""

    model_calls: int = 0
    tokens: int = 0


class UserBudgets:
    """Model calls and tokens per user over the last hour (to the minute), as stored by finished runs."""

    def __init__(self, cfg: LimitsSettings, db: Database, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.db = db
        self.clock = clock

    @property
    def enabled(self) -> bool:
        """Whether an hourly budget is configured; without one nothing is read or recorded."""
        return self.cfg.user_max_model_calls_per_hour is not None or self.cfg.user_max_tokens_per_hour is not None

    async def used(self, user_key: str) -> Usage:
        """What the user's runs that ended in the last hour used (nothing when no budget is configured)."""
        if not self.enabled:
            return Usage()
        calls, tokens = await self.db.read(functools.partial(hour_usage, user_key=user_key, now=self.clock()))
        return Usage(calls, tokens)

    def exceeded(self, used: Usage) -> str | None:
        """A user-facing message when ``used`` is at or over an hourly budget, else None."""
        if self.cfg.user_max_model_calls_per_hour is not None and \
                used.model_calls >= self.cfg.user_max_model_calls_per_hour:
            return "You've reached this hour's limit of model calls on this gateway. Please try again later."
        if self.cfg.user_max_tokens_per_hour is not None and used.tokens >= self.cfg.user_max_tokens_per_hour:
            return "You've reached this hour's token budget on this gateway. Please try again later."
        return None


@dataclass(slots=True)
class RunBudget:
    """Limits for one run; each ``charge_*`` returns a stop message once a limit is passed. With ``users`` and
    ``user_key``, the user's hourly budgets count ``used_before`` (the hour before the run) plus this run."""

    max_tool_calls: int
    max_tokens: int | None = None
    user_key: str | None = None
    users: UserBudgets | None = None
    used_before: Usage = Usage()
    tool_calls: int = 0
    tokens: int = 0
    model_calls: int = 0

    def user_refusal(self) -> str | None:
        """The hourly budget message when the user is at or over one, else None."""
        if self.users is None or self.user_key is None:
            return None
        return self.users.exceeded(Usage(self.used_before.model_calls + self.model_calls,
                                         self.used_before.tokens + self.tokens))

    def charge_model(self, tokens: int) -> str | None:
        """Count one model call and its tokens."""
        self.tokens += tokens
        self.model_calls += 1
        if self.max_tokens is not None and self.tokens > self.max_tokens:
            return f"I stopped: this request used more than its budget of {self.max_tokens} tokens."
        return self.user_refusal()

    def charge_tools(self, count: int) -> str | None:
        """Count tool calls about to run."""
        self.tool_calls += count
        if self.tool_calls > self.max_tool_calls:
            return f"I stopped: this request needed more than {self.max_tool_calls} tool calls."
        return None

    def user_charge(self) -> UserCharge | None:
        """What the run charges to its user's hourly budgets when it ends (None: no budget, or nothing used)."""
        if self.users is None or self.user_key is None or not self.users.enabled or not self.model_calls:
            return None
        return UserCharge(self.user_key, self.model_calls, self.tokens)
