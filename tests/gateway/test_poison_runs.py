"""Poison runs: a run the gateway stops during is started at most ``gateway.max_run_attempts`` times, then
recorded as failed with one notice to its user, and its session goes on with the next message."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.sim.model_server import ScriptedModel, last_user_text, rules, text, tool_call
from gateway.sim.telegram_api import TelegramSimulator
from gateway.store import NewRun, OutboxPart, OutboxRow, RunCompletion, Store
from tests.conftest import GatewayFactory
from tests.gateway_process import GatewayProcess

KEY = "telegram:dm:100"
NOTICE = ("I couldn't finish answering your message: the gateway stopped while working on it twice. "
          "It was skipped; please try again or rephrase.")
GAVE_UP = "gave up after 2 attempts: the gateway stopped during each"


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    s = await Store.open(store_url)
    yield s
    await s.close()


def _new_run(kind: str = "chat") -> NewRun:
    return NewRun(uuid.uuid4().hex, kind, "telegram" if kind == "chat" else "github", [], "hi", "telegram:100")


def _gave_up(run_id: str, inbox_id: int, seen: list[int]) -> Any:
    def completion(attempts: int) -> RunCompletion:
        seen.append(attempts)
        return RunCompletion(run_id, inbox_id, "failed", result="notice", error=f"gave up after {attempts}",
                             deliveries=[])
    return completion


# -- the store -------------------------------------------------------------------------------------------


async def test_every_start_counts_an_attempt_durably_on_both_start_paths(store: Store, store_url: str) -> None:
    queued = await store.accept("telegram:1", "telegram", "chat", KEY, {}, chat := _new_run())
    assert (await store.get_run(chat.id)).attempts == 0
    for expected in (1, 2, 3):  # each start after a stop of the gateway
        assert await store.start_run(chat.id, queued.inbox_id) is not None
        assert (await store.get_run(chat.id)).attempts == expected

    started = await store.accept("webhook:1", "webhook", "webhook", "webhook:github:1", {}, hook := _new_run("webhook"),
                                 started=True)
    assert (await store.get_run(hook.id)).attempts == 1  # started by the transaction that accepted it
    await store.start_run(hook.id, started.inbox_id)

    reopened = await Store.open(store_url)
    try:
        assert [(await reopened.get_run(r)).attempts for r in (chat.id, hook.id)] == [3, 2]
    finally:
        await reopened.close()


async def test_give_up_ends_a_run_started_max_attempts_times_once(store: Store) -> None:
    acc = await store.accept("telegram:1", "telegram", "chat", KEY, {}, run := _new_run())
    seen: list[int] = []
    notice = RunCompletion(run.id, acc.inbox_id, "failed", result="notice", error="gave up")
    assert await store.give_up_run(run.id, 2, _gave_up(run.id, acc.inbox_id, seen)) is None  # never started
    await store.start_run(run.id, acc.inbox_id)
    assert await store.give_up_run(run.id, 2, _gave_up(run.id, acc.inbox_id, seen)) is None  # one attempt left
    assert (await store.get_run(run.id)).status == "running" and seen == []

    await store.start_run(run.id, acc.inbox_id)
    assert await store.give_up_run(run.id, 2, _gave_up(run.id, acc.inbox_id, seen)) == []
    assert seen == [2]
    row = await store.get_run(run.id)
    assert (row.status, row.error, row.attempts) == ("failed", "gave up after 2", 2)
    assert await store.unfinished_inbox() == []
    # once ended, it is neither given up again, nor started, nor finished a second time
    assert await store.give_up_run(run.id, 2, lambda _n: notice) is None
    assert await store.start_run(run.id, acc.inbox_id) is None
    assert await store.finish_run(RunCompletion(run.id, acc.inbox_id, "completed", result="late")) is None
    assert (await store.get_run(run.id)).attempts == 2


async def test_give_up_stores_the_notice_with_the_failure_exactly_once(store: Store) -> None:
    acc = await store.accept("webhook:1", "webhook", "webhook", "webhook:github:1", {}, run := _new_run("webhook"),
                             started=True)
    await store.start_run(run.id, acc.inbox_id)

    def completion(attempts: int) -> RunCompletion:
        return RunCompletion(run.id, acc.inbox_id, "failed", result="skipped", error=f"gave up after {attempts}",
                             deliveries=[OutboxPart(f"run:{run.id}:0", "callback", "sink", "skipped",
                                                    run_id=run.id)])

    results = await asyncio.gather(*(store.give_up_run(run.id, 2, completion) for _ in range(4)))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1 and [p.text for p in winners[0]] == ["skipped"]
    rows: list[OutboxRow] = await store.outbox_rows(run.id)
    assert [(r.dedupe_key, r.text) for r in rows] == [(f"run:{run.id}:0", "skipped")]


# -- the gateway, restarted in this process -----------------------------------------------------------------


@pytest.fixture
def crash_on_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stops in this process play crashes: a dying process runs nothing after its runs are cut off, so the
    attempt a graceful stop would give back (``Store.give_back_attempt``) stays counted."""
    async def dies_first(self: Store, run_id: str) -> None:
        return None

    monkeypatch.setattr(Store, "give_back_attempt", dies_first)


async def _metric(h: Any, name: str) -> list[str]:
    async with h.http.get(f"{h.base_url}/metrics") as r:
        return [line for line in (await r.text()).splitlines() if line.startswith(name)]


@pytest.mark.usefixtures("crash_on_stop")
async def test_runs_stopped_twice_are_failed_told_once_and_the_session_goes_on(
        store_url: str, make_gateway: GatewayFactory) -> None:  # the database outlives the gateways
    """Chat, webhook-to-callback and webhook-to-nowhere runs, each cut off by two stops (the gateway stopped
    with runs in flight), are given up on the third start; the chat's next message is answered."""
    overrides = {"store": {"url": store_url},
                 "platforms": {"webhook": {"routes": {"quiet": {"secret": "quiet-secret-0123456789",
                                                                "prompt": "Quietly {payload.n}"}}}}}
    run_ids: list[str] = []
    for attempt in (1, 2):
        # Every model call hangs from the start (runs resumed by start() included): in flight at the stop.
        h = await make_gateway(overrides, responder=lambda _request: text("too late", latency=60))
        if attempt == 1:
            run_ids.append((await h.chat.user_says("first question")).run_id)
            status, hook = await h.post_webhook()
            assert status == 202
            status, quiet = await h.post_webhook({"n": 1}, route="quiet", secret="quiet-secret-0123456789")
            assert status == 202
            run_ids += [hook["run_id"], quiet["run_id"]]
        await h.model.wait_for_requests(3, timeout=10)
        await h.gateway.stop(drain_timeout=0)
        assert h.chat.sent == [] and h.sink.received == []

    h = await make_gateway(overrides)
    chat_run, hook_run, quiet_run = [await h.wait_run(r) for r in run_ids]
    for run in (chat_run, hook_run, quiet_run):
        assert (run["status"], run["attempts"], run["error"]) == ("failed", 2, GAVE_UP)
    await h.chat.wait_for(lambda: len(h.chat.sent) == 1)
    assert h.chat.final_texts() == [NOTICE]
    assert [d["text"] for d in await h.sink.wait_for(1)] == [NOTICE]
    assert h.model.request_count == 0  # none of them was started a third time

    accepted = await h.chat.user_says("second question")
    assert (await h.wait_run(accepted.run_id))["status"] == "completed"
    await h.chat.wait_for(lambda: len(h.chat.sent) == 2)
    assert h.chat.final_texts() == [NOTICE, "Echo: second question"]
    assert len(h.sink.received) == 1
    assert sorted(await _metric(h, "hermes_runs_total")) == [
        'hermes_runs_total{kind="chat",status="completed"} 1.0',
        'hermes_runs_total{kind="chat",status="failed"} 1.0',
        'hermes_runs_total{kind="webhook",status="failed"} 2.0']


async def _stopped_mid_run(make_gateway: GatewayFactory, overrides: dict[str, Any] | None = None) -> str:
    """A gateway stopped while its one chat run waits for the model; returns the run's id."""
    h = await make_gateway(overrides)
    h.model.hang_next(1)
    accepted = await h.chat.user_says("question")
    await h.model.wait_for_requests(1, timeout=10)
    await h.gateway.stop(drain_timeout=0)
    return accepted.run_id


@pytest.mark.usefixtures("crash_on_stop")
async def test_a_run_stopped_once_is_started_again_and_completes(make_gateway: GatewayFactory) -> None:
    run_id = await _stopped_mid_run(make_gateway)

    h = await make_gateway()
    run = await h.wait_run(run_id)
    assert (run["status"], run["attempts"]) == ("completed", 2)
    await h.chat.wait_for(lambda: h.chat.final_texts() == ["Echo: question"])


async def test_a_graceful_stop_does_not_count_an_attempt(make_gateway: GatewayFactory) -> None:
    """A shutdown past the drain timeout cuts a run off, but the run did nothing wrong: even with
    max_run_attempts 1 it is started again after the restart, and its attempt count says one."""
    run_id = await _stopped_mid_run(make_gateway, {"gateway": {"max_run_attempts": 1}})

    h = await make_gateway({"gateway": {"max_run_attempts": 1}})
    run = await h.wait_run(run_id)
    assert (run["status"], run["attempts"]) == ("completed", 1)
    await h.chat.wait_for(lambda: h.chat.final_texts() == ["Echo: question"])


@pytest.mark.usefixtures("crash_on_stop")
async def test_max_run_attempts_one_gives_up_after_the_first_stop(make_gateway: GatewayFactory) -> None:
    run_id = await _stopped_mid_run(make_gateway, {"gateway": {"max_run_attempts": 1}})

    h = await make_gateway({"gateway": {"max_run_attempts": 1}})
    run = await h.wait_run(run_id)
    assert (run["status"], run["attempts"]) == ("failed", 1)
    assert run["error"] == "gave up after 1 attempt: the gateway stopped during it"
    await h.chat.wait_for(lambda: len(h.chat.sent) == 1)
    assert h.chat.final_texts() == [
        "I couldn't finish answering your message: the gateway stopped while working on it. "
        "It was skipped; please try again or rephrase."]


# -- the gateway as users run it, killed by the message it works on ------------------------------------------

ALICE = 1001
# A tool running inside the gateway's process (isolation "process") that takes the whole gateway down, as a
# tool that crashes the interpreter or wedges it until a liveness probe kills it would.
POISON_PLUGIN = """
import os
import signal

from tools.registry import registry


def _crash(args, **ctx):
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


registry.register("crash_gateway", "plugin-poison", {
    "description": "Crash the gateway.", "parameters": {"type": "object", "properties": {}},
}, _crash, isolation="process")
"""


class DyingGateway(GatewayProcess):
    """``python -m gateway run`` that may die at any moment, even before its startup line."""

    async def spawn(self) -> None:
        env = {**os.environ, "HERMES_GATEWAY_HOME": str(self.home), "PYTHONUNBUFFERED": "1"}
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in exited()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "run", "--config", str(self.config_path),
            stdout=asyncio.subprocess.DEVNULL, stderr=self._stderr, env=env)

    async def exited(self, timeout: float) -> int:
        """Wait for the process to end by itself; its exit code."""
        assert self.proc is not None
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        finally:
            if self.proc.returncode is not None:
                self._stderr.close()


async def test_a_message_whose_run_kills_the_gateway_is_tried_max_run_attempts_times_then_skipped(
        store_url: str, tmp_path: Path, report: Any) -> None:
    """Real restarts: the tool SIGKILLs the gateway during each attempt; the third start gives the run up
    (one notice in the chat) and the chat's next message is answered as usual."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "poison.py").write_text(textwrap.dedent(POISON_PLUGIN), encoding="utf-8")

    def poisoned(request: dict[str, Any]) -> bool:
        return "poison" in last_user_text(request)

    async with (ScriptedModel(rules((r"poison", tool_call("crash_gateway", {})))) as model,
                TelegramSimulator() as telegram):
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump({
            "model": {"base_url": model.base_url, "api_key": "k", "name": "scripted-model", "max_retries": 0,
                      "stream": False},
            "http": {"port": 0},
            "store": {"url": store_url},
            "gateway": {"workspace": str(tmp_path / "workspace"), "drain_timeout": 1, "typing_delay": 30},
            "auth": {"platforms": {"telegram": {"allowed_users": [str(ALICE)]}}},
            "plugins": {"dir": str(plugins), "entry_points": False},
            "toolsets": {"telegram": ["hermes-telegram", "plugin-poison"]},
            "logging": {"level": "WARNING"},
            "platforms": {"telegram": {
                "enabled": True, "token": telegram.token, "base_url": telegram.base_url,
                "base_file_url": telegram.base_file_url, "poll_timeout": 1,
                "rate_limit": {"overall_per_second": 0, "group_per_minute": 0}}},
        }), encoding="utf-8")
        gateways: list[DyingGateway] = []
        try:
            telegram.user_sends("please take this poison", user_id=ALICE)
            for attempt in (1, 2):
                gateways.append(gw := DyingGateway(config, tmp_path))
                await gw.spawn()
                assert await gw.exited(timeout=60) == -signal.SIGKILL, gw.stderr_path.read_text()
                assert sum(map(poisoned, model.requests)) == attempt

            gateways.append(gw := DyingGateway(config, tmp_path))
            await gw.spawn()
            notice = await telegram.wait_for_messages(1, chat_id=ALICE, timeout=60)
            assert [m.text for m in notice] == [NOTICE]
            telegram.user_sends("hello again", user_id=ALICE)
            sent = await telegram.wait_for_messages(2, chat_id=ALICE, timeout=60)
            assert [m.text for m in sent] == [NOTICE, "Echo: hello again"]
            assert gw.proc is not None and gw.proc.returncode is None
            assert sum(map(poisoned, model.requests)) == 2  # the poisoned run was not started a third time
            assert not any("poison" in str(r["messages"]) for r in model.requests if not poisoned(r))

            store = await Store.open(store_url)
            try:
                runs = {r.prompt: r for r in await store.list_runs()}
            finally:
                await store.close()
            poison, hello = runs["please take this poison"], runs["hello again"]
            assert (poison.status, poison.attempts, poison.error) == ("failed", 2, GAVE_UP)
            assert (hello.status, hello.attempts) == ("completed", 1)
            report(f"{store_url.split(':')[0]}: poisoned run attempted {poison.attempts} times, then failed with "
                   f"one notice; {len(gateways)} gateway starts, model requests {model.request_count}")
        finally:
            for g in gateways:
                if g.proc is not None and g.proc.returncode is None:
                    await g.kill()
