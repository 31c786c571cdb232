"""Cron jobs and sessions over the API, for the operator's ``http.api_token`` only (what the CLI manages; a client
key gets 403). Cron operations are gateway/cron.py's, as the ``/cron`` command and the CLI use them with no actor
(every job); ``DELETE /v1/sessions/{key}`` starts the session's next conversation, as ``/new`` does."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from aiohttp import web
from sqlalchemy.engine import Connection

from gateway.api.common import ApiError, Callers, handler, json_response
from gateway.cron import CronService
from gateway.schema import messages_t, session_settings_t, sessions_t
from gateway.session_settings import clear_title
from gateway.store import Store, bump_epoch
from tools.cronjob_tools import CronJob


def _limit(request: web.Request, default: int = 100, most: int = 1000) -> int:
    raw = request.query.get("limit", str(default))
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise ApiError(400, f"limit must be an integer from 1 to {most}", "limit")
    return int(raw)


def _sessions(conn: Connection, limit: int) -> list[dict[str, Any]]:
    counted = (sa.select(sa.func.count()).select_from(messages_t)
               .where(messages_t.c.session_key == sessions_t.c.key, messages_t.c.epoch == sessions_t.c.epoch)
               .scalar_subquery())
    query = (sa.select(sessions_t.c.key, sessions_t.c.platform, sessions_t.c.chat_id, sessions_t.c.user_id,
                       sessions_t.c.thread_id, sessions_t.c.epoch, sessions_t.c.created_at, sessions_t.c.updated_at,
                       session_settings_t.c.title, session_settings_t.c.model, counted.label("messages"))
             .select_from(sessions_t.outerjoin(session_settings_t,
                                               session_settings_t.c.session_key == sessions_t.c.key))
             .order_by(sessions_t.c.updated_at.desc()).limit(limit))
    return [dict(row._mapping) for row in conn.execute(query)]


def _new_conversation(conn: Connection, key: str) -> int | None:
    exists = conn.execute(sa.select(sessions_t.c.key).where(sessions_t.c.key == key)).first()
    if exists is None:
        return None
    epoch = bump_epoch(conn, key)
    clear_title(conn, key)
    return epoch


class AdminApi:
    """``/v1/cron`` and ``/v1/sessions``."""

    def __init__(self, callers: Callers, store: Store, cron: CronService) -> None:
        self.callers = callers
        self.store = store
        self.cron = cron

    def routes(self) -> list[web.RouteDef]:
        """The routes to mount."""
        return [web.get("/v1/cron", handler(self.list_jobs)),
                web.get("/v1/cron/{job_id}", handler(self.show_job)),
                web.delete("/v1/cron/{job_id}", handler(self.remove_job)),
                web.post("/v1/cron/{job_id}/pause", handler(self.pause_job)),
                web.post("/v1/cron/{job_id}/resume", handler(self.resume_job)),
                web.post("/v1/cron/{job_id}/run", handler(self.run_job)),
                web.get("/v1/sessions", handler(self.list_sessions)),
                web.delete("/v1/sessions/{key}", handler(self.new_conversation))]

    def _operator(self, request: web.Request) -> None:
        if not self.callers.of(request).operator:
            raise ApiError(403, "cron jobs and sessions are managed with http.api_token only", code="operator_only")

    @staticmethod
    def _job(job: CronJob | None) -> web.Response:
        if job is None:
            raise ApiError(404, "no such cron job", "job_id")
        return json_response(job.to_json())

    async def list_jobs(self, request: web.Request) -> web.Response:
        """Every cron job."""
        self._operator(request)
        return json_response({"jobs": [job.to_json() for job in await self.cron.list_jobs(None)]})

    async def show_job(self, request: web.Request) -> web.Response:
        """One job."""
        self._operator(request)
        return self._job(await self.cron.get(request.match_info["job_id"], None))

    async def pause_job(self, request: web.Request) -> web.Response:
        """Stop a job firing."""
        self._operator(request)
        return self._job(await self.cron.pause(request.match_info["job_id"], None))

    async def resume_job(self, request: web.Request) -> web.Response:
        """Let a paused job fire again."""
        self._operator(request)
        return self._job(await self.cron.resume(request.match_info["job_id"], None))

    async def remove_job(self, request: web.Request) -> web.Response:
        """Delete a job (204)."""
        self._operator(request)
        if not await self.cron.remove(request.match_info["job_id"], None):
            raise ApiError(404, "no such cron job", "job_id")
        return web.Response(status=204)

    async def run_job(self, request: web.Request) -> web.Response:
        """Fire a job once now (202, its run's id; null when the job was fired at that moment already)."""
        self._operator(request)
        job_id = request.match_info["job_id"]
        if await self.cron.get(job_id, None) is None:
            raise ApiError(404, "no such cron job", "job_id")
        return json_response({"run_id": await self.cron.run_now(job_id, None)}, 202)

    async def list_sessions(self, request: web.Request) -> web.Response:
        """Sessions, the latest active first: title and model (set by commands), messages in the conversation."""
        self._operator(request)
        limit = _limit(request)
        return json_response({"sessions": await self.store.db.read(lambda conn: _sessions(conn, limit))})

    async def new_conversation(self, request: web.Request) -> web.Response:
        """Start the session's next conversation (``/new``): its earlier messages are forgotten."""
        self._operator(request)
        key = request.match_info["key"]
        epoch = await self.store.db.write(lambda conn: _new_conversation(conn, key))
        if epoch is None:
            raise ApiError(404, "no such session", "key")
        return json_response({"key": key, "epoch": epoch})
