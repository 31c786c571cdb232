"""Token usage and ``/usage``: the tokens the scripted model reports are summed per run, stored with the run's end,
and shown per conversation, per user today and this month, priced with ``model.prices``."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa

from gateway.app import Gateway
from gateway.commands.usage import format_cost
from gateway.config import ConfigError, parse_config
from gateway.config.sections import ModelPrice
from gateway.schema import run_usage_t
from gateway.sim.model_server import ScriptedModel, Turn, text, tool_call
from gateway.sim.telegram_api import DEFAULT_USER_ID, TelegramSimulator
from gateway.store import NewRun, RunCompletion, RunUsage, SessionRef, Store
from gateway.usage import period_starts, usage_report
from tests.gateway.conftest import StartTelegramGateway
from tools.cronjob_tools import CronJob, parse_schedule

ALICE, BOB = DEFAULT_USER_ID, 1002  # DMs: each chat id is its user's
MODEL = "scripted-model"
PRICES = {MODEL: {"input": 2.5, "output": 10}}  # dollars per million tokens

StartTelegram = Callable[..., Awaitable[tuple[Gateway, ScriptedModel]]]


def _reported(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _tool_run(first: tuple[int, int], second: tuple[int, int], answer: str = "All done.") -> tuple[Turn, Turn]:
    """A two-call run: a tool call, then the answer, each reporting (prompt, completion) tokens."""
    return (tool_call("todo", {"action": "list"}, usage=_reported(*first)), text(answer, usage=_reported(*second)))


@pytest.fixture
async def telegram(telegram_gateway: StartTelegramGateway) -> AsyncIterator[tuple[TelegramSimulator, StartTelegram]]:
    """The Telegram simulator and a factory starting a gateway with the real Telegram adapter against it."""
    async with TelegramSimulator() as sim, ScriptedModel() as model:
        async def start(**model_settings: Any) -> tuple[Gateway, ScriptedModel]:
            return await telegram_gateway(sim, model, {
                "model": model_settings, "auth": {"platforms": {"telegram": {"allowed_users": [str(ALICE), str(BOB)]}}},
                "platforms": {"telegram": {"tool_progress": "off"}}}), model

        yield sim, start


async def _ask(sim: TelegramSimulator, prompt: str, answer: str, user: int = ALICE) -> None:
    before = sum(s.text == answer for s in sim.sent_messages(user))
    sim.user_sends(prompt, user_id=user)
    await sim.wait_for(lambda: sum(s.text == answer for s in sim.sent_messages(user)) > before, timeout=10)


async def _usage(sim: TelegramSimulator, user: int = ALICE) -> list[str]:
    """Send /usage; the reply's lines."""
    def replies() -> list[str]:
        return [s.text or "" for s in sim.sent_messages(user) if (s.text or "").startswith("Token usage")]
    before = len(replies())
    sim.user_sends("/usage", user_id=user)
    await sim.wait_for(lambda: len(replies()) > before, timeout=10)
    return replies()[-1].splitlines()


async def _rows(gateway: Gateway) -> list[Any]:
    assert gateway.store is not None
    return await gateway.store.db.read(
        lambda conn: conn.execute(sa.select(run_usage_t).order_by(run_usage_t.c.created_at)).all())


async def _insert(gateway: Gateway, user_key: str, created_at: float, prompt: int, completion: int,
                  model: str = MODEL) -> None:
    """A run's usage stored at ``created_at`` in another conversation of the user's."""
    assert gateway.store is not None
    row = {"run_id": uuid.uuid4().hex, "kind": "chat", "session_key": "telegram:dm:other", "epoch": 0,
           "user_key": user_key, "model": model, "prompt_tokens": prompt, "completion_tokens": completion,
           "created_at": created_at}
    await gateway.store.db.write(lambda conn: conn.execute(run_usage_t.insert(), row))


# -- end to end through the Telegram simulator -----------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_usage_shows_the_sum_of_what_the_model_reported_and_its_cost(
        telegram: tuple[TelegramSimulator, StartTelegram], stream: bool) -> None:
    sim, start = telegram
    gateway, model = await start(stream=stream, prices=PRICES)
    model.push(*_tool_run((1200, 35), (1350, 65)))
    await _ask(sim, "what is left to do?", "All done.")
    assert [r.get("stream", False) for r in model.requests] == [stream, stream]
    if stream:
        assert all(r["stream_options"] == {"include_usage": True} for r in model.requests)
    [row] = await _rows(gateway)
    assert (row.kind, row.user_key, row.model, row.epoch) == ("chat", f"telegram:{ALICE}", MODEL, 0)
    assert (row.prompt_tokens, row.completion_tokens) == (2550, 100)
    assert gateway.store is not None
    [run] = await gateway.store.list_runs()  # as `runs list --json` and GET /runs show it
    assert run.to_dict()["usage"] == {"kind": "chat", "user_key": f"telegram:{ALICE}", "model": MODEL,
                                      "prompt_tokens": 2550, "completion_tokens": 100}

    # 2,550 input tokens at $2.50 and 100 output tokens at $10 per million: $0.006375 + $0.001 = $0.007375
    assert await _usage(sim) == [
        "Token usage (days in UTC):",
        "This conversation (since /new): 2,550 in, 100 out · 1 run · $0.0074",
        "You today: 2,550 in, 100 out · 1 run · $0.0074",
        "You this month: 2,550 in, 100 out · 1 run · $0.0074",
    ]


async def test_usage_is_per_user_per_period_and_the_conversation_restarts_with_new(
        telegram: tuple[TelegramSimulator, StartTelegram]) -> None:
    sim, start = telegram
    gateway, model = await start(prices=PRICES)
    model.push(*_tool_run((1000, 20), (1100, 30)))
    await _ask(sim, "what is left to do?", "All done.")
    model.push(*_tool_run((5000, 500), (6000, 600), answer="Bob's done."))
    await _ask(sim, "and for me?", "Bob's done.", user=BOB)
    day, month = period_starts(datetime.now(UTC), ZoneInfo("UTC"))
    await _insert(gateway, f"telegram:{ALICE}", day - 1, 300_000, 3_000)  # yesterday
    await _insert(gateway, f"telegram:{ALICE}", month - 1, 4_000_000, 40_000)  # last month
    yesterday_this_month = day - 1 >= month  # not on the 1st

    lines = await _usage(sim)
    assert lines[1] == "This conversation (since /new): 2,100 in, 50 out · 1 run · $0.0058"
    assert lines[2] == "You today: 2,100 in, 50 out · 1 run · $0.0058"
    # with yesterday's run: 302,100 in at $2.50 and 3,050 out at $10 per million = $0.75525 + $0.0305
    assert lines[3] == ("You this month: 302,100 in, 3,050 out · 2 runs · $0.7858" if yesterday_this_month
                        else "You this month: 2,100 in, 50 out · 1 run · $0.0058")
    bob = "11,000 in, 1,100 out · 1 run · $0.0385"  # $0.0275 + $0.011
    assert (await _usage(sim, BOB))[1:] == [f"This conversation (since /new): {bob}", f"You today: {bob}",
                                            f"You this month: {bob}"]

    sim.user_sends("/new")
    await sim.wait_for(lambda: any((s.text or "").startswith("Started a new") for s in sim.sent_messages(ALICE)))
    assert (await _usage(sim))[1:3] == ["This conversation (since /new): nothing yet",
                                        "You today: 2,100 in, 50 out · 1 run · $0.0058"]
    model.push(text("Hello again.", usage=_reported(400, 4)))
    await _ask(sim, "hi", "Hello again.")
    assert (await _usage(sim))[1:3] == ["This conversation (since /new): 400 in, 4 out · 1 run · $0.001",
                                        "You today: 2,500 in, 54 out · 2 runs · $0.0068"]
    assert [r.epoch for r in await _rows(gateway) if r.session_key == f"telegram:dm:{ALICE}"] == [0, 1]


async def test_without_prices_usage_shows_tokens_and_says_the_cost_is_unknown(
        telegram: tuple[TelegramSimulator, StartTelegram]) -> None:
    sim, start = telegram
    _, model = await start()
    model.push(text("Hi.", usage=_reported(10, 2)))
    await _ask(sim, "hello", "Hi.")
    lines = await _usage(sim)
    assert lines[1] == "This conversation (since /new): 10 in, 2 out · 1 run"
    assert lines[-1] == "Cost: no model prices are configured on this gateway."


async def test_a_model_without_a_price_is_named_and_left_out_of_the_cost(
        telegram: tuple[TelegramSimulator, StartTelegram]) -> None:
    sim, start = telegram
    gateway, model = await start(prices={"other-model": {"input": 1, "output": 1}})
    model.push(text("Hi.", usage=_reported(10, 2)))
    await _ask(sim, "hello", "Hi.")
    await _insert(gateway, f"telegram:{ALICE}", time.time(), 1_000_000, 0, model="other-model")
    assert await _usage(sim) == [
        "Token usage (days in UTC):",
        "This conversation (since /new): 10 in, 2 out · 1 run · cost unknown",
        "You today: 1,000,010 in, 2 out · 2 runs · $1.00 + unknown",
        "You this month: 1,000,010 in, 2 out · 2 runs · $1.00 + unknown",
        f"Cost unknown (no price configured) for {MODEL}.",
    ]


async def test_cron_runs_count_for_their_owner_and_webhook_runs_for_no_user(make_gateway) -> None:
    h = await make_gateway()
    h.model.push(text("Weather: sunny", usage=_reported(70, 7)), text("Pushed.", usage=_reported(50, 5)))
    job = await h.gateway.cron.create(CronJob(
        id="", owner="telegram:1001", prompt="CHECK WEATHER", timezone="UTC", origin_platform="telegram",
        origin_chat_id="100", schedule=parse_schedule("every 1h", ZoneInfo("UTC"), datetime.now(UTC))), None)
    cron_run = await h.gateway.cron.run_now(job.id, "telegram:1001")
    assert cron_run is not None and (await h.wait_run(cron_run))["status"] == "completed"
    _, accepted = await h.post_webhook()
    webhook = await h.wait_run(accepted["run_id"])  # GET /runs/{id}
    assert webhook["usage"] == {"kind": "webhook", "user_key": None, "model": MODEL, "prompt_tokens": 50,
                                "completion_tokens": 5}
    rows = {r.run_id: r for r in await _rows(h.gateway)}
    assert (rows[cron_run].kind, rows[cron_run].user_key, rows[cron_run].epoch) == ("cron", "telegram:1001", None)
    assert (rows[cron_run].prompt_tokens, rows[cron_run].completion_tokens) == (70, 7)
    assert rows[accepted["run_id"]].epoch is None


async def test_a_run_that_fails_after_a_model_call_keeps_its_usage(make_gateway) -> None:
    def respond(request: dict[str, Any]) -> Turn:
        if request["messages"][-1]["role"] == "tool":  # the second call fails (an HTTP 500; no retries)
            raise RuntimeError("the model server broke")
        return tool_call("todo", {"action": "list"}, usage=_reported(300, 30))

    h = await make_gateway(responder=respond)
    accepted = await h.chat.user_says("plan my day")
    assert (await h.wait_run(accepted.run_id))["status"] == "failed"
    [row] = await _rows(h.gateway)
    assert (row.run_id, row.prompt_tokens, row.completion_tokens, row.user_key) == (
        accepted.run_id, 300, 30, "telegram:1001")


# -- the store and the usage queries (SQLite and PostgreSQL) ----------------------------------------------------


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


async def _stored_run(store: Store, run_id: str, key: str, usage: RunUsage) -> bool:
    """Accept, start and finish a chat run of session ``key`` with ``usage``; whether its end was stored."""
    acc = await store.accept(f"evt-{run_id}", "telegram", "chat", key, {},
                             NewRun(run_id, "chat", "telegram", [], "hi"))
    context = await store.start_run(run_id, acc.inbox_id, SessionRef(key, "telegram", key, "1001", None))
    assert context is not None
    done = RunCompletion(run_id, acc.inbox_id, "completed", result="ok", session_key=key, epoch=context.epoch,
                         usage=usage)
    return await store.finish_run(done) is not None


async def test_usage_is_stored_once_with_the_runs_end_and_the_conversation_is_the_current_epoch(
        store_url: str) -> None:
    store = await Store.open(store_url)
    try:
        key, user = "telegram:dm:1001", "telegram:1001"
        assert await _stored_run(store, "r1", key, RunUsage("chat", user, "m-a", 100, 10))
        assert await store.finish_run(RunCompletion("r1", None, "completed", session_key=key, epoch=0,
                                                    usage=RunUsage("chat", user, "m-a", 999, 999))) is None
        assert await _stored_run(store, "r2", key, RunUsage("chat", user, "m-a", 0, 0))  # nothing reported: no row
        now = datetime.now(UTC)
        report = await usage_report(store, key, user, now, ZoneInfo("UTC"))
        assert report.conversation.models == report.today.models == report.month.models
        [only] = report.conversation.models
        assert (only.model, only.runs, only.prompt_tokens, only.completion_tokens) == ("m-a", 1, 100, 10)

        assert await store.reset_session(key) == 1
        assert await _stored_run(store, "r3", key, RunUsage("chat", user, "m-b", 5, 1))
        assert await _stored_run(store, "r4", key, RunUsage("chat", user, "m-a", 7, 2))
        report = await usage_report(store, key, user, now, ZoneInfo("UTC"))
        assert [(m.model, m.runs, m.prompt_tokens, m.completion_tokens) for m in report.conversation.models] == [
            ("m-a", 1, 7, 2), ("m-b", 1, 5, 1)]
        assert (report.today.runs, report.today.prompt_tokens, report.today.completion_tokens) == (3, 112, 13)
        prices = {"m-a": ModelPrice(input=0.15, output=0.6)}
        assert report.today.cost(prices) == (Decimal("0.00002325"), ["m-b"])  # (107 × 0.15 + 12 × 0.6) / 1e6
    finally:
        await store.close()


async def test_today_and_this_month_start_at_midnight_in_the_time_zone(store_url: str) -> None:
    store = await Store.open(store_url)
    try:
        user = "telegram:1001"
        rows = {"a": "2025-02-28 04:59:59", "b": "2025-02-28 05:00:00", "c": "2025-02-01 04:59:59",
                "d": "2025-02-01 05:00:00", "e": "2025-03-01 02:00:00"}
        tokens = {"a": 1, "b": 10, "c": 100, "d": 1000, "e": 10000}
        await store.db.write(lambda conn: conn.execute(run_usage_t.insert(), [
            {"run_id": name, "kind": "chat", "session_key": "s", "epoch": 0, "user_key": user, "model": "m",
             "prompt_tokens": tokens[name], "completion_tokens": 0, "created_at": _ts(at)}
            for name, at in rows.items()] + [
            {"run_id": "other", "kind": "chat", "session_key": "s2", "epoch": 0, "user_key": "telegram:1002",
             "model": "m", "prompt_tokens": 5, "completion_tokens": 0, "created_at": _ts("2025-03-01 02:00:00")}]))
        now = datetime(2025, 3, 1, 3, 0, tzinfo=UTC)  # 22:00 on 28 February in New York (UTC-5)
        new_york = await usage_report(store, "s", user, now, ZoneInfo("America/New_York"))
        assert new_york.today.prompt_tokens == 10 + 10000  # b, e
        assert new_york.month.prompt_tokens == 1 + 10 + 1000 + 10000  # a, b, d, e
        utc = await usage_report(store, "s", user, now, ZoneInfo("UTC"))
        assert utc.today.prompt_tokens == utc.month.prompt_tokens == 10000  # e
    finally:
        await store.close()


def test_period_starts_are_local_midnights() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    day, month = period_starts(datetime(2025, 3, 30, 12, 0, tzinfo=UTC), berlin)  # the day clocks go forward
    assert (day, month) == (_ts("2025-03-29 23:00:00"), _ts("2025-02-28 23:00:00"))


# -- prices and costs ------------------------------------------------------------------------------------------


def test_cost_is_rounded_to_the_cent_from_a_dollar_and_to_four_decimals_below() -> None:
    cases = {"0": "$0.00", "0.00004": "<$0.0001", "0.00005": "$0.0001", "0.001": "$0.001", "0.007375": "$0.0074",
             "0.5": "$0.50", "0.99996": "$1.00", "1": "$1.00", "1234.565": "$1,234.57"}
    assert {c: format_cost(Decimal(c)) for c in cases} == cases


@pytest.mark.parametrize(("price", "problem"), [
    ({"input": -0.15, "output": 0.6}, "model.prices.gpt-4o-mini.input: must be a price of 0 or more (got -0.15: "
                                      "write US dollars per million tokens as a plain number, e.g. 0.15)"),
    ({"input": 0.15, "output": "$0.60"}, "model.prices.gpt-4o-mini.output: must be a price of 0 or more (got "
                                         "'$0.60': write US dollars per million tokens as a plain number, e.g. 0.15)"),
    ({"input": 0.15}, "model.prices.gpt-4o-mini.output: required"),
    ({"input": 0.15, "output": 0.6, "cached": 0.07}, "model.prices.gpt-4o-mini.cached: unknown key"),
])
def test_a_bad_price_names_the_key_and_the_fix(price: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"model": {"prices": {"gpt-4o-mini": price}}}, {"HERMES_GATEWAY_HOME": "/tmp/h"})
    assert str(info.value).startswith(problem)


def test_prices_read_from_environment_variables_are_numbers() -> None:
    cfg = parse_config({"model": {"prices": {"m": {"input": "${IN}", "output": "${OUT:-0}"}}}},
                       {"HERMES_GATEWAY_HOME": "/tmp/h", "IN": "0.15"})
    assert cfg.model.prices == {"m": ModelPrice(input=0.15, output=0.0)}
