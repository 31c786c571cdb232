"""What the API's handlers share: who is calling (keys compared in constant time), JSON errors naming the field,
request bodies, the per-client run limit, and accepting a run."""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from aiohttp import web

from gateway.config import Config
from gateway.config.base import _tools_of, _widening
from gateway.router import Router, parse_target
from gateway.schema import runs_t
from gateway.store import Acceptance, Store
from platforms.base import GatewayClosing, MessageEvent
from toolsets import validate_toolset

OPERATOR = "@operator"  # the caller holding http.api_token (no client name can contain '@')
OPERATOR_DEFAULT_TOOLSET = "hermes-webhook"
_SESSION_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,200}")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    """A refused request: its status, a message, and the request field (``param``) at fault, if one is."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> web.Response:
        """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
        kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                409: "conflict_error", 429: "rate_limit_error"}.get(self.status, "invalid_request_error")
        if self.status >= 500:
            kind = "server_error"
        return json_response({"error": {"message": self.message, "type": kind, "param": self.param,
                                        "code": self.code}}, self.status)


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """A JSON response."""
    return web.Response(text=json.dumps(data, ensure_ascii=False, default=str), status=status,
                        content_type="application/json", headers=headers)


def handler(fn: Handler) -> Handler:
    """Turn an ``ApiError`` raised by ``fn`` into its JSON response."""
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await fn(request)
        except ApiError as exc:
            return exc.response()
        except GatewayClosing as exc:
            return ApiError(503, str(exc)).response()
    return wrapped


@dataclass(slots=True, frozen=True)
class Caller:
    """Who is calling: a configured client, or the operator (``http.api_token``)."""

    name: str
    allowance: str | list[str]
    """The toolsets its runs may use (``all`` for the operator)."""
    default_toolset: str | list[str]
    deliver_to: tuple[str, ...]
    max_concurrent_runs: int | None
    model: str

    @property
    def operator(self) -> bool:
        """Whether this is the operator, who manages everything (as the CLI does)."""
        return self.name == OPERATOR

    def toolsets(self, requested: Any, param: str = "toolset") -> list[str]:
        """The toolsets a run asks for (None: the caller's own), refused when unknown or beyond its allowance."""
        if requested is None:
            requested = self.default_toolset
        names = [requested] if isinstance(requested, str) else requested
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise ApiError(400, f"{param} must be a toolset name or a non-empty list of them", param)
        for name in names:
            if not validate_toolset(name):
                raise ApiError(400, f"unknown toolset {name!r}", param)
        if extra := _widening(names, _tools_of(self.allowance)):
            raise ApiError(403, f"{param} reaches beyond this key's toolsets (extra tools: {', '.join(extra)})",
                           param)
        return names


class Callers:
    """Resolves ``Authorization: Bearer <key>`` to a caller, comparing with every key in constant time."""

    def __init__(self, cfg: Config) -> None:
        model = cfg.model.name
        token = cfg.http.api_token.get_secret_value() if cfg.http.api_token else ""
        self._keys: list[tuple[bytes, Caller]] = [
            (client.key.get_secret_value().encode(),
             Caller(name, client.toolset, client.toolset, ("none", *client.deliver_to), client.max_concurrent_runs,
                    client.model_alias or model))
            for name, client in cfg.http.api.clients.items()]
        if token:
            self._keys.append((token.encode(), Caller(OPERATOR, "all", OPERATOR_DEFAULT_TOOLSET, ("none",), None,
                                                      model)))

    def of(self, request: web.Request) -> Caller:
        """The caller, or 401."""
        header = request.headers.get("Authorization", "")
        given = header[7:].encode("utf-8", "surrogateescape") if header.startswith("Bearer ") else b""
        found: Caller | None = None
        for key, caller in self._keys:  # every key is compared: the time taken does not tell which one matched
            if hmac.compare_digest(given, key) and given:
                found = caller
        if found is None:
            raise ApiError(401, "send Authorization: Bearer <a client key from http.api.clients>",
                           code="invalid_api_key")
        return found


async def read_object(request: web.Request) -> dict[str, Any]:
    """The request's JSON object body, or 400."""
    try:
        body = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def session_id(request: web.Request, body: Mapping[str, Any]) -> str | None:
    """The stored session the request names (``X-Hermes-Session`` header or ``session`` field), checked."""
    value = request.headers.get("X-Hermes-Session", body.get("session"))
    if value is None:
        return None
    if not isinstance(value, str) or not _SESSION_ID.fullmatch(value):
        raise ApiError(400, "session must be 1-128 letters, digits or . _ : -", "session")
    return value


def idempotency_key(request: web.Request) -> str:
    """``Idempotency-Key`` if given (checked), else a fresh id."""
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return uuid.uuid4().hex
    if not _IDEMPOTENCY_KEY.fullmatch(key):
        raise ApiError(400, "Idempotency-Key must be 1-200 printable ASCII characters", "Idempotency-Key")
    return key


def deliver_target(caller: Caller, value: Any) -> str:
    """``deliver_to`` of a run: ``none`` or a target listed for the caller's key."""
    if value is None:
        return "none"
    if not isinstance(value, str) or value not in caller.deliver_to:
        raise ApiError(403 if isinstance(value, str) else 400,
                       f"deliver_to must be one of this key's targets: {', '.join(caller.deliver_to)}", "deliver_to")
    return value


class RunIntake:
    """Accepts API runs through the router, within each client's ``max_concurrent_runs`` (counted in the store,
    so every replica and every kind of request counts)."""

    def __init__(self, store: Store, router: Router) -> None:
        self.store = store
        self.router = router
        self._locks: dict[str, asyncio.Lock] = {}

    async def _active(self, client: str) -> int:
        query = sa.select(sa.func.count()).select_from(runs_t).where(
            runs_t.c.kind == "api", runs_t.c.source == client, runs_t.c.status.in_(("queued", "running")))
        return int(await self.store.db.read(lambda conn: conn.execute(query).scalar_one()))

    async def accept(self, caller: Caller, request: web.Request, text: str, toolsets: list[str], *,
                     session: str | None = None, deliver_to: str = "none",
                     history: list[dict[str, Any]] | None = None) -> Acceptance:
        """Accept the run (once per ``Idempotency-Key``); 429 when the client has its maximum going."""
        key = idempotency_key(request)
        event = MessageEvent(platform="api", event_id=f"{caller.name}:{key}", chat_id=caller.name, chat_type="dm",
                             user_id=caller.name, user_name=caller.name, text=text,
                             metadata={} if history is None else {"history": json.dumps(history)})
        session_key = f"api:{caller.name}:{session}" if session else f"api:{caller.name}:request:{key}"
        async with self._locks.setdefault(caller.name, asyncio.Lock()):
            if caller.max_concurrent_runs is not None and await self._active(caller.name) >= caller.max_concurrent_runs:
                raise ApiError(429, f"this key has {caller.max_concurrent_runs} runs going already; retry later",
                               code="max_concurrent_runs")
            return await self.router.accept_api(event, session_key, toolsets, parse_target(deliver_to),
                                                history=session is not None)
