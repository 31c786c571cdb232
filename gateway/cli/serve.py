"""``run`` (the gateway) and ``demo`` (the offline demo on the embedded defaults)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import TYPE_CHECKING

from gateway.cli.common import common_parent, config_parent, load

if TYPE_CHECKING:
    from gateway.config import Config

ORDER = 0
logger = logging.getLogger(__name__)


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
    cfg = load(args)
    asyncio.run(_serve(cfg))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from gateway.demo import run_demo
    from gateway.logs import setup_logging

    setup_logging(args.log_level or "WARNING", args.log_format or "text")
    return asyncio.run(run_demo())


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``run`` and ``demo``."""
    sub.add_parser("run", parents=[config_parent()], help="run the gateway").set_defaults(func=_cmd_run)
    sub.add_parser("demo", parents=[common_parent()], help="offline demo on the embedded defaults").set_defaults(
        func=_cmd_demo)
