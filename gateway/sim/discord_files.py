"""The Discord simulator's files: what users attach, the CDN serving it, and files the bot uploads with a message.

``DiscordSimulator`` mixes this in. Attachments (``AttachmentSpec`` on ``user_sends``; ``voice_message`` for a voice
message, whose message gets the IS_VOICE_MESSAGE flag) and the bot's uploads are kept with their bytes and served,
without credentials, at signed CDN links shaped like Discord's
(``/attachments/{channel}/{id}/{name}?ex=..&is=..&hm=..``; an expired or tampered link answers 404). A message create
may be multipart, as discord.py sends a file (``payload_json`` + ``files[n]``): the same checks and nonce dedupe as a
JSON create, each file at most the channel's upload limit (``default_upload_limit``, or its guild's boost tier's, see
``set_premium_tier``; over it: 413, code 40005). Readers: ``bot_files``, ``downloads``. Knobs: ``attachment_url_ttl``,
``cdn_chunked``, ``redirect_downloads_to``; faults: ``fail_next(CDN_ROUTE, status=...)``, ``drop_next(CDN_ROUTE)``.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import hmac
import json
import mimetypes
import random
import secrets
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from aiohttp import BodyPartReader, hdrs, web

from gateway.sim.downloads import Download, drop, recorded, stream

__all__ = ["CDN_PATH", "CDN_ROUTE", "MAX_REQUEST_SIZE", "VOICE_MESSAGE_FLAG", "AttachmentSpec", "Download",
           "FilesMixin", "StoredFile", "UploadedPart", "read_body", "voice_message"]

JSON = dict[str, Any]

CDN_ROUTE = "cdn_attachment"
"""The route name of CDN downloads, for ``fail_next`` and ``drop_next``."""
CDN_PATH = "/attachments/{channel_id}/{attachment_id}/{filename}"
DEFAULT_UPLOAD_LIMIT = 10 * 1024 * 1024
BOOSTED_UPLOAD_LIMITS = {2: 50 * 1024 * 1024, 3: 100 * 1024 * 1024}
"""Per-file upload limits of guilds by boost tier, where above the default."""
MAX_REQUEST_SIZE = 128 * 1024 * 1024
"""The largest request body the simulator reads (aiohttp's default is 1 MiB)."""
VOICE_MESSAGE_FLAG = 1 << 13
"""The message flag IS_VOICE_MESSAGE, set on a message carrying a voice message."""
_OPUS_RATE = 48_000
_WAVEFORM_SAMPLES_PER_SECOND = 10
_MAX_WAVEFORM = 256
_GONE = "This content is no longer available."


@dataclass(slots=True, frozen=True)
class AttachmentSpec:
    """A file a simulated user attaches to a message: ``data``, or else ``size`` bytes of filler."""

    filename: str
    content_type: str = "application/octet-stream"
    size: int = 1024
    data: bytes | None = None
    duration_secs: float | None = None
    """A voice message's length; with ``waveform``, what makes an attachment a voice message."""
    waveform: bytes | None = None
    """A voice message's amplitudes (one byte each, at most 256), sent base64-encoded."""

    def content(self) -> bytes:
        """The file's bytes (filler derived from the name, the same every time)."""
        return self.data if self.data is not None else random.Random(self.filename).randbytes(self.size)

    def voice_fields(self) -> JSON:
        """The attachment fields of a voice message (none for another file)."""
        if self.duration_secs is None or self.waveform is None:
            return {}
        return {"duration_secs": self.duration_secs, "waveform": base64.b64encode(self.waveform).decode()}


def voice_message(data: bytes) -> AttachmentSpec:
    """A voice message as Discord's clients attach one: ``voice-message.ogg`` (OGG/Opus), its duration read from the
    stream (the last page's granule position less the pre-skip, at 48 kHz) and a flat waveform of that length."""
    head, last = data.find(b"OpusHead"), data.rfind(b"OggS")
    if not data.startswith(b"OggS") or head < 0:
        raise ValueError("a voice message is an OGG/Opus stream")
    [pre_skip] = struct.unpack_from("<H", data, head + 10)
    [granule] = struct.unpack_from("<q", data, last + 6)
    duration = max(0, granule - pre_skip) / _OPUS_RATE
    samples = min(_MAX_WAVEFORM, max(1, round(duration * _WAVEFORM_SAMPLES_PER_SECOND)))
    return AttachmentSpec("voice-message.ogg", "audio/ogg", data=data, duration_secs=duration,
                          waveform=bytes(samples))


@dataclass(slots=True, frozen=True)
class StoredFile:
    """An attachment the simulator keeps: on a user's message, or uploaded by the bot (``content_type`` as Discord
    states it: guessed from the name, else the part's)."""

    id: int
    channel_id: int
    filename: str
    content_type: str
    data: bytes
    url: str


@dataclass(slots=True, frozen=True)
class UploadedPart:
    """A file part of a multipart request (``name``: ``files[n]``)."""

    name: str
    filename: str
    content_type: str
    data: bytes


async def read_body(request: web.Request) -> tuple[Any, tuple[UploadedPart, ...]]:
    """A REST request's JSON body (of ``payload_json`` when multipart; None if unreadable) and its file parts."""
    if not request.can_read_body:
        return None, ()
    if request.content_type != "multipart/form-data":
        raw = await request.read()
        with contextlib.suppress(ValueError):
            return (json.loads(raw) if raw else None), ()
        return None, ()
    body, parts = None, []
    async for part in await request.multipart():
        if not isinstance(part, BodyPartReader):
            continue
        data = bytes(await part.read())
        if part.name == "payload_json":
            with contextlib.suppress(ValueError):
                body = json.loads(data)
        elif part.filename is not None:
            parts.append(UploadedPart(part.name or "", part.filename,
                                      part.headers.get(hdrs.CONTENT_TYPE, "application/octet-stream"), data))
    return body, tuple(parts)


class FilesMixin:
    """Attachments, the CDN and uploads for ``DiscordSimulator`` (which provides the model and the faults)."""

    default_upload_limit: int = DEFAULT_UPLOAD_LIMIT
    """Bytes a file may have in DMs and in guilds below boost tier 2 (larger: 413)."""
    attachment_url_ttl: float = 86_400.0
    """Seconds a CDN link works after it was handed out (then 404, as Discord's expire after about a day)."""
    cdn_chunked: bool = False
    """Serve downloads without Content-Length (chunked), as a proxy may: a client learns the size only by reading."""
    redirect_downloads_to: str | None = None
    """Answer every download with a 302 to this origin (a CDN that sends a client elsewhere)."""

    # Provided by DiscordSimulator.
    url: str
    _guilds: dict[int, JSON]
    bot_messages: Callable[[int | None], list[JSON]]
    _api_error: Callable[..., Exception]
    _guild_of: Callable[[JSON], int | None]
    _new_id: Callable[[], int]
    _changed: Callable[[], None]
    _take_fault: Callable[[str], Any]

    def __init__(self) -> None:
        super().__init__()
        self._files: dict[int, StoredFile] = {}
        self._downloads: list[Download] = []
        self._cdn_key = secrets.token_bytes(16)

    # ----------------------------------------------------------------- drivers and readers

    def set_premium_tier(self, tier: int, guild_id: int) -> None:
        """A guild's boost tier: uploads there are checked against it at once; clients learn it from the next
        GUILD_CREATE (their next IDENTIFY)."""
        self._guilds[guild_id]["premium_tier"] = tier

    def bot_files(self, channel_id: int | None = None) -> list[StoredFile]:
        """The files on the bot's messages (in ``channel_id``), each once whatever retries happened, in order."""
        return [self._files[int(a["id"])] for m in self.bot_messages(channel_id) for a in m["attachments"]]

    @property
    def downloads(self) -> list[Download]:
        """Every request to the CDN, in arrival order."""
        return list(self._downloads)

    # ----------------------------------------------------------------- model

    def upload_limit_in(self, channel: JSON) -> int:
        """The largest file the bot may upload in ``channel``."""
        guild = self._guilds.get(self._guild_of(channel) or 0)
        tier = guild.get("premium_tier", 0) if guild is not None else 0
        return BOOSTED_UPLOAD_LIMITS.get(tier, self.default_upload_limit)

    def _user_attachments(self, channel_id: int, specs: Sequence[AttachmentSpec]) -> list[JSON]:
        return [self._attachment(channel_id, s.filename, s.content_type, s.content()) | s.voice_fields() for s in specs]

    def _uploads(self, channel: JSON, parts: Sequence[UploadedPart]) -> list[JSON]:
        """The attachments of a bot message from its file parts; 413 (40005) when one is over the limit."""
        limit = self.upload_limit_in(channel)
        if any(len(p.data) > limit for p in parts):
            raise self._api_error(413, 40005, "Request entity too large")
        return [self._attachment(int(channel["id"]), p.filename,
                                 mimetypes.guess_type(p.filename)[0] or p.content_type, p.data) for p in parts]

    def _attachment(self, channel_id: int, filename: str, content_type: str, data: bytes) -> JSON:
        aid = self._new_id()
        issued = int(time.time())
        expires = int(issued + self.attachment_url_ttl)
        query = f"ex={expires:x}&is={issued:x}&hm={self._signature(aid, f'{expires:x}', f'{issued:x}')}"
        url = f"{self.url}{CDN_PATH.format(channel_id=channel_id, attachment_id=aid, filename=quote(filename))}?{query}"
        self._files[aid] = StoredFile(aid, channel_id, filename, content_type, data, url)
        return {"id": str(aid), "filename": filename, "size": len(data), "url": url, "proxy_url": url,
                "content_type": content_type}

    def _signature(self, aid: int, expires: str, issued: str) -> str:
        return hmac.new(self._cdn_key, f"{aid}:{expires}:{issued}".encode(), hashlib.sha256).hexdigest()

    def _signed_file(self, request: web.Request) -> StoredFile | None:
        """The file a CDN link names, if the link is intact and unexpired."""
        info, query = request.match_info, request.query
        if not info["attachment_id"].isdecimal():
            return None
        stored = self._files.get(int(info["attachment_id"]))
        expires, issued = query.get("ex", ""), query.get("is", "")
        if (stored is None or str(stored.channel_id) != info["channel_id"] or stored.filename != info["filename"]
                or not hmac.compare_digest(query.get("hm", ""), self._signature(stored.id, expires, issued))):
            return None
        return stored if int(expires, 16) > time.time() else None

    # ----------------------------------------------------------------- CDN

    async def _handle_cdn(self, request: web.Request) -> web.StreamResponse:
        download = Download(request.path_qs, time.monotonic(), dict(request.headers))
        return await recorded(self._downloads, download, self._changed, functools.partial(self._serve, request))

    async def _serve(self, request: web.Request, download: Download) -> web.StreamResponse:
        if self.redirect_downloads_to is not None:
            download.status = 302
            return web.Response(status=302, headers={"Location": self.redirect_downloads_to + request.path_qs})
        fault = self._take_fault(CDN_ROUTE)
        if fault is not None and fault.kind == "error":
            download.status = fault.status
            return web.Response(status=fault.status, body=json.dumps(fault.body).encode(),
                                headers={"Content-Type": "application/json", **fault.headers})
        if fault is not None:  # a drop: the connection closes without an answer
            return await drop(request)
        stored = self._signed_file(request)
        if stored is None:
            download.status = 404
            return web.Response(status=404, text=_GONE)
        return await stream(request, download, stored.data, stored.content_type, chunked=self.cdn_chunked)
