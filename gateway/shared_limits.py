"""Per-user limits kept in the store, so restarts and replicas share them (gateway/limits.py uses these).

Units of work over a ``Connection``, each run in one transaction by ``Database.write``/``read``:

- a user's inbound message bucket (``user_rate_limits``): refilled to now and debited in one transaction (the
  row locked with ``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite serializes writes anyway);
- the model calls and tokens of a user's finished runs per minute (``user_usage``), added in the transaction that
  records the run's end, and summed over the last hour when a run starts.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from gateway.schema import insert_ignoring_conflicts, user_rate_limits_t, user_usage_t

BUDGET_MINUTES = 60  # the hourly budgets look back this many minutes


@dataclass(frozen=True, slots=True)
class UserCharge:
    """What a run charges to its user's hourly budgets when it ends."""

    user_key: str
    model_calls: int
    tokens: int


# -- inbound message buckets -------------------------------------------------------------------------------------

_BUCKET = (sa.select(user_rate_limits_t.c.tokens, user_rate_limits_t.c.refilled_at)
           .where(user_rate_limits_t.c.user_key == sa.bindparam("b_key")).with_for_update())
_BUCKET_SET = (user_rate_limits_t.update().where(user_rate_limits_t.c.user_key == sa.bindparam("b_key"))
               .values(tokens=sa.bindparam("b_tokens"), refilled_at=sa.bindparam("b_at")))
_BUCKET_RETURN = (user_rate_limits_t.update().where(user_rate_limits_t.c.user_key == sa.bindparam("b_key"))
                  .values(tokens=user_rate_limits_t.c.tokens + sa.bindparam("b_n", type_=sa.Float)))


def take_tokens(conn: Connection, user_key: str, rate: float, capacity: float, most: int,
                now: float) -> tuple[int, float]:
    """Take up to ``most`` whole tokens from the user's bucket (``capacity`` tokens refilled at ``rate`` per second;
    full for a user never seen), refilled to ``now`` first. Returns (tokens taken, seconds until the bucket holds a
    whole token again when none was taken, else 0)."""
    row = conn.execute(_BUCKET, {"b_key": user_key}).first()
    if row is None:
        conn.execute(insert_ignoring_conflicts(conn.dialect.name, user_rate_limits_t, "user_key"),
                     {"user_key": user_key, "tokens": capacity, "refilled_at": now})
        row = conn.execute(_BUCKET, {"b_key": user_key}).one()
    at = max(now, row.refilled_at)  # a replica whose clock is behind refills nothing rather than going back
    tokens = min(capacity, row.tokens + (at - row.refilled_at) * rate)
    taken = min(most, int(tokens))
    conn.execute(_BUCKET_SET, {"b_key": user_key, "b_tokens": tokens - taken, "b_at": at})
    return taken, 0.0 if taken else (1 - tokens) / rate


def return_tokens(conn: Connection, unused: Mapping[str, int]) -> None:
    """Put tokens taken and not used back into their users' buckets (``take_tokens`` caps them at the capacity)."""
    if unused:
        conn.execute(_BUCKET_RETURN, [{"b_key": key, "b_n": n} for key, n in unused.items()])


# -- hourly usage ------------------------------------------------------------------------------------------------


@functools.cache
def _usage_add(dialect: str) -> Any:
    insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(user_usage_t)
    return insert.on_conflict_do_update(
        index_elements=[user_usage_t.c.user_key, user_usage_t.c.minute],
        set_={"model_calls": user_usage_t.c.model_calls + insert.excluded.model_calls,
              "tokens": user_usage_t.c.tokens + insert.excluded.tokens})


_USAGE_FORGET = user_usage_t.delete().where(user_usage_t.c.user_key == sa.bindparam("b_key"),
                                            user_usage_t.c.minute <= sa.bindparam("b_before"))
_USAGE_HOUR = (sa.select(sa.func.coalesce(sa.func.sum(user_usage_t.c.model_calls), 0),
                         sa.func.coalesce(sa.func.sum(user_usage_t.c.tokens), 0))
               .where(user_usage_t.c.user_key == sa.bindparam("b_key"),
                      user_usage_t.c.minute > sa.bindparam("b_before")))


def charge_user(conn: Connection, charge: UserCharge, now: float) -> None:
    """Add a run's model calls and tokens to its user's minute, dropping the user's minutes older than an hour."""
    minute = int(now // 60)
    conn.execute(_usage_add(conn.dialect.name), {"user_key": charge.user_key, "minute": minute,
                                                 "model_calls": charge.model_calls, "tokens": charge.tokens})
    conn.execute(_USAGE_FORGET, {"b_key": charge.user_key, "b_before": minute - BUDGET_MINUTES})


def hour_usage(conn: Connection, user_key: str, now: float) -> tuple[int, int]:
    """(model calls, tokens) the user's finished runs charged in the last hour (to the minute)."""
    params = {"b_key": user_key, "b_before": int(now // 60) - BUDGET_MINUTES}
    calls, tokens = conn.execute(_USAGE_HOUR, params).one()
    return int(calls), int(tokens)
