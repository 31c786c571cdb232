"""Slack simulator, files: the upload v2 flow, ``files.info``, files users share and their authenticated downloads.

``SlackSimulator`` (gateway/sim/slack_api.py) mixes this in. Web API methods: ``files.getUploadURLExternal``
(``filename``, ``length`` → ``upload_url``, ``file_id``; ``files:write``), ``files.completeUploadExternal``
(``files=[{id, title}]``, ``channel_id``, ``thread_ts``, ``initial_comment``: the bot's file share message;
``files:write``) and ``files.info`` (the file with ``shares.public|private[channel] = [{ts, ...}]``; ``files:read``).
An upload URL (``POST /upload/v1/<id>``, no token: it is signed) takes the bytes raw or as multipart, refuses a
length other than the one announced, and answers ``OK - <length>``. ``url_private`` and ``url_private_download``
(``GET /files-pri/<team>-<file id>/[download/]<name>``) serve a file to the bot token with ``files:read``; any other
request gets Slack's sign-in page with status 200, as Slack does.

Drivers: ``user_file`` makes a file a user uploaded, and ``user_audio_clip`` an audio clip a user recorded in Slack
(``subtype: slack_audio``), to pass as ``files=`` to the message drivers of ``SlackSimulator``. Readers: ``uploads``,
``downloads``, ``bot_files``. Faults: ``share_lag`` (Slack shares asynchronously: seconds before a share shows in
files.info), ``fail_download_next``, ``stream_download_next``, and
``server_error_next("files.completeUploadExternal", after_apply=True)`` for a completion whose answer is lost.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

from aiohttp import web

__all__ = ["AUDIO_CLIP", "FILE_SCOPES", "LOGIN_PAGE", "Download", "FilesMixin", "Share", "SimFile", "Upload"]

JSON = dict[str, Any]

FILE_SCOPES = {"files.getUploadURLExternal": "files:write", "files.completeUploadExternal": "files:write",
               "files.info": "files:read"}
"""The scope each files method needs."""
MAX_FILE_SIZE = 1024**3
MAX_COMMENT_LENGTH = 40_000
UPLOAD_PATH = "/upload/v1/"
FILES_PATH = "/files-pri/"
LOGIN_PAGE = ("<!DOCTYPE html><html lang=\"en-US\"><head><title>Slack</title></head><body>"
              "<h1>Sign in to Sim Workspace</h1><form action=\"/signin\" method=\"post\"></form></body></html>")
"""What Slack serves a file download it does not authorize (status 200)."""
AUDIO_CLIP = "slack_audio"
"""The ``subtype`` of a file that is an audio clip recorded in Slack (shown as a player: ``media_display_type``)."""
_STREAM_CHUNK = 64 * 1024
_STREAM_CAP = 256 * 1024 * 1024  # an endless download stops here even if the client never hangs up


@dataclass(slots=True, eq=False)
class Share:
    """The file shared in a channel (or a thread of it) by the message ``ts``; shown by files.info from ``shown_t``."""

    channel: str
    ts: str
    thread_ts: str | None
    shown_t: float

    def to_json(self, team_id: str, user: str) -> JSON:
        """The entry under ``shares.public|private[channel]``."""
        share: JSON = {"reply_users": [], "reply_users_count": 0, "reply_count": 0, "ts": self.ts,
                       "channel_name": self.channel.lower(), "team_id": team_id, "share_user_id": user,
                       "source": "UNKNOWN"}
        if self.thread_ts:
            share["thread_ts"] = self.thread_ts
        return share


@dataclass(slots=True, eq=False)
class SimFile:
    """A file: uploaded by the bot (``data`` None until its upload URL got the bytes) or by a user."""

    id: str
    name: str
    title: str
    mimetype: str
    user: str
    length: int
    created: int
    data: bytes | None = None
    completed: bool = False
    check_file_info: bool = False
    """A user's file the events show by id only (``file_access: check_file_info``, as in Slack Connect)."""
    subtype: str | None = None
    """``AUDIO_CLIP`` for an audio clip recorded in Slack."""
    shares: list[Share] = field(default_factory=list)

    def to_json(self, origin: str, team_id: str) -> JSON:
        """The file object, as in a message or files.info (without its shares)."""
        name = quote(self.name)
        base = f"{origin}{FILES_PATH}{team_id}-{self.id}"
        ext = self.name.rsplit(".", 1)[-1].lower() if "." in self.name else "binary"
        clip = {"subtype": self.subtype, "media_display_type": "audio"} if self.subtype == AUDIO_CLIP else {}
        return {**clip, "id": self.id, "created": self.created, "timestamp": self.created, "name": self.name,
                "title": self.title, "mimetype": self.mimetype, "filetype": ext, "pretty_type": ext.upper(),
                "user": self.user, "user_team": team_id, "editable": False, "size": len(self.data or b""),
                "mode": "hosted", "is_external": False, "external_type": "", "is_public": True,
                "public_url_shared": False, "display_as_bot": False, "username": "",
                "url_private": f"{base}/{name}", "url_private_download": f"{base}/download/{name}",
                "permalink": f"https://sim.slack.com/files/{self.user}/{self.id}/{name}",
                "has_rich_preview": False, "file_access": "visible"}

    def event_json(self, origin: str, team_id: str) -> JSON:
        """The file as a message event carries it."""
        if self.check_file_info:
            return {"id": self.id, "mode": "file_access", "file_access": "check_file_info", "created": self.created,
                    "timestamp": self.created, "user": self.user}
        return self.to_json(origin, team_id)


@dataclass(slots=True, eq=False)
class Upload:
    """One POST to an upload URL: the bytes it carried, whether a token came with it, the status answered."""

    file_id: str
    data: bytes
    content_type: str
    authorization: str | None
    status: int
    t: float = field(default_factory=time.monotonic)


@dataclass(slots=True, eq=False)
class Download:
    """One GET of a private file URL: the token presented and what was served."""

    path: str
    token: str | None
    status: int
    served: Literal["file", "sign-in page", "fault", "stream", "not found"]
    bytes_sent: int = 0
    hung_up: bool = False
    """An endless stream (``stream_download_next``) the client stopped reading and closed."""
    t: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class _DownloadFault:
    status: int | None  # None: stream the file endlessly without a Content-Length


class FilesMixin:
    """Files for ``SlackSimulator`` (which provides the workspace, the messages and the Web API plumbing)."""

    share_lag: float = 0.0
    """Seconds before a share shows in files.info (and is left out of the completion's answer when above 0)."""

    # Provided by SlackSimulator.
    bot_token: str
    bot_user_id: str
    bot_id: str
    team_id: str
    scopes: set[str]
    port: int
    _changed: Callable[[], None]
    _next_ts: Callable[[], str]
    _bot_posts: Callable[..., Any]
    _api_error: Callable[[str], Exception]

    def __init__(self) -> None:
        self._files: dict[str, SimFile] = {}
        self._upload_urls: dict[str, str] = {}  # upload id -> file id
        self._uploads: list[Upload] = []
        self._downloads: list[Download] = []
        self._download_faults: deque[_DownloadFault] = deque()

    def file_handlers(self) -> dict[str, Callable[[Any], JSON]]:
        """The Web API methods served here."""
        return {"files.getUploadURLExternal": self._get_upload_url, "files.completeUploadExternal": self._complete,
                "files.info": self._file_info}

    def file_routes(self) -> list[web.RouteDef]:
        """The upload URLs and the private file URLs."""
        return [web.post(UPLOAD_PATH + "{upload_id}", self._handle_upload),
                web.get(FILES_PATH + "{ref}/{rest:.*}", self._handle_download)]

    @property
    def _origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ----------------------------------------------------------------- drivers and readers

    def user_file(self, name: str, data: bytes, mimetype: str = "application/octet-stream", *,
                  user: str = "U0USER1", check_file_info: bool = False) -> SimFile:
        """A file ``user`` uploaded, to share with ``files=[...]`` in a message driver."""
        file = SimFile(self._new_file_id(), name, name, mimetype, user, len(data), int(time.time()), data,
                       completed=True, check_file_info=check_file_info)
        self._files[file.id] = file
        return file

    def user_audio_clip(self, data: bytes, mimetype: str = "audio/ogg", name: str = "audio_message.ogg", *,
                        user: str = "U0USER1") -> SimFile:
        """An audio clip ``user`` recorded in Slack (``subtype: slack_audio``), to share with ``files=[...]``."""
        file = self.user_file(name, data, mimetype, user=user)
        file.subtype = AUDIO_CLIP
        return file

    def files_event_json(self, files: Sequence[SimFile], channel: str, ts: str, thread_ts: str | None) -> list[JSON]:
        """Share a user's ``files`` by the message ``ts``; the files as its event carries them."""
        for file in files:
            file.shares.append(Share(channel, ts, thread_ts, time.monotonic()))
        return [f.event_json(self._origin, self.team_id) for f in files]

    @property
    def uploads(self) -> list[Upload]:
        """Every POST to an upload URL, in order."""
        return list(self._uploads)

    @property
    def downloads(self) -> list[Download]:
        """Every GET of a private file URL, in order."""
        return list(self._downloads)

    @property
    def bot_files(self) -> list[SimFile]:
        """The files the bot started uploading (files.getUploadURLExternal), in order."""
        return [f for f in self._files.values() if f.user == self.bot_user_id]

    def fail_download_next(self, status: int, count: int = 1) -> None:
        """Answer the next ``count`` file downloads with ``status`` (a 3xx redirects to the sign-in page)."""
        self._download_faults.extend(_DownloadFault(status) for _ in range(count))

    def stream_download_next(self) -> None:
        """Serve the next download without a Content-Length and without end, until the client hangs up."""
        self._download_faults.append(_DownloadFault(None))

    # ----------------------------------------------------------------- web api

    def _get_upload_url(self, call: Any) -> JSON:
        p = call.params
        name = str(p.get("filename") or "")
        try:
            length = int(p.get("length") or 0)
        except ValueError:
            raise self._api_error("invalid_arguments") from None
        if not name or length <= 0:
            raise self._api_error("missing_argument")  # Slack's answer to a length of 0 too
        if length > MAX_FILE_SIZE:
            raise self._api_error("file_upload_size_restricted")
        file = SimFile(self._new_file_id(), name, name, "application/octet-stream", self.bot_user_id, length,
                       int(time.time()))
        self._files[file.id] = file
        upload_id = secrets.token_urlsafe(24)
        self._upload_urls[upload_id] = file.id
        return {"upload_url": f"{self._origin}{UPLOAD_PATH}{upload_id}", "file_id": file.id}

    def _complete(self, call: Any) -> JSON:
        p = call.params
        entries = p.get("files")
        if isinstance(entries, str):
            try:
                entries = json.loads(entries)
            except ValueError:
                raise self._api_error("invalid_arguments") from None
        if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
            raise self._api_error("invalid_arguments")
        files = [self._files.get(str(e.get("id") or "")) for e in entries]
        if any(f is None or f.user != self.bot_user_id or f.data is None for f in files):
            raise self._api_error("file_not_found")
        channel = str(p.get("channel_id") or "")
        if channel and channel[:1] not in ("C", "G", "D"):
            raise self._api_error("channel_not_found")
        comment = str(p.get("initial_comment") or "")
        if len(comment) > MAX_COMMENT_LENGTH:
            raise self._api_error("msg_too_long")
        thread_ts = str(p["thread_ts"]) if p.get("thread_ts") else None
        done: list[SimFile] = []
        for entry, file in zip(entries, files, strict=True):
            assert file is not None
            file.title = str(entry.get("title") or file.name)
            file.completed = True
            done.append(file)
        if channel:
            ts = self._bot_posts(channel, comment, thread_ts, p,
                                 files=[f.to_json(self._origin, self.team_id) for f in done]).ts
            for file in done:
                file.shares.append(Share(channel, ts, thread_ts, time.monotonic() + self.share_lag))
        return {"files": [self._file_json(f) for f in done]}

    def _file_info(self, call: Any) -> JSON:
        file = self._files.get(str(call.params.get("file") or ""))
        if file is None or not file.completed:
            raise self._api_error("file_not_found")
        return {"file": self._file_json(file), "comments": [], "response_metadata": {"next_cursor": ""}}

    def _file_json(self, file: SimFile) -> JSON:
        """The file with the shares that show now, and the conversations they are in."""
        now = time.monotonic()
        shares: dict[str, dict[str, list[JSON]]] = {}
        for share in file.shares:
            if share.shown_t <= now:
                visibility = "public" if share.channel.startswith("C") else "private"
                shares.setdefault(visibility, {}).setdefault(share.channel, []).insert(
                    0, share.to_json(self.team_id, file.user))  # newest first, as Slack lists them
        shown = {s.channel for s in file.shares if s.shown_t <= now}
        return {**file.to_json(self._origin, self.team_id), "shares": shares,
                "channels": sorted(c for c in shown if c.startswith("C")),
                "groups": sorted(c for c in shown if c.startswith("G")),
                "ims": sorted(c for c in shown if c.startswith("D"))}

    # ----------------------------------------------------------------- upload URLs and private URLs

    async def _handle_upload(self, request: web.Request) -> web.Response:
        file = self._files.get(self._upload_urls.get(request.match_info["upload_id"], ""))
        if file is None:
            return web.Response(status=404, text="upload not found")
        if request.content_type == "multipart/form-data":
            form = await request.post()
            part = form.get("file") or form.get("filename")
            data = part.file.read() if isinstance(part, web.FileField) else str(part or "").encode()
        else:
            data = await request.read()
        ok = len(data) == file.length and not file.completed
        self._uploads.append(Upload(file.id, data, request.content_type, request.headers.get("Authorization"),
                                    200 if ok else 400))
        self._changed()
        if not ok:
            return web.Response(status=400, text=f"length {len(data)} is not the {file.length} announced"
                                if len(data) != file.length else "upload already completed")
        file.data = data
        return web.Response(text=f"OK - {len(data)}")

    async def _handle_download(self, request: web.Request) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        record = Download(request.path, header[7:] if header.startswith("Bearer ") else None, 200, "file")
        self._downloads.append(record)
        self._changed()
        team, _, file_id = request.match_info["ref"].partition("-")
        file = self._files.get(file_id) if team == self.team_id else None
        if self._download_faults:
            fault = self._download_faults.popleft()
            if fault.status is None and file is not None:
                return await self._stream_endlessly(request, record, file)
            record.status, record.served = fault.status or 500, "fault"
            if record.status in (301, 302, 303, 307, 308):
                raise web.HTTPFound(f"{self._origin}/?redirect={quote(request.path)}")
            return web.Response(status=record.status, text="<html><body>Slack is having trouble</body></html>",
                                content_type="text/html")
        if record.token != self.bot_token or "files:read" not in self.scopes:
            record.served = "sign-in page"
            return web.Response(text=LOGIN_PAGE, content_type="text/html")
        if file is None or file.data is None or not file.completed:
            record.status, record.served = 404, "not found"
            return web.Response(status=404, text="<html><body>File not found</body></html>", content_type="text/html")
        headers = {}
        if request.match_info["rest"].startswith("download/"):
            headers["Content-Disposition"] = f"attachment; filename=\"{quote(file.name)}\""
        record.bytes_sent = len(file.data)
        return web.Response(body=file.data, content_type=file.mimetype, headers=headers)

    async def _stream_endlessly(self, request: web.Request, record: Download, file: SimFile) -> web.StreamResponse:
        record.served = "stream"
        response = web.StreamResponse(headers={"Content-Type": file.mimetype})
        response.enable_chunked_encoding()
        await response.prepare(request)
        chunk = bytes(_STREAM_CHUNK)
        try:
            while record.bytes_sent < _STREAM_CAP:
                await response.write(chunk)
                record.bytes_sent += len(chunk)
        except ConnectionError:
            record.hung_up = True
        self._changed()
        return response

    def _new_file_id(self) -> str:
        return "F" + secrets.token_hex(5).upper()
