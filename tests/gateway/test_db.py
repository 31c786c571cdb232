"""The unit-of-work runner: SQLite group commit, inline quick units, checkpoints, error isolation inside a batch,
cancellation, close."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gateway.db import INLINE_BACKOFF, Database, SqliteDatabase, normalize_url

_meta = sa.MetaData()
_items = sa.Table("items", _meta, sa.Column("id", sa.Integer, primary_key=True), sa.Column("v", sa.String(32)))


@pytest.fixture
async def db(store_url: str) -> AsyncIterator[Database]:
    """A database with one table, on SQLite and on PostgreSQL."""
    database = Database.connect(store_url)
    await database.write(_meta.create_all)
    yield database
    await database.close()


def _insert(item_id: int) -> object:
    return lambda conn: conn.execute(_items.insert().values(id=item_id, v=str(item_id))).rowcount


async def _ids(database: Database) -> list[int]:
    return await database.read(lambda conn: [r.id for r in conn.execute(sa.select(_items.c.id).order_by("id"))])


async def test_a_failing_unit_rolls_back_alone(db: Database) -> None:
    def half_then_fail(conn: Connection) -> None:
        conn.execute(_items.insert().values(id=1000, v="half"))
        raise ValueError("boom")

    works = [_insert(i) for i in range(20)]
    works.insert(7, half_then_fail)
    works.insert(12, _insert(3))  # a duplicate primary key: one of the two inserts of id 3 fails
    results = await asyncio.gather(*(db.write(w) for w in works), return_exceptions=True)
    assert isinstance(results[7], ValueError)
    assert sorted(type(r).__name__ for r in (results[3], results[12])) == ["IntegrityError", "int"]
    assert [r for i, r in enumerate(results) if i not in (3, 7, 12)] == [1] * 19
    assert await _ids(db) == list(range(20)), "every other unit committed; the failing one left nothing"


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_sqlite_batches_concurrent_units_into_few_transactions(db: Database) -> None:
    assert isinstance(db, SqliteDatabase)
    commits = 0

    def count(_conn: object) -> None:
        nonlocal commits
        commits += 1

    sa.event.listen(db.engine, "commit", count)
    gate = threading.Event()
    blocker = asyncio.ensure_future(db.write(lambda conn: gate.wait(5)))
    await asyncio.sleep(0.05)  # the worker thread is inside the blocker's transaction
    writes = [asyncio.ensure_future(db.write(_insert(i))) for i in range(50)]
    await asyncio.sleep(0.05)
    gate.set()
    await blocker
    assert await asyncio.gather(*writes) == [1] * 50
    assert commits <= 3, f"50 queued units should share a commit or two, got {commits}"
    assert len(await _ids(db)) == 50


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_sqlite_runs_urgent_work_ahead_of_queued_bulk_work_without_starving_it(db: Database) -> None:
    ran: list[str] = []

    def unit(name: str, item_id: int) -> object:
        def work(conn: Connection) -> None:
            ran.append(name)
            conn.execute(_items.insert().values(id=item_id, v=name))
        return work

    gate = threading.Event()
    blocker = asyncio.ensure_future(db.write(lambda conn: gate.wait(5)))
    await asyncio.sleep(0.05)  # the worker thread is inside the blocker's transaction
    queued = [asyncio.ensure_future(db.write(unit(f"bulk{i}", i))) for i in range(3)]
    queued += [asyncio.ensure_future(db.write(unit(f"urgent{i}", 10 + i), urgent=True)) for i in range(2)]
    await asyncio.sleep(0.05)
    gate.set()
    await asyncio.gather(blocker, *queued)
    assert ran == ["urgent0", "urgent1", "bulk0", "bulk1", "bulk2"]  # the urgent batch first, then the rest

    # while both kinds keep coming, batches alternate: bulk work is not left behind for good
    ran.clear()
    holding = threading.Event()

    def urgent_held(conn: Connection) -> None:
        ran.append("urgent-a")
        holding.wait(5)
        conn.execute(_items.insert().values(id=20, v="urgent-a"))

    gate.clear()
    blocker = asyncio.ensure_future(db.write(lambda conn: gate.wait(5)))
    await asyncio.sleep(0.05)
    first = [asyncio.ensure_future(db.write(urgent_held, urgent=True)),
             asyncio.ensure_future(db.write(unit("bulk-a", 21)))]
    await asyncio.sleep(0.05)
    gate.set()
    await asyncio.sleep(0.05)  # urgent-a's batch is running
    late = asyncio.ensure_future(db.write(unit("urgent-b", 22), urgent=True))
    await asyncio.sleep(0.05)
    holding.set()
    await asyncio.gather(blocker, *first, late)
    assert ran == ["urgent-a", "bulk-a", "urgent-b"]


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_sqlite_skips_work_cancelled_before_it_ran_and_close_drains_the_rest(db: Database) -> None:
    gate = threading.Event()
    blocker = asyncio.ensure_future(db.write(lambda conn: gate.wait(5)))
    await asyncio.sleep(0.05)
    cancelled = asyncio.ensure_future(db.write(_insert(1)))
    kept = asyncio.ensure_future(db.write(_insert(2)))
    await asyncio.sleep(0)
    cancelled.cancel()
    gate.set()
    await blocker
    assert await kept == 1
    assert await _ids(db) == [2]
    queued = asyncio.ensure_future(db.write(_insert(3)))
    await asyncio.sleep(0)  # submitted
    await db.close()
    assert await queued == 1, "close() finishes the work already queued"
    with pytest.raises(RuntimeError, match="closed"):
        await db.write(_insert(4))


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_sqlite_reads_see_committed_writes_of_another_connection(store_url: str, db: Database) -> None:
    other = Database.connect(store_url)
    try:
        await other.write(_insert(5))
        assert await _ids(db) == [5]
    finally:
        await other.close()


def test_url_forms(tmp_path: Path) -> None:
    assert normalize_url("postgresql://u:p@h/db") == "postgresql+asyncpg://u:p@h/db"
    assert normalize_url("postgres://u:p@h/db") == "postgresql+asyncpg://u:p@h/db"
    assert normalize_url("sqlite+aiosqlite:///x.db") == "sqlite:///x.db"
    with pytest.raises(ValueError, match="unsupported store URL 'mysql'"):
        Database.connect("mysql://u:p@h/db")


async def test_a_database_that_cannot_be_opened_fails_each_caller_instead_of_hanging(tmp_path: Path) -> None:
    (tmp_path / "state.db").mkdir()  # a directory where the database file should be
    db = Database.connect(f"sqlite:///{tmp_path}/state.db")
    try:
        for _ in range(2):
            with pytest.raises(sa.exc.OperationalError, match="unable to open database file"):
                await asyncio.wait_for(db.read(lambda conn: conn.execute(sa.select(1)).scalar()), 5)
    finally:
        await db.close()


def _ran_on(where: list[str], item_id: int) -> object:
    def work(conn: Connection) -> int:
        where.append(threading.current_thread().name)
        return conn.execute(_items.insert().values(id=item_id, v="x")).rowcount
    return work


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_sqlite_runs_quick_work_inline_when_idle_and_queues_it_behind_a_running_transaction(
        db: Database) -> None:
    where: list[str] = []
    assert await db.write(_ran_on(where, 1), quick=True) == 1
    assert where == [threading.current_thread().name], "an idle store commits quick work on the caller's thread"

    gate = threading.Event()
    blocker = asyncio.ensure_future(db.write(lambda conn: gate.wait(5)))
    await asyncio.sleep(0.05)  # the store's thread holds the connection
    queued = asyncio.ensure_future(db.write(_ran_on(where, 2), quick=True))
    await asyncio.sleep(0.05)
    assert not queued.done(), "quick work never runs beside the thread's transaction"
    gate.set()
    await blocker
    assert await queued == 1
    assert where[1] == "hermes-db"
    assert await _ids(db) == [1, 2]


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_sqlite_quick_work_never_waits_on_the_loop_for_another_process_write_lock(
        store_url: str, db: Database) -> None:
    await db.write(_insert(1))
    holder = sqlite3.connect(store_url.split(":///", 1)[1], isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock
    where: list[str] = []
    started = time.perf_counter()
    write = asyncio.ensure_future(db.write(_ran_on(where, 2), quick=True))
    await asyncio.sleep(0)
    assert time.perf_counter() - started < 0.5, "the loop was held while the lock was busy"
    await asyncio.sleep(0.3)
    assert not write.done(), "the store's thread waits for the lock (busy timeout), not the loop"
    holder.execute("COMMIT")
    holder.close()
    assert await asyncio.wait_for(write, 5) == 1
    assert where == ["hermes-db"]
    assert await _ids(db) == [1, 2]


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_sqlite_checkpoints_only_on_its_own_thread(db: Database) -> None:
    assert isinstance(db, SqliteDatabase)
    checkpoints: list[str] = []

    def seen(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if "wal_checkpoint" in statement:
            checkpoints.append(threading.current_thread().name)

    sa.event.listen(db.engine, "before_cursor_execute", seen)
    assert await db.read(lambda conn: conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar()) == 0, \
        "a commit never checkpoints by itself (it could be on the event loop)"
    for i in range(20):
        await db.write(_insert(i), quick=True)
        await asyncio.sleep(0.006)  # each one inline (at most one per 5 ms)
    for _ in range(60):  # the store's thread checkpoints what was committed within about a second
        if checkpoints:
            break
        await asyncio.sleep(0.05)
    assert checkpoints and set(checkpoints) == {"hermes-db"}
    assert len(await _ids(db)) == 20


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_sqlite_sends_a_burst_of_quick_work_and_work_after_a_slow_inline_unit_to_its_thread(
        db: Database) -> None:
    assert isinstance(db, SqliteDatabase)
    here = threading.current_thread().name
    where: list[str] = []
    assert await asyncio.gather(*(db.write(_ran_on(where, i), quick=True) for i in range(50))) == [1] * 50
    assert where[0] == here
    assert where.count("hermes-db") >= 45, "a burst is committed by the thread in batches, not on the loop"

    slow_ids = iter(range(100, 105))

    def slow(conn: Connection) -> int:
        where.append(threading.current_thread().name)
        time.sleep(0.005)  # as when busy threads hold the GIL the loop needs back after each SQLite call
        return conn.execute(_items.insert().values(id=next(slow_ids), v="slow")).rowcount

    # The slow unit runs inline when no back-off is running and the connection is free; on a loaded machine
    # the burst's first unit may have started a back-off, or the thread may be checkpointing: wait and retry.
    for _ in range(5):
        await asyncio.sleep(INLINE_BACKOFF + 0.05)
        where.clear()
        assert await db.write(slow, quick=True) == 1
        if where == [here]:
            break
    assert where == [here], "a quick unit runs inline once the loop is quiet"
    await asyncio.sleep(0.05)  # well past the spacing between inline units, within the back-off
    assert await db.write(_ran_on(where, 99), quick=True) == 1
    assert where == [here, "hermes-db"]
    assert 52 <= len(await _ids(db)) <= 56
