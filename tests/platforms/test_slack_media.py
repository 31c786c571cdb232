"""Slack files: downloads of shared files with the bot token and uploads with the upload v2 flow, exactly once.

The real slack_sdk / slack-bolt and aiohttp against the Slack simulator (gateway/sim/slack_files.py), no mocks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

import tests.platforms.test_slack as slack_suite
from gateway.sim.slack_api import DEFAULT_CHANNEL, DEFAULT_USER, SlackSimulator
from gateway.sim.slack_files import LOGIN_PAGE, SimFile
from gateway.state_stores import PlatformStateStore
from gateway.store import Store
from platforms.base import Attachment, PlatformState
from platforms.files import OUTGOING_KINDS, AttachmentTooLarge, AttachmentUnavailable, OutgoingFile
from platforms.slack import SlackAdapter, to_mrkdwn
from platforms.slack_files import UPLOAD_LIMIT, UPLOAD_STATE_PREFIX, file_origins
from tests.platforms.test_slack import _Inbox, _settings

sim = slack_suite.sim  # the simulator fixture of test_slack.py

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8
PDF = b"%PDF-1.4\n" + b"report " * 300
CAPTION = "**Q3** chart, see `data.csv`"


@pytest.fixture
async def state(tmp_path: Path) -> AsyncIterator[PlatformStateStore]:
    store = await Store.open(f"sqlite:///{tmp_path}/state.db")
    yield PlatformStateStore(store)
    await store.close()


async def _connected(sim: SlackSimulator, inbox: _Inbox | None = None,
                     state: PlatformState | None = None) -> SlackAdapter:
    adapter = SlackAdapter(_settings(sim))
    adapter.state_store = state
    await adapter.connect(inbox or _Inbox())
    return adapter


@pytest.fixture
def inbox() -> _Inbox:
    return _Inbox()


@pytest.fixture
async def adapter(sim: SlackSimulator, inbox: _Inbox, state: PlatformStateStore) -> AsyncIterator[SlackAdapter]:
    connected = await _connected(sim, inbox, state)
    yield connected
    await connected.disconnect()


async def _shared(sim: SlackSimulator, inbox: _Inbox, file: SimFile) -> Attachment:
    """``file`` shared with the bot in a DM, as the adapter's event carries it."""
    before = len(inbox.events)
    await sim.user_sends_dm("have a look", files=[file])
    await sim.wait_for(lambda: len(inbox.events) > before)
    [attachment] = inbox.events[-1].attachments
    return attachment


def _png(name: str = "chart.png") -> OutgoingFile:
    return OutgoingFile("photo", name, "image/png", PNG)


# ------------------------------------------------------------------ downloads


async def test_a_shared_file_is_downloaded_with_the_bot_token(sim: SlackSimulator, adapter: SlackAdapter,
                                                              inbox: _Inbox) -> None:
    file = sim.user_file("chart.png", PNG, "image/png")
    attachment = await _shared(sim, inbox, file)
    assert (attachment.kind, attachment.file_id, attachment.name, attachment.mime_type, attachment.size) == (
        "photo", file.id, "chart.png", "image/png", len(PNG))
    assert attachment.url == f"http://127.0.0.1:{sim.port}/files-pri/{sim.team_id}-{file.id}/download/chart.png"

    assert await adapter.fetch_attachment(attachment, max_bytes=len(PNG)) == PNG
    [download] = sim.downloads
    assert (download.token, download.served, download.path) == (sim.bot_token, "file", attachment.url.split(
        str(sim.port))[1])

    # a file the event names by id only (Slack Connect's check_file_info): its URL comes from files.info
    notes = sim.user_file("notes.pdf", PDF, "application/pdf", check_file_info=True)
    hidden = await _shared(sim, inbox, notes)
    assert (hidden.file_id, hidden.url, hidden.name) == (notes.id, None, None)
    assert await adapter.fetch_attachment(hidden, max_bytes=len(PDF)) == PDF
    assert sim.calls_of("files.info")[-1].params["file"] == hidden.file_id


async def test_files_shared_in_a_channel_thread_arrive_with_their_messages(sim: SlackSimulator, adapter: SlackAdapter,
                                                                           inbox: _Inbox) -> None:
    chart, notes = sim.user_file("chart.png", PNG, "image/png"), sim.user_file("notes.pdf", PDF, "application/pdf")
    mention = await sim.user_mentions_bot("what is this?", files=[chart])
    await sim.wait_for(lambda: len(inbox.events) == 1)
    await sim.user_replies_in_thread(mention.ts, "and this", files=[notes])  # the bot's thread: no mention needed
    await sim.wait_for(lambda: len(inbox.events) == 2)
    assert [(e.text, e.thread_id, [(a.kind, a.file_id) for a in e.attachments]) for e in inbox.events] == [
        ("what is this?", mention.ts, [("photo", chart.id)]), ("and this", mention.ts, [("file", notes.id)])]
    assert [await adapter.fetch_attachment(e.attachments[0], max_bytes=10**6) for e in inbox.events] == [PNG, PDF]
    assert [s.channel for s in chart.shares + notes.shares] == [DEFAULT_CHANNEL, DEFAULT_CHANNEL]


async def test_a_file_over_the_limit_is_refused_without_reading_it_all(sim: SlackSimulator, adapter: SlackAdapter,
                                                                      inbox: _Inbox) -> None:
    attachment = await _shared(sim, inbox, sim.user_file("chart.png", PNG, "image/png"))
    with pytest.raises(AttachmentTooLarge):
        await adapter.fetch_attachment(attachment, max_bytes=len(PNG) - 1)  # over by its Content-Length
    assert await adapter.fetch_attachment(attachment, max_bytes=len(PNG)) == PNG  # exactly the limit is fine

    sim.stream_download_next()  # no Content-Length, and the body never ends
    with pytest.raises(AttachmentTooLarge):
        await adapter.fetch_attachment(attachment, max_bytes=100_000)
    stream = sim.downloads[-1]
    await sim.wait_for(lambda: stream.hung_up)  # the adapter stopped reading and closed the connection
    assert stream.served == "stream" and stream.bytes_sent < 64 * 1024 * 1024


async def test_slack_sign_in_page_is_not_taken_for_the_file(sim: SlackSimulator, adapter: SlackAdapter,
                                                            inbox: _Inbox) -> None:
    attachment = await _shared(sim, inbox, sim.user_file("chart.png", PNG, "image/png"))
    assert attachment.url is not None
    # what Slack does: a request without the bot token gets the sign-in page, with status 200
    async with aiohttp.ClientSession() as session, session.get(attachment.url) as response:
        assert (response.status, response.content_type, await response.text()) == (200, "text/html", LOGIN_PAGE)

    sim.scopes.discard("files:read")  # the app was installed without files:read
    with pytest.raises(AttachmentUnavailable, match=r"sign-in page.*files:read") as refused:
        await adapter.fetch_attachment(attachment, max_bytes=len(PNG))
    assert not refused.value.retryable and sim.downloads[-1].served == "sign-in page"
    sim.scopes.add("files:read")

    sim.fail_download_next(302)  # a redirect to the sign-in page is not followed with the token
    with pytest.raises(AttachmentUnavailable, match=r"redirected.*files:read") as redirected:
        await adapter.fetch_attachment(attachment, max_bytes=len(PNG))
    assert not redirected.value.retryable and len(sim.downloads) == 3

    # an HTML file a user shared is a file like any other
    page = await _shared(sim, inbox, sim.user_file("page.html", b"<html>mine</html>", "text/html"))
    assert await adapter.fetch_attachment(page, max_bytes=100) == b"<html>mine</html>"


async def test_failed_downloads_say_whether_trying_again_may_help(sim: SlackSimulator, adapter: SlackAdapter,
                                                                  inbox: _Inbox) -> None:
    attachment = await _shared(sim, inbox, sim.user_file("chart.png", PNG, "image/png"))
    for status, retryable in ((404, False), (403, False), (500, True), (503, True), (429, True)):
        sim.fail_download_next(status)
        with pytest.raises(AttachmentUnavailable, match=f"HTTP {status}") as failed:
            await adapter.fetch_attachment(attachment, max_bytes=len(PNG))
        assert failed.value.retryable is retryable
    gone = Attachment("file", "F0NOSUCH", "gone.txt")  # no URL, and files.info does not know it
    with pytest.raises(AttachmentUnavailable, match="file_not_found") as unknown:
        await adapter.fetch_attachment(gone, max_bytes=100)
    assert not unknown.value.retryable
    assert await adapter.fetch_attachment(attachment, max_bytes=len(PNG)) == PNG


async def test_the_bot_token_never_goes_to_another_host(sim: SlackSimulator, adapter: SlackAdapter) -> None:
    seen: list[dict[str, str]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.Response(body=PNG, content_type="image/png")

    app = web.Application()
    app.router.add_get("/{path:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        foreign = f"http://127.0.0.1:{runner.addresses[0][1]}/files-pri/T0TEAM-F0X/chart.png"
        slack_path = f"/files-pri/{sim.team_id}-F0X/chart.png"
        for url in (foreign, f"http://localhost:{sim.port}{slack_path}", f"https://127.0.0.1:{sim.port}{slack_path}"):
            with pytest.raises(AttachmentUnavailable, match="not on Slack") as refused:
                await adapter.fetch_attachment(Attachment("photo", "F0X", "chart.png", url=url), max_bytes=10**6)
            assert not refused.value.retryable
        assert seen == [] and sim.downloads == []  # nothing was even asked of the other hosts
    finally:
        await runner.cleanup()

    slack = file_origins("https://slack.com/api/")
    assert {("https", "slack.com", 443), ("https", "files.slack.com", 443)} == set(slack)
    for url in ("https://files.slack.com.example.net/x", "http://files.slack.com/x", "https://example.slack.com/x",
                "https://files.slack.com:8443/x"):
        with pytest.raises(AttachmentUnavailable, match="not on Slack"):
            await adapter.fetch_attachment(Attachment("file", "F0Y", url=url), max_bytes=10)


# ------------------------------------------------------------------ uploads


async def test_send_file_uploads_with_v2_and_shares_in_the_thread(sim: SlackSimulator, adapter: SlackAdapter,
                                                                 state: PlatformStateStore) -> None:
    assert {adapter.upload_limit(kind) for kind in OUTGOING_KINDS} == {UPLOAD_LIMIT}
    mention = await sim.user_mentions_bot("plot Q3")
    meta = {"delivery_id": "run:r1:1", "thread_id": mention.ts, "part_index": "1"}
    result = await adapter.send_file(DEFAULT_CHANNEL, _png(), CAPTION, metadata=meta)

    [ticket] = sim.calls_of("files.getUploadURLExternal")
    assert (ticket.params["filename"], int(ticket.params["length"])) == ("chart.png", len(PNG))
    [upload] = sim.uploads
    assert (upload.data, upload.status, upload.authorization) == (PNG, 200, None)  # the URL is signed: no token
    [file] = sim.bot_files
    assert (file.id, file.title, file.data) == (upload.file_id, "chart.png", PNG)
    assert await state.load(f"{UPLOAD_STATE_PREFIX}run:r1:1") == file.id
    [share] = sim.messages(DEFAULT_CHANNEL)
    assert (share.text, share.thread_ts, share.files and share.files[0]["id"]) == (
        to_mrkdwn(CAPTION), mention.ts, file.id)
    assert result.success and result.message_id == share.ts
    assert share.text != CAPTION  # the caption went as mrkdwn, as send formats text

    # a document at the top level of a DM, without a caption; a voice note goes as a plain file
    dm = sim.dm_channel(DEFAULT_USER)
    doc = await adapter.send_file(dm, OutgoingFile("document", "report.pdf", "application/pdf", PDF),
                                  metadata={"delivery_id": "run:r1:2"})
    voice = await adapter.send_file(dm, OutgoingFile("voice", "answer.ogg", "audio/ogg", b"OggS" + b"\0" * 60))
    shares = sim.messages(dm)
    assert [(m.text, m.thread_ts, m.files and m.files[0]["name"]) for m in shares] == [
        ("", None, "report.pdf"), ("", None, "answer.ogg")]
    assert (doc.message_id, voice.message_id) == (shares[0].ts, shares[1].ts)
    assert [u.data[:4] for u in sim.uploads[1:]] == [b"%PDF", b"OggS"]


async def test_a_share_slack_shows_late_is_found_in_files_info(sim: SlackSimulator, adapter: SlackAdapter) -> None:
    sim.share_lag = 0.25  # Slack shares asynchronously: the completion's answer does not show it yet
    result = await adapter.send_file(DEFAULT_CHANNEL, _png(), "late", metadata={"delivery_id": "run:r2:0"})
    [share] = sim.messages(DEFAULT_CHANNEL)
    assert result.success and result.message_id == share.ts
    [complete] = sim.calls_of("files.completeUploadExternal")
    assert complete.response is not None and complete.response["files"][0]["shares"] == {}
    assert len(sim.calls_of("files.info")) >= 2  # polled until the share showed


async def test_send_file_errors_map_as_for_text(sim: SlackSimulator, adapter: SlackAdapter) -> None:
    sim.rate_limit_next("files.getUploadURLExternal", retry_after=7)
    limited = await adapter.send_file(DEFAULT_CHANNEL, _png())
    assert (limited.success, limited.retryable, limited.retry_after) == (False, True, 7.0)
    sim.scopes.discard("files:write")
    refused = await adapter.send_file(DEFAULT_CHANNEL, _png())
    assert (refused.success, refused.retryable, refused.error) == (False, False, "slack: missing_scope")
    sim.scopes.add("files:write")
    sim.server_error_next("files.getUploadURLExternal")
    assert (await adapter.send_file(DEFAULT_CHANNEL, _png())).retryable
    assert sim.uploads == [] and sim.messages(DEFAULT_CHANNEL) == []


# ------------------------------------------------------------------ exactly once


async def test_a_crash_between_upload_and_completion_ends_in_one_share(sim: SlackSimulator,
                                                                      state: PlatformStateStore) -> None:
    first = await _connected(sim, state=state)
    meta = {"delivery_id": "run:r3:0", "part_index": "0"}
    sim.server_error_next("files.completeUploadExternal")  # the bytes are up; the completion never happened
    try:
        failed = await first.send_file(DEFAULT_CHANNEL, _png(), CAPTION, metadata=meta)
    finally:
        await first.disconnect()
    assert (failed.success, failed.retryable) == (False, True)
    assert len(sim.uploads) == 1 and sim.messages(DEFAULT_CHANNEL) == []

    restarted = await _connected(sim, state=state)  # the outbox sends the part again, in doubt
    try:
        sent = await restarted.send_file(DEFAULT_CHANNEL, _png(), CAPTION, metadata={**meta, "in_doubt": "1"})
    finally:
        await restarted.disconnect()
    [share] = sim.messages(DEFAULT_CHANNEL)
    assert sent.success and sent.message_id == share.ts and share.text == to_mrkdwn(CAPTION)
    abandoned, shared = sim.bot_files
    assert (abandoned.shares, [s.ts for s in shared.shares]) == ([], [share.ts])
    assert await state.load(f"{UPLOAD_STATE_PREFIX}run:r3:0") == shared.id


async def test_a_completion_whose_answer_was_lost_is_not_shared_again(sim: SlackSimulator, adapter: SlackAdapter
                                                                      ) -> None:
    meta = {"delivery_id": "run:r4:0", "thread_id": (await sim.user_mentions_bot("go")).ts}
    sim.server_error_next("files.completeUploadExternal", after_apply=True)  # shared; the answer is lost
    lost = await adapter.send_file(DEFAULT_CHANNEL, _png(), "once", metadata=meta)
    assert (lost.success, lost.retryable) == (False, True)
    again = await adapter.send_file(DEFAULT_CHANNEL, _png(), "once", metadata=meta)  # the outbox's retry
    [share] = sim.messages(DEFAULT_CHANNEL, thread_ts=meta["thread_id"])
    assert again.success and again.message_id == share.ts
    assert len(sim.calls_of("files.getUploadURLExternal")) == len(sim.uploads) == 1


async def test_an_in_doubt_part_already_shared_is_not_uploaded_again(sim: SlackSimulator,
                                                                    state: PlatformStateStore) -> None:
    first = await _connected(sim, state=state)
    meta = {"delivery_id": "run:r5:0"}
    try:  # sent and answered; the sender dies before the outbox records it
        sent = await first.send_file(DEFAULT_CHANNEL, _png(), CAPTION, metadata=meta)
    finally:
        await first.disconnect()
    restarted = await _connected(sim, state=state)
    try:
        again = await restarted.send_file(DEFAULT_CHANNEL, _png(), CAPTION, metadata={**meta, "in_doubt": "1"})
        other = await restarted.send_file(DEFAULT_CHANNEL, _png("other.png"), metadata={"delivery_id": "run:r5:1",
                                                                                     "in_doubt": "1"})
    finally:
        await restarted.disconnect()
    assert again.success and again.message_id == sent.message_id
    assert [m.files and m.files[0]["name"] for m in sim.messages(DEFAULT_CHANNEL)] == ["chart.png", "other.png"]
    assert other.success and len(sim.uploads) == 2  # another delivery in doubt, never uploaded: uploaded now


# ------------------------------------------------------------------ the simulator's upload URL


async def test_an_upload_url_takes_exactly_the_announced_length(sim: SlackSimulator) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{sim.base_url}files.getUploadURLExternal", data={"filename": "a.bin", "length": 4},
                                headers={"Authorization": f"Bearer {sim.bot_token}"}) as response:
            ticket = await response.json()
        async with session.post(ticket["upload_url"], data=b"12345") as response:
            assert response.status == 400
        form = aiohttp.FormData()
        form.add_field("file", b"1234", filename="a.bin")
        async with session.post(ticket["upload_url"], data=form) as response:
            assert (response.status, await response.text()) == (200, "OK - 4")
    assert [(u.status, u.data) for u in sim.uploads] == [(400, b"12345"), (200, b"1234")]
