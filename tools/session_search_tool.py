"""The ``session_search`` tool: full-text search over the calling user's own past conversations.

Only the ``user_key`` the gateway passes in ctx decides whose conversations are searched; the model cannot name
another user. Storage goes through ``SessionSearchBackend``, which the gateway plugs in (its database's full-text
index); without one the tool is unavailable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

from tools.registry import ISOLATION_PROCESS, BackendSlot, registry, tool_error, tool_result

MAX_QUERY_CHARS = 500
DEFAULT_LIMIT = 5
MAX_LIMIT = 20
MAX_OFFSET = 1_000
SORTS = ("relevance", "newest")

Sort = Literal["relevance", "newest"]


class SearchQueryError(ValueError):
    """A query the search cannot run; the message says how to write it instead."""


@dataclass(slots=True, frozen=True)
class SearchHit:
    """One matching message: where it was said (session key, conversation number, title), when (UTC ISO), by whom
    (user or assistant), the match in context, and where an operator can open its run (None: nowhere)."""

    session: str
    conversation: int
    title: str | None
    role: str
    at: str
    snippet: str
    run_id: str | None
    link: str | None


@dataclass(slots=True, frozen=True)
class SearchPage:
    """A page of hits, best first; ``next_offset`` is None on the last page."""

    hits: list[SearchHit]
    next_offset: int | None


class SessionSearchBackend(Protocol):
    """Searches one user's stored conversations; called from worker threads, so it must be thread-safe."""

    def search(self, user_key: str, query: str, *, limit: int, offset: int, sort: Sort) -> SearchPage:
        """A page of ``user_key``'s messages matching ``query``; raises ``SearchQueryError`` for a bad query."""
        ...


_slot: BackendSlot[SessionSearchBackend | None] = BackendSlot(None)
# Search in ``backend`` (the gateway plugs its database in here); None makes the tool unavailable.
set_session_search_backend = _slot.set



class _BadArgument(ValueError):
    """An argument out of its range; the message names it and the range."""


def _int_arg(args: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = args.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _BadArgument(f"'{name}' must be an integer from {low} to {high}.")
    return value


def _session_search(args: dict[str, Any], **ctx: Any) -> str:
    """Handler of the ``session_search`` tool."""
    backend, user_key = _slot.get(), ctx.get("user_key")
    if backend is None or not user_key:
        return tool_error("Searching past conversations is unavailable here: there is no user or no store.")
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        return tool_error("session_search needs 'query': words or \"a phrase\" to look for.")
    if len(query) > MAX_QUERY_CHARS:
        return tool_error(f"The query is {len(query)} characters; the limit is {MAX_QUERY_CHARS}.")
    sort = args.get("sort") or "relevance"
    if sort not in SORTS:
        return tool_error(f"Unknown sort {sort!r}; use one of: {', '.join(SORTS)}.")
    try:
        page = backend.search(user_key, query.strip(), limit=_int_arg(args, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT),
                              offset=_int_arg(args, "offset", 0, 0, MAX_OFFSET), sort=sort)
    except (_BadArgument, SearchQueryError) as exc:
        return tool_error(str(exc))
    return tool_result(query=query.strip(), count=len(page.hits), next_offset=page.next_offset,
                       results=[asdict(hit) for hit in page.hits])


registry.register(
    name="session_search",
    toolset="session_search",
    schema={
        "name": "session_search",
        "description": (
            "Full-text search over the user's own past conversations with you (this user only, every chat and "
            "earlier conversation). Each result: the matching words in context (marked «like this»), when it was "
            "said (UTC), by whom, the session and conversation it is from and its title. Query syntax: words (all "
            "must appear), \"an exact phrase\", OR between alternatives, -word to exclude; case-insensitive, no "
            "stemming (search for the word forms used). Page with offset."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to find, e.g. pelican \"launch code\" -test."},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT,
                          "description": f"Results per page (default {DEFAULT_LIMIT})."},
                "offset": {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET,
                           "description": "Results to skip: the previous page's next_offset."},
                "sort": {"type": "string", "enum": list(SORTS),
                         "description": "relevance (default) or newest first."},
            },
            "required": ["query"],
        },
    },
    handler=_session_search,
    check_fn=_slot.installed,
    isolation=ISOLATION_PROCESS,  # reads the gateway's own database
    emoji="🔎",
)
