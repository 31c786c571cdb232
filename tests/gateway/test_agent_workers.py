"""Agent loops in worker processes (``gateway.agent_workers``): the real gateway, real worker processes, the scripted
model and the Telegram simulator. Which process asked the model is read from the kernel (the model server's peer
port, mapped to the socket's owner through /proc)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.agent_workers import AgentWorkers
from gateway.sim.model_server import ScriptedModel, text, tool_call
from gateway.sim.telegram_api import DEFAULT_USER_ID, TelegramSimulator
from tests.conftest import API_TOKEN, GatewayFactory, Harness
from tests.gateway.conftest import StartTelegramGateway

CHAT = DEFAULT_USER_ID
ANSWER = " ".join(["The plan: buy milk, then call Bob about the launch."] * 4)


async def _until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    async def wait() -> None:
        while not predicate():
            await asyncio.sleep(0.02)
    await asyncio.wait_for(wait(), timeout)


def _proc_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {name} for {pid}")


def _owner(client_port: int, pids: list[int]) -> int | None:
    """The process among ``pids`` holding the TCP connection whose local port is ``client_port``."""
    inodes = {line.split()[9] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
              if int(line.split()[1].rsplit(":", 1)[1], 16) == client_port}
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except FileNotFoundError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return pid
    return None


async def _workers(h_or_gateway: Any, count: int) -> AgentWorkers:
    gateway = getattr(h_or_gateway, "gateway", h_or_gateway)
    pool = gateway.workers
    assert isinstance(pool, AgentWorkers)
    await _until(lambda: pool.ready() == count)
    return pool


def _bot_texts(sim: TelegramSimulator) -> list[str]:
    """What the user sees from the bot, oldest first (edits applied)."""
    return [m["text"] for m in sim.chat_history(CHAT) if m["from"]["id"] == sim.bot_id and "text" in m]


async def _metric(h: Harness, name: str) -> float:
    async with h.http.get(f"{h.base_url}/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


async def test_the_worker_count_is_honoured_the_model_is_asked_from_a_worker_and_a_dead_one_is_replaced(
        make_gateway: GatewayFactory) -> None:
    h = await make_gateway({"gateway": {"agent_workers": 3}})
    pool = await _workers(h, 3)
    pids = pool.pids()
    assert len(set(pids)) == 3
    for pid in pids:
        assert int(_proc_field(pid, "PPid")) == os.getpid()
        assert "gateway.agent_worker" in Path(f"/proc/{pid}/cmdline").read_text()
    assert await _metric(h, "hermes_agent_workers") == 3
    async with h.http.get(f"{h.base_url}/readyz", headers={"Authorization": f"Bearer {API_TOKEN}"}) as r:
        assert (await r.json())["agent_workers"] == {"configured": 3, "ready": 3, "restarts": 0}

    await h.chat.user_says("hello")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 1)
    assert _owner(h.model.peer_ports[-1], pids) in pids  # the loop's model request left from a worker

    os.kill(pids[0], signal.SIGKILL)
    await _until(lambda: pool.ready() == 3 and pids[0] not in pool.pids())
    assert len(set(pool.pids()) - set(pids)) == 1
    assert await _metric(h, "hermes_agent_worker_restarts_total") == 1
    await h.chat.user_says("still there?")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 2)


@pytest.mark.parametrize("kind", ["chat", "webhook"])
async def test_a_worker_killed_mid_run_has_the_run_redone_and_answered_once(
        store_url: str, make_gateway: GatewayFactory, kind: str) -> None:  # the database outlives the gateway
    asked: list[dict[str, Any]] = []
    first_arrived, release = asyncio.Event(), asyncio.Event()

    async def responder(body: dict[str, Any]) -> str:
        asked.append(body)
        if len(asked) == 1:  # the first attempt's request: its worker is killed while it waits
            first_arrived.set()
            await release.wait()
            return "answer of the dead attempt"
        return "the answer"

    h = await make_gateway({"gateway": {"agent_workers": 1}, "store": {"url": store_url}}, responder=responder)
    pool = await _workers(h, 1)
    [pid] = pool.pids()
    if kind == "chat":
        run_id = (await h.chat.user_says("what is the plan?")).run_id
    else:
        status, body = await h.post_webhook()
        assert status == 202
        run_id = body["run_id"]
    await asyncio.wait_for(first_arrived.wait(), 10)
    assert _owner(h.model.peer_ports[0], [pid]) == pid
    os.kill(pid, signal.SIGKILL)

    run = await h.wait_run(run_id, timeout=20)
    release.set()
    assert run["status"] == "completed" and run["result"] == "the answer"
    assert run["attempts"] == 2
    assert len(asked) == 2 and asked[0]["messages"] == asked[1]["messages"]  # redone from the start
    if kind == "chat":
        await h.chat.wait_for(lambda: len(h.chat.sent) >= 1)
        await asyncio.sleep(0.3)  # a second delivery would show up by now
        assert h.chat.final_texts() == ["the answer"]
    else:
        delivered = await h.sink.wait_for(1)
        await asyncio.sleep(0.3)
        assert [d["text"] for d in h.sink.received] == ["the answer"] == [d["text"] for d in delivered]
    assert pool.restarts == 1 and pool.pids() != [pid]


async def test_a_worker_dying_on_every_attempt_ends_the_run_after_max_attempts(make_gateway: GatewayFactory) -> None:
    h: Harness | None = None

    async def responder(body: dict[str, Any]) -> str:
        assert h is not None
        pids = h.gateway.workers.pids()
        owner = _owner(h.model.peer_ports[-1], pids)
        assert owner is not None
        os.kill(owner, signal.SIGKILL)  # this message kills its worker, every time
        await asyncio.sleep(0.5)
        return "never read"

    h = await make_gateway({"gateway": {"agent_workers": 1, "max_run_attempts": 2}}, responder=responder)
    await _workers(h, 1)
    run_id = (await h.chat.user_says("poison")).run_id
    run = await h.wait_run(run_id, timeout=30)
    assert run["status"] == "failed" and run["attempts"] == 2
    await h.chat.wait_for(lambda: len(h.chat.sent) == 1)
    assert "stopped while working on it twice" in h.chat.final_texts()[0]


async def test_stream_preview_and_tool_progress_reach_telegram_from_a_worker(
        telegram_gateway: StartTelegramGateway) -> None:
    async with TelegramSimulator() as sim, ScriptedModel() as model:
        model.push(tool_call("todo", {"action": "list"}), text(ANSWER, latency=0.3))
        model.chunk_size, model.chunk_delay = 8, 0.01
        gateway = await telegram_gateway(sim, model, {"gateway": {"agent_workers": 1}, "model": {"stream": True},
                                                      "platforms": {"telegram": {"tool_progress_delay": 0}}})
        pool = await _workers(gateway, 1)
        sim.user_sends("what is left to do?")
        await sim.wait_for(lambda: ANSWER in _bot_texts(sim), timeout=15)
        assert {_owner(port, pool.pids()) for port in model.peer_ports} == set(pool.pids())
        status, preview = sim.sent_messages(CHAT)
        assert status.text == "📋 todo: list"  # tool progress: the tool ran in the gateway, asked by the worker
        # the streamed preview: sent and edited with partial texts and the cursor, then edited into the answer
        partial = [preview.text, *(e.text for e in sim.edits(CHAT) if e.message_id == preview.message_id)][:-1]
        assert len(partial) >= 2
        assert all(t.endswith("▍") and ANSWER.startswith(t.removesuffix(" ▍")) for t in partial)
        assert _bot_texts(sim)[-1] == ANSWER


async def test_stop_cancels_a_run_whose_loop_is_in_a_worker(make_gateway: GatewayFactory) -> None:
    arrived = asyncio.Event()

    async def responder(body: dict[str, Any]) -> str:
        if "slow question" in str(body["messages"][-1]["content"]):
            arrived.set()
            await asyncio.sleep(30)
        return "quick answer"

    h = await make_gateway({"gateway": {"agent_workers": 1}}, responder=responder)
    pool = await _workers(h, 1)
    [pid] = pool.pids()
    run_id = (await h.chat.user_says("slow question")).run_id
    await asyncio.wait_for(arrived.wait(), 10)
    assert pool.loops() == 1
    await h.chat.user_says("/stop")
    run = await h.wait_run(run_id)
    assert run["status"] == "cancelled"
    await _until(lambda: pool.loops() == 0)  # the worker's loop too (its health reports count them)
    assert pool.pids() == [pid] and pool.restarts == 0  # the worker lives on
    await h.chat.user_says("next one")
    await h.chat.wait_for(lambda: "quick answer" in h.chat.final_texts())


async def test_a_hung_worker_is_killed_and_its_run_redone(make_gateway: GatewayFactory) -> None:
    asked: list[int] = []

    async def responder(body: dict[str, Any]) -> str:
        asked.append(len(asked))
        return "the answer"

    h = await make_gateway({"gateway": {"agent_workers": 1}}, responder=responder)
    pool = await _workers(h, 1)
    pool.hang_after = 1.0
    await asyncio.sleep(0.6)  # health reports keep coming meanwhile: the worker is not silent yet
    [pid] = pool.pids()
    os.kill(pid, signal.SIGSTOP)  # hung: alive, but its loop answers nothing
    run_id = (await h.chat.user_says("are you there?")).run_id
    run = await h.wait_run(run_id, timeout=20)
    assert run["status"] == "completed" and run["result"] == "the answer"
    assert pool.restarts == 1 and pid not in pool.pids()
    assert run["attempts"] == 2 and len(asked) == 1  # the hung attempt never reached the model
    await _until(lambda: not Path(f"/proc/{pid}").exists())  # killed and reaped
