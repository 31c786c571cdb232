"""Scheduler decisions that ``make mutate`` found unpinned: each test names the mutants of ``gateway/cron.py`` it
kills. ``plan_fire`` and ``fire_event_id`` are pure: every clock is explicit. The service runs in this process
against a SQLite store, its inbox the store's own (each fire accepted once by its dedupe key), its clock fixed
years ahead of the real one so that APScheduler fires nothing by itself while a test runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway.config import parse_config
from gateway.cron import CronService, fire_event_id, plan_fire
from gateway.cron_store import CronStore
from gateway.metrics import Metrics
from gateway.outbox import OutboxSender
from gateway.runs import RunJob
from gateway.store import RunCompletion, Store
from platforms.base import Accepted, MessageEvent
from tools.cronjob_tools import CronJob, parse_schedule, resolve_timezone

T0 = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)


def _job(schedule: str, *, tz: str = "UTC", next_at: datetime | None = T0, **fields: Any) -> CronJob:
    job = CronJob(id="j1", owner="telegram:1", prompt="p", schedule=parse_schedule(schedule, resolve_timezone(tz),
                                                                                    T0 - timedelta(days=1)),
                  timezone=tz, origin_platform="telegram", origin_chat_id="100", **fields)
    job.next_fire_at = next_at
    return job


def test_the_same_fire_has_the_same_id_and_a_manual_run_another() -> None:
    """Kills fire_event_id's ``manual: bool = True``, ``'run:' if (manual) and False`` / ``or True``, the
    ``run:`` text mutated and ``else 'XXXX'`` (ids that would not dedupe a fire, or collide with a manual run)."""
    assert fire_event_id("j1", T0) == "j1:2026-12-03T12:00:00+00:00"
    assert fire_event_id("j1", T0, manual=True) == "j1:run:2026-12-03T12:00:00+00:00"


def test_a_fire_due_exactly_now_is_on_time() -> None:
    """Kills plan_fire's ``moment < now`` (a job due this very second not fired) and ``FirePlan(None, None)``
    for a job not due (its next time forgotten)."""
    job = _job("every 1h")
    plan = plan_fire(job, T0, 3600, 0.0)
    assert (plan.fire_for, plan.next_at, plan.misfire) == (T0, T0 + timedelta(hours=1), None)
    early = plan_fire(job, T0 - timedelta(seconds=1), 3600, 0.0)
    assert (early.fire_for, early.next_at) == (None, T0)


def test_the_on_time_window_and_the_grace_period_are_inclusive() -> None:
    """Kills plan_fire's ``total_seconds() < tolerance`` and ``< grace_seconds``."""
    job = _job("every 1h")
    on_time = plan_fire(job, T0 + timedelta(seconds=60), 3600, 60.0)
    assert on_time.fire_for == T0 and on_time.misfire is None
    graced = plan_fire(job, T0 + timedelta(seconds=120), 120, 60.0)
    assert graced.fire_for == T0 and graced.misfire is not None and graced.misfire["action"] == "ran_once"


def test_a_local_time_schedule_runs_in_the_jobs_zone() -> None:
    """Kills plan_fire's ``schedule.trigger(None)`` (the next time computed in UTC instead of the job's zone)."""
    job = _job("0 9 * * *", tz="Asia/Tokyo", next_at=datetime(2026, 12, 3, 0, 0, tzinfo=UTC))  # 09:00 in Tokyo
    plan = plan_fire(job, datetime(2026, 12, 3, 0, 0, 30, tzinfo=UTC), 3600, 60.0)
    assert plan.fire_for == datetime(2026, 12, 3, 0, 0, tzinfo=UTC)
    assert plan.next_at == datetime(2026, 12, 4, 0, 0, tzinfo=UTC)


def test_a_misfire_record_says_what_was_missed() -> None:
    """Kills plan_fire's record mutants (its keys misspelt, ``missed[+1]`` / ``missed[-2]`` for the last)."""
    job = _job("every 1h", misfire="run_once")
    now = T0 + timedelta(hours=2, minutes=30)
    plan = plan_fire(job, now, 3600, 0.0)
    assert plan.fire_for == T0 + timedelta(hours=2)
    assert plan.misfire == {"policy": "run_once", "action": "ran_once", "missed": 3,
                            "first": "2026-12-03T12:00:00+00:00", "last": "2026-12-03T14:00:00+00:00",
                            "at": "2026-12-03T14:30:00+00:00"}


def test_more_missed_times_than_enumerated_jump_past_now() -> None:
    """Kills plan_fire's ``len(times) <= _MAX_MISSED`` and the jump's mutants (``moment = None``, the trigger's
    arguments, ``moment < now`` and the step after a time that is exactly now)."""
    job = _job("every 1s", misfire="skip")
    now = T0 + timedelta(seconds=20_000)
    plan = plan_fire(job, now, 3600, 0.0)
    assert plan.misfire is not None and plan.misfire["missed"] == 10_000
    assert plan.next_at == now + timedelta(seconds=1)
    later = plan_fire(job, now + timedelta(microseconds=500_000), 3600, 0.0)
    assert later.next_at == now + timedelta(seconds=1)


def test_a_time_due_exactly_now_after_the_enumerated_ones_is_jumped_past_too() -> None:
    """10,000 missed times of a 1 s job and the next one exactly now: the jump goes past now, as for any later now.

    Kills plan_fire's ``moment < now`` for the jump (the next time left at now)."""
    job = _job("every 1s", misfire="skip")
    now = T0 + timedelta(seconds=10_000)
    plan = plan_fire(job, now, 3600, 0.0)
    assert plan.misfire is not None and plan.misfire["missed"] == 10_000
    assert plan.next_at == now + timedelta(seconds=1)


# -- the service: catch-up at start, run requests, fires ---------------------------------------------------------

LATER = datetime(2031, 1, 6, 0, 0, 0, tzinfo=UTC)  # 09:00 in Tokyo; years after the real clock


class _Inbox:
    """The router's part for cron events: each stored once under ``cron:<event id>``; a repeat is a duplicate."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.events: list[MessageEvent] = []
        self.on_offer: dict[str, Any] = {}  # event id -> a coroutine function run as that event is offered

    @property
    def offered(self) -> list[str]:
        return [event.event_id for event in self.events]

    async def __call__(self, event: MessageEvent) -> Accepted:
        self.events.append(event)
        if (hook := self.on_offer.get(event.event_id)) is not None:
            await hook()
        accepted = await self.store.accept(f"cron:{event.event_id}", "cron", "cron", f"cron:{event.chat_id}",
                                           {"text": event.text})
        return Accepted(accepted.run_id, accepted.duplicate)


class _Cron:
    """A CronService on a fixed clock, and what it offered and counted."""

    def __init__(self, store: Store) -> None:
        self.store, self.jobs, self.inbox, self.metrics = store, CronStore(store), _Inbox(store), Metrics()
        self.now = LATER
        self.service = CronService(parse_config({}), store, self.inbox, OutboxSender(store, {}, self.metrics), {},
                                   self.metrics, clock=lambda: self.now)

    async def job(self, schedule: str, due: datetime, *, tz: str = "UTC", **fields: Any) -> CronJob:
        job = CronJob(id="", owner="telegram:1", prompt="p", schedule=parse_schedule(schedule, resolve_timezone(tz),
                                                                                     due - timedelta(days=1)),
                      timezone=tz, origin_platform="telegram", origin_chat_id="100", **fields)
        job.next_fire_at = due
        return await self.jobs.create(job)

    async def claimed_before_a_crash(self, job: CronJob) -> None:
        """The fire of the job's due time accepted, the job not advanced (the gateway died in between)."""
        assert job.next_fire_at is not None
        await self.inbox(MessageEvent(platform="cron", event_id=fire_event_id(job.id, job.next_fire_at),
                                      chat_id=job.id, chat_type="channel", user_id=job.owner, user_name=None,
                                      text=job.prompt))
        self.inbox.events.clear()

    def fires(self, trigger: str) -> float:
        return self.metrics.registry.get_sample_value("hermes_cron_fires_total", {"trigger": trigger}) or 0.0


@pytest.fixture
async def cron(store: Store) -> AsyncIterator[_Cron]:
    env = _Cron(store)
    yield env
    await env.service.stop()


async def test_a_fire_claimed_before_a_crash_is_finished_at_start_and_not_run_again(cron: _Cron) -> None:
    """A daily 09:00 Tokyo job whose fire was claimed, the gateway dying before it moved the job on: at start the
    job is moved to the next 09:00 in Tokyo and counts the fire, which is offered again only as a duplicate (no
    second run) and is no misfire.

    Kills _catch_up's ``fire_claimed(None)`` and ``fire_event_id(None, ...)`` (the claim not found: the time
    replayed as a misfire), ``trigger = None`` / ``trigger(None)`` (the next time in UTC), and the claimed fire's
    ``_apply`` mutants: ``advanced = None``, ``_apply(None, ...)``, ``_apply(job, None, ...)``, arguments left
    out, ``FirePlan(None, ...)`` (the fire not counted), ``FirePlan(due, None)`` / ``FirePlan(next)`` (the job
    ended) and ``next_fire(None, ...)`` / ``next_fire(trigger, None)`` / arguments left out."""
    job = await cron.job("0 9 * * *", LATER, tz="Asia/Tokyo")
    await cron.claimed_before_a_crash(job)
    cron.now = LATER + timedelta(minutes=30)
    await cron.service.start()
    stored = await cron.jobs.get(job.id)
    assert stored is not None
    assert (stored.state, stored.fires, stored.last_fire_at) == ("active", 1, LATER)
    assert stored.next_fire_at == LATER + timedelta(days=1) and stored.last_misfire is None
    assert cron.inbox.offered == [fire_event_id(job.id, LATER)]
    assert cron.fires("scheduled") == cron.fires("catch_up") == 0


async def test_after_finishing_a_claimed_fire_the_times_missed_since_are_caught_up(cron: _Cron) -> None:
    """An hourly job claimed at T, the gateway back at T+2h+0.5s: the claimed fire is finished (T), then the two
    times missed since go by the misfire policy: one run for the latest (T+2h), the other recorded as missed.

    Kills _catch_up's condition mutants that stop after the claimed fire (``advanced is not None``,
    ``state == "active"``, ``!= "XXactiveXX"`` / ``"ACTIVE"``, ``next_fire_at is not None``), ``job = None``,
    the catch-up's trigger label (``None``, ``"XXcatch_upXX"``, ``"CATCH_UP"``) and its tolerance ``1.0``
    (T+2h, half a second old at start, taken as on time: one missed time instead of two)."""
    job = await cron.job("every 1h", LATER)
    await cron.claimed_before_a_crash(job)
    cron.now = LATER + timedelta(hours=2, milliseconds=500)
    await cron.service.start()
    stored = await cron.jobs.get(job.id)
    assert stored is not None and stored.last_misfire is not None
    assert (stored.fires, stored.last_fire_at, stored.next_fire_at) == (2, LATER + timedelta(hours=2),
                                                                        LATER + timedelta(hours=3))
    assert (stored.last_misfire["action"], stored.last_misfire["missed"]) == ("ran_once", 2)
    assert cron.inbox.offered == [fire_event_id(job.id, LATER), fire_event_id(job.id, LATER + timedelta(hours=2))]
    assert cron.fires("catch_up") == 1


async def test_a_time_due_exactly_at_start_after_a_claimed_fire_is_fired_then(cron: _Cron) -> None:
    """Claimed at T, back at exactly T+1h: the next time is due now and is fired at start, on time.

    Kills _catch_up's ``advanced.next_fire_at >= now`` (a time due this very moment left to the scheduler)."""
    job = await cron.job("every 1h", LATER)
    await cron.claimed_before_a_crash(job)
    cron.now = LATER + timedelta(hours=1)
    await cron.service.start()
    stored = await cron.jobs.get(job.id)
    assert stored is not None and (stored.fires, stored.last_misfire) == (2, None)
    assert cron.inbox.offered[-1] == fire_event_id(job.id, LATER + timedelta(hours=1))


async def test_a_job_paused_while_its_claimed_fire_is_finished_is_not_caught_up(cron: _Cron) -> None:
    """Claimed at T, back at T+2.5h; as the claimed fire is offered again the owner pauses the job (another
    process): the missed times after it are not run.

    Kills _catch_up's ``advanced is None and advanced.state != "active"`` and ``state != "active" and
    next_fire_at is None`` (a paused job with a due time caught up, a run it was paused to stop)."""
    job = await cron.job("every 1h", LATER)
    await cron.claimed_before_a_crash(job)

    async def pause() -> None:
        await cron.jobs.pause(job.id, None)

    cron.inbox.on_offer[fire_event_id(job.id, LATER)] = pause
    cron.now = LATER + timedelta(hours=2, minutes=30)
    await cron.service.start()
    stored = await cron.jobs.get(job.id)
    assert stored is not None and stored.state == "paused"
    assert cron.inbox.offered == [fire_event_id(job.id, LATER)]


async def test_a_requested_run_is_claimed_as_manual_and_the_request_forgotten(cron: _Cron) -> None:
    """``hermes-gateway cron run`` leaves a request in the store; the scheduler's start fires it once, under the
    manual run's own event id (never a scheduled fire's), counts it as manual and clears the request.

    Kills _run_requested's trigger mutants (``None``, ``"XXmanualXX"``, ``"MANUAL"``: the scheduled fire's id)
    and ``clear_run_request(None, ...)`` / ``(job.id, None)`` / arguments left out (the request left behind)."""
    job = await cron.job("every 1h", LATER + timedelta(hours=1))
    asked = LATER - timedelta(seconds=5)
    await cron.jobs.request_run(job.id, None, asked)
    await cron.service.start()
    assert cron.inbox.offered == [fire_event_id(job.id, asked, manual=True)]
    assert cron.fires("manual") == 1
    stored = await cron.jobs.get(job.id)
    assert stored is not None and stored.run_requested_at is None and stored.fires == 0


async def test_a_fire_for_a_job_gone_or_paused_meanwhile_does_nothing(cron: _Cron) -> None:
    """APScheduler may call a fire for a job removed or paused since it was scheduled: nothing is offered.

    Kills _fire's ``job is None and job.state != "active"`` (a removed job's fire raising) and
    ``job.state != "active" and job.next_fire_at is None`` (a paused job fired)."""
    job = await cron.job("every 1h", LATER)
    cron.now = LATER - timedelta(minutes=1)
    await cron.service.start()
    await cron.service.pause(job.id, None)
    cron.now = LATER + timedelta(seconds=1)
    await cron.service._fire(job.id)
    await cron.service._fire("no-such-job")
    assert cron.inbox.offered == []
    stored = await cron.jobs.get(job.id)
    assert stored is not None and (stored.fires, stored.next_fire_at) == (0, LATER)


async def test_a_fire_offers_the_jobs_prompt_for_its_target_and_measures_its_lag(cron: _Cron) -> None:
    """A scheduled fire 30 s late is one cron event: the job's prompt from its owner (the job's name as the user
    name), its job, time and target (a topic of another chat) in the metadata; the 30 s go to the lag histogram,
    and the next fire, exactly on time, adds none.

    Kills _claim's event mutants (``chat_type``, ``user_name=None`` / ``job.name and None``, the metadata's keys
    and values, ``target_thread_id`` left out), ``trigger != "scheduled"`` for the lag and its ``max(1.0, ...)``
    / ``max(None, ...)`` / ``clock() + scheduled_for`` mutants."""
    job = await cron.job("every 1h", LATER, name="daily digest", deliver="telegram:200:7")
    cron.now = LATER - timedelta(minutes=1)
    await cron.service.start()
    cron.now = LATER + timedelta(seconds=30)
    await cron.service._fire(job.id)
    (event,) = cron.inbox.events
    assert (event.platform, event.event_id, event.chat_id, event.chat_type) == (
        "cron", fire_event_id(job.id, LATER), job.id, "channel")
    assert (event.user_id, event.user_name, event.text) == ("telegram:1", "daily digest", "p")
    assert event.metadata == {"job_id": job.id, "scheduled_for": "2031-01-06T00:00:00+00:00",
                              "target_platform": "telegram", "target_chat_id": "200", "target_thread_id": "7"}
    cron.now = LATER + timedelta(hours=1)  # the next one exactly on time: no lag
    await cron.service._fire(job.id)
    registry = cron.metrics.registry
    assert registry.get_sample_value("hermes_cron_fire_lag_seconds_sum") == 30.0
    assert registry.get_sample_value("hermes_cron_fire_lag_seconds_count") == 2.0
    assert cron.fires("scheduled") == 2


async def test_an_unnamed_job_fires_without_a_user_name_or_a_topic(cron: _Cron) -> None:
    """Kills _claim's ``user_name=job.name or None`` mutants that give an empty name, ``if target.thread_id``
    inverted (a topic key for a chat without topics) and ``fire_event_id(..., None)`` / ``trigger == "MANUAL"``
    (a manual run under the scheduled fire's id). A manual run is not a scheduled fire: no lag recorded."""
    job = await cron.job("every 1h", LATER + timedelta(hours=1))
    await cron.service.start()
    await cron.service.run_now(job.id, None)
    (event,) = cron.inbox.events
    assert event.event_id == fire_event_id(job.id, LATER, manual=True)
    assert event.user_name is None and "target_thread_id" not in event.metadata
    assert event.metadata["target_chat_id"] == "100"
    assert cron.metrics.registry.get_sample_value("hermes_cron_fire_lag_seconds_count") == 0.0
    assert cron.fires("manual") == 1



def _run(job_id: str, run_id: str = "r1") -> RunJob:
    event = MessageEvent(platform="cron", event_id=f"{job_id}:x", chat_id=job_id, chat_type="channel",
                         user_id="telegram:1", user_name=None, text="p", metadata={"job_id": job_id})
    return RunJob(inbox_id=1, run_id=run_id, kind="cron", source="cron", session_key=f"cron:{job_id}", event=event,
                  toolsets=[], target=None, history=False)


async def test_which_cron_answers_are_delivered(cron: _Cron) -> None:
    """Failures are not sent to the chat, an ``on_change`` job's unchanged answer is not either; a job's last run
    (done, or gone from the scheduler) is always reported.

    Kills should_deliver's mutants: the ``job_id`` key, ``state == "done"`` and ``status != "completed"``
    mutated, ``return True`` / ``False`` swapped, the ``on_change`` test (``or``, ``!=``, its wording)."""
    always = await cron.job("every 1h", LATER + timedelta(hours=1))
    on_change = await cron.job("every 1h", LATER + timedelta(hours=1), notify="on_change", last_result="same")
    last = await cron.job("every 1h", LATER + timedelta(hours=1), state="done", fires=3)
    await cron.service.start()

    async def delivered(job_id: str, status: str, result: str | None = None) -> bool:
        return await cron.service.should_deliver(_run(job_id), RunCompletion("r1", 1, status, result=result))

    assert await delivered(always.id, "completed", "an answer")
    assert not await delivered(always.id, "failed")
    assert not await delivered(on_change.id, "completed", "same")
    assert await delivered(on_change.id, "completed", "new")
    assert not await delivered(on_change.id, "failed")
    assert await delivered(last.id, "failed")
    assert await delivered("gone", "failed")


async def test_a_run_outcome_is_recorded_on_its_job(cron: _Cron) -> None:
    """A delivered answer becomes the job's last result (what ``on_change`` compares); an answer not delivered
    or a failure leaves it; failures are counted.

    Kills run_finished's ``job_id`` key, ``result = done.result if delivered or ...`` / ``and ... != ...``,
    ``record_run`` arguments (``None`` or left out) and ``status == "failed"`` for the failure counter."""
    job = await cron.job("every 1h", LATER + timedelta(hours=1), notify="on_change")
    await cron.service.start()
    service = cron.service
    await service.run_finished(_run(job.id, "r1"), RunCompletion("r1", 1, "completed", result="first"), True)
    await service.run_finished(_run(job.id, "r2"), RunCompletion("r2", 1, "completed", result="muted"), False)
    stored = await cron.jobs.get(job.id)
    assert stored is not None and (stored.last_run_id, stored.last_status, stored.last_result) == (
        "r2", "completed", "first")
    await service.run_finished(_run(job.id, "r3"), RunCompletion("r3", 1, "failed", error="boom"), True)
    stored = await cron.jobs.get(job.id)
    assert stored is not None
    assert (stored.last_status, stored.last_error, stored.last_result, stored.consecutive_failures) == (
        "failed", "boom", "first", 1)
    assert cron.metrics.registry.get_sample_value("hermes_cron_failures_total") == 1.0
    assert not await service.should_deliver(_run(job.id), RunCompletion("r4", 1, "completed", result="first"))


async def test_repeated_failures_pause_the_job_and_the_owner_is_told_why(cron: _Cron) -> None:
    """The third failure in a row pauses the job; the owner's notice carries the last run's error (its answer,
    when a failed run left one).

    Resumed and paused again, the owner is told again (the notice is keyed by the run that paused the job); a
    failure with no error and no answer says nothing after "Last error:".

    Kills run_finished's ``max_consecutive_failures`` argument mutated, ``if paused`` inverted, the notice's run
    id ``None`` (the second notice deduplicated away) and its reason (``done.result and done.error``,
    ``done.error and ""``, ``or "XXXX"``)."""
    job = await cron.job("every 1h", LATER + timedelta(hours=1), name="digest")
    await cron.service.start()
    for n in range(1, 3):
        await cron.service.run_finished(_run(job.id, f"r{n}"), RunCompletion(f"r{n}", 1, "failed", error="boom"),
                                        True)
    assert (await cron.store.outbox_rows()) == []
    await cron.service.run_finished(_run(job.id, "r3"), RunCompletion("r3", 1, "failed", error="quota exceeded"),
                                    True)
    stored = await cron.jobs.get(job.id)
    assert stored is not None and stored.state == "paused"
    (notice,) = await cron.store.outbox_rows()
    assert (notice.platform, notice.chat_id) == ("telegram", "100")
    assert "is paused" in notice.text and "Last error: quota exceeded\n" in notice.text
    await cron.service.resume(job.id, None)  # paused again later: told again
    for n in range(4, 7):
        await cron.service.run_finished(_run(job.id, f"r{n}"), RunCompletion(f"r{n}", 1, "failed"), True)
    first, second = await cron.store.outbox_rows()
    assert first.text == notice.text and "Last error: \nResume it" in second.text


async def test_the_last_run_of_a_finished_job_removes_it(cron: _Cron) -> None:
    """A job that is done (its last fire claimed) is removed when that run finishes, whether the scheduler has it
    cached or not. Kills run_finished's ``cached.state == "done"`` mutants and ``_delete_finished`` left out."""
    done = await cron.job("every 1h", LATER + timedelta(hours=1), state="done", fires=1)
    await cron.service.start()
    await cron.service.run_finished(_run(done.id), RunCompletion("r1", 1, "completed", result="x"), True)
    assert await cron.jobs.get(done.id) is None
    assert cron.service._cache.get(done.id) is None



async def test_a_fire_late_past_the_on_time_window_runs_once_within_the_grace(cron: _Cron) -> None:
    """A fire that comes 10 min late (the host slept) is a misfire: run once, recorded, within the grace period.
    After it the scheduler holds the job's next time, and a pause takes the job out of it.

    Kills _fire's ``plan_fire(..., None, ...)`` (no grace: the fire fails), ``_firing.pop(None, None)`` (the job
    left marked as firing: never rescheduled), ``pop(None)``, ``_cache.get(None)`` / ``is None`` /
    ``_schedule(None)`` (not rescheduled after the fire) and _schedule's ``next_run_time != ...``."""
    job = await cron.job("every 1h", LATER)
    cron.now = LATER - timedelta(minutes=1)
    await cron.service.start()
    cron.now = LATER + timedelta(minutes=10)
    await cron.service._fire(job.id)
    stored = await cron.jobs.get(job.id)
    assert stored is not None and stored.last_misfire is not None
    assert (stored.fires, stored.last_misfire["action"]) == (1, "ran_once")
    assert cron.inbox.offered == [fire_event_id(job.id, LATER)]
    scheduled = cron.service._scheduler.get_job(job.id)
    assert scheduled is not None and scheduled.next_run_time == LATER + timedelta(hours=1)
    await cron.service.pause(job.id, None)
    assert cron.service._scheduler.get_job(job.id) is None


async def test_the_scheduler_holds_each_active_job_once_at_its_time_in_its_zone(cron: _Cron) -> None:
    """Each active job is one APScheduler job under the job's id, at its stored next time, with the job's own
    trigger in its zone; a late wake-up still fires it (misfires are plan_fire's to decide), once, never two at
    a time. Paused and finished jobs are not scheduled.

    Kills _schedule's ``add_job`` mutants (``trigger`` ``None`` / ``trigger(None)`` / left out, ``id=None``,
    ``next_run_time`` left out, ``misfire_grace_time``, ``coalesce`` and ``max_instances`` changed or left out),
    ``state != "active" and next_fire_at is None``, ``current = None`` / ``get_job(None)`` and ``current is None``
    (a paused job left scheduled) and ``replace_existing`` ``False`` / ``None`` / left out (a rescheduled job
    refused)."""
    tokyo = await cron.job("0 9 * * *", LATER + timedelta(days=1), tz="Asia/Tokyo")
    paused = await cron.job("every 1h", LATER + timedelta(hours=1))
    await cron.jobs.pause(paused.id, None)
    done = await cron.job("every 1h", LATER + timedelta(hours=1), state="done")
    await cron.service.start()
    scheduled = cron.service._scheduler.get_job(tokyo.id)
    assert scheduled is not None and scheduled.args == (tokyo.id,)
    assert scheduled.next_run_time == LATER + timedelta(days=1)
    assert str(scheduled.trigger.timezone) == "Asia/Tokyo"
    assert (scheduled.misfire_grace_time, scheduled.coalesce, scheduled.max_instances) == (None, True, 1)
    assert cron.service._scheduler.get_job(paused.id) is None and cron.service._scheduler.get_job(done.id) is None
    resumed = await cron.service.resume(paused.id, None)
    assert resumed is not None and cron.service._scheduler.get_job(paused.id) is not None
    cron.now = LATER + timedelta(days=1)
    await cron.service._fire(tokyo.id)  # moves the job on: rescheduled under the same id
    scheduled = cron.service._scheduler.get_job(tokyo.id)
    assert scheduled is not None and scheduled.next_run_time == LATER + timedelta(days=2)
    await cron.service.pause(tokyo.id, None)
    assert cron.service._scheduler.get_job(tokyo.id) is None


async def test_a_job_finished_elsewhere_is_removed_when_its_run_ends(cron: _Cron) -> None:
    """The scheduler's copy still says active, the store says done (its last fire claimed by another replica):
    the run's end removes the job. Kills run_finished's ``cron_job.state == "XXdoneXX"`` / ``"DONE"`` and
    ``_delete_finished(None)``."""
    job = await cron.job("every 1h", LATER + timedelta(hours=1))
    await cron.service.start()
    assert await cron.jobs.advance(job, None, LATER + timedelta(hours=1), None) is not None  # its last fire
    await cron.service.run_finished(_run(job.id), RunCompletion("r1", 1, "completed", result="x"), True)
    assert await cron.jobs.get(job.id) is None


async def test_stop_lets_a_fire_in_flight_finish_its_bookkeeping(cron: _Cron) -> None:
    """A fire held up in the inbox when the gateway stops: stop waits for it, and the job is moved on.

    Kills _fire's ``_firing[job_id] = None`` (stop, handed no task to wait for, fails)."""
    job = await cron.job("every 1h", LATER)
    cron.now = LATER - timedelta(minutes=1)
    await cron.service.start()
    entered, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        entered.set()
        await release.wait()

    cron.inbox.on_offer[fire_event_id(job.id, LATER)] = hold
    cron.now = LATER
    fire = asyncio.create_task(cron.service._fire(job.id))
    await entered.wait()
    stopping = asyncio.create_task(cron.service.stop())
    await asyncio.sleep(0.1)
    assert not stopping.done()
    release.set()
    await asyncio.wait_for(stopping, 5)
    await fire
    stored = await cron.jobs.get(job.id)
    assert stored is not None and (stored.fires, stored.next_fire_at) == (1, LATER + timedelta(hours=1))
