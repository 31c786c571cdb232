"""``hermes-gateway chat``: one-shot and REPL through the scripted model, the session's history in the store, and
the local gateway leaving other platforms' parts to the daemon that shares its store."""

from __future__ import annotations

import asyncio
import io
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.app import Gateway
from gateway.cli.chat import DEFAULT_TOOLSETS, _chat_config
from gateway.config import parse_config
from gateway.sim.model_server import ScriptedModel, rules, text, tool_call
from gateway.store import OutboxPart, Store
from platforms.terminal import TerminalAdapter


def _earlier(_match: Any, request: dict[str, Any]) -> str:
    """What the user said before in this conversation, as the model was shown it."""
    said = [m["content"] for m in request["messages"] if m["role"] == "user"][:-1]
    return "Earlier: " + " | ".join(said)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    model = ScriptedModel(rules((r"find hello", tool_call("search_files", {"pattern": "hello"})),
                                (r"what did I say", _earlier)))
    await model.start()
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("hello from the workspace\n")
    config = tmp_path / "config.yaml"
    data = {"model": {"base_url": model.base_url, "api_key": "k", "name": "scripted-model", "max_retries": 0,
                      "stream": False},
            "store": {"url": f"sqlite:///{tmp_path}/state.db"}, "gateway": {"workspace": str(workspace)}}
    config.write_text(yaml.safe_dump(data))
    yield {"model": model, "config": config, "home": tmp_path, "data": data}
    await model.stop()


async def _chat(world: dict[str, Any], *args: str, stdin: str = "") -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "chat", "--config", str(world["config"]), "--user", "ada", *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HERMES_GATEWAY_HOME": str(world["home"])})
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_one_shot_runs_a_tool_and_records_the_run(world: dict[str, Any]) -> None:
    code, out, err = await _chat(world, "-m", "find hello in my files")
    assert code == 0, err
    assert out.startswith("Done: ") and "notes.txt" in out and "hello from the workspace" in out
    assert "→ search_files(pattern='hello')" in err.splitlines()
    store = await Store.open(world["data"]["store"]["url"])
    try:
        (run,) = await store.list_runs()
        assert run.status == "completed" and run.kind == "chat" and run.session_key == "cli:dm:ada"
        assert run.toolsets == list(DEFAULT_TOOLSETS) and run.prompt == "find hello in my files"
        assert [call["name"] for call in run.tool_calls] == ["search_files"]
        (part,) = await store.outbox_rows(run.id)
        assert part.status == "sent" and part.platform == "cli" and part.chat_id == "ada" and part.text == out.strip()
        assert [m.role for m in await store.history("cli:dm:ada", 0, 10)] == ["user", "assistant", "tool",
                                                                            "assistant"]
    finally:
        await store.close()


async def test_repl_keeps_history_within_and_across_invocations(world: dict[str, Any]) -> None:
    code, out, err = await _chat(world, stdin="I like tea\nwhat did I say?\n")
    assert code == 0, err
    assert out.splitlines() == ["Echo: I like tea", "Earlier: I like tea"]
    code, out, _err = await _chat(world, "-m", "what did I say now?")
    assert code == 0 and out == "Earlier: I like tea | what did I say?\n"
    code, out, _err = await _chat(world, stdin="/new\nwhat did I say?\n/exit\nnever sent\n")
    assert code == 0
    assert out.splitlines() == ["Started a new conversation. Earlier messages are forgotten.", "Earlier: "]
    assert "never sent" not in str(world["model"].requests)


async def test_unknown_toolset_is_refused_before_starting(world: dict[str, Any]) -> None:
    code, out, err = await _chat(world, "--toolset", "nope", "-m", "hi")
    assert code == 2 and out == "" and err.startswith("error: unknown toolset 'nope'; known: ")
    assert world["model"].requests == []


async def test_local_gateway_sends_only_its_own_parts(world: dict[str, Any]) -> None:
    """A chat beside a daemon on one store: a Telegram part waiting for the daemon stays pending, untouched."""
    cfg = _chat_config(parse_config(world["data"], env={"HERMES_GATEWAY_HOME": str(world["home"])}), "ada",
                       ["todo"])
    out = io.StringIO()
    adapter = TerminalAdapter("ada", out)
    gateway = Gateway(cfg, {"cli": adapter}, local=True)
    await gateway.start()
    try:
        assert gateway.store is not None and gateway.http is None
        (waiting,) = await gateway.store.enqueue([OutboxPart("other:1", "telegram", "100", "for the daemon")]) or []
        world["model"].push(text("hi Ada"))
        accepted, answered = await adapter.say("hello")
        assert accepted is not None and answered is not None
        await asyncio.wait_for(answered, 10)
        gateway.outbox.wake()  # a scan now sees the Telegram part too
        await asyncio.sleep(0.2)
        assert out.getvalue() == "hi Ada\n"
        (row,) = [r for r in await gateway.store.outbox_rows() if r.id == waiting.id]
        assert row.status == "pending" and row.attempts == 0 and row.claimed_by is None
    finally:
        await gateway.stop(drain_timeout=0)
