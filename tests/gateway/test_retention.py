"""Retention (gateway/retention.py): exactly what is old and finished goes, in batches, on the leader only;
``store prune|stats|vacuum``; a running gateway prunes in the background. Time is moved by rewriting stored
timestamps, never by sleeping."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from gateway.cli import main
from gateway.config import ConfigError, load_config
from gateway.config.sections import LimitsSettings
from gateway.config.store import RetentionSettings
from gateway.pairing import PairingStore
from gateway.retention import check_dedupe_window, prune
from gateway.schema import (
    inbox_t,
    messages_t,
    outbox_t,
    pairing_codes_t,
    run_usage_t,
    runs_t,
    session_summaries_t,
    user_rate_limits_t,
    user_usage_t,
)
from gateway.session_summary import SummaryStore
from gateway.store import ChatMessage, NewRun, OutboxPart, RunCompletion, RunUsage, Store

DAY = 86400.0
RULES = RetentionSettings(events="1d", cron_fires="1d", dedupe="2d", transcripts="1d", outbox="1d", usage="1d",
                          batch_size=100)
_TIMES = {inbox_t: ("created_at", "updated_at"), runs_t: ("created_at", "started_at", "finished_at"),
          messages_t: ("created_at",), outbox_t: ("created_at", "sent_at", "next_attempt_at"),
          run_usage_t: ("created_at",), session_summaries_t: ("updated_at",)}


async def _age(store: Store, seconds: float) -> None:
    """Make everything stored so far ``seconds`` older."""
    def work(conn: Any) -> None:
        for table, columns in _TIMES.items():
            conn.execute(table.update().values({c: table.c[c] - seconds for c in columns}))

    await store.db.write(work)


async def _chat_run(store: Store, name: str, *, finish: bool = True, parts: int = 1,
                    size: int = 0) -> tuple[int, str]:
    """An accepted chat event and its run (finished with a transcript, usage and sent parts when ``finish``);
    ``size``: characters of padding in its payload, prompt and answer."""
    run_id, pad = f"run-{name}", "x" * size
    acc = await store.accept(f"telegram:{name}", "telegram", "message", f"s-{name}", {"text": name + pad},
                             NewRun(run_id, "chat", "telegram", ["core"], name + pad))
    if not finish:
        return acc.inbox_id, run_id
    ctx = await store.start_run(run_id, acc.inbox_id)
    assert ctx is not None
    rows = await store.finish_run(RunCompletion(
        run_id, acc.inbox_id, "completed", result="ok", session_key=f"s-{name}", epoch=0,
        transcript=[ChatMessage("user", name), ChatMessage("assistant", "ok" + pad)],
        usage=RunUsage("chat", "telegram:1", "m", 10, 5),
        deliveries=[OutboxPart(f"{run_id}:{i}", "telegram", "100", "ok", part_index=i, run_id=run_id)
                    for i in range(parts)]))
    assert rows is not None
    for row in rows:
        await store.mark_sent(row.id, "m1")
    return acc.inbox_id, run_id


async def _count(store: Store, table: sa.Table, *where: Any) -> int:
    query = sa.select(sa.func.count()).select_from(table).where(*where)
    return int(await store.db.read(lambda conn: conn.execute(query).scalar_one()))


@pytest.fixture
async def store(store_url: str) -> Any:
    s = await Store.open(store_url)
    yield s
    await s.close()


async def test_prune_takes_exactly_what_is_old_and_finished(store: Store) -> None:
    # three days old: past every window, dedupe's included
    await _chat_run(store, "old")
    await _chat_run(store, "oldcron")
    await store.db.write(lambda conn: conn.execute(inbox_t.update().where(inbox_t.c.dedupe_key == "telegram:oldcron")
                                                   .values(platform="cron")))
    stuck_inbox, stuck_run = await _chat_run(store, "stuck", finish=False)
    pending = await store.enqueue([OutboxPart("pending-part", "telegram", "200", "wait")])
    failed = await store.enqueue([OutboxPart("failed-part", "telegram", "201", "gone")])
    doubt = await store.enqueue([OutboxPart("doubt-part", "telegram", "202", "maybe")])
    assert pending and failed and doubt
    await store.mark_failed(failed[0].id, "400")
    await store.db.write(lambda conn: conn.execute(outbox_t.update().where(outbox_t.c.id == doubt[0].id)
                                                   .values(status="failed", in_doubt=1)))
    await _age(store, 1.5 * DAY)
    # a day and a half old: past the events' window, inside the dedupe window
    middle_inbox, middle_run = await _chat_run(store, "middle")
    await _age(store, 1.5 * DAY)
    await _chat_run(store, "new")

    report = await prune(store, RULES, pause=0)

    assert report.rows["events"] == 3  # old, oldcron and middle: compacted, their runs gone
    assert report.rows["dedupe"] == 2  # old and oldcron: three days are past the dedupe window
    keys = {r.dedupe_key: r.status for r in await store.db.read(lambda c: c.execute(sa.select(inbox_t)).all())}
    assert keys == {"telegram:stuck": "pending", "telegram:middle": "pruned", "telegram:new": "done"}
    assert {r.id for r in await store.list_runs(10)} == {stuck_run, "run-new"}
    assert (await store.get_inbox(middle_inbox)).payload == {}  # type: ignore[union-attr]
    # the middle event's key still deduplicates: a redelivery is not a new event
    again = await store.accept("telegram:middle", "telegram", "message", "s-middle", {"text": "again"},
                               NewRun("run-again", "chat", "telegram", ["core"], "again"))
    assert again.duplicate and again.inbox_id == middle_inbox and again.run_id == middle_run
    assert await store.get_run("run-again") is None
    # transcripts older than a day went; the new conversation stays
    assert [m.content for m in await store.history("s-new", 0, 10)] == ["new", "ok"]
    assert await store.history("s-middle", 0, 10) == []
    # outbox: sent and failed parts went; pending and in-doubt ones stay
    assert {r.dedupe_key for r in await store.outbox_rows()} == {"pending-part", "doubt-part", "run-new:0"}
    assert report.rows["outbox"] == 4  # old's, oldcron's and middle's sent parts, the failed one
    assert await _count(store, run_usage_t) == 4  # this month's usage stays, whatever the window
    assert (await store.get_inbox(stuck_inbox)).status == "pending"  # type: ignore[union-attr]

    # a second pass finds nothing more
    assert (await prune(store, RULES, pause=0)).total == 0


async def test_an_unfinished_run_keeps_its_finished_event(store: Store) -> None:
    inbox_id, run_id = await _chat_run(store, "odd", finish=False)
    await store.set_inbox_status(inbox_id, "done")  # the event closed, its run not (yet)
    await _age(store, 10 * DAY)
    assert (await prune(store, RULES, pause=0)).total == 0
    assert (await store.get_run(run_id)) is not None


async def test_keep_forever_and_dedupe_forever(store: Store) -> None:
    await _chat_run(store, "old")
    await _age(store, 1000 * DAY)
    rules = RULES.model_copy(update={"dedupe": None, "transcripts": None, "outbox": None, "usage": None})
    report = await prune(store, rules, pause=0)
    assert (report.rows["events"], report.total) == (1, 1)
    assert await _count(store, inbox_t, inbox_t.c.status == "pruned") == 1
    assert await _count(store, messages_t) == 2 and await _count(store, outbox_t) == 1


async def test_a_prune_goes_in_batches_of_batch_size(store: Store) -> None:
    rules = RULES.model_copy(update={"batch_size": 4})
    baseline = (await prune(store, rules, pause=0)).batches  # one batch per kind when nothing is old
    await _chat_run(store, "a", parts=5)  # five sent parts: one more than a batch
    await _age(store, 1.5 * DAY)  # the event is compacted; its parts and messages go
    writes: list[int] = []
    write = store.db.write

    async def counting(work: Any, **kwargs: Any) -> Any:
        result = await write(work, **kwargs)
        if isinstance(result, int):
            writes.append(result)
        return result

    store.db.write = counting  # type: ignore[method-assign]
    report = await prune(store, rules, pause=0)
    assert report.rows["outbox"] == 5
    assert report.batches == baseline + 1  # the outbox's sent parts took two batches (4 + 1)
    assert writes and max(writes) <= 4  # no write deleted more than a batch


async def test_usage_of_this_and_last_month_survives(store: Store) -> None:
    await _chat_run(store, "u")
    now = datetime(2026, 3, 20, 12, tzinfo=UTC).timestamp()
    times = {"old": datetime(2026, 1, 15, tzinfo=UTC).timestamp(), "last": datetime(2026, 2, 2, tzinfo=UTC).timestamp(),
             "this": datetime(2026, 3, 1, tzinfo=UTC).timestamp()}

    def work(conn: Any) -> None:
        row = conn.execute(sa.select(run_usage_t)).one()._asdict()
        conn.execute(run_usage_t.delete())
        conn.execute(run_usage_t.insert(), [{**row, "run_id": k, "created_at": t} for k, t in times.items()])

    await store.db.write(work)
    report = await prune(store, RULES, now=now, pause=0)
    assert report.rows["usage"] == 1
    kept = await store.db.read(lambda conn: set(conn.execute(sa.select(run_usage_t.c.run_id)).scalars()))
    assert kept == {"last", "this"}


async def test_expired_pairing_codes_and_summaries_of_pruned_conversations_go(store: Store) -> None:
    pairing = PairingStore(store, ttl=600)
    now = time.time()
    assert await pairing.issue("telegram", "7", "old", "7", now=now - 2 * 3600)
    assert await pairing.issue("telegram", "8", "new", "8", now=now)
    await _chat_run(store, "gone")
    await SummaryStore(store).save("s-gone", 0, summary="long ago", through_id=1)
    await _age(store, 2 * DAY)
    await _chat_run(store, "here")
    await SummaryStore(store).save("s-here", 0, summary="recent", through_id=1)
    report = await prune(store, RULES, pause=0)
    assert report.rows["pairing"] == 1 and report.rows["summaries"] == 1
    assert await store.db.read(lambda c: list(c.execute(sa.select(pairing_codes_t.c.user_id)).scalars())) == ["8"]
    assert await store.db.read(lambda c: list(c.execute(sa.select(session_summaries_t.c.session_key)).scalars())) \
        == ["s-here"]


def test_retention_config_is_validated_with_the_key_and_the_fix(tmp_path: Path) -> None:
    def load(retention: str) -> Any:
        path = tmp_path / "config.yaml"
        path.write_text(f"store:\n  url: sqlite:///{tmp_path}/s.db\n  retention:\n{retention}\n")
        return load_config(path, {})

    cfg = load("    events: 12h\n    transcripts: 0\n    outbox: 3\n    interval: 90s")
    assert (cfg.store.retention.events, cfg.store.retention.transcripts) == (43200.0, None)
    assert (cfg.store.retention.outbox, cfg.store.retention.interval) == (3 * DAY, 90.0)
    with pytest.raises(ConfigError, match="must be at least 10 minutes") as info:
        load("    dedupe: 5m")
    assert info.value.errors[0].path == "store.retention.dedupe" and "10m" in info.value.errors[0].hint
    with pytest.raises(ConfigError, match="not a duration") as info:
        load("    events: soon")
    assert info.value.errors[0].path == "store.retention.events"
    with pytest.raises(ConfigError, match="positive") as info:
        load("    interval: 0")


def test_dedupe_window_covers_the_sources_windows(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"model:\n  api_key: k\nstore:\n  url: sqlite:///{tmp_path}/s.db\n  retention:\n    dedupe: 1h\n"
                    "platforms:\n  webhook:\n    routes:\n      gh:\n        secret: s\n        prompt: p\n")
    with pytest.raises(ConfigError, match=r"replay_window_seconds \(86400s\)") as info:
        check_dedupe_window(load_config(path, {}))
    assert info.value.path == "store.retention.dedupe" and "24h" in info.value.hint
    path.write_text(path.read_text().replace("dedupe: 1h", "dedupe: 1d"))
    check_dedupe_window(load_config(path, {}))


# -- the CLI ------------------------------------------------------------------------------------------------------


def _config(tmp_path: Path, db: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"store:\n  url: sqlite:///{db}\n  retention:\n    events: 1d\n    transcripts: 1d\n"
                    "    outbox: 1d\n    dedupe: 1d\n")
    return path


async def _fill(url: str, runs: int, size: int = 100, prefix: str = "") -> None:
    store = await Store.open(url)
    try:
        for i in range(runs):
            await _chat_run(store, f"{prefix}{i}", size=size)
        await _age(store, 3 * DAY)
    finally:
        await store.close()


def test_store_prune_dry_run_counts_and_deletes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    asyncio.run(_fill(f"sqlite:///{db}", 3))
    config = _config(tmp_path, db)
    assert main(["store", "prune", "--dry-run", "--json", "--config", str(config)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dry_run"] and out["rows"]["events"] == 3 and out["rows"]["transcripts"] == 6
    assert out["rows"]["outbox"] == 3 and out["batches"] == 0
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (3,)
    assert main(["store", "prune", "--config", str(config)]) == 0
    assert capsys.readouterr().out.startswith(
        "pruned 15 rows: events 3, dedupe 3, transcripts 6, summaries 0, outbox 3,")
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM inbox").fetchone() == (0,)


def test_store_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    asyncio.run(_fill(f"sqlite:///{db}", 2))
    config = _config(tmp_path, db)
    assert main(["store", "stats", "--json", "--config", str(config)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tables"]["runs"]["rows"] == 2 and out["tables"]["messages"]["rows"] == 4
    assert out["tables"]["inbox"]["bytes"] > 0 and out["auto_vacuum"] == "incremental"
    assert out["file_bytes"] + out["wal_bytes"] > 0
    assert main(["store", "stats", "--config", str(config)]) == 0
    text = capsys.readouterr().out
    assert "runs" in text and "2 rows" in text and "auto_vacuum incremental" in text


def test_store_vacuum_switches_to_incremental_and_shrinks_after_a_prune(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "state.db"
    with sqlite3.connect(db) as conn:  # a database from before retention: no auto-vacuum
        conn.execute("CREATE TABLE scratch (x)")
        conn.execute("DROP TABLE scratch")
    asyncio.run(_fill(f"sqlite:///{db}", 60, size=4000))
    config = _config(tmp_path, db)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone() == (0,)
    assert main(["store", "prune", "--config", str(config)]) == 0
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    pruned_size = db.stat().st_size
    capsys.readouterr()
    assert main(["store", "vacuum", "--config", str(config)]) == 0
    assert "switched to incremental auto-vacuum" in capsys.readouterr().out
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone() == (2,)
    assert db.stat().st_size < pruned_size / 2
    # from now on a prune hands its pages back by itself
    asyncio.run(_fill(f"sqlite:///{db}", 60, size=4000, prefix="again-"))
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    full = db.stat().st_size
    assert main(["store", "prune", "--json", "--config", str(config)]) == 0
    assert json.loads(capsys.readouterr().out)["vacuumed_pages"] > 0
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert db.stat().st_size < full / 2


# -- the gateway ---------------------------------------------------------------------------------------------------


_TINY = {"store": {"retention": {"events": "1h", "transcripts": "1h", "outbox": "1h", "dedupe": "1d",
                                 "interval": "1s"}}}


async def test_a_gateway_prunes_in_the_background(make_gateway) -> None:
    h = await make_gateway(_TINY)
    store = h.gateway.store
    await h.chat.user_says("hello", event_id="e1")
    await asyncio.wait_for(_until(lambda: _count(store, runs_t, runs_t.c.status == "completed"), 1), 10)
    await asyncio.wait_for(_until(lambda: _count(store, outbox_t, outbox_t.c.status == "sent"), 1), 10)
    await _age(store, 2 * 3600)  # two hours ago, as far as the store knows
    await asyncio.wait_for(_until(lambda: _count(store, inbox_t, inbox_t.c.status == "pruned"), 1), 10)
    await asyncio.wait_for(_until(lambda: _count(store, outbox_t), 0), 10)
    assert await _count(store, runs_t) == 0 and await _count(store, messages_t) == 0
    # the event's dedupe record is still there: a redelivery is dropped
    await h.chat.user_says("hello", event_id="e1")
    assert await _count(store, runs_t) == 0


async def _until(count: Any, expected: int) -> None:
    while await count() != expected:
        await asyncio.sleep(0.05)


async def test_the_prune_loop_runs_only_while_leading(make_gateway) -> None:
    h = await make_gateway(_TINY)
    gateway = h.gateway
    assert gateway.pruner is not None and gateway.pruner.running
    gateway.coordinator._set_leader(False)
    await asyncio.wait_for(_until(lambda: _running(gateway), 0), 5)
    await _chat_run(gateway.store, "while-following")
    await _age(gateway.store, 2 * 3600)
    await asyncio.sleep(1.5)  # longer than the interval: a leader would have pruned by now
    assert await _count(gateway.store, inbox_t, inbox_t.c.status == "done") == 1
    gateway.coordinator._set_leader(True)
    await asyncio.wait_for(_until(lambda: _count(gateway.store, inbox_t, inbox_t.c.status == "done"), 0), 10)


async def _running(gateway: Any) -> int:
    return int(gateway.pruner.running)


async def test_limit_rows_that_no_longer_limit_anything_go(store: Store) -> None:
    """Minutes of usage past the budgets' hour go; a user's bucket goes once it has refilled to full (a missing
    bucket is a full one), a draining one stays; without the limits (the CLI) buckets are left alone."""
    now = time.time()
    minute = int(now // 60)
    await store.db.write(lambda conn: conn.execute(user_usage_t.insert(), [
        {"user_key": "u:old", "minute": minute - 61, "model_calls": 1, "tokens": 10},
        {"user_key": "u:now", "minute": minute - 5, "model_calls": 1, "tokens": 10}]))
    limits = LimitsSettings(user_messages_per_minute=6, user_burst=10)  # 0.1 token a second
    await store.db.write(lambda conn: conn.execute(user_rate_limits_t.insert(), [
        {"user_key": "u:full", "tokens": 4, "refilled_at": now - 61},  # 4 + 6.1 >= 10
        {"user_key": "u:draining", "tokens": 4, "refilled_at": now - 59}]))  # 4 + 5.9 < 10
    cli = await prune(store, RULES, now=now, pause=0)
    assert cli.rows["limits"] == 1 and await _count(store, user_rate_limits_t) == 2
    gateway = await prune(store, RULES, now=now, pause=0, limits=limits)
    assert gateway.rows["limits"] == 1
    assert [r.user_key for r in await store.db.read(lambda c: c.execute(sa.select(user_usage_t)).all())] == ["u:now"]
    kept = await store.db.read(lambda c: c.execute(sa.select(user_rate_limits_t.c.user_key)).scalars().all())
    assert kept == ["u:draining"]


async def test_answered_approvals_and_dead_interaction_tokens_go(store: Store) -> None:
    """Approval requests answered before the events' window go, waiting ones stay whatever their age; Discord
    interaction tokens a day old go (they die after 15 minutes), other platform state stays."""
    from gateway.approvals import APPROVED, decide, insert_approval, new_approval
    from gateway.retention import INTERACTION_STATE_PREFIX
    from gateway.schema import approvals_t, platform_state_t
    from platforms.discord_interactions import _INTERACTION_KEY

    assert INTERACTION_STATE_PREFIX == _INTERACTION_KEY
    origin = {"platform": "telegram", "chat_id": "1", "chat_type": "dm", "user_id": "1", "user_name": "a"}
    old, waiting, recent = (new_approval("s", f"run-{n}", origin, "telegram:1", [], 60) for n in range(3))
    now = time.time()

    def setup(conn: Any) -> None:
        for approval in (old, waiting, recent):
            insert_approval(conn, approval)
        decide(conn, old, APPROVED, "a")
        decide(conn, recent, APPROVED, "a")
        conn.execute(approvals_t.update().where(approvals_t.c.id.in_([old.id, waiting.id]))
                     .values(decided_at=approvals_t.c.decided_at - 2 * DAY, created_at=now - 2 * DAY))
        conn.execute(platform_state_t.insert(), [
            {"key": f"{INTERACTION_STATE_PREFIX}1", "value": "t", "updated_at": now - 2 * DAY},
            {"key": f"{INTERACTION_STATE_PREFIX}2", "value": "t", "updated_at": now - 60},
            {"key": "telegram:offset", "value": "9", "updated_at": now - 2 * DAY}])

    await store.db.write(setup)
    report = await prune(store, RULES, pause=0)
    assert report.rows["approvals"] == 1 and report.rows["interactions"] == 1
    left = await store.db.read(lambda c: sorted(c.execute(sa.select(approvals_t.c.id)).scalars()))
    assert left == sorted([waiting.id, recent.id])
    keys = await store.db.read(lambda c: sorted(c.execute(sa.select(platform_state_t.c.key)).scalars()))
    assert keys == [f"{INTERACTION_STATE_PREFIX}2", "telegram:offset"]


async def test_a_sent_files_bytes_go_once_no_waiting_part_needs_them(store: Store) -> None:
    """A file's bytes are stored once (by SHA-256) with the parts that send it; pruning keeps them while any part
    that sends them waits, whatever their age, and removes them once every such part was sent."""
    from gateway.media.outbound import file_part
    from gateway.schema import outbox_files_t

    chart = file_part("photo", "chart.png", "image/png", b"\x89PNG chart")
    parts = [OutboxPart(f"run-f:{n}", "telegram", "100", "caption", part_index=n, run_id="run-f", file=chart)
             for n in range(2)]
    first, second = await store.enqueue(parts)
    assert await _count(store, outbox_files_t) == 1
    assert await store.outbox_file(chart.sha256) == b"\x89PNG chart"
    assert (first.file.name, first.file.kind, first.file.size, first.file.data) == ("chart.png", "photo", 10, None)
    await store.mark_sent(first.id, "m1")
    report = await prune(store, RULES, pause=0)
    assert report.rows["files"] == 0 and await store.outbox_file(chart.sha256) is not None  # the second waits
    await store.mark_sent(second.id, "m2")
    report = await prune(store, RULES, pause=0)
    assert report.rows["files"] == 1 and await store.outbox_file(chart.sha256) is None
