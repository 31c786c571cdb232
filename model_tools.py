"""What the model sees of the tools, and how its tool calls are carried out.

- ``get_tool_plan`` / ``get_tool_definitions``: cached, availability-filtered OpenAI
  tool definitions for a set of toolsets, with progressive disclosure (tool search)
  when non-core schemas would take too much of the context window. The definitions
  are shared with the cache: read-only.
- ``handle_function_call``: coerce arguments -> tool-search bridge -> pre hooks ->
  dispatch (timed) -> post hooks -> transform hooks. Always returns a string.
- ``_run_async``: the bridge that runs async tool handlers off the caller's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tools.registry import registry, tool_error, tool_result
from toolsets import TOOLSETS, Toolset, core_tools, resolve_toolset_traced

logger = logging.getLogger(__name__)

ASYNC_TOOL_TIMEOUT = 300.0
_DEFINITION_CACHE_SIZE = 8

BRIDGE_TOOLS = ("tool_search", "tool_describe", "tool_call")


# -- async bridge --------------------------------------------------------

_thread_local = threading.local()
_global_loop: asyncio.AbstractEventLoop | None = None
_global_loop_lock = threading.Lock()


def _persistent_loop() -> asyncio.AbstractEventLoop:
    """This thread's long-lived loop (one global loop for the main thread)."""
    global _global_loop
    if threading.current_thread() is threading.main_thread():
        with _global_loop_lock:
            if _global_loop is None or _global_loop.is_closed():
                _global_loop = asyncio.new_event_loop()
            return _global_loop
    loop = getattr(_thread_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        _thread_local.loop = loop
    return loop


def _cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


def _run_in_new_thread(coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
    outcome: dict[str, Any] = {}

    def runner() -> None:
        loop = asyncio.new_event_loop()
        try:
            outcome["value"] = loop.run_until_complete(asyncio.wait_for(coro, timeout))
        except BaseException as exc:  # handed back to the calling thread
            outcome["error"] = exc
        finally:
            _cancel_pending(loop)
            loop.close()

    thread = threading.Thread(target=runner, name="hermes-async-bridge", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _run_async(coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
    """Run an async tool's coroutine to completion from synchronous code.

    - a loop is already running in this thread: run on a new thread with a new loop
      (pending tasks cancelled after), so we never re-enter the running loop;
    - a worker thread: its thread-local persistent loop, so async clients cached by
      tools stay bound to a live loop across calls;
    - the main thread with no loop (CLI): one global persistent loop.
    Raises TimeoutError after ``timeout`` seconds (default ``ASYNC_TOOL_TIMEOUT``).
    """
    timeout = ASYNC_TOOL_TIMEOUT if timeout is None else timeout
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _persistent_loop().run_until_complete(asyncio.wait_for(coro, timeout))
    return _run_in_new_thread(coro, timeout)


registry.async_runner = _run_async


# -- hooks ---------------------------------------------------------------

HookKind = Literal["pre_tool_call", "post_tool_call", "transform_tool_result"]
PreHook = Callable[[str, dict[str, Any], Mapping[str, Any]], str | None]
PostHook = Callable[[str, dict[str, Any], str, float, Mapping[str, Any]], None]
TransformHook = Callable[[str, dict[str, Any], str], str | None]

_hooks: dict[str, list[Callable[..., Any]]] = {
    "pre_tool_call": [],
    "post_tool_call": [],
    "transform_tool_result": [],
}
_hooks_lock = threading.Lock()


def register_hook(kind: HookKind, fn: Callable[..., Any]) -> None:
    """Add a hook.

    pre_tool_call(name, args, ctx) -> block message or None; post_tool_call(name, args,
    result, seconds, ctx); transform_tool_result(name, args, result) -> new result or None.
    """
    with _hooks_lock:
        _hooks[kind].append(fn)


def unregister_hook(kind: HookKind, fn: Callable[..., Any]) -> None:
    """Remove a hook added with ``register_hook`` (no-op when absent)."""
    with _hooks_lock, contextlib.suppress(ValueError):
        _hooks[kind].remove(fn)


def clear_hooks() -> None:
    """Remove every hook."""
    with _hooks_lock:
        for fns in _hooks.values():
            fns.clear()


def _hooks_of(kind: HookKind) -> list[Callable[..., Any]]:
    with _hooks_lock:
        return list(_hooks[kind])


# -- argument coercion ---------------------------------------------------

_MISSING = object()


def _alternatives(schema: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The single-type schemas a schema allows, in the order they are to be tried."""
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return [alt for alt in schema[key] if isinstance(alt, Mapping)]
    t = schema.get("type")
    if isinstance(t, list):
        return [{**schema, "type": name} for name in t]
    return [schema]


def _matches(value: Any, type_name: str) -> bool:
    if type_name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return {
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }.get(type_name, lambda v: True)(value)


def _convert(value: Any, type_name: str, schema: Mapping[str, Any]) -> Any:
    """Convert ``value`` to ``type_name`` or return _MISSING."""
    if type_name in ("integer", "number") and isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            number = float(text)
        except ValueError:
            return _MISSING
        if type_name == "integer":
            return int(number) if number.is_integer() else _MISSING
        return number
    if type_name == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if type_name == "boolean" and isinstance(value, str):
        return {"true": True, "false": False, "yes": True, "no": False, "1": True, "0": False}.get(
            value.strip().lower(), _MISSING
        )
    if type_name == "null" and isinstance(value, str) and value.strip().lower() in ("null", "none", ""):
        return None
    if type_name == "string" and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if type_name in ("array", "object") and isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            decoded = _MISSING
        if decoded is not _MISSING and _matches(decoded, type_name):
            return coerce_value(decoded, schema)
    if type_name == "array" and not isinstance(value, list):
        return [coerce_value(value, schema.get("items") or {})]
    return _MISSING


def coerce_value(value: Any, schema: Mapping[str, Any]) -> Any:
    """Coerce one value to what ``schema`` expects; returns the original when nothing fits."""
    try:
        alternatives = _alternatives(schema)
        for alt in alternatives:
            type_name = alt.get("type")
            if not isinstance(type_name, str) or _matches(value, type_name):
                return _coerce_children(value, alt)
        for alt in alternatives:
            converted = _convert(value, alt["type"], alt)
            if converted is not _MISSING:
                return converted
    except Exception:  # coercion is best-effort; never let it break a tool call
        pass
    return value


def _coerce_children(value: Any, schema: Mapping[str, Any]) -> Any:
    if isinstance(value, dict) and isinstance(schema.get("properties"), Mapping):
        props = schema["properties"]
        return {k: coerce_value(v, props[k]) if isinstance(props.get(k), Mapping) else v
                for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [coerce_value(v, schema["items"]) for v in value]
    return value


def coerce_tool_args(name: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """Coerce a tool call's arguments to its schema (string numbers, bare values for arrays...)."""
    entry = registry.get(name)
    if entry is None or not isinstance(args, Mapping):
        return dict(args) if isinstance(args, Mapping) else {}
    params = entry.schema.get("parameters") or {}
    coerced = coerce_value(dict(args), {"type": "object", **params})
    return coerced if isinstance(coerced, dict) else dict(args)


# -- definitions ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolSearchConfig:
    """Progressive disclosure: defer non-core tools when their schemas exceed a share of the context."""

    enabled: bool = True
    context_window_tokens: int = 128_000
    threshold: float = 0.10


@dataclass(slots=True)
class ToolPlan:
    """What one run may use: the definitions sent to the model and the names it may call.

    ``definitions`` is the caller's own list, but its dicts are shared by every plan from the same
    cache entry: never change them (the agent and the openai SDK only read them).
    """

    definitions: list[dict[str, Any]]
    allowed: frozenset[str]
    deferred: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _CachedPlan:
    """A built plan and what it was built from, besides its cache key."""

    generation: int  # the registry's
    toolsets: tuple[tuple[str, Toolset], ...]  # the TOOLSETS entries resolution read
    probed: tuple[str, ...]  # tools whose availability can change without a new generation (check_fn, env)
    probed_available: tuple[str, ...]  # those of them that were available
    plan: ToolPlan

    def holds(self) -> bool:
        """Whether the plan is still right: same registry generation and toolsets, same availability
        of the probed tools (asked of the registry, so its check_fn TTL applies as to any caller)."""
        return (self.generation == registry.generation
                and all(TOOLSETS.get(name) is ts for name, ts in self.toolsets)
                and tuple(registry.available(self.probed)) == self.probed_available)


_plan_cache: OrderedDict[tuple[Any, ...], _CachedPlan] = OrderedDict()
_plan_cache_lock = threading.Lock()
_cache_stats = {"hits": 0, "misses": 0}


def cache_info() -> dict[str, int]:
    """Hit/miss counters and size of the definitions cache."""
    with _plan_cache_lock:
        return {**_cache_stats, "size": len(_plan_cache)}


def clear_definition_cache() -> None:
    """Drop every cached plan and reset the counters."""
    with _plan_cache_lock:
        _plan_cache.clear()
        _cache_stats.update(hits=0, misses=0)


def _estimate_tokens(obj: Any) -> int:
    return len(json.dumps(obj, separators=(",", ":"))) // 4


_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def _drop_mentions(text: str, pattern: re.Pattern[str]) -> str:
    return " ".join(s for s in _SENTENCE.split(text) if not pattern.search(s))


def _strip_unavailable_mentions(defs: list[dict[str, Any]], unavailable: Iterable[str]) -> None:
    """Remove sentences that mention tools the model cannot use (descriptions and parameters)."""
    names = sorted(unavailable, key=len, reverse=True)
    if not names:
        return
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    for d in defs:
        fn = d["function"]
        if pattern.search(fn.get("description", "")):
            fn["description"] = _drop_mentions(fn["description"], pattern)
        for prop in (fn.get("parameters") or {}).get("properties", {}).values():
            if isinstance(prop, dict) and pattern.search(prop.get("description", "")):
                prop["description"] = _drop_mentions(prop["description"], pattern)


def _bridge_definitions() -> list[dict[str, Any]]:
    def fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required}}}

    return [
        fn("tool_search", "Search the additional tools available in this session by keyword. "
           "Returns names and one-line descriptions.",
           {"query": {"type": "string"}, "limit": {"type": "integer", "default": 10}}, ["query"]),
        fn("tool_describe", "Show the full parameter schema of one tool found with tool_search.",
           {"name": {"type": "string"}}, ["name"]),
        fn("tool_call", "Call a tool found with tool_search, with arguments matching its schema.",
           {"name": {"type": "string"}, "arguments": {"type": "object"}}, ["name", "arguments"]),
    ]


def _build_plan(enabled: tuple[str, ...], disabled: tuple[str, ...], search: ToolSearchConfig) -> _CachedPlan:
    generation = registry.generation  # read first: a change during the build leaves the entry stale, never wrong
    all_names = registry.tool_names()
    disabled_tools, disabled_read = resolve_toolset_traced(disabled, all_names)
    enabled_tools, enabled_read = resolve_toolset_traced(enabled, all_names)
    excluded = set(disabled_tools)
    names = [n for n in enabled_tools if n not in excluded]
    entries = registry.snapshot()
    probed = tuple(n for n in names if (e := entries.get(n)) is not None and (e.check_fn or e.requires_env))
    available = registry.available(names)
    plan = _plan_from(available, search)
    return _CachedPlan(generation, tuple({**disabled_read, **enabled_read}.items()), probed,
                       tuple(n for n in probed if n in plan.allowed), plan)


def _plan_from(available: list[str], search: ToolSearchConfig) -> ToolPlan:
    defs = registry.get_definitions(available)
    _strip_unavailable_mentions(defs, set(registry.tool_names()) - set(available))
    core = core_tools()
    extra = [d for d in defs if d["function"]["name"] not in core]
    if search.enabled and extra and _estimate_tokens(extra) > search.threshold * search.context_window_tokens:
        deferred = tuple(d["function"]["name"] for d in extra)
        kept = [d for d in defs if d["function"]["name"] in core]
        return ToolPlan(kept + _bridge_definitions(), frozenset(available), deferred)
    return ToolPlan(defs, frozenset(available))


def get_tool_plan(
    enabled_toolsets: Iterable[str],
    disabled_toolsets: Iterable[str] = (),
    *,
    config_fingerprint: str = "",
    tool_search: ToolSearchConfig | None = None,
) -> ToolPlan:
    """The (cached) tool plan for a run: a new list of read-only definitions (see ``ToolPlan``)."""
    search = tool_search or ToolSearchConfig()
    enabled = tuple(sorted(set(enabled_toolsets)))
    disabled = tuple(sorted(set(disabled_toolsets)))
    key = (enabled, disabled, config_fingerprint, search)
    with _plan_cache_lock:
        cached = _plan_cache.get(key)
        if cached is not None:
            _plan_cache.move_to_end(key)
    if cached is not None and cached.holds():
        with _plan_cache_lock:
            _cache_stats["hits"] += 1
    else:
        cached = _build_plan(enabled, disabled, search)
        with _plan_cache_lock:
            _cache_stats["misses"] += 1
            _plan_cache[key] = cached
            while len(_plan_cache) > _DEFINITION_CACHE_SIZE:
                _plan_cache.popitem(last=False)
    plan = cached.plan
    return ToolPlan(list(plan.definitions), plan.allowed, plan.deferred)


def get_tool_definitions(
    enabled_toolsets: Iterable[str],
    disabled_toolsets: Iterable[str] = (),
    *,
    config_fingerprint: str = "",
    tool_search: ToolSearchConfig | None = None,
) -> list[dict[str, Any]]:
    """OpenAI tool definitions for the toolsets (cached; a new list of read-only definitions)."""
    return get_tool_plan(enabled_toolsets, disabled_toolsets, config_fingerprint=config_fingerprint,
                         tool_search=tool_search).definitions


# -- calls ---------------------------------------------------------------


def _search_tools(query: str, pool: Iterable[str], limit: int) -> list[dict[str, str]]:
    words = [w for w in re.split(r"\W+", query.lower()) if w]
    scored: list[tuple[int, str, str]] = []
    for name in pool:
        entry = registry.get(name)
        if entry is None:
            continue
        haystack = f"{name} {entry.toolset} {entry.description}".lower()
        score = sum(haystack.count(w) + (3 if w in name.lower() else 0) for w in words)
        if score or not words:
            scored.append((score, name, entry.description.split("\n", 1)[0][:200]))
    scored.sort(key=lambda t: (-t[0], t[1]))
    return [{"name": n, "description": d} for _, n, d in scored[: max(1, limit)]]


def _bridge_call(name: str, args: dict[str, Any], enabled_tools: frozenset[str] | None,
                 ctx: Mapping[str, Any]) -> str:
    pool = sorted(enabled_tools) if enabled_tools is not None else registry.tool_names()
    if name == "tool_search":
        limit = coerce_value(args.get("limit", 10), {"type": "integer"})
        return tool_result(tools=_search_tools(str(args.get("query", "")), pool,
                                               limit if isinstance(limit, int) else 10))
    target = str(args.get("name", ""))
    if target in BRIDGE_TOOLS or target not in pool:
        return tool_error(f"Unknown tool: {target}")
    if name == "tool_describe":
        defs = registry.get_definitions([target])
        return tool_result(defs[0]["function"]) if defs else tool_error(f"Tool {target} is unavailable")
    return handle_function_call(target, args.get("arguments") or {}, enabled_tools=enabled_tools, **ctx)


def _parse_args(args: Mapping[str, Any] | str | None) -> dict[str, Any] | str:
    """Arguments as a dict, or an error string."""
    if args is None or args == "":
        return {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError as exc:
            return tool_error(f"Invalid JSON in tool arguments: {exc}")
    if not isinstance(args, Mapping):
        return tool_error("Tool arguments must be a JSON object")
    return dict(args)


def handle_function_call(
    name: str,
    args: Mapping[str, Any] | str | None,
    *,
    enabled_tools: frozenset[str] | None = None,
    **ctx: Any,
) -> str:
    """Carry out one tool call from the model and return the result string.

    ``enabled_tools`` is the run's fixed allowance (``ToolPlan.allowed``): anything
    outside it is refused, including through ``tool_call``.
    """
    parsed = _parse_args(args)
    if isinstance(parsed, str):
        return parsed
    if name in BRIDGE_TOOLS:
        return _bridge_call(name, parsed, enabled_tools, ctx)
    if enabled_tools is not None and name not in enabled_tools:
        return tool_error(f"Tool {name} is not available in this session")
    call_args = coerce_tool_args(name, parsed)
    for hook in _hooks_of("pre_tool_call"):
        try:
            blocked = hook(name, call_args, ctx)
        except Exception as exc:
            logger.warning("pre_tool_call hook %r failed: %s", hook, exc)
            continue
        if blocked:
            return tool_error(str(blocked))
    started = time.perf_counter()
    result = registry.dispatch(name, call_args, **ctx)
    elapsed = time.perf_counter() - started
    for hook in _hooks_of("post_tool_call"):
        try:
            hook(name, call_args, result, elapsed, ctx)
        except Exception as exc:
            logger.warning("post_tool_call hook %r failed: %s", hook, exc)
    for hook in _hooks_of("transform_tool_result"):
        try:
            replaced = hook(name, call_args, result)
        except Exception as exc:
            logger.warning("transform_tool_result hook %r failed: %s", hook, exc)
            continue
        if isinstance(replaced, str):
            result = replaced
    return result
