"""The gateway's MCP servers: connected in the background, kept up with backoff, reported.

``McpService`` is what the gateway starts: it never blocks startup (a slow or dead server only
shows up in ``/readyz`` detail, never as "not ready"), keeps each server's ``mcp-<name>`` toolset
in step with the server's tool list, and reconnects on ``/reload-mcp``. The sessions themselves
live on the MCP thread of ``tools.mcp_tool.McpManager``, never on the gateway's loop.

``mcp_list``, ``mcp_test`` and ``report_reachability`` back ``hermes-gateway mcp list|test`` and
the MCP lines of ``hermes-gateway check``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from gateway.config import McpServer
from tools.mcp_tool import Launcher, McpManager, McpProbe, McpServerSpec, McpServerStatus, probe
from toolsets import remove_source_toolset, set_source_toolset

logger = logging.getLogger(__name__)


def server_specs(servers: Mapping[str, McpServer], launcher: Launcher | None = None) -> list[McpServerSpec]:
    """The configured servers as connection specs (secrets revealed: they go to the server only); ``launcher``
    starts stdio servers (the gateway's tool sandbox)."""
    return [
        McpServerSpec(
            name, command=s.command, args=tuple(s.args), env={k: v.get_secret_value() for k, v in s.env.items()},
            url=s.url, headers={k: v.get_secret_value() for k, v in s.headers.items()}, timeout=s.timeout,
            connect_timeout=s.connect_timeout,
            enabled_tools=frozenset(s.enabled_tools) if s.enabled_tools is not None else None,
            disabled_tools=frozenset(s.disabled_tools), launcher=launcher)
        for name, s in servers.items()
    ]


def _describe_toolset(spec: McpServerSpec) -> str:
    return f"Tools of MCP server {spec.name} ({spec.transport})."


def _sync_toolset(spec: McpServerSpec, names: Sequence[str]) -> None:
    set_source_toolset(spec.toolset, _describe_toolset(spec), names)


class McpService:
    """Owns the gateway's MCP connections; ``start`` returns at once, ``stop`` unregisters everything."""

    def __init__(self, servers: Mapping[str, McpServer], launcher: Launcher | None = None) -> None:
        self.specs = server_specs(servers, launcher)
        self._manager = McpManager(self.specs, on_tools_changed=_sync_toolset)

    def start(self) -> None:
        """Create the (still empty) ``mcp-<name>`` toolsets and start connecting in the background."""
        if not self.specs:
            return
        for spec in self.specs:
            _sync_toolset(spec, ())
        self._manager.start()
        logger.info("MCP: connecting %d servers in the background: %s", len(self.specs),
                    ", ".join(s.name for s in self.specs))

    async def stop(self) -> None:
        """Disconnect, unregister the tools and drop the toolsets."""
        await asyncio.to_thread(self._manager.stop)
        for spec in self.specs:
            remove_source_toolset(spec.toolset)

    def status(self) -> dict[str, McpServerStatus]:
        """Each server's status."""
        return self._manager.status()

    def readiness(self) -> dict[str, dict[str, Any]]:
        """``/readyz`` detail: state, transport, tool count and last error of each server."""
        return {name: s.to_dict() for name, s in self.status().items()}

    def reload(self) -> str:
        """Reconnect every server and re-list its tools (``/reload-mcp``); the reply text."""
        if not self.specs:
            return "No MCP servers are configured."
        names = self._manager.reconnect()
        return f"Reconnecting {len(names)} MCP server(s): {', '.join(names)}. Their tools are re-listed."


# -- command line --------------------------------------------------------


async def _probe_all(specs: Sequence[McpServerSpec]) -> list[McpProbe]:
    return list(await asyncio.gather(*(probe(s) for s in specs)))


def _summary(result: McpProbe) -> str:
    if not result.ok:
        return f"unreachable: {result.error}"
    off = sum(not t.wanted for t in result.tools)
    filtered = f" ({off} left out by enabled_tools/disabled_tools)" if off else ""
    return f"connected in {result.seconds:.2f} s: {len(result.tools)} tools{filtered}"


def mcp_list(servers: Mapping[str, McpServer], out: TextIO = sys.stdout) -> int:
    """``hermes-gateway mcp list``: every configured server, probed at once; exit code 0."""
    specs = server_specs(servers)
    if not specs:
        print("no MCP servers configured (add them under mcp_servers)", file=out)
        return 0
    width = max(len(s.name) for s in specs)
    for spec, result in zip(specs, asyncio.run(_probe_all(specs)), strict=True):
        print(f"{spec.name:<{width}}  {spec.transport:<5}  {spec.target}", file=out)
        print(f"{'':<{width}}  {_summary(result)}", file=out)
    return 0


def mcp_test(servers: Mapping[str, McpServer], name: str, out: TextIO = sys.stdout,
             err: TextIO = sys.stderr) -> int:
    """``hermes-gateway mcp test NAME``: connect to one server and list its tools; 1 when unreachable."""
    specs = {s.name: s for s in server_specs(servers)}
    spec = specs.get(name)
    if spec is None:
        print(f"error: no MCP server {name!r}; configured: {', '.join(sorted(specs)) or 'none'}", file=err)
        return 2
    print(f"MCP server {spec.name}: {spec.transport}, {spec.target}", file=out)
    result = asyncio.run(probe(spec))
    if not result.ok:
        print(f"unreachable after {result.seconds:.2f} s: {result.error}", file=err)
        return 1
    print(f"connected in {result.seconds:.2f} s ({result.server}, protocol {result.protocol})", file=out)
    print(f"{len(result.tools)} tools:", file=out)
    width = max((len(t.name) for t in result.tools), default=0)
    for tool in result.tools:
        mark = "+" if tool.wanted else "-"
        note = "" if tool.wanted else "(left out by config) "
        print(f"  {mark} {tool.name:<{width}}  {note}{tool.description.splitlines()[0] if tool.description else ''}",
              file=out)
    return 0


def report_reachability(servers: Mapping[str, McpServer], err: TextIO = sys.stderr) -> None:
    """The MCP lines of ``hermes-gateway check``: an unreachable server is a warning, never an error."""
    specs = server_specs(servers)
    for spec, result in zip(specs, asyncio.run(_probe_all(specs)) if specs else [], strict=True):
        if result.ok:
            print(f"mcp server {spec.name}: reachable ({len(result.tools)} tools, {result.seconds:.2f} s)", file=err)
        else:
            print(f"warning: mcp server {spec.name} unreachable: {result.error}", file=err)
