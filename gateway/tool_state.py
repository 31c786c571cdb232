"""Database-backed storage for the memory and todo tools.

Tool handlers run in worker threads and call these backends synchronously; each call
is carried to the gateway's event loop (where the database engine lives) and waited for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from gateway.state_stores import ToolStateStore
from gateway.store import Store
from tools.memory_tool import InMemoryMemoryBackend, MemoryNote, set_memory_backend
from tools.todo_tool import InMemoryTodoBackend, TodoItem, TodoStatus, set_todo_backend

T = TypeVar("T")
S = TypeVar("S")
_CALL_TIMEOUT = 30.0


class LoopBridge(Generic[S]):
    """Base of the synchronous tool backends: ``_call`` runs a coroutine of ``state`` on the gateway loop."""

    def __init__(self, state: S, loop: asyncio.AbstractEventLoop) -> None:
        self.state = state
        self.loop = loop

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(_CALL_TIMEOUT)


class StoreMemoryBackend(LoopBridge[ToolStateStore]):
    """``MemoryBackend`` on the gateway store."""

    def add(self, user_key: str, text: str) -> MemoryNote:
        """Store a note."""
        note_id, created = self._call(self.state.add_note(user_key, text))
        return MemoryNote(str(note_id), text, datetime.fromtimestamp(created, UTC))

    def list(self, user_key: str) -> list[MemoryNote]:
        """The user's notes, oldest first."""
        rows = self._call(self.state.list_notes(user_key))
        return [MemoryNote(str(i), text, datetime.fromtimestamp(ts, UTC)) for i, text, ts in rows]

    def remove(self, user_key: str, note_id: str) -> bool:
        """Delete one of the user's notes."""
        return note_id.isdigit() and self._call(self.state.remove_note(user_key, int(note_id)))


class StoreTodoBackend(LoopBridge[ToolStateStore]):
    """``TodoBackend`` on the gateway store."""

    def load(self, session_key: str) -> list[TodoItem]:
        """The session's checklist."""
        rows = self._call(self.state.load_todos(session_key))
        return [TodoItem(r["id"], r["text"], TodoStatus(r["status"])) for r in rows]

    def save(self, session_key: str, items: list[TodoItem]) -> None:
        """Replace the session's checklist."""
        data = [{"id": i.id, "text": i.text, "status": str(i.status)} for i in items]
        self._call(self.state.save_todos(session_key, data))


def install_tool_backends(store: Store, loop: asyncio.AbstractEventLoop) -> None:
    """Point the memory and todo tools at the gateway's database."""
    state = ToolStateStore(store)
    set_memory_backend(StoreMemoryBackend(state, loop))
    set_todo_backend(StoreTodoBackend(state, loop))


def uninstall_tool_backends() -> None:
    """Back to process-local storage (the gateway's loop and database are going away)."""
    set_memory_backend(InMemoryMemoryBackend())
    set_todo_backend(InMemoryTodoBackend())
