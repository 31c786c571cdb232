"""``webhook send``: fire a signed test delivery at a route of the running gateway."""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from pathlib import Path

from gateway.cli._http import base_url, request_json
from gateway.cli.common import CliError, config_parent, load, print_json

ORDER = 4
_DONE = ("completed", "failed", "cancelled")


def _body(data: str | None) -> bytes:
    """The payload: ``--data`` JSON, ``@file``, or ``-`` for stdin; a small sample when omitted (a new issue
    number each time: schemes that dedupe by the signed body would take a second identical sample for a replay)."""
    if data is None:
        return json.dumps({"action": "opened", "repository": {"full_name": "example/repo"},
                           "issue": {"number": secrets.randbelow(10**6) + 1,
                                     "title": "A test delivery from hermes-gateway webhook send"}}).encode()
    try:
        text = sys.stdin.read() if data == "-" else Path(data[1:]).read_text(encoding="utf-8") \
            if data.startswith("@") else data
    except OSError as exc:
        raise CliError(f"--data {data}: {exc.strerror or exc}", 2) from None
    try:
        json.loads(text)
    except ValueError as exc:
        raise CliError(f"--data is not JSON: {exc}", 2) from None
    return text.encode()


def _wait(url: str, token: str, run_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        code, run = request_json(f"{url}/runs/{run_id}", token=token)
        if code != 200:
            raise CliError(f"{url}/runs/{run_id} answered {code}: {run.get('error', 'no details')}")
        if run.get("status") in _DONE or time.monotonic() > deadline:
            return run
        time.sleep(0.2)


def _cmd_send(args: argparse.Namespace) -> int:
    from platforms.webhook_signatures import sign

    cfg = load(args)
    routes = cfg.platforms.webhook.routes
    route = routes.get(args.route)
    if route is None:
        known = ", ".join(sorted(routes)) or "none: add one under platforms.webhook.routes"
        raise CliError(f"no webhook route {args.route!r} in the config (routes: {known})", 2)
    url = base_url(cfg.http, args.url)
    body = _body(args.data)
    headers = {"Content-Type": "application/json", **sign(route.scheme, route.secrets()[0], body)}
    if route.scheme == "github":
        headers["X-GitHub-Event"] = args.event
    code, answer = request_json(f"{url}/webhooks/{args.route}", body=body, headers=headers)
    if code not in (200, 202) or "run_id" not in answer:
        if answer.get("ignored"):
            raise CliError(f"the route ignored event {answer.get('event')!r} (its events: {', '.join(route.events)});"
                           " pass --event")
        raise CliError(f"POST {url}/webhooks/{args.route} answered {code}: {answer.get('error', 'no details')}")
    run_id = answer["run_id"]
    if not args.wait:
        if args.json:
            print_json(answer)
        else:
            print(f"accepted: run {run_id} (see it with: hermes-gateway runs show {run_id})")
        return 0
    token = cfg.http.api_token.get_secret_value() if cfg.http.api_token else ""
    if not token:
        raise CliError("--wait reads the run from /runs/<id>, which needs http.api_token in the config")
    run = _wait(url, token, run_id, args.timeout)
    if args.json:
        print_json(run)
    else:
        print(f"run {run_id}: {run.get('status')}")
        print(run.get("result") or run.get("error") or "")
    return 0 if run.get("status") == "completed" else 1


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``webhook send``."""
    webhook = sub.add_parser("webhook", help="webhook routes").add_subparsers(dest="webhook_command", required=True)
    send = webhook.add_parser(
        "send", parents=[config_parent()], help="POST a signed test delivery to a route of the running gateway",
        description="Signs a JSON payload with the route's secret and scheme, as its sender would, and posts it "
                    "to the running gateway (URL from http.host and http.port).")
    send.add_argument("route", help="the route's name (platforms.webhook.routes)")
    send.add_argument("--data", help="the JSON payload, @FILE, or - for stdin (default: a sample issue event)")
    send.add_argument("--event", default="issues", help="X-GitHub-Event for github routes (default: issues)")
    send.add_argument("--url", help="the gateway's base URL (default: from the config)")
    send.add_argument("--wait", action="store_true", help="wait for the run and print its result")
    send.add_argument("--timeout", type=float, default=120.0, help="seconds --wait waits (default: 120)")
    send.add_argument("--json", action="store_true", help="print the answer (or the run) as JSON")
    send.set_defaults(func=_cmd_send)
