"""The session reset policy (``sessions:``): a conversation idle too long, or past the daily reset hour, starts
afresh on its next message, announced once in the reply; through the real Telegram adapter and its simulator.
Time moves by setting the session's stored last activity back."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa

from gateway.app import Gateway
from gateway.config import ConfigError, parse_config
from gateway.schema import sessions_t
from gateway.session_reset import DAILY, IDLE, ResetPolicy
from gateway.sim.model_server import ScriptedModel
from gateway.sim.telegram_api import DEFAULT_USER_ID, TelegramSimulator
from gateway.state_stores import ToolStateStore
from gateway.store import NewRun, SessionRef, SessionReset, Store
from tests.conftest import SIM_MODEL_KEY
from tests.gateway.schema_history import back_to
from tools.cronjob_tools import CronJob, parse_schedule

USER = DEFAULT_USER_ID
KEY = f"telegram:dm:{USER}"
IDLE_NOTICE = "(New conversation: the last one was idle for 5 h. /help for commands.)"
HOUR = 3600.0


@dataclass
class World:
    """The simulators and the gateways started against them (stopped at teardown), on one database."""

    model: ScriptedModel
    sim: TelegramSimulator
    home: Path
    gateways: list[Gateway] = field(default_factory=list)

    async def start(self, sessions: dict[str, Any], store_url: str | None = None) -> Gateway:
        data = {
            "model": {"base_url": self.model.base_url, "api_key": SIM_MODEL_KEY, "name": "scripted-model",
                      "max_retries": 0, "stream": False},
            "http": {"port": 0},
            "store": {"url": store_url or f"sqlite:///{self.home}/state.db"},
            "gateway": {"workspace": str(self.home / "workspace"), "typing_delay": 0, "drain_timeout": 1},
            "auth": {"platforms": {"telegram": {"allowed_users": [str(USER)]}}},
            "platforms": {"telegram": {"enabled": True, "token": self.sim.token, "base_url": self.sim.base_url,
                                       "base_file_url": self.sim.base_file_url}},
            "sessions": sessions,
        }
        gateway = Gateway(parse_config(data, env={"HERMES_GATEWAY_HOME": str(self.home)}))
        self.gateways.append(gateway)
        await gateway.start()
        return gateway

    def texts(self) -> list[str]:
        """What the user sees from the bot, oldest first."""
        return [m["text"] for m in self.sim.chat_history(USER) if m["from"]["id"] == self.sim.bot_id and "text" in m]

    async def say(self, text: str) -> str:
        """The user sends ``text``; returns the bot's reply (its one new message)."""
        before = len(self.texts())
        self.sim.user_sends(text)
        await self.sim.wait_for(lambda: len(self.texts()) > before, timeout=10)
        return self.texts()[before]

    def history_sent(self, request: int = -1) -> list[str | None]:
        """The contents of a model request after its system prompt."""
        return [m["content"] for m in self.model.requests[request]["messages"][1:]]


@pytest.fixture
async def world(tmp_path: Path, sims: tuple[ScriptedModel, TelegramSimulator]) -> AsyncIterator[World]:
    model, sim = sims
    w = World(model, sim, tmp_path)
    yield w
    for gateway in w.gateways:
        await gateway.stop(drain_timeout=1)


async def _session(store: Store) -> Any:
    return await store.db.read(lambda conn: conn.execute(sa.select(sessions_t)).one())


async def _last_active(store: Store, at: float) -> None:
    """Move the session's last activity to ``at``."""
    await store.db.write(lambda conn: conn.execute(sessions_t.update().values(updated_at=at)))


async def _idle_for(store: Store, seconds: float) -> None:
    await _last_active(store, (await _session(store)).updated_at - seconds)


# -- the policy ------------------------------------------------------------------------------------------


def _policy(sessions: dict[str, Any], cron_zone: str = "UTC") -> ResetPolicy:
    policy = ResetPolicy.from_config(parse_config({"sessions": sessions, "cron": {"timezone": cron_zone}}, env={}))
    assert policy is not None
    return policy


def _at(zone: str, *when: int) -> float:
    return datetime(*when, tzinfo=ZoneInfo(zone)).timestamp()  # type: ignore[misc]


def test_idle_resets_past_the_limit_only() -> None:
    policy = _policy({"reset_after_idle_minutes": 240})
    assert policy.reason(1000.0, 1000.0 + 4 * HOUR) is None
    assert policy.reason(1000.0, 1000.0 + 4 * HOUR + 1) == IDLE


def test_the_daily_hour_is_in_the_sessions_zone_else_crons() -> None:
    kolkata = _policy({"daily_reset_hour": 4}, cron_zone="Asia/Kolkata")  # UTC+5:30: 04:00 there is 22:30 UTC
    reset = _at("UTC", 2025, 6, 1, 22, 30)
    assert kolkata.last_daily_reset(reset + 5 * HOUR) == reset
    assert kolkata.last_daily_reset(reset - 60) == reset - 24 * HOUR
    assert kolkata.reason(reset - 60, reset) == DAILY
    assert kolkata.reason(reset, reset + 20 * HOUR) is None  # the same day, however long
    assert kolkata.reason(reset + 60, reset + 24 * HOUR) == DAILY
    utc = _policy({"daily_reset_hour": 4, "timezone": "UTC"}, cron_zone="Asia/Kolkata")
    assert utc.reason(reset - 60, reset + 60) is None


def test_a_daily_hour_the_clocks_skip_resets_when_they_reach_it() -> None:
    berlin = _policy({"daily_reset_hour": 2, "timezone": "Europe/Berlin"})  # 2025-03-30: 02:00 CET -> 03:00 CEST
    assert berlin.last_daily_reset(_at("Europe/Berlin", 2025, 3, 30, 12)) == _at("UTC", 2025, 3, 30, 1)
    assert berlin.last_daily_reset(_at("Europe/Berlin", 2025, 10, 26, 12)) == _at("UTC", 2025, 10, 26, 0)


def test_the_notice_names_the_reason() -> None:
    policy = _policy({"reset_after_idle_minutes": 60, "daily_reset_hour": 0})
    assert policy.notice(SessionReset(IDLE, 5 * HOUR + 59)) == IDLE_NOTICE
    assert policy.notice(SessionReset(IDLE, 61 * 60)) == \
        "(New conversation: the last one was idle for 61 min. /help for commands.)"
    assert policy.notice(SessionReset(IDLE, 3 * 24 * HOUR)) == \
        "(New conversation: the last one was idle for 3 days. /help for commands.)"
    assert policy.notice(SessionReset(DAILY, 9 * HOUR)) == \
        "(New conversation: the daily reset at 00:00 passed. /help for commands.)"


def test_no_policy_without_a_limit_or_hour() -> None:
    assert ResetPolicy.from_config(parse_config({}, env={})) is None


@pytest.mark.parametrize(("sessions", "error"), [
    ({"reset_after_idle_minutes": 0},
     "sessions.reset_after_idle_minutes: must be at least 1 minute, got 0 (e.g. 240 for four hours; "
     "null never resets)"),
    ({"reset_after_idle_minutes": "4h"}, "sessions.reset_after_idle_minutes: Input should be a valid integer"),
    ({"daily_reset_hour": 24},
     "sessions.daily_reset_hour: must be an hour from 0 to 23, got 24 (e.g. 4 for 04:00; null: no daily reset)"),
    ({"timezone": "Europe/Berln"}, "sessions.timezone: unknown time zone 'Europe/Berln' (did you mean "
                                   "'Europe/Berlin'? use an IANA name such as 'Europe/Berlin' or 'UTC')"),
])
def test_bad_values_name_the_key_and_the_fix(sessions: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config({"sessions": sessions}, env={})
    assert str(exc.value).startswith(error)


# -- the store: a run resets its session once, whichever start -------------------------------------------


@pytest.fixture
async def db(store_url: str) -> AsyncIterator[Store]:
    s = await Store.open(store_url)
    yield s
    await s.close()


async def _accept(store: Store) -> tuple[str, int]:
    run = NewRun(uuid.uuid4().hex, "chat", "telegram", [], "hi", f"telegram:{USER}")
    acc = await store.accept(uuid.uuid4().hex, "telegram", "chat", KEY, {}, run)
    return run.id, acc.inbox_id


async def test_a_run_started_again_gets_its_first_starts_epoch_and_reset(db: Store) -> None:
    ref, rule = SessionRef(KEY, "telegram", str(USER), str(USER), None), _policy({"reset_after_idle_minutes": 60})
    first = await _accept(db)
    assert (await db.start_run(*first, ref, 10, rule.reason)).epoch == 0  # the session is created
    await _idle_for(db, 2 * HOUR)
    second = await _accept(db)
    for _ in range(3):  # the first start, then starts after crashes
        context = await db.start_run(*second, ref, 10, rule.reason)
        assert context is not None and context.epoch == 1
        assert context.reset is not None and (context.reset.reason, round(context.reset.idle_seconds / HOUR)) == (
            IDLE, 2)
    row = await _session(db)
    assert row.epoch == 1 and json.loads(row.last_reset)["run"] == second[0]
    created = (await db.get_run(second[0])).created_at
    assert row.updated_at == created  # the activity is the message's acceptance, not a start's clock

    third = await _accept(db)
    context = await db.start_run(*third, ref, 10, rule.reason)
    assert (context.epoch, context.reset) == (1, None)
    assert (await db.start_run(*third, ref, 10, None)).reset is None


async def test_a_run_without_a_chat_session_leaves_the_chats_alone(db: Store) -> None:
    ref, rule = SessionRef(KEY, "telegram", str(USER), str(USER), None), _policy({"reset_after_idle_minutes": 60})
    await db.start_run(*await _accept(db), ref, 10, rule.reason)
    await _idle_for(db, 2 * HOUR)
    before = await _session(db)
    context = await db.start_run(*await _accept(db), None, 0, rule.reason)  # as a cron or webhook run starts
    assert context is not None and (context.epoch, context.reset) == (None, None)
    assert await _session(db) == before


async def test_a_version_4_database_gets_the_last_reset_column(store_url: str) -> None:
    first = await Store.open(store_url)
    await first.session_epoch(KEY, "telegram", str(USER), str(USER), None)

    await first.db.write(lambda conn: back_to(conn, 4))
    await first.close()
    upgraded = await Store.open(store_url)
    try:
        ref, rule = SessionRef(KEY, "telegram", str(USER), str(USER), None), _policy({"reset_after_idle_minutes": 1})
        await _idle_for(upgraded, HOUR)
        context = await upgraded.start_run(*await _accept(upgraded), ref, 0, rule.reason)
        assert context is not None and context.epoch == 1 and context.reset is not None
    finally:
        await upgraded.close()


# -- end to end through Telegram ---------------------------------------------------------------------------


async def test_an_idle_session_starts_a_new_conversation_announced_once(world: World) -> None:
    gw = await world.start({"reset_after_idle_minutes": 60})
    assert await world.say("my name is Ada") == "Echo: my name is Ada"
    assert gw.store is not None
    await ToolStateStore(gw.store).add_note(f"telegram:{USER}", "likes green tea")
    await _idle_for(gw.store, 5 * HOUR)

    assert await world.say("what is my name?") == f"{IDLE_NOTICE}\n\nEcho: what is my name?"
    assert world.history_sent() == ["what is my name?"]  # the old conversation is not sent
    assert "likes green tea" in world.model.requests[-1]["messages"][0]["content"]  # memory is the user's

    assert await world.say("and now?") == "Echo: and now?"  # announced once
    assert world.history_sent() == ["what is my name?", "Echo: what is my name?", "and now?"]
    assert len(world.texts()) == 3 and (await _session(gw.store)).epoch == 1


async def test_a_session_active_within_the_limit_goes_on(world: World) -> None:
    gw = await world.start({"reset_after_idle_minutes": 60})
    await world.say("my name is Ada")
    assert gw.store is not None
    await _idle_for(gw.store, 59 * 60)
    assert await world.say("what is my name?") == "Echo: what is my name?"
    assert world.history_sent() == ["my name is Ada", "Echo: my name is Ada", "what is my name?"]
    assert (await _session(gw.store)).epoch == 0


@pytest.mark.parametrize("last_active", ["before", "after"])
async def test_the_daily_reset_hour_in_a_non_utc_zone(world: World, last_active: str) -> None:
    """The reset hour is the local hour that began 30 to 90 minutes ago in Kolkata (UTC+5:30): the session was
    last active a minute before it (reset) or a minute after it (same day, no reset)."""
    zone = ZoneInfo("Asia/Kolkata")
    boundary = (datetime.now(zone) - timedelta(minutes=30)).replace(minute=0, second=0, microsecond=0)
    gw = await world.start({"daily_reset_hour": boundary.hour, "timezone": "Asia/Kolkata"})
    await world.say("my name is Ada")
    assert gw.store is not None
    await _last_active(gw.store, boundary.timestamp() + (-60 if last_active == "before" else 60))

    reply = await world.say("what is my name?")
    if last_active == "before":
        assert reply == (f"(New conversation: the daily reset at {boundary.hour:02d}:00 passed. /help for commands.)"
                         "\n\nEcho: what is my name?")
        assert world.history_sent() == ["what is my name?"]
    else:
        assert reply == "Echo: what is my name?"
        assert world.history_sent() == ["my name is Ada", "Echo: my name is Ada", "what is my name?"]


async def test_a_run_redone_after_a_restart_resets_once_and_announces_once(store_url: str, world: World) -> None:
    # store_url first: its database outlives the gateways (fixtures end in reverse order).
    gw = await world.start({"reset_after_idle_minutes": 60}, store_url)
    await world.say("my name is Ada")
    assert gw.store is not None
    await _idle_for(gw.store, 5 * HOUR)
    world.model.hang_next(1)
    world.sim.user_sends("what is my name?")
    await world.model.wait_for_requests(2, timeout=10)
    await gw.stop(drain_timeout=0)  # mid-run: its start (and reset) is stored, its answer is not

    await world.start({"reset_after_idle_minutes": 60}, store_url)
    await world.sim.wait_for(lambda: len(world.texts()) == 2, timeout=10)
    assert world.texts()[1] == f"{IDLE_NOTICE}\n\nEcho: what is my name?"
    assert world.history_sent(1) == world.history_sent(2) == ["what is my name?"]  # the same conversation
    assert await world.say("and now?") == "Echo: and now?"
    assert world.history_sent() == ["what is my name?", "Echo: what is my name?", "and now?"]
    store = world.gateways[-1].store
    assert store is not None and (await _session(store)).epoch == 1


async def test_a_cron_run_into_the_chat_neither_resets_nor_counts_as_activity(world: World) -> None:
    gw = await world.start({"reset_after_idle_minutes": 60})
    await world.say("my name is Ada")
    assert gw.store is not None and gw.cron is not None
    await _idle_for(gw.store, 5 * HOUR)
    before = await _session(gw.store)
    hourly = parse_schedule("every 1h", UTC, datetime.now(UTC))
    job = await gw.cron.create(CronJob(id="", owner=f"telegram:{USER}", prompt="CRON PING", schedule=hourly,
                                       timezone="UTC", origin_platform="telegram", origin_chat_id=str(USER)), None)
    assert await gw.cron.run_now(job.id, None) is not None
    await world.sim.wait_for(lambda: len(world.texts()) == 2, timeout=10)
    assert world.texts()[1] == "Echo: CRON PING"
    assert await _session(gw.store) == before
    assert await world.say("what is my name?") == f"{IDLE_NOTICE}\n\nEcho: what is my name?"
