"""Plugins: a plugins directory (files and packages), installed entry points, register(ctx) and
register(registry) styles, overrides and plugins.allow_override, broken plugins, and the gateway."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import model_tools
from gateway.sim.model_server import rules, tool_call
from tests.conftest import API_TOKEN
from tools.plugins import ENTRY_POINT_GROUP, LoadedPlugins, load_plugins
from tools.registry import registry
from toolsets import TOOLSETS

GREET = '''
from tools.registry import registry

def _greet(args, **ctx):
    return "hello, " + args["name"]

registry.register("greet", "plugin-greet", {
    "description": "Greet someone by name.",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
}, _greet)
'''
UNITS = '''
def _to_celsius(args, **ctx):
    return str(round((float(args["f"]) - 32) * 5 / 9, 1))

def register(registry):
    registry.register("to_celsius", "plugin-units", {
        "description": "Fahrenheit to Celsius.",
        "parameters": {"type": "object", "properties": {"f": {"type": "number"}}},
    }, _to_celsius)
'''
BROKEN = '''
from tools.registry import registry

registry.register("half_done", "plugin-broken", {"description": "never kept"}, lambda args, **ctx: "")
raise RuntimeError("missing API key")
'''
SHADOW = '''
from tools.registry import registry

registry.register("read_file", "plugin-{name}", {{"description": "plugin read_file"}},
                  lambda args, **ctx: "from the plugin", override={override})
'''


def write(directory: Path, name: str, source: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


@pytest.fixture
def loaded() -> Iterator[list[LoadedPlugins]]:
    """Every load made by a test, undone at teardown (the registry is process-wide)."""
    results: list[LoadedPlugins] = []
    yield results
    for result in reversed(results):
        result.unload()


def test_directory_plugins_load_in_their_toolsets(tmp_path: Path, loaded: list[LoadedPlugins]) -> None:
    write(tmp_path, "greet", GREET)
    write(tmp_path, "units", UNITS)
    write(tmp_path, "_helpers", "raise RuntimeError('never imported')")
    loaded.append(result := load_plugins(tmp_path, entry_points=False))
    assert [(s.name, s.tools, s.error) for s in result.statuses] == [
        ("greet", ("greet",), None), ("units", ("to_celsius",), None)]
    assert registry.toolset_of("greet") == "plugin-greet"
    assert model_tools.handle_function_call("greet", {"name": "Ada"}) == "hello, Ada"
    assert model_tools.handle_function_call("to_celsius", {"f": "212"}) == "100.0"  # args coerced to the schema
    result.unload()
    assert registry.get("greet") is None and registry.get("to_celsius") is None


def test_a_broken_plugin_is_reported_rolled_back_and_skipped(tmp_path: Path, loaded: list[LoadedPlugins],
                                                             caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path, "broken", BROKEN)
    write(tmp_path, "greet", GREET)
    write(tmp_path, "typo", "def oops(:\n")
    with caplog.at_level(logging.ERROR, logger="tools.plugins"):
        loaded.append(result := load_plugins(tmp_path, entry_points=False))
    statuses = {s.name: s for s in result.statuses}
    assert statuses["broken"].error == "RuntimeError: missing API key"
    assert statuses["typo"].error is not None and statuses["typo"].error.startswith("SyntaxError")
    assert statuses["greet"].ok and statuses["greet"].tools == ("greet",)
    assert registry.get("half_done") is None  # what it registered before raising is gone again
    assert "plugin broken" in caplog.text and "missing API key" in caplog.text
    assert statuses["broken"].to_dict() == {"status": "failed", "source": str(tmp_path / "broken.py"),
                                            "tools": [], "platforms": [], "commands": [], "hooks": [],
                                            "error": "RuntimeError: missing API key"}


def test_replacing_a_builtin_needs_override_and_the_operators_allow_list(
        tmp_path: Path, loaded: list[LoadedPlugins], caplog: pytest.LogCaptureFixture) -> None:
    registry.discover_builtin_tools()
    builtin = registry.get("read_file")
    assert builtin is not None and builtin.toolset == "file"

    write(tmp_path / "plain", "shadow", SHADOW.format(name="shadow", override=False))
    with caplog.at_level(logging.ERROR, logger="tools.registry"):
        loaded.append(rejected := load_plugins(tmp_path / "plain", entry_points=False,
                                               allow_override=["read_file"]))
    assert rejected.statuses[0].ok and rejected.statuses[0].tools == ()
    assert registry.get("read_file") is builtin
    assert "pass override=True" in caplog.text

    # override=True alone: the operator did not allow it, so the plugin fails and nothing of it stays.
    write(tmp_path / "forced", "shadow", SHADOW.format(name="shadow", override=True))
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="tools.plugins"):
        loaded.append(refused := load_plugins(tmp_path / "forced", entry_points=False, allow_override=["patch"]))
    assert refused.statuses[0].error == ("replacing read_file (toolset file) needs plugins.allow_override: "
                                         "[read_file] besides override=True")
    assert "plugin shadow" in caplog.text and "plugins.allow_override: [read_file]" in caplog.text
    assert registry.get("read_file").handler is builtin.handler and registry.toolset_of("read_file") == "file"
    # Through register_tool the refusal comes before the registry sees the tool.
    write(tmp_path / "ctx", "shadow", '''
        def register(ctx):
            ctx.register_tool("read_file", "plugin-shadow", {"description": "mine"}, lambda a, **c: "x", override=True)
    ''')
    current = registry.get("read_file")
    loaded.append(refused := load_plugins(tmp_path / "ctx", entry_points=False))
    assert refused.statuses[0].error.startswith("replacing read_file (toolset file) needs plugins.allow_override")
    assert registry.get("read_file") is current

    # Both: replaced, and the built-in (with its isolation) is back after the unload.
    loaded.append(forced := load_plugins(tmp_path / "forced", entry_points=False, allow_override=["read_file"]))
    assert forced.statuses[0].ok and forced.statuses[0].tools == ("read_file",)
    assert registry.toolset_of("read_file") == "plugin-shadow"
    assert registry.dispatch("read_file", {}) == "from the plugin"
    forced.unload()
    restored = registry.get("read_file")
    assert restored.handler is builtin.handler and restored.toolset == "file"
    assert (restored.isolation, restored.network, restored.effects) == (builtin.isolation, builtin.network,
                                                                        builtin.effects)


FULL = '''
from pydantic import BaseModel

class EchoSettings(BaseModel):
    url: str

class EchoAdapter:
    pass

def _hook(name, args, ctx):
    return None

async def _ping(ctx):
    return "pong"

def register(ctx):
    ctx.register_tool("echo_tool", "plugin-echo", {{"description": "Echo."}}, lambda args, **c: "echoed")
    ctx.register_platform("echo", EchoAdapter, EchoSettings)
    ctx.register_command("/ping", "answer pong", _ping, admin_only=True)
    ctx.register_hook("pre_tool_call", _hook)
    ctx.register_hook("pre_llm_call", lambda messages, ctx: None)
    {failure}
'''


def test_register_ctx_records_platforms_commands_and_hooks(tmp_path: Path, loaded: list[LoadedPlugins]) -> None:
    write(tmp_path, "echo", FULL.format(failure=""))
    loaded.append(result := load_plugins(tmp_path, entry_points=False))
    status = result.statuses[0]
    assert (status.ok, status.tools, status.platforms, status.commands, status.hooks) == (
        True, ("echo_tool",), ("echo",), ("ping",), ("pre_tool_call", "pre_llm_call"))
    assert status.to_dict()["commands"] == ["ping"]
    platform = result.platforms["echo"]
    assert (platform.plugin, platform.config_model.__name__, platform.adapter_factory.__name__) == (
        "echo", "EchoSettings", "EchoAdapter")
    command = result.commands["ping"]
    assert (command.plugin, command.description, command.admin_only) == ("echo", "answer pong", True)
    assert [(h.kind, h.plugin) for h in result.hooks] == [("pre_tool_call", "echo"), ("pre_llm_call", "echo")]
    assert registry.dispatch("echo_tool", {}) == "echoed"
    result.unload()
    assert registry.get("echo_tool") is None and not result.platforms and not result.commands and not result.hooks


@pytest.mark.parametrize(("failure", "error"), [
    ("raise RuntimeError('no key')", "RuntimeError: no key"),
    ("ctx.register_hook('post_llm_call', _hook)", "unknown hook kind 'post_llm_call' (one of pre_llm_call, "
                                                  "pre_tool_call, post_tool_call, transform_tool_result)"),
    ("ctx.register_platform('echo', EchoAdapter, EchoSettings)", "platform 'echo' is already provided "
                                                                 "(built in, or by another plugin)"),
    ("ctx.register_command('ping', 'again', _ping)", "command /ping already exists (built in, or from another "
                                                     "plugin)"),
    ("ctx.register_platform('Bad Name', EchoAdapter, EchoSettings)", "invalid platform name 'Bad Name' (use 1-32 "
                                                                     "lowercase letters, digits or '_', starting "
                                                                     "with a letter)"),
    ("ctx.register_platform('other', EchoAdapter, dict)", "platform 'other': config_model must be a pydantic "
                                                          "model class"),
])
def test_a_plugin_failing_after_registering_keeps_nothing(tmp_path: Path, loaded: list[LoadedPlugins],
                                                          failure: str, error: str) -> None:
    write(tmp_path, "echo", FULL.format(failure=failure))
    loaded.append(result := load_plugins(tmp_path, entry_points=False))
    assert result.statuses[0].error == error
    assert registry.get("echo_tool") is None
    assert not result.platforms and not result.commands and not result.hooks


def test_built_in_platform_and_command_names_are_reserved(tmp_path: Path, loaded: list[LoadedPlugins]) -> None:
    write(tmp_path, "echo", FULL.format(failure=""))
    loaded.append(result := load_plugins(tmp_path, entry_points=False, reserved_platforms={"echo"}))
    assert result.statuses[0].error == "platform 'echo' is already provided (built in, or by another plugin)"
    loaded.append(result := load_plugins(tmp_path, entry_points=False, reserved_commands={"ping", "help"}))
    assert result.statuses[0].error == "command /ping already exists (built in, or from another plugin)"
    assert registry.get("echo_tool") is None


def test_a_package_plugin_imports_its_own_modules(tmp_path: Path, loaded: list[LoadedPlugins]) -> None:
    write(tmp_path / "dice", "__init__", '''
        from .faces import FACES

        def register(ctx):
            ctx.register_tool("roll", "plugin-dice", {"description": "Roll."}, lambda args, **c: str(FACES))
    ''')
    write(tmp_path / "dice", "faces", "FACES = 6\n")
    (tmp_path / "notes").mkdir()  # a directory without __init__.py is no plugin
    loaded.append(result := load_plugins(tmp_path, entry_points=False))
    assert [(s.name, s.tools, s.source) for s in result.statuses] == [("dice", ("roll",), str(tmp_path / "dice"))]
    assert registry.dispatch("roll", {}) == "6"
    # A new load runs the package's current code, submodules included.
    result.unload()
    write(tmp_path / "dice", "faces", "FACES = 20\n")
    loaded.append(load_plugins(tmp_path, entry_points=False))
    assert registry.dispatch("roll", {}) == "20"


def _install_distribution(site: Path) -> None:
    """A real installed distribution (dist-info with entry_points.txt) on a sys.path entry."""
    write(site, "hermes_weather_plugin", '''
        def forecast(args, **ctx):
            return "sunny in " + args.get("city", "?")

        def register(registry):
            registry.register("forecast", "plugin-weather", {"description": "Tomorrow's weather."}, forecast)
    ''')
    write(site, "hermes_moon_plugin", '''
        from tools.registry import registry

        registry.register("moon_phase", "plugin-moon", {"description": "The moon's phase."},
                          lambda args, **ctx: "waxing gibbous")
    ''')
    dist = site / "hermes_weather_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hermes-weather-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\nweather = hermes_weather_plugin:register\nmoon = hermes_moon_plugin\n")


@pytest.fixture
def forget_modules() -> Iterator[None]:
    yield
    for name in ("hermes_weather_plugin", "hermes_moon_plugin"):
        sys.modules.pop(name, None)


@pytest.mark.usefixtures("forget_modules")
def test_entry_point_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             loaded: list[LoadedPlugins]) -> None:
    _install_distribution(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # importlib.metadata finds the dist-info there
    assert load_plugins(None, entry_points=False).statuses == []

    loaded.append(result := load_plugins(None))
    ours = {s.name: s for s in result.statuses if s.name in ("weather", "moon")}
    assert ours["weather"].tools == ("forecast",)
    assert ours["weather"].source == "entry point hermes_weather_plugin:register"
    assert ours["moon"].tools == ("moon_phase",)
    assert registry.dispatch("forecast", {"city": "Oslo"}) == "sunny in Oslo"
    result.unload()
    assert registry.get("moon_phase") is None
    # A module that registers at import registers again on the next load (it is re-imported).
    loaded.append(again := load_plugins(None))
    assert {s.name: s.tools for s in again.statuses}["moon"] == ("moon_phase",)


async def test_gateway_loads_plugins_reports_failures_and_uses_them_in_chat(make_gateway, tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    write(plugins, "greet", GREET)
    write(plugins, "broken", BROKEN)
    h = await make_gateway(
        {"plugins": {"dir": str(plugins), "entry_points": False},
         "toolsets": {"telegram": ["hermes-telegram", "plugin-greet", "plugin-broken"]}},
        responder=rules((r"greet", tool_call("greet", {"name": "Grace"}))))
    async with h.http.get(f"{h.base_url}/readyz", headers={"Authorization": f"Bearer {API_TOKEN}"}) as r:
        ready = await r.json()
    assert r.status == 200 and ready["ready"] is True
    assert ready["plugins"]["greet"] == {"status": "loaded", "source": str(plugins / "greet.py"),
                                         "tools": ["greet"], "platforms": [], "commands": [], "hooks": [],
                                         "error": None}
    assert ready["plugins"]["broken"]["status"] == "failed"
    assert ready["plugins"]["broken"]["error"] == "RuntimeError: missing API key"
    # The failed plugin's toolset exists but is empty, so telegram runs still start.
    assert TOOLSETS["plugin-broken"].tools == []

    accepted = await h.chat.user_says("please greet Grace")
    run = await h.wait_run(accepted.run_id)
    assert run["status"] == "completed"
    assert run["tool_calls"][0]["result"] == "hello, Grace"
    await h.chat.wait_for(lambda: "Done: hello, Grace" in h.chat.final_texts())
    sent_tools = {t["function"]["name"] for t in h.model.requests[0]["tools"]}
    assert "greet" in sent_tools and "half_done" not in sent_tools

    await asyncio.wait_for(h.gateway.stop(drain_timeout=1), 30)
    assert registry.get("greet") is None and "plugin-greet" not in TOOLSETS
    assert json.loads(registry.dispatch("greet", {"name": "x"})) == {"error": "Unknown tool: greet"}
