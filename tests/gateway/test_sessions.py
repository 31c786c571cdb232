"""Per-session ordering, busy policies, /stop and concurrency limits, through the in-process gateway."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import pytest

from gateway.session import SessionLanes, session_key
from gateway.sim.model_server import last_user_text, rules, tool_call
from platforms.base import MessageEvent, SessionSource
from tests.conftest import WEBHOOK_SECRET, GatewayFactory, Harness
from tools.registry import ISOLATION_PROCESS, registry
from toolsets import TOOLSETS, create_custom_toolset

_LABEL = re.compile(r"\b([a-z]+)-\d+\b")


@dataclass
class _Probe:
    """Model responder answering ``re: <label>`` after a delay, recording overlap per label group.

    A label is ``<group>-<n>`` found in the last user message; ``hold`` keeps the requests of a
    label (or of a whole group) open until its event is set.
    """

    delay: float = 0.2
    delays: Mapping[str, float] = field(default_factory=dict)
    hold: dict[str, asyncio.Event] = field(default_factory=dict)
    in_flight: Counter[str] = field(default_factory=Counter)
    peak_by_group: Counter[str] = field(default_factory=Counter)
    peak: int = 0
    spans: list[tuple[str, float, float]] = field(default_factory=list)

    async def __call__(self, body: dict[str, Any]) -> str:
        match = _LABEL.search(last_user_text(body))
        assert match is not None, last_user_text(body)
        label, group = match.group(0), match.group(1)
        start = time.monotonic()
        self.in_flight[group] += 1
        self.peak_by_group[group] = max(self.peak_by_group[group], self.in_flight[group])
        self.peak = max(self.peak, sum(self.in_flight.values()))
        try:
            gate = self.hold.get(label) or self.hold.get(group)
            if gate is not None:
                await asyncio.wait_for(gate.wait(), 5)
            await asyncio.sleep(self.delays.get(group, self.delay))
        finally:
            self.in_flight[group] -= 1
            self.spans.append((label, start, time.monotonic()))
        return f"re: {label}"


async def _until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async def _poll() -> None:
        while not predicate():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(_poll(), timeout)


@pytest.mark.parametrize(("source", "per_user", "key"), [
    (SessionSource("telegram", "100", "dm", "1001"), True, "telegram:dm:100"),
    (SessionSource("telegram", "100", "dm", "1001", "7"), True, "telegram:dm:100:7"),
    (SessionSource("slack", "C1", "group", "U1"), True, "slack:group:C1:U1"),
    (SessionSource("slack", "C1", "channel", "U1", "t1"), True, "slack:group:C1:t1:U1"),
    (SessionSource("slack", "C1", "group", "U1", "t1"), False, "slack:group:C1:t1"),
])
def test_session_keys(source: SessionSource, per_user: bool, key: str) -> None:
    assert session_key(source, per_user) == key


async def test_lanes_cancel_an_item_once_and_go_on() -> None:
    lanes = SessionLanes()
    events: list[str] = []
    started = asyncio.Event()

    async def stoppable() -> None:
        started.set()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # recording the cancellation takes a while
            events.append("cancel recorded")
            raise

    async def after() -> None:
        events.append("next item ran")

    lanes.submit("k", stoppable)
    lanes.submit("k", after)
    await asyncio.wait_for(started.wait(), 1)
    assert lanes.is_busy("k") and lanes.queued("k") == 1
    assert lanes.cancel_current("k")
    await asyncio.sleep(0.01)
    assert lanes.cancel_current("k"), "still stopping"
    assert await lanes.wait_idle(1)
    assert events == ["cancel recorded", "next item ran"]
    assert not lanes.cancel_current("k") and not lanes.is_busy("k") and lanes.active == 0
    await lanes.shutdown()


async def test_one_chat_is_answered_in_order_one_run_at_a_time(make_gateway: GatewayFactory) -> None:
    probe = _Probe(delay=0.2)
    h = await make_gateway(responder=probe)
    accepted = [await h.chat.user_says(f"a-{i}") for i in range(4)]
    await h.chat.wait_for(lambda: len(h.chat.sent) == 4, timeout=5)
    assert h.chat.final_texts() == [f"re: a-{i}" for i in range(4)]
    assert [s.metadata["run_id"] for s in h.chat.sent] == [a.run_id for a in accepted]
    assert probe.peak_by_group["a"] == 1
    spans = sorted(probe.spans, key=lambda s: s[1])
    assert [label for label, _, _ in spans] == [f"a-{i}" for i in range(4)]
    assert all(prev[2] <= nxt[1] for prev, nxt in pairwise(spans))
    # each run starts after the previous one finished, so it sees the whole conversation so far
    last = [m["content"] for m in h.model.requests[-1]["messages"] if m["role"] != "system"]
    assert last == ["a-0", "re: a-0", "a-1", "re: a-1", "a-2", "re: a-2", "a-3"]


def _union(spans: list[tuple[str, float, float]]) -> float:
    """Seconds during which at least one of the spans was open."""
    total, reach = 0.0, float("-inf")
    for _, start, end in sorted(spans, key=lambda s: s[1]):
        total += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return total


async def test_two_chats_run_concurrently(make_gateway: GatewayFactory) -> None:
    probe = _Probe(delay=0.2)
    h = await make_gateway(responder=probe)
    for i in range(3):
        await h.chat.user_says(f"left-{i}", chat_id="100")
        await h.chat.user_says(f"right-{i}", chat_id="200", user_id="1002")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 6, timeout=10)
    assert h.chat.final_texts("100") == [f"re: left-{i}" for i in range(3)]
    assert h.chat.final_texts("200") == [f"re: right-{i}" for i in range(3)]
    assert probe.peak_by_group == {"left": 1, "right": 1}
    assert probe.peak == 2
    busy, model_time = _union(probe.spans), sum(end - start for _, start, end in probe.spans)
    assert busy < 0.7 * model_time, f"the model was busy {busy:.2f} s for {model_time:.2f} s of requests"


async def test_busy_queue_answers_queued_messages_after_the_run(make_gateway: GatewayFactory) -> None:
    probe = _Probe(delay=0.01, hold={"q-0": asyncio.Event()})
    h = await make_gateway(responder=probe)
    await h.chat.user_says("q-0")
    await h.model.wait_for_requests(1)
    await h.chat.user_says("q-1")
    await h.chat.user_says("q-2")
    await h.chat.user_says("/status")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 1)
    status = h.chat.sent[0].text
    assert "Running: yes" in status and "Queued: 2" in status
    assert len(h.model.requests) == 1, "queued messages wait for the running one"
    probe.hold["q-0"].set()
    await h.chat.wait_for(lambda: len(h.chat.sent) == 4)
    assert h.chat.final_texts()[1:] == ["re: q-0", "re: q-1", "re: q-2"]
    await h.chat.user_says("/status")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 5)
    assert "Running: no" in h.chat.sent[4].text and "Queued: 0" in h.chat.sent[4].text


async def test_busy_interrupt_cancels_the_running_run(make_gateway: GatewayFactory) -> None:
    probe = _Probe(delay=0.01, hold={"i-0": asyncio.Event()})
    h = await make_gateway({"gateway": {"busy": "interrupt"}}, responder=probe)
    first = await h.chat.user_says("i-0")
    await h.model.wait_for_requests(1)
    second = await h.chat.user_says("i-1")
    assert (await h.wait_run(first.run_id))["status"] == "cancelled"
    assert (await h.wait_run(second.run_id))["status"] == "completed"
    await h.chat.wait_for(lambda: len(h.chat.sent) == 1)
    assert h.chat.final_texts() == ["re: i-1"]
    assert await h.gateway.store.outbox_rows(first.run_id) == []
    # the cancelled exchange left nothing in the history
    assert [m["content"] for m in h.model.requests[-1]["messages"][1:]] == ["i-1"]
    probe.hold["i-0"].set()


async def test_busy_interrupt_burst_cancels_the_running_run_exactly_once(make_gateway: GatewayFactory) -> None:
    probe = _Probe(delay=0.01, hold={"b-0": asyncio.Event()})
    h = await make_gateway({"gateway": {"busy": "interrupt"}}, responder=probe)
    first = await h.chat.user_says("b-0")
    await h.model.wait_for_requests(1)
    later = [await h.chat.user_says(f"b-{i}") for i in range(1, 4)]
    # every interrupted run ends up recorded (even one interrupted before it started), and a second
    # interrupt never cancels the first run again while it is recording its cancellation
    assert (await h.wait_run(first.run_id))["status"] == "cancelled"
    for acc in later:
        assert (await h.wait_run(acc.run_id))["status"] in ("completed", "cancelled")
    assert await h.gateway.store.count_inbox("running") == 0
    assert await h.gateway.store.count_inbox("pending") == 0
    assert h.chat.final_texts()[-1] == "re: b-3"
    probe.hold["b-0"].set()


@dataclass
class _SlowTool:
    """A tool that blocks until its run's cancel event is set (or a timeout passes)."""

    name: str = field(default_factory=lambda: f"test_slow_{uuid.uuid4().hex[:8]}")
    toolset: str = field(default_factory=lambda: f"test-slow-{uuid.uuid4().hex[:8]}")
    started: threading.Event = field(default_factory=threading.Event)
    observed: list[bool] = field(default_factory=list)

    def handler(self, args: dict[str, Any], **ctx: Any) -> str:
        self.started.set()
        cancelled = ctx["cancel_event"].wait(5)
        self.observed.append(cancelled)
        return json.dumps({"cancelled": cancelled})


@pytest.fixture
def slow_tool() -> Iterator[_SlowTool]:
    """A registered slow tool in its own toolset, removed afterwards."""
    tool = _SlowTool()
    schema = {"name": tool.name, "description": "Wait a long time.",
              "parameters": {"type": "object", "properties": {}}}
    # In the gateway's process: the handler shares its events with the test.
    assert registry.register(tool.name, tool.toolset, schema, tool.handler, isolation=ISOLATION_PROCESS)
    create_custom_toolset(tool.toolset, "A slow tool for tests.", [tool.name])
    yield tool
    registry.deregister(tool.name)
    TOOLSETS.pop(tool.toolset, None)


async def test_stop_cancels_a_run_mid_tool(make_gateway: GatewayFactory, slow_tool: _SlowTool) -> None:
    h = await make_gateway({"toolsets": {"telegram": [slow_tool.toolset]}},
                           responder=rules((r"slow", tool_call(slow_tool.name, {}))))
    stopped = await h.chat.user_says("please do the slow thing")
    await _until(slow_tool.started.is_set)
    await h.chat.user_says("/stop")
    run = await h.wait_run(stopped.run_id)
    assert run["status"] == "cancelled"
    await _until(lambda: slow_tool.observed == [True])
    await h.chat.user_says("hello again")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 2)
    assert h.chat.final_texts() == ["Stopped the current run.", "Echo: hello again"]
    assert await h.gateway.store.outbox_rows(stopped.run_id) == []
    # the model never got the tool result of the cancelled run
    assert len(h.model.requests) == 2
    assert [m["content"] for m in h.model.requests[1]["messages"][1:]] == ["hello again"]
    await h.chat.user_says("/stop")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 3)
    assert h.chat.sent[2].text == "Nothing is running."


async def test_stop_cancels_a_run_waiting_for_a_slot(make_gateway: GatewayFactory) -> None:
    probe = _Probe(delay=0.01, hold={"busy-0": asyncio.Event()})
    h = await make_gateway({"gateway": {"max_concurrent_runs": 1}}, responder=probe)
    await h.chat.user_says("busy-0", chat_id="100")
    await h.model.wait_for_requests(1)
    waiting = await h.chat.user_says("wait-0", chat_id="200")
    await h.chat.user_says("/stop", chat_id="200")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 1)
    assert h.chat.sent[0].text == "Stopped the current run."
    probe.hold["busy-0"].set()
    await h.chat.wait_for(lambda: len(h.chat.sent) == 2)
    assert (await h.wait_run(waiting.run_id, timeout=2))["status"] == "cancelled"
    assert h.chat.final_texts() == ["Stopped the current run.", "re: busy-0"]
    assert len(h.model.requests) == 1
    async with h.http.get(f"{h.base_url}/metrics") as r:
        assert 'hermes_runs_total{kind="chat",status="cancelled"} 1.0' in await r.text()


async def test_stop_cancels_a_run_accepted_but_not_started_yet(make_gateway: GatewayFactory) -> None:
    # A run accepted (here: by another replica, or just before a restart) that no one has started yet:
    # /stop records it as cancelled, so it never reaches the model when a sweep later takes up the session.
    probe = _Probe(delay=0.01)
    h = await make_gateway(responder=probe)
    router = h.gateway.router
    assert router is not None and h.gateway.store is not None
    event = MessageEvent(platform="telegram", event_id="queued-1", chat_id="300", chat_type="dm", user_id="1001",
                         user_name="user1001", text="queued-0", message_id="m1")
    run, payload = router._new_run(event, uuid.uuid4().hex)
    key = session_key(SessionSource.from_event(event))
    await h.gateway.store.accept(event.dedupe_key, "telegram", "chat", key, payload, run)
    await h.chat.user_says("/stop", chat_id="300")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 1)
    assert h.chat.sent[0].text == "Stopped the current run."
    assert (await h.wait_run(run.id, timeout=2))["status"] == "cancelled"
    await router.sweep(time.time() + 1)  # what a replica's sweep would do with a waiting event
    await asyncio.sleep(0.2)
    assert h.model.requests == [] and len(h.chat.sent) == 1
    async with h.http.get(f"{h.base_url}/metrics") as r:
        assert 'hermes_runs_total{kind="chat",status="cancelled"} 1.0' in await r.text()
    await h.chat.user_says("/stop", chat_id="300")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 2)
    assert h.chat.sent[1].text == "Nothing is running."


async def test_max_concurrent_runs_bounds_chat_runs(make_gateway: GatewayFactory) -> None:
    probe = _Probe(delay=0.15)
    h = await make_gateway({"gateway": {"max_concurrent_runs": 2}}, responder=probe)
    for i in range(6):
        await h.chat.user_says(f"c-{i}", chat_id=f"chat{i}")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 6, timeout=5)
    assert probe.peak == 2
    assert sorted(h.chat.final_texts()) == [f"re: c-{i}" for i in range(6)]


def _webhook_routes(*names: str, max_concurrency: int = 4) -> dict[str, Any]:
    return {name: {"secret": WEBHOOK_SECRET, "scheme": "github", "prompt": "{payload.label}",
                   "deliver_to": "none", "max_concurrency": max_concurrency} for name in names}


async def _burst(h: Harness, route: str, group: str, n: int) -> list[str]:
    replies = await asyncio.gather(*(h.post_webhook({"label": f"{group}-{i}"}, route=route) for i in range(n)))
    assert all(status == 202 for status, _ in replies)
    return [body["run_id"] for _, body in replies]


@pytest.mark.parametrize(("gateway_cfg", "route_concurrency", "peak"), [
    ({"max_concurrent_webhook_runs": 2}, 4, 2),
    ({"max_concurrent_webhook_runs": 16}, 3, 3),
])
async def test_webhook_run_limits(make_gateway: GatewayFactory, gateway_cfg: dict[str, int],
                                  route_concurrency: int, peak: int) -> None:
    probe = _Probe(delay=0.15)
    h = await make_gateway({"gateway": gateway_cfg, "platforms": {"webhook": {
        "routes": _webhook_routes("github", max_concurrency=route_concurrency)}}}, responder=probe)
    run_ids = await _burst(h, "github", "hook", 7)
    for run_id in run_ids:
        assert (await h.wait_run(run_id))["status"] == "completed"
    assert probe.peak == peak


async def test_a_saturated_route_does_not_starve_other_routes(make_gateway: GatewayFactory) -> None:
    probe = _Probe(delay=0.2)
    routes = {**_webhook_routes("slow", max_concurrency=1), **_webhook_routes("fast")}
    h = await make_gateway({"gateway": {"max_concurrent_webhook_runs": 2},
                            "platforms": {"webhook": {"routes": routes}}}, responder=probe)
    slow = await _burst(h, "slow", "slow", 5)
    (fast,) = await _burst(h, "fast", "fast", 1)
    await h.wait_run(fast, timeout=5)
    done_slow = [(await h.get_run(run_id))["status"] for run_id in slow].count("completed")
    assert done_slow <= 2, f"the fast route waited for {done_slow} runs of the saturated route"
    for run_id in slow:
        await h.wait_run(run_id, timeout=5)


async def test_webhook_burst_does_not_delay_chat(make_gateway: GatewayFactory) -> None:
    probe = _Probe(delays={"hook": 0.1, "chat": 0.02}, hold={"hook": asyncio.Event()})
    h = await make_gateway({"platforms": {"webhook": {"routes": _webhook_routes("github", max_concurrency=16)}}},
                           responder=probe)
    run_ids = await _burst(h, "github", "hook", 30)
    await _until(lambda: probe.in_flight["hook"] == 16)
    sent_at = time.monotonic()
    await h.chat.user_says("chat-0")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 1, timeout=5)
    latency = time.monotonic() - sent_at
    assert latency < 1.5, f"chat reply took {latency:.2f} s behind a webhook burst"
    assert h.chat.final_texts() == ["re: chat-0"]
    assert await h.gateway.store.count_runs("queued") == 14, "the rest of the burst waits for a webhook slot"
    probe.hold["hook"].set()
    for run_id in run_ids:
        assert (await h.wait_run(run_id))["status"] == "completed"
