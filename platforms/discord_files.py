"""Files for the Discord adapter in platforms/discord.py: attachment downloads from the CDN and upload limits.

An attachment's ``url`` is a signed CDN link (``.../attachments/{channel}/{id}/{name}?ex=..&is=..&hm=..``) that
needs no credentials and expires after about a day (then the CDN answers 404). Only Discord's own hosts are asked
for it (cdn.discordapp.com and media.discordapp.net next to discord.com, else the configured API base's origin, a
self-hosted or simulated API), never a redirect: an event's URL must not make the bot fetch from anywhere else.

Uploads go with the message create (``discord.File``: multipart ``payload_json`` + ``files[0]``); a file may be
as large as the channel's guild allows with its boosts (``Guild.filesize_limit``), else Discord's default of
10 MiB, which is also the limit in DMs and whenever the guild is not known. ``FilesMixin`` gives the adapter its
``upload_limit``, ``fetch_attachment`` and ``send_file``.
"""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import discord
import yarl

from platforms.base import Attachment, SendResult
from platforms.discord_interactions import NETWORK_ERRORS
from platforms.files import AttachmentTooLarge, AttachmentUnavailable, OutgoingFile, OutgoingKind, read_capped
from platforms.rich_text import to_discord

__all__ = ["DEFAULT_UPLOAD_LIMIT", "DISCORD_CDN_HOSTS", "AttachmentDownloader", "FilesMixin"]

DEFAULT_UPLOAD_LIMIT = discord.utils.DEFAULT_FILE_SIZE_LIMIT_BYTES
"""Discord's per-file upload limit without boosts (10 MiB since 2024; 8 MiB before 2023)."""
DISCORD_CDN_HOSTS = frozenset({"cdn.discordapp.com", "media.discordapp.net"})
_DISCORD_API_HOST = "discord.com"
_CONNECT_TIMEOUT = 30.0
_READ_TIMEOUT = 30.0  # between two chunks
_DOWNLOAD_TIMEOUT = 600.0  # a whole download, however slowly it trickles in
_Origin = tuple[str, str, int | None]


def _origin(url: yarl.URL) -> _Origin:
    return url.scheme, (url.host or "").lower(), url.port


class AttachmentDownloader:
    """Downloads attachments from Discord's CDN for the API at ``api_base_url``, on its own HTTP session."""

    def __init__(self, api_base_url: str) -> None:
        api = yarl.URL(api_base_url)
        self._origins: frozenset[_Origin] = frozenset({_origin(api)})
        if (api.host or "").lower() == _DISCORD_API_HOST:
            self._origins |= {_origin(yarl.URL(f"https://{host}")) for host in DISCORD_CDN_HOSTS}
        self._session: aiohttp.ClientSession | None = None

    def trusted(self, url: str) -> bool:
        """Whether ``url`` is on one of the hosts attachments are fetched from."""
        try:
            parsed = yarl.URL(url)
        except ValueError:
            return False
        return parsed.absolute and parsed.user is None and _origin(parsed) in self._origins

    async def fetch(self, attachment: Attachment, max_bytes: int) -> bytes:
        """The attachment's bytes, reading at most ``max_bytes + 1`` of them.

        Raises AttachmentTooLarge (before any request when its size is known, else when the CDN's Content-Length
        or the bytes read pass the limit) or AttachmentUnavailable (retryable for a 429, a 5xx and the network)."""
        name = attachment.name or attachment.file_id
        if attachment.size is not None and attachment.size > max_bytes:
            raise AttachmentTooLarge(f"{name} is {attachment.size} bytes, over the limit of {max_bytes}")
        if not attachment.url or not self.trusted(attachment.url):
            raise AttachmentUnavailable(f"{name}: its link is not on Discord's CDN")
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
                total=_DOWNLOAD_TIMEOUT, sock_connect=_CONNECT_TIMEOUT, sock_read=_READ_TIMEOUT))
        try:
            async with self._session.get(yarl.URL(attachment.url, encoded=True), allow_redirects=False) as response:
                if response.status != 200:
                    retryable = response.status == 429 or response.status >= 500
                    gone = " (gone, or its link expired)" if response.status in (403, 404, 410) else ""
                    raise AttachmentUnavailable(f"{name}: Discord's CDN answered HTTP {response.status}{gone}",
                                                retryable=retryable)
                return await read_capped(response, max_bytes, name)
        except NETWORK_ERRORS as exc:
            raise AttachmentUnavailable(f"{name}: the download failed ({exc!r})", retryable=True) from exc

    async def close(self) -> None:
        """Close the HTTP session (a later fetch opens a new one)."""
        if self._session is not None:
            await self._session.close()
            self._session = None


class FilesMixin:
    """The Discord adapter's files; ``DiscordAdapter`` provides its REST plumbing and ``_downloads``."""

    # Provided by DiscordAdapter.
    _client: discord.Client | None
    _downloads: AttachmentDownloader
    _channel: Callable[[str, Mapping[str, str] | None], discord.PartialMessageable | SendResult]
    _send_options: Callable[[discord.PartialMessageable, int | None, Mapping[str, str] | None], dict[str, Any]]
    _request: Callable[[Callable[[], Awaitable[discord.Message | None]], str], Awaitable[SendResult]]

    def upload_limit(self, kind: OutgoingKind, chat_id: str | None = None) -> int:
        """The largest file the bot may send (of any ``kind``): in ``chat_id``, its guild's limit with boosts when
        the gateway client has the channel cached; else Discord's default, 10 MiB."""
        return self._limit_in(int(chat_id) if chat_id and chat_id.isdecimal() else None)

    async def fetch_attachment(self, attachment: Attachment, max_bytes: int) -> bytes:
        """Download an event's attachment from Discord's CDN (see ``AttachmentDownloader.fetch``)."""
        return await self._downloads.fetch(attachment, max_bytes)

    async def send_file(self, chat_id: str, file: OutgoingFile, caption: str = "", reply_to: str | None = None,
                        metadata: Mapping[str, str] | None = None) -> SendResult:
        """Post one message with ``file`` attached and the caption as its text, replying and in the thread as
        ``send`` does and as exactly once (the same nonce); one over the channel's limit is refused unsent. A file
        replying to a slash command (``interaction:<id>``) goes to the channel: text parts answer the command."""
        channel = self._channel(chat_id, metadata)
        if isinstance(channel, SendResult):
            return channel
        if file.size > (limit := self._limit_in(channel.id)):
            return SendResult(success=False, error=f"discord: {file.name} ({file.size} bytes) is over the upload "
                                                   f"limit here ({limit} bytes)")
        reply = int(reply_to) if reply_to and reply_to.isdecimal() else None
        options = self._send_options(channel, reply, metadata)
        upload = discord.File(io.BytesIO(file.data), filename=file.name)  # images show inline, audio is playable
        return await self._request(lambda: channel.send(to_discord(caption) or None, file=upload, **options), chat_id)

    def _limit_in(self, channel_id: int | None) -> int:
        channel = self._client.get_channel(channel_id) if self._client is not None and channel_id else None
        guild = getattr(channel, "guild", None)
        return guild.filesize_limit if isinstance(guild, discord.Guild) else DEFAULT_UPLOAD_LIMIT
