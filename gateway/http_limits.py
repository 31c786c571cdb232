"""Limits of the HTTP server against slow and many clients.

At the socket, below aiohttp: a cap on open connections (beyond it a connection is answered 503 at once and
closed) and a deadline for the first request head of each connection. Per request: a deadline for the body,
and per-client-IP token buckets charged by failed requests, checked before any handler (so before signature
verification). What clients do wrong is logged as at most one WARNING line per client per minute.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import StreamReader, web
from aiohttp.http_exceptions import HttpProcessingError

logger = logging.getLogger(__name__)

_MAX_TRACKED = 100_000  # clients remembered by the buckets and the log limiter (least recently seen dropped)
_REFUSED_LINGER = 1.0  # seconds a refused connection is read (and discarded) so closing it does not reset the 503
_REFUSAL_BODY = b'{"error": "too many connections open; retry in a moment"}\n'
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(_REFUSAL_BODY)) + _REFUSAL_BODY


class ClientWarnings:
    """At most one WARNING line per key (a client's address) per interval; the next line counts those held back."""

    def __init__(self, log: logging.Logger, interval: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._interval = interval
        self._clock = clock
        self._seen: OrderedDict[str, tuple[float, int]] = OrderedDict()  # key -> (last line at, held back since)

    def warn(self, key: str, message: str, *args: Any) -> None:
        """Log ``message % args`` unless ``key`` already had a line within the interval."""
        now = self._clock()
        last, held = self._seen.get(key, (float("-inf"), 0))
        if now - last < self._interval:
            self._seen[key] = (last, held + 1)
            return
        suffix = f" ({held} more like it in the last {self._interval:.0f} s)" if held else ""
        self._log.warning(message + suffix, *args)
        self._seen[key] = (now, 0)
        self._seen.move_to_end(key)
        while len(self._seen) > _MAX_TRACKED:
            self._seen.popitem(last=False)


class FailureBuckets:
    """A token bucket per client address, spent by failed requests (4xx) and refilled at ``rate`` per second.

    An address whose bucket is empty is refused before its request is read or verified."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (tokens, at)

    def _tokens(self, address: str, now: float) -> float:
        tokens, at = self._buckets.get(address, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) * self.rate)

    def wait(self, address: str) -> float:
        """0 when ``address`` may send a request, else seconds until its bucket holds a token again."""
        if address not in self._buckets:
            return 0.0
        tokens = self._tokens(address, self._clock())
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    def charge(self, address: str) -> None:
        """Spend a token of ``address`` for a failed request."""
        now = self._clock()
        self._buckets[address] = (max(0.0, self._tokens(address, now) - 1), now)
        self._buckets.move_to_end(address)
        while len(self._buckets) > _MAX_TRACKED:
            self._buckets.popitem(last=False)


class _Abandoned(asyncio.TimeoutError):
    """Set on a request body the gateway gave up on (late or broken). A TimeoutError because aiohttp's lingering
    read of an unread body stops silently on one (any other exception is logged as unhandled) and closes."""


class BodyTimeout(_Abandoned):
    """The request body did not arrive within ``http.body_timeout``."""


class ServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server logger, with malformed requests (the client's fault) as rate-limited WARNING lines
    instead of ERROR tracebacks; everything else passes through unchanged."""

    def __init__(self, log: logging.Logger, warnings: ClientWarnings) -> None:
        super().__init__(log, {})
        self._warnings = warnings

    def exception(self, msg: object, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        """Log an exception; a request aiohttp could not parse becomes one WARNING per client per minute."""
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(exc, HttpProcessingError):
            # aiohttp logs these as "Error handling request from %s" with the client's address as the argument.
            client = str(args[0]) if args else "unknown"
            reason = " ".join(str(exc.message).split())[:200]  # one line, bounded
            self._warnings.warn(client, "http client %s: malformed request answered %s (%s)", client, exc.code,
                                reason)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


def _peer(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"


class ConnectionGuard:
    """The listening socket's protocol factory, wrapped: counts open connections, refuses those beyond
    ``max_connections`` with an immediate 503, and closes a connection whose first request head is not
    complete within ``header_timeout``.

    Hand-written because aiohttp has neither a connection limit nor a header deadline: its keep-alive timer
    cuts a partial head only after a response on the connection (on a fresh connection only since 3.14), and
    counting in a middleware would see a connection only once it has sent a whole request."""

    def __init__(self, max_connections: int, header_timeout: float, warnings: ClientWarnings) -> None:
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.warnings = warnings
        self.open = 0
        self._refused: set[asyncio.BaseTransport] = set()

    def factory(self, make: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """The protocol factory for ``loop.create_server`` around aiohttp's (``AppRunner.server``)."""
        def protocol() -> asyncio.Protocol:
            if self.open >= self.max_connections:
                return _Refused(self)
            self.open += 1
            return _Guarded(self, make())
        return protocol

    def close(self) -> None:
        """Close refused connections still lingering (at shutdown)."""
        for transport in list(self._refused):
            transport.close()


class _Refused(asyncio.Protocol):
    """A connection beyond the cap: 503 at once, its request read and discarded briefly, then closed."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard
        self._transport: asyncio.BaseTransport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        guard = self._guard
        guard.warnings.warn("connection limit", "http: %d connections open (http.max_connections): new "
                            "connections are answered 503", guard.open)
        guard._refused.add(transport)
        transport.write(_REFUSAL)
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(_REFUSED_LINGER, transport.close)

    def data_received(self, data: bytes) -> None:
        """Discard the request: unread data at close would reset the connection before the 503 is read."""

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._guard._refused.discard(self._transport)


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, counted, with a deadline for the first request head."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self._transport: asyncio.BaseTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._timer = asyncio.get_running_loop().call_later(self._guard.header_timeout, self._head_late)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            seen = self._tail + data
            if b"\n\r\n" in seen or b"\n\n" in seen:  # the blank line ending the head (CRLF, or bare LF)
                self._timer.cancel()
                self._timer = None
            self._tail = seen[-2:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._guard.open -= 1
        self._inner.connection_lost(exc)

    def _head_late(self) -> None:
        self._timer = None
        if self._transport is not None:
            client = _peer(self._transport)
            self._guard.warnings.warn(client, "http client %s: no complete request head within %s s "
                                      "(http.header_timeout): connection closed", client, self._guard.header_timeout)
            self._transport.close()


def _error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


def _failed(status: int) -> bool:
    # 429 is left out: a sender over its route's budget has passed verification (and 429s are not handled).
    return 400 <= status < 500 and status != 429


class RequestLimits:
    """The per-request limits, as one aiohttp middleware: the client's failure bucket (before any handler),
    the body deadline, and the client's faults (a body that is late, malformed or cut off) answered 4xx."""

    # Probes and scrapes come often from one address (kubelet, Prometheus), answer cheaply and never fail 4xx.
    exempt = frozenset({"/healthz", "/readyz", "/metrics"})

    def __init__(self, body_timeout: float, buckets: FailureBuckets | None, warnings: ClientWarnings) -> None:
        self.body_timeout = body_timeout
        self.buckets = buckets
        self.warnings = warnings

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """Refuse a client whose bucket is empty; charge it for each failed request."""
        address = request.remote or "unknown"
        buckets = None if request.path in self.exempt else self.buckets
        if buckets is not None and (wait := buckets.wait(address)):
            self.warnings.warn(address, "http client %s: too many failed requests (http.per_ip_burst): answered 429",
                               address)
            return _error(429, "too many failed requests from this address; retry later",
                          **{"Retry-After": str(max(1, math.ceil(wait)))})
        try:
            response = await self._in_time(request, handler)
        except web.HTTPException as exc:  # the router's 404 and 405, request.read()'s 413
            if buckets is not None and _failed(exc.status):
                buckets.charge(address)
            raise
        if buckets is not None and _failed(response.status):
            buckets.charge(address)
        return response

    async def _in_time(self, request: web.Request,
                       handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        body = request.content
        timer = None if body.is_eof() else asyncio.get_running_loop().call_later(self.body_timeout, self._late, body)
        try:
            return await handler(request)
        except Exception as exc:
            if exc is not body.exception():  # not the body's own failure: the handler's, an error as ever
                raise
            address = request.remote or "unknown"
            if isinstance(exc, BodyTimeout):
                self.warnings.warn(address, "http client %s: request body not complete within %s s "
                                   "(http.body_timeout): answered 408", address, self.body_timeout)
                response = _error(408, f"request body not received within {self.body_timeout} s")
            else:
                self.warnings.warn(address, "http client %s: unreadable request body answered 400 (%s: %s)",
                                   address, type(exc).__name__, exc)
                response = _error(400, "request body malformed or cut off")
                body.set_exception(_Abandoned())
            response.force_close()
            return response
        finally:
            if timer is not None:
                timer.cancel()

    def _late(self, body: StreamReader) -> None:
        if not body.is_eof() and body.exception() is None:
            body.set_exception(BodyTimeout())
