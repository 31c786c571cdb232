"""What the GitHub and GitLab simulators share: lifecycle, comment threads, pagination, a held 201."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
from datetime import UTC, datetime
from typing import Any

from aiohttp import web


class ForgeSimulator(abc.ABC):
    """An aiohttp server on 127.0.0.1 keeping comments per thread, with a token check.

    ``hold_next_post()``: the next comment is stored and its 201 status and JSON body are written, but the chunked
    body is not ended until ``release()``, so the client has the 201 yet cannot finish reading it (the moment to
    kill it: the platform has the comment, the sender has not recorded it). ``holding`` is set at that point.
    ``rate_limit_next(n, retry_after)``: the next ``n`` comments are refused as the forge's rate limit does (429 with
    ``Retry-After``), nothing stored.
    """

    default_per_page: int = 30

    def __init__(self, token: str) -> None:
        self.token = token
        self.threads: dict[str, list[dict[str, Any]]] = {}
        self.posts = 0
        self.lists = 0
        self.unauthorized = 0
        self.holding = asyncio.Event()
        self._hold = 0
        self._limited = 0
        self._retry_after = 0
        self._release = asyncio.Event()
        self._changed = asyncio.Event()
        self._next_id = 1000
        self.app = web.Application()
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    async def start(self) -> None:
        """Listen on an ephemeral port."""
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.base_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    async def stop(self) -> None:
        """Release held answers, stop listening."""
        self._release.set()
        if self._runner:
            await self._runner.cleanup()

    def hold_next_post(self) -> None:
        """Hold the next comment's answer after its 201 and body (see the class docstring)."""
        self._hold += 1
        self._release.clear()

    def release(self) -> None:
        """End the held answers."""
        self._release.set()

    def rate_limit_next(self, n: int = 1, retry_after: int = 1) -> None:
        """Refuse the next ``n`` comments with 429 and ``Retry-After: retry_after``."""
        self._limited, self._retry_after = n, retry_after

    def comments(self, thread: str) -> list[dict[str, Any]]:
        """The comments on ``thread`` (the simulator's key, e.g. ``acme/rocket#7``), oldest first."""
        return list(self.threads.get(thread, []))

    def add_comment(self, thread: str, body: str) -> dict[str, Any]:
        """Store a comment (as someone else would post it); returns it."""
        self._next_id += 1
        comment = self._shape(thread, self._next_id, body, datetime.now(UTC).isoformat().replace("+00:00", "Z"))
        self.threads.setdefault(thread, []).append(comment)
        self._changed.set()
        return comment

    async def wait_for_comments(self, thread: str, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Wait until ``thread`` has ``n`` comments; returns them."""
        async def _wait() -> None:
            while len(self.threads.get(thread, [])) < n:
                self._changed.clear()
                await self._changed.wait()
        await asyncio.wait_for(_wait(), timeout)
        return self.comments(thread)

    @abc.abstractmethod
    def _authorized(self, request: web.Request) -> bool:
        """Whether the request carries the token the way the forge expects."""

    @abc.abstractmethod
    def _shape(self, thread: str, comment_id: int, body: str, created_at: str) -> dict[str, Any]:
        """A comment as the forge's REST API returns it."""

    @abc.abstractmethod
    def _denied(self) -> web.Response:
        """The forge's answer to a missing or wrong token."""

    async def _post(self, request: web.Request, thread: str) -> web.StreamResponse:
        if not self._authorized(request):
            self.unauthorized += 1
            return self._denied()
        try:
            data = await request.json()
        except ValueError:
            return web.json_response({"message": "Problems parsing JSON"}, status=400)
        body = data.get("body") if isinstance(data, dict) else None
        if not isinstance(body, str) or not body:
            return web.json_response({"message": "body is missing"}, status=422)
        if self._limited:
            self._limited -= 1
            return web.json_response({"message": "API rate limit exceeded"}, status=429,
                                     headers={"Retry-After": str(self._retry_after)})
        self.posts += 1
        comment = self.add_comment(thread, body)
        if not self._hold:
            return web.json_response(comment, status=201)
        self._hold -= 1
        resp = web.StreamResponse(status=201, headers={"Content-Type": "application/json; charset=utf-8"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(json.dumps(comment).encode())
        self.holding.set()
        await self._release.wait()
        with contextlib.suppress(ConnectionResetError):
            await resp.write_eof()
        return resp

    async def _list(self, request: web.Request, thread: str) -> web.Response:
        if not self._authorized(request):
            self.unauthorized += 1
            return self._denied()
        self.lists += 1
        try:
            per_page = min(100, max(1, int(request.query.get("per_page", self.default_per_page))))
            page = max(1, int(request.query.get("page", "1")))
        except ValueError:
            return web.json_response({"message": "per_page and page must be integers"}, status=400)
        items = self.comments(thread)
        last = max(1, -(-len(items) // per_page))
        links = []
        if page < last:
            links.append(f'<{request.url.update_query(page=page + 1, per_page=per_page)}>; rel="next"')
        links.append(f'<{request.url.update_query(page=last, per_page=per_page)}>; rel="last"')
        return web.json_response(items[(page - 1) * per_page:page * per_page], headers={"Link": ", ".join(links)})
