"""Gateway configuration: one YAML file, ``${VAR}`` interpolation, typed and validated settings.

Every problem surfaces as a :class:`ConfigError` naming the dotted key path, what is wrong and how
to fix it; all problems found in one pass are reported together. Modules by concern: ``discovery``
(where the config and its ``.env`` are), ``loading`` (YAML to settings), ``interpolation``, ``errors``,
``root`` (the whole config), ``store``, ``platforms`` and ``sections`` (the rest).
"""

from gateway.config.approvals import ApprovalMode, ApprovalSettings
from gateway.config.base import _CHAT_PLATFORMS
from gateway.config.discovery import cli_command, discover_config, dotenv_file, gateway_home, load_env_file
from gateway.config.errors import ConfigError
from gateway.config.loading import default_config, load_config, load_store_config, parse_config
from gateway.config.platforms import (
    CallbackPlatform,
    CallbackTarget,
    DiscordPlatform,
    Platforms,
    SlackPlatform,
    TelegramPlatform,
    TelegramRateLimit,
    WebhookPlatform,
    WebhookRoute,
)
from gateway.config.root import Config, StoreConfig
from gateway.config.sections import (
    AuthSettings,
    CronSettings,
    GatewaySettings,
    HttpSettings,
    LimitsSettings,
    LoggingSettings,
    McpServer,
    ModelSettings,
    PlatformAuth,
    PluginSettings,
    SandboxLimitSettings,
    ToolSearchSettings,
    ToolsSettings,
    WebSettings,
)
from gateway.config.store import StoreSettings

__all__ = [
    "_CHAT_PLATFORMS",
    "ApprovalMode",
    "ApprovalSettings",
    "AuthSettings",
    "CallbackPlatform",
    "CallbackTarget",
    "Config",
    "ConfigError",
    "CronSettings",
    "DiscordPlatform",
    "GatewaySettings",
    "HttpSettings",
    "LimitsSettings",
    "LoggingSettings",
    "McpServer",
    "ModelSettings",
    "PlatformAuth",
    "Platforms",
    "PluginSettings",
    "SandboxLimitSettings",
    "SlackPlatform",
    "StoreConfig",
    "StoreSettings",
    "TelegramPlatform",
    "TelegramRateLimit",
    "ToolSearchSettings",
    "ToolsSettings",
    "WebSettings",
    "WebhookPlatform",
    "WebhookRoute",
    "cli_command",
    "default_config",
    "discover_config",
    "dotenv_file",
    "gateway_home",
    "load_config",
    "load_env_file",
    "load_store_config",
    "parse_config",
]
