"""What plugins add to a gateway besides their tools: platforms, chat commands and hooks.

``load_gateway_plugins`` loads the configured plugins under the operator's rules (``plugins.allow_override``;
the built-in platform and command names stay the gateway's). ``enabled_plugin_platforms`` validates each
enabled ``platforms.<name>`` plugin section by its plugin's own config model, errors naming the key path;
``check_with_plugins`` adds the command names of ``commands`` (a plugin's are only known once it has loaded).
``PluginParts`` installs the plugins' commands (routed like the built-in ones) and hooks (``model_tools``) at
start and takes them out at stop. The adapters are built by ``gateway.adapters.build_adapters``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, SecretStr, ValidationError

import model_tools
from gateway.commands.base import COMMANDS, Command, CommandContext, Handler, add_command, remove_command
from gateway.config import Config, ConfigError
from gateway.config.errors import _SECRET_FIELDS, _suggest, from_validation_error
from gateway.config.platforms import RESERVED_PLATFORMS, PluginPlatformSection
from tools.plugins import LoadedPlugins, PluginCommand, PluginPlatform, load_plugins

logger = logging.getLogger(__name__)


def load_gateway_plugins(cfg: Config) -> LoadedPlugins:
    """The plugins of ``cfg.plugins``, loaded (see ``tools.plugins.load_plugins``)."""
    return load_plugins(cfg.plugins.dir, entry_points=cfg.plugins.entry_points,
                        allow_override=cfg.plugins.allow_override, reserved_platforms=RESERVED_PLATFORMS,
                        reserved_commands=COMMANDS.keys())


@dataclass(frozen=True, slots=True)
class EnabledPlatform:
    """A plugin's platform the config turns on, with its section validated by the plugin's model."""

    platform: PluginPlatform
    settings: BaseModel
    secrets: tuple[str, ...] = field(default=())
    """Secret values of its section (for the log redaction filter)."""


def _not_provided(name: str, section: PluginPlatformSection, plugins: LoadedPlugins) -> ConfigError:
    status = next((s for s in plugins.statuses if s.name == section.plugin), None)
    if status is None:
        why = (f"no plugin {section.plugin!r} was found (plugins.dir, entry points): install it, or set "
               f"platforms.{name}.enabled: false")
    elif not status.ok:
        why = f"plugin {section.plugin!r} failed to load: {status.error}"
    else:
        why = f"plugin {section.plugin!r} provides {', '.join(status.platforms) or 'no platform'}"
    return ConfigError(f"platforms.{name}", f"no loaded plugin provides platform {name!r}", why)


def _secrets(settings: BaseModel, raw: Mapping[str, Any]) -> tuple[str, ...]:
    """SecretStr values of the validated settings, and strings under secret-named keys of the raw section."""
    found = [value.get_secret_value() for name in type(settings).model_fields
             if isinstance(value := getattr(settings, name), SecretStr)]
    found += [value for key, value in raw.items() if key in _SECRET_FIELDS and isinstance(value, str)]
    return tuple(s for s in found if s)


def enabled_plugin_platforms(cfg: Config, plugins: LoadedPlugins) -> dict[str, EnabledPlatform]:
    """Each enabled plugin platform section, validated by the loaded plugin that provides it; one ConfigError
    listing every problem (a platform no loaded plugin provides, a section its model refuses)."""
    errors: list[ConfigError] = []
    enabled: dict[str, EnabledPlatform] = {}
    for name, section in cfg.platforms.plugin_sections.items():
        if not section.enabled:
            continue
        platform = plugins.platforms.get(name)
        if platform is None:
            errors.append(_not_provided(name, section, plugins))
        elif platform.plugin != section.plugin:
            errors.append(ConfigError(f"platforms.{name}.plugin", f"platform {name!r} comes from plugin "
                                      f"{platform.plugin!r}", f"write plugin: {platform.plugin}"))
        else:
            try:
                settings = platform.config_model.model_validate(section.settings)
            except ValidationError as exc:
                errors += [ConfigError(".".join(p for p in (f"platforms.{name}", e.path) if p), e.message, e.hint)
                           for e in from_validation_error(exc, platform.config_model).errors]
            else:
                enabled[name] = EnabledPlatform(platform, settings, _secrets(settings, section.settings))
    if errors:
        raise ConfigError.combine(errors)
    return enabled


def _unknown_commands(cfg: Config, plugins: LoadedPlugins) -> list[ConfigError]:
    """Names in ``commands.disabled`` / ``commands.admin_only`` that are neither built in nor a loaded plugin's."""
    known = sorted({*COMMANDS, *plugins.commands})
    return [ConfigError(f"commands.{key}", f"unknown command {name!r}",
                        f"{_suggest(name, known, allowed=False)} no built-in command and no loaded plugin's has this "
                        "name: correct it, remove it, or load the plugin that provides it (plugins.dir, "
                        "plugins.entry_points)".lstrip())
            for key in ("disabled", "admin_only") for name in getattr(cfg.commands, key) if name not in known]


def check_with_plugins(cfg: Config, plugins: LoadedPlugins, *, platforms: bool = True
                       ) -> dict[str, EnabledPlatform]:
    """What only the loaded plugins settle: the names in ``commands``, and with ``platforms`` the enabled plugin
    platform sections (``enabled_plugin_platforms``, whose result this returns); one ConfigError listing every
    problem."""
    errors = _unknown_commands(cfg, plugins)
    enabled: dict[str, EnabledPlatform] = {}
    if platforms:
        try:
            enabled = enabled_plugin_platforms(cfg, plugins)
        except ConfigError as exc:
            errors += exc.errors
    if errors:
        raise ConfigError.combine(errors)
    return enabled


def _command_handler(command: PluginCommand) -> Handler:
    """The plugin's handler as a command handler: sync or async, and a failure answered, not raised."""
    async def run(ctx: CommandContext) -> str:
        try:
            reply = command.handler(ctx)
            if inspect.isawaitable(reply):
                reply = await reply
        except Exception:
            logger.exception("command /%s of plugin %s failed", command.name, command.plugin)
            return f"/{command.name} failed; the gateway's log says why."
        return str(reply)
    return run


class PluginParts:
    """The commands and hooks of loaded plugins, installed into this process; ``remove`` takes them out."""

    def __init__(self) -> None:
        self._commands: list[Command] = []
        self._hooks: list[tuple[str, Callable[..., Any]]] = []

    def install(self, plugins: LoadedPlugins) -> None:
        """Register each plugin command (as ``/name``) and hook (``model_tools.register_hook``)."""
        for hook in plugins.hooks:
            model_tools.register_hook(hook.kind, hook.fn)  # type: ignore[arg-type]  # its kind was checked at load
            self._hooks.append((hook.kind, hook.fn))
        for command in plugins.commands.values():
            entry = Command(command.name, command.description, _command_handler(command), command.admin_only)
            add_command(entry)
            self._commands.append(entry)

    def remove(self) -> None:
        """Unregister what ``install`` registered."""
        for kind, fn in self._hooks:
            model_tools.unregister_hook(kind, fn)  # type: ignore[arg-type]
        for entry in self._commands:
            remove_command(entry)
        self._hooks.clear()
        self._commands.clear()
