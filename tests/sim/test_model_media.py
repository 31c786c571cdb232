"""The scripted model's media side against the real openai SDK: image content parts, audio transcriptions and
speech (its OGG/Opus checked page by page with a CRC written here, independently of the simulator's)."""

from __future__ import annotations

import base64
import io
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from PIL import Image

from gateway.sim.model_media import MAX_AUDIO_BYTES, ogg_crc, opus_silence
from gateway.sim.model_server import ScriptedModel, image_parts

KEY = "sk-sim-media"
MODEL = "scripted-model"


@pytest.fixture
async def model() -> AsyncIterator[ScriptedModel]:
    async with ScriptedModel(api_key=KEY) as server:
        yield server


@pytest.fixture
async def client(model: ScriptedModel) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=model.base_url, api_key=KEY, max_retries=0, timeout=5,
                                  http_client=openai.DefaultAioHttpClient()) as sdk:
        yield sdk


def data_url(fmt: str, mime: str | None = None) -> str:
    out = io.BytesIO()
    Image.new("RGB", (4, 4), (1, 2, 3)).save(out, fmt)
    return f"data:{mime or 'image/' + fmt.lower()};base64,{base64.b64encode(out.getvalue()).decode()}"


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


# ------------------------------------------------------------------------------------------------ images


async def test_image_parts_are_accepted_and_read_back(model: ScriptedModel, client: openai.AsyncOpenAI) -> None:
    earlier, png, jpeg = data_url("GIF"), data_url("PNG"), data_url("JPEG")
    messages: list[Any] = [
        {"role": "user", "content": [{"type": "text", "text": "first"}, image_part(earlier)]},
        {"role": "assistant", "content": "seen"},
        {"role": "user", "content": [{"type": "text", "text": "what are these?"}, image_part(png),
                                     image_part(jpeg), image_part("https://example.test/cat.webp")]},
    ]
    answer = await client.chat.completions.create(model=MODEL, messages=messages)
    assert answer.choices[0].message.content == "Echo: what are these?"  # the text parts, as before
    [request] = model.requests
    assert image_parts(request) == [png, jpeg, "https://example.test/cat.webp"]
    assert image_parts(request, all_messages=True) == [earlier, png, jpeg, "https://example.test/cat.webp"]
    assert image_parts({"messages": [{"role": "user", "content": "plain"}]}) == []


@pytest.mark.parametrize(("message", "refusal"), [
    ({"role": "user", "content": [image_part(data_url("BMP", "image/png"))]}, "unsupported image"),
    ({"role": "user", "content": [image_part("data:image/svg+xml;base64,PHN2Zy8+")]}, "unsupported image"),
    ({"role": "user", "content": [image_part("data:image/png;base64,not base64!")]}, "invalid base64"),
    ({"role": "user", "content": [image_part("image/png;base64,AAAA")]}, "without the 'data:' prefix"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {}}]},
     r"messages\[0\]\.content\[0\]\.image_url\.url"),
    ({"role": "tool", "tool_call_id": "call_1", "content": [image_part(data_url("PNG"))]},
     "only allowed for messages with role 'user'"),
])
async def test_image_parts_openai_would_refuse_are_refused(model: ScriptedModel, client: openai.AsyncOpenAI,
                                                           message: dict[str, Any], refusal: str) -> None:
    with pytest.raises(openai.BadRequestError, match=refusal):
        await client.chat.completions.create(model=MODEL, messages=[message])  # type: ignore[list-item]
    assert model.request_count == 1  # recorded all the same


# ------------------------------------------------------------------------------------------ transcriptions


async def test_transcription_answers_the_transcript_set_for_the_bytes(model: ScriptedModel,
                                                                      client: openai.AsyncOpenAI) -> None:
    voice = opus_silence(1.0)
    model.audio.set_transcript(voice, "Hello from the voice note.")
    heard = await client.audio.transcriptions.create(model="whisper-1", file=("voice.ogg", voice, "audio/ogg"),
                                                     language="en")
    assert heard.text == "Hello from the voice note."
    as_text = await client.audio.transcriptions.create(model="whisper-large", file=("b.mp3", b"12345", "audio/mpeg"),
                                                       response_format="text")
    assert as_text.strip() == "transcript of 5 bytes"
    first, second = model.audio.transcriptions
    assert (first.model, first.filename, first.content_type, first.data, first.language, first.response_format) == \
        ("whisper-1", "voice.ogg", "audio/ogg", voice, "en", "json")
    assert (second.model, second.data, second.language, second.response_format) == \
        ("whisper-large", b"12345", None, "text")


async def test_transcription_refuses_what_openai_refuses(model: ScriptedModel, client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match=r"Invalid file format\. Supported formats: \['flac'"):
        await client.audio.transcriptions.create(model="whisper-1", file=("voice.bin", b"x", "audio/ogg"))
    with pytest.raises(openai.BadRequestError, match="'verbose_json' is not simulated"):
        await client.audio.transcriptions.create(model="whisper-1", file=("a.ogg", b"x", "audio/ogg"),
                                                 response_format="verbose_json")
    with pytest.raises(openai.APIStatusError, match="Maximum content size limit") as caught:
        await client.audio.transcriptions.create(model="whisper-1",
                                                 file=("big.wav", bytes(MAX_AUDIO_BYTES + 1), "audio/wav"))
    assert caught.value.status_code == 413
    assert [t.filename for t in model.audio.transcriptions] == ["voice.bin", "a.ogg", "big.wav"]
    async with openai.AsyncOpenAI(base_url=model.base_url, api_key="sk-wrong", max_retries=0) as stranger:
        with pytest.raises(openai.AuthenticationError):
            await stranger.audio.transcriptions.create(model="whisper-1", file=("a.ogg", b"x", "audio/ogg"))
    assert len(model.audio.transcriptions) == 3  # an unauthorized request is not recorded


async def test_audio_faults(model: ScriptedModel, client: openai.AsyncOpenAI) -> None:
    model.audio.fail_next(1, 429, retry_after=7)
    with pytest.raises(openai.RateLimitError) as caught:
        await client.audio.transcriptions.create(model="whisper-1", file=("a.ogg", b"x", "audio/ogg"))
    assert caught.value.response.headers["retry-after"] == "7"
    model.audio.drop_next()
    with pytest.raises(openai.APIConnectionError):
        await client.audio.speech.create(model="tts-1", voice="alloy", input="hi", response_format="opus")
    model.audio.hang_next()
    with pytest.raises(openai.APITimeoutError):
        await client.audio.speech.create(model="tts-1", voice="alloy", input="hi", response_format="opus",
                                         timeout=0.3)
    assert not model.requests  # the chat endpoint's faults and records are its own
    speech = await client.audio.speech.create(model="tts-1", voice="alloy", input="hi", response_format="opus")
    assert speech.content.startswith(b"OggS")


# ------------------------------------------------------------------------------------------------ speech


def crc_bitwise(data: bytes) -> int:
    """Ogg's CRC bit by bit (polynomial 0x04C11DB7, MSB first, initial value and final XOR 0)."""
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = (crc << 1) ^ 0x04C11DB7 if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return crc


@dataclass
class Page:
    flags: int
    granule: int
    serial: int
    sequence: int
    packets: list[bytes]


def ogg_pages(data: bytes) -> list[Page]:
    """Parse an Ogg stream (RFC 3533), checking every page's CRC; packets here never span pages."""
    pages: list[Page] = []
    at = 0
    while at < len(data):
        magic, version, flags, granule, serial, sequence, crc, count = struct.unpack_from("<4sBBqIIIB", data, at)
        assert (magic, version) == (b"OggS", 0)
        lacing = data[at + 27: at + 27 + count]
        end = at + 27 + count + sum(lacing)
        page = data[at:end]
        assert crc == crc_bitwise(page[:22] + bytes(4) + page[26:]), f"page {sequence}: bad CRC"
        assert lacing and lacing[-1] < 255  # the last packet ends on this page
        packets, start, size = [], at + 27 + count, 0
        for value in lacing:
            size += value
            if value < 255:
                packets.append(data[start:start + size])
                start, size = start + size, 0
        pages.append(Page(flags, granule, serial, sequence, packets))
        at = end
    assert at == len(data)
    return pages


def test_the_ogg_checksum_is_crc32_without_reflection_or_final_xor() -> None:
    # The published check value of CRC-32/POSIX (0x765E7680) without its final XOR of 0xFFFFFFFF.
    assert crc_bitwise(b"123456789") == ogg_crc(b"123456789") == 0x89A1897F


@pytest.mark.parametrize("seconds", [0.02, 1.0, 3.37])
def test_opus_silence_is_a_valid_ogg_opus_stream(seconds: float) -> None:
    pages = ogg_pages(opus_silence(seconds))
    assert [p.sequence for p in pages] == list(range(len(pages)))
    assert len({p.serial for p in pages}) == 1
    assert [p.flags for p in pages] == [0x02] + [0] * (len(pages) - 2) + [0x04]  # BOS first, EOS last
    [head], [tags] = pages[0].packets, pages[1].packets
    magic, version, channels, pre_skip, rate, gain, mapping = struct.unpack("<8sBBHIhB", head)
    assert (magic, version, channels, rate, gain, mapping) == (b"OpusHead", 1, 1, 48000, 0, 0)
    vendor_length = struct.unpack_from("<I", tags, 8)[0]
    assert tags[:8] == b"OpusTags" and struct.unpack_from("<I", tags, 12 + vendor_length)[0] == 0
    assert pages[0].granule == pages[1].granule == 0
    decoded = 0
    for page in pages[2:]:
        for packet in page.packets:
            assert packet[0] >> 3 == 31 and packet[0] & 0b111 == 0  # CELT fullband 20 ms, mono, one frame
            decoded += 960
        assert pages[2].granule <= page.granule <= decoded
    assert pages[-1].granule - pre_skip == round(seconds * 50) * 960  # the playing time, to the sample


async def test_speech_answers_ogg_opus_as_long_as_the_reading(model: ScriptedModel,
                                                              client: openai.AsyncOpenAI) -> None:
    words = "Fifteen letters" * 4  # 60 characters: four seconds at the simulated pace
    speech = await client.audio.speech.create(model="tts-1", voice="nova", input=words, response_format="opus")
    pages = ogg_pages(speech.content)
    pre_skip = struct.unpack_from("<H", pages[0].packets[0], 10)[0]
    assert pages[-1].granule - pre_skip == 4 * 48000
    [request] = model.audio.speeches
    assert (request.model, request.voice, request.input, request.response_format) == ("tts-1", "nova", words, "opus")
    model.audio.speech_audio = b"not audio at all"
    again = await client.audio.speech.create(model="tts-1", voice="nova", input="x", response_format="opus")
    assert again.content == b"not audio at all"


async def test_speech_refuses_what_it_does_not_simulate_or_openai_refuses(model: ScriptedModel,
                                                                           client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="'mp3' is not simulated"):
        await client.audio.speech.create(model="tts-1", voice="alloy", input="hi")  # mp3 by default
    with pytest.raises(openai.BadRequestError, match="string too long"):
        await client.audio.speech.create(model="tts-1", voice="alloy", input="x" * 4097, response_format="opus")
    with pytest.raises(openai.BadRequestError, match="Missing required parameter: 'voice'"):
        await client.audio.speech.create(model="tts-1", voice="", input="hi", response_format="opus")
    assert [s.input[:2] for s in model.audio.speeches] == ["hi", "xx", "hi"]
