"""Admin commands on the store: ``runs``, ``pairing`` and ``cron`` (a running gateway sees their changes).

They read only the store's part of the config (``load_store``), so they work where only the store is
reachable and the platforms' secrets are not set.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any

from gateway.cli.common import config_parent, load_store, print_json

if TYPE_CHECKING:
    from gateway.config import StoreConfig
    from gateway.pairing import PairingStore
    from gateway.store import RunRow
    from tools.cronjob_tools import CronJob

ORDER = 20


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON array of objects")


def _run_json(run: RunRow) -> dict[str, Any]:
    """``RunRow.to_dict`` with the same keys for every run (duration null until it finished)."""
    out = run.to_dict()
    out.setdefault("duration_seconds", None)
    return out


async def _runs(cfg: StoreConfig, args: argparse.Namespace) -> int:
    from gateway.store import Store

    store = await Store.open(cfg.store.url)
    try:
        run_id = getattr(args, "run_id", None)
        if run_id:
            run = await store.get_run(run_id)
            if run is None:
                print(f"error: no run {run_id}", file=sys.stderr)
                return 1
            print_json(run.to_dict())
            return 0
        runs = await store.list_runs(args.limit)
        if args.json:
            print_json([_run_json(run) for run in runs])
            return 0
        for run in runs:
            print(f"{run.id}  {run.kind:<8} {run.status:<10} {run.source:<16} {(run.result or run.error or '')[:60]!r}")
        return 0
    finally:
        await store.close()


def _cmd_runs(args: argparse.Namespace) -> int:
    return asyncio.run(_runs(load_store(args), args))


async def _pairing_rows(pairing: PairingStore) -> list[dict[str, Any]]:
    """Pending codes then approved users, every object with the same keys."""
    from datetime import UTC, datetime

    from gateway.pairing import format_code

    rows = [{"status": "pending", "platform": code.platform, "user_id": code.user_id, "user_name": code.user_name,
             "code": format_code(code.code), "expires_at": datetime.fromtimestamp(code.expires_at, UTC).isoformat(),
             "approved_by": None} for code in await pairing.pending()]
    rows += [{"status": "approved", "platform": user.platform, "user_id": user.user_id, "user_name": user.user_name,
              "code": None, "expires_at": None, "approved_by": user.approved_by} for user in await pairing.approved()]
    return rows


async def _pairing(cfg: StoreConfig, args: argparse.Namespace) -> int:
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
        if args.json:
            print_json(await _pairing_rows(pairing))
            return 0
        print("pending codes:")
        for code in await pairing.pending():
            print(f"  {format_code(code.code)}  {code.platform}:{code.user_id} ({code.user_name or '?'})")
        print("approved users:")
        for user in await pairing.approved():
            print(f"  {user.platform}:{user.user_id} ({user.user_name or '?'}) approved by {user.approved_by}")
        return 0
    finally:
        await store.close()


def _cmd_pairing(args: argparse.Namespace) -> int:
    return asyncio.run(_pairing(load_store(args), args))


async def _cron(cfg: StoreConfig, action: str, job_id: str | None, as_json: bool) -> int:
    """Cron jobs straight on the store; a running gateway picks changes up within cron.sync_interval_seconds."""
    from datetime import UTC, datetime

    from gateway.cron_store import CronStore
    from gateway.store import Store

    store = await Store.open(cfg.store.url)
    jobs = CronStore(store)
    try:
        if action == "list" or job_id is None:
            listed = await jobs.list()
            if as_json:
                print_json([listed_job.to_json() for listed_job in listed])
                return 0
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
            print_json(job.to_json())
        elif action == "run":
            print(f"run of {job_id} requested: a running gateway starts it within "
                  f"{cfg.cron.sync_interval_seconds:g}s, otherwise the next gateway start does")
        else:
            print(f"{action}d {job_id}")
        return 0
    finally:
        await store.close()


def _cmd_cron(args: argparse.Namespace) -> int:
    return asyncio.run(_cron(load_store(args), args.cron_command, getattr(args, "job_id", None),
                             getattr(args, "json", False)))


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``runs``, ``pairing`` and ``cron``."""
    runs = sub.add_parser("runs", help="inspect runs").add_subparsers(dest="runs_command", required=True)
    runs_list = runs.add_parser("list", parents=[config_parent()], help="recent runs")
    runs_list.add_argument("--limit", type=int, default=20)
    _json_flag(runs_list)
    runs_list.set_defaults(func=_cmd_runs)
    runs_show = runs.add_parser("show", parents=[config_parent()], help="one run as JSON")
    runs_show.add_argument("run_id")
    runs_show.set_defaults(func=_cmd_runs, limit=1)
    pairing = sub.add_parser("pairing", help="DM pairing codes and approved users").add_subparsers(
        dest="pairing_command", required=True)
    pairing_list = pairing.add_parser("list", parents=[config_parent()], help="pending codes and approved users")
    _json_flag(pairing_list)
    pairing_list.set_defaults(func=_cmd_pairing)
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
    cron_list = cron.add_parser("list", parents=[config_parent()], help="every job, with its owner")
    _json_flag(cron_list)
    cron_list.set_defaults(func=_cmd_cron)
    for name, text in (("show", "one job as JSON"), ("pause", "stop a job firing"),
                       ("resume", "let a paused job fire again"), ("remove", "delete a job"),
                       ("run", "fire a job once now (on the running gateway, else at the next start)")):
        cron_cmd = cron.add_parser(name, parents=[config_parent()], help=text)
        cron_cmd.add_argument("job_id")
        cron_cmd.set_defaults(func=_cmd_cron)
