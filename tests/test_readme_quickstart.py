"""The README's five-minute path, executed: its quickstart blocks' commands run in order, each through bash from
the repository root after the README's own venv line, against the simulators (a scripted model and the Telegram
Bot API). The one thing added is where the simulators are: setup's answers name the model simulator, and
``--telegram-base-url`` points the wizard at the Telegram simulator, as a self-hosted Bot API would be."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import socket
from pathlib import Path

from gateway.pairing import APPROVED_NOTICE
from gateway.sim.model_server import ScriptedModel
from gateway.sim.telegram_api import DEFAULT_USER_ID, TelegramSimulator
from tests.conftest import SIM_MODEL_KEY

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- quickstart:"
_BLOCK = re.compile(r"```sh\n(.*?)```", re.S)
_HINT = re.compile(r"approve with: (hermes-gateway .+)$", re.M)


def quickstart_blocks(readme: str) -> list[list[str]]:
    """The commands of the three ``sh`` blocks after the quickstart marker, comments stripped."""
    after = readme.split(MARKER, 1)[1]
    blocks = _BLOCK.findall(after)[:3]
    return [[line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()] for block in blocks]


def _env(home: Path) -> dict[str, str]:
    """A user's shell: nothing of the test machine's gateway or model settings; $HOME is the test's directory,
    so ``~/.hermes-gateway`` (the README's home, found by every command without flags) is ``home``."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "OPENAI_", "VIRTUAL_ENV"))}
    assert home.name == ".hermes-gateway"
    return {**keep, "HOME": str(home.parent), "PYTHONUNBUFFERED": "1"}


async def _shell(activate: str, command: str, home: Path, *, stdin: str | None = None,
                 timeout: float = 120) -> tuple[int, str, str]:
    """``command`` in bash after the README's venv line, from the repository root, without a terminal."""
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", f"{activate} && {command}", cwd=ROOT, env=_env(home), start_new_session=True,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_quickstart_blocks_are_the_ones_this_test_runs() -> None:
    blocks = quickstart_blocks((ROOT / "README.md").read_text())
    assert blocks == [
        [". .venv/bin/activate", "hermes-gateway setup", "hermes-gateway run"],
        ["hermes-gateway pairing approve ABCD-EFGH"],
        ["hermes-gateway webhook send github --wait", "hermes-gateway status", "hermes-gateway doctor"],
    ], "the README's quickstart changed: update this test to run what it now says"


async def test_the_readme_quickstart_works_as_written(
        tmp_path: Path, sims: tuple[ScriptedModel, TelegramSimulator]) -> None:
    model, telegram = sims
    assert (ROOT / ".venv" / "bin" / "activate").is_file(), "the README's commands use .venv (make test creates it)"
    [[activate, setup, run], [approve_example], [send, status, doctor]] = \
        quickstart_blocks((ROOT / "README.md").read_text())
    home = tmp_path / ".hermes-gateway"
    port = _free_port()

    # setup, answering its questions as a user would (the default port is taken on a test machine)
    answers = [model.base_url or "", "scripted-model", SIM_MODEL_KEY,
               telegram.token,  # Telegram
               "",  # no Slack
               "",  # no Discord
               "github",  # the route the README's webhook command names
               str(port)]
    code, out, err = await _shell(activate, f"{setup} --telegram-base-url {shlex.quote(telegram.base_url)}", home,
                                  stdin="\n".join(answers) + "\n")
    assert code == 0, out + err
    assert "ok    model: scripted-model" in out and "ok    telegram: bot @hermes_bot" in out
    assert (home / "config.yaml").is_file() and (home / ".env").is_file()

    # run, in the background, as "leave it running" says
    log = (tmp_path / "gateway.log").open("wb")
    gateway = await asyncio.create_subprocess_exec(
        "bash", "-c", f"{activate} && exec {run}", cwd=ROOT, env=_env(home), start_new_session=True,
        stdout=asyncio.subprocess.PIPE, stderr=log)
    log.close()
    try:
        assert gateway.stdout is not None
        line = await asyncio.wait_for(gateway.stdout.readline(), 60)
        assert f"listening on http://127.0.0.1:{port}".encode() in line, (tmp_path / "gateway.log").read_text()

        # a DM gets a pairing code; the gateway logs the command the README shows, with that code
        telegram.user_sends("hello bot")
        [offer] = await telegram.wait_for_messages(1, DEFAULT_USER_ID, timeout=30)
        shown = re.search(r"[A-Z2-9]{4}-[A-Z2-9]{4}", offer.text or "")
        assert shown, offer.text

        async def logged_hint() -> str:
            while not (found := _HINT.search((tmp_path / "gateway.log").read_text())):
                await asyncio.sleep(0.05)
            return found.group(1).strip()
        hint = await asyncio.wait_for(logged_hint(), 30)
        assert hint == approve_example.replace("ABCD-EFGH", shown.group(0))
        code, out, err = await _shell(activate, hint, home)
        assert code == 0, err
        assert (await telegram.wait_for_messages(2, DEFAULT_USER_ID, timeout=30))[1].text == APPROVED_NOTICE
        telegram.user_sends("are you there?")
        answered = await telegram.wait_for_messages(3, DEFAULT_USER_ID, timeout=30)
        assert "are you there?" in (answered[2].text or "")

        # the webhook route, the status and doctor, exactly as written
        code, out, err = await _shell(activate, send, home)
        assert code == 0, out + err
        assert re.match(r"run \S+: completed\n", out), out
        code, out, err = await _shell(activate, status, home)
        assert code == 0, out + err
        assert f"at http://127.0.0.1:{port}: ready" in out and "platforms: telegram connected" in out
        code, out, err = await _shell(activate, doctor, home)
        assert code == 0, out + err
        assert f"127.0.0.1:{port} is held by a running gateway" in out
    finally:
        if gateway.returncode is None:
            gateway.terminate()
            await asyncio.wait_for(gateway.wait(), 60)
    assert gateway.returncode == 0
