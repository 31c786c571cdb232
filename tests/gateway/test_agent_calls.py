"""How the agent calls the model and tools: streaming only when watched, bounded tool metric labels."""

from __future__ import annotations

import ast
import asyncio
import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

import model_tools
from gateway.agent_loop import build_client, post_chat_completion
from gateway.config import ModelSettings
from gateway.sim.model_server import ScriptedModel, ToolCall, Turn, rules, tool_call
from tools.registry import registry


async def test_webhook_run_does_not_stream_even_when_streaming_is_on(make_gateway) -> None:
    h = await make_gateway({"model": {"stream": True}})
    status, body = await h.post_webhook()
    assert status == 202
    run = await h.wait_run(body["run_id"])
    assert run["status"] == "completed"
    assert [bool(r.get("stream")) for r in h.model.requests] == [False], "nobody watches a webhook run's text"


async def test_chat_run_on_an_editable_platform_streams(make_gateway) -> None:
    h = await make_gateway({"model": {"stream": True}})
    await h.chat.user_says("hello there")
    await h.chat.wait_for(lambda: any(t.startswith("Echo: hello there") and "▍" not in t
                                      for t in h.chat.final_texts()))
    assert [bool(r.get("stream")) for r in h.model.requests] == [True]


async def test_tool_calls_in_an_answer_cut_off_are_not_run(make_gateway) -> None:
    """A turn cut off at the output limit may hold half a tool call: none runs, the run ends telling the user, and
    the stored turn keeps no dangling tool call (the next request's history stays valid).

    Fails on the mutant ``... is not None and not tool_calls:`` for the cut-off check in ``Agent.run`` (the call
    runs on half its arguments and the model is asked again)."""
    cut = Turn(content="Adding it now.", tool_calls=(ToolCall("todo", '{"action": "add", "items": ["bu'),),
               finish_reason="length")
    h = await make_gateway(responder=rules((r"remember", cut)))
    await h.chat.user_says("remember to buy milk")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 1)
    assert h.chat.sent[0].text == "Adding it now.\n\n(The answer was cut off: it reached the model's output limit.)"
    [run] = await h.gateway.store.list_runs()
    assert (run.status, run.ended_by, run.tool_calls, run.model_calls) == ("completed", "length", [], 1)
    await h.chat.user_says("and now?")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 2)
    history = h.model.requests[-1]["messages"]
    assert [m["role"] for m in history[1:]] == ["user", "assistant", "user"]
    assert not any(m.get("tool_calls") for m in history) and h.chat.sent[1].text == "Echo: and now?"


async def test_invented_tool_names_share_one_metric_label(make_gateway) -> None:
    h = await make_gateway(responder=rules((r"UNTRUSTED WEBHOOK PAYLOAD", tool_call("no_such_tool_4f9a", {}))))
    _, body = await h.post_webhook()
    run = await h.wait_run(body["run_id"])
    assert run["tool_calls"][0]["name"] == "no_such_tool_4f9a" and run["tool_calls"][0]["error"]
    metrics = h.gateway.metrics.render().decode()
    assert 'hermes_tool_call_seconds_count{tool="(not allowed)"} 1.0' in metrics
    assert "no_such_tool_4f9a" not in metrics


async def test_runs_leave_the_shared_tool_definitions_unchanged(make_gateway) -> None:
    # model_tools hands every run the same cached definition dicts: the agent and the openai SDK only read them.
    h = await make_gateway({"model": {"stream": True}},
                           responder=rules((r"plan", tool_call("todo", {"action": "add", "items": ["ship"]}))))
    executor = h.gateway.router.executor
    toolsets = (["hermes-telegram"], ["hermes-webhook"])
    plans = [executor.plan_for(t) for t in toolsets]
    before = copy.deepcopy([p.definitions for p in plans])
    await h.chat.user_says("plan the release")  # streamed, with a tool call: two requests with tools
    await h.chat.wait_for(lambda: any("▍" not in t for t in h.chat.final_texts()))
    _, body = await h.post_webhook()  # not streamed
    assert (await h.wait_run(body["run_id"]))["status"] == "completed"
    after = [executor.plan_for(t) for t in toolsets]
    for plan, again in zip(plans, after, strict=True):
        assert all(a is b for a, b in zip(plan.definitions, again.definitions, strict=True))  # the runs' entries
    assert [p.definitions for p in after] == before
    assert [r["tools"] for r in h.model.requests] == [before[0], before[0], before[1]]


@pytest.mark.parametrize(("max_connections", "calls"), [(3, 8), (1100, 1050)])
async def test_the_model_client_makes_as_many_calls_at_once_as_it_is_allowed(max_connections: int,
                                                                          calls: int) -> None:
    # The gateway allows one model call per run it may run at once; above 1,000 (the SDK's own limit)
    # calls would otherwise wait inside the client.
    expected = min(calls, max_connections)
    async with ScriptedModel(api_key="k", latency=60) as model:  # answers come after the test
        assert model.base_url is not None
        client = build_client(ModelSettings(base_url=model.base_url, api_key="k", max_retries=0),
                              max_connections=max_connections)
        pending = [asyncio.create_task(client.chat.completions.create(
            model="scripted-model", messages=[{"role": "user", "content": f"hi {i}"}])) for i in range(calls)]
        try:
            async with asyncio.timeout(30):
                while model.in_flight < expected:
                    await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # and no more than that
            assert model.in_flight == expected
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await client.close()


def _without_ids(value: Any) -> Any:
    """A response dump without what the scripted model numbers per response (ids, creation time)."""
    if isinstance(value, dict):
        return {k: _without_ids(v) for k, v in value.items() if k not in ("id", "created")}
    return [_without_ids(v) for v in value] if isinstance(value, list) else value


@pytest.mark.parametrize("stream", [False, True])
async def test_model_requests_are_the_sdks_own_on_the_wire(stream: bool) -> None:
    # The agent posts chat completions through the SDK client without the SDK's request transform
    # (post_chat_completion): the path, headers and JSON body must be what chat.completions.create sends.
    seen: list[tuple[dict[str, str], bytes]] = []

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        seen.append(({"path": request.path_qs, **request.headers}, await request.read()))
        return await handler(request)

    model = ScriptedModel(rules((r"weather", tool_call("get_weather", {"city": "Oslo"}))), api_key="k")
    model.app.middlewares.append(record)
    registry.discover_builtin_tools()
    body: dict[str, Any] = {
        "model": "scripted-model", "temperature": 0.2, "max_tokens": 300,
        "tools": model_tools.get_tool_definitions(["hermes-telegram"]),
        "messages": [{"role": "system", "content": "Be brief. ✓"}, {"role": "user", "content": "weather?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "c1", "type": "function", "function": {"name": "todo", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": '{"ok": true}'},
                     {"role": "user", "content": "and the weather in Oslo?"}]}
    async with model:
        assert model.base_url is not None
        client = build_client(ModelSettings(base_url=model.base_url, api_key="k", max_retries=0))
        try:
            answers = []
            for via_sdk in (True, False):
                if stream:
                    chunks = await (client.chat.completions.create(**body, stream=True,
                                                                   stream_options={"include_usage": True})
                                    if via_sdk else post_chat_completion(client, body, stream=True))
                    async with chunks:
                        answers.append([_without_ids(c.model_dump()) async for c in chunks])
                else:
                    answer = await (client.chat.completions.create(**body) if via_sdk
                                    else post_chat_completion(client, body))
                    answers.append(_without_ids(answer.model_dump()))
        finally:
            await client.close()
    (sdk_headers, sdk_bytes), (our_headers, our_bytes) = seen
    assert json.loads(our_bytes) == json.loads(sdk_bytes)  # the same JSON (the SDK orders the top-level keys)
    assert json.loads(our_bytes)["tools"] == body["tools"] and bool(json.loads(our_bytes).get("stream")) is stream
    assert our_headers == sdk_headers
    assert answers[0] == answers[1]
    assert "get_weather" in json.dumps(answers[1])


_FIRST_CALLS = """
import asyncio, sys
from gateway.agent_loop import build_client, load_sdk_modules, post_chat_completion
from gateway.config import ModelSettings
from gateway.sim.model_server import ScriptedModel

async def main():
    async with ScriptedModel(api_key="k") as model:
        client = build_client(ModelSettings(base_url=model.base_url, api_key="k", max_retries=0))
        if sys.argv[1] == "preload":
            await load_sdk_modules()
        before = set(sys.modules)
        body = {"model": "scripted-model", "messages": [{"role": "user", "content": "hi"}]}
        await post_chat_completion(client, body)
        async with await post_chat_completion(client, body, stream=True) as chunks:
            async for _ in chunks:
                pass
        await client.close()
        print(sorted(set(sys.modules) - before))

asyncio.run(main())
"""


@pytest.mark.parametrize("preload", [True, False])
def test_the_first_model_calls_import_nothing_after_start(preload: bool) -> None:
    # An import on the event loop stalls every chat: Gateway.start loads what the SDK would import lazily.
    out = subprocess.run([sys.executable, "-c", _FIRST_CALLS, "preload" if preload else "cold"], check=True,
                         capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2]).stdout
    imported = ast.literal_eval(out.strip().splitlines()[-1])
    if preload:
        assert imported == []
    else:  # the control: without the preload the first streamed answer imports anyio's backend on the loop
        assert "anyio._backends._asyncio" in imported
