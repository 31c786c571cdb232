"""The scripted model's media side (``ScriptedModel.audio`` and the image checks of chat requests).

- Image content parts of chat requests are checked as OpenAI checks them (user messages only; a base64 ``data:``
  URL of a PNG, JPEG, GIF or WebP, by its bytes) and read back by tests with :func:`image_parts`.
- ``POST /v1/audio/transcriptions``: multipart like OpenAI's (``file``, ``model``, ``language``,
  ``response_format`` json or text); the transcript is set per uploaded bytes (``set_transcript``).
- ``POST /v1/audio/speech``: JSON (``model``, ``input``, ``voice``, ``response_format`` opus); answers a valid
  OGG/Opus stream of silence, as long as reading the input would take (:func:`opus_silence`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import filetype
from aiohttp import web

from gateway.sim.model_faults import FaultQueue, Park, drop, error_response, fault_response, json_object

JSON = dict[str, Any]

# --------------------------------------------------------------------------------------------- images

_IMAGE_TYPES = {"png": "png", "jpeg": "jpg", "gif": "gif", "webp": "webp"}
"""The image types OpenAI takes: MIME subtype -> the extension ``filetype`` gives their bytes."""
_UNSUPPORTED_IMAGE = ("You uploaded an unsupported image. Please make sure your image has of one the following "
                      "formats: ['png', 'jpeg', 'gif', 'webp'].")


def _image_urls(content: Any) -> list[Any]:
    """The ``image_url`` values of a message's content parts (as sent: normally ``{"url": ...}``)."""
    if not isinstance(content, list):
        return []
    return [p.get("image_url") for p in content if isinstance(p, dict) and p.get("type") == "image_url"]


def image_parts(request: JSON, *, all_messages: bool = False) -> list[str]:
    """The image URLs (``data:`` URLs as sent) of a chat request's last user message, or of all its messages."""
    messages = [m for m in request.get("messages") or () if isinstance(m, dict)]
    if not all_messages:
        messages = [m for m in messages if m.get("role") == "user"][-1:]
    return [image["url"] for m in messages for image in _image_urls(m.get("content"))
            if isinstance(image, dict) and isinstance(image.get("url"), str)]


def _data_url_problem(url: str, where: str) -> str | None:
    head, comma, payload = url.partition(",")
    subtype = head.removeprefix("data:image/").removesuffix(";base64")
    if not comma or not head.startswith("data:image/") or not head.endswith(";base64"):
        return (f"Invalid '{where}'. Expected a base64-encoded data URL with an image MIME type (e.g. "
                "'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got a value without the 'data:' prefix.")
    try:
        data = base64.b64decode(payload, validate=True)
    except binascii.Error:
        return (f"Invalid '{where}'. Expected a base64-encoded data URL with an image MIME type (e.g. "
                "'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got an invalid base64 encoding.")
    found = filetype.guess(data)
    if subtype not in _IMAGE_TYPES or found is None or found.extension not in _IMAGE_TYPES.values():
        return _UNSUPPORTED_IMAGE
    return None


def image_problem(request: JSON) -> str | None:
    """What OpenAI would refuse in the image parts of a chat request (its message), or None."""
    for i, message in enumerate(request.get("messages") or ()):
        if not isinstance(message, dict):
            continue
        images = _image_urls(message.get("content"))
        if images and message.get("role") != "user":
            return (f"Image URLs are only allowed for messages with role 'user', but this message with role "
                    f"'{message.get('role')}' contains an image URL.")
        for j, image in enumerate(images):
            where = f"messages[{i}].content[{j}].image_url.url"
            if not isinstance(image, dict) or not isinstance(image.get("url"), str):
                return f"Missing required parameter: '{where}'."
            url = image["url"]
            if not url.startswith(("https://", "http://")) and (problem := _data_url_problem(url, where)):
                return problem
    return None


# ------------------------------------------------------------------------------------------ OGG/Opus


def _crc_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7 if crc & 0x80000000 else crc << 1) & 0xFFFFFFFF
        table.append(crc)
    return tuple(table)


_CRC_TABLE = _crc_table()
_SAMPLE_RATE = 48000
_PRE_SKIP = 312  # what libopus reports for its encoder's delay at 48 kHz
_SILENCE = b"\xf8\xff\xfe"  # TOC 31 (CELT, fullband, 20 ms, mono, one frame), then an empty frame: silence
_FRAME_SAMPLES = _SAMPLE_RATE // 50
_PACKETS_PER_PAGE = 50  # one second a page
_BOS, _EOS = 0x02, 0x04
_VENDOR = b"hermes-sim"


def ogg_crc(data: bytes) -> int:
    """The Ogg page checksum: CRC-32 with polynomial 0x04C11DB7, no reflection, initial value and final XOR 0."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _CRC_TABLE[(crc >> 24) ^ byte]
    return crc


def _ogg_page(packets: list[bytes], *, granule: int, serial: int, sequence: int, flags: int) -> bytes:
    """One Ogg page holding whole ``packets`` (RFC 3533: header, lacing values, data; the CRC over all of it)."""
    lacing = bytearray()
    for packet in packets:
        lacing += b"\xff" * (len(packet) // 255) + bytes([len(packet) % 255])
    if len(lacing) > 255:
        raise ValueError("too many packets for one Ogg page")
    header = struct.pack("<4sBBqIIIB", b"OggS", 0, flags, granule, serial, sequence, 0, len(lacing))
    page = header + lacing + b"".join(packets)
    return page[:22] + struct.pack("<I", ogg_crc(page)) + page[26:]


def opus_silence(seconds: float) -> bytes:
    """An OGG/Opus stream (RFC 7845: OpusHead and OpusTags pages, then 20 ms silence frames) ``seconds`` long."""
    frames = max(1, round(seconds * 50))
    serial = secrets.randbits(32)
    head = struct.pack("<8sBBHIhB", b"OpusHead", 1, 1, _PRE_SKIP, _SAMPLE_RATE, 0, 0)
    tags = b"OpusTags" + struct.pack("<I", len(_VENDOR)) + _VENDOR + struct.pack("<I", 0)
    pages = [_ogg_page([head], granule=0, serial=serial, sequence=0, flags=_BOS),
             _ogg_page([tags], granule=0, serial=serial, sequence=1, flags=0)]
    # A granule position counts the samples decoded by the end of its page, pre-skip included (a player drops the
    # first _PRE_SKIP); the last page's is where playback ends, within its last frame.
    total = frames + -(-_PRE_SKIP // _FRAME_SAMPLES)
    for first in range(0, total, _PACKETS_PER_PAGE):
        count = min(_PACKETS_PER_PAGE, total - first)
        last = first + count == total
        granule = _PRE_SKIP + frames * _FRAME_SAMPLES if last else (first + count) * _FRAME_SAMPLES
        pages.append(_ogg_page([_SILENCE] * count, granule=granule, serial=serial, sequence=len(pages),
                               flags=_EOS if last else 0))
    return b"".join(pages)


# ------------------------------------------------------------------------------------------- audio


@dataclass(frozen=True, slots=True)
class Transcription:
    """One transcription request as received."""

    model: str
    filename: str
    content_type: str
    data: bytes
    language: str | None
    response_format: str


@dataclass(frozen=True, slots=True)
class Speech:
    """One speech request as received."""

    model: str
    input: str
    voice: str
    response_format: str


MAX_AUDIO_BYTES = 25 * 1024 * 1024
"""OpenAI's limit on an uploaded audio file."""
AUDIO_FORMATS = ("flac", "m4a", "mp3", "mp4", "mpeg", "mpga", "oga", "ogg", "wav", "webm")
"""What OpenAI transcribes, told by the uploaded file's name."""
MAX_SPEECH_CHARS = 4096
CHARS_PER_SECOND = 15.0
"""How fast the simulated voice reads: a speech answer lasts ``len(input) / CHARS_PER_SECOND`` seconds."""


class AudioEndpoints(FaultQueue):
    """The audio endpoints (see the module doc). Settings: ``transcripts`` (SHA-256 hex of an upload's bytes ->
    its transcript; others get ``"transcript of <n> bytes"``), ``speech_audio`` (bytes answered instead of the OGG
    made), ``latency``. Records: ``transcriptions`` and ``speeches``, every authorized request that could be parsed
    (refused and faulted ones included). Faults (``fail_next``, ``drop_next``, ``hang_next``) apply to the next
    requests of either endpoint."""

    def __init__(self, authorized: Callable[[web.BaseRequest], bool], park: Park) -> None:
        super().__init__()
        self.transcripts: dict[str, str] = {}
        self.speech_audio: bytes | None = None
        self.latency = 0.0
        self.transcriptions: list[Transcription] = []
        self.speeches: list[Speech] = []
        self._authorized = authorized
        self._park = park

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """Serve the endpoints under ``/v1/audio``."""
        router.add_post("/v1/audio/transcriptions", self._transcription)
        router.add_post("/v1/audio/speech", self._speech)

    def set_transcript(self, audio: bytes, text: str) -> None:
        """What the endpoint hears in ``audio``."""
        self.transcripts[hashlib.sha256(audio).hexdigest()] = text

    async def _faulted(self, request: web.Request) -> web.StreamResponse | None:
        """The answer of an injected fault, or of the server stopping during ``latency``; None: answer."""
        fault = self.next_fault()
        if fault is not None:
            return await fault_response(fault, request, self._park, self.latency)
        return None if await self._park(self.latency) else drop(request)

    async def _transcription(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return error_response(401)
        if request.content_type != "multipart/form-data":
            return error_response(400, "The request must be multipart/form-data.")
        form = await request.post()
        upload, model = form.get("file"), form.get("model")
        if not isinstance(upload, web.FileField):
            return error_response(400, "Missing required parameter: 'file'.", param="file")
        language, response_format = form.get("language"), form.get("response_format", "json")
        data = upload.file.read()
        self.transcriptions.append(Transcription(str(model or ""), upload.filename, upload.content_type, data,
                                                 language if isinstance(language, str) else None,
                                                 str(response_format)))
        if not isinstance(model, str) or not model:
            return error_response(400, "Missing required parameter: 'model'.", param="model")
        if response_format not in ("json", "text"):
            return error_response(400, f"response_format {response_format!r} is not simulated (json, text).",
                                  param="response_format")
        if upload.filename.rpartition(".")[2].lower() not in AUDIO_FORMATS:
            return error_response(400, f"Invalid file format. Supported formats: {list(AUDIO_FORMATS)}",
                                  param="file")
        if len(data) > MAX_AUDIO_BYTES:
            return error_response(413, f"Maximum content size limit ({MAX_AUDIO_BYTES}) exceeded ({len(data)} "
                                  "bytes read)")
        if (answer := await self._faulted(request)) is not None:
            return answer
        text = self.transcripts.get(hashlib.sha256(data).hexdigest(), f"transcript of {len(data)} bytes")
        if response_format == "text":
            return web.Response(text=text + "\n", content_type="text/plain")
        return web.Response(body=json.dumps({"text": text}).encode(), content_type="application/json")

    async def _speech(self, request: web.Request) -> web.StreamResponse:
        body = await json_object(request, self._authorized(request))
        if isinstance(body, web.Response):
            return body
        text, response_format = body.get("input"), body.get("response_format", "mp3")
        self.speeches.append(Speech(str(body.get("model", "")), str(text or ""), str(body.get("voice", "")),
                                    str(response_format)))
        for name in ("model", "input", "voice"):
            if not isinstance(body.get(name), str) or not body[name]:
                return error_response(400, f"Missing required parameter: '{name}'.", param=name)
        if len(text) > MAX_SPEECH_CHARS:
            return error_response(400, f"Invalid 'input': string too long. Expected a string with maximum length "
                                  f"{MAX_SPEECH_CHARS}, but got a string with length {len(text)} instead.",
                                  param="input")
        if response_format != "opus":
            return error_response(400, f"response_format {response_format!r} is not simulated (opus).",
                                  param="response_format")
        if (answer := await self._faulted(request)) is not None:
            return answer
        audio = self.speech_audio if self.speech_audio is not None else opus_silence(len(text) / CHARS_PER_SECOND)
        return web.Response(body=audio, content_type="audio/ogg")
