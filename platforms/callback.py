"""Outbound-only HTTP delivery: POST a run's answer to a configured URL, signed (Standard Webhooks).

Each part carries a stable ``webhook-id`` (the outbox delivery key), so a receiver can
drop the rare repeat after a crash between its 2xx and our bookkeeping.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from platforms.base import SendResult
from platforms.http_target import HttpTargetAdapter
from platforms.webhook_signatures import sign

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class CallbackTarget:
    """Where and how to deliver."""

    url: str
    secret: str
    timeout: float = 10.0


class CallbackAdapter(HttpTargetAdapter):
    """Delivers to HTTP endpoints named in ``platforms.callback.targets``."""

    name = "callback"
    max_message_length = 100_000
    ordered_per_chat = False  # a target receives results of unrelated runs: only a run's parts keep order

    def __init__(self, targets: Mapping[str, CallbackTarget]) -> None:
        super().__init__()
        self.targets = dict(targets)

    async def send(self, chat_id: str, content: str, reply_to: str | None = None,
                   metadata: Mapping[str, str] | None = None) -> SendResult:
        """POST ``{"target", "text", "run_id", "part", "parts"}`` to the target's URL."""
        target = self.targets.get(chat_id)
        if target is None:
            return SendResult(success=False, error=f"unknown callback target {chat_id!r}")
        if self._session is None:
            return SendResult(success=False, error="callback platform not connected", retryable=True)
        meta = dict(metadata or {})
        body = json.dumps({"target": chat_id, "text": content, "run_id": meta.get("run_id"),
                           "part": int(meta.get("part_index", "0")), "parts": int(meta.get("parts_total", "1"))},
                          ensure_ascii=False).encode()
        delivery_id = meta.get("delivery_id") or None
        headers = {"Content-Type": "application/json",
                   **sign("standard-webhooks", target.secret, body, delivery_id=delivery_id)}
        try:
            async with self._session.post(target.url, data=body, headers=headers,
                                          timeout=aiohttp.ClientTimeout(total=target.timeout)) as resp:
                if 200 <= resp.status < 300:
                    return SendResult(success=True, message_id=headers.get("webhook-id"))
                retry_after = resp.headers.get("Retry-After")
                retryable = resp.status == 429 or resp.status >= 500
                return SendResult(success=False, error=f"HTTP {resp.status}", retryable=retryable,
                                  retry_after=float(retry_after) if retry_after and retry_after.isdigit() else None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return SendResult(success=False, error=f"{type(exc).__name__}: {exc}", retryable=True)
