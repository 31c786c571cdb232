"""The OpenAPI 3.1 document of the ``/v1`` API, served at ``/v1/openapi.json`` (written by hand; a test checks that
its operations are exactly the mounted routes)."""

from __future__ import annotations

from typing import Any

JSON = "application/json"
_S = dict[str, Any]


def _ref(name: str) -> _S:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(description: str, schema: _S) -> _S:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def _errors(*statuses: int) -> _S:
    return {str(s): {"$ref": f"#/components/responses/E{s}"} for s in statuses}


def _path(name: str, description: str) -> _S:
    return {"name": name, "in": "path", "required": True, "description": description, "schema": {"type": "string"}}


_IDEMPOTENCY = {"name": "Idempotency-Key", "in": "header", "required": False,
                "description": "the same key (per client) returns the first request's run; 1-200 printable ASCII",
                "schema": {"type": "string", "maxLength": 200}}
_SESSION = {"name": "X-Hermes-Session", "in": "header", "required": False,
            "description": "a stored conversation to continue (1-128 of letters, digits, . _ : -)",
            "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$"}}
_RUN_ID = _path("run_id", "a run's id")
_JOB_ID = _path("job_id", "a cron job's id")
_LIMIT = {"name": "limit", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1,
                                                                         "maximum": 1000, "default": 100}}
_TOOLSET = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}],
            "description": "toolset name(s) within the key's allowance; default: the key's own"}
_NULLABLE_STR = {"type": ["string", "null"]}
_NUM = {"type": ["number", "null"]}

_SCHEMAS: _S = {
    "Error": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {**_NULLABLE_STR, "description": "the request field at fault"},
                       "code": _NULLABLE_STR}}}},
    "RunRequest": {"type": "object", "required": ["prompt"], "additionalProperties": False, "properties": {
        "prompt": {"type": "string", "minLength": 1}, "toolset": _TOOLSET,
        "deliver_to": {"type": "string", "description": "none, or a target listed for the key (http.api.clients."
                                                        "<name>.deliver_to)"}}},
    "Run": {"type": "object", "required": ["id", "kind", "status"], "properties": {
        "id": {"type": "string"}, "kind": {"type": "string"}, "source": {"type": "string"},
        "session_key": {"type": "string"},
        "status": {"enum": ["queued", "running", "completed", "failed", "cancelled"]},
        "toolsets": {"type": "array", "items": {"type": "string"}}, "prompt": {"type": "string"},
        "deliver_to": _NULLABLE_STR, "result": _NULLABLE_STR, "error": _NULLABLE_STR,
        "tool_calls": {"type": "array", "items": {"type": "object"}}, "model_calls": {"type": "integer"},
        "attempts": {"type": "integer"}, "created_at": {"type": "number"}, "started_at": _NUM,
        "finished_at": _NUM, "model_seconds": _NUM, "duration_seconds": {"type": "number"},
        "ended_by": _NULLABLE_STR, "usage": {"type": ["object", "null"]}}},
    "Stopping": {"type": "object", "required": ["id", "stopping"],
                 "properties": {"id": {"type": "string"}, "stopping": {"const": True}}},
    "CronJob": {"type": "object", "required": ["id", "state"], "properties": {
        "id": {"type": "string"}, "name": {"type": "string"}, "prompt": {"type": "string"},
        "schedule": {"type": "object"}, "timezone": {"type": "string"}, "state": {"type": "string"},
        "repeat": {"type": ["integer", "null"]}, "runs": {"type": "integer"}, "deliver": {"type": "string"},
        "notify": {"type": "string"}, "misfire": {"type": "string"}, "chat": {"type": "string"},
        "owner": {"type": "string"}, "next_run": _NULLABLE_STR, "last_run": _NULLABLE_STR,
        "last_status": _NULLABLE_STR, "last_error": _NULLABLE_STR, "last_result": _NULLABLE_STR,
        "last_misfire": {"type": ["object", "null"]}, "consecutive_failures": {"type": "integer"},
        "paused_reason": _NULLABLE_STR}},
    "Session": {"type": "object", "required": ["key", "epoch", "messages"], "properties": {
        "key": {"type": "string"}, "platform": {"type": "string"}, "chat_id": {"type": "string"},
        "user_id": _NULLABLE_STR, "thread_id": _NULLABLE_STR, "epoch": {"type": "integer"},
        "created_at": {"type": "number"}, "updated_at": {"type": "number"},
        "title": {**_NULLABLE_STR, "description": "set with /title"},
        "model": {**_NULLABLE_STR, "description": "set with /model; null: the configured one"},
        "messages": {"type": "integer", "description": "messages of the current conversation"}}},
    "ChatCompletionRequest": {"type": "object", "required": ["model", "messages"], "properties": {
        "model": {"type": "string", "description": "GET /v1/models"},
        "messages": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["role", "content"],
                     "properties": {"role": {"enum": ["system", "developer", "user", "assistant"]},
                                    "content": {"oneOf": [{"type": "string"}, {"type": "array"}]}}}},
        "stream": {"type": "boolean"}, "n": {"const": 1}, "session": _SESSION["schema"]}},
    "ChatCompletion": {"type": "object", "description": "OpenAI's chat.completion, with hermes_run {id, tool_calls}"},
    "ModelList": {"type": "object", "properties": {"object": {"const": "list"}, "data": {"type": "array"}}},
}
_SSE = {"text/event-stream": {"schema": {"type": "string"}}}


def _op(summary: str, responses: _S, *errors: int, parameters: list[_S] | None = None,
        body: str | None = None, tag: str) -> _S:
    op: _S = {"summary": summary, "tags": [tag], "responses": {**responses, **_errors(401, *errors)}}
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = {"required": True, "content": {JSON: {"schema": _ref(body)}}}
    return op


_RUN = _json("the run", _ref("Run"))
_JOB = _json("the job", _ref("CronJob"))

OPENAPI: _S = {
    "openapi": "3.1.0",
    "info": {"title": "hermes-gateway HTTP API", "version": "1",
             "description": "Runs of the gateway's agent, cron jobs and sessions, and an OpenAI-compatible "
                            "endpoint. Send Authorization: Bearer <a client key from http.api.clients, or "
                            "http.api_token>. Cron jobs and sessions need http.api_token."},
    "security": [{"bearer": []}],
    "paths": {
        "/v1/openapi.json": {"get": {"summary": "this document", "tags": ["meta"], "security": [],
                                     "responses": {"200": _json("the document", {"type": "object"})}}},
        "/v1/models": {"get": _op("the model a key talks to", {"200": _json("models", _ref("ModelList"))},
                                  tag="openai")},
        "/v1/chat/completions": {"post": _op(
            "answer a conversation with the agent (a run of kind api)",
            {"200": {"description": "the answer; with stream, server-sent chat.completion.chunk events",
                     "content": {JSON: {"schema": _ref("ChatCompletion")}, **_SSE}}},
            400, 403, 409, 429, 502, 503, parameters=[_IDEMPOTENCY, _SESSION], body="ChatCompletionRequest",
            tag="openai")},
        "/v1/runs": {"post": _op(
            "start a run", {"202": {**_RUN, "description": "accepted", "headers": {
                "Location": {"schema": {"type": "string"}}}},
                            "200": {**_RUN, "description": "the run an earlier request with this Idempotency-Key "
                                                           "started"}},
            400, 403, 429, 503, parameters=[_IDEMPOTENCY], body="RunRequest", tag="runs")},
        "/v1/runs/{run_id}": {
            "get": _op("a run: status, result, tool calls", {"200": _RUN}, 404, parameters=[_RUN_ID], tag="runs"),
            "delete": _op("stop a running run, or cancel one not started yet",
                          {"202": _json("stopping", _ref("Stopping"))}, 404, 409, parameters=[_RUN_ID],
                          tag="runs")},
        "/v1/runs/{run_id}/events": {"get": _op(
            "the run's progress as server-sent events until it ends: started {run_id, kind}, text {turn, delta}, "
            "tool {name, line}, finished {status, result}",
            {"200": {"description": "event: <type> / data: <JSON> pairs, finished last", "content": _SSE}},
            404, parameters=[_RUN_ID], tag="runs")},
        "/v1/cron": {"get": _op("every cron job", {"200": _json("the jobs", {
            "type": "object", "properties": {"jobs": {"type": "array", "items": _ref("CronJob")}}})}, 403,
            tag="cron")},
        "/v1/cron/{job_id}": {
            "get": _op("one job", {"200": _JOB}, 403, 404, parameters=[_JOB_ID], tag="cron"),
            "delete": _op("remove a job", {"204": {"description": "removed"}}, 403, 404, parameters=[_JOB_ID],
                          tag="cron")},
        "/v1/cron/{job_id}/pause": {"post": _op("stop a job firing", {"200": _JOB}, 403, 404,
                                                parameters=[_JOB_ID], tag="cron")},
        "/v1/cron/{job_id}/resume": {"post": _op("let a paused job fire again", {"200": _JOB}, 403, 404,
                                                 parameters=[_JOB_ID], tag="cron")},
        "/v1/cron/{job_id}/run": {"post": _op("fire a job once now", {"202": _json("fired", {
            "type": "object", "properties": {"run_id": _NULLABLE_STR}})}, 403, 404, parameters=[_JOB_ID],
            tag="cron")},
        "/v1/sessions": {"get": _op("sessions, the latest active first", {"200": _json("the sessions", {
            "type": "object", "properties": {"sessions": {"type": "array", "items": _ref("Session")}}})},
            400, 403, parameters=[_LIMIT], tag="sessions")},
        "/v1/sessions/{key}": {"delete": _op(
            "start the session's next conversation (as /new)", {"200": _json("the new conversation", {
                "type": "object", "properties": {"key": {"type": "string"}, "epoch": {"type": "integer"}}})},
            403, 404, parameters=[_path("key", "a session key (URL-encoded)")], tag="sessions")},
    },
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": _SCHEMAS,
        "responses": {f"E{s}": _json(reason, _ref("Error")) for s, reason in (
            (400, "bad input (error.param names the field)"), (401, "no valid key"),
            (403, "not allowed for this key"), (404, "not found"), (409, "conflict (the run has ended or was "
                                                                         "stopped)"),
            (429, "too many runs going for this key"), (502, "the run failed"),
            (503, "the gateway is shutting down"))},
    },
}
