"""``status``: what the running gateway says about itself (``/readyz`` and ``/api/status``)."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from gateway.cli._http import base_url, request_json
from gateway.cli.common import CliError, config_parent, config_path, print_json

ORDER = 3


def _base_url(args: argparse.Namespace) -> tuple[str, str]:
    """The gateway's URL and its API token, from ``--url`` and the config."""
    from gateway.config import load_config

    http = load_config(config_path(args)).http
    return base_url(http, args.url), http.api_token.get_secret_value() if http.api_token else ""


def _platform(name: str, status: dict[str, Any]) -> str:
    error = status.get("last_error")
    return f"{name} {status.get('state')}" + (f" ({error})" if error and status.get("state") != "connected" else "")


def _lines(url: str, s: dict[str, Any]) -> list[str]:
    """The summary in a few readable lines."""
    ready = "ready" if s["ready"] else "NOT READY"
    why = "draining" if s.get("draining") else f"store {s.get('store')}"
    runs, cron, outbox = s["runs"], s["cron"], s["outbox"]
    platforms = ", ".join(_platform(n, p) for n, p in s.get("platforms", {}).items()) or "none"
    mcp = ", ".join(f"{n} {m.get('state')}" for n, m in s.get("mcp", {}).items())
    next_at = f", next at {cron['next_at']}" if cron.get("next_at") else ""
    uptime = timedelta(seconds=int(s["uptime_seconds"]))
    lines = [f"hermes-gateway {s['version']} at {url}: {ready} ({why}), up {uptime}",
             f"platforms: {platforms}",
             f"runs: {runs['running']} running, {runs['queued']} queued",
             f"cron: {cron['active']} active jobs, {cron['due']} due{next_at}",
             f"outbox: {outbox['pending']} parts pending, {outbox['in_doubt']} in doubt",
             f"tool sandbox: {s['tool_sandbox']['level']}"]
    return lines + ([f"mcp: {mcp}"] if mcp else [])


def _cmd_status(args: argparse.Namespace) -> int:
    url, token = _base_url(args)
    ready_code, ready = request_json(f"{url}/readyz")
    if not token:
        raise CliError(f"/readyz answered {ready_code} (ready: {ready.get('ready')}); the summary needs "
                       "http.api_token, which the config does not set")
    code, summary = request_json(f"{url}/api/status", token=token)
    if code == 401:
        raise CliError(f"{url}/api/status refused the token (401): http.api_token in the config differs from the "
                       "running gateway's")
    if code != 200:
        raise CliError(f"{url}/api/status answered {code}: {summary.get('error', 'no details')}")
    summary["ready"] = ready_code == 200  # what load balancers see, even if it changed in between
    if args.json:
        print_json({"url": url, **summary})
    else:
        print("\n".join(_lines(url, summary)))
    return 0 if summary["ready"] else 1


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``status``."""
    status = sub.add_parser(
        "status", parents=[config_parent()], help="ask the running gateway how it is",
        description="Readiness, platforms, runs, cron jobs, outbox and tool sandbox of the running gateway, "
                    "read from its /readyz and /api/status (the URL from the config's http.host and http.port, "
                    "the token from http.api_token). Exit 1 when it is not ready, or when nothing answers.")
    status.add_argument("--url", help="the gateway's base URL (default: from the config)")
    status.add_argument("--json", action="store_true", help="print the summary as JSON")
    status.set_defaults(func=_cmd_status)
