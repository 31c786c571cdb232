"""``check``: validate the config and summarise it, contacting nothing (``doctor`` does the live checks).

It loads the configured plugins as ``run`` does, so a plugin's platform section and the plugin command names
in ``commands`` are validated here too; a plugin that fails to load is a warning (the gateway runs without it).

The summary, warnings and ``config OK`` go to stderr; ``--show`` prints the resolved YAML (secrets masked)
to stdout, so it can be redirected on its own. Besides the secret fields, both mask credentials inside URLs
(userinfo, token-like query parameters), MCP ``args`` that carry a token, and any configured secret or
known token shape wherever it appears.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from gateway.cli.common import config_parent, config_path

if TYPE_CHECKING:
    from gateway.config import Config
    from gateway.config.platforms import PluginPlatformSection
    from gateway.plugins import EnabledPlatform
    from tools.plugins import LoadedPlugins, PluginStatus

ORDER = 5
MASK = "***"

# Words that mark a query parameter, an option or a KEY=VALUE argument as carrying a credential.
_SECRET_WORDS = frozenset({"token", "key", "apikey", "secret", "password", "passwd", "pass", "pwd", "auth",
                           "authorization", "bearer", "sig", "signature", "credential", "credentials", "session",
                           "sessionid", "cookie"})


def _secret_name(name: str) -> bool:
    """``api_key``, ``--access-token``, ``X-Api-Key``, ``authToken``: any word of the name is a credential word."""
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()
    return any(word in _SECRET_WORDS for word in re.split(r"[^a-z0-9]+", words))


def mask_url(text: str) -> str:
    """``text`` with a URL's userinfo and its token-like query values masked (anything else unchanged)."""
    try:
        parts = urlsplit(text)
    except ValueError:
        return text
    if not (parts.scheme and parts.netloc):
        return text
    netloc = f"{MASK}@{parts.netloc.rpartition('@')[2]}" if "@" in parts.netloc else parts.netloc
    query = "&".join(f"{name}={MASK}" if sep and value and _secret_name(name) else pair
                     for pair in parts.query.split("&") for name, sep, value in [pair.partition("=")])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def mask_args(args: list[str]) -> list[str]:
    """A command line with credentials masked: ``--token X``, ``--api-key=X``, ``API_KEY=X`` and URLs in it."""
    masked: list[str] = []
    hide_next = False
    for arg in args:
        name, sep, value = arg.partition("=")
        if hide_next and not arg.startswith("-"):
            masked.append(MASK)
        elif sep and value and "://" not in name and _secret_name(name):
            masked.append(f"{name}={MASK}")
        else:
            masked.append(mask_url(arg))
        hide_next = arg.startswith("-") and not sep and _secret_name(arg)
    return masked


def _mask_strings(value: Any, mask: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, dict):
        return {k: _mask_strings(v, mask) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_strings(v, mask) for v in value]
    return value


def _plugin_section(section: PluginPlatformSection, enabled: EnabledPlatform | None) -> dict[str, Any]:
    """A plugin platform's section for ``--show``: validated by its plugin's model when enabled (SecretStr
    fields masked), as written otherwise; keys named like credentials masked either way."""
    from gateway.config.root import _plain

    settings = _plain(enabled.settings) if enabled else dict(section.settings)
    shown = {key: MASK if value and _secret_name(key) else value for key, value in settings.items()}
    return {"plugin": section.plugin, "enabled": section.enabled, **shown}


def _shown(cfg: Config, redact: Callable[[str], str], plugin_platforms: dict[str, EnabledPlatform]
           ) -> dict[str, Any]:
    """The resolved config for ``--show``: secret fields, URL credentials and MCP args' tokens masked."""
    data = cfg.masked()
    for server in data["mcp_servers"].values():
        server["args"] = mask_args(server["args"])
    for name, section in cfg.platforms.plugin_sections.items():
        data["platforms"][name] = _plugin_section(section, plugin_platforms.get(name))
    return _mask_strings(data, lambda text: mask_url(redact(text)))


def _toolsets(names: str | list[str]) -> str:
    """``hermes-telegram (11 tools)``: the toolsets and how many tools they give (MCP and plugin tools are
    only known once their source is loaded)."""
    from toolsets import ALL_NAMES, SOURCE_PREFIXES, resolve_toolset

    listed = [names] if isinstance(names, str) else names
    if any(name in ALL_NAMES for name in listed):
        return f"{', '.join(listed)} (every tool)"
    sources = [name for name in listed if name.startswith(SOURCE_PREFIXES)]
    count = len(resolve_toolset([name for name in listed if name not in sources]))
    extra = f" + the tools of {', '.join(sources)}" if sources else ""
    return f"{', '.join(listed)} ({count} tools{extra})"


def _plugin_line(status: PluginStatus) -> str:
    parts = [f"{len(status.tools)} tools", *(f"{what} {', '.join(names)}" for what, names in (
        ("platforms", status.platforms), ("commands", [f"/{c}" for c in status.commands]),
        ("hooks", status.hooks)) if names)]
    return f"  {status.name}: {'; '.join(parts)} (from {status.source})"


def _plugin_failures(plugins: LoadedPlugins) -> list[str]:
    """A warning per plugin that failed to load, naming the setting that brought it in."""
    return [f"warning: plugin {s.name}: not loaded: {s.error}; fix: correct it, or remove it from "
            f"{'plugins.entry_points (uninstall it)' if s.source.startswith('entry point') else 'plugins.dir'}"
            for s in plugins.statuses if not s.ok]


def _summary(cfg: Config, path: Path | None, redact: Callable[[str], str], plugins: LoadedPlugins,
             plugin_platforms: dict[str, EnabledPlatform]) -> list[str]:
    from toolsets import toolset_for_platform

    p = cfg.platforms
    chat = [name for name in ("telegram", "slack", "discord") if getattr(p, name).enabled]
    routes = p.webhook.routes if p.webhook.enabled else {}
    enabled = [*chat, *(f"{name} (plugin {e.platform.plugin})" for name, e in plugin_platforms.items()),
               *([f"webhook ({len(routes)} routes)"] if routes else []),
               *([f"callback ({len(p.callback.targets)} targets)"] if p.callback.targets else [])]
    lines = [f"config: {path}" if path else "config: none found, the embedded defaults",
             f"model: {cfg.model.name} at {mask_url(redact(cfg.model.base_url))}",
             f"platforms: {', '.join(enabled) or 'none enabled'}"]
    if routes:
        lines.append("webhook routes:")
        lines += [f"  {name}: POST /webhooks/{name}, {r.scheme} signatures, delivers to {r.deliver_to}"
                  for name, r in routes.items()]
    loaded = [status for status in plugins.statuses if status.ok]
    if loaded:
        lines.append("plugins:")
        lines += [_plugin_line(status) for status in loaded]
    lines.append("toolsets:")
    lines += [f"  {name}: {_toolsets(toolset_for_platform(name, cfg.toolsets))}"
              for name in (*chat, *plugin_platforms, "cron")]
    lines += [f"  webhook {name}: {_toolsets(r.toolset)}" for name, r in routes.items()]
    if cfg.mcp_servers:
        servers = ", ".join(f"{name} ({'http' if s.url else 'stdio'})" for name, s in cfg.mcp_servers.items())
        lines.append(f"mcp servers: {servers}; not contacted (`hermes-gateway doctor` starts them)")
    return lines


def _cmd_check(args: argparse.Namespace) -> int:
    import yaml

    from gateway.app import install_source_toolsets
    from gateway.config import load_config
    from gateway.logs import Redactor
    from gateway.plugins import check_with_plugins, load_gateway_plugins
    from gateway.probes import config_findings
    from gateway.tool_sandbox import detect_isolation
    from tools.registry import registry
    from toolsets import remove_source_toolset

    path = config_path(args)
    cfg = load_config(path)
    registry.discover_builtin_tools()  # before the plugins, so replacing a built-in is judged as run judges it
    plugins = load_gateway_plugins(cfg)
    created: list[str] = []
    try:
        plugin_platforms = check_with_plugins(cfg, plugins)
        created = install_source_toolsets(cfg, plugins)  # hermes-<plugin platform> and plugin-* counted as at run
        # A configured secret repeated in a URL or an argument, token shapes.
        redact = Redactor([*cfg.secret_values(), *(s for e in plugin_platforms.values() for s in e.secrets)])
        if args.show:
            print(yaml.safe_dump(_shown(cfg, redact, plugin_platforms), sort_keys=False, allow_unicode=True), end="")
        for line in _summary(cfg, path, redact, plugins, plugin_platforms):
            print(line, file=sys.stderr)
    finally:
        for name in created:
            remove_source_toolset(name)
        plugins.unload()
    print(f"tool sandbox: {detect_isolation(cfg, path).describe()}", file=sys.stderr)
    for line in _plugin_failures(plugins):
        print(line, file=sys.stderr)
    for finding in config_findings(cfg):
        if finding.status != "ok":
            print(f"warning: {finding.check}: {finding.message}; fix: {finding.fix}", file=sys.stderr)
    print("config OK", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``check``."""
    check = sub.add_parser("check", parents=[config_parent()],
                           help="validate the config and summarise it (contacts nothing; see doctor)")
    check.add_argument("--show", action="store_true", help="also print the resolved config, secrets masked")
    check.set_defaults(func=_cmd_check)
