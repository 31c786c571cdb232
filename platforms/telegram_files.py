"""Files for the Telegram adapter in platforms/telegram.py: attachment downloads and sending files.

An attachment is fetched with getFile, which hands out a ``file_path`` for files of up to 20 MB (larger: "Bad
Request: file is too big"), then downloaded from ``base_file_url`` on the adapter's own HTTP client. That URL carries
the bot token, so it is never logged or put in an error. The download stops as soon as it passes the limit.

Sending is one multipart upload: sendPhoto (at most 10 MB), sendDocument, sendVoice and sendAudio (at most 50 MB; a
voice note over 1 MB shows as a file), the caption formatted as ``send`` formats text. The Bot API can neither look a
message up nor drop a repeat, so a file in doubt is sent again, as text is: at least once. ``FilesMixin`` gives the
adapter its ``upload_limit``, ``fetch_attachment`` and ``send_file``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx
from telegram import Bot, InputFile
from telegram.constants import FileSizeLimit, MessageLimit
from telegram.error import BadRequest, NetworkError, RetryAfter, TelegramError
from telegram.ext import Application

from platforms.base import Attachment, SendResult, split_message
from platforms.files import AttachmentTooLarge, AttachmentUnavailable, OutgoingFile, OutgoingKind

__all__ = ["PHOTO_UPLOAD_LIMIT", "UPLOAD_LIMIT", "AttachmentDownloader", "FilesMixin"]

PHOTO_UPLOAD_LIMIT = int(FileSizeLimit.PHOTOSIZE_UPLOAD)
"""Largest photo sendPhoto takes (10 MB)."""
UPLOAD_LIMIT = int(FileSizeLimit.FILESIZE_UPLOAD)
"""Largest file of any other kind a bot may upload (50 MB)."""
MAX_CAPTION = int(MessageLimit.CAPTION_LENGTH)
_TIMEOUT = httpx.Timeout(30.0, connect=10.0)  # per connect / read / write, not for a whole download
# kind -> the Bot API method and its file parameter (PTB's method is the parameter's send_<name>)
_METHODS: dict[OutgoingKind, tuple[str, str]] = {
    "photo": ("sendPhoto", "photo"), "document": ("sendDocument", "document"),
    "voice": ("sendVoice", "voice"), "audio": ("sendAudio", "audio")}


def _retryable(exc: TelegramError) -> bool:
    """A getFile failure a later try may get past: flood control, a timeout, the network, a 5xx."""
    return isinstance(exc, RetryAfter) or (isinstance(exc, NetworkError) and not isinstance(exc, BadRequest))


class AttachmentDownloader:
    """getFile and the file download for ``bot``, never more than ``limit`` bytes (``max_attachment_bytes``)."""

    def __init__(self, bot: Bot, limit: int) -> None:
        self._bot = bot
        self._limit = limit
        self._client: httpx.AsyncClient | None = None

    async def fetch(self, attachment: Attachment, max_bytes: int) -> bytes:
        """The attachment's bytes, at most ``min(max_bytes, limit)`` of them.

        Raises AttachmentTooLarge (before downloading when the event's or getFile's size says so, else as soon as the
        Content-Length or the bytes read pass the limit: at most one network chunk past it is held), or
        AttachmentUnavailable: retryable for flood control, timeouts, the network and 5xx; not for a file gone, one
        over the Bot API's 20 MB or any other refusal."""
        cap = min(max_bytes, self._limit)
        name = attachment.name or f"the {attachment.kind}"
        too_large = AttachmentTooLarge(f"telegram: {name} is over the limit of {cap} bytes")
        if attachment.size is not None and attachment.size > cap:
            raise too_large
        try:
            file = await self._bot.get_file(attachment.file_id)
        except TelegramError as exc:
            if "file is too big" in exc.message.lower():
                raise AttachmentUnavailable(f"telegram: {name} is over the Bot API's download limit of "
                                            f"{int(FileSizeLimit.FILESIZE_DOWNLOAD)} bytes") from exc
            raise AttachmentUnavailable(f"telegram: getFile for {name} failed: {exc.message}",
                                        retryable=_retryable(exc)) from exc
        if file.file_size is not None and file.file_size > cap:
            raise too_large
        if not file.file_path:
            raise AttachmentUnavailable(f"telegram: getFile gave no download path for {name}")
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=_TIMEOUT, follow_redirects=False)
        try:
            # identity: the bytes on the wire are the file's, so the limit holds for what is held in memory
            async with self._client.stream("GET", file.file_path, headers={"Accept-Encoding": "identity"}) as response:
                if response.status_code != httpx.codes.OK:
                    status = response.status_code
                    raise AttachmentUnavailable(f"telegram: the download of {name} answered HTTP {status}",
                                                retryable=status == httpx.codes.TOO_MANY_REQUESTS or status >= 500)
                length = response.headers.get("Content-Length", "")
                if length.isdecimal() and int(length) > cap:
                    raise too_large
                data = bytearray()
                async for chunk in response.aiter_raw():
                    data += chunk
                    if len(data) > cap:
                        raise too_large
                return bytes(data)
        except httpx.HTTPError as exc:  # its message never holds the URL (and the token in it)
            raise AttachmentUnavailable(f"telegram: the download of {name} failed ({type(exc).__name__})",
                                        retryable=True) from None

    async def close(self) -> None:
        """Close the HTTP client (a later fetch opens a new one)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None


class FilesMixin:
    """The Telegram adapter's files; ``TelegramAdapter`` provides the bot, the sending path and ``_downloads``."""

    # Provided by TelegramAdapter.
    _app: Application[Any, Any, Any, Any, Any, Any]
    _downloads: AttachmentDownloader
    _post: Callable[..., Awaitable[SendResult]]
    length_fn: Callable[[str], int]

    def upload_limit(self, kind: OutgoingKind, chat_id: str | None = None) -> int:
        """The Bot API's upload limits: 10 MB for a photo, 50 MB for any other file (the same in every chat)."""
        return PHOTO_UPLOAD_LIMIT if kind == "photo" else UPLOAD_LIMIT

    async def fetch_attachment(self, attachment: Attachment, max_bytes: int) -> bytes:
        """getFile, then the download (see ``AttachmentDownloader.fetch``)."""
        return await self._downloads.fetch(attachment, max_bytes)

    async def send_file(self, chat_id: str, file: OutgoingFile, caption: str = "", reply_to: str | None = None,
                        metadata: Mapping[str, str] | None = None) -> SendResult:
        """sendPhoto / sendDocument / sendVoice / sendAudio with the file uploaded under its name and type, the
        caption formatted as ``send`` formats text and cut cleanly to Telegram's 1,024 characters, replying and in
        the topic as ``send`` does. One over the upload limit is refused unsent; a file in doubt is sent again."""
        if file.size > (limit := self.upload_limit(file.kind)):
            return SendResult(False, error=f"telegram: {file.name} ({file.size} bytes) is over the upload limit for "
                                           f"a {file.kind} ({limit} bytes)")
        method, parameter = _METHODS[file.kind]
        upload = InputFile(file.data, filename=file.name)
        upload.mimetype = file.mime_type  # the sniffed type, not a guess from the name
        if self.length_fn(caption) > MAX_CAPTION:
            caption = split_message(caption, MAX_CAPTION, self.length_fn)[0]
        return await self._post(getattr(self._app.bot, f"send_{parameter}"), method, chat_id, caption, reply_to,
                                metadata, {parameter: upload}, "caption")
