"""What every section shares: the frozen section base, the loader's context, common field validators."""

from __future__ import annotations

import os
from collections.abc import Mapping
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


def _unknown_toolsets(names: str | list[str], *, plugins: bool, loc: _Loc = ()) -> list[_Problem]:
    items = [(loc, names)] if isinstance(names, str) else [((*loc, i), n) for i, n in enumerate(names)]
    extra = "; MCP and plugin toolsets start with mcp- or plugin-" if plugins else ""
    return [_Problem(at, f"unknown toolset {name!r}",
                     f"{_suggest(name, list(TOOLSETS))}{extra}")
            for at, name in items
            if not (validate_toolset(name) or (plugins and name.startswith(_PLUGIN_PREFIXES)))]


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


_StrOrList = Annotated[str | list[str], BeforeValidator(_str_or_list)]
_AuthPlatform = Annotated[str, _one_of(_CHAT_PLATFORMS, "platform")]
_ToolsetPlatform = Annotated[str, _one_of(_TOOLSET_PLATFORMS, "platform")]


class _Section(BaseModel):
    """A config section: unknown keys are errors, values never change after loading."""

    model_config = ConfigDict(extra="forbid", frozen=True)

