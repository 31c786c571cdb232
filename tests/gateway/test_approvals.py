"""Approvals end to end through the Telegram Bot API simulator and the real python-telegram-bot: a dangerous terminal
command waits for the user's yes (typed, or a button), runs once when approved, never when denied or expired, and
the model is told; another user cannot answer; a restart keeps the request; "always" skips the prompt next time; a
webhook run's dangerous call is refused without a prompt; clarify's choices come as buttons."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from gateway.app import Gateway
from gateway.schema import approval_grants_t, approvals_t
from gateway.sim.model_server import JSON, ScriptedModel, Turn, last_user_text, tool_call
from gateway.sim.telegram_api import DEFAULT_GROUP_ID, DEFAULT_USER_ID, TelegramSimulator
from tests.conftest import GatewayFactory, deep_merge
from tests.gateway.conftest import StartTelegramGateway

CHAT = DEFAULT_USER_ID
ADMIN, OTHER = 1002, 1003
DANGEROUS = "rm -rf build/"
PROMPT_ID = re.compile(r"id ([0-9a-f]{12})\)")

Start = Callable[..., Awaitable[Gateway]]


class Model:
    """Calls ``terminal`` with ``rm -rf build/`` for "clean the build" and ``clarify`` for "paint it", reports a
    tool's result, acknowledges a refusal, echoes anything else. Every request is kept for assertions."""

    def __init__(self) -> None:
        self.requests: list[JSON] = []

    def __call__(self, request: JSON) -> Turn:
        self.requests.append(request)
        last = request["messages"][-1]
        if last["role"] == "tool":
            return Turn(content=f"Tool said: {last['content']}")
        text = last_user_text(request)
        if text == "clean the build":
            return tool_call("terminal", {"command": DANGEROUS})
        if text == "paint it":
            return tool_call("clarify", {"question": "Which colour?", "choices": ["red", "green", "blue"]})
        if text.startswith(("(Denied", "(Nobody")):
            return Turn(content="Understood: I did not run it.")
        return Turn(content=f"Echo: {text}")


@pytest.fixture
async def tg(telegram_gateway: StartTelegramGateway, tmp_path: Path
             ) -> AsyncIterator[tuple[TelegramSimulator, Model, Start]]:
    model = Model()
    async with TelegramSimulator() as sim, ScriptedModel(model) as server:
        async def start(overrides: dict[str, Any] | None = None) -> Gateway:
            return await telegram_gateway(sim, server, deep_merge({
                "platforms": {"telegram": {"group_trigger": "always"}},
                "auth": {"platforms": {"telegram": {"allowed_users": [str(CHAT), str(ADMIN), str(OTHER)]}},
                         "admins": [f"telegram:{ADMIN}"]}}, overrides or {}))

        yield sim, model, start


def _build_dir(tmp_path: Path) -> Path:
    build = tmp_path / "workspace" / "build"
    build.mkdir(parents=True, exist_ok=True)
    (build / "out.o").write_text("object code")
    return build


async def _next_text(sim: TelegramSimulator, chat: int, before: int) -> str:
    sent = await sim.wait_for_messages(before + 1, chat, timeout=10)
    return sent[before].text


async def _ask(sim: TelegramSimulator, chat: int = CHAT, **origin: Any) -> str:
    """Send "clean the build" and return the approval id of the prompt that comes back."""
    before = len(sim.sent_messages(chat))
    sim.user_sends("clean the build", chat_id=chat, **origin)
    prompt = await _next_text(sim, chat, before)
    assert "Approval needed" in prompt and DANGEROUS in prompt, prompt
    found = PROMPT_ID.search(prompt)
    assert found is not None, prompt
    return found.group(1)


async def _ask_for_buttons(sim: TelegramSimulator, chat: int = CHAT, **origin: Any) -> tuple[str, int]:
    """Like ``_ask``; also the prompt's message id, once its keyboard shows the four answers."""
    approval_id = await _ask(sim, chat, **origin)
    prompt = next(s for s in sim.sent_messages(chat) if approval_id in s.text)
    message_id = prompt.result["message_id"]
    labels = [b["text"] for row in sim.keyboard(chat, message_id) for b in row]
    assert labels == ["Approve once", "This session", "Always", "Deny"]
    return approval_id, message_id


def _shown(sim: TelegramSimulator, chat: int, message_id: int) -> str:
    """The text a message shows now (edits applied)."""
    return next(m["text"] for m in sim.chat_history(chat) if m["message_id"] == message_id)


async def _approval_row(gateway: Gateway, approval_id: str) -> Any:
    return await gateway.store.db.read(lambda conn: conn.execute(
        sa.select(approvals_t).where(approvals_t.c.id == approval_id)).one())


def _terminal_runs(model: Model) -> list[str]:
    """The results of terminal calls the model was shown (each a run of the command or a refusal)."""
    return [m["content"] for r in model.requests for m in r["messages"] if m["role"] == "tool"]


async def test_typed_approve_runs_the_command_once(tg: tuple[TelegramSimulator, Model, Start],
                                                   tmp_path: Path) -> None:
    sim, model, start = tg
    build = _build_dir(tmp_path)
    gateway = await start()
    approval_id, prompt_id = await _ask_for_buttons(sim)
    assert build.exists(), "the command ran before anyone approved it"
    row = await _approval_row(gateway, approval_id)
    assert (row.status, row.requester) == ("pending", f"telegram:{CHAT}")
    before = len(sim.sent_messages(CHAT))
    sim.user_sends("/approve")
    note = await _next_text(sim, CHAT, before)
    assert note.startswith("✅ Approved (once) by") and DANGEROUS in note
    # Typed, not pressed: the prompt shows the answer too, its buttons gone.
    await sim.wait_for(lambda: _shown(sim, CHAT, prompt_id).startswith("✅ Approved (once)"), timeout=10)
    assert sim.keyboard(CHAT, prompt_id) == []
    answer = await _next_text(sim, CHAT, before + 1)
    assert answer.startswith("Tool said:") and '"exit_code": 0' in answer, answer
    assert not build.exists()
    row = await _approval_row(gateway, approval_id)
    assert (row.status, row.scope) == ("approved", "once")
    # The model saw the request wait, then the decision and the command's real result.
    resumed = model.requests[-1]["messages"]
    assert any(m["role"] == "user" and m["content"].startswith("(Approved by") for m in resumed)
    assert any(m["role"] == "tool" and "awaiting_approval" in m["content"] for m in resumed)
    # Once: the same request asks again.
    build.mkdir()
    await _ask(sim)
    assert build.exists()


async def test_deny_never_runs_and_the_model_is_told(tg: tuple[TelegramSimulator, Model, Start],
                                                     tmp_path: Path) -> None:
    sim, model, start = tg
    build = _build_dir(tmp_path)
    gateway = await start()
    approval_id = await _ask(sim)
    before = len(sim.sent_messages(CHAT))
    sim.user_sends(f"/deny {approval_id} not today")
    note = await _next_text(sim, CHAT, before)
    assert note.startswith("❌ Denied by") and "(not today)" in note
    assert await _next_text(sim, CHAT, before + 1) == "Understood: I did not run it."
    assert build.exists()
    told = model.requests[-1]["messages"][-1]
    assert told["role"] == "user" and told["content"].startswith("(Denied by") and "not today" in told["content"]
    assert (await _approval_row(gateway, approval_id)).status == "denied"
    # Answering again is refused, and nothing runs.
    sim.user_sends(f"/approve {approval_id}")
    assert (await _next_text(sim, CHAT, before + 2)).startswith("That was already answered: denied")
    assert build.exists()


async def test_expiry_denies_and_tells_the_model(tg: tuple[TelegramSimulator, Model, Start],
                                                 tmp_path: Path) -> None:
    sim, model, start = tg
    build = _build_dir(tmp_path)
    gateway = await start({"approvals": {"timeout_minutes": 0.02}})  # 1.2 s
    approval_id = await _ask(sim)
    before = len(sim.sent_messages(CHAT))
    told = await sim.wait_for(lambda: next((s.text for s in sim.sent_messages(CHAT)[before:]
                                            if s.text == "Understood: I did not run it."), None), timeout=15)
    assert told
    assert (await _approval_row(gateway, approval_id)).status == "expired"
    assert model.requests[-1]["messages"][-1]["content"].startswith("(Nobody answered within")
    assert build.exists()


async def test_another_user_cannot_answer_but_an_admin_can(tg: tuple[TelegramSimulator, Model, Start],
                                                           tmp_path: Path) -> None:
    sim, _model, start = tg
    build = _build_dir(tmp_path)
    gateway = await start()
    approval_id = await _ask(sim, DEFAULT_GROUP_ID, chat_type="group")
    before = len(sim.sent_messages(DEFAULT_GROUP_ID))
    sim.user_sends(f"/approve {approval_id}", chat_id=DEFAULT_GROUP_ID, chat_type="group", user_id=OTHER,
                   username="mallory")
    refused = await _next_text(sim, DEFAULT_GROUP_ID, before)
    assert refused.startswith("Only alice or an admin can answer")
    assert (await _approval_row(gateway, approval_id)).status == "pending"
    assert build.exists()
    sim.user_sends(f"/approve {approval_id}", chat_id=DEFAULT_GROUP_ID, chat_type="group", user_id=ADMIN,
                   username="root")
    assert (await _next_text(sim, DEFAULT_GROUP_ID, before + 1)).startswith("✅ Approved (once) by root")
    await sim.wait_for(lambda: not build.exists(), timeout=10)
    assert (await _approval_row(gateway, approval_id)).decided_by == "root"


async def test_always_skips_the_prompt_next_time(tg: tuple[TelegramSimulator, Model, Start], tmp_path: Path) -> None:
    sim, _model, start = tg
    build = _build_dir(tmp_path)
    gateway = await start()
    await _ask(sim)
    before = len(sim.sent_messages(CHAT))
    sim.user_sends("/approve always")
    assert (await _next_text(sim, CHAT, before)).startswith("✅ Approved (always)")
    await _next_text(sim, CHAT, before + 1)
    grants = await gateway.store.db.read(lambda conn: conn.execute(sa.select(approval_grants_t)).all())
    assert [(g.user_key, g.session_key) for g in grants] == [(f"telegram:{CHAT}", "")]
    build.mkdir()
    sim.user_sends("clean the build")
    answer = await _next_text(sim, CHAT, before + 2)
    assert answer.startswith("Tool said:"), answer
    assert not build.exists()
    # Only for that user: another user in a group is still asked.
    build.mkdir()
    await _ask(sim, DEFAULT_GROUP_ID, chat_type="group", user_id=ADMIN, username="root")
    assert build.exists()


async def test_a_restart_between_prompt_and_press_completes_once(tg: tuple[TelegramSimulator, Model, Start],
                                                                 tmp_path: Path) -> None:
    sim, model, start = tg
    build = _build_dir(tmp_path)
    first = await start()
    approval_id, prompt_id = await _ask_for_buttons(sim)
    await first.stop(drain_timeout=1)
    second = await start()
    assert (await _approval_row(second, approval_id)).status == "pending"
    before = len(sim.sent_messages(CHAT))
    sim.user_presses(prompt_id, "Approve once")
    assert (await _next_text(sim, CHAT, before)).startswith("Tool said:")
    assert not build.exists()
    await sim.wait_for(lambda: _shown(sim, CHAT, prompt_id).startswith("✅ Approved"), timeout=10)
    # The command ran exactly once: one tool result with its output reached the model, one answer was sent.
    assert len([c for c in _terminal_runs(model) if '"exit_code"' in c]) == 1
    await second.stop(drain_timeout=1)
    third = await start()  # nothing is left to resume: no second run, no second answer
    assert await third.store.unfinished_inbox() == []
    assert len(sim.sent_messages(CHAT)) == before + 1


def _report_tool(request: JSON) -> Turn:
    last = request["messages"][-1]
    if last["role"] == "tool":
        return Turn(content=f"Result: {last['content']}")
    return tool_call("terminal", {"command": DANGEROUS})


@pytest.mark.parametrize("allow", [[], ["terminal:*"]])
async def test_webhook_runs_refuse_dangerous_calls_without_a_prompt(make_gateway: GatewayFactory, tmp_path: Path,
                                                                   allow: list[str]) -> None:
    """Nobody can answer a webhook run's prompt: the call is refused and the model told, unless the route allows
    the pattern."""
    build = _build_dir(tmp_path)
    h = await make_gateway({"platforms": {"webhook": {
        "allowed_toolsets": ["hermes-webhook", "terminal"],
        "routes": {"github": {"toolset": ["terminal"], "approvals_allow": allow}}}}}, responder=_report_tool)
    status, body = await h.post_webhook()
    assert status == 202
    run = await h.wait_run(body["run_id"])
    assert run["status"] == "completed"
    delivered = (await h.sink.wait_for(1))[0]["text"]
    if allow:
        assert '"exit_code": 0' in delivered and not build.exists()
    else:
        assert "cannot ask anyone to approve this" in delivered and "terminal:" in delivered, delivered
        assert build.exists()
    approvals = await h.gateway.store.db.read(lambda conn: conn.execute(sa.select(approvals_t)).all())
    assert approvals == []


async def test_new_conversation_withdraws_the_request(tg: tuple[TelegramSimulator, Model, Start],
                                                      tmp_path: Path) -> None:
    sim, _model, start = tg
    build = _build_dir(tmp_path)
    gateway = await start()
    approval_id = await _ask(sim)
    before = len(sim.sent_messages(CHAT))
    sim.user_sends("/new")
    await _next_text(sim, CHAT, before)
    assert (await _approval_row(gateway, approval_id)).status == "withdrawn"
    sim.user_sends(f"/approve {approval_id}")
    assert (await _next_text(sim, CHAT, before + 1)).startswith("That was already answered: withdrawn")
    assert build.exists()


async def test_pressing_approve_runs_once_and_the_prompt_shows_who(tg: tuple[TelegramSimulator, Model, Start],
                                                                   tmp_path: Path) -> None:
    sim, model, start = tg
    build = _build_dir(tmp_path)
    gateway = await start()
    approval_id, prompt_id = await _ask_for_buttons(sim)
    before = len(sim.sent_messages(CHAT))
    update = sim.user_presses(prompt_id, "Approve once")
    answer = await _next_text(sim, CHAT, before)  # the resumed run's answer: the prompt itself was edited
    assert answer.startswith("Tool said:") and '"exit_code": 0' in answer
    assert not build.exists()
    await sim.wait_for(lambda: _shown(sim, CHAT, prompt_id).startswith("✅ Approved (once) by alice"), timeout=10)
    assert sim.keyboard(CHAT, prompt_id) == []
    assert sim.interactive.answer_to(update["callback_query"]["id"]) is not None
    assert (await _approval_row(gateway, approval_id)).decided_by == "alice"
    assert len([c for c in _terminal_runs(model) if '"exit_code"' in c]) == 1


async def test_pressing_deny_and_a_stranger_pressing(tg: tuple[TelegramSimulator, Model, Start],
                                                     tmp_path: Path) -> None:
    sim, _model, start = tg
    build = _build_dir(tmp_path)
    gateway = await start()
    approval_id, prompt_id = await _ask_for_buttons(sim, DEFAULT_GROUP_ID, chat_type="group")
    before = len(sim.sent_messages(DEFAULT_GROUP_ID))
    sim.user_presses(prompt_id, "Approve once", chat_id=DEFAULT_GROUP_ID, chat_type="group", user_id=OTHER,
                     username="mallory")
    refused = await _next_text(sim, DEFAULT_GROUP_ID, before)
    assert refused.startswith("Only alice or an admin can answer")
    assert len(sim.keyboard(DEFAULT_GROUP_ID, prompt_id)) > 0, "a refused press must not take the buttons away"
    assert (await _approval_row(gateway, approval_id)).status == "pending"
    sim.user_presses(prompt_id, "Deny", chat_id=DEFAULT_GROUP_ID, chat_type="group")
    told = await _next_text(sim, DEFAULT_GROUP_ID, before + 1)
    assert told == "Understood: I did not run it."
    assert _shown(sim, DEFAULT_GROUP_ID, prompt_id).startswith("❌ Denied by alice")
    assert build.exists()


async def test_clarify_choices_are_buttons(tg: tuple[TelegramSimulator, Model, Start]) -> None:
    sim, _model, start = tg
    await start()
    before = len(sim.sent_messages(CHAT))
    sim.user_sends("paint it")
    question = (await sim.wait_for_messages(before + 1, CHAT, timeout=10))[before]
    assert question.text.startswith("Which colour?")
    message_id = question.result["message_id"]
    assert [b["text"] for row in sim.keyboard(CHAT, message_id) for b in row] == ["red", "green", "blue"]
    sim.user_presses(message_id, "green")
    assert await _next_text(sim, CHAT, before + 1) == "Echo: green"


async def test_the_command_menu_is_set_at_start(tg: tuple[TelegramSimulator, Model, Start]) -> None:
    sim, _model, start = tg
    await start({"commands": {"disabled": ["usage"], "admin_only": ["cron"]}})
    for scope in ("default", "all_private_chats", "all_group_chats"):
        names = [c["command"] for c in sim.interactive.commands_for(scope)]
        assert {"approve", "deny", "status", "new", "help"} <= set(names), (scope, names)
        assert "usage" not in names and "cron" not in names  # turned off; for admins only
