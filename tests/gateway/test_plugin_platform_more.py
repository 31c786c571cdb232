"""A plugin's platform beyond chatting on it: ``check`` loads the plugins as ``run`` does (their sections and
command names validated with key paths, their platforms summarised, their sections shown masked); plugin command
names in ``commands``; webhook routes and ``send_message`` targets delivering to the example Relay platform."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.app import Gateway
from gateway.config import ConfigError, parse_config
from gateway.sim.model_server import rules, tool_call
from gateway.sim.relay_api import RelaySimulator
from tests.conftest import base_config, deep_merge
from tests.gateway.test_plugin_platform import EXAMPLES, relay, relay_config  # noqa: F401  (relay: a fixture)
from toolsets import resolve_toolset

ROOT = Path(__file__).resolve().parents[2]
RELAY_TOKEN = "relay-check-token-secret-77"


# -- hermes-gateway check --------------------------------------------------------------------------------------


def _check(home: Path, config: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    (home / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
    return subprocess.run([sys.executable, "-m", "gateway", "check", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**env, "HERMES_GATEWAY_HOME": str(home)}, check=False)


def _relay_file_config(**section: Any) -> dict[str, Any]:
    return {"model": {"base_url": "http://127.0.0.1:9/v1", "name": "m"},
            "plugins": {"dir": str(EXAMPLES), "entry_points": False},
            "platforms": {"relay": {"plugin": "relay", "url": "http://127.0.0.1:9", "token": RELAY_TOKEN,
                                    **section}},
            "auth": {"platforms": {"relay": {"allowed_users": ["u1"]}}}}


def test_check_loads_the_plugins_and_summarises_their_platforms(tmp_path: Path) -> None:
    done = _check(tmp_path, deep_merge(_relay_file_config(), {"commands": {"disabled": ["relay"]}}), "--show")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "platforms: relay (plugin relay)" in lines
    assert (f"  relay: 1 tools; platforms relay; commands /relay; hooks pre_llm_call, post_tool_call "
            f"(from {EXAMPLES / 'relay'})") in lines
    assert f"  relay: hermes-relay ({len(resolve_toolset('hermes-core')) + 1} tools)" in lines
    assert lines[-1] == "config OK"
    # --show has the plugin's section as its model resolved it (defaults included), the token masked.
    assert RELAY_TOKEN not in done.stdout and RELAY_TOKEN not in done.stderr
    shown = yaml.safe_load(done.stdout)
    assert shown["platforms"]["relay"] == {"plugin": "relay", "enabled": True, "url": "http://127.0.0.1:9",
                                           "token": "***", "poll_timeout": 25.0, "request_timeout": 10.0}
    assert shown["commands"]["disabled"] == ["relay"]


def test_check_refuses_what_only_the_plugin_can_judge_with_key_paths(tmp_path: Path) -> None:
    config = deep_merge(_relay_file_config(poll_timeout=99, tokn="x"), {"commands": {"admin_only": ["relya"]}})
    done = _check(tmp_path, config)
    assert done.returncode == 2
    errors = done.stderr.splitlines()
    assert errors[0] == ("config error: commands.admin_only: unknown command 'relya' (did you mean 'relay'? no "
                         "built-in command and no loaded plugin's has this name: correct it, remove it, or load the "
                         "plugin that provides it (plugins.dir, plugins.entry_points))")
    assert sorted(e.split(":")[0] for e in errors[1:]) == ["platforms.relay.poll_timeout", "platforms.relay.tokn"]
    assert RELAY_TOKEN not in done.stderr


def test_check_warns_about_a_plugin_that_fails_to_load(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "broken.py").write_text("raise RuntimeError('no luck')\n", encoding="utf-8")
    config = {"model": {"base_url": "http://127.0.0.1:9/v1"}, "plugins": {"dir": str(plugins), "entry_points": False}}
    done = _check(tmp_path, config)
    assert done.returncode == 0, done.stderr
    assert ("warning: plugin broken: not loaded: RuntimeError: no luck; fix: correct it, or remove it from "
            "plugins.dir") in done.stderr.splitlines()

    # A section naming it: the gateway could not run, and check says so at the section's key.
    config["platforms"] = {"relay": {"plugin": "broken", "url": "http://127.0.0.1:9"}}
    done = _check(tmp_path, config)
    assert done.returncode == 2
    assert ("config error: platforms.relay: no loaded plugin provides platform 'relay' (plugin 'broken' failed to "
            "load: RuntimeError: no luck)") in done.stderr.splitlines()


# -- plugin command names in commands ---------------------------------------------------------------------------


def test_command_names_not_built_in_pass_parsing_only_when_shaped_like_one(tmp_path: Path) -> None:
    env = {"HERMES_GATEWAY_HOME": str(tmp_path)}
    cfg = parse_config({"commands": {"disabled": ["/relay", "title"], "admin_only": ["relay"]}}, env)
    assert cfg.commands.disabled == ["relay", "title"]
    assert cfg.commands.admin_only == ["relay"]
    with pytest.raises(ConfigError) as err:
        parse_config({"commands": {"disabled": ["Relay Now"]}}, env)
    assert (err.value.path, err.value.message) == ("commands.disabled", "unknown command 'Relay Now'")
    assert err.value.hint.endswith("a plugin's command is 1-32 lowercase letters, digits or '_'")


async def test_the_gateway_refuses_an_unknown_command_name_at_start(tmp_path: Path) -> None:
    data = deep_merge(base_config(tmp_path, "http://127.0.0.1:9/v1", "http://127.0.0.1:9/cb"),
                      {"commands": {"disabled": ["titel"]}})
    gateway = Gateway(parse_config(data, env={"HERMES_GATEWAY_HOME": str(tmp_path)}))
    try:
        with pytest.raises(ConfigError) as err:
            await gateway.start()
    finally:
        await gateway.stop(drain_timeout=0)
    assert (err.value.path, err.value.message) == ("commands.disabled", "unknown command 'titel'")
    assert err.value.hint.startswith("did you mean 'title'?")


async def test_a_plugin_command_can_be_turned_off(make_gateway, relay: RelaySimulator) -> None:  # noqa: F811
    await make_gateway(deep_merge(relay_config(relay), {"commands": {"disabled": ["relay"]}}))
    await relay.user_says("/relay", chat="room-1", user="u1")
    sent = await relay.wait_for(lambda sent: len(sent) == 1)
    assert sent[0].text == "/relay is turned off on this gateway."


# -- delivering to a plugin's platform ----------------------------------------------------------------------------


def test_a_plugin_platform_is_a_delivery_platform_only_with_its_section() -> None:
    route = {"secret": "s", "prompt": "p", "deliver_to": "relay:room-9"}
    data: dict[str, Any] = {"platforms": {"webhook": {"routes": {"gh": route}}},
                            "messaging": {"targets": {"ops": {"platform": "relay", "chat_id": "room-9",
                                                              "users": ["relay:u1"]}}}}
    with pytest.raises(ConfigError) as err:
        parse_config(data, {})
    assert [(e.path, e.message) for e in err.value.errors] == [
        ("platforms.webhook.routes.gh.deliver_to", "unknown delivery platform 'relay'"),
        ("messaging.targets.ops.platform", "unknown platform 'relay'"),
        ("messaging.targets.ops.users[0]", "unknown platform 'relay'")]
    assert "platforms.<name> with plugin: <plugin name>" in err.value.errors[0].hint
    data["platforms"]["relay"] = {"plugin": "relay"}
    cfg = parse_config(data, {})
    assert cfg.platforms.webhook.routes["gh"].delivery == ("relay", "room-9", None)
    assert cfg.messaging.targets["ops"].platform == "relay"


def _tell(match: Any, _request: Any) -> Any:
    return tool_call("send_message", {"action": "send", "target": match[1], "message": match[2]})


async def test_a_webhook_and_send_message_deliver_to_the_plugin_platform_once(make_gateway,
                                                                             relay: RelaySimulator) -> None:  # noqa: F811
    config = deep_merge(relay_config(relay), {
        "platforms": {"webhook": {"routes": {"github": {"deliver_to": "relay:room-9"}}}},
        "messaging": {"targets": {"ops": {"platform": "relay", "chat_id": "room-9", "users": ["relay:u1"]}}}})
    h = await make_gateway(config, responder=rules((r"tell (\w+): (.+)", _tell)))

    status, body = await h.post_webhook()
    assert status == 202, body
    run = await h.wait_run(body["run_id"])
    assert run["status"] == "completed"
    await relay.wait_for(lambda sent: any(m.chat == "room-9" for m in sent))

    await relay.user_says("tell ops: db-1 is almost full", chat="room-1", user="u1")
    await relay.wait_for(lambda sent: any(m.text == "db-1 is almost full" for m in sent))
    assert h.gateway.outbox is not None and await h.gateway.outbox.flush(5)
    room = [m.text for m in relay.sent if m.chat == "room-9"]
    assert len(room) == 2 and room[0].startswith("Echo: Push to acme/rocket: fix countdown")  # each once
    assert room[1] == "db-1 is almost full"
    assert not h.sink.received  # the route's callback target is no longer where it delivers


PLUGIN_COMMAND = '''
def register(ctx):
    ctx.register_command("ping", "answers pong", lambda c: "pong")
'''


async def test_admin_only_names_a_plugin_command(make_gateway, tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "pinger.py").write_text(textwrap.dedent(PLUGIN_COMMAND), encoding="utf-8")
    h = await make_gateway({"plugins": {"dir": str(plugins), "entry_points": False},
                            "commands": {"admin_only": ["ping"]}})
    await h.chat.user_says("/ping")
    await h.chat.wait_for(lambda: bool(h.chat.final_texts()))
    assert h.chat.final_texts() == ["Only gateway admins can use /ping."]
