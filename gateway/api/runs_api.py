"""The runs API: ``POST /v1/runs`` starts an agent run (kind ``api``, its own session), ``GET /v1/runs/{id}`` shows
it, ``GET /v1/runs/{id}/events`` streams its progress as server-sent events until it ends, ``DELETE`` stops it.

A client key sees only its own runs (another's is 404); the operator's ``http.api_token`` sees every run.
Events: ``started``, ``text`` (a model turn's text as deltas), ``tool`` (a tool call as it starts), ``finished``
(status and result), each as ``event: <type>`` with a JSON ``data:`` line.
"""

from __future__ import annotations

import json

from aiohttp import web

from gateway.api.common import ApiError, Caller, Callers, RunIntake, deliver_target, handler, json_response, read_object
from gateway.run_events import follow
from gateway.store import FINAL_RUN_STATES, RunRow, Store

_FIELDS = ("prompt", "toolset", "deliver_to")


class RunsApi:
    """``/v1/runs``."""

    def __init__(self, callers: Callers, intake: RunIntake, store: Store) -> None:
        self.callers = callers
        self.intake = intake
        self.store = store

    def routes(self) -> list[web.RouteDef]:
        """The routes to mount."""
        return [web.post("/v1/runs", handler(self.create)),
                web.get("/v1/runs/{run_id}", handler(self.show)),
                web.get("/v1/runs/{run_id}/events", handler(self.events)),
                web.delete("/v1/runs/{run_id}", handler(self.stop))]

    async def _run(self, request: web.Request) -> tuple[Caller, RunRow]:
        """The caller and the run the path names, or 404 (also for another client's run)."""
        caller = self.callers.of(request)
        row = await self.store.get_run(request.match_info["run_id"])
        if row is None or not (caller.operator or (row.kind == "api" and row.source == caller.name)):
            raise ApiError(404, "no such run", "run_id")
        return caller, row

    async def create(self, request: web.Request) -> web.Response:
        """Accept a run (202; the same run again for a repeated ``Idempotency-Key``, 200)."""
        caller = self.callers.of(request)
        body = await read_object(request)
        if unknown := sorted(set(body) - set(_FIELDS)):
            raise ApiError(400, f"unknown field {unknown[0]!r} (fields: {', '.join(_FIELDS)})", unknown[0])
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ApiError(400, "prompt must be a non-empty string", "prompt")
        toolsets = caller.toolsets(body.get("toolset"))
        target = deliver_target(caller, body.get("deliver_to"))
        acc = await self.intake.accept(caller, request, prompt, toolsets, deliver_to=target)
        assert acc.run_id is not None
        row = await self.store.get_run(acc.run_id)
        assert row is not None
        return json_response(row.to_dict(), 200 if acc.duplicate else 202,
                             headers={"Location": f"/v1/runs/{acc.run_id}"})

    async def show(self, request: web.Request) -> web.Response:
        """The run: status, result, tool calls, usage."""
        _, row = await self._run(request)
        return json_response(row.to_dict())

    async def events(self, request: web.Request) -> web.StreamResponse:
        """The run's events as server-sent events, ``finished`` last (at once for a run that ended)."""
        _, row = await self._run(request)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        async for event in follow(self.store, row.id):
            data = json.dumps(event.data, ensure_ascii=False, default=str)
            await response.write(f"event: {event.type}\ndata: {data}\n\n".encode())
        await response.write_eof()
        return response

    async def stop(self, request: web.Request) -> web.Response:
        """Stop a running run, or cancel one accepted and not started (202); 409 for a run that has ended."""
        _, row = await self._run(request)
        if row.status in FINAL_RUN_STATES or not await self.intake.router.stop_run(row):
            ended = await self.store.get_run(row.id)
            raise ApiError(409, f"the run has ended ({ended.status if ended else row.status})", "run_id",
                           "run_ended")
        return json_response({"id": row.id, "stopping": True}, 202)
