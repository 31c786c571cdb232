"""Cron store rules that ``make mutate`` found unpinned: each test names the mutants of ``gateway/cron_store.py``
it kills. The store is SQLite; every clock is explicit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway.cron_store import CronStore, resume_time
from gateway.store import Store
from tools.cronjob_tools import CronJob, parse_schedule, resolve_timezone

NOW = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def jobs(store: Store) -> CronStore:
    return CronStore(store)


def _job(schedule: str = "every 1h", *, owner: str = "telegram:1", **fields: Any) -> CronJob:
    parsed = parse_schedule(schedule, resolve_timezone("UTC"), NOW)
    job = CronJob(id="", owner=owner, prompt="p", schedule=parsed, timezone="UTC", origin_platform="telegram",
                  origin_chat_id="100", **fields)
    job.next_fire_at = NOW + timedelta(hours=1)
    return job


async def test_advance_refuses_a_stale_copy_and_records_the_fire(jobs: CronStore) -> None:
    """Kills advance's compare-and-set mutants (the ``next_fire_at`` condition dropped: two schedulers would
    both fire), ``fired_for is None``, ``last_fire_at = None`` / ``_ts(None)``, ``misfire is None`` and
    ``last_misfire = None`` / ``json.dumps(None)``."""
    job = await jobs.create(_job())
    due = job.next_fire_at
    assert due is not None
    moved = await jobs.advance(job, due + timedelta(hours=1), due, {"skipped": 2})
    assert moved is not None and moved.fires == 1
    assert (moved.last_fire_at, moved.last_misfire) == (due, {"skipped": 2})
    assert await jobs.advance(job, due + timedelta(hours=1), due, None) is None  # the copy read before
    quiet = await jobs.advance(moved, due + timedelta(hours=2), None, None)
    assert quiet is not None and quiet.fires == 1 and quiet.last_fire_at == due and quiet.last_misfire == {
        "skipped": 2}


async def test_a_failure_count_pauses_an_active_job_once(jobs: CronStore) -> None:
    """Kills record_run's mutants: ``consecutive_failures`` not reset (``1 if ok``, ``if (ok) and False``), the
    pause's ``id`` condition dropped (another job paused) and ``reason[:2001]``. (The pause racing the owner's:
    test_a_failure_does_not_override_a_pause_that_came_first.)"""
    job = await jobs.create(_job())
    other = await jobs.create(_job())
    first, paused = await jobs.record_run(job.id, "r1", "failed", "boom", None, max_failures=2)
    assert not paused and first is not None and (first.consecutive_failures, first.last_error) == (1, "boom")
    good, paused = await jobs.record_run(job.id, "r2", "completed", None, "the answer", max_failures=2)
    assert not paused and good is not None
    assert (good.consecutive_failures, good.last_error, good.last_result) == (0, None, "the answer")
    await jobs.record_run(job.id, "r3", "failed", "x" * 3000, None, max_failures=2)
    last, paused = await jobs.record_run(job.id, "r4", "failed", "x" * 3000, None, max_failures=2)
    assert paused and last is not None and last.state == "paused"
    assert last.paused_reason is not None and len(last.paused_reason) == 2000
    again, paused = await jobs.record_run(job.id, "r5", "failed", "again", None, max_failures=2)
    assert not paused and again is not None and again.state == "paused"
    untouched = await jobs.get(other.id)
    assert untouched is not None and untouched.state == "active"


async def test_pause_keeps_the_reason_and_leaves_done_jobs_alone(jobs: CronStore) -> None:
    """Kills pause's ``paused_reason=None`` / left out and the ``state != "done"`` condition dropped or
    mutated."""
    job = await jobs.create(_job())
    paused = await jobs.pause(job.id, None, "the owner left")
    assert paused is not None and (paused.state, paused.paused_reason) == ("paused", "the owner left")
    done = await jobs.create(_job(state="done"))
    assert await jobs.pause(done.id, None) is None


async def test_resume_is_the_owners_and_fires_at_the_next_time(jobs: CronStore) -> None:
    """Kills resume's ``state == "XXdoneXX"`` / ``"DONE"`` (a finished job revived) and ``next_fire_at=None`` /
    ``_ts(None)``. (Its owner check is made twice, by the read and by the write: each alone suffices.)"""
    job = await jobs.create(_job())
    await jobs.pause(job.id, None, "failing")
    assert await jobs.resume(job.id, "telegram:2", NOW) is None
    resumed = await jobs.resume(job.id, "telegram:1", NOW)
    assert resumed is not None and (resumed.state, resumed.paused_reason, resumed.consecutive_failures) == (
        "active", None, 0)
    assert resumed.next_fire_at == resume_time(job, NOW) and resumed.next_fire_at is not None
    done = await jobs.create(_job(state="done"))
    assert await jobs.resume(done.id, None, NOW) is None


def test_a_one_shot_whose_time_passed_resumes_now() -> None:
    """Kills resume_time's mutants (``moment = None``, the ``once`` condition, ``max(None, ...)``,
    ``max(moment, None)``, ``microsecond=None`` / ``1``)."""
    late = _job("in 10 minutes")
    assert resume_time(late, NOW + timedelta(hours=2, microseconds=500)) == NOW + timedelta(hours=2)
    upcoming = _job("in 10 minutes")
    assert resume_time(upcoming, NOW) == NOW + timedelta(minutes=10)
    hourly = _job("every 1h")
    assert resume_time(hourly, NOW + timedelta(minutes=1, microseconds=5)).microsecond == 0


async def test_run_requests_are_the_owners_and_cleared_only_if_unchanged(jobs: CronStore) -> None:
    """Kills request_run's ``_select(job_id, None)``, and clear_run_request's conditions dropped, replaced by
    None or negated and ``run_requested_at`` left out."""
    job = await jobs.create(_job())
    other = await jobs.create(_job())
    assert await jobs.request_run(job.id, "telegram:2", NOW) is None
    first = NOW.replace(microsecond=0)
    assert await jobs.request_run(job.id, "telegram:1", first) is not None
    assert await jobs.request_run(other.id, None, first) is not None
    newer = first + timedelta(seconds=5)
    await jobs.request_run(job.id, None, newer)
    assert await jobs.clear_run_request(job.id, first) is None  # a newer request came in: keep it
    cleared = await jobs.clear_run_request(job.id, newer)
    assert cleared is not None and cleared.run_requested_at is None
    still = await jobs.get(other.id)
    assert still is not None and still.run_requested_at == first


async def test_counting_a_users_jobs(jobs: CronStore) -> None:
    """Kills count_owned's ``where(None)`` and ``owner != owner``."""
    for owner in ("telegram:1", "telegram:1", "telegram:2"):
        await jobs.create(_job(owner=owner))
    assert (await jobs.count_owned("telegram:1"), await jobs.count_owned("telegram:3")) == (2, 0)


async def test_a_fire_is_claimed_once_its_event_is_accepted(store: Store, jobs: CronStore) -> None:
    """Kills fire_claimed's mutants (the query, its condition or the read replaced, the answer negated)."""
    assert not await jobs.fire_claimed("cron:j1:2026-12-03T12:00:00+00:00")
    await store.accept("cron:j1:2026-12-03T12:00:00+00:00", "cron", "cron", "cron:j1", {})
    await store.accept("cron:j2:2026-12-03T12:00:00+00:00", "cron", "cron", "cron:j2", {})
    assert await jobs.fire_claimed("cron:j1:2026-12-03T12:00:00+00:00")
    assert not await jobs.fire_claimed("cron:j3:2026-12-03T12:00:00+00:00")


async def test_resume_replaces_a_next_fire_time_that_passed_while_paused(jobs: CronStore) -> None:
    """A job paused for five hours fires next at its next scheduled time after the resume, not at the time it had
    when it was paused (which the scheduler would take for a missed fire).

    Kills resume's ``next_fire_at=...`` left out of the update."""
    job = await jobs.create(_job())
    stale = await jobs.advance(job, NOW - timedelta(hours=5), None, None)
    assert stale is not None and await jobs.pause(job.id, None) is not None
    resumed = await jobs.resume(job.id, None, NOW)
    assert resumed is not None and resumed.next_fire_at == resume_time(job, NOW) == NOW + timedelta(hours=1)


async def test_recording_a_run_of_a_deleted_job_or_a_success_with_an_error(jobs: CronStore) -> None:
    """Kills record_run's ``job is None and ok or ...`` (a failed run of a job deleted meanwhile raises) and
    ``None if (ok) and False else error`` (a completed run keeps an error text)."""
    assert await jobs.record_run("gone", "r1", "failed", "boom", None, max_failures=1) == (None, False)
    job = await jobs.create(_job())
    done, paused = await jobs.record_run(job.id, "r2", "completed", "a warning", None, max_failures=1)
    assert not paused and done is not None and (done.last_status, done.last_error) == ("completed", None)


async def test_a_failure_does_not_override_a_pause_that_came_first(jobs: CronStore,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner pauses the job between the failure being counted and the automatic pause: the owner's pause
    stands (its reason kept) and the failure does not report pausing it.

    Kills record_run's pause without its ``state == "active"`` condition, and ``(paused, True) if (paused is not
    None) or True`` / ``else (job, True)`` (a pause reported that did not happen)."""
    job = await jobs.create(_job())
    update, writes = jobs._update, []

    async def owner_pauses_after_the_first_write(where: Any, **values: Any) -> CronJob | None:
        result = await update(where, **values)
        writes.append(values)
        if len(writes) == 1:
            await jobs.pause(job.id, "telegram:1", "on holiday")
        return result

    monkeypatch.setattr(jobs, "_update", owner_pauses_after_the_first_write)
    counted, paused = await jobs.record_run(job.id, "r1", "failed", "boom", None, max_failures=1)
    assert not paused and counted is not None and counted.consecutive_failures == 1
    after = await jobs.get(job.id)
    assert after is not None and (after.state, after.paused_reason) == ("paused", "on holiday")
