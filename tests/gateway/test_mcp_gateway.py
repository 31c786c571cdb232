"""MCP servers in the running gateway: chat runs calling MCP tools over stdio and streamable HTTP,
tool-list changes, hung and dead servers, tool search over 200 MCP tools, /reload-mcp and the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import model_tools
from gateway.config import ConfigError, parse_config
from gateway.sim.model_server import rules, text, tool_call
from tests.conftest import API_TOKEN
from tools.mcp_tool import McpServerStatus, McpState
from tools.registry import registry
from toolsets import TOOLSETS, ToolsetError, resolve_toolset, set_source_toolset

SERVERS = Path(__file__).resolve().parents[1] / "mcp_servers"
STDIO = {"command": sys.executable, "args": [str(SERVERS / "stdio_server.py")]}
ROOT = Path(__file__).resolve().parents[2]


def with_mcp(servers: dict[str, Any], *toolsets: str, **extra: Any) -> dict[str, Any]:
    """Config overrides: these MCP servers, and their toolsets added to telegram's."""
    return {"mcp_servers": servers, "toolsets": {"telegram": ["hermes-telegram", *toolsets]}, **extra}


async def wait_mcp(h: Any, name: str, done: Callable[[McpServerStatus], bool] = lambda s: s.state == "connected",
                   timeout: float = 30.0) -> McpServerStatus:
    async def poll() -> McpServerStatus:
        while not done(status := h.gateway.mcp.status()[name]):
            await asyncio.sleep(0.02)
        return status
    return await asyncio.wait_for(poll(), timeout)


def tool_names(request: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools", [])}


async def reply(h: Any, text_: str, **kwargs: Any) -> dict[str, Any]:
    """Send a chat message and return its finished run."""
    accepted = await h.chat.user_says(text_, **kwargs)
    return await h.wait_run(accepted.run_id, timeout=30)


@pytest.fixture
async def http_server() -> AsyncIterator[str]:
    """The HTTP test server as a subprocess on 127.0.0.1 (a free port); yields its MCP URL."""
    proc = await asyncio.create_subprocess_exec(sys.executable, str(SERVERS / "http_server.py"),
                                                stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    port = int(await asyncio.wait_for(proc.stdout.readline(), 60))
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    await asyncio.wait_for(proc.wait(), 30)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_chat_calls_a_stdio_mcp_tool_end_to_end(make_gateway) -> None:
    h = await make_gateway(with_mcp({"files": STDIO}, "mcp-files"),
                           responder=rules((r"echo", tool_call("echo", {"text": "ping from chat"}))))
    await wait_mcp(h, "files")
    run = await reply(h, "please echo something")
    assert run["status"] == "completed"
    assert run["tool_calls"][0]["name"] == "echo" and run["tool_calls"][0]["result"] == "ping from chat"
    await h.chat.wait_for(lambda: "Done: ping from chat" in h.chat.final_texts())
    sent = h.model.requests[0]["tools"]
    echo = next(t["function"] for t in sent if t["function"]["name"] == "echo")
    assert echo["parameters"]["properties"] == {"text": {"type": "string"}}
    assert {"read_file", "files_read_file"} <= tool_names(h.model.requests[0])  # the built-in keeps its name


async def test_chat_calls_a_streamable_http_mcp_tool(http_server: str, make_gateway) -> None:
    h = await make_gateway(with_mcp({"web": {"url": http_server}}, "mcp-web"),
                           responder=rules((r"add", tool_call("add", {"a": 2, "b": "40"}))))
    status = await wait_mcp(h, "web")
    assert status.transport == "http" and "add" in status.tools
    run = await reply(h, "add these up")
    assert json.loads(run["tool_calls"][0]["result"]) == {"sum": 42}  # "40" coerced to the schema's number
    assert run["result"] == 'Done: {"sum": 42}'


async def test_list_changed_reaches_the_next_run(make_gateway) -> None:
    h = await make_gateway(with_mcp({"files": STDIO}, "mcp-files"),
                           responder=rules((r"toggle", tool_call("toggle_extra")), (r"hello", text("hi"))))
    await wait_mcp(h, "files")
    generation = registry.generation
    first = await reply(h, "toggle it")
    assert first["tool_calls"][0]["result"] == "extra_tool is now on"
    assert "extra_tool" not in tool_names(h.model.requests[0])
    assert registry.generation > generation
    await reply(h, "hello")
    assert "extra_tool" in tool_names(h.model.requests[-1])  # the very next run sees the new tool
    await reply(h, "toggle it again")
    await reply(h, "hello")
    assert "extra_tool" not in tool_names(h.model.requests[-1])
    assert "extra_tool" not in resolve_toolset("mcp-files")


async def test_a_hung_server_times_out_while_other_chats_keep_flowing(make_gateway) -> None:
    h = await make_gateway(with_mcp({"slow": {**STDIO, "timeout": 1.5}}, "mcp-slow"),
                           responder=rules((r"hang", tool_call("hang", {"seconds": 30})), (r"hello", text("hi there"))))
    await wait_mcp(h, "slow")
    started = time.monotonic()
    hung = await h.chat.user_says("please hang", chat_id="100", user_id="1001")
    await asyncio.sleep(0.2)  # the hang is in flight
    other = await reply(h, "hello", chat_id="200", user_id="1002")
    assert other["result"] == "hi there"
    assert (await h.get_run(hung.run_id))["status"] == "running"  # the other chat did not wait for it
    run = await h.wait_run(hung.run_id, timeout=30)
    assert json.loads(run["tool_calls"][0]["result"]) == {"error": "hang on MCP server slow timed out after 1.5 s"}
    assert run["status"] == "completed" and time.monotonic() - started < 10
    async with h.http.get(f"{h.base_url}/metrics") as r:
        lag = float(re.search(r"^hermes_event_loop_lag_max_seconds (\S+)$", await r.text(), re.M).group(1))
    assert lag < 0.3


async def test_dead_servers_leave_the_gateway_healthy(make_gateway) -> None:
    servers = {"gone": {"command": "/nonexistent/hermes-mcp-server"},
               "closed": {"url": f"http://127.0.0.1:{closed_port()}/mcp"},
               # Never answers initialize (exits once its stdin closes).
               "stuck": {"command": sys.executable, "args": ["-c", "import sys; sys.stdin.read()"],
                         "connect_timeout": 30}}
    started = time.monotonic()
    h = await make_gateway(with_mcp(servers, "mcp-gone", "mcp-closed", "mcp-stuck"),
                           responder=rules((r"hello", text("still fine"))))
    assert time.monotonic() - started < 10  # startup never waits for a server (stuck would take 30 s)
    await wait_mcp(h, "gone", lambda s: s.failures >= 1)
    await wait_mcp(h, "closed", lambda s: s.failures >= 1)
    async with h.http.get(f"{h.base_url}/healthz") as r:
        assert r.status == 200
    async with h.http.get(f"{h.base_url}/readyz", headers={"Authorization": f"Bearer {API_TOKEN}"}) as r:
        ready = await r.json()
    assert r.status == 200 and ready["ready"] is True
    assert ready["mcp"]["gone"]["state"] in ("disconnected", "connecting")
    assert ready["mcp"]["gone"]["error"].startswith("FileNotFoundError")
    assert "ConnectError" in ready["mcp"]["closed"]["error"]
    assert ready["mcp"]["stuck"] == {"state": "connecting", "transport": "stdio", "tools": 0, "error": None,
                                     "failures": 0}
    run = await reply(h, "hello")
    assert run["result"] == "still fine"
    assert tool_names(h.model.requests[0]) <= set(resolve_toolset("hermes-telegram"))
    assert TOOLSETS["mcp-gone"].tools == []


async def test_two_hundred_mcp_tools_go_behind_tool_search(make_gateway) -> None:
    seen: list[tuple[str, str]] = []

    def pre(name: str, args: dict[str, Any], ctx: Any) -> None:
        seen.append(("pre", name))

    def post(name: str, args: dict[str, Any], result: str, seconds: float, ctx: Any) -> None:
        seen.append(("post", name))

    model_tools.register_hook("pre_tool_call", pre)
    model_tools.register_hook("post_tool_call", post)
    try:
        server = {**STDIO, "args": [*STDIO["args"], "--generate", "200"]}
        h = await make_gateway(
            with_mcp({"inventory": server}, "mcp-inventory"),
            responder=rules((r"stock", tool_call("tool_call", {"name": "gen_tool_042",
                                                               "arguments": {"record_id": "R-42"}}))))
        status = await wait_mcp(h, "inventory")
        assert len(status.tools) == 209
        run = await reply(h, "how much stock of R-42?")
    finally:
        model_tools.unregister_hook("pre_tool_call", pre)
        model_tools.unregister_hook("post_tool_call", post)
    sent = tool_names(h.model.requests[0])
    assert {"tool_search", "tool_describe", "tool_call"} <= sent
    assert not any(n.startswith("gen_tool_") for n in sent) and "echo" not in sent
    assert sent - {"tool_search", "tool_describe", "tool_call"} <= set(resolve_toolset("hermes-core"))
    assert run["tool_calls"][0]["result"] == "gen_tool_042: record R-42 has 7 in stock"
    assert seen == [("pre", "gen_tool_042"), ("post", "gen_tool_042")]  # hooks see the real tool


async def test_reload_mcp_is_for_admins_and_reconnects(make_gateway) -> None:
    h = await make_gateway(with_mcp({"files": STDIO}, "mcp-files", auth={"admins": ["telegram:1001"]}),
                           responder=rules((r"toggle", tool_call("toggle_extra"))))
    await wait_mcp(h, "files")
    await reply(h, "toggle it")
    assert "extra_tool" in h.gateway.mcp.status()["files"].tools
    await h.chat.user_says("/reload-mcp", user_id="1002")
    await h.chat.wait_for(lambda: "Only gateway admins can use /reload-mcp." in h.chat.final_texts())
    await h.chat.user_says("/reload-mcp", user_id="1001")
    await h.chat.wait_for(lambda: any(t.startswith("Reconnecting 1 MCP server(s): files")
                                      for t in h.chat.final_texts()))
    # The new server process starts without extra_tool, and the re-listing shows it.
    await wait_mcp(h, "files", lambda s: s.state == "connected" and "extra_tool" not in s.tools)
    assert registry.get("extra_tool") is None


async def test_stop_unregisters_mcp_tools(make_gateway) -> None:
    h = await make_gateway(with_mcp({"files": STDIO}, "mcp-files"))
    await wait_mcp(h, "files")
    assert registry.toolset_of("echo") == "mcp-files"
    await asyncio.wait_for(h.gateway.mcp.stop(), 30)
    assert registry.tools_in_toolset("mcp-files") == [] and "mcp-files" not in TOOLSETS
    assert h.gateway.mcp.status()["files"].state is McpState.STOPPED


def test_mcp_server_config_is_validated() -> None:
    def error(server: dict[str, Any]) -> ConfigError:
        with pytest.raises(ConfigError) as info:
            parse_config({"mcp_servers": {"x": server}}, {})
        return info.value

    assert error({}).path == "mcp_servers.x" and "either command" in error({}).message
    assert error({"command": "a", "url": "http://h/mcp"}).path == "mcp_servers.x"
    assert error({"url": "http://h/mcp", "args": ["-v"]}).path == "mcp_servers.x.args"
    assert error({"command": "a", "headers": {"A": "b"}}).path == "mcp_servers.x.headers"
    assert error({"url": "ftp://h"}).path == "mcp_servers.x.url"
    with pytest.raises(ConfigError, match="invalid MCP server name"):
        parse_config({"mcp_servers": {"bad name": {"command": "a"}}}, {})
    cfg = parse_config({"mcp_servers": {"x": {"command": "a", "env": {"TOKEN": "s3cret-token", "PORT": 8080}}},
                        "toolsets": {"telegram": ["hermes-telegram", "mcp-x", "plugin-y"]}}, {})
    assert cfg.masked()["mcp_servers"]["x"]["env"] == {"TOKEN": "***", "PORT": "***"}
    assert "s3cret-token" in cfg.secret_values()


async def _cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "gateway", *args, cwd=ROOT,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_mcp_list_test_and_check(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "store": {"url": f"sqlite:///{tmp_path}/state.db"},
        "mcp_servers": {"files": {**STDIO, "disabled_tools": ["crash"]},
                        "down": {"url": f"http://127.0.0.1:{closed_port()}/mcp", "connect_timeout": 5}}}))
    (code, out, _), (test_code, test_out, _), (bad_code, _, bad_err), (check_code, _, check_err), \
        (doctor_code, doctor_out, _) = await asyncio.gather(
            _cli("mcp", "list", "-c", str(config)), _cli("mcp", "test", "files", "-c", str(config)),
            _cli("mcp", "test", "down", "-c", str(config)), _cli("check", "-c", str(config)),
            _cli("doctor", "-c", str(config)))
    assert code == 0
    assert re.search(r"^files +stdio .*stdio_server\.py\n +connected in [\d.]+ s: 9 tools \(1 left out", out, re.M)
    assert re.search(r"^down +http .*\n +unreachable: ConnectError", out, re.M)
    assert test_code == 0
    assert "hermes-test-server 1.0, protocol" in test_out
    assert re.search(r"^  \+ echo +Echo the given text back unchanged\.$", test_out, re.M)
    assert re.search(r"^  - crash +\(left out by config\)", test_out, re.M)
    assert bad_code == 1 and "unreachable after" in bad_err
    assert check_code == 0 and check_err.rstrip().endswith("config OK")  # check contacts no MCP server
    assert "unreachable" not in check_err and "ConnectError" not in check_err
    assert "mcp servers: down (http), files (stdio); not contacted" in check_err
    assert doctor_code == 1, doctor_out  # doctor starts them: one answers, one is down
    assert re.search(r"^ok +mcp files: .* with 9 tools", doctor_out, re.M), doctor_out
    assert re.search(r"^fail +mcp down: .*ConnectError", doctor_out, re.M), doctor_out


def test_runtime_toolsets_must_be_named_for_their_source() -> None:
    with pytest.raises(ToolsetError, match="must start with mcp- or plugin-"):
        set_source_toolset("web", "would shadow a built-in toolset", ["echo"])
    assert TOOLSETS["web"].tools == ["web_search", "web_extract"]


async def test_stdio_servers_run_in_the_tool_sandbox(make_gateway, tmp_path, monkeypatch) -> None:
    """A stdio server gets the tool sandbox's rules: none of the gateway's files, processes or secrets."""
    monkeypatch.setenv("HERMES_CANARY_MCP", "canary-7f3e9a1c")
    probe = ("import json, os, sys; json.dump({'uid': os.getuid(), 'state_db': os.path.exists(sys.argv[1]), "
             "'env': dict(os.environ), 'pids': [p for p in os.listdir('/proc') if p.isdigit()], "
             "'gateway_pid_visible': os.path.exists('/proc/' + sys.argv[2])}, open('seen.json', 'w')); "
             "sys.stdin.read()")
    server = {"command": sys.executable, "args": ["-c", probe, str(tmp_path / "state.db"), str(os.getpid())],
              "env": {"SERVER_TOKEN": "configured-for-the-server"}}
    h = await make_gateway(with_mcp({"probe": server}, "mcp-probe"))
    seen_file = Path(h.gateway.cfg.gateway.workspace) / "seen.json"

    async def seen() -> dict[str, Any]:
        while not seen_file.exists() or not seen_file.read_text():
            await asyncio.sleep(0.02)
        return json.loads(seen_file.read_text())

    seen_by_server = await asyncio.wait_for(seen(), 30)
    assert (tmp_path / "state.db").exists() and seen_by_server["state_db"] is False
    assert seen_by_server["gateway_pid_visible"] is False
    assert seen_by_server["uid"] != 0
    assert seen_by_server["env"]["SERVER_TOKEN"] == "configured-for-the-server"  # its own env still reaches it
    assert "HERMES_CANARY_MCP" not in seen_by_server["env"] and "test-key" not in json.dumps(seen_by_server)
