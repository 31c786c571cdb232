"""Gateway configuration: one YAML file, ``${VAR}`` interpolation, typed and validated settings.

Every problem surfaces as a :class:`ConfigError` naming the dotted key path, what is wrong and how
to fix it; all problems found in one pass are reported together.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import zoneinfo
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Self, get_args
from urllib.parse import unquote, urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from toolsets import ALL_NAMES, TOOLSETS, resolve_toolset, validate_toolset

__all__ = [
    "AuthSettings",
    "CallbackPlatform",
    "CallbackTarget",
    "Config",
    "ConfigError",
    "CronSettings",
    "DiscordPlatform",
    "GatewaySettings",
    "HttpSettings",
    "LoggingSettings",
    "McpServer",
    "ModelSettings",
    "PlatformAuth",
    "Platforms",
    "PluginSettings",
    "SlackPlatform",
    "StoreSettings",
    "TelegramPlatform",
    "TelegramRateLimit",
    "ToolSearchSettings",
    "WebSettings",
    "WebhookPlatform",
    "WebhookRoute",
    "default_config",
    "gateway_home",
    "load_config",
    "parse_config",
]

_CHAT_PLATFORMS = ("telegram", "discord", "slack")
_DELIVERY_PLATFORMS = (*_CHAT_PLATFORMS, "callback")
_TOOLSET_PLATFORMS = (*_CHAT_PLATFORMS, "webhook", "cron")
_PLUGIN_PREFIXES = ("mcp-", "plugin-")
# Field names whose values must never be echoed in an error message.
_SECRET_FIELDS = frozenset({"api_key", "api_token", "secret", "token", "webhook_secret", "bot_token", "app_token",
                            "signing_secret"})
_ROUTE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MCP_SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")
_TELEGRAM_TOKEN = re.compile(r"\d+:[A-Za-z0-9_-]+")
_TELEGRAM_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")
_STORE_FORMS = ("sqlite:///PATH, sqlite+aiosqlite:///PATH, postgresql://USER:PASSWORD@HOST/DB "
                "or postgresql+asyncpg://USER:PASSWORD@HOST/DB")


class ConfigError(Exception):
    """A configuration problem: dotted key ``path`` ("" for the file itself), ``message`` and ``hint``.

    When several problems are found at once, ``errors`` lists each and ``str()`` puts one per line;
    for a single problem ``errors == [self]``.
    """

    def __init__(self, path: str = "", message: str = "", hint: str = "",
                 errors: Sequence[ConfigError] = ()) -> None:
        self.path = path
        self.message = message
        self.hint = hint
        self.errors: list[ConfigError] = list(errors) or [self]
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.errors[0] is not self:
            return "\n".join(str(e) for e in self.errors)
        head = ": ".join(part for part in (self.path, self.message) if part)
        return f"{head} ({self.hint})" if self.hint else head

    @classmethod
    def combine(cls, errors: Sequence[ConfigError]) -> ConfigError:
        """One error as itself; several as one error listing them all."""
        if len(errors) == 1:
            return errors[0]
        return cls(message=f"{len(errors)} configuration errors", errors=errors)


# --- validation plumbing -------------------------------------------------------------------------

_Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class _Problem:
    loc: _Loc  # relative to the value being validated
    message: str
    hint: str = ""


class _Invalid(ValueError):
    """Raised by validators; pydantic keeps it in the error's ctx, so our path, message and hint survive."""

    def __init__(self, *problems: _Problem) -> None:
        super().__init__("; ".join(p.message for p in problems))
        self.problems = problems


def _invalid(message: str, hint: str = "", loc: _Loc = ()) -> _Invalid:
    return _Invalid(_Problem(loc, message, hint))


@dataclass(frozen=True, slots=True)
class _Context:
    env: Mapping[str, str]
    base_dir: Path  # relative paths in the config are resolved against this


def _context(info: ValidationInfo) -> _Context:
    ctx = info.context
    return ctx if isinstance(ctx, _Context) else _Context(os.environ, Path.cwd())


def _resolve_path(path: Path, info: ValidationInfo) -> Path:
    path = path.expanduser()
    return path if path.is_absolute() else _context(info).base_dir / path


def _suggest(word: str, choices: Sequence[str], *, allowed: bool = True) -> str:
    """A hint of the form ``did you mean 'x'? allowed: a, b``."""
    close = difflib.get_close_matches(word, choices, n=1)
    parts = [f"did you mean {close[0]!r}?"] if close else []
    if allowed:
        parts.append(f"allowed: {', '.join(sorted(choices))}")
    return " ".join(parts)


def _one_of(allowed: tuple[str, ...], what: str) -> AfterValidator:
    def check(value: str) -> str:
        if value not in allowed:
            raise _invalid(f"unknown {what}", _suggest(value, allowed))
        return value
    return AfterValidator(check)


def _str_or_list(value: Any) -> Any:
    # Checked up front so a bad value gets one clear error instead of one per union member.
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(item, str | SecretStr) for item in items):
        raise _invalid("must be a string or a list of strings")
    return value


def _empty_to_none(value: Any) -> Any:
    return None if value == "" else value


def _check_http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise _invalid("must be an http:// or https:// URL", "e.g. https://example.com/path")
    return value


def _unknown_toolsets(names: str | list[str], *, plugins: bool, loc: _Loc = ()) -> list[_Problem]:
    items = [(loc, names)] if isinstance(names, str) else [((*loc, i), n) for i, n in enumerate(names)]
    extra = "; MCP and plugin toolsets start with mcp- or plugin-" if plugins else ""
    return [_Problem(at, f"unknown toolset {name!r}",
                     f"{_suggest(name, list(TOOLSETS), allowed=False)} see `hermes-gateway tools`{extra}".lstrip())
            for at, name in items
            if not (validate_toolset(name) or (plugins and name.startswith(_PLUGIN_PREFIXES)))]


def _raise_if(problems: list[_Problem]) -> None:
    if problems:
        raise _Invalid(*problems)


def _check_route_name(name: str) -> str:
    if not _ROUTE_NAME.fullmatch(name):
        raise _invalid("invalid route name", "use 1-64 letters, digits, '_' or '-'; it becomes /webhooks/<name>")
    return name


def _check_deliver_to(value: str) -> str:
    if value == "none":
        return value
    parts = value.split(":")
    hint = f"write none or <platform>:<chat_id>[:<thread_id>], platform one of {', '.join(_DELIVERY_PLATFORMS)}"
    if len(parts) not in (2, 3) or not all(parts):
        raise _invalid(f"invalid delivery target {value!r}", hint)
    if parts[0] not in _DELIVERY_PLATFORMS:
        raise _invalid(f"unknown delivery platform {parts[0]!r}", hint)
    if parts[0] == "callback" and len(parts) == 3:
        raise _invalid("a callback target takes no thread id", "write callback:<target name>")
    return value


def _tools_of(names: str | list[str]) -> set[str] | None:
    """The tools named by toolsets, or None for every tool (``all`` / ``*``)."""
    listed = [names] if isinstance(names, str) else names
    return None if any(n in ALL_NAMES for n in listed) else set(resolve_toolset(listed))


def _widening(names: str | list[str], allowed: set[str] | None) -> list[str]:
    if allowed is None:
        return []
    if _tools_of(names) is None:
        return ["every tool ('all')"]
    return [t for t in resolve_toolset(names) if t not in allowed]


# --- sections ------------------------------------------------------------------------------------

_StrOrList = Annotated[str | list[str], BeforeValidator(_str_or_list)]
_RouteName = Annotated[str, AfterValidator(_check_route_name)]
_AuthPlatform = Annotated[str, _one_of(_CHAT_PLATFORMS, "platform")]
_ToolsetPlatform = Annotated[str, _one_of(_TOOLSET_PLATFORMS, "platform")]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSettings(_Section):
    """The OpenAI-compatible model endpoint and how runs use it."""

    base_url: Annotated[str, AfterValidator(_check_http_url)] = "https://api.openai.com/v1"
    api_key: SecretStr = SecretStr("")
    name: str = "gpt-4o-mini"
    max_turns: int = Field(10, ge=1, le=100)
    timeout: float = Field(120.0, gt=0)
    connect_timeout: float = Field(10.0, gt=0)
    max_retries: int = Field(2, ge=0, le=10)
    temperature: float | None = Field(None, ge=0, le=2)
    max_tokens: int | None = Field(None, ge=1)
    stream: bool = True
    system_prompt: str | None = None
    system_prompt_file: Path | None = None
    context_window: int = Field(128000, ge=1)
    history_messages: int = Field(50, ge=0)
    history_tokens: int = Field(16000, ge=0)

    @field_validator("system_prompt_file")
    @classmethod
    def _resolve_prompt_file(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return None if value is None else _resolve_path(value, info)

    @model_validator(mode="wrap")
    @classmethod
    def _read_prompt_file(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        settings = handler(data)
        file = settings.system_prompt_file
        if file is None:
            return settings
        loc = ("system_prompt_file",)
        if settings.system_prompt is not None:
            raise _invalid("cannot be set together with model.system_prompt", "keep one of the two", loc)
        try:
            text = file.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise _invalid(f"file not found: {file}", "create it, or remove the key", loc) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise _invalid(f"cannot read {file}: {exc}", "it must be a readable UTF-8 text file", loc) from None
        return settings.model_copy(update={"system_prompt": text})


class StoreSettings(_Section):
    """Where sessions, the inbox/outbox and cron jobs are persisted."""

    url: str = Field(default_factory=lambda: _default_store_url(gateway_home()))

    @field_validator("url")
    @classmethod
    def _supported(cls, value: str) -> str:
        # Never echo the URL: it may carry a password.
        scheme, sep, rest = value.partition("://")
        if not sep:
            raise _invalid("not a database URL", f"use {_STORE_FORMS}")
        if scheme in ("sqlite", "sqlite+aiosqlite"):
            if not rest.startswith("/") or len(rest) < 2:
                raise _invalid("sqlite URL has no file path",
                               "write sqlite:///relative/state.db or sqlite:////absolute/state.db")
        elif scheme not in ("postgresql", "postgresql+asyncpg") or not rest:
            raise _invalid(f"unsupported database URL scheme {scheme!r}", f"use {_STORE_FORMS}")
        return value


class HttpSettings(_Section):
    """The one HTTP server (health, metrics, webhooks, run lookups)."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    api_token: Annotated[SecretStr | None, BeforeValidator(_empty_to_none)] = None
    max_body_bytes: int = Field(1048576, ge=1)


class GatewaySettings(_Section):
    """Concurrency, busy-session policy and shutdown behaviour of the core."""

    busy: Literal["queue", "interrupt"] = "queue"
    max_concurrent_runs: int = Field(64, ge=1)
    max_concurrent_webhook_runs: int = Field(16, ge=1)
    # A run the gateway stopped during this many times is failed (its user told once), not started again.
    max_run_attempts: int = Field(2, ge=1)
    tool_threads: int = Field(32, ge=1)
    stream_edit_interval: float = Field(1.0, gt=0)
    typing_delay: float = Field(1.0, ge=0)
    drain_timeout: float = Field(30.0, ge=0)
    group_sessions_per_user: bool = True
    loop_lag_warn_ms: float = Field(250.0, gt=0)
    workspace: Path = Field(default_factory=lambda: gateway_home() / "workspace")

    @field_validator("workspace")
    @classmethod
    def _resolve_workspace(cls, value: Path, info: ValidationInfo) -> Path:
        return _resolve_path(value, info)


class WebhookRoute(_Section):
    """One signed inbound webhook, served at ``POST /webhooks/<name>``."""

    secret: Annotated[SecretStr | list[SecretStr], BeforeValidator(_str_or_list)]
    scheme: Literal["github", "standard-webhooks", "hmac-sha256"] = "github"
    events: list[str] = Field(default_factory=list)
    event_field: str = Field("type", min_length=1)
    prompt: str = Field(min_length=1)
    toolset: _StrOrList = "hermes-webhook"
    deliver_to: Annotated[str, AfterValidator(_check_deliver_to)] = "none"
    rate_limit_per_minute: int = Field(60, ge=1)
    max_body_bytes: int = Field(262144, ge=1)
    max_concurrency: int = Field(4, ge=1)
    tolerance_seconds: int = Field(300, ge=1)

    @field_validator("secret")
    @classmethod
    def _secret_not_empty(cls, value: SecretStr | list[SecretStr]) -> SecretStr | list[SecretStr]:
        hint = "use a long random string, e.g. `openssl rand -hex 32`"
        if isinstance(value, SecretStr):
            if not value.get_secret_value():
                raise _invalid("must not be empty", hint)
            return value
        # Empty list entries are dropped so an optional `${OLD_SECRET:-}` can sit in a rotation list.
        kept = [s for s in value if s.get_secret_value()]
        if not kept:
            raise _invalid("must list at least one non-empty secret", hint)
        return kept

    @field_validator("toolset")
    @classmethod
    def _known_toolsets(cls, value: str | list[str]) -> str | list[str]:
        _raise_if(_unknown_toolsets(value, plugins=False))
        return value

    def secrets(self) -> list[str]:
        """The accepted signing secrets, newest first (a list means key rotation)."""
        items = self.secret if isinstance(self.secret, list) else [self.secret]
        return [s.get_secret_value() for s in items]

    @property
    def delivery(self) -> tuple[str, str, str | None] | None:
        """``deliver_to`` parsed as (platform, chat_id, thread_id), or None for ``none``."""
        if self.deliver_to == "none":
            return None
        parts = self.deliver_to.split(":")
        return parts[0], parts[1], parts[2] if len(parts) == 3 else None


class WebhookPlatform(_Section):
    """Signed inbound webhooks and the tools their (untrusted) payloads may drive."""

    enabled: bool = True
    allowed_toolsets: list[str] = Field(default_factory=lambda: ["hermes-webhook"])
    routes: dict[_RouteName, WebhookRoute] = Field(default_factory=dict)

    @field_validator("allowed_toolsets")
    @classmethod
    def _known_toolsets(cls, value: list[str]) -> list[str]:
        _raise_if(_unknown_toolsets(value, plugins=False))
        return value

    @model_validator(mode="after")
    def _routes_within_allowed(self) -> Self:
        allowed = _tools_of(self.allowed_toolsets)
        _raise_if([
            _Problem(("routes", name, "toolset"),
                     f"widens beyond platforms.webhook.allowed_toolsets (extra tools: {', '.join(extra)})",
                     "narrow the route's toolset, or deliberately add a toolset to allowed_toolsets")
            for name, route in self.routes.items() if (extra := _widening(route.toolset, allowed))
        ])
        return self


class CallbackTarget(_Section):
    """An HTTP endpoint that receives run results as a signed POST."""

    url: Annotated[str, AfterValidator(_check_http_url)]
    secret: SecretStr
    timeout: float = Field(10.0, gt=0)

    @field_validator("secret")
    @classmethod
    def _secret_not_empty(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value():
            raise _invalid("must not be empty", "use a long random string, e.g. `openssl rand -hex 32`")
        return value


class CallbackPlatform(_Section):
    """Outbound-only delivery of run results to HTTP endpoints."""

    targets: dict[str, CallbackTarget] = Field(default_factory=dict)


class TelegramRateLimit(_Section):
    """PTB's AIORateLimiter throttles; 0 switches a level off (flood-control 429s go to the outbox)."""

    overall_per_second: float = Field(30.0, ge=0)
    group_per_minute: float = Field(20.0, ge=0)


def _check_telegram_path(value: str) -> str:
    if not value.startswith("/"):
        raise _invalid("must start with /", "e.g. /telegram/webhook")
    return value


class TelegramPlatform(_Section):
    """A Telegram bot through the Bot API, by long polling or a webhook on the gateway's HTTP server."""

    enabled: bool = False
    token: Annotated[SecretStr | None, BeforeValidator(_empty_to_none)] = None
    base_url: Annotated[str, AfterValidator(_check_http_url)] = "https://api.telegram.org/bot"
    base_file_url: Annotated[str, AfterValidator(_check_http_url)] = "https://api.telegram.org/file/bot"
    mode: Literal["polling", "webhook"] = "polling"
    run_on: Literal["leader", "all"] = "leader"
    webhook_url: Annotated[Annotated[str, AfterValidator(_check_http_url)] | None,
                           BeforeValidator(_empty_to_none)] = None
    webhook_secret: Annotated[SecretStr | None, BeforeValidator(_empty_to_none)] = None
    webhook_path: Annotated[str, AfterValidator(_check_telegram_path)] = "/telegram/webhook"
    poll_timeout: int = Field(30, ge=1, le=300)
    group_trigger: Literal["mention", "always"] = "mention"
    edited_messages: Literal["ignore", "handle"] = "ignore"
    max_attachment_bytes: int = Field(20 * 1024 * 1024, ge=1)
    parse_mode: Literal["markdown", "html", "plain"] = "html"
    rate_limit: TelegramRateLimit = Field(default_factory=TelegramRateLimit)

    @model_validator(mode="after")
    def _run_on_fits_mode(self) -> Self:
        # Telegram serves one getUpdates per bot at a time, and posts to webhook_url whichever replica serves it.
        fits = "leader" if self.mode == "polling" else "all"
        if self.run_on == fits:
            return self
        if "run_on" not in self.model_fields_set:
            return self.model_copy(update={"run_on": fits})
        if self.mode == "polling":
            raise _invalid("polling mode receives on the leader only", "Telegram ends all but one concurrent "
                           "getUpdates with 409 Conflict; write leader, or use mode: webhook to receive on every "
                           "replica", ("run_on",))
        raise _invalid("webhook mode receives on every replica", "Telegram posts each update to webhook_url, "
                       "which any replica may serve; remove run_on or write all", ("run_on",))

    @model_validator(mode="after")
    def _required_when_enabled(self) -> Self:
        if not self.enabled:
            return self
        problems: list[_Problem] = []
        token = self.token.get_secret_value() if self.token else ""
        if not token:
            problems.append(_Problem(("token",), "required when platforms.telegram.enabled is true",
                                     "the token @BotFather gave you; keep it in an env var: ${TELEGRAM_BOT_TOKEN}"))
        elif not _TELEGRAM_TOKEN.fullmatch(token):
            problems.append(_Problem(("token",), "does not look like a bot token",
                                     "it has the form 123456789:AAE...; copy it from @BotFather"))
        if self.mode == "webhook":
            if self.webhook_url is None:
                problems.append(_Problem(("webhook_url",), "required in webhook mode",
                                         "the public https URL Telegram posts updates to"))
            secret = self.webhook_secret.get_secret_value() if self.webhook_secret else ""
            if not secret:
                problems.append(_Problem(("webhook_secret",), "required in webhook mode",
                                         "a random string, e.g. `openssl rand -hex 32`"))
            elif not _TELEGRAM_SECRET.fullmatch(secret):
                problems.append(_Problem(("webhook_secret",), "may only use A-Z, a-z, 0-9, _ and - (1-256)",
                                         "e.g. `openssl rand -hex 32`"))
        _raise_if(problems)
        return self


_SLACK_COMMAND = re.compile(r"/[a-z0-9_-]{1,31}")


def _check_slack_events_path(value: str) -> str:
    if not value.startswith("/"):
        raise _invalid("must start with /", "e.g. /slack/events")
    return value


def _check_slack_command(value: str) -> str:
    if not _SLACK_COMMAND.fullmatch(value):
        raise _invalid(f"not a slash command name: {value!r}",
                       "a / and 1-31 lowercase letters, digits, - or _, as in the Slack app settings, e.g. /hermes")
    return value


_SlackSecret = Annotated[SecretStr | None, BeforeValidator(_empty_to_none)]


class SlackPlatform(_Section):
    """A Slack app through slack-bolt: Socket Mode, or the HTTP Events API on the gateway's HTTP server."""

    enabled: bool = False
    mode: Literal["socket", "http"] = "socket"
    run_on: Literal["leader", "all"] = "leader"
    bot_token: _SlackSecret = None
    app_token: _SlackSecret = None
    signing_secret: _SlackSecret = None
    # slack-sdk appends the method name to the base URL as is, so it must end with "/".
    api_base_url: Annotated[str, AfterValidator(_check_http_url),
                            AfterValidator(lambda v: v if v.endswith("/") else v + "/")] = "https://slack.com/api/"
    events_path: Annotated[str, AfterValidator(_check_slack_events_path)] = "/slack/events"
    slash_command: Annotated[str, AfterValidator(_check_slack_command)] = "/hermes"
    reply_in_thread: bool = True
    ping_interval: float = Field(10.0, gt=0)

    @model_validator(mode="after")
    def _http_receives_everywhere(self) -> Self:
        # Slack posts to the Request URL, which every replica behind it serves: only "all" can be honoured.
        if self.mode != "http" or self.run_on == "all":
            return self
        if "run_on" in self.model_fields_set:
            raise _invalid("http mode receives on every replica", "Slack posts each event to the app's Request "
                           "URL, which any replica may serve; remove run_on or write all. leader is for socket mode",
                           ("run_on",))
        return self.model_copy(update={"run_on": "all"})

    @model_validator(mode="after")
    def _required_when_enabled(self) -> Self:
        if not self.enabled:
            return self
        bot = self.bot_token.get_secret_value() if self.bot_token else ""
        app = self.app_token.get_secret_value() if self.app_token else ""
        problems: list[_Problem] = []
        if not bot:
            problems.append(_Problem(("bot_token",), "required when platforms.slack.enabled is true",
                                     "the Bot User OAuth Token (xoxb-...); keep it in an env var: ${SLACK_BOT_TOKEN}"))
        elif bot.startswith("xapp-"):
            problems.append(_Problem(("bot_token",), "this is an app-level token",
                                     "bot_token takes the Bot User OAuth Token (xoxb-...); the xapp- token is "
                                     "app_token"))
        if self.mode == "socket":
            if not app:
                problems.append(_Problem(("app_token",), "required in socket mode",
                                         "an app-level token (xapp-...) with connections:write, or set mode: http"))
            elif not app.startswith("xapp-"):
                problems.append(_Problem(("app_token",), "does not look like an app-level token",
                                         "app-level tokens start with xapp- (Basic Information > App-Level Tokens)"))
        if self.mode == "http" and not (self.signing_secret and self.signing_secret.get_secret_value()):
            problems.append(_Problem(("signing_secret",), "required in http mode",
                                     "Basic Information > App Credentials > Signing Secret in the Slack app settings"))
        _raise_if(problems)
        return self


def _check_ws_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("ws", "wss") or not parts.netloc:
        raise _invalid("must be a ws:// or wss:// URL", "e.g. wss://gateway.discord.gg")
    return value


_DISCORD_SHARDS = re.compile(r"shard:(\d+(?:,\d+)*)")


def _check_discord_run_on(value: str) -> str:
    if value in ("leader", "all"):
        return value
    if (m := _DISCORD_SHARDS.fullmatch(value.replace(" ", ""))) is None:
        raise _invalid(f"unknown value {value!r}", "write leader, all, or shard:<ids> to run those shards on "
                       "this replica, e.g. shard:0,1")
    ids = [int(i) for i in m.group(1).split(",")]
    if len(set(ids)) != len(ids):
        raise _invalid(f"{value!r} names a shard twice", "list each shard once, e.g. shard:0,1")
    return "shard:" + ",".join(map(str, ids))


def _discord_shards(run_on: str) -> list[int] | None:
    """The shard ids of a checked ``run_on: shard:<ids>``; None for leader and all."""
    return [int(i) for i in run_on.removeprefix("shard:").split(",")] if run_on.startswith("shard:") else None


class DiscordPlatform(_Section):
    """A Discord bot through discord.py: the gateway websocket for events, REST for sends."""

    model_config = ConfigDict(coerce_numbers_to_str=True)  # ids are usually written unquoted

    enabled: bool = False
    token: Annotated[SecretStr | None, BeforeValidator(_empty_to_none)] = None
    api_base_url: Annotated[str, AfterValidator(_check_http_url),
                            AfterValidator(lambda v: v.rstrip("/"))] = "https://discord.com/api/v10"
    gateway_url: Annotated[Annotated[str, AfterValidator(_check_ws_url)] | None,
                           BeforeValidator(_empty_to_none)] = None
    shard_count: int | None = Field(None, ge=1)
    shard_ids: list[Annotated[int, Field(ge=0)]] | None = None
    run_on: Annotated[str, AfterValidator(_check_discord_run_on)] = "leader"
    respond_in_guilds: Literal["mention", "always"] = "mention"
    allowed_guilds: list[str] = Field(default_factory=list)
    allowed_channels: list[str] = Field(default_factory=list)
    allow_mentions: bool = False
    max_ratelimit_timeout: float = Field(30.0, ge=30)  # discord.py's minimum
    heartbeat_timeout: float = Field(60.0, gt=0)
    guild_ready_timeout: float = Field(2.0, ge=0)
    reconnect_backoff: float = Field(5.0, ge=0)
    backfill_window: float = Field(3600.0, ge=0)
    state_file: Path

    @model_validator(mode="before")
    @classmethod
    def _home_default(cls, data: Any, info: ValidationInfo) -> Any:
        # Like the store, the default follows the loader's env, not necessarily os.environ.
        if isinstance(data, Mapping) and data.get("state_file") in (None, ""):
            data = {**data, "state_file": gateway_home(_context(info).env) / "discord-state.json"}
        return data

    @field_validator("state_file")
    @classmethod
    def _resolve_state_file(cls, value: Path, info: ValidationInfo) -> Path:
        return _resolve_path(value, info)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        problems: list[_Problem] = []
        if self.enabled and not (self.token and self.token.get_secret_value()):
            problems.append(_Problem(("token",), "required when platforms.discord.enabled is true",
                                     "the bot token from the Developer Portal (Bot > Token); keep it in an env "
                                     "var: ${DISCORD_BOT_TOKEN}"))
        if self.shard_ids is not None:
            if self.shard_count is None:
                problems.append(_Problem(("shard_ids",), "needs shard_count", "set shard_count to the total number "
                                         "of shards across all processes"))
            elif bad := [i for i in self.shard_ids if i >= self.shard_count]:
                problems.append(_Problem(("shard_ids",), f"shard ids {bad} are not below shard_count "
                                         f"{self.shard_count}", "shard ids run from 0 to shard_count - 1"))
        shards = _discord_shards(self.run_on)
        if shards is not None:
            if self.shard_count is None:
                problems.append(_Problem(("run_on",), f"{self.run_on} needs shard_count", "set shard_count to the "
                                         "total number of shards across all replicas"))
            elif bad := [i for i in shards if i >= self.shard_count]:
                problems.append(_Problem(("run_on",), f"shard ids {bad} are not below shard_count "
                                         f"{self.shard_count}", "shard ids run from 0 to shard_count - 1"))
            if self.shard_ids is not None and sorted(self.shard_ids) != sorted(shards):
                problems.append(_Problem(("shard_ids",), f"conflicts with run_on: {self.run_on}",
                                         "remove shard_ids: run_on: shard:<ids> names the shards this replica runs"))
        _raise_if(problems)
        # run_on: shard:<ids> is how a replica says which shards it runs; the adapter reads shard_ids.
        return self if shards is None else self.model_copy(update={"shard_ids": shards})


class Platforms(_Section):
    """Per-platform settings."""

    telegram: TelegramPlatform = Field(default_factory=TelegramPlatform)
    discord: DiscordPlatform = Field(default_factory=DiscordPlatform)
    slack: SlackPlatform = Field(default_factory=SlackPlatform)
    webhook: WebhookPlatform = Field(default_factory=WebhookPlatform)
    callback: CallbackPlatform = Field(default_factory=CallbackPlatform)

    @model_validator(mode="after")
    def _callback_targets_exist(self) -> Self:
        known = sorted(self.callback.targets)
        _raise_if([
            _Problem(("webhook", "routes", name, "deliver_to"), f"unknown callback target {target[1]!r}",
                     f"define it under platforms.callback.targets; defined: {', '.join(known) or 'none'}")
            for name, route in self.webhook.routes.items()
            if (target := route.delivery) and target[0] == "callback" and target[1] not in self.callback.targets
        ])
        return self


def _check_admin(value: str) -> str:
    platform, sep, user = value.partition(":")
    if not sep or not user or platform not in _CHAT_PLATFORMS:
        raise _invalid(f"invalid admin {value!r}",
                       f"write <platform>:<user_id>, platform one of {', '.join(_CHAT_PLATFORMS)}")
    return value


class PlatformAuth(_Section):
    """Who may talk to the gateway on one platform."""

    # Numeric ids are usually written unquoted in YAML.
    model_config = ConfigDict(coerce_numbers_to_str=True)

    allow_all: bool = False
    allowed_users: list[str] = Field(default_factory=list)
    allowed_chats: list[str] = Field(default_factory=list)
    denied_users: list[str] = Field(default_factory=list)


class AuthSettings(_Section):
    """Admins, per-platform allow and deny lists, DM pairing."""

    admins: list[Annotated[str, AfterValidator(_check_admin)]] = Field(default_factory=list)
    platforms: dict[_AuthPlatform, PlatformAuth] = Field(default_factory=dict)
    dm_pairing: bool = False
    pairing_code_ttl_seconds: int = Field(3600, ge=60)
    max_pending_codes: int = Field(3, ge=1)


class LimitsSettings(_Section):
    """Abuse limits: inbound rate per user, and budgets per run and per user."""

    user_messages_per_minute: float = Field(20, gt=0)
    user_burst: int = Field(10, ge=1)
    run_max_tool_calls: int = Field(50, ge=1)
    run_max_tokens: int | None = Field(None, ge=1)
    user_max_model_calls_per_hour: int | None = Field(None, ge=1)
    user_max_tokens_per_hour: int | None = Field(None, ge=1)


class CronSettings(_Section):
    """Scheduled runs."""

    timezone: str = "UTC"
    misfire_grace_seconds: float = Field(3600.0, ge=0)
    max_consecutive_failures: int = Field(3, ge=1)
    min_interval_seconds: int = Field(60, ge=1)
    max_jobs_per_user: int = Field(50, ge=1)
    sync_interval_seconds: float = Field(5.0, gt=0)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (ValueError, KeyError, OSError):
            close = difflib.get_close_matches(value, sorted(zoneinfo.available_timezones()), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise _invalid(f"unknown time zone {value!r}",
                           f"{hint}use an IANA name such as 'Europe/Berlin' or 'UTC'") from None
        return value


class ToolSearchSettings(_Section):
    """Deferred tool definitions found by search instead of sent on every call."""

    enabled: bool = True
    threshold: float = Field(0.10, ge=0, le=1)


def _check_server_name(name: str) -> str:
    if not _MCP_SERVER_NAME.fullmatch(name):
        raise _invalid("invalid MCP server name", "use 1-32 letters, digits, '_' or '-'; it becomes toolset mcp-<name>")
    return name


class McpServer(_Section):
    """One MCP server: a command run as a subprocess (stdio) or a streamable HTTP endpoint (url)."""

    # Env values and header values are often numbers or tokens written unquoted.
    model_config = ConfigDict(coerce_numbers_to_str=True)

    command: str | None = Field(None, min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, SecretStr] = Field(default_factory=dict)
    url: Annotated[str, AfterValidator(_check_http_url)] | None = None
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    timeout: float = Field(60.0, gt=0)
    connect_timeout: float = Field(10.0, gt=0)
    enabled_tools: list[str] | None = None
    disabled_tools: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_transport(self) -> Self:
        if (self.command is None) == (self.url is None):
            raise _invalid("set either command (a stdio server) or url (a streamable HTTP server)",
                           "e.g. command: npx with args: [-y, some-mcp-server], or url: https://host/mcp")
        wrong = ("args", "env") if self.url is not None else ("headers",)
        _raise_if([_Problem((key,), f"only used with {'command' if self.url is not None else 'url'}",
                            "remove it, or switch the transport") for key in wrong if getattr(self, key)])
        return self


class PluginSettings(_Section):
    """Python tool plugins: installed entry points and a directory of .py files."""

    dir: Path | None = None
    entry_points: bool = True

    @field_validator("dir")
    @classmethod
    def _existing_dir(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        path = _resolve_path(value, info)
        if not path.is_dir():
            raise _invalid(f"not a directory: {path}", "create it, or remove the key")
        return path


def _check_network(value: str) -> str:
    try:
        ipaddress.ip_network(value)
    except ValueError:
        try:
            fixed = ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise _invalid(f"not a CIDR network: {value!r}", "e.g. 10.0.0.0/8 or fd00::/8") from None
        raise _invalid(f"{value!r} has host bits set", f"write {fixed}") from None
    return value


class WebSettings(_Section):
    """The web tools."""

    search_url: Annotated[str, AfterValidator(_check_http_url)] | None = None
    allow_private_networks: list[Annotated[str, AfterValidator(_check_network)]] = Field(default_factory=list)


class SandboxLimitSettings(_Section):
    """Limits of one sandboxed tool call; past one the call ends with a tool error (never retried)."""

    timeout: float = Field(30.0, gt=0, le=3600)  # wall clock; a tool's own timeout argument extends it
    cpu_seconds: float = Field(20.0, gt=0)
    memory_mb: int = Field(1024, ge=64)  # address space of each process in the sandbox
    open_files: int = Field(256, ge=16)
    processes: int = Field(128, ge=8)  # processes and threads: a fork bomb stops here
    file_size_mb: int = Field(1024, ge=1)


class ToolsSettings(_Section):
    """Where tools run: the sandbox for commands and untrusted content (see README, Tool sandbox)."""

    sandbox: Literal["auto", "bwrap", "unshare", "uid", "none"] = "auto"
    sandbox_uid: int = Field(65534, ge=1)  # the sandbox's user when the gateway runs as root
    workers: int = Field(8, ge=1, le=64)  # per kind (with and without network); idle ones beyond one are stopped
    limits: SandboxLimitSettings = Field(default_factory=SandboxLimitSettings)
    network: dict[str, bool] = Field(default_factory=dict)  # per tool: overrides what the tool declares


class LoggingSettings(_Section):
    """Log level and format."""

    level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"],
                     BeforeValidator(lambda v: v.upper() if isinstance(v, str) else v)] = "INFO"
    format: Literal["text", "json"] = "text"


def gateway_home(env: Mapping[str, str] | None = None) -> Path:
    """The gateway's home directory: ``$HERMES_GATEWAY_HOME`` or ``~/.hermes-gateway``."""
    env = os.environ if env is None else env
    return Path(env.get("HERMES_GATEWAY_HOME") or "~/.hermes-gateway").expanduser().absolute()


def _default_store_url(home: Path) -> str:
    return f"sqlite:///{home / 'state.db'}"


class Config(_Section):
    """The whole gateway configuration."""

    model: ModelSettings = Field(default_factory=ModelSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    platforms: Platforms = Field(default_factory=Platforms)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    cron: CronSettings = Field(default_factory=CronSettings)
    toolsets: dict[_ToolsetPlatform, _StrOrList] = Field(default_factory=dict)
    tool_search: ToolSearchSettings = Field(default_factory=ToolSearchSettings)
    web: WebSettings = Field(default_factory=WebSettings)
    tools: ToolsSettings = Field(default_factory=ToolsSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    mcp_servers: dict[Annotated[str, AfterValidator(_check_server_name)], McpServer] = Field(default_factory=dict)
    plugins: PluginSettings = Field(default_factory=PluginSettings)

    @model_validator(mode="before")
    @classmethod
    def _home_defaults(cls, data: Any, info: ValidationInfo) -> Any:
        # Defaults under the home directory follow the loader's env, not necessarily os.environ.
        if not isinstance(data, Mapping):
            return data
        home = gateway_home(_context(info).env)
        data = dict(data)
        for section, key, value in (("store", "url", _default_store_url(home)),
                                    ("gateway", "workspace", home / "workspace")):
            sub = data.get(section, {})
            if isinstance(sub, Mapping) and key not in sub:
                data[section] = {**sub, key: value}
        return data

    @field_validator("toolsets")
    @classmethod
    def _known_toolsets(cls, value: dict[str, str | list[str]]) -> dict[str, str | list[str]]:
        _raise_if([p for platform, names in value.items()
                   for p in _unknown_toolsets(names, plugins=True, loc=(platform,))])
        return value

    def masked(self) -> dict[str, Any]:
        """The resolved config as JSON-able data, every secret shown as ``"***"`` (empty ones as null)."""
        data = _plain(self)
        data["store"]["url"] = _mask_url_password(self.store.url)
        return data

    def secret_values(self) -> list[str]:
        """Every non-empty secret string (for the log redaction filter), without duplicates."""
        found = [*_secrets_in(self), *_url_passwords(self.store.url)]
        return list(dict.fromkeys(s for s in found if s))


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return {name: _plain(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, SecretStr):
        return "***" if value.get_secret_value() else None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _secrets_in(value: Any) -> Iterator[str]:
    if isinstance(value, SecretStr):
        yield value.get_secret_value()
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _secrets_in(getattr(value, name))
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _secrets_in(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _secrets_in(v)


def _split_password(url: str) -> tuple[str, str, str]:
    """(text before the password, password, text after it); password "" when there is none."""
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    if not (at and colon and password):
        return url, "", ""
    start = len(parts.scheme) + 3 + len(user) + 1  # "scheme://user:"
    return url[:start], password, url[start + len(password):]


def _mask_url_password(url: str) -> str:
    before, password, after = _split_password(url)
    return f"{before}***{after}" if password else url


def _url_passwords(url: str) -> list[str]:
    password = _split_password(url)[1]
    return [password, unquote(password)] if password else []


# --- interpolation -------------------------------------------------------------------------------

_TOKEN = re.compile(r"\$\$|\$\{([^}]*)\}|\$\{")
# The default is literal text; "{" in it would be an (unsupported) nested reference.
_REFERENCE = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^{]*))?")
_INTERPOLATION_HINT = "write ${VAR} or ${VAR:-default}; write $$ for a literal $"


def _format_path(loc: _Loc) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def _interpolate_str(text: str, env: Mapping[str, str], loc: _Loc) -> str:
    out: list[str] = []
    pos = 0
    for match in _TOKEN.finditer(text):
        out.append(text[pos:match.start()])
        pos = match.end()
        if match.group(0) == "$$":
            out.append("$")
            continue
        inner = match.group(1)
        ref = None if inner is None else _REFERENCE.fullmatch(inner)
        if ref is None:
            shown = "" if _SECRET_FIELDS.intersection(map(str, loc)) else f" {match.group(0)[:40]!r}"
            raise ConfigError(_format_path(loc), f"malformed ${{...}} reference{shown}", _INTERPOLATION_HINT)
        name, default, value = ref["name"], ref["default"], env.get(ref["name"])
        if default is not None:
            out.append(value or default)
        elif value is None:
            raise ConfigError(_format_path(loc), f"environment variable {name} is not set",
                              f"export it, or write ${{{name}:-default}}")
        else:
            out.append(value)
    out.append(text[pos:])
    return "".join(out)


def _interpolate(value: Any, env: Mapping[str, str], loc: _Loc, errors: list[ConfigError]) -> Any:
    """Interpolate every string value (never keys) of parsed YAML, collecting errors."""
    if isinstance(value, str):
        try:
            return _interpolate_str(value, env, loc)
        except ConfigError as exc:
            errors.append(exc)
            return value
    if isinstance(value, Mapping):
        return {k: _interpolate(v, env, (*loc, k), errors) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, (*loc, i), errors) for i, v in enumerate(value)]
    return value


# --- pydantic errors -> ConfigError --------------------------------------------------------------

def _model_at(loc: _Loc) -> type[BaseModel]:
    """The model class validated at ``loc`` (a path that pydantic already walked)."""
    tp: Any = Config
    for part in loc:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            tp = tp.model_fields[str(part)].annotation
        else:  # a dict value or a list item
            tp = get_args(tp)[-1]
    return tp


def _describe(value: Any) -> str:
    if value is None:
        return "got an empty value"
    if isinstance(value, Mapping):
        return "got a mapping"
    if isinstance(value, list):
        return "got a list"
    shown = repr(value)
    return f"got {shown if len(shown) <= 60 else shown[:57] + '...'}"


def _from_validation_error(exc: ValidationError) -> list[ConfigError]:
    errors: list[ConfigError] = []
    for err in exc.errors():
        loc: _Loc = tuple(part for part in err["loc"] if part != "[key]")
        cause = err.get("ctx", {}).get("error")
        if isinstance(cause, _Invalid):
            errors.extend(ConfigError(_format_path((*loc, *p.loc)), p.message, p.hint) for p in cause.problems)
        elif err["type"] == "extra_forbidden":
            allowed = list(_model_at(loc[:-1]).model_fields)
            errors.append(ConfigError(_format_path(loc), "unknown key", _suggest(str(loc[-1]), allowed)))
        elif err["type"] == "missing":
            errors.append(ConfigError(_format_path(loc), "required"))
        elif err["type"] in ("model_type", "model_attributes_type", "dict_type"):
            hint = "it is empty: add its keys, or remove it" if err["input"] is None else _describe(err["input"])
            errors.append(ConfigError(_format_path(loc), "must be a mapping", hint))
        else:
            secret = _SECRET_FIELDS.intersection(map(str, loc))
            errors.append(ConfigError(_format_path(loc), err["msg"], "" if secret else _describe(err["input"])))
    return errors


# --- loading -------------------------------------------------------------------------------------

class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _yaml_error(file: Path, exc: yaml.YAMLError) -> ConfigError:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return ConfigError("", f"{file}: invalid YAML{where}: {problem}", "check indentation and quoting there")


def _parse(data: Mapping[str, Any], env: Mapping[str, str] | None, base_dir: Path) -> Config:
    env = os.environ if env is None else env
    errors: list[ConfigError] = []
    resolved = _interpolate(data, env, (), errors)
    if errors:
        raise ConfigError.combine(errors)
    try:
        return Config.model_validate(resolved, context=_Context(env, base_dir))
    except ValidationError as exc:
        raise ConfigError.combine(_from_validation_error(exc)) from None


def parse_config(data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Config:
    """Validate already-parsed config data; ``${VAR}`` in string values is resolved from ``env``.

    Relative paths are resolved against the current directory.
    """
    return _parse(data, env, Path.cwd())


def default_config(env: Mapping[str, str] | None = None) -> Config:
    """The configuration with every default (home-relative paths follow ``env``)."""
    return parse_config({}, env)


def load_config(path: str | Path | None, env: Mapping[str, str] | None = None) -> Config:
    """Load and validate a YAML config file (None: all defaults); ``env`` defaults to os.environ.

    Relative paths in the file are resolved against the file's directory.
    """
    if path is None:
        return default_config(env)
    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("", f"config file not found: {file}",
                          "pass --config PATH, or start from deploy/config.example.yaml") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("", f"cannot read config file {file}: {exc}") from None
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise _yaml_error(file, exc) from None
    if data is None:  # an empty file (or only comments)
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError("", f"{file}: the top level must be a mapping of sections, not {type(data).__name__}",
                          "start with a section name such as 'model:'")
    return _parse(data, env, file.absolute().parent)
