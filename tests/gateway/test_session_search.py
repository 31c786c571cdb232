"""session_search end to end and the message search in the store, on SQLite and PostgreSQL: a user finds a phrase
from their week-old conversation through a real chat (Telegram simulator, scripted model), another user with the
same phrase gets only their own; the upgrade from schema v9 indexes the messages stored before; the index follows
retention; a message too large for a tsvector is still stored; PostgreSQL's query uses the index."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gateway.app import Gateway
from gateway.config.store import RetentionSettings
from gateway.logs import redactor
from gateway.retention import prune
from gateway.schema import HEAD_REVISION, SCHEMA_VERSION, current_revision, messages_t, sessions_t
from gateway.session_search import SessionSearch, parse_query, search_sql
from gateway.sim.model_server import JSON, ScriptedModel, Turn, default_responder, last_user_text, tool_call
from gateway.sim.telegram_api import TelegramSimulator
from gateway.store import ChatMessage, NewRun, RunCompletion, SessionRef, Store
from tests.gateway.conftest import StartTelegramGateway
from tests.gateway.schema_history import back_to
from tools.session_search_tool import SearchPage, SearchQueryError

ALICE, BOB, CAROL = 1001, 1002, 1003
WEEK = 7 * 86400


class Searcher:
    """A scripted model that calls session_search for "search: QUERY" and keeps each result it is shown."""

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def __call__(self, request: JSON) -> Turn:
        last = request["messages"][-1]
        if last["role"] == "tool":
            self.results.append(json.loads(last["content"]))
            return Turn(content="Searched.")
        text = last_user_text(request)
        if text.startswith("search: "):
            return tool_call("session_search", {"query": text.removeprefix("search: ")})
        return default_responder(request)


Chat = Callable[[int, str], Awaitable[str]]


@pytest.fixture
async def chat(store_url: str, telegram_gateway: StartTelegramGateway
               ) -> AsyncIterator[tuple[Chat, Searcher, Gateway]]:
    """A gateway on ``store_url`` with the real Telegram adapter; ``say(user, text)`` is a DM and its answer."""
    model = Searcher()
    async with TelegramSimulator() as sim, ScriptedModel(model) as server:
        gateway = await telegram_gateway(sim, server, {
            "store": {"url": store_url},
            "auth": {"platforms": {"telegram": {"allowed_users": [str(ALICE), str(BOB), str(CAROL)]}}}})

        async def say(user: int, text: str) -> str:
            before = len(sim.sent_messages(user))
            sim.user_sends(text, user_id=user)
            return (await sim.wait_for_messages(before + 1, user, timeout=10))[before].text or ""

        yield say, model, gateway


async def _move_back(store: Store, session: str, seconds: float) -> None:
    """Make a session's conversation (and the session) ``seconds`` older, as if it had happened then."""
    def work(conn: Connection) -> None:
        conn.execute(messages_t.update().where(messages_t.c.session_key == session)
                     .values(created_at=messages_t.c.created_at - seconds))
        conn.execute(sessions_t.update().where(sessions_t.c.key == session)
                     .values(created_at=sessions_t.c.created_at - seconds,
                             updated_at=sessions_t.c.updated_at - seconds))
    await store.db.write(work)


async def test_a_user_finds_their_week_old_phrase_and_never_another_users(
        chat: tuple[Chat, Searcher, Gateway]) -> None:
    say, model, gateway = chat
    assert gateway.store is not None
    assert await say(ALICE, "Remember: the launch code word is periwinkle") == \
        "Echo: Remember: the launch code word is periwinkle"
    await _move_back(gateway.store, f"telegram:dm:{ALICE}", WEEK)
    await say(BOB, "My launch code word is periwinkle too")
    assert await say(ALICE, "/new")  # the week-old talk is an earlier conversation now

    assert await say(ALICE, 'search: "code word" periwinkle') == "Searched."
    found = model.results[-1]
    assert found["count"] == 2 and found["next_offset"] is None
    assert {(hit["session"], hit["conversation"], hit["role"]) for hit in found["results"]} == {
        (f"telegram:dm:{ALICE}", 0, "user"), (f"telegram:dm:{ALICE}", 0, "assistant")}
    week_ago = (datetime.now(UTC) - timedelta(seconds=WEEK)).date().isoformat()
    assert all(hit["at"].startswith(week_ago) and hit["at"].endswith("Z") for hit in found["results"])
    assert any("«periwinkle»" in hit["snippet"] for hit in found["results"])
    assert "too" not in json.dumps(found) and f"dm:{BOB}" not in json.dumps(found)

    await say(BOB, "search: periwinkle")
    theirs = model.results[-1]
    assert {hit["session"] for hit in theirs["results"]} == {f"telegram:dm:{BOB}"}
    assert all(hit["at"].startswith(datetime.now(UTC).date().isoformat()) for hit in theirs["results"])
    assert "Remember" not in json.dumps(theirs)

    await say(CAROL, "search: periwinkle")
    assert model.results[-1]["count"] == 0

    await say(ALICE, "search: -periwinkle")
    assert "no word to look for" in model.results[-1]["error"]


# -- the store ------------------------------------------------------------------------------------------------------


async def _converse(store: Store, user: str, chat: str, session: str, run_id: str,
                    *messages: ChatMessage) -> None:
    """One exchange written as a chat run writes it."""
    accepted = await store.accept(f"event-{run_id}", "telegram", "chat", session, {},
                                  NewRun(run_id, "chat", "telegram", [], "x"))
    context = await store.start_run(run_id, accepted.inbox_id, SessionRef(session, "telegram", chat, user, None), 10)
    assert context is not None
    await store.finish_run(RunCompletion(run_id, accepted.inbox_id, "completed", result="ok", session_key=session,
                                         epoch=context.epoch, transcript=list(messages)))


async def _search(store: Store, query: str, user: str = "telegram:1001") -> SearchPage:
    return await SessionSearch(store, links=False).search(user, query, limit=20, offset=0, sort="relevance")


def _search_objects(conn: Connection) -> set[str]:
    """The message search's tables, triggers (SQLite) and index (PostgreSQL)."""
    if conn.dialect.name == "sqlite":
        query = "SELECT type || ' ' || name FROM sqlite_master WHERE name LIKE '%messages_search%'"
    else:
        query = "SELECT 'index ' || indexname FROM pg_indexes WHERE indexname = 'ix_messages_search'"
    return set(conn.exec_driver_sql(query).scalars())


async def test_a_match_mark_inside_a_secret_does_not_unmask_it(store_url: str) -> None:
    """A message stored before its secret was configured: the mark FTS puts around the matched word
    (``my-db-«pass»-Zx81Q``) must not hide the secret from the redactor."""
    secret = "my-db-pass-Zx81Q"
    store = await Store.open(store_url)
    try:
        await _converse(store, "1001", "1001", "telegram:dm:1001", "r1",
                        ChatMessage("user", f"the database password is {secret} keep it"))
        redactor.add([secret])
        page = await _search(store, "pass")
        assert page.hits, "the word inside the secret is found"
        assert all("Zx81Q" not in hit.snippet for hit in page.hits), page.hits
        assert "[REDACTED]" in page.hits[0].snippet
    finally:
        await store.close()


async def test_the_upgrade_from_v9_indexes_the_messages_stored_before(store_url: str) -> None:
    store = await Store.open(store_url)
    created = await store.db.read(_search_objects)
    assert created == ({"index ix_messages_search"} if store.dialect == "postgresql" else {
        "table messages_search", "table messages_search_data", "table messages_search_idx",
        "table messages_search_docsize", "table messages_search_config", "trigger messages_search_insert",
        "trigger messages_search_delete", "trigger messages_search_update"})
    await _converse(store, "1001", "1001", "telegram:dm:1001", "r1", ChatMessage("user", "the gannet dives"),
                    ChatMessage("assistant", "Gannets do dive."))
    await store.db.write(lambda conn: back_to(conn, 9))
    assert await store.db.read(_search_objects) == set()
    await store.close()

    store = await Store.open(store_url)
    try:
        assert await store.db.read(current_revision) == (SCHEMA_VERSION, HEAD_REVISION)
        assert await store.db.read(_search_objects) == created
        assert [hit.role for hit in (await _search(store, "gannet")).hits] == ["user"]  # no stemming: not Gannets
        await _converse(store, "1001", "1001", "telegram:dm:1001", "r2", ChatMessage("user", "a gannet again"))
        assert len((await _search(store, "gannet")).hits) == 2
    finally:
        await store.close()


async def test_only_what_people_said_is_indexed_and_the_index_follows_retention(store_url: str) -> None:
    store = await Store.open(store_url)
    try:
        call = {"id": "c1", "type": "function", "function": {"name": "web_search", "arguments": '{"q": "puffin"}'}}
        await _converse(store, "1001", "1001", "telegram:dm:1001", "old", ChatMessage("user", "puffin facts?"),
                        ChatMessage("assistant", None, [call]), ChatMessage("tool", "puffin results", None, "c1"),
                        ChatMessage("assistant", "Puffins: see above"))
        await _converse(store, "1001", "1001", "telegram:dm:1001", "new", ChatMessage("user", "more on the puffin"))
        assert {hit.run_id for hit in (await _search(store, "puffin")).hits} == {"old", "new"}
        assert [hit.role for hit in (await _search(store, "results")).hits] == []  # the tool's own output
        await store.db.write(lambda conn: conn.execute(
            messages_t.update().where(messages_t.c.run_id == "old").values(created_at=time.time() - 100 * 86400)))
        report = await prune(store, RetentionSettings(transcripts="90d"), pause=0)
        assert report.rows["transcripts"] == 4
        assert {hit.run_id for hit in (await _search(store, "puffin")).hits} == {"new"}
        if store.dialect == "sqlite":  # the FTS index itself holds only the message left
            indexed = await store.db.read(
                lambda conn: conn.exec_driver_sql("SELECT count(*) FROM messages_search_docsize").scalar())
            assert indexed == 1
    finally:
        await store.close()


async def test_a_message_too_large_for_a_tsvector_is_stored_and_found_by_its_start(store_url: str) -> None:
    store = await Store.open(store_url)
    try:
        huge = " ".join(f"w{i}é" for i in range(250_000))  # ~2 MB of distinct words: over a tsvector's 1 MB
        await _converse(store, "1001", "1001", "telegram:dm:1001", "big", ChatMessage("user", f"albatross {huge}"))
        (hit,) = (await _search(store, "albatross")).hits
        assert hit.run_id == "big" and "«albatross»" in hit.snippet
    finally:
        await store.close()


@pytest.mark.parametrize("text", ['NEAR(a b', '"', "a AND", "*", "content:x", "^start", "(", "a OR OR b", "-", "'"])
async def test_query_text_is_never_database_syntax(store_url: str, text: str) -> None:
    store = await Store.open(store_url)
    try:
        await _converse(store, "1001", "1001", "telegram:dm:1001", "r", ChatMessage("user", "a b start content x"))
        try:
            page = await _search(store, text)
        except SearchQueryError as exc:  # said plainly
            assert "no word to look for" in str(exc)
        else:
            assert all(hit.session == "telegram:dm:1001" for hit in page.hits)
    finally:
        await store.close()


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)  # the GIN index is PostgreSQL's
async def test_postgresql_finds_matches_through_the_index(store_url: str) -> None:
    store = await Store.open(store_url)
    try:
        def a_long_history(conn: Connection) -> None:  # a user with many messages, a few of them matching
            conn.exec_driver_sql("INSERT INTO messages (session_key, epoch, role, content, created_at) SELECT "
                                 "'telegram:dm:1', 0, 'user', 'filler words number ' || i, 0 "
                                 "FROM generate_series(1, 5000) i")
            conn.exec_driver_sql("ANALYZE messages")

        await store.db.write(a_long_history)
        for sort in ("relevance", "newest"):
            sql, binds = search_sql("postgresql", parse_query('kite "red balloon" OR green -blue'), sort)

            def plan(conn: Connection, sql: str = sql, binds: dict[str, str] = binds) -> str:
                statement = sa.text(f"EXPLAIN {sql}").bindparams(sa.bindparam("keys", expanding=True))
                rows = conn.execute(statement, {**binds, "keys": ["telegram:dm:1"], "limit": 5, "offset": 0})
                return "\n".join(rows.scalars())

            assert "Index Scan on ix_messages_search" in await store.db.read(plan)
    finally:
        await store.close()
