"""Documents: a safe file name for what a sender called their file, and the text of a PDF (pypdf)."""

from __future__ import annotations

import io
import re
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.media.errors import MediaError

if TYPE_CHECKING:
    from pypdf import PdfReader

MAX_NAME_BYTES = 120
"""The longest file name kept, in UTF-8 bytes, extension included (file systems allow 255; the gateway adds
suffixes such as ``.txt`` beside a PDF)."""
_PATH_SEPARATORS = re.compile(r"[/\\]")
_RESERVED = re.compile(r'[<>:"|?*]')
_EXTENSION = re.compile(r"(?=.*[a-z])[a-z0-9]{1,8}")  # "2" of "v1.2" is no extension
_SAME_EXT = ({"jpg", "jpeg", "jpe"}, {"tif", "tiff"}, {"htm", "html"}, {"yml", "yaml"}, {"mpg", "mpeg"},
             {"oga", "ogg", "opus"}, {"mid", "midi"}, {"aif", "aiff"})


def _clean(name: str) -> str:
    """``name`` as one plain path component: NFKC (full-width slashes become slashes before the path is cut),
    its last part, no control or format characters (bidi overrides included), no characters Windows forbids,
    no leading dots or surrounding spaces."""
    name = _PATH_SEPARATORS.split(unicodedata.normalize("NFKC", name))[-1]
    name = "".join(ch for ch in name if not unicodedata.category(ch).startswith("C"))
    return _RESERVED.sub("_", name).strip().lstrip(".").rstrip(". ")


def _same_ext(claimed: str, ext: str) -> bool:
    return claimed == ext or any(claimed in group and ext in group for group in _SAME_EXT)


def _cap(stem: str, suffix: str) -> str:
    """``stem + suffix`` within ``MAX_NAME_BYTES``, the stem cut (never inside a character)."""
    room = MAX_NAME_BYTES - len(suffix.encode())
    return stem.encode()[:room].decode(errors="ignore").rstrip(". ") + suffix


def safe_name(name: str | None, fallback: str, ext: str) -> str:
    """A plain file name for ``name`` (``fallback`` when nothing of it is left) ending in ``.ext``, the sniffed
    extension: a claimed extension that names another type is replaced, a claimed suffix that is no extension kept
    and ``.ext`` added (``"photo.png"`` of a JPEG: ``"photo.jpg"``; ``"v1.2 notes"`` of a PDF: ``"v1.2 notes.pdf"``)."""
    cleaned = _clean(name or "") or _clean(fallback) or "file"
    ext = ext.lower()
    stem, dot, claimed = cleaned.rpartition(".")
    if not dot or not _EXTENSION.fullmatch(claimed.lower()):
        stem, claimed = cleaned, ""
    if _same_ext(claimed.lower(), ext):
        return _cap(stem, "." + claimed)
    return _cap(stem, "." + ext)


@dataclass(frozen=True, slots=True)
class PdfText:
    """A PDF's text, each page after a ``--- page N of M ---`` line; ``truncated``: pages after ``pages_read``
    were left out (the text ends saying so)."""

    text: str
    pages_read: int
    total_pages: int
    truncated: bool


def _open(data: bytes) -> tuple[PdfReader, int]:
    """A reader of ``data`` and its page count, decrypted when it only has an owner password (printing or copying
    restricted). pypdf (13 MiB with its crypto providers) is imported on the first PDF, not by every gateway."""
    from pypdf import PasswordType, PdfReader
    from pypdf.errors import DependencyError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and reader.decrypt("") == PasswordType.NOT_DECRYPTED:
            raise MediaError("the PDF is password-protected.")
        return reader, len(reader.pages)  # the page tree is read here: its errors are the file's, not a page's
    except MediaError:
        raise
    except DependencyError as exc:
        raise MediaError("the PDF is encrypted in a way that cannot be read here.") from exc
    except Exception as exc:  # pypdf meets a malformed file with many kinds of exceptions
        raise MediaError("the PDF is damaged and cannot be read.") from exc


def pdf_text(data: bytes, max_pages: int) -> PdfText:
    """The text of the first ``max_pages`` pages of the PDF ``data``; ``MediaError`` when it is encrypted with a
    password or too damaged to open. A page whose text cannot be extracted says so in its place."""
    reader, total = _open(data)
    read = min(total, max_pages)
    parts: list[str] = []
    for number in range(1, read + 1):
        try:
            page = reader.pages[number - 1].extract_text().strip()
        except Exception:  # one damaged page (a broken content stream, font) does not lose the others
            page = "[the text of this page could not be extracted]"
        parts.append(f"--- page {number} of {total} ---\n{page}")
    if read < total:
        parts.append(f"--- the last {total - read} of the {total} pages were not read (at most {max_pages} are) ---")
    return PdfText("\n\n".join(parts), read, total, read < total)
