"""What the model sees of the tools, and how its tool calls are carried out.

- ``get_tool_plan`` / ``get_tool_definitions``: cached, availability-filtered OpenAI
  tool definitions for a set of toolsets, with progressive disclosure (tool search)
  when non-core schemas would take too much of the context window, and schemas cut to
  what strict servers accept when asked (``strict_schemas``). The definitions are shared
  with the cache: read-only.
- ``handle_function_call``: parse -> tool-search bridge -> coerce -> request middleware ->
  pre hooks -> dispatch (timed, inside the execution middleware) -> post hooks -> transform
  hooks -> a result over the tool's limit stored in the workspace, a preview returned.
  Always returns a string.
- ``cap_turn_results``: the same storing across the results of one model turn.
- ``llm_call_context``: what ``pre_llm_call`` hooks add to the next model request.
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
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from tools.code_execution_tool import execute_code_definition
from tools.registry import DEFAULT_MAX_RESULT_CHARS, registry, tool_error, tool_result, truncate_result
from tools.result_store import PREVIEW_CHARS, store_result, stored_notice
from tools.schema_sanitizer import sanitize_definition
from toolsets import TOOLSETS, Toolset, core_tools, resolve_toolset_traced

logger = logging.getLogger(__name__)

ASYNC_TOOL_TIMEOUT = 300.0
DEFAULT_TURN_RESULT_CHARS = 200_000  # of the results of one model turn together (``cap_turn_results``)
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


# -- hooks and middleware ------------------------------------------------

HookKind = Literal["pre_llm_call", "pre_tool_call", "post_tool_call", "transform_tool_result"]
MiddlewareKind = Literal["tool_request", "tool_execution"]
PreLlmHook = Callable[[list[dict[str, Any]], Mapping[str, Any]], str | None]
PreHook = Callable[[str, dict[str, Any], Mapping[str, Any]], str | None]
PostHook = Callable[[str, dict[str, Any], str, float, Mapping[str, Any]], None]
TransformHook = Callable[[str, dict[str, Any], str], str | None]
RequestMiddleware = Callable[[str, dict[str, Any], Mapping[str, Any]], Mapping[str, Any] | None]
CallNext = Callable[[Mapping[str, Any]], str]
ExecutionMiddleware = Callable[[str, dict[str, Any], Mapping[str, Any], CallNext], str]

_HOOK_KINDS: tuple[str, ...] = get_args(HookKind)
_MIDDLEWARE_KINDS: tuple[str, ...] = get_args(MiddlewareKind)
_hooks: dict[str, list[Callable[..., Any]]] = {kind: [] for kind in (*_HOOK_KINDS, *_MIDDLEWARE_KINDS)}
_hooks_lock = threading.Lock()


def _add(kind: str, kinds: tuple[str, ...], fn: Callable[..., Any]) -> None:
    if kind not in kinds:
        raise ValueError(f"unknown kind {kind!r}: use one of {', '.join(kinds)}")
    with _hooks_lock:
        _hooks[kind].append(fn)


def register_hook(kind: HookKind, fn: Callable[..., Any]) -> None:
    """Add a hook (called in registration order; one that raises is logged and skipped).

    - ``pre_llm_call(messages, ctx) -> str | None``: before each model request of a run (``messages``: the
      request's, read-only; ``ctx``: the run's tool context); the texts returned are added to that request only
      (after its last user message's text), never to the transcript;
    - ``pre_tool_call(name, args, ctx) -> str | None``: a string blocks the call (the model gets it as the error);
    - ``post_tool_call(name, args, result, seconds, ctx)``: after every call, a blocked one included: then
      ``ctx["blocked"]`` is True, ``result`` the refusal and ``seconds`` 0;
    - ``transform_tool_result(name, args, result) -> str | None``: a string replaces the result.

    ``name`` is the tool that runs (a ``tool_call`` through tool search shows the tool it calls).
    """
    _add(kind, _HOOK_KINDS, fn)


def register_middleware(kind: MiddlewareKind, fn: Callable[..., Any]) -> None:
    """Add middleware around tool calls (in registration order: the first added is the outermost).

    - ``tool_request(name, args, ctx) -> Mapping | None``: rewrites a call's arguments before the pre hooks and
      the tool see them (return the new arguments, or None to keep them);
    - ``tool_execution(name, args, ctx, call_next) -> str``: wraps the tool's run: ``call_next(args)`` runs the
      rest of the chain and the tool (once; a second call raises) and returns its result, which the middleware
      may transform before returning it.

    Middleware that raises (or returns something else than documented) is logged and skipped: the call goes on
    as if it were absent, with the result of ``call_next`` when it had already called it.
    """
    _add(kind, _MIDDLEWARE_KINDS, fn)


def unregister_hook(kind: HookKind | MiddlewareKind, fn: Callable[..., Any]) -> None:
    """Remove a hook or middleware added with ``register_hook``/``register_middleware`` (no-op when absent)."""
    with _hooks_lock, contextlib.suppress(ValueError, KeyError):
        _hooks[kind].remove(fn)


unregister_middleware = unregister_hook


def clear_hooks() -> None:
    """Remove every hook and middleware."""
    with _hooks_lock:
        for fns in _hooks.values():
            fns.clear()


def has_hooks(kind: HookKind | MiddlewareKind) -> bool:
    """Whether any hook (or middleware) of ``kind`` is registered."""
    with _hooks_lock:
        return bool(_hooks[kind])


def _hooks_of(kind: HookKind | MiddlewareKind) -> list[Callable[..., Any]]:
    with _hooks_lock:
        return list(_hooks[kind])


def llm_call_context(messages: list[dict[str, Any]], ctx: Mapping[str, Any]) -> str:
    """The texts ``pre_llm_call`` hooks give for the next model request (``messages``), joined; "" for none."""
    texts: list[str] = []
    for hook in _hooks_of("pre_llm_call"):
        try:
            text = hook(messages, ctx)
        except Exception as exc:
            logger.warning("pre_llm_call hook %r failed: %s", hook, exc)
            continue
        if isinstance(text, str) and text.strip():
            texts.append(text.strip())
    return "\n\n".join(texts)


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
    toolsets: tuple[tuple[str, Toolset | None], ...]  # the TOOLSETS entries resolution read (None: unknown)
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


def _build_plan(enabled: tuple[str, ...], disabled: tuple[str, ...], search: ToolSearchConfig,
                strict: bool) -> _CachedPlan:
    generation = registry.generation  # read first: a change during the build leaves the entry stale, never wrong
    disabled_tools, disabled_read = resolve_toolset_traced(disabled)
    enabled_tools, enabled_read = resolve_toolset_traced(enabled)
    excluded = set(disabled_tools)
    names = [n for n in enabled_tools if n not in excluded]
    entries = registry.snapshot()
    probed = tuple(n for n in names if (e := entries.get(n)) is not None and (e.check_fn or e.requires_env))
    available = registry.available(names)
    plan = _plan_from(available, search, strict)
    return _CachedPlan(generation, tuple({**disabled_read, **enabled_read}.items()), probed,
                       tuple(n for n in probed if n in plan.allowed), plan)


def _plan_from(available: list[str], search: ToolSearchConfig, strict: bool) -> ToolPlan:
    defs = registry.get_definitions(available)
    _strip_unavailable_mentions(defs, set(registry.tool_names()) - set(available))
    # execute_code's description lists the tools a script may call: this plan's (as the reference builds it; after
    # the stripping, which would take words such as "memory" for the tool).
    defs = [execute_code_definition(available) if d["function"]["name"] == "execute_code" else d for d in defs]
    bridge = _bridge_definitions()
    if strict:
        defs, bridge = [sanitize_definition(d) for d in defs], [sanitize_definition(d) for d in bridge]
    core = core_tools()
    extra = [d for d in defs if d["function"]["name"] not in core]
    if search.enabled and extra and _estimate_tokens(extra) > search.threshold * search.context_window_tokens:
        deferred = tuple(d["function"]["name"] for d in extra)
        kept = [d for d in defs if d["function"]["name"] in core]
        return ToolPlan(kept + bridge, frozenset(available), deferred)
    return ToolPlan(defs, frozenset(available))


def get_tool_plan(
    enabled_toolsets: Iterable[str],
    disabled_toolsets: Iterable[str] = (),
    *,
    config_fingerprint: str = "",
    tool_search: ToolSearchConfig | None = None,
    strict_schemas: bool = False,
) -> ToolPlan:
    """The (cached) tool plan for a run: a new list of read-only definitions (see ``ToolPlan``).

    ``strict_schemas``: parameters cut to the JSON Schema subset strict servers accept (tools/schema_sanitizer.py).
    """
    search = tool_search or ToolSearchConfig()
    enabled = tuple(sorted(set(enabled_toolsets)))
    disabled = tuple(sorted(set(disabled_toolsets)))
    key = (enabled, disabled, config_fingerprint, search, strict_schemas)
    with _plan_cache_lock:
        cached = _plan_cache.get(key)
        if cached is not None:
            _plan_cache.move_to_end(key)
    if cached is not None and cached.holds():
        with _plan_cache_lock:
            _cache_stats["hits"] += 1
    else:
        cached = _build_plan(enabled, disabled, search, strict_schemas)
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
    strict_schemas: bool = False,
) -> list[dict[str, Any]]:
    """OpenAI tool definitions for the toolsets (cached; a new list of read-only definitions)."""
    return get_tool_plan(enabled_toolsets, disabled_toolsets, config_fingerprint=config_fingerprint,
                         tool_search=tool_search, strict_schemas=strict_schemas).definitions


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


def real_call(name: str, arguments: str) -> tuple[str, str]:
    """The tool a call from the model runs and its arguments (JSON): for a ``tool_call`` through tool search, the
    tool it names; otherwise the call as it is."""
    if name != "tool_call":
        return name, arguments
    parsed = _parse_args(arguments)
    if isinstance(parsed, str) or not isinstance(parsed.get("name"), str):
        return name, arguments
    inner = parsed.get("arguments") or {}
    return parsed["name"], inner if isinstance(inner, str) else json.dumps(inner, ensure_ascii=False)


def handle_function_call(
    name: str,
    args: Mapping[str, Any] | str | None,
    *,
    enabled_tools: frozenset[str] | None = None,
    **ctx: Any,
) -> str:
    """Carry out one tool call from the model and return the result string (see the module's docstring).

    ``enabled_tools`` is the run's fixed allowance (``ToolPlan.allowed``): anything outside it is refused,
    including through ``tool_call``. ``ctx`` is handed to hooks, middleware and the tool; with ``workspace`` in it,
    a result over the tool's ``max_result_size_chars`` is stored there (under ``run_id`` and ``tool_call_id``) and
    the model gets a preview with the path; without, the result is cut.
    """
    parsed = _parse_args(args)
    if isinstance(parsed, str):
        return parsed
    if name in BRIDGE_TOOLS:
        return _bridge_call(name, parsed, enabled_tools, ctx)
    if enabled_tools is not None and name not in enabled_tools:
        return tool_error(f"Tool {name} is not available in this session")
    call_args = _rewrite(name, coerce_tool_args(name, parsed), ctx)
    refusal = _refusal(name, call_args, ctx)
    if refusal is None:
        started = time.perf_counter()
        # The run's allowance goes with the call: execute_code offers a script only the tools the run may use.
        result = _execute(name, call_args,
                          ctx if enabled_tools is None else {**ctx, "enabled_tools": sorted(enabled_tools)})
        elapsed, post_ctx = time.perf_counter() - started, ctx
    else:
        result, elapsed, post_ctx = tool_error(refusal), 0.0, {**ctx, "blocked": True}
    for hook in _hooks_of("post_tool_call"):
        try:
            hook(name, call_args, result, elapsed, post_ctx)
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
    entry = registry.get(name)
    limit = entry.result_limit if entry is not None else DEFAULT_MAX_RESULT_CHARS
    return result if len(result) <= limit else _shrink(name, result, limit, ctx, enabled_tools)


def _rewrite(name: str, args: dict[str, Any], ctx: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments after the ``tool_request`` middleware."""
    for middleware in _hooks_of("tool_request"):
        try:
            rewritten = middleware(name, dict(args), ctx)
        except Exception as exc:
            logger.warning("tool_request middleware %r failed on %s: %s", middleware, name, exc)
            continue
        if isinstance(rewritten, Mapping):
            args = dict(rewritten)
        elif rewritten is not None:
            logger.warning("tool_request middleware %r returned %s, not arguments; ignored", middleware,
                           type(rewritten).__name__)
    return args


def _refusal(name: str, args: dict[str, Any], ctx: Mapping[str, Any]) -> str | None:
    """Why a ``pre_tool_call`` hook blocks the call, or None (every hook runs until one blocks)."""
    for hook in _hooks_of("pre_tool_call"):
        try:
            blocked = hook(name, args, ctx)
        except Exception as exc:
            logger.warning("pre_tool_call hook %r failed: %s", hook, exc)
            continue
        if blocked:
            return str(blocked)
    return None


def _execute(name: str, args: dict[str, Any], ctx: Mapping[str, Any]) -> str:
    """Dispatch the call inside the ``tool_execution`` middleware (the first registered outermost)."""
    chain = _hooks_of("tool_execution")

    def call_at(index: int, call_args: dict[str, Any]) -> str:
        if index == len(chain):
            return registry.dispatch(name, call_args, **ctx)
        middleware = chain[index]
        done: list[str] = []

        def call_next(next_args: Mapping[str, Any]) -> str:
            if done:
                raise RuntimeError("call_next was called twice: a tool runs once per call")
            done.append(call_at(index + 1, dict(next_args)))
            return done[0]

        try:
            result = middleware(name, dict(call_args), ctx, call_next)
            if not isinstance(result, str):
                raise TypeError(f"returned {type(result).__name__}, not the result string")
        except Exception as exc:
            logger.warning("tool_execution middleware %r failed on %s: %s", middleware, name, exc)
            return done[0] if done else call_at(index + 1, call_args)
        return result

    return call_at(0, args)


# Tools with which a run can read a stored result back.
_READERS = frozenset({"read_file", "search_files", "terminal", "execute_code"})


def _shrink(name: str, result: str, cut_to: int, ctx: Mapping[str, Any],
            enabled_tools: Iterable[str] | None) -> str:
    """A long result stored in the run's workspace and shown as a preview with its path (cut to ``cut_to``
    characters when there is no workspace, it cannot be written, or the run has no tool to read it with:
    a webhook run's ``web_extract`` is cut, not pointed at a file it cannot open)."""
    workspace = ctx.get("workspace")
    if workspace and (enabled_tools is None or not _READERS.isdisjoint(enabled_tools)):
        try:
            path = store_result(workspace, str(ctx.get("run_id") or "no-run"), str(ctx.get("tool_call_id") or name),
                                result)
        except OSError as exc:
            logger.warning("result of %s (%d characters) not stored in the workspace: %s", name, len(result), exc)
        else:
            return stored_notice(result, path, min(PREVIEW_CHARS, cut_to))
    return truncate_result(result, cut_to)


@dataclass(frozen=True, slots=True)
class TurnResult:
    """One tool result of a model turn: the tool that ran (its real name), the call's id and the result."""

    name: str
    call_id: str
    text: str


def cap_turn_results(results: Sequence[TurnResult], limit: int, ctx: Mapping[str, Any],
                     enabled_tools: Iterable[str] | None = None) -> list[str]:
    """The results of one model turn fitted into ``limit`` characters together: the largest are stored and
    previewed (as ``handle_function_call`` does with one over its tool's limit) until the rest fit. Results no
    longer than twice a preview are left as they are: storing them would not gain enough."""
    texts = [r.text for r in results]
    total = sum(map(len, texts))
    for i in sorted(range(len(texts)), key=lambda i: -len(texts[i])):
        if total <= limit or len(texts[i]) <= 2 * PREVIEW_CHARS:
            break
        shrunk = _shrink(results[i].name, texts[i], PREVIEW_CHARS, {**ctx, "tool_call_id": results[i].call_id},
                         enabled_tools)
        total += len(shrunk) - len(texts[i])
        texts[i] = shrunk
    return texts
