"""What an operator sees on the console: a normal start says nothing alarming, irrelevant library warnings stay
out, start-up failures are one line, and ``--help`` imports nothing heavy."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import discord
import pytest
import yaml

from gateway.logs import setup_logging
from gateway.sim.discord_api import DiscordSimulator
from gateway.sim.model_server import ScriptedModel
from gateway.sim.slack_api import SlackSimulator
from gateway.sim.telegram_api import TelegramSimulator
from tests.gateway_process import GatewayProcess

_OURS = ("gateway.", "platforms.", "tools.", "model_tools", "toolsets")
_RECORD = re.compile(r"^\S+ \S+ (?P<level>[A-Z]+) (?P<logger>\S+): ", re.MULTILINE)


def _third_party_warnings(log: str) -> list[str]:
    """Lines of WARNING and above from loggers that are not the gateway's, and Python warnings."""
    found = [m.group(0) + log[m.end():].split("\n", 1)[0] for m in _RECORD.finditer(log)
             if m["level"] in ("WARNING", "ERROR", "CRITICAL") and not m["logger"].startswith(_OURS)]
    return found + re.findall(r"^.*\b\w+Warning: .*$", log, re.MULTILINE)


@pytest.fixture
async def platforms() -> AsyncIterator[dict[str, Any]]:
    """The model and every chat platform's simulator, as a ``platforms`` config section for them."""
    model, tg, slack, dc = ScriptedModel(), TelegramSimulator(), SlackSimulator(), DiscordSimulator()
    for server in (model, tg, slack, dc):
        await server.start()
    yield {
        "model": {"base_url": model.base_url, "api_key": "k", "name": "scripted-model"},
        "platforms": {
            "telegram": {"enabled": True, "token": tg.token, "base_url": tg.base_url,
                         "base_file_url": tg.base_file_url, "poll_timeout": 2},
            "slack": {"enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
                      "api_base_url": slack.base_url},
            "discord": {"enabled": True, "token": dc.token, "api_base_url": dc.api_base_url,
                        "gateway_url": dc.gateway_url, "guild_ready_timeout": 0.05},
            "webhook": {"routes": {"github": {"secret": "console-webhook-secret", "scheme": "github",
                                              "prompt": "Summarise {payload}"}}},
        },
    }
    for server in (dc, slack, tg, model):
        await server.stop()


async def test_a_normal_start_with_every_platform_logs_no_stack_and_no_library_warning(
        tmp_path: Path, platforms: dict[str, Any]) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**platforms, "http": {"port": 0},
                                      "store": {"url": f"sqlite:///{tmp_path}/state.db"}}))
    gw = GatewayProcess(config, tmp_path)
    await gw.start()
    try:
        async with aiohttp.ClientSession() as http:
            await gw.wait_ready(http)
    finally:
        assert await gw.terminate() == 0
    log = gw.stderr_path.read_text()
    assert "gateway started: platforms=telegram,discord,slack,webhook" in log, log
    assert "Traceback" not in log and not re.search(r'^\s+File "', log, re.MULTILINE), log
    assert "stack" not in log, log
    assert _third_party_warnings(log) == [], log


@pytest.fixture
def console() -> Iterator[io.StringIO]:
    """The gateway's logging set up at INFO, its stderr handler writing into a buffer."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    buf = io.StringIO()
    setup_logging("INFO", "text")
    root.handlers[0].stream = buf  # type: ignore[attr-defined]
    yield buf
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


async def _sending_client() -> None:
    """Make and close what the Discord adapter sends with: a client without intents (discord.py then warns about
    the guilds intent, and about voice libraries once per process: made to warn again here)."""
    discord.VoiceClient.warn_nacl = discord.VoiceClient.warn_dave = True
    client = discord.Client(intents=discord.Intents.none())
    await client.close()


async def test_discord_voice_and_intent_warnings_of_the_sending_client_stay_off_the_console(
        console: io.StringIO) -> None:
    await _sending_client()
    logging.getLogger("discord.state").warning("Shard ID %s timed out waiting for chunks for guild_id %s.", 0, 1)
    out = console.getvalue()
    assert "PyNaCl" not in out and "davey" not in out and "Guilds intent" not in out, out
    assert "WARNING discord.state: Shard ID 0 timed out" in out  # other warnings of the library stay


async def test_the_demoted_library_warnings_show_at_debug(console: io.StringIO) -> None:
    setup_logging("DEBUG", "text")
    logging.getLogger().handlers[0].stream = console  # type: ignore[attr-defined]
    await _sending_client()
    out = console.getvalue()
    assert "DEBUG discord.client: PyNaCl is not installed" in out and "DEBUG discord.state: Guilds intent" in out


def _run_briefly(tmp_path: Path, http: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """``hermes-gateway run`` with these ``http`` settings, expected to exit on its own."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"http": http, "store": {"url": f"sqlite:///{tmp_path}/state.db"}}))
    return subprocess.run([sys.executable, "-m", "gateway", "run", "--config", str(config)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "HERMES_GATEWAY_HOME": str(tmp_path)})


def _not_log_records(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not _RECORD.match(line)]


def test_a_busy_http_port_is_one_line_naming_http_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _run_briefly(tmp_path, {"host": "127.0.0.1", "port": port})
    assert result.returncode == 1, result.stderr
    assert _not_log_records(result.stderr) == [
        f"error: cannot listen on 127.0.0.1:{port} (http.host, http.port): the port is already in use "
        "(another gateway?); stop that process or change http.port"], result.stderr
    assert "gateway stopped" in result.stderr  # what had started was stopped


def test_an_http_host_not_of_this_machine_names_http_host(tmp_path: Path) -> None:
    result = _run_briefly(tmp_path, {"host": "192.0.2.1", "port": 0})  # TEST-NET-1: nobody's address
    assert result.returncode == 1, result.stderr
    assert _not_log_records(result.stderr) == [
        "error: cannot listen on 192.0.2.1:0 (http.host, http.port): the address is not one of this machine's; "
        "change http.host"], result.stderr


_NOISY = {"command": sys.executable,
          "args": [str(Path(__file__).resolve().parents[1] / "mcp_servers" / "noisy_stdio_server.py")]}
_NOISE = "noisy-server: starting up, nothing is wrong"


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_an_mcp_servers_stderr_is_logged_at_debug_not_printed(tmp_path: Path, level: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"mcp_servers": {"noisy": _NOISY}}))
    result = subprocess.run([sys.executable, "-m", "gateway", "mcp", "test", "noisy", "--config", str(config),
                             "--log-level", level], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "HERMES_GATEWAY_HOME": str(tmp_path)})
    assert result.returncode == 0 and "connected in" in result.stdout, result.stderr
    logged = [line for line in result.stderr.splitlines() if _NOISE in line]
    if level == "INFO":
        assert logged == [], result.stderr
    else:
        assert len(logged) == 1 and f"DEBUG tools.mcp_tool: MCP server noisy (stderr): {_NOISE}" in logged[0]


async def test_the_gateways_mcp_servers_write_nothing_on_its_console(
        make_gateway: Any, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="tools.mcp_tool"):
        h = await make_gateway({"mcp_servers": {"noisy": _NOISY}})

        async def connected() -> None:
            while h.gateway.mcp.status()["noisy"].state != "connected" or not any(
                    _NOISE in r.getMessage() for r in caplog.records):
                await asyncio.sleep(0.02)

        await asyncio.wait_for(connected(), 30)
    assert _NOISE not in capfd.readouterr().err  # the process's own stderr (file descriptor 2)
    [record] = [r for r in caplog.records if _NOISE in r.getMessage()]
    assert record.levelno == logging.DEBUG and record.getMessage() == f"MCP server noisy (stderr): {_NOISE}"


_HEAVY = ("openai", "aiohttp", "sqlalchemy", "telegram", "discord", "slack_bolt", "slack_sdk", "pydantic", "yaml",
          "mcp", "httpx2", "prometheus_client")


def test_building_the_cli_parser_imports_no_heavy_library() -> None:
    # What --help and shell completion run: every subcommand's parser, its help text formatted.
    code = ("import json, sys, gateway.cli\n"
            "parser = gateway.cli.build_parser()\n"
            "parser.format_help()\n"
            "for choice in parser._subparsers._group_actions[0].choices.values(): choice.format_help()\n"
            f"print(json.dumps(sorted(m for m in {list(_HEAVY)!r} if m in sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_an_http_host_that_does_not_resolve_names_http_host(tmp_path: Path) -> None:
    result = _run_briefly(tmp_path, {"host": "nonexistent.invalid", "port": 0})
    assert result.returncode == 1, result.stderr
    [line] = _not_log_records(result.stderr)
    assert line.startswith("error: cannot listen on nonexistent.invalid:0 (http.host, http.port): the host name "
                           "does not resolve"), result.stderr
    assert "change http.host" in line
