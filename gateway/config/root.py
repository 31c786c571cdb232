"""The whole configuration (:class:`Config`) and the part admin commands read (:class:`StoreConfig`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import AfterValidator, BaseModel, Field, PrivateAttr, SecretStr, field_validator, model_validator

from gateway.config.approvals import ApprovalSettings
from gateway.config.base import (
    _CHAT_PLATFORMS,
    _Section,
    _StrOrList,
    _ToolsetPlatform,
    _unknown_names,
    _unknown_platforms,
    _unknown_toolsets,
)
from gateway.config.delegation import DelegationSettings
from gateway.config.errors import _raise_if
from gateway.config.media import MediaSettings
from gateway.config.messaging import _CALLER_PLATFORMS, MessagingSettings
from gateway.config.platforms import _DELIVERY_PLATFORMS, Platforms
from gateway.config.sections import (
    AuthSettings,
    CommandSettings,
    CronSettings,
    GatewaySettings,
    HttpSettings,
    LimitsSettings,
    LoggingSettings,
    McpServer,
    ModelSettings,
    PluginSettings,
    SessionPolicy,
    ToolSearchSettings,
    ToolsSettings,
    WebSettings,
    _check_server_name,
)
from gateway.config.store import StoreSettings, _mask_url_password, _url_passwords


class _Root(_Section):
    """A validated config, remembering the file it came from."""

    _source: Path | None = PrivateAttr(None)

    @property
    def source(self) -> Path | None:
        """The absolute path of the config file this was loaded from; None for data or the embedded defaults."""
        return self._source


# Sections whose defaults depend on the loader's env (the home) are validated from {} when absent.
def _home_relative() -> Any:
    return Field(default_factory=dict, validate_default=True)


class Config(_Root):
    """The whole gateway configuration."""

    model: ModelSettings = Field(default_factory=ModelSettings)
    store: StoreSettings = _home_relative()
    http: HttpSettings = Field(default_factory=HttpSettings)
    gateway: GatewaySettings = _home_relative()
    platforms: Platforms = _home_relative()
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
    commands: CommandSettings = Field(default_factory=CommandSettings)
    sessions: SessionPolicy = Field(default_factory=SessionPolicy)
    approvals: ApprovalSettings = Field(default_factory=ApprovalSettings)
    media: MediaSettings = Field(default_factory=MediaSettings)
    messaging: MessagingSettings = Field(default_factory=MessagingSettings)
    delegation: DelegationSettings = Field(default_factory=DelegationSettings)

    @field_validator("toolsets")
    @classmethod
    def _known_toolsets(cls, value: dict[str, str | list[str]]) -> dict[str, str | list[str]]:
        _raise_if([p for platform, names in value.items()
                   for p in _unknown_toolsets(names, plugins=True, loc=(platform,))])
        return value

    @model_validator(mode="after")
    def _known_platforms(self) -> Self:
        plugins = tuple(self.platforms.plugin_sections)
        # Sections check their toolset names alone, letting any hermes-<name> through: whether <name> is a plugin's
        # platform is known only here.
        named: list[tuple[tuple[str | int, ...], str | list[str]]] = [
            *((("approvals", "toolsets", name), name) for name in self.approvals.toolsets),
            (("delegation", "default_toolsets"), self.delegation.default_toolsets),
            *((("platforms", "webhook", "routes", route, "toolset"), settings.toolset)
              for route, settings in self.platforms.webhook.routes.items())]
        _raise_if([*_unknown_platforms(self.toolsets, self.auth.platforms, self.auth.admins, plugins),
                   *(p for loc, names in named for p in _unknown_toolsets(names, plugins=True, loc=loc,
                                                                           platforms=plugins)),
                   *_unknown_names(self._deliveries(), _DELIVERY_PLATFORMS, plugins, "delivery platform"),
                   *_unknown_names(((("messaging", "targets", name, "platform"), target.platform)
                                    for name, target in self.messaging.targets.items()),
                                   _CHAT_PLATFORMS, plugins, "platform"),
                   *_unknown_names(((("messaging", "targets", name, "users", i), user.partition(":")[0])
                                    for name, target in self.messaging.targets.items()
                                    for i, user in enumerate(target.users) if user != "*"),
                                   _CALLER_PLATFORMS, plugins, "platform")])
        return self

    def _deliveries(self) -> Iterator[tuple[tuple[str | int, ...], str]]:
        """The platform of each ``<platform>:<chat>`` delivery target (webhook routes, API clients), at its key."""
        routes = ((("platforms", "webhook", "routes", name, "deliver_to"), route.deliver_to)
                  for name, route in self.platforms.webhook.routes.items())
        clients = ((("http", "api", "clients", name, "deliver_to", i), spec)
                   for name, client in self.http.api.clients.items() for i, spec in enumerate(client.deliver_to))
        for loc, spec in (*routes, *clients):
            platform, sep, _ = spec.partition(":")
            if sep:  # none, github and gitlab name no platform
                yield loc, platform

    def masked(self) -> dict[str, Any]:
        """The resolved config as JSON-able data, every secret shown as ``"***"`` (empty ones as null)."""
        data = _plain(self)
        data["store"]["url"] = _mask_url_password(self.store.url)
        return data

    def secret_values(self) -> list[str]:
        """Every non-empty secret string (for the log redaction filter), without duplicates."""
        found = [*_secrets_in(self), *_url_passwords(self.store.url)]
        return list(dict.fromkeys(s for s in found if s))


# What StoreConfig reads of a config file: a whole section (None), or only the keys listed.
STORE_CONFIG_KEYS: dict[str, tuple[str, ...] | None] = {
    "store": None,
    "auth": ("pairing_code_ttl_seconds", "max_pending_codes"),
    "cron": ("sync_interval_seconds",),
    "logging": None,
}


class StoreConfig(_Root):
    """What the admin commands (``runs``, ``pairing``, ``cron``) need: the store, the pairing limits, the
    cron sync interval and logging. Only the keys in ``STORE_CONFIG_KEYS`` are read; others keep their defaults."""

    store: StoreSettings = _home_relative()
    auth: AuthSettings = Field(default_factory=AuthSettings)
    cron: CronSettings = Field(default_factory=CronSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)

    def secret_values(self) -> list[str]:
        """The store URL's password, if any (for the log redaction filter)."""
        return _url_passwords(self.store.url)


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
