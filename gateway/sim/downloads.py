"""File downloads as the platform simulators serve them: streamed in chunks with each request recorded (how much
went out, whether the client read it all), and a connection dropped on demand."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

CHUNK = 64 * 1024


@dataclass(slots=True, eq=False)
class Download:
    """One download request: ``sent`` bytes of the ``size`` were written, ``complete`` if all; ``done`` once the
    simulator finished with it (the client may have gone away). ``headers``: the request's, where a test needs
    them."""

    path: str
    t: float
    headers: dict[str, str] = field(default_factory=dict)
    status: int | None = None
    size: int = 0
    sent: int = 0
    complete: bool = False
    done: bool = False


async def recorded(downloads: list[Download], download: Download, changed: Callable[[], None],
                   serve: Callable[[Download], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Serve a download kept in ``downloads`` (``changed`` told when it starts and when it is done)."""
    downloads.append(download)
    changed()
    try:
        return await serve(download)
    finally:
        download.done = True
        changed()


async def drop(request: web.Request) -> web.Response:
    """Close the connection without an answer (aiohttp's handler cancellation ends the handler in the sleep)."""
    if request.transport is not None:
        request.transport.abort()
    await asyncio.sleep(1)
    return web.Response(status=500)


async def stream(request: web.Request, download: Download, data: bytes, content_type: str, *,
                 chunked: bool) -> web.StreamResponse:
    """Serve ``data`` in chunks (with a Content-Length unless ``chunked``), recording progress in ``download``."""
    response = web.StreamResponse(headers={"Content-Type": content_type})
    if chunked:
        response.enable_chunked_encoding()
    else:
        response.content_length = len(data)
    download.status, download.size = 200, len(data)
    await response.prepare(request)
    try:
        for start in range(0, len(data), CHUNK):
            chunk = data[start:start + CHUNK]
            await response.write(chunk)
            download.sent += len(chunk)
        await response.write_eof()
    except ConnectionError:  # the client stopped reading and closed the connection
        return response
    download.complete = True
    return response
