"""Secret hygiene: no secret shape survives into logs, tool results or stored errors."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from gateway.logs import REDACTED, Redactor, redactor, setup_logging
from gateway.sim.model_server import rules, tool_call
from tools.registry import registry
from toolsets import TOOLSETS, create_custom_toolset

SECRETS = {
    "telegram": "123456789:AAHfiqksKZ8WmR2zSjiQ7_v4TMAKdiHm9T0",
    "slack_bot": "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx",
    "slack_app": "xapp-1-A0123456789-1234567890123-abcdef0123456789",
    "openai": "sk-proj-abcdefghijklmnopqrstuvwxyz012345",
    "whsec": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "bearer": "Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig",
    "configured": "plain-configured-secret-value",
}


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """Root logging at DEBUG into a buffer, through the gateway's formatter."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    buf = io.StringIO()
    setup_logging("DEBUG", "text", [SECRETS["configured"]])
    root.handlers[0].stream = buf  # type: ignore[attr-defined]
    yield buf
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_each_secret_shape_is_redacted_in_messages_args_urls_and_tracebacks(fmt: str, captured: io.StringIO) -> None:
    if fmt == "json":
        setup_logging("DEBUG", "json")
        logging.getLogger().handlers[0].stream = captured  # type: ignore[attr-defined]
    log = logging.getLogger("platform.test")
    for name, secret in SECRETS.items():
        log.debug("calling %s with %s", name, secret)
        log.debug("GET https://api.example.com/bot%s/getMe?token=%s", secret, secret)
        try:
            raise RuntimeError(f"request failed: Authorization: {secret}")
        except RuntimeError:
            log.exception("failure for %s", name)
    out = captured.getvalue()
    assert REDACTED in out
    for name, secret in SECRETS.items():
        core = secret.split()[-1]
        assert core not in out, f"{name} leaked"
    if fmt == "json":
        assert all(json.loads(line)["level"] for line in out.splitlines() if line.startswith("{"))


def test_redactor_keeps_ordinary_text() -> None:
    r = Redactor(["abcdefghij"])
    text = "The build took 12:34 and 100% of 1234567 tests passed; see https://x.org/a?page=2"
    assert r(text) == text
    assert r("short ok") == "short ok"


async def test_tool_results_and_run_errors_are_redacted_before_storage(make_gateway) -> None:
    leaky = "sk-live-0123456789abcdefghijklmnop"

    def leak(args: dict, **ctx: object) -> str:
        return f"config dump: OPENAI_API_KEY={leaky} bot=123456789:AAHfiqksKZ8WmR2zSjiQ7_v4TMAKdiHm9T0"

    registry.register("leaky_tool", "test-leaky", {"name": "leaky_tool", "description": "leaks",
                                                   "parameters": {"type": "object", "properties": {}}}, leak)
    create_custom_toolset("test-leaky", "", ["leaky_tool"])
    try:
        h = await make_gateway({"toolsets": {"telegram": "test-leaky"}},
                               responder=rules((r"dump", tool_call("leaky_tool", {}))))
        await h.chat.user_says("dump the config")
        await h.chat.wait_for(lambda: len(h.chat.sent) == 1)
        # what the model saw after the tool call
        tool_msg = next(m for m in h.model.requests[-1]["messages"] if m["role"] == "tool")["content"]
        assert leaky not in tool_msg and "AAHfiqks" not in tool_msg and REDACTED in tool_msg
        # what was stored
        run = (await h.gateway.store.list_runs())[0]
        assert leaky not in json.dumps(run.tool_calls)
        history = await h.gateway.store.history("telegram:dm:100", 0, 50)
        assert all(leaky not in (m.content or "") for m in history)
        assert leaky not in h.chat.sent[0].text
    finally:
        registry.deregister("leaky_tool")
        TOOLSETS.pop("test-leaky", None)
        redactor.add(())
