"""The ``cronjob`` tool: prompts scheduled from chat (create, list, update, pause, resume, remove, run).

Schedules are parsed into a normalized :class:`Schedule` and evaluated with APScheduler's triggers in
the job's time zone. Storing and firing jobs is the gateway's business, reached through
:class:`CronBackend` (synchronous, called from worker threads); with no backend installed the tool
says that scheduling is unavailable. A job belongs to the user who created it: users see and change
only their own jobs, admins (``is_admin`` in ctx) all of them.
"""

from __future__ import annotations

import difflib
import re
import zoneinfo
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from tools.registry import EFFECT_SCHEDULES, ISOLATION_PROCESS, BackendSlot, registry, tool_error, tool_result

ScheduleKind = Literal["cron", "interval", "once"]
NOTIFY_MODES = ("always", "on_change")
MISFIRE_POLICIES = ("run_once", "skip")
JOB_STATES = ("active", "paused", "done")
MAX_PROMPT_CHARS = 4_000
SCHEDULE_FORMS = (
    "a 5-field cron expression ('0 9 * * 1-5'), 'every 30m' / 'every 2h' / 'every 1d', 'daily at 09:00', "
    "'weekdays at 9:00', 'in 20 minutes' / 'in 2 hours', or an ISO timestamp ('2030-06-01T09:00')"
)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_UNIT = r"(s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?|d|days?|w|weeks?)"
_EVERY = re.compile(rf"every\s+(\d+)?\s*{_UNIT}", re.I)
_IN = re.compile(rf"in\s+(\d+)\s*{_UNIT}", re.I)
_AT = re.compile(r"(daily|every\s+day|weekdays)\s+at\s+([01]?\d|2[0-3]):([0-5]\d)", re.I)
_CRON_FIELD = re.compile(r"[0-9A-Za-z*/,?-]+")
# APScheduler 3 numbers weekdays from Monday (0) while crontab numbers them from Sunday (0 or 7),
# so a numeric day-of-week field is rewritten as weekday names before it reaches the trigger.
_DOW_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_DOW_ORDER = (1, 2, 3, 4, 5, 6, 0)


class CronError(ValueError):
    """A schedule, time zone or job request the user must fix; the message says how."""


# -- time zones and schedules -----------------------------------------------

def resolve_timezone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA zone ``name``; CronError (with a suggestion) when it is unknown."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (ValueError, KeyError, OSError):
        close = difflib.get_close_matches(name, sorted(zoneinfo.available_timezones()), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise CronError(f"Unknown time zone {name!r}.{hint} Use an IANA name such as 'Europe/Berlin' "
                        "or 'UTC'.") from None


class _WallClockCronTrigger(BaseTrigger):
    """A crontab trigger matched on the zone's wall clock.

    APScheduler 3's CronTrigger adds wall-clock differences in UTC, so across a DST change it can skip
    days or months (agronholm/apscheduler#529: a midnight monthly job in Europe/Berlin goes from March
    to May). Here a UTC CronTrigger, which never sees DST, matches the fields on local wall time and
    each result is placed in the zone: a time in the spring-forward gap does not exist and is skipped;
    a time in the repeated autumn hour fires once, at its first occurrence.
    """

    __slots__ = ("timezone", "wall")

    def __init__(self, expr: str, tz: zoneinfo.ZoneInfo) -> None:
        self.wall = CronTrigger.from_crontab(expr, timezone=UTC)
        self.timezone = tz

    def _on_wall(self, moment: datetime) -> datetime:
        return moment.astimezone(self.timezone).replace(tzinfo=UTC)

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        """The next local time matching the expression after ``previous_fire_time`` (else from ``now``)."""
        previous = self._on_wall(previous_fire_time) if previous_fire_time else None
        wall = self.wall.get_next_fire_time(previous, self._on_wall(now))
        while wall is not None:
            local = wall.replace(tzinfo=self.timezone)
            exists = self._on_wall(local.astimezone(UTC)) == wall
            if exists and (local > previous_fire_time if previous_fire_time else local >= now):
                return local
            wall = self.wall.get_next_fire_time(wall, wall)
        return None

    def __str__(self) -> str:
        return f"{self.wall} on the {self.timezone} wall clock"


def _whole_second(moment: datetime) -> datetime:
    """Fire times are whole seconds, so their ISO form (the fire's dedupe key) survives storage."""
    return moment.replace(microsecond=0) + (timedelta(seconds=1) if moment.microsecond else timedelta())


@dataclass(frozen=True, slots=True)
class Schedule:
    """A normalized schedule: a crontab ``expr``, every ``seconds`` from ``start``, or once ``at``."""

    kind: ScheduleKind
    expr: str | None = None
    seconds: int | None = None
    start: datetime | None = None
    at: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form shown to the model and stored with the job."""
        if self.kind == "cron":
            return {"kind": "cron", "expr": self.expr}
        if self.kind == "interval":
            assert self.start is not None
            return {"kind": "interval", "seconds": self.seconds, "start": self.start.isoformat()}
        assert self.at is not None
        return {"kind": "once", "at": self.at.isoformat()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Schedule:
        """Inverse of ``to_dict``."""
        kind = data["kind"]
        if kind == "cron":
            return cls("cron", expr=data["expr"])
        if kind == "interval":
            return cls("interval", seconds=int(data["seconds"]), start=datetime.fromisoformat(data["start"]))
        return cls("once", at=datetime.fromisoformat(data["at"]))

    def trigger(self, tz: zoneinfo.ZoneInfo) -> BaseTrigger:
        """The APScheduler trigger computing this schedule's fire times in ``tz``."""
        if self.kind == "cron":
            assert self.expr is not None
            return _WallClockCronTrigger(_apscheduler_crontab(self.expr), tz)
        if self.kind == "interval":
            return IntervalTrigger(seconds=self.seconds or 1, start_date=self.start, timezone=tz)
        return DateTrigger(run_date=self.at, timezone=tz)

    def describe(self) -> str:
        """A short human form: ``cron '0 9 * * 1-5'``, ``every 2h``, ``once at 2030-06-01T09:00:00+02:00``."""
        if self.kind == "cron":
            return f"cron '{self.expr}'"
        if self.kind == "interval":
            return f"every {_duration(self.seconds or 0)}"
        assert self.at is not None
        return f"once at {self.at.isoformat()}"


def _duration(seconds: int) -> str:
    for unit in ("w", "d", "h", "m"):
        if seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


def _dow_values(item: str) -> set[int]:
    """Crontab day-of-week numbers (0 = Sunday) named by one comma item such as ``1-5`` or ``*/2``."""
    base, _, step_text = item.partition("/")
    if step_text and not step_text.isdigit():
        raise CronError(f"invalid day-of-week step in {item!r}")
    step = int(step_text or 1)

    def number(token: str) -> int:
        token = token.lower()
        if token[:3] in _DOW_NAMES and token.isalpha():
            return _DOW_NAMES.index(token[:3])
        if token.isdigit() and int(token) <= 7:
            return int(token)
        raise CronError(f"invalid day of week {token!r} (use 0-7 or sun-sat)")

    if base in ("*", "?"):
        low, high = 0, 6
    elif "-" in base:
        low, high = (number(t) for t in base.split("-", 1))
        high = 7 if high == 0 and low > 0 else high  # fri-sun
    else:
        low = number(base)
        high = 6 if step_text else low
    if step < 1 or low > high:
        raise CronError(f"invalid day-of-week range {item!r}")
    return {v % 7 for v in range(low, high + 1, step)}


def _apscheduler_crontab(expr: str) -> str:
    """``expr`` with its day-of-week field spelled as names, the one form both conventions agree on."""
    fields = expr.split()
    if fields[4] in ("*", "?"):
        return expr
    days: set[int] = set()
    for item in fields[4].split(","):
        days |= _dow_values(item)
    return " ".join([*fields[:4], ",".join(_DOW_NAMES[d] for d in _DOW_ORDER if d in days)])


def _cron_schedule(expr: str, tz: zoneinfo.ZoneInfo) -> Schedule:
    fields = expr.split()
    if not all(_CRON_FIELD.fullmatch(f) for f in fields):
        raise CronError(f"Invalid cron expression {expr!r}. Accepted schedules: {SCHEDULE_FORMS}.")
    if fields[2] not in ("*", "?") and fields[4] not in ("*", "?"):
        raise CronError(f"Cron expression {expr!r} restricts both day of month and day of week, which crontab "
                        "and other schedulers read differently; restrict only one of them.")
    schedule = Schedule("cron", expr=" ".join(fields))
    try:
        schedule.trigger(tz)
    except ValueError as exc:
        raise CronError(f"Invalid cron expression {expr!r}: {exc}. Accepted schedules: {SCHEDULE_FORMS}.") from None
    return schedule


def _seconds(count: str | None, unit: str) -> int:
    return int(count or 1) * _UNITS[unit[0].lower()]


def parse_schedule(text: str, tz: zoneinfo.ZoneInfo, now: datetime) -> Schedule:
    """Parse a schedule written by a user or the model; CronError lists the accepted forms."""
    text = " ".join(str(text).split())
    if m := _EVERY.fullmatch(text):
        seconds = _seconds(m.group(1), m.group(2))
        if seconds < 1:
            raise CronError("The interval must be at least one second.")
        return Schedule("interval", seconds=seconds, start=_whole_second(now + timedelta(seconds=seconds)))
    if m := _IN.fullmatch(text):
        seconds = _seconds(m.group(1), m.group(2))
        if seconds < 1:
            raise CronError("'in N ...' needs N of at least 1.")
        return Schedule("once", at=_whole_second(now + timedelta(seconds=seconds)).astimezone(tz))
    if m := _AT.fullmatch(text):
        days = "1-5" if m.group(1).lower() == "weekdays" else "*"
        return Schedule("cron", expr=f"{int(m.group(3))} {int(m.group(2))} * * {days}")
    if len(text.split()) == 5:
        return _cron_schedule(text, tz)
    if re.match(r"\d{4}-\d\d-\d\d", text):
        try:
            at = datetime.fromisoformat(text)
        except ValueError:
            raise CronError(f"Invalid timestamp {text!r}; write it as 2030-06-01T09:00 (the job's time zone) "
                            "or with an offset, 2030-06-01T09:00+02:00.") from None
        at = _whole_second(at.replace(tzinfo=tz) if at.tzinfo is None else at).astimezone(tz)
        if at <= now:
            raise CronError(f"{at.isoformat()} is in the past; give a future time.")
        return Schedule("once", at=at)
    raise CronError(f"Unrecognized schedule {text!r}. Accepted schedules: {SCHEDULE_FORMS}.")


def first_fire(schedule: Schedule, tz: zoneinfo.ZoneInfo, now: datetime) -> datetime | None:
    """The first fire time at or after ``now`` (a one-shot's moment even when it has passed)."""
    return schedule.trigger(tz).get_next_fire_time(None, now)


def next_fire(trigger: BaseTrigger, after: datetime) -> datetime | None:
    """The fire time following the fire time ``after`` (None when the schedule has ended)."""
    return trigger.get_next_fire_time(after, after)


def upcoming(schedule: Schedule, tz: zoneinfo.ZoneInfo, now: datetime, count: int = 3) -> list[datetime]:
    """The next ``count`` fire times from ``now``, in ``tz``."""
    trigger = schedule.trigger(tz)
    times: list[datetime] = []
    moment = trigger.get_next_fire_time(None, now)
    while moment is not None and len(times) < count:
        times.append(moment.astimezone(tz))
        moment = next_fire(trigger, moment)
    return times


# -- jobs and the backend ---------------------------------------------------

def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class CronJob:
    """A scheduled prompt. ``deliver`` is ``origin`` (the chat it was created in), ``home`` (its owner's home
    channel, set with /sethome, when the job fires) or a target spec."""

    id: str
    owner: str
    prompt: str
    schedule: Schedule
    timezone: str
    origin_platform: str
    origin_chat_id: str
    origin_thread_id: str | None = None
    session_key: str | None = None
    name: str = ""
    repeat: int | None = None
    deliver: str = "origin"
    notify: str = "always"
    misfire: str = "run_once"
    state: str = "active"
    fires: int = 0
    next_fire_at: datetime | None = None
    last_fire_at: datetime | None = None
    last_run_id: str | None = None
    last_status: str | None = None
    last_error: str | None = None
    last_result: str | None = None
    consecutive_failures: int = 0
    last_misfire: dict[str, Any] | None = None
    paused_reason: str | None = None
    run_requested_at: datetime | None = None
    created_at: datetime = field(default_factory=_now)
    updated_at: datetime = field(default_factory=_now)

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        """The job's time zone."""
        return zoneinfo.ZoneInfo(self.timezone)

    def local(self, moment: datetime | None) -> str | None:
        """``moment`` as ISO 8601 in the job's time zone."""
        return moment.astimezone(self.zone).isoformat() if moment else None

    def summary(self) -> str:
        """One line for ``/cron list`` and the CLI."""
        label = self.name or self.prompt
        label = label if len(label) <= 40 else label[:39] + "…"
        line = (f"{self.id}  {self.state:<6}  {self.schedule.describe()} ({self.timezone})  "
                f"next {self.local(self.next_fire_at) or '-'}  runs {self.fires}"
                f"{f'/{self.repeat}' if self.repeat else ''}  {label!r}")
        if self.last_status:
            line += f"  last {self.last_status}"
        if self.last_misfire:
            line += f"  misfire {self.last_misfire['action']} ({self.last_misfire['missed']} missed)"
        return line

    def to_json(self) -> dict[str, Any]:
        """The job as the tool and ``cron show`` present it (times in the job's zone)."""
        chat = f"{self.origin_platform}:{self.origin_chat_id}" + (
            f":{self.origin_thread_id}" if self.origin_thread_id else "")
        last = self.last_result if self.last_result is None or len(self.last_result) <= 200 \
            else self.last_result[:199] + "…"
        return {"id": self.id, "name": self.name, "prompt": self.prompt, "schedule": self.schedule.to_dict(),
                "timezone": self.timezone, "state": self.state, "repeat": self.repeat, "runs": self.fires,
                "deliver": self.deliver, "notify": self.notify, "misfire": self.misfire, "chat": chat,
                "owner": self.owner, "next_run": self.local(self.next_fire_at),
                "last_run": self.local(self.last_fire_at), "last_status": self.last_status,
                "last_error": self.last_error, "last_result": last, "last_misfire": self.last_misfire,
                "consecutive_failures": self.consecutive_failures, "paused_reason": self.paused_reason}


class CronBackend(Protocol):
    """Synchronous job storage and control; ``actor`` is the user key acting, None for an admin.

    Every method sees only the actor's jobs (all jobs for None) and raises CronError for requests
    the user must change (limits, delivery targets).
    """

    @property
    def default_timezone(self) -> str:
        """The zone for jobs created without one."""
        ...

    def create(self, job: CronJob, actor: str | None) -> CronJob:
        """Store and schedule a new job; returns it with its id and next fire time."""
        ...

    def list(self, actor: str | None) -> list[CronJob]:
        """The actor's jobs, oldest first."""
        ...

    def get(self, job_id: str, actor: str | None) -> CronJob | None:
        """One job, or None when it does not exist for this actor."""
        ...

    def update(self, job: CronJob, actor: str | None) -> CronJob | None:
        """Save the user-editable fields of ``job`` (recomputing its next fire time)."""
        ...

    def pause(self, job_id: str, actor: str | None) -> CronJob | None:
        """Stop firing until resumed."""
        ...

    def resume(self, job_id: str, actor: str | None) -> CronJob | None:
        """Fire again from the next scheduled time."""
        ...

    def remove(self, job_id: str, actor: str | None) -> bool:
        """Delete the job."""
        ...

    def run_now(self, job_id: str, actor: str | None) -> str | None:
        """Fire once now, outside the schedule; returns the run id."""
        ...


_slot: BackendSlot[CronBackend | None] = BackendSlot(None)
# Point the tool at the gateway's scheduler (None: scheduling unavailable).
set_cron_backend = _slot.set
get_cron_backend = _slot.get



# -- the tool ---------------------------------------------------------------

def _text_arg(args: Mapping[str, Any], key: str) -> str | None:
    value = args.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        raise CronError(f"'{key}' must be a string.")
    return value.strip()


def _choice(args: Mapping[str, Any], key: str, allowed: tuple[str, ...]) -> str | None:
    value = _text_arg(args, key)
    if value is not None and value not in allowed:
        raise CronError(f"'{key}' must be one of: {', '.join(allowed)}.")
    return value


def _repeat(args: Mapping[str, Any]) -> int | None:
    value = args.get("repeat")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CronError("'repeat' is the total number of runs: a positive integer (0 for no limit).")
    return value or None


def _prompt(args: Mapping[str, Any]) -> str | None:
    prompt = _text_arg(args, "prompt")
    if prompt is not None and len(prompt) > MAX_PROMPT_CHARS:
        raise CronError(f"The prompt is {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}.")
    return prompt


def _scheduled(job: CronJob, **fields: Any) -> dict[str, Any]:
    now = _now()
    return {"schedule": job.schedule.to_dict(), "timezone": job.timezone,
            "next_runs": [t.isoformat() for t in upcoming(job.schedule, job.zone, max(now, job.next_fire_at or now))],
            **fields}


def _create(backend: CronBackend, args: Mapping[str, Any], ctx: Mapping[str, Any], actor: str | None) -> str:
    prompt, text = _prompt(args), _text_arg(args, "schedule")
    if prompt is None or text is None:
        return tool_error("create needs 'prompt' (what to run) and 'schedule' (when). "
                          f"Accepted schedules: {SCHEDULE_FORMS}.")
    platform, chat_id = ctx.get("platform"), ctx.get("chat_id")
    if not platform or not chat_id or platform == "cron":
        return tool_error("Jobs can only be created from a chat.")
    tz_name = _text_arg(args, "timezone") or ctx.get("timezone") or backend.default_timezone
    tz = resolve_timezone(tz_name)
    schedule = parse_schedule(text, tz, _now())
    repeat = _repeat(args)
    if schedule.kind == "once" and repeat not in (None, 1):
        return tool_error("A one-time schedule runs once; drop 'repeat' or use an 'every ...' schedule.")
    job = CronJob(id="", owner=str(ctx["user_key"]), prompt=prompt, schedule=schedule, timezone=tz_name,
                  origin_platform=str(platform), origin_chat_id=str(chat_id),
                  origin_thread_id=str(ctx["thread_id"]) if ctx.get("thread_id") else None,
                  session_key=ctx.get("session_key"), name=_text_arg(args, "name") or "", repeat=repeat,
                  deliver=_text_arg(args, "deliver") or "origin", notify=_choice(args, "notify", NOTIFY_MODES)
                  or "always", misfire=_choice(args, "misfire", MISFIRE_POLICIES) or "run_once")
    created = backend.create(job, actor)
    return tool_result(_scheduled(created, created=created.to_json()))


def _list(backend: CronBackend, args: Mapping[str, Any], ctx: Mapping[str, Any], actor: str | None) -> str:
    jobs = backend.list(actor)
    return tool_result(count=len(jobs), jobs=[j.to_json() for j in jobs])


def _job_id(args: Mapping[str, Any], action: str) -> str:
    job_id = _text_arg(args, "id")
    if job_id is None:
        raise CronError(f"{action} needs 'id': the job's id as shown by list.")
    return job_id


def _missing(job_id: str) -> str:
    return tool_error(f"No job with id {job_id!r}. Use list to see your jobs.")


def _update(backend: CronBackend, args: Mapping[str, Any], ctx: Mapping[str, Any], actor: str | None) -> str:
    job_id = _job_id(args, "update")
    job = backend.get(job_id, actor)
    if job is None:
        return _missing(job_id)
    changes: dict[str, Any] = {}
    tz_name = _text_arg(args, "timezone")
    if tz_name is not None:
        resolve_timezone(tz_name)
        changes["timezone"] = tz_name
    text = _text_arg(args, "schedule")
    if text is not None:
        changes["schedule"] = parse_schedule(text, resolve_timezone(tz_name or job.timezone), _now())
    for key, value in (("prompt", _prompt(args)), ("name", _text_arg(args, "name")),
                       ("deliver", _text_arg(args, "deliver")), ("notify", _choice(args, "notify", NOTIFY_MODES)),
                       ("misfire", _choice(args, "misfire", MISFIRE_POLICIES))):
        if value is not None:
            changes[key] = value
    if "repeat" in args:
        changes["repeat"] = _repeat(args)
    if not changes:
        return tool_error("update needs at least one of: prompt, schedule, timezone, name, repeat, deliver, "
                          "notify, misfire.")
    updated = backend.update(replace(job, **changes), actor)
    return _missing(job_id) if updated is None else tool_result(_scheduled(updated, updated=updated.to_json()))


def _state_change(method: str) -> Callable[[CronBackend, Mapping[str, Any], Mapping[str, Any], str | None], str]:
    def change(backend: CronBackend, args: Mapping[str, Any], ctx: Mapping[str, Any], actor: str | None) -> str:
        job_id = _job_id(args, method)
        job = getattr(backend, method)(job_id, actor)
        return _missing(job_id) if job is None else tool_result({f"{method}d": job.to_json()})
    return change


def _remove(backend: CronBackend, args: Mapping[str, Any], ctx: Mapping[str, Any], actor: str | None) -> str:
    job_id = _job_id(args, "remove")
    return tool_result(removed=job_id) if backend.remove(job_id, actor) else _missing(job_id)


def _run(backend: CronBackend, args: Mapping[str, Any], ctx: Mapping[str, Any], actor: str | None) -> str:
    job_id = _job_id(args, "run")
    run_id = backend.run_now(job_id, actor)
    return _missing(job_id) if run_id is None else tool_result(started=job_id, run_id=run_id)


_ACTIONS: dict[str, Callable[[CronBackend, Mapping[str, Any], Mapping[str, Any], str | None], str]] = {
    "create": _create,
    "list": _list,
    "update": _update,
    "pause": _state_change("pause"),
    "resume": _state_change("resume"),
    "remove": _remove,
    "run": _run,
}


def _cronjob(args: dict[str, Any], **ctx: Any) -> str:
    """Handler of the ``cronjob`` tool."""
    backend = _slot.get()
    if backend is None:
        return tool_error("Scheduling is not available here: no scheduler is running.")
    user_key = ctx.get("user_key")
    if not user_key:
        return tool_error("Scheduling is unavailable here: the tool context has no user_key.")
    action = args.get("action")
    handler = _ACTIONS.get(action) if isinstance(action, str) else None
    if handler is None:
        return tool_error(f"Unknown action {action!r}; use one of: {', '.join(_ACTIONS)}.")
    try:
        return handler(backend, args, ctx, None if ctx.get("is_admin") else str(user_key))
    except CronError as exc:
        return tool_error(str(exc))


registry.register(
    name="cronjob",
    toolset="cronjob",
    schema={
        "name": "cronjob",
        "description": (
            "Schedule a prompt to run later or repeatedly; each run's answer is posted to this chat. "
            "Actions: create (prompt, schedule, optional timezone, name, repeat, notify, misfire, deliver), "
            "list, update (id plus fields to change), pause (id), resume (id), remove (id), run (id: once now). "
            f"Schedules: {SCHEDULE_FORMS}. Times are in the job's timezone (default: the gateway's). "
            "The prompt runs later without this conversation, so make it self-contained. The answer shows "
            "the normalized schedule and the next run times."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": list(_ACTIONS)},
                "id": {"type": "string", "description": "update/pause/resume/remove/run: the job id from list."},
                "prompt": {"type": "string", "description": "create/update: the self-contained task to run."},
                "schedule": {"type": "string", "description": f"create/update: when; {SCHEDULE_FORMS}."},
                "timezone": {"type": "string", "description": "IANA time zone such as 'Europe/Berlin'."},
                "name": {"type": "string", "description": "A short label for the job."},
                "repeat": {"type": "integer", "description": "Total number of runs (0 or omitted: no limit)."},
                "deliver": {"type": "string",
                            "description": "Where answers go: 'origin' (this chat, the default), 'home' (the "
                                           "user's home channel, set with /sethome) or, for admins, "
                                           "<platform>:<chat_id>[:<thread_id>] or callback:<name>."},
                "notify": {"type": "string", "enum": list(NOTIFY_MODES),
                           "description": "always (default) or on_change: post only when the answer changed."},
                "misfire": {"type": "string", "enum": list(MISFIRE_POLICIES),
                            "description": "Runs missed while the gateway was down: run_once (default) or skip."},
            },
            "required": ["action"],
        },
    },
    handler=_cronjob,
    isolation=ISOLATION_PROCESS,  # the gateway's own state
    effects=[EFFECT_SCHEDULES],
    emoji="⏰",
)
