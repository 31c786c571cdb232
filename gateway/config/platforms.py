"""The ``platforms`` section: signed webhooks, callback targets, Telegram, Slack, Discord, the forges, and the
sections of platforms that plugins provide."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.config.approvals import ApprovalMode, Patterns
from gateway.config.base import (
    _CHAT_PLATFORMS,
    _PLATFORM_NAME,
    _RUN_SOURCES,
    _check_http_url,
    _context,
    _empty_to_none,
    _resolve_path,
    _Section,
    _str_or_list,
    _StrOrList,
    _tools_of,
    _unknown_toolsets,
    _widening,
)
from gateway.config.discovery import gateway_home
from gateway.config.errors import _invalid, _Problem, _raise_if, _suggest
from platforms.forge import FORGES
from platforms.reaction_rules import reaction_problem
from platforms.webhook_signatures import DEFAULT_REPLAY_WINDOW, standard_webhooks_key

_DELIVERY_PLATFORMS = (*_CHAT_PLATFORMS, "callback")

_ROUTE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TELEGRAM_TOKEN = re.compile(r"\d+:[A-Za-z0-9_-]+")
_TELEGRAM_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")


def _check_route_name(name: str) -> str:
    if not _ROUTE_NAME.fullmatch(name):
        raise _invalid("invalid route name", "use 1-64 letters, digits, '_' or '-'; it becomes /webhooks/<name>")
    return name


def _check_deliver_to(value: str) -> str:
    if value == "none" or value in FORGES:  # github, gitlab: the issue or pull request of the payload
        return value
    parts = value.split(":")
    hint = (f"write none, github, gitlab or <platform>:<chat_id>[:<thread_id>], platform one of "
            f"{', '.join(_DELIVERY_PLATFORMS)}")
    if len(parts) not in (2, 3) or not all(parts):
        raise _invalid(f"invalid delivery target {value!r}", hint)
    if parts[0] not in _DELIVERY_PLATFORMS and not _PLATFORM_NAME.fullmatch(parts[0]):
        raise _invalid(f"unknown delivery platform {parts[0]!r}", hint)  # a plugin's: checked with the whole config
    if parts[0] == "callback" and len(parts) == 3:
        raise _invalid("a callback target takes no thread id", "write callback:<target name>")
    return value


_RouteName = Annotated[str, AfterValidator(_check_route_name)]
_WHSEC_HINT = "copy the whole secret from the sender (whsec_ and its base64), or use a plain string without whsec_"


def _whsec_problems(secrets: list[SecretStr], loc: tuple[str | int, ...]) -> list[_Problem]:
    """A Standard Webhooks ``whsec_`` secret that does not decode would fail every delivery: refuse it at load."""
    problems = []
    for i, secret in enumerate(secrets):
        try:
            standard_webhooks_key(secret.get_secret_value())
        except ValueError as exc:
            problems.append(_Problem(loc + ((i,) if len(secrets) > 1 else ()), str(exc), _WHSEC_HINT))
    return problems


class WebhookRoute(_Section):
    """One signed inbound webhook, served at ``POST /webhooks/<name>``."""

    secret: Annotated[SecretStr | list[SecretStr], BeforeValidator(_str_or_list)]
    scheme: Literal["github", "standard-webhooks", "hmac-sha256", "hmac-sha256-v2", "gitlab"] = "github"
    events: list[str] = Field(default_factory=list)
    event_field: str = Field("type", min_length=1)
    mode: Literal["agent", "deliver"] = "agent"
    prompt: str | None = Field(None, min_length=1)
    template: str | None = Field(None, min_length=1)
    toolset: _StrOrList = "hermes-webhook"
    deliver_to: Annotated[str, AfterValidator(_check_deliver_to)] = "none"
    rate_limit_per_minute: int = Field(60, ge=1)
    max_body_bytes: int = Field(262144, ge=1)
    # Most runs of this route at once (its admission ceiling); None: only gateway.max_concurrent_webhook_runs.
    max_concurrency: int | None = Field(None, ge=1)
    tolerance_seconds: int = Field(300, ge=1)
    replay_window_seconds: int = Field(int(DEFAULT_REPLAY_WINDOW), ge=1)
    allow_unsigned_id: bool = False
    # Nobody can answer a webhook run's approval prompt: calls that would need one are denied, unless listed here.
    approvals: ApprovalMode = "dangerous"
    approvals_allow: Patterns = Field(default_factory=list)

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

    @model_validator(mode="after")
    def _scheme_settings(self) -> Self:
        problems = (_whsec_problems(self.secret if isinstance(self.secret, list) else [self.secret], ("secret",))
                    if self.scheme == "standard-webhooks" else [])
        only = {"replay_window_seconds": "github", "allow_unsigned_id": "hmac-sha256"}
        problems += [_Problem((key,), f"only used by the {scheme} scheme", "remove it, or change the scheme")
                     for key, scheme in only.items() if key in self.model_fields_set and self.scheme != scheme]
        _raise_if(problems)
        return self

    @model_validator(mode="after")
    def _mode_settings(self) -> Self:
        # An agent route needs a prompt; a deliver route a template and somewhere to send it, and runs no tools.
        needed, unused = (("template", ("prompt", "toolset")) if self.mode == "deliver" else ("prompt", ("template",)))
        problems = [_Problem((key,), f"not used with mode: {self.mode}", "remove it, or change the mode")
                    for key in unused if key in self.model_fields_set]
        if getattr(self, needed) is None:
            problems.append(_Problem((needed,), f"required with mode: {self.mode}",
                                     f"set {needed}, or change the mode"))
        if self.mode == "deliver" and self.deliver_to == "none":
            problems.append(_Problem(("deliver_to",), "required with mode: deliver",
                                     "name a chat or callback:<target> to send the rendered template to"))
        _raise_if(problems)
        return self

    @property
    def text_template(self) -> str:
        """The prompt (mode agent) or the message template (mode deliver)."""
        text = self.template if self.mode == "deliver" else self.prompt
        assert text is not None  # checked at load
        return text

    def secrets(self) -> list[str]:
        """The accepted signing secrets, newest first (a list means key rotation)."""
        items = self.secret if isinstance(self.secret, list) else [self.secret]
        return [s.get_secret_value() for s in items]

    @property
    def delivery(self) -> tuple[str, str, str | None] | None:
        """``deliver_to`` parsed as (platform, chat_id, thread_id), or None for ``none``; github and gitlab have
        no chat id here (the payload names the issue or pull request)."""
        if self.deliver_to == "none":
            return None
        if self.deliver_to in FORGES:
            return self.deliver_to, "", None
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
        _raise_if(_whsec_problems([value], ()))  # callbacks are signed with Standard Webhooks headers
        return value


class CallbackPlatform(_Section):
    """Outbound-only delivery of run results to HTTP endpoints."""

    targets: dict[str, CallbackTarget] = Field(default_factory=dict)


ToolProgressMode = Literal["off", "new", "all", "verbose"]
ToolProgressDone = Literal["collapse", "delete", "keep"]


class ReactionEmoji(_Section):
    """The bot's status reaction on a chat message, per state of its run (gateway/reactions.py)."""

    received: str = Field(min_length=1)
    working: str = Field(min_length=1)
    done: str = Field(min_length=1)
    failed: str = Field(min_length=1)
    cancelled: str = ""
    """Stopped with /stop; empty: the bot's reaction is removed."""


class ChatPlatform(_Section):
    """What every chat platform shares: how a run's tool calls are shown while it works (gateway/tool_progress.py).

    ``tool_progress``: off, new (a line only when the tool differs from the previous one), all, or verbose (full
    arguments, still cut and redacted); ``tool_progress_delay``: seconds a run uses tools before the status message
    appears (a quick answer needs none); ``tool_progress_done``: what the status message becomes at the end.
    ``reactions``: the bot's reaction on each chat message shows its run's state (``reaction_emoji``).
    """

    tool_progress: ToolProgressMode = "all"
    tool_progress_delay: float = Field(5.0, ge=0)
    tool_progress_done: ToolProgressDone = "collapse"
    # Off by default: each state is a platform API call (three per message), which tripled the gateway's CPU per
    # Telegram message in bench_chat (17 against 6 ms) and counts against the platform's rate limits.
    reactions: bool = False
    reaction_emoji: ReactionEmoji  # the defaults are each platform's own (``_REACTION_DEFAULTS``)

    _PLATFORM: ClassVar[str]
    _REACTION_DEFAULTS: ClassVar[dict[str, str]]

    @model_validator(mode="before")
    @classmethod
    def _reaction_defaults(cls, data: Any) -> Any:
        # Emoji left out keep the platform's default, so one state can be changed alone.
        if isinstance(data, Mapping):
            given = data.get("reaction_emoji")
            if given is None or isinstance(given, Mapping):
                data = {**data, "reaction_emoji": {**cls._REACTION_DEFAULTS, **(given or {})}}
        return data

    @model_validator(mode="after")
    def _reactions_allowed(self) -> Self:
        _raise_if([_Problem(("reaction_emoji", state), problem, "leave it out for the default")
                   for state, emoji in self.reaction_emoji.model_dump().items()
                   if emoji and (problem := reaction_problem(self._PLATFORM, emoji))])
        return self


class TelegramRateLimit(_Section):
    """PTB's AIORateLimiter throttles; 0 switches a level off (flood-control 429s go to the outbox)."""

    overall_per_second: float = Field(30.0, ge=0)
    group_per_minute: float = Field(20.0, ge=0)


def _check_telegram_path(value: str) -> str:
    if not value.startswith("/"):
        raise _invalid("must start with /", "e.g. /telegram/webhook")
    return value


class TelegramPlatform(ChatPlatform):
    """A Telegram bot through the Bot API, by long polling or a webhook on the gateway's HTTP server."""

    _PLATFORM: ClassVar[str] = "telegram"
    # Telegram lets a bot react with its fixed set only (platforms/reaction_rules.py).
    _REACTION_DEFAULTS: ClassVar[dict[str, str]] = {"received": "👀", "working": "✍", "done": "👍", "failed": "😢"}

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


class SlackPlatform(ChatPlatform):
    """A Slack app through slack-bolt: Socket Mode, or the HTTP Events API on the gateway's HTTP server."""

    _PLATFORM: ClassVar[str] = "slack"
    _REACTION_DEFAULTS: ClassVar[dict[str, str]] = {"received": "eyes", "working": "hourglass_flowing_sand",
                                                    "done": "white_check_mark", "failed": "x"}

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
    assistant_status: bool = True

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


class DiscordPlatform(ChatPlatform):
    """A Discord bot through discord.py: the gateway websocket for events, REST for sends."""

    _PLATFORM: ClassVar[str] = "discord"
    _REACTION_DEFAULTS: ClassVar[dict[str, str]] = {"received": "👀", "working": "⏳", "done": "✅", "failed": "❌"}

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
    # Guilds whose slash commands are registered per guild (shown at once); empty: global commands.
    command_guilds: list[str] = Field(default_factory=list)
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


class ForgePlatform(_Section):
    """Comments on the issue or pull (merge) request a webhook came from: ``deliver_to: github|gitlab``."""

    token: Annotated[SecretStr | None, BeforeValidator(_empty_to_none)] = None
    timeout: float = Field(10.0, gt=0)

    @property
    def enabled(self) -> bool:
        """Whether comments can be posted (a token is set)."""
        return self.token is not None


class GitHubPlatform(ForgePlatform):
    """GitHub REST (api.github.com, or GitHub Enterprise's ``https://HOST/api/v3``)."""

    api_base_url: Annotated[str, AfterValidator(_check_http_url)] = "https://api.github.com"


class GitLabPlatform(ForgePlatform):
    """GitLab REST v4 (gitlab.com, or a self-hosted ``https://HOST/api/v4``)."""

    api_base_url: Annotated[str, AfterValidator(_check_http_url)] = "https://gitlab.com/api/v4"


_PLUGIN_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _check_plugin_name(value: str) -> str:
    if not _PLUGIN_NAME.fullmatch(value):
        raise _invalid("invalid plugin name", "the plugin's file or package name in plugins.dir, or its entry point's")
    return value


class PluginPlatformSection(_Section):
    """``platforms.<name>`` of a platform a plugin provides: ``plugin`` names that plugin and ``enabled`` (default
    true) turns the platform on; the other keys (``settings``) are the plugin's, validated by its config model
    when the gateway has loaded it (gateway/plugins.py)."""

    plugin: Annotated[str, AfterValidator(_check_plugin_name)]
    enabled: bool = True
    settings: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _plugin_keys(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        own = ("plugin", "enabled")
        return {**{k: data[k] for k in own if k in data},
                "settings": {k: v for k, v in data.items() if k not in own}}


def _plugin_section_problem(name: str, value: Any, builtin: list[str]) -> _Problem | None:
    if not (isinstance(value, Mapping) and "plugin" in value):
        return _Problem((name,), "unknown key", f"{_suggest(name, builtin)}; for a plugin's platform, name the "
                                                f"plugin: platforms.{name}.plugin: <plugin name>")
    if name in _RUN_SOURCES:
        return _Problem((name,), "reserved platform name", f"{', '.join(_RUN_SOURCES)} are the gateway's own")
    if not _PLATFORM_NAME.fullmatch(name):
        return _Problem((name,), "invalid platform name", "use 1-32 lowercase letters, digits or '_', starting "
                                                          "with a letter (the name the plugin registers)")
    return None


class Platforms(_Section):
    """Per-platform settings; any other key is a plugin's platform (``PluginPlatformSection``)."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, PluginPlatformSection] = Field(init=False)

    telegram: TelegramPlatform = Field(default_factory=TelegramPlatform)
    discord: DiscordPlatform = Field(default_factory=dict, validate_default=True)  # its default is in the home
    slack: SlackPlatform = Field(default_factory=SlackPlatform)
    webhook: WebhookPlatform = Field(default_factory=WebhookPlatform)
    callback: CallbackPlatform = Field(default_factory=CallbackPlatform)
    github: GitHubPlatform = Field(default_factory=GitHubPlatform)
    gitlab: GitLabPlatform = Field(default_factory=GitLabPlatform)

    @model_validator(mode="before")
    @classmethod
    def _plugin_platforms(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            builtin = list(cls.model_fields)
            _raise_if([problem for name, value in data.items() if str(name) not in cls.model_fields
                       and (problem := _plugin_section_problem(str(name), value, builtin))])
        return data

    @property
    def plugin_sections(self) -> dict[str, PluginPlatformSection]:
        """The sections of plugins' platforms, by platform name."""
        return dict(self.model_extra or {})

    @model_validator(mode="after")
    def _forge_tokens_set(self) -> Self:
        _raise_if([
            _Problem((route.deliver_to, "token"), f"required: route {name!r} delivers to {route.deliver_to}",
                     f"set a token that may comment on issues and pull requests, or change "
                     f"platforms.webhook.routes.{name}.deliver_to")
            for name, route in self.webhook.routes.items()
            if route.deliver_to in FORGES and not getattr(self, route.deliver_to).enabled
        ])
        return self

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



RESERVED_PLATFORMS = frozenset((*Platforms.model_fields, *_RUN_SOURCES))
"""Names no plugin's platform may take: the built-in platforms and the gateway's own sources of runs."""
