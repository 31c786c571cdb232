"""The scheduler end to end: jobs from chat, firing into the origin thread, misfires, notify, failures,
ownership through /cron, the CLI against a running gateway, and real kill -9 restarts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml

from gateway.cli import main
from gateway.config import parse_config
from gateway.cron import ON_TIME_SECONDS, CronService, plan_fire
from gateway.cron_store import CronStore
from gateway.metrics import Metrics
from gateway.runs import RunJob
from gateway.schema import inbox_t
from gateway.sim.callback_sink import CallbackSink
from gateway.sim.model_server import ScriptedModel, rules, text, tool_call
from gateway.store import RunCompletion, Store
from platforms.base import MessageEvent
from tools.cronjob_tools import CronJob, Schedule, first_fire, parse_schedule, resolve_timezone

GRACE = 3600.0


def _job(prompt: str, schedule: str, *, owner: str = "telegram:1001", chat: str = "100", tz: str = "UTC",
         **fields: Any) -> CronJob:
    zone = resolve_timezone(tz)
    parsed = parse_schedule(schedule, zone, datetime.now(UTC))
    return CronJob(id="", owner=owner, prompt=prompt, schedule=parsed, timezone=tz, origin_platform="telegram",
                   origin_chat_id=chat, **fields)


async def _metrics(h: Any) -> str:
    async with h.http.get(f"{h.base_url}/metrics") as r:
        return await r.text()


async def _eventually(check: Any, timeout: float = 5.0) -> None:
    async def _poll() -> None:
        while not await check():
            await asyncio.sleep(0.05)
    await asyncio.wait_for(_poll(), timeout)


# -- from chat to chat ------------------------------------------------------

async def test_job_created_in_chat_fires_into_the_same_thread_and_is_removed(make_gateway) -> None:
    h = await make_gateway(responder=rules(
        (r"remind me", tool_call("cronjob", {"action": "create", "schedule": "in 1 seconds", "name": "stretch",
                                             "prompt": "STRETCH REMINDER: tell the user to stretch"})),
        (r"^STRETCH REMINDER", text("Time to stretch!")),
    ))
    await h.chat.user_says("remind me to stretch in a second", thread_id="55")
    await h.chat.wait_for(lambda: any(t.startswith("Done:") for t in h.chat.final_texts()))
    assert '"kind": "once"' in h.chat.final_texts()[0] and "next_runs" in h.chat.final_texts()[0]
    [job] = await h.gateway.cron.list_jobs(None)
    assert (job.owner, job.origin_chat_id, job.origin_thread_id) == ("telegram:1001", "100", "55")

    await h.chat.wait_for(lambda: "Time to stretch!" in h.chat.final_texts(), timeout=5)
    reminder = next(s for s in h.chat.sent if s.text == "Time to stretch!")
    assert reminder.chat_id == "100" and reminder.metadata["thread_id"] == "55"
    cron_request = next(r for r in h.model.requests if r["messages"][-1]["content"].startswith("STRETCH"))
    assert [m["role"] for m in cron_request["messages"]] == ["system", "user"]  # fresh context, no chat history
    tools = {t["function"]["name"] for t in cron_request.get("tools", [])}
    assert "todo" in tools and not tools & {"cronjob", "clarify"}  # the hermes-cron toolset
    [run] = [r for r in await h.gateway.store.list_runs() if r.kind == "cron"]
    assert run.source == job.id and run.status == "completed"

    async def removed() -> bool:
        return await h.gateway.cron.list_jobs(None) == []
    await _eventually(removed)  # a one-shot is gone once it has run
    metrics = await _metrics(h)
    assert 'hermes_cron_fires_total{trigger="scheduled"} 1.0' in metrics
    assert "hermes_cron_fire_lag_seconds_count 1.0" in metrics
    assert 'hermes_cron_jobs{state="active"} 0.0' in metrics


async def test_repeat_limits_the_number_of_runs(make_gateway) -> None:
    h = await make_gateway({"cron": {"min_interval_seconds": 1}})
    job = await h.gateway.cron.create(_job("TICK", "every 1s", repeat=2), None)
    await h.chat.wait_for(lambda: h.chat.final_texts().count("Echo: TICK") == 2, timeout=6)

    async def removed() -> bool:
        return await h.gateway.cron.get(job.id, None) is None
    await _eventually(removed)
    await asyncio.sleep(1.1)  # a third tick would have come by now
    assert h.chat.final_texts().count("Echo: TICK") == 2


async def test_notify_on_change_skips_an_unchanged_answer(make_gateway) -> None:
    h = await make_gateway()
    job = await h.gateway.cron.create(_job("CHECK WEATHER", "every 1h", notify="on_change"), None)
    for answer in ("Weather: sunny", "Weather: sunny", "Weather: rain"):
        h.model.push(answer)
        run_id = await h.gateway.cron.run_now(job.id, "telegram:1001")
        assert run_id is not None
        assert (await h.wait_run(run_id))["status"] == "completed"
    await h.chat.wait_for(lambda: "Weather: rain" in h.chat.final_texts())
    await h.gateway.outbox.flush(2)
    assert h.chat.final_texts() == ["Weather: sunny", "Weather: rain"]
    stored = await h.gateway.cron.get(job.id, None)
    assert stored is not None and stored.last_result == "Weather: rain"


async def test_repeated_failures_pause_the_job_and_tell_the_owner_once(make_gateway) -> None:
    h = await make_gateway()
    job = await h.gateway.cron.create(_job("FLAKY", "every 1h"), None)
    h.model.fail_next(3, status=500)
    for attempt in range(3):
        run_id = await h.gateway.cron.run_now(job.id, None)
        assert run_id is not None and (await h.wait_run(run_id))["status"] == "failed"
        if attempt == 0:
            first = await h.gateway.cron.get(job.id, None)
            assert first is not None and first.state == "active" and "InternalServerError" in first.last_error
    await h.chat.wait_for(lambda: len(h.chat.sent) == 1)
    await h.gateway.outbox.flush(2)
    [notice] = h.chat.final_texts()
    assert f"Scheduled job {job.id}" in notice and "is paused" in notice and f"/cron resume {job.id}" in notice
    paused = await h.gateway.cron.get(job.id, None)
    assert paused is not None and paused.state == "paused" and paused.consecutive_failures == 3
    assert "3 failed runs in a row" in paused.paused_reason
    assert "hermes_cron_failures_total 3.0" in await _metrics(h)
    resumed = await h.gateway.cron.resume(job.id, "telegram:1001")
    assert resumed is not None and resumed.state == "active" and resumed.consecutive_failures == 0


async def test_cron_command_is_scoped_to_the_owner(make_gateway) -> None:
    h = await make_gateway({"auth": {"admins": ["telegram:1003"],
                                     "platforms": {"telegram": {"allowed_users": ["1001", "1002", "1003"]}}}})
    job = await h.gateway.cron.create(_job("PING", "daily at 09:00"), None)

    async def say(text_: str, user: str) -> str:
        before = len(h.chat.sent)
        await h.chat.user_says(text_, user_id=user, chat_id=f"c{user}")
        await h.chat.wait_for(lambda: len(h.chat.sent) > before)
        return h.chat.sent[before].text

    assert (await say("/cron list", "1002")).startswith("No scheduled jobs")
    for action in ("pause", "resume", "remove", "run"):
        assert (await say(f"/cron {action} {job.id}", "1002")).startswith("No job")
    untouched = await h.gateway.cron.get(job.id, None)
    assert untouched is not None and untouched.state == "active"

    assert job.id in await say("/cron list", "1001")
    assert (await say(f"/cron pause {job.id}", "1001")).startswith(f"Paused: {job.id}")
    assert (await say(f"/cron resume {job.id}", "1001")).startswith(f"Resumed: {job.id}")
    assert job.id in await say("/cron", "1003")  # admins see every job
    assert (await say(f"/cron run {job.id}", "1001")) == f"Running job {job.id} now."
    await h.chat.wait_for(lambda: "Echo: PING" in h.chat.final_texts())
    assert next(s for s in h.chat.sent if s.text == "Echo: PING").chat_id == "100"  # the job's chat
    assert (await say("/cron frobnicate", "1001")).startswith("Usage: /cron list")
    assert (await say(f"/cron remove {job.id}", "1001")) == f"Removed job {job.id}."
    assert (await say("/cron list", "1001")).startswith("No scheduled jobs")


@pytest.fixture
def keep_root_logging() -> Iterator[None]:
    """The CLI installs its own log handler; give pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


async def test_cli_changes_reach_the_running_gateway(make_gateway, tmp_path: Path, capsys,
                                                     keep_root_logging: None) -> None:
    h = await make_gateway({"cron": {"sync_interval_seconds": 0.1}})
    config = tmp_path / "cli.yaml"
    config.write_text(yaml.safe_dump({"store": {"url": h.gateway.cfg.store.url}}), encoding="utf-8")
    job = await h.gateway.cron.create(_job("CLI PING", "every 1h"), None)

    async def cli(*argv: str) -> tuple[int, str]:
        code = await asyncio.to_thread(main, [*argv, "--config", str(config), "--log-level", "ERROR"])
        return code, capsys.readouterr().out

    async def gauge(state: str, value: int) -> bool:
        return f'hermes_cron_jobs{{state="{state}"}} {value}.0' in await _metrics(h)

    code, out = await cli("cron", "list")
    assert code == 0 and job.id in out and "telegram:1001" in out
    assert (await cli("cron", "pause", job.id))[0] == 0
    await _eventually(lambda: gauge("paused", 1))
    code, out = await cli("cron", "run", job.id)
    assert code == 0 and "requested" in out
    await h.chat.wait_for(lambda: "Echo: CLI PING" in h.chat.final_texts())
    assert (await cli("cron", "resume", job.id))[0] == 0
    await _eventually(lambda: gauge("active", 1))
    code, out = await cli("cron", "show", job.id)
    assert code == 0 and '"state": "active"' in out
    assert (await cli("cron", "remove", job.id))[0] == 0
    await _eventually(lambda: gauge("active", 0))
    assert (await cli("cron", "show", job.id))[0] == 1
    assert h.chat.final_texts().count("Echo: CLI PING") == 1


# -- misfire planning with an injected clock ------------------------------------

def _hourly(misfire: str, due: datetime) -> CronJob:
    return CronJob(id="j", owner="telegram:1", prompt="p", timezone="UTC", origin_platform="telegram",
                   origin_chat_id="1", misfire=misfire, next_fire_at=due,
                   schedule=Schedule("interval", seconds=3600, start=due))


T0 = datetime(2030, 1, 1, 8, 0, tzinfo=UTC)
H = timedelta(hours=1)


def test_plan_fire_on_time_fires_the_due_time() -> None:
    plan = plan_fire(_hourly("skip", T0), T0 + timedelta(seconds=0.3), GRACE, ON_TIME_SECONDS)
    assert (plan.fire_for, plan.next_at, plan.misfire) == (T0, T0 + H, None)
    assert plan_fire(_hourly("run_once", T0), T0 - timedelta(seconds=1), GRACE, ON_TIME_SECONDS).fire_for is None


def test_plan_fire_at_start_runs_once_for_all_missed_times_or_skips_them() -> None:
    now = T0 + 2.5 * H  # down across T0, T0+1h and T0+2h
    once = plan_fire(_hourly("run_once", T0), now, GRACE, 0.0)
    assert (once.fire_for, once.next_at) == (T0 + 2 * H, T0 + 3 * H)
    assert once.misfire is not None and (once.misfire["action"], once.misfire["missed"]) == ("ran_once", 3)
    skip = plan_fire(_hourly("skip", T0), now, GRACE, 0.0)
    assert (skip.fire_for, skip.next_at) == (None, T0 + 3 * H)
    assert skip.misfire is not None and (skip.misfire["action"], skip.misfire["missed"]) == ("skipped", 3)


def test_plan_fire_run_once_expires_beyond_the_grace_period() -> None:
    plan = plan_fire(_hourly("run_once", T0), T0 + 2 * H + timedelta(minutes=20), 600.0, 0.0)
    assert plan.fire_for is None and plan.next_at == T0 + 3 * H
    assert plan.misfire is not None and plan.misfire["action"] == "expired"


def test_plan_fire_late_at_runtime_fires_the_latest_time_and_records_the_rest() -> None:
    now = T0 + 2 * H + timedelta(seconds=5)  # the loop stalled past two fire times
    for policy, action in (("run_once", "ran_once"), ("skip", "skipped")):
        plan = plan_fire(_hourly(policy, T0), now, GRACE, ON_TIME_SECONDS)
        assert (plan.fire_for, plan.next_at) == (T0 + 2 * H, T0 + 3 * H)
        assert plan.misfire is not None and (plan.misfire["action"], plan.misfire["missed"]) == (action, 2)


def test_plan_fire_one_shot_ends_after_its_time() -> None:
    job = _hourly("run_once", T0)
    job.schedule = Schedule("once", at=T0)
    plan = plan_fire(job, T0 + timedelta(seconds=1), GRACE, ON_TIME_SECONDS)
    assert (plan.fire_for, plan.next_at) == (T0, None)


# -- the job table's compare-and-set ----------------------------------------------

@pytest.fixture
async def cron_store(store_url: str) -> AsyncIterator[CronStore]:
    """Cron jobs on a fresh database: once on SQLite, once on PostgreSQL."""
    store = await Store.open(store_url)
    yield CronStore(store)
    await store.close()


async def test_advance_from_a_stale_copy_of_the_job_is_refused(cron_store: CronStore) -> None:
    """Two schedulers that read the job before either fired it advance it once: the second one's copy names a
    next fire time the job no longer has, so its advance changes nothing (no second fire counted, no ending).

    Fails on the mutant ``return await self._update(cron_jobs_t.c.id == job.id, **values)`` in
    ``CronStore.advance`` (the compare-and-set on the previous ``next_fire_at`` dropped)."""
    due = datetime(2031, 5, 6, 9, 0, tzinfo=UTC)
    job = _job("water the plants", "every 2h", repeat=2)
    job.next_fire_at = due
    created = await cron_store.create(job)
    mine, theirs = await cron_store.get(created.id), await cron_store.get(created.id)
    assert mine is not None and theirs is not None

    first = await cron_store.advance(mine, due + timedelta(hours=2), due, None)
    assert first is not None and (first.fires, first.next_fire_at) == (1, due + timedelta(hours=2))
    assert await cron_store.advance(theirs, due + timedelta(hours=2), due, None) is None
    assert await cron_store.advance(theirs, None, due, {"missed": 1}) is None  # would end the job
    stored = await cron_store.get(created.id)
    assert stored is not None
    assert (stored.fires, stored.next_fire_at, stored.state, stored.last_misfire) == (
        1, due + timedelta(hours=2), "active", None)

    second = await cron_store.advance(first, due + timedelta(hours=4), due + timedelta(hours=2), None)
    assert second is not None and (second.fires, second.state, second.next_fire_at) == (2, "done", None)


# -- real restarts ----------------------------------------------------------

class _GatewayProcess:
    """``hermes-gateway run`` as a child process; killed with SIGKILL, never asked to stop."""

    def __init__(self, config: Path, home: Path) -> None:
        self.config, self.home = config, home
        self.proc: asyncio.subprocess.Process | None = None
        self.output: list[str] = []
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "run", "--config", str(self.config),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "HERMES_GATEWAY_HOME": str(self.home)}, cwd=Path(__file__).resolve().parents[2])
        listening = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read(listening))
        await asyncio.wait_for(listening, 30)

    async def _read(self, listening: asyncio.Future[None]) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.output.append(line)
            if "listening on" in line and not listening.done():
                listening.set_result(None)
        if not listening.done():
            listening.set_exception(RuntimeError("gateway exited:\n" + "\n".join(self.output[-30:])))

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await asyncio.wait_for(self.proc.wait(), 10)
        if self._reader is not None:
            await asyncio.wait_for(self._reader, 10)


class _Restarts:
    def __init__(self, tmp_path: Path, model: ScriptedModel, sink: CallbackSink) -> None:
        self.url = f"sqlite:///{tmp_path}/state.db"
        config = {
            "model": {"base_url": model.base_url, "api_key": "test-key", "name": "scripted-model",
                      "max_retries": 0, "stream": False, "timeout": 60},
            "http": {"host": "127.0.0.1", "port": 0},
            "store": {"url": self.url},
            "gateway": {"workspace": str(tmp_path / "workspace"), "drain_timeout": 1},
            "platforms": {"callback": {"targets": {"sink": {"url": sink.url, "secret": "sink-secret-123456"}}}},
            "cron": {"sync_interval_seconds": 0.2},
            "logging": {"level": "WARNING"},
        }
        self.config = tmp_path / "gateway.yaml"
        self.config.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.home = tmp_path
        self.processes: list[_GatewayProcess] = []

    async def start(self) -> _GatewayProcess:
        process = _GatewayProcess(self.config, self.home)
        self.processes.append(process)
        await process.start()
        return process


@pytest.fixture
async def restarts(tmp_path: Path) -> AsyncIterator[tuple[_Restarts, ScriptedModel, CallbackSink, Store]]:
    model = ScriptedModel()
    await model.start()
    sink = CallbackSink()
    await sink.start()
    env = _Restarts(tmp_path, model, sink)
    store = await Store.open(env.url)
    yield env, model, sink, store
    for process in env.processes:
        with contextlib.suppress(Exception):
            await process.kill()
    await store.close()
    await sink.stop()
    await model.stop()


async def _fires(store: Store, job_id: str) -> list[str]:
    query = sa.select(inbox_t.c.dedupe_key).where(inbox_t.c.dedupe_key.like(f"cron:{job_id}:%"))
    return [r.dedupe_key for r in await store.db.read(lambda conn: conn.execute(query).all())]


def _stored(job: CronJob) -> CronJob:
    job.next_fire_at = first_fire(job.schedule, job.zone, datetime.now(UTC))
    return job


async def test_kill_9_during_a_fire_then_restart_delivers_exactly_once(restarts) -> None:
    env, model, sink, store = restarts
    model.responder = rules((r"DAILY REPORT", text("report ready")))
    model.push(text("report ready", latency=30))  # the first attempt is still thinking when the gateway dies
    gateway = await env.start()
    jobs = CronStore(store)
    job = await jobs.create(_stored(_job("DAILY REPORT", "in 1 seconds", deliver="callback:sink")))
    await model.wait_for_requests(1, timeout=10)  # the scheduler picked the job up and fired it
    await gateway.kill()
    assert sink.received == []
    assert len(await _fires(store, job.id)) == 1

    await env.start()
    delivered = await sink.wait_for(1, timeout=15)
    assert delivered[0]["text"] == "report ready"
    await asyncio.sleep(1.0)
    assert len(sink.received) == 1
    assert len(await _fires(store, job.id)) == 1
    assert len(model.requests) == 2  # the run was redone once after the crash, and delivered once

    async def removed() -> bool:
        return await jobs.get(job.id) is None
    await _eventually(removed)


async def test_gateway_down_across_three_fire_times_runs_once_or_skips(restarts, capsys,
                                                                        keep_root_logging: None) -> None:
    env, _model, sink, store = restarts
    jobs = CronStore(store)
    start = datetime.now(UTC).replace(microsecond=0) - 2.5 * H  # due at start, start+1h and start+2h
    hourly = Schedule("interval", seconds=3600, start=start)
    run_once, skip = [await jobs.create(CronJob(
        id="", owner="telegram:1001", prompt=f"MISSED {policy}", schedule=hourly, timezone="UTC",
        origin_platform="telegram", origin_chat_id="100", deliver="callback:sink", misfire=policy,
        next_fire_at=start)) for policy in ("run_once", "skip")]

    await env.start()
    delivered = await sink.wait_for(1, timeout=15)
    assert delivered[0]["text"] == "Echo: MISSED run_once"
    await asyncio.sleep(1.0)
    assert len(sink.received) == 1
    assert await _fires(store, run_once.id) == [f"cron:{run_once.id}:{(start + 2 * H).isoformat()}"]
    assert await _fires(store, skip.id) == []
    for job_id, fires, action in ((run_once.id, 1, "ran_once"), (skip.id, 0, "skipped")):
        stored = await jobs.get(job_id)
        assert stored is not None and stored.fires == fires and stored.next_fire_at == start + 3 * H
        assert stored.last_misfire is not None
        assert (stored.last_misfire["action"], stored.last_misfire["missed"]) == (action, 3)

    assert await asyncio.to_thread(main, ["cron", "list", "--config", str(env.config), "--log-level", "ERROR"]) == 0
    listing = capsys.readouterr().out
    assert "misfire ran_once (3 missed)" in listing and "misfire skipped (3 missed)" in listing


async def test_a_run_finishing_before_the_scheduler_loaded_its_job_still_removes_a_finished_one_shot(
        tmp_path: Path) -> None:
    """At start, unfinished runs are resumed before the scheduler loads its jobs; a resumed one-shot fire can
    finish first. Its job (done) is read from the store then, and removed: it used to stay forever (seen as a
    flaky `test_kill_9_during_a_fire_then_restart_delivers_exactly_once` on a loaded machine)."""
    store = await Store.open(f"sqlite:///{tmp_path}/state.db")
    try:
        jobs = CronStore(store)
        job = await jobs.create(_job("ONCE", "in 1 minutes", state="done", fires=1))
        service = CronService(parse_config({}), store, _never_called, None, {}, Metrics())  # type: ignore[arg-type]
        event = MessageEvent(platform="cron", event_id=f"cron:{job.id}:x", chat_id="100", chat_type="dm",
                             user_id="1001", user_name="cron", text="ONCE", metadata={"job_id": job.id})
        run = RunJob(inbox_id=1, run_id="r1", kind="cron", source="cron", session_key="cron:x", event=event,
                     toolsets=[], target=None, history=False)
        await service.run_finished(run, RunCompletion("r1", 1, "completed", result="done"), True)
        assert await jobs.get(job.id) is None
    finally:
        await store.close()


async def _never_called(_event: MessageEvent) -> Any:
    raise AssertionError("no message is offered")
