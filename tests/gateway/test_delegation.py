"""delegate_task end to end: the real gateway and Telegram adapter against the Telegram simulator, the scripted model
answering the run and its sub-agents (told apart by the sub-agent system prompt)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

import model_tools
from gateway.agent import Agent
from gateway.agent_loop import build_client
from gateway.app import Gateway
from gateway.approvals import ApprovalGate, ApprovalPolicy
from gateway.config import parse_config
from gateway.delegation import SUBAGENT_PROMPT, DelegationScope, install_delegation
from gateway.metrics import Metrics
from gateway.sim.model_server import JSON, ScriptedModel, Turn, tool_call
from gateway.sim.telegram_api import DEFAULT_USER_ID, TelegramSimulator
from gateway.store import Store
from tests.gateway.conftest import StartTelegramGateway
from tools.delegate_tool import DelegationError, SubTask

CHAT = DEFAULT_USER_ID  # a DM: the chat id is the user's
USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}  # what every scripted answer reports
HOLD_TIMEOUT = 10.0


def is_child(request: JSON) -> bool:
    return request["messages"][0]["content"] == SUBAGENT_PROMPT


def goal_of(request: JSON) -> str:
    """The goal a sub-agent's request carries (its first user message: "Your task:\\n<goal>...")."""
    return request["messages"][1]["content"].split("\n")[1]


def tools_of(request: JSON) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools") or ()}


def delegate_description(request: JSON) -> str:
    return next(t["function"]["description"] for t in request["tools"] if t["function"]["name"] == "delegate_task")


def last_tool_result(request: JSON) -> dict[str, Any]:
    return json.loads(request["messages"][-1]["content"])


@dataclass
class Delegating:
    """The scripted model. The run's first request delegates ``tasks``; a sub-agent whose goal is in ``children``
    gets that turn first (each first request held until ``hold`` sub-agents have asked, or until ``release`` is set),
    then answers "<goal> done"; the run then answers "All done." (or echoes)."""

    tasks: list[dict[str, Any]]
    children: dict[str, Turn] = field(default_factory=dict)
    hold: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: list[str] = field(default_factory=list)

    async def __call__(self, request: JSON) -> Turn:
        last = request["messages"][-1]
        if not is_child(request):
            if last["role"] == "tool":
                return Turn("All done.", usage=USAGE)
            if last["content"] == "hi":
                return Turn("hello", usage=USAGE)
            return Turn(tool_calls=tool_call("delegate_task", {"tasks": self.tasks}).tool_calls, usage=USAGE)
        goal = goal_of(request)
        if last["role"] == "user":
            self.arrived.append(goal)
            if len(self.arrived) >= self.hold:
                self.release.set()
            try:
                await asyncio.wait_for(self.release.wait(), HOLD_TIMEOUT)
            except TimeoutError:
                return Turn(f"{goal}: held alone, the others never came", usage=USAGE)
            if goal in self.children:
                turn = self.children[goal]
                return Turn(turn.content, turn.tool_calls, usage=USAGE)
        return Turn(f"{goal} done", usage=USAGE)


Start = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def telegram(telegram_gateway: StartTelegramGateway) -> AsyncIterator[tuple[TelegramSimulator, ScriptedModel,
                                                                                    Start]]:
    """The Telegram simulator, the scripted model (its responder set by the test) and a gateway factory taking
    ``delegation`` settings; progress shown at once and kept."""
    async with TelegramSimulator() as sim, ScriptedModel() as model:
        async def start(delegation: dict[str, Any] | None = None, **overrides: Any) -> Gateway:
            progress = {"platforms": {"telegram": {"tool_progress_delay": 0, "tool_progress_done": "keep"}}}
            return await telegram_gateway(sim, model, {**progress, "delegation": delegation or {}, **overrides})

        yield sim, model, start


async def _answered(sim: TelegramSimulator, answer: str = "All done.") -> None:
    await sim.wait_for(lambda: any(s.text == answer for s in sim.sent_messages(CHAT)), timeout=15)


async def _idle(gateway: Gateway) -> None:
    assert gateway.router is not None
    assert await gateway.router.lanes.wait_idle(10)


THREE = [{"goal": "alpha"}, {"goal": "beta"}, {"goal": "gamma"}]


async def test_three_children_run_at_once_and_their_calls_show_in_the_run_progress(
        telegram: tuple[TelegramSimulator, ScriptedModel, Start]) -> None:
    sim, model, start = telegram
    script = Delegating(THREE, {g: tool_call("todo", {"action": "add", "items": [f"{g} step"]})
                                for g in ("alpha", "beta", "gamma")}, hold=3)
    model.responder = script
    gateway = await start()
    sim.user_sends("split the work")
    await _answered(sim)
    await _idle(gateway)

    requests = model.requests
    run_first, *children, run_last = requests
    assert not is_child(run_first) and not is_child(run_last) and all(is_child(r) for r in children)
    # Each sub-agent's first request came before any sub-agent's second: all three were in flight together (the
    # model held every first answer until the third had asked).
    firsts = [i for i, r in enumerate(children) if r["messages"][-1]["role"] == "user"]
    assert firsts == [0, 1, 2] and sorted(script.arrived) == ["alpha", "beta", "gamma"]
    assert model.peak_in_flight >= 3

    # The run's tools minus what sub-agents never get: no clarify or send_file, and no delegate_task at depth 1.
    parent_tools = tools_of(run_first)
    assert {"delegate_task", "clarify", "todo"} <= parent_tools
    for request in children:
        assert tools_of(request) == parent_tools - {"delegate_task", "clarify", "send_file"}

    report = last_tool_result(run_last)
    assert report["total"] == report["completed"] == 3
    assert sorted((r["goal"], r["status"], r["summary"], r["tool_calls"]) for r in report["results"]) == [
        (g, "completed", f"{g} done", ["todo"]) for g in ("alpha", "beta", "gamma")]

    # The run's status message shows the delegation and each sub-agent's call.
    status = sim.sent_messages(CHAT)[0]
    shown = next(m["text"] for m in sim.chat_history(CHAT) if m["message_id"] == status.message_id)
    lines = shown.splitlines()
    assert lines[0].startswith("🔀 delegate_task: ")
    assert sorted(lines[1:]) == [f'📋 todo: add, ["{g} step"]' for g in ("alpha", "beta", "gamma")]

    # Sub-agents' model calls count in the run's usage (2 of the run's own, 6 of its sub-agents').
    assert gateway.store is not None
    (run,) = await gateway.store.list_runs()
    assert run.status == "completed" and run.usage is not None
    assert (run.usage.prompt_tokens, run.usage.completion_tokens) == (8 * 7, 8 * 3)


async def test_sub_agents_share_the_run_tool_call_budget(
        telegram: tuple[TelegramSimulator, ScriptedModel, Start]) -> None:
    sim, model, start = telegram
    model.responder = Delegating(THREE, {g: tool_call("todo", {"action": "list"}) for g in ("alpha", "beta", "gamma")},
                                 hold=3)
    await start(limits={"run_max_tool_calls": 3})  # delegate_task itself, then two of the three sub-agents' calls
    sim.user_sends("split the work")
    await _answered(sim)
    report = last_tool_result(model.requests[-1])
    statuses = sorted(r["status"] for r in report["results"])
    assert statuses == ["budget", "completed", "completed"]
    stopped = next(r for r in report["results"] if r["status"] == "budget")
    assert stopped["summary"] == "I stopped: this request needed more than 3 tool calls."


async def test_sub_agents_get_delegation_max_turns(telegram: tuple[TelegramSimulator, ScriptedModel, Start]) -> None:
    sim, model, start = telegram
    model.responder = Delegating([{"goal": "long"}], {"long": tool_call("todo", {"action": "list"})})
    await start({"max_turns": 1})  # the run keeps model.max_turns
    sim.user_sends("take a while")
    await _answered(sim)
    (result,) = last_tool_result(model.requests[-1])["results"]
    assert (result["status"], result["model_calls"], result["tool_calls"]) == ("max_turns", 1, ["todo"])


async def test_toolsets_narrow_a_sub_agent_tools(telegram: tuple[TelegramSimulator, ScriptedModel, Start]) -> None:
    sim, model, start = telegram
    model.responder = Delegating([{"goal": "a"}, {"goal": "b", "toolsets": ["memory", "clarify"]}])
    await start({"default_toolsets": ["todo"]})
    sim.user_sends("narrow")
    await _answered(sim)
    children = {goal_of(r): tools_of(r) for r in model.requests if is_child(r)}
    assert children == {"a": {"todo"}, "b": {"memory"}}  # the default; the task's own, never clarify


async def test_nesting_stops_at_max_spawn_depth(telegram: tuple[TelegramSimulator, ScriptedModel, Start]) -> None:
    sim, model, start = telegram
    model.responder = Delegating([{"goal": "outer"}], {"outer": tool_call("delegate_task", {"goal": "inner"})})
    await start({"max_spawn_depth": 2})
    sim.user_sends("go deep")
    await _answered(sim)

    run_first, child, grandchild, child_last, run_last = model.requests
    assert [goal_of(r) for r in (child, grandchild, child_last)] == ["outer", "inner", "outer"]
    assert "nested up to depth 2" in delegate_description(run_first)
    assert "delegate_task" in tools_of(child)  # depth 1 < 2: it may delegate
    assert "delegate_task" not in tools_of(grandchild)  # depth 2: the last level
    assert tools_of(grandchild) == tools_of(child) - {"delegate_task"}
    assert last_tool_result(child_last)["results"][0]["summary"] == "inner done"
    assert last_tool_result(run_last)["results"][0] == {
        "goal": "outer", "status": "completed", "summary": "outer done", "error": None,
        "tool_calls": ["delegate_task"], "model_calls": 2}


async def test_the_schema_follows_the_delegation_config(
        telegram: tuple[TelegramSimulator, ScriptedModel, Start]) -> None:
    sim, model, start = telegram
    model.responder = Delegating([])
    first = await start({"max_concurrent_children": 2})
    sim.user_sends("hi")
    await _answered(sim, "hello")
    await first.stop(drain_timeout=1)
    await start({"max_concurrent_children": 5, "max_spawn_depth": 3})
    sim.user_sends("hi")
    await sim.wait_for(lambda: len([s for s in sim.sent_messages(CHAT) if s.text == "hello"]) == 2, timeout=15)

    before, after = (r for r in model.requests if r["messages"][-1]["content"] == "hi")
    assert "Up to 2 tasks run concurrently" in delegate_description(before)
    assert "cannot delegate further (delegation.max_spawn_depth is 1)" in delegate_description(before)
    assert "Up to 5 tasks run concurrently" in delegate_description(after)
    assert "nested up to depth 3" in delegate_description(after)
    tasks = next(t for t in after["tools"] if t["function"]["name"] == "delegate_task")["function"]["parameters"]
    assert "up to 5 per call" in tasks["properties"]["tasks"]["description"]


async def test_installing_other_limits_renews_the_cached_definitions() -> None:
    """The definition cache keys on the registry's generation, not on dynamic descriptions: installing a
    delegation config must drop the plans built under the old one."""
    def description() -> str:
        (definition,) = model_tools.get_tool_definitions(["delegation"])
        return definition["function"]["description"]

    installed = []
    cfg = parse_config({}, env={})
    client = build_client(cfg.model)
    with ThreadPoolExecutor(1) as pool:
        agent = Agent(cfg.model, client, pool, Metrics())
        for children in (2, 6):
            cfg = parse_config({"delegation": {"max_concurrent_children": children}}, env={})
            installed.append(install_delegation(cfg, agent, model_tools.get_tool_plan, asyncio.get_running_loop()))
            assert f"Up to {children} tasks run concurrently" in description()
            assert description() == description()  # and cached again
        for delegation in reversed(installed):
            await delegation.stop()
    await client.close()
    assert "Up to 3 tasks run concurrently" in description()  # the defaults once no gateway runs sub-agents


async def test_stop_cancels_the_sub_agents_with_the_run(
        telegram: tuple[TelegramSimulator, ScriptedModel, Start]) -> None:
    sim, model, start = telegram
    script = Delegating(THREE, {g: tool_call("todo", {"action": "list"}) for g in ("alpha", "beta", "gamma")},
                        hold=4)  # never reached: the sub-agents' first answers wait until released
    model.responder = script
    gateway = await start()
    sim.user_sends("split the work")
    await model.wait_for_requests(4, timeout=10)  # the run's, then each sub-agent's first
    sim.user_sends("/stop")
    await _answered(sim, "Stopped the current run.")
    await _idle(gateway)
    assert gateway.delegation is not None
    await asyncio.wait_for(gateway.delegation.wait_idle(), 5)  # the sub-agents' tasks ended
    assert gateway.delegation.running == 0
    assert gateway.store is not None
    (run,) = await gateway.store.list_runs()
    assert (run.status, run.error) == ("cancelled", "stopped by user")

    script.release.set()  # their answers now come, to nobody
    sim.user_sends("hi")
    await _answered(sim, "hello")
    assert sum(is_child(r) for r in model.requests) == 3  # no sub-agent asked the model again
    assert "All done." not in [s.text for s in sim.sent_messages(CHAT)]


async def test_a_sub_agent_call_needing_approval_is_refused_not_asked(
        telegram: tuple[TelegramSimulator, ScriptedModel, Start]) -> None:
    sim, model, start = telegram
    model.responder = Delegating([{"goal": "note it"}],
                                 {"note it": tool_call("todo", {"action": "add", "items": ["x"]})})
    # todo writes state, which asks here; the user trusts delegate_task itself.
    await start(approvals={"ask_for_effects": ["writes_state"], "trusted": {f"telegram:{CHAT}": ["delegate_task:*"]}})
    sim.user_sends("delegate a note")
    await _answered(sim)
    refused = last_tool_result(next(r for r in model.requests if is_child(r) and r["messages"][-1]["role"] == "tool"))
    assert refused["error"].startswith("Not run: a sub-agent cannot ask the user to approve this (todo writes state)")
    assert not [s for s in sim.sent_messages(CHAT) if "Approval needed" in (s.text or "")]
    assert last_tool_result(model.requests[-1])["results"][0]["tool_calls"] == ["todo"]


async def test_a_delegation_is_refused_before_any_sub_agent_starts_with_what_to_fix(store: Store) -> None:
    cfg = parse_config({}, env={})
    client = build_client(cfg.model)
    with ThreadPoolExecutor(1) as pool:
        delegation = install_delegation(cfg, Agent(cfg.model, client, pool, Metrics()), model_tools.get_tool_plan,
                                        asyncio.get_running_loop())
        gate = ApprovalGate(ApprovalPolicy(cfg), store, kind="chat", source="telegram", toolsets=["web"],
                            user_key="telegram:1", session_key="telegram:dm:1", workspace=None)
        scope = DelegationScope(("web", "delegation"), frozenset({"web_extract", "delegate_task"}), "m", gate)

        async def refusal(tasks: list[SubTask], ctx: dict[str, Any]) -> str:
            with pytest.raises(DelegationError) as info:
                await asyncio.to_thread(delegation.delegate, tasks, ctx)
            return str(info.value)

        assert await refusal([SubTask("a")], {}) == "delegate_task works only inside a gateway run."
        assert await refusal([SubTask("a"), SubTask("b", toolsets=("nope",))], {"delegation": scope}) == (
            "tasks[1]: unknown toolset 'nope'. Name toolsets among yours (web, delegation) or leave toolsets out to "
            "give it your tools.")
        assert await refusal([SubTask("a", toolsets=("memory",))], {"delegation": scope}) == (
            "tasks[0]: the toolsets memory hold none of the tools you may use; name others or leave toolsets out.")
        deep = {"delegation": dataclasses.replace(scope, depth=1)}
        assert await refusal([SubTask("a")], deep) == (
            "A sub-agent at depth 1 cannot delegate (delegation.max_spawn_depth is 1).")
        assert delegation.running == 0
        await delegation.stop()
    await client.close()
