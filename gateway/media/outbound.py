"""Files and voice sent back: what ``send_file`` asked for and spoken answers, made into the file parts stored with
the answer (gateway/runs.py), so they are delivered through the outbox like text: durable, in the chat's order,
once where the platform allows. Also the loader that shows a workspace image to a model that sees."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from markdown_it import MarkdownIt

from gateway.config.media import MediaSettings
from gateway.config.sections import ModelSettings
from gateway.media.audio import media_client, speak
from gateway.media.documents import safe_name
from gateway.media.errors import MediaError
from gateway.media.images import data_url, prepare_image
from gateway.media.sniff import sniff
from gateway.store import FilePart
from platforms.base import BasePlatformAdapter
from platforms.files import OUTGOING_KINDS, OutgoingKind
from tools.workspace import resolve_in_workspace

logger = logging.getLogger(__name__)

VOICE_NAME = "answer.ogg"
_BREAKS = ("softbreak", "hardbreak")
_SPOKEN = ("text", "code_inline", *_BREAKS)


def upload_limits(adapter: BasePlatformAdapter | None, chat_id: str | None) -> str:
    """The largest file of each kind the chat takes, as JSON (for ``send_file``'s check, through the sandbox's
    plain-valued context; ``{}``: none)."""
    limits = {kind: adapter.upload_limit(kind, chat_id) for kind in sorted(OUTGOING_KINDS)} if adapter else {}
    return json.dumps(limits)


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MB" if n >= 1024 * 1024 else f"{n} bytes"


def file_part(kind: OutgoingKind, name: str, mime: str, data: bytes) -> FilePart:
    """A file part with its bytes and their digest."""
    return FilePart(kind, name, mime, len(data), hashlib.sha256(data).hexdigest(), data)


async def requested_files(requests: Sequence[Mapping[str, str]], workspace: Path, adapter: BasePlatformAdapter,
                          chat_id: str) -> tuple[list[tuple[FilePart, str]], list[str]]:
    """The files ``send_file`` asked for, read now (each with its caption), and a line for the user per file that
    cannot go (gone since, or over the platform's limit for how it would be shown)."""
    parts: list[tuple[FilePart, str]] = []
    notes: list[str] = []
    for request in requests:
        shown = request["path"]
        try:
            path = resolve_in_workspace(workspace, shown)
            data = await asyncio.to_thread(path.read_bytes)
        except (OSError, ValueError) as exc:
            notes.append(f"⚠️ {shown} was not sent: {getattr(exc, 'strerror', None) or exc}.")
            continue
        found = sniff(data, path.name, None)
        kind: OutgoingKind = "document"
        if request["as"] != "auto":
            kind = request["as"]  # type: ignore[assignment]
        elif found.kind == "image" and len(data) <= adapter.upload_limit("photo", chat_id):
            kind = "photo"
        limit = adapter.upload_limit(kind, chat_id)
        if len(data) > limit:
            notes.append(f"⚠️ {shown} was not sent: it is {_size(len(data))} and {adapter.name} takes files of at "
                         f"most {_size(limit)}.")
            continue
        name = safe_name(path.name, "file", found.ext)
        parts.append((file_part(kind, name, found.mime, data), request["caption"]))
    return parts, notes


def spoken_text(markdown: str) -> str:
    """What a voice answer reads: the answer's words without Markdown markup, code blocks left out."""
    words: list[str] = []
    for token in MarkdownIt("commonmark").parse(markdown):
        if token.type == "inline" and token.children is not None:
            words.append("".join(" " if child.type in _BREAKS else child.content for child in token.children
                                 if child.type in _SPOKEN))
    return "\n".join(w for w in words if w.strip())


async def voice_answer(answer: str, settings: MediaSettings, model: ModelSettings) -> FilePart | None:
    """The answer spoken (OGG/Opus) through ``media.speech``; None when it is too long, has nothing to say aloud, or
    the speech endpoint failed (the text answer still goes; the failure is logged)."""
    endpoint = settings.speech
    text = spoken_text(answer)
    if endpoint is None or not text or len(text) > endpoint.max_chars:
        return None
    client = media_client(endpoint, model)
    try:
        audio = await speak(client, endpoint, text)
    except MediaError as exc:
        logger.warning("voice answer not made: %s", exc)
        return None
    finally:
        await client.close()
    return file_part("voice", VOICE_NAME, "audio/ogg", audio)


class ImageLoader:
    """Loads a workspace image for a model that sees (``Agent.show_image``): confined to the workspace, downscaled
    and stripped of metadata like an incoming photo."""

    def __init__(self, settings: MediaSettings) -> None:
        self.max_side = settings.image_max_side

    async def __call__(self, workspace: str, path: str) -> str:
        """The image at ``path`` in ``workspace`` as a data URL; raises ValueError/OSError/MediaError."""
        data = await asyncio.to_thread(resolve_in_workspace(Path(workspace), path).read_bytes)
        return data_url(await asyncio.to_thread(prepare_image, data, self.max_side))
