"""The pairing path exactly as an operator follows it: a gateway (a subprocess, Telegram through the simulator,
secrets from the environment) logs the approve command for a stranger's code; that command, run as printed in
a shell where only the store is reachable and no secret is exported, approves the stranger, who is told and
then answered."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from gateway.pairing import APPROVED_NOTICE
from gateway.sim.model_server import ScriptedModel
from gateway.sim.telegram_api import DEFAULT_USER_ID, TelegramSimulator
from tests.gateway_process import GatewayProcess

TOKEN = "123456:e2e-secret-token"
API_KEY = "sk-e2e-secret-key"
_HINT = re.compile(r"approve with: (.+)$", re.M)


def _command(printed: str) -> list[str]:
    """The printed command with ``hermes-gateway`` mapped to this venv's console script."""
    argv = shlex.split(printed)
    assert argv[0] == "hermes-gateway", printed
    script = Path(sys.executable).with_name("hermes-gateway")
    return [str(script), *argv[1:]] if script.is_file() else [sys.executable, "-m", "gateway", *argv[1:]]


async def _printed_hint(log: Path, timeout: float = 15) -> str:
    async def poll() -> str:
        while not (match := _HINT.search(log.read_text())):
            await asyncio.sleep(0.05)
        return match.group(1).strip()
    return await asyncio.wait_for(poll(), timeout)


@pytest.mark.parametrize("in_home", [True, False], ids=["discovered-config", "explicit-config"])
async def test_the_printed_approve_command_works_with_only_the_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_home: bool) -> None:
    home = tmp_path / "home"
    home.mkdir()
    config = home / "config.yaml" if in_home else tmp_path / "etc dir" / "gateway.yaml"
    config.parent.mkdir(exist_ok=True)
    tg = TelegramSimulator(token=TOKEN)
    await tg.start()
    model = ScriptedModel()
    await model.start()
    # No store section: the default database in the home, which the operator's shell shares.
    config.write_text(yaml.safe_dump({
        "model": {"base_url": model.base_url, "api_key": "${OPENAI_API_KEY}", "name": "scripted-model",
                  "stream": False, "max_retries": 0},
        "http": {"port": 0},
        "gateway": {"drain_timeout": 2},
        "platforms": {"telegram": {"enabled": True, "token": "${TELEGRAM_BOT_TOKEN}", "base_url": tg.base_url,
                                   "base_file_url": tg.base_file_url, "poll_timeout": 2}},
        "auth": {"dm_pairing": True},
    }))
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", TOKEN)
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.delenv("HERMES_GATEWAY_CONFIG", raising=False)
    gateway = GatewayProcess(config, home)
    try:
        await gateway.start()
        async with aiohttp.ClientSession() as http:
            await gateway.wait_ready(http)
        tg.user_sends("hello?")
        (offer,) = await tg.wait_for_messages(1, DEFAULT_USER_ID, timeout=15)
        code = re.search(r"[A-Z2-9]{4}-[A-Z2-9]{4}", offer.text or "")
        assert code, offer.text
        printed = await _printed_hint(gateway.stderr_path)
        expected = f"hermes-gateway pairing approve {code.group(0)}" if in_home else \
            f"hermes-gateway --config {shlex.quote(str(config))} pairing approve {code.group(0)}"
        assert printed == expected
        operator_env = {"PATH": os.environ["PATH"], "HERMES_GATEWAY_HOME": str(home)}  # no secret exported
        done = await asyncio.to_thread(subprocess.run, _command(printed), capture_output=True, text=True,
                                       timeout=60, env=operator_env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert f"Approved telegram user {DEFAULT_USER_ID}" in done.stdout
        notice = await tg.wait_for_messages(2, DEFAULT_USER_ID, timeout=15)
        assert notice[1].text == APPROVED_NOTICE
        tg.user_sends("are you there now?")
        answered = await tg.wait_for_messages(3, DEFAULT_USER_ID, timeout=15)
        assert "are you there now?" in (answered[2].text or "")
        assert [r for r in model.requests if "hello?" in str(r)] == []  # the stranger's first DM never ran
        assert await gateway.terminate() == 0
    finally:
        if gateway.proc is not None and gateway.proc.returncode is None:
            await gateway.kill()
        await model.stop()
        await tg.stop()
