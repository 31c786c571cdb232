"""Outbox rules that ``make mutate`` found unpinned: each test names the mutants of ``gateway/outbox.py`` it kills.
The sender runs against a real SQLite store and a recording platform double."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.metrics import Metrics
from gateway.outbox import OutboxSender
from gateway.store import OutboxPart, Store
from platforms.base import AdapterState, BasePlatformAdapter, OnMessage, SendResult


@dataclass
class _Recorded:
    kind: str
    chat_id: str
    text: str
    reply_to: str | None
    metadata: dict[str, str]
    message_id: str | None = None


@dataclass
class _Platform(BasePlatformAdapter):
    """Records every send and edit; ``outcomes`` are returned in turn (then success)."""

    outcomes: list[SendResult | Exception] = field(default_factory=list)
    calls: list[_Recorded] = field(default_factory=list)
    name = "telegram"
    max_message_length = 4096
    can_edit = True

    def __post_init__(self) -> None:
        super().__init__()

    async def connect(self, on_message: OnMessage, *, receive: bool = True) -> None:
        self._set_state(AdapterState.CONNECTED)

    async def disconnect(self) -> None:
        self._set_state(AdapterState.DISCONNECTED)

    async def send(self, chat_id: str, content: str, reply_to: str | None = None,
                   metadata: Mapping[str, str] | None = None) -> SendResult:
        self.calls.append(_Recorded("send", chat_id, content, reply_to, dict(metadata or {})))
        return self._next()

    async def edit_message(self, chat_id: str, message_id: str, content: str,
                           metadata: Mapping[str, str] | None = None) -> SendResult:
        self.calls.append(_Recorded("edit", chat_id, content, None, dict(metadata or {}), message_id))
        return self._next()

    def _next(self) -> SendResult:
        outcome = self.outcomes.pop(0) if self.outcomes else SendResult(success=True, message_id="m-1")
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


async def _deliver(store: Store, platform: _Platform, parts: list[OutboxPart],
                   metrics: Metrics | None = None) -> Metrics:
    metrics = metrics or Metrics()
    await store.enqueue(parts)
    sender = OutboxSender(store, {"telegram": platform}, metrics)
    sender.start()
    try:
        assert await sender.flush(5)
    finally:
        await sender.stop()
    return metrics


def _count(metrics: Metrics, platform: str, outcome: str) -> float:
    return metrics.registry.get_sample_value("hermes_deliveries_total", {"platform": platform,
                                                                          "outcome": outcome}) or 0.0


async def test_a_part_goes_out_with_its_text_reply_and_delivery_metadata(store: Store) -> None:
    """Kills _attempt's ``send(row.chat_id, None, ...)``, ``reply_to=None`` and ``reply_to`` left out, and
    _send_one's ``run_id or "XXXX"`` (the metadata an adapter dedupes and threads by)."""
    platform = _Platform()
    part = OutboxPart("run-1:0", "telegram", "42", "hello there", thread_id="t-9", reply_to="m-7",
                      part_index=0, parts_total=1, run_id="run-1")
    command = OutboxPart("cmd:1", "telegram", "43", "help text")
    await _deliver(store, platform, [part, command])
    calls = {c.chat_id: c for c in platform.calls}
    sent = calls["42"]
    assert (sent.kind, sent.text, sent.reply_to) == ("send", "hello there", "m-7")
    assert sent.metadata == {"delivery_id": "run-1:0", "run_id": "run-1", "part_index": "0", "parts_total": "1",
                             "thread_id": "t-9"}
    assert calls["43"].metadata["run_id"] == ""


async def test_an_edit_carries_the_chat_and_the_new_text(store: Store) -> None:
    """Kills _attempt's ``edit_message(None, ...)`` and ``edit_message(..., None, ...)``."""
    platform = _Platform()
    await _deliver(store, platform, [OutboxPart("run-1:0", "telegram", "42", "final answer",
                                                edit_message_id="preview-3", run_id="run-1")])
    (edit,) = platform.calls
    assert (edit.kind, edit.chat_id, edit.message_id, edit.text) == ("edit", "42", "preview-3", "final answer")


async def test_deliveries_are_counted_by_platform_and_outcome(store: Store) -> None:
    """Kills the ``deliveries.labels(...)`` mutants of _send_one (platform or outcome replaced, left out or
    misspelt) for sent, retry and failed parts, and for a part no adapter can send."""
    platform = _Platform(outcomes=[SendResult(success=False, error="429", retryable=True, retry_after=0.01),
                                   SendResult(success=True, message_id="m-2"),
                                   SendResult(success=False, error="chat not found")])
    metrics = await _deliver(store, platform, [OutboxPart("a:0", "telegram", "1", "first"),
                                               OutboxPart("b:0", "telegram", "1", "second"),
                                               OutboxPart("c:0", "nowhere", "1", "lost")])
    assert (_count(metrics, "telegram", "retry"), _count(metrics, "telegram", "sent"),
            _count(metrics, "telegram", "failed"), _count(metrics, "nowhere", "failed")) == (1, 1, 1, 1)


async def test_a_part_another_live_sender_holds_is_not_sent_here(store: Store) -> None:
    """Kills _drain's ``held = row.claimed_by == self.owner or ...`` and ``held = row.claimed_by != self.owner
    and ...`` (a part claimed by another, live replica sent here too: a double send)."""
    platform = _Platform()
    (row,) = await store.enqueue([OutboxPart("a:0", "telegram", "1", "only once")]) or []
    claimed = await store.claim_outbox(row.id, "other-replica", 600)
    assert claimed is not None
    sender = OutboxSender(store, {"telegram": platform}, Metrics(), owner="me", sole_sender=False)
    sender.submit([claimed])  # as a scan that read the row with the other replica's claim would
    sender.start()
    try:
        await asyncio.sleep(0.3)
    finally:
        await sender.stop()
    assert platform.calls == []
    (after,) = await store.outbox_rows()
    assert (after.status, after.claimed_by) == ("pending", "other-replica")


async def test_a_part_passed_over_is_sent_once_its_holder_is_gone(store: Store) -> None:
    """Kills _drain's ``until = None`` (the skipped part's time is compared on the next scan, which then fails
    for good) and ``list(None)``."""
    platform = _Platform()
    (row,) = await store.enqueue([OutboxPart("a:0", "telegram", "1", "eventually")]) or []
    claimed = await store.claim_outbox(row.id, "dead-replica", 600)
    assert claimed is not None
    live: set[str] = {"me", "dead-replica"}

    async def live_senders() -> set[str]:
        return set(live)

    sender = OutboxSender(store, {"telegram": platform}, Metrics(), owner="me", sole_sender=False,
                          live_senders=live_senders, scan_interval=0.05)
    sender.submit([claimed])
    sender.start()
    try:
        await asyncio.sleep(0.2)
        assert platform.calls == []
        live.discard("dead-replica")  # its claims expire on the next scan
        assert await sender.flush(5)
    finally:
        await sender.stop()
    assert [c.text for c in platform.calls] == ["eventually"]


async def test_parts_written_elsewhere_are_found_by_the_periodic_scan(store: Store) -> None:
    """Kills __init__'s ``scan_interval = None`` and _scan_loop's ``asyncio.timeout(None)`` /
    ``suppress(None)`` (parts another process wrote, without waking this one, would wait for ever)."""
    platform = _Platform()
    sender = OutboxSender(store, {"telegram": platform}, Metrics(), scan_interval=0.05)
    sender.start()
    try:
        await asyncio.sleep(0.1)  # the start-up scan found nothing
        await store.enqueue([OutboxPart("cli:1", "telegram", "1", "from the CLI")])  # no submit, no wake
        for _ in range(100):
            if platform.calls:
                break
            await asyncio.sleep(0.02)
    finally:
        await sender.stop()
    assert [c.text for c in platform.calls] == ["from the CLI"]


async def test_parts_submitted_before_start_wait_for_it(store: Store) -> None:
    """Kills __init__'s ``self._task = ""`` (parts would go out before the adapters are connected)."""
    platform = _Platform()
    rows = await store.enqueue([OutboxPart("early:1", "telegram", "1", "hello")])
    sender = OutboxSender(store, {"telegram": platform}, Metrics())
    sender.submit(rows or [])
    await asyncio.sleep(0.1)
    assert platform.calls == []
    sender.start()
    try:
        assert await sender.flush(5)
    finally:
        await sender.stop()
    assert [c.text for c in platform.calls] == ["hello"]


async def test_flush_says_when_parts_are_left(store: Store) -> None:
    """Kills flush's ``outbox_depth() != 0`` and ``== 1`` (a timed-out flush reporting an empty outbox)."""
    platform = _Platform(outcomes=[SendResult(success=False, error="429", retryable=True, retry_after=60)])
    await store.enqueue([OutboxPart("stuck:1", "telegram", "1", "later")])
    sender = OutboxSender(store, {"telegram": platform}, Metrics())
    sender.start()
    try:
        assert await sender.flush(0.3) is False
    finally:
        await sender.stop()


async def test_a_part_already_queued_does_not_hold_back_the_rest(store: Store) -> None:
    """Kills submit's ``continue`` -> ``break`` (the parts after one already queued here would wait for the next
    scan)."""
    rows = await store.enqueue([OutboxPart("q:1", "telegram", "1", "one"), OutboxPart("q:2", "telegram", "2", "two")])
    assert rows is not None
    sender = OutboxSender(store, {"telegram": _Platform()}, Metrics())
    sender.submit(rows[:1])
    sender.submit(rows)
    assert sender._queued == {rows[0].id, rows[1].id}


async def test_stop_returns_once_sends_in_flight_have_ended(store: Store) -> None:
    """Kills stop's ``gather(return_exceptions=True)`` without the tasks (stop would return while a send is
    still running, after the gateway closed its adapters)."""
    entered, ended = asyncio.Event(), []

    class Slow(_Platform):
        async def send(self, chat_id: str, content: str, reply_to: str | None = None,
                       metadata: Mapping[str, str] | None = None) -> SendResult:
            entered.set()
            try:
                await asyncio.Event().wait()
            finally:
                await asyncio.sleep(0)
                ended.append(chat_id)
            raise AssertionError("unreachable")

    await store.enqueue([OutboxPart("slow:1", "telegram", "1", "text")])
    sender = OutboxSender(store, {"telegram": Slow()}, Metrics())
    sender.start()
    await asyncio.wait_for(entered.wait(), 5)
    await sender.stop()
    assert ended == ["1"]
