"""MCP test server over stdio: ``python stdio_server.py [--generate N]``."""

from __future__ import annotations

import argparse

import anyio
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.stdio import stdio_server
from toolbox import build_server


async def _main(generated: int) -> None:
    server = build_server(generated)
    options = server.create_initialization_options(NotificationOptions(tools_changed=True))
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, options)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--generate", type=int, default=0, help="add this many generated tools")
    anyio.run(_main, parser.parse_args().generate)
