"""Context compression: a session's older turns folded into a summary the model writes.

With ``model.context_tokens`` set, a run's history is the session's stored summary (as a system message)
and the messages after it. When the request would pass ``model.compress_at`` of ``context_tokens``, tool
results in older turns are shortened first; if that is not enough, the older turns (and the previous
summary) are summarised by the model, the last ``model.keep_recent_turns`` messages staying verbatim.
The size is the larger of the tokenizer's count (gateway/tokens.py) and what the model server reported for the
session's last request (``usage.prompt_tokens``, which also counts what the estimate cannot see, such as tool schemas).
When the model fails to write the summary (an error, a timeout, an empty answer) the run still answers: its
history is the newest messages that fit, as without compression; nothing is stored, so a later run tries again.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gateway.agent import Agent, message_tokens, trim_history
from gateway.config import ModelSettings
from gateway.model_errors import ModelError
from gateway.schema import insert_ignoring_conflicts, messages_t, session_summaries_t
from gateway.store import ChatMessage, Store

logger = logging.getLogger(__name__)

SUMMARY_PREFIX = "Summary of the earlier conversation: "
COMPRESS_PROMPT = (
    "You compress a chat between a user and an assistant so that the assistant can continue it. Write a "
    "concise summary of the conversation below, folding in the earlier summary if there is one: the user's "
    "goals, facts and preferences they stated, decisions made, results of tool calls that still matter, and "
    "open questions. Write plain prose or short bullet points, in the conversation's language; no preamble."
)
TOOL_RESULT_CHARS = 300  # a tool result in an older turn, shortened
_MAX_LOAD = 2000  # messages after the summary read at most (a long session stored before compression was on)

_t = session_summaries_t
_SUMMARY_ROW = sa.select(_t).where(_t.c.session_key == sa.bindparam("b_key"))
_AFTER = (sa.select(messages_t).where(messages_t.c.session_key == sa.bindparam("b_key"),
                                      messages_t.c.epoch == sa.bindparam("b_epoch"),
                                      messages_t.c.id > sa.bindparam("b_after"))
          .order_by(messages_t.c.id.desc()).limit(_MAX_LOAD))


@dataclass(slots=True)
class SessionContext:
    """A session's summary (None before the first compression), its messages after it with their ids, and the
    prompt size reported for its last request since then."""

    summary: str | None
    messages: list[ChatMessage]
    ids: list[int]
    prompt_tokens: int | None = None


@dataclass(slots=True)
class PreparedHistory:
    """What goes between the system prompt and the user's message, and the model calls it took (``tokens`` in
    all, ``prompt_tokens`` of them the requests', as reported)."""

    messages: list[dict[str, Any]]
    model_calls: int = 0
    model_seconds: float = 0.0
    tokens: int = 0
    prompt_tokens: int = 0
    compressed: bool = False


class SummaryStore:
    """The ``session_summaries`` table."""

    def __init__(self, store: Store) -> None:
        self.db = store.db

    async def load(self, key: str, epoch: int) -> SessionContext:
        """The session's summary of ``epoch`` and the messages after it, oldest first."""
        def work(conn: Connection) -> SessionContext:
            row = conn.execute(_SUMMARY_ROW, {"b_key": key}).first()
            current = row is not None and row.epoch == epoch
            after = row.through_id if current else 0
            rows = conn.execute(_AFTER, {"b_key": key, "b_epoch": epoch, "b_after": after}).all()[::-1]
            messages = [ChatMessage(r.role, r.content, json.loads(r.tool_calls) if r.tool_calls else None,
                                    r.tool_call_id) for r in rows]
            return SessionContext(row.summary if current else None, messages, [r.id for r in rows],
                                  row.prompt_tokens if current else None)

        return await self.db.read(work)

    async def save(self, key: str, epoch: int, *, summary: str | None = None, through_id: int | None = None,
                   prompt_tokens: int | None = None) -> None:
        """With ``summary``: the session's new summary covering its messages up to ``through_id`` (the prompt
        size reported before it no longer applies); else the prompt size of its last request."""
        now = time.time()

        def work(conn: Connection) -> None:
            row = conn.execute(_SUMMARY_ROW, {"b_key": key}).first()
            values: dict[str, Any] = {"epoch": epoch, "prompt_tokens": prompt_tokens, "updated_at": now}
            if summary is not None:
                values.update(summary=summary, through_id=through_id or 0)
            elif row is None or row.epoch != epoch:  # a new conversation (/new): the old summary is not its own
                values.update(summary=None, through_id=0)
            if row is not None:
                conn.execute(_t.update().where(_t.c.session_key == key).values(**values))
            else:
                conn.execute(insert_ignoring_conflicts(conn.dialect.name, _t, "session_key"),
                             {"session_key": key, "summary": None, "through_id": 0, **values})

        await self.db.write(work, quick=True)


def _shorten(msg: ChatMessage) -> ChatMessage:
    if msg.role != "tool" or len(msg.content or "") <= TOOL_RESULT_CHARS:
        return msg
    cut = msg.content or ""
    return ChatMessage("tool", f"{cut[:TOOL_RESULT_CHARS]}… [shortened: {len(cut)} characters]", None,
                       msg.tool_call_id)


def _render(summary: str | None, old: list[ChatMessage], max_chars: int) -> str:
    """The compression request's text: the earlier summary, then the older turns, clipped from the start."""
    lines: list[str] = []
    for m in old:
        if m.tool_calls:
            calls = ", ".join(f"{c['function']['name']}({c['function']['arguments']})" for c in m.tool_calls)
            lines.append(f"assistant called: {calls}")
        if m.content:
            lines.append(f"{'tool result' if m.role == 'tool' else m.role}: {m.content}")
    text = "\n".join(lines)
    if len(text) > max_chars:
        text = "…" + text[-max_chars:]
    head = f"Earlier summary:\n{summary}\n\n" if summary else ""
    return f"{head}Conversation:\n{text}"


def _split(messages: list[ChatMessage], keep: int) -> int:
    """Where the verbatim tail starts: the last ``keep`` messages, moved back so it starts no tool exchange
    half way (a tool result needs the call before it)."""
    start = max(len(messages) - keep, 0)
    while start > 0 and messages[start].role == "tool":
        start -= 1
    return start


class ContextCompressor:
    """Builds a run's history within ``model.context_tokens``, compressing the session when it must."""

    def __init__(self, cfg: ModelSettings, store: Store, agent: Agent) -> None:
        assert cfg.context_tokens is not None
        self.cfg = cfg
        self.context_tokens = cfg.context_tokens
        self.summaries = SummaryStore(store)
        self.agent = agent

    @property
    def limit(self) -> int:
        """The request size (tokens) past which the session is compressed."""
        return int(self.context_tokens * self.cfg.compress_at)

    async def history(self, key: str, epoch: int, fixed_tokens: int, force: bool = False,
                      model: str | None = None) -> PreparedHistory:
        """The run's history for a request whose other parts (system prompt, user message) take
        ``fixed_tokens``; ``force`` summarises the older turns whatever the size (``/compress``). A summary is
        written by ``model`` (the session's), else ``model.name``."""
        ctx = await self.summaries.load(key, epoch)
        summary = [ChatMessage("system", SUMMARY_PREFIX + ctx.summary)] if ctx.summary else []
        start = _split(ctx.messages, self.cfg.keep_recent_turns)
        old, recent = ctx.messages[:start], ctx.messages[start:]
        estimate = fixed_tokens + sum(map(message_tokens, summary + ctx.messages))
        overhead = max((ctx.prompt_tokens or 0) - estimate, 0)  # what the server counts and the estimate cannot
        if estimate + overhead <= self.limit and not force:
            return PreparedHistory([m.to_openai() for m in summary + ctx.messages])
        shortened = [_shorten(m) for m in old]
        if not force and fixed_tokens + overhead + sum(map(message_tokens, summary + shortened + recent)) <= self.limit:
            return PreparedHistory([m.to_openai() for m in summary + shortened + recent])
        prepared = PreparedHistory([])
        if old:
            text = await self._summarise(key, ctx.summary, shortened, prepared, model)
            if text is None:  # nothing stored: the next run over the limit tries again
                recent = shortened + recent
            else:
                await self.summaries.save(key, epoch, summary=text, through_id=ctx.ids[start - 1])
                summary = [ChatMessage("system", SUMMARY_PREFIX + text)]
                prepared.compressed = True
        room = self.limit - fixed_tokens - overhead - sum(map(message_tokens, summary))
        prepared.messages = [m.to_openai() for m in summary + trim_history(recent, max(room, 0))]
        return prepared

    async def _summarise(self, key: str, summary: str | None, old: list[ChatMessage], prepared: PreparedHistory,
                         model: str | None) -> str | None:
        """The new summary, or None when the model failed to write one (an error, no answer in time, an empty
        answer): the run then goes on without it, with the turns that fit."""
        out_tokens = max(self.context_tokens // 8, 64)
        request = [{"role": "system", "content": COMPRESS_PROMPT},
                   {"role": "user", "content": _render(summary, old, (self.context_tokens - out_tokens) * 3)}]
        started = time.perf_counter()
        prepared.model_calls = 1
        try:
            turn, prepared.model_seconds = await self.agent.summarise(request, out_tokens, model)
        except ModelError as exc:
            prepared.model_seconds = time.perf_counter() - started
            logger.warning("session %s: summarising %d older messages failed (%s); trimming instead",
                           key, len(old), exc)
            return None
        prepared.tokens, prepared.prompt_tokens = turn.tokens, turn.prompt_tokens or 0
        if not turn.content.strip():
            logger.warning("session %s: the model wrote an empty summary of %d older messages; trimming instead",
                           key, len(old))
            return None
        logger.info("compressed %d older messages into a summary of %d characters", len(old), len(turn.content))
        # The cap holds even for a server ignoring max_tokens: the summary must leave room for the conversation.
        return turn.content.strip()[:out_tokens * 4]

    async def record_usage(self, key: str, epoch: int, prompt_tokens: int) -> None:
        """Remember the size the server reported for the session's last request."""
        await self.summaries.save(key, epoch, prompt_tokens=prompt_tokens)
