"""``hermes-gateway webhook send``: a signed delivery to a route of a running gateway subprocess, per scheme; the
run waited for; the route's event filter, unknown routes and bad payloads refused with one clear line."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.sim.model_server import ScriptedModel, text
from tests.gateway_process import GatewayProcess

TOKEN = "webhook-cli-api-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _cli(*args: str, home: Path, stdin: bytes | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "HERMES_GATEWAY_HOME": str(home)})
    out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """A gateway with a GitHub route (issues only) and a standard-webhooks route, its secrets in a .env."""
    prompts: list[str] = []

    def answer(request: dict[str, Any]) -> Any:
        prompts.append(request["messages"][-1]["content"])
        return text(f"seen: {prompts[-1].splitlines()[0]}")  # the rendered prompt (the payload follows it)

    model = ScriptedModel(answer)
    await model.start()
    (tmp_path / ".env").write_text("GH_SECRET=gh-secret-0123456789\nSW_SECRET=whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=\n")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "model": {"base_url": model.base_url, "api_key": "k", "name": "scripted-model", "max_retries": 0,
                  "stream": False},
        "http": {"host": "127.0.0.1", "port": _free_port(), "api_token": TOKEN},
        "store": {"url": f"sqlite:///{tmp_path}/state.db"},
        "gateway": {"workspace": str(tmp_path / "workspace")},
        "platforms": {"webhook": {"routes": {
            "github": {"secret": "${GH_SECRET}", "scheme": "github", "events": ["issues"],
                       "prompt": "Issue {payload.issue.title} ({event})"},
            "alerts": {"secret": "${SW_SECRET}", "scheme": "standard-webhooks", "prompt": "Alert {payload.text}"}}}},
    }))
    gateway = GatewayProcess(tmp_path / "config.yaml", tmp_path)
    await gateway.start()
    yield {"home": tmp_path, "prompts": prompts}
    await gateway.terminate()
    await model.stop()


async def test_send_signs_with_the_routes_scheme_and_waits_for_the_run(running: dict[str, Any]) -> None:
    home = running["home"]
    code, out, err = await _cli("webhook", "send", "github", "--wait", home=home)
    assert code == 0, err
    first, result = out.splitlines()[:2]
    assert first.startswith("run ") and first.endswith(": completed")
    assert result == "seen: Issue A test delivery from hermes-gateway webhook send (issues.opened)"
    # A second sample is a new delivery, not a replay of the first (the GitHub scheme dedupes by the signed body).
    code, out, err = await _cli("webhook", "send", "github", "--json", home=home)
    assert code == 0, err
    again = json.loads(out)
    assert again["duplicate"] is False and again["run_id"] != first.split()[1]

    code, out, err = await _cli("webhook", "send", "alerts", "--data", "-", "--json", home=home,
                                stdin=json.dumps({"type": "alert", "text": "disk full"}).encode())
    assert code == 0, err
    accepted = json.loads(out)
    assert accepted["duplicate"] is False
    code, out, err = await _cli("runs", "show", accepted["run_id"], home=home)
    assert code == 0, err
    for _ in range(100):
        if json.loads(out)["status"] == "completed":
            break
        await asyncio.sleep(0.1)
        code, out, err = await _cli("runs", "show", accepted["run_id"], home=home)
    assert json.loads(out)["result"] == "seen: Alert disk full"


async def test_send_refuses_with_one_line(running: dict[str, Any]) -> None:
    home = running["home"]
    code, _, err = await _cli("webhook", "send", "gitlab", home=home)
    assert (code, err) == (2, "error: no webhook route 'gitlab' in the config (routes: alerts, github)\n")
    code, _, err = await _cli("webhook", "send", "github", "--event", "push", home=home)
    assert code == 1
    assert err == "error: the route ignored event 'push.opened' (its events: issues); pass --event\n"
    code, _, err = await _cli("webhook", "send", "github", "--data", "{not json", home=home)
    assert code == 2 and err.startswith("error: --data is not JSON: ")
    code, _, err = await _cli("webhook", "send", "github", "--data", "@/nonexistent.json", home=home)
    assert (code, err) == (2, "error: --data @/nonexistent.json: No such file or directory\n")
    assert running["prompts"] == [], "nothing refused reached the model"


async def test_send_names_the_url_when_no_gateway_runs(tmp_path: Path) -> None:
    port = _free_port()
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "http": {"port": port}, "platforms": {"webhook": {"routes": {"github": {"secret": "s", "prompt": "p"}}}}}))
    code, _, err = await _cli("webhook", "send", "github", home=tmp_path)
    assert code == 1 and err.startswith(f"error: no gateway answered at http://127.0.0.1:{port} (")
