"""The ``memory`` tool: short notes the agent keeps about a user across chats and sessions.

Notes are scoped by the ``user_key`` the gateway passes in ctx. Storage goes through
``MemoryBackend`` so the gateway can plug in its database; the default keeps notes in
process memory.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from tools.registry import EFFECT_WRITES_STATE, ISOLATION_PROCESS, BackendSlot, registry, tool_error, tool_result

MAX_NOTE_CHARS = 2_000
MAX_NOTES_PER_USER = 200


@dataclass(slots=True, frozen=True)
class MemoryNote:
    """One stored note; ``created_at`` is timezone-aware UTC."""

    id: str
    text: str
    created_at: datetime


class MemoryBackend(Protocol):
    """Synchronous note storage keyed by user; called from worker threads, so it must be thread-safe."""

    def add(self, user_key: str, text: str) -> MemoryNote:
        """Store a note and return it with its new id and creation time."""
        ...

    def list(self, user_key: str) -> list[MemoryNote]:
        """The user's notes, oldest first."""
        ...

    def remove(self, user_key: str, note_id: str) -> bool:
        """Delete one of the user's notes; False when the user has no note with that id."""
        ...


class InMemoryMemoryBackend:
    """Thread-safe process-local ``MemoryBackend`` (the default; notes are lost on restart)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._notes: dict[str, list[MemoryNote]] = {}
        self._ids = itertools.count(1)

    def add(self, user_key: str, text: str) -> MemoryNote:
        """Store a note and return it with its new id and creation time."""
        with self._lock:
            note = MemoryNote(id=str(next(self._ids)), text=text, created_at=datetime.now(UTC))
            self._notes.setdefault(user_key, []).append(note)
        return note

    def list(self, user_key: str) -> list[MemoryNote]:
        """The user's notes, oldest first."""
        with self._lock:
            return list(self._notes.get(user_key, ()))

    def remove(self, user_key: str, note_id: str) -> bool:
        """Delete one of the user's notes; False when the user has no note with that id."""
        with self._lock:
            notes = self._notes.get(user_key, [])
            for index, note in enumerate(notes):
                if note.id == note_id:
                    del notes[index]
                    return True
        return False


_slot: BackendSlot[MemoryBackend] = BackendSlot(InMemoryMemoryBackend())
# Make the memory tool store notes in ``backend`` (the gateway plugs its database in here).
set_memory_backend = _slot.set
get_memory_backend = _slot.get



def _note_json(note: MemoryNote) -> dict[str, str]:
    return {"id": note.id, "text": note.text, "created": note.created_at.date().isoformat()}


def _notes_result(notes: list[MemoryNote], **fields: Any) -> str:
    return tool_result(fields, count=len(notes), notes=[_note_json(n) for n in notes])


def _add(backend: MemoryBackend, user_key: str, args: Mapping[str, Any]) -> str:
    text = args.get("text")
    if not isinstance(text, str) or not text.strip():
        return tool_error("add needs 'text': the note to remember")
    text = text.strip()
    if len(text) > MAX_NOTE_CHARS:
        return tool_error(f"The note is {len(text)} characters; the limit is {MAX_NOTE_CHARS}. Shorten it.")
    # A soft limit: concurrent adds for one user may overshoot it by a note or two, which is harmless.
    count = len(backend.list(user_key))
    if count >= MAX_NOTES_PER_USER:
        return tool_error(
            f"Memory is full ({MAX_NOTES_PER_USER} notes). "
            "Remove notes that no longer matter, then add again."
        )
    note = backend.add(user_key, text)
    return tool_result(added=_note_json(note), count=count + 1)


def _list(backend: MemoryBackend, user_key: str, args: Mapping[str, Any]) -> str:
    return _notes_result(backend.list(user_key))


def _remove(backend: MemoryBackend, user_key: str, args: Mapping[str, Any]) -> str:
    raw = args.get("id")
    note_id = "" if raw is None else str(raw).strip()
    if not note_id:
        return tool_error("remove needs 'id': the note's id as shown by list or search")
    if not backend.remove(user_key, note_id):
        return tool_error(f"No note with id {note_id!r}. Use list or search to see the ids.")
    return tool_result(removed=note_id)


def _search(backend: MemoryBackend, user_key: str, args: Mapping[str, Any]) -> str:
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        return tool_error("search needs 'query': words to look for")
    words = query.casefold().split()
    hits = [n for n in backend.list(user_key) if all(w in n.text.casefold() for w in words)]
    return _notes_result(hits, query=query.strip())


_ACTIONS: dict[str, Callable[[MemoryBackend, str, Mapping[str, Any]], str]] = {
    "add": _add,
    "list": _list,
    "remove": _remove,
    "search": _search,
}


def _memory(args: dict[str, Any], **ctx: Any) -> str:
    """Handler of the ``memory`` tool."""
    user_key = ctx.get("user_key")
    if not user_key:
        return tool_error("Memory is unavailable here: the tool context has no user_key.")
    action = args.get("action")
    run = _ACTIONS.get(action) if isinstance(action, str) else None
    if run is None:
        return tool_error(f"Unknown action {action!r}; use one of: {', '.join(_ACTIONS)}.")
    return run(_slot.get(), user_key, args)


registry.register(
    name="memory",
    toolset="memory",
    schema={
        "name": "memory",
        "description": (
            "Long-term notes about the user that persist across conversations: preferences, facts "
            "they shared, ongoing projects. Actions: add (text), list, search (query: every word must "
            "appear, case-insensitive), remove (id). Keep each note short and self-contained; "
            f"at most {MAX_NOTES_PER_USER} notes of {MAX_NOTE_CHARS} characters."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": list(_ACTIONS)},
                "text": {"type": "string", "description": "add: the note to remember."},
                "id": {"type": "string", "description": "remove: the note's id from list or search."},
                "query": {"type": "string", "description": "search: words to look for."},
            },
            "required": ["action"],
        },
    },
    handler=_memory,
    isolation=ISOLATION_PROCESS,  # the gateway's own state
    effects=[EFFECT_WRITES_STATE],
    emoji="🧠",
)
