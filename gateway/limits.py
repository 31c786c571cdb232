"""Abuse limits: a token bucket per user for inbound messages, and budgets per run and per user.

State is in memory and bounded (least recently seen users are forgotten first), so a flood
of distinct senders cannot grow it without limit; a user's model calls are kept for an hour,
and only when an hourly budget is configured.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gateway.config import LimitsSettings
from platforms.ratelimit import TokenBucket

MAX_TRACKED_USERS = 10_000  # users remembered per structure (least recently seen out): a few MiB at most
_HOUR = 3600.0


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


class InboundLimiter:
    """Per-user message rate; tells the caller when to send the one polite notice."""

    def __init__(self, cfg: LimitsSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        self._buckets: _Lru[TokenBucket] = _Lru()
        self._noticed: _Lru[bool] = _Lru()

    def check(self, user_key: str) -> tuple[bool, bool]:
        """(allowed, send_notice): the notice goes out once per limiting episode."""
        now = self.clock()
        bucket = self._buckets.touch(user_key, lambda: TokenBucket(
            self.cfg.user_messages_per_minute / 60, self.cfg.user_burst, now))
        if bucket.take(now) == 0:
            self._noticed.pop(user_key, None)
            return True, False
        first = user_key not in self._noticed
        self._noticed.touch(user_key, lambda: True)
        return False, first


@dataclass(slots=True)
class _Usage:
    events: deque[tuple[float, int]] = field(default_factory=deque)  # (time, tokens) per model call

    def window(self, now: float) -> tuple[int, int]:
        while self.events and self.events[0][0] <= now - _HOUR:
            self.events.popleft()
        return len(self.events), sum(t for _, t in self.events)


class UserBudgets:
    """Model calls and tokens per user over a rolling hour."""

    def __init__(self, cfg: LimitsSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        self._usage: _Lru[_Usage] = _Lru()

    @property
    def enabled(self) -> bool:
        """Whether an hourly budget is configured; without one nothing is recorded."""
        return self.cfg.user_max_model_calls_per_hour is not None or self.cfg.user_max_tokens_per_hour is not None

    def _of(self, user_key: str) -> _Usage:
        return self._usage.touch(user_key, _Usage)

    def charge(self, user_key: str, tokens: int) -> None:
        """Record one model call (when a budget needs it)."""
        if self.enabled:
            self._of(user_key).events.append((self.clock(), tokens))

    def exceeded(self, user_key: str) -> str | None:
        """A user-facing message when the user is over an hourly budget, else None."""
        if not self.enabled:
            return None
        calls, tokens = self._of(user_key).window(self.clock())
        if self.cfg.user_max_model_calls_per_hour is not None and calls >= self.cfg.user_max_model_calls_per_hour:
            return "You've reached this hour's limit of model calls on this gateway. Please try again later."
        if self.cfg.user_max_tokens_per_hour is not None and tokens >= self.cfg.user_max_tokens_per_hour:
            return "You've reached this hour's token budget on this gateway. Please try again later."
        return None


@dataclass(slots=True)
class RunBudget:
    """Limits for one run; each ``charge_*`` returns a stop message once a limit is passed."""

    max_tool_calls: int
    max_tokens: int | None = None
    user_key: str | None = None
    users: UserBudgets | None = None
    tool_calls: int = 0
    tokens: int = 0

    def charge_model(self, tokens: int) -> str | None:
        """Count one model call and its tokens."""
        self.tokens += tokens
        if self.users is not None and self.user_key is not None:
            self.users.charge(self.user_key, tokens)
        if self.max_tokens is not None and self.tokens > self.max_tokens:
            return f"I stopped: this request used more than its budget of {self.max_tokens} tokens."
        if self.users is not None and self.user_key is not None:
            return self.users.exceeded(self.user_key)
        return None

    def charge_tools(self, count: int) -> str | None:
        """Count tool calls about to run."""
        self.tool_calls += count
        if self.tool_calls > self.max_tool_calls:
            return f"I stopped: this request needed more than {self.max_tool_calls} tool calls."
        return None
