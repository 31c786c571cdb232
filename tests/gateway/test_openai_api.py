"""The OpenAI-compatible endpoint (#26 item 4) driven by the ``openai`` client itself: answers that needed a tool
call (streaming and not), usage, a toolset-limited key, stored sessions, and bad input refused with nothing
enqueued."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.conftest import API_TOKEN, GatewayFactory, Harness

FULL_KEY = "full-client-key-0123456789"
READER_KEY = "reader-client-key-0123456789"
TODO = '[[tool:todo {"action": "add", "items": ["buy milk"]}]]'
API = {"http": {"api": {"enabled": True, "clients": {
    "full": {"key": FULL_KEY, "toolset": ["todo", "memory"], "model_alias": "hermes"},
    "reader": {"key": READER_KEY, "toolset": "hermes-webhook", "max_concurrent_runs": 1}}}}}


def client(h: Harness, key: str = FULL_KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{h.base_url}/v1", api_key=key, max_retries=0)


async def inbox_count(h: Harness) -> int:
    assert h.gateway.store is not None
    return await h.gateway.store.count_inbox()


async def test_answer_that_needed_a_tool_call(make_gateway: GatewayFactory) -> None:
    h = await make_gateway(API)
    async with client(h) as oa:
        models = await oa.models.list()
        assert [m.id for m in models.data] == ["hermes"]
        answer = await oa.chat.completions.create(model="hermes", messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "earlier question"}, {"role": "assistant", "content": "earlier answer"},
            {"role": "user", "content": TODO}])
    content = answer.choices[0].message.content
    assert content is not None and content.startswith("Done: ") and "buy milk" in content
    assert answer.choices[0].finish_reason == "stop" and answer.model == "hermes"
    assert answer.usage is not None and answer.usage.prompt_tokens > 0 and answer.usage.completion_tokens > 0
    run = await h.get_run(answer.id.removeprefix("chatcmpl-"))
    assert run["kind"] == "api" and run["source"] == "full" and run["status"] == "completed"
    assert [c["name"] for c in run["tool_calls"]] == ["todo"]
    assert run["usage"]["prompt_tokens"] == answer.usage.prompt_tokens
    first = h.model.requests[0]["messages"]  # the request's conversation came before its last message
    assert [(m["role"], m["content"]) for m in first[1:]] == [
        ("system", "Be brief."), ("user", "earlier question"), ("assistant", "earlier answer"), ("user", TODO)]


async def test_streaming_answer_with_tool_progress(make_gateway: GatewayFactory) -> None:
    h = await make_gateway({**API, "model": {"stream": True}})
    async with client(h) as oa:
        stream = await oa.chat.completions.create(model="hermes", messages=[{"role": "user", "content": TODO}],
                                                  stream=True)
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    tools = [c.model_extra["hermes_tool"] for c in chunks if c.model_extra and "hermes_tool" in c.model_extra]
    assert text.startswith("Done: ") and "buy milk" in text
    assert [t["name"] for t in tools] == ["todo"] and "todo" in tools[0]["line"]
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 2  # it came in pieces
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0


async def test_limited_key_cannot_reach_a_tool_outside_its_toolset(make_gateway: GatewayFactory) -> None:
    h = await make_gateway(API)
    async with client(h, READER_KEY) as oa:
        answer = await oa.chat.completions.create(model="scripted-model",
                                                  messages=[{"role": "user", "content": TODO}])
    content = answer.choices[0].message.content or ""
    assert "Tool todo is not available" in content and "buy milk" not in content
    offered = {t["function"]["name"] for t in h.model.requests[0].get("tools", [])}
    assert "todo" not in offered and offered <= {"web_search", "web_extract"}
    run = await h.get_run(answer.id.removeprefix("chatcmpl-"))
    assert run["toolsets"] == ["hermes-webhook"]


async def test_stored_session_keeps_the_conversation(make_gateway: GatewayFactory) -> None:
    h = await make_gateway(API)
    async with client(h) as oa:
        for text in ("first", "second"):
            await oa.chat.completions.create(model="hermes", messages=[
                {"role": "user", "content": "ignored with a session"}, {"role": "user", "content": text}],
                extra_headers={"X-Hermes-Session": "s1"})
    last = h.model.requests[-1]["messages"]
    assert [(m["role"], m["content"]) for m in last[1:]] == [
        ("user", "first"), ("assistant", "Echo: first"), ("user", "second")]


async def test_idempotency_key_answers_once(make_gateway: GatewayFactory) -> None:
    h = await make_gateway(API)
    async with client(h) as oa:
        answers = [await oa.chat.completions.create(model="hermes", messages=[{"role": "user", "content": "hi"}],
                                                    extra_headers={"Idempotency-Key": "req-1"}) for _ in range(2)]
    assert answers[0].id == answers[1].id and h.model.request_count == 1


@pytest.mark.parametrize(("body", "headers", "status", "param"), [
    ({"model": "hermes"}, {}, 400, "messages"),
    ({"model": "hermes", "messages": []}, {}, 400, "messages"),
    ({"model": "hermes", "messages": [{"role": "robot", "content": "x"}]}, {}, 400, "messages[0].role"),
    ({"model": "hermes", "messages": [{"role": "user", "content": 3}]}, {}, 400, "messages[0].content"),
    ({"model": "hermes", "messages": [{"role": "assistant", "content": "x"}]}, {}, 400, "messages[0].role"),
    ({"model": "hermes", "messages": [{"role": "user", "content": " "}]}, {}, 400, "messages[0].content"),
    ({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}, {}, 400, "model"),
    ({"model": "hermes", "stream": "yes", "messages": [{"role": "user", "content": "x"}]}, {}, 400, "stream"),
    ({"model": "hermes", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, {}, 400,
     "tools"),
    ({"model": "hermes", "session": "a b", "messages": [{"role": "user", "content": "x"}]}, {}, 400, "session"),
    ({"model": "hermes", "messages": [{"role": "user", "content": "x"}]}, {"Idempotency-Key": "é"}, 400,
     "Idempotency-Key"),
    ([1], {}, 400, None),
])
async def test_bad_input_is_refused_naming_the_field(make_gateway: GatewayFactory, body: Any,
                                                    headers: dict[str, str], status: int, param: str | None) -> None:
    h = await make_gateway(API)
    async with h.http.post(f"{h.base_url}/v1/chat/completions", data=json.dumps(body),
                           headers={"Authorization": f"Bearer {FULL_KEY}", **headers}) as r:
        assert r.status == status
        error = (await r.json())["error"]
    assert error["param"] == param and error["message"]
    assert await inbox_count(h) == 0 and h.model.request_count == 0


async def test_keys_are_checked(make_gateway: GatewayFactory) -> None:
    h = await make_gateway(API)
    for key in ("wrong-key-0123456789", "", FULL_KEY[:-1]):
        async with client(h, key or "x") as oa:
            with pytest.raises(openai.AuthenticationError):
                await oa.chat.completions.create(model="hermes", messages=[{"role": "user", "content": "x"}])
    async with h.http.get(f"{h.base_url}/v1/models") as r:
        assert r.status == 401
    async with h.http.get(f"{h.base_url}/v1/models", headers={"Authorization": f"Bearer {API_TOKEN}"}) as r:
        assert (await r.json())["data"][0]["id"] == "scripted-model"  # the operator's token is a caller too
    assert await inbox_count(h) == 0


async def test_api_is_off_unless_enabled(make_gateway: GatewayFactory) -> None:
    h = await make_gateway({"http": {"api": {"clients": API["http"]["api"]["clients"]}}})
    async with h.http.get(f"{h.base_url}/v1/models", headers={"Authorization": f"Bearer {FULL_KEY}"}) as r:
        assert r.status == 404
