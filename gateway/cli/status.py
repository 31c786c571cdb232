"""``status``: what the running gateway says about itself (``/readyz`` and ``/api/status``)."""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from typing import Any

from gateway.cli.common import CliError, config_parent, config_path, print_json

ORDER = 3
TIMEOUT_SECONDS = 5.0
_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}


def _base_url(args: argparse.Namespace) -> tuple[str, str]:
    """The gateway's URL (``--url``, else the config's http.host and http.port) and its API token."""
    from gateway.config import load_config

    http = load_config(config_path(args)).http
    token = http.api_token.get_secret_value() if http.api_token else ""
    if args.url:
        return args.url.rstrip("/"), token
    if not http.port:
        raise CliError("http.port is 0 in the config (a port chosen at start): pass --url", 2)
    host = _LOOPBACK.get(http.host, f"[{http.host}]" if ":" in http.host else http.host)
    return f"http://{host}:{http.port}", token


def _get(url: str, token: str | None = None) -> tuple[int, dict[str, Any]]:
    """GET a JSON endpoint: (HTTP status, body). CliError when nothing answers."""
    import urllib.error  # http.client and email: 40 ms that --help need not pay
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:  # 401, 503: still the gateway's answer
        with exc:
            try:
                return exc.code, json.load(exc)
            except ValueError:
                return exc.code, {}
    except OSError as exc:  # refused, unreachable, timed out (URLError is one)
        reason = getattr(exc, "reason", exc)
        raise CliError(f"no gateway answered at {url.rsplit('/', 1)[0]} ({reason}); is it running? "
                       "(--url points elsewhere)") from None
    except ValueError:
        raise CliError(f"{url} did not answer with JSON: is that a hermes-gateway?") from None


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
    ready_code, ready = _get(f"{url}/readyz")
    if not token:
        raise CliError(f"/readyz answered {ready_code} (ready: {ready.get('ready')}); the summary needs "
                       "http.api_token, which the config does not set")
    code, summary = _get(f"{url}/api/status", token)
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
