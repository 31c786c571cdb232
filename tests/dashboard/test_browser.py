"""The operator dashboard in a real browser (Debian's chromium through Playwright) against a gateway whose Telegram,
Slack and Discord adapters talk to their simulators: logging in, the overview's adapter states, approving a pairing
code, pausing a cron job, following and stopping runs, CSRF and cookie refusals, and no secret in anything served."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest
from playwright.async_api import APIResponse, Browser, BrowserContext, Locator, Page, Response, expect

from gateway.sim.model_server import JSON, Turn, default_responder, rules, text, tool_call
from gateway.sim.telegram_api import DEFAULT_USER_ID
from platforms.webhook_signatures import sign
from tests.dashboard.conftest import CANARIES, CHAT_PLATFORMS, OPERATOR, Running, eventually, log_in
from tests.gateway.test_cron import _job

pytestmark = pytest.mark.asyncio(loop_scope="session")  # the browser lives on the session's loop

DOCS = Path(__file__).resolve().parents[2] / "docs"
STRANGER_ID = 5005
CODE = re.compile(r"\b([A-Z2-9]{4})-?([A-Z2-9]{4})\b")
SETTLE = 2.5  # seconds a paused every-second job is watched for a fire that must not come


async def _fires(running: Running, job_id: str) -> int:
    """How many runs the cron job has fired."""
    return sum(r.kind == "cron" and r.source == job_id for r in await running.gateway.store.list_runs(100))


def _telegram_texts(running: Running, chat_id: int) -> list[str]:
    return [m.text or "" for m in running.telegram.sent_messages(chat_id)]


async def _submit(row: Locator, action: str) -> None:
    """Press the submit button of the row's ``form[data-action=action]``."""
    await row.locator(f'form[data-action="{action}"] [type=submit]').click()


# ------------------------------------------------------------------------------------------------ login


async def test_log_in_with_an_operator_token_and_a_wrong_token_is_refused(running: Running, browser: Browser,
                                                                          context: BrowserContext) -> None:
    page = await context.new_page()
    await page.goto("/dashboard/")
    assert urlsplit(page.url).path == "/dashboard/login"  # no session: the overview sends you to the login form

    async with page.expect_response(lambda r: r.request.method == "POST") as refused:
        await log_in(page, "wrong-token-not-configured")
    assert (await refused.value).status == 401
    await expect(page.locator("body")).to_contain_text("Wrong token")
    assert [c for c in await context.cookies() if c["name"] == "hermes_dashboard"] == []

    async with page.expect_response(lambda r: r.request.method == "POST") as accepted:
        await log_in(page, CANARIES["http.dashboard.operators.alice"])
    assert (await accepted.value).status == 303
    await page.wait_for_url("**/dashboard/")
    for platform in CHAT_PLATFORMS:
        await expect(page.locator(f'[data-adapter="{platform}"]')).to_have_count(1)
    [cookie] = [c for c in await context.cookies() if c["name"] == "hermes_dashboard"]
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"], cookie["secure"]) == (
        True, "Strict", "/dashboard", False)  # plain HTTP here: not Secure

    admin = await browser.new_context(base_url=running.url)  # http.api_token logs in too (as "admin")
    try:
        page = await admin.new_page()
        await log_in(page, CANARIES["http.api_token"])
        await page.wait_for_url("**/dashboard/")
        await expect(page.locator('[data-adapter="telegram"]')).to_have_count(1)
    finally:
        await admin.close()


# --------------------------------------------------------------------------------------------- overview


async def test_overview_shows_the_chat_adapters_and_telegram_going_down_live(running: Running, page: Page) -> None:
    for platform in CHAT_PLATFORMS:
        await expect(page.locator(f'[data-adapter="{platform}"]')).to_have_attribute("data-state", "connected")
    for stat in ("runs-in-flight", "queued", "outbox-pending", "outbox-in-doubt", "loop-lag", "error-rate", "role"):
        await expect(page.locator(f'[data-stat="{stat}"]')).to_have_count(1)
    await running.slack.user_sends_dm("hello")  # one finished run for the picture
    await running.slack.wait_for_messages(1)
    await page.reload()
    DOCS.mkdir(exist_ok=True)
    await page.screenshot(path=str(DOCS / "dashboard-overview.png"), full_page=True)

    loads: list[str] = []
    page.on("load", lambda _: loads.append(page.url))
    await running.telegram.stop()
    adapter = running.gateway.adapters["telegram"]
    await eventually(lambda: adapter.status()["state"] != "connected" and bool(adapter.status()["last_error"]),
                     what="the Telegram adapter to notice its API is gone")
    telegram = page.locator('[data-adapter="telegram"]')
    # Live: the page follows over SSE, never reloaded.
    await expect(telegram).not_to_have_attribute("data-state", "connected", timeout=15_000)
    await expect(telegram.locator(".last-error")).to_contain_text("getUpdates failed", timeout=15_000)
    assert loads == []
    shown = await telegram.get_attribute("data-state")
    assert shown == adapter.status()["state"] and shown in ("connecting", "disconnected", "failed")
    for platform in ("slack", "discord"):
        await expect(page.locator(f'[data-adapter="{platform}"]')).to_have_attribute("data-state", "connected")
    await page.reload()  # and the same after a reload
    await expect(telegram).to_have_attribute("data-state", shown)
    await expect(telegram.locator(".last-error")).to_contain_text("getUpdates failed")


# ---------------------------------------------------------------------------------------------- pairing


async def test_a_pairing_code_approved_in_the_browser_lets_the_stranger_chat(running: Running, page: Page) -> None:
    tg = running.telegram
    tg.user_sends("hello, can I use you?", user_id=STRANGER_ID, first_name="Mallory")
    [offer] = await tg.wait_for_messages(1, STRANGER_ID, timeout=10)
    found = CODE.search(offer.text or "")
    assert found, offer.text
    await page.goto("/dashboard/pairing")
    row = page.locator(f'tr[data-code="{found.group(1)}{found.group(2)}"]')  # shown ABCD-EFGH, keyed ABCDEFGH
    await expect(row).to_have_count(1)
    await _submit(row, "approve")
    await expect(row).to_have_count(0)
    await expect(page.locator(f'tr[data-user="telegram:{STRANGER_ID}"]')).to_have_count(1)

    tg.user_sends("are you there?", user_id=STRANGER_ID, first_name="Mallory")
    await eventually(lambda: "Echo: are you there?" in _telegram_texts(running, STRANGER_ID),
                     what="the approved stranger's answer")
    assert not any(t.startswith("Echo: hello") for t in _telegram_texts(running, STRANGER_ID))  # never before


# ------------------------------------------------------------------------------------------------- cron


async def test_a_cron_job_paused_in_the_browser_does_not_fire(running: Running, page: Page,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gateway.dashboard")
    running.telegram.add_chat(DEFAULT_USER_ID)
    job = await running.gateway.cron.create(_job("TICK", "every 1s", chat=str(DEFAULT_USER_ID)), None)
    await eventually(lambda: _fires(running, job.id), what="the job's first fire")  # it does fire while active

    await page.goto("/dashboard/cron")
    row = page.locator(f'tr[data-job-id="{job.id}"]')
    await expect(row.locator("[data-job-state]")).to_have_attribute("data-job-state", "active")
    await _submit(row, "pause")
    await expect(row.locator("[data-job-state]")).to_have_attribute("data-job-state", "paused")
    stored = await running.gateway.cron.get(job.id, None)
    assert stored is not None and stored.state == "paused"
    assert [r for r in caplog.records if r.name == "gateway.dashboard" and OPERATOR in r.getMessage()
            and job.id in r.getMessage()], "the pause was not logged with the operator's name"

    before = await _fires(running, job.id)
    await asyncio.sleep(SETTLE)
    assert await _fires(running, job.id) == before, "a paused job fired"

    await _submit(row, "resume")  # the same job fires again once resumed: it was the pause that held it
    await expect(row.locator("[data-job-state]")).to_have_attribute("data-job-state", "active")
    await eventually(lambda: _fired_since(running, job.id, before), what="a fire after resuming")


async def _fired_since(running: Running, job_id: str, fires: int) -> bool:
    return await _fires(running, job_id) > fires


# ------------------------------------------------------------------------------------------------- runs


def _planned(request: JSON) -> Turn:
    """A tool's result is answered slowly (the run page stays open on a running run); anything else is echoed."""
    last = request["messages"][-1]
    if last["role"] == "tool":
        return text("Planned: " + str(last["content"])[:80], latency=1.0)
    return default_responder(request)


# The first message holds its session for a while; "plan" calls todo; "long" never ends by itself.
SLOW = rules((r"^first", text("First done", latency=1.5)),
             (r"^plan", tool_call("todo", {"action": "add", "items": ["book a venue"]}, latency=0.5)),
             (r"^long", text("too late", latency=60)), fallback=_planned)


async def _run_of(running: Running, prompt: str) -> str:
    """The id of the run whose prompt is ``prompt``, once it exists."""
    async def find() -> str | None:
        return next((r.id for r in await running.gateway.store.list_runs(100) if r.prompt == prompt), None)
    return await eventually(find, what=f"a run for {prompt!r}")


async def test_a_run_is_followed_live_from_queued_to_delivered_with_its_tool_call(running: Running,
                                                                                  page: Page) -> None:
    running.model.responder = SLOW
    tg = running.telegram
    tg.user_sends("first, hold the session")
    await _run_of(running, "first, hold the session")
    tg.user_sends("plan the launch")  # waits behind the first run of the same chat
    run_id = await _run_of(running, "plan the launch")

    loads: list[str] = []
    page.on("load", lambda _: loads.append(page.url))
    await page.goto(f"/dashboard/runs/{run_id}")
    status = page.locator("[data-run-status]")
    seen: list[str] = []
    deadline = time.monotonic() + 15
    while not seen or seen[-1] != "completed":
        assert time.monotonic() < deadline, f"the page showed {seen}"
        shown = (await status.inner_text()).strip()
        if not seen or seen[-1] != shown:
            seen.append(shown)
        await asyncio.sleep(0.03)
    assert seen == ["queued", "running", "completed"], seen
    assert len(loads) == 1, loads  # every change came without a reload

    call = page.locator('[data-tool-call="todo"]')
    await expect(call).to_have_count(1)
    await expect(call).to_contain_text("book a venue")
    delivery = page.locator("[data-delivery]")
    await expect(delivery).to_have_count(1)
    await expect(delivery).to_have_attribute("data-state", "sent")  # the outbox part, delivered
    await eventually(lambda: any(t.startswith("Planned:") for t in _telegram_texts(running, DEFAULT_USER_ID)),
                     what="the answer in Telegram")
    DOCS.mkdir(exist_ok=True)
    await page.screenshot(path=str(DOCS / "dashboard-run.png"), full_page=True)


async def test_a_long_run_is_stopped_from_its_page(running: Running, page: Page) -> None:
    running.model.responder = SLOW
    running.telegram.user_sends("long task, take your time")
    run_id = await _run_of(running, "long task, take your time")
    await eventually(lambda: _status_is(running, run_id, "running"), what="the run to start")

    await page.goto(f"/dashboard/runs/{run_id}")
    stop = page.locator('form[data-action="stop-run"]')
    await expect(stop).to_have_count(1)
    await stop.locator("[type=submit]").click()
    await expect(page.locator("[data-run-status]")).to_have_text("cancelled")
    await eventually(lambda: _status_is(running, run_id, "cancelled"), what="the run cancelled in the store")
    await expect(page.locator('form[data-action="stop-run"]')).to_have_count(0)
    assert "too late" not in _telegram_texts(running, DEFAULT_USER_ID)


async def _status_is(running: Running, run_id: str, status: str) -> bool:
    run = await running.gateway.store.get_run(run_id)
    return run is not None and run.status == status


# ----------------------------------------------------------------------------------------- CSRF, cookie


async def test_state_changes_without_the_cookie_or_the_csrf_token_are_refused(
        running: Running, browser: Browser, page: Page) -> None:
    job = await running.gateway.cron.create(_job("NEVER", "every 1h", chat=str(DEFAULT_USER_ID)), None)
    await page.goto("/dashboard/cron")
    form = page.locator(f'tr[data-job-id="{job.id}"] form[data-action="pause"]')
    action = await form.get_attribute("action")
    csrf = await form.locator("input[name=csrf]").get_attribute("value")
    assert action and csrf
    target = urlsplit(action).path  # relative to the gateway, whatever the form wrote

    async def still_active(response: APIResponse, why: str) -> None:
        assert response.status in (401, 403) or (
            response.status in (302, 303) and urlsplit(response.headers["location"]).path == "/dashboard/login"), \
            (why, response.status)
        stored = await running.gateway.cron.get(job.id, None)
        assert stored is not None and stored.state == "active", why

    stranger = await browser.new_context(base_url=running.url)  # no session cookie, but a valid token
    try:
        await still_active(await stranger.request.post(target, form={"csrf": csrf}, max_redirects=0),
                           "no cookie")
    finally:
        await stranger.close()
    no_token = await page.request.post(target, form={}, max_redirects=0)
    assert no_token.status == 403
    await still_active(no_token, "no CSRF token")
    for wrong in ({"form": {"csrf": csrf[::-1]}}, {"headers": {"X-CSRF-Token": "0" * len(csrf)}}):
        refused = await page.request.post(target, max_redirects=0, **wrong)  # type: ignore[arg-type]
        assert refused.status == 403
        await still_active(refused, f"wrong CSRF token {wrong}")
    await page.request.get(target, max_redirects=0)  # GET never changes state
    await still_active(await page.request.post(target, form={"csrf": "x"}, max_redirects=0), "after a GET")

    # The same request with the page's own token goes through: the token was all that was missing.
    accepted = await page.request.post(target, form={"csrf": csrf}, max_redirects=0)
    assert accepted.status in (200, 204, 302, 303), accepted.status
    stored = await running.gateway.cron.get(job.id, None)
    assert stored is not None and stored.state == "paused"


# -------------------------------------------------------------------------------------------- secrets


async def _populate(running: Running) -> str:
    """Give every page something to show: two chat runs (one with a tool call), a pending pairing code, a cron job,
    a refused and an accepted webhook delivery, and Telegram down with an error. Returns a run id."""
    running.model.responder = rules((r"^plan", tool_call("todo", {"action": "add", "items": ["audit"]})),
                                    fallback=default_responder)
    tg = running.telegram
    tg.user_sends("plan the audit")
    run_id = await _run_of(running, "plan the audit")
    await eventually(lambda: _status_is(running, run_id, "completed"), what="the chat run")
    tg.user_sends("let me in", user_id=STRANGER_ID)
    await tg.wait_for_messages(1, STRANGER_ID, timeout=10)
    await running.gateway.cron.create(_job("REPORT", "every 1h", chat=str(DEFAULT_USER_ID)), None)
    body = json.dumps({"repository": {"full_name": "acme/rocket"}, "head_commit": {"message": "ship"}}).encode()
    secret = CANARIES["platforms.webhook.routes.github.secret"]
    async with aiohttp.ClientSession() as http:
        for key in (secret, "not-the-secret"):
            headers = {"Content-Type": "application/json", "X-GitHub-Event": "push",
                       **sign("github", key, body, delivery_id=f"d-{key[:6]}")}
            async with http.post(f"{running.url}/webhooks/github", data=body, headers=headers) as r:
                assert r.status == (202 if key == secret else 401), await r.text()
    await tg.stop()
    adapter = running.gateway.adapters["telegram"]
    await eventually(lambda: bool(adapter.status()["last_error"]), what="Telegram's error")
    return run_id


class _Served:
    """Everything the browser was served: bodies of documents, scripts, styles and JSON, and event-stream data."""

    def __init__(self) -> None:
        self.texts: list[tuple[str, str]] = []  # (what, text)
        self.streams: list[str] = []
        self._reads: list[asyncio.Task[None]] = []

    def watch(self, page: Page) -> None:
        page.on("response", lambda r: self._reads.append(asyncio.ensure_future(self._read(r))))

    async def _read(self, response: Response) -> None:
        headers = await response.all_headers()
        self.texts.append((f"headers of {response.url}", json.dumps(headers)))
        if "text/event-stream" in headers.get("content-type", ""):
            self.streams.append(response.url)  # read through an EventSource below: it never ends
        elif response.status not in (301, 302, 303, 307, 308):
            self.texts.append((response.url, (await response.body()).decode("utf-8", "replace")))

    async def settle(self) -> None:
        await asyncio.gather(*self._reads)
        self._reads.clear()


async def _crawl(page: Page, served: _Served, start: list[str]) -> list[str]:
    """Visit ``start`` and every /dashboard page linked from what was visited (GET only); the paths visited."""
    queue, seen = list(start), set(start)
    while queue:
        path = queue.pop(0)
        await page.goto(path)
        await page.wait_for_load_state("networkidle")
        for href in await page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))"):
            link = urlsplit(href)
            target = link.path + (f"?{link.query}" if link.query else "")
            if link.netloc in ("", urlsplit(page.url).netloc) and link.path.startswith("/dashboard") \
                    and not link.path.startswith(("/dashboard/events", "/dashboard/logout")) and target not in seen:
                seen.add(target)
                queue.append(target)
    await served.settle()
    return sorted(seen)


# The raw event stream as the browser receives it (every event, whatever its name), for ``ms`` milliseconds.
_READ_STREAM = """async ([url, ms]) => {
  const response = await fetch(url, {headers: {Accept: "text/event-stream"}});
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let text = "";
  const stop = Date.now() + ms;
  while (Date.now() < stop) {
    const next = await Promise.race([reader.read(), new Promise((r) => setTimeout(() => r(null), stop - Date.now()))]);
    if (next === null || next.done) break;
    text += decoder.decode(next.value, {stream: true});
  }
  await reader.cancel();
  return [response.status, response.headers.get("content-type"), text];
}"""


async def test_no_page_or_response_contains_a_configured_secret(running: Running, browser: Browser,
                                                                page: Page) -> None:
    run_id = await _populate(running)
    secrets = running.secrets()
    configured = set(running.gateway.cfg.secret_values())
    assert set(CANARIES.values()) <= configured, set(CANARIES.values()) - configured  # the config knows them all

    served = _Served()
    served.watch(page)
    anonymous = await browser.new_context(base_url=running.url)  # the login form as a visitor sees it
    try:
        login = await anonymous.new_page()
        served.watch(login)
        await login.goto("/dashboard/login")
        await login.wait_for_load_state("networkidle")
        await served.settle()
    finally:
        await anonymous.close()
    pages = ["/dashboard/", "/dashboard/runs", f"/dashboard/runs/{run_id}", "/dashboard/sessions",
             "/dashboard/cron", "/dashboard/pairing", "/dashboard/webhooks", "/dashboard/config"]
    visited = await _crawl(page, served, pages)
    assert set(pages) <= set(visited)

    # Every event stream the pages opened, read as the browser receives it while a run comes and goes.
    streams = sorted({(u := urlsplit(url)).path + (f"?{u.query}" if u.query else "") for url in served.streams})
    assert "/dashboard/events" in streams and any("run=" in s for s in streams), streams  # overview and run pages
    running.model.responder = default_responder
    reading = asyncio.gather(*(page.evaluate(_READ_STREAM, [path, 2500]) for path in streams))
    await asyncio.sleep(0.5)
    await running.slack.user_sends_dm("anything new?")
    for path, (status, content_type, stream) in zip(streams, await reading, strict=True):
        assert (status, content_type.split(";")[0]) == (200, "text/event-stream"), path
        assert "data:" in stream, f"{path} sent nothing in 2.5 s: {stream!r}"
        served.texts.append((path, stream))

    leaks = [(what, name) for what, body in served.texts for name, secret in secrets.items() if secret in body]
    assert leaks == [], leaks
    assert len(served.texts) > 2 * len(pages)
