"""The run's media input on its own (gateway/media/inbound.py) with the real Telegram adapter against the simulator:
a redone run reuses the files an earlier attempt finished (their manifest) and fetches again what it did not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.config.media import MediaSettings
from gateway.config.sections import ModelSettings
from gateway.media.inbound import MediaPreparer
from gateway.sim.telegram_api import TelegramSimulator
from platforms.base import Accepted, MessageEvent
from platforms.telegram import TelegramAdapter, TelegramSettings
from tests.media_samples import pdf_with_text


@pytest.fixture
async def telegram(tmp_path: Path) -> AsyncIterator[tuple[TelegramSimulator, TelegramAdapter, list[MessageEvent]]]:
    events: list[MessageEvent] = []

    async def on_message(event: MessageEvent) -> Accepted:
        events.append(event)
        return Accepted(None, False)

    async with TelegramSimulator() as sim:
        adapter = TelegramAdapter(TelegramSettings(token=sim.token, base_url=sim.base_url,
                                                   base_file_url=sim.base_file_url, poll_timeout=1))
        await adapter.connect(on_message)
        try:
            yield sim, adapter, events
        finally:
            await adapter.disconnect()


async def test_a_redone_run_reuses_finished_files_and_fetches_the_rest_again(
        telegram: tuple[TelegramSimulator, TelegramAdapter, list[MessageEvent]], tmp_path: Path) -> None:
    sim, adapter, events = telegram
    sim.user_sends_document(pdf_with_text("Minutes of the meeting"), "minutes.pdf", "application/pdf")
    await sim.wait_for(lambda: events)
    preparer = MediaPreparer(MediaSettings(), ModelSettings(), tmp_path)
    first = await preparer.prepare(events[0], adapter, "telegram:dm:1", sees_images=False, can_analyze=False)
    again = await preparer.prepare(events[0], adapter, "telegram:dm:1", sees_images=False, can_analyze=False)
    assert again.text == first.text and len(sim.downloads) == 1  # the first attempt's file, not fetched again
    [manifest] = tmp_path.rglob(".manifest.json")
    manifest.unlink()  # as if the attempt died before it marked the file finished
    redone = await preparer.prepare(events[0], adapter, "telegram:dm:1", sees_images=False, can_analyze=False)
    assert redone.text == first.text and len(sim.downloads) == 2
    [text] = tmp_path.rglob("minutes.pdf.txt")
    assert "Minutes of the meeting" in text.read_text()
    assert not list(tmp_path.rglob("*.partial"))
