"""The HTTP API under ``/v1`` (``http.api``): OpenAI-compatible chat completions and models, runs, cron jobs and
sessions, and its OpenAPI document."""

from __future__ import annotations

from aiohttp import web

from gateway.api.common import Callers, RunIntake
from gateway.api.openai_compat import OpenAiApi
from gateway.config import Config
from gateway.router import Router
from gateway.store import Store

__all__ = ["api_routes"]


def api_routes(cfg: Config, store: Store, router: Router) -> list[web.RouteDef]:
    """Every ``/v1`` route, for ``HttpServer.add_routes``."""
    callers, intake = Callers(cfg), RunIntake(store, router)
    return OpenAiApi(callers, intake, store).routes()
