"""The HTTP API under ``/v1`` (``http.api``): OpenAI-compatible chat completions and models, runs, cron jobs and
sessions, and its OpenAPI document."""

from __future__ import annotations

from aiohttp import web

from gateway.api.admin_api import AdminApi
from gateway.api.common import Callers, RunIntake, json_response
from gateway.api.openai_compat import OpenAiApi
from gateway.api.openapi import OPENAPI
from gateway.api.runs_api import RunsApi
from gateway.config import Config
from gateway.cron import CronService
from gateway.router import Router
from gateway.store import Store

__all__ = ["api_routes"]


async def _openapi(_request: web.Request) -> web.Response:
    """The OpenAPI document (no key needed: it holds nothing secret)."""
    return json_response(OPENAPI)


def api_routes(cfg: Config, store: Store, router: Router, cron: CronService) -> list[web.RouteDef]:
    """Every ``/v1`` route, for ``HttpServer.add_routes``."""
    callers, intake = Callers(cfg), RunIntake(store, router)
    return [*OpenAiApi(callers, intake, store).routes(), *RunsApi(callers, intake, store).routes(),
            *AdminApi(callers, store, cron).routes(), web.get("/v1/openapi.json", _openapi)]
