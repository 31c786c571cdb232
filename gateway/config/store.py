"""The ``store`` section: the database URL (its default in the home), keeping its password out of sight, and how
long finished data is kept (``store.retention``, applied by gateway/retention.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import Field, ValidationInfo, field_validator, model_validator

from gateway.config.base import _context, _resolve_path, _Section
from gateway.config.discovery import default_store_url, gateway_home
from gateway.config.errors import _invalid

_STORE_FORMS = ("sqlite:///PATH, sqlite+aiosqlite:///PATH, postgresql://USER:PASSWORD@HOST/DB "
                "or postgresql+asyncpg://USER:PASSWORD@HOST/DB")
_SQLITE_SCHEMES = ("sqlite", "sqlite+aiosqlite")


_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_DURATION_HINT = "write a number of days or a duration such as 30d, 12h, 15m, 90s"
DEDUPE_FLOOR = 600.0
"""Seconds: the shortest dedupe window accepted (Slack retries an event up to three times within ~5 minutes)."""


def _duration(value: Any, *, forever: bool) -> float | None:
    """Seconds from a number of days or a ``30d``/``12h``/``15m``/``90s`` string; with ``forever``, null or 0 is
    None (keep forever)."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool) and value == 0):
        if forever:
            return None
        raise _invalid("must be a positive duration", _DURATION_HINT)
    if isinstance(value, bool):
        raise _invalid("must be a duration", _DURATION_HINT)
    if isinstance(value, int | float):
        seconds = float(value) * 86400
    elif isinstance(value, str) and value.strip()[-1:].lower() in _UNITS:
        text = value.strip()
        try:
            seconds = float(text[:-1]) * _UNITS[text[-1].lower()]
        except ValueError:
            raise _invalid(f"not a duration: {value!r}", _DURATION_HINT) from None
    else:
        raise _invalid(f"not a duration: {value!r}", _DURATION_HINT)
    if seconds < 0 or seconds != seconds:
        raise _invalid("must not be negative", _DURATION_HINT)
    if seconds == 0:
        return _duration(0, forever=forever)
    return seconds


class RetentionSettings(_Section):
    """How long finished data is kept (seconds; None: forever). Nothing unfinished or in doubt is ever pruned."""

    events: float | None = 30 * 86400.0
    cron_fires: float | None = 30 * 86400.0
    dedupe: float | None = 2 * 86400.0
    transcripts: float | None = 90 * 86400.0
    outbox: float | None = 7 * 86400.0
    usage: float | None = 400 * 86400.0
    tool_results: float | None = 7 * 86400.0  # long tool results stored in the workspace (.hermes/tool_results)
    interval: float = 600.0
    batch_size: int = Field(500, ge=1, le=10_000)

    @field_validator("events", "cron_fires", "dedupe", "transcripts", "outbox", "usage", "tool_results",
                     mode="before")
    @classmethod
    def _kept_for(cls, value: Any) -> float | None:
        return _duration(value, forever=True)

    @field_validator("interval", mode="before")
    @classmethod
    def _every(cls, value: Any) -> float | None:
        return _duration(value, forever=False)

    @field_validator("dedupe")
    @classmethod
    def _dedupe_floor(cls, value: float | None) -> float | None:
        if value is not None and value < DEDUPE_FLOOR:
            raise _invalid(f"must be at least {DEDUPE_FLOOR / 60:g} minutes: a platform redelivering an event "
                           "after its dedupe key is pruned would run it again",
                           "write 10m or more (default 2d: Telegram keeps undelivered updates for 24 hours)")
        return value


class StoreSettings(_Section):
    """Where sessions, the inbox/outbox and cron jobs are persisted (default: ``state.db`` in the home)."""

    url: str
    retention: RetentionSettings = Field(default_factory=RetentionSettings)

    @model_validator(mode="before")
    @classmethod
    def _home_default(cls, data: Any, info: ValidationInfo) -> Any:
        # The default follows the loader's env, not necessarily os.environ.
        if isinstance(data, Mapping) and "url" not in data:
            data = {**data, "url": default_store_url(gateway_home(_context(info).env))}
        return data

    @field_validator("url")
    @classmethod
    def _supported(cls, value: str, info: ValidationInfo) -> str:
        # Never echo the URL: it may carry a password.
        scheme, sep, rest = value.partition("://")
        if not sep:
            raise _invalid("not a database URL", f"use {_STORE_FORMS}")
        if scheme in _SQLITE_SCHEMES:
            if not rest.startswith("/") or len(rest) < 2:
                raise _invalid("sqlite URL has no file path",
                               "write sqlite:///relative/state.db or sqlite:////absolute/state.db")
            return _absolute_sqlite(scheme, rest[1:], info)
        if scheme not in ("postgresql", "postgresql+asyncpg") or not rest:
            raise _invalid(f"unsupported database URL scheme {scheme!r}", f"use {_STORE_FORMS}")
        return value


def _absolute_sqlite(scheme: str, target: str, info: ValidationInfo) -> str:
    """A relative SQLite file is resolved against the config file's directory, as every relative path in the
    config is, so each command opens the same database wherever it is run from."""
    path, query, params = target.partition("?")
    if path == ":memory:":
        return f"{scheme}:///{target}"
    return f"{scheme}:///{_resolve_path(Path(path), info)}{query}{params}"


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
