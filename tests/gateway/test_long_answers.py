"""Long answers are measured off the event loop: splitting an answer into parts measures each candidate part's
rendering (milliseconds per try for Markdown), so a long answer is split on a worker thread, and a streamed
preview is clipped with a few measures instead of the splitter's search."""

from __future__ import annotations

import threading
from typing import Any

from gateway.sim.model_server import text
from platforms.base import split_message
from platforms.telegram import telegram_length

PARAGRAPH = "Some **bold** words, `code`, a [link](https://example.com) and more.\n\n- one\n- two\n\n"


async def test_a_long_answer_is_split_on_a_worker_thread(make_gateway: Any) -> None:
    answer = PARAGRAPH * 120  # ~10,000 characters: more than one Telegram message once rendered
    h = await make_gateway(responder=lambda _request: text(answer))
    measured_on: list[str] = []

    def length(part: str) -> int:
        measured_on.append(threading.current_thread().name)
        return telegram_length(part)

    h.chat.length_fn = length
    expected = split_message(answer, h.chat.max_message_length, telegram_length)
    assert len(expected) >= 2
    await h.chat.user_says("write a lot")
    await h.chat.wait_for(lambda: len(h.chat.sent) == len(expected), timeout=30)
    assert [s.text for s in h.chat.sent] == expected
    on_loop = measured_on.count(threading.main_thread().name)
    assert len(measured_on) > 20 and on_loop <= 1, f"{on_loop} of {len(measured_on)} measures on the event loop"


async def test_a_short_answer_stays_on_the_loop(make_gateway: Any) -> None:
    h = await make_gateway(responder=lambda _request: text("short and sweet"))
    measured_on: list[str] = []

    def length(part: str) -> int:
        measured_on.append(threading.current_thread().name)
        return len(part)

    h.chat.length_fn = length
    await h.chat.user_says("hi")
    await h.chat.wait_for(lambda: len(h.chat.sent) == 1)
    assert h.chat.sent[0].text == "short and sweet"
    assert set(measured_on) == {threading.main_thread().name}, "no thread hop for an answer of one part"
