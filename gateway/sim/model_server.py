"""A scripted OpenAI-compatible chat-completions server for tests, benchmarks and the offline demo.

Answers ``POST /v1/chat/completions`` (plain JSON or ``stream=true`` SSE in the real OpenAI wire format)
and ``GET /v1/models``. What the model says for each request is a :class:`Turn`, taken first from a FIFO
queue (:meth:`ScriptedModel.push`), then from a responder callable (by default :func:`default_responder`).
Faults (HTTP errors, dropped connections, hangs) and latency can be injected per request. Image content parts
are checked as OpenAI checks them (:func:`image_parts` reads them back); the audio endpoints are
``ScriptedModel.audio`` (gateway/sim/model_media.py).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import logging
import re
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from aiohttp import web

from gateway.sim.model_faults import FaultQueue, drop, error_response, fault_response, json_object
from gateway.sim.model_media import AudioEndpoints, image_parts, image_problem

__all__ = [
    "Responder",
    "ScriptedModel",
    "ToolCall",
    "Turn",
    "default_responder",
    "image_parts",
    "last_user_text",
    "parse_directives",
    "rules",
    "text",
    "tool_call",
    "tool_calls",
]

logger = logging.getLogger(__name__)

JSON = dict[str, Any]


# --------------------------------------------------------------------------------------------- turns


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call the model makes; ``arguments`` is the raw JSON string sent on the wire."""

    name: str
    arguments: str = "{}"
    id: str | None = None  # None: the server assigns a unique ``call_...`` id per response


@dataclass(frozen=True, slots=True)
class Turn:
    """What the model answers for one request: text and/or tool calls, plus per-turn overrides.

    ``None`` overrides fall back to the server's settings; ``finish_reason`` defaults to
    ``"tool_calls"`` when there are tool calls and ``"stop"`` otherwise.
    """

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    latency: float | None = None
    chunk_delay: float | None = None
    chunk_size: int | None = None
    finish_reason: str | None = None
    usage: dict[str, int] | None = field(default=None, hash=False)


def _args_json(args: dict[str, Any] | str | None) -> str:
    if args is None:
        return "{}"
    return args if isinstance(args, str) else json.dumps(args)


def text(
    content: str,
    *,
    latency: float | None = None,
    chunk_delay: float | None = None,
    finish_reason: str | None = None,
    usage: dict[str, int] | None = None,
) -> Turn:
    """A text-only turn (``usage``: the token counts reported for it instead of the server's estimate)."""
    return Turn(content=content, latency=latency, chunk_delay=chunk_delay, finish_reason=finish_reason, usage=usage)


def tool_call(
    name: str,
    args: dict[str, Any] | str | None = None,
    *,
    id: str | None = None,
    content: str | None = None,
    latency: float | None = None,
    chunk_delay: float | None = None,
    usage: dict[str, int] | None = None,
) -> Turn:
    """A turn calling one tool; ``args`` is a dict (JSON-encoded) or a raw arguments string."""
    return Turn(
        content=content,
        tool_calls=(ToolCall(name, _args_json(args), id),),
        latency=latency,
        chunk_delay=chunk_delay,
        usage=usage,
    )


def tool_calls(
    calls: Iterable[ToolCall | tuple[str, dict[str, Any] | str | None]],
    *,
    content: str | None = None,
    latency: float | None = None,
    chunk_delay: float | None = None,
) -> Turn:
    """A turn calling several tools in parallel; items are ``ToolCall`` or ``(name, args)`` pairs."""
    built = tuple(c if isinstance(c, ToolCall) else ToolCall(c[0], _args_json(c[1])) for c in calls)
    return Turn(content=content, tool_calls=built, latency=latency, chunk_delay=chunk_delay)


# ------------------------------------------------------------------------------------------ responders

Responder = Callable[[JSON], Turn | str | Awaitable[Turn | str]]
"""Maps a request body to a turn (a ``str`` means a text turn); may be sync or async."""

_DIRECTIVE = re.compile(r"\[\[tool:([A-Za-z0-9_.\-]+)")
_DECODER = json.JSONDecoder()


def _text_of(content: Any) -> str:
    """Text of a message ``content``: a string, a list of content parts, or None."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def last_user_text(request: JSON) -> str:
    """Text of the last ``user`` message in a request body ("" if none)."""
    for message in reversed(request.get("messages") or ()):
        if isinstance(message, dict) and message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


def parse_directives(text: str) -> list[ToolCall]:
    """Parse ``[[tool:NAME]]`` / ``[[tool:NAME {json args}]]`` directives, in order.

    Arguments that are not valid JSON are passed through verbatim (handy for testing bad-args handling).
    """
    calls: list[ToolCall] = []
    pos = 0
    size = len(text)
    while (m := _DIRECTIVE.search(text, pos)) is not None:
        i = m.end()
        while i < size and text[i].isspace():
            i += 1
        args: str | None = None
        end = -1
        if text.startswith("]]", i):
            args, end = "{}", i + 2
        elif text.startswith("{", i):
            try:
                _, j = _DECODER.raw_decode(text, i)
            except ValueError:
                j = -1
            if j >= 0:
                k = j
                while k < size and text[k].isspace():
                    k += 1
                if text.startswith("]]", k):
                    args, end = text[i:j], k + 2
        if args is None:
            close = text.find("]]", i)
            if close < 0:
                break
            args, end = text[i:close].strip(), close + 2
        calls.append(ToolCall(m.group(1), args))
        pos = end
    return calls


def default_responder(request: JSON) -> Turn:
    """Rule-based model for the demo and benchmarks.

    - last message(s) are tool results: ``"Done: <first 200 chars of each result>"`` (joined by " | ");
    - last message is a user message with ``[[tool:NAME {json}]]`` directives: call those tools;
    - otherwise: ``"Echo: <last user text>"``.
    """
    messages = request.get("messages") or []
    last = messages[-1] if messages else None
    if isinstance(last, dict) and last.get("role") == "tool":
        results: list[str] = []
        for message in reversed(messages):
            if not isinstance(message, dict) or message.get("role") != "tool":
                break
            results.append(_text_of(message.get("content"))[:200])
        return Turn(content="Done: " + " | ".join(reversed(results)))
    user = last_user_text(request)
    if isinstance(last, dict) and last.get("role") == "user" and "[[tool:" in user:
        calls = parse_directives(user)
        if calls:
            return Turn(tool_calls=tuple(calls))
    return Turn(content="Echo: " + user)


RuleResult = Turn | str | Callable[[re.Match[str], JSON], Turn | str]


def rules(
    *pairs: tuple[str | re.Pattern[str], RuleResult], fallback: Responder = default_responder
) -> Responder:
    """A responder trying ``(regex, result)`` pairs against the last user message (``re.search``).

    Rules apply only when the last message is a user message, so a rule that calls a tool does not loop:
    the follow-up request (ending in the tool result) goes to ``fallback``. ``result`` is a turn, a string,
    or ``f(match, request) -> Turn | str``.
    """
    compiled = [(re.compile(p) if isinstance(p, str) else p, r) for p, r in pairs]

    def responder(request: JSON) -> Turn | str | Awaitable[Turn | str]:
        messages = request.get("messages") or []
        if messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "user":
            user = _text_of(messages[-1].get("content"))
            for pattern, result in compiled:
                m = pattern.search(user)
                if m is not None:
                    return result(m, request) if callable(result) else result
        return fallback(request)

    return responder


# ----------------------------------------------------------------------------------------- helpers


_DROP_GRACE = 0.05


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _split(s: str, size: int) -> list[str]:
    return [s[i : i + size] for i in range(0, len(s), size)] or [""]


# ----------------------------------------------------------------------------------------- the server


class ScriptedModel(FaultQueue):
    """Scripted OpenAI-compatible model server on aiohttp (``async with ScriptedModel() as model:``).

    Public mutable settings: ``responder``, ``latency`` (seconds before each answer), ``chunk_delay``
    (seconds between stream chunks), ``chunk_size`` (characters per streamed content/arguments chunk).
    ``requests`` records every authorized chat-completions body, in arrival order (faulted ones included).
    """

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        api_key: str | None = None,
        latency: float = 0.0,
        chunk_delay: float = 0.0,
        chunk_size: int = 16,
        models: Sequence[str] = ("scripted-model",),
    ) -> None:
        if chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        super().__init__()
        self.responder: Responder = responder or default_responder
        self.latency = latency
        self.chunk_delay = chunk_delay
        self.chunk_size = chunk_size
        self.requests: list[JSON] = []
        self.peer_ports: list[int] = []
        """The client's port of each recorded request (which process asked: tests map it to a pid)."""
        self.in_flight = 0
        """Chat-completion requests being answered now; ``peak_in_flight`` is the most at once."""
        self.peak_in_flight = 0
        self.base_url: str | None = None
        self._auth = None if api_key is None else f"Bearer {api_key}"
        self._models = tuple(models)
        self._queue: deque[Turn] = deque()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._parked: set[asyncio.Future[None]] = set()
        self._stopping = False
        self._tag = secrets.token_hex(3)
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_get("/v1/models", self._list_models)
        self.audio = AudioEndpoints(self._authorized, self._park)
        """``/v1/audio/transcriptions`` and ``/v1/audio/speech``: their settings, records and faults."""
        self.audio.add_routes(self.app.router)

    # ---------------------------------------------------------------- lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Start listening and return the base URL (``http://HOST:PORT/v1``)."""
        if self._runner is not None:
            raise RuntimeError("ScriptedModel already started")
        self._stopping = False
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        bound_host, bound_port = runner.addresses[0][:2]
        self.base_url = f"http://{bound_host}:{bound_port}/v1"
        return self.base_url

    async def stop(self) -> None:
        """Stop the server; hanging or sleeping requests are woken and their connections dropped."""
        self._stopping = True
        for fut in list(self._parked):
            _resolve(fut)
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(RuntimeError("ScriptedModel stopped"))
        self._waiters.clear()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # ---------------------------------------------------------------- scripting

    def push(self, *turns: Turn | str) -> None:
        """Queue turns answered, in order, before the responder is consulted (a ``str`` is a text turn)."""
        self._queue.extend(Turn(content=t) if isinstance(t, str) else t for t in turns)

    @property
    def pending_turns(self) -> int:
        """Number of pushed turns not yet served."""
        return len(self._queue)

    # ---------------------------------------------------------------- recording

    @property
    def request_count(self) -> int:
        """Number of chat-completions requests received."""
        return len(self.requests)

    async def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[JSON]:
        """Wait until at least ``n`` requests were received; return a snapshot of ``requests``."""
        if len(self.requests) < n:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (n, fut)
            self._waiters.append(entry)
            try:
                async with asyncio.timeout(timeout):
                    await fut
            except TimeoutError:
                raise TimeoutError(f"expected {n} model requests, got {len(self.requests)}") from None
            finally:
                if entry in self._waiters:
                    self._waiters.remove(entry)
        return list(self.requests)

    def _record(self, body: JSON) -> None:
        self.requests.append(body)
        if self._waiters:
            count = len(self.requests)
            for n, fut in self._waiters:
                if n <= count and not fut.done():
                    fut.set_result(None)

    # ---------------------------------------------------------------- handlers

    async def _park(self, seconds: float | None) -> bool:
        """Sleep ``seconds`` (forever if None) unless stopped; False when woken by ``stop()``."""
        if self._stopping:
            return False
        if seconds is not None and seconds <= 0:
            return True
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        handle = loop.call_later(seconds, _resolve, fut) if seconds is not None else None
        self._parked.add(fut)
        try:
            await fut
        finally:
            if handle is not None:
                handle.cancel()
            self._parked.discard(fut)
        return not self._stopping

    def _authorized(self, request: web.BaseRequest) -> bool:
        return self._auth is None or request.headers.get("Authorization") == self._auth

    async def _list_models(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return error_response(401)
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "hermes-sim"} for m in self._models]
        return web.Response(
            body=json.dumps({"object": "list", "data": data}).encode(), content_type="application/json"
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            return await self._answer(request)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await json_object(request, self._authorized(request))
        if isinstance(body, web.Response):
            return body
        self._record(body)
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        self.peer_ports.append(peer[1] if peer else 0)
        if not isinstance(body.get("messages"), list):
            return error_response(400, "Missing required parameter: 'messages'.", param="messages")
        if not isinstance(body.get("model"), str):
            return error_response(400, "Missing required parameter: 'model'.", param="model")
        if (problem := image_problem(body)) is not None:
            return error_response(400, problem, param="messages")

        fault = self.next_fault()
        if fault is not None:
            answer = await fault_response(fault, request, self._park, self.latency, streaming=bool(body.get("stream")))
            if answer is not None:
                return answer

        if self._queue:
            turn = self._queue.popleft()
        else:
            try:
                result = self.responder(body)
                if inspect.isawaitable(result):
                    result = await result
            except Exception as exc:
                logger.exception("scripted model responder failed")
                return error_response(500, f"scripted responder failed: {exc!r}")
            turn = Turn(content=result) if isinstance(result, str) else result

        if not await self._park(self.latency if turn.latency is None else turn.latency):
            return drop(request)
        if body.get("stream"):
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            drop_after = fault.after_chunks if fault is not None else None
            return await self._stream(request, body, turn, include_usage, drop_after)
        return web.Response(body=self._completion(body, turn), content_type="application/json")

    # ---------------------------------------------------------------- payloads

    def _call_ids(self, turn: Turn) -> list[str]:
        return [c.id or f"call_{self._tag}{next(self._ids)}" for c in turn.tool_calls]

    @staticmethod
    def _usage(body: JSON, turn: Turn) -> dict[str, int]:
        if turn.usage is not None:
            return turn.usage
        prompt_chars = 0
        for message in body.get("messages") or ():
            if isinstance(message, dict):
                content = message.get("content")
                prompt_chars += len(content) if isinstance(content, str) else len(_text_of(content))
        completion_chars = len(turn.content or "") + sum(
            len(c.name) + len(c.arguments) for c in turn.tool_calls
        )
        prompt, completion = prompt_chars // 4, completion_chars // 4
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    @staticmethod
    def _finish_reason(turn: Turn) -> str:
        return turn.finish_reason or ("tool_calls" if turn.tool_calls else "stop")

    def _completion(self, body: JSON, turn: Turn) -> bytes:
        message: JSON = {"role": "assistant", "content": turn.content, "refusal": None}
        if turn.tool_calls:
            message["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c, cid in zip(turn.tool_calls, self._call_ids(turn), strict=True)
            ]
        payload = {
            "id": f"chatcmpl-{self._tag}{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "system_fingerprint": None,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": self._finish_reason(turn)}
            ],
            "usage": self._usage(body, turn),
        }
        return json.dumps(payload).encode()

    def _chunks(self, body: JSON, turn: Turn, include_usage: bool) -> list[bytes]:
        """SSE events for a turn, byte-for-byte in the shape OpenAI streams them."""
        dumps = json.dumps
        head = (
            f'{{"id":"chatcmpl-{self._tag}{next(self._ids)}","object":"chat.completion.chunk",'
            f'"created":{int(time.time())},"model":{dumps(body["model"])},"system_fingerprint":null,'
        )
        open_choice = "data: " + head + '"choices":[{"index":0,"delta":'
        usage_tail = ',"usage":null}\n\n' if include_usage else "}\n\n"
        mid = ',"logprobs":null,"finish_reason":null}]' + usage_tail
        size = turn.chunk_size or self.chunk_size
        out: list[str] = []

        first: JSON = {"role": "assistant", "content": "" if turn.content or not turn.tool_calls else None}
        if turn.content:
            out.append(open_choice + dumps(first) + mid)
            out.extend(open_choice + dumps({"content": piece}) + mid for piece in _split(turn.content, size))
            first = {}
        for index, (call, cid) in enumerate(zip(turn.tool_calls, self._call_ids(turn), strict=True)):
            header = {
                "index": index,
                "id": cid,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            out.append(open_choice + dumps({**first, "tool_calls": [header]}) + mid)
            first = {}
            if call.arguments:
                out.extend(
                    open_choice
                    + dumps({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                    + mid
                    for piece in _split(call.arguments, size)
                )
        if first:  # neither content nor tool calls: still announce the role
            out.append(open_choice + dumps(first) + mid)
        out.append(
            open_choice
            + '{},"logprobs":null,"finish_reason":'
            + dumps(self._finish_reason(turn))
            + "}]"
            + usage_tail
        )
        if include_usage:
            out.append("data: " + head + '"choices":[],"usage":' + dumps(self._usage(body, turn)) + "}\n\n")
        out.append("data: [DONE]\n\n")
        return [s.encode() for s in out]

    async def _stream(
        self,
        request: web.Request,
        body: JSON,
        turn: Turn,
        include_usage: bool,
        drop_after: int | None,
    ) -> web.StreamResponse:
        chunks = self._chunks(body, turn, include_usage)
        delay = self.chunk_delay if turn.chunk_delay is None else turn.chunk_delay
        resp = web.StreamResponse(headers={"Cache-Control": "no-cache"})
        resp.content_type = "text/event-stream"
        try:
            await resp.prepare(request)
            if delay <= 0 and drop_after is None:
                await resp.write(b"".join(chunks))  # one write: cheap for benchmarks, same bytes on the wire
            else:
                for i, chunk in enumerate(chunks):
                    if drop_after is not None and i >= drop_after:
                        # A client discards buffered bytes once it sees the connection error, so give it
                        # a moment to read the chunks already sent before closing.
                        await self._park(_DROP_GRACE)
                        return drop(request, resp)
                    if i and not await self._park(delay):
                        return drop(request, resp)
                    await resp.write(chunk)
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the client went away mid-stream
        return resp
