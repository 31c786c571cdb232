"""`hermes-gateway setup` and `doctor` as operators run them: subprocesses against the simulators, with
HERMES_GATEWAY_HOME pointing at the test's directory."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import socket
import stat
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from dotenv import dotenv_values

from gateway.config import load_config, parse_config
from gateway.probes import probe_model
from gateway.schema import SCHEMA_VERSION
from gateway.sim.model_server import ScriptedModel
from gateway.sim.telegram_api import TelegramSimulator
from platforms.webhook_signatures import sign
from tests.conftest import SIM_MODEL_KEY

ROOT = Path(__file__).resolve().parents[2]
PAIRING_CODE = re.compile(r"this code: ([A-Z2-9]{4}-[A-Z2-9]{4})")


@dataclass
class Done:
    code: int
    out: str
    err: str


def _env(home: Path) -> dict[str, str]:
    """A controlled environment: no HERMES_* or API keys of the machine running the tests."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "OPENAI_"))}
    return {**keep, "HERMES_GATEWAY_HOME": str(home), "PYTHONUNBUFFERED": "1"}


def _argv(command: str) -> list[str]:
    """A command line as setup prints it, run with this interpreter."""
    words = shlex.split(command)
    assert words[0] == "hermes-gateway", command
    return [sys.executable, "-m", "gateway", *words[1:]]


async def _run(home: Path, *args: str, stdin: str | None = None) -> Done:
    proc = await asyncio.create_subprocess_exec(
        *args, cwd=ROOT, env=_env(home), stdin=asyncio.subprocess.PIPE if stdin is not None else None,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None), 120)
    assert proc.returncode is not None
    return Done(proc.returncode, out.decode(), err.decode())


async def _cli(home: Path, *args: str, stdin: str | None = None) -> Done:
    return await _run(home, sys.executable, "-m", "gateway", *args, stdin=stdin)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _line(out: str, prefix: str) -> str:
    found = [line for line in out.splitlines() if line.startswith(prefix)]
    assert len(found) == 1, f"no single line starting with {prefix!r} in:\n{out}"
    return found[0]


def _setup_args(model: ScriptedModel, telegram: TelegramSimulator, port: int) -> list[str]:
    assert model.base_url is not None
    return ["setup", "--non-interactive", "--model-base-url", model.base_url, "--model-api-key", SIM_MODEL_KEY,
            "--model", "scripted-model", "--telegram-token", telegram.token, "--telegram-base-url", telegram.base_url,
            "--webhook-route", "github", "--http-port", str(port)]


class _Gateway:
    """The gateway started with the command setup printed."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, home: Path, command: str) -> _Gateway:
        log = (home / "gateway.log").open("wb")
        proc = await asyncio.create_subprocess_exec(*_argv(command), cwd=ROOT, env=_env(home),
                                                    stdout=asyncio.subprocess.PIPE, stderr=log)
        log.close()
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert b"listening on" in line, (line, (home / "gateway.log").read_text())
        return cls(proc)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            await asyncio.wait_for(self.proc.wait(), 30)


async def test_setup_writes_a_config_that_doctor_passes_and_run_serves(
        tmp_path: Path, sims: tuple[ScriptedModel, TelegramSimulator]) -> None:
    model, telegram = sims
    port = _free_port()
    done = await _cli(tmp_path, *_setup_args(model, telegram, port))
    assert done.code == 0, done.err
    assert _line(done.out, "ok    model: scripted-model at")
    assert _line(done.out, "ok    telegram: bot @hermes_bot")

    config, dotenv = tmp_path / "config.yaml", tmp_path / ".env"
    assert stat.S_IMODE(dotenv.stat().st_mode) == 0o600
    text = config.read_text()
    secrets = dotenv_values(dotenv)
    assert secrets["HERMES_TELEGRAM_TOKEN"] == telegram.token and secrets["HERMES_MODEL_API_KEY"] == SIM_MODEL_KEY
    for value in secrets.values():  # secrets only in .env, referenced as ${VAR}
        assert value is not None and value not in text
    assert "${HERMES_TELEGRAM_TOKEN}" in text and text.startswith("# hermes-gateway config")
    cfg = load_config(config, {k: v for k, v in secrets.items() if v is not None})
    assert cfg.platforms.telegram.enabled and cfg.auth.dm_pairing and cfg.http.port == port
    assert list(cfg.platforms.webhook.routes) == ["github"]

    steps = [line.strip() for line in done.out.splitlines() if line.strip().startswith("hermes-gateway ")]
    assert steps == ["hermes-gateway run", "hermes-gateway pairing approve CODE", "hermes-gateway doctor"]

    doctor = await _cli(tmp_path, "doctor")
    assert doctor.code == 0, doctor.out + doctor.err
    assert _line(doctor.out, "ok    telegram: bot @hermes_bot")
    assert _line(doctor.out, f"ok    http port: 127.0.0.1:{port} is free")
    assert _line(doctor.out, "ok    store:").endswith("does not exist yet: `hermes-gateway run` creates it")
    assert "fail  " not in doctor.out  # the tool sandbox may be a warning on this machine

    gateway = await _Gateway.start(tmp_path, steps[0])
    try:
        # A stranger's DM gets a pairing code; the printed approve command lets them in; then the model answers.
        telegram.user_sends("hello")
        [notice] = await telegram.wait_for_messages(1, timeout=20)
        code = PAIRING_CODE.search(notice.text or "")
        assert code, notice.text
        approved = await _run(tmp_path, *_argv(steps[1].replace("CODE", code.group(1))))
        assert approved.code == 0, approved.err
        telegram.user_sends("are you there?")
        await telegram.wait_for(lambda: any(m.text == "Echo: are you there?" for m in telegram.sent_messages()), 20)

        body = json.dumps({"zen": "Keep it logically awesome."}).encode()
        secret, token = secrets["HERMES_WEBHOOK_GITHUB_SECRET"], secrets["HERMES_API_TOKEN"]
        assert secret is not None and token is not None
        headers = {"Content-Type": "application/json", "X-GitHub-Event": "ping",
                   **sign("github", secret, body, delivery_id=str(uuid.uuid4()))}
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{base}/webhooks/github", data=body, headers=headers) as r:
                assert r.status == 202, await r.text()
                run_id = (await r.json())["run_id"]
            for _ in range(400):
                async with http.get(f"{base}/runs/{run_id}", headers={"Authorization": f"Bearer {token}"}) as r:
                    run = await r.json()
                if run["status"] == "completed":
                    break
                await asyncio.sleep(0.05)
        assert run["status"] == "completed" and run["result"].startswith("Echo: A ping event arrived on webhook github")

        # doctor beside the running gateway: its port is held by a gateway, which is fine
        again = await _cli(tmp_path, "doctor", "--json")
        assert again.code == 0, again.out
        by_check = {r["check"]: r for r in json.loads(again.out)}
        assert by_check["http port"]["message"] == f"127.0.0.1:{port} is held by a running gateway (/healthz ok)"
        assert by_check["store"]["message"] == f"schema v{SCHEMA_VERSION}, writable"
    finally:
        await gateway.stop()


async def test_setup_refuses_to_overwrite_and_writes_nothing_when_a_check_fails(
        tmp_path: Path, sims: tuple[ScriptedModel, TelegramSimulator]) -> None:
    model, telegram = sims
    args = _setup_args(model, telegram, 0)
    bad = [*args[:args.index("--telegram-token") + 1], "999:unknown-token", *args[args.index("--telegram-token") + 2:]]
    failed = await _cli(tmp_path, *bad)
    assert failed.code == 1
    assert _line(failed.out, "fail  telegram: the bot token was rejected (getMe: 401 Unauthorized)")
    assert "nothing written" in failed.err and not (tmp_path / "config.yaml").exists()

    assert (await _cli(tmp_path, *args)).code == 0
    before = (tmp_path / ".env").read_text()
    again = await _cli(tmp_path, *args)
    assert again.code == 1 and f"{tmp_path / 'config.yaml'} exists; pass --force" in again.err
    assert (tmp_path / ".env").read_text() == before
    forced = await _cli(tmp_path, *args, "--force")
    assert forced.code == 0 and (tmp_path / ".env").read_text() != before  # new generated secrets


async def test_interactive_setup_asks_and_checks_each_answer(
        tmp_path: Path, sims: tuple[ScriptedModel, TelegramSimulator]) -> None:
    model, telegram = sims
    assert model.base_url is not None
    answers = [model.base_url, "scripted-model", "wrong-key",  # refused: asked again
               "",  # do not keep the refused answer
               model.base_url, "scripted-model", SIM_MODEL_KEY,
               telegram.token, "",  # telegram; no slack
               "",  # no discord
               "github, alerts", "0"]
    done = await _cli(tmp_path, "setup", "--telegram-base-url", telegram.base_url, stdin="\n".join(answers) + "\n")
    assert done.code == 0, done.out + done.err
    assert "fail  model: the API key was rejected (401" in done.out
    assert "ok    telegram: bot @hermes_bot" in done.out
    secrets = dotenv_values(tmp_path / ".env")
    assert secrets["HERMES_MODEL_API_KEY"] == SIM_MODEL_KEY
    cfg = load_config(tmp_path / "config.yaml", {k: v for k, v in secrets.items() if v is not None})
    assert sorted(cfg.platforms.webhook.routes) == ["alerts", "github"] and cfg.http.port == 0
    assert cfg.platforms.telegram.base_url == telegram.base_url and not cfg.platforms.slack.enabled


# -- doctor's failures ---------------------------------------------------------------------------------------------


async def _plain_http_server() -> tuple[web.AppRunner, int]:
    """Something that is not a gateway holding a port."""
    async def not_found(_request: web.Request) -> web.Response:
        return web.Response(status=404, text="nginx")

    app = web.Application()
    app.router.add_get("/{tail:.*}", not_found)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


async def test_doctor_names_each_failure_and_its_fix(
        tmp_path: Path, sims: tuple[ScriptedModel, TelegramSimulator]) -> None:
    _model, telegram = sims
    closed = _free_port()
    squatter, busy = await _plain_http_server()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"base_url": f"http://127.0.0.1:{closed}/v1", "api_key": "k", "name": "scripted-model"},
        "http": {"port": busy},
        "platforms": {
            "telegram": {"enabled": True, "token": "999:not-this-bot", "base_url": telegram.base_url},
            "webhook": {"routes": {
                "alerts": {"secret": "s3cret-value", "prompt": "p", "deliver_to": "slack:C123"}}}},
        "auth": {"dm_pairing": True}}))
    try:
        done = await _cli(tmp_path, "doctor")
    finally:
        await squatter.cleanup()
    assert done.code == 1, done.out + done.err
    assert _line(done.out, "fail  model:") == (
        f"fail  model: connection refused by 127.0.0.1:{closed}; fix: start the server there, or correct "
        "model.base_url")
    assert _line(done.out, "fail  telegram:").startswith("fail  telegram: the bot token was rejected")
    assert _line(done.out, "fail  webhook alerts:") == (
        "fail  webhook alerts: deliver_to slack:C123 names slack, which is not enabled; fix: enable "
        "platforms.slack, or change platforms.webhook.routes.alerts.deliver_to")
    assert _line(done.out, "fail  http port:") == (
        f"fail  http port: 127.0.0.1:{busy} is in use by another program (not a gateway: no /healthz); "
        "fix: stop that program, or set http.port to a free port")
    assert done.out.splitlines()[-1].startswith("doctor: 4 failed, ")


async def test_doctor_without_a_config_points_at_setup(tmp_path: Path) -> None:
    done = await _cli(tmp_path, "doctor")
    assert done.code == 1
    assert _line(done.out, "fail  config:") == (
        "fail  config: no config file found; fix: run `hermes-gateway setup`, or pass --config PATH")


# -- the model probe's causes, in process ----------------------------------------------------------------------------


async def test_model_probe_names_the_real_cause(sims: tuple[ScriptedModel, TelegramSimulator]) -> None:
    model, _telegram = sims
    assert model.base_url is not None

    def settings(**changes: Any) -> Any:
        return parse_config({"model": {"base_url": model.base_url, "api_key": SIM_MODEL_KEY,
                                       "name": "scripted-model", **changes}}, {}).model

    assert (await probe_model(settings())).status == "ok"
    wrong_key = await probe_model(settings(api_key="nope"))
    assert wrong_key.message.startswith("the API key was rejected (401")
    model.fail_next(status=404)
    missing = await probe_model(settings(name="gpt-9"))
    assert missing.message == "model 'gpt-9' not found (404)"
    assert missing.fix == "set model.name to one of: scripted-model"
    tls = await probe_model(settings(base_url=model.base_url.replace("http://", "https://")))
    assert tls.message.startswith(f"TLS handshake with {model.base_url.split('/')[2]} failed")
    model.hang_next()
    slow = await probe_model(settings(), timeout=0.5)
    assert slow.message == f"no answer from {model.base_url.split('/')[2]} within 0.5 s"
    # Newer OpenAI models refuse max_tokens; the probe asks again with max_completion_tokens.
    model.fail_next(status=400, message="Unsupported parameter: 'max_tokens'. Use 'max_completion_tokens' instead.")
    assert (await probe_model(settings())).status == "ok"
    assert "max_completion_tokens" in model.requests[-1] and "max_tokens" not in model.requests[-1]


async def test_interactive_setup_without_answers_stops_and_writes_nothing(tmp_path: Path) -> None:
    done = await _cli(tmp_path, "setup", stdin="")
    assert done.code == 2 and "no answer: the input ended (pass --non-interactive" in done.err
    assert "Traceback" not in done.err and not (tmp_path / "config.yaml").exists()
