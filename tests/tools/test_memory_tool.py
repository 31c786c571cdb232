import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tools.memory_tool import (
    MAX_NOTE_CHARS,
    MAX_NOTES_PER_USER,
    InMemoryMemoryBackend,
    MemoryNote,
    get_memory_backend,
    set_memory_backend,
)
from tools.registry import EFFECT_WRITES_STATE, registry

ALICE = "telegram:1001"
BOB = "discord:2002"


@pytest.fixture(autouse=True)
def backend() -> Iterator[InMemoryMemoryBackend]:
    previous = get_memory_backend()
    fresh = InMemoryMemoryBackend()
    set_memory_backend(fresh)
    yield fresh
    set_memory_backend(previous)


def call(user_key: str | None = ALICE, **args: Any) -> dict[str, Any]:
    ctx: dict[str, Any] = {"session_key": "telegram:dm:42", "platform": "telegram", "unknown_ctx": object()}
    if user_key is not None:
        ctx["user_key"] = user_key
    return json.loads(registry.dispatch("memory", args, **ctx))


def test_registered_in_memory_toolset_with_state_effect() -> None:
    entry = registry.get("memory")
    assert entry is not None
    assert entry.toolset == "memory"
    assert entry.effects == {EFFECT_WRITES_STATE}
    assert entry.schema["parameters"]["properties"]["action"]["enum"] == ["add", "list", "remove", "search"]


def test_add_then_list() -> None:
    first = call(action="add", text="  Prefers metric units  ")
    second = call(action="add", text="Works at Acme")

    assert first["added"]["text"] == "Prefers metric units"
    assert first["count"] == 1
    assert second["count"] == 2
    listed = call(action="list")
    assert listed["count"] == 2
    assert [n["text"] for n in listed["notes"]] == ["Prefers metric units", "Works at Acme"]
    assert [n["id"] for n in listed["notes"]] == [first["added"]["id"], second["added"]["id"]]
    assert listed["notes"][0]["created"] == datetime.now(UTC).date().isoformat()


def test_notes_are_timestamped_in_utc(backend: InMemoryMemoryBackend) -> None:
    call(action="add", text="x")
    (note,) = backend.list(ALICE)
    assert note.created_at.utcoffset() == timedelta(0)
    assert abs(datetime.now(UTC) - note.created_at) < timedelta(seconds=5)


def test_remove() -> None:
    keep = call(action="add", text="keep me")["added"]["id"]
    drop = call(action="add", text="drop me")["added"]["id"]

    assert call(action="remove", id=drop) == {"removed": drop}
    assert [n["id"] for n in call(action="list")["notes"]] == [keep]
    assert "No note with id" in call(action="remove", id=drop)["error"]


def test_remove_accepts_numeric_id() -> None:
    note_id = call(action="add", text="x")["added"]["id"]
    assert call(action="remove", id=int(note_id)) == {"removed": note_id}


def test_search_matches_every_word_case_insensitively() -> None:
    call(action="add", text="Daughter Maya plays the Violin")
    call(action="add", text="Allergic to peanuts")
    call(action="add", text="Violin lessons on Tuesdays")

    found = call(action="search", query="violin maya")
    assert found["query"] == "violin maya"
    assert found["count"] == 1
    assert found["notes"][0]["text"] == "Daughter Maya plays the Violin"
    assert call(action="search", query="VIOLIN")["count"] == 2
    assert call(action="search", query="cello") == {"query": "cello", "count": 0, "notes": []}


def test_users_are_isolated() -> None:
    alice_note = call(ALICE, action="add", text="Alice's secret")["added"]["id"]

    assert call(BOB, action="list") == {"count": 0, "notes": []}
    assert call(BOB, action="search", query="secret")["count"] == 0
    assert "error" in call(BOB, action="remove", id=alice_note)
    assert [n["text"] for n in call(ALICE, action="list")["notes"]] == ["Alice's secret"]


@pytest.mark.parametrize("user_key", [None, ""])
def test_missing_user_key_is_a_clear_error(user_key: str | None) -> None:
    result = call(user_key, action="list")
    assert "user_key" in result["error"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({}, "Unknown action"),
        ({"action": "forget"}, "Unknown action"),
        ({"action": ["add"]}, "Unknown action"),
        ({"action": "add"}, "needs 'text'"),
        ({"action": "add", "text": "   "}, "needs 'text'"),
        ({"action": "add", "text": 42}, "needs 'text'"),
        ({"action": "remove"}, "needs 'id'"),
        ({"action": "search", "query": " "}, "needs 'query'"),
    ],
)
def test_bad_arguments_are_errors(args: dict[str, Any], fragment: str) -> None:
    assert fragment in call(**args)["error"]


def test_note_length_limit() -> None:
    assert "added" in call(action="add", text="a" * MAX_NOTE_CHARS)
    error = call(action="add", text="a" * (MAX_NOTE_CHARS + 1))["error"]
    assert str(MAX_NOTE_CHARS) in error
    assert call(action="list")["count"] == 1


def test_note_count_limit_is_per_user(backend: InMemoryMemoryBackend) -> None:
    for n in range(MAX_NOTES_PER_USER):
        backend.add(ALICE, f"note {n}")

    assert "Memory is full" in call(ALICE, action="add", text="one too many")["error"]
    assert len(backend.list(ALICE)) == MAX_NOTES_PER_USER
    assert "added" in call(BOB, action="add", text="Bob has room")


def test_concurrent_adds_keep_every_note_with_unique_ids(backend: InMemoryMemoryBackend) -> None:
    threads_count, per_thread = 8, 20
    barrier = threading.Barrier(threads_count)
    results: list[dict[str, Any]] = []
    results_lock = threading.Lock()

    def worker(t: int) -> None:
        barrier.wait()
        for n in range(per_thread):
            result = call(action="add", text=f"t{t} n{n}")
            with results_lock:
                results.append(result)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert all("added" in r for r in results)
    notes = backend.list(ALICE)
    assert len(notes) == threads_count * per_thread
    assert len({n.id for n in notes}) == len(notes)
    assert {n.text for n in notes} == {f"t{t} n{n}" for t in range(threads_count) for n in range(per_thread)}


class _RecordingBackend:
    """A stand-in for the gateway's database backend, satisfying ``MemoryBackend``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.notes: list[MemoryNote] = []

    def add(self, user_key: str, text: str) -> MemoryNote:
        self.calls.append(("add", user_key, text))
        note = MemoryNote(id=f"db-{len(self.notes)}", text=text, created_at=datetime(2024, 5, 1, tzinfo=UTC))
        self.notes.append(note)
        return note

    def list(self, user_key: str) -> list[MemoryNote]:
        self.calls.append(("list", user_key))
        return list(self.notes)

    def remove(self, user_key: str, note_id: str) -> bool:
        self.calls.append(("remove", user_key, note_id))
        return False


def test_custom_backend_is_used_when_set(backend: InMemoryMemoryBackend) -> None:
    custom = _RecordingBackend()
    set_memory_backend(custom)
    assert get_memory_backend() is custom

    added = call(action="add", text="stored in the database")
    listed = call(action="list")
    removed = call(action="remove", id="db-0")

    assert added["added"] == {"id": "db-0", "text": "stored in the database", "created": "2024-05-01"}
    assert listed["notes"] == [added["added"]]
    assert "error" in removed
    assert ("add", ALICE, "stored in the database") in custom.calls
    assert ("remove", ALICE, "db-0") in custom.calls
    assert backend.list(ALICE) == []
