"""vision_analyze end to end (Telegram simulator, scripted model): a chat model without vision has a photo described
by the configured vision model; a chat model with vision is shown a workspace image as an image part of its next
request; without either, the tool says why."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.sim.model_media import image_parts
from gateway.sim.model_server import JSON, ScriptedModel, Turn, last_user_text, tool_call
from tests.gateway.media_chats import TelegramMediaChat, telegram_chat
from tests.media_samples import camera_jpeg, decoded_image, png_chart

VISION_MODEL = "llava-test"
DESCRIPTION = "A yellow square on a blue background."
SAVED_IMAGE = re.compile(r"saved in the workspace at (\S+\.jpg)")


class VisionModel:
    """The chat model calls vision_analyze on the photo it was told about (or on chart.png when asked); the vision
    model describes what it is shown. Every request is kept."""

    def __init__(self) -> None:
        self.requests: list[JSON] = []

    def __call__(self, request: JSON) -> Turn:
        self.requests.append(request)
        if request["model"] == VISION_MODEL:
            return Turn(content=DESCRIPTION if image_parts(request) else "I was shown no image.")
        last = request["messages"][-1]
        if last["role"] == "tool":
            return Turn(content=f"Tool said: {last['content']}")
        if last["role"] == "user" and image_parts(request):
            return Turn(content=f"Now I see {len(image_parts(request))} image(s).")
        text = last_user_text(request)
        if found := SAVED_IMAGE.search(text):
            return tool_call("vision_analyze", {"path": found.group(1), "question": "What shape is there?"})
        if text == "look at the chart":
            return tool_call("vision_analyze", {"path": "chart.png"})
        return Turn(content=f"Echo: {text}")


@pytest.fixture
async def chat(tmp_path: Path) -> AsyncIterator[tuple[TelegramMediaChat, VisionModel]]:
    model = VisionModel()
    async with ScriptedModel(model) as server, telegram_chat(server, tmp_path) as driver:
        try:
            yield driver, model
        finally:
            for gateway in driver.gateways:
                await gateway.stop(drain_timeout=1)


def _chart_in_workspace(home: Path) -> None:
    workspace = home / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "chart.png").write_bytes(png_chart())


async def test_a_chat_model_without_vision_has_the_vision_model_describe_a_photo(
        chat: tuple[TelegramMediaChat, VisionModel]) -> None:
    driver, model = chat
    await driver.start({"model": {"vision": False}, "media": {"vision": {"model": VISION_MODEL}}})
    await driver.send_photo(camera_jpeg(2400, 1600))
    [answer] = await driver.texts(1)
    assert DESCRIPTION in answer
    chat_turn, vision_turn = model.requests[0], model.requests[1]
    assert image_parts(chat_turn) == [] and "use vision_analyze" in last_user_text(chat_turn)
    [shown] = image_parts(vision_turn)
    assert vision_turn["model"] == VISION_MODEL and "What shape is there?" in last_user_text(vision_turn)
    assert max(decoded_image(shown).size) == 1568


async def test_a_chat_model_with_vision_is_shown_a_workspace_image(chat: tuple[TelegramMediaChat, VisionModel],
                                                                   tmp_path: Path) -> None:
    driver, model = chat
    _chart_in_workspace(tmp_path)
    await driver.start({"model": {"vision": True}})
    await driver.send_text("look at the chart")
    [answer] = await driver.texts(1)
    assert answer == "Now I see 1 image(s)."
    last = model.requests[-1]["messages"]
    assert last[-2]["role"] == "tool" and "show_image" in last[-2]["content"]
    assert decoded_image(image_parts(model.requests[-1])[0]).size == (320, 200)
    assert all(not image_parts({"messages": [m]}) for m in last[:-1])  # only the message after the tool result


async def test_without_vision_anywhere_the_tool_says_why(chat: tuple[TelegramMediaChat, VisionModel],
                                                         tmp_path: Path) -> None:
    driver, _ = chat
    _chart_in_workspace(tmp_path)
    await driver.start({"model": {"vision": False}})
    await driver.send_text("look at the chart")
    [answer] = await driver.texts(1)
    assert "no vision model is configured (media.vision)" in answer


async def test_a_damaged_photo_is_one_clear_message_and_no_model_call(chat: tuple[TelegramMediaChat, VisionModel]
                                                                      ) -> None:
    """A JPEG cut short passes the type check (its header is a JPEG's) and fails when it is prepared for the
    model: the user hears why, the model is not called with a broken image."""
    driver, model = chat
    await driver.start({"model": {"vision": True}})
    await driver.send_photo(camera_jpeg(800, 600)[:600])
    [answer] = await driver.texts(1)
    assert answer.startswith("⚠️ I could not take the photo: ") and model.requests == []
