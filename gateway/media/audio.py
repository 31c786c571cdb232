"""Speech to text and text to speech through OpenAI-compatible endpoints (``media.transcription``/``media.speech``)."""

from __future__ import annotations

import openai

from gateway.agent_loop import build_client
from gateway.config.media import MediaEndpoint, SpeechEndpoint, TranscriptionEndpoint
from gateway.config.sections import ModelSettings
from gateway.media.errors import MediaError, endpoint_error
from gateway.media.sniff import sniff

OGG = "audio/ogg"


def media_client(endpoint: MediaEndpoint, model_cfg: ModelSettings) -> openai.AsyncOpenAI:
    """A client of ``endpoint`` (its ``base_url`` and ``api_key``, else the chat model's; its ``timeout``; the chat
    model's retries and transport). The caller closes it."""
    timeout = endpoint.timeout
    return build_client(model_cfg.model_copy(update={
        "base_url": endpoint.base_url or model_cfg.base_url,
        "api_key": endpoint.api_key or model_cfg.api_key,
        "timeout": timeout,
        "connect_timeout": min(model_cfg.connect_timeout, timeout),
    }))


async def transcribe(client: openai.AsyncOpenAI, endpoint: TranscriptionEndpoint, data: bytes, filename: str,
                     mime: str) -> str:
    """What the audio ``data`` says (``endpoint.language`` given as a hint when set); ``MediaError`` on failure."""
    try:
        result = await client.audio.transcriptions.create(
            model=endpoint.model, file=(filename, data, mime), response_format="json",
            language=endpoint.language if endpoint.language else openai.omit)
    except openai.OpenAIError as exc:
        raise endpoint_error(exc, "transcription") from exc
    return result.text


async def speak(client: openai.AsyncOpenAI, endpoint: SpeechEndpoint, text: str) -> bytes:
    """``text`` read aloud with ``endpoint.voice``, as OGG/Opus (a voice note); ``MediaError`` on failure or when the
    endpoint answers with anything but OGG."""
    try:
        response = await client.audio.speech.create(model=endpoint.model, voice=endpoint.voice, input=text,
                                                    response_format="opus")
    except openai.OpenAIError as exc:
        raise endpoint_error(exc, "speech") from exc
    audio = response.content
    if sniff(audio, None, None).mime != OGG:
        raise MediaError(f"the speech service did not answer with OGG/Opus audio ({len(audio)} bytes of something "
                         "else).")
    return audio
