"""model_tools: definition cache, availability, description fixes, coercion, call pipeline,
tool search and the async bridge."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import model_tools as mt
from tools.registry import CHECK_FN_TTL_SECONDS, registry, tool_result
from toolsets import TOOLSETS, create_custom_toolset


def _schema(name: str, description: str = "A test tool.", props: dict | None = None) -> dict:
    return {"name": name, "description": description,
            "parameters": {"type": "object", "properties": props or {}}}


def _add(names: list[str], name: str, handler=None, toolset: str = "test-a", **kw) -> None:
    registry.register(name, toolset, kw.pop("schema", None) or _schema(name), handler or
                      (lambda args, **ctx: tool_result(tool=name, args=args)), **kw)
    names.append(name)


# -- definitions ---------------------------------------------------------

def test_cache_hit_miss_and_generation_invalidation(scratch: list[str]) -> None:
    _add(scratch, "t_one")
    create_custom_toolset("test-a", "", ["t_one", "t_two"])
    mt.clear_definition_cache()
    first = mt.get_tool_definitions(["test-a"])
    assert [d["function"]["name"] for d in first] == ["t_one"]
    assert mt.cache_info()["misses"] == 1
    mt.get_tool_definitions(["test-a"])
    assert mt.cache_info()["hits"] == 1
    _add(scratch, "t_two")  # generation bump -> miss, new tool visible
    second = mt.get_tool_definitions(["test-a"])
    assert mt.cache_info()["misses"] == 2
    assert [d["function"]["name"] for d in second] == ["t_one", "t_two"]


def test_cache_keyed_on_config_fingerprint(scratch: list[str]) -> None:
    _add(scratch, "t_one")
    create_custom_toolset("test-a", "", ["t_one"])
    mt.clear_definition_cache()
    mt.get_tool_definitions(["test-a"], config_fingerprint="cfg1")
    mt.get_tool_definitions(["test-a"], config_fingerprint="cfg1")
    mt.get_tool_definitions(["test-a"], config_fingerprint="cfg2")
    assert mt.cache_info() == {"hits": 1, "misses": 2, "size": 2}


def test_cache_hit_shares_definitions_but_each_caller_gets_its_own_list(scratch: list[str]) -> None:
    _add(scratch, "t_one")
    _add(scratch, "t_two")
    create_custom_toolset("test-a", "", ["t_one", "t_two"])
    mt.clear_definition_cache()
    first = mt.get_tool_plan(["test-a"])
    first.definitions.clear()
    first.definitions.append({"type": "function", "function": {"name": "injected"}})
    second = mt.get_tool_plan(["test-a"])
    third = mt.get_tool_plan(["test-a"])
    assert [d["function"]["name"] for d in second.definitions] == ["t_one", "t_two"]
    assert second.definitions is not third.definitions
    assert all(a is b for a, b in zip(second.definitions, third.definitions, strict=True))  # not copied
    assert mt.cache_info()["hits"] == 2


def test_replacing_a_toolset_invalidates_plans_that_read_it(scratch: list[str]) -> None:
    _add(scratch, "t_one")
    _add(scratch, "t_two")
    create_custom_toolset("test-a", "", ["t_one"])
    create_custom_toolset("test-outer", "", [], ["test-a"])
    assert mt.get_tool_plan(["test-outer"]).allowed == {"t_one"}
    generation = registry.generation
    create_custom_toolset("test-a", "", ["t_one", "t_two"])  # an included toolset, no registry change
    assert registry.generation == generation
    assert mt.get_tool_plan(["test-outer"]).allowed == {"t_one", "t_two"}
    del TOOLSETS["test-a"]  # an unknown toolset resolves to nothing at run time
    assert mt.get_tool_plan(["test-outer"]).allowed == frozenset()


def test_deregistering_a_tool_invalidates_the_plan(scratch: list[str]) -> None:
    _add(scratch, "t_one")
    _add(scratch, "t_two")
    create_custom_toolset("test-a", "", ["t_one", "t_two"])
    assert mt.get_tool_plan(["test-a"]).allowed == {"t_one", "t_two"}
    registry.deregister("t_two")
    plan = mt.get_tool_plan(["test-a"])
    assert plan.allowed == {"t_one"} and [d["function"]["name"] for d in plan.definitions] == ["t_one"]


@pytest.fixture
def registry_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """The global registry on a fake clock (``now[0]``); its check_fn answers are forgotten before and after."""
    now = [1000.0]
    monkeypatch.setattr(registry, "_clock", lambda: now[0])
    registry.invalidate_check_fn_cache()
    yield now
    registry.invalidate_check_fn_cache()


def test_cached_plan_follows_check_fn_answers_once_per_ttl(scratch: list[str], registry_clock: list[float]) -> None:
    now = registry_clock
    probes: list[bool] = []
    state = {"up": True}

    def check() -> bool:
        probes.append(state["up"])
        return state["up"]

    _add(scratch, "t_plain")
    _add(scratch, "t_probed", check_fn=check)
    create_custom_toolset("test-a", "", ["t_plain", "t_probed"])
    mt.clear_definition_cache()
    for _ in range(5):
        assert mt.get_tool_plan(["test-a"]).allowed == {"t_plain", "t_probed"}
    state["up"] = False
    now[0] += CHECK_FN_TTL_SECONDS - 1  # the registry's cached answer still holds
    assert mt.get_tool_plan(["test-a"]).allowed == {"t_plain", "t_probed"}
    assert probes == [True]
    now[0] += 2  # expired: probed again, and the plan follows
    for _ in range(3):
        plan = mt.get_tool_plan(["test-a"])
        assert plan.allowed == {"t_plain"} and [d["function"]["name"] for d in plan.definitions] == ["t_plain"]
    assert probes == [True, False]
    assert mt.cache_info() == {"hits": 7, "misses": 2, "size": 1}


def test_cached_plan_follows_required_environment_variables(scratch: list[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HERMES_TEST_PLAN_KEY", raising=False)
    _add(scratch, "t_keyed", requires_env=["HERMES_TEST_PLAN_KEY"])
    create_custom_toolset("test-a", "", ["t_keyed"])
    assert mt.get_tool_plan(["test-a"]).allowed == frozenset()
    monkeypatch.setenv("HERMES_TEST_PLAN_KEY", "set")
    assert mt.get_tool_plan(["test-a"]).allowed == {"t_keyed"}
    monkeypatch.delenv("HERMES_TEST_PLAN_KEY")
    assert mt.get_tool_plan(["test-a"]).allowed == frozenset()


def test_cache_bounded_to_eight(scratch: list[str]) -> None:
    _add(scratch, "t_one")
    create_custom_toolset("test-a", "", ["t_one"])
    mt.clear_definition_cache()
    for i in range(12):
        mt.get_tool_definitions(["test-a"], config_fingerprint=str(i))
    assert mt.cache_info()["size"] == 8


def test_unavailable_tool_never_included_even_when_cached(scratch: list[str]) -> None:
    state = {"up": True}
    _add(scratch, "t_flaky", check_fn=lambda: state["up"])
    create_custom_toolset("test-a", "", ["t_flaky"])
    assert [d["function"]["name"] for d in mt.get_tool_definitions(["test-a"])] == ["t_flaky"]
    state["up"] = False
    registry.invalidate_check_fn_cache()
    assert mt.get_tool_definitions(["test-a"]) == []
    plan = mt.get_tool_plan(["test-a"])
    assert "t_flaky" not in plan.allowed


def test_disabled_toolsets_subtract(scratch: list[str]) -> None:
    _add(scratch, "t_one")
    _add(scratch, "t_two")
    create_custom_toolset("test-a", "", ["t_one", "t_two"])
    create_custom_toolset("test-b", "", ["t_two"])
    assert [d["function"]["name"] for d in mt.get_tool_definitions(["test-a"], ["test-b"])] == ["t_one"]


def test_descriptions_never_mention_unavailable_tools(scratch: list[str]) -> None:
    _add(scratch, "t_reader", schema=_schema(
        "t_reader", "Reads a page. For discovery use t_searcher first. Returns text.",
        {"url": {"type": "string", "description": "A URL. Get one from t_searcher. Must be http."}}))
    _add(scratch, "t_searcher", check_fn=lambda: False)
    create_custom_toolset("test-a", "", ["t_reader", "t_searcher"])
    (d,) = mt.get_tool_definitions(["test-a"])
    assert d["function"]["description"] == "Reads a page. Returns text."
    assert d["function"]["parameters"]["properties"]["url"]["description"] == "A URL. Must be http."


# -- coercion ------------------------------------------------------------

COERCE_CASES = [
    ("5", {"type": "integer"}, 5),
    (" 7 ", {"type": "integer"}, 7),
    ("3.0", {"type": "integer"}, 3),
    ("3.5", {"type": "integer"}, "3.5"),
    (4.0, {"type": "integer"}, 4),
    ("2.5", {"type": "number"}, 2.5),
    ("10", {"type": "number"}, 10),
    ("abc", {"type": "number"}, "abc"),
    ("true", {"type": "boolean"}, True),
    ("False", {"type": "boolean"}, False),
    ("maybe", {"type": "boolean"}, "maybe"),
    ("null", {"type": "null"}, None),
    (5, {"type": "string"}, "5"),
    ("x", {"type": "array", "items": {"type": "string"}}, ["x"]),
    (3, {"type": "array", "items": {"type": "string"}}, ["3"]),
    ('["1", 2]', {"type": "array", "items": {"type": "integer"}}, [1, 2]),
    ('{"a": "1"}', {"type": "object", "properties": {"a": {"type": "integer"}}}, {"a": 1}),
    ("not json", {"type": "object"}, "not json"),
    ("5", {"type": ["integer", "null"]}, 5),
    ("null", {"type": ["integer", "null"]}, None),
    ("5", {"anyOf": [{"type": "boolean"}, {"type": "integer"}]}, 5),
    ("5", {"type": ["string", "integer"]}, "5"),
    (True, {"type": "integer"}, True),
    ({"n": {"m": "2"}}, {"type": "object", "properties": {"n": {"type": "object", "properties": {
        "m": {"type": "integer"}}}}}, {"n": {"m": 2}}),
]


@pytest.mark.parametrize(("value", "schema", "expected"), COERCE_CASES)
def test_coerce_value_table(value: object, schema: dict, expected: object) -> None:
    result = mt.coerce_value(value, schema)
    assert result == expected and type(result) is type(expected)


def test_coerce_tool_args_uses_registered_schema(scratch: list[str]) -> None:
    _add(scratch, "t_typed", schema=_schema("t_typed", props={
        "n": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
        "flag": {"type": "boolean"}}))
    assert mt.coerce_tool_args("t_typed", {"n": "3", "tags": "one", "flag": "yes", "extra": "kept"}) == {
        "n": 3, "tags": ["one"], "flag": True, "extra": "kept"}
    assert mt.coerce_tool_args("not_registered", {"n": "3"}) == {"n": "3"}


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=4),
                     max_leaves=10)
_types = st.sampled_from(["string", "integer", "number", "boolean", "null", "array", "object", "weird"])
_schemas = st.recursive(
    st.builds(lambda t: {"type": t}, _types) | st.builds(lambda ts: {"type": ts}, st.lists(_types, max_size=3)),
    lambda c: st.builds(lambda i: {"type": "array", "items": i}, c)
    | st.builds(lambda p: {"type": "object", "properties": p}, st.dictionaries(st.text(max_size=4), c, max_size=3))
    | st.builds(lambda a: {"anyOf": a}, st.lists(c, max_size=3)),
    max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(value=_json | st.text(max_size=30), schema=_schemas)
def test_coercion_never_raises(value: object, schema: dict) -> None:
    mt.coerce_value(value, schema)


@settings(max_examples=200, deadline=None)
@given(value=st.integers(min_value=-10**12, max_value=10**12))
def test_integer_strings_round_trip(value: int) -> None:
    assert mt.coerce_value(str(value), {"type": "integer"}) == value


# -- call pipeline -------------------------------------------------------

def test_pipeline_order_and_hooks(scratch: list[str]) -> None:
    seen: list[tuple] = []
    _add(scratch, "t_echo", schema=_schema("t_echo", props={"n": {"type": "integer"}}))
    mt.register_hook("pre_tool_call", lambda name, args, ctx: seen.append(("pre", name, args, ctx["user_key"])))
    mt.register_hook("post_tool_call",
                     lambda name, args, result, secs, ctx: seen.append(("post", name, secs >= 0)))
    mt.register_hook("transform_tool_result", lambda name, args, result: result.replace("t_echo", "T_ECHO"))
    out = mt.handle_function_call("t_echo", '{"n": "4"}', user_key="tg:1")
    assert json.loads(out) == {"tool": "T_ECHO", "args": {"n": 4}}
    assert seen == [("pre", "t_echo", {"n": 4}, "tg:1"), ("post", "t_echo", True)]


def test_pre_hook_blocks(scratch: list[str]) -> None:
    ran: list[int] = []
    _add(scratch, "t_guarded", handler=lambda args, **ctx: ran.append(1) or "ran")
    mt.register_hook("pre_tool_call", lambda name, args, ctx: "blocked by policy" if name == "t_guarded" else None)
    assert json.loads(mt.handle_function_call("t_guarded", {})) == {"error": "blocked by policy"}
    assert ran == []


def test_failing_hooks_do_not_break_calls(scratch: list[str]) -> None:
    _add(scratch, "t_one")

    def boom(*a: object) -> None:
        raise RuntimeError("hook bug")

    for kind in ("pre_tool_call", "post_tool_call", "transform_tool_result"):
        mt.register_hook(kind, boom)
    assert json.loads(mt.handle_function_call("t_one", {}))["tool"] == "t_one"


def test_bad_arguments_and_unknown_tool() -> None:
    assert "Invalid JSON" in json.loads(mt.handle_function_call("read_file", "{nope"))["error"]
    assert json.loads(mt.handle_function_call("read_file", "[1]"))["error"] == "Tool arguments must be a JSON object"
    assert json.loads(mt.handle_function_call("ghost_tool", {})) == {"error": "Unknown tool: ghost_tool"}


def test_enabled_tools_is_enforced(scratch: list[str]) -> None:
    _add(scratch, "t_one")
    _add(scratch, "t_secret")
    allowed = frozenset({"t_one"})
    assert json.loads(mt.handle_function_call("t_one", {}, enabled_tools=allowed))["tool"] == "t_one"
    err = json.loads(mt.handle_function_call("t_secret", {}, enabled_tools=allowed))["error"]
    assert err == "Tool t_secret is not available in this session"
    err = json.loads(mt.handle_function_call("tool_call", {"name": "t_secret", "arguments": {}},
                                             enabled_tools=allowed))["error"]
    assert err == "Unknown tool: t_secret"


# -- tool search ---------------------------------------------------------

def test_tool_search_activates_with_many_tools_and_routes_with_real_name(scratch: list[str]) -> None:
    long_desc = "Query the inventory database for records. " * 10
    for i in range(200):
        _add(scratch, f"t_mcp_{i}", toolset="mcp-test",
             schema=_schema(f"t_mcp_{i}", long_desc + f"Variant {i}.", {"id": {"type": "integer"}}))
    _add(scratch, "t_weather", toolset="mcp-test",
         schema=_schema("t_weather", "Get the weather forecast for a city.", {"city": {"type": "string"}}))
    create_custom_toolset("test-many", "", [*scratch, "read_file"])
    registry.discover_builtin_tools()
    plan = mt.get_tool_plan(["test-many"])
    names = [d["function"]["name"] for d in plan.definitions]
    assert names == ["read_file", "tool_search", "tool_describe", "tool_call"]
    assert len(plan.deferred) == 201 and "t_weather" in plan.allowed

    found = json.loads(mt.handle_function_call("tool_search", {"query": "weather forecast"},
                                               enabled_tools=plan.allowed))["tools"]
    assert found[0]["name"] == "t_weather"
    described = json.loads(mt.handle_function_call("tool_describe", {"name": "t_weather"},
                                                   enabled_tools=plan.allowed))
    assert described["parameters"]["properties"]["city"] == {"type": "string"}

    hooked: list[str] = []
    mt.register_hook("pre_tool_call", lambda name, args, ctx: hooked.append(f"pre:{name}"))
    mt.register_hook("post_tool_call", lambda name, args, result, secs, ctx: hooked.append(f"post:{name}"))
    out = mt.handle_function_call("tool_call", {"name": "t_mcp_7", "arguments": {"id": "12"}},
                                  enabled_tools=plan.allowed)
    assert json.loads(out) == {"tool": "t_mcp_7", "args": {"id": 12}}
    assert hooked == ["pre:t_mcp_7", "post:t_mcp_7"]


def test_tool_search_stays_off_below_threshold(scratch: list[str]) -> None:
    for i in range(3):
        _add(scratch, f"t_small_{i}", toolset="mcp-test")
    create_custom_toolset("test-few", "", list(scratch))
    assert len(mt.get_tool_plan(["test-few"]).definitions) == 3
    tight = mt.ToolSearchConfig(context_window_tokens=100, threshold=0.1)
    assert [d["function"]["name"] for d in mt.get_tool_plan(["test-few"], tool_search=tight).definitions] == [
        "tool_search", "tool_describe", "tool_call"]


# -- async bridge --------------------------------------------------------

async def _loop_id() -> int:
    return id(asyncio.get_running_loop())


def test_run_async_main_thread_uses_one_global_loop() -> None:
    assert threading.current_thread() is threading.main_thread()
    assert mt._run_async(_loop_id()) == mt._run_async(_loop_id())


def test_run_async_worker_thread_loop_persists_per_thread() -> None:
    with ThreadPoolExecutor(max_workers=1) as pool:
        a = pool.submit(mt._run_async, _loop_id()).result()
        b = pool.submit(mt._run_async, _loop_id()).result()
    with ThreadPoolExecutor(max_workers=1) as other:
        c = other.submit(mt._run_async, _loop_id()).result()
    main = mt._run_async(_loop_id())
    assert a == b
    assert c != a and main != a


def test_async_client_cached_by_tool_stays_valid_across_calls(scratch: list[str]) -> None:
    state: dict[str, object] = {}

    async def handler(args: dict, **ctx: object) -> str:
        # a tool caching a loop-bound object (like an aiohttp session) between calls
        if "queue" not in state:
            state["queue"] = asyncio.Queue()
        q: asyncio.Queue = state["queue"]  # type: ignore[assignment]
        await q.put(1)
        return str(q.qsize())

    _add(scratch, "t_cached", handler=handler, is_async=True)
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert [pool.submit(mt.handle_function_call, "t_cached", {}).result() for _ in range(3)] == ["1", "2", "3"]


async def test_run_async_inside_running_loop_uses_new_thread() -> None:
    outer = id(asyncio.get_running_loop())
    inner = mt._run_async(_loop_id())
    assert inner != outer


async def test_async_tool_does_not_block_the_main_loop(scratch: list[str]) -> None:
    async def slow(args: dict, **ctx: object) -> str:
        await asyncio.sleep(0.5)
        return "slept"

    _add(scratch, "t_slow", handler=slow, is_async=True)
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.01)

    def nested_loop_call() -> str:
        # a worker thread that itself runs a loop: the bridge must take the new-thread path
        async def inner() -> str:
            return mt.handle_function_call("t_slow", {})
        return asyncio.run(inner())

    loop = asyncio.get_running_loop()
    task = asyncio.create_task(ticker())
    try:
        results = await asyncio.wait_for(asyncio.gather(
            loop.run_in_executor(None, mt.handle_function_call, "t_slow", {}),
            loop.run_in_executor(None, nested_loop_call)), timeout=5)
    finally:
        task.cancel()
    assert results == ["slept", "slept"]
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert len(ticks) >= 30, f"ticker ran {len(ticks)} times in 0.5 s"
    assert max(gaps) < 0.1, f"main loop stalled for {max(gaps):.3f} s"


def test_run_async_timeout_path() -> None:
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=1) as pool, pytest.raises(TimeoutError):
        pool.submit(mt._run_async, forever(), 0.2).result()
    assert time.perf_counter() - started < 5
    assert cancelled.is_set()


async def test_run_async_timeout_path_in_new_thread() -> None:
    async def forever() -> None:
        await asyncio.sleep(30)

    with pytest.raises(TimeoutError):
        mt._run_async(forever(), 0.2)


def test_async_tool_timeout_becomes_tool_error(scratch: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    async def forever(args: dict, **ctx: object) -> str:
        await asyncio.sleep(30)
        return "never"

    _add(scratch, "t_hang", handler=forever, is_async=True)
    monkeypatch.setattr(mt, "ASYNC_TOOL_TIMEOUT", 0.2)
    with ThreadPoolExecutor(max_workers=1) as pool:
        out = json.loads(pool.submit(mt.handle_function_call, "t_hang", {}).result())
    assert out["error"].startswith("t_hang failed: TimeoutError")
