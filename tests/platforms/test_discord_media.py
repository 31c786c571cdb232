"""Discord files: attachments fetched from the CDN and files sent with a message, through real discord.py and
aiohttp against the simulator's REST API, gateway and CDN on 127.0.0.1."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import tests.platforms.test_discord as discord_suite
from gateway.sim.discord_api import ALICE_ID, GENERAL_ID, GUILD_ID, AttachmentSpec, DiscordSimulator
from gateway.sim.discord_files import CDN_ROUTE, VOICE_MESSAGE_FLAG, voice_message
from gateway.sim.model_media import opus_silence
from platforms.base import Accepted, AdapterState, Attachment, MessageEvent
from platforms.discord import DISCORD_API, DiscordAdapter, DiscordSettings, delivery_nonce
from platforms.discord_files import DEFAULT_UPLOAD_LIMIT, AttachmentDownloader
from platforms.files import AttachmentTooLarge, AttachmentUnavailable, OutgoingFile
from platforms.rich_text import to_discord

MIB = 1024 * 1024
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
TABLE = "| a | b |\n|---|---|\n| 1 | 2 |"  # Markdown that Discord gets as a code block


# the Discord fixtures of test_discord.py
sim, _discord_endpoints = discord_suite.sim, discord_suite._discord_endpoints


class _Inbox:
    """Stands in for the gateway's router: keeps every event."""

    def __init__(self) -> None:
        self.events: list[MessageEvent] = []

    async def __call__(self, event: MessageEvent) -> Accepted:
        self.events.append(event)
        return Accepted(run_id=None, duplicate=False)


Connect = Callable[[], Awaitable[tuple[DiscordAdapter, _Inbox]]]


@pytest.fixture
async def connect(sim: DiscordSimulator) -> AsyncIterator[Connect]:
    adapters: list[DiscordAdapter] = []

    async def _connect() -> tuple[DiscordAdapter, _Inbox]:
        adapter = DiscordAdapter(DiscordSettings(token=sim.token, api_base_url=sim.api_base_url,
                                                 gateway_url=sim.gateway_url, guild_ready_timeout=0.05,
                                                 heartbeat_timeout=0.75, reconnect_backoff=0.05))
        adapters.append(adapter)
        inbox = _Inbox()
        await adapter.connect(inbox)
        await sim.wait_for(lambda: adapter.state is AdapterState.CONNECTED)  # on_ready: the guilds are known
        return adapter, inbox

    yield _connect
    for adapter in adapters:
        await adapter.disconnect()


async def _attachments(sim: DiscordSimulator, inbox: _Inbox, *specs: AttachmentSpec) -> tuple[Attachment, ...]:
    """The attachments of a DM from Alice carrying ``specs``, as the adapter's event has them."""
    message = sim.user_sends_dm("see attached", attachments=specs)
    event = await sim.wait_for(lambda: next((e for e in inbox.events if e.event_id == message["id"]), None))
    return event.attachments


# --------------------------------------------------------------------------- fetching


async def test_an_attachment_is_fetched_from_the_cdn_without_the_bot_token(sim: DiscordSimulator,
                                                                          connect: Connect) -> None:
    adapter, inbox = await connect()
    photo, pdf = await _attachments(sim, inbox, AttachmentSpec("cat.png", "image/png", data=PNG),
                                    AttachmentSpec("notes.pdf", "application/pdf", size=300_000))
    assert await adapter.fetch_attachment(photo, max_bytes=len(PNG)) == PNG
    assert await adapter.fetch_attachment(pdf, max_bytes=MIB) == AttachmentSpec("notes.pdf", size=300_000).content()
    assert [(d.status, d.complete) for d in sim.downloads] == [(200, True), (200, True)]
    assert all("Authorization" not in d.headers for d in sim.downloads), "the CDN needs no credentials"


async def test_a_voice_message_is_a_voice_attachment_and_an_audio_file_is_audio(sim: DiscordSimulator,
                                                                                connect: Connect) -> None:
    adapter, inbox = await connect()
    ogg = opus_silence(2.5)
    spec = voice_message(ogg)
    assert (spec.duration_secs, len(spec.waveform or b"")) == (2.5, 25)
    voice_dm = sim.user_sends_dm("", attachments=[spec])
    assert voice_dm["flags"] == VOICE_MESSAGE_FLAG and voice_dm["attachments"][0]["duration_secs"] == 2.5
    (voice,) = await _attachments(sim, inbox, spec)
    (song,) = await _attachments(sim, inbox, AttachmentSpec("song.ogg", "audio/ogg", data=ogg))
    assert [(a.kind, a.name, a.mime_type) for a in (voice, song)] == [
        ("voice", "voice-message.ogg", "audio/ogg"), ("audio", "song.ogg", "audio/ogg")]
    assert await adapter.fetch_attachment(voice, max_bytes=MIB) == ogg
    with pytest.raises(ValueError, match="OGG/Opus"):
        voice_message(b"ID3 an mp3")


async def test_an_attachment_over_the_limit_is_refused_before_it_is_downloaded(sim: DiscordSimulator,
                                                                              connect: Connect) -> None:
    adapter, inbox = await connect()
    (big,) = await _attachments(sim, inbox, AttachmentSpec("huge.bin", size=24 * MIB))
    with pytest.raises(AttachmentTooLarge, match=r"huge\.bin"):
        await adapter.fetch_attachment(big, max_bytes=MIB)
    assert sim.downloads == [], "its stated size was enough to refuse it"
    unsized = dataclasses.replace(big, size=None)
    with pytest.raises(AttachmentTooLarge):  # the CDN's Content-Length says it
        await adapter.fetch_attachment(unsized, max_bytes=MIB)
    sim.cdn_chunked = True  # no Content-Length: the reading stops past the limit
    with pytest.raises(AttachmentTooLarge):
        await adapter.fetch_attachment(unsized, max_bytes=MIB)
    await sim.wait_for(lambda: len(sim.downloads) == 2 and all(d.done for d in sim.downloads))
    assert all(d.status == 200 and not d.complete and d.sent < d.size for d in sim.downloads), \
        "the adapter closed the connection instead of reading the whole body"
    (small,) = await _attachments(sim, inbox, AttachmentSpec("small.bin", size=MIB))
    assert len(await adapter.fetch_attachment(dataclasses.replace(small, size=None), max_bytes=MIB)) == MIB


async def test_download_failures_say_whether_a_retry_may_help(sim: DiscordSimulator, connect: Connect) -> None:
    adapter, inbox = await connect()
    (doc,) = await _attachments(sim, inbox, AttachmentSpec("doc.txt", "text/plain", data=b"hello"))
    sim.fail_next(CDN_ROUTE, status=500)
    with pytest.raises(AttachmentUnavailable, match="HTTP 500") as failed:
        await adapter.fetch_attachment(doc, max_bytes=MIB)
    assert failed.value.retryable
    sim.drop_next(CDN_ROUTE, n=2)  # aiohttp tries a GET on a reused connection twice
    with pytest.raises(AttachmentUnavailable) as dropped:
        await adapter.fetch_attachment(doc, max_bytes=MIB)
    assert dropped.value.retryable
    sim.clear_faults()
    sim.fail_next(CDN_ROUTE, status=404)
    with pytest.raises(AttachmentUnavailable, match="HTTP 404") as gone:
        await adapter.fetch_attachment(doc, max_bytes=MIB)
    assert not gone.value.retryable
    assert await adapter.fetch_attachment(doc, max_bytes=MIB) == b"hello"
    sim.attachment_url_ttl = -1  # links handed out from now on have expired
    (expired,) = await _attachments(sim, inbox, AttachmentSpec("old.txt", "text/plain", data=b"old"))
    with pytest.raises(AttachmentUnavailable, match="expired") as late:
        await adapter.fetch_attachment(expired, max_bytes=MIB)
    assert not late.value.retryable and sim.downloads[-1].status == 404
    tampered = dataclasses.replace(doc, url=(doc.url or "").replace("doc.txt", "old.txt"))
    with pytest.raises(AttachmentUnavailable, match="HTTP 404"):
        await adapter.fetch_attachment(tampered, max_bytes=MIB)


async def test_no_other_host_is_ever_asked(sim: DiscordSimulator, connect: Connect) -> None:
    adapter, inbox = await connect()
    async with DiscordSimulator() as elsewhere:
        (there,) = elsewhere.user_sends_dm("x", attachments=[AttachmentSpec("a.png", "image/png")])["attachments"]
        foreign = Attachment(kind="photo", file_id=there["id"], name="a.png", size=there["size"], url=there["url"])
        with pytest.raises(AttachmentUnavailable, match="not on Discord's CDN") as refused:
            await adapter.fetch_attachment(foreign, max_bytes=MIB)
        assert not refused.value.retryable
        (ours,) = await _attachments(sim, inbox, AttachmentSpec("b.png", "image/png"))
        sim.redirect_downloads_to = elsewhere.url  # the same path there holds nothing, but it must not be asked
        with pytest.raises(AttachmentUnavailable, match="HTTP 302"):
            await adapter.fetch_attachment(ours, max_bytes=MIB)
        assert elsewhere.downloads == [] and sim.downloads[-1].status == 302
    with pytest.raises(AttachmentUnavailable):
        await adapter.fetch_attachment(dataclasses.replace(ours, url=None), max_bytes=MIB)


def test_the_trusted_hosts_of_discord_itself() -> None:
    downloader = AttachmentDownloader(DISCORD_API)
    assert downloader.trusted("https://cdn.discordapp.com/attachments/1/2/a.png?ex=1&is=2&hm=3")
    assert downloader.trusted("https://media.discordapp.net/attachments/1/2/a.png")
    assert downloader.trusted("https://discord.com/api/v10/attachments/1/2/a.png")
    for url in ("http://cdn.discordapp.com/attachments/1/2/a.png", "https://cdn.discordapp.com.evil.example/a.png",
                "https://evil.example/attachments/1/2/a.png", "https://user@cdn.discordapp.com/a.png",
                "https://cdn.discordapp.com:8443/a.png", "/attachments/1/2/a.png", "not a url"):
        assert not downloader.trusted(url), url


# --------------------------------------------------------------------------- sending


async def test_each_kind_is_sent_with_its_bytes_caption_reply_and_thread(sim: DiscordSimulator,
                                                                        connect: Connect) -> None:
    adapter, inbox = await connect()
    thread = sim.create_thread("files")
    asked = sim.user_sends("send me the files", channel_id=thread, mention_bot=True)
    await sim.wait_for(lambda: inbox.events)
    files = [OutgoingFile("photo", "chart.png", "image/png", PNG),
             OutgoingFile("document", "report.pdf", "application/pdf", b"%PDF-1.7\n" + b"x" * 5000),
             OutgoingFile("voice", "answer.ogg", "audio/ogg", b"OggS" + b"\0" * 3000),
             OutgoingFile("audio", "song.mp3", "audio/mpeg", b"ID3" + b"\1" * 4000)]
    for file in files:
        sent = await adapter.send_file(str(GENERAL_ID), file, caption=TABLE, reply_to=asked["id"],
                                       metadata={"thread_id": str(thread), "delivery_id": f"run:r1:{file.kind}"})
        assert sent.success, sent.error
    stored = sim.bot_files(thread)
    assert [(f.filename, f.content_type, f.data) for f in stored] == [
        ("chart.png", "image/png", files[0].data), ("report.pdf", "application/pdf", files[1].data),
        ("answer.ogg", "audio/ogg", files[2].data), ("song.mp3", "audio/mpeg", files[3].data)]
    messages = sim.bot_messages(thread)
    assert [m["content"] for m in messages] == [to_discord(TABLE)] * 4 and to_discord(TABLE).startswith("```")
    assert {m["message_reference"]["message_id"] for m in messages} == {asked["id"]}
    calls = sim.calls_of("create_message")
    assert [c.body["nonce"] for c in calls] == [delivery_nonce(f"run:r1:{f.kind}") for f in files]
    assert all(c.body["enforce_nonce"] is True and [p.name for p in c.files] == ["files[0]"] for c in calls)
    assert sim.bot_messages(GENERAL_ID) == []
    bare = await adapter.send_file(str(sim.dm_channel_id()), files[0])
    (dm,) = sim.bot_messages(sim.dm_channel_id())
    assert bare.message_id == dm["id"] and dm["content"] == "" and "message_reference" not in dm
    assert [a["filename"] for a in dm["attachments"]] == ["chart.png"]


async def test_a_file_resent_in_doubt_arrives_once(sim: DiscordSimulator, connect: Connect) -> None:
    adapter, _ = await connect()
    chat = str(sim.dm_channel_id())
    file = OutgoingFile("document", "notes.txt", "text/plain", b"remember the milk")
    sim.drop_next("create_message", after_apply=True)  # posted, and the answer lost
    lost = await adapter.send_file(chat, file, caption="notes", metadata={"delivery_id": "run:r2:0"})
    assert not lost.success and lost.retryable
    again = await adapter.send_file(chat, file, caption="notes", metadata={"delivery_id": "run:r2:0",
                                                                          "in_doubt": "1"})
    (message,) = sim.bot_messages()
    assert again.success and again.message_id == message["id"]
    assert [f.data for f in sim.bot_files()] == [b"remember the milk"]
    assert len(sim.calls_of("create_message")) == 2


async def test_send_failures_map_as_for_text(sim: DiscordSimulator, connect: Connect) -> None:
    adapter, _ = await connect()
    chat = str(sim.dm_channel_id())
    file = OutgoingFile("photo", "a.png", "image/png", PNG)
    sim.fail_next("create_message", status=429, retry_after=45)
    limited = await adapter.send_file(chat, file)
    assert (limited.success, limited.retryable, limited.retry_after) == (False, True, 45)
    sim.fail_next("create_message", status=403, code=50013, message="Missing Permissions")
    forbidden = await adapter.send_file(chat, file)
    assert not forbidden.retryable and "Missing Permissions" in (forbidden.error or "")
    sim.drop_next("create_message")
    assert (await adapter.send_file(chat, file)).retryable
    assert sim.bot_messages() == []


async def test_a_file_too_large_gets_a_clear_final_error(sim: DiscordSimulator, connect: Connect) -> None:
    adapter, _ = await connect()
    chat = str(sim.dm_channel_id())
    assert adapter.upload_limit("document", chat) == DEFAULT_UPLOAD_LIMIT == 10 * MIB
    over = OutgoingFile("document", "big.bin", "application/octet-stream", b"\0" * (10 * MIB + 1))
    refused = await adapter.send_file(chat, over)
    assert not refused.success and not refused.retryable and "over the upload limit" in (refused.error or "")
    assert sim.calls_of("create_message") == [], "refused before uploading"
    sim.default_upload_limit = 1000  # Discord's limit is lower than the adapter knew
    rejected = await adapter.send_file(chat, OutgoingFile("document", "b.bin", "application/octet-stream",
                                                          b"\0" * 2000))
    assert not rejected.success and not rejected.retryable
    assert "too large" in (rejected.error or "") and "413" in rejected.error and "40005" in rejected.error
    assert sim.bot_messages() == []


async def test_a_boosted_guild_takes_larger_files(sim: DiscordSimulator, connect: Connect) -> None:
    sim.set_premium_tier(2, GUILD_ID)
    adapter, _ = await connect()
    assert adapter.upload_limit("photo", str(GENERAL_ID)) == 50 * MIB
    assert adapter.upload_limit("photo", str(sim.dm_channel_id(ALICE_ID))) == 10 * MIB
    assert adapter.upload_limit("photo") == 10 * MIB
    data = bytes(range(256)) * (10 * MIB // 256 + 1)
    sent = await adapter.send_file(str(GENERAL_ID), OutgoingFile("document", "big.bin", "application/octet-stream",
                                                                 data))
    assert sent.success, sent.error
    assert [f.data == data for f in sim.bot_files(GENERAL_ID)] == [True]
