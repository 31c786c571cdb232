"""The ``hermes-gateway`` command line.

Each subcommand lives in a module of this package that defines ``register(sub)`` (adding its parsers) and
an ``ORDER`` (its place in ``--help``). Those modules import only the standard library at import time and
everything heavy inside their handlers, so ``--help`` and shell completion stay fast.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

from gateway.cli.common import CliError, add_common, add_config, add_version


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(
        prog="hermes-gateway", description="Multi-platform chat gateway daemon.",
        epilog="The config is --config PATH, else $HERMES_GATEWAY_CONFIG, else $HERMES_GATEWAY_HOME/config.yaml "
               "(home: ~/.hermes-gateway); a .env beside it is loaded without overriding the environment.")
    add_version(parser)
    add_common(parser, top=True)
    add_config(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = [importlib.import_module(f"{__name__}.{info.name}")
               for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_") and info.name != "common"]
    for module in sorted(modules, key=lambda m: (m.ORDER, m.__name__)):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = build_parser()
    if "_ARGCOMPLETE" in os.environ:  # shell completion (eval "$(register-python-argcomplete hermes-gateway)")
        import argcomplete

        argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    from gateway.config import ConfigError

    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        with contextlib.suppress(Exception):
            sys.stdout.close()
        return 0
