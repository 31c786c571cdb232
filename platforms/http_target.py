"""The common part of platforms that only deliver over HTTP (callbacks, forge comments): one client session,
opened on connect and closed on disconnect; nothing is received (events come in as webhooks)."""

from __future__ import annotations

import aiohttp

from platforms.base import AdapterState, BasePlatformAdapter, OnMessage


class HttpTargetAdapter(BasePlatformAdapter):
    """An adapter whose sends are HTTP requests on one ``aiohttp`` session (``_new_session``)."""

    def __init__(self) -> None:
        super().__init__()
        self._session: aiohttp.ClientSession | None = None

    def _new_session(self) -> aiohttp.ClientSession:
        """The session requests go through (default headers, timeouts)."""
        return aiohttp.ClientSession()

    async def connect(self, on_message: OnMessage, *, receive: bool = True) -> None:
        """Open the HTTP client (`receive` only sets the flag: nothing is received here)."""
        self._session = self._new_session()
        self._set_state(AdapterState.CONNECTED)
        if receive:
            await self.start_receiving()

    async def disconnect(self) -> None:
        """Close the HTTP client."""
        await self.stop_receiving()
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._set_state(AdapterState.DISCONNECTED)
