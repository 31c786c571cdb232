"""The limiters' memory stays bounded: per-user state is capped, and kept only while it is needed."""

from __future__ import annotations

import pytest

from gateway import limits
from gateway.config import LimitsSettings
from gateway.limits import InboundLimiter, RunBudget, UserBudgets


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_without_an_hourly_budget_no_model_call_is_recorded() -> None:
    budgets = UserBudgets(LimitsSettings())
    for i in range(500):
        budget = RunBudget(max_tool_calls=10, user_key=f"telegram:{i}", users=budgets)
        assert budget.charge_model(100) is None
        assert budgets.exceeded(f"telegram:{i}") is None
    assert len(budgets._usage) == 0


def test_hourly_budget_forgets_calls_older_than_an_hour() -> None:
    clock = Clock()
    budgets = UserBudgets(LimitsSettings(user_max_model_calls_per_hour=3), clock)
    for _ in range(3):
        budgets.charge("telegram:1", 10)
    assert budgets.exceeded("telegram:1") is not None
    clock.now += 3601
    assert budgets.exceeded("telegram:1") is None
    assert len(budgets._usage["telegram:1"].events) == 0


def test_hourly_budgets_keep_at_most_the_most_recent_users(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_TRACKED_USERS", 50)
    budgets = UserBudgets(LimitsSettings(user_max_tokens_per_hour=1000))
    for i in range(200):
        budgets.charge(f"telegram:{i}", 10)
    assert len(budgets._usage) == 50
    assert "telegram:199" in budgets._usage and "telegram:0" not in budgets._usage


def test_inbound_limiter_keeps_at_most_the_most_recent_users(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_TRACKED_USERS", 50)
    limiter = InboundLimiter(LimitsSettings(user_messages_per_minute=1, user_burst=1), Clock())
    for i in range(200):
        assert limiter.check(f"telegram:{i}") == (True, False)
        assert limiter.check(f"telegram:{i}") == (False, True)  # over the limit: one notice
    assert len(limiter._buckets) == 50 and len(limiter._noticed) == 50
    assert limiter.check("telegram:199") == (False, False)  # still remembered: no second notice
