"""``run`` (the gateway) and ``demo`` (the offline demo on the embedded defaults)."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import signal
import socket
from typing import TYPE_CHECKING

from gateway.cli.common import CliError, common_parent, config_parent, load

if TYPE_CHECKING:
    from gateway.config import Config

ORDER = 0
logger = logging.getLogger(__name__)

# Why the HTTP server could not bind, by errno, and what to change.
_BIND_ERRORS = {
    errno.EADDRINUSE: "the port is already in use (another gateway?); stop that process or change http.port",
    errno.EACCES: "no permission (ports below 1024 need privileges); change http.port",
    errno.EADDRNOTAVAIL: "the address is not one of this machine's; change http.host",
    socket.EAI_NONAME: "the host name does not resolve; change http.host",
    socket.EAI_AGAIN: "the host name does not resolve (no answer from DNS); change http.host, or check DNS",
}


async def _serve(cfg: Config) -> None:
    from gateway.app import Gateway

    gateway = Gateway(cfg)
    try:
        await gateway.start()
    except OSError as exc:
        # Only the HTTP server's bind: it has no port yet, and the error is one a bind raises.
        if gateway.http is None or gateway.port is not None or exc.errno not in _BIND_ERRORS:
            raise
        await gateway.stop(drain_timeout=0)
        raise CliError(f"cannot listen on {cfg.http.host}:{cfg.http.port} (http.host, http.port): "
                       f"{_BIND_ERRORS[exc.errno]}") from None
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
