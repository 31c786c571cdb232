"""``hermes-gateway tools``: ``--json``, and with a config file what each platform, webhook route and cron run
gets (their toolsets resolved, MCP and plugin tools included, each available or why not)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
STDIO_SERVER = ROOT / "tests" / "mcp_servers" / "stdio_server.py"
GREET = '''
from tools.registry import registry

registry.register("greet", "plugin-greet", {
    "description": "Greet someone by name.",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
}, lambda args, **ctx: "hello, " + args["name"])
'''
BROKEN = '''
raise RuntimeError("missing API key")
'''


def _tools(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", "tools", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "HERMES_GATEWAY_HOME": str(home)})


def _by_name(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {g["name"]: g for g in groups}


def _tools_of(group: dict[str, Any]) -> dict[str, tuple[bool, str, str | None]]:
    return {t["name"]: (t["available"], t["runs_in"], t["reason"]) for t in group["tools"]}


def test_json_without_a_config_lists_the_toolsets_only(tmp_path: Path) -> None:
    result = _tools(tmp_path, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"sandbox", "toolsets"}  # no config file: nothing is configured to get tools
    assert report["sandbox"].startswith("bwrap: bubblewrap")
    webhook = _by_name(report["toolsets"])["hermes-webhook"]
    assert webhook["toolsets"] == ["hermes-webhook"]
    assert _tools_of(webhook) == {"web_extract": (True, "sandbox", None),
                                  "web_search": (False, "sandbox", "not configured or not reachable")}
    only = json.loads(_tools(tmp_path, "--json", "--toolset", "memory").stdout)
    assert [g["name"] for g in only["toolsets"]] == ["memory"]


def _config(tmp_path: Path) -> Path:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "greet.py").write_text(GREET, encoding="utf-8")
    (plugins / "broken.py").write_text(BROKEN, encoding="utf-8")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "store": {"url": f"sqlite:///{tmp_path}/state.db"},
        "plugins": {"dir": str(plugins), "entry_points": False},
        "platforms": {
            "telegram": {"enabled": True, "token": "123456:abcdefghijklmnopqrstuvwxyzABCDEFGHI"},
            "webhook": {"routes": {"github": {"secret": "route-secret-123456", "scheme": "github",
                                              "prompt": "Summarise {payload}", "toolset": "web"}}},
        },
        "mcp_servers": {"files": {"command": sys.executable, "args": [str(STDIO_SERVER)],
                                  "disabled_tools": ["crash"]},
                        "down": {"url": "http://127.0.0.1:9/mcp", "connect_timeout": 2}},
        "toolsets": {"telegram": ["hermes-telegram", "mcp-files", "mcp-down", "plugin-greet", "plugin-broken"]},
    }))
    return config


def test_with_a_config_each_platform_and_route_shows_what_its_runs_get(tmp_path: Path) -> None:
    config = _config(tmp_path)
    result = _tools(tmp_path, "--config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    consumers = _by_name(report["consumers"])
    assert list(consumers) == ["telegram", "webhook:github", "cron"]  # slack and discord are not enabled

    telegram = consumers["telegram"]
    assert telegram["toolsets"] == ["hermes-telegram", "mcp-files", "mcp-down", "plugin-greet", "plugin-broken"]
    tools = _tools_of(telegram)
    assert tools["memory"] == (True, "gateway", None) and tools["terminal"] == (True, "sandbox", None)
    assert tools["echo"] == (True, "gateway", None)  # the MCP server's tools, as it offers them
    assert tools["files_read_file"] == (True, "gateway", None)  # its read_file, renamed beside the builtin one
    assert "crash" not in tools  # left out by disabled_tools
    assert tools["greet"] == (True, "sandbox", None)  # the plugin's tool (plugins run in the sandbox by default)
    assert telegram["notes"] == [
        "mcp-down: MCP server down is not connected (ConnectError: All connection attempts failed)",
        "plugin-broken: plugin broken failed to load (RuntimeError: missing API key)"]

    assert _tools_of(consumers["webhook:github"]) == {
        "web_search": (False, "sandbox", "not configured or not reachable"), "web_extract": (True, "sandbox", None)}
    assert consumers["cron"]["toolsets"] == ["hermes-cron"] and "echo" not in _tools_of(consumers["cron"])
    assert report["mcp_servers"]["files"]["state"] == "connected" and report["mcp_servers"]["files"]["tools"] == 8
    assert report["mcp_servers"]["down"]["state"] == "disconnected"
    assert report["plugins"]["greet"]["status"] == "loaded" and report["plugins"]["broken"]["status"] == "failed"
    # The MCP servers' and plugins' toolsets are listed among the others.
    assert "echo" in _tools_of(_by_name(report["toolsets"])["mcp-files"])


def test_the_text_report_has_a_section_per_platform_and_route(tmp_path: Path) -> None:
    result = _tools(tmp_path, "--config", str(_config(tmp_path)))
    assert result.returncode == 0, result.stderr
    section = result.stdout.split(f"\nwhat runs get with {tmp_path / 'config.yaml'}:\n", 1)[1].splitlines()
    headings = [line for line in section if not line.startswith("  ")]
    assert headings[0].startswith("telegram [hermes-telegram, mcp-files, mcp-down, plugin-greet, plugin-broken]  (")
    assert headings[1] == "webhook:github [web]  (1/2 available)  runs of webhook route github"
    assert headings[2].startswith("cron [hermes-cron]  (")
    assert "  ! mcp-down: MCP server down is not connected (ConnectError: All connection attempts failed)" in section
    assert "  + greet           available, in the sandbox" in section
    assert "  + files_read_file available, in the gateway" in section
    assert "  - web_search      unavailable: not configured or not reachable" in section


def test_an_unknown_toolset_is_a_usage_error(tmp_path: Path) -> None:
    result = _tools(tmp_path, "--toolset", "nope")
    assert result.returncode == 2
    assert result.stderr.startswith("error: unknown toolset 'nope'; known: clarify, code_execution, cronjob"), \
        result.stderr


def test_a_plugin_platform_gets_its_automatic_toolset(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "store": {"url": f"sqlite:///{tmp_path}/state.db"},
        "plugins": {"dir": str(ROOT / "examples" / "plugins"), "entry_points": False},
        "platforms": {"relay": {"plugin": "relay", "url": "http://127.0.0.1:9", "token": "relay-token"}},
    }))
    result = _tools(tmp_path, "--config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    relay = _by_name(report["consumers"])["relay"]
    assert (relay["toolsets"], relay["description"]) == (["hermes-relay"], "relay sessions (platform of plugin relay)")
    core = _tools_of(_by_name(report["toolsets"])["hermes-core"])
    assert _tools_of(relay) == {**core, "relay_shout": (True, "sandbox", None)}
    assert report["plugins"]["relay"]["platforms"] == ["relay"]
