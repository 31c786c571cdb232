"""The ``media`` section: what incoming files may be, and the OpenAI-compatible endpoints that see, hear and speak."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, SecretStr

from gateway.config.base import _check_http_url, _Section

_MB = 1024 * 1024

MediaKind = Literal["image", "audio", "document", "video"]
"""What the gateway makes of an incoming file, from its sniffed content (not the platform's claim)."""


class MediaEndpoint(_Section):
    """An OpenAI-compatible endpoint for one media job; ``base_url`` and ``api_key`` unset: the chat model's."""

    base_url: Annotated[str, AfterValidator(_check_http_url)] | None = None
    api_key: SecretStr | None = None
    model: str
    timeout: float = Field(60.0, gt=0)


class SpeechEndpoint(MediaEndpoint):
    """Text to speech (``audio.speech.create``): the voice and the speed the answer is read with."""

    model: str = "tts-1"
    voice: str = "alloy"
    # Answers longer than this are sent as text only (a voice note of a long answer helps nobody).
    max_chars: int = Field(1500, ge=1, le=4096)


class TranscriptionEndpoint(MediaEndpoint):
    """Speech to text (``audio.transcriptions.create``; local Whisper servers speak it too)."""

    model: str = "whisper-1"
    language: str | None = None


class MaxBytes(_Section):
    """The largest incoming file of each kind the gateway downloads, in bytes (0: never downloaded)."""

    image: int = Field(10 * _MB, ge=0)
    audio: int = Field(25 * _MB, ge=0)
    document: int = Field(20 * _MB, ge=0)
    video: int = Field(0, ge=0)


class MediaSettings(_Section):
    """Incoming attachments (images to the model, voice transcribed, documents into the workspace) and files
    and voice notes sent back."""

    max_bytes: MaxBytes = Field(default_factory=MaxBytes)
    # Images are downscaled so that their longer side is at most this many pixels (EXIF dropped) before a model
    # sees them.
    image_max_side: int = Field(1568, ge=64, le=8192)
    # Without a vision-capable chat model, the vision_analyze tool asks this one; unset: images are saved to the
    # workspace and the model told it cannot see them.
    vision: MediaEndpoint | None = None
    # Unset: a voice note is answered with a message saying it cannot be transcribed.
    transcription: TranscriptionEndpoint | None = None
    # Shown to the user as a quote above the answer: what the gateway heard.
    show_transcript: bool = True
    # Unset: /voice says voice replies are not configured.
    speech: SpeechEndpoint | None = None
    # Pages of a PDF read into its text file in the workspace (the rest is left out, and the file says so).
    pdf_max_pages: int = Field(200, ge=1)
