"""Files through the platform contract: fetching an incoming attachment, and the file a send carries.

Stdlib only at import, like platforms/base.py (``read_capped`` works on the aiohttp response it is given). The
gateway (gateway/media) decides what to fetch and what to send; an adapter only moves bytes with its platform's API
and reports what went wrong in these exception types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    import aiohttp

OutgoingKind = Literal["photo", "document", "voice", "audio"]
"""How a sent file is shown: an inline image, a file to download, a voice note (OGG/Opus), a playable audio file."""

OUTGOING_KINDS = frozenset(get_args(OutgoingKind))
READ_CHUNK = 64 * 1024


class AttachmentError(Exception):
    """An attachment could not be fetched; the message says why, in words fit for the user."""


class AttachmentTooLarge(AttachmentError, ValueError):
    """The file is over the size limit it was fetched with; nothing (or only the start) was downloaded."""


class AttachmentUnavailable(AttachmentError):
    """The platform refused or failed the download (gone, expired, no permission, network).

    ``retryable``: a later attempt may succeed (a timeout, a 5xx), as opposed to a 403/404."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True, slots=True)
class OutgoingFile:
    """A file for ``send_file``: its content, the name the user sees, its sniffed content type and kind."""

    kind: OutgoingKind
    name: str
    mime_type: str
    data: bytes

    def __post_init__(self) -> None:
        if self.kind not in OUTGOING_KINDS:
            raise ValueError(f"unknown outgoing file kind {self.kind!r}")
        if not self.name or "/" in self.name or "\\" in self.name:
            raise ValueError(f"a file name must be a plain name, not {self.name!r}")

    @property
    def size(self) -> int:
        """Bytes of content."""
        return len(self.data)


async def read_capped(response: aiohttp.ClientResponse, max_bytes: int, name: str) -> bytes:
    """The body of an aiohttp download, refused with AttachmentTooLarge as soon as its Content-Length or the bytes
    read pass ``max_bytes`` (at most ``max_bytes + 1`` are read)."""
    too_large = AttachmentTooLarge(f"{name} is over the limit of {max_bytes} bytes")
    if response.content_length is not None and response.content_length > max_bytes:
        raise too_large
    data = bytearray()
    while chunk := await response.content.read(min(READ_CHUNK, max_bytes + 1 - len(data))):
        data += chunk
        if len(data) > max_bytes:
            raise too_large
    return bytes(data)
