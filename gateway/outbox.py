"""The outbox sender: delivers persisted message parts through the adapters.

Parts reach the sender straight from the transaction that stored them (``submit``); a scan of the
store (at start, when woken, and every few seconds) is the backstop: parts written by the CLI or by
another gateway process, parts a dead sender left behind. Parts go out in order per *lane* (a chat;
for callback targets, one run's parts): a part waiting for a retry holds back its lane, lanes are
served concurrently. Each part is claimed in the store just before it is sent, and only the first
pending part of a lane can be claimed, by one sender at a time, so order holds across processes.
Transient failures are retried with exponential backoff, honouring the platform's ``retry_after``.
A part is marked sent right after the platform confirms it.

A claim left behind by a sender that died mid-send makes the part *in doubt*: the platform may
already have it. The adapter is told (``metadata["in_doubt"]``), so platforms that can look the part
up or that drop repeats (Slack, Discord nonces, callback ids) never show it twice.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping

from gateway.metrics import Metrics
from gateway.store import Claim, OutboxRow, Store
from platforms.base import BasePlatformAdapter, SendResult
from platforms.files import OutgoingFile

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 8
MAX_BACKOFF_SECONDS = 300.0
CLAIM_TTL_SECONDS = 120.0  # longer than any send may take (adapters time out well before)
SCAN_INTERVAL_SECONDS = 5.0
_SKIP_SECONDS = 2.0  # a part another sender holds is looked at again after this


def backoff_delay(attempts: int, retry_after: float | None) -> float:
    """Seconds to wait before the next attempt (``attempts`` already made)."""
    if retry_after is not None and retry_after > 0:
        return float(retry_after)
    return min(MAX_BACKOFF_SECONDS, 0.5 * 2 ** max(0, attempts - 1)) * random.uniform(0.8, 1.2)


class OutboxSender:
    """Sends outbox parts, one task per lane with work.

    ``owner`` names this process in claims. ``sole_sender``: no other gateway shares the database,
    so claims found at start belong to dead incarnations and are taken over at once; otherwise
    ``live_senders`` tells which owners are alive, and the claims of the others are taken over.
    ``platforms``: send only parts to these platforms (a front end's own gateway beside others on the
    store leaves every other part to them).
    """

    def __init__(self, store: Store, adapters: Mapping[str, BasePlatformAdapter], metrics: Metrics,
                 owner: str | None = None, *, sole_sender: bool = True,
                 live_senders: Callable[[], Awaitable[set[str] | None]] | None = None,
                 clock: Callable[[], float] = time.time, scan_interval: float = SCAN_INTERVAL_SECONDS,
                 platforms: frozenset[str] | None = None) -> None:
        self.store = store
        self.adapters = adapters
        self.metrics = metrics
        self.owner = owner or uuid.uuid4().hex[:16]
        self.sole_sender = sole_sender
        self.live_senders = live_senders
        self.clock = clock
        self.scan_interval = scan_interval
        self.platforms = platforms
        self._wake = asyncio.Event()
        self._lanes: dict[str, list[OutboxRow]] = {}  # lane -> its known pending parts, by id
        self._lane_tasks: dict[str, asyncio.Task[None]] = {}
        self._queued: set[int] = set()
        # Parts not to take from a scan before a time: done here (a scan that read the store before
        # the part was marked may still list it) or held by another sender. Pruned on every scan.
        self._skip: dict[int, float] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def claim(self) -> Claim:
        """This sender's claim, for the transaction that stores new parts (saves claiming them again)."""
        return Claim(self.owner, CLAIM_TTL_SECONDS)

    def submit(self, rows: Iterable[OutboxRow]) -> None:
        """Send these stored parts (each once, in id order within its lane)."""
        now = self.clock()
        for row in rows:
            if (row.id in self._queued or self._skip.get(row.id, 0.0) > now
                    or (self.platforms is not None and row.platform not in self.platforms)):
                continue
            self._queued.add(row.id)
            bisect.insort(self._lanes.setdefault(row.lane, []), row, key=lambda r: r.id)
            if self._task is not None:
                self._serve(row.lane)

    def _serve(self, name: str) -> None:
        if name not in self._lane_tasks:
            self._lane_tasks[name] = asyncio.create_task(self._drain(name, self._lanes[name]), name=f"outbox:{name}")

    def wake(self) -> None:
        """Scan the store now (parts were written that were not submitted)."""
        self._wake.set()

    def start(self) -> None:
        """Start sending (parts submitted before wait until now: the adapters are connected) and scanning."""
        self._task = asyncio.create_task(self._scan_loop(), name="outbox-scan")
        for name in list(self._lanes):
            self._serve(name)

    @property
    def busy(self) -> bool:
        """Whether parts are being sent or waiting for their next attempt here."""
        return bool(self._lanes)

    async def flush(self, timeout: float) -> bool:
        """Wait until nothing is pending (or ``timeout``); returns whether the outbox is empty."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if not self._lanes and await self.store.outbox_depth() == 0:
                return True
            self.wake()
            await asyncio.sleep(0.05)
        return await self.store.outbox_depth() == 0

    async def stop(self) -> None:
        """Stop sending (undelivered parts stay in the store for the next start)."""
        tasks = [t for t in (self._task, *self._lane_tasks.values()) if t]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _scan_loop(self) -> None:
        if self.sole_sender:
            abandoned = await self.store.abandon_claims(self.owner)
            if abandoned:
                logger.warning("%d outbox parts were being sent when the gateway stopped; sending them again "
                               "(marked in doubt)", abandoned)
        while True:
            self._wake.clear()
            try:
                await self._scan()
            except Exception:
                logger.exception("outbox scan failed")
            # not asyncio.wait_for: on 3.11 it swallows a cancel that coincides with a wake
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.scan_interval):
                    await self._wake.wait()

    async def _scan(self) -> None:
        live = await self.live_senders() if not self.sole_sender and self.live_senders is not None else None
        if live and (expired := await self.store.expire_claims(live)):
            logger.warning("took over %d outbox parts a dead replica was sending (marked in doubt)", expired)
        rows = await self.store.pending_outbox()
        self.metrics.outbox_depth.set(len(rows))
        pending = {row.id for row in rows}
        self._skip = {i: t for i, t in self._skip.items() if i in pending}
        self.submit(rows)

    async def _drain(self, name: str, lane: list[OutboxRow]) -> None:
        try:
            while lane:
                row = lane[0]
                wait = row.next_attempt_at - self.clock()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue  # an earlier part may have arrived meanwhile
                held = row.claimed_by == self.owner and (row.claim_until or 0.0) > self.clock() + 1.0
                claimed = row if held else await self.store.claim_outbox(row.id, self.owner, CLAIM_TTL_SECONDS)
                if claimed is None:
                    # Sent already, held by another sender, or an earlier part of the lane is unknown here:
                    # forget the lane's parts (a scan brings back what is still pending, in order).
                    until = self.clock() + _SKIP_SECONDS
                    for dropped in list(lane):
                        self._done(lane, dropped, until)
                    self.wake()
                    break
                if await self._send_one(claimed):
                    self._done(lane, row, float("inf"))
                else:  # a retry: the store released the claim
                    row.attempts, row.next_attempt_at = claimed.attempts + 1, claimed.next_attempt_at
                    row.claimed_by = row.claim_until = None
        finally:
            for row in lane:
                self._queued.discard(row.id)
            if self._lanes.get(name) is lane:
                del self._lanes[name]
                self._lane_tasks.pop(name, None)

    def _done(self, lane: list[OutboxRow], row: OutboxRow, skip_until: float) -> None:
        lane.remove(row)
        self._queued.discard(row.id)
        self._skip[row.id] = skip_until

    async def _send_one(self, row: OutboxRow) -> bool:
        """Deliver one claimed part; returns whether it is finished (sent or failed for good).

        A retry is recorded in ``row.next_attempt_at``.
        """
        adapter = self.adapters.get(row.platform)
        attempts = row.attempts + 1
        if adapter is None:
            await self.store.mark_failed(row.id, f"no adapter for platform {row.platform!r}")
            self.metrics.deliveries.labels(row.platform, "failed").inc()
            logger.error("outbox %s: no adapter for platform %s; dropped", row.id, row.platform)
            return True
        metadata = {"delivery_id": row.dedupe_key, "run_id": row.run_id or "", "part_index": str(row.part_index),
                    "parts_total": str(row.parts_total)}
        if row.thread_id:
            metadata["thread_id"] = row.thread_id
        if row.in_doubt:
            metadata["in_doubt"] = "1"
            logger.warning("outbox %s to %s:%s: a previous sender died while sending it; the platform may "
                           "already have it", row.id, row.platform, row.chat_id)
        try:
            result = await self._attempt(adapter, row, metadata)
        except Exception as exc:  # an adapter bug must not kill the sender
            logger.exception("outbox %s: %s send raised", row.id, row.platform)
            result = SendResult(success=False, error=f"{type(exc).__name__}: {exc}", retryable=True)
        if result.success:
            await self.store.mark_sent(row.id, result.message_id)
            self.metrics.deliveries.labels(row.platform, "sent").inc()
            return True
        if result.retryable and attempts < MAX_ATTEMPTS:
            delay = backoff_delay(attempts, result.retry_after)
            row.next_attempt_at = self.clock() + delay
            await self.store.mark_retry(row.id, row.next_attempt_at, result.error or "retryable failure")
            self.metrics.deliveries.labels(row.platform, "retry").inc()
            logger.warning("outbox %s to %s:%s failed (%s); retry in %.1fs", row.id, row.platform, row.chat_id,
                           result.error, delay)
            return False
        await self.store.mark_failed(row.id, result.error or "failed")
        self.metrics.deliveries.labels(row.platform, "failed").inc()
        logger.error("outbox %s to %s:%s failed permanently: %s", row.id, row.platform, row.chat_id, result.error)
        return True

    async def _attempt(self, adapter: BasePlatformAdapter, row: OutboxRow, metadata: dict[str, str]) -> SendResult:
        if row.edit_message_id:
            result = await adapter.edit_message(row.chat_id, row.edit_message_id, row.text, metadata)
            if result.success or result.retryable:
                return result
            logger.info("outbox %s: edit of %s failed (%s); sending a new message", row.id, row.edit_message_id,
                        result.error)
        if row.file is not None:
            data = await self.store.outbox_file(row.file.sha256)
            if data is None:
                return SendResult(success=False, error=f"the bytes of {row.file.name} are gone from the store")
            file = OutgoingFile(row.file.kind, row.file.name, row.file.mime_type, data)  # type: ignore[arg-type]
            return await adapter.send_file(row.chat_id, file, row.text, reply_to=row.reply_to, metadata=metadata)
        if row.choices:
            return await adapter.send_choices(row.chat_id, row.text, row.choices, reply_to=row.reply_to,
                                              metadata=metadata)
        return await adapter.send(row.chat_id, row.text, reply_to=row.reply_to, metadata=metadata)
