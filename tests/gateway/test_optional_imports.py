"""A gateway imports a chat platform's library only when that platform is enabled, the MCP SDK only when
MCP servers are configured, and the PostgreSQL driver only for a PostgreSQL store (together ~60 MiB of idle
memory and seconds of start-up)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = ("telegram", "discord", "slack_bolt", "slack_sdk", "mcp", "mcp_types", "tools.mcp_tool", "asyncpg",
            "sqlalchemy.ext.asyncio")
WEBHOOK = {"routes": {"github": {"secret": "s" * 24, "scheme": "github", "prompt": "{payload}"}}}

# Starts and stops a gateway in a fresh interpreter, then prints which optional modules got imported.
_PROBE = f"""
import asyncio, json, sys
from gateway.app import Gateway
from gateway.config import parse_config

async def main() -> None:
    gateway = Gateway(parse_config(json.loads(sys.argv[1]), env={{"HERMES_GATEWAY_HOME": sys.argv[2]}}))
    await gateway.start()
    await gateway.stop(drain_timeout=0)

asyncio.run(main())
print(json.dumps(sorted(m for m in {OPTIONAL!r} if m in sys.modules)))
"""


def _imported_by_a_started_gateway(home: Path, extra: dict[str, Any]) -> list[str]:
    config = {
        "model": {"base_url": "http://127.0.0.1:9/v1", "api_key": "k", "name": "m"},
        "http": {"port": 0},
        "store": {"url": f"sqlite:///{home}/state.db"},
        "platforms": {"webhook": WEBHOOK},
        **extra,
    }
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(config), str(home)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_a_webhook_only_gateway_imports_no_chat_library_and_no_mcp(tmp_path: Path) -> None:
    assert _imported_by_a_started_gateway(tmp_path, {}) == []


def test_enabled_platforms_and_configured_mcp_servers_are_imported(tmp_path: Path) -> None:
    # Nothing listens on port 9: the platform and the server fail to connect, which the gateway survives.
    extra = {"platforms": {"telegram": {"enabled": True, "token": "123:abc", "base_url": "http://127.0.0.1:9/bot"},
                           "webhook": WEBHOOK},
             "mcp_servers": {"dead": {"url": "http://127.0.0.1:9/mcp", "connect_timeout": 1}}}
    assert _imported_by_a_started_gateway(tmp_path, extra) == ["mcp", "mcp_types", "telegram", "tools.mcp_tool"]


async def test_the_postgresql_driver_is_imported_for_a_postgresql_store_only(store_url: str, tmp_path: Path) -> None:
    imported = await asyncio.to_thread(_imported_by_a_started_gateway, tmp_path, {"store": {"url": store_url}})
    assert imported == (["asyncpg", "sqlalchemy.ext.asyncio"] if store_url.startswith("postgresql") else [])
