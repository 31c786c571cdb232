"""A platform from a plugin: the example Relay plugin (examples/plugins/relay) loaded through plugins.dir, its
config section checked by its own model, a chat through the Relay simulator, its automatic toolset, its command
and its hooks; and the operator's plugins.allow_override in a running gateway."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.app import Gateway
from gateway.commands import COMMANDS
from gateway.config import ConfigError, parse_config
from gateway.logs import redactor
from gateway.sim.model_server import rules, tool_call
from gateway.sim.relay_api import RelaySimulator
from tests.conftest import API_TOKEN, base_config, deep_merge
from tools.registry import registry
from toolsets import TOOLSETS, resolve_toolset

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"
NOTE = "Relay shows plain text only: answer without Markdown."


@pytest.fixture
async def relay() -> AsyncIterator[RelaySimulator]:
    sim = RelaySimulator(token="relay-secret-token-42")
    await sim.start()
    yield sim
    await sim.stop()


def relay_config(sim: RelaySimulator, **section: Any) -> dict[str, Any]:
    return {"plugins": {"dir": str(EXAMPLES), "entry_points": False},
            "platforms": {"relay": {"plugin": "relay", "url": sim.url, "token": sim.token, "poll_timeout": 5,
                                    **section}},
            "auth": {"platforms": {"relay": {"allowed_users": ["u1"]}}}}


def _tool_names(request: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools") or ()}


async def test_chat_through_a_plugin_platform(make_gateway, relay: RelaySimulator) -> None:
    h = await make_gateway(relay_config(relay), responder=rules(
        (r"shout (\w+)", lambda m, _: tool_call("relay_shout", {"text": m.group(1)}))))
    assert h.gateway.adapters["relay"].name == "relay"
    assert relay.token not in redactor(f"token={relay.token}")  # its SecretStr setting joined the log redaction

    # Its sessions' toolset resolves by itself: the core tools plus the plugin's.
    assert resolve_toolset("hermes-relay") == [*resolve_toolset("hermes-core"), "relay_shout"]
    assert "relay_shout" in resolve_toolset("all")

    await relay.user_says("please shout hello", chat="room-1", user="u1")
    sent = await relay.wait_for(lambda sent: any(m.text == "Done: HELLO!" for m in sent))
    assert [(m.chat, m.text) for m in sent] == [("room-1", "Done: HELLO!")]

    first = h.model.requests[0]
    offered = _tool_names(first)
    assert "relay_shout" in offered and {"read_file", "terminal", "memory"} <= offered
    assert offered <= set(resolve_toolset("hermes-relay"))
    # The plugin's pre_llm_call hook added its note to the request (and only for Relay sessions).
    assert NOTE in str(first["messages"][-1]["content"])

    # The plugin's command, routed like the built-in ones; it reports what its post_tool_call hook counted.
    await relay.user_says("/relay", chat="room-1", user="u1")
    sent = await relay.wait_for(lambda sent: len(sent) == 2)
    assert sent[1].text == "Relay plugin here (relay). Tool calls seen: relay_shout x1."
    assert len(h.model.requests) == 2  # the command never reached the model

    # Someone not allowed on Relay is refused like on any platform.
    await relay.user_says("shout nope", chat="room-2", user="mallory")
    await relay.user_says("/relay", chat="room-1", user="u1")
    sent = await relay.wait_for(lambda sent: len(sent) >= 3)
    assert [m.chat for m in sent] == ["room-1"] * 3  # no answer to mallory, and no tool call for her
    assert sent[2].text == "Relay plugin here (relay). Tool calls seen: relay_shout x1."

    async with h.http.get(f"{h.base_url}/readyz", headers={"Authorization": f"Bearer {API_TOKEN}"}) as r:
        ready = await r.json()
    assert ready["platforms"]["relay"]["state"] == "connected"
    assert ready["plugins"]["relay"] == {"status": "loaded", "source": str(EXAMPLES / "relay"),
                                         "tools": ["relay_shout"], "platforms": ["relay"], "commands": ["relay"],
                                         "hooks": ["pre_llm_call", "post_tool_call"], "error": None}

    # A non-Relay session gets no note: the hook looks at the platform.
    await h.chat.user_says("hi there")
    await h.chat.wait_for(lambda: "Echo: hi there" in h.chat.final_texts())
    assert NOTE not in str(h.model.requests[-1]["messages"])

    await asyncio.wait_for(h.gateway.stop(drain_timeout=1), 30)
    assert "relay" not in COMMANDS and "hermes-relay" not in TOOLSETS and registry.get("relay_shout") is None


async def _start_failing(tmp_path: Path, overrides: dict[str, Any]) -> ConfigError:
    cfg = parse_config(deep_merge(base_config(tmp_path, "http://127.0.0.1:9/v1", "http://127.0.0.1:9/cb"),
                                  overrides), env={"HERMES_GATEWAY_HOME": str(tmp_path)})
    gateway = Gateway(cfg)
    try:
        with pytest.raises(ConfigError) as info:
            await gateway.start()
    finally:
        await gateway.stop(drain_timeout=0)
    assert registry.get("relay_shout") is None  # the plugins were unloaded again
    return info.value


async def test_the_plugin_validates_its_section_with_key_paths(tmp_path: Path, relay: RelaySimulator) -> None:
    err = await _start_failing(tmp_path, relay_config(relay, url="ftp://relay", tokn="x", poll_timeout=99))
    assert sorted((e.path, e.message) for e in err.errors) == [
        ("platforms.relay.poll_timeout", "Input should be less than or equal to 30"),
        ("platforms.relay.tokn", "unknown key"),
        ("platforms.relay.url", "Value error, must be an http:// or https:// URL"),
    ]
    assert next(e for e in err.errors if e.path.endswith("tokn")).hint.startswith("did you mean 'token'?")


async def test_a_section_no_loaded_plugin_provides(tmp_path: Path, relay: RelaySimulator) -> None:
    config = relay_config(relay)
    config["platforms"]["relay"]["plugin"] = "relays"
    err = await _start_failing(tmp_path, config)
    assert (err.path, str(err)) == ("platforms.relay.plugin", "platforms.relay.plugin: platform 'relay' comes "
                                                              "from plugin 'relay' (write plugin: relay)")
    config["plugins"]["dir"] = str(tmp_path)  # no plugins there
    err = await _start_failing(tmp_path, config)
    assert err.path == "platforms.relay"
    assert err.hint.startswith("no plugin 'relays' was found")


def test_its_name_is_known_to_toolsets_and_auth_only_with_its_section() -> None:
    data = {"toolsets": {"relay": ["hermes-relay", "plugin-relay"], "slack": ["hermes-relay"]},
            "auth": {"admins": ["relay:u1"]}}
    with pytest.raises(ConfigError) as info:
        parse_config(data, {})
    assert [e.path for e in info.value.errors] == ["toolsets.relay", "auth.admins[0]", "toolsets.relay[0]",
                                                   "toolsets.slack[0]"]
    assert info.value.errors[2].message == "unknown toolset 'hermes-relay'"
    cfg = parse_config({**data, "platforms": {"relay": {"plugin": "relay", "url": "http://x"}}}, {})
    assert cfg.toolsets["relay"] == ["hermes-relay", "plugin-relay"]
    assert cfg.platforms.plugin_sections["relay"].settings == {"url": "http://x"}
    with pytest.raises(ConfigError, match=r"platforms\.cron: reserved platform name"):
        parse_config({"platforms": {"cron": {"plugin": "relay"}}}, {})


SHADOW = '''
def register(ctx):
    ctx.register_tool("read_file", "plugin-shadow", {"description": "plugin read_file"},
                      lambda args, **c: "from the plugin", override=True)
'''


async def test_the_gateway_applies_plugins_allow_override(make_gateway, tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "shadow.py").write_text(textwrap.dedent(SHADOW), encoding="utf-8")
    h = await make_gateway({"plugins": {"dir": str(plugins), "entry_points": False}})
    status = h.gateway.plugins.statuses[0]
    assert status.error == ("replacing read_file (toolset file) needs plugins.allow_override: [read_file] besides "
                            "override=True")
    assert registry.toolset_of("read_file") == "file"
    await h.gateway.stop(drain_timeout=1)

    h = await make_gateway({"plugins": {"dir": str(plugins), "entry_points": False,
                                        "allow_override": ["read_file"]}})
    assert h.gateway.plugins.statuses[0].ok
    assert registry.toolset_of("read_file") == "plugin-shadow"
    await h.gateway.stop(drain_timeout=1)
    assert registry.toolset_of("read_file") == "file"
