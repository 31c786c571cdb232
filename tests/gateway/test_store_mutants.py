"""Store rules that ``make mutate`` found unpinned: each test names the mutants of ``gateway/store.py`` it kills.
Every test runs on SQLite and on PostgreSQL (the ``store_url`` fixture)."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa

from gateway.schema import inbox_t, messages_t, run_usage_t
from gateway.shared_limits import UserCharge, hour_usage
from gateway.steering import Steered
from gateway.store import (
    ChatMessage,
    Claim,
    FilePart,
    NewRun,
    OutboxPart,
    Replay,
    RunCompletion,
    RunUsage,
    SessionRef,
    Store,
    accept_event,
)
from platforms.base import Choice

KEY = "telegram:dm:100"
SESSION = SessionRef(KEY, "telegram", "100", "100", None)


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    s = await Store.open(store_url)
    yield s
    await s.close()


def _run(deliver_to: str | None = "telegram:100") -> NewRun:
    return NewRun(uuid.uuid4().hex, "webhook", "route-a", ["web", "file"], "summarize", deliver_to)


def _part(key: str, chat_id: str = "100", **fields: object) -> OutboxPart:
    return OutboxPart(key, "telegram", chat_id, f"text of {key}", **fields)  # type: ignore[arg-type]


async def test_an_accepted_run_is_recorded_as_queued_with_what_it_needs(store: Store) -> None:
    """Kills accept's run-row mutants: ``"XXqueuedXX"`` / ``"QUEUED"`` (status), ``"XXdeliver_toXX"`` /
    ``"DELIVER_TO"`` (where the answer goes, lost), ``dumps(None)`` (toolsets), ``"model_calls": 1``,
    ``started_at: now if (started) or True`` (a queued run with a start time), and ``duplicate=None``."""
    run = _run()
    accepted = await store.accept("webhook:route-a:1", "webhook", "webhook", "webhook:route-a", {"n": 1}, run)
    assert accepted.duplicate is False and accepted.run_id == run.id
    row = await store.get_run(run.id)
    assert row is not None
    assert (row.status, row.deliver_to, row.toolsets, row.prompt) == ("queued", "telegram:100", ["web", "file"],
                                                                       "summarize")
    assert (row.model_calls, row.attempts, row.started_at, row.tool_calls) == (0, 0, None, [])
    (event,) = await store.unfinished_inbox()
    assert event.status == "pending"


async def test_a_run_accepted_as_started_is_running_with_its_first_attempt(store: Store) -> None:
    """Kills accept's ``"running" if (started) and False`` / ``"XXrunningXX"`` / ``"RUNNING"`` (the inbox row's
    and the run's status), ``"XXattemptsXX"`` / ``"ATTEMPTS"`` (the attempt not counted, so a run that kills
    the gateway is never given up), ``"XXstarted_atXX"`` / ``"STARTED_AT"`` and
    ``started_at: now if (started) and False``."""
    before = time.time()
    run = _run()
    await store.accept("webhook:route-a:2", "webhook", "webhook", "webhook:route-a", {}, run, started=True)
    row = await store.get_run(run.id)
    assert row is not None and row.status == "running" and row.attempts == 1
    assert row.started_at is not None and row.started_at >= before
    (event,) = await store.unfinished_inbox()
    assert event.status == "running"


async def test_start_run_returns_the_sessions_epoch_and_its_recent_history(store: Store) -> None:
    """Kills start_run's ``epoch = None``, ``_session_epoch(None/…)`` argument mutants, ``RunContext(None, …)``,
    ``RunContext(epoch, None)``, the ``_history(...)`` argument mutants and ``if (history_limit) and False``."""
    first = await store.accept("telegram:1", "telegram", "chat", KEY, {}, _run())
    assert first.run_id is not None
    context = await store.start_run(first.run_id, first.inbox_id, SESSION, history_limit=10)
    assert context is not None and context.epoch == 0 and context.history == []
    transcript = [ChatMessage("user", "one"), ChatMessage("assistant", "two"), ChatMessage("user", "three")]
    await store.finish_run(RunCompletion(first.run_id, first.inbox_id, "completed", result="two",
                                         session_key=KEY, epoch=0, transcript=transcript))
    second = await store.accept("telegram:2", "telegram", "chat", KEY, {}, _run())
    assert second.run_id is not None
    context = await store.start_run(second.run_id, second.inbox_id, SESSION, history_limit=2)
    assert context is not None and context.epoch == 0
    assert [(m.role, m.content) for m in context.history] == [("assistant", "two"), ("user", "three")]


async def test_start_run_without_a_session_or_a_history_limit_reads_no_history(store: Store) -> None:
    """Kills start_run's ``RunContext(None, None)`` (no session: the history must be an empty list),
    ``history_limit: int = 1`` (the default reads none) and ``if (history_limit) or True``."""
    done = await store.accept("telegram:1", "telegram", "chat", KEY, {}, _run())
    assert done.run_id is not None
    await store.start_run(done.run_id, done.inbox_id, SESSION)
    await store.finish_run(RunCompletion(done.run_id, done.inbox_id, "completed", session_key=KEY, epoch=0,
                                         transcript=[ChatMessage("user", "earlier")]))
    plain = await store.accept("telegram:2", "telegram", "chat", KEY, {}, _run())
    assert plain.run_id is not None
    context = await store.start_run(plain.run_id, plain.inbox_id)
    assert context is not None and context.epoch is None and context.history == []
    other = await store.accept("telegram:3", "telegram", "chat", KEY, {}, _run())
    assert other.run_id is not None
    context = await store.start_run(other.run_id, other.inbox_id, SESSION)
    assert context is not None and context.epoch == 0 and context.history == []


async def test_a_finished_run_keeps_its_tool_calls_and_its_messages_name_it(store: Store) -> None:
    """Kills _finish_run's ``dumps(None)`` for the tool calls and ``_append_messages(..., None, now)`` (the
    transcript's messages would not name the run that wrote them)."""
    accepted = await store.accept("telegram:1", "telegram", "chat", KEY, {}, _run())
    assert accepted.run_id is not None
    await store.start_run(accepted.run_id, accepted.inbox_id, SESSION)
    calls = [{"name": "read_file", "arguments": {"path": "a.txt"}}]
    await store.finish_run(RunCompletion(accepted.run_id, accepted.inbox_id, "completed", tool_calls=calls,
                                         session_key=KEY, epoch=0, transcript=[ChatMessage("user", "hi")]))
    row = await store.get_run(accepted.run_id)
    assert row is not None and row.tool_calls == calls
    run_ids = await store.db.read(lambda conn: conn.execute(sa.select(messages_t.c.run_id)).scalars().all())
    assert run_ids == [accepted.run_id]


async def test_a_part_keeps_the_message_it_replies_to(store: Store) -> None:
    """Kills _outbox_values' ``"XXreply_toXX"`` / ``"REPLY_TO"`` (the column silently left empty: the reply
    loses its thread on the platform)."""
    (row,) = await store.enqueue([_part("reply:1", reply_to="m-41", thread_id="t-7")]) or []
    assert (row.reply_to, row.thread_id) == ("m-41", "t-7")
    (stored,) = await store.outbox_rows()
    assert (stored.reply_to, stored.thread_id) == ("m-41", "t-7")


async def test_enqueue_closes_the_inbox_event_it_answers(store: Store) -> None:
    """Kills enqueue's ``"b_status": "XXdoneXX"`` / ``"DONE"`` (a command's event left unfinished would be
    replayed at the next start)."""
    accepted = await store.accept("telegram:cmd", "telegram", "command", KEY, {"text": "/help"})
    await store.enqueue([_part("cmd:1")], inbox_id=accepted.inbox_id)
    event = await store.get_inbox(accepted.inbox_id)
    assert event is not None and event.status == "done"
    assert await store.unfinished_inbox() == []


async def test_expiring_the_claims_of_dead_senders(store: Store) -> None:
    """Kills expire_claims' mutants: the ``where`` conditions dropped or replaced by None, ``status !=
    "pending"`` / ``"XXpendingXX"`` / ``"PENDING"``, ``not_in(None)``, ``claim_until >= 0`` / ``> 1`` and
    ``values(claim_until=None)`` (a NULL expiry never compares as past, so the part could never be taken over)."""
    rows = await store.enqueue([_part("a:1", chat_id="1"), _part("b:1", chat_id="2"), _part("c:1", chat_id="3")])
    assert rows is not None
    dead, alive, sent = rows
    assert await store.claim_outbox(dead.id, "dead-sender", 600)
    assert await store.claim_outbox(alive.id, "live-sender", 600)
    assert await store.claim_outbox(sent.id, "dead-sender", 600)
    await store.mark_sent(sent.id, "m-1")
    assert await store.expire_claims({"live-sender"}) == 1
    assert await store.expire_claims({"live-sender"}) == 0  # already expired: not counted again
    taken = await store.claim_outbox(dead.id, "new-sender", 600)
    assert taken is not None and taken.claimed_by == "new-sender" and taken.in_doubt == 1
    assert await store.claim_outbox(alive.id, "new-sender", 600) is None
    (after,) = [r for r in await store.outbox_rows() if r.id == sent.id]
    assert after.status == "sent"


async def test_an_attempt_given_back_is_uncounted_once(store: Store) -> None:
    """Kills give_back_attempt's mutants (the statement, its parameters or the write replaced or left out)."""
    accepted = await store.accept("webhook:1", "webhook", "webhook", "webhook:route-a", {}, _run(), started=True)
    assert accepted.run_id is not None
    await store.give_back_attempt(accepted.run_id)
    row = await store.get_run(accepted.run_id)
    assert row is not None and row.attempts == 0
    await store.give_back_attempt(accepted.run_id)  # never below zero
    row = await store.get_run(accepted.run_id)
    assert row is not None and row.attempts == 0


async def test_a_run_is_given_up_only_once_it_used_its_attempts(store: Store) -> None:
    """Kills give_up_run's mutants: ``attempts = None`` or read with the wrong statement or parameters,
    ``is None and``, ``is not None or``, ``attempts <= max_attempts``, ``now = None``, the ``_finish_run`` and
    ``completion`` argument mutants, and the write replaced or left out."""
    accepted = await store.accept("webhook:1", "webhook", "webhook", "webhook:route-a", {}, _run(), started=True)
    run_id = accepted.run_id
    assert run_id is not None
    seen: list[int] = []

    def completion(attempts: int) -> RunCompletion:
        seen.append(attempts)
        return RunCompletion(run_id, accepted.inbox_id, "failed", error=f"gave up after {attempts} attempts",
                             deliveries=[_part(f"run:{run_id}:0", run_id=run_id)])

    assert await store.give_up_run(run_id, 2, completion, Claim("me", 60)) is None  # 1 attempt < 2: start again
    assert seen == []
    await store.start_run(run_id, accepted.inbox_id)  # the second attempt
    before = time.time()
    stored = await store.give_up_run(run_id, 2, completion, Claim("me", 60))
    assert seen == [2]
    assert stored is not None and [p.dedupe_key for p in stored] == [f"run:{run_id}:0"]
    assert stored[0].claimed_by == "me"
    row = await store.get_run(run_id)
    assert row is not None and row.status == "failed" and row.error == "gave up after 2 attempts"
    assert row.finished_at is not None and row.finished_at >= before
    assert await store.give_up_run(run_id, 2, completion) is None  # already finished


async def test_the_next_run_event_of_a_session(store: Store) -> None:
    """Kills next_run_event's mutants: the row read replaced by None or with the wrong statement or parameters,
    ``_inbox_row(None)`` and the ``row is not None`` condition mutated."""
    assert await store.next_run_event(KEY) is None
    await store.accept("telegram:cmd", "telegram", "command", KEY, {"text": "/help"})
    first = await store.accept("telegram:1", "telegram", "chat", KEY, {"text": "one"}, _run())
    await store.accept("telegram:2", "telegram", "chat", KEY, {"text": "two"}, _run())
    await store.accept("telegram:other", "telegram", "chat", "telegram:dm:200", {"text": "x"}, _run())
    event = await store.next_run_event(KEY)
    assert event is not None and (event.id, event.payload) == (first.inbox_id, {"text": "one"})


async def test_a_delivery_error_is_kept_up_to_2000_characters(store: Store) -> None:
    """Kills mark_retry's and mark_failed's ``error[:2001]``."""
    rows = await store.enqueue([_part("e:1", chat_id="1"), _part("e:2", chat_id="2")])
    assert rows is not None
    await store.mark_retry(rows[0].id, time.time() + 5, "r" * 3000)
    await store.mark_failed(rows[1].id, "f" * 3000)
    errors = {r.dedupe_key: r.last_error for r in await store.outbox_rows()}
    assert errors == {"e:1": "r" * 2000, "e:2": "f" * 2000}


# -- found by the run of 2026-12-04 ----------------------------------------------------------------------------

async def _accepted(store: Store, event: str) -> tuple[int, str]:
    accepted = await store.accept(event, "telegram", "chat", KEY, {}, _run())
    assert accepted.run_id is not None and accepted.inbox_id is not None
    return accepted.inbox_id, accepted.run_id


async def test_messages_steered_into_a_run_end_with_it(store: Store) -> None:
    """A message taken by a running run (steering) ends as that run ends: its run finished with the same status,
    ``ended_by`` "steered", nothing of its own (no result, tool calls or model calls), its inbox event done.

    Kills every mutant of _finish_run's two ``steered`` statements (the statement or its rows replaced, a key
    misspelt, ``b_model_calls: 1``, ``b_model_seconds: 1.0``, ``"XXsteeredXX"``, ``"XX[]XX"``, ``"XXdoneXX"``)."""
    inbox_id, run_id = await _accepted(store, "telegram:1")
    steered_inbox, steered_run = await _accepted(store, "telegram:2")
    assert await store.start_run(run_id, inbox_id) is not None
    done = RunCompletion(run_id, inbox_id, "completed", result="both answered", model_calls=2, model_seconds=1.5,
                         tool_calls=[{"name": "todo"}], steered=[Steered("and this", steered_inbox, steered_run)])
    assert await store.finish_run(done) == []
    row = await store.get_run(steered_run)
    assert row is not None
    assert (row.status, row.ended_by, row.result, row.tool_calls, row.model_calls, row.model_seconds) == (
        "completed", "steered", None, [], 0, 0.0)
    assert row.finished_at is not None
    assert await store.unfinished_inbox() == []


@pytest.mark.parametrize(("prompt", "completion"), [(120, 0), (0, 30)])
async def test_a_runs_token_usage_is_stored_with_its_session(store: Store, prompt: int, completion: int) -> None:
    """Kills _finish_run's usage mutants: ``u.prompt_tokens and u.completion_tokens`` (usage with only one count
    dropped), the insert or its values replaced, a column name misspelt and ``session_key and ""``."""
    inbox_id, run_id = await _accepted(store, "telegram:1")
    usage = RunUsage("chat", "telegram:100", "gpt-test", prompt, completion)
    await store.finish_run(RunCompletion(run_id, inbox_id, "completed", session_key=KEY, epoch=0, usage=usage))
    rows = await store.db.read(lambda conn: conn.execute(sa.select(run_usage_t)).all())
    assert [(r.run_id, r.kind, r.session_key, r.epoch, r.user_key, r.model, r.prompt_tokens, r.completion_tokens)
            for r in rows] == [(run_id, "chat", KEY, 0, "telegram:100", "gpt-test", prompt, completion)]


async def test_a_reset_rule_starts_a_new_conversation_when_a_run_starts(store: Store) -> None:
    """Kills start_run's ``_chat_session(conn, session, run_id, None, now)`` (the reset policy never asked) and
    ``RunContext(..., None)`` / the reset left out (the user never told their conversation was started anew)."""
    inbox_id, run_id = await _accepted(store, "telegram:1")
    first = await store.start_run(run_id, inbox_id, SESSION)
    assert first is not None and (first.epoch, first.reset) == (0, None)
    inbox_id, run_id = await _accepted(store, "telegram:2")
    context = await store.start_run(run_id, inbox_id, SESSION, reset_rule=lambda idle_since, at: "idle")
    assert context is not None and context.epoch == 1
    assert context.reset is not None and context.reset.reason == "idle"



async def test_a_replayed_body_within_its_window_is_the_first_delivery(store: Store) -> None:
    """A signed body delivered again under another id within the replay window is a duplicate of the first
    delivery (its run, not a new one); after the window it is accepted anew, and the marker slides with it.

    Kills accept_event's replay mutants: ``_replayed(conn, None)`` / arguments left out, ``is None`` for ``is not
    None`` (every replay accepted, every first delivery refused), and _mark_replay's arguments replaced by None or
    left out (no marker written, or a marker pointing nowhere)."""
    now = time.time()
    first = await store.accept("webhook:a:1", "webhook", "webhook", "webhook:a", {}, _run(),
                               replay=Replay("body:h1", now, 300))
    again = await store.accept("webhook:a:2", "webhook", "webhook", "webhook:a", {}, _run(),
                               replay=Replay("body:h1", now + 10, 300))
    assert first.duplicate is False and first.run_id is not None
    assert (again.duplicate, again.inbox_id, again.run_id) == (True, first.inbox_id, first.run_id)
    later = await store.accept("webhook:a:3", "webhook", "webhook", "webhook:a", {}, _run(),
                               replay=Replay("body:h1", now + 400, 300))
    assert later.duplicate is False and later.run_id not in (None, first.run_id)
    last = await store.accept("webhook:a:4", "webhook", "webhook", "webhook:a", {}, _run(),
                              replay=Replay("body:h1", now + 500, 300))
    assert (last.duplicate, last.run_id) == (True, later.run_id)


async def test_a_run_accepted_in_another_unit_of_work_is_queued_by_default(store: Store) -> None:
    """A command accepts its run with accept_event inside its own transaction, without ``started``: the run
    waits in the queue like any other.

    Kills accept_event's ``started: bool = True`` (such a run recorded as running, its attempt counted)."""
    run = _run()
    accepted = await store.db.write(lambda conn: accept_event(
        conn, dedupe_key="cmd:1", platform="telegram", kind="chat", session_key=KEY, payload={}, run=run))
    row = await store.get_run(run.id)
    assert accepted.duplicate is False and row is not None and (row.status, row.attempts) == ("queued", 0)


async def test_a_commands_effects_are_applied_with_its_reply_once(store: Store) -> None:
    """A command's changes run in the transaction that stores its reply, and not again for a replayed event.

    Kills enqueue's ``effect(None)`` (the change made without the transaction's connection)."""
    accepted = await store.accept("telegram:9", "telegram", "command", KEY, {})
    seen: list[object] = []
    rows = await store.enqueue([_part("cmd:9")], accepted.inbox_id, effects=[
        lambda conn: seen.append(conn.execute(sa.select(sa.literal(1))).scalar_one())])
    assert rows is not None and seen == [1]
    assert await store.enqueue([_part("cmd:9")], accepted.inbox_id, effects=[seen.append]) is None
    assert seen == [1]


async def test_a_parts_choices_are_stored_with_it(store: Store) -> None:
    """Kills _outbox_values' ``"XXchoicesXX"`` / ``"CHOICES"`` (the column left empty), ``if (p.choices) and
    False`` and ``json.dumps(None)`` (a prompt's buttons lost between the run's end and the send)."""
    choices = (Choice("Approve", "/approve"), Choice("Deny", "/deny", style="danger"))
    await store.enqueue([_part("c:0", choices=choices), _part("c:1", "101")])
    assert {r.dedupe_key: r.choices for r in await store.pending_outbox()} == {"c:0": choices, "c:1": ()}


async def test_a_runs_end_charges_its_user_and_applies_its_effects(store: Store) -> None:
    """The run's model calls and tokens go to its user's hourly budget, and its other effects run with the
    completion, in its transaction.

    Kills _finish_run's ``charge_user`` with an argument replaced by None or left out, and ``effect(None)``."""
    inbox_id, run_id = await _accepted(store, "telegram:1")
    seen: list[object] = []
    done = RunCompletion(run_id, inbox_id, "completed", charge=UserCharge("telegram:100", 3, 1200), effects=[
        lambda conn: seen.append(conn.execute(sa.select(sa.literal(1))).scalar_one())])
    await store.finish_run(done)
    assert seen == [1]
    assert await store.db.read(lambda conn: hour_usage(conn, "telegram:100", time.time())) == (3, 1200)


async def test_a_steered_messages_inbox_event_is_done(store: Store) -> None:
    """Kills _finish_run's ``"b_status": "XXdoneXX"`` / ``"DONE"`` for a steered message's inbox event (no longer
    pending or running, but not done either)."""
    inbox_id, run_id = await _accepted(store, "telegram:1")
    steered_inbox, steered_run = await _accepted(store, "telegram:2")
    await store.finish_run(RunCompletion(run_id, inbox_id, "completed",
                                         steered=[Steered("and this", steered_inbox, steered_run)]))
    statuses = await store.db.read(lambda conn: conn.execute(sa.select(inbox_t.c.status)).scalars().all())
    assert statuses == ["done", "done"]


async def test_a_runs_usage_without_a_session_has_an_empty_session_key(store: Store) -> None:
    """A webhook run has no session: its usage row's session key is empty. Kills the ``session_key or "..."``
    fallback misspelt."""
    inbox_id, run_id = await _accepted(store, "webhook:1")
    usage = RunUsage("webhook", None, "gpt-test", 10, 5)
    await store.finish_run(RunCompletion(run_id, inbox_id, "completed", usage=usage))
    keys = await store.db.read(lambda conn: conn.execute(sa.select(run_usage_t.c.session_key)).scalars().all())
    assert keys == [""]


# -- found by the run of 2026-12-04 09:30 (file parts) ---------------------------------------------------------

async def test_a_file_part_is_stored_with_its_bytes_once_and_read_back_described(store: Store) -> None:
    """Two parts sending the same file (a photo to two chats) store its bytes once, under its sha256; a part read
    back carries the file's description (kind, name, type, size, sha256) and the sender loads the bytes by the
    sha256. Storing the same file again later is no error.

    Kills _outbox_values' ``file`` / ``file_sha256`` keys mutated and ``if (p.file) and False`` (the part stored as
    text only), and _store_parts' file mutants: ``files = None``, ``data is None``, the insert's table, key,
    dialect and ``returning`` mutated or left out, ``conn.execute(None, ...)`` / ``(insert, None)`` and the rows'
    keys mutated (the bytes not stored, or the insert failing)."""
    data = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    photo = FilePart("photo", "chart.png", "image/png", len(data), hashlib.sha256(data).hexdigest(), data)
    stored = await store.enqueue([_part("f:0", file=photo), _part("f:1", chat_id="200", file=photo),
                                  _part("t:0")])
    assert [r.dedupe_key for r in stored] == ["f:0", "f:1", "t:0"]
    rows = {r.dedupe_key: r for r in await store.outbox_rows()}
    described = FilePart("photo", "chart.png", "image/png", len(data), photo.sha256)
    assert rows["f:0"].file == described and rows["f:1"].file == described and rows["t:0"].file is None
    assert await store.outbox_file(photo.sha256) == data
    again = await store.enqueue([_part("f:2", file=photo)])
    assert [r.dedupe_key for r in again] == ["f:2"]
    assert await store.outbox_file(photo.sha256) == data
