"""The media library (gateway/media): sniffing, images, names, PDF text, and the media endpoints through the real
``openai`` client against the scripted model."""

from __future__ import annotations

import base64
import gzip
import io
import struct
import tarfile
import zipfile
import zlib
from collections.abc import AsyncIterator

import pytest
from PIL import ExifTags, Image
from PIL.PngImagePlugin import PngInfo

from gateway.config.media import MediaEndpoint, SpeechEndpoint, TranscriptionEndpoint
from gateway.config.sections import ModelSettings
from gateway.media.audio import media_client, speak, transcribe
from gateway.media.documents import MAX_NAME_BYTES, pdf_text, safe_name
from gateway.media.errors import MediaError
from gateway.media.images import data_url, prepare_image
from gateway.media.sniff import Sniffed, sniff
from gateway.media.vision import describe_image, model_sees_images
from gateway.sim.model_media import opus_silence
from gateway.sim.model_server import ScriptedModel, image_parts, text
from tests.media_samples import pdf_with_text

MODEL_KEY = "sk-model-key-0123456789"
RED, BLUE = (255, 0, 0), (0, 0, 255)


def encoded(image: Image.Image, fmt: str, **params: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **params)
    return out.getvalue()


def zipped(**files: str) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    return out.getvalue()


# ------------------------------------------------------------------------------------------------ sniff

JPEG = encoded(Image.new("RGB", (8, 8), RED), "JPEG")
PNG = encoded(Image.new("RGB", (8, 8), RED), "PNG")


@pytest.mark.parametrize(("data", "name", "mime", "expected"), [
    (JPEG, "cat.png", "image/png", ("image", "image/jpeg", "jpg")),  # the bytes win over the claim
    (PNG, None, None, ("image", "image/png", "png")),
    (encoded(Image.new("RGB", (8, 8)), "GIF"), "x.gif", None, ("image", "image/gif", "gif")),
    (encoded(Image.new("RGB", (8, 8)), "WEBP"), "x.webp", None, ("image", "image/webp", "webp")),
    # HEIC is an image Pillow cannot read: a document, kept but not shown
    (b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + bytes(64), "a.jpg", "image/jpeg",
     ("document", "image/heic", "heic")),
    (opus_silence(0.2), "voice.oga", "audio/ogg", ("audio", "audio/ogg", "ogg")),
    (b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isomiso2mp41" + bytes(64), "clip", None, ("video", "video/mp4", "mp4")),
    (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n", "paper.txt", "text/plain", ("document", "application/pdf", "pdf")),
    # text: the claimed extension is kept among text ones, else .txt
    (b"print('hi')\n", "tool.py", "application/octet-stream", ("document", "text/plain", "py")),
    (b"a,b\n1,2\n", "data.csv", None, ("document", "text/csv", "csv")),
    ("# Titel\nÄrger\n".encode(), "notes.md", None, ("document", "text/markdown", "md")),
    (b'{"a": 1}', "x.json", "application/json", ("document", "text/plain", "json")),
    (b"just words", "setup.exe", "application/x-msdownload", ("document", "text/plain", "txt")),
    # HTML and SVG are served as text, never as images
    (b"  <!DOCTYPE html><html><script>x()</script></html>", "page.png", "image/png",
     ("document", "text/plain", "html")),
    (b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"/>', "logo.svg", "image/svg+xml",
     ("document", "text/plain", "svg")),
    # not supported: executables, binary data of no known type, text that is not UTF-8
    (b"MZ\x90\x00" + bytes(200), "invoice.pdf", "application/pdf", (None, "application/x-msdownload", "exe")),
    (b"\x7fELF\x02\x01\x01" + bytes(100), "run.sh", None, (None, "application/x-executable", "elf")),
    (bytes(range(256)) * 4, "blob.txt", "text/plain", (None, "application/octet-stream", "bin")),
    ("hello".encode("utf-16"), "u16.txt", None, (None, "application/octet-stream", "bin")),
])
def test_sniff_tells_the_type_from_the_bytes(data: bytes, name: str | None, mime: str | None,
                                             expected: tuple[str | None, str, str]) -> None:
    found = sniff(data, name, mime)
    assert (found.kind, found.mime, found.ext) == expected
    assert not found.archive


DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


def test_a_zip_is_an_office_file_only_when_claimed_so_and_an_archive_otherwise() -> None:
    data = zipped(**{"notes.txt": "hi"})  # a zip whose entries do not tell: the claimed extension decides
    assert sniff(data, "report.docx", "application/zip") == sniff(data, None, DOCX) == Sniffed("document", DOCX, "docx")
    for name, mime in (("bundle.zip", None), ("report.pdf", "application/pdf"), (None, None)):
        assert sniff(data, name, mime) == Sniffed("document", "application/zip", "zip", archive=True)
    office = zipped(**{"word/document.xml": "<w:document/>"})  # one that tells, whatever the claim
    assert sniff(office, "photos.zip", "application/zip") == Sniffed("document", DOCX, "docx")


def test_archives_are_documents_flagged_as_archives() -> None:
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as archive:
        info = tarfile.TarInfo("a.txt")
        info.size = 2
        archive.addfile(info, io.BytesIO(b"hi"))
    for data, ext in ((tar.getvalue(), "tar"), (gzip.compress(b"hello"), "gz")):
        found = sniff(data, "x.txt", "text/plain")
        assert (found.kind, found.ext, found.archive) == ("document", ext, True)


# ------------------------------------------------------------------------------------------------ images


def photo_with_exif(size: tuple[int, int], orientation: int) -> bytes:
    """A JPEG whose top row band is red (the rest blue), with an orientation tag and a GPS position."""
    image = Image.new("RGB", size, BLUE)
    image.paste(RED, (0, 0, size[0], size[1] // 4))
    exif = image.getexif()
    exif[ExifTags.Base.Orientation] = orientation
    exif[ExifTags.Base.Make] = "PhoneCo"
    exif[ExifTags.Base.GPSInfo] = {ExifTags.GPS.GPSLatitudeRef: "N", ExifTags.GPS.GPSLatitude: (48.0, 51.0, 29.0)}
    return encoded(image, "JPEG", exif=exif, quality=95)


def close_to(pixel: tuple[int, ...], colour: tuple[int, int, int]) -> bool:
    return all(abs(a - b) < 40 for a, b in zip(pixel, colour, strict=False))


def test_a_photo_is_turned_upright_downscaled_and_loses_its_exif_and_gps() -> None:
    data = photo_with_exif((1200, 800), orientation=6)  # stored sideways: shown turned 90° clockwise
    assert Image.open(io.BytesIO(data)).getexif().get_ifd(ExifTags.IFD.GPSInfo)  # the GPS is there going in
    prepared = prepare_image(data, 300)
    out = Image.open(io.BytesIO(prepared.data))
    assert (prepared.mime, out.format) == ("image/jpeg", "JPEG")
    assert (prepared.width, prepared.height) == out.size == (200, 300)  # upright (portrait), longer side 300
    assert close_to(out.getpixel((190, 150)), RED) and close_to(out.getpixel((10, 150)), BLUE)  # top went right
    assert not out.getexif() and "exif" not in out.info
    assert b"Exif" not in prepared.data and b"PhoneCo" not in prepared.data


def test_a_small_image_keeps_its_size_and_a_long_one_its_aspect() -> None:
    small = prepare_image(PNG, 1568)
    assert (small.width, small.height) == (8, 8)
    wide = prepare_image(encoded(Image.new("RGB", (3000, 1000), RED), "PNG"), 600)
    assert (wide.width, wide.height) == (600, 200)


def test_transparency_keeps_png_and_an_opaque_alpha_channel_becomes_jpeg() -> None:
    seethrough = Image.new("RGBA", (40, 20), (0, 255, 0, 255))
    seethrough.paste((0, 0, 0, 0), (0, 0, 20, 20))
    text_chunk = PngInfo()
    text_chunk.add_text("Comment", "taken at home, 12 Elm St")
    data = encoded(seethrough, "PNG", pnginfo=text_chunk)
    assert b"Elm St" in data
    prepared = prepare_image(data, 1568)
    out = Image.open(io.BytesIO(prepared.data))
    assert (prepared.mime, out.mode) == ("image/png", "RGBA")
    assert b"Elm St" not in prepared.data and "Comment" not in out.info
    assert out.getpixel((5, 5))[3] == 0 and out.getpixel((30, 5)) == (0, 255, 0, 255)
    opaque = prepare_image(encoded(Image.new("RGBA", (10, 10), (9, 9, 9, 255)), "PNG"), 1568)
    assert opaque.mime == "image/jpeg"


def test_an_animated_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (16, 16), RED), Image.new("RGB", (16, 16), BLUE)]
    data = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    assert Image.open(io.BytesIO(data)).n_frames == 2
    prepared = prepare_image(data, 1568)
    assert prepared.mime == "image/jpeg"
    assert close_to(Image.open(io.BytesIO(prepared.data)).getpixel((8, 8)), RED)


def claiming_size(png: bytes, width: int, height: int) -> bytes:
    """``png`` with its IHDR claiming another size (its CRC fixed): what a decompression bomb looks like."""
    ihdr = png[12:29]  # type, then width, height and five one-byte fields
    patched = ihdr[:4] + struct.pack(">II", width, height) + ihdr[12:]
    return png[:12] + patched + struct.pack(">I", zlib.crc32(patched)) + png[33:]


@pytest.mark.parametrize(("width", "height"), [(10_000, 8_000), (40_000, 40_000)])  # ours; Pillow's own limit
def test_a_huge_image_is_refused_from_its_header(width: int, height: int) -> None:
    with pytest.raises(MediaError, match="too large"):
        prepare_image(claiming_size(PNG, width, height), 1568)


@pytest.mark.parametrize(("data", "message"), [(b"hello, not an image", "not an image"),
                                               (JPEG[: len(JPEG) // 2], "damaged")])
def test_what_is_no_readable_image_is_a_media_error(data: bytes, message: str) -> None:
    with pytest.raises(MediaError, match=message):
        prepare_image(data, 1568)


def test_data_url_carries_the_prepared_bytes() -> None:
    prepared = prepare_image(JPEG, 1568)
    head, _, payload = data_url(prepared).partition(",")
    assert head == "data:image/jpeg;base64" and base64.b64decode(payload) == prepared.data


# ------------------------------------------------------------------------------------------------ names


@pytest.mark.parametrize(("name", "fallback", "ext", "expected"), [
    ("holiday.JPG", "photo", "jpg", "holiday.JPG"),
    ("holiday.jpeg", "photo", "jpg", "holiday.jpeg"),  # the same type, another spelling
    ("holiday.png", "photo", "jpg", "holiday.jpg"),  # the claimed extension named another type
    ("invoice.pdf", "document", "exe", "invoice.exe"),
    ("v1.2 notes", "document", "pdf", "v1.2 notes.pdf"),  # a suffix that is no extension is kept
    ("v1.2", "document", "pdf", "v1.2.pdf"),
    ("../../etc/passwd", "document", "txt", "passwd.txt"),
    ("C:\\Users\\me\\report.docx", "document", "docx", "report.docx"),
    ("..／..／secret.txt", "document", "txt", "secret.txt"),  # full-width slashes are slashes once normalised
    (".bashrc", "document", "txt", "bashrc.txt"),
    ("bad\x00na\nme\u202etxt.exe", "document", "exe", "badnametxt.exe"),  # control and bidi characters go
    ('what?*<is>:"this"|.txt', "document", "txt", "what___is___this__.txt"),
    ("ﬁnal  .pdf", "document", "pdf", "final.pdf"),
    (None, "photo", "jpg", "photo.jpg"),
    ("", "voice", "ogg", "voice.ogg"),
    ("...", "file", "zip", "file.zip"),
])
def test_safe_name(name: str | None, fallback: str, ext: str, expected: str) -> None:
    assert safe_name(name, fallback, ext) == expected


def test_a_long_name_is_cut_keeping_its_extension_and_whole_characters() -> None:
    for name in ("a" * 400 + ".pdf", "ü" * 400 + ".pdf"):
        cut = safe_name(name, "document", "pdf")
        assert cut.endswith(".pdf") and len(cut.encode()) <= MAX_NAME_BYTES
        assert len(cut.encode()) > MAX_NAME_BYTES - 2  # cut at the limit, not shorter
        assert cut[:-4] == name[: len(cut) - 4]


# ------------------------------------------------------------------------------------------------ PDF


def test_pdf_text_gives_each_page_after_its_marker() -> None:
    pdf = pdf_text(pdf_with_text("Hello first page", "The second one"), 10)
    assert (pdf.pages_read, pdf.total_pages, pdf.truncated) == (2, 2, False)
    assert pdf.text == "--- page 1 of 2 ---\nHello first page\n\n--- page 2 of 2 ---\nThe second one"


def test_pdf_text_stops_at_max_pages_and_says_so() -> None:
    pdf = pdf_text(pdf_with_text(*(f"Words of page {n}" for n in range(1, 6))), 2)
    assert (pdf.pages_read, pdf.total_pages, pdf.truncated) == (2, 5, True)
    assert "Words of page 2" in pdf.text and "Words of page 3" not in pdf.text
    assert pdf.text.endswith("--- the last 3 of the 5 pages were not read (at most 2 are) ---")


def test_a_pdf_restricted_by_its_owner_only_is_read() -> None:
    pdf = pdf_text(pdf_with_text("Printing is not allowed", user_password=""), 10)
    assert "Printing is not allowed" in pdf.text


@pytest.mark.parametrize(("data", "message"), [
    (pdf_with_text("top secret", user_password="letmein"), "password-protected"),
    (b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 9 0 R >> garbage", "damaged"),
    (pdf_with_text("half a file")[:200], "damaged"),
])
def test_an_encrypted_or_broken_pdf_is_a_media_error(data: bytes, message: str) -> None:
    with pytest.raises(MediaError, match=message):
        pdf_text(data, 10)


# ------------------------------------------------------------------------------------------------ vision


@pytest.mark.parametrize("name", [
    "gpt-4o", "gpt-4o-mini", "chatgpt-4o-latest", "gpt-4.1-nano", "gpt-4-turbo", "gpt-4-turbo-2024-04-09", "gpt-5",
    "gpt-5-mini", "o1", "o1-2024-12-17", "o3", "o3-pro", "o4-mini", "claude-3-5-sonnet-20241022",
    "claude-sonnet-4-5", "anthropic/claude-opus-4.1", "gemini-2.0-flash", "google/gemini-2.5-pro", "llava:13b",
    "bakllava", "Qwen/Qwen2.5-VL-72B-Instruct", "qwen-vl-max", "pixtral-12b-2409", "gemma3:27b", "gemma-3-27b-it",
    "meta-llama/llama-3.2-11b-vision-instruct:free", "llama-4-scout", "llama4:maverick", "minicpm-v:8b",
    "moondream", "gpt-4-vision-preview",
])
def test_vision_families_see_images(name: str) -> None:
    assert model_sees_images("auto", name)
    assert not model_sees_images(False, name)


@pytest.mark.parametrize("name", [
    "gpt-4", "gpt-4-0613", "gpt-4-turbo-preview", "gpt-3.5-turbo", "o1-mini", "o1-preview", "o3-mini",
    "o3-mini-high", "o10", "claude-2.1", "claude-instant-1.2", "llama-3.1-70b", "gemma2:9b", "qwen2.5-72b-instruct",
    "deepseek/deepseek-chat", "mistral-large", "scripted-model",
])
def test_other_models_do_not(name: str) -> None:
    assert not model_sees_images("auto", name)
    assert model_sees_images(True, name)


# ------------------------------------------------------------------------------------------ the endpoints


@pytest.fixture
async def model() -> AsyncIterator[ScriptedModel]:
    async with ScriptedModel(api_key=MODEL_KEY) as server:
        yield server


def chat_model(server: ScriptedModel, retries: int = 0) -> ModelSettings:
    assert server.base_url is not None
    return ModelSettings(base_url=server.base_url, api_key=MODEL_KEY, max_retries=retries)


async def test_transcribe_sends_the_audio_with_its_name_and_language(model: ScriptedModel) -> None:
    voice = opus_silence(1.5)
    model.audio.set_transcript(voice, "Wie spät ist es?")
    endpoint = TranscriptionEndpoint(language="de")
    async with media_client(endpoint, chat_model(model)) as client:
        assert await transcribe(client, endpoint, voice, "voice.ogg", "audio/ogg") == "Wie spät ist es?"
        assert await transcribe(client, TranscriptionEndpoint(), b"other", "a.mp3", "audio/mpeg") == \
            "transcript of 5 bytes"
    first, second = model.audio.transcriptions
    assert (first.model, first.filename, first.content_type, first.data, first.language) == \
        ("whisper-1", "voice.ogg", "audio/ogg", voice, "de")
    assert second.language is None


async def test_speak_returns_ogg_opus_of_the_text(model: ScriptedModel) -> None:
    endpoint = SpeechEndpoint(voice="nova", model="tts-1-hd")
    async with media_client(endpoint, chat_model(model)) as client:
        audio = await speak(client, endpoint, "Hello there, friend.")
    assert sniff(audio, None, None).mime == "audio/ogg" and audio[28:36] == b"OpusHead"
    [request] = model.audio.speeches
    assert (request.model, request.voice, request.input, request.response_format) == \
        ("tts-1-hd", "nova", "Hello there, friend.", "opus")


async def test_speech_that_is_not_ogg_is_a_media_error(model: ScriptedModel) -> None:
    model.audio.speech_audio = b"ID3\x04" + bytes(500)  # an MP3 where OGG was asked for
    async with media_client(SpeechEndpoint(), chat_model(model)) as client:
        with pytest.raises(MediaError, match="did not answer with OGG/Opus"):
            await speak(client, SpeechEndpoint(), "hi")


async def test_the_endpoint_has_its_own_address_and_key(model: ScriptedModel) -> None:
    async with ScriptedModel(api_key="sk-whisper-only") as whisper:
        endpoint = TranscriptionEndpoint(base_url=whisper.base_url, api_key="sk-whisper-only")
        async with media_client(endpoint, chat_model(model)) as client:
            assert await transcribe(client, endpoint, b"abc", "v.ogg", "audio/ogg") == "transcript of 3 bytes"
        assert len(whisper.audio.transcriptions) == 1 and not model.audio.transcriptions


async def test_a_refused_key_is_told_without_the_key_or_the_address(model: ScriptedModel) -> None:
    endpoint = TranscriptionEndpoint(api_key="sk-wrong-key-5555")
    async with media_client(endpoint, chat_model(model)) as client:
        with pytest.raises(MediaError) as caught:
            await transcribe(client, endpoint, b"abc", "v.ogg", "audio/ogg")
    message = str(caught.value)
    assert message == "the transcription service refused the gateway's credentials (HTTP 401)."


async def test_a_refused_request_gives_the_servers_reason_without_urls(model: ScriptedModel) -> None:
    async with media_client(TranscriptionEndpoint(), chat_model(model)) as client:
        with pytest.raises(MediaError, match=r"HTTP 400: Invalid file format\. Supported formats: \["):
            await transcribe(client, TranscriptionEndpoint(), b"abc", "voice.bin", "application/octet-stream")
        model.audio.fail_next(1, 400, message="see https://example.test/help?key=sk-leak for help")
        with pytest.raises(MediaError) as caught:
            await transcribe(client, TranscriptionEndpoint(), b"abc", "v.ogg", "audio/ogg")
    assert str(caught.value) == "the transcription service refused the request (HTTP 400: see <url> for help)."


async def test_the_chat_models_retries_apply(model: ScriptedModel) -> None:
    model.audio.fail_next(1, 503, retry_after=0.01)
    async with media_client(SpeechEndpoint(), chat_model(model, retries=1)) as client:
        assert (await speak(client, SpeechEndpoint(), "again")).startswith(b"OggS")
    assert len(model.audio.speeches) == 2
    model.audio.fail_next(1, 503)
    async with media_client(SpeechEndpoint(), chat_model(model)) as client:
        with pytest.raises(MediaError, match=r"the speech service failed \(HTTP 503\)"):
            await speak(client, SpeechEndpoint(), "no retries")


async def test_the_endpoints_timeout_and_an_unreachable_endpoint(model: ScriptedModel) -> None:
    model.audio.hang_next()
    endpoint = TranscriptionEndpoint(timeout=0.3)
    async with media_client(endpoint, chat_model(model)) as client:
        with pytest.raises(MediaError, match="did not answer in time"):
            await transcribe(client, endpoint, b"abc", "v.ogg", "audio/ogg")
    async with ScriptedModel() as gone:
        address = gone.base_url
    unreachable = TranscriptionEndpoint(base_url=address, timeout=2)
    async with media_client(unreachable, chat_model(model)) as client:
        with pytest.raises(MediaError, match="could not be reached"):
            await transcribe(client, unreachable, b"abc", "v.ogg", "audio/ogg")


async def test_describe_image_asks_one_question_with_the_image(model: ScriptedModel) -> None:
    url = data_url(prepare_image(PNG, 1568))
    model.push(text("  A small red square.  "))
    endpoint = MediaEndpoint(model="gpt-4o-mini")
    async with media_client(endpoint, chat_model(model)) as client:
        answer = await describe_image(client, "gpt-4o-mini", url, "What colour is it?", 300)
    assert answer == "A small red square."
    [request] = model.requests
    assert (request["model"], request["max_tokens"]) == ("gpt-4o-mini", 300)
    assert image_parts(request) == [url]
    assert request["messages"][0]["content"][0] == {"type": "text", "text": "What colour is it?"}


async def test_describe_image_failures_are_media_errors(model: ScriptedModel) -> None:
    url = data_url(prepare_image(PNG, 1568))
    async with media_client(MediaEndpoint(model="v"), chat_model(model)) as client:
        model.push(text(""))
        with pytest.raises(MediaError, match="gave no answer"):
            await describe_image(client, "v", url, "What is it?", 100)
        model.fail_next(1, 404)
        with pytest.raises(MediaError, match="does not know the configured model"):
            await describe_image(client, "v", url, "What is it?", 100)
        with pytest.raises(MediaError, match="unsupported image"):  # a data URL the service refuses
            await describe_image(client, "v", "data:image/svg+xml;base64,PHN2Zy8+", "What is it?", 100)
