"""The cronjob tool: schedule parsing, DST, and every action against the gateway's real backend."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tools.cronjob_tools import (
    CronError,
    get_cron_backend,
    parse_schedule,
    resolve_timezone,
    set_cron_backend,
    upcoming,
)
from tools.registry import EFFECT_SCHEDULES, registry

BERLIN = resolve_timezone("Europe/Berlin")
NOW = datetime(2030, 3, 27, 12, 0, 30, tzinfo=UTC)  # a Wednesday, days before the March DST change
ALICE = {"user_key": "telegram:1001", "platform": "telegram", "chat_id": "100", "thread_id": "7",
         "session_key": "telegram:dm:100:7", "is_admin": False}
BOB = {**ALICE, "user_key": "telegram:1002", "chat_id": "200", "thread_id": None, "session_key": "telegram:dm:200"}
ADMIN = {**ALICE, "user_key": "telegram:1003", "chat_id": "300", "is_admin": True}


def _local(times: list[datetime]) -> list[str]:
    return [t.isoformat() for t in times]


@pytest.mark.parametrize(("text", "normalized", "next_three"), [
    ("0 9 * * 1-5", {"kind": "cron", "expr": "0 9 * * 1-5"},
     ["2030-03-28T09:00:00+01:00", "2030-03-29T09:00:00+01:00", "2030-04-01T09:00:00+02:00"]),
    ("*/15  * * * *", {"kind": "cron", "expr": "*/15 * * * *"},
     ["2030-03-27T13:15:00+01:00", "2030-03-27T13:30:00+01:00", "2030-03-27T13:45:00+01:00"]),
    ("0 8 * * 0", {"kind": "cron", "expr": "0 8 * * 0"},  # crontab numbering: 0 is Sunday
     ["2030-03-31T08:00:00+02:00", "2030-04-07T08:00:00+02:00", "2030-04-14T08:00:00+02:00"]),
    ("every 2h", {"kind": "interval", "seconds": 7200, "start": "2030-03-27T14:00:30+00:00"},
     ["2030-03-27T15:00:30+01:00", "2030-03-27T17:00:30+01:00", "2030-03-27T19:00:30+01:00"]),
    ("every 30m", {"kind": "interval", "seconds": 1800, "start": "2030-03-27T12:30:30+00:00"},
     ["2030-03-27T13:30:30+01:00", "2030-03-27T14:00:30+01:00", "2030-03-27T14:30:30+01:00"]),
    ("every 1d", {"kind": "interval", "seconds": 86400, "start": "2030-03-28T12:00:30+00:00"},
     ["2030-03-28T13:00:30+01:00", "2030-03-29T13:00:30+01:00", "2030-03-30T13:00:30+01:00"]),
    ("daily at 09:00", {"kind": "cron", "expr": "0 9 * * *"},
     ["2030-03-28T09:00:00+01:00", "2030-03-29T09:00:00+01:00", "2030-03-30T09:00:00+01:00"]),
    ("weekdays at 9:00", {"kind": "cron", "expr": "0 9 * * 1-5"},
     ["2030-03-28T09:00:00+01:00", "2030-03-29T09:00:00+01:00", "2030-04-01T09:00:00+02:00"]),
    ("in 20 minutes", {"kind": "once", "at": "2030-03-27T13:20:30+01:00"}, ["2030-03-27T13:20:30+01:00"]),
    ("in 2 hours", {"kind": "once", "at": "2030-03-27T15:00:30+01:00"}, ["2030-03-27T15:00:30+01:00"]),
    ("in 5 seconds", {"kind": "once", "at": "2030-03-27T13:00:35+01:00"}, ["2030-03-27T13:00:35+01:00"]),
    ("2030-06-01T09:00", {"kind": "once", "at": "2030-06-01T09:00:00+02:00"}, ["2030-06-01T09:00:00+02:00"]),
    ("2030-06-01T09:00Z", {"kind": "once", "at": "2030-06-01T11:00:00+02:00"}, ["2030-06-01T11:00:00+02:00"]),
])
def test_each_schedule_form_is_normalized_with_its_next_fire_times(text: str, normalized: dict[str, Any],
                                                                   next_three: list[str]) -> None:
    schedule = parse_schedule(text, BERLIN, NOW)
    assert schedule.to_dict() == normalized
    assert _local(upcoming(schedule, BERLIN, NOW)) == next_three


@pytest.mark.parametrize(("text", "message"), [
    ("sometimes", "Unrecognized schedule"),
    ("0 9 * *", "Unrecognized schedule"),
    ("61 * * * *", "Invalid cron expression"),
    ("0 9 * * 8", "invalid day of week"),
    ("0 9 1 * 1", "restrict only one"),
    ("2020-01-01T09:00", "in the past"),
    ("2030-13-01T09:00", "Invalid timestamp"),
    ("in 0 minutes", "at least 1"),
])
def test_invalid_schedules_say_what_is_accepted(text: str, message: str) -> None:
    with pytest.raises(CronError, match=message) as info:
        parse_schedule(text, BERLIN, NOW)
    if "Unrecognized" in message or "Invalid cron" in message:
        assert "every 2h" in str(info.value) and "daily at 09:00" in str(info.value)


def test_unknown_time_zone_suggests_a_name() -> None:
    with pytest.raises(CronError, match="Europe/Berlin"):
        resolve_timezone("Europe/Berln")


def test_daily_nine_oclock_in_berlin_stays_local_across_both_dst_changes() -> None:
    daily = parse_schedule("daily at 09:00", BERLIN, NOW)
    spring = upcoming(daily, BERLIN, datetime(2030, 3, 29, 12, tzinfo=UTC), 3)  # DST starts 31 March 2030
    autumn = upcoming(daily, BERLIN, datetime(2030, 10, 25, 12, tzinfo=UTC), 3)  # and ends 27 October
    assert _local(spring) == ["2030-03-30T09:00:00+01:00", "2030-03-31T09:00:00+02:00", "2030-04-01T09:00:00+02:00"]
    assert _local(autumn) == ["2030-10-26T09:00:00+02:00", "2030-10-27T09:00:00+01:00", "2030-10-28T09:00:00+01:00"]
    assert [t.astimezone(UTC).hour for t in spring] == [8, 7, 7]
    assert [t.astimezone(UTC).hour for t in autumn] == [7, 8, 8]


def test_wall_clock_matching_survives_dst_where_plain_apscheduler_skips() -> None:
    monthly = parse_schedule("0 0 1 * *", BERLIN, NOW)
    assert _local(upcoming(monthly, BERLIN, NOW, 2)) == ["2030-04-01T00:00:00+02:00", "2030-05-01T00:00:00+02:00"]
    # 02:30 does not exist on 31 March (skipped) and happens twice on 27 October (fires once)
    night = parse_schedule("30 2 * * *", BERLIN, NOW)
    assert _local(upcoming(night, BERLIN, datetime(2030, 3, 29, 12, tzinfo=UTC), 3)) == [
        "2030-03-30T02:30:00+01:00", "2030-04-01T02:30:00+02:00", "2030-04-02T02:30:00+02:00"]
    assert _local(upcoming(night, BERLIN, datetime(2030, 10, 25, 12, tzinfo=UTC), 3)) == [
        "2030-10-26T02:30:00+02:00", "2030-10-27T02:30:00+02:00", "2030-10-28T02:30:00+01:00"]


def test_crontab_weekday_numbers_and_steps_follow_crontab() -> None:
    def weekdays(expr: str) -> list[str]:
        return [t.strftime("%a") for t in upcoming(parse_schedule(expr, BERLIN, NOW), BERLIN, NOW, 7)]
    assert weekdays("0 9 * * 1-5") == ["Thu", "Fri", "Mon", "Tue", "Wed", "Thu", "Fri"]
    assert weekdays("0 9 * * 0,6") == ["Sat", "Sun", "Sat", "Sun", "Sat", "Sun", "Sat"]
    assert weekdays("0 9 * * 7") == ["Sun"] * 7
    assert weekdays("0 9 * * */3") == ["Sat", "Sun", "Wed", "Sat", "Sun", "Wed", "Sat"]  # 0, 3, 6
    assert weekdays("0 9 * * fri-sun") == ["Fri", "Sat", "Sun", "Fri", "Sat", "Sun", "Fri"]


def test_registered_with_the_schedules_effect() -> None:
    entry = registry.get("cronjob")
    assert entry is not None and entry.toolset == "cronjob"
    assert entry.effects == {EFFECT_SCHEDULES}
    assert entry.schema["parameters"]["properties"]["action"]["enum"] == [
        "create", "list", "update", "pause", "resume", "remove", "run"]


@pytest.fixture
def no_backend() -> Iterator[None]:
    previous = get_cron_backend()
    set_cron_backend(None)
    yield
    set_cron_backend(previous)


def test_without_a_scheduler_the_tool_says_so(no_backend: None) -> None:
    result = json.loads(registry.dispatch("cronjob", {"action": "list"}, **ALICE))
    assert "not available" in result["error"]


async def _tool(ctx: dict[str, Any], **args: Any) -> dict[str, Any]:
    # Tool handlers run in worker threads; the backend carries each call to the gateway loop.
    return json.loads(await asyncio.to_thread(registry.dispatch, "cronjob", args, **ctx))


async def test_create_list_update_pause_resume_run_remove(make_gateway) -> None:
    h = await make_gateway({"cron": {"timezone": "Europe/Berlin"}})
    created = await _tool(ALICE, action="create", prompt="Summarize the news", schedule="weekdays at 9:00",
                          name="news")
    job = created["created"]
    assert created["schedule"] == {"kind": "cron", "expr": "0 9 * * 1-5"}
    assert created["timezone"] == "Europe/Berlin" and len(created["next_runs"]) == 3
    assert all(t.endswith(("+01:00", "+02:00")) and "T09:00:00" in t for t in created["next_runs"])
    assert job["chat"] == "telegram:100:7" and job["state"] == "active" and job["next_run"] == created["next_runs"][0]

    listed = await _tool(ALICE, action="list")
    assert [j["id"] for j in listed["jobs"]] == [job["id"]]

    updated = await _tool(ALICE, action="update", id=job["id"], schedule="every 2h", timezone="UTC",
                          notify="on_change")
    assert updated["updated"]["schedule"]["kind"] == "interval" and updated["updated"]["notify"] == "on_change"
    assert updated["next_runs"][0].endswith("+00:00")

    assert (await _tool(ALICE, action="pause", id=job["id"]))["paused"]["state"] == "paused"
    assert (await _tool(ALICE, action="resume", id=job["id"]))["resumed"]["state"] == "active"

    h.model.push("fresh headlines")
    started = await _tool(ALICE, action="run", id=job["id"])
    assert (await h.wait_run(started["run_id"]))["status"] == "completed"
    await h.chat.wait_for(lambda: "fresh headlines" in h.chat.final_texts())
    sent = next(s for s in h.chat.sent if s.text == "fresh headlines")
    assert sent.chat_id == "100" and sent.metadata["thread_id"] == "7"

    assert (await _tool(ALICE, action="remove", id=job["id"])) == {"removed": job["id"]}
    assert (await _tool(ALICE, action="list"))["count"] == 0


async def test_other_users_cannot_see_or_change_a_job_but_admins_can(make_gateway) -> None:
    await make_gateway()
    job = (await _tool(ALICE, action="create", prompt="water the plants", schedule="daily at 07:30"))["created"]
    assert (await _tool(BOB, action="list"))["count"] == 0
    for action in ("pause", "resume", "remove", "run"):
        assert "No job" in (await _tool(BOB, action=action, id=job["id"]))["error"]
    assert "No job" in (await _tool(BOB, action="update", id=job["id"], prompt="hijack"))["error"]
    mine = (await _tool(ALICE, action="list"))["jobs"]
    assert len(mine) == 1 and mine[0]["state"] == "active" and mine[0]["prompt"] == "water the plants"
    assert [j["id"] for j in (await _tool(ADMIN, action="list"))["jobs"]] == [job["id"]]
    assert (await _tool(ADMIN, action="pause", id=job["id"]))["paused"]["state"] == "paused"


async def test_create_refuses_bad_input_with_clear_errors(make_gateway) -> None:
    await make_gateway({"cron": {"max_jobs_per_user": 1}})
    bad_tz = await _tool(ALICE, action="create", prompt="x", schedule="daily at 09:00", timezone="Mars/Olympus")
    assert "Unknown time zone" in bad_tz["error"]
    bad_schedule = await _tool(ALICE, action="create", prompt="x", schedule="whenever")
    assert "every 30m" in bad_schedule["error"] and "ISO timestamp" in bad_schedule["error"]
    too_often = await _tool(ALICE, action="create", prompt="x", schedule="every 10s")
    assert "shortest interval" in too_often["error"]
    elsewhere = await _tool(ALICE, action="create", prompt="x", schedule="daily at 09:00", deliver="telegram:999")
    assert "Only admins" in elsewhere["error"]
    missing = await _tool(ALICE, action="create", schedule="daily at 09:00")
    assert "needs 'prompt'" in missing["error"]
    assert "created" in await _tool(ALICE, action="create", prompt="x", schedule="daily at 09:00")
    assert "limit" in (await _tool(ALICE, action="create", prompt="y", schedule="daily at 10:00"))["error"]
    unknown = await _tool(ADMIN, action="create", prompt="x", schedule="daily at 09:00", deliver="callback:nope")
    assert "No callback target" in unknown["error"]
    assert (await _tool(ADMIN, action="create", prompt="x", schedule="daily at 09:00",
                        deliver="callback:sink"))["created"]["deliver"] == "callback:sink"
