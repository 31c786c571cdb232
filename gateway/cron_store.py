"""Durable cron job definitions: the ``cron_jobs`` table and async access to it.

The table is in ``gateway.schema``, so ``Store.open`` creates it. Every method that
takes an ``actor`` sees only that user's jobs (None: every job, for admins and operators). Writes
return the row as stored, so callers keep an exact copy; fire bookkeeping is a compare-and-set on
the job's next fire time, so two schedulers can never advance a job twice for one fire.
"""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from gateway.schema import cron_jobs_t, inbox_t
from gateway.store import Store
from tools.cronjob_tools import CronJob, Schedule, first_fire, resolve_timezone

_EDITABLE = ("name", "prompt", "schedule", "timezone", "repeat", "deliver", "notify", "misfire")


def _ts(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


def _dt(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if value is not None else None


def _row_values(job: CronJob) -> dict[str, Any]:
    return {"id": job.id, "owner": job.owner, "name": job.name, "prompt": job.prompt,
            "schedule": json.dumps(job.schedule.to_dict()), "timezone": job.timezone,
            "origin_platform": job.origin_platform, "origin_chat_id": job.origin_chat_id,
            "origin_thread_id": job.origin_thread_id, "session_key": job.session_key, "repeat": job.repeat,
            "deliver": job.deliver, "notify": job.notify, "misfire": job.misfire, "state": job.state,
            "fires": job.fires, "next_fire_at": _ts(job.next_fire_at), "last_fire_at": _ts(job.last_fire_at),
            "last_run_id": job.last_run_id, "last_status": job.last_status, "last_error": job.last_error,
            "last_result": job.last_result, "consecutive_failures": job.consecutive_failures,
            "last_misfire": json.dumps(job.last_misfire) if job.last_misfire else None,
            "paused_reason": job.paused_reason, "run_requested_at": _ts(job.run_requested_at),
            "created_at": job.created_at.timestamp(), "updated_at": job.updated_at.timestamp()}


def _job(r: Any) -> CronJob:
    return CronJob(
        id=r.id, owner=r.owner, prompt=r.prompt, schedule=Schedule.from_dict(json.loads(r.schedule)),
        timezone=r.timezone, origin_platform=r.origin_platform, origin_chat_id=r.origin_chat_id,
        origin_thread_id=r.origin_thread_id, session_key=r.session_key, name=r.name, repeat=r.repeat,
        deliver=r.deliver, notify=r.notify, misfire=r.misfire, state=r.state, fires=r.fires,
        next_fire_at=_dt(r.next_fire_at), last_fire_at=_dt(r.last_fire_at), last_run_id=r.last_run_id,
        last_status=r.last_status, last_error=r.last_error, last_result=r.last_result,
        consecutive_failures=r.consecutive_failures,
        last_misfire=json.loads(r.last_misfire) if r.last_misfire else None, paused_reason=r.paused_reason,
        run_requested_at=_dt(r.run_requested_at), created_at=_dt(r.created_at) or datetime.now(UTC),
        updated_at=_dt(r.updated_at) or datetime.now(UTC))


def resume_time(job: CronJob, now: datetime) -> datetime | None:
    """When a resumed job fires next: its next scheduled time, or now for a one-shot whose time passed."""
    moment = first_fire(job.schedule, resolve_timezone(job.timezone), now)
    return max(moment, now.replace(microsecond=0)) if job.schedule.kind == "once" and moment else moment


class CronStore:
    """Async access to cron jobs on the gateway's database."""

    def __init__(self, store: Store) -> None:
        self.db = store.db

    @staticmethod
    def _select(job_id: str, actor: str | None) -> Any:
        query = cron_jobs_t.c.id == job_id
        return query if actor is None else sa.and_(query, cron_jobs_t.c.owner == actor)

    async def _update(self, where: Any, **values: Any) -> CronJob | None:
        values["updated_at"] = datetime.now(UTC).timestamp()
        update = cron_jobs_t.update().where(where).values(**values).returning(*cron_jobs_t.c)
        row = await self.db.write(lambda conn: conn.execute(update).first())
        return _job(row) if row is not None else None

    async def create(self, job: CronJob) -> CronJob:
        """Insert ``job`` under a new random id; returns the stored job."""
        while True:
            job.id = secrets.token_hex(4)
            insert = cron_jobs_t.insert().values(**_row_values(job))
            try:
                await self.db.write(lambda conn, insert=insert: conn.execute(insert))
                return job
            except IntegrityError:  # an id collision: draw again
                continue

    async def insert_many(self, jobs: list[CronJob]) -> None:
        """Insert jobs that already have ids, in one transaction (imports and benchmarks)."""
        if not jobs:
            return
        rows = [_row_values(j) for j in jobs]
        await self.db.write(lambda conn: conn.execute(cron_jobs_t.insert(), rows))

    async def get(self, job_id: str, actor: str | None = None) -> CronJob | None:
        """One job, or None."""
        query = sa.select(cron_jobs_t).where(self._select(job_id, actor))
        row = await self.db.read(lambda conn: conn.execute(query).first())
        return _job(row) if row is not None else None

    async def list(self, actor: str | None = None) -> list[CronJob]:
        """The actor's jobs (every job for None), oldest first."""
        query = sa.select(cron_jobs_t).order_by(cron_jobs_t.c.created_at, cron_jobs_t.c.id)
        if actor is not None:
            query = query.where(cron_jobs_t.c.owner == actor)
        return [_job(r) for r in await self.db.read(lambda conn: conn.execute(query).all())]

    async def count_owned(self, owner: str) -> int:
        """Number of jobs ``owner`` has."""
        query = sa.select(sa.func.count()).select_from(cron_jobs_t).where(cron_jobs_t.c.owner == owner)
        return int(await self.db.read(lambda conn: conn.execute(query).scalar_one()))

    async def versions(self) -> dict[str, float]:
        """Every job id with its last change time (to notice changes made by other processes)."""
        query = sa.select(cron_jobs_t.c.id, cron_jobs_t.c.updated_at)
        return {r.id: r.updated_at for r in await self.db.read(lambda conn: conn.execute(query).all())}

    async def save_settings(self, job: CronJob, actor: str | None) -> CronJob | None:
        """Write the user-editable fields of ``job`` and its next fire time."""
        values = {k: v for k, v in _row_values(job).items() if k in _EDITABLE}
        return await self._update(self._select(job.id, actor), **values, next_fire_at=_ts(job.next_fire_at))

    async def pause(self, job_id: str, actor: str | None, reason: str | None = None) -> CronJob | None:
        """Stop the job firing (``reason`` says why when the gateway paused it)."""
        return await self._update(sa.and_(self._select(job_id, actor), cron_jobs_t.c.state != "done"),
                                  state="paused", paused_reason=reason)

    async def resume(self, job_id: str, actor: str | None, now: datetime) -> CronJob | None:
        """Let the job fire again from its next scheduled time, with a clean failure count."""
        job = await self.get(job_id, actor)
        if job is None or job.state == "done":
            return None
        return await self._update(self._select(job_id, actor), state="active", paused_reason=None,
                                  consecutive_failures=0, next_fire_at=_ts(resume_time(job, now)))

    async def request_run(self, job_id: str, actor: str | None, at: datetime) -> CronJob | None:
        """Ask whichever gateway runs the scheduler to fire the job once, now."""
        return await self._update(self._select(job_id, actor), run_requested_at=at.timestamp())

    async def clear_run_request(self, job_id: str, requested: datetime) -> CronJob | None:
        """Forget a run request once it was claimed (only if no newer request came in)."""
        return await self._update(sa.and_(cron_jobs_t.c.id == job_id,
                                          cron_jobs_t.c.run_requested_at == requested.timestamp()),
                                  run_requested_at=None)

    async def advance(self, job: CronJob, next_at: datetime | None, fired_for: datetime | None,
                      misfire: dict[str, Any] | None) -> CronJob | None:
        """Move the job past its due time, counting the fire; None when someone else already did.

        The job ends (state ``done``) when its schedule has no next time or ``repeat`` is used up.
        """
        fires = job.fires + (fired_for is not None)
        ended = next_at is None or (job.repeat is not None and fires >= job.repeat)
        values: dict[str, Any] = {"fires": fires, "next_fire_at": None if ended else _ts(next_at)}
        if ended:
            values["state"] = "done"
        if fired_for is not None:
            values["last_fire_at"] = _ts(fired_for)
        if misfire is not None:
            values["last_misfire"] = json.dumps(misfire)
        return await self._update(sa.and_(cron_jobs_t.c.id == job.id,
                                          cron_jobs_t.c.next_fire_at == _ts(job.next_fire_at)), **values)

    async def record_run(self, job_id: str, run_id: str, status: str, error: str | None,
                         delivered_result: str | None, max_failures: int) -> tuple[CronJob | None, bool]:
        """Record a finished run; returns the job and whether this failure paused it."""
        ok = status == "completed"
        values: dict[str, Any] = {
            "last_run_id": run_id, "last_status": status, "last_error": None if ok else error,
            "consecutive_failures": 0 if ok else cron_jobs_t.c.consecutive_failures + 1}
        if delivered_result is not None:
            values["last_result"] = delivered_result
        job = await self._update(cron_jobs_t.c.id == job_id, **values)
        if job is None or ok or job.state != "active" or job.consecutive_failures < max_failures:
            return job, False
        reason = f"paused after {job.consecutive_failures} failed runs in a row; last error: {error}"
        paused = await self._update(sa.and_(cron_jobs_t.c.id == job_id, cron_jobs_t.c.state == "active"),
                                    state="paused", paused_reason=reason[:2000])
        return (paused, True) if paused is not None else (job, False)

    async def delete(self, job_id: str, actor: str | None = None) -> bool:
        """Remove a job."""
        delete = cron_jobs_t.delete().where(self._select(job_id, actor))
        return bool(await self.db.write(lambda conn: conn.execute(delete).rowcount))

    async def fire_claimed(self, dedupe_key: str) -> bool:
        """Whether a fire with this inbox dedupe key was already accepted."""
        query = sa.select(inbox_t.c.id).where(inbox_t.c.dedupe_key == dedupe_key)
        return await self.db.read(lambda conn: conn.execute(query).first()) is not None
