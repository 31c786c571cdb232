"""ScriptedModel against the real openai SDK (aiohttp transport) on an ephemeral port."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import aiohttp
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.sim.model_server import (
    ScriptedModel,
    ToolCall,
    Turn,
    default_responder,
    last_user_text,
    parse_directives,
    rules,
    text,
    tool_call,
    tool_calls,
)

T = TypeVar("T")
WAIT = 5.0
MODEL = "scripted-model"
USER_HI = [{"role": "user", "content": "hi"}]
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


async def w(aw: Awaitable[T], timeout: float = WAIT) -> T:
    """Every wait in these tests is bounded."""
    return await asyncio.wait_for(aw, timeout)


def make_client(model: ScriptedModel, api_key: str = "sk-test", timeout: float = WAIT) -> openai.AsyncOpenAI:
    assert model.base_url is not None
    return openai.AsyncOpenAI(
        base_url=model.base_url,
        api_key=api_key,
        max_retries=0,
        timeout=timeout,
        http_client=openai.DefaultAioHttpClient(),
    )


@pytest.fixture
async def model() -> AsyncIterator[ScriptedModel]:
    async with ScriptedModel(chunk_size=4) as m:
        yield m


@pytest.fixture
async def client(model: ScriptedModel) -> AsyncIterator[openai.AsyncOpenAI]:
    c = make_client(model)
    yield c
    await c.close()


async def collect(stream: openai.AsyncStream[Any]) -> list[Any]:
    return [chunk async for chunk in stream]


async def stream_chunks(client: openai.AsyncOpenAI, **kwargs: Any) -> list[Any]:
    stream = await w(client.chat.completions.create(model=MODEL, stream=True, **kwargs))
    return await w(collect(stream))


# ------------------------------------------------------------------------------------ lifecycle


async def test_start_returns_v1_base_url_and_stop_closes_port() -> None:
    m = ScriptedModel()
    url = await w(m.start())
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    assert m.base_url == url
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/models") as resp:
            assert resp.status == 200
            body = await resp.json()
        assert body["object"] == "list" and [d["id"] for d in body["data"]] == [MODEL]
        await w(m.stop())
        with pytest.raises(aiohttp.ClientConnectionError):
            await w(session.get(url + "/models"))


async def test_models_list_through_sdk(client: openai.AsyncOpenAI) -> None:
    page = await w(client.models.list())
    assert [m.id for m in page.data] == [MODEL]


# -------------------------------------------------------------------------------- non-streaming


async def test_non_streaming_text(model: ScriptedModel, client: openai.AsyncOpenAI) -> None:
    model.push(text("hello there"))
    r = await w(client.chat.completions.create(model="my-model", messages=USER_HI))
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    assert r.model == "my-model"
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "hello there"
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    assert r.usage is not None
    assert r.usage.prompt_tokens == len("hi") // 4
    assert r.usage.completion_tokens == len("hello there") // 4
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


async def test_non_streaming_tool_call(model: ScriptedModel, client: openai.AsyncOpenAI) -> None:
    model.push(tool_call("get_weather", {"city": "Paris"}))
    r = await w(client.chat.completions.create(model=MODEL, messages=USER_HI, tools=TOOLS))
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


async def test_parallel_tool_calls_have_unique_ids_and_explicit_id_kept(
    model: ScriptedModel, client: openai.AsyncOpenAI
) -> None:
    model.push(tool_calls([("a", {"x": 1}), ToolCall("b", '{"y": 2}', id="call_fixed"), ("c", None)]))
    r = await w(client.chat.completions.create(model=MODEL, messages=USER_HI))
    calls = r.choices[0].message.tool_calls
    assert calls is not None
    assert [c.function.name for c in calls] == ["a", "b", "c"]
    assert [json.loads(c.function.arguments) for c in calls] == [{"x": 1}, {"y": 2}, {}]
    assert calls[1].id == "call_fixed"
    assert len({c.id for c in calls}) == 3


async def test_turn_overrides_finish_reason_and_usage(
    model: ScriptedModel, client: openai.AsyncOpenAI
) -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107}
    model.push(Turn(content="trunc", finish_reason="length", usage=usage))
    r = await w(client.chat.completions.create(model=MODEL, messages=USER_HI))
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.total_tokens == 107


# ------------------------------------------------------------------------------------ streaming


STREAM_TEXTS = [
    "Hello, streaming world!",
    'quotes " and \\ backslashes\nand newlines\n\n',
    "data: [DONE]\n\nnot the end",
    "unicode: héllo wörld ✓ 🎉🎉 中文",
]


@pytest.mark.parametrize("content", STREAM_TEXTS)
async def test_streaming_text_reassembled_from_several_chunks(
    model: ScriptedModel, client: openai.AsyncOpenAI, content: str
) -> None:
    model.push(text(content))
    chunks = await stream_chunks(client, messages=USER_HI)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1
    assert all(len(p) <= 4 for p in pieces)
    assert "".join(pieces) == content
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    assert all(c.usage is None for c in chunks)


async def test_streaming_raw_wire_format(model: ScriptedModel) -> None:
    """The bytes on the wire: text/event-stream, `data: {json}\\n\\n` events, then `data: [DONE]`."""
    model.push(tool_call("f", {"k": "v"}, content="ok"))
    payload = {"model": MODEL, "messages": USER_HI, "stream": True, "stream_options": {"include_usage": True}}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{model.base_url}/chat/completions", json=payload) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        raw = await w(resp.text())
    assert raw.endswith("data: [DONE]\n\n")
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    parsed = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert all(p["object"] == "chat.completion.chunk" for p in parsed)
    assert all("usage" in p for p in parsed)  # include_usage: null on every chunk but the last
    assert parsed[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert parsed[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert parsed[-1]["choices"] == [] and parsed[-1]["usage"]["total_tokens"] >= 1


async def test_streaming_chunk_delay_makes_text_progressive(
    model: ScriptedModel, client: openai.AsyncOpenAI
) -> None:
    model.push(text("abcdefghijkl", chunk_delay=0.05))  # 3 content chunks of 4 chars
    stream = await w(client.chat.completions.create(model=MODEL, messages=USER_HI, stream=True))
    arrivals: list[tuple[float, str]] = []

    async def consume() -> None:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append((time.monotonic(), chunk.choices[0].delta.content))

    await w(consume())
    assert [p for _, p in arrivals] == ["abcd", "efgh", "ijkl"]
    assert arrivals[-1][0] - arrivals[0][0] >= 0.09


async def test_streaming_tool_call_via_stream_helper(
    model: ScriptedModel, client: openai.AsyncOpenAI
) -> None:
    args = {"city": "San Francisco, California", "units": "metric", "days": [1, 2, 3]}
    model.push(tool_calls([("get_weather", args), ("get_time", {"tz": "Europe/Paris"})]))

    async def run() -> Any:
        async with client.chat.completions.stream(model=MODEL, messages=USER_HI, tools=TOOLS) as stream:
            return await stream.get_final_completion()

    final = await w(run())
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].function.arguments) == args
    assert json.loads(calls[1].function.arguments) == {"tz": "Europe/Paris"}
    assert all(c.id.startswith("call_") for c in calls)


async def test_streaming_tool_call_reassembled_by_index(
    model: ScriptedModel, client: openai.AsyncOpenAI
) -> None:
    args0 = {"city": "Paris", "note": "a fairly long argument value"}
    model.push(tool_calls([("get_weather", args0), ("noop", {})], content="Let me check."))
    chunks = await stream_chunks(client, messages=USER_HI, tools=TOOLS)

    content = ""
    calls: dict[int, dict[str, Any]] = {}
    arg_pieces: dict[int, int] = {}
    for chunk in chunks:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            if tc.index not in calls:
                assert tc.id and tc.type == "function" and tc.function and tc.function.name
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
            else:  # id/name only in the first chunk for an index
                assert tc.id is None and (tc.function is None or tc.function.name is None)
            if tc.function and tc.function.arguments:
                calls[tc.index]["arguments"] += tc.function.arguments
                arg_pieces[tc.index] = arg_pieces.get(tc.index, 0) + 1

    assert content == "Let me check."
    assert sorted(calls) == [0, 1]
    assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["arguments"]) == args0
    assert calls[1]["name"] == "noop" and json.loads(calls[1]["arguments"]) == {}
    assert arg_pieces[0] > 1
    assert calls[0]["id"] != calls[1]["id"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_streaming_tool_only_turn_first_chunk_has_role_and_null_content(
    model: ScriptedModel, client: openai.AsyncOpenAI
) -> None:
    model.push(tool_call("get_weather", {"city": "Oslo"}))
    chunks = await stream_chunks(client, messages=USER_HI)
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and first.content is None
    assert first.tool_calls is not None and first.tool_calls[0].function is not None
    assert first.tool_calls[0].function.name == "get_weather"
    assert all(not (c.choices[0].delta.content) for c in chunks)


async def test_stream_usage_chunk_with_include_usage(
    model: ScriptedModel, client: openai.AsyncOpenAI
) -> None:
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello there"}]
    model.push(text("General Kenobi"))
    chunks = await stream_chunks(client, messages=messages, stream_options={"include_usage": True})
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.prompt_tokens == (len("You are terse.") + len("hello there")) // 4
    assert last.usage.completion_tokens == len("General Kenobi") // 4
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == "stop"


# ------------------------------------------------------------------------------- default responder


async def test_default_responder_echo(client: openai.AsyncOpenAI) -> None:
    r = await w(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "ping"}]))
    assert r.choices[0].message.content == "Echo: ping"
    assert r.choices[0].finish_reason == "stop"


async def test_default_responder_directive_then_tool_result(client: openai.AsyncOpenAI) -> None:
    user = {"role": "user", "content": 'please [[tool:get_weather {"city": "Paris"}]] now'}
    r1 = await w(client.chat.completions.create(model=MODEL, messages=[user], tools=TOOLS))
    assert r1.choices[0].finish_reason == "tool_calls"
    calls = r1.choices[0].message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}

    result = "sunny, 21C " + "x" * 300
    messages: list[Any] = [
        user,
        {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": result},
    ]
    r2 = await w(client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS))
    assert r2.choices[0].message.content == "Done: " + result[:200]
    assert r2.choices[0].finish_reason == "stop"


async def test_default_responder_directive_streaming(client: openai.AsyncOpenAI) -> None:
    content = '[[tool:search {"q": "cats and dogs", "limit": 5}]]'
    chunks = await stream_chunks(client, messages=[{"role": "user", "content": content}])
    name = "".join(
        tc.function.name or "" for c in chunks for tc in c.choices[0].delta.tool_calls or [] if tc.function
    )
    args = "".join(
        tc.function.arguments or ""
        for c in chunks
        for tc in c.choices[0].delta.tool_calls or []
        if tc.function
    )
    assert name == "search"
    assert json.loads(args) == {"q": "cats and dogs", "limit": 5}


def test_default_responder_unit_paths() -> None:
    assert default_responder({"messages": []}).content == "Echo: "
    parts = [{"type": "text", "text": "multi"}, {"type": "text", "text": "part"}]
    assert default_responder({"messages": [{"role": "user", "content": parts}]}).content == "Echo: multipart"
    two_results = {
        "messages": [
            {"role": "user", "content": "[[tool:a]] [[tool:b {}]]"},
            {"role": "assistant", "content": None},
            {"role": "tool", "tool_call_id": "1", "content": "first"},
            {"role": "tool", "tool_call_id": "2", "content": "second"},
        ]
    }
    assert default_responder(two_results).content == "Done: first | second"
    turn = default_responder({"messages": two_results["messages"][:1]})
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("a", "{}"), ("b", "{}")]
    # A directive in an older user message does not fire again after an assistant reply.
    stale = {"messages": [*two_results["messages"][:1], {"role": "assistant", "content": "ok"}]}
    assert default_responder(stale).tool_calls == ()
    assert last_user_text(stale) == "[[tool:a]] [[tool:b {}]]"


def test_parse_directives_edge_cases() -> None:
    assert parse_directives("no directives") == []
    assert parse_directives('[[tool:x {"a": [[1, 2]], "b": "]]"}]]') == [
        ToolCall("x", '{"a": [[1, 2]], "b": "]]"}')
    ]
    assert parse_directives("[[tool:bad not json]] tail") == [ToolCall("bad", "not json")]
    assert parse_directives("[[tool:unterminated {") == []
    assert parse_directives('[[tool:a]][[tool:b {"n": 1}]]') == [
        ToolCall("a", "{}"),
        ToolCall("b", '{"n": 1}'),
    ]


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=10,
)


@given(
    name=st.from_regex(r"[A-Za-z0-9_\-]{1,20}", fullmatch=True),
    args=st.dictionaries(st.text(max_size=8), _json_values, max_size=4),
    before=st.text(max_size=20).filter(lambda s: "[[tool:" not in s),
    after=st.text(max_size=20),
)
def test_parse_directives_roundtrips_any_json_args(
    name: str, args: dict[str, Any], before: str, after: str
) -> None:
    calls = parse_directives(f"{before}[[tool:{name} {json.dumps(args)}]]{after}")
    assert calls[0].name == name
    assert json.loads(calls[0].arguments) == args


# ------------------------------------------------------------------------- custom responders, queue


async def test_queue_before_responder_and_responder_set_later(
    model: ScriptedModel, client: openai.AsyncOpenAI
) -> None:
    seen: list[str] = []

    def responder(request: dict[str, Any]) -> str:
        seen.append(last_user_text(request))
        return f"custom {len(seen)}"

    model.responder = responder
    model.push("queued one", text("queued two"))
    assert model.pending_turns == 2
    got = []
    for word in ["a", "b", "c", "d"]:
        r = await w(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": word}]))
        got.append(r.choices[0].message.content)
    assert got == ["queued one", "queued two", "custom 1", "custom 2"]
    assert seen == ["c", "d"]
    assert model.pending_turns == 0


async def test_async_responder() -> None:
    async def responder(request: dict[str, Any]) -> Turn:
        await asyncio.sleep(0)
        return tool_call("t", {"n": len(request["messages"])})

    async with ScriptedModel(responder) as m:
        client = make_client(m)
        try:
            r = await w(client.chat.completions.create(model=MODEL, messages=USER_HI))
        finally:
            await client.close()
    calls = r.choices[0].message.tool_calls
    assert calls is not None and json.loads(calls[0].function.arguments) == {"n": 1}


async def test_rules_responder(model: ScriptedModel, client: openai.AsyncOpenAI) -> None:
    model.responder = rules(
        (r"weather in (\w+)", lambda m, req: tool_call("get_weather", {"city": m.group(1)})),
        (r"^hello", "Hi!"),
    )
    r1 = await w(
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "weather in Rome"}])
    )
    calls = r1.choices[0].message.tool_calls
    assert calls is not None and json.loads(calls[0].function.arguments) == {"city": "Rome"}
    r2 = await w(
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello you"}])
    )
    assert r2.choices[0].message.content == "Hi!"
    r3 = await w(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "other"}]))
    assert r3.choices[0].message.content == "Echo: other"
    # After the tool result, rules are skipped (no loop) and the fallback answers.
    messages: list[Any] = [
        {"role": "user", "content": "weather in Rome"},
        {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "rainy"},
    ]
    r4 = await w(client.chat.completions.create(model=MODEL, messages=messages))
    assert r4.choices[0].message.content == "Done: rainy"


async def test_responder_exception_is_a_500(model: ScriptedModel, client: openai.AsyncOpenAI) -> None:
    def broken(request: dict[str, Any]) -> Turn:
        raise ValueError("boom")

    model.responder = broken
    with pytest.raises(openai.InternalServerError) as info:
        await w(client.chat.completions.create(model=MODEL, messages=USER_HI))
    assert "boom" in info.value.message


# ---------------------------------------------------------------------------------------- faults


async def test_fail_next_500_then_success(model: ScriptedModel, client: openai.AsyncOpenAI) -> None:
    model.fail_next(1, 500)
    with pytest.raises(openai.InternalServerError) as info:
        await w(client.chat.completions.create(model=MODEL, messages=USER_HI))
    assert info.value.status_code == 500
    assert isinstance(info.value.body, dict) and info.value.body["type"] == "server_error"
    r = await w(client.chat.completions.create(model=MODEL, messages=USER_HI))
    assert r.choices[0].message.content == "Echo: hi"
    assert model.request_count == 2


async def test_fail_next_does_not_consume_queued_turns(
    model: ScriptedModel, client: openai.AsyncOpenAI
) -> None:
    model.push("scripted")
    model.fail_next(2, 503)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            await w(client.chat.completions.create(model=MODEL, messages=USER_HI, stream=True))
    r = await w(client.chat.completions.create(model=MODEL, messages=USER_HI))
    assert r.choices[0].message.content == "scripted"


async def test_fail_next_429_with_retry_after(model: ScriptedModel, client: openai.AsyncOpenAI) -> None:
    model.fail_next(1, status=429, retry_after=7)
    with pytest.raises(openai.RateLimitError) as info:
        await w(client.chat.completions.create(model=MODEL, messages=USER_HI))
    assert info.value.status_code == 429
    assert info.value.response.headers["retry-after"] == "7"
    assert info.value.code == "rate_limit_exceeded"


async def test_drop_next_is_a_connection_error(model: ScriptedModel, client: openai.AsyncOpenAI) -> None:
    model.drop_next(1)
    # The aiohttp transport maps a server disconnect to APITimeoutError, a subclass of APIConnectionError.
    with pytest.raises(openai.APIConnectionError):
        await w(client.chat.completions.create(model=MODEL, messages=USER_HI))
    r = await w(client.chat.completions.create(model=MODEL, messages=USER_HI))
    assert r.choices[0].message.content == "Echo: hi"


async def test_drop_mid_stream_after_chunks(model: ScriptedModel, client: openai.AsyncOpenAI) -> None:
    model.drop_next(1, after_chunks=2)
    model.push(text("a long answer that is cut off"))
    stream = await w(client.chat.completions.create(model=MODEL, messages=USER_HI, stream=True))
    received: list[Any] = []

    async def consume() -> None:
        async for chunk in stream:
            received.append(chunk)

    with pytest.raises(openai.APIConnectionError):
        await w(consume())
    assert len(received) == 2
    assert received[1].choices[0].delta.content == "a lo"


async def test_hang_next_times_out_client_and_stop_is_fast() -> None:
    m = ScriptedModel()
    await w(m.start())
    fast = make_client(m, timeout=0.3)
    slow = make_client(m, timeout=30.0)
    try:
        m.hang_next(2)
        with pytest.raises(openai.APITimeoutError):
            await w(fast.chat.completions.create(model=MODEL, messages=USER_HI))
        pending = asyncio.create_task(slow.chat.completions.create(model=MODEL, messages=USER_HI))
        await w(m.wait_for_requests(2))
        started = time.monotonic()
        await w(m.stop(), timeout=2.0)
        assert time.monotonic() - started < 1.0
        with pytest.raises(openai.APIConnectionError):
            await w(pending)
    finally:
        await m.stop()
        await fast.close()
        await slow.close()


async def test_stop_wakes_requests_sleeping_in_latency() -> None:
    m = ScriptedModel(latency=30.0)
    await w(m.start())
    client = make_client(m, timeout=30.0)
    try:
        pending = asyncio.create_task(client.chat.completions.create(model=MODEL, messages=USER_HI))
        await w(m.wait_for_requests(1))
        started = time.monotonic()
        await w(m.stop(), timeout=2.0)
        assert time.monotonic() - started < 1.0
        with pytest.raises(openai.APIConnectionError):
            await w(pending)
    finally:
        await client.close()


async def test_latency_server_wide_and_per_turn() -> None:
    async with ScriptedModel(latency=0.2) as m:
        client = make_client(m)
        try:
            started = time.monotonic()
            await w(client.chat.completions.create(model=MODEL, messages=USER_HI))
            assert time.monotonic() - started >= 0.19
            m.latency = 0.0
            m.push(text("slow turn", latency=0.3))
            started = time.monotonic()
            r = await w(client.chat.completions.create(model=MODEL, messages=USER_HI))
            assert time.monotonic() - started >= 0.29
            assert r.choices[0].message.content == "slow turn"
        finally:
            await client.close()


# ------------------------------------------------------------------------------------------ auth


async def test_auth_checked_when_api_key_given() -> None:
    async with ScriptedModel(api_key="sk-right") as m:
        wrong = make_client(m, api_key="sk-wrong")
        right = make_client(m, api_key="sk-right")
        try:
            with pytest.raises(openai.AuthenticationError) as info:
                await w(wrong.chat.completions.create(model=MODEL, messages=USER_HI))
            assert info.value.status_code == 401
            assert info.value.code == "invalid_api_key"
            with pytest.raises(openai.AuthenticationError):
                await w(wrong.models.list())
            r = await w(right.chat.completions.create(model=MODEL, messages=USER_HI))
            assert r.choices[0].message.content == "Echo: hi"
            assert m.request_count == 1  # rejected requests are not recorded
        finally:
            await wrong.close()
            await right.close()


async def test_no_auth_check_without_api_key(model: ScriptedModel) -> None:
    client = make_client(model, api_key="anything-goes")
    try:
        r = await w(client.chat.completions.create(model=MODEL, messages=USER_HI))
        assert r.choices[0].message.content == "Echo: hi"
    finally:
        await client.close()


async def test_invalid_bodies_get_400(model: ScriptedModel) -> None:
    async with aiohttp.ClientSession() as session:
        url = f"{model.base_url}/chat/completions"
        async with session.post(url, data=b"{not json", headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["type"] == "invalid_request_error"
        async with session.post(url, json={"model": MODEL}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["param"] == "messages"


# ------------------------------------------------------------------------------------- recording


async def test_requests_recorded_and_wait_for_requests(
    model: ScriptedModel, client: openai.AsyncOpenAI
) -> None:
    assert model.request_count == 0
    words = [f"msg{i}" for i in range(5)]
    tasks = [
        asyncio.create_task(
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": x}])
        )
        for x in words
    ]
    recorded = await w(model.wait_for_requests(5))
    assert len(recorded) >= 5
    await w(asyncio.gather(*tasks))
    assert model.request_count == 5
    assert sorted(last_user_text(r) for r in model.requests) == words
    assert all(r["model"] == MODEL for r in model.requests)

    await w(client.chat.completions.create(model=MODEL, messages=USER_HI, tools=TOOLS, temperature=0.5))
    last = model.requests[-1]
    assert last["tools"][0]["function"]["name"] == "get_weather"
    assert last["temperature"] == 0.5

    with pytest.raises(TimeoutError, match="expected 99"):
        await model.wait_for_requests(99, timeout=0.05)


async def test_concurrent_load_smoke(model: ScriptedModel, client: openai.AsyncOpenAI) -> None:
    """Many concurrent streamed and plain calls all get their own answer."""

    async def one(i: int) -> str:
        msgs = [{"role": "user", "content": f"n{i}"}]
        if i % 2:
            chunks = await client.chat.completions.create(model=MODEL, messages=msgs, stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
        r = await client.chat.completions.create(model=MODEL, messages=msgs)
        return r.choices[0].message.content or ""

    results = await w(asyncio.gather(*(one(i) for i in range(100))), timeout=20.0)
    assert results == [f"Echo: n{i}" for i in range(100)]
    assert model.request_count == 100
