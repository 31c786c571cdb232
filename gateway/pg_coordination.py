"""Coordination of several replicas through PostgreSQL advisory locks (see ``gateway.coordination``)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from typing import Any

import asyncpg

from gateway.coordination import Coordinator

logger = logging.getLogger(__name__)

# Two-key advisory lock classes (pg_advisory_lock(int4, int4)); session locks use the one-key form.
_REPLICA_CLASS = 0x48524D01
_LEADER_CLASS = 0x48524D02
_STOP_CHANNEL = "hermes_stop"  # NOTIFY channel: "stop the work you hold this lock for"
_ELECTION_INTERVAL = 1.0
_HEALTH_INTERVAL = 2.0
_CALL_TIMEOUT = 10.0


def lock_key(name: str) -> int:
    """A signed 64-bit advisory lock key for a name (collisions only serialize two names)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)


class PgCoordinator(Coordinator):
    """Advisory locks on a dedicated asyncpg connection (one per replica)."""

    sole = False

    def __init__(self, dsn: str, election_interval: float = _ELECTION_INTERVAL,
                 health_interval: float = _HEALTH_INTERVAL) -> None:
        super().__init__()
        self.dsn = dsn
        self._number = secrets.randbelow(2**31 - 1) + 1
        self.replica_id = f"r{self._number}"
        self.election_interval = election_interval
        self.health_interval = health_interval
        self._conn: asyncpg.Connection | None = None
        self._call = asyncio.Lock()  # one statement at a time on the connection
        self._held: dict[str, int] = {}  # lock name -> times taken (advisory locks are reentrant)
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> None:
        await self._connect()
        self._task = asyncio.create_task(self._watch(), name="coordination")

    async def _connect(self) -> None:
        conn = await asyncpg.connect(self.dsn, timeout=_CALL_TIMEOUT)
        await conn.execute("SELECT pg_advisory_lock($1, $2)", _REPLICA_CLASS, self._number)
        await conn.add_listener(_STOP_CHANNEL, self._notified)
        self._conn = conn
        await self._elect()

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._set_leader(False)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._conn.close(), _CALL_TIMEOUT)  # releases every lock
            self._conn = None
        self._held.clear()

    async def _fetchval(self, query: str, *args: Any) -> Any:
        if self._conn is None:
            raise ConnectionError("the coordination connection is down")
        async with self._call:
            return await self._conn.fetchval(query, *args, timeout=_CALL_TIMEOUT)

    async def _elect(self) -> None:
        if not self.is_leader and await self._fetchval("SELECT pg_try_advisory_lock($1, 0)", _LEADER_CLASS):
            self._set_leader(True)

    async def _watch(self) -> None:
        """Stand for leadership until elected; notice a lost connection and reconnect."""
        backoff = 0.5
        while not self._stopping:
            await asyncio.sleep(self.election_interval if not self.is_leader else self.health_interval)
            try:
                if self._conn is None:
                    await self._connect()
                    backoff = 0.5
                    logger.warning("replica %s: coordination connection restored", self.replica_id)
                elif self.is_leader:
                    await self._fetchval("SELECT 1")
                else:
                    await self._elect()
            except (OSError, asyncpg.PostgresError, TimeoutError, ConnectionError) as exc:
                self._lost(exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    def _lost(self, exc: BaseException) -> None:
        if self._conn is None:
            return
        logger.error("replica %s: coordination connection lost (%s): leadership and session locks are gone",
                     self.replica_id, exc)
        conn, self._conn = self._conn, None
        conn.terminate()
        self._held.clear()
        self._set_leader(False)
        if self.on_locks_lost is not None:
            self.on_locks_lost()

    async def try_lock(self, name: str) -> bool:
        try:
            got = bool(await self._fetchval("SELECT pg_try_advisory_lock($1)", lock_key(name)))
        except (OSError, asyncpg.PostgresError, TimeoutError, ConnectionError) as exc:
            self._lost(exc)
            return False
        if got:
            self._held[name] = self._held.get(name, 0) + 1
        return got

    async def unlock(self, name: str) -> None:
        count = self._held.get(name, 0)
        if count == 0:
            return  # lost with the connection (or never held)
        if count == 1:
            del self._held[name]
        else:
            self._held[name] = count - 1
        try:
            await self._fetchval("SELECT pg_advisory_unlock($1)", lock_key(name))
        except (OSError, asyncpg.PostgresError, TimeoutError, ConnectionError) as exc:
            self._lost(exc)

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if self.on_stop_request is not None:
            self.on_stop_request(payload)

    async def request_stop(self, name: str) -> bool:
        if name in self._held:
            return False  # this replica holds it: the caller stops it here
        if await self.try_lock(name):  # nobody does
            await self.unlock(name)
            return False
        try:
            await self._fetchval("SELECT pg_notify($1, $2)", _STOP_CHANNEL, name)
        except (OSError, asyncpg.PostgresError, TimeoutError, ConnectionError) as exc:
            self._lost(exc)
            return False
        return True

    async def live_replicas(self) -> set[str] | None:
        try:
            if self._conn is None:
                return None
            async with self._call:
                rows = await self._conn.fetch(
                    "SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND classid = $1 AND objsubid = 2 "
                    "AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                    _REPLICA_CLASS, timeout=_CALL_TIMEOUT)
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            self._lost(exc)
            return None
        return {f"r{row['objid']}" for row in rows}

    def status(self) -> dict[str, Any]:
        return {**super().status(), "connected": self._conn is not None, "locks_held": len(self._held)}
