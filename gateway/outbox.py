"""The outbox sender: delivers persisted message parts through the adapters.

Parts of one chat go out strictly in order (a part waiting for a retry holds back
the chat's later parts); chats are served concurrently. Transient failures are
retried with exponential backoff, honouring the platform's ``retry_after``. A part
is marked sent in the store right after the platform confirms it, so a restart
never sends it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping

from gateway.metrics import Metrics
from gateway.store import OutboxRow, Store
from platforms.base import BasePlatformAdapter, SendResult

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 8
MAX_BACKOFF_SECONDS = 300.0


def backoff_delay(attempts: int, retry_after: float | None) -> float:
    """Seconds to wait before the next attempt (``attempts`` already made)."""
    if retry_after is not None and retry_after > 0:
        return float(retry_after)
    return min(MAX_BACKOFF_SECONDS, 0.5 * 2 ** max(0, attempts - 1)) * random.uniform(0.8, 1.2)


class OutboxSender:
    """Background task that drains the outbox."""

    def __init__(self, store: Store, adapters: Mapping[str, BasePlatformAdapter], metrics: Metrics,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.adapters = adapters
        self.metrics = metrics
        self.clock = clock
        self._wake = asyncio.Event()
        self._busy_chats: set[tuple[str, str]] = set()
        # Parts this process already handled: the earliest time each may be tried again (inf once
        # sent or failed) and the attempts made. A scan that read the outbox before the handling
        # committed must neither send them again nor lose count of their attempts.
        self._handled: dict[int, tuple[float, int]] = {}
        self._chat_tasks: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Look at the outbox now (new parts were written)."""
        self._wake.set()

    def start(self) -> None:
        """Start the sender task."""
        self._task = asyncio.create_task(self._loop(), name="outbox-sender")

    async def flush(self, timeout: float) -> bool:
        """Wait until nothing is pending (or ``timeout``); returns whether the outbox is empty."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if not self._busy_chats and await self.store.outbox_depth() == 0:
                return True
            self.wake()
            await asyncio.sleep(0.05)
        return await self.store.outbox_depth() == 0

    async def stop(self) -> None:
        """Stop sending (undelivered parts stay in the store for the next start)."""
        tasks = [t for t in (self._task, *self._chat_tasks) if t]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                wait = await self._dispatch_due()
            except Exception:
                logger.exception("outbox scan failed")
                wait = 1.0
            # not asyncio.wait_for: on 3.11 it swallows a cancel that coincides with a wake, so stop() hung
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    async def _dispatch_due(self) -> float:
        rows = await self.store.pending_outbox()
        self.metrics.outbox_depth.set(len(rows))
        now = self.clock()
        seen = {row.id for row in rows}
        self._handled = {i: h for i, h in self._handled.items() if i in seen}
        by_chat: dict[tuple[str, str], list[OutboxRow]] = {}
        for row in rows:
            handled = self._handled.get(row.id)
            if handled is not None:
                not_before, attempts = handled
                if not_before == float("inf"):
                    continue
                row.next_attempt_at = max(row.next_attempt_at, not_before)
                row.attempts = max(row.attempts, attempts)
            by_chat.setdefault((row.platform, row.chat_id), []).append(row)
        next_due = 5.0
        for chat, chat_rows in by_chat.items():
            if chat in self._busy_chats:
                continue
            head = chat_rows[0]
            if head.next_attempt_at > now:
                next_due = min(next_due, head.next_attempt_at - now)
                continue
            self._busy_chats.add(chat)
            task = asyncio.create_task(self._send_chat(chat, chat_rows), name=f"outbox:{chat[0]}:{chat[1]}")
            self._chat_tasks.add(task)
            task.add_done_callback(self._chat_tasks.discard)
        return max(0.01, next_due)

    async def _send_chat(self, chat: tuple[str, str], rows: list[OutboxRow]) -> None:
        try:
            for row in rows:
                if row.next_attempt_at > self.clock() or not await self._send_one(row):
                    break
        finally:
            self._busy_chats.discard(chat)
            self.wake()

    async def _send_one(self, row: OutboxRow) -> bool:
        """Deliver one part; returns whether the chat may go on to its next part."""
        adapter = self.adapters.get(row.platform)
        attempts = row.attempts + 1
        if adapter is None:
            self._handled[row.id] = (float("inf"), attempts)
            await self.store.mark_failed(row.id, f"no adapter for platform {row.platform!r}")
            self.metrics.deliveries.labels(row.platform, "failed").inc()
            logger.error("outbox %s: no adapter for platform %s; dropped", row.id, row.platform)
            return True
        metadata = {"delivery_id": row.dedupe_key, "run_id": row.run_id or "", "part_index": str(row.part_index),
                    "parts_total": str(row.parts_total)}
        if row.thread_id:
            metadata["thread_id"] = row.thread_id
        try:
            result = await self._attempt(adapter, row, metadata)
        except Exception as exc:  # an adapter bug must not kill the sender
            logger.exception("outbox %s: %s send raised", row.id, row.platform)
            result = SendResult(success=False, error=f"{type(exc).__name__}: {exc}", retryable=True)
        if result.success:
            self._handled[row.id] = (float("inf"), attempts)
            await self.store.mark_sent(row.id, result.message_id)
            self.metrics.deliveries.labels(row.platform, "sent").inc()
            return True
        if result.retryable and attempts < MAX_ATTEMPTS:
            delay = backoff_delay(attempts, result.retry_after)
            retry_at = self.clock() + delay
            self._handled[row.id] = (retry_at, attempts)
            await self.store.mark_retry(row.id, retry_at, result.error or "retryable failure")
            self.metrics.deliveries.labels(row.platform, "retry").inc()
            logger.warning("outbox %s to %s:%s failed (%s); retry in %.1fs", row.id, row.platform, row.chat_id,
                           result.error, delay)
            return False
        self._handled[row.id] = (float("inf"), attempts)
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
        return await adapter.send(row.chat_id, row.text, reply_to=row.reply_to, metadata=metadata)
