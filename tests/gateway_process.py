"""The gateway as users run it: ``python -m gateway run --config PATH`` as a subprocess, for end-to-end tests."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import uuid
from pathlib import Path

import aiohttp


def _cmdline(pid: int) -> bytes:
    """The process's command line (empty once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


class GatewayProcess:
    """`python -m gateway run` with a config file; tells its port from the startup line."""

    def __init__(self, config_path: Path, home: Path) -> None:
        self.config_path = config_path
        self.home = home
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0
        self.stderr_path = home / f"gateway-{uuid.uuid4().hex[:6]}.log"
        self.workers_seen = 0
        """Agent workers it had when it was last killed."""
        self.lingering: list[int] = []
        """Those of them still running after that kill (none should)."""

    async def start(self) -> None:
        """Spawn the process; returns once it printed its startup line (its port)."""
        env = {**os.environ, "HERMES_GATEWAY_HOME": str(self.home), "PYTHONUNBUFFERED": "1"}
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in stop()/kill()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "run", "--config", str(self.config_path),
            stdout=asyncio.subprocess.PIPE, stderr=self._stderr, env=env)
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout=30)
        match = re.search(rb"listening on http://[\d.]+:(\d+)", line)
        assert match, f"unexpected startup line {line!r}; log: {self.stderr_path.read_text()}"
        self.port = int(match.group(1))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def wait_ready(self, http: aiohttp.ClientSession, timeout: float = 20) -> None:
        """Wait until ``/readyz`` answers 200 and reports every adapter connected."""
        async def poll() -> None:
            while True:
                try:
                    async with http.get(f"{self.url}/readyz") as r:
                        body = await r.json()
                        if r.status == 200 and all(p["state"] == "connected" for p in body["platforms"].values()):
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        await asyncio.wait_for(poll(), timeout)

    def workers(self) -> list[int]:
        """Process ids of its agent worker processes (its children running ``gateway.agent_worker``)."""
        assert self.proc is not None
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except FileNotFoundError:
            return []
        return [int(pid) for pid in children if b"gateway.agent_worker" in _cmdline(int(pid))]

    async def kill(self) -> None:
        """SIGKILL: no shutdown, no cleanup, as when the machine or the OOM killer takes the process. Its agent
        workers must follow it (their socket closes): ``lingering`` keeps those still alive 5 s later."""
        assert self.proc is not None
        workers = self.workers()
        self.workers_seen = len(workers)
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()
        self._stderr.close()
        for _ in range(100):
            self.lingering = [pid for pid in workers if _cmdline(pid)]
            if not self.lingering:
                return
            await asyncio.sleep(0.05)

    async def terminate(self) -> int:
        """SIGTERM (drain, then exit); returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self.proc.wait(), timeout=30)
        self._stderr.close()
        return code
