"""What tools a configuration offers (``hermes-gateway tools``): each toolset resolved, and what each chat
platform, webhook route and scheduled run actually gets, MCP and plugin tools included, each tool available
or why not, and where it runs.

The report sets up the tool sources as the gateway does (builtin tools, plugins, the MCP servers connected
once, the sandbox probed but never started) and tears them down again. Stdio MCP servers are started as the
report's own subprocesses, not under the sandbox's launcher (whose workspace a first run has not made yet).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.app import install_source_toolsets
from gateway.config import Config
from gateway.plugins import load_gateway_plugins
from gateway.tool_sandbox import detect_isolation, sandbox_policy
from tools.plugins import LoadedPlugins
from tools.registry import ISOLATION_SANDBOX, registry
from tools.sandbox import SandboxPool
from toolsets import (
    SOURCE_PREFIXES,
    TOOLSETS,
    ToolsetError,
    remove_source_toolset,
    resolve_toolset,
    toolset_for_platform,
)

if TYPE_CHECKING:  # the MCP SDK is imported only when servers are configured (as the gateway does)
    from gateway.mcp_service import McpService

_CHAT_PLATFORMS = ("telegram", "discord", "slack")
_MCP_GRACE = 5.0  # beyond the slowest server's connect_timeout, for its process to start


@dataclass(frozen=True, slots=True)
class ToolStatus:
    """One tool: whether a run may use it now (else why not), and whether it runs in the sandbox or the gateway."""

    name: str
    available: bool
    runs_in: str
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ToolGroup:
    """A toolset, or what one consumer (a platform, a webhook route, scheduled runs) gets from its toolsets."""

    name: str
    description: str
    toolsets: tuple[str, ...]
    tools: tuple[ToolStatus, ...]
    notes: tuple[str, ...] = ()
    """Why a tool source among its toolsets adds no tools (an MCP server down, a plugin that failed, ...)."""

    @property
    def available(self) -> int:
        """How many of its tools are available."""
        return sum(t.available for t in self.tools)


@dataclass(frozen=True, slots=True)
class ToolReport:
    """The sandbox and the toolsets; for a config file also what each consumer gets and the tool sources' state."""

    sandbox: str
    toolsets: tuple[ToolGroup, ...]
    consumers: tuple[ToolGroup, ...] | None = None
    mcp_servers: dict[str, dict[str, Any]] | None = None
    plugins: dict[str, dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``--json``): the parts not reported are left out."""
        return {key: value for key, value in asdict(self).items() if value is not None}


def _consumers(cfg: Config) -> Iterator[tuple[str, str, list[str]]]:
    """(name, description, toolset names) of every enabled consumer of tools."""
    for platform in _CHAT_PLATFORMS:
        if getattr(cfg.platforms, platform).enabled:
            yield platform, f"{platform.capitalize()} sessions", toolset_for_platform(platform, cfg.toolsets)
    if cfg.platforms.webhook.enabled:
        for name, route in cfg.platforms.webhook.routes.items():
            toolsets = [route.toolset] if isinstance(route.toolset, str) else list(route.toolset)
            yield f"webhook:{name}", f"runs of webhook route {name}", toolsets
    for name, section in cfg.platforms.plugin_sections.items():
        if section.enabled:
            toolsets = toolset_for_platform(name, cfg.toolsets)
            yield name, f"{name} sessions (platform of plugin {section.plugin})", toolsets
    yield "cron", "scheduled runs (cron jobs made from chat)", toolset_for_platform("cron", cfg.toolsets)


def _sources(mcp: McpService | None, plugins: LoadedPlugins) -> dict[str, str | None]:
    """Each MCP server's and plugin's toolset: None when it provides its tools now, else why not."""
    sources: dict[str, str | None] = {
        f"mcp-{name}": None if status.state == "connected"
        else f"MCP server {name} is not connected ({status.error or status.state})"
        for name, status in (mcp.status() if mcp is not None else {}).items()}
    sources.update({p.toolset: None if p.ok else f"plugin {p.name} failed to load ({p.error})"
                    for p in plugins.statuses})
    return sources


@asynccontextmanager
async def _mcp_connected(cfg: Config) -> AsyncIterator[McpService | None]:
    """The configured MCP servers, each connected or failed once (None when there are none)."""
    if not cfg.mcp_servers:
        yield None
        return
    from gateway.mcp_service import McpService

    service = McpService(cfg.mcp_servers)
    service.start()
    deadline = time.monotonic() + max(s.connect_timeout for s in cfg.mcp_servers.values()) + _MCP_GRACE
    try:
        while time.monotonic() < deadline and any(s.state == "connecting" and not s.failures
                                                  for s in service.status().values()):
            await asyncio.sleep(0.05)
        yield service
    finally:
        await service.stop()


async def tool_report(cfg: Config, path: Path | None, toolset: str | None = None) -> ToolReport:
    """The report for ``cfg`` (read from ``path``; None: the embedded defaults, reported without consumers);
    ``toolset`` limits it to that toolset (``ToolsetError`` when there is none of that name)."""
    registry.discover_builtin_tools()
    isolation = detect_isolation(cfg, path)
    if isolation.level != "none":  # never started: it only answers whether sandboxed tools can run
        registry.sandbox = SandboxPool(isolation, sandbox_policy(cfg))
    memo: dict[Any, bool] = {}
    sources: dict[str, str | None] = {}

    def group(name: str, description: str, toolsets: Sequence[str]) -> ToolGroup:
        notes = tuple(f"{t}: {note}" for t in toolsets if t.startswith(SOURCE_PREFIXES)
                      and (note := sources.get(t, "no MCP server or plugin of that name provides it")))
        tools = []
        for tool in resolve_toolset(toolsets):
            reason = registry.unavailable_reason(tool, memo)
            entry = registry.get(tool)
            sandboxed = entry is not None and entry.isolation == ISOLATION_SANDBOX and isolation.level != "none"
            tools.append(ToolStatus(tool, reason is None, "sandbox" if sandboxed else "gateway", reason))
        return ToolGroup(name, description, tuple(toolsets), tuple(tools), notes)

    plugins = load_gateway_plugins(cfg)
    try:
        async with _mcp_connected(cfg) as mcp:
            created = install_source_toolsets(cfg, plugins)
            sources.update(_sources(mcp, plugins))
            try:
                if toolset is not None and toolset not in TOOLSETS:
                    raise ToolsetError(f"unknown toolset {toolset!r}; known: {', '.join(sorted(TOOLSETS))}")
                toolsets = tuple(group(n, TOOLSETS[n].description, [n]) for n in ([toolset] if toolset
                                                                                    else sorted(TOOLSETS)))
                if path is None or toolset is not None:
                    return ToolReport(isolation.describe(), toolsets)
                return ToolReport(isolation.describe(), toolsets, tuple(group(*c) for c in _consumers(cfg)),
                                  mcp.readiness() if mcp is not None else {},
                                  {p.name: p.to_dict() for p in plugins.statuses})
            finally:
                for name in created:
                    remove_source_toolset(name)
    finally:
        plugins.unload()
