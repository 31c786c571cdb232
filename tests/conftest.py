"""Shared test harness: the scripted model, a callback receiver, a recording chat adapter,
and a started in-process gateway on ephemeral ports."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import settings

import model_tools
from bench.common import scratch_database
from gateway.app import Gateway
from gateway.config import parse_config
from gateway.logs import redactor
from gateway.sim.callback_sink import CallbackSink
from gateway.sim.model_server import ScriptedModel
from gateway.sim.telegram_api import TelegramSimulator
from platforms.base import AdapterState, BasePlatformAdapter, MessageEvent, OnMessage, SendResult
from platforms.webhook_signatures import sign
from tools.registry import registry
from toolsets import TOOLSETS

WEBHOOK_SECRET = "test-webhook-secret-0123456789"
API_TOKEN = "test-api-token"

# CI explores the same examples every run (a red CI is then a change's doing, and replays); a run elsewhere
# draws new ones, so property tests keep finding what CI has not tried.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@dataclass
class Sent:
    chat_id: str
    text: str
    reply_to: str | None
    metadata: dict[str, str]
    message_id: str
    edits: list[str] = field(default_factory=list)


class RecordingAdapter(BasePlatformAdapter):
    """A chat platform double: events are pushed by the test, sends are recorded (and can fail)."""

    name = "telegram"
    max_message_length = 4096
    can_edit = True

    def __init__(self) -> None:
        super().__init__()
        self.on_message: OnMessage | None = None
        self.sent: list[Sent] = []
        self.typing: list[str] = []
        self.results: list[SendResult] = []  # scripted outcomes of the next sends
        self._ids = 0
        self._changed = asyncio.Event()
        self.bot_username = "hermes_bot"

    async def connect(self, on_message: OnMessage, *, receive: bool = True) -> None:
        self.on_message = on_message
        self._set_state(AdapterState.CONNECTED)

    async def disconnect(self) -> None:
        self._set_state(AdapterState.DISCONNECTED)

    async def send(self, chat_id: str, content: str, reply_to: str | None = None,
                   metadata: Mapping[str, str] | None = None) -> SendResult:
        if self.results:
            return self.results.pop(0)
        self._ids += 1
        self.sent.append(Sent(chat_id, content, reply_to, dict(metadata or {}), str(self._ids)))
        self._changed.set()
        return SendResult(success=True, message_id=str(self._ids))

    async def edit_message(self, chat_id: str, message_id: str, content: str,
                           metadata: Mapping[str, str] | None = None) -> SendResult:
        for s in self.sent:
            if s.message_id == message_id:
                s.edits.append(content)
                self._changed.set()
                return SendResult(success=True, message_id=message_id)
        return SendResult(success=False, error="message not found")

    async def send_typing(self, chat_id: str, metadata: Mapping[str, str] | None = None) -> None:
        self.typing.append(chat_id)

    def final_texts(self, chat_id: str | None = None) -> list[str]:
        """What the user ends up seeing: each message's latest text."""
        return [(s.edits[-1] if s.edits else s.text) for s in self.sent if chat_id is None or s.chat_id == chat_id]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        async def _wait() -> None:
            while not predicate():
                self._changed.clear()
                await self._changed.wait()
        await asyncio.wait_for(_wait(), timeout)

    async def user_says(self, text: str, *, chat_id: str = "100", user_id: str = "1001", chat_type: str = "dm",
                        thread_id: str | None = None, event_id: str | None = None) -> Any:
        assert self.on_message is not None
        event = MessageEvent(platform=self.name, event_id=event_id or uuid.uuid4().hex, chat_id=chat_id,
                             chat_type=chat_type, user_id=user_id, user_name=f"user{user_id}", text=text,
                             message_id=uuid.uuid4().hex[:8], thread_id=thread_id)
        return await self.on_message(event)


def deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) \
            else value
    return out


def base_config(home: Path, model_url: str, sink_url: str) -> dict[str, Any]:
    return {
        "model": {"base_url": model_url, "api_key": "test-key", "name": "scripted-model", "max_retries": 0,
                  "stream": False},
        "http": {"port": 0, "api_token": API_TOKEN},
        "store": {"url": f"sqlite:///{home}/state.db"},
        # Agent loops in-process (a test about agent worker processes turns them on): two workers' start-up per
        # gateway would cost more CPU than most tests.
        "gateway": {"workspace": str(home / "workspace"), "stream_edit_interval": 0.05, "typing_delay": 0,
                    "agent_workers": 0},
        "web": {"allow_private_networks": ["127.0.0.1/32"]},
        "auth": {"platforms": {"telegram": {"allowed_users": ["1001", "1002"]}}},
        "platforms": {
            "webhook": {"routes": {"github": {
                "secret": WEBHOOK_SECRET, "scheme": "github",
                "prompt": "Push to {payload.repository.full_name}: {payload.head_commit.message}",
                "deliver_to": "callback:sink"}}},
            "callback": {"targets": {"sink": {"url": sink_url, "secret": "sink-secret-123456"}}},
        },
    }


@dataclass
class Harness:
    gateway: Gateway
    model: ScriptedModel
    sink: CallbackSink
    chat: RecordingAdapter
    http: aiohttp.ClientSession

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.port}"

    async def post_webhook(self, payload: Any = None, *, route: str = "github", scheme: str = "github",
                           secret: str = WEBHOOK_SECRET, delivery_id: str | None = None, event: str = "push",
                           body: bytes | None = None, headers: Mapping[str, str] | None = None
                           ) -> tuple[int, dict[str, Any]]:
        delivery_id = delivery_id or str(uuid.uuid4())
        if body is None:
            # One body per delivery id, as GitHub sends: its deliveries dedupe by their signed body.
            payload = payload if payload is not None else {
                "repository": {"full_name": "acme/rocket"}, "head_commit": {"id": delivery_id,
                                                                             "message": "fix countdown"}}
            body = json.dumps(payload).encode()
        hdrs = {"Content-Type": "application/json", "X-GitHub-Event": event,
                **sign(scheme, secret, body, delivery_id=delivery_id)}
        hdrs.update(headers or {})
        async with self.http.post(f"{self.base_url}/webhooks/{route}", data=body, headers=hdrs) as r:
            return r.status, await r.json(content_type=None)

    async def get_run(self, run_id: str) -> dict[str, Any]:
        async with self.http.get(f"{self.base_url}/runs/{run_id}",
                                 headers={"Authorization": f"Bearer {API_TOKEN}"}) as r:
            assert r.status == 200, await r.text()
            return await r.json()

    async def wait_run(self, run_id: str, timeout: float = 10.0) -> dict[str, Any]:
        async def _wait() -> dict[str, Any]:
            while True:
                run = await self.get_run(run_id)
                if run["status"] in ("completed", "failed", "cancelled"):
                    return run
                await asyncio.sleep(0.02)
        return await asyncio.wait_for(_wait(), timeout)


GatewayFactory = Callable[..., Awaitable[Harness]]

_FIGURES = pytest.StashKey[dict[str, list[str]]]()


def figures(config: pytest.Config, section: str) -> list[str]:
    """Lines a test leaves under ``section`` in the terminal summary (shown whether it passed or not,
    also under ``-q``): the counts and figures CI logs should show."""
    return config.stash.setdefault(_FIGURES, {}).setdefault(section, [])


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """``report(line)``: add a line to this test module's section of the terminal summary."""
    section = request.node.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", " ")
    return figures(request.config, section).append


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In a pytest-xdist worker: hand this worker's figures to the controller, which prints the summary."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["figures"] = session.config.stash.get(_FIGURES, {})


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist's controller: a worker finished; keep its figures for the summary."""
    for section, lines in node.workeroutput.get("figures", {}).items():
        figures(node.config, section).extend(lines)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    for section, lines in config.stash.get(_FIGURES, {}).items():
        terminalreporter.write_sep("-", section)
        for line in lines:
            terminalreporter.write_line(line)

@pytest.fixture
def scratch() -> Iterator[list[str]]:
    """For the tool-pipeline tests: names appended here are deregistered after the test, with the ``test-*``
    toolsets, every hook and middleware, and the cached plans."""
    names: list[str] = []
    yield names
    for name in names:
        registry.deregister(name)
    for ts in [k for k in TOOLSETS if k.startswith("test-")]:
        del TOOLSETS[ts]
    model_tools.clear_hooks()
    model_tools.clear_definition_cache()


@pytest.fixture(autouse=True)
def _redacted_secrets_per_test() -> Iterator[None]:
    """Each test redacts only its own gateways' secrets. The redactor is process-wide and only ever adds (a process
    runs one gateway); without this, a secret of an earlier test in the same worker, such as the test PostgreSQL
    password "hermes", would redact the words of a later one (".hermes/tool_results/...")."""
    saved = redactor._patterns
    yield
    redactor._patterns = saved


PG_URL_ENV = "HERMES_TEST_PG_URL"


@pytest.fixture(params=["sqlite", "postgresql"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh database per test: a SQLite file, and a new PostgreSQL database on the server
    named by $HERMES_TEST_PG_URL (`.ci/start-postgres` starts one; CI always sets it)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/state.db"
        return
    base = os.environ.get(PG_URL_ENV)
    if not base:
        if os.environ.get("CI"):
            pytest.fail(f"{PG_URL_ENV} is not set: CI must start PostgreSQL (.ci/start-postgres)")
        pytest.skip(f"PostgreSQL tests need {PG_URL_ENV} (run: export {PG_URL_ENV}=$(.ci/start-postgres))")
    async with scratch_database(base, "hermes_t") as url:
        yield url


@pytest.fixture
async def make_gateway(tmp_path: Path) -> AsyncIterator[GatewayFactory]:
    """Start a gateway (and its simulators) with config overrides (and more platform doubles beside the
    RecordingAdapter as ``telegram``); everything stops at teardown."""
    started: list[Harness] = []

    async def factory(overrides: Mapping[str, Any] | None = None, responder: Any = None,
                      adapters: Mapping[str, BasePlatformAdapter] | None = None) -> Harness:
        model = ScriptedModel(responder)
        await model.start()
        sink = CallbackSink()
        await sink.start()
        cfg = parse_config(deep_merge(base_config(tmp_path, model.base_url, sink.url), overrides or {}),
                           env={"HERMES_GATEWAY_HOME": str(tmp_path)})
        chat = RecordingAdapter()
        gateway = Gateway(cfg, adapters={"telegram": chat, **(adapters or {})})
        await gateway.start()
        harness = Harness(gateway, model, sink, chat, aiohttp.ClientSession())
        started.append(harness)
        return harness

    yield factory
    for h in started:
        await h.gateway.stop(drain_timeout=1)
        await h.http.close()
        await h.sink.stop()
        await h.model.stop()


SIM_MODEL_KEY = "model-key-0123"


@pytest.fixture
async def sims() -> AsyncIterator[tuple[ScriptedModel, TelegramSimulator]]:
    """A scripted model that wants ``SIM_MODEL_KEY`` and a Telegram Bot API simulator, both started."""
    model = ScriptedModel(api_key=SIM_MODEL_KEY)
    await model.start()
    telegram = TelegramSimulator()
    await telegram.start()
    yield model, telegram
    await telegram.stop()
    await model.stop()
