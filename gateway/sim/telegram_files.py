"""The Telegram simulator's files: what users send, getFile and the file download, and the bot's uploads.

``TelegramSimulator`` mixes this in. Files are kept with their bytes; ``getFile`` answers a ``file_path`` served at
``/file/bot<token>/<file_path>`` (and ``file_size``, unless the file was added with ``sized=False``), or Telegram's
``Bad Request: file is too big`` above ``download_limit`` (20 MB). sendPhoto, sendDocument, sendVoice and sendAudio
take a multipart upload (or a known file_id); the caption is validated and parsed like sendMessage's text (0-1024
characters after entities parsing); a reply and a topic work as for text. A voice note must be OGG/Opus, MP3 or M4A
of at most ``voice_note_limit`` (1 MB), else Telegram shows it as a document, as here. Uploads above ``upload_limit``
(50 MB) get 413, photos above ``photo_upload_limit`` (10 MB) a 400.

Drivers: ``user_sends_photo`` / ``_document`` / ``_voice`` / ``_audio``, ``add_file``. Readers: ``sent_media``
(``Sent.files`` holds the uploads), ``downloads``. Knobs: ``chunked_downloads`` (no Content-Length), the limits above.
Download faults: ``fail_next_download(status)``, ``drop_next_download()``.
"""

from __future__ import annotations

import functools
import mimetypes
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Literal, Unpack

from aiohttp import web

from gateway.sim.downloads import Download, drop, recorded, stream

if TYPE_CHECKING:
    from gateway.sim.telegram_api import Call, Origin, Sent

__all__ = ["FAKE_JPEG", "MAX_CAPTION_LENGTH", "Download", "FilesMixin", "UploadedFile"]

JSON = dict[str, Any]
MediaKey = Literal["photo", "document", "voice", "audio"]

MAX_CAPTION_LENGTH = 1024
MB = 1_000_000
FAKE_JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x00" * 32 + b"\xff\xd9"
_FOLDERS: dict[str, str] = {"photo": "photos", "voice": "voice", "audio": "music"}  # else "documents"
_DROP = 0  # a download fault that closes the connection instead of answering


@dataclass(slots=True, frozen=True)
class UploadedFile:
    """A file part of a multipart request."""

    field: str
    filename: str | None
    content_type: str | None
    data: bytes


@dataclass(slots=True)
class StoredFile:
    """A file the simulator keeps; ``sized``: getFile states its ``file_size``."""

    file_id: str
    file_unique_id: str
    file_path: str
    data: bytes
    sized: bool = True


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"Error {status}"


def _is_voice(data: bytes) -> bool:
    """OGG (Opus), MP3 or M4A: what Telegram shows as a voice note."""
    return data.startswith((b"OggS", b"ID3", b"\xff\xfb", b"\xff\xf3", b"\xff\xf2")) or data[4:8] == b"ftyp"


class FilesMixin:
    """Files, getFile, downloads and uploads for ``TelegramSimulator`` (which provides messages and errors)."""

    download_limit: int = 20 * MB
    """Largest file getFile hands out (larger: ``Bad Request: file is too big``)."""
    upload_limit: int = 50 * MB
    """Largest file a bot may upload (larger: 413 Request Entity Too Large)."""
    photo_upload_limit: int = 10 * MB
    """Largest photo sendPhoto takes (larger: 400)."""
    voice_note_limit: int = 1 * MB
    """Largest upload sendVoice shows as a voice note (larger: as a document)."""
    chunked_downloads: bool = False
    """Serve downloads without Content-Length: a client learns the size only by reading."""

    # Provided by TelegramSimulator.
    _sent: list[Sent]
    _changed: Callable[[], None]
    _api_error: Callable[[int, str], Exception]
    _json_response: Callable[[int, JSON], web.Response]
    _resolve_chat: Callable[[JSON], JSON]
    _format: Callable[..., tuple[str, list[JSON]]]
    _bot_message: Callable[[Call, JSON, JSON], JSON]
    _origin: Callable[[Origin], tuple[JSON, JSON]]
    _user_message: Callable[[JSON, JSON, Origin, int | None, JSON], JSON]
    _caption_fields: Callable[[str | None], JSON]
    push_update: Callable[[JSON], JSON]
    token: str

    def __init__(self) -> None:
        super().__init__()
        self._files: dict[str, StoredFile] = {}
        self._files_by_path: dict[str, StoredFile] = {}
        self._file_seq = 0
        self._downloads: list[Download] = []
        self._download_faults: deque[int] = deque()

    # ----------------------------------------------------------------- readers and faults

    def sent_media(self, chat_id: int | None = None) -> list[Sent]:
        """Messages that sendPhoto / sendDocument / sendVoice / sendAudio created; ``Sent.files`` holds the uploads."""
        return [s for s in self._sent if s.method != "sendMessage" and chat_id in (None, s.chat_id)]

    @property
    def downloads(self) -> list[Download]:
        """Every request to the file endpoint, in arrival order."""
        return list(self._downloads)

    def fail_next_download(self, status: int = 404, n: int = 1) -> None:
        """Answer the next ``n`` downloads with HTTP ``status`` (e.g. 404: the link expired; 500)."""
        self._download_faults.extend([status] * n)

    def drop_next_download(self, n: int = 1) -> None:
        """Close the connection without answering the next ``n`` downloads."""
        self._download_faults.extend([_DROP] * n)

    # ----------------------------------------------------------------- drivers

    def user_sends_photo(self, data: bytes = FAKE_JPEG, caption: str | None = None, **origin: Unpack[Origin]) -> JSON:
        """A user sends a photo; its sizes are downloadable through getFile."""
        return self._user_sends({"photo": self._photo_sizes(data)}, caption, origin)

    def user_sends_document(self, data: bytes, file_name: str = "document.txt", mime_type: str | None = None,
                            caption: str | None = None, **origin: Unpack[Origin]) -> JSON:
        """A user sends a document; it is downloadable through getFile."""
        return self._user_sends({"document": self._document(data, file_name, mime_type)}, caption, origin)

    def user_sends_voice(self, data: bytes, duration: int = 1, caption: str | None = None,
                         **origin: Unpack[Origin]) -> JSON:
        """A user sends a voice note (OGG/Opus); it is downloadable through getFile."""
        stored = self._store_file(data, "voice", "voice.oga")
        return self._user_sends({"voice": self._voice(stored, "audio/ogg", duration)}, caption, origin)

    def user_sends_audio(self, data: bytes, file_name: str = "audio.mp3", mime_type: str | None = None,
                         duration: int = 1, caption: str | None = None, **origin: Unpack[Origin]) -> JSON:
        """A user sends an audio file (a playable track, not a voice note); it is downloadable through getFile."""
        stored = self._store_file(data, "music", file_name)
        return self._user_sends({"audio": self._audio(stored, file_name, mime_type, duration)}, caption, origin)

    def add_file(self, data: bytes, file_name: str = "file.bin", folder: str = "documents", *,
                 sized: bool = True) -> str:
        """Register bytes for getFile + download; returns the file_id. ``sized=False``: getFile leaves out
        ``file_size`` (it is optional in the Bot API)."""
        stored = self._store_file(data, folder, file_name)
        stored.sized = sized
        return stored.file_id

    def _user_sends(self, fields: JSON, caption: str | None, origin: Origin) -> JSON:
        user, chat = self._origin(origin)
        fields.update(self._caption_fields(caption))
        return self.push_update({"message": self._user_message(user, chat, origin, None, fields)})

    # ----------------------------------------------------------------- the file model

    def _store_file(self, data: bytes, folder: str, file_name: str) -> StoredFile:
        self._file_seq += 1
        seq = self._file_seq
        ext = ("." + file_name.rsplit(".", 1)[1]) if "." in file_name else ""
        stored = StoredFile(file_id=f"BQACAgIAAxkBAAI{seq:06d}", file_unique_id=f"AgAD{seq:06d}",
                            file_path=f"{folder}/file_{seq}{ext}", data=data)
        self._files[stored.file_id] = stored
        self._files_by_path[stored.file_path] = stored
        return stored

    def _photo_sizes(self, data: bytes, stored: StoredFile | None = None) -> list[JSON]:
        thumb = self._store_file(data, "photos", "photo.jpg")
        full = stored or self._store_file(data, "photos", "photo.jpg")
        return [
            {"file_id": f.file_id, "file_unique_id": f.file_unique_id, "file_size": len(data), "width": w, "height": h}
            for f, w, h in ((thumb, 90, 68), (full, 1280, 960))
        ]

    def _document(self, data: bytes, file_name: str, mime_type: str | None, stored: StoredFile | None = None) -> JSON:
        f = stored or self._store_file(data, "documents", file_name)
        return {"file_id": f.file_id, "file_unique_id": f.file_unique_id, "file_name": file_name,
                "mime_type": mime_type or mimetypes.guess_type(file_name)[0] or "application/octet-stream",
                "file_size": len(data)}

    @staticmethod
    def _voice(stored: StoredFile, mime_type: str, duration: int) -> JSON:
        return {"file_id": stored.file_id, "file_unique_id": stored.file_unique_id, "duration": duration,
                "mime_type": mime_type, "file_size": len(stored.data)}

    def _audio(self, stored: StoredFile, file_name: str, mime_type: str | None, duration: int) -> JSON:
        return {**self._document(stored.data, file_name, mime_type, stored), "duration": duration}

    # ----------------------------------------------------------------- methods

    async def _get_file(self, call: Call) -> JSON:
        stored = self._files.get(str(call.params.get("file_id") or ""))
        if stored is None:
            raise self._api_error(400, "Bad Request: invalid file_id")
        if len(stored.data) > self.download_limit:
            raise self._api_error(400, "Bad Request: file is too big")
        file: JSON = {"file_id": stored.file_id, "file_unique_id": stored.file_unique_id,
                      "file_path": stored.file_path}
        if stored.sized:
            file["file_size"] = len(stored.data)
        return file

    async def _send_photo(self, call: Call) -> JSON:
        return await self._send_media(call, "photo")

    async def _send_document(self, call: Call) -> JSON:
        return await self._send_media(call, "document")

    async def _send_voice(self, call: Call) -> JSON:
        return await self._send_media(call, "voice")

    async def _send_audio(self, call: Call) -> JSON:
        return await self._send_media(call, "audio")

    async def _send_media(self, call: Call, key: MediaKey) -> JSON:
        p = call.params
        chat = self._resolve_chat(p)
        caption, caption_entities = self._format(
            p.get("caption"), p.get("parse_mode"), p.get("caption_entities"), limit=MAX_CAPTION_LENGTH, what="caption")
        stored, upload = self._media_input(call, key)
        fields = self._media_fields(key, stored, upload, p)
        if caption:
            fields["caption"] = caption
            if caption_entities:
                fields["caption_entities"] = caption_entities
        return self._bot_message(call, chat, fields)

    def _media_fields(self, key: MediaKey, stored: StoredFile, upload: UploadedFile | None, params: JSON) -> JSON:
        """The message fields showing a sent file, as Telegram shows its kind."""
        name = (upload.filename if upload else None) or stored.file_path.rsplit("/", 1)[-1]
        mime_type = upload.content_type if upload else None
        duration = int(params.get("duration") or 0)
        if key == "photo":
            return {"photo": self._photo_sizes(stored.data, stored)}
        if key == "voice" and _is_voice(stored.data) and len(stored.data) <= self.voice_note_limit:
            return {"voice": self._voice(stored, mime_type or "audio/ogg", duration)}
        if key == "audio":
            return {"audio": self._audio(stored, name, mime_type, duration)}
        return {"document": self._document(stored.data, name, mime_type, stored)}

    def _media_input(self, call: Call, key: MediaKey) -> tuple[StoredFile, UploadedFile | None]:
        value = call.params.get(key)
        if value is None or value == "":
            raise self._api_error(400, f"Bad Request: there is no {key} in the request")
        value = str(value)
        if value.startswith("attach://"):
            upload = call.files.get(value.removeprefix("attach://"))
            if upload is None:
                raise self._api_error(400, f"Bad Request: there is no {key} in the request")
            if len(upload.data) > self.upload_limit:
                raise self._api_error(413, "Request Entity Too Large")
            if key == "photo" and len(upload.data) > self.photo_upload_limit:
                raise self._api_error(400, "Bad Request: PHOTO_SAVE_FILE_INVALID")
            folder = _FOLDERS.get(key, "documents")
            return self._store_file(upload.data, folder, upload.filename or f"{key}.bin"), upload
        if value in self._files:
            return self._files[value], None
        if value.startswith(("http://", "https://")):
            # Not fetched: the simulator stays offline.
            return self._store_file(b"", "documents", value.rsplit("/", 1)[-1] or "file.bin"), None
        raise self._api_error(400, "Bad Request: wrong file identifier/HTTP URL specified")

    # ----------------------------------------------------------------- the file endpoint

    async def _handle_file(self, request: web.Request) -> web.StreamResponse:
        download = Download(request.match_info["path"], time.monotonic())
        return await recorded(self._downloads, download, self._changed, functools.partial(self._serve, request))

    async def _serve(self, request: web.Request, download: Download) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            download.status = 401
            return self._json_response(401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
        fault = self._download_faults.popleft() if self._download_faults else None
        if fault == _DROP:
            return await drop(request)
        stored = self._files_by_path.get(download.path)
        status = fault or (200 if stored is not None else 404)
        if stored is None or status != 200:
            download.status = status
            return self._json_response(status, {"ok": False, "error_code": status, "description": _reason(status)})
        return await stream(request, download, stored.data, "application/octet-stream",
                            chunked=self.chunked_downloads)

