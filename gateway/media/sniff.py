"""What a file is, from its bytes (``filetype``'s signatures), never from what the sender claims it is.

A claim is used only where the bytes cannot tell: which zip-based office format a zip is, and which text
extension a text file has. HTML and SVG are text documents (never images: a browser would run their scripts).
"""

from __future__ import annotations

from dataclasses import dataclass

import filetype
from PIL import Image

from gateway.config.media import MediaKind


@dataclass(frozen=True, slots=True)
class Sniffed:
    """A file's kind (None: not supported), its MIME type and extension (no dot), and whether it is an archive
    (kept as it is, never unpacked)."""

    kind: MediaKind | None
    mime: str
    ext: str
    archive: bool = False


Image.init()
_PILLOW_IMAGES = {mime for mime in Image.MIME.values() if mime.startswith("image/")} | {"image/apng"}
"""Image types Pillow decodes (APNG is a PNG to Pillow); other images (HEIC, PSD layers it cannot, CAD) are
documents: saved, not shown."""
_AUDIO_VIDEO: dict[str, MediaKind] = {"audio": "audio", "video": "video"}
_EXECUTABLE = frozenset({"exe", "elf", "swf", "nes", "crx", "wasm", "deb", "rpm"})
_ARCHIVE = frozenset({"zip", "tar", "rar", "gz", "bz2", "7z", "xz", "Z", "lzo", "lz", "lz4", "zst", "br", "cab", "ar"})
_ZIPPED_OFFICE = frozenset({"docx", "xlsx", "pptx", "odt", "ods", "odp", "epub"})
"""Formats that are zip files inside, which ``filetype`` may see only as zip: the claimed extension decides."""
_TEXT_MIME = {"md": "text/markdown", "markdown": "text/markdown", "csv": "text/csv",
              "tsv": "text/tab-separated-values"}
_TEXT_EXT = frozenset({
    "txt", "text", "md", "markdown", "rst", "adoc", "org", "tex", "log", "csv", "tsv", "json", "jsonl", "ndjson",
    "yaml", "yml", "toml", "ini", "cfg", "conf", "properties", "env", "xml", "html", "htm", "svg", "css", "scss",
    "js", "mjs", "cjs", "ts", "tsx", "jsx", "vue", "py", "pyi", "ipynb", "rb", "go", "rs", "c", "h", "cc", "cpp",
    "hpp", "cs", "java", "kt", "kts", "scala", "swift", "m", "php", "pl", "lua", "r", "jl", "dart", "ex", "exs",
    "erl", "hs", "clj", "sh", "bash", "zsh", "fish", "ps1", "bat", "sql", "graphql", "proto", "diff", "patch",
    "dockerfile", "makefile", "gradle", "srt", "vtt", "ics", "vcf",
})
_SNIFF_CHARS = 1024


def _claimed_ext(claimed_name: str | None, claimed_mime: str | None) -> str:
    """The extension the sender claims: the name's, else the one of its MIME type ("" when neither tells)."""
    if claimed_name and "." in claimed_name:
        return claimed_name.rsplit(".", 1)[1].lower()
    claimed = filetype.get_type(mime=claimed_mime) if claimed_mime else None
    return claimed.extension if claimed is not None else ""


def _text(data: bytes, claimed_ext: str) -> Sniffed | None:
    """A UTF-8 text file as a document (None when ``data`` is not text); HTML and SVG by their content."""
    if b"\x00" in data:
        return None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    head = text[:_SNIFF_CHARS].lstrip().lower()
    if head.startswith(("<!doctype html", "<html")):
        ext = claimed_ext if claimed_ext in ("html", "htm") else "html"
    elif head.startswith("<svg") or (head.startswith("<?xml") and "<svg" in head):
        ext = "svg"
    else:
        ext = claimed_ext if claimed_ext in _TEXT_EXT else "txt"
    return Sniffed("document", _TEXT_MIME.get(ext, "text/plain"), ext)


def sniff(data: bytes, claimed_name: str | None, claimed_mime: str | None) -> Sniffed:
    """What ``data`` is (see the module doc); the claimed name and MIME type only settle what the bytes leave open."""
    claimed_ext = _claimed_ext(claimed_name, claimed_mime)
    found = filetype.guess(data)
    if found is None:
        return _text(data, claimed_ext) or Sniffed(None, "application/octet-stream", "bin")
    if found.extension == "zip" and claimed_ext in _ZIPPED_OFFICE:
        found = filetype.get_type(ext=claimed_ext)
    top = found.mime.split("/", 1)[0]
    if top == "image":
        return Sniffed("image" if found.mime in _PILLOW_IMAGES else "document", found.mime, found.extension)
    if top in _AUDIO_VIDEO:
        return Sniffed(_AUDIO_VIDEO[top], found.mime, found.extension)
    if found.extension in _EXECUTABLE:
        return Sniffed(None, found.mime, found.extension)
    return Sniffed("document", found.mime, found.extension, archive=found.extension in _ARCHIVE)
