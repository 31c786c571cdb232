"""The schema under Alembic (gateway/migrations): a database the previous release left upgrades in place with its
data, every earlier version ends at the same schema as a new database, and ``store current|migrate``."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from gateway.cron_store import CronStore
from gateway.db import normalize_url
from gateway.pairing import PairingStore
from gateway.schema import (
    HEAD_REVISION,
    MESSAGE_SEARCH_NAMES,
    SCHEMA_VERSION,
    current_revision,
    meta_t,
    metadata,
    pairing_codes_t,
)
from gateway.session_settings import HomeChannel, SettingsStore
from gateway.session_summary import SummaryStore
from gateway.state_stores import PlatformStateStore, ToolStateStore
from gateway.store import RunCompletion, SessionRef, Store
from tests.gateway.schema_history import back_to

DATA = Path(__file__).parent.parent / "data"


def _differences(conn: Connection) -> list[Any]:
    """What Alembic's autogenerate finds between the database and ``gateway.schema.metadata`` (the message search is
    not Alembic's: tests/gateway/test_session_search.py checks it)."""
    def ours(name: str | None, _type: str, _parents: Any) -> bool:
        return not (name or "").startswith(MESSAGE_SEARCH_NAMES)

    return compare_metadata(MigrationContext.configure(conn, opts={"include_name": ours}), metadata)


async def _load_release(url: str) -> None:
    """Fill an empty database from the previous release's dump."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.split(":///", 1)[1]) as conn:
            conn.executescript((DATA / "release-v4.sqlite.sql").read_text())
        return
    conn = await asyncpg.connect(normalize_url(url).replace("postgresql+asyncpg", "postgresql"))
    try:
        await conn.execute((DATA / "release-v4.postgres.sql").read_text())
    finally:
        await conn.close()


def test_the_head_revision_is_the_schema_version() -> None:
    """A new revision without a new SCHEMA_VERSION (or the other way round) fails here."""
    cfg = Config()
    cfg.set_main_option("script_location", "gateway:migrations")
    assert ScriptDirectory.from_config(cfg).get_current_head() == HEAD_REVISION == f"{SCHEMA_VERSION:04d}"


async def test_a_new_database_is_at_the_head_with_every_table(store_url: str) -> None:
    store = await Store.open(store_url)
    try:
        assert await store.db.read(current_revision) == (SCHEMA_VERSION, HEAD_REVISION)
        assert await store.db.read(_differences) == []
    finally:
        await store.close()


def test_a_database_created_by_a_process_importing_only_the_store_has_every_table(tmp_path: Path) -> None:
    """The CLI's `runs list` imports the store alone; every module's tables are in the schema all the same."""
    url = f"sqlite:///{tmp_path}/state.db"
    code = ("import asyncio\nfrom gateway.store import Store\n"
            f"async def main():\n    await (await Store.open({url!r})).close()\nasyncio.run(main())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    assert "alembic" not in done.stderr  # its step-by-step INFO lines stay quiet
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        assert _differences(conn) == []
        assert {"cron_jobs", "pairing_codes", "approved_users"} <= set(sa.inspect(conn).get_table_names())
    engine.dispose()


async def test_the_previous_releases_database_upgrades_in_place_with_its_data(store_url: str) -> None:
    await _load_release(store_url)
    store = await Store.open(store_url)
    try:
        assert await store.db.read(current_revision) == (SCHEMA_VERSION, HEAD_REVISION)
        assert await store.db.read(_differences) == []
        done = await store.get_run("run-1")
        assert done is not None and (done.status, done.result, done.ended_by) == ("completed", "Hi there!", "answer")
        (waiting,) = await store.unfinished_inbox()  # accepted before the upgrade: still to be run
        assert (waiting.run_id, waiting.status) == ("run-2", "pending")
        history = await store.history("telegram:dm:100", 0, 10)
        assert [(m.role, m.content) for m in history] == [("user", "hello"), ("assistant", "Hi there!")]
        (part,) = await store.outbox_rows("run-1")
        assert (part.text, part.lane, part.status) == ("Hi there!", "telegram:100", "pending")
        tools = ToolStateStore(store)
        assert [text for _, text, _ in await tools.list_notes("telegram:100")] == ["likes tea"]
        assert (await tools.load_todos("telegram:dm:100"))[0]["content"] == "write tests"
        assert (await SummaryStore(store).load("telegram:dm:100", 0)).summary == "earlier talk"
        assert await PlatformStateStore(store).load("discord:session") == "abc"
        (job,) = await CronStore(store).list()
        assert (job.prompt, job.owner) == ("daily digest", "telegram:100")
        issued = await store.db.read(lambda conn: conn.execute(sa.select(pairing_codes_t.c.created_at)).scalar_one())
        pending = await PairingStore(store, 3600, 10).pending(now=issued + 60)  # as of the dump, not of today
        assert [p.user_id for p in pending] == ["200"]
        # What the upgrade added works on the old data.
        settings = SettingsStore(store)
        await settings.set_session("telegram:dm:100", model="m", title="t")
        await settings.set_home("telegram:100", HomeChannel("telegram", "100"))
        assert (await settings.session("telegram:dm:100")).title == "t"
        context = await store.start_run("run-2", waiting.id, SessionRef("telegram:dm:100", "telegram", "100", "100",
                                                                         None), 10)
        assert context is not None and [m.content for m in context.history] == ["hello", "Hi there!"]
        assert await store.finish_run(RunCompletion("run-2", waiting.id, "completed", result="ok")) == []
    finally:
        await store.close()


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
async def test_every_earlier_version_upgrades_to_the_schema_of_a_new_database(store_url: str, version: int) -> None:
    first = await Store.open(store_url)
    await first.db.write(lambda conn: back_to(conn, version))
    assert await first.db.read(current_revision) == (version, None)
    await first.close()
    upgraded = await Store.open(store_url)
    try:
        assert await upgraded.db.read(current_revision) == (SCHEMA_VERSION, HEAD_REVISION)
        assert await upgraded.db.read(_differences) == []
    finally:
        await upgraded.close()


async def test_a_database_newer_than_the_gateway_is_refused(store_url: str) -> None:
    first = await Store.open(store_url)
    await first.db.write(lambda conn: conn.execute(
        meta_t.update().where(meta_t.c.key == "schema_version").values(value=str(SCHEMA_VERSION + 1))))
    await first.close()
    with pytest.raises(RuntimeError, match=f"schema v{SCHEMA_VERSION + 1} is newer than this gateway"):
        await Store.open(store_url)


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True, timeout=60,
                          env={"HERMES_GATEWAY_HOME": str(home), "PATH": "/usr/bin:/bin"},
                          cwd=Path(__file__).parents[2])


async def test_store_current_and_migrate_on_the_previous_releases_database(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(f"store:\n  url: sqlite:///{tmp_path}/state.db\n")
    await _load_release(f"sqlite:///{tmp_path}/state.db")
    current = _cli(tmp_path, "store", "current")
    assert current.returncode == 0, current.stderr
    assert current.stdout.strip() == (
        f"schema v4 (from before Alembic): this gateway migrates it to v{SCHEMA_VERSION} when it starts; to do it "
        "now, back the database up, then run: hermes-gateway store migrate")
    migrated = _cli(tmp_path, "store", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.strip() == f"migrated v4 to schema v{SCHEMA_VERSION} (revision {HEAD_REVISION})"
    again = _cli(tmp_path, "store", "migrate")
    assert again.stdout.strip() == f"schema v{SCHEMA_VERSION} (revision {HEAD_REVISION}): already up to date"
    assert "up to date" in _cli(tmp_path, "store", "current").stdout
    engine = sa.create_engine(f"sqlite:///{tmp_path}/state.db")
    with engine.connect() as conn:
        assert current_revision(conn) == (SCHEMA_VERSION, HEAD_REVISION)
        assert _differences(conn) == []
    engine.dispose()
