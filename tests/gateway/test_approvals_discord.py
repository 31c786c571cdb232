"""Approvals and slash commands end to end on Discord: the real gateway and discord.py adapter against the Discord
simulator. The prompt's buttons are message components; a press (an interaction acknowledged with a deferred
update) answers the request, runs the command once or never, and the prompt is edited to show who answered; another
user's press is refused; a restart keeps the request; "Always" skips the prompt next time; clarify's choices are
buttons; the command menu is registered as application commands, and a slash command's answer edits its response."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.app import Gateway
from gateway.sim.discord_api import ALICE_ID, BOB_ID, GENERAL_ID, GUILD_ID, DiscordSimulator
from gateway.sim.discord_interactions import InteractionCallback
from platforms.base import AdapterState
from tests.conftest import GatewayFactory, deep_merge
from tests.gateway.test_approvals import DANGEROUS, PROMPT_ID, Model, _approval_row, _build_dir, _terminal_runs
from tests.platforms.test_discord import (
    BACKOFF,
    HEARTBEAT_MS,
    HEARTBEAT_TIMEOUT,
    _discord_endpoints,  # noqa: F401 (autouse: discord.py's URLs restored)
)

CAROL_ID = 2003  # an admin
ANSWERS = ["Approve once", "This session", "Always", "Deny"]
DEFERRED_UPDATE, DEFERRED_RESPONSE = 6, 5

Start = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def dc(make_gateway: GatewayFactory) -> AsyncIterator[tuple[DiscordSimulator, Model, Start]]:
    """The Discord simulator, the scripted model and a factory starting a gateway against both (config overrides
    merged in), returned once the Discord adapter is connected. Gateways share the store and workspace."""
    model = Model()
    started: list[Gateway] = []
    async with DiscordSimulator(heartbeat_interval=HEARTBEAT_MS) as sim:
        sim.add_user(CAROL_ID, "carol")

        async def start(overrides: dict[str, Any] | None = None) -> Gateway:
            h = await make_gateway(deep_merge({
                "platforms": {"discord": {
                    "enabled": True, "token": sim.token, "api_base_url": sim.api_base_url,
                    "guild_ready_timeout": 0.05, "heartbeat_timeout": HEARTBEAT_TIMEOUT,
                    "reconnect_backoff": BACKOFF, "respond_in_guilds": "always"}},
                "auth": {"platforms": {"discord": {"allowed_users": [str(ALICE_ID), str(BOB_ID), str(CAROL_ID)]}},
                         "admins": [f"discord:{CAROL_ID}"]}}, overrides or {}), responder=model)
            adapter = h.gateway.adapters["discord"]
            started.append(h.gateway)
            await sim.wait_for(lambda: adapter.state is AdapterState.CONNECTED, timeout=10)
            return h.gateway

        yield sim, model, start
        for gateway in started:  # before the simulator goes: what they still send reaches it
            await gateway.stop(drain_timeout=1)


def _labels(message: dict[str, Any]) -> list[str]:
    return [b["label"] for row in message.get("components", []) for b in row["components"]]


def _shown(sim: DiscordSimulator, message_id: int) -> dict[str, Any]:
    """A message as users see it now (edits applied)."""
    return next(m for m in sim.messages(GENERAL_ID) if int(m["id"]) == message_id)


async def _next(sim: DiscordSimulator, before: int) -> str:
    """The content of the bot's next new message in #general after the first ``before``."""
    return (await sim.wait_for_bot_messages(before + 1, GENERAL_ID, timeout=10))[before]["content"]


async def _ask(sim: DiscordSimulator, user_id: int = ALICE_ID) -> tuple[str, int]:
    """``user_id`` says "clean the build" in #general; the approval id and message id of the prompt that comes
    back, once it shows the four answers as buttons."""
    before = len(sim.bot_messages(GENERAL_ID))
    sim.user_sends("clean the build", user_id=user_id)
    prompt = (await sim.wait_for_bot_messages(before + 1, GENERAL_ID, timeout=10))[before]
    assert "Approval needed" in prompt["content"] and DANGEROUS in prompt["content"], prompt["content"]
    assert _labels(prompt) == ANSWERS
    found = PROMPT_ID.search(prompt["content"])
    assert found is not None, prompt["content"]
    return found.group(1), int(prompt["id"])


async def _acknowledged(sim: DiscordSimulator, interaction: dict[str, Any]) -> list[InteractionCallback]:
    """The interaction's callbacks, once it has one."""
    await sim.wait_for_callback(int(interaction["id"]))
    return sim.callbacks(int(interaction["id"]))


def _command_results(model: Model) -> list[str]:
    """Terminal results the model was shown that are a run of the command (not a wait or a refusal)."""
    return [c for c in _terminal_runs(model) if '"exit_code"' in c]


async def test_pressing_approve_once_runs_the_command_once(dc: tuple[DiscordSimulator, Model, Start],
                                                           tmp_path: Path) -> None:
    sim, model, start = dc
    build = _build_dir(tmp_path)
    gateway = await start()
    approval_id, prompt_id = await _ask(sim)
    assert build.exists(), "the command ran before anyone approved it"
    before = len(sim.bot_messages(GENERAL_ID))
    press = sim.user_presses(prompt_id, label="Approve once")
    answer = await _next(sim, before)  # the prompt itself is edited: the next new message is the run's answer
    assert answer.startswith("Tool said:") and '"exit_code": 0' in answer, answer
    assert not build.exists()
    assert len(_command_results(model)) == 1
    shown = await sim.wait_for(lambda: (m := _shown(sim, prompt_id))["content"].startswith("✅ Approved (once) by "
                                                                                          "Alice") and m)
    assert DANGEROUS in shown["content"] and shown["components"] == []
    assert [c.type for c in await _acknowledged(sim, press)] == [DEFERRED_UPDATE]
    row = await _approval_row(gateway, approval_id)
    assert (row.status, row.scope, row.decided_by, row.requester) == ("approved", "once", "Alice",
                                                                      f"discord:{ALICE_ID}")
    with pytest.raises(ValueError, match="no enabled button"):  # nothing left to press twice
        sim.user_presses(prompt_id, label="Approve once")


async def test_pressing_deny_never_runs_and_the_model_is_told(dc: tuple[DiscordSimulator, Model, Start],
                                                              tmp_path: Path) -> None:
    sim, model, start = dc
    build = _build_dir(tmp_path)
    gateway = await start()
    approval_id, prompt_id = await _ask(sim)
    before = len(sim.bot_messages(GENERAL_ID))
    press = sim.user_presses(prompt_id, label="Deny")
    assert await _next(sim, before) == "Understood: I did not run it."
    told = model.requests[-1]["messages"][-1]
    assert told["role"] == "user" and told["content"].startswith("(Denied by Alice") and DANGEROUS in told["content"]
    assert build.exists() and _command_results(model) == []
    shown = _shown(sim, prompt_id)
    assert shown["content"].startswith("❌ Denied by Alice") and shown["components"] == []
    assert [c.type for c in await _acknowledged(sim, press)] == [DEFERRED_UPDATE]
    assert (await _approval_row(gateway, approval_id)).status == "denied"


async def test_another_users_press_is_refused_and_the_request_stays(dc: tuple[DiscordSimulator, Model, Start],
                                                                    tmp_path: Path) -> None:
    sim, model, start = dc
    build = _build_dir(tmp_path)
    gateway = await start()
    approval_id, prompt_id = await _ask(sim)
    before = len(sim.bot_messages(GENERAL_ID))
    press = sim.user_presses(prompt_id, label="Approve once", user_id=BOB_ID)
    refused = await _next(sim, before)
    assert refused.startswith("Only Alice or an admin can answer"), refused
    assert [c.type for c in await _acknowledged(sim, press)] == [DEFERRED_UPDATE]
    prompt = _shown(sim, prompt_id)
    assert "Approval needed" in prompt["content"] and _labels(prompt) == ANSWERS
    assert (await _approval_row(gateway, approval_id)).status == "pending"
    assert build.exists() and _command_results(model) == []
    # Still answerable: an admin's press approves it.
    sim.user_presses(prompt_id, label="Approve once", user_id=CAROL_ID)
    assert (await _next(sim, before + 1)).startswith("Tool said:")
    assert _shown(sim, prompt_id)["content"].startswith("✅ Approved (once) by Carol")
    assert not build.exists() and len(_command_results(model)) == 1


async def test_a_restart_between_prompt_and_press_completes_once(dc: tuple[DiscordSimulator, Model, Start],
                                                                 tmp_path: Path) -> None:
    sim, model, start = dc
    build = _build_dir(tmp_path)
    first = await start()
    approval_id, prompt_id = await _ask(sim)
    await first.stop(drain_timeout=1)
    second = await start()
    assert (await _approval_row(second, approval_id)).status == "pending"
    before = len(sim.bot_messages(GENERAL_ID))
    press = sim.user_presses(prompt_id, label="Approve once")
    assert (await _next(sim, before)).startswith("Tool said:")
    assert [c.type for c in await _acknowledged(sim, press)] == [DEFERRED_UPDATE]
    assert not build.exists()
    assert len(_command_results(model)) == 1
    assert _shown(sim, prompt_id)["content"].startswith("✅ Approved (once) by Alice")
    assert len(sim.bot_messages(GENERAL_ID)) == before + 1  # one answer, no second run


async def test_always_skips_the_prompt_next_time_for_that_user(dc: tuple[DiscordSimulator, Model, Start],
                                                               tmp_path: Path) -> None:
    sim, _model, start = dc
    build = _build_dir(tmp_path)
    await start()
    _, prompt_id = await _ask(sim)
    before = len(sim.bot_messages(GENERAL_ID))
    sim.user_presses(prompt_id, label="Always")
    assert (await _next(sim, before)).startswith("Tool said:")
    assert _shown(sim, prompt_id)["content"].startswith("✅ Approved (always) by Alice")
    build.mkdir()
    sim.user_sends("clean the build")
    answer = await _next(sim, before + 1)
    assert answer.startswith("Tool said:") and '"exit_code": 0' in answer, answer
    assert not build.exists()
    # Only for Alice: Bob is still asked.
    build.mkdir()
    await _ask(sim, user_id=BOB_ID)
    assert build.exists()


async def test_expiry_denies_edits_the_prompt_and_tells_the_model(dc: tuple[DiscordSimulator, Model, Start],
                                                                  tmp_path: Path) -> None:
    sim, model, start = dc
    build = _build_dir(tmp_path)
    gateway = await start({"approvals": {"timeout_minutes": 0.02}})  # 1.2 s
    approval_id, prompt_id = await _ask(sim)
    before = len(sim.bot_messages(GENERAL_ID))
    assert await _next(sim, before) == "Understood: I did not run it."
    assert model.requests[-1]["messages"][-1]["content"].startswith("(Nobody answered within")
    shown = await sim.wait_for(lambda: (m := _shown(sim, prompt_id))["content"].startswith("⌛ Expired") and m)
    assert shown["components"] == []
    assert (await _approval_row(gateway, approval_id)).status == "expired"
    assert build.exists()


async def test_clarify_choices_are_answered_by_a_press(dc: tuple[DiscordSimulator, Model, Start]) -> None:
    sim, model, start = dc
    await start()
    sim.user_sends("paint it")
    question = (await sim.wait_for_bot_messages(1, GENERAL_ID, timeout=10))[0]
    assert question["content"].startswith("Which colour?") and _labels(question) == ["red", "green", "blue"]
    press = sim.user_presses(int(question["id"]), label="green")
    assert await _next(sim, 1) == "Echo: green"
    assert model.requests[-1]["messages"][-1] == {"role": "user", "content": "green"}
    assert [c.type for c in await _acknowledged(sim, press)] == [DEFERRED_UPDATE]


@pytest.mark.parametrize("per_guild", [False, True])
async def test_application_commands_are_registered_at_start(dc: tuple[DiscordSimulator, Model, Start],
                                                            per_guild: bool) -> None:
    sim, _model, start = dc
    guilds = [str(GUILD_ID)] if per_guild else []
    await start({"commands": {"disabled": ["usage"], "admin_only": ["cron"]},
                 "platforms": {"discord": {"command_guilds": guilds}}})
    where, elsewhere = (GUILD_ID, None) if per_guild else (None, GUILD_ID)
    registered = await sim.wait_for(lambda: sim.application_commands(where))
    names = {c["name"] for c in registered}
    assert {"status", "approve", "deny", "new", "help"} <= names, names
    assert not names & {"usage", "cron"}  # turned off; for admins only
    assert sim.application_commands(elsewhere) == []


async def test_a_status_slash_command_edits_its_response(dc: tuple[DiscordSimulator, Model, Start]) -> None:
    sim, _model, start = dc
    await start()
    await sim.wait_for(lambda: sim.application_commands())
    invoked = sim.user_invokes("status", user_id=BOB_ID)
    iid = int(invoked["id"])
    original = await sim.wait_for(lambda: (m := sim.original_response(iid)) and m["content"].startswith("Model:")
                                  and m)
    assert "\nSession: " in original["content"] and "\nUptime: " in original["content"], original["content"]
    assert not original["flags"] & 128  # no longer "thinking..."
    assert [c.type for c in sim.callbacks(iid)] == [DEFERRED_RESPONSE]
    assert sim.bot_messages(GENERAL_ID) == [original] and not sim.calls_of("create_message")  # the response only


async def test_approve_as_a_slash_command(dc: tuple[DiscordSimulator, Model, Start], tmp_path: Path) -> None:
    sim, model, start = dc
    build = _build_dir(tmp_path)
    gateway = await start()
    await sim.wait_for(lambda: sim.application_commands())
    approval_id, _ = await _ask(sim)
    before = len(sim.bot_messages(GENERAL_ID))
    invoked = sim.user_invokes("approve", {"args": f"once {approval_id}"})
    iid = int(invoked["id"])
    note = await sim.wait_for(lambda: (m := sim.original_response(iid)) and m["content"].startswith("✅") and m)
    assert note["content"].startswith("✅ Approved (once) by Alice") and DANGEROUS in note["content"]
    assert [c.type for c in sim.callbacks(iid)] == [DEFERRED_RESPONSE]
    assert (await _next(sim, before + 1)).startswith("Tool said:")  # after the response message
    assert not build.exists() and len(_command_results(model)) == 1
    assert (await _approval_row(gateway, approval_id)).scope == "once"
