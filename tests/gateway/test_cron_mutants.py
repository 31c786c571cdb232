"""Scheduler decisions that ``make mutate`` found unpinned: each test names the mutants of ``gateway/cron.py`` it
kills. ``plan_fire`` and ``fire_event_id`` are pure: every clock is explicit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from gateway.cron import fire_event_id, plan_fire
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
