"""The ``hermes-gateway`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from tools.registry import registry
from toolsets import TOOLSETS, resolve_toolset


def _version() -> str:
    try:
        return version("hermes-gateway")
    except PackageNotFoundError:
        return "unknown"


def _cmd_tools(args: argparse.Namespace) -> int:
    registry.discover_builtin_tools()
    names = [args.toolset] if args.toolset else sorted(TOOLSETS)
    unknown = [n for n in names if n not in TOOLSETS]
    if unknown:
        print(f"error: unknown toolset {unknown[0]!r}; known: {', '.join(sorted(TOOLSETS))}", file=sys.stderr)
        return 2
    memo: dict = {}
    for name in names:
        tools = resolve_toolset(name, registry.tool_names())
        ready = sum(registry.unavailable_reason(t, memo) is None for t in tools)
        print(f"{name}  ({ready}/{len(tools)} available)  {TOOLSETS[name].description}")
        for tool in tools:
            reason = registry.unavailable_reason(tool, memo)
            mark = "+" if reason is None else "-"
            print(f"  {mark} {tool:<14} {'available' if reason is None else 'unavailable: ' + reason}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(prog="hermes-gateway", description=__doc__)
    parser.add_argument("--version", action="version", version=f"hermes-gateway {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    tools = sub.add_parser("tools", help="list toolsets with their resolved tools and availability")
    tools.add_argument("--toolset", help="show only this toolset")
    tools.set_defaults(func=_cmd_tools)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
