"""Where the SQL runs: every unit of work is one synchronous function, executed in one transaction.

The store's methods are written once as ``work(conn) -> result`` over a synchronous SQLAlchemy
``Connection`` and run unchanged on both engines:

- **SQLite**: one connection, used by the store's thread. Work submitted while a transaction is
  running is batched into the next one (group commit): one thread hand-off and one commit for many
  callers, each caller's future settled only after the commit. A batch whose work raises is rolled
  back and its items are redone one transaction each, so one caller's error never touches another's.
  Urgent work (accepting an event, which a platform is waiting on) goes into batches of its own,
  ahead of queued bulk work, so a burst of finishing runs cannot hold up acknowledgements.
  A *quick* unit (a few rows by key: accepting an event, finishing a run, marking a delivery sent)
  runs inline on the caller's thread instead when nothing is queued and the connection is free: a
  commit in WAL mode with ``synchronous=NORMAL`` writes to the log without an fsync (~15 µs here),
  while waking the store's thread and then the caller's loop costs ~0.4 ms of latency and CPU. The
  inline attempt never waits: a busy connection or another process's write lock sends the unit to
  the thread as before. It is for quiet moments only: at most one inline unit per 5 ms (a burst of 200
  accepts in one loop iteration would hold the loop for all of them, where the thread commits them in
  a few batches), and none for a second after one took over 2 ms (busy threads contending for the
  GIL, which every SQLite call releases and the loop then waits for). The fsyncs happen in
  checkpoints, which only the store's thread runs.
- **PostgreSQL**: asyncpg through ``AsyncConnection.run_sync``: no thread hand-offs; concurrent
  work runs on pooled connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

logger = logging.getLogger(__name__)

T = TypeVar("T")
Work = Callable[[Connection], T]

MAX_BATCH = 64  # work items per SQLite transaction
CHECKPOINT_EVERY = 1.0  # seconds: the store's thread copies the SQLite log into the database at most this often
BUSY_TIMEOUT_MS = 10_000  # how long the store's thread waits for another process's write lock
INLINE_SPACING = 0.005  # seconds: at most one inline unit this often; a burst goes to the thread, batched
INLINE_SLOW = 0.002  # an inline unit that took longer (the GIL contended by busy threads, a slow disk) ...
INLINE_BACKOFF = 1.0  # ... sends quick units to the thread for this long


def normalize_url(url: str) -> str:
    """Map ``postgresql://`` URLs to the asyncpg driver; ``sqlite://`` stays on the standard library."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+asyncpg://" + url[len(plain):]
    if url.startswith("sqlite+aiosqlite://"):
        return "sqlite://" + url[len("sqlite+aiosqlite://"):]
    return url


class Database(ABC):
    """Runs units of work against one database."""

    dialect: str

    @staticmethod
    def connect(url: str) -> Database:
        """The database for a store URL (``sqlite:///PATH`` or ``postgresql://...``)."""
        url = normalize_url(url)
        if url.startswith("sqlite"):
            return SqliteDatabase(url)
        if url.startswith("postgresql"):
            return PostgresDatabase(url)
        raise ValueError(f"unsupported store URL {url.split(':', 1)[0]!r}: use sqlite:///PATH or postgresql://...")

    @abstractmethod
    async def write(self, work: Work[T], *, urgent: bool = False, quick: bool = False) -> T:
        """Run ``work`` in a transaction that may write; returns once it is committed. ``urgent`` work
        (a caller waiting on it, such as a platform for its acknowledgement) may go ahead of bulk work;
        ``quick`` work (a few rows by key) may run inline on the caller's thread (SQLite)."""

    @abstractmethod
    async def read(self, work: Work[T]) -> T:
        """Run read-only ``work``."""

    @abstractmethod
    async def close(self) -> None:
        """Finish queued work and release the connections."""


@dataclass(slots=True)
class _Item:
    work: Work[Any]
    write: bool
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    urgent: bool = False


def _settle(outcomes: list[tuple[_Item, Any, BaseException | None]]) -> None:
    for item, result, error in outcomes:
        if item.future.done():  # the caller gave up (cancelled)
            continue
        if error is None:
            item.future.set_result(result)
        else:
            item.future.set_exception(error)


def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
    # isolation_level None: the driver emits no BEGIN of its own; SqliteDatabase begins explicitly.
    dbapi_conn.isolation_level = None
    dbapi_conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    # Takes effect only on a database that has no tables yet (a new one): pruned pages can then be handed back
    # (gateway/retention.py); an older database switches with one `hermes-gateway store vacuum`.
    dbapi_conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    _use_wal(dbapi_conn)
    # No automatic checkpoints: a commit that crossed the threshold would run one (with its fsync) on
    # whichever thread committed, possibly the event loop's; SqliteDatabase checkpoints on its own thread.
    for pragma in ("synchronous=NORMAL", "foreign_keys=ON", "wal_autocheckpoint=0"):
        dbapi_conn.execute(f"PRAGMA {pragma}")


def _use_wal(dbapi_conn: Any) -> None:
    """Switch the database to WAL. Connections opening a new database file together race to switch it, and
    the loser's ``PRAGMA journal_mode`` can fail at once ("database is locked") instead of waiting for the
    busy timeout, so it is retried within that timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


class SqliteDatabase(Database):
    """SQLite on a dedicated thread with group commit."""

    dialect = "sqlite"

    def __init__(self, url: str) -> None:
        path = url.split(":///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.engine = sa.create_engine(url, poolclass=sa.pool.StaticPool,
                                       connect_args={"timeout": 10, "check_same_thread": False})
        sa.event.listen(self.engine, "connect", _sqlite_connect)
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._closed = False
        self._conn: Connection | None = None
        self._conn_lock = threading.Lock()  # held by whoever uses the connection: the thread or an inline unit
        self._waits_for_locks = True  # the connection's busy timeout: BUSY_TIMEOUT_MS (thread) or 0 (inline)
        self._inline_after = 0.0  # monotonic time before which quick units go to the thread
        self._uncheckpointed = 0  # commits since the last checkpoint
        self._checkpointed_at = time.monotonic()
        self._thread = threading.Thread(target=self._serve, name="hermes-db", daemon=True)
        self._thread.start()

    async def write(self, work: Work[T], *, urgent: bool = False, quick: bool = False) -> T:
        started = time.monotonic()
        if (quick and started >= self._inline_after and self._queue.empty() and not self._closed
                and self._conn_lock.acquire(blocking=False)):
            try:
                ran, result = self._inline(work)
            finally:
                self._conn_lock.release()
            took = time.monotonic() - started
            self._inline_after = started + (INLINE_BACKOFF if took > INLINE_SLOW else INLINE_SPACING)
            if ran:
                return result
        return await self._submit(work, True, urgent)

    def _inline(self, work: Work[T]) -> tuple[bool, T | None]:
        """Run ``work`` in its own transaction now, holding the connection lock; (False, None) when another
        process holds the write lock (the caller queues it instead of waiting)."""
        conn = self._connection()
        self._wait_for_locks(conn, False)
        try:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        except sa.exc.OperationalError:  # "database is locked": nothing ran
            return False, None
        try:
            result = work(conn)
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        self._uncheckpointed += 1
        return True, result

    async def read(self, work: Work[T]) -> T:
        return await self._submit(work, False, False)

    def _submit(self, work: Work[T], write: bool, urgent: bool) -> asyncio.Future[T]:
        if self._closed:
            raise RuntimeError("the database is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put(_Item(work, write, future, loop, urgent))
        return future

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        await asyncio.to_thread(self._thread.join)
        self.engine.dispose()

    def _connection(self) -> Connection:
        """The connection (opened on first use); call with the connection lock held."""
        if self._conn is None:
            self._conn = self.engine.connect()
        return self._conn

    def _wait_for_locks(self, conn: Connection, wait: bool) -> None:
        if self._waits_for_locks != wait:
            conn.exec_driver_sql(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS if wait else 0}")
            self._waits_for_locks = wait

    def _serve(self) -> None:
        urgent: deque[_Item] = deque()
        bulk: deque[_Item] = deque()
        stopping = urgent_last = False
        try:
            while urgent or bulk or not stopping:
                if not urgent and not bulk:
                    try:  # idle (inline units may still commit): checkpoint once a second while waiting
                        item = self._queue.get(timeout=CHECKPOINT_EVERY)
                    except queue.Empty:
                        self._checkpoint()
                        continue
                    stopping = self._take(item, urgent, bulk)
                while True:  # and whatever else is queued
                    try:
                        stopping = self._take(self._queue.get_nowait(), urgent, bulk) or stopping
                    except queue.Empty:
                        break
                # urgent work first, but alternating with bulk work while both wait, so neither starves
                source = bulk if bulk and (urgent_last or not urgent) else urgent
                urgent_last = source is urgent
                batch = [i for i in (source.popleft() for _ in range(min(MAX_BATCH, len(source))))
                         if not i.future.cancelled()]
                self._run_batch(batch)
                if time.monotonic() - self._checkpointed_at > CHECKPOINT_EVERY:
                    self._checkpoint()
        finally:
            with self._conn_lock:
                if self._conn is not None:
                    self._conn.close()

    def _checkpoint(self) -> None:
        """Copy the committed log into the database file (PASSIVE: never waits for readers)."""
        self._checkpointed_at = time.monotonic()
        if not self._uncheckpointed:
            return
        with self._conn_lock:
            self._uncheckpointed = 0
            try:
                self._connection().exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
            except Exception as exc:  # the next one retries; SQLite also checkpoints on the last close
                logger.warning("SQLite checkpoint failed: %s", exc)

    @staticmethod
    def _take(item: _Item | None, urgent: deque[_Item], bulk: deque[_Item]) -> bool:
        """File a queued item; returns True for the stop sentinel."""
        if item is None:
            return True
        (urgent if item.urgent else bulk).append(item)
        return False

    def _run_batch(self, batch: list[_Item]) -> None:
        if not batch:
            return
        with self._conn_lock:
            try:
                conn = self._connection()
                self._wait_for_locks(conn, True)
            except Exception as exc:  # e.g. an unwritable path: every caller gets the error
                self._settle_all([(item, None, exc) for item in batch])
                return
            try:
                outcomes = self._transaction(conn, batch)
            except Exception as exc:
                if len(batch) == 1:
                    outcomes = [(batch[0], None, exc)]
                else:  # redo alone, so the error reaches only its own caller
                    outcomes = []
                    for item in batch:
                        try:
                            outcomes += self._transaction(conn, [item])
                        except Exception as one_exc:
                            outcomes.append((item, None, one_exc))
            self._uncheckpointed += any(item.write for item in batch)
        self._settle_all(outcomes)

    @staticmethod
    def _settle_all(outcomes: list[tuple[_Item, Any, BaseException | None]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Item, Any, BaseException | None]]] = {}
        for outcome in outcomes:
            by_loop.setdefault(outcome[0].loop, []).append(outcome)
        for loop, settled in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_settle, settled)

    @staticmethod
    def _transaction(conn: Connection, batch: list[_Item]) -> list[tuple[_Item, Any, BaseException | None]]:
        # IMMEDIATE takes the write lock up front, so a read-then-write never fails on a stale snapshot.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if any(i.write for i in batch) else "BEGIN")
        try:
            results = [(item, item.work(conn), None) for item in batch]
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        return results


class PostgresDatabase(Database):
    """PostgreSQL through asyncpg; each unit of work on a pooled connection."""

    dialect = "postgresql"

    def __init__(self, url: str) -> None:
        # Imported here: SQLAlchemy's asyncio layer and asyncpg cost ~11 MiB that SQLite gateways do not need.
        from sqlalchemy.ext.asyncio import create_async_engine

        self.engine = create_async_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True)

    async def write(self, work: Work[T], *, urgent: bool = False, quick: bool = False) -> T:
        async with self.engine.begin() as conn:  # pooled connections: nothing queues behind bulk work
            return await conn.run_sync(work)

    async def read(self, work: Work[T]) -> T:
        async with self.engine.connect() as conn:
            return await conn.run_sync(work)

    async def close(self) -> None:
        await self.engine.dispose()
