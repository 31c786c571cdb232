"""The gateway's one aiohttp server: health, readiness, metrics, runs, status, and adapter endpoints."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web
from aiohttp.log import server_logger

from gateway.config import HttpSettings
from gateway.http_limits import ClientWarnings, ConnectionGuard, FailureBuckets, RequestLimits, ServerLog
from gateway.metrics import Metrics
from gateway.store import Store

logger = logging.getLogger(__name__)

Readiness = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]
Summary = Callable[[], Awaitable[dict[str, Any]]]
UNAUTHORIZED = "unauthorized: send Authorization: Bearer <http.api_token>"
# What /readyz tells anyone; the rest of its detail (MCP servers, plugins: names and errors) needs the token.
_PUBLIC_READINESS = frozenset({"store", "draining", "platforms", "coordination"})


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, ensure_ascii=False, default=str), status=status,
                        content_type="application/json")


class HttpServer:
    """Owns the aiohttp application and its runner."""

    def __init__(self, cfg: HttpSettings, metrics: Metrics, store: Store, readiness: Readiness,
                 summary: Summary) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.store = store
        self.readiness = readiness
        self.summary = summary
        self._warnings = ClientWarnings(logger)
        buckets = FailureBuckets(cfg.per_ip_rate, cfg.per_ip_burst) if cfg.per_ip_burst else None
        self._guard = ConnectionGuard(cfg.max_connections, cfg.header_timeout, self._warnings)
        limits = RequestLimits(cfg.body_timeout, buckets, self._warnings)
        self.app = web.Application(client_max_size=cfg.max_body_bytes, middlewares=[limits.middleware])
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/runs", self._list_runs)
        self.app.router.add_get("/runs/{run_id}", self._get_run)
        self.app.router.add_get("/api/status", self._status)
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self.port: int | None = None

    def add_routes(self, routes: Iterable[web.AbstractRouteDef]) -> None:
        """Mount an adapter's endpoints (before ``start``)."""
        self.app.add_routes(list(routes))

    async def start(self) -> int:
        """Bind and serve; returns the bound port (useful with port 0)."""
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False,
                                     keepalive_timeout=self.cfg.keepalive_timeout,
                                     logger=ServerLog(server_logger, self._warnings))
        await self._runner.setup()
        assert self._runner.server is not None
        # Our own listener instead of a TCPSite: its protocol factory is wrapped by the connection guard.
        self._listener = await asyncio.get_running_loop().create_server(
            self._guard.factory(self._runner.server), self.cfg.host, self.cfg.port)
        self.port = self._listener.sockets[0].getsockname()[1]
        logger.info("http listening on %s:%s", self.cfg.host, self.port)
        return self.port

    async def stop(self) -> None:
        """Stop listening, then finish and close the open connections."""
        if self._listener is not None:
            self._listener.close()
            self._guard.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _healthz(self, _request: web.Request) -> web.Response:
        return _json({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        ready, detail = await self.readiness()
        if not self._authorized(request):
            detail = {key: value for key, value in detail.items() if key in _PUBLIC_READINESS}
        return _json({"ready": ready, **detail}, status=200 if ready else 503)

    async def _status(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _json({"error": UNAUTHORIZED}, status=401)
        return _json(await self.summary())

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"})

    def _authorized(self, request: web.Request) -> bool:
        token = self.cfg.api_token.get_secret_value() if self.cfg.api_token else ""
        if not token:
            return False
        header = request.headers.get("Authorization", "")
        # aiohttp decodes header bytes with surrogateescape: encode them back the same way (non-UTF-8: no match).
        return header.startswith("Bearer ") and hmac.compare_digest(header[7:].encode("utf-8", "surrogateescape"),
                                                                    token.encode())

    async def _get_run(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _json({"error": UNAUTHORIZED}, status=401)
        run = await self.store.get_run(request.match_info["run_id"])
        if run is None:
            return _json({"error": "run not found"}, status=404)
        return _json(run.to_dict())

    async def _list_runs(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _json({"error": UNAUTHORIZED}, status=401)
        try:
            limit = max(1, min(200, int(request.query.get("limit", "20"))))
        except ValueError:
            return _json({"error": "limit must be an integer"}, status=400)
        runs = await self.store.list_runs(limit, request.query.get("status"))
        return _json({"runs": [r.to_dict() for r in runs]})
