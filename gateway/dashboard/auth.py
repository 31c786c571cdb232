"""Who may use the dashboard: token login exchanged for a server-side session, CSRF tokens on every POST,
failed logins limited per client address, and the security headers of every /dashboard response."""

from __future__ import annotations

import hmac
import ipaddress
import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web

from gateway.config import HttpSettings
from gateway.http_limits import FailureBuckets

logger = logging.getLogger("gateway.dashboard")

COOKIE = "hermes_dashboard"
PREFIX = "/dashboard"
ADMIN = "admin"  # the operator name of http.api_token
LOGIN_BURST = 5  # failed logins an address may make at once
LOGIN_RATE = 1 / 60  # failed logins per second an address earns back
MAX_SESSIONS = 1000
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(slots=True)
class Session:
    """One logged-in browser: who, its CSRF token, when it was last used (monotonic seconds)."""

    operator: str
    csrf: str
    seen: float
    flash: str | None = None
    """What the last action did, shown once on the next page."""


OPERATOR_KEY = web.RequestKey("dashboard_session", Session)


class Sessions:
    """Login sessions in memory, by random id; one unused for ``idle`` seconds is gone (so is every one at a
    restart: operators log in again)."""

    def __init__(self, idle: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.idle = idle
        self.clock = clock
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    def create(self, operator: str) -> tuple[str, Session]:
        """A new session for ``operator``: its id (the cookie's value) and the session."""
        sid = secrets.token_hex(32)
        session = self._by_id[sid] = Session(operator, secrets.token_hex(32), self.clock())
        while len(self._by_id) > MAX_SESSIONS:
            self._by_id.popitem(last=False)
        return sid, session

    def get(self, sid: str | None) -> Session | None:
        """The live session with this id (its idle time starts over), or None."""
        session = self._by_id.get(sid or "")
        if session is None:
            return None
        now = self.clock()
        if now - session.seen > self.idle:
            del self._by_id[sid or ""]
            return None
        session.seen = now
        self._by_id.move_to_end(sid or "")
        return session

    def end(self, sid: str | None) -> None:
        """Log out."""
        self._by_id.pop(sid or "", None)


class Gatekeeper:
    """The dashboard's checks, as one aiohttp middleware of its sub-application, and its login and logout."""

    def __init__(self, http: HttpSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        board = http.dashboard
        self.tokens = [(name, token.get_secret_value().encode()) for name, token in board.operators.items()]
        if http.api_token is not None:
            self.tokens.append((ADMIN, http.api_token.get_secret_value().encode()))
        self.proxies = [ipaddress.ip_network(net) for net in board.trusted_proxies]
        self.sessions = Sessions(board.session_idle_minutes * 60.0, clock)
        self.failures = FailureBuckets(LOGIN_RATE, LOGIN_BURST, clock)

    def operator_of(self, token: str) -> str | None:
        """The operator whose token this is; every token is compared, in constant time."""
        given = token.encode("utf-8", "surrogateescape")
        found = None
        for name, secret in self.tokens:
            if hmac.compare_digest(given, secret) and found is None:
                found = name
        return found

    def _proxied(self, request: web.Request) -> bool:
        try:
            peer = ipaddress.ip_address(request.remote or "")
        except ValueError:
            return False
        return any(peer in net for net in self.proxies)

    def client(self, request: web.Request) -> str:
        """The client's address: the peer's, or behind a trusted proxy the last address it forwarded."""
        forwarded = request.headers.get("X-Forwarded-For", "")
        if forwarded and self._proxied(request):
            return forwarded.rsplit(",", 1)[-1].strip()
        return request.remote or "unknown"

    def secure(self, request: web.Request) -> bool:
        """Whether the browser reached us over TLS (directly, or through a trusted proxy that says so)."""
        return request.secure or (self._proxied(request)
                                  and request.headers.get("X-Forwarded-Proto", "").lower() == "https")

    def _same_origin(self, request: web.Request) -> bool:
        # Browsers say where a request comes from in Sec-Fetch-Site; older ones only in Origin, which under
        # Referrer-Policy: no-referrer is "null" even for our own forms. A request naming another site is
        # refused (the login form's too: login CSRF); clients that send neither are no browser's cross-site
        # requests, and every action still needs the session's CSRF token.
        site = request.headers.get("Sec-Fetch-Site")
        if site is not None:
            return site in ("same-origin", "none")
        origin = request.headers.get("Origin")
        if origin is None or origin == "null":
            return True
        host = request.headers.get("X-Forwarded-Host") if self._proxied(request) else None
        return urlsplit(origin).netloc == (host or request.host)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse cross-site POSTs, requests without a session and POSTs without the session's CSRF token."""
        if request.method == "POST" and not self._same_origin(request):
            raise web.HTTPForbidden(text="cross-site request refused")
        if request.path == f"{PREFIX}/login" or request.path.startswith(f"{PREFIX}/static/"):
            return await handler(request)
        session = self.sessions.get(request.cookies.get(COOKIE))
        if session is None:
            if request.method == "GET" and not _is_data(request):
                raise web.HTTPSeeOther(f"{PREFIX}/login")
            raise web.HTTPUnauthorized(text="log in at /dashboard/login")
        if request.method == "POST":
            form = await request.post()
            sent = request.headers.get("X-CSRF-Token") or str(form.get("csrf", ""))
            if not hmac.compare_digest(sent.encode("utf-8", "surrogateescape"), session.csrf.encode()):
                logger.warning("dashboard: %s %s by %s refused: missing or wrong CSRF token", request.method,
                               request.path, session.operator)
                raise web.HTTPForbidden(text="missing or wrong CSRF token: reload the page")
        request[OPERATOR_KEY] = session
        return await handler(request)

    def login_wait(self, request: web.Request) -> int:
        """0, or whole seconds until this client may try a login again."""
        return math.ceil(self.failures.wait(self.client(request)))

    def login(self, request: web.Request, token: str) -> web.Response | None:
        """A 303 to the overview with a new session's cookie, or None for a wrong token (charged to the client)."""
        operator = self.operator_of(token)
        client = self.client(request)
        if operator is None:
            self.failures.charge(client)
            logger.warning("dashboard: failed login from %s", client)
            return None
        sid, _ = self.sessions.create(operator)
        logger.info("dashboard: %s logged in from %s", operator, client)
        response = see_other(f"{PREFIX}/")
        response.set_cookie(COOKIE, sid, path=PREFIX, httponly=True, samesite="Strict", secure=self.secure(request))
        return response

    def logout(self, request: web.Request) -> web.Response:
        """End the session and clear its cookie."""
        session = request[OPERATOR_KEY]
        self.sessions.end(request.cookies.get(COOKIE))
        logger.info("dashboard: %s logged out", session.operator)
        response = see_other(f"{PREFIX}/login")
        response.del_cookie(COOKIE, path=PREFIX)
        return response


def see_other(location: str) -> web.Response:
    """A 303 redirect (after a POST, the browser GETs ``location``)."""
    return web.Response(status=303, headers={"Location": location})


def _is_data(request: web.Request) -> bool:
    """JSON and event-stream endpoints answer 401 without a session; pages redirect to the login form."""
    return request.path.startswith((f"{PREFIX}/api/", f"{PREFIX}/events"))


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare`` of the gateway's app: the dashboard's headers on every /dashboard response
    (errors and event streams included), nothing on the others."""
    if request.path == PREFIX or request.path.startswith(f"{PREFIX}/"):
        response.headers.update(SECURITY_HEADERS)


def operator(request: web.Request) -> Session:
    """The session of a request the middleware let through."""
    return request[OPERATOR_KEY]
