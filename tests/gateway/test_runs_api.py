"""The runs API (#26 item 5): a run's lifecycle with its server-sent events, a held run stopped, a queued one
cancelled, client keys seeing only their runs and toolsets, bad input refused naming the field with nothing
enqueued, cron jobs and sessions for the operator's token, and the OpenAPI document matching the routes."""

from __future__ import annotations

import json
import urllib.parse
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from gateway.api.openapi import OPENAPI
from tests.conftest import API_TOKEN, GatewayFactory, Harness
from tools.cronjob_tools import CronJob, parse_schedule

FULL_KEY = "full-client-key-0123456789"
READER_KEY = "reader-client-key-0123456789"
TODO = '[[tool:todo {"action": "add", "items": ["buy milk"]}]]'
API = {"http": {"api": {"enabled": True, "clients": {
    "full": {"key": FULL_KEY, "toolset": ["todo", "memory"]},
    "reader": {"key": READER_KEY, "toolset": "hermes-webhook"}}}}}


def auth(key: str = FULL_KEY, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **headers}


async def call(h: Harness, method: str, path: str, key: str = FULL_KEY, body: Any = None,
               **headers: str) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body)
    async with h.http.request(method, f"{h.base_url}{path}", data=data, headers=auth(key, **headers)) as r:
        return r.status, (await r.json() if r.content_type == "application/json" else None)


async def events(h: Harness, run_id: str, key: str = FULL_KEY) -> list[tuple[str, dict[str, Any]]]:
    """The run's server-sent events until the stream ends."""
    async with h.http.get(f"{h.base_url}/v1/runs/{run_id}/events", headers=auth(key)) as r:
        assert r.status == 200 and r.content_type == "text/event-stream"
        body = await r.text()
    out = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


async def inbox_count(h: Harness) -> int:
    assert h.gateway.store is not None
    return await h.gateway.store.count_inbox()


async def test_run_lifecycle_with_events(make_gateway: GatewayFactory) -> None:
    h = await make_gateway(API)
    status, run = await call(h, "POST", "/v1/runs", body={"prompt": TODO, "toolset": "todo"},
                             **{"Idempotency-Key": "job-1"})
    assert status == 202 and run["kind"] == "api" and run["source"] == "full" and run["toolsets"] == ["todo"]
    seen = await events(h, run["id"])
    kinds = [kind for kind, _ in seen]
    assert kinds[0] == "started" and kinds[-1] == "finished" and "tool" in kinds
    assert kinds.index("started") < kinds.index("tool") < kinds.index("finished")
    assert [data["name"] for kind, data in seen if kind == "tool"] == ["todo"]
    assert seen[-1][1]["status"] == "completed" and "buy milk" in seen[-1][1]["result"]
    status, shown = await call(h, "GET", f"/v1/runs/{run['id']}")
    assert status == 200 and shown["status"] == "completed" and "buy milk" in shown["result"]
    assert [c["name"] for c in shown["tool_calls"]] == ["todo"]
    assert (await events(h, run["id"]))[-1] == seen[-1]  # an ended run's stream is its end at once
    status, again = await call(h, "POST", "/v1/runs", body={"prompt": TODO, "toolset": "todo"},
                               **{"Idempotency-Key": "job-1"})
    assert status == 200 and again["id"] == run["id"] and h.model.request_count == 2
    assert (await call(h, "DELETE", f"/v1/runs/{run['id']}"))[0] == 409
    # Another client's run does not exist for it; the operator sees every run.
    assert (await call(h, "GET", f"/v1/runs/{run['id']}", READER_KEY))[0] == 404
    assert (await call(h, "GET", f"/v1/runs/{run['id']}/events", READER_KEY))[0] == 404
    assert (await call(h, "DELETE", f"/v1/runs/{run['id']}", READER_KEY))[0] == 404
    assert (await call(h, "GET", f"/v1/runs/{run['id']}", API_TOKEN))[1]["id"] == run["id"]


async def test_held_run_is_stopped_and_a_queued_one_cancelled(make_gateway: GatewayFactory) -> None:
    h = await make_gateway({**API, "gateway": {"max_concurrent_runs": 1}})
    h.model.hang_next()
    _, held = await call(h, "POST", "/v1/runs", body={"prompt": "held"})
    await h.model.wait_for_requests(1)
    _, queued = await call(h, "POST", "/v1/runs", body={"prompt": "waits"})
    assert (await call(h, "GET", f"/v1/runs/{queued['id']}"))[1]["status"] == "queued"
    assert await call(h, "DELETE", f"/v1/runs/{queued['id']}") == (202, {"id": queued["id"], "stopping": True})
    assert (await call(h, "GET", f"/v1/runs/{held['id']}"))[1]["status"] == "running"  # the other runs on
    async with h.http.get(f"{h.base_url}/v1/runs/{held['id']}/events", headers=auth()) as r:
        assert await r.content.readuntil(b"\n\n") == f'event: started\ndata: {{"run_id": "{held["id"]}", ' \
            '"kind": "api"}\n\n'.encode()
        assert (await call(h, "DELETE", f"/v1/runs/{held['id']}"))[0] == 202
        rest = await r.text()  # the stream ends with the run
    assert rest.startswith("event: finished\n") and '"status": "cancelled"' in rest
    for run_id in (held["id"], queued["id"]):
        assert (await h.wait_run(run_id))["status"] == "cancelled"
    assert h.model.request_count == 1  # the cancelled one never started


async def test_a_limited_key_cannot_widen_its_toolset(make_gateway: GatewayFactory) -> None:
    h = await make_gateway(API)
    status, body = await call(h, "POST", "/v1/runs", READER_KEY, {"prompt": TODO, "toolset": "todo"})
    assert status == 403 and body["error"]["param"] == "toolset"
    status, run = await call(h, "POST", "/v1/runs", READER_KEY, {"prompt": "hi"})
    assert status == 202 and run["toolsets"] == ["hermes-webhook"]
    assert await inbox_count(h) == 1


@pytest.mark.parametrize(("body", "headers", "status", "param"), [
    ({}, {}, 400, "prompt"),
    ({"prompt": " "}, {}, 400, "prompt"),
    ({"prompt": 3}, {}, 400, "prompt"),
    ({"prompt": "x", "toolset": "no-such-toolset"}, {}, 400, "toolset"),
    ({"prompt": "x", "toolset": []}, {}, 400, "toolset"),
    ({"prompt": "x", "deliver_to": "telegram:100"}, {}, 403, "deliver_to"),
    ({"prompt": "x", "deliver_to": 5}, {}, 400, "deliver_to"),
    ({"prompt": "x", "session": "s1"}, {}, 400, "session"),
    ({"prompt": "x"}, {"Idempotency-Key": "é"}, 400, "Idempotency-Key"),
    ([1], {}, 400, None),
])
async def test_bad_input_is_refused_naming_the_field(make_gateway: GatewayFactory, body: Any,
                                                    headers: dict[str, str], status: int, param: str | None) -> None:
    h = await make_gateway(API)
    got, answer = await call(h, "POST", "/v1/runs", body=body, **headers)
    assert got == status and answer["error"]["param"] == param and answer["error"]["message"]
    assert await inbox_count(h) == 0 and h.model.request_count == 0


async def test_keys_and_unknown_runs(make_gateway: GatewayFactory) -> None:
    h = await make_gateway(API)
    assert (await call(h, "POST", "/v1/runs", "wrong-key-0123456789", {"prompt": "x"}))[0] == 401
    status, body = await call(h, "GET", "/v1/runs/nope")
    assert status == 404 and body["error"]["param"] == "run_id"
    assert await inbox_count(h) == 0


async def test_cron_jobs_for_the_operator(make_gateway: GatewayFactory) -> None:
    h = await make_gateway(API)
    assert h.gateway.cron is not None
    job = await h.gateway.cron.create(CronJob(
        id="", owner="telegram:1001", prompt="CHECK WEATHER", timezone="UTC", origin_platform="telegram",
        origin_chat_id="100", schedule=parse_schedule("every 1h", ZoneInfo("UTC"), datetime.now(UTC))), None)
    assert (await call(h, "GET", "/v1/cron"))[0] == 403  # client keys do not manage cron jobs
    assert (await call(h, "POST", f"/v1/cron/{job.id}/pause"))[0] == 403
    status, listed = await call(h, "GET", "/v1/cron", API_TOKEN)
    assert status == 200 and [j["id"] for j in listed["jobs"]] == [job.id]
    assert (await call(h, "POST", f"/v1/cron/{job.id}/pause", API_TOKEN))[1]["state"] == "paused"
    assert (await call(h, "GET", f"/v1/cron/{job.id}", API_TOKEN))[1]["state"] == "paused"
    assert (await call(h, "POST", f"/v1/cron/{job.id}/resume", API_TOKEN))[1]["state"] == "active"
    status, fired = await call(h, "POST", f"/v1/cron/{job.id}/run", API_TOKEN)
    assert status == 202 and (await h.wait_run(fired["run_id"]))["kind"] == "cron"
    assert (await call(h, "DELETE", f"/v1/cron/{job.id}", API_TOKEN))[0] == 204
    status, body = await call(h, "GET", f"/v1/cron/{job.id}", API_TOKEN)
    assert status == 404 and body["error"]["param"] == "job_id"
    assert (await call(h, "POST", "/v1/cron/nope/run", API_TOKEN))[0] == 404


async def test_sessions_listed_and_restarted(make_gateway: GatewayFactory) -> None:
    h = await make_gateway(API)
    await h.chat.user_says("hello")
    await h.chat.wait_for(lambda: bool(h.chat.final_texts()))
    await h.chat.user_says("/title Groceries")
    await h.chat.wait_for(lambda: len(h.chat.final_texts()) >= 2)
    assert (await call(h, "GET", "/v1/sessions"))[0] == 403
    status, listed = await call(h, "GET", "/v1/sessions", API_TOKEN)
    assert status == 200
    (session,) = listed["sessions"]
    assert session["platform"] == "telegram" and session["title"] == "Groceries" and session["messages"] == 2
    key = urllib.parse.quote(session["key"], safe="")
    assert (await call(h, "DELETE", f"/v1/sessions/{key}"))[0] == 403
    assert await call(h, "DELETE", f"/v1/sessions/{key}", API_TOKEN) == (
        200, {"key": session["key"], "epoch": session["epoch"] + 1})
    (after,) = (await call(h, "GET", "/v1/sessions", API_TOKEN))[1]["sessions"]
    assert after["messages"] == 0 and after["title"] is None
    assert (await call(h, "DELETE", "/v1/sessions/telegram%3Anope", API_TOKEN))[0] == 404
    status, body = await call(h, "GET", "/v1/sessions?limit=0", API_TOKEN)
    assert status == 400 and body["error"]["param"] == "limit"


async def test_openapi_document_matches_the_routes(make_gateway: GatewayFactory) -> None:
    h = await make_gateway(API)
    async with h.http.get(f"{h.base_url}/v1/openapi.json") as r:
        assert r.status == 200 and await r.json() == OPENAPI
    assert h.gateway.http is not None
    mounted = {(route.method, route.resource.canonical) for route in h.gateway.http.app.router.routes()
               if route.resource is not None and route.resource.canonical.startswith("/v1/")
               and route.method != "HEAD"}
    documented = {(method.upper(), path) for path, item in OPENAPI["paths"].items() for method in item}
    assert mounted == documented
    for path, item in OPENAPI["paths"].items():  # every path parameter is declared
        for op in item.values():
            names = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert names == {part[1:-1] for part in path.split("/") if part.startswith("{")}
