"""Busy modes end to end (/busy queue|interrupt|steer): a message arriving while its session's run waits for the
model, through the Telegram simulator with the real adapter and the scripted model."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.sim.model_server import text, tool_call
from gateway.store import ChatMessage, Store
from tests.gateway.telegram_chat import CHAT, SESSION, TelegramChat, telegram_chat


async def _transcript(store: Store) -> list[tuple[str, str | None]]:
    """The DM session's stored conversation as (role, text); a tool call shows as its tool's name."""
    messages: list[ChatMessage] = await store.history(SESSION, 0, 100)
    return [(m.role, m.tool_calls[0]["function"]["name"] if m.tool_calls else m.content) for m in messages]


async def _runs(store: Store) -> list[tuple[str, str, str | None]]:
    """(prompt, status, ended_by) of every run, oldest first."""
    return [(r.prompt, r.status, r.ended_by) for r in reversed(await store.list_runs())]


async def _busy_run(chat: TelegramChat, mode: str, first_turn: str = "first") -> None:
    """Set the busy mode with /busy, then send "first", whose first model call waits."""
    await chat.start()
    assert (await chat.command(f"/busy {mode}")).startswith(f"Busy mode here: {mode} (")
    await chat.says(first_turn)
    await chat.model.wait_for_requests(1)


async def test_queue_answers_the_second_message_after_the_first(tmp_path: Path) -> None:
    async with telegram_chat(tmp_path) as chat:
        gate = chat.script.on("first", text("First answer."), held=True)
        await _busy_run(chat, "queue")
        await chat.says("second")
        gate.set()
        await chat.wait_for_text("Echo: second")
        assert chat.texts()[1:] == ["First answer.", "Echo: second"]
        second = chat.model.requests[1]["messages"]
        assert [m["content"] for m in second[1:]] == ["first", "First answer.", "second"]  # after the first run
        assert await _runs(chat.store) == [("first", "completed", "answer"), ("second", "completed", "answer")]


async def test_interrupt_cancels_the_running_run_and_answers_the_new_message(tmp_path: Path) -> None:
    async with telegram_chat(tmp_path) as chat:
        chat.script.on("first", text("never sent"), held=True)
        await _busy_run(chat, "interrupt")
        await chat.says("second")
        await chat.wait_for_text("Echo: second")
        assert chat.texts()[1:] == ["Echo: second"]
        assert await _runs(chat.store) == [("first", "cancelled", None), ("second", "completed", "answer")]
        assert await _transcript(chat.store) == [("user", "second"), ("assistant", "Echo: second")]


async def test_steer_adds_the_message_to_the_running_agent_loop(tmp_path: Path) -> None:
    """The steering message is in the run's second model request, as a user message after the tool's result; one
    run, one answer; the steered message's inbox event and run end with that run, and the transcript keeps the
    order the model saw. The message's status reaction shows it received, taken (working), then done."""
    async with telegram_chat(tmp_path) as chat:
        gate = chat.script.on("first", tool_call("todo", {"action": "list"}), held=True)
        await _busy_run(chat, "steer")
        steering = await chat.says("also this")
        gate.set()
        answer = await chat.wait_for_text("Echo: also this")
        assert answer.result["reply_to_message"]["text"] == "first"
        second = chat.model.requests[1]["messages"]
        assert [m["role"] for m in second[-3:]] == ["assistant", "tool", "user"]
        assert second[-1]["content"] == "also this"
        assert chat.model.request_count == 2
        assert chat.texts()[1:] == ["Echo: also this"]
        assert await _runs(chat.store) == [("first", "completed", "answer"), ("also this", "completed", "steered")]
        assert await chat.store.count_inbox("done") == await chat.store.count_inbox() == 3  # with /busy
        assert await _transcript(chat.store) == [("user", "first"), ("assistant", "todo"),
                                                 ("tool", second[-2]["content"]), ("user", "also this"),
                                                 ("assistant", "Echo: also this")]
        await chat.sim.wait_for(lambda: chat.sim.bot_reaction(CHAT, steering) == ["👍"])
        assert [[r["emoji"] for r in c.params["reaction"]] for c in chat.sim.reaction_calls(CHAT)
                if int(c.params["message_id"]) == steering] == [["👀"], ["✍"], ["👍"]]


async def test_steer_after_the_last_model_call_runs_the_message_next(tmp_path: Path) -> None:
    """The run's model call that ends it is under way when the message comes: the message is not lost, it is
    the next run."""
    async with telegram_chat(tmp_path) as chat:
        gate = chat.script.on("first", text("First answer."), held=True)
        await _busy_run(chat, "steer")
        await chat.says("too late")
        gate.set()
        await chat.wait_for_text("Echo: too late")
        assert chat.texts()[1:] == ["First answer.", "Echo: too late"]
        assert chat.model.requests[0]["messages"][-1]["content"] == "first"
        assert await _runs(chat.store) == [("first", "completed", "answer"), ("too late", "completed", "answer")]
        assert await chat.store.count_inbox("done") == await chat.store.count_inbox() == 3
        assert await _transcript(chat.store) == [("user", "first"), ("assistant", "First answer."),
                                                 ("user", "too late"), ("assistant", "Echo: too late")]


async def test_a_crash_after_a_steer_redoes_the_run_and_answers_the_message_once(tmp_path: Path) -> None:
    """The gateway stops while the run that took the steering message waits for its second model call: the
    message's inbox event was never closed, so after the restart the run is redone (without it) and the message
    is answered once, by a run of its own."""
    async with telegram_chat(tmp_path) as chat:
        gate = chat.script.on("first", tool_call("todo", {"action": "list"}), held=True)
        hang = chat.script.on("also this", text("never sent"), held=True)
        await _busy_run(chat, "steer")
        await chat.says("also this")
        gate.set()
        await chat.model.wait_for_requests(2)
        assert chat.model.requests[1]["messages"][-1]["content"] == "also this"
        await chat.gateway.stop(drain_timeout=0)
        assert chat.texts()[1:] == []

        chat.script.answers.clear()  # the model answers at once now
        hang.set()
        await chat.start()
        await chat.wait_for_text("Echo: also this")
        await chat.wait_for_text("Echo: first")
        assert chat.texts()[1:] == ["Echo: first", "Echo: also this"]
        assert await _runs(chat.store) == [("first", "completed", "answer"), ("also this", "completed", "answer")]
        assert await chat.store.count_inbox("done") == await chat.store.count_inbox() == 3
        assert await _transcript(chat.store) == [("user", "first"), ("assistant", "Echo: first"),
                                                 ("user", "also this"), ("assistant", "Echo: also this")]


async def test_busy_mode_is_kept_per_session_across_a_restart(tmp_path: Path) -> None:
    async with telegram_chat(tmp_path) as chat:
        await chat.start({"gateway": {"busy": "steer"}})
        assert (await chat.command("/busy")).splitlines()[0] == "Busy mode here: steer."
        await chat.command("/busy interrupt")
        await chat.gateway.stop()
        await chat.start({"gateway": {"busy": "steer"}})
        shown = await chat.command("/busy")
        assert shown.splitlines() == [
            "Busy mode here: interrupt.",
            "queue - a message sent while I'm answering waits, and gets its own answer after the current one",
            "interrupt - a message sent while I'm answering stops the current answer and is answered instead",
            "steer - a message sent while I'm answering joins it: I read it before my next step and answer both "
            "together",
            "Change it with /busy queue|interrupt|steer."]
        assert (await chat.gateway.router.settings.session(SESSION)).busy == "interrupt"


@pytest.mark.parametrize("wrong", ["/busy sometimes", "/busy queue please"])
async def test_busy_refuses_an_unknown_mode(tmp_path: Path, wrong: str) -> None:
    async with telegram_chat(tmp_path) as chat:
        await chat.start()
        assert await chat.command(wrong) == "Usage: /busy [queue|interrupt|steer]"
        assert (await chat.gateway.router.settings.session(SESSION)).busy is None


async def test_a_photo_sent_while_steering_is_not_steered_but_runs_next(tmp_path: Path) -> None:
    """Files are fetched when a run starts: a photo arriving during a steerable run is its own next run (a steered
    message gives the loop only text, so the photo would be lost), and the model is told about the photo."""
    async with telegram_chat(tmp_path) as chat:
        gate = chat.script.on("first", tool_call("todo", {"action": "list"}), held=True)
        await _busy_run(chat, "steer")
        update = chat.sim.user_sends_photo(caption="and this photo")
        await chat.sim.wait_for(lambda: update not in chat.sim.pending_updates, timeout=10)
        gate.set()
        await chat.sim.wait_for_messages(3, CHAT, timeout=10)  # /busy's reply, then both answers
        assert "and this photo" not in str(chat.model.requests[1]["messages"])  # the first run's second call
        assert chat.texts()[2].startswith("Echo: and this photo\n\n[image photo.jpg")
        assert [(prompt, status) for prompt, status, _ in await _runs(chat.store)] == [
            ("first", "completed"), ("and this photo", "completed")]
