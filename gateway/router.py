"""From an adapter's event to work: authorize, accept once, then a command or a run.

``on_message`` is the callback every adapter gets. It returns once the event is
durably in the inbox (or was a duplicate), so the adapter may acknowledge it to
the platform; the work itself happens afterwards, one item at a time per session.

With several replicas on one database (``Coordinator.sole`` is false) the inbox is the
session's queue: whichever replica holds the session's lock runs its events oldest first,
whichever replica accepted them; a sweep picks up events nobody is running (their
replica died, or they arrived while another replica was finishing the session).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Coroutine, Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine import Connection

from gateway.approval_flow import ApprovalFlow
from gateway.approvals import (
    Approval,
    display_name,
)
from gateway.auth import SIGNED_PLATFORMS, Authorizer, Decision
from gateway.commands import (
    COMMANDS,
    CommandContext,
    CronControl,
    McpControl,
    for_another_bot,
    parse_command,
    run_command,
)
from gateway.config import Config
from gateway.coordination import Coordinator, LocalCoordinator
from gateway.limits import InboundLimiter
from gateway.metrics import Metrics
from gateway.outbox import OutboxSender
from gateway.pairing import PairingStore, approve_command, format_code, notify_approved
from gateway.runs import RunExecutor, RunJob, Target
from gateway.session import SessionLanes, background_session_key, session_key
from gateway.session_settings import SettingsStore
from gateway.session_summary import PreparedHistory
from gateway.steering import SteerBox, Steered
from gateway.store import Acceptance, InboxRow, NewRun, OutboxPart, Replay, RunRow, Store, accept_event
from platforms.base import Accepted, BasePlatformAdapter, GatewayClosing, MessageEvent, SessionSource, split_message
from platforms.forge import FORGES
from toolsets import toolset_for_platform

logger = logging.getLogger(__name__)


SWEEP_INTERVAL_SECONDS = 2.0
SWEEP_AGE_SECONDS = 2.0  # events younger than this are being started by the replica that accepted them

RATE_LIMIT_NOTICE = "You're sending messages faster than I can answer. I'll skip a few; please slow down a little."
PAIRING_NOTICE = ("Hi! This bot only talks to people its operator approved. To request access, send the operator "
                  "this code: {code} (valid for one hour).")


def _format_uptime(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h {minutes}m" if days else f"{hours}h {minutes}m {secs}s"


def _replay_of(event: MessageEvent) -> Replay | None:
    """A signed webhook delivery's second dedupe key (platforms/webhook_signatures.py ``Delivery.replay``)."""
    meta = event.metadata
    return (Replay(meta["replay_key"], float(meta["replay_at"]), float(meta["replay_window"]))
            if "replay_key" in meta else None)


def parse_target(spec: str, source: str | None = None) -> Target | None:
    """``platform:chat[:thread]`` -> Target; ``none`` -> None; ``github`` / ``gitlab`` -> the issue or pull request
    named by ``source`` (``<forge>:<chat id>``, bound from the webhook's payload), None when it names none there."""
    if spec == "none":
        return None
    if spec in FORGES:
        forge, _, thread = (source or "").partition(":")
        return Target(spec, thread) if forge == spec and thread else None
    platform, _, rest = spec.partition(":")
    if platform == "callback":
        return Target(platform, rest)
    chat, _, thread = rest.partition(":")
    return Target(platform, chat, thread or None)


class Router:
    """Routes accepted events to commands and runs; implements ``CommandHost``."""

    def __init__(self, cfg: Config, store: Store, executor: RunExecutor, outbox: OutboxSender,
                 adapters: Mapping[str, BasePlatformAdapter], metrics: Metrics,
                 coordinator: Coordinator | None = None) -> None:
        self.cfg = cfg
        self.store = store
        self.executor = executor
        self.outbox = outbox
        self.adapters = adapters
        self.metrics = metrics
        self.coordinator = coordinator or LocalCoordinator()
        self._driving: set[str] = set()  # sessions this replica is running from the inbox (shared database)
        self._sweeper: asyncio.Task[None] | None = None
        self.approvals = ApprovalFlow(cfg, store, outbox, self._new_run, self._submit)
        self._background: set[asyncio.Task[Any]] = set()
        self.settings = SettingsStore(store)
        self.pairing = PairingStore(store, cfg.auth.pairing_code_ttl_seconds, cfg.auth.max_pending_codes)
        self.auth = Authorizer(cfg.auth, self.pairing)
        self.limiter = InboundLimiter(cfg.limits, store.db)
        self.lanes = SessionLanes()
        self.closing = False
        self.started_at = time.monotonic()
        self._running: dict[str, str] = {}  # session key -> run id
        self._steering: dict[str, SteerBox[RunJob]] = {}  # session key -> where messages for its chat run wait
        self.cron: CronControl | None = None  # set by the gateway once its scheduler runs
        self.mcp: McpControl | None = None  # set by the gateway

    # -- intake ----------------------------------------------------------

    def _session_of(self, event: MessageEvent) -> str:
        return session_key(SessionSource.from_event(event), self.cfg.gateway.group_sessions_per_user)

    def _bot_username(self, platform: str) -> str | None:
        adapter = self.adapters.get(platform)
        return getattr(adapter, "bot_username", None) if adapter else None

    def _new_run(self, event: MessageEvent, run_id: str) -> tuple[NewRun, dict[str, Any]]:
        if event.platform == "webhook":
            route = self.cfg.platforms.webhook.routes[event.chat_id]
            toolsets = [route.toolset] if isinstance(route.toolset, str) else list(route.toolset)
            target = parse_target(route.deliver_to, event.metadata.get("source"))
            if target is None and route.deliver_to in FORGES:
                logger.warning("webhook %s: the payload names no %s issue or pull request to answer on; the answer "
                               "is not delivered", event.chat_id, route.deliver_to)
            kind, source, history = "webhook", event.chat_id, False
        elif event.platform == "cron":  # a scheduled job's fire (gateway/cron.py): fresh context, origin chat
            toolsets = toolset_for_platform("cron", self.cfg.toolsets)
            meta = event.metadata
            target = Target(meta["target_platform"], meta["target_chat_id"], meta.get("target_thread_id"))
            kind, source, history = "cron", meta["job_id"], False
        else:
            toolsets = toolset_for_platform(event.platform, self.cfg.toolsets)
            target = Target(event.platform, event.chat_id, event.thread_id, event.message_id)
            kind, source, history = "chat", event.platform, True
        run = NewRun(run_id, kind, source, toolsets, event.text, target and f"{target.platform}:{target.chat_id}")
        payload = {"event": event.to_dict(), "kind": kind, "source": source, "toolsets": toolsets,
                   "target": target.to_dict() if target else None, "history": history}
        return run, payload

    async def on_message(self, event: MessageEvent) -> Accepted | None:
        """Accept an event once; returns its acceptance, or None when it was refused.

        Raises GatewayClosing while shutting down, so the adapter does not acknowledge the event.
        """
        if self.closing:
            raise GatewayClosing("the gateway is shutting down; deliver this event again later")
        if event.platform not in SIGNED_PLATFORMS and for_another_bot(event.text, self._bot_username(event.platform)):
            self.metrics.events.labels(event.platform, "other_bot").inc()
            return None
        decision = await self.auth.check(event)
        if decision is not Decision.ALLOW:
            self.metrics.events.labels(event.platform, "unauthorized").inc()
            logger.info("unauthorized %s user %s in chat %s ignored", event.platform, event.user_id, event.chat_id)
            if decision is Decision.PAIR:
                await self._offer_pairing(event)
            return None
        if event.platform not in SIGNED_PLATFORMS:
            allowed, notify = await self.limiter.check(f"{event.platform}:{event.user_id}")
            if not allowed:
                self.metrics.events.labels(event.platform, "rate_limited").inc()
                if notify:
                    await self._notify(event, "rate", RATE_LIMIT_NOTICE)
                return None
        command = (parse_command(event.text, self._bot_username(event.platform))
                   if event.platform not in SIGNED_PLATFORMS else None)
        if command is not None:
            key = self._session_of(event)
            acc = await self.store.accept(event.dedupe_key, event.platform, "command", key,
                                          {"event": event.to_dict()})
            if not acc.duplicate and COMMANDS[command.name].slow:  # it calls the model: acknowledge the event first
                self._spawn(self._command_once(acc.inbox_id, key, event))
            elif not acc.duplicate:
                await self._command_once(acc.inbox_id, key, event)
        else:
            run_id = uuid.uuid4().hex
            run, payload = self._new_run(event, run_id)
            key = (f"webhook:{event.chat_id}:{run_id}" if run.kind == "webhook"
                   else f"cron:{run.source}" if run.kind == "cron" else self._session_of(event))
            # A webhook run that need not wait for a slot starts as it is accepted (its own session, no history).
            slots = (await self.executor.take_free_webhook_slots(run.source)
                     if run.kind == "webhook" and self.coordinator.sole else None)
            try:
                acc = await self.store.accept(event.dedupe_key, event.platform, run.kind, key, payload, run,
                                              started=slots is not None, replay=_replay_of(event))
            except BaseException:
                if slots is not None:
                    slots.release()
                raise
            if slots is not None and acc.duplicate:
                slots.release()  # no run to hand them to
            if not acc.duplicate:
                self.executor.reactions.received(run.kind, event)
                await self._dispatch(RunJob(acc.inbox_id, run_id, run.kind, run.source, key, event, run.toolsets,
                                            Target.from_dict(payload["target"]), payload["history"], slots))
        self.metrics.events.labels(event.platform, "duplicate" if acc.duplicate else "accepted").inc()
        return Accepted(acc.run_id, acc.duplicate)

    async def accept_api(self, event: MessageEvent, session: str, toolsets: list[str], target: Target | None,
                         history: bool) -> Acceptance:
        """Accept a run asked for over the HTTP API (gateway/api; ``event.chat_id`` names the client) and start it;
        a repeated dedupe key returns the first acceptance. ``history``: ``session`` is a stored conversation."""
        if self.closing:
            raise GatewayClosing("the gateway is shutting down; try again later")
        run_id = uuid.uuid4().hex
        deliver_to = target and f"{target.platform}:{target.chat_id}"
        run = NewRun(run_id, "api", event.chat_id, toolsets, event.text, deliver_to)
        payload = {"event": event.to_dict(), "kind": run.kind, "source": run.source, "toolsets": toolsets,
                   "target": target.to_dict() if target else None, "history": history}
        acc = await self.store.accept(event.dedupe_key, event.platform, run.kind, session, payload, run)
        if not acc.duplicate:
            await self._dispatch(RunJob(acc.inbox_id, run_id, run.kind, run.source, session, event, toolsets, target,
                                        history))
        self.metrics.events.labels(event.platform, "duplicate" if acc.duplicate else "accepted").inc()
        return acc

    async def _notify(self, event: MessageEvent, kind: str, text: str) -> None:
        """Send a gateway notice to the event's chat (not part of any run)."""
        stored = await self.store.enqueue([OutboxPart(f"{kind}:{event.dedupe_key}", event.platform, event.chat_id,
                                                      text, event.thread_id, event.message_id)],
                                        claim=self.outbox.claim)
        self.outbox.submit(stored or [])

    async def _offer_pairing(self, event: MessageEvent) -> None:
        code = await self.pairing.issue(event.platform, event.user_id, event.user_name, event.chat_id)
        if code is None:
            return  # a code went out within the hour, or too many are pending: stay quiet
        logger.warning("pairing code issued to %s user %s (%s); approve with: %s",
                       event.platform, event.user_id, event.user_name, approve_command(code, self.cfg.source))
        await self._notify(event, "pair", PAIRING_NOTICE.format(code=format_code(code)))

    async def approve_pairing(self, event: MessageEvent, code: str) -> str:
        """``/pair approve CODE`` from an admin: approve and tell the user."""
        if not self.auth.is_admin(event.platform, event.user_id):
            return "Only gateway admins can approve pairing codes."
        result = await self.pairing.approve(code, f"{event.platform}:{event.user_id}")
        if result.ok and result.code is not None:
            self.outbox.submit(await notify_approved(self.store, result.code) or [])
        return result.message

    async def _dispatch(self, job: RunJob) -> None:
        """Start a newly accepted run. A chat message whose session has a run going (here, or perhaps on another
        replica) does what the session's busy mode says: queue behind it, interrupt it, or steer it."""
        busy = job.kind == "chat" and (not self.coordinator.sole or self.lanes.is_busy(job.session_key))
        mode = await self.busy_mode(job.session_key) if busy else "queue"
        if mode == "steer" and self._steer(job):
            return
        self._submit(job, interrupt=mode == "interrupt")

    async def busy_mode(self, session_key: str) -> str:
        """What a message does while the session's run goes on: its ``/busy`` choice, else ``gateway.busy``."""
        return (await self.settings.session(session_key)).busy or self.cfg.gateway.busy

    def _steer(self, job: RunJob) -> bool:
        """Hand a chat message to its session's run going on here (gateway/steering.py); False when there is
        none taking messages, when earlier messages wait for the session (they go first), or when it carries files
        (they are fetched when a run starts: it runs next)."""
        box = self._steering.get(job.session_key)
        if box is None or self.lanes.queued(job.session_key) or job.event.attachments:
            return False
        return box.offer(Steered(job.event.text, job.inbox_id, job.run_id), job)

    def _submit(self, job: RunJob, *, started_before: bool = False, interrupt: bool = False,
                first: bool = False) -> None:
        """Queue a run on its session (``first``: ahead of what waits). ``started_before``: a run picked up after
        a stop (it may be given up). ``interrupt``: stop the session's running run first."""
        stopped_here = interrupt and self._stop_here(job.session_key)
        if interrupt and not stopped_here and not self.coordinator.sole:  # it may run on another replica
            self._spawn(self.coordinator.request_stop(f"session:{job.session_key}"))
        if not self.coordinator.sole:  # a webhook or background run is its session's only event: run it as is
            self._drive_soon(job.session_key, job if job.kind in ("webhook", "background") else None)
            return

        self.lanes.submit(job.session_key, lambda: self._run_job(job.session_key, job, started_before), first=first)

    async def resume(self) -> int:
        """Re-queue every accepted event that did not finish (after a crash or restart); with a shared
        database, take part in running what nobody runs (now and every few seconds). Approvals nobody answered
        in time are denied from now on (on every replica: each is decided once)."""
        self.approvals.start()
        if not self.coordinator.sole:
            count = await self.sweep(before=time.time())
            self._sweeper = asyncio.create_task(self._sweep_loop(), name="inbox-sweep")
            return count
        rows = await self.store.unfinished_inbox()
        for row in rows:
            if row.kind == "command":
                await self._resume_command(row)
            else:
                self._submit(self._job(row), started_before=row.status == "running")
        if rows:
            logger.info("resumed %d unfinished events", len(rows))
        return len(rows)

    @staticmethod
    def _job(row: InboxRow) -> RunJob:
        p = row.payload
        return RunJob(row.id, row.run_id or uuid.uuid4().hex, p["kind"], p["source"], row.session_key,
                      MessageEvent.from_dict(p["event"]), list(p["toolsets"]), Target.from_dict(p["target"]),
                      bool(p["history"]))

    async def _resume_command(self, row: InboxRow) -> None:
        event = MessageEvent.from_dict(row.payload["event"])
        if parse_command(event.text, self._bot_username(event.platform)) is None:
            await self.store.set_inbox_status(row.id, "done")
        else:
            await self._handle_command(row.id, row.session_key, event)

    # -- several replicas on one database ----------------------------------

    def _drive_soon(self, key: str, job: RunJob | None = None) -> None:
        """Run the session's waiting events here, unless this replica already does. ``job``: the one
        event of a session nothing else can join (a webhook run's own session), run as is."""
        if key in self._driving or self.closing:
            return
        self._driving.add(key)
        self.lanes.submit(key, lambda: self._drive(key, job))

    async def _drive(self, key: str, own: RunJob | None) -> None:
        """Under the session's lock, run its unfinished events oldest first, wherever they were accepted."""
        try:
            if not await self.coordinator.try_lock(f"session:{key}"):
                return  # another replica runs this session; it looks for new events before letting go
            try:
                if own is not None:
                    await self._run_job(key, own)
                    return
                last: int | None = None
                while not self.closing and (row := await self.store.next_run_event(key)) is not None:
                    if row.id == last:  # the run could not be recorded: leave it to a later sweep
                        logger.error("inbox event %s of session %s did not finish; retrying later", row.id, key)
                        return
                    last = row.id
                    await self._run_job(key, self._job(row), row.status == "running")
            finally:
                await self.coordinator.unlock(f"session:{key}")
        finally:
            self._driving.discard(key)
        # An event accepted elsewhere while this replica held the lock may have been passed over there.
        if own is None and not self.closing and await self.store.next_run_event(key) is not None:
            self._drive_soon(key)

    async def _run_job(self, key: str, job: RunJob, started_before: bool = False) -> None:
        """Run the job; one that was started before and interrupted by stops of the gateway
        ``gateway.max_run_attempts`` times is given up instead (recorded as failed, its user told once)."""
        if started_before and await self.executor.give_up_if_exhausted(job):
            return
        self._running[key] = job.run_id
        if job.kind == "chat":
            job.steering = self._steering[key] = SteerBox()
        try:
            await self.executor.execute(job)
        finally:
            self._running.pop(key, None)
            if job.steering is not None:
                del self._steering[key]
                # Messages that came too late for the run's model calls run next, in order; when the gateway is
                # shutting down they stay pending in the inbox and resume on its next start.
                for later in reversed(job.steering.close()):
                    if not self.lanes.closed:
                        self._submit(later, first=True)

    async def _command_once(self, inbox_id: int, key: str, event: MessageEvent) -> None:
        """Handle a command; with a shared database, only where its event's lock is held."""
        if self.coordinator.sole:
            await self._handle_command(inbox_id, key, event)
            return
        if not await self.coordinator.try_lock(f"inbox:{inbox_id}"):
            return
        try:
            row = await self.store.get_inbox(inbox_id)
            if row is not None and row.status in ("pending", "running"):
                await self._handle_command(inbox_id, key, event)
        finally:
            await self.coordinator.unlock(f"inbox:{inbox_id}")

    async def sweep(self, before: float) -> int:
        """Take up unfinished events last touched before ``before`` that no replica is working on."""
        waiting = await self.store.waiting_events(before)
        for key, kind, inbox_id in waiting:
            if kind != "command":
                self._drive_soon(key)
                continue
            row = await self.store.get_inbox(inbox_id)
            if row is not None:
                await self._command_once(row.id, row.session_key, MessageEvent.from_dict(row.payload["event"]))
        return len(waiting)

    async def _sweep_loop(self) -> None:
        while not self.closing:
            await asyncio.sleep(SWEEP_INTERVAL_SECONDS)
            try:
                await self.sweep(before=time.time() - SWEEP_AGE_SECONDS)
            except Exception:
                logger.exception("inbox sweep failed")

    def locks_lost(self) -> None:
        """This replica's session locks are gone: stop its runs (the replica that takes a session over
        redoes its unfinished run; the completion is recorded once)."""
        for key in list(self._driving):
            self.lanes.cancel_current(key)

    async def stop_sweeping(self) -> None:
        """Stop looking for unattended events and asking other replicas to stop work; drop status reactions not
        shown yet (shutdown)."""
        tasks = [t for t in (self._sweeper, *self._background) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.approvals.stop()
        await self.executor.reactions.close()

    # -- commands --------------------------------------------------------

    async def _handle_command(self, inbox_id: int, key: str, event: MessageEvent) -> None:
        cmd = parse_command(event.text, self._bot_username(event.platform))
        assert cmd is not None
        ctx = CommandContext(event, key, cmd.args, self)
        try:
            reply = await run_command(cmd, ctx)
        except Exception:
            logger.exception("command /%s failed", cmd.name)
            reply = f"/{cmd.name} failed; the error was logged."
            ctx.effects.clear()
            ctx.after.clear()
        adapter = self.adapters.get(event.platform)
        limit, length = (adapter.max_message_length, adapter.length_fn) if adapter else (4000, len)
        parts = split_message(reply, limit, length)
        pressed = event.metadata.get("pressed_message_id") if ctx.replace_pressed else None
        replies = [OutboxPart(f"cmd:{event.dedupe_key}:{i}", event.platform, event.chat_id, text, event.thread_id,
                              event.message_id if i == 0 else None, part_index=i, parts_total=len(parts),
                              edit_message_id=pressed if i == 0 else None) for i, text in enumerate(parts)]
        if ctx.replace_pressed and pressed is None and ctx.also_replace is not None:  # typed: the prompt shows it too
            replies.insert(0, OutboxPart(f"cmd:{event.dedupe_key}:prompt", event.platform, event.chat_id, parts[0],
                                         event.thread_id, edit_message_id=ctx.also_replace))
        stored = await self.store.enqueue(replies, inbox_id=inbox_id, claim=self.outbox.claim, effects=ctx.effects)
        self.outbox.submit(stored or [])
        for then in ctx.after:
            then()

    def model_for(self, choice: str | None) -> str:
        """The model a session with this ``/model`` choice uses."""
        return self.executor.model_for(choice)

    async def session_busy(self, session_key: str) -> bool:
        """Whether the session has a message whose run has not finished (running or waiting, on any replica):
        once a run's completion is stored, its exchange is in the history."""
        return await self.store.next_run_event(session_key) is not None

    async def compress_session(self, session_key: str, event: MessageEvent) -> PreparedHistory | None:
        """``/compress``: summarise the session's older turns now (None when compression is off)."""
        compressor = self.executor.compressor
        if compressor is None:
            return None
        epoch = await self.store.session_epoch(session_key, event.platform, event.chat_id, event.user_id,
                                               event.thread_id)
        model = (await self.settings.session(session_key)).model
        return await compressor.history(session_key, epoch, 0, force=True, model=self.executor.model_for(model))

    def retry(self, ctx: CommandContext, text: str) -> None:
        """``/retry``: accept ``text`` as a new message of the command's chat in the command's transaction (a
        replayed command finds it accepted), and start its run once that is stored."""
        event = dataclasses.replace(ctx.event, event_id=f"retry:{ctx.event.event_id}", text=text,
                                    received_at=datetime.now(UTC))
        run_id = uuid.uuid4().hex
        run, payload = self._new_run(event, run_id)
        accepted: list[Acceptance] = []
        ctx.effects.append(lambda conn: accepted.append(accept_event(
            conn, dedupe_key=event.dedupe_key, platform=event.platform, kind=run.kind, session_key=ctx.session_key,
            payload=payload, run=run)))

        def start() -> None:
            if accepted and not accepted[0].duplicate:
                self._submit(RunJob(accepted[0].inbox_id, run_id, run.kind, run.source, ctx.session_key, event,
                                    run.toolsets, Target.from_dict(payload["target"]), payload["history"]))
        ctx.after.append(start)

    def start_background(self, ctx: CommandContext, prompt: str) -> str:
        """``/background``: accept ``prompt`` as a detached run of the command's chat, in the command's transaction,
        and start it once that is stored; the task's id. Like Hermes Agent, it runs in a session of its own (no
        history, nothing added to the chat's), so the chat goes on meanwhile; its answer replies to the command."""
        event = dataclasses.replace(ctx.event, event_id=f"background:{ctx.event.event_id}", text=prompt,
                                    received_at=datetime.now(UTC))
        run_id = uuid.uuid4().hex
        task, key = run_id[:6], background_session_key(ctx.session_key, run_id[:6])
        toolsets = toolset_for_platform(event.platform, self.cfg.toolsets)
        target = Target(event.platform, event.chat_id, event.thread_id, event.message_id)
        run = NewRun(run_id, "background", task, toolsets, prompt, f"{event.platform}:{event.chat_id}")
        payload = {"event": event.to_dict(), "kind": run.kind, "source": task, "toolsets": toolsets,
                   "target": target.to_dict(), "history": False}
        accepted: list[Acceptance] = []  # the last attempt's, should the transaction be tried again

        def accept(conn: Connection) -> None:
            accepted[:] = [accept_event(conn, dedupe_key=event.dedupe_key, platform=event.platform, kind=run.kind,
                                        session_key=key, payload=payload, run=run)]

        def start() -> None:
            if accepted and not accepted[0].duplicate:
                self._submit(RunJob(accepted[0].inbox_id, run_id, run.kind, task, key, event, toolsets, target, False))
        ctx.effects.append(accept)
        ctx.after.append(start)
        return task

    # -- approvals (gateway/approval_flow.py) ---------------------------------

    def answer_approval(self, ctx: CommandContext, approval: Approval, status: str, scope: str | None = None,
                        reason: str | None = None) -> None:
        """``/approve`` / ``/deny``: record the answer and accept the run that resumes the chat, in the command's
        transaction; start that run once it is stored."""
        e = ctx.event
        effect, start = self.approvals.answer(approval, status, display_name(e.platform, e.user_id, e.user_name),
                                              scope, reason)
        ctx.effects.append(effect)
        ctx.after.append(start)

    async def stop_session(self, session_key: str) -> bool:
        """``/stop``: cancel the session's running run, here or on the replica that runs it; or, when its
        run was accepted but has not started yet, record that run as cancelled so it never starts."""
        if self._stop_here(session_key) or await self.coordinator.request_stop(f"session:{session_key}"):
            return True
        row = await self.store.next_run_event(session_key)
        if row is None or row.run_id is None:
            return False
        if self._stop_here(session_key):  # it started while the inbox was read
            return True
        return await self.executor.cancel_unstarted(row.run_id, row.id, session_key, row.kind)

    async def stop_run(self, run: RunRow) -> bool:
        """Stop one run (the runs API): cancel it where it runs, or record it cancelled when it has not started.
        Another run of its session is never stopped: here the running run's id is checked; on another replica a
        session runs one run at a time, so a run recorded as running is the one its session's holder runs."""
        key = run.session_key
        if self._running.get(key) == run.id:
            return self._stop_here(key)
        if run.status == "running":
            return not self.coordinator.sole and await self.coordinator.request_stop(f"session:{key}")
        inbox_id = await self.store.inbox_of_run(key, run.id)
        if self._running.get(key) == run.id:  # it started while the inbox was read
            return self._stop_here(key)
        return await self.executor.cancel_unstarted(run.id, inbox_id, key, run.kind)

    def _stop_here(self, session_key: str) -> bool:
        run_id = self._running.get(session_key)
        if run_id is None:
            return False
        self.executor.request_stop(run_id)
        return self.lanes.cancel_current(session_key)

    def stop_requested(self, lock_name: str) -> None:
        """Another replica asked the holder of ``lock_name`` to stop (``/stop`` or an interrupting message)."""
        if lock_name.startswith("session:"):
            self._stop_here(lock_name.removeprefix("session:"))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def session_status(self, session_key: str) -> dict[str, object]:
        """Data for ``/status``."""
        return {"busy": self.lanes.is_busy(session_key),
                "queued": self.lanes.queued(session_key),
                "uptime": _format_uptime(time.monotonic() - self.started_at)}

    def is_admin(self, platform: str, user_id: str) -> bool:
        """Whether the user is listed in ``auth.admins``."""
        return self.auth.is_admin(platform, user_id)

    def session_tools(self, session_key: str, platform: str) -> list[str]:
        """Tools this platform's sessions may use now."""
        plan = self.executor.plan_for(toolset_for_platform(platform, self.cfg.toolsets))
        return sorted(plan.allowed)
