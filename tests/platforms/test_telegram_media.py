"""Telegram files: getFile plus a capped download, and sendPhoto / sendDocument / sendVoice / sendAudio uploads.

The real python-telegram-bot and httpx against the Bot API simulator (gateway/sim/telegram_files.py), no mocks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gateway.sim.telegram_api import DEFAULT_SUPERGROUP_ID, DEFAULT_USER_ID, TelegramSimulator
from platforms.base import Accepted, Attachment, MessageEvent, SendResult, utf16_len
from platforms.files import AttachmentTooLarge, AttachmentUnavailable, OutgoingFile
from platforms.telegram import TelegramAdapter, TelegramSettings
from platforms.telegram_files import PHOTO_UPLOAD_LIMIT, UPLOAD_LIMIT

MB = 1_000_000
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(range(256)) * 8 + b"\xff\xd9"
OGG = b"OggS\x00\x02" + b"opus voice " * 50
MP3 = b"ID3\x04\x00" + b"mp3 frames " * 50
PDF = b"%PDF-1.4\n" + b"report " * 300
CAPTION = "**Q3** chart, see `data.csv`"
FILES = {
    "photo": OutgoingFile("photo", "chart.jpg", "image/jpeg", JPEG),
    "document": OutgoingFile("document", "report.pdf", "application/pdf", PDF),
    "voice": OutgoingFile("voice", "answer.ogg", "audio/ogg", OGG),
    "audio": OutgoingFile("audio", "song.mp3", "audio/mpeg", MP3),
}

Connect = Callable[..., Awaitable[tuple[TelegramAdapter, list[MessageEvent]]]]


@pytest.fixture
async def sim() -> AsyncIterator[TelegramSimulator]:
    async with TelegramSimulator() as simulator:
        yield simulator


@pytest.fixture
async def connect(sim: TelegramSimulator) -> AsyncIterator[Connect]:
    """Connect an adapter (settings as given) that polls the simulator; all are disconnected at teardown."""
    adapters: list[TelegramAdapter] = []

    async def start(**settings: Any) -> tuple[TelegramAdapter, list[MessageEvent]]:
        events: list[MessageEvent] = []

        async def on_message(event: MessageEvent) -> Accepted:
            events.append(event)
            return Accepted(None, False)

        adapter = TelegramAdapter(TelegramSettings(token=sim.token, base_url=sim.base_url,
                                                   base_file_url=sim.base_file_url, poll_timeout=1, **settings))
        adapters.append(adapter)
        await adapter.connect(on_message)
        return adapter, events

    yield start
    for adapter in adapters:
        await adapter.disconnect()


async def _attachment(sim: TelegramSimulator, events: list[MessageEvent], send: Callable[[], object]) -> Attachment:
    """The attachment of the message ``send`` makes a user send, as the adapter's event carries it."""
    before = len(events)
    send()
    await sim.wait_for(lambda: len(events) > before)
    [attachment] = events[-1].attachments
    return attachment


def _unsized(file_id: str) -> Attachment:
    """An attachment whose event stated no size."""
    return Attachment("document", file_id)


# ------------------------------------------------------------------ downloads


async def test_each_kind_of_attachment_is_fetched_with_get_file_and_the_file_path(sim: TelegramSimulator,
                                                                                  connect: Connect) -> None:
    adapter, events = await connect()
    photo = await _attachment(sim, events, lambda: sim.user_sends_photo(JPEG))
    doc = await _attachment(sim, events, lambda: sim.user_sends_document(PDF, "report.pdf", caption="read this"))
    voice = await _attachment(sim, events, lambda: sim.user_sends_voice(OGG, duration=3))
    audio = await _attachment(sim, events, lambda: sim.user_sends_audio(MP3, "song.mp3", duration=200))
    assert [(a.kind, a.name, a.mime_type, a.size) for a in (photo, doc, voice, audio)] == [
        ("photo", None, "image/jpeg", len(JPEG)), ("document", "report.pdf", "application/pdf", len(PDF)),
        ("voice", None, "audio/ogg", len(OGG)), ("audio", "song.mp3", "audio/mpeg", len(MP3))]
    assert [await adapter.fetch_attachment(a, max_bytes=MB) for a in (photo, doc, voice, audio)] == [
        JPEG, PDF, OGG, MP3]
    assert [c.params["file_id"] for c in sim.calls_of("getFile")] == [a.file_id for a in (photo, doc, voice, audio)]
    assert [(d.status, d.complete) for d in sim.downloads] == [(200, True)] * 4
    assert await adapter.fetch_attachment(doc, max_bytes=len(PDF)) == PDF, "exactly at the limit is within it"


async def test_a_file_over_the_limit_is_refused_before_it_is_downloaded(sim: TelegramSimulator,
                                                                       connect: Connect) -> None:
    adapter, events = await connect(max_attachment_bytes=2000)
    doc = await _attachment(sim, events, lambda: sim.user_sends_document(PDF, "report.pdf"))
    with pytest.raises(AttachmentTooLarge, match=r"report\.pdf"):
        await adapter.fetch_attachment(doc, max_bytes=len(PDF) - 1)
    assert sim.calls_of("getFile") == [], "the event's size was enough to refuse it"
    with pytest.raises(AttachmentTooLarge):  # getFile's file_size says it
        await adapter.fetch_attachment(_unsized(doc.file_id), max_bytes=len(PDF) - 1)
    with pytest.raises(AttachmentTooLarge, match="2000 bytes"):  # max_attachment_bytes caps a larger max_bytes
        await adapter.fetch_attachment(_unsized(doc.file_id), max_bytes=MB)
    assert len(sim.calls_of("getFile")) == 2 and sim.downloads == []


async def test_a_download_of_unstated_size_stops_at_the_limit(sim: TelegramSimulator, connect: Connect) -> None:
    adapter, _ = await connect(max_attachment_bytes=64 * MB)
    sim.download_limit = 64 * MB  # as a local Bot API server hands out large files
    big = sim.add_file(bytes(40 * MB), "big.bin", sized=False)  # getFile says no file_size
    with pytest.raises(AttachmentTooLarge):  # the Content-Length says it
        await adapter.fetch_attachment(_unsized(big), max_bytes=MB)
    sim.chunked_downloads = True  # no Content-Length either: the reading stops past the limit
    with pytest.raises(AttachmentTooLarge):
        await adapter.fetch_attachment(_unsized(big), max_bytes=MB)
    await sim.wait_for(lambda: len(sim.downloads) == 2 and all(d.done for d in sim.downloads))
    assert all(d.status == 200 and not d.complete and d.sent < d.size / 2 for d in sim.downloads), \
        "the adapter closed the connection instead of reading the whole body"
    small = sim.add_file(bytes(range(256)) * 4096, "small.bin", sized=False)  # 1 MiB, chunked
    assert await adapter.fetch_attachment(_unsized(small), max_bytes=1024 * 1024) == bytes(range(256)) * 4096


async def test_a_file_over_the_bot_apis_download_limit_is_unavailable_for_good(sim: TelegramSimulator,
                                                                              connect: Connect) -> None:
    adapter, _ = await connect()
    sim.download_limit = 1000  # Telegram's is 20 MB
    huge = sim.add_file(bytes(1001), "huge.bin")
    with pytest.raises(AttachmentUnavailable, match="download limit") as refused:
        await adapter.fetch_attachment(_unsized(huge), max_bytes=MB)
    assert not refused.value.retryable
    assert sim.calls_of("getFile")[0].response == {"ok": False, "error_code": 400,
                                                   "description": "Bad Request: file is too big"}
    assert sim.downloads == []


@pytest.mark.parametrize(("fault", "retryable"), [
    (lambda sim: sim.fail_next_download(404), False),  # the file_path expired or the file is gone
    (lambda sim: sim.fail_next_download(403), False),
    (lambda sim: sim.fail_next_download(500), True),
    (lambda sim: sim.fail_next_download(429), True),
    (lambda sim: sim.drop_next_download(), True),  # the connection closed: the network
    (lambda sim: sim.fail_next("getFile", error_code=429, retry_after=1), True),
    (lambda sim: sim.fail_next("getFile", error_code=502), True),
    (lambda sim: sim.drop_next("getFile"), True),
    (lambda sim: sim.fail_next("getFile", error_code=400, description="Bad Request: invalid file_id"), False),
    (lambda sim: sim.fail_next("getFile", error_code=403, description="Forbidden: bot was kicked"), False),
])
async def test_a_failed_download_says_whether_trying_again_may_help(sim: TelegramSimulator, connect: Connect,
                                                                    fault: Callable[[TelegramSimulator], None],
                                                                    retryable: bool) -> None:
    adapter, _ = await connect()
    doc = _unsized(sim.add_file(PDF, "report.pdf"))
    fault(sim)
    with pytest.raises(AttachmentUnavailable) as failed:
        await adapter.fetch_attachment(doc, max_bytes=MB)
    assert failed.value.retryable is retryable
    assert sim.token not in str(failed.value), "the download URL carries the bot token"
    assert await adapter.fetch_attachment(doc, max_bytes=MB) == PDF, "the fault was one-off"


# ------------------------------------------------------------------ sending


@pytest.mark.parametrize("kind", list(FILES))
async def test_each_kind_is_sent_with_its_bytes_name_caption_reply_and_topic(sim: TelegramSimulator,
                                                                             connect: Connect, kind: str) -> None:
    adapter, _ = await connect()
    sim.user_sends("hi", chat_type="supergroup", message_thread_id=7)
    question = sim.user_sends("send me the file", chat_type="supergroup", message_thread_id=7)["message"]
    file = FILES[kind]
    sent = await adapter.send_file(str(DEFAULT_SUPERGROUP_ID), file, CAPTION, reply_to=str(question["message_id"]),
                                   metadata={"thread_id": "7", "delivery_id": "d1"})
    [media] = sim.sent_media(DEFAULT_SUPERGROUP_ID)
    assert sent == SendResult(True, message_id=str(media.message_id))
    method = {"photo": "sendPhoto", "document": "sendDocument", "voice": "sendVoice", "audio": "sendAudio"}[kind]
    upload = media.files[kind]
    assert (media.method, upload.data, upload.filename, upload.content_type) == (method, file.data, file.name,
                                                                                file.mime_type)
    assert kind in media.result, f"Telegram shows it as a {kind}"
    assert (media.text, media.parse_mode) == ("Q3 chart, see data.csv", "HTML")
    assert [(e["type"], e["offset"], e["length"]) for e in media.result["caption_entities"]] == [
        ("bold", 0, 2), ("code", 14, 8)]
    assert (media.result["reply_to_message"]["message_id"], media.message_thread_id) == (question["message_id"], 7)


async def test_a_file_without_caption_has_none_and_goes_with_its_sniffed_type(sim: TelegramSimulator,
                                                                              connect: Connect) -> None:
    adapter, _ = await connect()
    sim.user_sends("hi")
    saved_as = OutgoingFile("document", "upload.bin", "application/pdf", PDF)  # the name suggests no type
    assert (await adapter.send_file(str(DEFAULT_USER_ID), saved_as)).success
    [media] = sim.sent_media(DEFAULT_USER_ID)
    assert "caption" not in media.result and media.files["document"].data == PDF
    assert media.result["document"]["mime_type"] == "application/pdf"


async def test_a_caption_over_telegrams_limit_is_cut_cleanly(sim: TelegramSimulator, connect: Connect) -> None:
    adapter, _ = await connect()
    sim.user_sends("hi")
    words = " ".join(f"**word{i}**" for i in range(300))  # 300 bold words: 2,389 characters shown
    assert (await adapter.send_file(str(DEFAULT_USER_ID), FILES["photo"], words)).success
    [media] = sim.sent_media(DEFAULT_USER_ID)
    shown = media.text or ""
    assert 1000 < utf16_len(shown) <= 1024
    assert shown == " ".join(f"word{i}" for i in range(len(shown.split()))), "cut between words, at the start"
    assert all(e["type"] == "bold" for e in media.result["caption_entities"])


async def test_a_caption_telegram_cannot_parse_goes_as_plain_text(sim: TelegramSimulator, connect: Connect) -> None:
    adapter, _ = await connect(parse_mode="markdown")
    sim.user_sends("hi")
    assert (await adapter.send_file(str(DEFAULT_USER_ID), FILES["document"], "2*3 = 6")).success
    rejected, accepted = sim.calls_of("sendDocument")
    assert rejected.status == 400 and "can't parse entities" in (rejected.response or {})["description"]
    assert "parse_mode" not in accepted.params and sim.sent_media()[0].text == "2*3 = 6"


async def test_send_failures_map_as_for_text(sim: TelegramSimulator, connect: Connect) -> None:
    adapter, _ = await connect()
    sim.user_sends("hi")
    chat = str(DEFAULT_USER_ID)
    sim.fail_next("sendPhoto", error_code=429, retry_after=4)
    flood = await adapter.send_file(chat, FILES["photo"], "x")
    assert (flood.success, flood.retryable, flood.retry_after) == (False, True, 4.0)
    sim.fail_next("sendVoice", error_code=502)
    assert (await adapter.send_file(chat, FILES["voice"])).retryable
    missing = await adapter.send_file("424242", FILES["document"])
    assert (missing.success, missing.retryable, missing.error) == (False, False, "Chat not found")
    sim.upload_limit = 100  # the Bot API's front end refuses the body: final, not retried
    too_large = await adapter.send_file(chat, FILES["audio"])
    assert (too_large.success, too_large.retryable) == (False, False) and "Too Large" in (too_large.error or "")
    sim.user_blocks_bot(DEFAULT_USER_ID)
    blocked = await adapter.send_file(chat, FILES["document"])
    assert (blocked.retryable, blocked.error) == (False, "Forbidden: bot was blocked by the user")
    assert sim.sent_media() == []


async def test_a_file_over_the_upload_limit_is_refused_unsent(sim: TelegramSimulator, connect: Connect) -> None:
    adapter, _ = await connect()
    assert [adapter.upload_limit(kind) for kind in FILES] == [10 * MB, 50 * MB, 50 * MB, 50 * MB]
    assert (PHOTO_UPLOAD_LIMIT, UPLOAD_LIMIT) == (10 * MB, 50 * MB)
    big_photo = OutgoingFile("photo", "big.jpg", "image/jpeg", JPEG + bytes(10 * MB))
    refused = await adapter.send_file(str(DEFAULT_USER_ID), big_photo, "x")
    assert (refused.success, refused.retryable) == (False, False) and "big.jpg" in (refused.error or "")
    assert sim.calls_of("sendPhoto") == []


async def test_a_file_in_doubt_is_sent_again(sim: TelegramSimulator, connect: Connect) -> None:
    """The Bot API can neither look a message up nor drop a repeat: a file whose answer was lost arrives twice
    rather than never (at least once, as text)."""
    adapter, _ = await connect()
    sim.user_sends("hi")
    sim.drop_next("sendDocument", after_apply=True)
    lost = await adapter.send_file(str(DEFAULT_USER_ID), FILES["document"], "the report",
                                   metadata={"delivery_id": "d1"})
    assert (lost.success, lost.retryable) == (False, True)
    again = await adapter.send_file(str(DEFAULT_USER_ID), FILES["document"], "the report",
                                    metadata={"delivery_id": "d1", "in_doubt": "1"})
    assert again.success
    assert [(m.text, m.files["document"].data) for m in sim.sent_media()] == [("the report", PDF)] * 2
    assert again.message_id == str(sim.sent_media()[-1].message_id)


async def test_a_voice_note_telegram_cannot_play_shows_as_a_file(sim: TelegramSimulator, connect: Connect) -> None:
    adapter, _ = await connect()
    sim.user_sends("hi")
    wav = OutgoingFile("voice", "answer.wav", "audio/wav", b"RIFF\x00\x00\x00\x00WAVEfmt " + bytes(64))
    assert (await adapter.send_file(str(DEFAULT_USER_ID), wav)).success
    assert (await adapter.send_file(str(DEFAULT_USER_ID), FILES["voice"])).success
    shown = [("voice" in m.result, "document" in m.result) for m in sim.sent_media()]
    assert shown == [(False, True), (True, False)], "OGG/Opus is what a voice note must be"
