"""What every section shares: the frozen section base, the loader's context, common field validators."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, SecretStr, ValidationInfo

from gateway.config.errors import _invalid, _Loc, _Problem, _suggest
from toolsets import ALL_NAMES, TOOLSETS, resolve_toolset, validate_toolset

_CHAT_PLATFORMS = ("telegram", "discord", "slack")
_TOOLSET_PLATFORMS = (*_CHAT_PLATFORMS, "webhook", "cron")
_PLUGIN_PREFIXES = ("mcp-", "plugin-")
_RUN_SOURCES = ("cron", "api", "cli")  # where runs come from besides the configured platforms
_PLATFORM_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")  # what a plugin's platform may be called



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


def _unknown_toolsets(names: str | list[str], *, plugins: bool, loc: _Loc = (),
                      platforms: Iterable[str] | None = None) -> list[_Problem]:
    """Problems for names no toolset has. With ``plugins``, tool sources' (mcp-, plugin-) pass, and so does
    ``hermes-<platform>`` of a plugin's platform (in ``platforms``; None: the check is left to the whole config)."""
    items = [(loc, names)] if isinstance(names, str) else [((*loc, i), n) for i, n in enumerate(names)]
    extra = ("; MCP and plugin toolsets start with mcp- or plugin-, a plugin platform's is hermes-<platform> "
             "(with its section platforms.<platform>)") if plugins else ""

    def plugin_platform(name: str) -> bool:
        platform = name.removeprefix("hermes-")
        return (name != platform and _PLATFORM_NAME.fullmatch(platform) is not None
                and (platforms is None or platform in platforms))

    return [_Problem(at, f"unknown toolset {name!r}", f"{_suggest(name, list(TOOLSETS))}{extra}")
            for at, name in items
            if not (validate_toolset(name) or (plugins and (name.startswith(_PLUGIN_PREFIXES)
                                                            or plugin_platform(name))))]


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


def _platform_shaped(value: str) -> str:
    if not _PLATFORM_NAME.fullmatch(value):
        raise _invalid("unknown platform", _suggest(value, _TOOLSET_PLATFORMS))
    return value


def _unknown_platforms(toolsets: Mapping[str, str | list[str]], auth_platforms: Iterable[str], admins: list[str],
                       plugin_platforms: Iterable[str]) -> list[_Problem]:
    """Platform names used as ``toolsets`` and ``auth.platforms`` keys, in ``auth.admins`` and in ``hermes-<name>``
    toolsets that are neither built in (for that use) nor a plugin's platform (one with a ``platforms.<name>``
    section naming its plugin)."""
    plugins = tuple(plugin_platforms)
    hint = "; a plugin's platform needs its section platforms.<name> with plugin: <plugin name>"
    problems = [_Problem(("toolsets", name), "unknown platform",
                         _suggest(name, (*_TOOLSET_PLATFORMS, *plugins)) + hint)
                for name in toolsets if name not in (*_TOOLSET_PLATFORMS, *plugins)]
    problems += [_Problem(("auth", "platforms", name), "unknown platform",
                          _suggest(name, (*_CHAT_PLATFORMS, *plugins)) + hint)
                 for name in auth_platforms if name not in (*_CHAT_PLATFORMS, *plugins)]
    problems += [_Problem(("auth", "admins", i), f"invalid admin {admin!r}",
                          f"write <platform>:<user_id>, platform one of {', '.join((*_CHAT_PLATFORMS, *plugins))}")
                 for i, admin in enumerate(admins) if admin.partition(":")[0] not in (*_CHAT_PLATFORMS, *plugins)]
    problems += [p for platform, names in toolsets.items()
                 for p in _unknown_toolsets(names, plugins=True, loc=("toolsets", platform), platforms=plugins)]
    return problems


def _unknown_names(named: Iterable[tuple[_Loc, str]], builtin: Iterable[str], plugin_platforms: Iterable[str],
                   what: str) -> list[_Problem]:
    """Problems for platform names (at their key paths) that are neither ``builtin`` nor a plugin's platform."""
    known = (*builtin, *plugin_platforms)
    hint = "; a plugin's platform needs its section platforms.<name> with plugin: <plugin name>"
    return [_Problem(loc, f"unknown {what} {name!r}", _suggest(name, known) + hint)
            for loc, name in named if name not in known]


_StrOrList = Annotated[str | list[str], BeforeValidator(_str_or_list)]
# Which names are known is checked with the whole config (``_unknown_platforms``): plugins add platforms.
_AuthPlatform = Annotated[str, AfterValidator(_platform_shaped)]
_ToolsetPlatform = Annotated[str, AfterValidator(_platform_shaped)]


class _Section(BaseModel):
    """A config section: unknown keys are errors, values never change after loading."""

    model_config = ConfigDict(extra="forbid", frozen=True)

