"""send_file through a SIGKILL, per platform: the gateway as users run it (a process) sends an image and a document
the model asked for; each upload is taken by the platform, whose answer is then held back on the way to the gateway,
and the gateway is SIGKILLed in that moment: the platform shows the file, the outbox never recorded it as sent. The
next gateway takes the part over as in doubt and applies the platform's rule: Discord sends it again with the same
nonce (Discord drops the repeat), Slack looks up the file id it saved before the upload (files.info shows it
shared), Telegram sends it again (the Bot API has no idempotency key and no way to look a message up by anything
the bot chose, so a file caught mid-send is shown twice: at least once, counted in the outbox row).

The answer is held by a relay between the gateway and the simulator (the platform's base URL points at it): the
simulator applies the request and answers as usual, the relay keeps that answer until the gateway is gone. So the
kill lands between the platform's answer and the gateway's commit every time, not by a race.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote_plus

import aiohttp
import pytest
import yaml
from aiohttp import web

from gateway.sim.discord_api import ALICE_ID, DiscordSimulator
from gateway.sim.model_server import JSON, ScriptedModel, Turn, tool_calls
from gateway.sim.slack_api import SlackSimulator
from gateway.sim.telegram_api import DEFAULT_USER_ID, TelegramSimulator
from tests.conftest import base_config, deep_merge
from tests.gateway_process import GatewayProcess
from tests.media_samples import pdf_with_text, png_chart

ASK = "send the chart and the report"
ANSWER = "Here are the chart and the report."
CHART, REPORT = png_chart(), pdf_with_text("Quarterly report")
CONTENT = {"chart.png": CHART, "report.pdf": REPORT}
CHART_SHOWN, REPORT_SHOWN = ("chart.png", "The chart"), ("report.pdf", "The report")
SLACK_USER = "U0USER1"
TIMEOUT = 30.0
# Headers that describe one connection or one encoding of a body, not the request: the relay's own hops set them.
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade", "te",
                         "trailer", "proxy-authorization", "proxy-authenticate"})

SentFile = tuple[str, bytes, str]
"""A file as the chat shows it: name, bytes, caption."""


class HoldingRelay:
    """An HTTP relay in front of a simulator: requests and answers pass unchanged, except the answer to the one
    request ``hold`` picks, which the simulator gave (its effect is done) but the client never gets."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.url = ""
        self._hold: tuple[re.Pattern[str], bytes, asyncio.Future[str]] | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> HoldingRelay:
        self._session = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self._relay)
        # handler_cancellation: a held answer's handler ends when its client (the killed gateway) is gone
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._runner is not None and self._session is not None
        await self._runner.cleanup()
        await self._session.close()

    def hold(self, path: str, marker: bytes) -> asyncio.Future[str]:
        """Keep back the answer to the next request whose path matches ``path`` and whose query or body holds
        ``marker``;
        the future gives that path once the simulator answered it."""
        held: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._hold = (re.compile(path), marker, held)
        return held

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with self._session.request(request.method, self.upstream + request.path_qs, data=body,
                                         headers=headers, allow_redirects=False) as upstream:
            answer = web.Response(status=upstream.status, body=await upstream.read(), headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP})
        said = unquote_plus(request.query_string).encode() + body
        if self._hold is not None and self._hold[0].search(request.path) and self._hold[1] in said:
            held = self._hold[2]
            self._hold = None
            held.set_result(request.path)
            await asyncio.Event().wait()  # the answer never leaves
        return answer


class Chat(Protocol):
    """A user's direct chat with the bot on one platform's simulator, reached through a relay."""

    upload: str
    """The path (a regex) of the request that makes a file show in the chat."""

    @property
    def origin(self) -> str:
        """The simulator's scheme, host and port."""
        ...

    def config(self, relay: str) -> dict[str, Any]:
        """The gateway's platform config, its API base URL on the relay."""
        ...

    async def user_writes(self, text: str) -> None:
        """The user writes to the bot."""
        ...

    def texts(self) -> list[str]:
        """The bot's text messages in the chat, in order."""
        ...

    def files(self) -> list[SentFile]:
        """The files the chat shows from the bot, in order (each as often as it shows)."""
        ...


@dataclass
class TelegramChat:
    """A private chat on the Telegram simulator."""

    sim: TelegramSimulator
    upload = r"/send(Photo|Document)$"

    @property
    def origin(self) -> str:
        return self.sim.url

    def config(self, relay: str) -> dict[str, Any]:
        return {"telegram": {"enabled": True, "token": self.sim.token, "base_url": f"{relay}/bot",
                             "base_file_url": self.sim.base_file_url, "poll_timeout": 2}}

    async def user_writes(self, text: str) -> None:
        self.sim.user_sends(text)

    def texts(self) -> list[str]:
        return [s.text or "" for s in self.sim.sent_messages(DEFAULT_USER_ID)]

    def files(self) -> list[SentFile]:
        shown = []
        for sent in self.sim.sent_media(DEFAULT_USER_ID):
            [upload] = sent.files.values()
            shown.append((upload.filename or "", upload.data, sent.text or ""))
        return shown


@dataclass
class SlackChat:
    """A direct-message channel on the Slack simulator (Socket Mode; the Web API through the relay)."""

    sim: SlackSimulator
    upload = r"/files\.completeUploadExternal$"

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.sim.port}"

    def config(self, relay: str) -> dict[str, Any]:
        return {"slack": {"enabled": True, "bot_token": self.sim.bot_token, "app_token": self.sim.app_token,
                          "signing_secret": self.sim.signing_secret, "api_base_url": f"{relay}/api/"}}

    async def user_writes(self, text: str) -> None:
        await self.sim.user_sends_dm(text, user=SLACK_USER)

    def texts(self) -> list[str]:
        return [m.final_text for m in self.sim.messages(self.sim.dm_channel(SLACK_USER)) if not m.files]

    def files(self) -> list[SentFile]:
        uploaded = {f.id: f for f in self.sim.bot_files}
        return [(uploaded[f["id"]].name, uploaded[f["id"]].data or b"", m.final_text)
                for m in self.sim.messages(self.sim.dm_channel(SLACK_USER)) for f in m.files or ()]


@dataclass
class DiscordChat:
    """A DM channel on the Discord simulator (the gateway websocket direct, REST through the relay)."""

    sim: DiscordSimulator
    upload = r"/channels/\d+/messages$"

    @property
    def origin(self) -> str:
        return self.sim.url

    def config(self, relay: str) -> dict[str, Any]:
        return {"discord": {"enabled": True, "token": self.sim.token, "api_base_url": f"{relay}/api/v10",
                            "guild_ready_timeout": 0.05, "reconnect_backoff": 0.05}}

    async def user_writes(self, text: str) -> None:
        self.sim.user_sends_dm(text, user_id=ALICE_ID)

    def texts(self) -> list[str]:
        return [m["content"] for m in self.sim.bot_messages(self.sim.dm_channel_id(ALICE_ID)) if not m["attachments"]]

    def files(self) -> list[SentFile]:
        channel = self.sim.dm_channel_id(ALICE_ID)
        captions = [m["content"] for m in self.sim.bot_messages(channel) for _ in m["attachments"]]
        return [(f.filename, f.data, caption) for f, caption in zip(self.sim.bot_files(channel), captions, strict=True)]


def _model(request: JSON) -> Turn:
    """Sends both files when asked, then answers."""
    if request["messages"][-1]["role"] == "tool":
        return Turn(content=ANSWER)
    return tool_calls([("send_file", {"path": "chart.png", "caption": "The chart"}),
                       ("send_file", {"path": "report.pdf", "caption": "The report"})])


@dataclass
class Crash:
    """One platform's chat, the relay in front of its simulator, the model, and the gateways started so far."""

    chat: Chat
    relay: HoldingRelay
    model: ScriptedModel
    home: Path
    http: aiohttp.ClientSession
    gateways: list[GatewayProcess]

    async def start_gateway(self) -> GatewayProcess:
        """A new gateway process on the same home (its database, its workspace); returns once it is connected."""
        gateway = GatewayProcess(self.home / "config.yaml", self.home)
        self.gateways.append(gateway)
        await gateway.start()
        await gateway.wait_ready(self.http)
        return gateway

    def hold_upload(self, name: str) -> asyncio.Future[str]:
        """Keep back the platform's answer to the next upload of ``name`` (it takes effect all the same)."""
        return self.relay.hold(self.chat.upload, name.encode())

    async def kill_when_held(self, gateway: GatewayProcess, held: asyncio.Future[str]) -> None:
        """SIGKILL ``gateway`` once the platform took the held upload (the answer still on the relay)."""
        try:
            await asyncio.wait_for(held, TIMEOUT)
        except TimeoutError:
            raise AssertionError(f"the upload to hold did not reach the platform within {TIMEOUT:.0f} s; gateway "
                                 f"log: {gateway.stderr_path}") from None
        await gateway.kill()

    def shown(self) -> list[tuple[str, str]]:
        """The files the chat shows, as (name, caption), each with the bytes of the workspace file of that name."""
        files = self.chat.files()
        assert all(data == CONTENT[name] for name, data, _ in files), [(n, len(d)) for n, d, _ in files]
        return [(name, caption) for name, _, caption in files]

    def outbox(self) -> list[tuple[str | None, str, int]]:
        """The run's outbox parts: (file name or None for text, status, in_doubt), in order."""
        with closing(sqlite3.connect(self.home / "state.db")) as db:
            rows = db.execute("SELECT file, status, in_doubt FROM outbox WHERE run_id IS NOT NULL ORDER BY id")
            return [(json.loads(f)["name"] if f else None, status, in_doubt) for f, status, in_doubt in rows]


@pytest.fixture
async def crash(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Crash]:
    """The chat on the simulator of the platform the test names (``request.param``) behind a relay, the config of
    a gateway process on it, and the workspace holding the two files the model sends."""
    async with AsyncExitStack() as stack:
        sim: Any = await stack.enter_async_context(
            {"telegram": TelegramSimulator, "slack": SlackSimulator, "discord": DiscordSimulator}[request.param]())
        chat: Chat = {"telegram": TelegramChat, "slack": SlackChat, "discord": DiscordChat}[request.param](sim)
        relay = await stack.enter_async_context(HoldingRelay(chat.origin))
        model = await stack.enter_async_context(ScriptedModel(_model))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        workspace = tmp_path / "workspace"
        workspace.mkdir()
        (workspace / "chart.png").write_bytes(CHART)
        (workspace / "report.pdf").write_bytes(REPORT)
        config = deep_merge(base_config(tmp_path, model.base_url or "", "http://127.0.0.1:9/results"), {
            "auth": {"platforms": {"slack": {"allowed_users": [SLACK_USER]},
                                   "discord": {"allowed_users": [str(ALICE_ID)]}}},
            "platforms": chat.config(relay.url)})
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
        crash = Crash(chat, relay, model, tmp_path, http, [])
        try:
            yield crash
        finally:
            for gateway in crash.gateways:
                if gateway.proc is not None and gateway.proc.returncode is None:
                    await gateway.kill()


async def _killed_mid_upload_twice(crash: Crash) -> None:
    """The user asks for both files; the first gateway is killed while the chart's upload is held, the second while
    the report's is; a third finishes and stops cleanly."""
    held = crash.hold_upload("chart.png")
    first = await crash.start_gateway()
    await crash.chat.user_writes(ASK)
    await crash.kill_when_held(first, held)
    assert crash.shown() == [CHART_SHOWN]  # the platform has it; the gateway never heard
    held = crash.hold_upload("report.pdf")  # before the start: the part goes out as soon as the outbox starts
    await crash.kill_when_held(await crash.start_gateway(), held)

    last = await crash.start_gateway()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while any(status != "sent" for _, status, _ in crash.outbox()) and loop.time() < deadline:
        await asyncio.sleep(0.1)
    assert await last.terminate() == 0
    assert crash.model.request_count == 2  # the run was not redone: only its parts were in flight


def _assert_sent_after_doubt(crash: Crash) -> None:
    """The answer's text part went out once; each file part was sent, and its row says it was in doubt (a dead
    sender's claim was taken over: the report's once or twice, as the first gateway claimed the run's parts)."""
    parts = crash.outbox()
    assert [(name, status) for name, status, _ in parts] == [(None, "sent"), ("chart.png", "sent"),
                                                             ("report.pdf", "sent")]
    assert parts[0][2] == 0 and all(in_doubt >= 1 for _, _, in_doubt in parts[1:]), parts


@pytest.mark.parametrize("crash", ["discord", "slack"], indirect=True)
async def test_a_file_caught_mid_upload_by_a_sigkill_shows_once(crash: Crash) -> None:
    """Discord and Slack: each file shows exactly once, with its caption, after the answer.

    Catches: without the delivery's nonce with enforce_nonce, Discord shows the chart and the report twice; without
    the file id saved before the upload, or without looking it up with files.info when the part is tried again,
    Slack shares each twice."""
    await _killed_mid_upload_twice(crash)
    assert crash.chat.texts() == [ANSWER]
    assert crash.shown() == [CHART_SHOWN, REPORT_SHOWN]
    _assert_sent_after_doubt(crash)


@pytest.mark.parametrize("crash", ["telegram"], indirect=True)
async def test_a_file_caught_mid_upload_by_a_sigkill_is_sent_again_on_telegram(crash: Crash) -> None:
    """Telegram: each file shows twice (the upload the kill cut off took effect, and the part in doubt was sent
    again: at least once, at most twice) and its outbox row records that it was in doubt.

    Catches: a part in doubt taken as sent instead of sent again (the chart shows once; the report, claimed by the
    first gateway and never tried, never), one given up (not shown again, its row not sent), and an in-doubt mark
    left out of the row."""
    await _killed_mid_upload_twice(crash)
    assert crash.chat.texts() == [ANSWER]
    assert crash.shown() == [CHART_SHOWN, CHART_SHOWN, REPORT_SHOWN, REPORT_SHOWN]
    _assert_sent_after_doubt(crash)
