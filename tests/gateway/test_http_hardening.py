"""The HTTP server against slow and many clients, over real TCP: head and body deadlines, the idle keep-alive
timeout, the connection cap, per-IP buckets of failed requests (before signature verification), and what
clients do wrong logged as one WARNING line per client per minute, never an ERROR traceback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

import platforms.webhook
from gateway.http_limits import ClientWarnings, FailureBuckets
from platforms.webhook_signatures import sign
from tests.conftest import API_TOKEN, WEBHOOK_SECRET

SLACK = 5.0  # seconds allowed beyond a deadline on a loaded machine


@contextlib.asynccontextmanager
async def raw(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A plain TCP connection to the gateway, closed on exit."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def trickle(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Send ``data`` a byte every 0.2 s, until the server closes the connection."""
    with contextlib.suppress(OSError):
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.2)


async def closed_by_server(reader: asyncio.StreamReader, within: float) -> bytes:
    """What the server sent before closing the connection (it must close within ``within`` seconds). A reset
    counts as closed: bytes still arriving after the server closed its end are answered with one."""
    try:
        return await asyncio.wait_for(reader.read(), within)
    except ConnectionResetError:
        return b""


def webhook_head(length: int) -> bytes:
    return (f"POST /webhooks/github HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
            f"X-GitHub-Event: push\r\nContent-Length: {length}\r\n\r\n").encode()


def signed_webhook() -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"repository": {"full_name": "acme/rocket"}, "head_commit": {"message": "go"}}).encode()
    headers = {"Content-Type": "application/json", "X-GitHub-Event": "push",
               **sign("github", WEBHOOK_SECRET, body, delivery_id=str(uuid.uuid4()))}
    return body, headers


async def test_slow_header_and_slow_body_clients_are_cut_at_their_deadlines_while_a_webhook_is_served(
        make_gateway: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    h = await make_gateway({"http": {"header_timeout": 1, "body_timeout": 1}})
    port = h.gateway.port
    async with raw(port) as (head_reader, head_writer), raw(port) as (body_reader, body_writer):
        started = time.monotonic()
        # The head never ends: a byte every 0.2 s does not extend the deadline.
        head_task = asyncio.create_task(trickle(head_writer, b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 200))
        body_writer.write(webhook_head(1000) + b'{"a": ')
        # A few body bytes, then nothing: nothing in flight when the server answers 408 and closes.
        body_task = asyncio.create_task(trickle(body_writer, b"111"))

        status, body = await h.post_webhook()  # served meanwhile
        assert status == 202
        assert (await h.wait_run(body["run_id"]))["status"] == "completed"

        assert await closed_by_server(head_reader, 1 + SLACK) == b""
        answer = await closed_by_server(body_reader, 1 + SLACK)
        assert answer.startswith(b"HTTP/1.1 408 ") and b"request body not received within 1.0 s" in answer
        assert time.monotonic() - started < 1 + SLACK
        await asyncio.gather(head_task, body_task)
    warnings = [r.getMessage() for r in caplog.records if r.name == "gateway.http"]
    assert any("no complete request head within 1.0 s" in m for m in warnings)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_an_idle_kept_alive_connection_is_closed_at_the_keepalive_timeout(make_gateway: Any) -> None:
    h = await make_gateway({"http": {"keepalive_timeout": 1}})
    async with raw(h.gateway.port) as (reader, writer):
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), SLACK)
        assert head.startswith(b"HTTP/1.1 200 ") and b"Connection: close" not in head
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        assert await closed_by_server(reader, 1 + SLACK) == b""


async def test_connections_beyond_the_cap_get_503_at_once_and_the_gateway_serves_again_after(
        make_gateway: Any) -> None:
    h = await make_gateway({"http": {"max_connections": 5, "header_timeout": 60}})
    fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
    try:
        async with contextlib.AsyncExitStack() as idle:
            for _ in range(5):
                await idle.enter_async_context(raw(h.gateway.port))
            started = time.monotonic()
            async with fresh.get(f"{h.base_url}/healthz") as r:
                assert r.status == 503 and r.headers["Retry-After"] == "1"
                assert "too many connections" in (await r.json())["error"]
            body, headers = signed_webhook()
            async with fresh.post(f"{h.base_url}/webhooks/github", data=body, headers=headers) as r:
                assert r.status == 503
            assert time.monotonic() - started < SLACK  # answered at once, not after a deadline
            assert await h.gateway.store.count_inbox() == 0
        # The idle connections are gone: served again.
        async def healthy() -> None:
            while True:
                async with fresh.get(f"{h.base_url}/healthz") as r:
                    if r.status == 200:
                        return
                await asyncio.sleep(0.05)
        await asyncio.wait_for(healthy(), SLACK)
        async with fresh.post(f"{h.base_url}/webhooks/github", data=body, headers=headers) as r:
            assert r.status == 202
    finally:
        await fresh.close()


async def test_a_forged_flood_from_one_ip_gets_429_before_verification_another_ip_is_served(
        make_gateway: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    verified: list[str] = []
    real_verify = platforms.webhook.verify

    def counting_verify(*args: Any, **kwargs: Any) -> str:
        verified.append("x")
        return real_verify(*args, **kwargs)

    monkeypatch.setattr(platforms.webhook, "verify", counting_verify)
    h = await make_gateway({"http": {"per_ip_burst": 20, "per_ip_rate": 0.01}})
    statuses = [(await h.post_webhook(secret="forged-secret"))[0] for _ in range(60)]
    assert statuses == [401] * 20 + [429] * 40
    assert len(verified) == 20  # the 40 refused were never read nor verified
    async with h.http.get(f"{h.base_url}/healthz") as r:
        assert r.status == 200  # probes are exempt

    # Another address is served; a signed sender behind the attacker's address shares its bucket (the
    # trade-off of a per-address limit, README: HTTP limits).
    body, headers = signed_webhook()
    other = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0)))
    async with other, other.post(f"{h.base_url}/webhooks/github", data=body, headers=headers) as r:
        assert r.status == 202
    status, _ = await h.post_webhook()
    assert status == 429


async def test_a_non_utf8_authorization_header_is_refused_not_a_500(make_gateway: Any) -> None:
    h = await make_gateway()
    for path, expected in (("/runs", b"HTTP/1.1 401 "), ("/api/status", b"HTTP/1.1 401 "),
                           ("/readyz", b"HTTP/1.1 200 ")):
        async with raw(h.gateway.port) as (reader, writer):
            writer.write(f"GET {path} HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n".encode()
                         + b"Authorization: Bearer \xff\xfe" + API_TOKEN.encode() + b"\r\n\r\n")
            answer = await closed_by_server(reader, SLACK)
        assert answer.startswith(expected), (path, answer[:40])


async def test_malformed_requests_are_one_warning_line_per_client_not_error_tracebacks(
        make_gateway: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    h = await make_gateway()
    for _ in range(5):
        async with raw(h.gateway.port) as (reader, writer):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nNo colon here\r\n\r\n")
            assert (await closed_by_server(reader, SLACK)).startswith(b"HTTP/1.0 400 ")  # aiohttp's parser error
    for _ in range(3):  # a body that fails as the handler reads it: 400, not 500
        async with raw(h.gateway.port) as (reader, writer):
            writer.write(b"POST /webhooks/github HTTP/1.1\r\nHost: gateway\r\nContent-Encoding: gzip\r\n"
                         b"Content-Length: 12\r\n\r\nnot gzip at all"[:-3])
            assert (await closed_by_server(reader, SLACK)).startswith(b"HTTP/1.1 400 ")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    lines = [r for r in caplog.records if r.levelno == logging.WARNING and "http client 127.0.0.1" in r.getMessage()]
    assert len(lines) == 1 and "malformed request answered 400" in lines[0].getMessage()
    assert lines[0].exc_info is None


def test_client_warnings_hold_back_lines_within_the_minute_and_count_them() -> None:
    now = [0.0]
    log = logging.getLogger("test.client_warnings")
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    log.addHandler(handler)
    try:
        warnings = ClientWarnings(log, clock=lambda: now[0])
        for second in (0, 1, 30, 59):
            now[0] = second
            warnings.warn("10.0.0.1", "client %s: bad", "10.0.0.1")
        warnings.warn("10.0.0.2", "client %s: bad", "10.0.0.2")
        now[0] = 61
        warnings.warn("10.0.0.1", "client %s: bad", "10.0.0.1")
    finally:
        log.removeHandler(handler)
    assert records == ["client 10.0.0.1: bad", "client 10.0.0.2: bad",
                       "client 10.0.0.1: bad (3 more like it in the last 60 s)"]


def test_failure_buckets_refill_at_their_rate() -> None:
    now = [0.0]
    buckets = FailureBuckets(rate=0.5, burst=2, clock=lambda: now[0])
    assert buckets.wait("a") == 0
    buckets.charge("a")
    buckets.charge("a")
    assert buckets.wait("a") == pytest.approx(2.0) and buckets.wait("b") == 0
    now[0] = 2.0
    assert buckets.wait("a") == 0


async def test_readyz_without_the_token_names_no_mcp_server_and_shows_no_error(make_gateway: Any) -> None:
    h = await make_gateway({"mcp_servers": {"secret-db": {"command": "/nonexistent/hermes-mcp-server"}}})

    async def mcp_failed() -> None:
        while not h.gateway.mcp.status()["secret-db"].failures:
            await asyncio.sleep(0.02)
    await asyncio.wait_for(mcp_failed(), 30)
    async with h.http.get(f"{h.base_url}/readyz", headers={"Authorization": "Bearer wrong-token"}) as r:
        text = await r.text()
    assert r.status == 200 and json.loads(text)["ready"] is True
    assert "secret-db" not in text and "FileNotFoundError" not in text and "mcp" not in json.loads(text)
    assert json.loads(text)["platforms"]["webhook"]["state"] == "connected"
    async with h.http.get(f"{h.base_url}/readyz", headers={"Authorization": f"Bearer {API_TOKEN}"}) as r:
        ready = await r.json()
    assert ready["mcp"]["secret-db"]["error"].startswith("FileNotFoundError")
