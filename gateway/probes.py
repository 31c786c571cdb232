"""Checks of a gateway's configuration: what the loader accepts but will not work, and live probes of every
service it talks to, each a :class:`CheckResult` (ok / warn / fail, one line, the fix).

``hermes-gateway setup`` probes the answers it is given, ``doctor`` runs every check against a config and
``check`` shows the static findings (``config_findings``) without contacting anything.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import sqlite3
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import aiohttp
import openai
import sqlalchemy as sa
from pydantic import SecretStr

from gateway.config import (
    Config,
    ConfigError,
    DiscordPlatform,
    HttpSettings,
    McpServer,
    ModelSettings,
    SlackPlatform,
    StoreSettings,
    TelegramPlatform,
)
from gateway.model_errors import exception_chain
from gateway.schema import SCHEMA_VERSION
from platforms.webhook_signatures import sign

Status = Literal["ok", "warn", "fail"]
_SLACK_AUTH_ERRORS = frozenset({"invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired",
                                "not_allowed_token_type"})


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check's outcome: ``message`` says what was found, ``fix`` what to do about it (empty when ok)."""

    check: str
    status: Status
    message: str
    fix: str = ""

    def line(self) -> str:
        """``ok    model: ...`` (with ``; fix: ...`` when there is one)."""
        fix = f"; fix: {self.fix}" if self.fix else ""
        return f"{self.status:<4}  {self.check}: {self.message}{fix}"

    def to_json(self) -> dict[str, str]:
        """The result as a JSON object (``doctor --json``)."""
        return {"check": self.check, "status": self.status, "message": self.message, "fix": self.fix}


def _ok(check: str, message: str) -> CheckResult:
    return CheckResult(check, "ok", message)


def _fail(check: str, message: str, fix: str) -> CheckResult:
    return CheckResult(check, "fail", message, fix)


# -- why a connection failed ---------------------------------------------------------------------------------


def _where(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc or url


def network_cause(exc: BaseException, url: str) -> str | None:
    """The real reason a request to ``url`` failed (connection refused, DNS, TLS), read from the exception chain:
    the SDKs' own classes hide it (openai calls a refused connection a timeout); None when it is none of those."""
    where = _where(url)
    for cause in exception_chain(exc):
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"TLS certificate of {where} not trusted ({cause.verify_message})"
        if isinstance(cause, ssl.SSLError):
            # aiohttp's ClientConnectorSSLError is an SSLError too, without ssl's attributes
            detail = getattr(cause, "reason", None) or getattr(cause, "os_error", None) or cause
            return f"TLS handshake with {where} failed ({detail})"
        if isinstance(cause, socket.gaierror):
            return f"DNS lookup of {urlsplit(url).hostname} failed ({cause.strerror})"
        if isinstance(cause, ConnectionRefusedError):
            return f"connection refused by {where}"
    return None


def _fix_for(cause: str, setting: str) -> str:
    if cause.startswith("connection refused"):
        return f"start the server there, or correct {setting}"
    if cause.startswith("DNS"):
        return f"check the host name in {setting} and this machine's DNS"
    if cause.startswith("TLS"):
        return f"use http:// in {setting} for a server without TLS, or give the server a trusted certificate"
    return f"check {setting} and the network"


def _unreachable(check: str, exc: BaseException, url: str, setting: str, timeout: float) -> CheckResult:
    cause = network_cause(exc, url)
    if cause is None:
        timed_out = any(isinstance(c, TimeoutError) or "Timeout" in type(c).__name__ for c in exception_chain(exc))
        cause = f"no answer from {_where(url)} within {timeout:g} s" if timed_out else \
            f"cannot reach {_where(url)} ({type(exc).__name__}: {exc})"
    return _fail(check, cause, _fix_for(cause, setting))


# -- the model -----------------------------------------------------------------------------------------------


async def probe_model(model: ModelSettings, timeout: float = 10.0) -> CheckResult:
    """A one-token chat completion against ``model.base_url`` with ``model.name``."""
    from gateway.agent_loop import build_client, post_chat_completion  # the tool pipeline: only when a model is probed

    check, url = "model", model.base_url
    settings = model.model_copy(update={"max_retries": 0, "timeout": timeout,
                                        "connect_timeout": min(model.connect_timeout, timeout)})
    body = {"model": model.name, "messages": [{"role": "user", "content": "Reply with OK."}], "max_tokens": 1}
    started = time.perf_counter()
    async with build_client(settings, max_connections=1) as client:
        try:
            try:
                await post_chat_completion(client, body)
            except openai.BadRequestError as exc:
                if "max_tokens" not in exc.message:
                    raise
                # Newer OpenAI models refuse max_tokens and take max_completion_tokens instead.
                body = {key: value for key, value in body.items() if key != "max_tokens"}
                await post_chat_completion(client, {**body, "max_completion_tokens": 1})
        except openai.APIStatusError as exc:
            return await _model_refused(client, model, exc)
        except openai.APIConnectionError as exc:
            return _unreachable(check, exc, url, "model.base_url", timeout)
    return _ok(check, f"{model.name} at {url} answered in {(time.perf_counter() - started) * 1000:.0f} ms")


async def _model_refused(client: openai.AsyncOpenAI, model: ModelSettings, exc: openai.APIStatusError
                         ) -> CheckResult:
    body = exc.body if isinstance(exc.body, dict) else {}
    status, detail = exc.status_code, str(body.get("message") or exc.message)
    if isinstance(exc, openai.AuthenticationError):
        return _fail("model", f"the API key was rejected (401 from {model.base_url})",
                     "set model.api_key to a valid key for this server")
    if isinstance(exc, openai.PermissionDeniedError):
        return _fail("model", f"access denied (403): {detail}", f"check that the key may use {model.name}")
    if isinstance(exc, openai.NotFoundError):
        if exc.code != "model_not_found" and "model" not in detail.lower():
            return _fail("model", f"404 Not Found at {model.base_url}/chat/completions",
                         "check model.base_url (OpenAI-compatible servers usually end in /v1)")
        try:
            names = sorted(m.id for m in (await client.models.list()).data)
        except openai.OpenAIError:
            names = []
        listed = f"one of: {', '.join(names[:10])}" if names else "a model this server serves (GET /models)"
        return _fail("model", f"model {model.name!r} not found (404)", f"set model.name to {listed}")
    if isinstance(exc, openai.RateLimitError):
        if exc.code == "insufficient_quota":
            return _fail("model", f"out of quota (429): {detail}", "check the account's plan and billing")
        return CheckResult("model", "warn", f"rate limited (429): {detail}", "try again later; check the rate limits")
    return _fail("model", f"the server answered HTTP {status}: {detail}", "check model.base_url and model.name")


# -- chat platforms ------------------------------------------------------------------------------------------


def _secret(value: SecretStr | None) -> str:
    return value.get_secret_value() if value is not None else ""


async def probe_telegram(tg: TelegramPlatform, timeout: float = 10.0) -> CheckResult:
    """``getMe`` with python-telegram-bot's ``Bot`` on the configured base URLs."""
    from telegram import Bot
    from telegram.error import InvalidToken, TelegramError
    from telegram.request import HTTPXRequest

    check = "telegram"
    request = HTTPXRequest(connect_timeout=timeout, read_timeout=timeout, write_timeout=timeout, pool_timeout=timeout)
    bot = Bot(_secret(tg.token), base_url=tg.base_url, base_file_url=tg.base_file_url, request=request)
    try:
        async with bot:  # initialize: getMe
            me = bot.bot
    except InvalidToken as exc:
        # PTB says InvalidToken for 401 (a token Telegram does not know) and for 404 (wrong URL or token form).
        cause = exc.__cause__ if isinstance(exc.__cause__, TelegramError) else exc
        if "not found" in cause.message.lower():
            return _fail(check, f"the Bot API answered 404 Not Found at {tg.base_url}",
                         "check platforms.telegram.base_url (it ends in /bot) and the token")
        return _fail(check, "the bot token was rejected (getMe: 401 Unauthorized)",
                     "copy the token again from @BotFather into platforms.telegram.token")
    except TelegramError as exc:
        return _unreachable(check, exc, tg.base_url, "platforms.telegram.base_url", timeout)
    return _ok(check, f"bot @{me.username} (id {me.id})")


async def probe_slack(sl: SlackPlatform, timeout: float = 10.0) -> CheckResult:
    """``auth.test`` with the bot token (and in Socket Mode ``apps.connections.open`` with the app token)."""
    from slack_sdk.errors import SlackApiError
    from slack_sdk.web.async_client import AsyncWebClient

    check = "slack"

    def client(token: object) -> AsyncWebClient:
        return AsyncWebClient(token=_secret(token), base_url=sl.api_base_url, timeout=max(1, round(timeout)))

    method, key = "auth.test", "bot_token"
    try:
        auth = await client(sl.bot_token).auth_test()
        if sl.mode == "socket":
            method, key = "apps.connections.open", "app_token"
            await client(sl.app_token).apps_connections_open(app_token=_secret(sl.app_token))
    except SlackApiError as exc:
        error = exc.response.get("error", "unknown error")
        if error in _SLACK_AUTH_ERRORS:
            what = "bot token" if key == "bot_token" else "app-level token"
            return _fail(check, f"the {what} was rejected ({method}: {error})",
                         f"copy it again from the Slack app settings into platforms.slack.{key}")
        return _fail(check, f"{method} failed ({error})", "check platforms.slack.api_base_url and Slack's status")
    except (aiohttp.ClientError, TimeoutError) as exc:
        return _unreachable(check, exc, sl.api_base_url, "platforms.slack.api_base_url", timeout)
    mode = "Socket Mode app token accepted" if sl.mode == "socket" else "http mode"
    return _ok(check, f"bot {auth.get('user')} in workspace {auth.get('team')} ({mode})")


async def probe_discord(dc: DiscordPlatform, timeout: float = 10.0) -> CheckResult:
    """``GET /users/@me`` with the bot token on the configured API base."""
    check, url = "discord", f"{dc.api_base_url}/users/@me"
    headers = {"Authorization": f"Bot {_secret(dc.token)}", "User-Agent": "DiscordBot (hermes-gateway doctor, 1)"}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http, \
                http.get(url, headers=headers) as response:
            if response.status == 401:
                return _fail(check, "the bot token was rejected (GET /users/@me: 401 Unauthorized)",
                             "copy it again from the Developer Portal (Bot > Token) into platforms.discord.token")
            if response.status != 200:
                return _fail(check, f"GET /users/@me answered HTTP {response.status} at {dc.api_base_url}",
                             "check platforms.discord.api_base_url (a v10 API, e.g. https://discord.com/api/v10)")
            me = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return _unreachable(check, exc, dc.api_base_url, "platforms.discord.api_base_url", timeout)
    return _ok(check, f"bot {me.get('username')} (id {me.get('id')})")


PLATFORM_PROBES: dict[str, Callable[..., Awaitable[CheckResult]]] = {
    "telegram": probe_telegram, "slack": probe_slack, "discord": probe_discord}
"""Each chat platform's token check, called with its config section and a timeout."""


async def probe_platforms(cfg: Config, timeout: float = 10.0) -> list[CheckResult]:
    """The enabled chat platforms' token checks, concurrently, in a fixed order."""
    return list(await asyncio.gather(*(probe(getattr(cfg.platforms, name), timeout)
                                       for name, probe in PLATFORM_PROBES.items()
                                       if getattr(cfg.platforms, name).enabled)))


# -- local resources -----------------------------------------------------------------------------------------


async def probe_http_port(http: HttpSettings, timeout: float = 5.0) -> CheckResult:
    """Whether ``http.host:http.port`` is free, or held by a running gateway (its ``/healthz`` answers)."""
    check, where = "http port", f"{http.host}:{http.port}"
    if http.port == 0:
        return _ok(check, "port 0: the gateway listens on a free port it picks at start")
    try:
        socket.create_server((http.host, http.port)).close()  # SO_REUSEADDR, as aiohttp listens
        return _ok(check, f"{where} is free")
    except OSError as exc:
        if exc.errno == errno.EACCES:
            return _fail(check, f"not allowed to listen on {where}", "use a port above 1023 in http.port")
        if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
            return _fail(check, f"{http.host} is not an address of this machine", "set http.host, e.g. 127.0.0.1")
        if exc.errno != errno.EADDRINUSE:
            return _fail(check, f"cannot listen on {where} ({exc.strerror})", "check http.host and http.port")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(http.host, http.host)
    url = f"http://{f'[{host}]' if ':' in host else host}:{http.port}/healthz"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session, \
                session.get(url) as response:
            health = await response.json(content_type=None) if response.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        health = None
    if isinstance(health, dict) and health.get("status") == "ok":
        return _ok(check, f"{where} is held by a running gateway (/healthz ok)")
    return _fail(check, f"{where} is in use by another program (not a gateway: no /healthz)",
                 "stop that program, or set http.port to a free port")


def _sqlite_file(url: str) -> Path | None:
    scheme, sep, rest = url.partition(":///")
    return Path(rest).expanduser() if sep and scheme.startswith("sqlite") else None


def _schema_version(conn: sa.Connection) -> int | None:
    if not sa.inspect(conn).has_table("meta"):
        return None
    row = conn.execute(sa.text("SELECT value FROM meta WHERE key = 'schema_version'")).first()
    return int(row[0]) if row is not None else None


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


async def probe_store(store: StoreSettings) -> CheckResult:
    """The database answers, is writable, and its schema is this gateway's (opened without migrating it)."""
    check = "store"
    file = _sqlite_file(store.url)
    if file is not None:
        if not file.exists():
            parent = _existing_parent(file.parent)
            if not os.access(parent, os.W_OK):
                return _fail(check, f"cannot create {file}: {parent} is not writable",
                             "make it writable for this user, or change store.url")
            return _ok(check, f"{file} does not exist yet: `hermes-gateway run` creates it")
        if not (os.access(file, os.R_OK | os.W_OK) and os.access(file.parent, os.W_OK)):
            return _fail(check, f"{file} (or its directory, for the write-ahead log) is not writable",
                         "make both writable for the gateway's user")
        engine = sa.create_engine(f"sqlite:///file:{file}?mode=ro&uri=true")  # never writes, never creates
        try:
            version = await asyncio.to_thread(_read_sqlite_version, engine)
        except (sa.exc.SQLAlchemyError, sqlite3.Error) as exc:
            return _fail(check, f"cannot read {file} ({type(exc).__name__}: {exc})", "check store.url")
        return _schema_result(version, writable=True)
    from gateway.db import Database

    db = Database.connect(store.url)
    try:
        version, writable = await db.read(_postgres_state)
    except (sa.exc.SQLAlchemyError, OSError) as exc:
        return _fail(check, f"cannot read the database ({type(exc).__name__}: {exc})",
                     "check store.url and that the server is running")
    finally:
        await db.close()
    return _schema_result(version, writable)


def _read_sqlite_version(engine: sa.Engine) -> int | None:
    try:
        with engine.connect() as conn:
            return _schema_version(conn)
    finally:
        engine.dispose()


def _postgres_state(conn: sa.Connection) -> tuple[int | None, bool]:
    version = _schema_version(conn)
    privilege = "SELECT has_schema_privilege(current_schema(), 'CREATE')" if version is None else \
        "SELECT has_table_privilege('meta', 'UPDATE')"
    return version, bool(conn.execute(sa.text(privilege)).scalar())


def _schema_result(version: int | None, writable: bool) -> CheckResult:
    check = "store"
    if not writable:
        return _fail(check, "the database user may not write", "grant it INSERT, UPDATE and DELETE on the tables")
    if version is None:
        return _ok(check, "empty database: `hermes-gateway run` creates the tables")
    if version > SCHEMA_VERSION:
        return _fail(check, f"schema v{version} is newer than this gateway (v{SCHEMA_VERSION})",
                     "upgrade hermes-gateway, or point store.url at this version's database")
    if version < SCHEMA_VERSION:
        return CheckResult(check, "warn", f"schema v{version}, writable: `hermes-gateway run` migrates it to "
                           f"v{SCHEMA_VERSION}", "back the database up before the first start of this version")
    return _ok(check, f"schema v{version}, writable")


async def probe_mcp(servers: dict[str, McpServer]) -> list[CheckResult]:
    """Each MCP server started (or connected to) once, its tools listed."""
    from gateway.mcp_service import server_specs
    from tools.mcp_tool import probe

    specs = server_specs(servers)
    results = await asyncio.gather(*(probe(spec) for spec in specs))
    return [_ok(f"mcp {spec.name}", f"{spec.transport} server answered in {r.seconds:.2f} s with {len(r.tools)} tools")
            if r.ok else _fail(f"mcp {spec.name}", f"{spec.transport} server: {r.error}",
                               f"check mcp_servers.{spec.name}; try `hermes-gateway mcp test {spec.name}`")
            for spec, r in zip(specs, results, strict=True)]


def sandbox_result(cfg: Config, config_path: Path | None) -> CheckResult:
    """The tool isolation this machine gives ``tools.sandbox``."""
    from gateway.tool_sandbox import detect_isolation

    check = "tool sandbox"
    try:
        isolation = detect_isolation(cfg, config_path)
    except ConfigError as exc:
        return _fail(check, exc.message, exc.hint)
    if isolation.level == "none":
        return CheckResult(check, "warn", isolation.describe(), "set tools.sandbox: auto to isolate tools")
    if not isolation.available:
        return CheckResult(check, "warn", isolation.describe(),
                           "install bubblewrap (apt install bubblewrap) or allow unprivileged user namespaces")
    return _ok(check, isolation.describe())


# -- static findings -----------------------------------------------------------------------------------------


def _enabled(cfg: Config, platform: str) -> bool:
    if platform == "callback":
        return True  # targets are checked by the config loader
    return bool(getattr(cfg.platforms, platform).enabled)


def config_findings(cfg: Config) -> list[CheckResult]:
    """What the config loader accepts but will not work: webhook secrets the route's scheme cannot use, a
    ``deliver_to`` naming a disabled platform, a chat platform nobody may talk to. One result per route and
    per enabled chat platform."""
    results: list[CheckResult] = []
    webhook = cfg.platforms.webhook
    for name, route in webhook.routes.items():
        check, key = f"webhook {name}", f"platforms.webhook.routes.{name}"
        delivery = route.delivery
        try:
            for secret in route.secrets():
                sign(route.scheme, secret, b"")  # the verifier derives its key the same way
        except ValueError as exc:
            results.append(_fail(check, f"{key}.secret: {exc}",
                                 "copy the whole secret from the sender (whsec_ and base64), or use a plain string"))
        else:
            if delivery is not None and not _enabled(cfg, delivery[0]):
                results.append(_fail(check, f"deliver_to {route.deliver_to} names {delivery[0]}, which is not enabled",
                                     f"enable platforms.{delivery[0]}, or change {key}.deliver_to"))
            elif not webhook.enabled:
                results.append(CheckResult(check, "warn", "platforms.webhook.enabled is false: the route is not served",
                                           "set platforms.webhook.enabled: true, or remove the route"))
            else:
                results.append(_ok(check, f"POST /webhooks/{name}, {route.scheme} signatures, delivers to "
                                          f"{route.deliver_to}"))
    for platform in PLATFORM_PROBES:
        if _enabled(cfg, platform):
            results.append(_auth_finding(cfg, platform))
    return results


def _auth_finding(cfg: Config, platform: str) -> CheckResult:
    auth = cfg.auth
    rules = auth.platforms.get(platform)
    admins = [a for a in auth.admins if a.startswith(f"{platform}:")]
    ways = [*(["everyone (allow_all)"] if rules and rules.allow_all else []),
            *([f"{len(rules.allowed_users)} allowed users"] if rules and rules.allowed_users else []),
            *([f"{len(rules.allowed_chats)} allowed chats"] if rules and rules.allowed_chats else []),
            *([f"{len(admins)} admins"] if admins else []), *(["DM pairing"] if auth.dm_pairing else [])]
    check = f"{platform} access"
    if not ways:
        return CheckResult(check, "warn", "nobody may talk to the bot (deny by default)",
                           f"set auth.dm_pairing: true, or list users in auth.platforms.{platform}.allowed_users")
    return _ok(check, ", ".join(ways))


# -- everything ----------------------------------------------------------------------------------------------


async def all_checks(cfg: Config, config_path: Path | None, timeout: float = 10.0) -> list[CheckResult]:
    """Every check of ``hermes-gateway doctor``, the live ones concurrently, in a fixed order."""
    model, platforms, port, store, mcp, sandbox = await asyncio.gather(
        probe_model(cfg.model, timeout), probe_platforms(cfg, timeout), probe_http_port(cfg.http, timeout),
        probe_store(cfg.store), probe_mcp(cfg.mcp_servers), asyncio.to_thread(sandbox_result, cfg, config_path))
    return [model, *platforms, *config_findings(cfg), port, store, *mcp, sandbox]
