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
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml

from gateway.config import Config, ConfigError, load_config
from gateway.cron_store import CronStore
from gateway.logs import setup_logging
from gateway.pairing import PairingStore, format_code, notify_approved
from gateway.store import Store
from gateway.tool_sandbox import detect_isolation, sandbox_policy
from tools.cronjob_tools import CronJob
from tools.registry import ISOLATION_SANDBOX, registry
from tools.sandbox import SandboxPool
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
    cfg = load_config(args.config)
    registry.discover_builtin_tools()
    names = [args.toolset] if args.toolset else sorted(TOOLSETS)
    unknown = [n for n in names if n not in TOOLSETS]
    if unknown:
        print(f"error: unknown toolset {unknown[0]!r}; known: {', '.join(sorted(TOOLSETS))}", file=sys.stderr)
        return 2
    isolation = detect_isolation(cfg, Path(args.config) if args.config else None)
    print(f"tool sandbox: {isolation.describe()}", file=sys.stderr)
    if isolation.level != "none":  # never started: it only answers whether sandboxed tools can run
        registry.sandbox = SandboxPool(isolation, sandbox_policy(cfg))
    memo: dict = {}
    for name in names:
        tools = resolve_toolset(name, registry.tool_names())
        ready = sum(registry.unavailable_reason(t, memo) is None for t in tools)
        print(f"{name}  ({ready}/{len(tools)} available)  {TOOLSETS[name].description}")
        for tool in tools:
            reason = registry.unavailable_reason(tool, memo)
            entry = registry.get(tool)
            where = "in the sandbox" if entry and entry.isolation == ISOLATION_SANDBOX and isolation.level != "none" \
                else "in the gateway"
            shown = f"available, {where}" if reason is None else f"unavailable: {reason}"
            print(f"  {'+' if reason is None else '-'} {tool:<14} {shown}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    print(yaml.safe_dump(cfg.masked(), sort_keys=False, allow_unicode=True), end="")
    if cfg.mcp_servers:
        from gateway.mcp_service import report_reachability  # the MCP SDK takes a second to import

        report_reachability(cfg.mcp_servers)  # an unreachable server is a warning: the exit code stays 0
    isolation = detect_isolation(cfg, Path(args.config) if args.config else None)
    print(f"tool sandbox: {isolation.describe()}", file=sys.stderr)
    print("config OK", file=sys.stderr)
    return 0


def _cmd_mcp(args: argparse.Namespace) -> int:
    from gateway.mcp_service import mcp_list, mcp_test

    cfg = _load(args)
    return mcp_test(cfg.mcp_servers, args.name) if args.mcp_command == "test" else mcp_list(cfg.mcp_servers)


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


async def _pairing(cfg: Config, args: argparse.Namespace) -> int:
    store = await Store.open(cfg.store.url)
    pairing = PairingStore(store, cfg.auth.pairing_code_ttl_seconds, cfg.auth.max_pending_codes)
    try:
        if args.pairing_command == "approve":
            result = await pairing.approve(args.code, "cli")
            if result.ok and result.code is not None:
                await notify_approved(store, result.code)
            print(result.message, file=sys.stdout if result.ok else sys.stderr)
            return 0 if result.ok else 1
        if args.pairing_command == "revoke":
            ok = await pairing.revoke(args.platform, args.user_id)
            print(f"revoked {args.platform}:{args.user_id}" if ok else "no such approved user",
                  file=sys.stdout if ok else sys.stderr)
            return 0 if ok else 1
        print("pending codes:")
        for code in await pairing.pending():
            print(f"  {format_code(code.code)}  {code.platform}:{code.user_id} ({code.user_name or '?'})")
        print("approved users:")
        for platform, user_id, name, by in await pairing.approved():
            print(f"  {platform}:{user_id} ({name or '?'}) approved by {by}")
        return 0
    finally:
        await store.close()


def _cmd_pairing(args: argparse.Namespace) -> int:
    cfg = _load(args)
    return asyncio.run(_pairing(cfg, args))


async def _cron(cfg: Config, action: str, job_id: str | None) -> int:
    """Cron jobs straight on the store; a running gateway picks changes up within cron.sync_interval_seconds."""
    store = await Store.open(cfg.store.url)
    jobs = CronStore(store)
    try:
        if action == "list" or job_id is None:
            listed = await jobs.list()
            for listed_job in listed:
                print(f"{listed_job.owner}  {listed_job.summary()}")
            if not listed:
                print("no cron jobs")
            return 0
        now = datetime.now(UTC)
        job: CronJob | None = None
        if action == "show":
            job = await jobs.get(job_id)
        elif action == "pause":
            job = await jobs.pause(job_id, None, "paused by an operator")
        elif action == "resume":
            job = await jobs.resume(job_id, None, now)
        elif action == "run":
            job = await jobs.request_run(job_id, None, now)
        if not (await jobs.delete(job_id) if action == "remove" else job is not None):
            print(f"error: no cron job {job_id}", file=sys.stderr)
            return 1
        if action == "show" and job is not None:
            print(json.dumps(job.to_json(), indent=2, ensure_ascii=False))
        elif action == "run":
            print(f"run of {job_id} requested: a running gateway starts it within "
                  f"{cfg.cron.sync_interval_seconds:g}s, otherwise the next gateway start does")
        else:
            print(f"{action}d {job_id}")
        return 0
    finally:
        await store.close()


def _cmd_cron(args: argparse.Namespace) -> int:
    cfg = _load(args)
    return asyncio.run(_cron(cfg, args.cron_command, getattr(args, "job_id", None)))


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
    tools = sub.add_parser("tools", parents=[with_config],
                           help="list toolsets with their resolved tools, availability and where they run")
    tools.add_argument("--toolset", help="show only this toolset")
    tools.set_defaults(func=_cmd_tools)
    runs = sub.add_parser("runs", help="inspect runs").add_subparsers(dest="runs_command", required=True)
    runs_list = runs.add_parser("list", parents=[with_config], help="recent runs")
    runs_list.add_argument("--limit", type=int, default=20)
    runs_list.set_defaults(func=_cmd_runs)
    runs_show = runs.add_parser("show", parents=[with_config], help="one run as JSON")
    runs_show.add_argument("run_id")
    runs_show.set_defaults(func=_cmd_runs, limit=1)
    pairing = sub.add_parser("pairing", help="DM pairing codes and approved users").add_subparsers(
        dest="pairing_command", required=True)
    pairing.add_parser("list", parents=[with_config], help="pending codes and approved users").set_defaults(
        func=_cmd_pairing)
    approve = pairing.add_parser("approve", parents=[with_config], help="approve a pairing code")
    approve.add_argument("code")
    approve.set_defaults(func=_cmd_pairing)
    revoke = pairing.add_parser("revoke", parents=[with_config], help="withdraw a user's approval")
    revoke.add_argument("platform")
    revoke.add_argument("user_id")
    revoke.set_defaults(func=_cmd_pairing)
    cron = sub.add_parser("cron", help="scheduled jobs (changes reach a running gateway within "
                                        "cron.sync_interval_seconds)").add_subparsers(dest="cron_command",
                                                                                      required=True)
    cron.add_parser("list", parents=[with_config], help="every job, with its owner").set_defaults(func=_cmd_cron)
    for name, text in (("show", "one job as JSON"), ("pause", "stop a job firing"),
                       ("resume", "let a paused job fire again"), ("remove", "delete a job"),
                       ("run", "fire a job once now (on the running gateway, else at the next start)")):
        cron_cmd = cron.add_parser(name, parents=[with_config], help=text)
        cron_cmd.add_argument("job_id")
        cron_cmd.set_defaults(func=_cmd_cron)
    mcp = sub.add_parser("mcp", help="the configured MCP servers").add_subparsers(dest="mcp_command", required=True)
    mcp.add_parser("list", parents=[with_config], help="each server, connected to once, with its tool count"
                   ).set_defaults(func=_cmd_mcp)
    mcp_test_cmd = mcp.add_parser("test", parents=[with_config], help="connect to one server and list its tools")
    mcp_test_cmd.add_argument("name")
    mcp_test_cmd.set_defaults(func=_cmd_mcp)
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
