"""``POST /v1/chat/completions`` and ``GET /v1/models``: the agent, with the client's tools, behind OpenAI's API.

A request is a durable run (kind ``api``) executed like any other; its tool calls run in the gateway and the client
gets the final answer. Stateless: the request's messages before the last are the conversation; with a session
(``X-Hermes-Session`` header or ``session`` field) the stored conversation is, and only the last message is taken.
Streaming sends each model turn's text as ``delta.content`` (turns separated by a blank line) and each tool call as
it starts in a chunk with an empty delta and the extension field ``hermes_tool: {"name", "line"}``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from gateway.api.common import ApiError, Caller, Callers, RunIntake, handler, json_response, read_object, session_id
from gateway.run_events import follow
from gateway.store import RunRow, Store

_ROLES = ("system", "developer", "user", "assistant")
_UNSUPPORTED = {"tools": "the gateway's own tools run inside it; client-side tools are not supported",
                "functions": "client-side functions are not supported",
                "tool_choice": "the gateway chooses its own tools"}


def _content(message: Any, i: int) -> tuple[str, str]:
    """(role, text) of one request message, or 400 naming it."""
    param = f"messages[{i}]"
    if not isinstance(message, dict):
        raise ApiError(400, f"{param} must be an object", param)
    role = message.get("role")
    if role not in _ROLES:
        raise ApiError(400, f"{param}.role must be one of {', '.join(_ROLES)}", f"{param}.role")
    content = message.get("content")
    if isinstance(content, list):  # content parts: only text ones
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise ApiError(400, f"{param}.content: only text parts are supported", f"{param}.content")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise ApiError(400, f"{param}.content must be a string or a list of text parts", f"{param}.content")
    return ("system" if role == "developer" else role), content


def _messages(body: dict[str, Any]) -> tuple[list[dict[str, str]], str]:
    """The conversation before the last message, and the last (a user's) text."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    parsed = [_content(m, i) for i, m in enumerate(messages)]
    role, text = parsed[-1]
    last = f"messages[{len(parsed) - 1}]"
    if role != "user":
        raise ApiError(400, f"{last} must be the user's message to answer", f"{last}.role")
    if not text.strip():
        raise ApiError(400, f"{last}.content is empty", f"{last}.content")
    return [{"role": r, "content": c} for r, c in parsed[:-1]], text


def _usage(row: RunRow) -> dict[str, int]:
    prompt, completion = (row.usage.prompt_tokens, row.usage.completion_tokens) if row.usage else (0, 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class OpenAiApi:
    """The OpenAI-compatible endpoints."""

    def __init__(self, callers: Callers, intake: RunIntake, store: Store) -> None:
        self.callers = callers
        self.intake = intake
        self.store = store

    def routes(self) -> list[web.RouteDef]:
        """The routes to mount."""
        return [web.post("/v1/chat/completions", handler(self.chat_completions)),
                web.get("/v1/models", handler(self.models))]

    async def models(self, request: web.Request) -> web.Response:
        """The one model a caller talks to: the gateway's agent, under the client's alias if it has one."""
        caller = self.callers.of(request)
        return json_response({"object": "list", "data": [
            {"id": caller.model, "object": "model", "created": 0, "owned_by": "hermes-gateway"}]})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """Answer a conversation with the agent (waiting for its run, or streaming it)."""
        caller = self.callers.of(request)
        body = await read_object(request)
        for field, why in _UNSUPPORTED.items():
            if body.get(field):
                raise ApiError(400, f"{field}: {why}", field)
        model = body.get("model")
        if model != caller.model:
            raise ApiError(400, f"model must be {caller.model!r} (GET /v1/models)", "model", "model_not_found")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ApiError(400, "stream must be true or false", "stream")
        if body.get("n", 1) != 1:
            raise ApiError(400, "n must be 1", "n")
        session = session_id(request, body)
        history, text = _messages(body)
        acc = await self.intake.accept(caller, request, text, caller.toolsets(None), session=session,
                                       history=None if session else history)
        assert acc.run_id is not None
        headers = {"X-Hermes-Run-Id": acc.run_id}
        if stream:
            return await self._stream(request, caller, acc.run_id, headers)
        async for _event in follow(self.store, acc.run_id):
            pass
        row = await self._ended(acc.run_id)
        return json_response({
            "id": f"chatcmpl-{row.id}", "object": "chat.completion", "created": int(row.created_at),
            "model": caller.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": row.result},
                         "finish_reason": "stop", "logprobs": None}],
            "usage": _usage(row), "hermes_run": {"id": row.id, "tool_calls": row.tool_calls}}, headers=headers)

    async def _ended(self, run_id: str) -> RunRow:
        """The ended run; a failed or stopped one is a 5xx/409 error with its message."""
        row = await self.store.get_run(run_id)
        assert row is not None
        if row.status == "cancelled":
            raise ApiError(409, "the run was stopped", code="run_cancelled")
        if row.status != "completed":
            raise ApiError(502, row.result or row.error or "the run failed", code="run_failed")
        return row

    async def _stream(self, request: web.Request, caller: Caller, run_id: str,
                      headers: dict[str, str]) -> web.StreamResponse:
        response = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        created = int(time.time())

        async def send(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> None:
            chunk = {"id": f"chatcmpl-{run_id}", "object": "chat.completion.chunk", "created": created,
                     "model": caller.model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                     **extra}
            await response.write(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode())

        await send({"role": "assistant", "content": ""})
        turn, turn_text, sent_any = 0, "", False
        async for event in follow(self.store, run_id):
            if event.type == "text":
                if event.data["turn"] != turn:
                    prefix = "\n\n" if sent_any else ""
                    turn, turn_text = event.data["turn"], ""
                else:
                    prefix = ""
                turn_text += event.data["delta"]
                sent_any = True
                await send({"content": prefix + event.data["delta"]})
            elif event.type == "tool":
                await send({}, hermes_tool=event.data)
        row = await self.store.get_run(run_id)
        assert row is not None
        final = row.result or ""
        if row.status == "completed":
            # What streamed may lack the answer's end (held back while it could be a secret) or differ from it.
            rest = final[len(turn_text):] if final.startswith(turn_text) else ("\n\n" if sent_any else "") + final
            if rest:
                await send({"content": rest})
            await send({}, "stop", usage=_usage(row))
        else:
            error = {"message": "the run was stopped" if row.status == "cancelled" else final or "the run failed",
                     "type": "server_error", "code": f"run_{row.status}"}
            await response.write(f"data: {json.dumps({'error': error})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
