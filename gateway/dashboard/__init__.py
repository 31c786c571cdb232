"""The operator dashboard: a small web console under ``/dashboard`` of the gateway's HTTP server, enabled by
``http.dashboard.enabled``.

Server-rendered pages (Jinja2 through aiohttp-jinja2, every value passed through the log redactor), a little
plain JavaScript for live updates over server-sent events, token login for a server-side session, CSRF tokens
on every POST and a strict Content-Security-Policy. Modules: ``auth`` (sessions, CSRF, headers), ``views``
(pages and actions), ``data`` (what they read and do), ``live`` (event streams), ``metrics_history`` (the
sparklines' samples).
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp_jinja2
import jinja2
from aiohttp import web
from markupsafe import Markup

from gateway.dashboard.auth import PREFIX, Gatekeeper, add_security_headers
from gateway.dashboard.data import DashboardContext
from gateway.dashboard.live import Live
from gateway.dashboard.metrics_history import sparkline
from gateway.dashboard.views import Views
from gateway.logs import redactor

__all__ = ["DashboardContext", "mount_dashboard"]

_HERE = Path(__file__).resolve().parent


def _redacted(value: Any) -> Any:
    """Jinja's ``finalize``: every value a template prints passes the redactor (None prints nothing)."""
    if value is None:
        return ""
    if isinstance(value, Markup):
        return Markup(redactor(str(value)))
    return redactor(value) if isinstance(value, str) else value


def _when(unix: float | None) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if unix else "-"


def _render(request: web.Request, template: str, context: dict[str, Any]) -> str:
    return aiohttp_jinja2.render_string(template, request, context)


def dashboard_app(ctx: DashboardContext) -> web.Application:
    """The dashboard as an aiohttp sub-application (its routes relative to /dashboard)."""
    gate = Gatekeeper(ctx.cfg.http)
    app = web.Application(middlewares=[gate.middleware])
    env = aiohttp_jinja2.setup(app, loader=jinja2.FileSystemLoader(_HERE / "templates"), autoescape=True,
                               finalize=_redacted, undefined=jinja2.StrictUndefined)
    env.filters["when"] = _when
    env.filters["sparkline"] = sparkline
    live = Live(ctx, _render)
    app.add_routes(Views(ctx, gate).routes())
    app.router.add_get("/events", live.events)
    app.router.add_static("/static", _HERE / "static", show_index=False, follow_symlinks=False)
    sampler: list[asyncio.Task[None]] = []

    async def start(_app: web.Application) -> None:
        sampler.append(asyncio.create_task(ctx.history.run(), name="dashboard-metrics-history"))

    async def cleanup(_app: web.Application) -> None:
        for task in sampler:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app.on_startup.append(start)
    app.on_shutdown.append(live.on_shutdown)
    app.on_cleanup.append(cleanup)
    return app


async def _to_index(_request: web.Request) -> web.Response:
    return web.Response(status=308, headers={"Location": f"{PREFIX}/"})


def mount_dashboard(root: web.Application, ctx: DashboardContext) -> None:
    """Serve the dashboard under /dashboard of ``root`` (the gateway's HTTP app, before it starts), with its
    security headers on every /dashboard response."""
    root.add_subapp(PREFIX, dashboard_app(ctx))
    root.router.add_get(PREFIX, _to_index)
    root.on_response_prepare.append(add_security_headers)
