"""The ``hermes-gateway`` command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

import yaml

from gateway.config import Config, ConfigError, load_config
from gateway.logs import setup_logging
from gateway.store import Store
from tools.registry import registry
from toolsets import TOOLSETS, resolve_toolset

logger = logging.getLogger(__name__)


def _version() -> str:
    try:
        return version("hermes-gateway")
    except PackageNotFoundError:
        return "unknown"


def _load(args: argparse.Namespace) -> Config:
    cfg = load_config(args.config)
    setup_logging(args.log_level or cfg.logging.level, args.log_format or cfg.logging.format, cfg.secret_values())
    return cfg


def _cmd_tools(args: argparse.Namespace) -> int:
    registry.discover_builtin_tools()
    names = [args.toolset] if args.toolset else sorted(TOOLSETS)
    unknown = [n for n in names if n not in TOOLSETS]
    if unknown:
        print(f"error: unknown toolset {unknown[0]!r}; known: {', '.join(sorted(TOOLSETS))}", file=sys.stderr)
        return 2
    memo: dict = {}
    for name in names:
        tools = resolve_toolset(name, registry.tool_names())
        ready = sum(registry.unavailable_reason(t, memo) is None for t in tools)
        print(f"{name}  ({ready}/{len(tools)} available)  {TOOLSETS[name].description}")
        for tool in tools:
            reason = registry.unavailable_reason(tool, memo)
            mark = "+" if reason is None else "-"
            print(f"  {mark} {tool:<14} {'available' if reason is None else 'unavailable: ' + reason}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    print(yaml.safe_dump(cfg.masked(), sort_keys=False, allow_unicode=True), end="")
    print("config OK", file=sys.stderr)
    return 0


async def _serve(cfg: Config) -> None:
    from gateway.app import Gateway

    gateway = Gateway(cfg)
    await gateway.start()
    print(f"hermes-gateway: listening on http://{cfg.http.host}:{gateway.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logger.info("signal received: draining")
    await gateway.stop()


def _cmd_run(args: argparse.Namespace) -> int:
    cfg = _load(args)
    asyncio.run(_serve(cfg))
    return 0


async def _runs(cfg: Config, run_id: str | None, limit: int) -> int:
    store = await Store.open(cfg.store.url)
    try:
        if run_id:
            run = await store.get_run(run_id)
            if run is None:
                print(f"error: no run {run_id}", file=sys.stderr)
                return 1
            print(json.dumps(run.to_dict(), indent=2, ensure_ascii=False))
            return 0
        for run in await store.list_runs(limit):
            print(f"{run.id}  {run.kind:<8} {run.status:<10} {run.source:<16} {(run.result or run.error or '')[:60]!r}")
        return 0
    finally:
        await store.close()


def _cmd_runs(args: argparse.Namespace) -> int:
    cfg = _load(args)
    return asyncio.run(_runs(cfg, getattr(args, "run_id", None), args.limit))


def _cmd_demo(args: argparse.Namespace) -> int:
    from gateway.demo import run_demo

    setup_logging(args.log_level or "WARNING", args.log_format or "text")
    return asyncio.run(run_demo())


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(prog="hermes-gateway", description="Multi-platform chat gateway daemon.")
    parser.add_argument("--version", action="version", version=f"hermes-gateway {_version()}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    common.add_argument("--log-format", choices=["text", "json"])
    with_config = argparse.ArgumentParser(add_help=False, parents=[common])
    with_config.add_argument("--config", "-c", help="YAML config file (embedded defaults when omitted)")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("run", parents=[with_config], help="run the gateway").set_defaults(func=_cmd_run)
    sub.add_parser("check", parents=[with_config],
                   help="validate the config and print it resolved, secrets masked").set_defaults(func=_cmd_check)
    sub.add_parser("demo", parents=[common], help="offline demo on the embedded defaults").set_defaults(
        func=_cmd_demo)
    tools = sub.add_parser("tools", help="list toolsets with their resolved tools and availability")
    tools.add_argument("--toolset", help="show only this toolset")
    tools.set_defaults(func=_cmd_tools)
    runs = sub.add_parser("runs", help="inspect runs").add_subparsers(dest="runs_command", required=True)
    runs_list = runs.add_parser("list", parents=[with_config], help="recent runs")
    runs_list.add_argument("--limit", type=int, default=20)
    runs_list.set_defaults(func=_cmd_runs)
    runs_show = runs.add_parser("show", parents=[with_config], help="one run as JSON")
    runs_show.add_argument("run_id")
    runs_show.set_defaults(func=_cmd_runs, limit=1)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        with contextlib.suppress(Exception):
            sys.stdout.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
