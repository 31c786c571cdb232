"""MCP servers as tool sources: each server's tools are registered at runtime in toolset ``mcp-<server>``.

Threading: every ``ClientSession`` lives on one event loop in a thread owned by ``McpManager``
(the SDK's anyio tasks and streams belong to the loop that created them). A tool handler is a
plain function called on a tool worker thread; it hands the call to that loop with
``run_coroutine_threadsafe`` and waits at most the server's ``timeout``. The gateway's main loop
never carries MCP traffic, and a hung server only ties up the worker thread that called it.

Naming: a tool keeps its MCP name (characters other than letters, digits, ``_`` and ``-``
become ``_``) unless a tool of another toolset already has that name; then it is registered as
``<server>_<tool>`` (logged), and skipped (logged) if that is taken too.

Connections: a server that cannot be reached is retried with exponential backoff; while it is
down its tools stay registered but unavailable (their ``check_fn`` reflects the connection), so
the model never sees them. Sessions use the ``initialize`` handshake, which every server speaks
(2025-11-25 and older, and the SDK's dual-era servers), so ``notifications/tools/list_changed``
arrives on the session itself and re-lists the server's tools.

This module registers nothing at import, so builtin discovery leaves it alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import functools
import importlib.metadata
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, BinaryIO, TextIO

import anyio
import httpx2
import mcp_types as types
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.session import IncomingMessage, MessageHandlerFnT
from mcp.client.streamable_http import streamable_http_client

from tools.registry import (
    EFFECT_WRITES_STATE,
    ISOLATION_PROCESS,
    ToolRegistry,
    registry,
    sanitize_error_text,
    tool_error,
)

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 60.0
DEFAULT_CONNECT_TIMEOUT = 10.0
PING_INTERVAL = 15.0
BACKOFF = (1.0, 60.0)  # first and longest wait between reconnect attempts, in seconds

_CALL_GRACE = 5.0  # the SDK's own per-request timeout should fire first; this only backs it up
_REFRESH_WAIT = 5.0  # how long a call waits for a tool-list refresh its server announced
_SSE_READ_TIMEOUT = 300.0  # streamable HTTP keeps a GET stream open for server messages
_MAX_PAGES = 100
_MAX_DESCRIPTION = 1024
_MAX_NAME = 64
_MAX_STDERR_LINE = 4096  # a longer stderr "line" of a server is logged in pieces of this size
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")

try:
    _VERSION = importlib.metadata.version("hermes-gateway")
except importlib.metadata.PackageNotFoundError:
    _VERSION = "unknown"
_CLIENT_INFO = types.Implementation(name="hermes-gateway", version=_VERSION)

ToolsChanged = Callable[["McpServerSpec", Sequence[str]], None]


class McpState(StrEnum):
    """Where a server's connection is."""

    CONNECTING = "connecting"
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"
    STOPPED = "stopped"


Launcher = Callable[[str, Sequence[str]], list[str]]


@dataclass(frozen=True, slots=True)
class McpServerSpec:
    """How to reach one MCP server: a command run as a subprocess (stdio) or a streamable HTTP URL."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float = DEFAULT_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    enabled_tools: frozenset[str] | None = None
    disabled_tools: frozenset[str] = frozenset()
    launcher: Launcher | None = None
    """Turns a stdio server's command and arguments into the command line that starts it (the sandbox)."""

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name}: give either a command or a url")

    @property
    def toolset(self) -> str:
        """The toolset its tools are registered in."""
        return f"mcp-{self.name}"

    @property
    def transport(self) -> str:
        """``stdio`` or ``http``."""
        return "stdio" if self.command is not None else "http"

    @property
    def target(self) -> str:
        """The command line or URL, for display (never the env or headers)."""
        return " ".join([self.command, *self.args]) if self.command is not None else str(self.url)

    def wants(self, tool: str) -> bool:
        """Whether ``enabled_tools``/``disabled_tools`` let the server's tool ``tool`` through."""
        return (self.enabled_tools is None or tool in self.enabled_tools) and tool not in self.disabled_tools


@dataclass(frozen=True, slots=True)
class McpServerStatus:
    """A server's connection state, the tools it has registered, and its consecutive failed attempts."""

    name: str
    transport: str
    state: McpState
    tools: tuple[str, ...] = ()
    error: str | None = None
    failures: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``/readyz`` detail)."""
        return {"state": str(self.state), "transport": self.transport, "tools": len(self.tools),
                "error": self.error, "failures": self.failures}


@dataclass(frozen=True, slots=True)
class McpToolInfo:
    """One tool a server offers, as a probe saw it."""

    name: str
    description: str
    wanted: bool


@dataclass(frozen=True, slots=True)
class McpProbe:
    """The outcome of one short connection to a server (``hermes-gateway mcp test`` and ``check``)."""

    ok: bool
    seconds: float
    tools: tuple[McpToolInfo, ...] = ()
    server: str = ""
    protocol: str = ""
    error: str | None = None


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of the innermost cause (task groups wrap transport errors), sanitized."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc)
    return sanitize_error_text(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, 300)


async def _log_lines(pipe: BinaryIO, server: str) -> None:
    """Log each line written to the pipe at DEBUG, until every writer has closed it."""
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    pending = b""
    try:
        while chunk := await reader.read(_MAX_STDERR_LINE):
            *lines, pending = (pending + chunk).split(b"\n")
            if len(pending) >= _MAX_STDERR_LINE:
                lines, pending = [*lines, pending], b""
            for line in lines:
                logger.debug("MCP server %s (stderr): %s", server, line.decode(errors="replace").rstrip())
        if pending:
            logger.debug("MCP server %s (stderr): %s", server, pending.decode(errors="replace").rstrip())
    finally:
        transport.close()


@asynccontextmanager
async def _stderr_to_log(server: str) -> AsyncIterator[TextIO]:
    """A pipe for a stdio server's stderr whose lines go to the log at DEBUG rather than to the gateway's console;
    close the yielded end once the server has started (it keeps its own copy)."""
    read_end, write_end = os.pipe()
    reader, writer = os.fdopen(read_end, "rb"), os.fdopen(write_end, "w")
    task = asyncio.create_task(_log_lines(reader, server))
    try:
        yield writer
    finally:
        writer.close()
        # The server has been stopped: what it wrote last is read, unless a child of it still holds the pipe.
        done, _ = await asyncio.wait([task], timeout=1.0)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        reader.close()


@asynccontextmanager
async def _open_session(spec: McpServerSpec,
                        on_message: MessageHandlerFnT | None = None) -> AsyncIterator[ClientSession]:
    """A session over the spec's transport, not yet initialized; control requests time out at connect_timeout."""
    async with AsyncExitStack() as stack:
        if spec.command is not None:
            argv = spec.launcher(spec.command, spec.args) if spec.launcher else [spec.command, *spec.args]
            params = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(spec.env) or None)
            errlog = await stack.enter_async_context(_stderr_to_log(spec.name))
            read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
            errlog.close()
        else:
            timeout = httpx2.Timeout(max(_SSE_READ_TIMEOUT, spec.timeout + _CALL_GRACE), connect=spec.connect_timeout)
            client = await stack.enter_async_context(httpx2.AsyncClient(headers=dict(spec.headers), timeout=timeout))
            read, write = await stack.enter_async_context(streamable_http_client(str(spec.url), http_client=client))
        yield await stack.enter_async_context(ClientSession(
            read, write, read_timeout_seconds=spec.connect_timeout, message_handler=on_message,
            client_info=_CLIENT_INFO))


async def _list_tools(session: ClientSession) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


async def probe(spec: McpServerSpec) -> McpProbe:
    """Connect once, list the tools, disconnect; never raises."""
    started = time.perf_counter()
    try:
        async with _open_session(spec) as session:
            init = await session.initialize()
            tools = await _list_tools(session)
    except Exception as exc:
        return McpProbe(False, time.perf_counter() - started, error=describe_error(exc))
    info = init.server_info
    return McpProbe(True, time.perf_counter() - started,
                    tuple(McpToolInfo(t.name, _description(t, spec), spec.wants(t.name)) for t in tools),
                    f"{info.name} {info.version}".strip(), init.protocol_version)


# -- results -------------------------------------------------------------


def _decoded_size(data: str) -> int:
    return len(data) * 3 // 4 - data[-2:].count("=")


def _render_block(block: types.ContentBlock) -> str:
    """One content block as text; binary content becomes a short reference."""
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent | types.AudioContent):
        return f"[{block.type} {block.mime_type}, {_decoded_size(block.data)} bytes]"
    if isinstance(block, types.ResourceLink):
        kind = f", {block.mime_type}" if block.mime_type else ""
        return f"[resource link {block.uri} ({block.name}{kind})]"
    if isinstance(block, types.EmbeddedResource):
        res = block.resource
        if isinstance(res, types.TextResourceContents):
            return f"[resource {res.uri}]\n{res.text}"
        return f"[resource {res.uri}, {res.mime_type or 'binary'}, {_decoded_size(res.blob)} bytes]"
    return f"[{getattr(block, 'type', 'unknown')} content]"


def format_result(result: types.CallToolResult) -> str:
    """The result string the model sees.

    An error result becomes ``tool_error`` (sanitized). Structured content, when present, is
    the result as JSON (its text blocks are only a serialized copy, per the spec); other
    content is text, with images, audio and resources as short references.
    """
    if result.is_error:
        text = " ".join(b.text for b in result.content if isinstance(b, types.TextContent))
        return tool_error(text or "the tool reported an error")
    parts: list[str] = []
    if result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
        parts += [_render_block(b) for b in result.content if not isinstance(b, types.TextContent)]
    else:
        parts = [_render_block(b) for b in result.content]
    return "\n".join(parts) if parts else "(no output)"


# -- registration --------------------------------------------------------


def _safe_name(name: str) -> str:
    return _UNSAFE.sub("_", name)[:_MAX_NAME]


def _description(tool: types.Tool, spec: McpServerSpec) -> str:
    text = (tool.description or tool.title or f"Tool {tool.name} of MCP server {spec.name}.").strip()
    return text[:_MAX_DESCRIPTION]


def _schema(tool: types.Tool, spec: McpServerSpec) -> dict[str, Any]:
    params: dict[str, Any] = copy.deepcopy(dict(tool.input_schema or {}))
    params.setdefault("type", "object")
    if params["type"] == "object":
        params.setdefault("properties", {})
    return {"description": _description(tool, spec), "parameters": params}


def _effects(tool: types.Tool) -> tuple[str, ...]:
    # Without a read-only hint an MCP tool may change anything: say so.
    read_only = tool.annotations is not None and tool.annotations.read_only_hint is True
    return () if read_only else (EFFECT_WRITES_STATE,)


class _Cancelled(Exception):
    """The run was stopped while a call was waiting."""


def _wait(future: concurrent.futures.Future[str], timeout: float, cancel: threading.Event | None) -> str:
    """``future.result(timeout)``, giving up early when ``cancel`` is set."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        try:
            return future.result(remaining if cancel is None else min(remaining, 0.1))
        except TimeoutError:
            if cancel is not None and cancel.is_set():
                raise _Cancelled from None


class _Connection:
    """One server: its session, its registered tools and its reconnect loop (coroutines run on the MCP loop)."""

    def __init__(self, spec: McpServerSpec, loop: asyncio.AbstractEventLoop, tool_registry: ToolRegistry,
                 on_tools_changed: ToolsChanged | None, backoff: tuple[float, float], ping_interval: float) -> None:
        self.spec = spec
        self._loop = loop
        self._registry = tool_registry
        self._on_tools_changed = on_tools_changed
        self._backoff = backoff
        self._ping_interval = ping_interval
        self._session: ClientSession | None = None
        self._names: set[str] = set()  # the names its tools are registered under
        self._was_connected = False  # what the tools' check_fn said at the last status change
        self.status = McpServerStatus(spec.name, spec.transport, McpState.CONNECTING)
        self._wake = asyncio.Event()  # look at the connection now (reconnect request, failed call)
        self._reconnect = False
        self._served = False  # the current attempt got as far as serving
        self._dirty = asyncio.Event()  # the server said its tool list changed
        self._settled = asyncio.Event()  # no refresh pending
        self._settled.set()

    # -- state -----------------------------------------------------------

    def _is_connected(self) -> bool:
        return self._session is not None

    def _set_status(self, state: McpState, error: str | None = None, failures: int = 0) -> None:
        self.status = McpServerStatus(self.spec.name, self.spec.transport, state, tuple(sorted(self._names)),
                                      error, failures)
        if self._is_connected() != self._was_connected:
            self._was_connected = not self._was_connected
            self._registry.invalidate_check_fn_cache()  # the cached check_fn answer is stale now

    def request_reconnect(self) -> None:
        """Drop the session (if any) and connect again now; call on the MCP loop."""
        self._reconnect = True
        self._wake.set()

    # -- lifecycle -------------------------------------------------------

    async def run(self) -> None:
        """Connect, serve, and reconnect with backoff, until cancelled."""
        delay, failures = self._backoff[0], 0
        while True:
            self._set_status(McpState.CONNECTING, self.status.error, failures)
            self._served = self._reconnect = False
            try:
                reason = await self._serve()
            except Exception as exc:
                reason = describe_error(exc)
            if self._served:  # it was up: start the backoff over
                delay, failures = self._backoff[0], 0
            if self._reconnect:
                wait = 0.0
                logger.info("MCP server %s: reconnecting on request", self.spec.name)
            else:
                failures += 1
                wait = delay * random.uniform(0.9, 1.1)
                delay = min(delay * 2, self._backoff[1])
                logger.warning("MCP server %s (%s) unavailable: %s; retrying in %.1f s",
                               self.spec.name, self.spec.transport, reason, wait)
            self._set_status(McpState.DISCONNECTED, reason, failures)
            self._wake.clear()
            with anyio.move_on_after(wait):
                await self._wake.wait()

    async def _serve(self) -> str:
        """One connection's lifetime; returns why it ended."""
        async with _open_session(self.spec, self._on_message) as session:
            await session.initialize()
            self._install(await _list_tools(session))
            self._session, self._served = session, True
            self._set_status(McpState.CONNECTED)
            logger.info("MCP server %s connected: %d tools", self.spec.name, len(self._names))
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._refresh_loop, session)
                    reason = await self._watch(session)
                    tg.cancel_scope.cancel()
            finally:
                self._session = None
                self._settled.set()
            return reason

    async def _watch(self, session: ClientSession) -> str:
        """Return when a ping fails or a reconnect is requested; pings every ``ping_interval``."""
        while True:
            with anyio.move_on_after(self._ping_interval):
                await self._wake.wait()
            self._wake.clear()
            if self._reconnect:
                return "reconnect requested"
            try:
                await session.send_ping()
            except Exception as exc:
                return f"connection lost ({describe_error(exc)})"

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            # Marked before the call that caused it returns, so that call can wait for the refresh.
            self._settled.clear()
            self._dirty.set()
        elif isinstance(message, Exception):
            logger.debug("MCP server %s transport error: %s", self.spec.name, describe_error(message))
            self._wake.set()

    async def _refresh_loop(self, session: ClientSession) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                self._install(await _list_tools(session))
                self._set_status(McpState.CONNECTED)
                logger.info("MCP server %s tool list changed: %d tools", self.spec.name, len(self._names))
            except Exception as exc:
                logger.warning("MCP server %s: refreshing the tool list failed: %s", self.spec.name,
                               describe_error(exc))
                self._wake.set()
            if not self._dirty.is_set():
                self._settled.set()

    def close(self) -> None:
        """Forget the server's tools (after its ``run`` task was cancelled)."""
        self._install([])
        self._set_status(McpState.STOPPED)

    # -- tools -----------------------------------------------------------

    def _name_for(self, tool: str, taken: set[str]) -> str | None:
        plain = _safe_name(tool)
        for candidate in (plain, _safe_name(f"{self.spec.name}_{tool}")):
            owner = self._registry.toolset_of(candidate)
            if candidate in taken or owner not in (None, self.spec.toolset):
                continue
            if candidate != plain:
                logger.warning("MCP server %s: tool %s registered as %s (%s is taken by %s)", self.spec.name,
                               tool, candidate, plain, self._registry.toolset_of(plain) or "another tool")
            return candidate
        logger.error("MCP server %s: tool %s skipped: its names are taken by other tools", self.spec.name, tool)
        return None

    def _install(self, tools: Sequence[types.Tool]) -> None:
        """Make the registry match ``tools``: register first, then the toolset, then drop what went away."""
        names: set[str] = set()
        for tool in tools:
            if not self.spec.wants(tool.name):
                continue
            name = self._name_for(tool.name, names)
            if name is not None and self._registry.register(
                    name, self.spec.toolset, _schema(tool, self.spec), functools.partial(self._handle, tool.name),
                    check_fn=self._is_connected, effects=_effects(tool),
                    isolation=ISOLATION_PROCESS):  # a proxy: the tool itself runs in the server's process
                names.add(name)
        stale = [n for n in self._names if n not in names]
        self._names = names
        if self._on_tools_changed is not None:
            self._on_tools_changed(self.spec, sorted(names))
        for name in stale:
            if self._registry.toolset_of(name) == self.spec.toolset:
                self._registry.deregister(name)

    def _handle(self, tool: str, args: dict[str, Any], **ctx: Any) -> str:
        """The registry handler of every tool of this server (runs on a tool worker thread)."""
        future = asyncio.run_coroutine_threadsafe(self._call(tool, args), self._loop)
        try:
            return _wait(future, self.spec.timeout + _CALL_GRACE, ctx.get("cancel_event"))
        except TimeoutError:
            future.cancel()
            return tool_error(f"{tool} on MCP server {self.spec.name} timed out after {self.spec.timeout:g} s")
        except _Cancelled:
            future.cancel()
            return tool_error(f"{tool} on MCP server {self.spec.name} was cancelled")
        except concurrent.futures.CancelledError:
            return tool_error(f"MCP server {self.spec.name} is shutting down")

    async def _call(self, tool: str, args: dict[str, Any]) -> str:
        session = self._session
        if session is None:
            return tool_error(f"MCP server {self.spec.name} is not connected ({self.status.state}); try later")
        try:
            result = await session.call_tool(tool, args, read_timeout_seconds=self.spec.timeout)
        except MCPError as exc:
            if exc.code == types.REQUEST_TIMEOUT:
                logger.warning("MCP server %s: %s timed out after %g s", self.spec.name, tool, self.spec.timeout)
                return tool_error(f"{tool} on MCP server {self.spec.name} timed out after {self.spec.timeout:g} s")
            if exc.code == types.CONNECTION_CLOSED:
                self._wake.set()
                return tool_error(f"MCP server {self.spec.name} disconnected during the call")
            return tool_error(f"MCP server {self.spec.name}: {exc.message}")
        except Exception as exc:
            return tool_error(f"MCP server {self.spec.name}: {describe_error(exc)}")
        if not self._settled.is_set():
            with anyio.move_on_after(_REFRESH_WAIT):
                await self._settled.wait()
        return format_result(result)


class McpManager:
    """Owns the MCP event-loop thread and one reconnecting connection per server."""

    def __init__(self, specs: Sequence[McpServerSpec], *, tool_registry: ToolRegistry = registry,
                 on_tools_changed: ToolsChanged | None = None, backoff: tuple[float, float] = BACKOFF,
                 ping_interval: float = PING_INTERVAL) -> None:
        self._loop = asyncio.new_event_loop()
        self._connections = {s.name: _Connection(s, self._loop, tool_registry, on_tools_changed, backoff,
                                                 ping_interval) for s in specs}
        self._tasks: list[asyncio.Task[None]] = []
        self._thread = threading.Thread(target=self._run_loop, name="hermes-mcp", daemon=True)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def start(self) -> None:
        """Start the loop thread and begin connecting every server; returns at once."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(5.0)

    async def _start(self) -> None:
        for conn in self._connections.values():
            task = asyncio.create_task(conn.run(), name=f"mcp-{conn.spec.name}")
            task.add_done_callback(functools.partial(self._log_exit, conn.spec.name))
            self._tasks.append(task)

    @staticmethod
    def _log_exit(name: str, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("MCP server %s supervisor crashed: %s", name, describe_error(task.exception()))

    def status(self) -> dict[str, McpServerStatus]:
        """Each server's current status (safe from any thread)."""
        return {name: conn.status for name, conn in self._connections.items()}

    def reconnect(self) -> list[str]:
        """Reconnect every server, re-listing its tools; returns their names."""
        for conn in self._connections.values():
            self._loop.call_soon_threadsafe(conn.request_reconnect)
        return list(self._connections)

    def stop(self, timeout: float = 10.0) -> None:
        """Disconnect everything, unregister the tools and end the thread (blocking)."""
        if not self._thread.is_alive():
            self._loop.close()  # never started; after a stop the thread already closed it (a no-op then)
            return
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout)
        except TimeoutError:
            logger.warning("MCP servers did not shut down within %.0f s", timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)

    async def _stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for conn in self._connections.values():
            conn.close()
        # Calls still in flight end now (their callers get "shutting down"), not at their timeout.
        calls = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in calls:
            task.cancel()
        await asyncio.gather(*calls, return_exceptions=True)

