"""Approvals end to end on Slack: the real gateway and slack-bolt against the Slack simulator. The prompt's Block Kit
buttons answer it: "Approve once" runs the command once and the prompt shows who approved, without its buttons;
"Deny" never runs it and the model is told; another user's press is refused and changes nothing; a restart between
prompt and press completes once; "Always" skips the prompt next time; clarify's choices are buttons too."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import tests.platforms.test_slack as slack_suite
from gateway.sim.slack_api import DEFAULT_CHANNEL, DEFAULT_USER, Message, SlackSimulator, UserAction
from tests.conftest import Harness, deep_merge
from tests.gateway.test_approvals import DANGEROUS, PROMPT_ID, Model, _approval_row, _build_dir
from tests.platforms.test_slack import OTHER_USER, _slack_config

sim = slack_suite.sim  # the Slack simulator fixture of test_slack.py
ADMIN = "U0ADMIN"
ANSWERS = ["Approve once", "This session", "Always", "Deny"]

Start = Callable[..., Awaitable[Harness]]


@pytest.fixture
async def slack(sim: SlackSimulator, make_gateway: Any) -> AsyncIterator[tuple[SlackSimulator, Model, Start]]:
    """The simulator, the scripted model's script, and a starter of gateways with Slack (``mode`` socket or http)
    where DEFAULT_USER, OTHER_USER and ADMIN may talk and ADMIN is an admin. Every gateway uses the same script."""
    model = Model()

    async def start(mode: str = "socket") -> Harness:
        h = await make_gateway(deep_merge(_slack_config(sim, mode=mode), {
            "auth": {"platforms": {"slack": {"allowed_users": [DEFAULT_USER, OTHER_USER, ADMIN]}},
                     "admins": [f"slack:{ADMIN}"]}}), responder=model)
        if mode == "http":
            sim.request_url = f"{h.base_url}/slack/events"
        return h

    yield sim, model, start


def _buttons(message: Message) -> list[str]:
    """The labels of the buttons a message shows now."""
    return [e["text"]["text"] for b in message.blocks or () if b["type"] == "actions" for e in b["elements"]]


async def _next(sim: SlackSimulator, channel: str, before: int, thread: str | None = None) -> Message:
    """The bot's message number ``before`` (0-based) in ``channel`` (and ``thread``), once posted."""
    return (await sim.wait_for_messages(before + 1, channel, thread_ts=thread, timeout=10))[before]


async def _ask(sim: SlackSimulator, *, user: str = DEFAULT_USER, in_channel: bool = False
               ) -> tuple[str, Message, str | None]:
    """``user`` asks for "clean the build" (in a DM, or mentioning the bot in the channel, which answers in a
    thread); returns the approval id, the prompt once it shows the four answers, and the thread."""
    if in_channel:
        asked = await sim.user_mentions_bot("clean the build", user=user)
        channel, thread = DEFAULT_CHANNEL, asked.ts
    else:
        channel, thread = sim.dm_channel(user), None
        asked = await sim.user_sends_dm("clean the build", user=user)
    before = len(sim.messages(channel, thread_ts=thread))
    prompt = await _next(sim, channel, before, thread)
    assert "Approval needed" in prompt.text and DANGEROUS in prompt.text, prompt.text
    found = PROMPT_ID.search(prompt.text)
    assert found is not None and _buttons(prompt) == ANSWERS, (prompt.text, prompt.blocks)
    await sim.wait_for_ack(asked.delivery)
    return found.group(1), prompt, thread


async def _acked(sim: SlackSimulator, press: UserAction) -> None:
    """The press was acknowledged to Slack once, within its deadline."""
    delivery = await sim.wait_for_ack(press.delivery)
    assert delivery.attempts == 1 and delivery.ack_seconds is not None and delivery.ack_seconds < 3


def _ran(model: Model) -> list[str]:
    """The terminal results with an exit code the model was handed back, one per run of the command (a later
    request repeats earlier results in its history: only a request that ends with one counts)."""
    return [last["content"] for r in model.requests if (last := r["messages"][-1])["role"] == "tool"
            and '"exit_code"' in last["content"]]


@pytest.mark.parametrize("mode", ["socket", "http"])
async def test_pressing_approve_once_runs_it_once_and_the_prompt_shows_who(
        slack: tuple[SlackSimulator, Model, Start], tmp_path: Path, mode: str) -> None:
    sim, model, start = slack
    build = _build_dir(tmp_path)
    h = await start(mode)
    dm = sim.dm_channel(DEFAULT_USER)
    approval_id, prompt, _ = await _ask(sim)
    assert build.exists(), "the command ran before anyone approved it"
    before = len(sim.messages(dm))
    press = await sim.user_presses_button(prompt, "Approve once")
    await _acked(sim, press)
    answer = await _next(sim, dm, before)  # the resumed run's answer: the prompt itself is edited
    assert answer.text.startswith("Tool said:") and '"exit_code": 0' in answer.text, answer.text
    assert not build.exists()
    await sim.wait_for(lambda: prompt.final_text.startswith("✅ Approved (once) by u0user1"), timeout=10)
    assert DANGEROUS in prompt.final_text and prompt.blocks is None and _buttons(prompt) == []
    row = await _approval_row(h.gateway, approval_id)
    assert (row.status, row.scope, row.decided_by, row.requester) == (
        "approved", "once", "u0user1", f"slack:{DEFAULT_USER}")
    assert len(_ran(model)) == 1
    with pytest.raises(LookupError):  # nothing left to press
        await sim.user_presses_button(prompt, "Approve once")


async def test_pressing_deny_never_runs_it_and_the_model_is_told(slack: tuple[SlackSimulator, Model, Start],
                                                                 tmp_path: Path) -> None:
    sim, model, start = slack
    build = _build_dir(tmp_path)
    h = await start()
    dm = sim.dm_channel(DEFAULT_USER)
    approval_id, prompt, _ = await _ask(sim)
    before = len(sim.messages(dm))
    await _acked(sim, await sim.user_presses_button(prompt, "Deny"))
    assert (await _next(sim, dm, before)).text == "Understood: I did not run it."
    told = model.requests[-1]["messages"][-1]
    assert told["role"] == "user" and told["content"].startswith("(Denied by"), told
    await sim.wait_for(lambda: prompt.final_text.startswith("❌ Denied by u0user1"), timeout=10)
    assert prompt.blocks is None
    assert (await _approval_row(h.gateway, approval_id)).status == "denied"
    assert build.exists() and _ran(model) == []


async def test_another_users_press_is_refused_and_an_admin_can_answer(slack: tuple[SlackSimulator, Model, Start],
                                                                      tmp_path: Path) -> None:
    sim, model, start = slack
    build = _build_dir(tmp_path)
    h = await start()
    approval_id, prompt, thread = await _ask(sim, in_channel=True)
    before = len(sim.messages(DEFAULT_CHANNEL, thread_ts=thread))
    await _acked(sim, await sim.user_presses_button(prompt, "Approve once", user=OTHER_USER))
    refused = await _next(sim, DEFAULT_CHANNEL, before, thread)
    assert refused.text.startswith("Only") and "or an admin can answer this approval" in refused.text, refused.text
    assert _buttons(prompt) == ANSWERS and prompt.edits == [], "a refused press must not take the buttons away"
    assert (await _approval_row(h.gateway, approval_id)).status == "pending"
    assert build.exists() and _ran(model) == []
    await _acked(sim, await sim.user_presses_button(prompt, "Approve once", user=ADMIN))
    answer = await _next(sim, DEFAULT_CHANNEL, before + 1, thread)
    assert answer.text.startswith("Tool said:") and '"exit_code": 0' in answer.text, answer.text
    await sim.wait_for(lambda: prompt.final_text.startswith("✅ Approved (once) by u0admin"), timeout=10)
    assert prompt.blocks is None
    assert (await _approval_row(h.gateway, approval_id)).decided_by == "u0admin"
    assert not build.exists() and len(_ran(model)) == 1


async def test_a_restart_between_prompt_and_press_completes_once(slack: tuple[SlackSimulator, Model, Start],
                                                                 tmp_path: Path) -> None:
    sim, model, start = slack
    build = _build_dir(tmp_path)
    first = await start()
    dm = sim.dm_channel(DEFAULT_USER)
    approval_id, prompt, _ = await _ask(sim)
    await first.gateway.stop(drain_timeout=1)
    second = await start()
    await sim.wait_for(lambda: len(sim.live_sockets) == 1, timeout=10)
    assert (await _approval_row(second.gateway, approval_id)).status == "pending"
    before = len(sim.messages(dm))
    await _acked(sim, await sim.user_presses_button(prompt, "Approve once"))
    answer = await _next(sim, dm, before)
    assert answer.text.startswith("Tool said:") and '"exit_code": 0' in answer.text, answer.text
    await sim.wait_for(lambda: prompt.final_text.startswith("✅ Approved (once)"), timeout=10)
    assert not build.exists()
    assert len(_ran(model)) == 1 and len(sim.messages(dm)) == before + 1
    assert (await _approval_row(second.gateway, approval_id)).status == "approved"


async def test_always_skips_the_prompt_next_time_for_that_user(slack: tuple[SlackSimulator, Model, Start],
                                                               tmp_path: Path) -> None:
    sim, model, start = slack
    build = _build_dir(tmp_path)
    await start()
    dm = sim.dm_channel(DEFAULT_USER)
    _, prompt, _ = await _ask(sim)
    before = len(sim.messages(dm))
    await _acked(sim, await sim.user_presses_button(prompt, "Always"))
    await _next(sim, dm, before)
    await sim.wait_for(lambda: prompt.final_text.startswith("✅ Approved (always)"), timeout=10)
    build.mkdir()
    await sim.user_sends_dm("clean the build")
    answer = await _next(sim, dm, before + 1)  # no prompt this time
    assert answer.text.startswith("Tool said:") and '"exit_code": 0' in answer.text, answer.text
    assert _buttons(answer) == [] and not build.exists() and len(_ran(model)) == 2
    # Only for that user: another user is still asked.
    build.mkdir()
    await _ask(sim, user=OTHER_USER)
    assert build.exists()


async def test_clarify_choices_are_answered_by_a_press(slack: tuple[SlackSimulator, Model, Start]) -> None:
    sim, model, start = slack
    await start()
    dm = sim.dm_channel(DEFAULT_USER)
    await sim.user_sends_dm("paint it")
    question = await _next(sim, dm, 0)
    assert question.text.startswith("Which colour?") and _buttons(question) == ["red", "green", "blue"]
    await _acked(sim, await sim.user_presses_button(question, "green"))
    assert (await _next(sim, dm, 1)).text == "Echo: green"
    assert model.requests[-1]["messages"][-1] == {"role": "user", "content": "green"}
