"""The agent loop itself: model requests, stream parsing, and the order of a run's turns.

It runs where the gateway puts it: in the gateway's process (``gateway.agent_workers: 0``) or in an agent worker
process (gateway/agent_workers.py). Everything that touches the gateway's state (steering, ``pre_llm_call`` hooks,
usage and budgets, the approval gate, the tools, media) is asked of a ``RunSide``, once per model turn at most
twice; what crosses is plain data. This module imports only what a worker needs: the SDK, the model's settings and
the message shapes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, overload

import anyio
import httpx2
import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway.config import ModelSettings
from gateway.model_errors import ModelError, explain
from gateway.store_rows import ChatMessage
from tools.clarify_tool import parse_clarify

OnText = Callable[[str], Awaitable[None]]
# A model answer cut off before its end (finish_reason): delivered as far as it got, with this line, and the run
# is ended by that reason (RunOutcome.ended_by).
CUT_OFF_NOTES = {
    "length": "(The answer was cut off: it reached the model's output limit.)",
    "content_filter": "(The answer was cut off by the model provider's content filter.)",
}
_SDK_MAX_CONNECTIONS = 1000  # the openai SDK's own defaults
_SDK_KEEPALIVE = 100
_CHUNK_STREAM = openai.AsyncStream[ChatCompletionChunk]


@dataclass(slots=True)
class ModelTurn:
    """One model answer: its text, the tool calls it asks for, total tokens (0 if unreported), why it ended, the
    request's size as the server counted it (usage.prompt_tokens; None if unreported) and the answer's
    (usage.completion_tokens; 0 if unreported)."""

    content: str
    tool_calls: list[dict[str, Any]]
    tokens: int
    finish_reason: str | None
    prompt_tokens: int | None = None
    completion_tokens: int = 0


@dataclass(slots=True)
class TurnReport:
    """What the run's side accounts for one model call: its tokens and seconds."""

    tokens: int
    prompt_tokens: int | None
    completion_tokens: int
    seconds: float


@dataclass(slots=True)
class Acted:
    """What the run's side did with one turn's tool calls: ``stop`` (the budget ran out: the run ends with this
    text), else each call's result and record in order, whether some wait for the user's approval, the files
    ``send_file`` asked for, and image parts to show the model with the results."""

    stop: str | None = None
    results: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    pending: bool = False
    files: list[dict[str, str]] = field(default_factory=list)
    shown: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class LoopRequest:
    """A run's loop as plain data: the first request's messages, the tool definitions, the model, calls the user
    approved (run first), and whether the side is asked before each model call (``steer``: messages steered into
    the run; ``hooks``: ``pre_llm_call`` hooks, which read the conversation) and shown the text as it streams."""

    messages: list[dict[str, Any]]
    definitions: list[dict[str, Any]]
    model: str
    max_turns: int
    approved: list[dict[str, Any]] = field(default_factory=list)
    steer: bool = False
    hooks: bool = False
    stream: bool = False


@dataclass(slots=True)
class RunOutcome:
    """What a finished agent loop produced; ``ended_by`` is "answer", "clarify", "approval" (calls wait for a
    user's yes: ``pending``), "budget", "max_turns", or the finish_reason of an answer cut off ("length",
    "content_filter")."""

    text: str
    transcript: list[ChatMessage] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    model_calls: int = 0
    model_seconds: float = 0.0
    tokens: int = 0
    ended_by: str = "answer"
    prompt_tokens: int | None = None
    """usage.prompt_tokens of the last model answer (None if unreported)."""
    model: str = ""
    """The model the loop asked (the session's choice, or ``model.name``)."""
    choices: list[str] = field(default_factory=list)
    """The answers a ``clarify`` question offers (shown as buttons)."""
    pending: list[tuple[dict[str, Any], Any]] = field(default_factory=list)
    """The calls (and their approval verdicts) waiting for a user's yes when ``ended_by`` is "approval"; filled by
    the gateway's side of the run (gateway/agent.py), which decided them."""
    files: list[dict[str, str]] = field(default_factory=list)
    """Files ``send_file`` asked to send with the answer (path, caption, as)."""


class RunSide(Protocol):
    """The gateway's part of one run, as the loop asks for it."""

    async def prepare(self, convo: list[dict[str, Any]]) -> tuple[list[str], str | None]:
        """Before a model call: texts steered into the run since the last one, and what ``pre_llm_call`` hooks add to
        this request (``convo`` is empty unless the request asked for hooks)."""
        ...

    async def turn(self, report: TurnReport, calls: list[dict[str, Any]]) -> Acted:
        """After a model call: account for it, then decide and run its ``calls`` (none: accounting only)."""
        ...

    async def approved(self, calls: list[dict[str, Any]]) -> Acted:
        """Run calls the user approved."""
        ...

    async def text(self, text: str) -> None:
        """The answer's text so far, as it streams."""
        ...


def build_client(cfg: ModelSettings, max_connections: int = _SDK_MAX_CONNECTIONS) -> openai.AsyncOpenAI:
    """One long-lived client per model configuration, on the aiohttp transport, allowing
    ``max_connections`` model calls at once (the gateway passes its run limits: the SDK's default
    of 1,000 would queue calls inside the client that the configuration allows)."""
    limits = httpx2.Limits(max_connections=max_connections,
                          max_keepalive_connections=min(_SDK_KEEPALIVE, max_connections))
    return openai.AsyncOpenAI(
        base_url=cfg.base_url,
        api_key=cfg.api_key.get_secret_value() or "not-needed",
        max_retries=cfg.max_retries,
        timeout=openai.Timeout(cfg.timeout, connect=cfg.connect_timeout),
        http_client=openai.DefaultAioHttpClient(limits=limits),
    )


@overload
async def post_chat_completion(client: openai.AsyncOpenAI, body: dict[str, Any], *,
                               stream: Literal[False] = False) -> ChatCompletion: ...


@overload
async def post_chat_completion(client: openai.AsyncOpenAI, body: dict[str, Any], *,
                               stream: Literal[True]) -> openai.AsyncStream[ChatCompletionChunk]: ...


async def post_chat_completion(client: openai.AsyncOpenAI, body: dict[str, Any], *, stream: bool = False
                               ) -> ChatCompletion | openai.AsyncStream[ChatCompletionChunk]:
    """``POST /chat/completions`` through the SDK client: the same request as ``chat.completions.create``.

    ``create`` first runs the SDK's request transform over the whole body, a recursive walk of the messages
    and tool schemas against its parameter TypedDicts (~1.2 ms per call on this machine, about a third of
    the gateway's event-loop CPU per webhook run), which returns the plain JSON built here unchanged. The
    documented ``client.post`` sends the same bytes with the client's retries, auth, timeouts, error
    classes and response models (``tests/gateway/test_agent_calls.py`` compares the two on the wire).
    """
    if stream:
        return await client.post("/chat/completions", cast_to=ChatCompletion, stream=True, stream_cls=_CHUNK_STREAM,
                                 body={**body, "stream": True, "stream_options": {"include_usage": True}})
    return await client.post("/chat/completions", cast_to=ChatCompletion, body=body)


async def load_sdk_modules() -> None:
    """Import now what the SDK would import on the event loop at the end of the first streamed answer
    (anyio's asyncio backend, for the stream's clean-up: an 8-17 ms stall of every chat on the loop), and start the
    default executor the aiohttp transport resolves host names on."""
    await anyio.sleep(0)
    await asyncio.get_running_loop().run_in_executor(None, int)


class ModelCaller:
    """Model requests to one OpenAI-compatible server, streamed when someone watches the text."""

    def __init__(self, cfg: ModelSettings, client: openai.AsyncOpenAI,
                 on_error: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.client = client
        self.on_error = on_error
        """Told the SDK error's class name of each failed call (the gateway counts them)."""

    async def complete(self, convo: list[dict[str, Any]], tools: list[dict[str, Any]], on_text: OnText | None,
                       max_tokens: int | None = None, model: str | None = None) -> ModelTurn:
        """One model call (``max_tokens``: this call's output cap instead of ``model.max_tokens``; ``model``:
        instead of ``model.name``)."""
        kwargs: dict[str, Any] = {"model": model or self.cfg.name, "messages": convo}
        if tools:
            kwargs["tools"] = tools
        if self.cfg.temperature is not None:
            kwargs["temperature"] = self.cfg.temperature
        if (max_tokens := max_tokens or self.cfg.max_tokens) is not None:
            kwargs["max_tokens"] = max_tokens
        try:
            # Stream only when someone shows the text as it comes: parsing SSE chunks costs about a third
            # more CPU per call than one JSON answer (bench/RESULTS.md), for nothing when nobody watches.
            if self.cfg.stream and on_text is not None:
                return await self._stream(kwargs, on_text)
            response = await post_chat_completion(self.client, kwargs)
        except openai.OpenAIError as exc:
            if self.on_error is not None:
                self.on_error(type(exc).__name__)
            raise explain(exc, self.cfg) from exc
        if not response.choices:
            raise ModelError("The model returned an empty answer. Please try again.", "no choices")
        choice = response.choices[0]
        msg = choice.message
        calls = [{"id": tc.id, "type": "function",
                  "function": {"name": tc.function.name, "arguments": tc.function.arguments or "{}"}}
                 for tc in (msg.tool_calls or []) if tc.type == "function"]
        usage = response.usage
        return ModelTurn(msg.content or "", calls, usage.total_tokens if usage else 0, choice.finish_reason,
                         usage.prompt_tokens if usage else None, usage.completion_tokens if usage else 0)

    async def _stream(self, kwargs: dict[str, Any], on_text: OnText) -> ModelTurn:
        parts: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        tokens = completion_tokens = 0
        prompt_tokens: int | None = None
        finish_reason: str | None = None
        stream = await post_chat_completion(self.client, kwargs, stream=True)
        async with stream:
            async for chunk in stream:
                if chunk.usage is not None:
                    tokens, prompt_tokens = chunk.usage.total_tokens, chunk.usage.prompt_tokens
                    completion_tokens = chunk.usage.completion_tokens
                if not chunk.choices:
                    continue
                finish_reason = chunk.choices[0].finish_reason or finish_reason
                delta = chunk.choices[0].delta
                if delta.content:
                    parts.append(delta.content)
                    await on_text("".join(parts))
                for tc in delta.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"id": "", "type": "function",
                                                       "function": {"name": "", "arguments": ""}})
                    if tc.id:
                        slot["id"] = tc.id
                    if tc.function and tc.function.name:
                        slot["function"]["name"] += tc.function.name
                    if tc.function and tc.function.arguments:
                        slot["function"]["arguments"] += tc.function.arguments
        ordered = [calls[i] for i in sorted(calls)]
        for i, call in enumerate(ordered):
            call["id"] = call["id"] or f"call_{i}"
            call["function"]["arguments"] = call["function"]["arguments"] or "{}"
        return ModelTurn("".join(parts), ordered, tokens, finish_reason, prompt_tokens, completion_tokens)


async def run_loop(side: RunSide, caller: ModelCaller, req: LoopRequest) -> RunOutcome:
    """Drive the model until it answers without tool calls (or ``max_turns`` / the budget is reached). Before each
    model call, messages steered into the run are added as user messages, and what ``pre_llm_call`` hooks give is
    added to that request only. Each turn's calls are decided and run by ``side``; a call waiting for the user's
    approval ends the loop ("approval"), a ``clarify`` question too ("clarify")."""
    outcome = RunOutcome(text="", model=req.model)
    convo = list(req.messages)
    if req.approved:
        assistant = ChatMessage("assistant", None, list(req.approved))
        outcome.transcript.append(assistant)
        convo.append(assistant.to_openai())
        _take(await side.approved(req.approved), req.approved, outcome, convo)
    on_text = side.text if req.stream else None
    for _turn in range(req.max_turns):
        context = None
        if req.steer or req.hooks:
            steered, context = await side.prepare(convo if req.hooks else [])
            for text in steered:
                message = ChatMessage("user", text)
                outcome.transcript.append(message)
                convo.append(message.to_openai())
        request = _with_context(convo, context) if context else convo
        started = time.perf_counter()
        turn = await caller.complete(request, req.definitions, on_text, model=outcome.model)
        content, tool_calls = turn.content, turn.tool_calls
        elapsed = time.perf_counter() - started
        outcome.model_calls += 1
        outcome.model_seconds += elapsed
        outcome.tokens += turn.tokens
        outcome.prompt_tokens = turn.prompt_tokens
        note = CUT_OFF_NOTES.get(turn.finish_reason or "")
        # Tool calls in a cut-off answer may be cut off too: none is run, the user gets what came.
        acted = await side.turn(TurnReport(turn.tokens, turn.prompt_tokens, turn.completion_tokens, elapsed),
                                tool_calls if note is None else [])
        if note is not None:
            return _end(outcome, f"{content.rstrip()}\n\n{note}" if content.strip() else note,
                        turn.finish_reason or "")
        assistant = ChatMessage("assistant", content or None, tool_calls or None)
        outcome.transcript.append(assistant)
        convo.append(assistant.to_openai())
        if not tool_calls:
            outcome.text = content or ""
            return outcome
        if acted.stop:
            return _end(outcome, acted.stop, "budget")
        question = _take(acted, tool_calls, outcome, convo)
        if acted.pending:
            outcome.ended_by = "approval"  # the gateway stores the request and writes the prompt
            return outcome
        if question is not None:
            (outcome.text, outcome.choices), outcome.ended_by = question, "clarify"
            outcome.transcript.append(ChatMessage("assistant", outcome.text))
            return outcome
    return _end(outcome, f"I stopped after {req.max_turns} steps without a final answer. "
                "Ask me to continue, or narrow the request.", "max_turns")


def _take(acted: Acted, calls: list[dict[str, Any]], outcome: RunOutcome, convo: list[dict[str, Any]]
          ) -> tuple[str, list[str]] | None:
    """Add a turn's results to the outcome and the conversation (images to show as a user message after them: a
    tool message cannot carry images); the first ``clarify`` question among them, if any."""
    question: tuple[str, list[str]] | None = None
    for tc, (result, record) in zip(calls, acted.results, strict=True):
        outcome.tool_calls.append(record)
        tool_msg = ChatMessage("tool", result, tool_call_id=tc["id"])
        outcome.transcript.append(tool_msg)
        convo.append(tool_msg.to_openai())
        question = question or parse_clarify(result)
    outcome.files += acted.files
    if acted.shown:
        convo.append({"role": "user", "content": acted.shown})
    return question


def _end(outcome: RunOutcome, text: str, reason: str) -> RunOutcome:
    """Finish early with an explanation the user sees (and the transcript keeps)."""
    outcome.text, outcome.ended_by = text, reason
    outcome.transcript.append(ChatMessage("assistant", text))
    return outcome


def _with_context(convo: list[dict[str, Any]], context: str) -> list[dict[str, Any]]:
    """A copy of ``convo`` with ``context`` after the text of its last user message (a new user message when
    there is none); the messages themselves are not changed."""
    request = list(convo)
    for i in range(len(request) - 1, -1, -1):
        message = request[i]
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list):  # content parts (images): the context is one more text part
            request[i] = {**message, "content": [*content, {"type": "text", "text": context}]}
        else:
            request[i] = {**message, "content": f"{content or ''}\n\n{context}".lstrip()}
        return request
    return [*request, {"role": "user", "content": context}]
