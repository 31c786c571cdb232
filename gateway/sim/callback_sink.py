"""A receiver for ``callback:`` deliveries: records each POST, with injectable failures."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web


class CallbackSink:
    """An aiohttp server on 127.0.0.1 recording the results the gateway delivers to it."""

    def __init__(self, path: str = "/results") -> None:
        self.path = path
        self.received: list[dict[str, Any]] = []
        self.attempts: list[float] = []
        self.fail_with: list[tuple[int, dict[str, str]]] = []
        self.app = web.Application()
        self.app.router.add_post(path, self._results)
        self._runner: web.AppRunner | None = None
        self.base_url = ""
        self._changed = asyncio.Event()

    @property
    def url(self) -> str:
        """Where the gateway should POST."""
        return self.base_url + self.path

    async def start(self) -> None:
        """Listen on an ephemeral port."""
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.base_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner:
            await self._runner.cleanup()

    async def _results(self, request: web.Request) -> web.Response:
        self.attempts.append(asyncio.get_running_loop().time())
        if self.fail_with:
            status, headers = self.fail_with.pop(0)
            return web.json_response({"error": "injected"}, status=status, headers=headers)
        self.received.append({"webhook-id": request.headers.get("webhook-id"), **await request.json()})
        self._changed.set()
        return web.json_response({"ok": True})

    async def wait_for(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Wait until ``n`` deliveries arrived; returns them."""
        async def _wait() -> None:
            while len(self.received) < n:
                self._changed.clear()
                await self._changed.wait()
        await asyncio.wait_for(_wait(), timeout)
        return list(self.received)
