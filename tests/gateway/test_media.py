"""Media end to end on every chat platform: the real gateway and adapter against the platform's simulator and the
scripted model. Photos reach the model as image parts (downscaled, without EXIF), a voice note's transcript is the
model's input, a PDF's text is read with read_file, send_file delivers an image and a document once with their
captions, refused files (too large, not what they claim, failed download) get one clear message and no model call,
and /voice on brings a voice message back."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.media.sniff import sniff
from gateway.sim.model_media import image_parts, opus_silence
from gateway.sim.model_server import JSON, ScriptedModel, Turn, last_user_text, tool_call, tool_calls
from tests.gateway.media_chats import MediaChat, open_chat
from tests.media_samples import camera_jpeg, decoded_image, pdf_with_text, png_chart

PDF_TEXT = "The launch code is 4711."
TRANSCRIPT = "please turn on the lights in the kitchen"
TEXT_FILE = re.compile(r"its text: (.+?\.txt)[,\]]")


class MediaModel:
    """Answers by what the user's turn holds (and keeps every request): counts the images it sees, reads a PDF's
    text file, sends files when asked, echoes anything else."""

    def __init__(self) -> None:
        self.requests: list[JSON] = []

    def __call__(self, request: JSON) -> Turn:
        self.requests.append(request)
        last = request["messages"][-1]
        if last["role"] == "tool":
            return Turn(content=f"Tool said: {last['content']}")
        text = last_user_text(request)
        if found := TEXT_FILE.search(text):
            return tool_call("read_file", {"path": found.group(1)})
        if text == "send the chart and the report":
            return tool_calls([("send_file", {"path": "chart.png", "caption": "The chart"}),
                               ("send_file", {"path": "report.pdf", "caption": "The report"})])
        if images := image_parts(request):
            return Turn(content=f"I see {len(images)} image(s).")
        return Turn(content=f"Echo: {text}")


@pytest.fixture(params=["telegram", "slack", "discord"])
async def chat(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[MediaChat, MediaModel,
                                                                                       ScriptedModel]]:
    """A user's chat on each platform, the model's responder and the model server."""
    model = MediaModel()
    async with ScriptedModel(model) as server, open_chat(request.param, server, tmp_path) as driver:
        yield driver, model, server


def _user_turn(request: JSON) -> JSON:
    return next(m for m in reversed(request["messages"]) if m["role"] == "user")


async def test_a_photo_with_and_without_caption_reaches_the_model_as_an_image(
        chat: tuple[MediaChat, MediaModel, ScriptedModel]) -> None:
    driver, model, _ = chat
    await driver.start({"model": {"vision": True}})
    await driver.send_photo(camera_jpeg(), caption="What is on this photo?")
    assert (await driver.texts(1))[0] == "I see 1 image(s)."
    await driver.send_photo(camera_jpeg(1200, 900))
    assert (await driver.texts(2))[1] == "I see 1 image(s)."
    with_caption, without = (_user_turn(r) for r in model.requests)
    assert last_user_text({"messages": [with_caption]}).startswith("What is on this photo?")
    assert "[image " in last_user_text({"messages": [without]})
    [big], [small] = image_parts(model.requests[0]), image_parts(model.requests[1])
    shown = decoded_image(big)
    assert max(shown.size) == 1568 and dict(shown.getexif()) == {}  # downscaled, no EXIF (GPS) left
    assert decoded_image(small).size == (1200, 900)


async def test_a_voice_note_is_transcribed_into_the_models_input(
        chat: tuple[MediaChat, MediaModel, ScriptedModel]) -> None:
    driver, model, server = chat
    voice = opus_silence(1.0)
    server.audio.set_transcript(voice, TRANSCRIPT)
    await driver.start({"media": {"transcription": {"model": "whisper-1"}}})
    await driver.send_voice(voice)
    [answer] = await driver.texts(1)
    assert TRANSCRIPT in last_user_text(model.requests[0])
    assert answer.startswith(f"🎤 {TRANSCRIPT}") and "Echo: " in answer
    [heard] = server.audio.transcriptions
    assert heard.data == voice and heard.model == "whisper-1"


async def test_a_voice_note_without_a_transcription_endpoint_is_one_clear_message(
        chat: tuple[MediaChat, MediaModel, ScriptedModel]) -> None:
    driver, model, server = chat
    await driver.start()
    await driver.send_voice(opus_silence(1.0))
    [answer] = await driver.texts(1)
    assert "no transcription endpoint is configured (media.transcription" in answer
    assert model.requests == [] and server.audio.transcriptions == []


async def test_a_pdfs_text_is_readable_with_read_file(chat: tuple[MediaChat, MediaModel, ScriptedModel],
                                                      tmp_path: Path) -> None:
    driver, model, _ = chat
    await driver.start()
    await driver.send_document(pdf_with_text(PDF_TEXT, "Second page."), "launch plan.pdf", "application/pdf")
    [answer] = await driver.texts(1)
    assert PDF_TEXT in answer  # the model read it with read_file
    [read] = [m for m in model.requests[-1]["messages"] if m["role"] == "tool"]
    assert PDF_TEXT in read["content"] and "Second page." in read["content"]
    [saved] = (tmp_path / "workspace" / "media").rglob("launch plan.pdf")
    assert saved.read_bytes().startswith(b"%PDF")


async def test_send_file_delivers_an_image_and_a_document_once_with_their_captions(
        chat: tuple[MediaChat, MediaModel, ScriptedModel], tmp_path: Path) -> None:
    driver, _, _ = chat
    workspace = tmp_path / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    chart, report = png_chart(), pdf_with_text("Quarterly report")
    (workspace / "chart.png").write_bytes(chart)
    (workspace / "report.pdf").write_bytes(report)
    gateway = await driver.start()
    await driver.send_text("send the chart and the report")
    [answer] = await driver.texts(1)
    assert answer.startswith("Tool said:") and '"status": "queued"' in answer, answer
    await _sent_everything(gateway)
    files = driver.files()
    assert [(f.name, f.data, f.caption) for f in files] == [("chart.png", chart, "The chart"),
                                                           ("report.pdf", report, "The report")]
    if driver.platform == "telegram":
        assert [f.shown_as for f in files] == ["photo", "document"]


async def test_refused_files_each_get_one_clear_message_and_no_model_call(
        chat: tuple[MediaChat, MediaModel, ScriptedModel]) -> None:
    driver, model, _ = chat
    await driver.start({"media": {"max_bytes": {"document": 2000}}})
    await driver.send_document(b"%PDF-1.7\n" + b"0" * 5000, "big.pdf", "application/pdf")
    assert "big.pdf: it is 4.9 KB, over the 2 KB limit for document files." in (await driver.texts(1))[0]
    await driver.send_photo(b"MZ\x90\x00" + b"\x00" * 400)  # an executable sent as a photo
    assert "not supported" in (await driver.texts(2))[1] or "its content is" in (await driver.texts(2))[1]
    driver.fail_downloads(3)
    await driver.send_document(pdf_with_text("x"), "plan.pdf", "application/pdf")
    assert "the download failed" in (await driver.texts(3))[2]
    assert model.requests == []
    assert len(await driver.texts(3)) == 3  # one message each


async def test_voice_on_brings_a_voice_message_back(chat: tuple[MediaChat, MediaModel, ScriptedModel]) -> None:
    driver, _, server = chat
    gateway = await driver.start({"media": {"speech": {"model": "tts-1", "voice": "nova"}}})
    await driver.send_text("/voice on")
    assert (await driver.texts(1))[0].startswith("Voice answers on")
    await driver.send_text("hello there")
    assert (await driver.texts(2))[1] == "Echo: hello there"
    await _sent_everything(gateway)
    [voice] = driver.files()
    assert sniff(voice.data, voice.name, None).mime == "audio/ogg"
    [spoken] = server.audio.speeches
    assert spoken.input == "Echo: hello there" and spoken.voice == "nova" and spoken.response_format == "opus"
    if driver.platform == "telegram":
        assert voice.shown_as == "voice"


async def _sent_everything(gateway: object) -> None:
    """Wait until the outbox has delivered every part (files go after the answer's text)."""
    outbox = gateway.outbox  # type: ignore[attr-defined]
    assert await outbox.flush(10.0)
