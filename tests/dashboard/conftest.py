"""Fixtures of the dashboard's browser tests: Debian's chromium driven by Playwright, and a gateway with the dashboard
on, its three chat platforms against their simulators, the scripted model, and a canary value in every secret key.

The tests run on one event loop for the session (the browser lives on it); see ``pytestmark`` in test_browser.py.
"""

from __future__ import annotations

import asyncio
import inspect
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, Page, async_playwright

from gateway.app import Gateway
from gateway.config import parse_config
from gateway.sim.discord_api import ALICE_ID, DiscordSimulator
from gateway.sim.model_server import ScriptedModel
from gateway.sim.slack_api import DEFAULT_USER, SlackSimulator
from gateway.sim.telegram_api import DEFAULT_USER_ID, TelegramSimulator
from platforms.base import AdapterState
from tests.conftest import base_config, deep_merge
from tests.platforms.test_discord import (
    BACKOFF,
    HEARTBEAT_MS,
    HEARTBEAT_TIMEOUT,
    _discord_endpoints,  # noqa: F401 (autouse: discord.py's process-wide URLs restored after each test)
)

CHAT_PLATFORMS = ("telegram", "slack", "discord")
OPERATOR = "alice"
# One canary per secret key the config has; each carries a tag ("cnryNN") found nowhere else, so a page that shows
# part of a secret is caught too. The Telegram and Slack tokens keep the shapes the config validates.
CANARIES: dict[str, str] = {
    "http.api_token": "cnry01-http-api-token-e7c1d2",
    "http.dashboard.operators.alice": "cnry02-operator-alice-token-5b9a",
    "http.api.clients.ci.key": "cnry03-api-client-key-80f4",
    "model.api_key": "sk-cnry04-model-api-key-3d2e",
    "platforms.telegram.token": "424242:cnry05-telegram-bot-token",
    "platforms.telegram.webhook_secret": "cnry06-telegram-webhook-secret",
    "platforms.slack.bot_token": "xoxb-cnry07-slack-bot-token",
    "platforms.slack.app_token": "xapp-cnry08-slack-app-token",
    "platforms.slack.signing_secret": "cnry09-slack-signing-secret",
    "platforms.discord.token": "MTAwMA.cnry10.discord-bot-token",
    "platforms.webhook.routes.github.secret": "cnry11-webhook-route-secret",
    "platforms.callback.targets.sink.secret": "cnry12-callback-target-secret",
    "platforms.github.token": "ghp_cnry13githubforgetoken",
    "platforms.gitlab.token": "glpat-cnry14-gitlab-forge-token",
    "mcp_servers.vault.headers.Authorization": "Bearer cnry15-mcp-header-secret",
}


def canary_tags() -> dict[str, str]:
    """Each canary's tag (``cnryNN``) by its key."""
    return {key: value[value.index("cnry"):][:6] for key, value in CANARIES.items()}


def _config(home: Path, model: ScriptedModel, tg: TelegramSimulator, slack: SlackSimulator,
            discord: DiscordSimulator) -> dict[str, Any]:
    c = CANARIES
    return deep_merge(base_config(home, model.base_url or "", "http://127.0.0.1:9/results"), {
        "model": {"api_key": c["model.api_key"]},
        "http": {"api_token": c["http.api_token"],
                 "api": {"clients": {"ci": {"key": c["http.api.clients.ci.key"]}}},
                 "dashboard": {"enabled": True, "operators": {OPERATOR: c["http.dashboard.operators.alice"]}}},
        "auth": {"dm_pairing": True,
                 "platforms": {"telegram": {"allowed_users": [str(DEFAULT_USER_ID)]},
                               "slack": {"allowed_users": [DEFAULT_USER]},
                               "discord": {"allowed_users": [str(ALICE_ID)]}}},
        "cron": {"min_interval_seconds": 1, "sync_interval_seconds": 0.5},
        "platforms": {
            "telegram": {"enabled": True, "token": tg.token, "base_url": tg.base_url,
                         "base_file_url": tg.base_file_url, "poll_timeout": 1,
                         "webhook_secret": c["platforms.telegram.webhook_secret"]},
            "slack": {"enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
                      "signing_secret": slack.signing_secret, "api_base_url": slack.base_url, "ping_interval": 0.2},
            "discord": {"enabled": True, "token": discord.token, "api_base_url": discord.api_base_url,
                        "guild_ready_timeout": 0.05, "heartbeat_timeout": HEARTBEAT_TIMEOUT,
                        "reconnect_backoff": BACKOFF},
            "webhook": {"routes": {"github": {"secret": c["platforms.webhook.routes.github.secret"]}}},
            "callback": {"targets": {"sink": {"secret": c["platforms.callback.targets.sink.secret"]}}},
            "github": {"token": c["platforms.github.token"]},
            "gitlab": {"token": c["platforms.gitlab.token"]},
        },
        # An MCP server nobody listens for: its header is a configured secret, its connection error shows up.
        "mcp_servers": {"vault": {"url": "http://127.0.0.1:9/mcp",
                                  "headers": {"Authorization": c["mcp_servers.vault.headers.Authorization"]}}},
    })


@dataclass
class Running:
    """A started gateway with the dashboard on, the simulators it talks to, and the scripted model."""

    gateway: Gateway
    model: ScriptedModel
    telegram: TelegramSimulator
    slack: SlackSimulator
    discord: DiscordSimulator

    @property
    def url(self) -> str:
        """The gateway's HTTP root, e.g. ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.gateway.port}"

    def secrets(self) -> dict[str, str]:
        """What no response may contain, by name: every secret the config lists, and each canary's tag."""
        named = {value: key for key, value in CANARIES.items()}
        found = {named.get(value, f"configured secret #{i}"): value
                 for i, value in enumerate(self.gateway.cfg.secret_values())}
        return {**found, **{f"{key} (its tag)": tag for key, tag in canary_tags().items()}}


async def eventually(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Call ``check`` (a function, or one returning a coroutine) until it gives something truthy, and return that;
    fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := await got if inspect.isawaitable(got := check()) else got):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)
    return result


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    """Debian's chromium (never a browser Playwright downloads), headless, for the whole session."""
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("chromium is not installed: the dashboard's browser tests drive Debian's chromium "
                    "(apt-get install chromium; .ci/run installs it)")
    async with async_playwright() as pw:
        # Playwright passes --no-sandbox itself (its chromium_sandbox defaults to False), which chromium needs when
        # the tests run as root, as in CI containers.
        browser = await pw.chromium.launch(executable_path=executable, headless=True)
        yield browser
        await browser.close()


@pytest_asyncio.fixture(loop_scope="session")
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    """The gateway with the dashboard on, once Telegram, Slack and Discord are all connected."""
    c = CANARIES
    model = ScriptedModel(api_key=c["model.api_key"])
    await model.start()
    tg = TelegramSimulator(token=c["platforms.telegram.token"])
    await tg.start()
    slack = SlackSimulator(bot_token=c["platforms.slack.bot_token"], app_token=c["platforms.slack.app_token"],
                           signing_secret=c["platforms.slack.signing_secret"])
    await slack.start()
    discord = DiscordSimulator(c["platforms.discord.token"], heartbeat_interval=HEARTBEAT_MS)
    await discord.start()
    cfg = parse_config(_config(tmp_path, model, tg, slack, discord), env={"HERMES_GATEWAY_HOME": str(tmp_path)})
    gateway = Gateway(cfg)
    try:
        await gateway.start()
        await eventually(lambda: all(gateway.adapters[p].state is AdapterState.CONNECTED for p in CHAT_PLATFORMS),
                         what="Telegram, Slack and Discord connected")
        yield Running(gateway, model, tg, slack, discord)
    finally:
        await gateway.stop(drain_timeout=1)
        await discord.stop()
        await slack.stop()
        await tg.stop()
        await model.stop()


async def log_in(page: Page, token: str) -> None:
    """Open the login form on ``page``, type ``token`` and submit it (where that lands is the caller's to check)."""
    await page.goto("/dashboard/login")
    await page.fill("form#login input[name=token]", token)
    await page.click("form#login button[type=submit]")


@pytest_asyncio.fixture(loop_scope="session")
async def context(browser: Browser, running: Running) -> AsyncIterator[BrowserContext]:
    """A fresh browser profile (no cookies) whose relative URLs go to the gateway."""
    ctx = await browser.new_context(base_url=running.url, viewport={"width": 1280, "height": 860})
    ctx.set_default_timeout(10_000)
    yield ctx
    await ctx.close()


@pytest_asyncio.fixture(loop_scope="session")
async def page(context: BrowserContext) -> Page:
    """A page logged in to the dashboard as operator ``alice``, on the overview."""
    page = await context.new_page()
    await log_in(page, CANARIES["http.dashboard.operators.alice"])
    await page.wait_for_url("**/dashboard/")
    return page
