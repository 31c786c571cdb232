"""The sections other than the store and the platforms: model, http, gateway, auth, limits, cron, sessions, tools,
MCP, plugins, web, logging."""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
import zoneinfo
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.config.base import (
    _CHAT_PLATFORMS,
    _PLATFORM_NAME,
    _AuthPlatform,
    _check_http_url,
    _context,
    _empty_to_none,
    _resolve_path,
    _Section,
    _StrOrList,
    _unknown_toolsets,
)
from gateway.config.discovery import gateway_home
from gateway.config.errors import _invalid, _Problem, _raise_if, _suggest
from gateway.config.platforms import _check_deliver_to

_MCP_SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")


def _check_price(value: Any) -> float:
    try:
        price = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        price = math.nan
    if not math.isfinite(price) or price < 0:
        raise _invalid("must be a price of 0 or more",
                       f"got {value!r}: write US dollars per million tokens as a plain number, e.g. 0.15")
    return price


class ModelPrice(_Section):
    """What a model costs, in US dollars per million tokens of its requests (input) and answers (output)."""

    input: Annotated[float, BeforeValidator(_check_price)]
    output: Annotated[float, BeforeValidator(_check_price)]


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
    # The run's user's memory notes in its system prompt (newest first), at most this many characters; 0: none.
    memory_prompt_chars: int = Field(2000, ge=0)
    # Tokens a request's history may use; set, older turns are summarised (compressed) past compress_at of it,
    # the last keep_recent_turns messages kept verbatim. None: trim to history_messages / history_tokens.
    context_tokens: int | None = Field(None, ge=256)
    compress_at: float = Field(0.75, gt=0, lt=1)
    keep_recent_turns: int = Field(6, ge=1)
    # Models a chat may switch its session to with /model (``name`` is always allowed); empty: no switching.
    allowed: list[str] = Field(default_factory=list)
    # Per model name, its price (``/usage`` shows the cost of the tokens used with it); unlisted: cost unknown.
    prices: dict[str, ModelPrice] = Field(default_factory=dict)
    # Whether the model sees images (as image content parts): auto decides by the model's name (gateway/media);
    # false sends none and offers the vision_analyze tool when media.vision is set.
    vision: Literal["auto", True, False] = "auto"

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


_API_CLIENT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _check_api_client_name(name: str) -> str:
    if not _API_CLIENT_NAME.fullmatch(name):
        raise _invalid("invalid client name", "use 1-64 letters, digits, '_' or '-'")
    return name


class ApiClient(_Section):
    """A program allowed to use the HTTP API (gateway/api): its key, the tools its runs get, where they may
    deliver (``none`` always), how many of its runs may go on at once, and the model name it is shown."""

    key: SecretStr = Field(min_length=16)
    toolset: _StrOrList = "hermes-webhook"
    deliver_to: list[Annotated[str, AfterValidator(_check_deliver_to)]] = Field(default_factory=list)
    max_concurrent_runs: int = Field(4, ge=1)
    model_alias: str | None = Field(None, min_length=1)

    @field_validator("toolset")
    @classmethod
    def _known_toolsets(cls, value: str | list[str]) -> str | list[str]:
        _raise_if(_unknown_toolsets(value, plugins=True))
        return value


class ApiSettings(_Section):
    """``http.api``: the OpenAI-compatible endpoint and the runs API under ``/v1``."""

    enabled: bool = False
    clients: dict[Annotated[str, AfterValidator(_check_api_client_name)], ApiClient] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _distinct_keys(self) -> Self:
        seen: dict[str, str] = {}
        for name, client in self.clients.items():
            if (other := seen.setdefault(client.key.get_secret_value(), name)) != name:
                raise _invalid(f"same key as client {other!r}", "give every client its own key",
                               ("clients", name, "key"))
        return self


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


def _check_operator_token(value: Any) -> Any:
    # Checked here rather than by SecretStr's own constraints: their errors would echo the token.
    text = value.get_secret_value() if isinstance(value, SecretStr) else value
    if not isinstance(text, str) or len(text) < 16:
        raise _invalid("must be a secret token of at least 16 characters",
                       "e.g. ${HERMES_DASHBOARD_ALICE} set to the output of: openssl rand -hex 24")
    return value


class DashboardSettings(_Section):
    """``http.dashboard``: the operator's web console under ``/dashboard`` (gateway/dashboard)."""

    enabled: bool = False
    # Operator name -> login token; http.api_token also logs in, as operator "admin".
    operators: dict[Annotated[str, AfterValidator(_check_api_client_name)],
                    Annotated[SecretStr, BeforeValidator(_check_operator_token)]] = Field(default_factory=dict)
    session_idle_minutes: int = Field(60, ge=1)
    # Proxies whose X-Forwarded-Proto / X-Forwarded-For the dashboard believes (Secure cookies, login limits).
    trusted_proxies: list[Annotated[str, AfterValidator(_check_network)]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _distinct_tokens(self) -> Self:
        seen: dict[str, str] = {}
        for name, token in self.operators.items():
            if (other := seen.setdefault(token.get_secret_value(), name)) != name:
                raise _invalid(f"same token as operator {other!r}", "give every operator their own token",
                               ("operators", name))
        return self


class HttpSettings(_Section):
    """The one HTTP server (health, metrics, webhooks, run lookups, the dashboard)."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    api_token: Annotated[SecretStr | None, BeforeValidator(_empty_to_none)] = None
    max_body_bytes: int = Field(1048576, ge=1)
    # Slow and many clients (README: HTTP limits): deadlines in seconds, open connections, failed-request buckets.
    header_timeout: float = Field(10.0, gt=0)
    body_timeout: float = Field(30.0, gt=0)
    keepalive_timeout: float = Field(15.0, gt=0)
    max_connections: int = Field(512, ge=1)
    per_ip_burst: int = Field(200, ge=0)
    per_ip_rate: float = Field(2.0, gt=0)
    api: ApiSettings = Field(default_factory=ApiSettings)
    dashboard: DashboardSettings = Field(default_factory=DashboardSettings)

    @model_validator(mode="after")
    def _dashboard_login(self) -> Self:
        board = self.dashboard
        if board.enabled and self.api_token is None and not board.operators:
            raise _invalid("the dashboard is enabled but nobody can log in to it",
                           "set http.api_token, or add a token under http.dashboard.operators (e.g. "
                           "operators: {alice: ${HERMES_DASHBOARD_ALICE}}), or set http.dashboard.enabled: false",
                           ("dashboard", "enabled"))
        if board.enabled and self.api_token is not None:
            for name, token in board.operators.items():
                if token.get_secret_value() == self.api_token.get_secret_value():
                    raise _invalid("same token as http.api_token (which logs in as admin)",
                                   "give the operator their own token", ("dashboard", "operators", name))
        return self


# Each kind's floor when gateway.admission leaves it unset (lowered to the kind's ceiling when that is lower).
ADMISSION_FLOORS = {"chat": 16, "webhook": 16, "cron": 2}


class AdmissionFloor(_Section):
    """The fewest runs of a kind admission control lets go on at once, however unhealthy the gateway looks."""

    floor: int | None = Field(None, ge=1)  # None: ADMISSION_FLOORS' (at most the ceiling)


class CronAdmission(AdmissionFloor):
    """Cron runs have their own ceiling (chat's and webhooks' are gateway.max_concurrent_runs and
    gateway.max_concurrent_webhook_runs)."""

    ceiling: int = Field(16, ge=1)


class AdmissionSettings(_Section):
    """``gateway.admission``: how many runs go on at once follows measured health (event-loop lag, model latency;
    gateway/admission.py), between each kind's floor and ceiling. Off, each kind runs at its ceiling."""

    enabled: bool = True
    lag_target_ms: float = Field(5.0, gt=0)  # event-loop lag p99 above this lowers the limits
    interval: float = Field(0.25, gt=0, le=60)  # seconds between adjustments
    latency_tolerance: float = Field(2.0, ge=1)  # model latency above this times its long-term average lowers them
    chat: AdmissionFloor = Field(default_factory=AdmissionFloor)
    webhook: AdmissionFloor = Field(default_factory=AdmissionFloor)
    cron: CronAdmission = Field(default_factory=CronAdmission)


class GatewaySettings(_Section):
    """Concurrency, busy-session policy and shutdown behaviour of the core."""

    # What a chat message does while its session's run is busy (a chat changes it for itself with /busy): wait
    # after it, stop it and start, or steer it (joins the running agent loop before its next model call).
    busy: Literal["queue", "interrupt", "steer"] = "queue"
    # Processes running the agent loops (model requests, stream parsing, tool orchestration; gateway/agent_workers):
    # one per core by default, 0 runs them in the gateway's own process (small deployments, tests).
    agent_workers: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=0, le=64)
    # Ceilings of concurrent runs: chat (with background and API runs), and webhook runs of all routes together.
    max_concurrent_runs: int = Field(256, ge=1)
    max_concurrent_webhook_runs: int = Field(1000, ge=1)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    # A run the gateway stopped during this many times is failed (its user told once), not started again.
    max_run_attempts: int = Field(2, ge=1)
    tool_threads: int = Field(32, ge=1)
    stream_edit_interval: float = Field(1.0, gt=0)
    typing_delay: float = Field(1.0, ge=0)
    drain_timeout: float = Field(30.0, ge=0)
    group_sessions_per_user: bool = True
    loop_lag_warn_ms: float = Field(250.0, gt=0)
    workspace: Path

    @model_validator(mode="before")
    @classmethod
    def _home_default(cls, data: Any, info: ValidationInfo) -> Any:
        # Like the store, the default follows the loader's env, not necessarily os.environ.
        if isinstance(data, Mapping) and "workspace" not in data:
            data = {**data, "workspace": gateway_home(_context(info).env) / "workspace"}
        return data

    @field_validator("workspace")
    @classmethod
    def _resolve_workspace(cls, value: Path, info: ValidationInfo) -> Path:
        return _resolve_path(value, info)

    @model_validator(mode="after")
    def _floors_under_ceilings(self) -> Self:
        keys = {"chat": "max_concurrent_runs", "webhook": "max_concurrent_webhook_runs",
                "cron": "admission.cron.ceiling"}
        problems = []
        for kind, (_, ceiling) in self.run_limits().items():
            floor = getattr(self.admission, kind).floor
            if floor is not None and floor > ceiling:
                problems.append(_Problem(("admission", kind, "floor"),
                                         f"{floor} is above its ceiling gateway.{keys[kind]} ({ceiling})",
                                         f"lower it to at most {ceiling}, or raise gateway.{keys[kind]}"))
        _raise_if(problems)
        return self

    def run_limits(self) -> dict[str, tuple[int, int]]:
        """Each kind's (floor, ceiling) of concurrent runs: chat, webhook (all routes together) and cron; with
        admission off, each floor is its ceiling."""
        a = self.admission
        ceilings = {"chat": self.max_concurrent_runs, "webhook": self.max_concurrent_webhook_runs,
                    "cron": a.cron.ceiling}
        return {kind: (ceiling if not a.enabled else min(getattr(a, kind).floor or ADMISSION_FLOORS[kind], ceiling),
                       ceiling) for kind, ceiling in ceilings.items()}


_COMMAND_NAME = re.compile(r"[a-z0-9_]{1,32}")  # what a plugin's command may be called (tools/plugins.py)


def _check_command_names(value: list[str]) -> list[str]:
    """Built-in names (aliases as their command's name), and names shaped like a plugin's command: whether a
    loaded plugin has those is checked once plugins load (``gateway.plugins.check_with_plugins``)."""
    from gateway.commands import COMMANDS  # the registry imports this package: look it up when validating

    names = [name.lstrip("/") for name in value]
    invalid = [name for name in names if name not in COMMANDS and not _COMMAND_NAME.fullmatch(name)]
    if invalid:
        raise _invalid(f"unknown command {invalid[0]!r}",
                       f"{_suggest(invalid[0], sorted(COMMANDS))}; a plugin's command is 1-32 lowercase letters, "
                       "digits or '_'")
    return sorted({COMMANDS[name].name if name in COMMANDS else name for name in names})


class CommandSettings(_Section):
    """Chat commands this gateway turns off, and those only its admins may use (names without the slash)."""

    disabled: Annotated[list[str], AfterValidator(_check_command_names)] = Field(default_factory=list)
    admin_only: Annotated[list[str], AfterValidator(_check_command_names)] = Field(default_factory=list)


def _check_admin(value: str) -> str:
    platform, sep, user = value.partition(":")  # a plugin's platform is checked with the whole config
    if not sep or not user or not _PLATFORM_NAME.fullmatch(platform):
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
    # Tokens a process takes from a user's stored bucket at a time (gateway/limits.py): fewer database writes, and
    # up to this many minus one messages more per replica.
    local_allowance: int = Field(5, ge=1, le=100)
    run_max_tool_calls: int = Field(50, ge=1)
    run_max_tokens: int | None = Field(None, ge=1)
    user_max_model_calls_per_hour: int | None = Field(None, ge=1)
    user_max_tokens_per_hour: int | None = Field(None, ge=1)


def _check_zone(value: str) -> str:
    try:
        zoneinfo.ZoneInfo(value)
    except (ValueError, KeyError, OSError):
        close = difflib.get_close_matches(value, sorted(zoneinfo.available_timezones()), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise _invalid(f"unknown time zone {value!r}",
                       f"{hint}use an IANA name such as 'Europe/Berlin' or 'UTC'") from None
    return value


class CronSettings(_Section):
    """Scheduled runs."""

    timezone: Annotated[str, AfterValidator(_check_zone)] = "UTC"
    misfire_grace_seconds: float = Field(3600.0, ge=0)
    max_consecutive_failures: int = Field(3, ge=1)
    min_interval_seconds: int = Field(60, ge=1)
    max_jobs_per_user: int = Field(50, ge=1)
    sync_interval_seconds: float = Field(5.0, gt=0)


def _check_idle_minutes(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise _invalid(f"must be at least 1 minute, got {value}", "e.g. 240 for four hours; null never resets")
    return value


def _check_hour(value: int | None) -> int | None:
    if value is not None and not 0 <= value <= 23:
        raise _invalid(f"must be an hour from 0 to 23, got {value}", "e.g. 4 for 04:00; null: no daily reset")
    return value


class SessionPolicy(_Section):
    """When a chat's conversation starts afresh by itself (as with /new); the reply that follows says so."""

    # Minutes without a message after which the next one starts a new conversation; None: never.
    reset_after_idle_minutes: Annotated[int | None, AfterValidator(_check_idle_minutes)] = None
    # The first message after this hour of the day (in timezone) starts a new conversation; None: never.
    daily_reset_hour: Annotated[int | None, AfterValidator(_check_hour)] = None
    # The time zone of daily_reset_hour; None: cron.timezone.
    timezone: Annotated[str, AfterValidator(_check_zone)] | None = None


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
    """Python plugins: installed entry points and a directory of .py files and packages; ``allow_override``
    names the tools a plugin may replace (besides its own ``override=True``)."""

    dir: Path | None = None
    entry_points: bool = True
    allow_override: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)

    @field_validator("dir")
    @classmethod
    def _existing_dir(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        path = _resolve_path(value, info)
        if not path.is_dir():
            raise _invalid(f"not a directory: {path}", "create it, or remove the key")
        return path


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


class ExecuteCodeSettings(_Section):
    """The ``execute_code`` tool's scripts: its sandbox call's limits apply too (its network: tools.network)."""

    max_timeout: float = Field(300.0, gt=0, le=3600)  # the most a script's timeout argument may ask (default 30 s)
    memory_mb: int = Field(512, ge=64)  # address space of the script, at most tools.limits.memory_mb
    max_tool_calls: int = Field(50, ge=0, le=10_000)  # tool calls one script may make


class ToolsSettings(_Section):
    """Where tools run: the sandbox for commands and untrusted content (see README, Tool sandbox)."""

    sandbox: Literal["auto", "bwrap", "unshare", "uid", "none"] = "auto"
    sandbox_uid: int = Field(65534, ge=1)  # the sandbox's user when the gateway runs as root
    workers: int = Field(8, ge=1, le=64)  # per kind (with and without network); idle ones beyond one are stopped
    limits: SandboxLimitSettings = Field(default_factory=SandboxLimitSettings)
    execute_code: ExecuteCodeSettings = Field(default_factory=ExecuteCodeSettings)
    network: dict[str, bool] = Field(default_factory=dict)  # per tool: overrides what the tool declares
    # The characters the results of one model turn give the model together; past it the largest are stored in the
    # workspace (.hermes/tool_results) and the model sees a preview with the path.
    max_turn_result_chars: int = Field(200_000, ge=10_000)
    # Tool schemas cut to the JSON Schema subset strict servers accept (llama.cpp's grammars): for such servers.
    sanitize_schemas: bool = False


class LoggingSettings(_Section):
    """Log level and format."""

    level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"],
                     BeforeValidator(lambda v: v.upper() if isinstance(v, str) else v)] = "INFO"
    format: Literal["text", "json"] = "text"

