"""/background end to end: a detached run of the chat in a session of its own, answered when done while the chat
goes on, stopped by its id, durable across a restart; through the Telegram simulator with the real adapter."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.session import background_session_key
from gateway.sim.model_server import text
from tests.gateway.telegram_chat import SESSION, TelegramChat, telegram_chat

PROMPT = "research the moon"


async def _background(chat: TelegramChat) -> tuple[str, int]:
    """Start a background task of PROMPT; its id and the command message's id."""
    before = len(chat.bot_messages())
    command_id = await chat.says(f"/background {PROMPT}")
    reply = (await chat.sim.wait_for_messages(before + 1, timeout=10))[before]
    found = re.fullmatch(r"Background task ([0-9a-f]{6}) started\. Keep chatting; its answer will come here\. "
                         r"/stop \1 cancels it\.", reply.text or "")
    assert found is not None, reply.text
    return found.group(1), command_id


async def test_background_answer_comes_after_a_foreground_exchange(tmp_path: Path) -> None:
    async with telegram_chat(tmp_path) as chat:
        gate = chat.script.on(PROMPT, text("The moon is far."), held=True)
        await chat.start()
        task, command_id = await _background(chat)
        await chat.model.wait_for_requests(1)
        await chat.says("hello")  # the chat goes on while the task works
        await chat.wait_for_text("Echo: hello")
        gate.set()
        answer = await chat.wait_for_text(f"Background task {task}: The moon is far.")
        assert answer.result["reply_to_message"]["message_id"] == command_id
        assert chat.texts()[1:] == ["Echo: hello", f"Background task {task}: The moon is far."]
        # its own session: no history in, nothing added to the chat's conversation
        assert [m["role"] for m in chat.model.requests[0]["messages"]] == ["system", "user"]
        assert [m.content for m in await chat.store.history(SESSION, 0, 100)] == ["hello", "Echo: hello"]
        run = next(r for r in await chat.store.list_runs() if r.kind == "background")
        assert (run.prompt, run.status, run.source, run.result) == (PROMPT, "completed", task, "The moon is far.")
        assert run.session_key == background_session_key(SESSION, task)


async def test_status_lists_a_background_task_and_stop_with_its_id_stops_it(tmp_path: Path) -> None:
    async with telegram_chat(tmp_path) as chat:
        chat.script.on(PROMPT, text("never sent"), held=True)
        await chat.start()
        task, _ = await _background(chat)
        await chat.model.wait_for_requests(1)
        assert f"\nBackground: {task} (running)\n" in await chat.command("/status")
        assert await chat.command("/stop") == "Nothing is running."  # plain /stop: the chat's own run
        assert await chat.command("/stop abcdef") == "No background task abcdef is running here."
        assert await chat.command(f"/stop {task}") == f"Stopped background task {task}."
        assert "Background:" not in await chat.command("/status")
        run = next(r for r in await chat.store.list_runs() if r.kind == "background")
        assert (run.status, run.error) == ("cancelled", "stopped by user")
        assert await chat.command(f"/stop {task}") == f"No background task {task} is running here."
        assert not [t for t in chat.texts() if t.startswith(f"Background task {task}:")]


async def test_a_background_task_survives_a_restart(tmp_path: Path) -> None:
    async with telegram_chat(tmp_path) as chat:
        gate = chat.script.on(PROMPT, text("never sent"), held=True)
        await chat.start()
        task, command_id = await _background(chat)
        await chat.model.wait_for_requests(1)
        await chat.gateway.stop(drain_timeout=0)

        chat.script.answers.clear()
        gate.set()
        await chat.start()
        answer = await chat.wait_for_text(f"Background task {task}: Echo: {PROMPT}")
        assert answer.result["reply_to_message"]["message_id"] == command_id
        assert [t for t in chat.texts() if t.startswith("Background task")][1:] == [
            f"Background task {task}: Echo: {PROMPT}"]


async def test_background_without_a_prompt_explains_itself(tmp_path: Path) -> None:
    async with telegram_chat(tmp_path) as chat:
        await chat.start()
        assert (await chat.command("/background")).startswith("Usage: /background PROMPT")
        assert await chat.store.count_runs() == 0
