"""``check``: validate the config without starting anything."""

from __future__ import annotations

import argparse
import sys

from gateway.cli.common import config_parent, config_path

ORDER = 5


def _cmd_check(args: argparse.Namespace) -> int:
    import yaml

    from gateway.config import load_config
    from gateway.tool_sandbox import detect_isolation

    path = config_path(args)
    cfg = load_config(path)
    print(yaml.safe_dump(cfg.masked(), sort_keys=False, allow_unicode=True), end="")
    if cfg.mcp_servers:
        from gateway.mcp_service import report_reachability

        report_reachability(cfg.mcp_servers)  # an unreachable server is a warning: the exit code stays 0
    isolation = detect_isolation(cfg, path)
    print(f"tool sandbox: {isolation.describe()}", file=sys.stderr)
    print("config OK", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``check``."""
    sub.add_parser("check", parents=[config_parent()],
                   help="validate the config and print it resolved, secrets masked").set_defaults(func=_cmd_check)
