"""Admin commands on the store: ``runs``, ``pairing`` and ``cron`` (a running gateway sees their changes)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING

from gateway.cli.common import config_parent, load

if TYPE_CHECKING:
    from gateway.config import Config
    from tools.cronjob_tools import CronJob

ORDER = 20


async def _runs(cfg: Config, run_id: str | None, limit: int) -> int:
    from gateway.store import Store

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
    cfg = load(args)
    return asyncio.run(_runs(cfg, getattr(args, "run_id", None), args.limit))


async def _pairing(cfg: Config, args: argparse.Namespace) -> int:
    from gateway.pairing import PairingStore, format_code, notify_approved
    from gateway.store import Store

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
    cfg = load(args)
    return asyncio.run(_pairing(cfg, args))


async def _cron(cfg: Config, action: str, job_id: str | None) -> int:
    """Cron jobs straight on the store; a running gateway picks changes up within cron.sync_interval_seconds."""
    from datetime import UTC, datetime

    from gateway.cron_store import CronStore
    from gateway.store import Store

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
    cfg = load(args)
    return asyncio.run(_cron(cfg, args.cron_command, getattr(args, "job_id", None)))


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``runs``, ``pairing`` and ``cron``."""
    runs = sub.add_parser("runs", help="inspect runs").add_subparsers(dest="runs_command", required=True)
    runs_list = runs.add_parser("list", parents=[config_parent()], help="recent runs")
    runs_list.add_argument("--limit", type=int, default=20)
    runs_list.set_defaults(func=_cmd_runs)
    runs_show = runs.add_parser("show", parents=[config_parent()], help="one run as JSON")
    runs_show.add_argument("run_id")
    runs_show.set_defaults(func=_cmd_runs, limit=1)
    pairing = sub.add_parser("pairing", help="DM pairing codes and approved users").add_subparsers(
        dest="pairing_command", required=True)
    pairing.add_parser("list", parents=[config_parent()], help="pending codes and approved users").set_defaults(
        func=_cmd_pairing)
    approve = pairing.add_parser("approve", parents=[config_parent()], help="approve a pairing code")
    approve.add_argument("code")
    approve.set_defaults(func=_cmd_pairing)
    revoke = pairing.add_parser("revoke", parents=[config_parent()], help="withdraw a user's approval")
    revoke.add_argument("platform")
    revoke.add_argument("user_id")
    revoke.set_defaults(func=_cmd_pairing)
    cron = sub.add_parser("cron", help="scheduled jobs (changes reach a running gateway within "
                                        "cron.sync_interval_seconds)").add_subparsers(dest="cron_command",
                                                                                      required=True)
    cron.add_parser("list", parents=[config_parent()], help="every job, with its owner").set_defaults(func=_cmd_cron)
    for name, text in (("show", "one job as JSON"), ("pause", "stop a job firing"),
                       ("resume", "let a paused job fire again"), ("remove", "delete a job"),
                       ("run", "fire a job once now (on the running gateway, else at the next start)")):
        cron_cmd = cron.add_parser(name, parents=[config_parent()], help=text)
        cron_cmd.add_argument("job_id")
        cron_cmd.set_defaults(func=_cmd_cron)
