"""Per-user limits kept in the store: a user's rate limit and hourly budgets hold across a restart and across
replicas on one database, and the local allowance keeps the store off the hot path."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gateway.config import LimitsSettings
from gateway.db import Database
from gateway.limits import InboundLimiter
from gateway.store import Store
from tests.conftest import GatewayFactory

NEVER_REFILLS = 0.0001  # messages per minute: no token comes back during a test


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def count_writes(db: Database, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one for each write transaction ``db`` runs from now on."""
    writes: list[int] = []
    write = db.write

    async def counted(work: Callable[..., Any], **kwargs: Any) -> Any:
        writes.append(1)
        return await write(work, **kwargs)

    monkeypatch.setattr(db, "write", counted)
    return writes


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    s = await Store.open(store_url)
    yield s
    await s.close()


def _limits(burst: int, allowance: int, per_minute: float = NEVER_REFILLS, **more: Any) -> dict[str, Any]:
    return {"user_messages_per_minute": per_minute, "user_burst": burst, "local_allowance": allowance, **more}


async def _admitted(say: Callable[[str], Awaitable[Any]], n: int) -> int:
    return sum([await say(f"msg {i}") is not None for i in range(n)])


# -- through the gateway ---------------------------------------------------------------------------------------


async def test_a_users_rate_limit_holds_across_a_restart(store_url: str, make_gateway: GatewayFactory) -> None:
    cfg = {"store": {"url": store_url}, "limits": _limits(burst=4, allowance=3)}
    first = await make_gateway(cfg)
    assert await _admitted(first.chat.user_says, 2) == 2  # took 3 tokens of 4: one is left unused
    await first.chat.wait_for(lambda: len(first.chat.sent) == 2)
    await first.gateway.stop(drain_timeout=5)  # gives the unused token back
    second = await make_gateway(cfg)
    assert await _admitted(second.chat.user_says, 5) == 2, "4 in all: the burst, across the restart"
    assert await second.chat.user_says("another user", user_id="1002", chat_id="200") is not None


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
async def test_a_users_rate_limit_holds_across_two_replicas(store_url: str, make_gateway: GatewayFactory) -> None:
    burst, allowance, replicas = 10, 3, 2
    cfg = {"store": {"url": store_url}, "limits": _limits(burst, allowance)}
    a, b = await make_gateway(cfg), await make_gateway(cfg)
    admitted = 0
    for i in range(15):  # the messages split between the replicas, as a load balancer would
        admitted += await a.chat.user_says(f"a {i}") is not None
        admitted += await b.chat.user_says(f"b {i}") is not None
    # Each replica alone would admit the whole burst (20 together); the bound is the module docstring's.
    assert burst - replicas * (allowance - 1) <= admitted <= burst + replicas * (allowance - 1)
    assert admitted == burst, "no token was taken before: every admission used one of the stored burst"


async def test_hourly_budgets_hold_across_a_restart(store_url: str, make_gateway: GatewayFactory) -> None:
    cfg = {"store": {"url": store_url}, "limits": {"user_max_model_calls_per_hour": 1}}
    first = await make_gateway(cfg)
    await first.chat.user_says("hello")
    await first.chat.wait_for(lambda: len(first.chat.sent) == 1)
    assert first.chat.sent[0].text == "Echo: hello"
    await first.gateway.stop(drain_timeout=5)
    second = await make_gateway(cfg)
    await second.chat.user_says("again")
    await second.chat.wait_for(lambda: len(second.chat.sent) == 1)
    assert "this hour's limit of model calls" in second.chat.sent[0].text
    assert len(second.model.requests) == 0
    await second.chat.user_says("other user", user_id="1002", chat_id="200")
    await second.chat.wait_for(lambda: len(second.chat.sent) == 2)
    assert second.chat.sent[1].text == "Echo: other user"


# -- the limiter over the store ----------------------------------------------------------------------------------


async def test_the_local_allowance_means_one_write_per_allowance(store: Store,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    limiter = InboundLimiter(LimitsSettings(**_limits(burst=100, allowance=10)), store.db, Clock())
    writes = count_writes(store.db, monkeypatch)
    assert all([(await limiter.check("telegram:1"))[0] for _ in range(40)])
    assert len(writes) == 4
    # a flood once the bucket is empty: one write finds it empty, the rest are refused without the store
    limiter = InboundLimiter(LimitsSettings(**_limits(burst=5, allowance=5)), store.db, Clock())
    results = [(await limiter.check("telegram:2"))[0] for _ in range(100)]
    assert results == [True] * 5 + [False] * 95
    assert len(writes) == 4 + 2


async def test_concurrent_messages_of_one_user_take_from_the_store_once(store: Store,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    limiter = InboundLimiter(LimitsSettings(**_limits(burst=10, allowance=4)), store.db, Clock())
    writes = count_writes(store.db, monkeypatch)
    results = await asyncio.gather(*(limiter.check("telegram:1") for _ in range(4)))
    assert results == [(True, False)] * 4 and len(writes) == 1
    assert limiter._allowances["telegram:1"].tokens == 0


async def test_processes_share_the_bucket_and_its_refill(store: Store) -> None:
    clock = Clock()
    settings = LimitsSettings(**_limits(burst=6, allowance=4, per_minute=60))  # a token a second
    one, two = InboundLimiter(settings, store.db, clock), InboundLimiter(settings, store.db, clock)
    assert [(await one.check("u"))[0] for _ in range(2)] == [True, True]  # took 4: 2 left in the store
    assert [(await two.check("u"))[0] for _ in range(3)] == [True, True, False]
    clock.now += 0.5
    assert not (await two.check("u"))[0], "refused locally until a token can have come back"
    clock.now += 2.0  # 2.5 s since the store was empty: 2 tokens
    assert [(await two.check("u"))[0] for _ in range(3)] == [True, True, False]
    await one.give_back()  # its 2 unused tokens go back to the store
    clock.now += 1.0
    assert [(await two.check("u"))[0] for _ in range(4)] == [True, True, True, False]


async def test_returned_tokens_never_overfill_the_bucket(store: Store) -> None:
    clock = Clock()
    settings = LimitsSettings(**_limits(burst=3, allowance=3, per_minute=60))
    one, two = InboundLimiter(settings, store.db, clock), InboundLimiter(settings, store.db, clock)
    assert (await one.check("u"))[0]  # took all 3
    clock.now += 10  # the stored bucket refills to its capacity meanwhile
    await one.give_back()
    assert [(await two.check("u"))[0] for _ in range(5)] == [True] * 3 + [False] * 2
