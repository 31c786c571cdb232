"""Server-sent events for the dashboard's pages (``GET /dashboard/events``): the overview's figures and the latest
runs' statuses; with ``?run=<id>``, that run's status, tool calls and delivery parts as they change.

Every event's data is JSON passed through the log redactor. A stream ends when the client goes or the gateway
stops (its HTTP server's shutdown signal)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.dashboard.auth import operator
from gateway.dashboard.data import DashboardContext, overview, run_detail, run_statuses
from gateway.logs import redactor
from gateway.run_events import RunEvent, run_events

logger = logging.getLogger("gateway.dashboard")

OVERVIEW_SECONDS = 2.0  # how often the overview's figures are read
RUN_SECONDS = 1.0  # how often a run's page looks at the store when no event comes (other replicas, deliveries)
SETTLED_SECONDS = 10.0  # the same, once the run ended and its parts are delivered or failed

Render = Callable[[web.Request, str, dict[str, Any]], str]


class Live:
    """The event streams, and the signal that ends them."""

    def __init__(self, ctx: DashboardContext, render: Render) -> None:
        self.ctx = ctx
        self.render = render
        self.closing = asyncio.Event()

    async def on_shutdown(self, _app: web.Application) -> None:
        """The HTTP server stops: end every stream, so its shutdown does not wait for them."""
        self.closing.set()

    async def events(self, request: web.Request) -> web.StreamResponse:
        """``GET /dashboard/events``: text/event-stream."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Accel-Buffering": "no"})
        await response.prepare(request)
        run_id = request.query.get("run")
        with contextlib.suppress(ConnectionError):  # the browser went away
            await (self._run(request, response, run_id) if run_id else self._overview(request, response))
        return response

    async def _send(self, response: web.StreamResponse, event: str, data: Any) -> None:
        text = redactor(json.dumps(data, ensure_ascii=False, default=str))
        await response.write(f"event: {event}\ndata: {text}\n\n".encode())

    async def _overview(self, request: web.Request, response: web.StreamResponse) -> None:
        last: dict[str, Any] | None = None
        statuses: dict[str, str] = {}
        while not self.closing.is_set():
            data = await overview(self.ctx)
            data["fragments"] = {  # element id -> its new content
                "sparklines": self.render(request, "_sparklines.html", {"series": self.ctx.history.series()}),
                "per-kind": self.render(request, "_per_kind.html", {"per_kind": data["per_kind"]})}
            if data != last:
                await self._send(response, "overview", data)
                last = data
            now = await run_statuses(self.ctx.store)
            if changed := {run_id: s for run_id, s in now.items() if statuses.get(run_id) != s}:
                await self._send(response, "runs", changed)
            statuses = now
            await response.write(b": ping\n\n")  # a gone client is noticed here
            await self._wait(self.closing.wait(), OVERVIEW_SECONDS)

    async def _run(self, request: web.Request, response: web.StreamResponse, run_id: str) -> None:
        queue = run_events.subscribe(run_id)
        live: list[dict[str, Any]] = []  # tool calls announced while it runs (stored only when it ends)
        last: dict[str, Any] | None = None
        try:
            while not self.closing.is_set():
                row = await self.ctx.store.get_run(run_id)
                if row is None:
                    return
                parts = await self.ctx.store.outbox_rows(run_id)
                detail = run_detail(row, parts, live)
                html = self.render(request, "_run_live.html", {"run": detail, "csrf": operator(request).csrf})
                data = {"status": row.status, "html": html}
                if data != last:
                    await self._send(response, "run", data)
                    last = data
                else:
                    await response.write(b": ping\n\n")
                event = await self._wait(queue.get(), SETTLED_SECONDS if detail["settled"] else RUN_SECONDS)
                if isinstance(event, RunEvent) and event.type == "tool":
                    live.append(event.data)
        finally:
            run_events.unsubscribe(run_id, queue)

    async def _wait(self, what: Awaitable[Any], timeout: float) -> Any:
        """What ``what`` returns within ``timeout``, or None on timeout or when the streams are closing."""
        waiting = asyncio.ensure_future(what)
        closing = asyncio.ensure_future(self.closing.wait())
        try:
            await asyncio.wait({waiting, closing}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            return waiting.result() if waiting.done() else None
        finally:
            for task in (waiting, closing):
                task.cancel()
