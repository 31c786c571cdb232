"""``tools`` (what each toolset resolves to) and ``mcp`` (the MCP servers)."""

from __future__ import annotations

import argparse
import sys

from gateway.cli.common import CliError, config_parent, config_path, load

ORDER = 10


def _cmd_tools(args: argparse.Namespace) -> int:
    from gateway.config import load_config
    from gateway.tool_sandbox import detect_isolation, sandbox_policy
    from tools.registry import ISOLATION_SANDBOX, registry
    from tools.sandbox import SandboxPool
    from toolsets import TOOLSETS, resolve_toolset

    path = config_path(args)
    cfg = load_config(path)
    registry.discover_builtin_tools()
    names = [args.toolset] if args.toolset else sorted(TOOLSETS)
    unknown = [n for n in names if n not in TOOLSETS]
    if unknown:
        raise CliError(f"unknown toolset {unknown[0]!r}; known: {', '.join(sorted(TOOLSETS))}", 2)
    isolation = detect_isolation(cfg, path)
    print(f"tool sandbox: {isolation.describe()}", file=sys.stderr)
    if isolation.level != "none":  # never started: it only answers whether sandboxed tools can run
        registry.sandbox = SandboxPool(isolation, sandbox_policy(cfg))
    memo: dict = {}
    for name in names:
        tools = resolve_toolset(name, registry.tool_names())
        ready = sum(registry.unavailable_reason(t, memo) is None for t in tools)
        print(f"{name}  ({ready}/{len(tools)} available)  {TOOLSETS[name].description}")
        for tool in tools:
            reason = registry.unavailable_reason(tool, memo)
            entry = registry.get(tool)
            where = "in the sandbox" if entry and entry.isolation == ISOLATION_SANDBOX and isolation.level != "none" \
                else "in the gateway"
            shown = f"available, {where}" if reason is None else f"unavailable: {reason}"
            print(f"  {'+' if reason is None else '-'} {tool:<14} {shown}")
    return 0


def _cmd_mcp(args: argparse.Namespace) -> int:
    from gateway.mcp_service import mcp_list, mcp_test

    cfg = load(args)
    return mcp_test(cfg.mcp_servers, args.name) if args.mcp_command == "test" else mcp_list(cfg.mcp_servers)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``tools`` and ``mcp``."""
    tools = sub.add_parser("tools", parents=[config_parent()],
                           help="list toolsets with their resolved tools, availability and where they run")
    tools.add_argument("--toolset", help="show only this toolset")
    tools.set_defaults(func=_cmd_tools)
    mcp = sub.add_parser("mcp", help="the configured MCP servers").add_subparsers(dest="mcp_command", required=True)
    mcp.add_parser("list", parents=[config_parent()], help="each server, connected to once, with its tool count"
                   ).set_defaults(func=_cmd_mcp)
    mcp_test_cmd = mcp.add_parser("test", parents=[config_parent()], help="connect to one server and list its tools")
    mcp_test_cmd.add_argument("name")
    mcp_test_cmd.set_defaults(func=_cmd_mcp)
