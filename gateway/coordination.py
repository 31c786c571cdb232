"""Who does what when several gateway processes (replicas) share one PostgreSQL database.

- **Session locks**: one replica at a time runs a session's work.
- **Leadership**: one elected replica runs the cron scheduler and the platform connections that must
  be single (Telegram polling, Slack Socket Mode, a Discord shard).
- **Liveness**: each replica holds a lock on its own id, so the others can tell which outbox claims
  were left behind by a dead replica.

All three are PostgreSQL advisory locks held on one dedicated connection per replica: when a replica
dies, its connection closes and the server releases every lock it held at once, so failover needs no
lease timeouts. With SQLite there is exactly one gateway per database: ``LocalCoordinator`` grants
everything.
"""

from __future__ import annotations

import logging
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class Coordinator(ABC):
    """Session locks, leadership and liveness for one gateway process."""

    replica_id: str
    sole: bool
    """Whether this is the only gateway on the database (then nothing needs locking)."""

    def __init__(self) -> None:
        self.is_leader = False
        self.on_leadership: Callable[[bool], None] | None = None
        """Called with the new state whenever this replica gains or loses leadership."""
        self.on_locks_lost: Callable[[], None] | None = None
        """Called when the session locks this replica held were lost (its connection dropped)."""
        self.on_stop_request: Callable[[str], None] | None = None
        """Called with a lock name when some replica asks the holder of that lock to stop its work."""

    @staticmethod
    def for_store(url: str) -> Coordinator:
        """The coordinator a store URL calls for."""
        scheme = url.split("://", 1)[0]
        if scheme.startswith(("postgresql", "postgres")):
            from gateway.pg_coordination import PgCoordinator  # asyncpg only when PostgreSQL is used

            return PgCoordinator("postgresql://" + url.split("://", 1)[1])
        return LocalCoordinator()

    def _set_leader(self, leader: bool) -> None:
        if leader == self.is_leader:
            return
        self.is_leader = leader
        logger.log(logging.INFO if self.sole else logging.WARNING, "replica %s %s leadership", self.replica_id,
                   "gained" if leader else "lost")
        if self.on_leadership is not None:
            self.on_leadership(leader)

    @abstractmethod
    async def start(self) -> None:
        """Connect and take part in the election."""

    @abstractmethod
    async def stop(self) -> None:
        """Give up leadership and every lock."""

    @abstractmethod
    async def try_lock(self, name: str) -> bool:
        """Take the lock on ``name`` (a session, an inbox event) if nobody holds it."""

    @abstractmethod
    async def unlock(self, name: str) -> None:
        """Release a lock taken with ``try_lock``."""

    @abstractmethod
    async def live_replicas(self) -> set[str] | None:
        """Ids of the replicas alive now (None when that cannot be told)."""

    @abstractmethod
    async def request_stop(self, name: str) -> bool:
        """Ask the replica holding lock ``name`` to stop that work; returns whether another replica holds it."""

    def status(self) -> dict[str, Any]:
        """Readiness detail."""
        return {"replica": self.replica_id, "leader": self.is_leader, "sole": self.sole}


class LocalCoordinator(Coordinator):
    """The only gateway on its database: always the leader, every lock granted."""

    sole = True

    def __init__(self) -> None:
        super().__init__()
        self.replica_id = secrets.token_hex(8)

    async def start(self) -> None:
        self._set_leader(True)

    async def stop(self) -> None:
        self._set_leader(False)

    async def try_lock(self, name: str) -> bool:
        return True

    async def unlock(self, name: str) -> None:
        return None

    async def live_replicas(self) -> set[str] | None:
        return {self.replica_id}

    async def request_stop(self, name: str) -> bool:
        return False
