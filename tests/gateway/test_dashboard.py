"""The operator dashboard, server side: a real gateway (python-telegram-bot against the Telegram simulator, the
scripted model, signed webhooks) with ``http.dashboard`` on, driven over HTTP by an aiohttp client as a browser
would: login and its cookie, refusals without a session or CSRF token, security headers, rate-limited logins,
every page with real data, every action, live events, and no configured secret in any response."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.app import Gateway
from gateway.config import ConfigError, parse_config
from gateway.dashboard.auth import Gatekeeper, Sessions
from gateway.dashboard.metrics_history import MetricsHistory, sparkline
from gateway.metrics import Metrics
from gateway.pairing import APPROVED_NOTICE
from gateway.sim.model_server import ScriptedModel, text, tool_call
from gateway.sim.telegram_api import TelegramSimulator
from tests.gateway.telegram_chat import CHAT, SESSION, Script, TelegramChat
from tools.cronjob_tools import CronJob, parse_schedule, resolve_timezone

# Canaries: each configured secret, which must never appear in a response.
API_TOKEN = "canary-api-token-5b7d0c1e9f"
ALICE_TOKEN = "canary-alice-token-3e8a61f04d"
MODEL_KEY = "canary-model-key-a4c2e97b13"
WEBHOOK_SECRET = "canary-webhook-secret-0d6f2b8e55"
SINK_SECRET = "canary-sink-secret-7c1a9e3f28"
TELEGRAM_TOKEN = "424242:canaryTelegramTokenQ8w3Zr5Tn1Yp"
CANARIES = (API_TOKEN, ALICE_TOKEN, MODEL_KEY, WEBHOOK_SECRET, SINK_SECRET, TELEGRAM_TOKEN)
STRANGER = 5550001

PAGES = ("/dashboard/", "/dashboard/runs", "/dashboard/sessions", "/dashboard/cron", "/dashboard/pairing",
         "/dashboard/webhooks", "/dashboard/config")


def _overrides(**dashboard: Any) -> dict[str, Any]:
    return {"model": {"api_key": MODEL_KEY},
            "http": {"api_token": API_TOKEN,
                     "dashboard": {"enabled": True, "operators": {"alice": ALICE_TOKEN}, **dashboard}},
            "auth": {"dm_pairing": True},
            "platforms": {"webhook": {"routes": {"github": {"secret": WEBHOOK_SECRET}}},
                          "callback": {"targets": {"sink": {"secret": SINK_SECRET}}}}}


@dataclass
class Console:
    """A browser's view of the dashboard: its own cookie jar (cookies for 127.0.0.1 allowed)."""

    base: str
    http: aiohttp.ClientSession
    csrf: str = ""

    async def login(self, token: str = ALICE_TOKEN) -> aiohttp.ClientResponse:
        async with self.http.post(f"{self.base}/dashboard/login", data={"token": token},
                                  allow_redirects=False) as r:
            await r.read()
        if r.status == 303:
            _, page = await self.get("/dashboard/")
            self.csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)  # type: ignore[union-attr]
        return r

    async def get(self, path: str, **kwargs: Any) -> tuple[int, str]:
        async with self.http.get(f"{self.base}{path}", allow_redirects=False, **kwargs) as r:
            return r.status, await r.text()

    async def post(self, path: str, data: dict[str, str] | None = None, *, csrf: str | None = None,
                   headers: dict[str, str] | None = None) -> aiohttp.ClientResponse:
        form = {**(data or {}), "csrf": self.csrf if csrf is None else csrf}
        async with self.http.post(f"{self.base}{path}", data=form, headers=headers, allow_redirects=False) as r:
            await r.read()
            return r


@dataclass
class Board:
    """A running gateway with the dashboard on, its Telegram chat, and a logged-in console."""

    chat: TelegramChat
    console: Console

    @property
    def gateway(self) -> Gateway:
        return self.chat.gateway

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.gateway.port}"

    async def fresh_console(self) -> AsyncIterator[Console]:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            yield Console(self.base, http)

    async def finished_run(self, prompt: str) -> str:
        """The user sends ``prompt``; the id of its run, once the reply was delivered."""
        before = len(self.chat.bot_messages())
        await self.chat.says(prompt)
        await self.chat.sim.wait_for_messages(before + 1, CHAT, timeout=10)
        store = self.chat.store
        return await _until(lambda: _run_of(store, prompt, final=True))


async def _run_of(store: Any, prompt: str, final: bool = False) -> str | None:
    for run in await store.list_runs(50):
        if run.prompt == prompt and (not final or run.status in ("completed", "failed", "cancelled")):
            return str(run.id)
    return None


async def _until(probe: Any, timeout: float = 10.0) -> Any:
    async def wait() -> Any:
        while not (found := await probe()):
            await asyncio.sleep(0.02)
        return found
    return await asyncio.wait_for(wait(), timeout)


@pytest.fixture
async def board(tmp_path: Path) -> AsyncIterator[Board]:
    script = Script()
    async with (TelegramSimulator(token=TELEGRAM_TOKEN) as sim, ScriptedModel(script) as model,
                aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http):
        chat = TelegramChat(sim, model, script, tmp_path)
        try:
            gateway = await chat.start(_overrides(trusted_proxies=["127.0.0.1/32"]))
            console = Console(f"http://127.0.0.1:{gateway.port}", http)
            assert (await console.login()).status == 303
            yield Board(chat, console)
        finally:
            script.release_all()
            for gateway in chat.gateways:
                await gateway.stop(drain_timeout=1)


# ------------------------------------------------------------------------------------------- login and refusals


async def test_login_exchanges_a_token_for_a_strict_session_cookie(board: Board) -> None:
    async for console in board.fresh_console():
        response = await console.login(ALICE_TOKEN)
        assert response.status == 303 and response.headers["Location"] == "/dashboard/"
        cookie = response.headers["Set-Cookie"]
        assert cookie.startswith("hermes_dashboard=")
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/dashboard" in cookie
        assert "Secure" not in cookie  # plain HTTP, no proxy saying otherwise
        assert ALICE_TOKEN not in cookie
        status, page = await console.get("/dashboard/")
        assert status == 200 and "alice" in page
    async for console in board.fresh_console():  # http.api_token logs in as admin
        assert (await console.login(API_TOKEN)).status == 303
        assert '<span class="who">admin</span>' in (await console.get("/dashboard/"))[1]


async def test_cookie_is_secure_behind_a_trusted_tls_proxy(board: Board) -> None:
    async with board.console.http.post(f"{board.base}/dashboard/login", data={"token": ALICE_TOKEN},
                                       headers={"X-Forwarded-Proto": "https"}, allow_redirects=False) as r:
        assert r.status == 303
        assert "Secure" in r.headers["Set-Cookie"]


async def test_cookie_is_not_secure_when_an_untrusted_client_claims_tls(tmp_path: Path) -> None:
    async with TelegramSimulator() as sim, ScriptedModel() as model, aiohttp.ClientSession() as http:
        chat = TelegramChat(sim, model, Script(), tmp_path)
        try:
            gateway = await chat.start(_overrides())  # no trusted proxies
            async with http.post(f"http://127.0.0.1:{gateway.port}/dashboard/login", data={"token": ALICE_TOKEN},
                                 headers={"X-Forwarded-Proto": "https"}, allow_redirects=False) as r:
                assert r.status == 303
                assert "Secure" not in r.headers["Set-Cookie"]
        finally:
            for started in chat.gateways:
                await started.stop(drain_timeout=1)


async def test_wrong_token_is_refused(board: Board) -> None:
    async for console in board.fresh_console():
        response = await console.login("not-the-token-at-all")
        assert response.status == 401
        assert "Set-Cookie" not in response.headers
        async with console.http.post(f"{board.base}/dashboard/login", data={"token": "wrong"}) as r:
            assert r.status == 401 and "Wrong token" in await r.text()
        assert (await console.get("/dashboard/"))[0] == 303


async def test_without_a_session_pages_redirect_and_data_is_401(board: Board) -> None:
    async for console in board.fresh_console():
        for path in (*PAGES, "/dashboard/runs/whatever"):
            status, _ = await console.get(path)
            assert status == 303, path
        async with console.http.get(f"{board.base}/dashboard/", allow_redirects=False) as r:
            assert r.headers["Location"] == "/dashboard/login"
        for path in ("/dashboard/api/overview", "/dashboard/events"):
            assert (await console.get(path))[0] == 401, path
        forged = Console(board.base, console.http, csrf="0" * 64)
        async with console.http.get(f"{board.base}/dashboard/", allow_redirects=False,
                                    cookies={"hermes_dashboard": "f" * 64}) as r:
            assert r.status == 303  # a made-up session id is no session
        assert (await forged.post("/dashboard/sessions/reset", {"key": SESSION})).status == 401  # a POST: refused


async def test_logout_ends_the_session(board: Board) -> None:
    async for console in board.fresh_console():
        await console.login()
        assert (await console.post("/dashboard/logout", csrf="")).status == 403  # logout needs the token too
        response = await console.post("/dashboard/logout")
        assert response.status == 303 and response.headers["Location"] == "/dashboard/login"
        assert (await console.get("/dashboard/"))[0] == 303


async def test_a_post_without_or_with_a_wrong_csrf_token_is_refused(board: Board) -> None:
    await board.finished_run("hello")
    epoch = await _epoch(board)
    console = board.console
    assert (await console.post("/dashboard/sessions/reset", {"key": SESSION}, csrf="")).status == 403
    assert (await console.post("/dashboard/sessions/reset", {"key": SESSION}, csrf="ab" * 32)).status == 403
    assert await _epoch(board) == epoch  # nothing happened
    # The token in the header does as well as in the form.
    async with console.http.post(f"{board.base}/dashboard/sessions/reset", data={"key": SESSION},
                                 headers={"X-CSRF-Token": console.csrf}, allow_redirects=False) as r:
        assert r.status == 303
    assert await _epoch(board) == epoch + 1


async def test_a_cross_site_post_is_refused(board: Board) -> None:
    await board.finished_run("hello")
    epoch = await _epoch(board)
    response = await board.console.post("/dashboard/sessions/reset", {"key": SESSION},
                                        headers={"Origin": "https://evil.example"})
    assert response.status == 403
    response = await board.console.post("/dashboard/sessions/reset", {"key": SESSION},
                                        headers={"Sec-Fetch-Site": "cross-site", "Origin": "null"})
    assert response.status == 403
    async for console in board.fresh_console():  # login CSRF: a foreign page posting the form
        async with console.http.post(f"{board.base}/dashboard/login", data={"token": ALICE_TOKEN},
                                     headers={"Origin": "https://evil.example"}, allow_redirects=False) as r:
            assert r.status == 403 and "Set-Cookie" not in r.headers
    assert await _epoch(board) == epoch
    same = await board.console.post("/dashboard/sessions/reset", {"key": SESSION},
                                    headers={"Origin": "null", "Sec-Fetch-Site": "same-origin"})
    assert same.status == 303 and await _epoch(board) == epoch + 1


async def _epoch(board: Board) -> int:
    epoch = await board.chat.store.session_epoch(SESSION, "telegram", str(CHAT), str(CHAT), None)
    return int(epoch)


async def test_failed_logins_are_rate_limited_per_address(board: Board) -> None:
    async for console in board.fresh_console():
        for _ in range(5):
            assert (await console.login("wrong-token-guess")).status == 401
        limited = await console.login("wrong-token-guess")
        assert limited.status == 429 and int(limited.headers["Retry-After"]) >= 1
        assert (await console.login(ALICE_TOKEN)).status == 429  # even the right token, until it cools down
    # A session made before keeps working.
    assert (await board.console.get("/dashboard/"))[0] == 200


async def test_every_dashboard_response_carries_the_security_headers(board: Board) -> None:
    console = board.console
    for path in (*PAGES, "/dashboard/login", "/dashboard/static/dashboard.js", "/dashboard/api/overview",
                 "/dashboard/nope", "/dashboard/runs/no-such-run", "/dashboard/static/../templates/base.html"):
        async with console.http.get(f"{board.base}{path}", allow_redirects=False) as r:
            csp = r.headers.get("Content-Security-Policy", "")
            assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
            assert "unsafe-inline" not in csp and "unsafe-eval" not in csp, path
            assert r.headers["X-Content-Type-Options"] == "nosniff", path
            assert r.headers["Referrer-Policy"] == "no-referrer", path
            assert r.headers["Cache-Control"] == "no-store", path
            if "static/.." in path or path.endswith("nope") or "no-such-run" in path:
                assert r.status == 404, path
    async with console.http.get(f"{board.base}/dashboard/events", timeout=aiohttp.ClientTimeout(total=5)) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
    async with console.http.get(f"{board.base}/healthz") as r:
        assert "Content-Security-Policy" not in r.headers


async def test_no_inline_script_in_any_page(board: Board) -> None:
    for path in (*PAGES, "/dashboard/login"):
        _, page = await board.console.get(path)
        scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", page, re.S)
        assert all('src="/dashboard/static/' in attrs and not body.strip() for attrs, body in scripts), path
        assert not re.search(r"\son[a-z]+=", page), path  # no inline event handlers
        assert ' style="' not in page, path


async def test_dashboard_is_off_unless_enabled(telegram_gateway: Any) -> None:
    async with TelegramSimulator() as sim, ScriptedModel() as model, aiohttp.ClientSession() as http:
        gateway = await telegram_gateway(sim, model)
        for path in ("/dashboard", "/dashboard/", "/dashboard/login", "/dashboard/static/dashboard.js"):
            async with http.get(f"http://127.0.0.1:{gateway.port}{path}", allow_redirects=False) as r:
                assert r.status == 404, path


def test_enabling_the_dashboard_without_any_token_is_a_config_error(tmp_path: Path) -> None:
    env = {"HERMES_GATEWAY_HOME": str(tmp_path)}
    with pytest.raises(ConfigError) as info:
        parse_config({"http": {"dashboard": {"enabled": True}}}, env=env)
    assert info.value.path == "http.dashboard.enabled"
    assert "http.api_token" in info.value.hint and "http.dashboard.operators" in info.value.hint
    with pytest.raises(ConfigError) as info:
        parse_config({"http": {"dashboard": {"enabled": True, "operators": {"bob": "short-secret"}}}}, env=env)
    assert info.value.path == "http.dashboard.operators.bob" and "short-secret" not in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config({"http": {"api_token": API_TOKEN, "dashboard": {"enabled": True,
                                                                      "operators": {"bob": API_TOKEN}}}}, env=env)
    assert info.value.path == "http.dashboard.operators.bob" and API_TOKEN not in str(info.value)
    assert parse_config({"http": {"api_token": API_TOKEN, "dashboard": {"enabled": True}}}, env=env)


# -------------------------------------------------------------------------------------------------------- pages


async def test_overview_shows_adapters_figures_and_sparklines(board: Board) -> None:
    await board.finished_run("hello")
    status, page = await board.console.get("/dashboard/")
    assert status == 200
    assert re.search(r'data-adapter="telegram" data-state="connected"', page)
    assert re.search(r'data-adapter="webhook" data-state="connected"', page)
    assert page.count('class="last-error"') == len(board.gateway.adapters)
    for stat in ("runs-in-flight", "queued", "outbox-pending", "outbox-in-doubt", "loop-lag", "error-rate"):
        assert f'data-stat="{stat}"' in page, stat
    assert re.search(r'data-stat="role">sole<', page)
    assert re.search(r'data-stat="error-rate">0\.0 %<', page)  # one run finished, none failed
    assert page.count('<svg class="sparkline"') == 5
    data = json.loads((await board.console.get("/dashboard/api/overview"))[1])
    assert data["stats"]["role"] == "sole" and data["finished_last_hour"] == 1
    assert {a["platform"]: a["state"] for a in data["adapters"]} == {
        name: "connected" for name in board.gateway.adapters}


async def test_overview_shows_a_disconnected_platform_with_its_error(board: Board) -> None:
    adapter = board.gateway.adapters["telegram"]
    await board.chat.sim.stop()  # Telegram's API goes away

    async def noticed() -> bool:
        return adapter.status()["state"] != "connected" and bool(adapter.status()["last_error"])
    await _until(noticed, timeout=20)
    _, page = await board.console.get("/dashboard/")
    card = re.search(r'<article class="card adapter" data-adapter="telegram" data-state="([a-z]+)">(.*?)</article>',
                     page, re.S)
    assert card is not None and card.group(1) == adapter.status()["state"]
    error = re.search(r'class="last-error">([^<]*)<', card.group(2))
    assert error is not None and "getUpdates failed" in error.group(1)
    assert re.search(r'data-adapter="webhook" data-state="connected"', page)
    assert TELEGRAM_TOKEN not in page


async def test_runs_list_filters_and_a_run_with_its_tool_call_and_delivery(board: Board) -> None:
    board.chat.script.on("list my todos", tool_call("todo", {"action": "list"}))
    board.chat.script.on("Then answer.", text("Nothing to do."))  # never asked: the todo result comes next
    run_id = await board.finished_run("list my todos")
    console = board.console
    _, page = await console.get("/dashboard/runs")
    assert re.search(rf'<tr data-run-id="{run_id}">\s*<td><a href="/dashboard/runs/{run_id}">', page)
    row = re.search(rf'<tr data-run-id="{run_id}">(.*?)</tr>', page, re.S).group(1)  # type: ignore[union-attr]
    assert 'data-run-status="completed">completed<' in row
    for query, shown in (("status=completed", True), ("status=failed", False), ("platform=telegram", True),
                         ("platform=webhook", False), ("kind=chat", True), ("kind=webhook", False),
                         ("route=github", False), ("status=bogus", True)):
        _, filtered = await console.get(f"/dashboard/runs?{query}")
        assert (f'data-run-id="{run_id}"' in filtered) is shown, query
    status, detail = await console.get(f"/dashboard/runs/{run_id}")
    assert status == 200
    assert 'data-run-status="completed">completed<' in detail
    assert '<pre class="text" id="prompt">list my todos</pre>' in detail
    call = re.search(r'<article class="tool-call" data-tool-call="todo">(.*?)</article>', detail, re.S)
    assert call is not None
    assert "&#34;action&#34;: &#34;list&#34;" in call.group(1)  # its arguments
    assert re.search(r"<small>\d+\.\d{3} s</small>", call.group(1))  # its timing
    assert 'class="text result"' in call.group(1)  # its result's preview
    assert re.search(r'data-model-calls="2">2', detail)
    assert re.search(r'class="tokens">\d+ prompt \+ \d+ completion \(scripted-model\)', detail)
    assert re.search(r'<tr data-delivery="1" data-state="sent">', detail)
    assert 'data-action="stop-run"' not in detail  # it ended


async def test_stopping_a_running_run_from_its_page(board: Board) -> None:
    gate = board.chat.script.on("take your time", text("Done at last."), held=True)
    await board.chat.says("take your time")
    store = board.chat.store
    run_id = await _until(lambda: _run_of(store, "take your time"))
    await _until(lambda: _status_is(store, run_id, "running"))
    _, page = await board.console.get(f"/dashboard/runs/{run_id}")
    assert 'data-run-status="running"' in page
    form = re.search(r'<form method="post" action="(/dashboard/runs/[^"]+/stop)" data-action="stop-run">', page)
    assert form is not None
    response = await board.console.post(form.group(1))
    assert response.status == 303 and response.headers["Location"] == f"/dashboard/runs/{run_id}"
    await _until(lambda: _status_is(store, run_id, "cancelled"))
    gate.set()
    _, page = await board.console.get(f"/dashboard/runs/{run_id}")
    assert f"stopped run {run_id}" in page and 'data-run-status="cancelled"' in page


async def _status_is(store: Any, run_id: str, status: str) -> bool:
    run = await store.get_run(run_id)
    return run is not None and run.status == status


async def _events(console: Console, path: str, until: Any, timeout: float = 10.0) -> list[tuple[str, Any]]:
    """Server-sent events from ``path`` until ``until(events)`` holds."""
    events: list[tuple[str, Any]] = []
    async with console.http.get(f"{console.base}{path}") as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        name = ""

        async def read() -> None:
            nonlocal name
            async for raw in r.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    events.append((name, json.loads(line[6:])))
                    if until(events):
                        return
        await asyncio.wait_for(read(), timeout)
    return events


async def test_a_run_page_follows_the_run_live(board: Board) -> None:
    gate = board.chat.script.on("slow question", text("Slow answer."), held=True)
    await board.chat.says("slow question")
    store = board.chat.store
    run_id = await _until(lambda: _run_of(store, "slow question"))

    def delivered(events: list[tuple[str, Any]]) -> bool:
        if events and events[-1][0] == "run" and events[-1][1]["status"] == "running":
            gate.set()  # the page saw it running: let the model answer
        return bool(events) and 'data-delivery="1" data-state="sent"' in events[-1][1]["html"]

    events = await _events(board.console, f"/dashboard/events?run={run_id}", delivered)
    statuses = [data["status"] for name, data in events if name == "run"]
    assert statuses[0] in ("queued", "running") and statuses[-1] == "completed"
    assert "running" in statuses
    assert 'data-action="stop-run"' in events[0][1]["html"] and 'data-action="stop-run"' not in events[-1][1]["html"]


async def test_the_overview_stream_sends_figures_and_run_statuses(board: Board) -> None:
    done = await board.finished_run("hello")
    gate = board.chat.script.on("think hard", text("Thought."), held=True)
    await board.chat.says("think hard")
    store = board.chat.store
    held = await _until(lambda: _run_of(store, "think hard"))
    await _until(lambda: _status_is(store, held, "running"))

    def busy(events: list[tuple[str, Any]]) -> bool:
        return any(n == "overview" and d["stats"]["runs-in-flight"] == 1 for n, d in events) and \
            any(n == "runs" and d.get(held) == "running" for n, d in events)
    events = await _events(board.console, "/dashboard/events", busy)
    overview = next(data for name, data in events if name == "overview" and data["stats"]["runs-in-flight"])
    assert overview["stats"]["role"] == "sole" and '<svg class="sparkline"' in overview["fragments"]["sparklines"]
    assert re.search(r'<tr data-kind="chat"><td>chat</td><td>1</td><td>0</td></tr>', overview["fragments"]["per-kind"])
    first_runs = next(data for name, data in events if name == "runs")
    assert first_runs[done] == "completed"
    gate.set()

    def finished(events: list[tuple[str, Any]]) -> bool:
        return any(n == "runs" and d.get(held) == "completed" for n, d in events)
    events = await _events(board.console, "/dashboard/events", finished)
    assert [d for n, d in events if n == "runs"][-1][held] == "completed"


async def test_sessions_page_and_reset(board: Board) -> None:
    await board.finished_run("hello")
    _, page = await board.console.get("/dashboard/sessions?platform=telegram")
    row = re.search(rf'<tr data-session="{SESSION}">(.*?)</tr>', page, re.S)
    assert row is not None and "#1" in row.group(1) and 'data-action="reset-session"' in row.group(1)
    assert 'data-session="' not in (await board.console.get("/dashboard/sessions?platform=discord"))[1]
    response = await board.console.post("/dashboard/sessions/reset", {"key": SESSION})
    assert response.headers["Location"] == "/dashboard/sessions"
    _, page = await board.console.get("/dashboard/sessions")
    assert f"started a new conversation in session {SESSION}" in page
    assert re.search(rf'<tr data-session="{SESSION}">.*?<td>#2</td>', page, re.S)
    # The next message starts afresh: the model sees no earlier turn.
    await board.finished_run("again")
    request = board.chat.model.requests[-1]
    assert [m["content"] for m in request["messages"] if m["role"] == "user"] == ["again"]


async def test_cron_page_and_its_actions(board: Board, caplog: pytest.LogCaptureFixture) -> None:
    await board.finished_run("hello")  # the chat the job delivers to exists
    cron = board.gateway.cron
    assert cron is not None
    zone = "Asia/Tokyo"
    job = await cron.create(CronJob(id="", owner=f"telegram:{CHAT}", prompt="water the plants", name="plants",
                                    schedule=parse_schedule("every 2h", resolve_timezone(zone), datetime.now(UTC)),
                                    timezone=zone, origin_platform="telegram", origin_chat_id=str(CHAT)), None)
    console = board.console
    _, page = await console.get("/dashboard/cron")
    row = re.search(rf'<tr data-job-id="{job.id}">(.*?)</tr>', page, re.S).group(1)  # type: ignore[union-attr]
    assert 'data-job-state="active"' in row and "never fired" in row
    assert f"{job.local(job.next_fire_at)} <small>(Asia/Tokyo)</small>" in row and "+09:00" in row
    assert {a for a in re.findall(r'data-action="([a-z-]+)"', row)} == {"pause", "run-now", "remove"}
    caplog.set_level(logging.INFO, "gateway.dashboard")

    await console.post(f"/dashboard/cron/{job.id}/pause")
    assert (await cron.get(job.id, None)).state == "paused"  # type: ignore[union-attr]
    _, page = await console.get("/dashboard/cron")
    assert re.search(rf'<tr data-job-id="{job.id}">.*?data-job-state="paused".*?data-action="resume"', page, re.S)

    await console.post(f"/dashboard/cron/{job.id}/resume")
    assert (await cron.get(job.id, None)).state == "active"  # type: ignore[union-attr]

    before = len(board.chat.bot_messages())
    await console.post(f"/dashboard/cron/{job.id}/run-now")
    await board.chat.sim.wait_for_messages(before + 1, CHAT, timeout=10)
    assert "Echo: water the plants" in board.chat.texts()[-1]
    fired = await _until(lambda: _last_status(cron, job.id))
    _, page = await console.get("/dashboard/cron")
    assert fired == "completed" and re.search(rf'<tr data-job-id="{job.id}">.*?completed at', page, re.S)

    await console.post(f"/dashboard/cron/{job.id}/remove")
    assert await cron.get(job.id, None) is None
    assert f'data-job-id="{job.id}"' not in (await console.get("/dashboard/cron"))[1]
    actions = [r.getMessage() for r in caplog.records if r.name == "gateway.dashboard"]
    for action in ("pause", "resume", "run-now", "remove"):
        assert any(m.startswith(f"dashboard: alice: cron job {job.id}: {action}") for m in actions), action


async def _last_status(cron: Any, job_id: str) -> str | None:
    job = await cron.get(job_id, None)
    return job.last_status if job else None


async def _pending_code(board: Board, user_id: int) -> str:
    board.chat.sim.user_sends("hello?", user_id=user_id, chat_id=user_id, first_name="Stranger")
    await board.chat.sim.wait_for_messages(1, user_id, timeout=10)
    pending = await board.gateway.router.pairing.pending()  # type: ignore[union-attr]
    return next(c.code for c in pending if c.user_id == str(user_id))


async def test_pairing_approve_deny_and_revoke(board: Board) -> None:
    sim, console = board.chat.sim, board.console
    code = await _pending_code(board, STRANGER)
    _, page = await console.get("/dashboard/pairing")
    row = re.search(rf'<tr data-code="{code}">(.*?)</tr>', page, re.S).group(1)  # type: ignore[union-attr]
    assert f"telegram:{STRANGER}" in row and 'data-action="approve"' in row and 'data-action="deny"' in row

    await console.post("/dashboard/pairing/approve", {"code": code})
    await sim.wait_for(lambda: any(s.text == APPROVED_NOTICE for s in sim.sent_messages(STRANGER)), timeout=10)
    _, page = await console.get("/dashboard/pairing")
    assert f'data-code="{code}"' not in page
    user = re.search(rf'<tr data-user="telegram:{STRANGER}">(.*?)</tr>', page, re.S)
    assert user is not None and "dashboard:alice" in user.group(1) and 'data-action="revoke"' in user.group(1)
    # The stranger's next message is answered.
    before = len(sim.sent_messages(STRANGER))
    sim.user_sends("now may I?", user_id=STRANGER, chat_id=STRANGER, first_name="Stranger")
    answered = await sim.wait_for_messages(before + 1, STRANGER, timeout=10)
    assert answered[-1].text == "Echo: now may I?"

    await console.post("/dashboard/pairing/revoke", {"platform": "telegram", "user_id": str(STRANGER)})
    assert not await board.gateway.router.pairing.is_approved("telegram", str(STRANGER))  # type: ignore[union-attr]

    other = await _pending_code(board, STRANGER + 1)
    await console.post("/dashboard/pairing/deny", {"code": other})
    _, page = await console.get("/dashboard/pairing")
    assert f"denied pairing code {other}" in page and f'data-code="{other}"' not in page
    refused = await board.gateway.router.pairing.approve(other, "cli")  # type: ignore[union-attr]
    assert not refused.ok and "already denied" in refused.message


async def test_webhooks_page_lists_routes_and_recent_deliveries(board: Board) -> None:
    from platforms.webhook_signatures import sign

    body = json.dumps({"repository": {"full_name": "acme/rocket"}, "head_commit": {"message": "fix"}}).encode()
    url = f"{board.base}/webhooks/github"
    http = board.console.http
    good = {"Content-Type": "application/json", "X-GitHub-Event": "push", **sign("github", WEBHOOK_SECRET, body,
                                                                                   delivery_id="d-1")}
    async with http.post(url, data=body, headers=good) as r:
        assert r.status == 202
        run_id = (await r.json())["run_id"]
    forged = {**good, **sign("github", "not-the-secret-at-all", body, delivery_id="d-2")}
    async with http.post(url, data=body, headers=forged) as r:
        assert r.status == 401
    _, page = await board.console.get("/dashboard/webhooks")
    assert re.search(r'<tr data-route="github">.*?github.*?agent', page, re.S)
    assert re.search(rf'<tr data-delivery-status="202">.*?href="/dashboard/runs/{run_id}"', page, re.S)
    refused = re.search(r'<tr data-delivery-status="401">.*?class="reason">([^<]+)<', page, re.S)
    assert refused is not None and refused.group(1).startswith("invalid signature")
    assert page.index('data-delivery-status="401"') < page.index('data-delivery-status="202"')  # newest first
    _, runs = await board.console.get("/dashboard/runs?route=github")
    assert f'data-run-id="{run_id}"' in runs


async def test_config_page_masks_every_secret(board: Board) -> None:
    _, page = await board.console.get("/dashboard/config")
    config = json.loads(re.search(r'<pre class="text config" id="config">(.*?)</pre>', page, re.S)  # type: ignore
                        .group(1).replace("&#34;", '"').replace("&amp;", "&").replace("&lt;", "<")
                        .replace("&gt;", ">").replace("&#39;", "'"))
    assert config["http"]["api_token"] == "***"
    assert config["http"]["dashboard"]["operators"] == {"alice": "***"}
    assert config["model"]["api_key"] == "***"
    assert config["platforms"]["telegram"]["token"] == "***"


async def test_no_configured_secret_reaches_any_response(board: Board) -> None:
    """Secrets the gateway holds, and a user message quoting them, are never shown: every page, the JSON, the
    event streams."""
    board.chat.script.on(f"my key is {MODEL_KEY}", tool_call("todo", {"action": "add", "items": [SINK_SECRET]}))
    run_id = await board.finished_run(f"my key is {MODEL_KEY}")
    await _pending_code(board, STRANGER)
    bodies = []
    for path in (*PAGES, f"/dashboard/runs/{run_id}", "/dashboard/login", "/dashboard/api/overview",
                 "/dashboard/static/dashboard.js", "/dashboard/static/dashboard.css"):
        status, body = await board.console.get(path)
        assert status == 200, path
        bodies.append(body)
    events = await _events(board.console, f"/dashboard/events?run={run_id}", lambda ev: ev[-1][0] == "run")
    events += await _events(board.console, "/dashboard/events", lambda ev: {"overview", "runs"} <= {n for n, _ in ev})
    bodies.append(json.dumps(events))
    assert "[REDACTED]" in bodies[len(PAGES)]  # the run's page: its prompt and tool call, redacted
    for body in bodies:
        for canary in CANARIES:
            assert canary not in body


# ---------------------------------------------------------------------------------------------- metrics history


def test_history_series_and_error_rate_follow_the_metrics() -> None:
    metrics = Metrics()
    now = [1000.0]
    history = MetricsHistory(metrics, clock=lambda: now[0])
    history.sample()
    metrics.runs.labels("chat", "completed").inc(3)
    metrics.runs.labels("webhook", "failed").inc()
    metrics.outbox_depth.set(7)
    metrics.loop_lag_histogram.observe(0.002)
    metrics.loop_lag_histogram.observe(0.004)
    now[0] += 60
    history.sample()
    metrics.runs.labels("chat", "completed").inc()  # in the current minute, so far
    series = history.series()
    assert series["runs"] == [4, 1] and series["failed"] == [1, 0] and series["outbox"] == [0, 7, 7]
    assert series["loop_lag_ms"] == [pytest.approx(3.0), 0.0]
    rate = history.error_rate()
    assert (rate.finished, rate.failed, rate.text) == (5, 1, "20.0 %")
    for _ in range(70):  # the ring keeps an hour
        history.sample()
    assert len(history.samples) == 61 and history.error_rate().finished == 0


def test_sparkline_scales_into_the_box() -> None:
    assert sparkline([]) == ""
    assert sparkline([5.0]) == "0.0,1.0 120.0,1.0"  # one value: a flat line at the top
    points = [tuple(map(float, p.split(","))) for p in sparkline([0, 10, 5], 100, 22).split()]
    assert points == [(0.0, 21.0), (50.0, 1.0), (100.0, 11.0)]


def test_a_session_ends_after_its_idle_time_and_at_logout() -> None:
    now = [0.0]
    sessions = Sessions(idle=60.0, clock=lambda: now[0])
    sid, session = sessions.create("alice")
    assert len(sid) == 64 and len(session.csrf) == 64 and sid != session.csrf
    now[0] = 59.0
    assert sessions.get(sid) is session  # used: its idle time starts over
    now[0] = 118.0
    assert sessions.get(sid) is session
    now[0] = 178.5
    assert sessions.get(sid) is None and sessions.get(sid) is None
    other, _ = sessions.create("bob")
    sessions.end(other)
    assert sessions.get(other) is None and sessions.get(None) is None


def test_every_configured_token_logs_in_as_its_operator(tmp_path: Path) -> None:
    cfg = parse_config({"http": {"api_token": API_TOKEN, "dashboard": {
        "enabled": True, "operators": {"alice": ALICE_TOKEN, "bob": "bob-token-0123456789"}}}},
        env={"HERMES_GATEWAY_HOME": str(tmp_path)})
    gate = Gatekeeper(cfg.http)
    assert gate.operator_of(ALICE_TOKEN) == "alice" and gate.operator_of("bob-token-0123456789") == "bob"
    assert gate.operator_of(API_TOKEN) == "admin"
    assert gate.operator_of(ALICE_TOKEN[:-1]) is None and gate.operator_of("") is None
    assert gate.operator_of(ALICE_TOKEN + "x") is None
