"""The tool sandbox through a whole gateway: the real Telegram adapter against the Bot API simulator, the
scripted model, sandboxed tools in bubblewrap workers. What a model can make tools read, and whether one
chat's runaway tool holds up another chat."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from gateway.app import Gateway
from gateway.config import load_config
from gateway.sim.model_server import ScriptedModel, rules, tool_call, tool_calls
from gateway.sim.telegram_api import DEFAULT_USER_ID, TelegramSimulator
from gateway.state_stores import ToolStateStore
from gateway.store import RunRow
from tests.sandbox_support import BACKTRACK, HANG, descendant_processes, leaks, require_bwrap, write_plugin
from tools.sandbox.policy import NOBODY

ALICE = DEFAULT_USER_ID
BOB = 1002
HANG_GUARD = 60.0  # seconds: only a broken gateway takes this long

# Distinctive fake secrets, one per place a gateway keeps them. The common prefix lets a probe search for
# all of them at once; the rest of each is unique, so finding one (in any encoding) names the leak.
PREFIX = "zq7canary"
ENV_SECRETS = {
    "HERMES_CANARY_1": f"{PREFIX}-environment-one-4b8d1f60e2a9",
    "HERMES_CANARY_2": f"{PREFIX}-environment-two-93c07e5ad1b4",
    "HERMES_CANARY_MODEL_KEY": f"{PREFIX}-model-api-key-1e6f2b9c47d0",  # the config takes it as ${...}
}
TELEGRAM_TOKEN = f"987654321:{PREFIX}-telegram-token-5a0c8e3f71bd"
CONFIG_SECRETS = {
    "http.api_token": f"{PREFIX}-http-api-token-c2d95b7a0e18",
    "platforms.webhook.routes.github.secret": f"{PREFIX}-webhook-route-secret-7f3e0a2d9c64",
    "platforms.callback.targets.sink.secret": f"{PREFIX}-callback-secret-08b6d4f1e7a3",
    "platforms.telegram.token": TELEGRAM_TOKEN,
}
MEMORY_NOTE = f"{PREFIX}-memory-note-in-state-db-6d2a9f4c03e8"
HOME_FILE_SECRET = f"{PREFIX}-file-beside-state-db-b19e07c5a2f6"
SECRETS = {**ENV_SECRETS, **CONFIG_SECRETS, "memory note (state.db)": MEMORY_NOTE,
           "notes.txt beside state.db": HOME_FILE_SECRET}
DECOY = f"zq7decoy-in-the-workspace-{'e5' * 8}"  # a control: tools do see the workspace, and the check sees it


@dataclass
class World:
    """The simulators, a gateway home with its config file, and the gateways started on them."""

    sim: TelegramSimulator
    model: ScriptedModel
    home: Path
    http: aiohttp.ClientSession
    gateways: list[Gateway] = field(default_factory=list)

    @property
    def config_path(self) -> Path:
        return self.home / "config.yaml"

    @property
    def workspace(self) -> Path:
        return self.home / "workspace"

    def config(self, sections: Mapping[str, Any]) -> dict[str, Any]:
        data: dict[str, Any] = {
            "model": {"base_url": self.model.base_url, "api_key": "${HERMES_CANARY_MODEL_KEY}",
                      "name": "scripted-model", "max_retries": 0, "stream": False},
            "http": {"port": 0, "api_token": CONFIG_SECRETS["http.api_token"]},
            "store": {"url": f"sqlite:///{self.home}/state.db"},
            "gateway": {"workspace": str(self.workspace), "typing_delay": 0, "drain_timeout": 1},
            "auth": {"platforms": {"telegram": {"allowed_users": [str(ALICE), str(BOB)]}}},
            "web": {"allow_private_networks": ["127.0.0.1/32"]},
            "platforms": {
                "telegram": {"enabled": True, "token": self.sim.token, "base_url": self.sim.base_url,
                             "base_file_url": self.sim.base_file_url},
                "webhook": {"routes": {"github": {
                    "secret": CONFIG_SECRETS["platforms.webhook.routes.github.secret"], "scheme": "github",
                    "prompt": "Push: {payload.head_commit.message}", "deliver_to": "callback:sink"}}},
                "callback": {"targets": {"sink": {"url": "http://127.0.0.1:9/hook",
                                                  "secret": CONFIG_SECRETS["platforms.callback.targets.sink.secret"]}}},
            },
        }
        for name, values in sections.items():
            data[name] = {**data.get(name, {}), **values}
        return data

    async def start(self, **sections: Any) -> Gateway:
        """A gateway as an operator runs it: a config file in its home, secrets from the environment."""
        self.config_path.write_text(yaml.safe_dump(self.config(sections)))
        gateway = Gateway(load_config(self.config_path))
        self.gateways.append(gateway)
        await gateway.start()
        return gateway

    async def runs(self, gateway: Gateway) -> list[RunRow]:
        assert gateway.store is not None
        return await gateway.store.list_runs(100)

    async def finished_run(self, gateway: Gateway, prompt: str) -> RunRow:
        async def poll() -> RunRow:
            while True:
                for run in await self.runs(gateway):
                    if run.prompt == prompt and run.status in ("completed", "failed", "cancelled"):
                        return run
                await asyncio.sleep(0.02)
        return await asyncio.wait_for(poll(), HANG_GUARD)


@pytest.fixture
async def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    require_bwrap()
    monkeypatch.setenv("HERMES_GATEWAY_HOME", str(tmp_path))
    for name, value in ENV_SECRETS.items():
        monkeypatch.setenv(name, value)
    async with TelegramSimulator(token=TELEGRAM_TOKEN) as sim, ScriptedModel() as model, \
            aiohttp.ClientSession() as http:
        w = World(sim, model, tmp_path, http)
        yield w
        for gateway in w.gateways:
            await gateway.stop(drain_timeout=1)


def _bot_texts(sim: TelegramSimulator, chat_id: int) -> list[str]:
    return [m["text"] for m in sim.chat_history(chat_id) if m["from"]["id"] == sim.bot_id and "text" in m]


async def _poll(condition: Callable[[], bool], what: str, timeout: float = HANG_GUARD) -> None:
    async def wait() -> None:
        while not condition():
            await asyncio.sleep(0.02)
    try:
        await asyncio.wait_for(wait(), timeout)
    except TimeoutError:
        pytest.fail(f"timed out after {timeout:g} s waiting until {what}")


def _tool_results(model: ScriptedModel) -> list[str]:
    """Every tool result the model was shown, in full."""
    return [str(m.get("content")) for request in model.requests for m in request["messages"] if m["role"] == "tool"]


# -- (1) the canary test -----------------------------------------------------------------------------------

def _probes(home: Path, config: Path) -> list[tuple[str, dict[str, Any]]]:
    """What a model after the gateway's secrets would try, with absolute and workspace-relative paths."""
    commands = [
        "cat /proc/$PPID/environ", "cat /proc/1/environ", "env", "cat /proc/*/environ | tr '\\0' '\\n'",
        "find / -name state.db 2>/dev/null", "find / -name 'config.yaml' -o -name 'notes.txt' 2>/dev/null",
        f"cat {config}", f"base64 {config}", f"od -An -tx1 {config}", "cat ../config.yaml", "base64 ../config.yaml",
        f"cat {home}/notes.txt", "cat ../notes.txt", f"base64 {home}/state.db",
        f"grep -ao '{PREFIX}[a-z0-9-]*' ../state.db*", f"ls -la {home} ..", f"grep -rs {PREFIX} {home} /etc",
        # Controls: the probes run, as the sandbox's user, and see the workspace.
        "id -u", "cat decoy.txt", "base64 decoy.txt", "od -An -tx1 decoy.txt",
    ]
    calls: list[tuple[str, dict[str, Any]]] = [("terminal", {"command": f"{c} 2>&1"}) for c in commands]
    for path in (str(config), "../config.yaml", str(home / "state.db"), "../state.db", "../notes.txt",
                 str(home / "notes.txt"), "decoy.txt"):
        calls.append(("read_file", {"path": path}))
    for path in ("..", str(home), "/", "."):
        calls.append(("search_files", {"pattern": "zq7(canary|decoy)", "path": path}))
    return calls


@dataclass
class ProbeRun:
    run: RunRow
    results: list[str]  # every tool result, in full, as the model got them
    found: dict[tuple[str, str], list[str]]  # (secret, where) -> the forms in which it showed up there


async def _probe(world: World, **sections: Any) -> ProbeRun:
    """Start a gateway holding every kind of secret, let the model run the probes, and look for the secrets."""
    world.workspace.mkdir()
    (world.workspace / "decoy.txt").write_text(f"the decoy: {DECOY}\n")
    (world.home / "notes.txt").write_text(f"operator notes: {HOME_FILE_SECRET}\n")
    probes = _probes(world.home, world.config_path)
    world.model.responder = rules((r"probe", tool_calls(probes)))
    gateway = await world.start(**sections)
    assert gateway.store is not None
    # What the memory tool keeps, for another user: Alice's own notes are in her runs' system prompt by design;
    # another user's are in the same database file, which no tool may read.
    await ToolStateStore(gateway.store).add_note("telegram:424242", MEMORY_NOTE)
    assert CONFIG_SECRETS["http.api_token"] in world.config_path.read_text()  # the secrets are really there

    world.sim.user_sends("probe the machine")
    run = await world.finished_run(gateway, "probe the machine")
    await _poll(lambda: any(t.startswith("Done:") for t in _bot_texts(world.sim, ALICE)), "the answer arrives")
    assert run.status == "completed", run
    results = _tool_results(world.model)
    assert len(results) == len(probes) == len(run.tool_calls)
    [session_key] = {r.session_key for r in await world.runs(gateway)}
    epoch = await gateway.store.session_epoch(session_key, "telegram", str(ALICE), str(ALICE), None)
    transcript = [json.dumps(m.to_openai()) for m in await gateway.store.history(session_key, epoch, 1000)]
    assert len(transcript) >= len(probes)  # the tool results are stored
    platform = [json.dumps(call.params) for call in world.sim.calls if call.params]
    assert any(DECOY in text for text in platform)  # the answer quoted the tool results to the chat
    places: dict[str, Iterable[str]] = {
        "tool results": results, "run record": [json.dumps(run.to_dict())], "stored transcript": transcript,
        "messages sent to Telegram": platform, "model requests": [json.dumps(r) for r in world.model.requests]}
    found = {(name, where): forms for name, secret in SECRETS.items() for where, texts in places.items()
             if (forms := leaks(secret, texts))}
    # The probes ran and saw the workspace; the leak check finds what is there in every form.
    assert {kind.split(":")[0] for kind in leaks(DECOY, results)} >= {"plain", "base64", "hex"}
    assert not [r for r in results if "is unavailable" in r or "timed out" in r]
    return ProbeRun(run, results, found)


@pytest.mark.parametrize("level", ["bwrap", "unshare"])
async def test_no_secret_of_the_gateway_reaches_a_tool_the_store_or_the_chat(world: World, level: str) -> None:
    probe = await _probe(world, tools={"sandbox": level})
    assert probe.found == {}
    # Not hidden by the log redactor on the way out: the sandbox never had them.
    assert not [r for r in probe.results if "[REDACTED]" in r]
    [id_result] = [json.loads(c["result"]) for c in probe.run.tool_calls if "id -u" in str(c["arguments"])]
    assert id_result["exit_code"] == 0
    if os.geteuid() == 0:
        assert id_result["output"].strip() == str(NOBODY)  # and ran as the sandbox's user


async def test_the_same_probes_find_secrets_without_the_sandbox(world: World) -> None:
    """The contrast that shows the probes and the check can find a leak: with ``tools.sandbox: none`` the
    terminal runs in the gateway as its user and reads its files; only the redactor stands in the way."""
    probe = await _probe(world, tools={"sandbox": "none"})
    leaked = {name for name, where in probe.found if where == "tool results"}
    # Not in the config, so unknown to the redactor: the state database and a file beside it.
    assert {"memory note (state.db)", "notes.txt beside state.db"} <= leaked, probe.found
    assert any("[REDACTED]" in r for r in probe.results)  # the config's own secrets, caught only on the way out


# -- (2) a runaway tool does not hold up other chats ----------------------------------------------------------

async def test_a_gil_holding_tool_in_one_chat_does_not_delay_another(world: World) -> None:
    plugins = world.home / "plugins"
    write_plugin(plugins, "backtrack", BACKTRACK)
    world.model.responder = rules((r"backtrack", tool_call("backtrack", {"marker": "started-by-alice"})))
    gateway = await world.start(plugins={"dir": str(plugins), "entry_points": False},
                                toolsets={"telegram": ["hermes-telegram", "plugin-backtrack"]},
                                tools={"limits": {"timeout": 3}})
    world.sim.user_sends("please backtrack", user_id=ALICE)
    await _poll((world.workspace / "started-by-alice").exists, "Alice's tool is running")

    world.sim.user_sends("hello there", user_id=BOB)
    await world.sim.wait_for(lambda: _bot_texts(world.sim, BOB) == ["Echo: hello there"], timeout=HANG_GUARD)
    # Bob has his answer, and Alice's run is still going: it was answered while her tool held its CPU.
    [alice_run] = [r for r in await world.runs(gateway) if r.prompt == "please backtrack"]
    assert alice_run.status == "running", alice_run
    assert _bot_texts(world.sim, ALICE) == []

    alice_run = await world.finished_run(gateway, "please backtrack")
    [call] = alice_run.tool_calls
    assert call["error"] and "backtrack: timed out after 3 s" in call["result"], call
    await _poll(lambda: bool(_bot_texts(world.sim, ALICE)), "Alice's answer arrives")
    sends = [c for c in world.sim.calls if c.method == "sendMessage"]
    assert [int(c.params["chat_id"]) for c in sends] == [BOB, ALICE]


async def test_stop_ends_a_sandboxed_call_and_shutdown_does_not_wait_for_one(world: World) -> None:
    plugins = world.home / "plugins"
    write_plugin(plugins, "hang", HANG)
    world.model.responder = rules((r"sleep", lambda m, request: tool_call("hang", {"marker": m.string.split()[-1]})))
    gateway = await world.start(plugins={"dir": str(plugins), "entry_points": False},
                                toolsets={"telegram": ["hermes-telegram", "plugin-hang"]},
                                tools={"limits": {"timeout": 600}})
    world.sim.user_sends("please sleep alice-started", user_id=ALICE)
    await _poll((world.workspace / "alice-started").exists, "Alice's tool is running")
    world.sim.user_sends("/stop", user_id=ALICE)
    run = await world.finished_run(gateway, "please sleep alice-started")
    assert run.status == "cancelled", run
    assert gateway.sandbox is not None
    await _poll(lambda: gateway.sandbox.stats()["calls"].get("cancelled") == 1, "the pool counts the cancel")

    # A call still running at shutdown: the gateway stops without waiting for its 600 s, killing the worker.
    world.sim.user_sends("please sleep bob-started", user_id=BOB)
    await _poll((world.workspace / "bob-started").exists, "Bob's tool is running")
    await asyncio.wait_for(gateway.stop(drain_timeout=1), HANG_GUARD)
    world.gateways.remove(gateway)
    if os.geteuid() == 0:  # nothing of the sandbox outlives the gateway
        await _poll(lambda: descendant_processes(NOBODY) == [], "every sandboxed process is gone", timeout=10)


# -- (3) patterns and pages that backtrack -------------------------------------------------------------------

async def test_backtracking_patterns_and_pages_give_results_while_other_chats_are_answered(world: World) -> None:
    requested = asyncio.Event()

    async def page(request: web.Request) -> web.Response:
        requested.set()
        return web.Response(text="<html><head>" + "<title>" * 50_000 + "</head><body>end of page</body></html>",
                            content_type="text/html")

    app = web.Application()
    app.router.add_get("/titles", page)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/titles"
    try:
        world.workspace.mkdir()
        (world.workspace / "evil.txt").write_text(("a" * 40 + "!\n") * 200 + "aaaa\n")
        world.model.responder = rules((r"scan", tool_calls([
            ("search_files", {"pattern": "(a+)+$", "path": "."}), ("web_extract", {"urls": [url]})])))
        gateway = await world.start(tools={"limits": {"timeout": 15}})
        world.sim.user_sends("scan these", user_id=ALICE)
        await asyncio.wait_for(requested.wait(), HANG_GUARD)
        world.sim.user_sends("are you there?", user_id=BOB)
        await world.sim.wait_for(lambda: _bot_texts(world.sim, BOB) == ["Echo: are you there?"], timeout=HANG_GUARD)

        run = await world.finished_run(gateway, "scan these")
        calls = {c["name"]: c for c in run.tool_calls}
        search, extract = calls["search_files"], calls["web_extract"]
        assert not search["error"], search
        assert json.loads(search["result"])["results"] == [{"path": "evil.txt", "line": 201, "text": "aaaa"}]
        assert not extract["error"], extract
        [fetched] = json.loads(extract["result"])
        assert fetched.get("status") == 200 and "end of page" in fetched["content"], fetched
    finally:
        await runner.cleanup()


# -- (4) operators see the isolation; without one, the tools are not offered -----------------------------------

def _check(tmp_path: Path, tools: Mapping[str, Any] | None, path_env: str | None = None,
           **sections: Any) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**({"tools": dict(tools)} if tools else {}), **sections}))
    env = {**os.environ, "HERMES_GATEWAY_HOME": str(tmp_path)}
    if path_env is not None:
        env["PATH"] = path_env
    return subprocess.run([sys.executable, "-m", "gateway", "check", "--config", str(config)], capture_output=True,
                          text=True, timeout=HANG_GUARD, env=env, check=False)


def _sandbox_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("tool sandbox: ")]
    return line


def test_check_prints_the_tool_sandbox_level(tmp_path: Path) -> None:
    require_bwrap()
    assert _sandbox_line(_check(tmp_path, None)).startswith("tool sandbox: bwrap: bubblewrap: own PID")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    missing = _sandbox_line(_check(tmp_path, {"sandbox": "bwrap"}, path_env=str(empty)))
    assert missing.startswith("tool sandbox: unavailable: bubblewrap is not installed"), missing
    assert "tools.sandbox: none" in missing  # the way out is named
    assert _sandbox_line(_check(tmp_path, {"sandbox": "none"})).startswith("tool sandbox: none: ")
    # A workspace that would put the gateway's own files in the tools' reach is a config error, in any mode.
    exposed = _check(tmp_path, {"sandbox": "none"}, gateway={"workspace": str(tmp_path)})
    assert exposed.returncode == 2 and "gateway.workspace" in exposed.stderr, exposed.stderr
    assert f"{tmp_path} holds the gateway's own files" in exposed.stderr and "Traceback" not in exposed.stderr


SANDBOXED_TOOLS = {"terminal", "read_file", "write_file", "patch", "search_files", "web_extract"}


def _offered(model: ScriptedModel) -> set[str]:
    return {t["function"]["name"] for t in model.requests[0]["tools"]}


async def test_without_isolation_sandboxed_tools_are_not_offered(make_gateway, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with caplog.at_level(logging.WARNING, logger="gateway.tool_sandbox"):
        h = await make_gateway({"tools": {"sandbox": "bwrap"}})
    assert "tool sandbox unavailable: bubblewrap is not installed" in caplog.text
    accepted = await h.chat.user_says("hi")
    run = await h.wait_run(accepted.run_id)
    assert run["status"] == "completed"
    offered = _offered(h.model)
    assert not offered & SANDBOXED_TOOLS, offered
    assert {"memory", "todo"} <= offered  # the gateway's own state needs no sandbox


async def test_with_sandbox_none_tools_run_in_the_gateway_with_a_warning(make_gateway,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.tool_sandbox"):
        h = await make_gateway({"tools": {"sandbox": "none"}},
                               responder=rules((r"whoami", tool_call("terminal", {"command": "id -u"}))))
    assert "tool sandbox disabled (tools.sandbox: none)" in caplog.text
    accepted = await h.chat.user_says("whoami")
    run = await h.wait_run(accepted.run_id)
    assert _offered(h.model) >= SANDBOXED_TOOLS
    [call] = run["tool_calls"]
    assert json.loads(call["result"])["output"].strip() == str(os.geteuid())  # the gateway's own user


def test_run_refuses_a_workspace_holding_its_config_file(tmp_path: Path) -> None:
    """The running gateway checks the file it was started with, not only the home's config.yaml."""
    etc = tmp_path / "etc"
    etc.mkdir()
    config = etc / "gateway.yaml"
    config.write_text(yaml.safe_dump({"tools": {"sandbox": "none"}, "gateway": {"workspace": str(etc)},
                                      "store": {"url": f"sqlite:///{tmp_path}/state.db"}, "http": {"port": 0}}))
    done = subprocess.run([sys.executable, "-m", "gateway", "run", "--config", str(config)], capture_output=True,
                          text=True, timeout=HANG_GUARD, env={**os.environ, "HERMES_GATEWAY_HOME": str(tmp_path / "h")})
    assert done.returncode == 2, done.stderr
    assert f"gateway.workspace: {etc} holds the gateway's own files ({config})" in done.stderr
