"""The ``store`` section: the database URL (its default in the home), and keeping its password out of sight."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import ValidationInfo, field_validator, model_validator

from gateway.config.base import _context, _resolve_path, _Section
from gateway.config.discovery import default_store_url, gateway_home
from gateway.config.errors import _invalid

_STORE_FORMS = ("sqlite:///PATH, sqlite+aiosqlite:///PATH, postgresql://USER:PASSWORD@HOST/DB "
                "or postgresql+asyncpg://USER:PASSWORD@HOST/DB")
_SQLITE_SCHEMES = ("sqlite", "sqlite+aiosqlite")


class StoreSettings(_Section):
    """Where sessions, the inbox/outbox and cron jobs are persisted (default: ``state.db`` in the home)."""

    url: str

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
