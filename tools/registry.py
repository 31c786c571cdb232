"""The tool registry: every tool registers itself here at the bottom of its module.

Imports nothing of ours (the bottom of the V-shaped import graph). Reads take a
snapshot under an RLock; every change bumps ``_generation`` so that caches built
on top of the registry (``model_tools.get_tool_definitions``) know to rebuild.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

logger = logging.getLogger(__name__)

Handler = Callable[..., Any]
CheckFn = Callable[[], bool]
AsyncRunner = Callable[[Coroutine[Any, Any, Any]], Any]

CHECK_FN_TTL_SECONDS = 30.0
DEFAULT_MAX_RESULT_CHARS = 100_000
# What dispatch hands back at most: a result over its tool's limit reaches ``model_tools`` whole (which stores it
# in the workspace and shows the model a preview), up to this ceiling. It keeps a runaway tool's output within
# memory and within a sandbox frame (16 MiB: 2 M characters take at most 12 MB as escaped UTF-8 JSON).
RESULT_CEILING_CHARS = 2_000_000
MAX_ERROR_CHARS = 600

# Side effects a tool may declare. Restricted toolsets (webhook runs) are checked
# against these, so a tool that writes, executes or sends must say so.
EFFECT_WRITES_FILES = "writes_files"
EFFECT_RUNS_COMMANDS = "runs_commands"
EFFECT_SENDS_MESSAGES = "sends_messages"
EFFECT_WRITES_STATE = "writes_state"
EFFECT_SCHEDULES = "schedules"
KNOWN_EFFECTS = frozenset(
    {EFFECT_WRITES_FILES, EFFECT_RUNS_COMMANDS, EFFECT_SENDS_MESSAGES, EFFECT_WRITES_STATE, EFFECT_SCHEDULES}
)

# Where a tool's handler runs. "sandbox": a worker process in its own namespaces, with no secrets and only
# the workspace writable (every tool that runs commands, parses fetched or uploaded content or compiles a
# model-chosen pattern); "process": in the gateway, through the async bridge (tools whose whole job is the
# gateway's own state). The default is the safe one.
ISOLATION_SANDBOX = "sandbox"
ISOLATION_PROCESS = "process"
ISOLATIONS = frozenset({ISOLATION_SANDBOX, ISOLATION_PROCESS})


class SandboxRunner(Protocol):
    """Runs the handlers of ``isolation="sandbox"`` tools out of process (installed by the gateway)."""

    def unavailable_reason(self, entry: ToolEntry) -> str | None:
        """Why sandboxed tools cannot run now, or None."""
        ...

    def run(self, entry: ToolEntry, args: dict[str, Any], ctx: Mapping[str, Any]) -> str:
        """Run the tool's handler in the sandbox; returns its result string (errors as tool errors)."""
        ...


class ToolEntry:
    """One registered tool: its OpenAI schema, handler and availability probes."""

    __slots__ = (
        "check_fn",
        "description",
        "dynamic_schema_overrides",
        "effects",
        "emoji",
        "handler",
        "is_async",
        "isolation",
        "max_result_size_chars",
        "name",
        "network",
        "requires_env",
        "schema",
        "toolset",
    )

    def __init__(
        self,
        name: str,
        toolset: str,
        schema: dict[str, Any],
        handler: Handler,
        check_fn: CheckFn | None = None,
        requires_env: Sequence[str] = (),
        is_async: bool = False,
        description: str = "",
        emoji: str = "",
        max_result_size_chars: int | None = None,
        dynamic_schema_overrides: Callable[[], dict[str, Any]] | None = None,
        effects: Iterable[str] = (),
        isolation: str = ISOLATION_SANDBOX,
        network: bool = False,
    ) -> None:
        self.name = name
        self.toolset = toolset
        self.schema = schema
        self.handler = handler
        self.check_fn = check_fn
        self.requires_env = tuple(requires_env)
        self.is_async = is_async
        self.description = description or schema.get("description", "")
        self.emoji = emoji
        self.max_result_size_chars = max_result_size_chars
        self.dynamic_schema_overrides = dynamic_schema_overrides
        self.effects = frozenset(effects)
        self.isolation = isolation
        self.network = network

    def __repr__(self) -> str:
        return f"ToolEntry({self.name!r}, toolset={self.toolset!r})"

    @property
    def result_limit(self) -> int:
        """The most characters of a result the model sees as is (``max_result_size_chars``, else the default)."""
        return self.max_result_size_chars or DEFAULT_MAX_RESULT_CHARS


def _is_mcp_toolset(toolset: str) -> bool:
    return toolset.startswith("mcp-")


class ToolRegistry:
    """Thread-safe registry of tools with cached availability checks and safe dispatch."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.RLock()
        self._tools: dict[str, ToolEntry] = {}
        self._generation = 0
        self._clock = clock
        self._check_cache: dict[CheckFn, tuple[float, bool]] = {}
        self._discovered: set[str] = set()
        self.async_runner: AsyncRunner = asyncio.run
        self.sandbox: SandboxRunner | None = None
        """Where ``isolation="sandbox"`` handlers run; None runs them here (a sandbox worker, tests, the CLI)."""

    # -- changes ---------------------------------------------------------

    @property
    def generation(self) -> int:
        """Counter bumped on every change; caches key on it."""
        return self._generation

    def register(
        self,
        name: str,
        toolset: str,
        schema: dict[str, Any],
        handler: Handler,
        *,
        check_fn: CheckFn | None = None,
        requires_env: Sequence[str] = (),
        is_async: bool = False,
        description: str = "",
        emoji: str = "",
        max_result_size_chars: int | None = None,
        dynamic_schema_overrides: Callable[[], dict[str, Any]] | None = None,
        effects: Iterable[str] = (),
        isolation: str = ISOLATION_SANDBOX,
        network: bool = False,
        override: bool = False,
    ) -> bool:
        """Register a tool; returns False (and logs) when the conflict policy rejects it.

        Conflicts: an MCP tool may replace an MCP tool (server refresh); ``override=True``
        may replace anything (logged); re-registering the same handler is a no-op;
        everything else is rejected and logged as an error. Never raises.

        ``isolation`` says where the handler runs (``"sandbox"``, the default, or ``"process"``);
        ``network`` whether a sandboxed handler needs the network.
        """
        unknown = set(effects) - KNOWN_EFFECTS
        if unknown:
            logger.error("tool %s declares unknown effects %s; not registered", name, sorted(unknown))
            return False
        if isolation not in ISOLATIONS:
            logger.error("tool %s declares unknown isolation %r (use %s); not registered", name, isolation,
                         " or ".join(sorted(ISOLATIONS)))
            return False
        entry = ToolEntry(
            name,
            toolset,
            schema,
            handler,
            check_fn=check_fn,
            requires_env=requires_env,
            is_async=is_async,
            description=description,
            emoji=emoji,
            max_result_size_chars=max_result_size_chars,
            dynamic_schema_overrides=dynamic_schema_overrides,
            effects=effects,
            isolation=isolation,
            network=network,
        )
        with self._lock:
            existing = self._tools.get(name)
            if existing is not None:
                if existing.handler is handler and existing.toolset == toolset:
                    return True
                if _is_mcp_toolset(existing.toolset) and _is_mcp_toolset(toolset):
                    logger.debug("MCP tool %s replaced (%s -> %s)", name, existing.toolset, toolset)
                elif override:
                    logger.warning("tool %s from %s overridden by %s", name, existing.toolset, toolset)
                else:
                    logger.error(
                        "tool %s from %s rejected: already registered by %s (pass override=True to replace)",
                        name,
                        toolset,
                        existing.toolset,
                    )
                    return False
            self._tools[name] = entry
            self._generation += 1
        return True

    def deregister(self, name: str) -> bool:
        """Remove a tool; returns whether it was registered."""
        with self._lock:
            if self._tools.pop(name, None) is None:
                return False
            self._generation += 1
            return True

    def deregister_toolset(self, toolset: str) -> list[str]:
        """Remove every tool of one toolset (an MCP server going away); returns their names."""
        with self._lock:
            names = [n for n, e in self._tools.items() if e.toolset == toolset]
            for n in names:
                del self._tools[n]
            if names:
                self._generation += 1
            return names

    def invalidate_check_fn_cache(self) -> None:
        """Forget cached availability probes (and bump the generation)."""
        with self._lock:
            self._check_cache.clear()
            self._generation += 1

    # -- reads -----------------------------------------------------------

    def get(self, name: str) -> ToolEntry | None:
        """The entry for ``name``, or None."""
        with self._lock:
            return self._tools.get(name)

    def snapshot(self) -> dict[str, ToolEntry]:
        """A copy of the name -> entry mapping, safe to iterate without the lock."""
        with self._lock:
            return dict(self._tools)

    def tool_names(self) -> list[str]:
        """Sorted names of all registered tools."""
        with self._lock:
            return sorted(self._tools)

    def toolset_of(self, name: str) -> str | None:
        """The toolset a tool registered under, or None when unknown."""
        entry = self.get(name)
        return entry.toolset if entry else None

    def tools_in_toolset(self, toolset: str) -> list[str]:
        """Sorted names of the tools registered under ``toolset``."""
        with self._lock:
            return sorted(n for n, e in self._tools.items() if e.toolset == toolset)

    def _check_fn_cached(self, check_fn: CheckFn, memo: dict[CheckFn, bool] | None = None) -> bool:
        """Evaluate ``check_fn`` at most once per TTL (and once per ``memo``); errors mean unavailable."""
        if memo is not None and check_fn in memo:
            return memo[check_fn]
        now = self._clock()
        with self._lock:
            cached = self._check_cache.get(check_fn)
        if cached is not None and now - cached[0] < CHECK_FN_TTL_SECONDS:
            result = cached[1]
        else:
            try:
                result = bool(check_fn())
            except Exception as exc:  # a probe that fails means "not available", never a crash
                logger.debug("check_fn %r raised %s: treating as unavailable", check_fn, exc)
                result = False
            with self._lock:
                self._check_cache[check_fn] = (now, result)
        if memo is not None:
            memo[check_fn] = result
        return result

    def unavailable_reason(self, name: str, memo: dict[CheckFn, bool] | None = None) -> str | None:
        """Why the tool cannot be used now (not registered, env var unset, check failed), or None."""
        entry = self.get(name)
        if entry is None:
            return "not registered"
        missing = [var for var in entry.requires_env if not os.environ.get(var)]
        if missing:
            return f"needs {', '.join(missing)}"
        if entry.check_fn is not None and not self._check_fn_cached(entry.check_fn, memo):
            return "not configured or not reachable"
        sandbox = self.sandbox
        if entry.isolation == ISOLATION_SANDBOX and sandbox is not None:
            return sandbox.unavailable_reason(entry)
        return None

    def is_available(self, name: str, memo: dict[CheckFn, bool] | None = None) -> bool:
        """Whether the tool is registered, its env vars are set and its check_fn passes."""
        return self.unavailable_reason(name, memo) is None

    def available(self, names: Iterable[str]) -> list[str]:
        """The subset of ``names`` that is available, in order, probing each check_fn once."""
        memo: dict[CheckFn, bool] = {}
        return [n for n in names if self.is_available(n, memo)]

    def get_definitions(self, names: Iterable[str]) -> list[dict[str, Any]]:
        """OpenAI tool definitions for the available tools among ``names`` (sorted by name)."""
        snap = self.snapshot()
        out: list[dict[str, Any]] = []
        for name in sorted(set(self.available(names))):
            entry = snap.get(name)
            if entry is None:  # deregistered between the two reads
                continue
            function = {"name": name, **{k: v for k, v in entry.schema.items() if k != "name"}}
            if entry.dynamic_schema_overrides is not None:
                try:
                    function.update(entry.dynamic_schema_overrides())
                except Exception as exc:
                    logger.warning("dynamic schema override of %s failed: %s", name, exc)
            out.append({"type": "function", "function": json.loads(json.dumps(function))})
        return out

    # -- dispatch --------------------------------------------------------

    def dispatch(self, name: str, args: Mapping[str, Any], **ctx: Any) -> str:
        """Run a tool and return its whole result as a string (up to ``RESULT_CEILING_CHARS``); never raises.

        Sandboxed tools go to ``sandbox`` when one is installed; otherwise the handler runs here, async
        handlers through ``async_runner`` (``model_tools`` installs its bridge). The tool's own limit
        (``ToolEntry.result_limit``) is the caller's to apply: ``model_tools`` stores a longer result.
        """
        entry = self.get(name)
        if entry is None:
            return tool_error(f"Unknown tool: {name}")
        sandbox = self.sandbox
        if entry.isolation == ISOLATION_SANDBOX and sandbox is not None:
            reason = sandbox.unavailable_reason(entry)
            text = tool_error(f"{name} is unavailable: {reason}") if reason else sandbox.run(entry, dict(args), ctx)
            return truncate_result(text, RESULT_CEILING_CHARS)
        return self.run_here(entry, args, ctx)

    def run_here(self, entry: ToolEntry, args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
        """Run the tool's handler in this process (what a sandbox worker does with each call)."""
        name = entry.name
        try:
            result = entry.handler(dict(args), **ctx)
            if entry.is_async:
                result = self.async_runner(result)
        except Exception as exc:
            logger.info("tool %s failed: %s: %s", name, type(exc).__name__, exc)
            return tool_error(f"{name} failed: {type(exc).__name__}: {exc}")
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
        return truncate_result(text, RESULT_CEILING_CHARS)

    # -- discovery -------------------------------------------------------

    def discover_builtin_tools(self, tools_dir: Path | None = None, package: str = "tools") -> list[str]:
        """Import the modules of ``tools_dir`` that call ``registry.register(...)`` at module level.

        The scan is purely syntactic (AST), so modules that register only inside a
        function (e.g. MCP, registered at runtime) are not imported. Idempotent.
        """
        root = tools_dir or Path(__file__).resolve().parent
        imported: list[str] = []
        for path in sorted(root.glob("*.py")):
            module = f"{package}.{path.stem}"
            if path.stem.startswith("_") or module in self._discovered or module == __name__:
                continue
            if not _registers_at_module_level(path):
                continue
            try:
                importlib.import_module(module)
            except Exception as exc:
                logger.error("tool module %s failed to import: %s", module, exc)
                continue
            self._discovered.add(module)
            imported.append(module)
        return imported


def _registers_at_module_level(path: Path) -> bool:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        logger.error("cannot scan tool module %s: %s", path, exc)
        return False
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) else None
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "register"
            and isinstance(call.func.value, ast.Name)
            and call.func.value.id == "registry"
        ):
            return True
    return False


# -- result helpers ------------------------------------------------------

_ROLE_TAG = re.compile(r"<\|[^|>]{0,40}\|>|</?\s*(system|user|assistant|tool|developer)\b[^>]*>", re.I)
_CDATA = re.compile(r"<!\[CDATA\[.*?\]\]>", re.S)
_XML_TAG = re.compile(r"</?[A-Za-z][\w:.-]*(\s[^<>]*)?/?>")
_FENCE = re.compile(r"```[\w+-]*")
_SPACES = re.compile(r"\s+")


def sanitize_error_text(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Strip markup the model could mistake for structure (role tags, XML, CDATA, fences); cap length."""
    # Cut before the patterns run: error texts can carry fetched content, and the markup patterns
    # backtrack (an unclosed tag rescans to the end), so their cost must not grow with the input.
    text = text[: 4 * limit]
    text = _CDATA.sub(" ", text)
    text = _ROLE_TAG.sub(" ", text)
    text = _XML_TAG.sub(" ", text)
    text = _FENCE.sub(" ", text)
    text = _SPACES.sub(" ", text).strip()
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def truncate_result(text: str, limit: int) -> str:
    """Cut ``text`` to ``limit`` characters with a marker saying how much was dropped."""
    if len(text) <= limit:
        return text
    marker = f"\n[... truncated: showing {limit} of {len(text)} characters]"
    return text[: max(0, limit - len(marker))] + marker


def tool_error(message: str, **extra: Any) -> str:
    """The JSON error string every tool returns on failure (message sanitized)."""
    return json.dumps({"error": sanitize_error_text(str(message)), **extra}, ensure_ascii=False)


def tool_result(data: Any = None, **fields: Any) -> str:
    """Serialize a tool's structured result as JSON (``data`` mapping merged with ``fields``)."""
    if data is None:
        payload: Any = fields
    elif isinstance(data, Mapping):
        payload = {**data, **fields}
    elif fields:
        raise TypeError("tool_result: keyword fields need a mapping (or no) data argument")
    else:
        payload = data
    return json.dumps(payload, ensure_ascii=False, default=str)


B = TypeVar("B")


class BackendSlot(Generic[B]):
    """Where the gateway plugs in what a tool works on (its scheduler, database, outbox ...), so the tool module
    imports nothing of the gateway. A change drops the registry's cached ``check_fn`` answers: tools whose
    ``check_fn`` is ``installed`` appear and disappear with their backend."""

    def __init__(self, default: B) -> None:
        self._backend = default

    def set(self, backend: B) -> None:
        """Use ``backend`` from now on."""
        self._backend = backend
        registry.invalidate_check_fn_cache()

    def get(self) -> B:
        """The backend in use."""
        return self._backend

    def installed(self) -> bool:
        """Whether a backend is plugged in (a ``check_fn``)."""
        return self._backend is not None


registry = ToolRegistry()
