"""The ``session_search`` tool's backend: full-text search over a user's own stored conversations.

A user's own sessions are those the store recorded for their platform and user id, except group sessions shared
by the whole group (``gateway.group_sessions_per_user: false``), whose transcripts hold other people's messages:
their direct chats, their own sessions in groups, their API sessions. Only what the user and the assistant said is
indexed (gateway/schema.py), as it was stored (redacted before the transcript is written); snippets pass the
redactor again, for secrets configured since. One query language on both databases: words (all must appear),
``"phrases"``, ``OR`` between alternatives (AND binds tighter), ``-word`` to exclude; it is parsed here and
rendered for SQLite's FTS5 or PostgreSQL's tsquery, so the model's text never reaches either parser as syntax.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gateway.config import Config
from gateway.dashboard.auth import PREFIX as DASHBOARD
from gateway.logs import redactor
from gateway.schema import PG_MESSAGE_VECTOR, SEARCHED_ROLES, runs_t, session_settings_t, sessions_t
from gateway.session import session_key
from gateway.store import Store
from gateway.tool_state import LoopBridge
from platforms.base import SessionSource
from tools.session_search_tool import SearchHit, SearchPage, SearchQueryError, Sort, set_session_search_backend

MAX_TERMS = 16
SNIPPET_WORDS = 16
_TOKEN = re.compile(r'-?"[^"]*"?|\S+')
_MARKS = ("«", "»", "…")


@dataclass(slots=True, frozen=True)
class SearchQuery:
    """A parsed query: any of ``groups`` (each: all of its phrases) and none of ``excluded``."""

    groups: tuple[tuple[str, ...], ...]
    excluded: tuple[str, ...]


def parse_query(text: str) -> SearchQuery:
    """Parse the tool's query language; raises ``SearchQueryError`` when nothing is left to look for."""
    groups: list[list[str]] = [[]]
    excluded: list[str] = []
    count = 0
    for token in _TOKEN.findall(text):
        if token == "OR":
            if groups[-1]:
                groups.append([])
            continue
        negated = token.startswith("-")
        phrase = " ".join(token.removeprefix("-").replace('"', " ").split())
        if not re.search(r"\w", phrase):  # punctuation only: no word to match
            continue
        count += 1
        if count > MAX_TERMS:
            raise SearchQueryError(f"The query has more than {MAX_TERMS} words and phrases; keep the telling ones.")
        (excluded if negated else groups[-1]).append(phrase)
    groups = [g for g in groups if g]
    if not groups:
        raise SearchQueryError("The query has no word to look for (only exclusions or punctuation). Add a word "
                               'or "a phrase" that must appear.')
    return SearchQuery(tuple(tuple(g) for g in groups), tuple(excluded))


def _fts5(query: SearchQuery) -> str:
    """The query as an FTS5 expression: every phrase quoted, so none of its characters is syntax."""
    def quoted(phrase: str) -> str:
        return '"' + phrase.replace('"', '""') + '"'

    expression = " OR ".join("(" + " AND ".join(map(quoted, group)) + ")" for group in query.groups)
    return "".join([f"({expression})", *(f" NOT {quoted(p)}" for p in query.excluded)])


def _tsquery(query: SearchQuery) -> tuple[str, dict[str, str]]:
    """The query as PostgreSQL SQL building a tsquery (each phrase a bound ``phraseto_tsquery``), with its binds."""
    binds: dict[str, str] = {}

    def phrase(text: str) -> str:
        name = f"p{len(binds)}"
        binds[name] = text
        return f"phraseto_tsquery('simple', :{name})"

    expression = " || ".join("(" + " && ".join(map(phrase, group)) + ")" for group in query.groups)
    return "(" + "".join([f"({expression})", *(f" && !!{phrase(p)}" for p in query.excluded)]) + ")", binds


_SQLITE_ORDER = {"relevance": "bm25(messages_search), m.id DESC", "newest": "m.id DESC"}
_SQLITE_SEARCH = (
    "SELECT m.id, m.session_key, m.epoch, m.role, m.run_id, m.created_at, "
    f"snippet(messages_search, 0, '{_MARKS[0]}', '{_MARKS[1]}', '{_MARKS[2]}', {SNIPPET_WORDS}) AS snippet "
    "FROM messages_search JOIN messages m ON m.id = messages_search.rowid "
    "WHERE messages_search MATCH :query AND m.session_key IN :keys ORDER BY {order} LIMIT :limit OFFSET :offset")
_ROLES = ", ".join(f"'{role}'" for role in SEARCHED_ROLES)
_PG_ORDER = {"relevance": "rank DESC, id DESC", "newest": "id DESC"}
# The tsquery is written out where it is used (a constant the planner matches to the index, where a CTE's column
# would not be); the matches are found and paged first, and only the page's get their snippet (ts_headline reads
# the whole text).
_PG_SEARCH = (
    "SELECT id, session_key, epoch, role, run_id, created_at, "
    f" ts_headline('simple', content, {{tsquery}}, 'StartSel={_MARKS[0]}, StopSel={_MARKS[1]}, "
    f"MaxWords={SNIPPET_WORDS}, MinWords={SNIPPET_WORDS * 3 // 4}, ShortWord=0') AS snippet FROM ("
    f" SELECT id, session_key, epoch, role, run_id, created_at, content, ts_rank({PG_MESSAGE_VECTOR}, {{tsquery}})"
    f" AS rank FROM messages WHERE role IN ({_ROLES}) AND {PG_MESSAGE_VECTOR} @@ {{tsquery}}"
    " AND session_key IN :keys ORDER BY {order} LIMIT :limit OFFSET :offset) AS hits ORDER BY {order}")


def _own_sessions(conn: Connection, user_key: str) -> dict[str, Any]:
    """The user's own sessions by key (rows with their current epoch and title): see the module's docstring."""
    platform, _, user_id = user_key.partition(":")
    rows = conn.execute(
        sa.select(sessions_t.c.key, sessions_t.c.chat_id, sessions_t.c.thread_id, sessions_t.c.epoch,
                  session_settings_t.c.title)
        .select_from(sessions_t.outerjoin(session_settings_t, session_settings_t.c.session_key == sessions_t.c.key))
        .where(sessions_t.c.platform == platform, sessions_t.c.user_id == user_id)).all()
    own = {}
    for row in rows:
        mine_in_group = session_key(SessionSource(platform, row.chat_id, "group", user_id, row.thread_id))
        if not row.key.startswith(f"{platform}:group:") or row.key == mine_in_group:
            own[row.key] = row
    return own


def search_sql(dialect: str, query: SearchQuery, sort: Sort) -> tuple[str, dict[str, str]]:
    """The dialect's SQL for a page of the matches in the sessions bound as ``keys`` (and ``limit``, ``offset``),
    with the query's binds."""
    if dialect == "postgresql":
        tsquery, binds = _tsquery(query)
        return _PG_SEARCH.format(tsquery=tsquery, order=_PG_ORDER[sort]), binds
    return _SQLITE_SEARCH.format(order=_SQLITE_ORDER[sort]), {"query": _fts5(query)}


def _matches(conn: Connection, query: SearchQuery, keys: Sequence[str], limit: int, offset: int,
             sort: Sort) -> list[Any]:
    sql, binds = search_sql(conn.dialect.name, query, sort)
    statement = sa.text(sql).bindparams(sa.bindparam("keys", expanding=True))
    return conn.execute(statement, {**binds, "keys": list(keys), "limit": limit, "offset": offset}).all()


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(slots=True)
class SessionSearch:
    """Searches users' conversations in the gateway's store; ``links``: runs can be opened on the dashboard."""

    store: Store
    links: bool

    async def search(self, user_key: str, text: str, *, limit: int, offset: int, sort: Sort) -> SearchPage:
        """A page of the user's messages matching ``text`` (one more is fetched to tell whether a page follows)."""
        query = parse_query(text)

        def work(conn: Connection) -> tuple[dict[str, Any], list[Any], set[str]]:
            own = _own_sessions(conn, user_key)
            rows = _matches(conn, query, list(own), limit + 1, offset, sort) if own else []
            run_ids = {r.run_id for r in rows if r.run_id}
            kept = set(conn.execute(sa.select(runs_t.c.id).where(runs_t.c.id.in_(run_ids))).scalars()) \
                if self.links and run_ids else set()
            return own, rows, kept

        own, rows, runs = await self.store.db.read(work)
        hits = [SearchHit(session=r.session_key, conversation=int(r.epoch),
                          title=own[r.session_key].title if r.epoch == own[r.session_key].epoch else None,
                          role=r.role, at=_iso(r.created_at), snippet=_redacted(r.snippet or ""), run_id=r.run_id,
                          link=f"{DASHBOARD}/runs/{r.run_id}" if r.run_id in runs else None)
                for r in rows[:limit]]
        return SearchPage(hits, offset + limit if len(rows) > limit else None)


def _redacted(snippet: str) -> str:
    """The snippet through the redactor. The match marks may split a secret (``my-«pass»-word``) so that no pattern
    sees it whole: the text is also redacted without them, and where that changes anything the marks go."""
    plain = snippet.replace(_MARKS[0], "").replace(_MARKS[1], "")
    cleaned = redactor(plain)
    return cleaned if cleaned != plain else redactor(snippet)


class StoreSessionSearchBackend(LoopBridge[SessionSearch]):
    """``SessionSearchBackend`` on the gateway store."""

    def search(self, user_key: str, query: str, *, limit: int, offset: int, sort: Sort) -> SearchPage:
        """A page of ``user_key``'s messages matching ``query``."""
        return self._call(self.state.search(user_key, query, limit=limit, offset=offset, sort=sort))


def install_session_search(cfg: Config, store: Store, loop: asyncio.AbstractEventLoop) -> None:
    """Point the ``session_search`` tool at the gateway's database."""
    links = cfg.http.dashboard.enabled
    set_session_search_backend(StoreSessionSearchBackend(SessionSearch(store, links), loop))
