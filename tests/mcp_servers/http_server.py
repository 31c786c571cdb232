"""MCP test server over streamable HTTP on 127.0.0.1: prints its port, then serves at ``/mcp``.

``python http_server.py [--generate N] [--port P]`` (port 0, the default, picks a free one).
"""

from __future__ import annotations

import argparse
import socket

import anyio
import uvicorn
from toolbox import build_server


async def _main(generated: int, port: int) -> None:
    app = build_server(generated).streamable_http_app()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    print(sock.getsockname()[1], flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    await server.serve(sockets=[sock])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--generate", type=int, default=0, help="add this many generated tools")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    anyio.run(_main, args.generate, args.port)
