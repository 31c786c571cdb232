"""The scheduler: stored cron jobs fire as runs whose answers go back to the chat that made them.

Job definitions live in the store (``gateway/cron_store.py``), the source of truth. APScheduler's
``AsyncIOScheduler`` (in-memory job store) holds one job per active definition, with the job's own
trigger, pinned to the stored next fire time, and calls ``_fire`` when it is due. A fire is claimed
by offering ``MessageEvent(platform="cron", event_id=f"{job_id}:{scheduled_for}")`` to the router:
the inbox's unique dedupe key makes each fire run at most once, across restarts and replicas. Only
then is the job advanced (a compare-and-set on its next fire time), so a crash in between is
repaired on the next start. Due times that passed while no gateway was running are misfires,
handled by the job's policy: ``run_once`` (one run for all of them, within the grace period) or
``skip``. Changes made by other processes (the CLI, other replicas) are picked up every
``cron.sync_interval_seconds``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from gateway.config import Config
from gateway.cron_store import CronStore
from gateway.metrics import Metrics
from gateway.outbox import OutboxSender
from gateway.router import parse_target
from gateway.runs import RunJob, Target
from gateway.session_settings import SettingsStore
from gateway.store import OutboxPart, RunCompletion, Store
from gateway.tool_state import LoopBridge
from platforms.base import Accepted, BasePlatformAdapter, MessageEvent, OnMessage
from tools.cronjob_tools import JOB_STATES, CronError, CronJob, first_fire, next_fire, upcoming

logger = logging.getLogger(__name__)

# A fire that starts within this many seconds of its time is on time (a busy loop or a slow database
# delays fires by seconds); anything later means the host slept, and is treated as a misfire.
ON_TIME_SECONDS = 60.0
_MAX_MISSED = 10_000  # enumerate at most this many missed times (a 1 s job down for hours)
_STOP_TIMEOUT = 5.0  # seconds fires in flight get to finish their bookkeeping on shutdown

# APScheduler logs every job submission at INFO; our own fire log says what matters.
logging.getLogger("apscheduler").setLevel(logging.WARNING)


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def fire_event_id(job_id: str, scheduled_for: datetime, manual: bool = False) -> str:
    """The inbox event id of one fire: the same fire always gets the same id."""
    return f"{job_id}:{'run:' if manual else ''}{_iso(scheduled_for)}"


@dataclass(frozen=True, slots=True)
class FirePlan:
    """What to do with a due job: which time to fire for (if any), the next due time, the misfire record."""

    fire_for: datetime | None
    next_at: datetime | None
    misfire: dict[str, Any] | None = None


def plan_fire(job: CronJob, now: datetime, grace_seconds: float, tolerance: float) -> FirePlan:
    """Decide a due job's fire from its stored next fire time and ``now``.

    Due times more than ``tolerance`` seconds old are missed (at start the tolerance is 0: anything
    due before the gateway ran was missed). Missed times follow ``job.misfire``: ``run_once`` fires
    once for all of them (for the latest, if within ``grace_seconds``); ``skip`` never runs them.
    """
    trigger = job.schedule.trigger(job.zone)
    times: list[datetime] = []
    moment = job.next_fire_at
    while moment is not None and moment <= now and len(times) < _MAX_MISSED:
        times.append(moment)
        moment = next_fire(trigger, moment)
    if not times:
        return FirePlan(None, job.next_fire_at)
    if moment is not None and moment <= now:  # more missed times than we enumerate: jump past now
        moment = trigger.get_next_fire_time(None, now)
        moment = next_fire(trigger, moment) if moment is not None and moment <= now else moment
    on_time = (now - times[-1]).total_seconds() <= tolerance
    fire_for = times[-1] if on_time else None
    missed = times[:-1] if on_time else times
    if not missed:
        return FirePlan(fire_for, moment)
    if job.misfire == "skip":
        action = "skipped"
    elif fire_for is not None:
        action = "ran_once"  # the missed times are covered by this fire
    elif (now - missed[-1]).total_seconds() <= grace_seconds:
        fire_for, action = missed[-1], "ran_once"
    else:
        action = "expired"  # run_once, but even the latest missed time is older than the grace period
    record = {"policy": job.misfire, "action": action, "missed": len(missed), "first": _iso(missed[0]),
              "last": _iso(missed[-1]), "at": _iso(now)}
    return FirePlan(fire_for, moment, record)


class CronService:
    """Runs the schedule: CRUD for the tool and commands, firing, misfires, run outcomes.

    Implements the tool's backend calls (async here; ``StoreCronBackend`` makes them synchronous),
    the commands' ``CronControl`` and the run executor's ``CronHook``.
    """

    def __init__(self, cfg: Config, store: Store, on_message: OnMessage, outbox: OutboxSender,
                 adapters: Mapping[str, BasePlatformAdapter], metrics: Metrics,
                 clock: Callable[[], datetime] = _utc_now) -> None:
        self.cfg = cfg
        self.settings = cfg.cron
        self.store = store
        self.jobs = CronStore(store)
        self.homes = SettingsStore(store)
        self.outbox = outbox
        self.adapters = adapters
        self.metrics = metrics
        self.clock = clock
        self.load_seconds = 0.0
        self._on_message = on_message
        self._cache: dict[str, CronJob] = {}
        self._scheduler = AsyncIOScheduler(timezone=UTC)
        self._firing: dict[str, asyncio.Task[Any]] = {}  # job id -> its fire in flight
        self._sync_task: asyncio.Task[None] | None = None
        for state in JOB_STATES:  # counted when scraped, not on every change
            metrics.cron_jobs.labels(state).set_function(partial(self._count, state))

    @property
    def default_timezone(self) -> str:
        """The zone for jobs created without one (``cron.timezone``)."""
        return self.settings.timezone

    # -- lifecycle -------------------------------------------------------

    async def start(self) -> None:
        """Load the jobs, handle what was missed while down, and start firing."""
        started = asyncio.get_running_loop().time()
        self._scheduler = AsyncIOScheduler(timezone=UTC)  # a fresh one each time this replica starts leading
        now = self.clock()
        for job in await self.jobs.list():
            self._cache[job.id] = job
            if job.state == "active" and job.next_fire_at is not None and job.next_fire_at <= now:
                await self._catch_up(job, now)
            if (current := self._cache.get(job.id)) is not None and current.run_requested_at is not None:
                await self._run_requested(current)
        # Started paused: jobs then go straight to the job store (a dict), where a pending job would be
        # looked up by a linear scan for every add (quadratic in the number of jobs).
        self._scheduler.start(paused=True)
        for job in self._cache.values():
            self._schedule(job)
        self._scheduler.resume()
        self._sync_task = asyncio.create_task(self._sync_loop(), name="cron-sync")
        self.load_seconds = asyncio.get_running_loop().time() - started
        logger.info("cron: %d jobs loaded in %.1f ms", len(self._cache), self.load_seconds * 1000)

    async def stop(self) -> None:
        """Stop firing; fires in flight get a moment to finish (one cut short is repaired on the next start)."""
        if self._sync_task is not None:
            self._sync_task.cancel()
            await asyncio.gather(self._sync_task, return_exceptions=True)
        if self._scheduler.running:
            self._scheduler.pause()
            if self._firing:
                await asyncio.wait(set(self._firing.values()), timeout=_STOP_TIMEOUT)
            self._scheduler.shutdown(wait=False)
            await asyncio.sleep(0)  # AsyncIOScheduler shuts down on the loop's next turn

    # -- firing ----------------------------------------------------------

    def _schedule(self, job: CronJob) -> None:
        """Mirror one stored job into APScheduler (or take it out)."""
        if job.id in self._firing:
            return  # the fire puts the job's state when it is done
        current = self._scheduler.get_job(job.id)
        if job.state != "active" or job.next_fire_at is None:
            if current is not None:
                current.remove()
            return
        if current is not None and current.next_run_time == job.next_fire_at:
            return
        self._scheduler.add_job(self._fire, job.schedule.trigger(job.zone), args=(job.id,), id=job.id,
                                replace_existing=True, next_run_time=job.next_fire_at, misfire_grace_time=None,
                                coalesce=True, max_instances=1)

    def _put(self, job: CronJob | None, *, reloaded: bool = False) -> None:
        """Cache and schedule a row. A row returned by a write never replaces a newer one that another
        write returned first; a ``reloaded`` row is the store's current state and always does."""
        if job is None:
            return
        known = self._cache.get(job.id)
        if not reloaded and known is not None and known.updated_at > job.updated_at:
            return
        self._cache[job.id] = job
        self._schedule(job)

    def _drop(self, job_id: str) -> None:
        self._cache.pop(job_id, None)
        if self._scheduler.get_job(job_id) is not None:
            self._scheduler.remove_job(job_id)

    def _count(self, state: str) -> int:
        return sum(j.state == state for j in self._cache.values())

    async def _owner_home(self, job: CronJob) -> Target:
        """The owner's home channel (``/sethome``) while its platform runs here, else the job's chat."""
        home = await self.homes.home(job.owner)
        if home is not None and home.platform in self.adapters:
            return Target(home.platform, home.chat_id, home.thread_id)
        return Target(job.origin_platform, job.origin_chat_id, job.origin_thread_id)

    async def _target(self, job: CronJob) -> Target:
        if job.deliver == "origin":
            return Target(job.origin_platform, job.origin_chat_id, job.origin_thread_id)
        if job.deliver == "home":
            return await self._owner_home(job)
        target = parse_target(job.deliver)
        assert target is not None  # validated when the job was saved
        return target

    async def _claim(self, job: CronJob, scheduled_for: datetime, trigger: str) -> Accepted | None:
        """Offer one fire to the inbox; the dedupe key makes a repeated offer a no-op."""
        target = await self._target(job)
        meta = {"job_id": job.id, "scheduled_for": _iso(scheduled_for), "target_platform": target.platform,
                "target_chat_id": target.chat_id}
        if target.thread_id:
            meta["target_thread_id"] = target.thread_id
        event = MessageEvent(platform="cron", event_id=fire_event_id(job.id, scheduled_for, trigger == "manual"),
                             chat_id=job.id, chat_type="channel", user_id=job.owner, user_name=job.name or None,
                             text=job.prompt, metadata=meta)
        accepted = await self._on_message(event)
        if accepted is not None and not accepted.duplicate:
            self.metrics.cron_fires.labels(trigger).inc()
            if trigger == "scheduled":
                self.metrics.cron_fire_lag.observe(max(0.0, (self.clock() - scheduled_for).total_seconds()))
            logger.info("cron job %s fired for %s (%s): run %s", job.id, _iso(scheduled_for), trigger,
                        accepted.run_id)
        return accepted

    async def _fire(self, job_id: str) -> None:
        """APScheduler's job function: the job's stored next fire time is due."""
        job = self._cache.get(job_id)
        task = asyncio.current_task()
        if job is None or job.state != "active" or job.next_fire_at is None or task is None:
            return
        self._firing[job_id] = task
        try:
            await self._apply(job, plan_fire(job, self.clock(), self.settings.misfire_grace_seconds,
                                             ON_TIME_SECONDS), "scheduled")
        except Exception:
            logger.exception("cron job %s: fire failed; it is retried on the next start", job_id)
        finally:
            self._firing.pop(job_id, None)
            if (current := self._cache.get(job_id)) is not None:
                self._schedule(current)

    async def _catch_up(self, job: CronJob, now: datetime) -> None:
        """At start: finish a fire claimed before a crash, then apply the misfire policy to the rest."""
        assert job.next_fire_at is not None
        if await self.jobs.fire_claimed(f"cron:{fire_event_id(job.id, job.next_fire_at)}"):
            trigger = job.schedule.trigger(job.zone)
            advanced = await self._apply(job, FirePlan(job.next_fire_at, next_fire(trigger, job.next_fire_at)),
                                         "scheduled")
            if advanced is None or advanced.state != "active" or advanced.next_fire_at is None \
                    or advanced.next_fire_at > now:
                return
            job = advanced
        await self._apply(job, plan_fire(job, now, self.settings.misfire_grace_seconds, 0.0), "catch_up")

    async def _apply(self, job: CronJob, plan: FirePlan, trigger: str) -> CronJob | None:
        if plan.fire_for is None and plan.misfire is None and plan.next_at == job.next_fire_at:
            return job
        accepted = await self._claim(job, plan.fire_for, trigger) if plan.fire_for is not None else None
        if plan.misfire is not None:
            self.metrics.cron_misfires.labels(plan.misfire["action"]).inc()
            logger.info("cron job %s missed %d fire times: %s", job.id, plan.misfire["missed"],
                        plan.misfire["action"])
        advanced = await self.jobs.advance(job, plan.next_at, plan.fire_for, plan.misfire)
        reloaded = advanced is None
        if advanced is None:  # changed elsewhere meanwhile (an edit, the CLI, another replica): reload
            advanced = await self.jobs.get(job.id)
            if advanced is None:
                self._drop(job.id)
                return None
        if advanced.state == "done" and accepted is not None and advanced.last_run_id == accepted.run_id:
            await self._delete_finished(advanced)  # its last run already finished
            return None
        self._put(advanced, reloaded=reloaded)
        return advanced

    async def _run_requested(self, job: CronJob) -> None:
        """Fire a run requested by the CLI (once, whichever gateway sees it first)."""
        assert job.run_requested_at is not None
        await self._claim(job, job.run_requested_at, "manual")
        self._put(await self.jobs.clear_run_request(job.id, job.run_requested_at) or await self.jobs.get(job.id))

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sync_interval_seconds)
            await self._sync()

    async def _sync(self) -> None:
        """Pick up jobs created, changed or removed by other processes."""
        try:
            versions = await self.jobs.versions()
            for job_id in [j for j in self._cache if j not in versions]:
                self._drop(job_id)
            for job_id, updated_at in versions.items():
                known = self._cache.get(job_id)
                if known is not None and known.updated_at == datetime.fromtimestamp(updated_at, UTC):
                    continue
                job = await self.jobs.get(job_id)
                self._put(job, reloaded=True)
                if job is not None and job.run_requested_at is not None:
                    await self._run_requested(job)
        except Exception:
            logger.exception("cron: sync with the store failed")

    async def _delete_finished(self, job: CronJob) -> None:
        await self.jobs.delete(job.id)
        self._drop(job.id)
        logger.info("cron job %s finished after %d runs and was removed", job.id, job.fires)

    # -- run outcomes (the executor's CronHook) ----------------------------

    async def should_deliver(self, job: RunJob, done: RunCompletion) -> bool:
        """Whether a cron run's answer goes to the chat: failures and unchanged ``on_change`` answers do not."""
        cron_job = self._cache.get(job.event.metadata.get("job_id", ""))
        if cron_job is None or cron_job.state == "done":
            return True  # no later run will follow: always report the last one
        if done.status != "completed":
            return False
        return not (cron_job.notify == "on_change" and done.result == cron_job.last_result)

    async def run_finished(self, job: RunJob, done: RunCompletion, delivered: bool) -> None:
        """Record a cron run's outcome; pause the job (telling its owner once) after repeated failures."""
        job_id = job.event.metadata.get("job_id", "")
        try:
            # A run resumed at start can finish before the scheduler has loaded its jobs: read it then.
            cached = self._cache.get(job_id) or await self.jobs.get(job_id)
            if cached is None:
                return
            if done.status == "failed":
                self.metrics.cron_failures.inc()
            if cached.state == "done":  # its last run: nothing left to record
                await self._delete_finished(cached)
                return
            result = done.result if delivered and done.status == "completed" else None
            cron_job, paused = await self.jobs.record_run(job_id, job.run_id, done.status, done.error, result,
                                                          self.settings.max_consecutive_failures)
            if cron_job is None:
                return
            if cron_job.state == "done":
                await self._delete_finished(cron_job)
                return
            self._put(cron_job)
            if paused:
                await self._tell_owner_paused(cron_job, job.run_id, done.result or done.error or "")
        except Exception:
            logger.exception("cron job %s: recording run %s failed", job_id, job.run_id)

    async def _tell_owner_paused(self, job: CronJob, run_id: str, reason: str) -> None:
        text = (f"Scheduled job {job.id} ({job.name or job.prompt[:60]}) is paused: its last "
                f"{job.consecutive_failures} runs failed. Last error: {reason[:300]}\n"
                f"Resume it with /cron resume {job.id} once the problem is fixed.")
        to = await self._owner_home(job)
        stored = await self.store.enqueue([OutboxPart(f"cron:paused:{job.id}:{run_id}", to.platform, to.chat_id,
                                                      text, to.thread_id)], claim=self.outbox.claim)
        self.outbox.submit(stored or [])
        logger.warning("cron job %s paused after %d consecutive failures", job.id, job.consecutive_failures)

    # -- the tool's and the commands' operations --------------------------

    def _validate(self, job: CronJob, actor: str | None) -> None:
        times = upcoming(job.schedule, job.zone, self.clock(), 2)
        if len(times) == 2 and (times[1] - times[0]).total_seconds() < self.settings.min_interval_seconds:
            raise CronError(f"That schedule runs more often than every {self.settings.min_interval_seconds} "
                            "seconds, the shortest interval allowed here.")
        if job.deliver in ("origin", "home"):
            return
        target = parse_target(job.deliver) if ":" in job.deliver else None
        if target is None or not target.chat_id:
            raise CronError(f"Invalid deliver {job.deliver!r}: use 'origin', 'home', "
                            "<platform>:<chat_id>[:<thread_id>] or callback:<name>.")
        if actor is not None and (target.platform, target.chat_id) != (job.origin_platform, job.origin_chat_id):
            raise CronError("Only admins may deliver to another chat; leave 'deliver' unset to post here.")
        if target.platform == "callback" and target.chat_id not in self.cfg.platforms.callback.targets:
            raise CronError(f"No callback target named {target.chat_id!r} is configured.")
        if target.platform not in self.adapters:
            raise CronError(f"The {target.platform} platform is not running on this gateway.")

    async def create(self, job: CronJob, actor: str | None) -> CronJob:
        """Store and schedule a new job."""
        self._validate(job, actor)
        if actor is not None and await self.jobs.count_owned(job.owner) >= self.settings.max_jobs_per_user:
            raise CronError(f"You already have {self.settings.max_jobs_per_user} scheduled jobs, the limit; "
                            "remove one first.")
        now = self.clock()
        job = replace(job, state="active", fires=0, created_at=now, updated_at=now,
                      next_fire_at=first_fire(job.schedule, job.zone, now))
        created = await self.jobs.create(job)
        self._put(created)
        logger.info("cron job %s created by %s: %s", created.id, created.owner, created.schedule.describe())
        return created

    async def list_jobs(self, actor: str | None) -> list[CronJob]:
        """The actor's jobs (all for None)."""
        return await self.jobs.list(actor)

    async def get(self, job_id: str, actor: str | None) -> CronJob | None:
        """One of the actor's jobs."""
        return await self.jobs.get(job_id, actor)

    async def update(self, job: CronJob, actor: str | None) -> CronJob | None:
        """Save edited settings; a new schedule or zone recomputes the next fire time."""
        current = await self.jobs.get(job.id, actor)
        if current is None:
            return None
        self._validate(job, actor)
        if job.repeat is not None and job.repeat <= current.fires:
            raise CronError(f"The job already ran {current.fires} times; set repeat above that, or remove it.")
        if (job.schedule, job.timezone) != (current.schedule, current.timezone):
            job = replace(job, next_fire_at=first_fire(job.schedule, job.zone, self.clock()))
        else:
            job = replace(job, next_fire_at=current.next_fire_at)
        saved = await self.jobs.save_settings(job, actor)
        self._put(saved)
        return saved

    async def pause(self, job_id: str, actor: str | None) -> CronJob | None:
        """Stop firing until resumed."""
        job = await self.jobs.pause(job_id, actor)
        self._put(job)
        return job

    async def resume(self, job_id: str, actor: str | None) -> CronJob | None:
        """Fire again from the next scheduled time."""
        job = await self.jobs.resume(job_id, actor, self.clock())
        self._put(job)
        return job

    async def remove(self, job_id: str, actor: str | None) -> bool:
        """Delete the job."""
        removed = await self.jobs.delete(job_id, actor)
        if removed:
            self._drop(job_id)
        return removed

    async def run_now(self, job_id: str, actor: str | None) -> str | None:
        """Fire once now, outside the schedule (not counted against ``repeat``); returns the run id."""
        job = await self.jobs.get(job_id, actor)
        if job is None:
            return None
        accepted = await self._claim(job, self.clock(), "manual")
        return accepted.run_id if accepted else None


class StoreCronBackend(LoopBridge[CronService]):
    """The ``cronjob`` tool's ``CronBackend``: each call runs on the gateway loop and is waited for."""

    @property
    def default_timezone(self) -> str:
        """The zone for jobs created without one."""
        return self.state.default_timezone

    def create(self, job: CronJob, actor: str | None) -> CronJob:
        """Store and schedule a new job."""
        return self._call(self.state.create(job, actor))

    def list(self, actor: str | None) -> list[CronJob]:
        """The actor's jobs."""
        return self._call(self.state.list_jobs(actor))

    def get(self, job_id: str, actor: str | None) -> CronJob | None:
        """One of the actor's jobs."""
        return self._call(self.state.get(job_id, actor))

    def update(self, job: CronJob, actor: str | None) -> CronJob | None:
        """Save edited settings."""
        return self._call(self.state.update(job, actor))

    def pause(self, job_id: str, actor: str | None) -> CronJob | None:
        """Stop firing."""
        return self._call(self.state.pause(job_id, actor))

    def resume(self, job_id: str, actor: str | None) -> CronJob | None:
        """Fire again."""
        return self._call(self.state.resume(job_id, actor))

    def remove(self, job_id: str, actor: str | None) -> bool:
        """Delete the job."""
        return self._call(self.state.remove(job_id, actor))

    def run_now(self, job_id: str, actor: str | None) -> str | None:
        """Fire once now."""
        return self._call(self.state.run_now(job_id, actor))

