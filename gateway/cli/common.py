"""What every subcommand shares: the common options, finding the config, loading it, one error style.

Imports only the standard library at import time (``--help`` must stay fast).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.config import Config, StoreConfig

HOME_ENV = "HERMES_GATEWAY_HOME"
CONFIG_ENV = "HERMES_GATEWAY_CONFIG"


class CliError(Exception):
    """A command failed in a way the user can fix: printed as ``error: <message>``, exit ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class _Version(argparse.Action):
    """``--version``, reading the installed version only when asked (importlib.metadata is slow to import)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("hermes-gateway")
        except PackageNotFoundError:
            found = "unknown"
        parser.exit(message=f"hermes-gateway {found}\n")


def add_version(parser: argparse.ArgumentParser) -> None:
    """Add ``--version``."""
    parser.add_argument("--version", action=_Version)


def _default(top: bool) -> Any:
    # Options accepted both before and after the subcommand: the subcommand's copy defaults to SUPPRESS,
    # so a value given before it is not overwritten.
    return None if top else argparse.SUPPRESS


def add_common(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """``--log-level`` and ``--log-format``."""
    parser.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], default=_default(top))
    parser.add_argument("--log-format", choices=["text", "json"], default=_default(top))


def add_config(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """``--config``/``-c``."""
    parser.add_argument("--config", "-c", metavar="PATH", default=_default(top),
                        help=f"YAML config file (else ${CONFIG_ENV}, else ${HOME_ENV}/config.yaml)")


def common_parent() -> argparse.ArgumentParser:
    """A parent parser with the logging options, for subcommands that read no config."""
    parent = argparse.ArgumentParser(add_help=False)
    add_common(parent)
    return parent


def config_parent() -> argparse.ArgumentParser:
    """A parent parser with the logging options and ``--config``."""
    parent = common_parent()
    add_config(parent)
    return parent


def home_dir(env: dict[str, str] | os._Environ[str] | None = None) -> Path:
    """The gateway's home: ``$HERMES_GATEWAY_HOME``, else ``~/.hermes-gateway``."""
    from gateway.config import gateway_home

    return gateway_home(env)


def config_path(args: argparse.Namespace, env: dict[str, str] | os._Environ[str] | None = None) -> Path | None:
    """The config file to use: ``--config``, else ``$HERMES_GATEWAY_CONFIG``, else the home's
    ``config.yaml`` when it exists; None means the embedded defaults.

    The ``.env`` beside it (in the home when there is no file) is loaded into the environment first,
    never overriding what is already set, so ``${VAR}`` in the config can come from it."""
    from gateway.config import discover_config, load_env_file

    path = discover_config(getattr(args, "config", None), env)
    load_env_file(path, env)
    return path


def print_json(value: Any) -> None:
    """Print ``value`` as indented JSON (what every ``--json`` prints)."""
    print(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def err(message: str) -> None:
    """Print a line to stderr."""
    print(message, file=sys.stderr)


def _setup_logging(args: argparse.Namespace, cfg: Config | StoreConfig) -> None:
    from gateway.logs import setup_logging

    setup_logging(args.log_level or cfg.logging.level, args.log_format or cfg.logging.format, cfg.secret_values())


def load(args: argparse.Namespace) -> Config:
    """The whole config, validated, with logging set up from it (for commands that run the gateway)."""
    from gateway.config import load_config

    cfg = load_config(config_path(args))
    _setup_logging(args, cfg)
    return cfg


def load_store(args: argparse.Namespace) -> StoreConfig:
    """Only what admin commands use (the store, pairing limits, cron sync interval, logging), validated, with
    logging set up: secrets the rest of the config refers to need not be set."""
    from gateway.config import load_store_config

    cfg = load_store_config(config_path(args))
    _setup_logging(args, cfg)
    return cfg
