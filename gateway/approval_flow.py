"""Answering approvals: the unit of work that records an answer and accepts the run resuming the conversation, and
the expiry sweep (gateway/approvals.py says what is asked and stored).

An answer is a compare-and-set on the request and, in the same transaction, one resume event for the chat (dedupe
key ``<platform>:approval:<id>``): two presses, a press and the expiry, or two replicas store one decision and
one resumed run. Every replica sweeps expired requests; each is decided once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection

from gateway.approvals import (
    APPROVED,
    EXPIRED,
    AlreadyAnswered,
    Approval,
    decide,
    decision_note,
    expired_approvals,
    prompt_message_id,
    resume_text,
)
from gateway.config import Config
from gateway.outbox import OutboxSender
from gateway.runs import RunJob, Target
from gateway.store import Acceptance, NewRun, OutboxPart, Store, accept_event
from platforms.base import MessageEvent

logger = logging.getLogger(__name__)

NewRunOf = Callable[[MessageEvent, str], tuple[NewRun, dict[str, Any]]]
Submit = Callable[[RunJob], None]
Effect = Callable[[Connection], None]


class ApprovalFlow:
    """Answers to approval requests and their expiry, for the router (``new_run`` and ``submit`` are its)."""

    def __init__(self, cfg: Config, store: Store, outbox: OutboxSender, new_run: NewRunOf, submit: Submit) -> None:
        self.cfg = cfg
        self.store = store
        self.outbox = outbox
        self._new_run = new_run
        self._submit = submit
        self._expiry: asyncio.Task[None] | None = None

    def answer(self, approval: Approval, status: str, who: str | None, scope: str | None = None,
               reason: str | None = None) -> tuple[Effect, Callable[[], None]]:
        """The unit of work that decides ``approval`` (raising ``AlreadyAnswered`` when another answer came first)
        and accepts its resume event, and what starts the resumed run once that is stored."""
        o = approval.origin
        text = resume_text(approval, status, who, scope, reason, self.cfg.approvals.timeout_minutes)
        metadata = {"approval_id": approval.id}
        if status == APPROVED:  # the calls run again under new ids: the prompt's run answered the old ones
            metadata["approval_calls"] = json.dumps([
                {"id": f"call_{approval.id}_{i}", "type": "function",
                 "function": {"name": call["name"], "arguments": call["arguments"]}}
                for i, call in enumerate(approval.calls)])
        event = MessageEvent(o["platform"], f"approval:{approval.id}", o["chat_id"], o["chat_type"], o["user_id"],
                             o.get("user_name"), text, thread_id=o.get("thread_id"), metadata=metadata)
        run_id = uuid.uuid4().hex
        run, payload = self._new_run(event, run_id)
        accepted: list[Acceptance] = []  # the last attempt's, should the transaction be tried again

        def effect(conn: Connection) -> None:
            if not decide(conn, approval, status, who, scope, reason):
                raise AlreadyAnswered(approval.id)
            accepted[:] = [accept_event(conn, dedupe_key=event.dedupe_key, platform=event.platform, kind=run.kind,
                                        session_key=approval.session_key, payload=payload, run=run)]

        def start() -> None:
            if accepted and not accepted[0].duplicate:
                self._submit(RunJob(accepted[0].inbox_id, run_id, run.kind, run.source, approval.session_key, event,
                                    run.toolsets, Target.from_dict(payload["target"]), payload["history"]))
        return effect, start

    async def expire(self) -> int:
        """Deny the requests nobody answered in time: each prompt shows it expired and the model is told."""
        expired = await self.store.db.read(lambda conn: expired_approvals(conn, time.time()))
        for approval in expired:
            effect, start = self.answer(approval, EXPIRED, None)
            o = approval.origin
            prompt_id = await self.store.db.read(lambda conn, a=approval: prompt_message_id(conn, a.run_id))
            note = OutboxPart(f"approval:{approval.id}:expired", o["platform"], o["chat_id"],
                              decision_note(approval, EXPIRED, None), o.get("thread_id"), edit_message_id=prompt_id)
            try:
                stored = await self.store.enqueue([note], claim=self.outbox.claim, effects=[effect])
            except AlreadyAnswered:
                continue
            self.outbox.submit(stored or [])
            start()
            logger.info("approval %s expired unanswered; run %s is told", approval.id, approval.run_id)
        return len(expired)

    def start(self) -> None:
        """Sweep for expired requests from now on (a tenth of the timeout apart, 0.2-15 s)."""
        if self._expiry is None:
            self._expiry = asyncio.create_task(self._loop(), name="approval-expiry")

    async def stop(self) -> None:
        """Stop sweeping."""
        task, self._expiry = self._expiry, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _loop(self) -> None:
        interval = min(15.0, max(0.2, self.cfg.approvals.timeout_minutes * 6))
        while True:
            try:
                await self.expire()
            except Exception:
                logger.exception("approval expiry failed")
            await asyncio.sleep(interval)
