"""A failed model call names its real cause and the config key to fix, in the log and in the answer the user gets
(against real sockets: a closed port, a name that does not resolve, TLS failures, the model simulator's errors)."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gateway.sim.model_server import ScriptedModel
from tests.conftest import GatewayFactory, Harness

Ask = Callable[..., Awaitable[tuple[str, str]]]


@pytest.fixture
def ask(make_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture) -> Ask:
    """Start a gateway with these model settings, say hello on the chat, return (the reply, the logged error)."""

    async def _ask(model: dict[str, Any] | None = None,
                   prepare: Callable[[Harness], None] | None = None) -> tuple[str, str]:
        h = await make_gateway({"model": model or {}})
        if prepare is not None:
            prepare(h)
        with caplog.at_level("WARNING", logger="gateway.runs"):
            accepted = await h.chat.user_says("hello")
            run = await h.wait_run(accepted.run_id, timeout=20)
        [logged] = [r.getMessage() for r in caplog.records if "model error" in r.getMessage()]
        assert "timed out" not in logged.lower() or "model.timeout" in logged, logged
        assert run["status"] == "failed" and run["error"] == logged.split("model error: ", 1)[1]
        await h.chat.wait_for(lambda: run["result"] in h.chat.final_texts())  # what the user is told
        return run["result"], logged

    return _ask


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_closed_port_is_connection_refused_not_a_timeout(ask: Ask) -> None:
    port = _closed_port()
    reply, logged = await ask({"base_url": f"http://127.0.0.1:{port}/v1"})
    assert f"connection refused by 127.0.0.1:{port}" in logged and "check model.base_url" in logged, logged
    assert reply.startswith("I can't reach the model service: the connection was refused.")
    assert "model.base_url" in reply and "timed out" not in reply


async def test_a_host_that_does_not_resolve_is_named(ask: Ask) -> None:
    reply, logged = await ask({"base_url": "http://nonexistent.invalid/v1"})
    assert "host 'nonexistent.invalid' does not resolve" in logged and "check model.base_url" in logged, logged
    assert reply == "I can't reach the model service: its host name does not resolve. An operator needs to " \
                    "check model.base_url."


async def test_https_to_a_plain_http_server_is_a_tls_failure(ask: Ask) -> None:
    plain = ScriptedModel()
    url = await plain.start()
    try:
        reply, logged = await ask({"base_url": url.replace("http://", "https://")})
    finally:
        await plain.stop()
    assert "TLS handshake with 127.0.0.1:" in logged and "(is it plain HTTP? then use http://)" in logged, logged
    assert reply.startswith("I can't reach the model service: the secure connection failed.")
    assert "model.base_url" in reply


@pytest.fixture
async def self_signed(tmp_path: Path) -> AsyncIterator[str]:
    """An HTTPS server with a self-signed certificate; its base URL."""
    assert shutil.which("openssl"), "the openssl command makes the certificate (Debian's openssl; .ci/run installs it)"
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"],
                   check=True, capture_output=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    runner = web.AppRunner(web.Application())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    yield f"https://127.0.0.1:{runner.addresses[0][1]}/v1"
    await runner.cleanup()


async def test_a_self_signed_certificate_is_named(ask: Ask, self_signed: str) -> None:
    reply, logged = await ask({"base_url": self_signed})
    assert "the TLS certificate of 127.0.0.1:" in logged and "self" in logged and "signed" in logged, logged
    assert "check model.base_url" in logged
    assert reply.startswith("I can't reach the model service: its TLS certificate is not trusted.")


@pytest.fixture
async def other_model() -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """Start a model simulator besides the gateway's own (with these settings); its base URL."""
    started: list[ScriptedModel] = []

    async def start(**kwargs: Any) -> str:
        started.append(ScriptedModel(**kwargs))
        return await started[-1].start()

    yield start
    for model in started:
        await model.stop()


async def test_a_rejected_key_names_model_api_key(ask: Ask, other_model: Callable[..., Awaitable[str]]) -> None:
    reply, logged = await ask({"base_url": await other_model(api_key="the-right-key")})
    assert "the API key was rejected (AuthenticationError, HTTP 401 from " in logged, logged
    assert "check model.api_key" in logged
    assert reply == "The model service rejected the gateway's API key; an operator needs to fix model.api_key."


async def test_a_forbidden_model_names_the_key_and_the_model(ask: Ask) -> None:
    reply, logged = await ask(prepare=lambda h: h.model.fail_next(status=403))
    assert "access refused (PermissionDeniedError, HTTP 403 from " in logged, logged
    assert "check that model.api_key may use model 'scripted-model'" in logged
    assert reply == "The model service refused the gateway access; an operator needs to check model.api_key and " \
                    "model.name."


async def test_an_unknown_model_names_model_name(ask: Ask) -> None:
    reply, logged = await ask(prepare=lambda h: h.model.fail_next(
        status=404, message="The model `scripted-model` does not exist or you do not have access to it."))
    assert "model 'scripted-model' not found (NotFoundError, HTTP 404 from " in logged, logged
    assert "check model.name" in logged
    assert reply == "The configured model does not exist at the model service; an operator needs to fix model.name."


async def test_a_base_url_without_the_api_path_names_model_base_url(
        ask: Ask, other_model: Callable[..., Awaitable[str]]) -> None:
    url = (await other_model()).removesuffix("/v1")
    reply, logged = await ask({"base_url": url})
    assert f"no chat completions endpoint at {url} (NotFoundError, HTTP 404 from " in logged, logged
    assert "check model.base_url" in logged
    assert reply == "The model service's address is wrong; an operator needs to fix model.base_url."


async def test_rate_limiting_asks_to_try_later(ask: Ask) -> None:
    reply, logged = await ask(prepare=lambda h: h.model.fail_next(status=429))
    assert "rate-limited (RateLimitError, HTTP 429 from " in logged, logged
    assert reply == "The model service is rate-limiting us. Please try again in a minute."


@pytest.fixture
async def out_of_quota() -> AsyncIterator[str]:
    """A server answering every chat completion as OpenAI does for an account without quota; its base URL."""
    body = {"error": {"message": "You exceeded your current quota, please check your plan and billing details.",
                      "type": "insufficient_quota", "param": None, "code": "insufficient_quota"}}

    async def refuse(_request: web.Request) -> web.Response:
        return web.json_response(body, status=429)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    await runner.cleanup()


async def test_an_exhausted_quota_is_not_called_rate_limiting(ask: Ask, out_of_quota: str) -> None:
    reply, logged = await ask({"base_url": out_of_quota})
    assert "quota exhausted (RateLimitError, HTTP 429 from " in logged, logged
    assert "check the account of model.api_key" in logged
    assert reply == "The model service account is out of quota; an operator needs to check the account of " \
                    "model.api_key."


async def test_a_model_that_does_not_answer_names_model_timeout(ask: Ask) -> None:
    reply, logged = await ask({"timeout": 0.5}, prepare=lambda h: h.model.hang_next(1))
    assert "no answer from 127.0.0.1:" in logged and "within model.timeout (0.5 s)" in logged, logged
    assert reply == "The model did not answer in time. Please try again in a moment."


@pytest.fixture
def full_backlog() -> Iterator[str]:
    """A listening socket whose accept queue is full (nobody accepts): connecting hangs until it times out."""
    with socket.socket() as server, socket.socket() as queued:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        queued.connect(server.getsockname())  # the one connection the queue holds; later SYNs are dropped
        yield f"http://127.0.0.1:{server.getsockname()[1]}/v1"


async def test_a_connection_that_never_opens_names_model_connect_timeout(ask: Ask, full_backlog: str) -> None:
    reply, logged = await ask({"base_url": full_backlog, "connect_timeout": 0.5})
    assert "within model.connect_timeout (0.5 s)" in logged and "check model.base_url" in logged, logged
    assert reply == "I can't reach the model service. Please try again in a moment; if this persists, an operator " \
                    "needs to check model.base_url."


async def test_an_unreachable_network_is_named(ask: Ask) -> None:
    # Linux refuses TCP to the broadcast address at once: "Network is unreachable".
    reply, logged = await ask({"base_url": "http://255.255.255.255/v1"})
    assert "cannot connect to 255.255.255.255:80 (Network is unreachable)" in logged, logged
    assert "check model.base_url" in logged and "model.base_url" in reply


async def test_a_connection_dropped_mid_answer_is_not_called_unreachable(ask: Ask) -> None:
    reply, logged = await ask({"stream": True}, prepare=lambda h: h.model.drop_next(1, after_chunks=2))
    assert "the connection to 127.0.0.1:" in logged and "failed during the request" in logged, logged
    assert reply == "The connection to the model service broke off. Please try again in a moment."
