"""``check``: validate the config and summarise it, contacting nothing (``doctor`` does the live checks).

The summary, warnings and ``config OK`` go to stderr; ``--show`` prints the resolved YAML (secrets masked)
to stdout, so it can be redirected on its own.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.cli.common import config_parent, config_path

if TYPE_CHECKING:
    from gateway.config import Config

ORDER = 5


def _toolsets(names: str | list[str]) -> str:
    """``hermes-telegram (11 tools)``: the toolsets and how many tools they give (MCP and plugin tools are
    only known once their source is loaded)."""
    from toolsets import ALL_NAMES, SOURCE_PREFIXES, resolve_toolset

    listed = [names] if isinstance(names, str) else names
    if any(name in ALL_NAMES for name in listed):
        return f"{', '.join(listed)} (every tool)"
    sources = [name for name in listed if name.startswith(SOURCE_PREFIXES)]
    count = len(resolve_toolset([name for name in listed if name not in sources]))
    extra = f" + the tools of {', '.join(sources)}" if sources else ""
    return f"{', '.join(listed)} ({count} tools{extra})"


def _summary(cfg: Config, path: Path | None) -> list[str]:
    from toolsets import toolset_for_platform

    p = cfg.platforms
    chat = [name for name in ("telegram", "slack", "discord") if getattr(p, name).enabled]
    routes = p.webhook.routes if p.webhook.enabled else {}
    enabled = [*chat, *([f"webhook ({len(routes)} routes)"] if routes else []),
               *([f"callback ({len(p.callback.targets)} targets)"] if p.callback.targets else [])]
    lines = [f"config: {path}" if path else "config: none found, the embedded defaults",
             f"model: {cfg.model.name} at {cfg.model.base_url}",
             f"platforms: {', '.join(enabled) or 'none enabled'}"]
    if routes:
        lines.append("webhook routes:")
        lines += [f"  {name}: POST /webhooks/{name}, {r.scheme} signatures, delivers to {r.deliver_to}"
                  for name, r in routes.items()]
    lines.append("toolsets:")
    lines += [f"  {name}: {_toolsets(toolset_for_platform(name, cfg.toolsets))}" for name in (*chat, "cron")]
    lines += [f"  webhook {name}: {_toolsets(r.toolset)}" for name, r in routes.items()]
    if cfg.mcp_servers:
        servers = ", ".join(f"{name} ({'http' if s.url else 'stdio'})" for name, s in cfg.mcp_servers.items())
        lines.append(f"mcp servers: {servers}; not contacted (`hermes-gateway doctor` starts them)")
    return lines


def _cmd_check(args: argparse.Namespace) -> int:
    import yaml

    from gateway.config import load_config
    from gateway.probes import config_findings
    from gateway.tool_sandbox import detect_isolation

    path = config_path(args)
    cfg = load_config(path)
    if args.show:
        print(yaml.safe_dump(cfg.masked(), sort_keys=False, allow_unicode=True), end="")
    for line in _summary(cfg, path):
        print(line, file=sys.stderr)
    print(f"tool sandbox: {detect_isolation(cfg, path).describe()}", file=sys.stderr)
    for finding in config_findings(cfg):
        if finding.status != "ok":
            print(f"warning: {finding.check}: {finding.message}; fix: {finding.fix}", file=sys.stderr)
    print("config OK", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``check``."""
    check = sub.add_parser("check", parents=[config_parent()],
                           help="validate the config and summarise it (contacts nothing; see doctor)")
    check.add_argument("--show", action="store_true", help="also print the resolved config, secrets masked")
    check.set_defaults(func=_cmd_check)
