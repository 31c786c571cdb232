"""Outbox rules that ``make mutate`` found unpinned: each test names the mutants of ``gateway/outbox.py`` it kills.
The sender runs against a real SQLite store and a recording platform double."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from gateway.metrics import Metrics
from gateway.outbox import _SKIP_SECONDS, OutboxSender
from gateway.store import Claim, FilePart, OutboxPart, OutboxRow, Store
from platforms.base import AdapterState, BasePlatformAdapter, Choice, OnMessage, SendResult
from platforms.files import OutgoingFile


@dataclass
class _Recorded:
    kind: str
    chat_id: str
    text: str
    reply_to: str | None
    metadata: dict[str, str]
    message_id: str | None = None
    choices: tuple[Choice, ...] = ()
    file: OutgoingFile | None = None


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

    async def send_choices(self, chat_id: str, content: str, choices: Sequence[Choice], reply_to: str | None = None,
                           metadata: Mapping[str, str] | None = None) -> SendResult:
        self.calls.append(_Recorded("choices", chat_id, content, reply_to, dict(metadata or {}),
                                    choices=tuple(choices)))
        return self._next()

    async def send_file(self, chat_id: str, file: OutgoingFile, caption: str = "", reply_to: str | None = None,
                        metadata: Mapping[str, str] | None = None) -> SendResult:
        self.calls.append(_Recorded("file", chat_id, caption, reply_to, dict(metadata or {}), file=file))
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


# -- found by the run of 2026-12-04 (each test drives the sender step by step or on a clock that stands still) --

class _Clock:
    """Wall-clock seconds that move only when the test moves them."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def _until(condition: Callable[[], bool | Awaitable[bool]], what: str) -> None:
    """Wait (at most 5 s) for ``condition``: the sender's tasks run meanwhile."""
    for _ in range(500):
        done = condition()
        if done if isinstance(done, bool) else await done:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class _Scans:
    """The sender's scans read what the test hands them, one read per ``feed``; ``feed`` returns once the scan
    has submitted what it read (submit runs in the same step as the read's return)."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads: asyncio.Queue[list[OutboxRow]] = asyncio.Queue()
        self.done: asyncio.Queue[None] = asyncio.Queue()
        monkeypatch.setattr(store, "pending_outbox", self._read)

    async def _read(self, limit: int = 500) -> list[OutboxRow]:
        rows = await self.reads.get()
        self.done.put_nowait(None)
        return rows

    async def feed(self, rows: list[OutboxRow]) -> None:
        await self.reads.put(rows)
        await asyncio.wait_for(self.done.get(), 5)


async def test_a_sender_for_some_platforms_takes_only_their_parts(store: Store) -> None:
    """A gateway's local sender (``platforms``: the adapters it runs) leaves other platforms' parts to the
    gateway that has their adapter, instead of failing them for want of one.

    Kills __init__'s ``self.platforms = None`` and submit's ``row.platform in self.platforms``."""
    rows = await store.enqueue([OutboxPart("a:0", "slack", "C1", "not mine"), OutboxPart("b:0", "telegram", "1",
                                                                                         "mine")])
    assert rows is not None
    sender = OutboxSender(store, {"telegram": _Platform()}, Metrics(), platforms=frozenset({"telegram"}))
    sender.submit(rows[:1])
    assert not sender.busy
    sender.submit(rows[1:])
    assert sender.busy


async def test_a_part_with_choices_goes_out_through_send_choices(store: Store) -> None:
    """Kills every mutant of _attempt's ``send_choices(row.chat_id, row.text, row.choices, reply_to=row.reply_to,
    metadata=metadata)`` (an argument replaced by None or left out: the buttons, the reply or the delivery
    metadata an adapter dedupes by would be lost)."""
    platform = _Platform()
    choices = (Choice("Yes", "/approve"), Choice("No", "/deny", style="danger"))
    await _deliver(store, platform, [OutboxPart("run-2:0", "telegram", "42", "Run it?", thread_id="t-1",
                                                reply_to="m-5", run_id="run-2", choices=choices)])
    assert platform.calls == [_Recorded("choices", "42", "Run it?", "m-5", {
        "delivery_id": "run-2:0", "run_id": "run-2", "part_index": "0", "parts_total": "1", "thread_id": "t-1"},
        choices=choices)]


async def test_a_part_due_exactly_now_is_sent_now(store: Store) -> None:
    """Kills _drain's ``if wait >= 0:`` (a part due at this very instant waits zero seconds over and over: on a
    clock that stands still it is never sent)."""
    platform = _Platform()
    rows = await store.enqueue([OutboxPart("now:0", "telegram", "1", "on time")])
    assert rows is not None
    (row,) = rows
    sender = OutboxSender(store, {"telegram": platform}, Metrics(), clock=lambda: row.next_attempt_at)
    sender.submit(rows)
    sender.start()
    try:
        await _until(lambda: bool(platform.calls), "the send")
    finally:
        await sender.stop()


async def test_a_claim_about_to_lapse_is_renewed_before_sending(store: Store) -> None:
    """The sender trusts its own claim on a part only while more than a second of it is left; otherwise it
    claims the part again, which fails here: another sender took it over meanwhile.

    Kills _drain's ``(row.claim_until or 0.0) >= self.clock() + 1.0`` (a second left exactly) and ``>
    self.clock() - 1.0`` (a claim that lapsed up to a second ago trusted): each a double send."""
    platform = _Platform()
    rows = await store.enqueue([OutboxPart("a:0", "telegram", "1", "edge"), OutboxPart("b:0", "telegram", "2",
                                                                                       "lapsed")],
                               claim=Claim("other-replica", 600))
    assert rows is not None
    clock = _Clock()
    mine = [dataclasses.replace(rows[0], claimed_by="me", claim_until=clock.now + 1.0),
            dataclasses.replace(rows[1], claimed_by="me", claim_until=clock.now + 0.5)]
    sender = OutboxSender(store, {"telegram": platform}, Metrics(), owner="me", sole_sender=False, clock=clock,
                          scan_interval=3600)
    sender.submit(mine)
    sender.start()
    try:
        await _until(lambda: not sender.busy, "both lanes to give the parts up")
    finally:
        await sender.stop()
    assert platform.calls == []
    assert {r.claimed_by for r in await store.outbox_rows()} == {"other-replica"}


async def test_a_part_another_sender_holds_is_passed_over_until_its_skip_time(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lane whose part another live sender holds gives its parts up, wakes a scan, and the scans pass them
    over until ``_SKIP_SECONDS`` later (not before: each would claim in vain; not after: the holder may be gone).

    Kills _drain's ``until = self.clock() - _SKIP_SECONDS``, ``list(None)``, ``self._done(None, ...)``,
    ``self._done(lane, None, ...)``, the ``_done`` calls with an argument left out (each: the scan right after
    takes the part again), and submit's ``self._skip.get(row.id, 0.0) >= now`` (not taken at its skip time)."""
    rows = await store.enqueue([OutboxPart("a:0", "telegram", "1", "held elsewhere")],
                               claim=Claim("other-replica", 600))
    assert rows is not None
    clock = _Clock()
    scans = _Scans(store, monkeypatch)
    claim, claims, gate = store.claim_outbox, [], asyncio.Event()

    async def gated_claim(outbox_id: int, owner: str, ttl: float) -> OutboxRow | None:
        claims.append(outbox_id)
        if len(claims) > 1:
            await gate.wait()  # a lane that took the part again stays busy until the test is done
        return await claim(outbox_id, owner, ttl)

    monkeypatch.setattr(store, "claim_outbox", gated_claim)
    sender = OutboxSender(store, {"telegram": _Platform()}, Metrics(), owner="me", sole_sender=False, clock=clock,
                          scan_interval=3600)
    sender.submit(rows)
    sender.start()  # its first scan waits for a read
    try:
        await _until(lambda: not sender.busy, "the lane to give the part up")
        await scans.feed(rows)
        assert not sender.busy and len(claims) == 1, "a scan right after took the part again"
        clock.now += _SKIP_SECONDS
        await scans.feed(rows)  # the scan the lane woke
        assert sender.busy, "the part was not taken again at its skip time"
    finally:
        gate.set()
        await sender.stop()


async def test_a_stale_scan_of_a_sent_part_submits_the_rest_of_what_it_read(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scan read before a part was marked sent lists it with the parts written since: the sent part is passed
    over and the new one sent.

    Kills _drain's ``self._done(lane, row, None)`` (the scan fails on the sent part's skip time and submits
    nothing after it) and ``self._done(lane, row, self.clock())`` (the sent part goes out again)."""
    platform = _Platform()
    first = await store.enqueue([OutboxPart("a:0", "telegram", "1", "first")], claim=Claim("me", 600))
    assert first is not None
    stale = await store.pending_outbox()
    scans = _Scans(store, monkeypatch)
    clock = _Clock()
    sender = OutboxSender(store, {"telegram": platform}, Metrics(), owner="me", clock=clock, scan_interval=3600)
    sender.submit(first)
    sender.start()
    try:
        await _until(lambda: bool(platform.calls) and not sender.busy, "the first part to be sent")
        later = await store.enqueue([OutboxPart("b:0", "telegram", "2", "second")])
        assert later is not None
        clock.now = later[0].next_attempt_at
        await scans.feed([*stale, *later])
        await _until(lambda: len(platform.calls) >= 2 and not sender.busy, "the second part to be sent")
    finally:
        await sender.stop()
    assert [c.text for c in platform.calls] == ["first", "second"]


async def test_a_store_error_in_a_lane_leaves_its_parts_to_the_next_scan(store: Store,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A lane that ends on an error (here the store failing a claim) forgets its parts, so the next scan takes
    them again.

    Kills _drain's ``self._queued.discard(None)`` (the parts stay marked as queued here: never sent until a
    restart)."""
    platform = _Platform()
    rows = await store.enqueue([OutboxPart("a:0", "telegram", "1", "after a hiccup")])
    assert rows is not None
    claim = store.claim_outbox
    failures = [OSError("database is locked")]

    async def claim_once_failing(outbox_id: int, owner: str, ttl: float) -> OutboxRow | None:
        if failures:
            raise failures.pop()
        return await claim(outbox_id, owner, ttl)

    monkeypatch.setattr(store, "claim_outbox", claim_once_failing)
    sender = OutboxSender(store, {"telegram": platform}, Metrics(), scan_interval=3600)
    sender.submit(rows)
    sender.start()
    try:
        await _until(lambda: not failures and not sender.busy, "the lane to end on the error")
        sender.wake()
        await _until(lambda: bool(platform.calls), "the part to be sent by the next scan")
    finally:
        await sender.stop()


@pytest.mark.parametrize("first", [OutboxPart("a:0", "nowhere", "1", "no adapter", lane="shared"),
                                   OutboxPart("a:0", "telegram", "1", "refused", lane="shared")])
async def test_a_part_failed_for_good_lets_the_next_of_its_lane_go_at_once(store: Store, first: OutboxPart) -> None:
    """Kills _send_one's ``return True`` -> ``return False`` after ``mark_failed`` for a part no adapter can send
    and for one the platform refuses for good (the lane tries to claim the failed part again, gives up its
    parts and the next one waits for a skip time that, on a clock that stands still, never comes)."""
    platform = _Platform(outcomes=[SendResult(success=False, error="chat not found")] * (first.platform == "telegram"))
    await store.enqueue([first, OutboxPart("b:0", "telegram", "1", "next", lane="shared")])
    sender = OutboxSender(store, {"telegram": platform}, Metrics(), clock=_Clock(), scan_interval=3600)
    sender.start()
    async def settled() -> bool:
        return {r.dedupe_key: r.status for r in await store.outbox_rows()} == {"a:0": "failed", "b:0": "sent"}

    try:
        await _until(settled, "the first part failed and the next one sent")
    finally:
        await sender.stop()


async def test_a_failed_attempt_records_the_adapters_error(store: Store) -> None:
    """Kills _send_one's ``SendResult(success=False, error=None, ...)``, the error left out, ``type(None)``
    (an adapter's exception recorded as something else) and ``result.error and "retryable failure"`` (the
    platform's reason replaced by a generic one)."""
    platform = _Platform(outcomes=[RuntimeError("boom"), SendResult(success=False, error="429 flood",
                                                                    retryable=True, retry_after=0.01)])
    await store.enqueue([OutboxPart("a:0", "telegram", "1", "x")])
    sender = OutboxSender(store, {"telegram": platform}, Metrics(), scan_interval=3600)
    errors: list[str | None] = []

    async def recorded() -> bool:
        (row,) = await store.outbox_rows()
        if row.attempts > len(errors):
            errors.append(row.last_error)
        return len(errors) == 2

    sender.start()
    try:
        await _until(recorded, "two failed attempts")
    finally:
        await sender.stop()
    assert errors == ["RuntimeError: boom", "429 flood"]


async def test_a_failure_the_adapter_gives_no_reason_for_is_recorded_as_retryable_or_final(store: Store) -> None:
    """The outbox's last error (shown on the dashboard's run page) says whether a reasonless failure will be tried
    again. Kills _send_one's ``"retryable failure"`` and ``"failed"`` texts mutated (``"XX..XX"``, upper case)."""
    platform = _Platform(outcomes=[SendResult(success=False, retryable=True, retry_after=0.01),
                                   SendResult(success=False, retryable=False)])
    await store.enqueue([OutboxPart("a:0", "telegram", "1", "x")])
    sender = OutboxSender(store, {"telegram": platform}, Metrics(), scan_interval=3600)
    errors: list[str | None] = []

    async def recorded() -> bool:
        (row,) = await store.outbox_rows()
        if row.attempts > len(errors) or (row.status == "failed" and len(errors) < 2):
            errors.append(row.last_error)
        return len(errors) == 2

    sender.start()
    try:
        await _until(recorded, "a retry, then a final failure")
    finally:
        await sender.stop()
    assert errors == ["retryable failure", "failed"]


async def test_a_file_part_goes_out_through_send_file_with_its_bytes_and_caption(store: Store) -> None:
    """Kills _attempt's file mutants: ``row.file is None`` (sent as text), ``outbox_file(None)`` / its bytes
    ``None``, the OutgoingFile's fields (``None`` or swapped) and send_file's arguments (the chat, the caption,
    ``reply_to`` or the delivery metadata ``None`` or left out)."""
    data = b"%PDF-1.4 report"
    report = FilePart("document", "report.pdf", "application/pdf", len(data), hashlib.sha256(data).hexdigest(), data)
    platform = _Platform()
    await _deliver(store, platform, [OutboxPart("f:0", "telegram", "100", "the report", reply_to="41",
                                                run_id="r1", file=report)])
    (call,) = platform.calls
    assert (call.kind, call.chat_id, call.text, call.reply_to) == ("file", "100", "the report", "41")
    assert call.file == OutgoingFile("document", "report.pdf", "application/pdf", data)
    assert call.metadata["delivery_id"] == "f:0" and call.metadata["run_id"] == "r1"


async def test_a_file_part_whose_bytes_are_gone_fails_saying_which(store: Store) -> None:
    """Its bytes pruned from the store, a file part fails for good (no send), the reason naming the file.

    Kills _attempt's ``data is not None`` and the error's ``success=True`` / wording / ``None`` mutants."""
    gone = FilePart("photo", "chart.png", "image/png", 10, "0" * 64)  # no bytes stored under this sha256
    platform = _Platform()
    await _deliver(store, platform, [OutboxPart("g:0", "telegram", "100", "", file=gone)])
    assert platform.calls == []
    (row,) = await store.outbox_rows()
    assert (row.status, row.last_error) == ("failed", "the bytes of chart.png are gone from the store")
