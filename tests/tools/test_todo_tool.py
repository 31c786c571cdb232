import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tools.registry import EFFECT_WRITES_STATE, registry
from tools.todo_tool import (
    MAX_ITEMS,
    MAX_TEXT_CHARS,
    InMemoryTodoBackend,
    TodoItem,
    TodoStatus,
    get_todo_backend,
    set_todo_backend,
)

SESSION = "telegram:dm:42"
OTHER_SESSION = "slack:channel:C1"


@pytest.fixture(autouse=True)
def backend() -> Iterator[InMemoryTodoBackend]:
    previous = get_todo_backend()
    fresh = InMemoryTodoBackend()
    set_todo_backend(fresh)
    yield fresh
    set_todo_backend(previous)


def call(session_key: str | None = SESSION, **args: Any) -> dict[str, Any]:
    ctx: dict[str, Any] = {"user_key": "telegram:1001", "run_id": "r1", "unknown_ctx": object()}
    if session_key is not None:
        ctx["session_key"] = session_key
    return json.loads(registry.dispatch("todo", args, **ctx))


def texts(result: dict[str, Any]) -> list[str]:
    return [item["text"] for item in result["items"]]


def test_registered_in_todo_toolset_with_state_effect() -> None:
    entry = registry.get("todo")
    assert entry is not None
    assert entry.toolset == "todo"
    assert entry.effects == {EFFECT_WRITES_STATE}
    schema_statuses = entry.schema["parameters"]["properties"]["status"]["enum"]
    assert schema_statuses == ["pending", "in_progress", "done", "cancelled"]


def test_add_returns_the_list_with_a_summary() -> None:
    result = call(action="add", items=["  write tests ", "fix bug"])
    assert result == {
        "summary": "2 items: 2 pending",
        "items": [
            {"id": "1", "status": "pending", "text": "write tests"},
            {"id": "2", "status": "pending", "text": "fix bug"},
        ],
    }
    assert call(action="list") == result


def test_summary_counts_each_status() -> None:
    assert call(action="list") == {"summary": "0 items", "items": []}
    assert call(action="add", items=["a"])["summary"] == "1 item: 1 pending"
    call(action="add", items=["b", "c", "d"])
    call(action="update", id="1", status="done")
    call(action="update", id="2", status="in_progress")
    result = call(action="update", id="4", status="cancelled")
    assert result["summary"] == "4 items: 1 done, 1 in progress, 1 pending, 1 cancelled"
    assert [item["status"] for item in result["items"]] == ["done", "in_progress", "pending", "cancelled"]


def test_update_text_and_numeric_id() -> None:
    call(action="add", items=["draft", "review"])
    result = call(action="update", id=2, text="review carefully")
    assert texts(result) == ["draft", "review carefully"]
    assert result["items"][1]["status"] == "pending"


def test_invalid_status_is_rejected_and_nothing_changes() -> None:
    call(action="add", items=["a"])
    error = call(action="update", id="1", status="finished", text="changed")["error"]
    assert "finished" in error
    assert "pending, in_progress, done, cancelled" in error
    assert call(action="list")["items"] == [{"id": "1", "status": "pending", "text": "a"}]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({}, "Unknown action"),
        ({"action": "delete"}, "Unknown action"),
        ({"action": "add"}, "needs 'items'"),
        ({"action": "add", "items": []}, "needs 'items'"),
        ({"action": "add", "items": "one string"}, "needs 'items'"),
        ({"action": "add", "items": ["ok", 3]}, "non-empty string"),
        ({"action": "add", "items": ["ok", "  "]}, "non-empty string"),
        ({"action": "update", "id": "1"}, "'status' and/or 'text'"),
        ({"action": "update", "id": "1", "status": ["done"]}, "Invalid status"),
        ({"action": "update", "id": "1", "text": ""}, "non-empty string"),
        ({"action": "update", "status": "done"}, "'id'"),
        ({"action": "update", "id": "9", "status": "done"}, "No item with id '9'"),
        ({"action": "remove", "id": "9"}, "No item with id '9'"),
    ],
)
def test_bad_arguments_are_errors(args: dict[str, Any], fragment: str) -> None:
    call(action="add", items=["existing"])
    assert fragment in call(**args)["error"]
    assert texts(call(action="list")) == ["existing"]


def test_remove_keeps_other_ids_stable_and_does_not_reuse_them() -> None:
    call(action="add", items=["a", "b", "c"])
    result = call(action="remove", id="1")
    assert [(i["id"], i["text"]) for i in result["items"]] == [("2", "b"), ("3", "c")]
    result = call(action="add", items=["d"])
    assert [i["id"] for i in result["items"]] == ["2", "3", "4"]


def test_clear_drops_done_and_cancelled_items() -> None:
    call(action="add", items=["done", "cancelled", "pending", "in progress"])
    call(action="update", id="1", status="done")
    call(action="update", id="2", status="cancelled")
    call(action="update", id="4", status="in_progress")
    result = call(action="clear")
    assert result["summary"] == "2 items: 1 in progress, 1 pending"
    assert [(i["id"], i["text"]) for i in result["items"]] == [("3", "pending"), ("4", "in progress")]


def test_sessions_are_isolated() -> None:
    call(SESSION, action="add", items=["mine"])
    assert call(OTHER_SESSION, action="list")["items"] == []
    assert "error" in call(OTHER_SESSION, action="remove", id="1")
    call(OTHER_SESSION, action="clear")
    assert texts(call(SESSION, action="list")) == ["mine"]


@pytest.mark.parametrize("session_key", [None, ""])
def test_missing_session_key_is_a_clear_error(session_key: str | None) -> None:
    assert "session_key" in call(session_key, action="list")["error"]


def test_item_count_limit_is_all_or_nothing() -> None:
    call(action="add", items=[f"task {n}" for n in range(MAX_ITEMS - 1)])
    error = call(action="add", items=["one", "two"])["error"]
    assert str(MAX_ITEMS) in error
    assert len(call(action="list")["items"]) == MAX_ITEMS - 1
    assert call(action="add", items=["last"])["summary"] == f"{MAX_ITEMS} items: {MAX_ITEMS} pending"


def test_text_length_limit() -> None:
    assert "items" in call(action="add", items=["a" * MAX_TEXT_CHARS])
    assert str(MAX_TEXT_CHARS) in call(action="add", items=["a" * (MAX_TEXT_CHARS + 1)])["error"]
    assert str(MAX_TEXT_CHARS) in call(action="update", id="1", text="a" * (MAX_TEXT_CHARS + 1))["error"]
    assert len(call(action="list")["items"]) == 1


def test_in_memory_backend_hands_out_copies(backend: InMemoryTodoBackend) -> None:
    call(action="add", items=["a"])
    backend.load(SESSION)[0].status = TodoStatus.DONE
    assert call(action="list")["items"][0]["status"] == "pending"


def test_concurrent_calls_in_one_session_lose_no_update() -> None:
    threads_count, per_thread = 8, 10
    barrier = threading.Barrier(threads_count)

    def worker(t: int) -> None:
        barrier.wait()
        for n in range(per_thread):
            call(action="add", items=[f"t{t} n{n}"])

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    items = call(action="list")["items"]
    assert len(items) == threads_count * per_thread
    assert len({i["id"] for i in items}) == len(items)
    assert {i["text"] for i in items} == {
        f"t{t} n{n}" for t in range(threads_count) for n in range(per_thread)
    }


class _RecordingBackend:
    """A stand-in for the gateway's database backend, satisfying ``TodoBackend``."""

    def __init__(self) -> None:
        self.saved: dict[str, list[TodoItem]] = {"s": [TodoItem("7", "from the database", TodoStatus.DONE)]}
        self.saves = 0

    def load(self, session_key: str) -> list[TodoItem]:
        return list(self.saved.get(session_key, []))

    def save(self, session_key: str, items: list[TodoItem]) -> None:
        self.saves += 1
        self.saved[session_key] = list(items)


def test_custom_backend_is_used_when_set(backend: InMemoryTodoBackend) -> None:
    custom = _RecordingBackend()
    set_todo_backend(custom)
    assert get_todo_backend() is custom

    assert call("s", action="list")["summary"] == "1 item: 1 done"
    assert custom.saves == 0  # list is read-only
    result = call("s", action="add", items=["new"])
    assert [i["id"] for i in result["items"]] == ["7", "8"]
    assert [item.text for item in custom.saved["s"]] == ["from the database", "new"]
    assert backend.load("s") == []
