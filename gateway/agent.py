"""The gateway's side of the agent loop: the run's tools on the tool thread pool, the approval gate, budgets,
steering, hooks and media; the loop itself (gateway/agent_loop.py) runs here or in an agent worker process.

Tool code never runs on the event loop: each call goes to ``model_tools.handle_function_call`` on a bounded thread
pool (async tools then run on that worker's own loop via the bridge).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import openai

import model_tools
from gateway import tokens
from gateway.agent_loop import Acted, LoopRequest, ModelCaller, ModelTurn, OnText, RunOutcome, TurnReport, run_loop
from gateway.approvals import RUN, ApprovalGate, Verdict
from gateway.config import ModelSettings
from gateway.limits import RunBudget
from gateway.metrics import Metrics
from gateway.steering import TakeSteered
from gateway.store import ChatMessage, RunUsage
from tools.media_tools import parse_attach, parse_show_image
from tools.registry import tool_error, tool_result

DEFAULT_SYSTEM_PROMPT = (
    "You are Hermes, a helpful assistant reached through a chat gateway. Answer concisely. "
    "Use the tools you are given when they help; never invent tool results."
)

ShowImage = Callable[[str, str], Awaitable[str]]
"""(workspace, path in it) -> the image as a data URL for the model (gateway/media/outbound.py)."""
RECORD_RESULT_CHARS = 2000  # of a tool call's result, kept in the run's record


class LoopRunner(Protocol):
    """Where a run's loop runs when not in this process (gateway/agent_workers.py)."""

    async def run(self, side: GatewaySide, req: LoopRequest) -> RunOutcome:
        """Run ``req``'s loop, asking ``side`` for the gateway's part."""
        ...


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
    """Runs the tool-calling loop against one OpenAI-compatible model: in this process, or through ``workers``."""

    def __init__(self, cfg: ModelSettings, client: openai.AsyncOpenAI, tool_pool: ThreadPoolExecutor,
                 metrics: Metrics, *, max_turn_result_chars: int = model_tools.DEFAULT_TURN_RESULT_CHARS) -> None:
        self.cfg = cfg
        self.tool_pool = tool_pool
        self.metrics = metrics
        self.caller = ModelCaller(cfg, client, lambda error: metrics.model_errors.labels(error).inc())
        self.max_turn_result_chars = max_turn_result_chars
        """The most characters the results of one model turn give the model together (``tools.max_turn_result_chars``):
        past it, the largest are stored in the workspace and previewed (``model_tools.cap_turn_results``)."""
        self.system_prompt = cfg.system_prompt or DEFAULT_SYSTEM_PROMPT
        self.show_image: ShowImage | None = None
        """Set by the gateway: loads an image ``vision_analyze`` asks to show (None: images are not shown)."""
        self.workers: LoopRunner | None = None
        """Set by the gateway with ``gateway.agent_workers`` > 0: the loops run in those processes."""
        self.on_model_seconds: Callable[[float], None] | None = None
        """Told each model call's seconds (the gateway's admission control)."""

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
        side = GatewaySide(self, plan, tool_ctx, on_text, cancel, budget, usage, steer, gate)
        req = LoopRequest(messages, plan.definitions, model or self.cfg.name, self.cfg.max_turns, list(approved),
                          steer=steer is not None, hooks=model_tools.has_hooks("pre_llm_call"),
                          stream=on_text is not None)
        outcome = await (self.workers.run(side, req) if self.workers is not None else run_loop(side, self.caller, req))
        outcome.pending = side.pending
        return outcome

    async def summarise(self, messages: list[dict[str, Any]], max_tokens: int,
                        model: str | None = None) -> tuple[ModelTurn, float]:
        """One model call without tools or streaming (a conversation summary); the answer and its seconds."""
        started = time.perf_counter()
        turn = await self.caller.complete(messages, [], None, max_tokens, model)
        elapsed = time.perf_counter() - started
        self.observe_model(elapsed)
        return turn, elapsed

    def observe_model(self, seconds: float) -> None:
        """Count one model call's seconds."""
        self.metrics.model_latency.observe(seconds)
        if self.on_model_seconds is not None:
            self.on_model_seconds(seconds)


@dataclass(slots=True)
class GatewaySide:
    """The gateway's part of one run (``agent_loop.RunSide``): what the loop asks between model calls."""

    agent: Agent
    plan: model_tools.ToolPlan
    tool_ctx: dict[str, Any]
    on_text: OnText | None
    cancel: threading.Event | None
    budget: RunBudget | None
    usage: RunUsage | None
    steer: TakeSteered | None
    gate: ApprovalGate | None
    pending: list[tuple[dict[str, Any], Verdict]] = field(default_factory=list)

    async def prepare(self, convo: list[dict[str, Any]]) -> tuple[list[str], str | None]:
        steered = self.steer() if self.steer is not None else []
        if not model_tools.has_hooks("pre_llm_call"):
            return steered, None
        # Hooks may block: on the tool pool. They see the conversation with the steered messages.
        request = [*convo, *({"role": "user", "content": text} for text in steered)]
        loop = asyncio.get_running_loop()
        context = await loop.run_in_executor(self.agent.tool_pool, model_tools.llm_call_context, request,
                                             self.tool_ctx)
        return steered, context or None

    def account(self, report: TurnReport) -> str | None:
        """Count one model call: its tokens into the run's usage and budget, its seconds into the metrics; the
        budget's stop text when the run is past it."""
        if self.usage is not None:
            self.usage.add(report.prompt_tokens or 0, report.completion_tokens)
        self.agent.observe_model(report.seconds)
        return self.budget.charge_model(report.tokens) if self.budget is not None else None

    async def turn(self, report: TurnReport, calls: list[dict[str, Any]]) -> Acted:
        over_budget = self.account(report)
        if not calls:
            return Acted()
        stop = over_budget or (self.budget.charge_tools(len(calls)) if self.budget is not None else None)
        if stop:
            return Acted(stop=stop)
        verdicts = await self.gate.check(calls) if self.gate is not None else [RUN] * len(calls)
        ran = iter(await self._run_calls([tc for tc, v in zip(calls, verdicts, strict=True) if v.action == "run"]))
        acted = Acted()
        for tc, verdict in zip(calls, verdicts, strict=True):
            acted.results.append(next(ran) if verdict.action == "run" else _held(tc, verdict))
            if verdict.action == "ask":
                self.pending.append((tc, verdict))
        acted.pending = bool(self.pending)
        await self._take_media(acted)
        return acted

    async def approved(self, calls: list[dict[str, Any]]) -> Acted:
        acted = Acted(results=await self._run_calls(calls))
        await self._take_media(acted)
        return acted

    async def text(self, text: str) -> None:
        if self.on_text is not None:
            await self.on_text(text)

    async def _run_calls(self, calls: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        """Run one turn's calls concurrently; their results and records, the turn's results within
        ``max_turn_result_chars`` together."""
        done = list(await asyncio.gather(*(self._call_tool(tc) for tc in calls)))
        limit = self.agent.max_turn_result_chars
        if sum(len(result) for result, _ in done) <= limit:
            return done
        turn = [model_tools.TurnResult(record["name"], tc["id"], result)
                for tc, (result, record) in zip(calls, done, strict=True)]
        loop = asyncio.get_running_loop()
        texts = await loop.run_in_executor(self.agent.tool_pool, model_tools.cap_turn_results, turn, limit,
                                           self.tool_ctx, self.plan.allowed)
        for i, (text, (result, record)) in enumerate(zip(texts, done, strict=True)):
            if text != result:
                record["result"] = text[:RECORD_RESULT_CHARS]
                done[i] = (text, record)
        return done

    async def _take_media(self, acted: Acted) -> None:
        """Files ``send_file`` asked for go with the answer; images ``vision_analyze`` asked to show follow the tool
        results as image parts, for the next request only."""
        show_image = self.agent.show_image
        for result, _ in acted.results:
            if (attach := parse_attach(result)) is not None:
                acted.files.append(attach)
            if (path := parse_show_image(result)) is not None and show_image is not None:
                try:
                    url = await show_image(self.tool_ctx["workspace"], path)
                except Exception as exc:  # the model hears why instead of seeing nothing
                    acted.shown.append({"type": "text", "text": f"[{path} could not be shown: {exc}]"})
                else:
                    acted.shown += [{"type": "text", "text": f"The image {path}:"},
                                    {"type": "image_url", "image_url": {"url": url}}]

    async def _call_tool(self, tc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        name = tc["function"]["name"]
        args = tc["function"]["arguments"]
        plan = self.plan
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        ctx = {**self.tool_ctx, "tool_call_id": tc["id"]}
        if self.cancel is not None:
            ctx["cancel_event"] = self.cancel
        result = await loop.run_in_executor(
            self.agent.tool_pool,
            lambda: model_tools.handle_function_call(name, args, enabled_tools=plan.allowed, **ctx))
        elapsed = time.perf_counter() - started
        record = _record(tc, result, round(elapsed, 6), result.startswith('{"error"'))
        # The name comes from the model: label only tools the run may call, so a model inventing names
        # cannot grow the metric's label set (and the process's memory) without bound.
        real = record["name"]
        known = real in plan.allowed or (real == name and name in model_tools.BRIDGE_TOOLS)
        self.agent.metrics.tool_latency.labels(real if known else "(not allowed)").observe(elapsed)
        return result, record


def _held(tc: dict[str, Any], verdict: Verdict) -> tuple[str, dict[str, Any]]:
    """The result (for the model) and record of a call not run: refused, or waiting for the user's answer."""
    if verdict.action == "deny":
        result = tool_error(verdict.reason)
    else:
        result = tool_result(status="awaiting_approval", reasons=[d.reason for d in verdict.dangers],
                             note="Not run yet: the user was asked to approve it. Stop here; their decision "
                                  "comes as the next message, with the result if they approve.")
    return result, _record(tc, result, 0.0, verdict.action == "deny", approval=verdict.action)


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
