"""Slack files for ``SlackAdapter``: downloading what users share, and uploading with Slack's upload v2 flow.

Downloads: a shared file's ``url_private_download`` (or ``url_private``, or for a file the event shows only by id,
the one ``files.info`` gives) is fetched with the bot token as a Bearer header. The token only ever goes to Slack
itself: the scheme, host and port of ``api_base_url``, or its ``files.`` host (``slack.com`` → ``files.slack.com``).
Slack answers a download it does not authorize (no token, a revoked one, no ``files:read`` scope) with its sign-in
page and status 200, or a redirect to it: both are refused with a message naming the cause, never taken for the file.
The body is read in pieces and abandoned past the size limit.

Uploads: ``files.getUploadURLExternal`` → POST of the bytes to the ``upload_url`` (no token: the URL is signed) →
``files.completeUploadExternal``, which shares the file in the channel or thread with the caption as its
``initial_comment``. Before the bytes go, the file id is saved under ``slack-upload:<delivery id>``; a later attempt
of the same delivery (after a crash, or an answer lost on the way back) first asks ``files.info`` whether that file
is already shared there, so a file is shared once. Slack shares asynchronously, so the ``ts`` of the share message
is polled for briefly when the completion does not show it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from yarl import URL

from platforms.base import Attachment, PlatformState
from platforms.files import AttachmentUnavailable, OutgoingFile, read_capped

__all__ = ["UPLOAD_LIMIT", "UPLOAD_STATE_PREFIX", "download", "file_origins", "private_url", "upload"]

logger = logging.getLogger(__name__)

UPLOAD_LIMIT = 1024**3
"""Slack takes files of up to 1 GB."""
UPLOAD_STATE_PREFIX = "slack-upload:"
"""``PlatformState`` key prefix: ``slack-upload:<delivery id>`` holds the id of the file that delivery uploaded."""

_TRANSFER_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=15.0, sock_read=60.0)
_SHARE_POLL_DELAYS = (0.1, 0.2, 0.4, 0.8, 1.6)
_NO_ACCESS = "the bot token is invalid or lacks the files:read scope"
# files.info answers meaning there is no usable earlier upload to find: it was never completed, or is gone, or the
# app may not look (then the file is uploaded again: at least once rather than not at all).
_NOT_FOUND_ERRORS = frozenset({"file_not_found", "file_deleted", "missing_scope", "not_allowed_token_type"})

Origin = tuple[str, str | None, int | None]


def file_origins(api_base_url: str) -> frozenset[Origin]:
    """The origins (scheme, host, port) the bot token may be sent to for a download."""
    api = URL(api_base_url)
    return frozenset((api.scheme, host, api.port) for host in (api.host, f"files.{api.host}"))


async def private_url(client: AsyncWebClient, file_id: str) -> str:
    """The download URL of a file an event named only by id (``file_access: check_file_info``), from files.info.

    Raises SlackApiError as the Web API does, AttachmentUnavailable when the file has no URL."""
    info = (await client.files_info(file=file_id)).get("file") or {}
    url = info.get("url_private_download") or info.get("url_private")
    if not url:
        raise AttachmentUnavailable(f"slack: file {file_id} has no download URL (an external or hidden file)")
    return str(url)


async def download(session: aiohttp.ClientSession, token: str, origins: frozenset[Origin], attachment: Attachment,
                   url: str, max_bytes: int) -> bytes:
    """The bytes at ``url``, fetched with the bot token.

    Raises AttachmentUnavailable (a URL off Slack, the sign-in page, an HTTP error: retryable for 5xx and 429),
    AttachmentTooLarge past ``max_bytes`` (having read at most ``max_bytes + 1`` bytes), and aiohttp's errors or
    TimeoutError for the network."""
    target = URL(url)
    if (target.scheme, target.host, target.port) not in origins:
        raise AttachmentUnavailable(f"slack: the file's URL is not on Slack ({target.scheme}://{target.host}); "
                                    "the bot token is not sent there")
    async with session.get(target, headers={"Authorization": f"Bearer {token}"}, allow_redirects=False,
                           timeout=_TRANSFER_TIMEOUT) as response:
        _check(response, attachment)
        return await read_capped(response, max_bytes, f"slack: {attachment.name or attachment.file_id}")


def _check(response: aiohttp.ClientResponse, attachment: Attachment) -> None:
    status = response.status
    if 300 <= status < 400:
        raise AttachmentUnavailable(f"slack: the download was redirected (to {response.headers.get('Location')}, "
                                    f"Slack's sign-in): {_NO_ACCESS}")
    if status >= 400:
        raise AttachmentUnavailable(f"slack: the download failed (HTTP {status})",
                                    retryable=status >= 500 or status == 429)
    if response.content_type == "text/html" and attachment.mime_type != "text/html":
        raise AttachmentUnavailable(f"slack: Slack answered with its sign-in page instead of the file: {_NO_ACCESS}")


async def upload(client: AsyncWebClient, session: aiohttp.ClientSession, state: PlatformState | None, chat_id: str,
                 file: OutgoingFile, *, comment: str, thread: str | None, delivery: str | None) -> str | None:
    """Share ``file`` in ``chat_id`` (in ``thread``) with the mrkdwn ``comment``, once per ``delivery``.

    Returns the ``ts`` of the share message (None if Slack did not show it within a few seconds). Raises
    SlackApiError, and aiohttp's errors or TimeoutError (an upload URL refusing the bytes among them)."""
    key = f"{UPLOAD_STATE_PREFIX}{delivery}" if delivery and state is not None else None
    earlier = await state.load(key) if state is not None and key else None
    if earlier and (ts := await _shared_before(client, earlier, chat_id, thread)) is not None:
        logger.info("slack: %s was already shared in %s before (file %s, ts %s); not uploading it again",
                    delivery, chat_id, earlier, ts)
        return ts
    ticket = await client.files_getUploadURLExternal(filename=file.name, length=file.size)
    file_id = str(ticket["file_id"])
    if state is not None and key:
        await state.save(key, file_id)
    async with session.post(ticket["upload_url"], data=file.data, timeout=_TRANSFER_TIMEOUT) as response:
        response.raise_for_status()
    done = await client.files_completeUploadExternal(files=[{"id": file_id, "title": file.name}], channel_id=chat_id,
                                                     initial_comment=comment or None, thread_ts=thread)
    completed = next((f for f in done.get("files") or () if f.get("id") == file_id), {})
    return _share_ts(completed, chat_id, thread) or await _awaited_share(client, file_id, chat_id, thread)


async def _shared_before(client: AsyncWebClient, file_id: str, chat_id: str, thread: str | None) -> str | None:
    """The share message of an earlier attempt's file, if that file is shared in the chat (or soon shows so)."""
    try:
        info = await client.files_info(file=file_id)
    except SlackApiError as exc:
        data = exc.response.data
        error = data.get("error") if isinstance(data, dict) else None
        if error not in _NOT_FOUND_ERRORS:
            raise  # the answer is unknown: try again later rather than risk a second share
        logger.info("slack: the earlier upload %s cannot be found (%s); uploading again", file_id, error)
        return None
    return _share_ts(info.get("file") or {}, chat_id, thread) or await _awaited_share(client, file_id, chat_id, thread)


async def _awaited_share(client: AsyncWebClient, file_id: str, chat_id: str, thread: str | None) -> str | None:
    """Poll files.info for the file's share in the chat; None when it does not show (or cannot be looked at)."""
    for delay in _SHARE_POLL_DELAYS:
        await asyncio.sleep(delay)
        try:
            info = await client.files_info(file=file_id)
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            logger.warning("slack: cannot look up the share of file %s (%s)", file_id, exc)
            return None
        if (ts := _share_ts(info.get("file") or {}, chat_id, thread)) is not None:
            return ts
    logger.warning("slack: file %s shows no share in %s yet; its message id is unknown", file_id, chat_id)
    return None


def _share_ts(file: Mapping[str, Any], chat_id: str, thread: str | None) -> str | None:
    """The ``ts`` of the file's share message in the chat (top level, or in ``thread``), from its ``shares``."""
    shares = file.get("shares") or {}
    for visibility in ("public", "private"):
        for share in (shares.get(visibility) or {}).get(chat_id) or ():
            in_thread = share.get("thread_ts")
            if (in_thread == thread) if thread else in_thread in (None, share.get("ts")):
                return str(share["ts"])
    return None
