"""The send_message tool against the gateway's real backend and outbox: the targets each user may address, sends
delivered once per run, refusals that say why, runs nobody chats in, and the ``messaging`` config's errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.config import ConfigError, parse_config
from tests.conftest import GatewayFactory, Harness, RecordingAdapter
from tools.registry import EFFECT_SENDS_MESSAGES, ISOLATION_PROCESS, registry
from tools.send_message_tool import MAX_MESSAGE_CHARS, set_messaging_backend

ALICE = {"user_key": "telegram:1001", "platform": "telegram", "chat_id": "100", "session_key": "telegram:dm:100",
         "run_id": "run-a"}
BOB = {**ALICE, "user_key": "telegram:1002", "chat_id": "200", "session_key": "telegram:dm:200", "run_id": "run-b"}
ADMIN = {**ALICE, "user_key": "telegram:1003", "run_id": "run-c"}
CRON = {**ALICE, "platform": "cron", "chat_id": "job1", "session_key": "cron:job1"}
WEBHOOK = {"user_key": "webhook:webhook:deploys", "platform": "webhook", "chat_id": "deploys", "run_id": "run-w",
           "session_key": "webhook:deploys:run-w"}
TARGETS = {
    "ops": {"platform": "slack", "chat_id": "C-OPS", "description": "the ops channel", "users": ["telegram:1002"]},
    "lobby": {"platform": "telegram", "chat_id": -500, "thread_id": 7, "description": "the lobby", "users": ["*"]},
    "guild": {"platform": "discord", "chat_id": "42", "users": ["*"]},  # Discord does not run here
    "deploys": {"platform": "telegram", "chat_id": "-600", "users": ["webhook:deploys"]},
}


class SlackDouble(RecordingAdapter):
    name = "slack"


async def _tool(ctx: dict[str, Any], **args: Any) -> dict[str, Any]:
    """The tool as a run calls it: in a worker thread (the backend carries each call to the gateway loop)."""
    return json.loads(await asyncio.to_thread(registry.dispatch, "send_message", args, **ctx))


async def _start(make_gateway: GatewayFactory, messaging: dict[str, Any] | None = None) -> tuple[Harness, SlackDouble]:
    slack = SlackDouble()
    h = await make_gateway({"messaging": {"targets": TARGETS, **(messaging or {})},
                            "auth": {"admins": ["telegram:1003"]}}, adapters={"slack": slack})
    return h, slack


async def _sethome(h: Harness, chat_id: str = "-200", user_id: str = "1001") -> None:
    await h.chat.user_says("/sethome", chat_id=chat_id, user_id=user_id, chat_type="group")
    await h.chat.wait_for(lambda: any("home channel" in t for t in h.chat.final_texts(chat_id)))


def _names(listed: dict[str, Any]) -> list[str]:
    return [t["target"] for t in listed["targets"]]


@pytest.fixture
def no_backend() -> Iterator[None]:
    set_messaging_backend(None)
    yield
    set_messaging_backend(None)


def test_registered_as_a_sending_process_tool_unavailable_without_an_outbox(no_backend: None) -> None:
    entry = registry.get("send_message")
    assert entry is not None and (entry.toolset, entry.isolation, entry.effects) == (
        "messaging", ISOLATION_PROCESS, frozenset({EFFECT_SENDS_MESSAGES}))
    assert entry.emoji and not registry.is_available("send_message")
    assert "unavailable" in json.loads(registry.dispatch("send_message", {"action": "list"}, **ALICE))["error"]


async def test_each_user_sees_the_targets_they_may_address(make_gateway: GatewayFactory) -> None:
    h, _ = await _start(make_gateway)
    assert registry.is_available("send_message")
    # Telegram: a private chat's id is the user's id, so the DM is known before any is stored.
    listed = await _tool(ALICE, action="list")
    assert listed["targets"] == [{"target": "dm", "platform": "telegram", "description": "your direct chat with me"},
                                 {"target": "lobby", "platform": "telegram", "description": "the lobby"}]
    await _sethome(h)
    assert _names(await _tool(ALICE, action="list")) == ["home", "dm", "lobby"]
    assert _names(await _tool(BOB, action="list")) == ["dm", "ops", "lobby"]
    assert _names(await _tool(ADMIN, action="list")) == ["dm", "ops", "lobby", "deploys"]  # no guild: not running


async def test_a_send_reaches_the_home_channel_once_per_run(make_gateway: GatewayFactory) -> None:
    h, _ = await _start(make_gateway)
    await _sethome(h)
    sent = await _tool(ALICE, action="send", target="home", message="  Standup moved to 10:00  ")
    assert sent == {"sent": {"target": "home", "platform": "telegram",
                             "description": "your home channel (set with /sethome)"}, "parts": 1}
    again = await _tool(ALICE, target="home", message="Standup moved to 10:00")  # send is the default action
    assert "already sent" in again["note"]
    assert await h.gateway.outbox.flush(5)
    assert h.chat.final_texts("-200").count("Standup moved to 10:00") == 1
    (row,) = [r for r in await h.gateway.store.outbox_rows("run-a") if r.text == "Standup moved to 10:00"]
    assert row.dedupe_key.startswith("msg:run-a:") and row.dedupe_key.endswith(":0") and row.status == "sent"
    # Another run may say the same again.
    await _tool({**ALICE, "run_id": "run-a2"}, action="send", target="home", message="Standup moved to 10:00")
    await h.chat.wait_for(lambda: h.chat.final_texts("-200").count("Standup moved to 10:00") == 2)


async def test_dm_threads_long_texts_and_other_platforms(make_gateway: GatewayFactory) -> None:
    h, slack = await _start(make_gateway)
    await h.chat.user_says("hello", chat_id="100", user_id="1001")  # a DM session: its chat is the DM now
    await h.chat.wait_for(lambda: "Echo: hello" in h.chat.final_texts("100"))
    await _tool(ALICE, action="send", target="dm", message="psst")
    await h.chat.wait_for(lambda: "psst" in h.chat.final_texts("100"))
    long = " ".join(["word"] * 1500)  # 7,499 characters: two Telegram messages
    assert (await _tool(ALICE, action="send", target="lobby", message=long))["parts"] == 2
    await h.chat.wait_for(lambda: len(h.chat.final_texts("-500")) == 2)
    assert "".join(h.chat.final_texts("-500")).replace("\n", " ").split() == long.split()
    assert {s.metadata.get("thread_id") for s in h.chat.sent if s.chat_id == "-500"} == {"7"}
    await _tool(BOB, action="send", target="ops", message="disk almost full on db-1")
    await slack.wait_for(lambda: slack.final_texts("C-OPS") == ["disk almost full on db-1"])


async def test_a_target_the_user_may_not_address_is_refused(make_gateway: GatewayFactory) -> None:
    h, slack = await _start(make_gateway)
    refused = await _tool(ALICE, action="send", target="ops", message="let me in")
    assert "You may not send to 'ops'" in refused["error"] and "messaging.targets.ops.users" in refused["error"]
    assert "You may send to: dm, lobby" in refused["error"]
    assert "No target named 'nowhere'" in (await _tool(ALICE, target="nowhere", message="x"))["error"]
    assert "/sethome" in (await _tool(ALICE, target="home", message="x"))["error"]
    assert "may not send to 'guild'" in (await _tool(ADMIN, target="guild", message="x"))["error"]  # not running
    assert await h.gateway.outbox.flush(5)
    assert slack.sent == [] and not [r for r in await h.gateway.store.outbox_rows() if r.text in ("let me in", "x")]


async def test_cron_and_webhook_runs_send_only_when_allowed(make_gateway: GatewayFactory) -> None:
    h, _ = await _start(make_gateway)
    await _sethome(h)
    assert "messaging.allow_cron" in (await _tool(CRON, target="home", message="nightly"))["error"]
    assert "messaging.allow_cron" in (await _tool(CRON, action="list"))["error"]
    assert "messaging.allow_webhooks" in (await _tool(WEBHOOK, target="deploys", message="v2"))["error"]
    await h.gateway.stop()

    h, _ = await _start(make_gateway, {"allow_cron": True, "allow_webhooks": True})
    assert (await _tool(CRON, target="home", message="nightly"))["parts"] == 1  # as the job's owner
    await h.chat.wait_for(lambda: "nightly" in h.chat.final_texts("-200"))
    # No home or DM of a webhook, and not the targets open to every user ("*"): only those naming its route.
    assert _names(await _tool(WEBHOOK, action="list")) == ["deploys"]
    assert "may not send to 'lobby'" in (await _tool(WEBHOOK, target="lobby", message="injected"))["error"]
    await _tool(WEBHOOK, target="deploys", message="v2 is live")
    await h.chat.wait_for(lambda: "v2 is live" in h.chat.final_texts("-600"))


@pytest.mark.parametrize(("args", "fragment"), [
    ({"action": "send", "message": "x"}, "send needs 'target'"),
    ({"action": "send", "target": "dm"}, "send needs 'message'"),
    ({"action": "send", "target": "dm", "message": "x" * (MAX_MESSAGE_CHARS + 1)}, f"limit is {MAX_MESSAGE_CHARS}"),
    ({"action": "shout"}, "Unknown action 'shout'"),
])
async def test_bad_arguments_are_clear_errors(make_gateway: GatewayFactory, args: dict[str, Any],
                                              fragment: str) -> None:
    await _start(make_gateway)
    assert fragment in (await _tool(ALICE, **args))["error"]


@pytest.mark.parametrize(("targets", "path", "fragment"), [
    ({"home": {"platform": "telegram", "chat_id": "1"}}, "messaging.targets.home", "reserved"),
    ({"Ops Room": {"platform": "telegram", "chat_id": "1"}}, "messaging.targets.Ops Room", "invalid target name"),
    ({"ops": {"platform": "irc", "chat_id": "1"}}, "messaging.targets.ops.platform", "unknown platform"),
    ({"ops": {"platform": "slack"}}, "messaging.targets.ops.chat_id", "required"),
    ({"ops": {"platform": "slack", "chat_id": "C1", "users": ["bob"]}}, "messaging.targets.ops.users[0]",
     "write <platform>:<user_id>"),
])
def test_the_messaging_config_is_validated_with_the_key_and_the_fix(tmp_path: Path, targets: dict[str, Any],
                                                                    path: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"messaging": {"targets": targets}}, env={"HERMES_GATEWAY_HOME": str(tmp_path)})
    assert any(e.path == path and fragment in str(e) for e in caught.value.errors), str(caught.value)
