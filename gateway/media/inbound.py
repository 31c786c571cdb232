"""Incoming attachments made into what the model reads.

Attachments stay platform file ids in the stored event; the run fetches them (not the ack), checks what they are
from their bytes, and keeps them in the session's folder of the workspace, where the file tools find them: images go
to a model that sees as image parts, voice is transcribed into the message, documents are saved (a PDF's text beside
it). Anything refused is said to the user in one line above the answer. A run redone after a crash finds what an
earlier attempt finished in that folder (a manifest written last marks a finished file) and fetches the rest again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.config.media import MediaKind, MediaSettings
from gateway.config.sections import ModelSettings
from gateway.media.audio import media_client, transcribe
from gateway.media.documents import pdf_text, safe_name
from gateway.media.errors import MediaError
from gateway.media.images import data_url, prepare_image
from gateway.media.sniff import sniff
from platforms.base import Attachment, BasePlatformAdapter, MessageEvent
from platforms.files import AttachmentError, AttachmentTooLarge, AttachmentUnavailable

logger = logging.getLogger(__name__)

MEDIA_DIR = "media"
"""The workspace folder that holds each session's incoming files (``media/<session>/<file>/<name>``)."""

_CLAIMED: dict[str, MediaKind] = {"photo": "image", "voice": "audio", "audio": "audio", "video": "video",
                                  "document": "document", "file": "document"}
_LABELS = {"photo": "the photo", "voice": "the voice message", "audio": "the audio file", "video": "the video",
           "document": "the file", "file": "the file"}
_FETCH_ATTEMPTS = 3
_MANIFEST = ".manifest.json"


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB"):
        if n < 1024 or unit == "MB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}".replace(".0 ", " ")
        n /= 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")


@dataclass(slots=True)
class RunInput:
    """The user's turn as the model gets it: ``text`` (the message with a line per attachment; also what the
    transcript keeps), ``images`` (data URLs for this request only), ``notices`` (lines for the user, above the
    answer)."""

    text: str
    images: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    empty: bool = False
    """Nothing for the model: no text, and every attachment refused (the run answers with ``notices`` alone)."""

    def content(self) -> str | list[dict[str, Any]]:
        """The user message's ``content`` in the OpenAI format: text, or text and image parts."""
        if not self.images:
            return self.text
        parts: list[dict[str, Any]] = [{"type": "text", "text": self.text}] if self.text else []
        return parts + [{"type": "image_url", "image_url": {"url": url}} for url in self.images]


@dataclass(slots=True)
class _Saved:
    """A fetched attachment as stored in the workspace (what its manifest records)."""

    kind: MediaKind
    path: str
    """Relative to the workspace."""
    mime: str
    size: int
    text_path: str | None = None
    note: str = ""
    archive: bool = False


class MediaPreparer:
    """Turns a message's attachments into the run's input (see the module doc)."""

    def __init__(self, settings: MediaSettings, model: ModelSettings, workspace: Path) -> None:
        self.settings, self.model, self.workspace = settings, model, workspace

    async def prepare(self, event: MessageEvent, adapter: BasePlatformAdapter | None, session_key: str, *,
                      sees_images: bool, can_analyze: bool) -> RunInput:
        """The run's input for ``event``: its text, then a line per attachment (see ``RunInput``)."""
        run_input = RunInput(event.text)
        if not event.attachments:
            return run_input
        folder = Path(MEDIA_DIR) / hashlib.sha256(session_key.encode()).hexdigest()[:12]
        lines: list[str] = []
        taken = 0
        for attachment in event.attachments:
            label = attachment.name or _LABELS[attachment.kind]
            try:
                saved = await self._saved(event.platform, attachment, adapter, folder)
                line, usable = await self._describe(saved, label, run_input, sees_images=sees_images,
                                                    can_analyze=can_analyze)
            except (AttachmentError, MediaError) as exc:  # a damaged image fails only when it is prepared
                logger.info("attachment %s of %s refused: %s", attachment.file_id, event.dedupe_key, exc)
                run_input.notices.append(f"⚠️ I could not take {label}: {exc}")
                lines.append(f"[{label} could not be read: {exc}]")
                continue
            lines.append(line)
            taken += usable
        run_input.empty = not taken and not event.text.strip()
        run_input.text = "\n\n".join(part for part in (run_input.text.strip(), *lines) if part)
        return run_input

    async def _describe(self, saved: _Saved, label: str, run_input: RunInput, *, sees_images: bool,
                        can_analyze: bool) -> tuple[str, bool]:
        """The line the model reads for one saved attachment (an image also goes into ``run_input.images``, a voice
        message's transcript into its text), and whether it gave the model anything (an untranscribed voice
        message does not)."""
        where = f"saved in the workspace at {saved.path} ({saved.mime}, {_size(saved.size)})"
        name = Path(saved.path).name
        if saved.kind == "image":
            if sees_images:
                data = (self.workspace / saved.path).read_bytes()
                prepared = await asyncio.to_thread(prepare_image, data, self.settings.image_max_side)
                run_input.images.append(data_url(prepared))
                return f"[image {name}, shown below; {where}]", True
            hint = ("use vision_analyze with this path to look at it" if can_analyze
                    else "this model cannot see images")
            return f"[image {name}, {where}; {hint}]", True
        if saved.kind == "audio":
            transcript = await self._transcript(saved, label, run_input)
            if transcript is None:
                return f"[audio {name}, {where}; it could not be transcribed]", False
            return f"[audio {name}, {where}; what it says:]\n{transcript}", True
        if saved.text_path:
            return f"[document {name}, {where}; its text: {saved.text_path}{saved.note}]", True
        if saved.archive:
            return f"[archive {name}, {where}; not unpacked]", True
        return f"[{saved.kind} {name}, {where}]", True

    async def _transcript(self, saved: _Saved, label: str, run_input: RunInput) -> str | None:
        endpoint = self.settings.transcription
        if endpoint is None:
            run_input.notices.append(f"⚠️ I cannot listen to {label}: no transcription endpoint is configured "
                                     "(media.transcription in the gateway's config).")
            return None
        client = media_client(endpoint, self.model)
        try:
            text = await transcribe(client, endpoint, (self.workspace / saved.path).read_bytes(),
                                    Path(saved.path).name, saved.mime)
        except MediaError as exc:
            run_input.notices.append(f"⚠️ I could not transcribe {label}: {exc}")
            return None
        finally:
            await client.close()
        if self.settings.show_transcript:
            run_input.notices.append(f"> 🎤 {text.strip()}")
        return text.strip()

    async def _saved(self, platform: str, attachment: Attachment, adapter: BasePlatformAdapter | None,
                     folder: Path) -> _Saved:
        """The attachment in the workspace: from an earlier attempt's manifest, else fetched and saved now."""
        home = folder / hashlib.sha256(f"{platform}:{attachment.file_id}".encode()).hexdigest()[:12]
        manifest = self.workspace / home / _MANIFEST
        if manifest.is_file():
            return _Saved(**json.loads(manifest.read_text()))
        claimed = _CLAIMED[attachment.kind]
        limit = getattr(self.settings.max_bytes, claimed)
        if limit == 0:
            raise MediaError(f"{claimed} files are not accepted here.")
        if attachment.size is not None and attachment.size > limit:
            raise AttachmentTooLarge(self._too_large(attachment.size, claimed, limit))
        if adapter is None:
            raise AttachmentUnavailable(f"the {platform} connection is not available")
        data = await self._fetch(adapter, attachment, limit)
        found = sniff(data, attachment.name, attachment.mime_type)
        if found.kind is None:
            raise MediaError(f"its type ({found.mime}) is not supported.")
        if claimed == "audio" and found.kind == "video":  # voice clips come in MP4 or WebM (Slack's do)
            found = dataclasses.replace(found, kind="audio")
        if claimed != "document" and found.kind != claimed:  # a document may be anything; a photo must be one
            raise MediaError(f"it was sent as {claimed} but its content is {found.mime}.")
        if found.kind != claimed and len(data) > (kind_limit := getattr(self.settings.max_bytes, found.kind)):
            raise AttachmentTooLarge(self._too_large(len(data), found.kind, kind_limit))
        name = safe_name(attachment.name, attachment.kind, found.ext)
        saved = _Saved(found.kind, str(home / name), found.mime, len(data), archive=found.archive)
        (self.workspace / home).mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(_write, self.workspace / saved.path, data)
        if found.mime == "application/pdf":
            await self._pdf_text(saved, data)
        await asyncio.to_thread(_write, manifest, json.dumps(_manifest(saved)).encode())
        return saved

    async def _pdf_text(self, saved: _Saved, data: bytes) -> None:
        try:
            pdf = await asyncio.to_thread(pdf_text, data, self.settings.pdf_max_pages)
        except MediaError as exc:
            saved.note = f" (no text: {exc})"
            return
        saved.text_path = saved.path + ".txt"
        await asyncio.to_thread(_write, self.workspace / saved.text_path, pdf.text.encode())
        saved.note = (f", {pdf.pages_read} of {pdf.total_pages} pages" if pdf.truncated
                      else f", {pdf.total_pages} page{'s' if pdf.total_pages != 1 else ''}")

    @staticmethod
    def _too_large(size: int | None, kind: str, limit: int) -> str:
        return f"it is {'over' if size is None else _size(size) + ', over'} the {_size(limit)} limit for {kind} files."

    async def _fetch(self, adapter: BasePlatformAdapter, attachment: Attachment, limit: int) -> bytes:
        """The attachment's bytes; a failure the platform calls passing is tried again (three tries in all)."""
        for attempt in range(1, _FETCH_ATTEMPTS + 1):
            try:
                return await adapter.fetch_attachment(attachment, limit)
            except AttachmentTooLarge as exc:
                raise AttachmentTooLarge(self._too_large(None, _CLAIMED[attachment.kind], limit)) from exc
            except AttachmentUnavailable as exc:
                if not exc.retryable or attempt == _FETCH_ATTEMPTS:
                    raise AttachmentUnavailable(f"the download failed ({exc}).") from exc
                logger.info("attachment %s: download failed (%s); trying again", attachment.file_id, exc)
                await asyncio.sleep(0.5 * attempt)
        raise AssertionError("unreachable")


def _manifest(saved: _Saved) -> dict[str, Any]:
    return {"kind": saved.kind, "path": saved.path, "mime": saved.mime, "size": saved.size,
            "text_path": saved.text_path, "note": saved.note, "archive": saved.archive}


def _write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (a crash leaves no half file under the final name)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)
