"""The agent loop: model call, tool calls on the tool thread pool, repeat up to ``max_turns``.

Tool code never runs on the event loop: each call goes to ``model_tools.handle_function_call``
on a bounded thread pool (async tools then run on that worker's own loop via the bridge).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import anyio
import httpx2
import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

import model_tools
from gateway import tokens
from gateway.approvals import RUN, ApprovalGate, Verdict
from gateway.config import ModelSettings
from gateway.limits import RunBudget
from gateway.metrics import Metrics
from gateway.model_errors import ModelError, explain
from gateway.steering import TakeSteered
from gateway.store import ChatMessage, RunUsage
from tools.clarify_tool import parse_clarify
from tools.media_tools import parse_attach, parse_show_image
from tools.registry import tool_error, tool_result

logger = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = (
    "You are Hermes, a helpful assistant reached through a chat gateway. Answer concisely. "
    "Use the tools you are given when they help; never invent tool results."
)

OnText = Callable[[str], Awaitable[None]]
ShowImage = Callable[[str, str], Awaitable[str]]
"""(workspace, path in it) -> the image as a data URL for the model (gateway/media/outbound.py)."""
# A model answer cut off before its end (finish_reason): delivered as far as it got, with this line, and the run
# is ended by that reason (RunOutcome.ended_by).
CUT_OFF_NOTES = {
    "length": "(The answer was cut off: it reached the model's output limit.)",
    "content_filter": "(The answer was cut off by the model provider's content filter.)",
}
RECORD_RESULT_CHARS = 2000  # of a tool call's result, kept in the run's record
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
    pending: list[tuple[dict[str, Any], Verdict]] = field(default_factory=list)
    """The calls waiting for a user's approval when ``ended_by`` is "approval" (gateway/approvals.py)."""
    files: list[dict[str, str]] = field(default_factory=list)
    """Files ``send_file`` asked to send with the answer (path, caption, as)."""


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
    (anyio's asyncio backend, for the stream's clean-up: an 8-17 ms stall of every chat on the loop)."""
    await anyio.sleep(0)


MESSAGE_FRAMING_TOKENS = 4  # role and separators around each message, as OpenAI's chat format counts them


def message_tokens(msg: ChatMessage) -> int:
    """Tokens of one message as ``gateway.tokens`` counts them, plus its framing."""
    calls = tokens.count(json.dumps(msg.tool_calls, ensure_ascii=False)) if msg.tool_calls else 0
    return tokens.count(msg.content or "") + calls + MESSAGE_FRAMING_TOKENS


def trim_history(history: Sequence[ChatMessage], token_budget: int) -> list[ChatMessage]:
    """Keep the most recent messages within ``token_budget`` tokens, never starting mid tool exchange."""
    kept: list[ChatMessage] = []
    used = 0
    for msg in reversed(history):
        cost = message_tokens(msg)
        if used + cost > token_budget and kept:
            break
        kept.append(msg)
        used += cost
    kept.reverse()
    while kept and (kept[0].role == "tool" or (kept[0].role == "assistant" and kept[0].tool_calls)):
        kept.pop(0)
    return kept


class Agent:
    """Runs the tool-calling loop against one OpenAI-compatible model."""

    def __init__(self, cfg: ModelSettings, client: openai.AsyncOpenAI, tool_pool: ThreadPoolExecutor,
                 metrics: Metrics, *, max_turn_result_chars: int = model_tools.DEFAULT_TURN_RESULT_CHARS) -> None:
        self.cfg = cfg
        self.client = client
        self.tool_pool = tool_pool
        self.metrics = metrics
        self.max_turn_result_chars = max_turn_result_chars
        """The most characters the results of one model turn give the model together (``tools.max_turn_result_chars``):
        past it, the largest are stored in the workspace and previewed (``model_tools.cap_turn_results``)."""
        self.system_prompt = cfg.system_prompt or DEFAULT_SYSTEM_PROMPT
        self.show_image: ShowImage | None = None
        """Set by the gateway: loads an image ``vision_analyze`` asks to show (None: images are not shown)."""

    async def run(self, messages: list[dict[str, Any]], plan: model_tools.ToolPlan, tool_ctx: dict[str, Any],
                  on_text: OnText | None = None, cancel: threading.Event | None = None,
                  budget: RunBudget | None = None, model: str | None = None,
                  usage: RunUsage | None = None, steer: TakeSteered | None = None, gate: ApprovalGate | None = None,
                  approved: Sequence[dict[str, Any]] = ()) -> RunOutcome:
        """Drive the model (``model``, else ``model.name``) until it answers without tool calls (or ``max_turns``
        / the budget is reached). Each call's reported tokens are added to ``usage`` as they come, so it holds what
        was used even when the loop fails part way. Before each model call, the messages ``steer`` gives are added
        as user messages (gateway/steering.py), and what ``pre_llm_call`` hooks give is added to that request only.
        ``gate`` decides each tool call (run, ask, deny: a call to ask about ends the loop with ``ended_by``
        "approval"); ``approved`` calls, answered yes by the user, run first."""
        outcome = RunOutcome(text="", model=model or self.cfg.name)
        convo = list(messages)
        if approved:
            assistant = ChatMessage("assistant", None, list(approved))
            outcome.transcript.append(assistant)
            convo.append(assistant.to_openai())
            results = await self._run_calls(approved, plan, tool_ctx, cancel)
            for tc, (result, record) in zip(approved, results, strict=True):
                outcome.tool_calls.append(record)
                tool_msg = ChatMessage("tool", result, tool_call_id=tc["id"])
                outcome.transcript.append(tool_msg)
                convo.append(tool_msg.to_openai())
            await self._take_media([result for result, _ in results], outcome, convo, tool_ctx)
        for _turn in range(self.cfg.max_turns):
            for steering in steer() if steer is not None else ():
                message = ChatMessage("user", steering)
                outcome.transcript.append(message)
                convo.append(message.to_openai())
            request = await self._with_hook_context(convo, tool_ctx)
            started = time.perf_counter()
            turn = await self._complete(request, plan.definitions, on_text, model=outcome.model)
            content, tool_calls = turn.content, turn.tool_calls
            elapsed = time.perf_counter() - started
            outcome.model_calls += 1
            outcome.model_seconds += elapsed
            outcome.tokens += turn.tokens
            outcome.prompt_tokens = turn.prompt_tokens
            if usage is not None:
                usage.add(turn.prompt_tokens or 0, turn.completion_tokens)
            self.metrics.model_latency.observe(elapsed)
            over_budget = budget.charge_model(turn.tokens) if budget is not None else None
            if (note := CUT_OFF_NOTES.get(turn.finish_reason or "")) is not None:
                # Tool calls in a cut-off answer may be cut off too: none is run, the user gets what came.
                logger.info("model answer cut off (finish_reason %s) after %d characters and %d tool calls",
                            turn.finish_reason, len(content), len(tool_calls))
                return self._end(outcome, f"{content.rstrip()}\n\n{note}" if content.strip() else note,
                                 turn.finish_reason or "")
            assistant = ChatMessage("assistant", content or None, tool_calls or None)
            outcome.transcript.append(assistant)
            convo.append(assistant.to_openai())
            if not tool_calls:
                outcome.text = content or ""
                return outcome
            stop = over_budget or (budget.charge_tools(len(tool_calls)) if budget is not None else None)
            if stop:
                return self._end(outcome, stop, "budget")
            verdicts = await gate.check(tool_calls) if gate is not None else [RUN] * len(tool_calls)
            ran = iter(await self._run_calls([tc for tc, v in zip(tool_calls, verdicts, strict=True)
                                              if v.action == "run"], plan, tool_ctx, cancel))
            question: tuple[str, list[str]] | None = None
            results: list[str] = []
            for tc, verdict in zip(tool_calls, verdicts, strict=True):
                result, record = next(ran) if verdict.action == "run" else self._held(tc, verdict)
                if verdict.action == "ask":
                    outcome.pending.append((tc, verdict))
                outcome.tool_calls.append(record)
                tool_msg = ChatMessage("tool", result, tool_call_id=tc["id"])
                outcome.transcript.append(tool_msg)
                convo.append(tool_msg.to_openai())
                question = question or parse_clarify(result)
                results.append(result)
            await self._take_media(results, outcome, convo, tool_ctx)
            if outcome.pending:
                outcome.ended_by = "approval"  # the caller stores the request and writes the prompt
                return outcome
            if question is not None:
                (outcome.text, outcome.choices), outcome.ended_by = question, "clarify"
                outcome.transcript.append(ChatMessage("assistant", outcome.text))
                return outcome
        return self._end(outcome, f"I stopped after {self.cfg.max_turns} steps without a final answer. "
                         "Ask me to continue, or narrow the request.", "max_turns")

    async def _with_hook_context(self, convo: list[dict[str, Any]], tool_ctx: Mapping[str, Any]
                                 ) -> list[dict[str, Any]]:
        """The next request: ``convo``, with what ``pre_llm_call`` hooks give (run on the tool pool: a hook may
        block) added to its last user message, in a copy (the conversation and the transcript never hold it)."""
        if not model_tools.has_hooks("pre_llm_call"):
            return convo
        loop = asyncio.get_running_loop()
        context = await loop.run_in_executor(self.tool_pool, model_tools.llm_call_context, list(convo), tool_ctx)
        return _with_context(convo, context) if context else convo

    async def _run_calls(self, calls: Sequence[dict[str, Any]], plan: model_tools.ToolPlan,
                         tool_ctx: dict[str, Any], cancel: threading.Event | None) -> list[tuple[str, dict[str, Any]]]:
        """Run one turn's calls concurrently; their results and records, the turn's results within
        ``max_turn_result_chars`` together."""
        done = list(await asyncio.gather(*(self._call_tool(tc, plan, tool_ctx, cancel) for tc in calls)))
        if sum(len(result) for result, _ in done) <= self.max_turn_result_chars:
            return done
        turn = [model_tools.TurnResult(record["name"], tc["id"], result)
                for tc, (result, record) in zip(calls, done, strict=True)]
        loop = asyncio.get_running_loop()
        texts = await loop.run_in_executor(self.tool_pool, model_tools.cap_turn_results, turn,
                                           self.max_turn_result_chars, tool_ctx, plan.allowed)
        for i, (text, (result, record)) in enumerate(zip(texts, done, strict=True)):
            if text != result:
                record["result"] = text[:RECORD_RESULT_CHARS]
                done[i] = (text, record)
        return done

    async def _take_media(self, results: Sequence[str], outcome: RunOutcome, convo: list[dict[str, Any]],
                          tool_ctx: Mapping[str, Any]) -> None:
        """Files ``send_file`` asked for go with the answer; images ``vision_analyze`` asked to show follow the tool
        results as a user message with image parts (a tool message cannot carry images), for this request only."""
        shown: list[dict[str, Any]] = []
        for result in results:
            if (attach := parse_attach(result)) is not None:
                outcome.files.append(attach)
            if (path := parse_show_image(result)) is not None and self.show_image is not None:
                try:
                    url = await self.show_image(tool_ctx["workspace"], path)
                except Exception as exc:  # the model hears why instead of seeing nothing
                    shown.append({"type": "text", "text": f"[{path} could not be shown: {exc}]"})
                else:
                    shown += [{"type": "text", "text": f"The image {path}:"},
                              {"type": "image_url", "image_url": {"url": url}}]
        if shown:
            convo.append({"role": "user", "content": shown})

    @staticmethod
    def _held(tc: dict[str, Any], verdict: Verdict) -> tuple[str, dict[str, Any]]:
        """The result (for the model) and record of a call not run: refused, or waiting for the user's answer."""
        if verdict.action == "deny":
            result = tool_error(verdict.reason)
        else:
            result = tool_result(status="awaiting_approval", reasons=[d.reason for d in verdict.dangers],
                                 note="Not run yet: the user was asked to approve it. Stop here; their decision "
                                      "comes as the next message, with the result if they approve.")
        return result, _record(tc, result, 0.0, verdict.action == "deny", approval=verdict.action)

    @staticmethod
    def _end(outcome: RunOutcome, text: str, reason: str) -> RunOutcome:
        """Finish early with an explanation the user sees (and the transcript keeps)."""
        outcome.text, outcome.ended_by = text, reason
        outcome.transcript.append(ChatMessage("assistant", text))
        return outcome

    async def summarise(self, messages: list[dict[str, Any]], max_tokens: int,
                        model: str | None = None) -> tuple[ModelTurn, float]:
        """One model call without tools or streaming (a conversation summary); the answer and its seconds."""
        started = time.perf_counter()
        turn = await self._complete(messages, [], None, max_tokens, model)
        elapsed = time.perf_counter() - started
        self.metrics.model_latency.observe(elapsed)
        return turn, elapsed

    async def _complete(self, convo: list[dict[str, Any]], tools: list[dict[str, Any]],
                        on_text: OnText | None, max_tokens: int | None = None, model: str | None = None) -> ModelTurn:
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
            self.metrics.model_errors.labels(type(exc).__name__).inc()
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

    async def _stream(self, kwargs: dict[str, Any], on_text: OnText | None) -> ModelTurn:
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
                    if on_text is not None:
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

    async def _call_tool(self, tc: dict[str, Any], plan: model_tools.ToolPlan, tool_ctx: dict[str, Any],
                         cancel: threading.Event | None) -> tuple[str, dict[str, Any]]:
        name = tc["function"]["name"]
        args = tc["function"]["arguments"]
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        ctx = {**tool_ctx, "tool_call_id": tc["id"]}
        if cancel is not None:
            ctx["cancel_event"] = cancel
        result = await loop.run_in_executor(
            self.tool_pool, lambda: model_tools.handle_function_call(name, args, enabled_tools=plan.allowed, **ctx))
        elapsed = time.perf_counter() - started
        record = _record(tc, result, round(elapsed, 6), result.startswith('{"error"'))
        # The name comes from the model: label only tools the run may call, so a model inventing names
        # cannot grow the metric's label set (and the process's memory) without bound.
        real = record["name"]
        known = real in plan.allowed or (real == name and name in model_tools.BRIDGE_TOOLS)
        self.metrics.tool_latency.labels(real if known else "(not allowed)").observe(elapsed)
        return result, record


def _record(tc: dict[str, Any], result: str, seconds: float, error: bool, **extra: Any) -> dict[str, Any]:
    """A tool call as the run keeps it: the tool that ran (behind a ``tool_call``, the tool it called, with
    ``via``), its arguments, the start of its result."""
    called = tc["function"]["name"]
    name, arguments = model_tools.real_call(called, tc["function"]["arguments"])
    record = {"name": name, "arguments": arguments, "result": result[:RECORD_RESULT_CHARS], "seconds": seconds,
              "error": error, **extra}
    if name != called:
        record["via"] = called
    return record


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
