"""``tools`` (what each toolset resolves to, and what each platform and route gets) and ``mcp`` (the MCP
servers)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

from gateway.cli.common import CliError, config_parent, config_path, load, print_json

if TYPE_CHECKING:
    from gateway.tool_report import ToolGroup

ORDER = 10


def _print_group(group: ToolGroup, heading: str) -> None:
    print(f"{heading}  ({group.available}/{len(group.tools)} available)  {group.description}")
    for note in group.notes:
        print(f"  ! {note}")
    width = max([14, *(len(t.name) for t in group.tools)])
    for tool in group.tools:
        shown = f"available, in the {tool.runs_in}" if tool.available else f"unavailable: {tool.reason}"
        print(f"  {'+' if tool.available else '-'} {tool.name:<{width}} {shown}")


def _cmd_tools(args: argparse.Namespace) -> int:
    from gateway.config import load_config
    from gateway.logs import setup_logging
    from gateway.tool_report import tool_report
    from toolsets import ToolsetError

    path = config_path(args)
    cfg = load_config(path)
    setup_logging(args.log_level or "WARNING", args.log_format or "text", cfg.secret_values())
    try:
        report = asyncio.run(tool_report(cfg, path, args.toolset))
    except ToolsetError as exc:
        raise CliError(str(exc), 2) from None
    if args.json:
        print_json(report.to_dict())
        return 0
    print(f"tool sandbox: {report.sandbox}", file=sys.stderr)
    for group in report.toolsets:
        _print_group(group, group.name)
    if report.consumers is not None:
        print(f"\nwhat runs get with {path}:")
        for group in report.consumers:
            _print_group(group, f"{group.name} [{', '.join(group.toolsets)}]")
    return 0


def _cmd_mcp(args: argparse.Namespace) -> int:
    from gateway.mcp_service import mcp_list, mcp_test

    cfg = load(args)
    return mcp_test(cfg.mcp_servers, args.name) if args.mcp_command == "test" else mcp_list(cfg.mcp_servers)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``tools`` and ``mcp``."""
    tools = sub.add_parser("tools", parents=[config_parent()],
                           help="list toolsets with their resolved tools, availability and where they run; with a "
                                "config file, also what each platform, webhook route and cron run gets")
    tools.add_argument("--toolset", help="show only this toolset")
    tools.add_argument("--json", action="store_true", help="print the report as JSON")
    tools.set_defaults(func=_cmd_tools)
    mcp = sub.add_parser("mcp", help="the configured MCP servers").add_subparsers(dest="mcp_command", required=True)
    mcp.add_parser("list", parents=[config_parent()], help="each server, connected to once, with its tool count"
                   ).set_defaults(func=_cmd_mcp)
    mcp_test_cmd = mcp.add_parser("test", parents=[config_parent()], help="connect to one server and list its tools")
    mcp_test_cmd.add_argument("name")
    mcp_test_cmd.set_defaults(func=_cmd_mcp)
