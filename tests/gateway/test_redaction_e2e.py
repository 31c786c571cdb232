"""A secret the model echoes, plain or encoded, reaches neither the chat nor the store: the real gateway and
Telegram adapter against the Bot API and model simulators."""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.app import Gateway
from gateway.config import parse_config
from gateway.logs import REDACTED
from gateway.sim.model_server import ScriptedModel, rules, text
from gateway.sim.telegram_api import DEFAULT_USER_ID, TelegramSimulator

MODEL_KEY = "model-api-key-5f1e0c9a7b3d"
ROUTE_SECRET = "route-secret-0123456789abcdef"
CONFIG_DUMP = b"webhook_secret=" + ROUTE_SECRET.encode() + b"\n"
ANSWER = (
    f"The model key, base64-encoded: {base64.b64encode(MODEL_KEY.encode()).decode()} (keep it safe).\n\n"
    f"The config file as `base64` prints it:\n\n{base64.encodebytes(CONFIG_DUMP).decode()}\n"
    f"and the route secret in hex: {ROUTE_SECRET.encode().hex()}. Anything else?"
)


def _stable_base64(stream: bytes, start: int, length: int) -> str:
    """The characters of ``stream``'s base64 made only of the bytes ``start`` to ``start + length``."""
    return base64.b64encode(stream).decode()[-(-start * 8 // 6):(start + length) * 8 // 6]


# What must never be seen, in any 10-character piece.
FORBIDDEN = [
    MODEL_KEY,
    ROUTE_SECRET,
    _stable_base64(MODEL_KEY.encode(), 0, len(MODEL_KEY)),
    _stable_base64(CONFIG_DUMP, len(b"webhook_secret="), len(ROUTE_SECRET)),
    ROUTE_SECRET.encode().hex(),
]


def leaks(seen: str) -> list[str]:
    """The forbidden pieces in ``seen`` (whitespace, and the \\n escapes of JSON, taken out: wraps do not hide)."""
    squeezed = "".join(seen.replace("\\n", "").replace("\\r", "").split())
    return [f[i:i + 10] for f in FORBIDDEN for i in range(len(f) - 9) if f[i:i + 10] in squeezed]


@pytest.fixture
async def started(tmp_path: Path) -> AsyncIterator[tuple[TelegramSimulator, ScriptedModel, Path, list[Gateway]]]:
    async with TelegramSimulator() as sim, ScriptedModel() as model:
        gateways: list[Gateway] = []
        yield sim, model, tmp_path, gateways
        for gateway in gateways:
            await gateway.stop(drain_timeout=1)


@pytest.mark.parametrize("stream", [True, False])
async def test_encoded_secrets_in_the_answer_never_reach_the_chat_or_the_store(
        started: tuple[TelegramSimulator, ScriptedModel, Path, list[Gateway]], stream: bool) -> None:
    sim, model, home, gateways = started
    model.responder = rules((r"again", text("Nothing new.")),
                            fallback=lambda request: text(ANSWER))
    model.chunk_size, model.chunk_delay = 8, 0.01  # streamed slowly: the preview is edited many times
    cfg = parse_config({
        "model": {"base_url": model.base_url, "api_key": MODEL_KEY, "name": "scripted-model", "max_retries": 0,
                  "stream": stream},
        "http": {"port": 0},
        "store": {"url": f"sqlite:///{home}/state.db"},
        "gateway": {"workspace": str(home / "workspace"), "stream_edit_interval": 0.05, "typing_delay": 0},
        "auth": {"platforms": {"telegram": {"allowed_users": [str(DEFAULT_USER_ID)]}}},
        "platforms": {
            "telegram": {"enabled": True, "token": sim.token, "base_url": sim.base_url,
                         "base_file_url": sim.base_file_url},
            "webhook": {"routes": {"github": {"secret": ROUTE_SECRET, "scheme": "github",
                                              "prompt": "Push: {payload.ref}"}}},
        },
    }, env={"HERMES_GATEWAY_HOME": str(home)})
    gateway = Gateway(cfg)
    gateways.append(gateway)
    await gateway.start()
    assert gateway.store is not None

    sim.user_sends("show me the model key and the config, encoded")

    def final_text() -> str | None:
        texts = [m["text"] for m in sim.chat_history(DEFAULT_USER_ID)
                 if m["from"]["id"] == sim.bot_id and "text" in m]
        return texts[-1] if texts and "Anything else?" in texts[-1] else None

    final = await sim.wait_for(final_text, timeout=15)
    assert REDACTED in final and "The model key, base64-encoded:" in final
    sent = [call.params["text"] for call in sim.calls if "text" in call.params]
    if stream:
        assert len(sim.edits(DEFAULT_USER_ID)) >= 3, "the answer was previewed while it streamed"
    for message in sent:
        assert leaks(message) == [], message

    [run] = await gateway.store.list_runs()
    assert run.status == "completed" and leaks(run.result or "") == []
    history = await gateway.store.history(run.session_key, 0, 100)
    assert [m.role for m in history] == ["user", "assistant"]
    assert REDACTED in (history[-1].content or "")
    with sqlite3.connect(f"file:{home}/state.db?mode=ro", uri=True) as db:
        # The search index's shadow tables hold the words of messages.content (checked here too) as prefix-compressed
        # binary segments, whose hex dump matches by chance: the word "secret" is stored as "s" + "ecret".
        dump = [line for line in db.iterdump() if not line.startswith('INSERT INTO "messages_search_')]
        assert leaks("\n".join(dump)) == []

    # The next turn's history, as the model gets it, holds the redacted answer.
    sim.user_sends("again?")
    await sim.wait_for(lambda: any(m.get("text") == "Nothing new." for m in sim.chat_history(DEFAULT_USER_ID)),
                       timeout=15)
    assert leaks(json.dumps(model.requests[-1]["messages"])) == []
