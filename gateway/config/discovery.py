"""Where the config lives: the home directory, the config file found without flags, its ``.env``, and the
exact ``hermes-gateway`` command line that finds the same config again (for hints the gateway prints)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

from dotenv import load_dotenv

HOME_ENV = "HERMES_GATEWAY_HOME"
CONFIG_ENV = "HERMES_GATEWAY_CONFIG"
DEFAULT_HOME = "~/.hermes-gateway"
CONFIG_NAME = "config.yaml"
DOTENV_NAME = ".env"


def gateway_home(env: Mapping[str, str] | None = None) -> Path:
    """The gateway's home directory: ``$HERMES_GATEWAY_HOME`` or ``~/.hermes-gateway``, absolute."""
    env = os.environ if env is None else env
    return Path(env.get(HOME_ENV) or DEFAULT_HOME).expanduser().absolute()


def default_store_url(home: Path) -> str:
    """The store when the config names none: a SQLite file in the home."""
    return f"sqlite:///{home / 'state.db'}"


def discover_config(explicit: str | Path | None = None, env: Mapping[str, str] | None = None) -> Path | None:
    """The config file: ``explicit`` (``--config``), else ``$HERMES_GATEWAY_CONFIG``, else the home's
    ``config.yaml`` when it exists; None means the embedded defaults."""
    env = os.environ if env is None else env
    chosen = explicit or env.get(CONFIG_ENV)
    if chosen:
        return Path(chosen).expanduser()
    found = gateway_home(env) / CONFIG_NAME
    return found if found.is_file() else None


def dotenv_file(config: Path | None, env: Mapping[str, str] | None = None) -> Path:
    """The ``.env`` that goes with ``config``: beside it, or in the home when there is no config file."""
    return (config.expanduser().absolute().parent if config is not None else gateway_home(env)) / DOTENV_NAME


def load_env_file(config: Path | None, env: Mapping[str, str] | None = None) -> Path | None:
    """Load the ``.env`` of ``config`` (its home found in ``env``) into ``os.environ``, never overriding a
    variable already set; returns the file when there was one."""
    file = dotenv_file(config, env)
    if not file.is_file():
        return None
    load_dotenv(file, override=False)
    return file


def _same_file(a: Path | None, b: Path | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.expanduser().resolve() == b.expanduser().resolve()


def cli_command(arguments: str, source: Path | None, env: Mapping[str, str] | None = None) -> str:
    """``hermes-gateway ARGUMENTS`` as it must be typed to act on the config loaded from ``source``:
    with ``--config /abs/path`` unless discovery in ``env`` finds that same file without flags."""
    if source is None or _same_file(discover_config(None, env), source):
        return f"hermes-gateway {arguments}"
    return f"hermes-gateway --config {shlex.quote(str(source.expanduser().resolve()))} {arguments}"
