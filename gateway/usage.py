"""Token usage and its cost: the ``run_usage`` rows runs store as they end (the tokens the model server reported),
totalled per model for a conversation and for a user since a time, and priced with ``model.prices``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gateway.config.sections import ModelPrice
from gateway.schema import run_usage_t, sessions_t
from gateway.store import Store

_MILLION = Decimal(1_000_000)
_u = run_usage_t
_PER_MODEL = (sa.select(_u.c.model, sa.func.count().label("runs"),
                        sa.func.coalesce(sa.func.sum(_u.c.prompt_tokens), 0).label("prompt_tokens"),
                        sa.func.coalesce(sa.func.sum(_u.c.completion_tokens), 0).label("completion_tokens"))
              .group_by(_u.c.model).order_by(_u.c.model))
_OF_CONVERSATION = _PER_MODEL.where(
    _u.c.session_key == sa.bindparam("b_key"),
    _u.c.epoch == sa.select(sessions_t.c.epoch).where(sessions_t.c.key == sa.bindparam("b_key")).scalar_subquery())
_OF_USER = _PER_MODEL.where(_u.c.user_key == sa.bindparam("b_user"), _u.c.created_at >= sa.bindparam("b_since"))


@dataclass(slots=True, frozen=True)
class ModelUsage:
    """The runs that used one model in a period, and their tokens."""

    model: str
    runs: int
    prompt_tokens: int
    completion_tokens: int

    def cost(self, price: ModelPrice) -> Decimal:
        """The tokens' cost in US dollars at ``price`` (exact: prices are taken as written)."""
        return (self.prompt_tokens * Decimal(str(price.input))
                + self.completion_tokens * Decimal(str(price.output))) / _MILLION


@dataclass(slots=True, frozen=True)
class UsageTotals:
    """A period's usage, per model (sorted by name)."""

    models: tuple[ModelUsage, ...] = ()

    @property
    def runs(self) -> int:
        """Runs in the period."""
        return sum(m.runs for m in self.models)

    @property
    def prompt_tokens(self) -> int:
        """Input tokens: the requests' (prompt) tokens."""
        return sum(m.prompt_tokens for m in self.models)

    @property
    def completion_tokens(self) -> int:
        """Output tokens: the answers' (completion) tokens."""
        return sum(m.completion_tokens for m in self.models)

    def cost(self, prices: Mapping[str, ModelPrice]) -> tuple[Decimal, list[str]]:
        """The cost of the models that have a price, and the models used without one (their cost is unknown)."""
        priced = [m.cost(prices[m.model]) for m in self.models if m.model in prices]
        return sum(priced, Decimal(0)), [m.model for m in self.models if m.model not in prices]


@dataclass(slots=True, frozen=True)
class UsageReport:
    """What ``/usage`` shows: the current conversation's usage (since its last ``/new``), and its user's today
    and this month."""

    conversation: UsageTotals
    today: UsageTotals
    month: UsageTotals


def period_starts(now: datetime, tz: ZoneInfo) -> tuple[float, float]:
    """UTC timestamps of the start of ``now``'s day and of its month, in time zone ``tz``."""
    local = now.astimezone(tz)
    return (datetime(local.year, local.month, local.day, tzinfo=tz).timestamp(),
            datetime(local.year, local.month, 1, tzinfo=tz).timestamp())


def _totals(conn: Connection, query: sa.Select[Any], params: dict[str, object]) -> UsageTotals:
    return UsageTotals(tuple(ModelUsage(r.model, int(r.runs), int(r.prompt_tokens), int(r.completion_tokens))
                             for r in conn.execute(query, params)))


async def usage_report(store: Store, session_key: str, user_key: str, now: datetime, tz: ZoneInfo) -> UsageReport:
    """The usage of the session's current conversation, and the user's (all their sessions, scheduled runs
    included) since the start of ``now``'s day and month in ``tz``."""
    day, month = period_starts(now, tz)

    def work(conn: Connection) -> UsageReport:
        return UsageReport(_totals(conn, _OF_CONVERSATION, {"b_key": session_key}),
                           _totals(conn, _OF_USER, {"b_user": user_key, "b_since": day}),
                           _totals(conn, _OF_USER, {"b_user": user_key, "b_since": month}))

    return await store.db.read(work)
