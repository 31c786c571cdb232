"""The SQLite store: inbox dedupe, atomic run completion, history epochs, outbox states, schema."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa

from gateway.schema import SCHEMA_VERSION, meta_t
from gateway.session_settings import HomeChannel, SessionSettings, SettingsStore
from gateway.store import ChatMessage, Claim, NewRun, OutboxPart, RunCompletion, Store
from tests.gateway.schema_history import back_to

KEY = "telegram:dm:100"


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    """A store on a fresh database: once on SQLite, once on PostgreSQL (the `store_url` fixture)."""
    s = await Store.open(store_url)
    yield s
    await s.close()


def _run(prompt: str = "hi") -> NewRun:
    return NewRun(uuid.uuid4().hex, "chat", "telegram", ["hermes-telegram"], prompt, "telegram:100")


async def _accept_run(store: Store, dedupe_key: str, prompt: str = "hi") -> tuple[int, str]:
    acc = await store.accept(dedupe_key, "telegram", "chat", KEY, {"text": prompt}, _run(prompt))
    assert not acc.duplicate and acc.run_id is not None
    return acc.inbox_id, acc.run_id


def _parts(run_id: str, n: int, chat_id: str = "100") -> list[OutboxPart]:
    return [OutboxPart(f"run:{run_id}:{i}", "telegram", chat_id, f"part {i}", part_index=i, parts_total=n,
                       run_id=run_id) for i in range(n)]


async def test_accept_dedupes_on_the_key(store: Store) -> None:
    first = await store.accept("telegram:1", "telegram", "chat", KEY, {"n": 1}, _run())
    again = await store.accept("telegram:1", "telegram", "chat", KEY, {"n": 2}, _run())
    assert not first.duplicate and again.duplicate
    assert (again.inbox_id, again.run_id) == (first.inbox_id, first.run_id)
    assert await store.count_inbox() == 1 and await store.count_runs() == 1
    rows = await store.unfinished_inbox()
    assert [r.payload for r in rows] == [{"n": 1}]


async def test_concurrent_accepts_of_one_key_have_exactly_one_winner(store: Store) -> None:
    runs = [_run() for _ in range(12)]
    results = await asyncio.wait_for(asyncio.gather(*(
        store.accept("telegram:race", "telegram", "chat", KEY, {"i": i}, run) for i, run in enumerate(runs))), 20)
    winners = [r for r in results if not r.duplicate]
    assert len(winners) == 1
    assert {(r.inbox_id, r.run_id) for r in results} == {(winners[0].inbox_id, winners[0].run_id)}
    assert await store.count_inbox() == 1 and await store.count_runs() == 1
    assert (await store.get_run(winners[0].run_id)) is not None


async def test_finish_run_is_atomic_and_idempotent(store: Store) -> None:
    inbox_id, run_id = await _accept_run(store, "telegram:1")
    await store.start_run(run_id, inbox_id)
    assert (await store.get_run(run_id)).status == "running"
    assert [r.status for r in await store.unfinished_inbox()] == ["running"]
    epoch = await store.session_epoch(KEY, "telegram", "100", "1001", None)
    done = RunCompletion(run_id, inbox_id, "completed", result="hello", model_calls=1, session_key=KEY,
                         epoch=epoch, transcript=[ChatMessage("user", "hi"), ChatMessage("assistant", "hello")],
                         deliveries=_parts(run_id, 2))
    assert await store.finish_run(done)
    run = await store.get_run(run_id)
    assert (run.status, run.result, run.model_calls, run.attempts) == ("completed", "hello", 1, 1)
    assert await store.unfinished_inbox() == []
    assert [m.content for m in await store.history(KEY, epoch, 10)] == ["hi", "hello"]
    assert [r.dedupe_key for r in await store.outbox_rows(run_id)] == [f"run:{run_id}:0", f"run:{run_id}:1"]

    replay = RunCompletion(run_id, inbox_id, "failed", result="other", session_key=KEY, epoch=epoch,
                           transcript=[ChatMessage("user", "hi"), ChatMessage("assistant", "other")],
                           deliveries=[OutboxPart(f"run:{run_id}:replay", "telegram", "100", "other",
                                                  run_id=run_id)])
    assert await store.finish_run(replay) is None
    assert (await store.get_run(run_id)).result == "hello"
    assert len(await store.history(KEY, epoch, 10)) == 2
    assert len(await store.outbox_rows(run_id)) == 2


async def test_cancelled_run_finishes_without_deliveries(store: Store) -> None:
    inbox_id, run_id = await _accept_run(store, "telegram:1")
    await store.start_run(run_id, inbox_id)
    assert await store.finish_run(RunCompletion(run_id, inbox_id, "cancelled", error="stopped by user",
                                                session_key=KEY, epoch=0)) == []
    assert (await store.get_run(run_id)).status == "cancelled"
    assert await store.finish_run(RunCompletion(run_id, inbox_id, "completed", result="late")) is None
    assert await store.outbox_rows(run_id) == [] and await store.count_inbox("done") == 1


async def test_history_order_limit_and_epochs(store: Store) -> None:
    epoch = await store.session_epoch(KEY, "telegram", "100", "1001", None)
    assert epoch == 0
    for i in range(3):
        inbox_id, run_id = await _accept_run(store, f"telegram:{i}")
        await store.finish_run(RunCompletion(run_id, inbox_id, "completed", session_key=KEY, epoch=epoch,
                                             transcript=[ChatMessage("user", f"q{i}"), ChatMessage("assistant",
                                                                                                  f"a{i}")]))
    assert [m.content for m in await store.history(KEY, epoch, 100)] == ["q0", "a0", "q1", "a1", "q2", "a2"]
    assert [m.content for m in await store.history(KEY, epoch, 3)] == ["a1", "q2", "a2"]
    assert await store.history("telegram:dm:other", 0, 100) == []

    assert await store.reset_session(KEY) == 1
    assert await store.session_epoch(KEY, "telegram", "100", "1001", None) == 1
    assert await store.history(KEY, 1, 100) == []
    assert len(await store.history(KEY, 0, 100)) == 6, "the old epoch is kept, just no longer read"


async def test_tool_calls_survive_the_round_trip(store: Store) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "todo", "arguments": "{}"}}
    transcript = [ChatMessage("user", "plan"), ChatMessage("assistant", None, [call]),
                  ChatMessage("tool", "[]", tool_call_id="call_1"), ChatMessage("assistant", "done")]
    inbox_id, run_id = await _accept_run(store, "telegram:1")
    await store.finish_run(RunCompletion(run_id, inbox_id, "completed", session_key=KEY, epoch=0,
                                         transcript=transcript))
    assert await store.history(KEY, 0, 10) == transcript


async def test_unfinished_inbox_is_oldest_first(store: Store) -> None:
    ids = [await _accept_run(store, f"telegram:{i}") for i in range(4)]
    await store.start_run(ids[2][1], ids[2][0])
    await store.finish_run(RunCompletion(ids[1][1], ids[1][0], "completed"))
    command = await store.accept("telegram:cmd", "telegram", "command", KEY, {"text": "/help"})
    rows = await store.unfinished_inbox()
    assert [r.id for r in rows] == [ids[0][0], ids[2][0], ids[3][0], command.inbox_id]
    assert [r.status for r in rows] == ["pending", "running", "pending", "pending"]
    assert rows[-1].kind == "command" and rows[-1].run_id is None
    await store.set_inbox_status(command.inbox_id, "done")
    assert len(await store.unfinished_inbox()) == 3


async def test_outbox_state_transitions(store: Store) -> None:
    assert await store.enqueue(_parts("r1", 3))
    a, b, c = await store.pending_outbox()
    assert [r.status for r in (a, b, c)] == ["pending"] * 3 and a.attempts == 0
    later = time.time() + 60
    await store.mark_retry(a.id, later, "429 too many requests")
    a = (await store.pending_outbox())[0]
    assert (a.status, a.attempts, a.next_attempt_at, a.last_error) == ("pending", 1, later, "429 too many requests")
    await store.mark_sent(a.id, "m-1")
    await store.mark_failed(b.id, "chat not found")
    assert [r.id for r in await store.pending_outbox()] == [c.id]
    assert await store.outbox_depth() == 1
    rows = {r.id: r for r in await store.outbox_rows("r1")}
    assert (rows[a.id].status, rows[a.id].attempts, rows[a.id].platform_message_id) == ("sent", 2, "m-1")
    assert (rows[b.id].status, rows[b.id].attempts, rows[b.id].last_error) == ("failed", 1, "chat not found")


async def test_enqueue_is_once_and_closes_the_inbox_event(store: Store) -> None:
    acc = await store.accept("telegram:cmd", "telegram", "command", KEY, {"text": "/help"})
    parts = [OutboxPart("cmd:telegram:cmd:0", "telegram", "100", "Commands: ...")]
    assert await store.enqueue(parts, inbox_id=acc.inbox_id)
    assert await store.unfinished_inbox() == []
    assert await store.enqueue(parts, inbox_id=acc.inbox_id) is None
    assert await store.outbox_depth() == 1


async def test_schema_is_created_on_open_and_kept_on_reopen(store_url: str) -> None:
    url = store_url.replace("/state.db", "/nested/dir/state.db")
    first = await Store.open(url)
    assert await first.ping()
    inbox_id, run_id = await _accept_run(first, "telegram:1")
    await first.close()

    second = await Store.open(url)
    try:
        assert (await second.get_run(run_id)).prompt == "hi"
        assert [r.id for r in await second.unfinished_inbox()] == [inbox_id]
        duplicate = await second.accept("telegram:1", "telegram", "chat", KEY, {}, _run())
        assert duplicate.duplicate and duplicate.run_id == run_id
        newer = meta_t.update().where(meta_t.c.key == "schema_version").values(value="99")
        await second.db.write(lambda conn: conn.execute(newer))
    finally:
        await second.close()
    with pytest.raises(RuntimeError, match="newer than this gateway"):
        await Store.open(url)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_sqlite_runs_in_wal_mode(store: Store) -> None:
    mode = await store.db.read(lambda conn: conn.execute(sa.text("PRAGMA journal_mode")).scalar_one())
    assert mode == "wal"


async def test_only_the_head_of_a_lane_can_be_claimed_and_by_one_sender(store: Store) -> None:
    a0, a1 = await store.enqueue(_parts("rA", 2))
    (b0,) = await store.enqueue(_parts("rB", 1, chat_id="200"))
    assert await store.claim_outbox(a1.id, "p1", 60) is None, "part 1 waits for part 0 of the same chat"
    claimed = await store.claim_outbox(a0.id, "p1", 60)
    assert claimed is not None and claimed.in_doubt == 0
    assert await store.claim_outbox(a0.id, "p2", 60) is None, "a live claim is exclusive"
    assert await store.claim_outbox(a0.id, "p1", 60) is not None, "the holder may claim again"
    assert await store.claim_outbox(b0.id, "p2", 60) is not None, "other chats are independent"
    await store.mark_sent(a0.id, "m1")
    assert await store.claim_outbox(a0.id, "p1", 60) is None, "a sent part is never claimed again"
    assert (await store.claim_outbox(a1.id, "p2", 60)).in_doubt == 0


async def test_a_claim_left_by_a_dead_sender_is_taken_over_in_doubt(store: Store) -> None:
    (part,) = await store.enqueue(_parts("rA", 1))
    await store.claim_outbox(part.id, "dead", 60)
    assert await store.claim_outbox(part.id, "alive", 60) is None
    assert await store.abandon_claims("alive") == 1
    taken = await store.claim_outbox(part.id, "alive", 60)
    assert taken is not None and taken.in_doubt == 1
    await store.mark_retry(taken.id, time.time(), "timeout")
    again = await store.claim_outbox(part.id, "alive", 60)
    assert again is not None and again.in_doubt == 1, "a recorded failure is not a new doubt"
    (expiring,) = await store.enqueue(_parts("rB", 1, chat_id="300"))
    await store.claim_outbox(expiring.id, "dead", 0.01)
    await asyncio.sleep(0.05)
    assert (await store.claim_outbox(expiring.id, "alive", 60)).in_doubt == 1, "an expired claim is taken over"


async def test_parts_with_their_own_lane_do_not_wait_for_the_chat(store: Store) -> None:
    first = [OutboxPart(f"run:r1:{i}", "callback", "sink", f"r1 {i}", part_index=i, parts_total=2, run_id="r1",
                        lane="callback:sink:r1") for i in range(2)]
    second = [OutboxPart("run:r2:0", "callback", "sink", "r2", run_id="r2", lane="callback:sink:r2")]
    r1_0, r1_1 = await store.enqueue(first)
    (r2_0,) = await store.enqueue(second)
    assert await store.claim_outbox(r1_0.id, "p", 60) is not None
    assert await store.claim_outbox(r2_0.id, "p", 60) is not None, "another run's lane is free"
    assert await store.claim_outbox(r1_1.id, "p", 60) is None, "but a run's own parts keep their order"


async def test_concurrent_starts_migrate_once(store_url: str) -> None:
    stores = await asyncio.wait_for(asyncio.gather(*(Store.open(store_url) for _ in range(4))), 30)
    try:
        versions = await stores[0].db.read(lambda conn: conn.execute(sa.select(meta_t.c.value)).scalars().all())
        assert versions == [str(SCHEMA_VERSION)]
        await asyncio.gather(*(_accept_run(s, f"telegram:{i}") for i, s in enumerate(stores)))
        assert await stores[1].count_inbox() == 4
    finally:
        for s in stores:
            await s.close()


async def test_a_version_1_database_is_upgraded_in_place(store_url: str) -> None:
    first = await Store.open(store_url)
    (old,) = await first.enqueue(_parts("rA", 1))
    _, run_id = await _accept_run(first, "telegram:1")

    await first.db.write(lambda conn: back_to(conn, 1))
    await first.close()
    upgraded = await Store.open(store_url)
    try:
        (row,) = await upgraded.outbox_rows()
        assert (row.id, row.lane, row.in_doubt, row.text) == (old.id, "telegram:100", 0, "part 0")
        assert (await upgraded.get_run(run_id)).prompt == "hi"
        assert (await upgraded.claim_outbox(row.id, "p", 60)) is not None
        version = await upgraded.db.read(lambda conn: conn.execute(sa.select(meta_t.c.value)).scalar_one())
        assert version == str(SCHEMA_VERSION)
    finally:
        await upgraded.close()


async def test_a_version_2_database_gets_the_runs_ended_by_column(store_url: str) -> None:
    first = await Store.open(store_url)
    inbox_id, run_id = await _accept_run(first, "telegram:1")
    await first.db.write(lambda conn: back_to(conn, 2))
    await first.close()
    upgraded = await Store.open(store_url)
    try:
        assert (await upgraded.get_run(run_id)).ended_by is None
        done = RunCompletion(run_id, inbox_id, "completed", result="Step 1 ... (cut off)", ended_by="length")
        assert await upgraded.finish_run(done) == []
        run = await upgraded.get_run(run_id)
        assert (run.status, run.ended_by, run.to_dict()["ended_by"]) == ("completed", "length", "length")
        version = await upgraded.db.read(lambda conn: conn.execute(sa.select(meta_t.c.value)).scalar_one())
        assert version == str(SCHEMA_VERSION)
    finally:
        await upgraded.close()


async def test_new_parts_are_claimed_for_their_sender_only_when_first_in_their_lane(store: Store) -> None:
    inbox_id, run_id = await _accept_run(store, "telegram:1")
    stored = await store.finish_run(RunCompletion(run_id, inbox_id, "completed", deliveries=_parts(run_id, 2)),
                                    Claim("me", 60))
    assert [(r.claimed_by, r.part_index) for r in stored] == [("me", 0), ("me", 1)]
    assert await store.claim_outbox(stored[0].id, "other", 60) is None, "the claim is in the store too"
    later = await store.enqueue(_parts("later", 1), claim=Claim("me", 60))
    assert later[0].claimed_by is None, "an earlier part of the chat is still pending: claimed when its turn comes"
    assert await store.enqueue(_parts("later", 1), claim=Claim("me", 60)) is None


async def test_a_version_4_database_gets_the_conversation_tables(store_url: str) -> None:
    first = await Store.open(store_url)
    await first.db.write(lambda conn: back_to(conn, 4))
    await first.close()
    upgraded = await Store.open(store_url)
    try:
        settings = SettingsStore(upgraded)
        await settings.set_session("s", model="m", busy="steer")
        await settings.set_session("s", title="t")
        assert await settings.session("s") == SessionSettings(model="m", title="t", busy="steer")
        await settings.set_home("telegram:1", HomeChannel("slack", "C1", "171.2"))
        assert await settings.home("telegram:1") == HomeChannel("slack", "C1", "171.2")
        version = await upgraded.db.read(lambda conn: conn.execute(sa.select(meta_t.c.value)).scalar_one())
        assert version == str(SCHEMA_VERSION)
    finally:
        await upgraded.close()
