"""The limiters' memory stays bounded: per-user state is capped, and kept (and stored) only while it is needed."""

from __future__ import annotations

import functools

import pytest

from gateway import limits
from gateway.config import LimitsSettings
from gateway.limits import InboundLimiter, RunBudget, Usage, UserBudgets
from gateway.shared_limits import UserCharge, charge_user
from gateway.store import Store


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_without_an_hourly_budget_nothing_is_read_or_recorded(store: Store,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    budgets = UserBudgets(LimitsSettings(), store.db)
    monkeypatch.setattr(store.db, "read", None)  # any read fails
    for i in range(50):
        budget = RunBudget(max_tool_calls=10, user_key=f"telegram:{i}", users=budgets,
                           used_before=await budgets.used(f"telegram:{i}"))
        assert budget.charge_model(100) is None
        assert budget.user_charge() is None


async def test_hourly_budget_forgets_usage_older_than_an_hour(store: Store) -> None:
    clock = Clock()
    budgets = UserBudgets(LimitsSettings(user_max_model_calls_per_hour=3), store.db, clock)
    await store.db.write(functools.partial(charge_user, charge=UserCharge("telegram:1", 3, 30), now=clock.now))
    await store.db.write(functools.partial(charge_user, charge=UserCharge("telegram:2", 1, 10), now=clock.now))
    assert await budgets.used("telegram:1") == Usage(3, 30)
    assert budgets.exceeded(await budgets.used("telegram:1")) is not None
    assert budgets.exceeded(await budgets.used("telegram:2")) is None
    clock.now += 3540  # 59 minutes on: still within the hour
    assert await budgets.used("telegram:1") == Usage(3, 30)
    clock.now += 61
    assert await budgets.used("telegram:1") == Usage()
    # the next charge drops the user's minutes older than an hour
    await store.db.write(functools.partial(charge_user, charge=UserCharge("telegram:1", 1, 5), now=clock.now))
    rows = await store.db.read(lambda conn: conn.exec_driver_sql("SELECT user_key, model_calls FROM user_usage "
                                                                 "ORDER BY user_key").all())
    assert [tuple(r) for r in rows] == [("telegram:1", 1), ("telegram:2", 1)]


async def test_run_budget_counts_the_hour_before_the_run_and_the_run_itself(store: Store) -> None:
    budgets = UserBudgets(LimitsSettings(user_max_tokens_per_hour=100), store.db)
    budget = RunBudget(max_tool_calls=10, user_key="telegram:1", users=budgets, used_before=Usage(1, 60))
    assert budget.user_refusal() is None
    assert budget.charge_model(30) is None
    assert budget.charge_model(10) == "You've reached this hour's token budget on this gateway. Please try again later."
    assert budget.user_charge() == UserCharge("telegram:1", 2, 40)


async def test_inbound_limiter_keeps_at_most_the_most_recent_users(store: Store,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_TRACKED_USERS", 50)
    limiter = InboundLimiter(LimitsSettings(user_messages_per_minute=1, user_burst=1), store.db, Clock())
    for i in range(200):
        assert await limiter.check(f"telegram:{i}") == (True, False)
        assert await limiter.check(f"telegram:{i}") == (False, True)  # over the limit: one notice
    assert len(limiter._allowances) == 50 and len(limiter._noticed) == 50
    assert await limiter.check("telegram:199") == (False, False)  # still remembered: no second notice
