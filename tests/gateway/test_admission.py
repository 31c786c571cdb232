"""Adaptive admission (gateway/admission.py): the adaptive limit's semaphore semantics, the gradient controller
driven by injected health samples, the config, and limits growing under a webhook burst through a real gateway."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import pytest

from gateway.admission import PACE, AdaptiveLimit, Admission, GradientController, Health
from gateway.config import ConfigError, parse_config
from gateway.metrics import Metrics
from gateway.sim.model_server import last_user_text
from gateway.watchdog import LoopWatchdog
from tests.conftest import WEBHOOK_SECRET, GatewayFactory

HEALTHY = Health(loop_lag=0.001)


async def _settle() -> None:
    """Let every task that can run, run (waiters resume, new ones queue)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def _handed_out(limit: AdaptiveLimit) -> None:
    """Until the limit has handed every slot it has room for (a raise hands them out over several iterations)."""
    while limit.in_flight < limit.limit and limit.waiting:
        await asyncio.sleep(0)


async def _take(limit: AdaptiveLimit, i: int, order: list[int] | None) -> None:
    await limit.acquire()
    if order is not None:
        order.append(i)


async def _waiters(limit: AdaptiveLimit, n: int, order: list[int] | None = None) -> list[asyncio.Task[None]]:
    """``n`` tasks queued for a slot of ``limit`` (each appends its number to ``order`` once it has one)."""
    tasks = [asyncio.create_task(_take(limit, i, order)) for i in range(n)]
    await _settle()
    return tasks


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# --- AdaptiveLimit ----------------------------------------------------------------------------------------------

async def test_raising_the_limit_wakes_waiters_first_come_first_served() -> None:
    limit = AdaptiveLimit("chat", 1, 10)
    await limit.acquire()
    assert limit.locked()
    order: list[int] = []
    tasks = await _waiters(limit, 4, order)
    assert (limit.in_flight, limit.waiting, order) == (1, 4, [])
    limit.set_limit(3)
    await _settle()
    assert order == [0, 1] and (limit.in_flight, limit.waiting) == (3, 2) and limit.locked()
    limit.release()
    await _settle()
    assert order == [0, 1, 2]
    await _cancel(tasks)


async def test_a_large_raise_hands_out_slots_a_few_per_iteration_in_order() -> None:
    limit = AdaptiveLimit("webhook", 1, 100)
    await limit.acquire()
    order: list[int] = []
    tasks = await _waiters(limit, 3 * PACE, order)
    limit.set_limit(100)
    assert limit.in_flight == 1 + PACE and limit.locked(), "the rest wait for the next iterations"
    late = asyncio.create_task(_take(limit, -1, order))
    await _handed_out(limit)
    await _settle()
    assert order == [*range(3 * PACE), -1], "nobody arriving meanwhile goes first"
    await _cancel([*tasks, late])


async def test_lowering_the_limit_keeps_held_slots() -> None:
    limit = AdaptiveLimit("webhook", 1, 10, limit=4)
    for _ in range(4):
        await limit.acquire()
    order: list[int] = []
    tasks = await _waiters(limit, 1, order)
    limit.set_limit(2)
    assert (limit.limit, limit.in_flight) == (2, 4)
    limit.release()
    limit.release()
    await _settle()
    assert order == [] and limit.locked(), "a slot given back above the new limit is not handed on"
    limit.release()
    await _settle()
    assert order == [0] and limit.in_flight == 2
    await _cancel(tasks)


async def test_set_limit_stays_within_floor_and_ceiling() -> None:
    limit = AdaptiveLimit("cron", 2, 8)
    limit.set_limit(100)
    assert limit.limit == 8
    limit.set_limit(0)
    assert limit.limit == 2
    with pytest.raises(ValueError, match="floor"):
        AdaptiveLimit("bad", 5, 4)


async def test_a_waiter_cancelled_before_its_turn_takes_no_slot() -> None:
    limit = AdaptiveLimit("chat", 1, 1)
    await limit.acquire()
    order: list[int] = []
    tasks = await _waiters(limit, 3, order)
    tasks[0].cancel()
    await _settle()
    assert limit.waiting == 2
    limit.release()
    await _settle()
    assert order == [1] and limit.in_flight == 1
    await _cancel(tasks)


async def test_a_waiter_cancelled_after_it_was_handed_a_slot_passes_it_on() -> None:
    limit = AdaptiveLimit("chat", 1, 1)
    await limit.acquire()
    order: list[int] = []
    tasks = await _waiters(limit, 2, order)
    limit.release()  # handed to waiter 0, which has not resumed yet
    tasks[0].cancel()
    await _settle()
    assert order == [1] and limit.in_flight == 1 and limit.waiting == 0
    limit.release()
    assert limit.in_flight == 0 and not limit.locked()
    await _cancel(tasks)


async def test_context_manager_and_over_release() -> None:
    limit = AdaptiveLimit("chat", 1, 1)
    async with limit:
        assert limit.locked()
    assert not limit.locked()
    with pytest.raises(ValueError, match="released more often"):
        limit.release()


# --- GradientController -----------------------------------------------------------------------------------------

def _controller() -> GradientController:
    return GradientController(lag_target=0.005, latency_tolerance=2.0)


async def test_limit_rises_to_the_ceiling_with_a_slow_healthy_model_and_waiting_runs() -> None:
    controller, limit = _controller(), AdaptiveLimit("webhook", 16, 1000)
    tasks = await _waiters(limit, 1500)
    seen = []
    for _ in range(8):
        controller.step(Health(loop_lag=0.001, model_latency=3.0), [limit])
        await _handed_out(limit)
        seen.append(limit.limit)
    assert seen[:6] == [32, 64, 128, 256, 512, 1000], "slow start: doubling each healthy interval"
    assert limit.in_flight == 1000
    await _cancel(tasks)


async def test_limit_grows_no_further_than_the_runs_asking() -> None:
    controller, limit = _controller(), AdaptiveLimit("chat", 16, 256)
    tasks = await _waiters(limit, 40)
    for _ in range(5):
        controller.step(HEALTHY, [limit])
        await _settle()
    assert limit.limit == 40 and limit.waiting == 0
    await _cancel(tasks)


async def test_idle_or_unsaturated_limit_does_not_grow() -> None:
    controller, limit = _controller(), AdaptiveLimit("chat", 16, 256)
    tasks = await _waiters(limit, 10)  # fewer runs than the limit: nobody waits
    for _ in range(5):
        controller.step(HEALTHY, [limit])
    assert limit.limit == 16
    await _cancel(tasks)


async def test_loop_lag_above_target_lowers_the_limit_as_runs_end() -> None:
    controller, limit = _controller(), AdaptiveLimit("webhook", 4, 1000, limit=64)
    tasks = await _waiters(limit, 64)
    controller.step(Health(loop_lag=0.008), [limit])
    assert limit.limit == 40, "gradient target/lag = 5/8"
    controller.step(Health(loop_lag=0.050), [limit])
    assert limit.limit == 40, "64 runs still hold slots: the last decrease has not taken effect yet"
    for _ in range(44):
        limit.release()
    controller.step(Health(loop_lag=0.050), [limit])
    assert limit.limit == 20, "at most halved per interval"
    for _ in range(20):  # the rest end
        limit.release()
    for _ in range(10):
        controller.step(Health(loop_lag=0.050), [limit])
    assert limit.limit == 4, "the floor"
    await _cancel(tasks)


async def test_one_interval_of_lag_neither_lowers_nor_raises_the_limit() -> None:
    controller, limit = _controller(), AdaptiveLimit("webhook", 4, 1000, limit=64)
    tasks = await _waiters(limit, 100)
    controller.step(HEALTHY, [limit])
    controller.step(HEALTHY, [limit])
    assert limit.limit == 100
    await _handed_out(limit)
    tasks += await _waiters(limit, 50)
    controller.step(Health(loop_lag=0.040), [limit])  # a batch of runs ending together, say
    assert limit.limit == 100
    controller.step(Health(loop_lag=0.040), [limit])  # it goes on: trouble
    assert limit.limit == 50
    await _cancel(tasks)


async def test_worker_lag_counts_like_main_loop_lag() -> None:
    controller, limit = _controller(), AdaptiveLimit("chat", 1, 100, limit=50)
    controller.step(Health(loop_lag=0.001, worker_lag=0.010), [limit])
    assert limit.limit == 25


async def test_after_a_decrease_growth_restarts_gently_then_speeds_up() -> None:
    controller, limit = _controller(), AdaptiveLimit("webhook", 16, 10_000, limit=400)
    tasks = await _waiters(limit, 5000)
    controller.step(Health(loop_lag=0.010), [limit])
    assert limit.limit == 200
    for _ in range(200):  # the runs holding slots above the lowered limit end
        limit.release()
    await _settle()
    seen = []
    for _ in range(6):
        controller.step(HEALTHY, [limit])
        await _settle()
        seen.append(limit.limit)
    steps = [b - a for a, b in pairwise([200, *seen])]
    assert steps[0] == 14, "sqrt(200)"
    assert all(b > a for a, b in pairwise(steps)), steps
    assert steps[-2] < seen[-3] and seen[-1] >= 2 * seen[-2] - 1, "a longer healthy run is back to doubling"
    await _cancel(tasks)


async def test_model_latency_rising_above_its_baseline_lowers_the_limit() -> None:
    controller, limit = _controller(), AdaptiveLimit("chat", 4, 256, limit=100)
    for _ in range(10):
        controller.step(Health(loop_lag=0.001, model_latency=1.0), [limit])
    assert limit.limit == 100
    controller.step(Health(loop_lag=0.001, model_latency=1.9), [limit])
    assert limit.limit == 100, "within the tolerance"
    controller.step(Health(loop_lag=0.001, model_latency=3.0), [limit])
    assert limit.limit < 100
    steady = GradientController(0.005, 2.0)
    other = AdaptiveLimit("chat", 4, 256, limit=100)
    for _ in range(20):
        steady.step(Health(loop_lag=0.001, model_latency=3.0), [other])
    assert other.limit == 100, "a model that is slow from the start is its own baseline"


async def test_limits_never_leave_floor_and_ceiling() -> None:
    rng = random.Random(7)
    controller, limit = _controller(), AdaptiveLimit("webhook", 3, 90)
    tasks: list[asyncio.Task[None]] = []
    for _ in range(300):
        tasks = [t for t in tasks if not t.done()] + await _waiters(limit, rng.randrange(0, 40))
        for _ in range(rng.randrange(0, limit.in_flight + 1)):  # runs end
            limit.release()
        if rng.random() < 0.2:
            await _cancel(tasks[: rng.randrange(0, len(tasks) + 1)])
        health = Health(loop_lag=rng.choice([None, 0.0005, 0.004, 0.006, 0.2]),
                        worker_lag=rng.choice([None, 0.001, 0.02]),
                        model_latency=rng.choice([None, 0.5, 1.0, 4.0]))
        controller.step(health, [limit])
        assert 3 <= limit.limit <= 90
    await _cancel(tasks)


# --- config and the gateway's limits ----------------------------------------------------------------------------

def _gateway(**gateway: Any) -> Any:
    return parse_config({"gateway": gateway}, {"HERMES_GATEWAY_HOME": "/tmp/hermes-admission"}).gateway


def test_default_limits_and_floors_lowered_to_small_ceilings() -> None:
    assert _gateway().run_limits() == {"chat": (16, 256), "webhook": (16, 1000), "cron": (2, 16)}
    small = _gateway(max_concurrent_runs=2, max_concurrent_webhook_runs=1)
    assert small.run_limits()["chat"] == (2, 2) and small.run_limits()["webhook"] == (1, 1)
    off = _gateway(admission={"enabled": False, "chat": {"floor": 4}})
    assert off.run_limits() == {"chat": (256, 256), "webhook": (1000, 1000), "cron": (16, 16)}


@pytest.mark.parametrize(("gateway", "path", "hint"), [
    ({"max_concurrent_runs": 8, "admission": {"chat": {"floor": 9}}}, "gateway.admission.chat.floor",
     "lower it to at most 8, or raise gateway.max_concurrent_runs"),
    ({"admission": {"webhook": {"floor": 2000}}}, "gateway.admission.webhook.floor",
     "raise gateway.max_concurrent_webhook_runs"),
    ({"admission": {"cron": {"floor": 5, "ceiling": 4}}}, "gateway.admission.cron.floor",
     "raise gateway.admission.cron.ceiling"),
])
def test_a_floor_above_its_ceiling_is_a_config_error(gateway: dict[str, Any], path: str, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        _gateway(**gateway)
    assert info.value.path == path and hint in info.value.hint


def test_each_kind_and_route_has_its_limit() -> None:
    cfg = parse_config({"gateway": {"max_concurrent_webhook_runs": 100}, "platforms": {"webhook": {"routes": {
        "small": {"secret": "s", "prompt": "p", "max_concurrency": 3},
        "big": {"secret": "s", "prompt": "p"}}}}}, {"HERMES_GATEWAY_HOME": "/tmp/hermes-admission"})
    admission = Admission(cfg.gateway, cfg.platforms.webhook.routes, Metrics())
    small, webhook = admission.slots_of("webhook", "small")
    assert (small.name, small.floor, small.ceiling, webhook is admission.webhook) == ("webhook:small", 3, 3, True)
    big, _ = admission.slots_of("webhook", "big")
    assert (big.floor, big.ceiling) == (16, 100)
    gone, _ = admission.slots_of("webhook", "removed")
    assert gone is admission.slots_of("webhook", "removed")[0] and gone.ceiling == 100
    assert admission.slots_of("cron", "job") == (admission.cron,)
    assert admission.slots_of("chat", "x") == admission.slots_of("api", "y") == (admission.chat,)
    assert admission.slots_of("background", "z") == (admission.chat,)


async def test_sample_reports_lag_sources_and_median_model_latency() -> None:
    cfg = parse_config({}, {"HERMES_GATEWAY_HOME": "/tmp/hermes-admission"})
    admission = Admission(cfg.gateway, {}, Metrics())
    admission.start(lambda: 0.002, lambda: 0.004)
    for seconds in (1.0, 5.0, 2.0):
        admission.observe_model(seconds)
    assert admission.sample() == Health(0.002, 0.004, 2.0)
    assert admission.sample().model_latency is None
    await admission.stop()


async def test_watchdog_reports_the_lag_p99_since_its_last_read() -> None:
    watchdog = LoopWatchdog(Metrics(), warn_after=10.0)
    assert watchdog.lag_p99() is None
    watchdog.start()
    try:
        await asyncio.sleep(0.06)  # a few quiet samples
        time.sleep(0.1)  # a stall: the sample due during it is late by most of it (fewer than 100 samples: the max)
        await asyncio.sleep(0.06)
        assert (watchdog.lag_p99() or 0) >= 0.05
        await asyncio.sleep(0.06)
        assert (watchdog.lag_p99() or 0) < 0.05, "a new window"
    finally:
        await watchdog.stop()


# --- through a gateway ------------------------------------------------------------------------------------------

@dataclass
class _Parked:
    """Model responder keeping every request open until ``release`` is set; counts requests in flight."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0
    peak: int = 0

    async def __call__(self, body: dict[str, Any]) -> str:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.wait_for(self.release.wait(), 20)
        finally:
            self.in_flight -= 1
        return f"re: {last_user_text(body)}"


async def _until(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.02)
    await asyncio.wait_for(poll(), timeout)


async def test_webhook_limit_grows_under_a_burst(make_gateway: GatewayFactory) -> None:
    model = _Parked()
    # A generous lag target: this test is about growth through the gateway, not about a busy test machine.
    h = await make_gateway({
        "gateway": {"admission": {"interval": 0.05, "lag_target_ms": 500, "webhook": {"floor": 2}}},
        "platforms": {"webhook": {"routes": {"github": {
            "secret": WEBHOOK_SECRET, "scheme": "github", "prompt": "{payload.label}", "deliver_to": "none"}}}}},
        responder=model)
    assert h.gateway.router is not None
    route, webhook = h.gateway.router.executor.admission.slots_of("webhook", "github")
    assert (route.limit, webhook.limit) == (2, 2)
    replies = await asyncio.gather(*(h.post_webhook({"label": f"hook-{i}"}) for i in range(24)))
    assert all(status == 202 for status, _ in replies)
    await _until(lambda: model.in_flight == 24)
    assert route.limit >= 24 and webhook.limit >= 24
    async with h.http.get(f"{h.base_url}/metrics") as r:
        text = await r.text()
    assert 'hermes_admission_in_flight{kind="webhook:github"} 24.0' in text
    limits = [line for line in text.splitlines() if line.startswith('hermes_admission_limit{kind="webhook"}')]
    assert len(limits) == 1 and float(limits[0].split()[-1]) >= 24
    model.release.set()
    for _, body in replies:
        assert (await h.wait_run(body["run_id"]))["status"] == "completed"
