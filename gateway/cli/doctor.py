"""``doctor``: the config's static findings and live checks of everything it names (the model, each platform's
token, the HTTP port, the store, the MCP servers, the tool sandbox): one line per check, non-zero on a failure."""

from __future__ import annotations

import argparse
import asyncio

from gateway.cli.common import config_parent, config_path, load, print_json

ORDER = 6


def _cmd_doctor(args: argparse.Namespace) -> int:
    from gateway.probes import CheckResult, all_checks

    path = config_path(args)
    if path is None:
        results = [CheckResult("config", "fail", "no config file found",
                               "run `hermes-gateway setup`, or pass --config PATH")]
    else:
        cfg = load(args)
        results = [CheckResult("config", "ok", f"{path} is valid"),
                   *asyncio.run(all_checks(cfg, path, args.timeout))]
    failed = sum(r.status == "fail" for r in results)
    if args.json:
        print_json([r.to_json() for r in results])
    else:
        for result in results:
            print(result.line())
        warned = sum(r.status == "warn" for r in results)
        print(f"doctor: {failed} failed, {warned} warnings" if failed or warned
              else f"doctor: all {len(results)} checks passed")
    return 1 if failed else 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``doctor``."""
    doctor = sub.add_parser("doctor", parents=[config_parent()],
                            help="check the config live: model, platform tokens, port, store, MCP servers, sandbox")
    doctor.add_argument("--json", action="store_true", help="print the results as a JSON list")
    doctor.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="for each network check (default 10)")
    doctor.set_defaults(func=_cmd_doctor)
