"""The ``todo`` tool: a per-session checklist the agent keeps while working through a task.

Lists are scoped by the ``session_key`` the gateway passes in ctx. Storage goes through
``TodoBackend``, which loads and saves a whole list; the default keeps lists in process memory.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol

from tools.registry import EFFECT_WRITES_STATE, ISOLATION_PROCESS, BackendSlot, registry, tool_error, tool_result

MAX_ITEMS = 100
MAX_TEXT_CHARS = 500


class TodoStatus(StrEnum):
    """Where an item stands; the values are what the model sends and backends store."""

    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    DONE = "done"
    CANCELLED = "cancelled"


_SUMMARY_ORDER = (TodoStatus.DONE, TodoStatus.IN_PROGRESS, TodoStatus.PENDING, TodoStatus.CANCELLED)
_FINISHED = frozenset({TodoStatus.DONE, TodoStatus.CANCELLED})


@dataclass(slots=True)
class TodoItem:
    """One checklist entry; ``id`` is short and never changes while the item exists."""

    id: str
    text: str
    status: TodoStatus = TodoStatus.PENDING


class TodoBackend(Protocol):
    """Synchronous whole-list storage keyed by session; called from worker threads, so thread-safe."""

    def load(self, session_key: str) -> list[TodoItem]:
        """The session's items in order (empty when there are none)."""
        ...

    def save(self, session_key: str, items: list[TodoItem]) -> None:
        """Replace the session's items with ``items``."""
        ...


class InMemoryTodoBackend:
    """Thread-safe process-local ``TodoBackend`` (the default; lists are lost on restart)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lists: dict[str, list[TodoItem]] = {}

    def load(self, session_key: str) -> list[TodoItem]:
        """The session's items in order (copies: changing them does not change the store)."""
        with self._lock:
            return [replace(item) for item in self._lists.get(session_key, ())]

    def save(self, session_key: str, items: list[TodoItem]) -> None:
        """Replace the session's items with copies of ``items``."""
        copies = [replace(item) for item in items]
        with self._lock:
            if copies:
                self._lists[session_key] = copies
            else:
                self._lists.pop(session_key, None)


_slot: BackendSlot[TodoBackend] = BackendSlot(InMemoryTodoBackend())
# Make the todo tool store lists in ``backend`` (the gateway plugs its database in here).
set_todo_backend = _slot.set
get_todo_backend = _slot.get



# One model turn may carry several parallel todo calls for the same session; each is a
# load-modify-save, so they are serialised per session to avoid lost updates.
_session_locks: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()
_session_locks_guard = threading.Lock()


def _session_lock(session_key: str) -> threading.Lock:
    with _session_locks_guard:
        lock = _session_locks.get(session_key)
        if lock is None:
            lock = _session_locks[session_key] = threading.Lock()
        return lock


def _text_problem(value: object) -> str | None:
    """Why ``value`` cannot be an item's text, or None when it can."""
    if not isinstance(value, str) or not value.strip():
        return "Item text must be a non-empty string."
    if len(value.strip()) > MAX_TEXT_CHARS:
        return f"Item text is {len(value.strip())} characters; the limit is {MAX_TEXT_CHARS}."
    return None


def _lookup(items: list[TodoItem], args: Mapping[str, Any]) -> TodoItem | str:
    """The item named by ``args["id"]``, or an error message."""
    raw = args.get("id")
    wanted = "" if raw is None else str(raw).strip()
    if not wanted:
        return "Give the item's 'id' (list shows the ids)."
    for item in items:
        if item.id == wanted:
            return item
    return f"No item with id {wanted!r}; list shows the ids."


# Each action edits ``items`` in place and returns an error message, or None on success.


def _add(items: list[TodoItem], args: Mapping[str, Any]) -> str | None:
    texts = args.get("items")
    if not isinstance(texts, list) or not texts:
        return "add needs 'items': a non-empty list of task texts."
    for text in texts:
        if problem := _text_problem(text):
            return problem
    if len(items) + len(texts) > MAX_ITEMS:
        return (
            f"The list has {len(items)} items; adding {len(texts)} would pass the limit of {MAX_ITEMS}. "
            "Remove or clear finished items first."
        )
    next_id = max((int(item.id) for item in items if item.id.isdigit()), default=0) + 1
    items.extend(TodoItem(str(next_id + offset), text.strip()) for offset, text in enumerate(texts))
    return None


def _list(items: list[TodoItem], args: Mapping[str, Any]) -> str | None:
    return None


def _update(items: list[TodoItem], args: Mapping[str, Any]) -> str | None:
    found = _lookup(items, args)
    if isinstance(found, str):
        return found
    status, text = args.get("status"), args.get("text")
    if status is None and text is None:
        return "update needs 'status' and/or 'text'."
    if status is not None:
        try:
            status = TodoStatus(status)
        except ValueError:
            return f"Invalid status {status!r}; use one of: {', '.join(TodoStatus)}."
    if text is not None and (problem := _text_problem(text)):
        return problem
    if status is not None:
        found.status = status
    if text is not None:
        found.text = text.strip()
    return None


def _remove(items: list[TodoItem], args: Mapping[str, Any]) -> str | None:
    found = _lookup(items, args)
    if isinstance(found, str):
        return found
    items.remove(found)
    return None


def _clear(items: list[TodoItem], args: Mapping[str, Any]) -> str | None:
    items[:] = [item for item in items if item.status not in _FINISHED]
    return None


_ACTIONS: dict[str, Callable[[list[TodoItem], Mapping[str, Any]], str | None]] = {
    "add": _add,
    "list": _list,
    "update": _update,
    "remove": _remove,
    "clear": _clear,
}


def _summary(items: list[TodoItem]) -> str:
    """E.g. ``"3 items: 1 done, 1 in progress, 1 pending"``."""
    counts = Counter(item.status for item in items)
    head = f"{len(items)} item{'' if len(items) == 1 else 's'}"
    parts = [f"{counts[status]} {status.replace('_', ' ')}" for status in _SUMMARY_ORDER if counts[status]]
    return f"{head}: {', '.join(parts)}" if parts else head


def _todo(args: dict[str, Any], **ctx: Any) -> str:
    """Handler of the ``todo`` tool."""
    session_key = ctx.get("session_key")
    if not session_key:
        return tool_error("The todo list is unavailable here: the tool context has no session_key.")
    action = args.get("action")
    run = _ACTIONS.get(action) if isinstance(action, str) else None
    if run is None:
        return tool_error(f"Unknown action {action!r}; use one of: {', '.join(_ACTIONS)}.")
    with _session_lock(session_key):
        items = _slot.get().load(session_key)
        if problem := run(items, args):
            return tool_error(problem)
        if run is not _list:
            _slot.get().save(session_key, items)
    return tool_result(
        summary=_summary(items),
        items=[{"id": item.id, "status": str(item.status), "text": item.text} for item in items],
    )


registry.register(
    name="todo",
    toolset="todo",
    schema={
        "name": "todo",
        "description": (
            "A checklist for the current conversation, to plan and track multi-step work. Actions: "
            "add (items), list, update (id, status and/or text), remove (id), clear (drops done and "
            "cancelled items). Every action returns the whole list. "
            f"At most {MAX_ITEMS} items of {MAX_TEXT_CHARS} characters."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": list(_ACTIONS)},
                "items": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "add: the texts of the new items.",
                },
                "id": {"type": "string", "description": "update/remove: the item's id."},
                "status": {
                    "type": "string",
                    "enum": [str(status) for status in TodoStatus],
                    "description": "update: the item's new status.",
                },
                "text": {"type": "string", "description": "update: the item's new text."},
            },
            "required": ["action"],
        },
    },
    handler=_todo,
    isolation=ISOLATION_PROCESS,  # the gateway's own state
    effects=[EFFECT_WRITES_STATE],
    emoji="📋",
)
