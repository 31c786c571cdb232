"""Faults the scripted model's endpoints can be told to answer with (OpenAI-style HTTP errors, dropped connections,
hangs), and OpenAI's error body; shared by chat completions (model_server.py) and audio (model_media.py)."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from aiohttp import web

Park = Callable[[float | None], Awaitable[bool]]
"""The server's sleep (forever for None); False when the server stopped meanwhile."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault: ``fail`` answers ``status``, ``drop`` closes the connection (a stream after
    ``after_chunks`` chunks), ``hang`` never answers."""

    kind: Literal["fail", "drop", "hang"]
    status: int = 500
    retry_after: float | None = None
    message: str | None = None
    after_chunks: int | None = None


_ERROR_KIND: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "Bad request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("invalid_request_error", "unsupported_country_region_territory", "Request not allowed."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    413: ("invalid_request_error", None, "Request entity too large."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached. Please try again later."),
    500: ("server_error", None, "The server had an error while processing your request."),
    503: ("server_error", None, "The engine is currently overloaded, please try again later."),
}


def error_response(
    status: int,
    message: str | None = None,
    *,
    param: str | None = None,
    retry_after: float | None = None,
) -> web.Response:
    """An OpenAI error answer: ``{"error": {message, type, param, code}}`` (``Retry-After`` when given)."""
    kind, code, default_message = _ERROR_KIND.get(status, ("api_error", None, "Simulated error."))
    body = {"error": {"message": message or default_message, "type": kind, "param": param, "code": code}}
    headers = None
    if retry_after is not None:
        headers = {"Retry-After": f"{retry_after:g}"}
    return web.Response(
        status=status, body=json.dumps(body).encode(), content_type="application/json", headers=headers
    )


def drop(request: web.BaseRequest, resp: web.StreamResponse | None = None) -> web.StreamResponse:
    """Close ``request``'s connection without (more of) an answer."""
    # Returning a response over a closed transport makes aiohttp treat it as a client disconnect
    # (no error log), while the client sees the connection close without (more of) a response.
    transport = request.transport
    if transport is not None:
        transport.close()
    return resp if resp is not None else web.Response()


class FaultQueue:
    """Faults injected for the next requests of an endpoint, consumed one per request, in order."""

    def __init__(self) -> None:
        self._faults: deque[Fault] = deque()

    def fail_next(
        self,
        n: int = 1,
        status: int = 500,
        retry_after: float | None = None,
        message: str | None = None,
    ) -> None:
        """Answer the next ``n`` requests with an OpenAI-style error (``Retry-After`` header if given)."""
        self._faults.extend([Fault("fail", status, retry_after, message)] * n)

    def drop_next(self, n: int = 1, *, after_chunks: int | None = None) -> None:
        """Close the connection of the next ``n`` requests without answering.

        With ``after_chunks``, streaming requests get that many SSE chunks first (non-streaming ones
        are dropped before any response); the close follows the last chunk by ~50 ms.
        """
        self._faults.extend([Fault("drop", after_chunks=after_chunks)] * n)

    def hang_next(self, n: int = 1) -> None:
        """Never answer the next ``n`` requests; they are dropped when the server stops."""
        self._faults.extend([Fault("hang")] * n)

    def clear_faults(self) -> None:
        """Forget injected faults not yet consumed."""
        self._faults.clear()

    def next_fault(self) -> Fault | None:
        """The fault for the request being answered (None: answer normally)."""
        return self._faults.popleft() if self._faults else None


async def fault_response(
    fault: Fault, request: web.BaseRequest, park: Park, latency: float, *, streaming: bool = False
) -> web.StreamResponse | None:
    """The answer ``fault`` makes of ``request``; None for a drop after some chunks of a stream (the stream does
    it)."""
    if fault.kind == "hang":
        await park(None)
        return drop(request)
    if fault.kind == "fail":
        if not await park(latency):
            return drop(request)
        return error_response(fault.status, fault.message, retry_after=fault.retry_after)
    if fault.after_chunks is None or not streaming:
        return drop(request)
    return None


async def json_object(request: web.Request, authorized: bool) -> dict[str, object] | web.Response:
    """A request's JSON object body, or the error OpenAI answers instead (401 unauthorized, 400 not a JSON
    object)."""
    if not authorized:
        return error_response(401)
    try:
        body = json.loads(await request.read())
    except ValueError:
        return error_response(400, "We could not parse the JSON body of your request.")
    if not isinstance(body, dict):
        return error_response(400, "The request body must be a JSON object.")
    return body
