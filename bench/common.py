"""Shared benchmark harness: service subprocesses, simulators, load generators, CPU and RSS probes,
percentiles, tables and JSON results.

Every number that compares implementations is CPU time per unit of work of the process under test
(user + system from ``/proc/<pid>/stat``): on a shared 2-core machine it is far steadier than wall time.
All traffic stays on 127.0.0.1; every loop here is bounded in count and in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import platform
import re
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import aiohttp
import asyncpg
import yaml
from aiohttp import web

from gateway.sim.callback_sink import CallbackSink
from gateway.sim.discord_api import DiscordSimulator, RestCall
from gateway.sim.model_server import Turn, text, tool_call
from gateway.sim.slack_api import ApiCall, SlackSimulator
from gateway.sim.telegram_api import Call, TelegramSimulator
from platforms.base import AdapterState, BasePlatformAdapter, MessageEvent, OnMessage, SendResult
from platforms.webhook_signatures import sign

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
WEBHOOK_SECRET = "bench-webhook-secret-0123456789abcdef"
SINK_SECRET = "bench-sink-secret-0123456789abcdef"
API_TOKEN = "bench-api-token"
MODEL_KEY = "bench-model-key"
BENCH_FILE = "bench.txt"
BENCH_TOOL = "read_file"
BENCH_TOOLSET = "file"
ROUTE = "bench"
WEBHOOK_PROMPT = "Push to {payload.repository.full_name}: {payload.head_commit.message}. Summarise it."

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_READY = re.compile(rb"listening on http://[^\s:/]+:(\d+)")

T = TypeVar("T")


# -- probes ------------------------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by every thread of process ``pid``."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    fields = data[data.rindex(b")") + 2:].split()  # the command name may contain spaces
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def rss_mb(pid: int) -> float:
    """Resident set size of process ``pid`` in MiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def machine_info() -> dict[str, Any]:
    """Where and when the figures were taken."""
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count(), "cpu_model": model,
            "python": platform.python_version(), "platform": platform.platform()}


# -- statistics and output ----------------------------------------------------------------------------

def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0-100) with linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / max in milliseconds, and the sample count (NaN samples are dropped)."""
    seconds = [s for s in seconds if s == s]
    return {"n": len(seconds), "p50_ms": percentile(seconds, 50) * 1000, "p99_ms": percentile(seconds, 99) * 1000,
            "max_ms": max(seconds) * 1000 if seconds else float("nan")}


def ratio(ours: float, floor: float) -> str:
    """``ours / floor`` as ``1.23x`` (or ``-`` when undefined)."""
    return f"{ours / floor:.2f}x" if floor and floor == floor and ours == ours else "-"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value != value:
            return "-"
        magnitude = abs(value)
        return f"{value:.0f}" if magnitude >= 100 else f"{value:.1f}" if magnitude >= 10 else f"{value:.2f}"
    return str(value)


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain-text table (floats shown with 2-3 significant figures)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))))


def save_results(name: str, data: Mapping[str, Any]) -> Path:
    """Write ``bench/results/<name>.json`` with the machine and command line; returns the path."""
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {"benchmark": name, "machine": machine_info(), "command": " ".join([Path(sys.argv[0]).name,
                                                                                  *sys.argv[1:]]), **data}
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"\nresults written to {path.relative_to(ROOT)}")
    return path


# -- PostgreSQL ---------------------------------------------------------------------------------------

@asynccontextmanager
async def scratch_database(admin_url: str, prefix: str) -> AsyncIterator[str]:
    """A new, empty database on the server of ``admin_url`` (whose user may create databases), dropped
    afterwards; yields its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield admin_url.rsplit("/", 1)[0] + "/" + name
    finally:
        admin = await asyncpg.connect(admin_url)
        try:
            await _drop_database(admin, name)
        finally:
            await admin.close()


async def _drop_database(admin: asyncpg.Connection, name: str, tries: int = 50) -> None:
    """DROP ... WITH (FORCE). It cannot end an autovacuum worker busy in the new database (a superuser's backend:
    InsufficientPrivilegeError); such a worker is done within moments, so the drop is tried again."""
    for attempt in range(tries):
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except asyncpg.exceptions.InsufficientPrivilegeError:
            if attempt == tries - 1:
                raise
            await asyncio.sleep(0.1)


# -- subprocesses -------------------------------------------------------------------------------------

class ServiceProcess:
    """A server subprocess (the gateway or a floor relay) that prints ``listening on http://HOST:PORT``."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env or {})
        self.port = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        """The process id (after ``start``)."""
        assert self._proc is not None
        return self._proc.pid

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        """CPU seconds the process used so far."""
        return cpu_seconds(self.pid)

    def rss_mb(self) -> float:
        """The process's resident memory in MiB."""
        return rss_mb(self.pid)

    async def start(self, timeout: float = 30.0) -> int:
        """Start it and wait for its ``listening`` line; returns the port."""
        with open(self.log_path, "wb") as log:  # the child keeps its own descriptor
            self._proc = await asyncio.create_subprocess_exec(
                *self.argv, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env})
        assert self._proc.stdout is not None
        try:
            async with asyncio.timeout(timeout):
                while not self.port:
                    line = await self._proc.stdout.readline()
                    if not line:
                        raise RuntimeError(f"{self.name} exited before listening:\n{self.log_tail()}")
                    if match := _READY.search(line):
                        self.port = int(match.group(1))
        except BaseException:
            await self.stop()
            raise
        self._drain = asyncio.create_task(self._drain_stdout())
        return self.port

    async def _drain_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        while await self._proc.stdout.readline():
            pass

    async def gauge(self, session: aiohttp.ClientSession, name: str, labels: str = "") -> float:
        """One sample of a Prometheus metric from the gateway's ``/metrics`` (0 when absent)."""
        async with session.get(self.base_url + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as resp:
            body = await resp.text()
        prefix = f"{name}{{{labels}}} " if labels else f"{name} "
        return next((float(line[len(prefix):]) for line in body.splitlines() if line.startswith(prefix)), 0.0)

    async def wait_ready(self, session: aiohttp.ClientSession, timeout: float = 30.0) -> None:
        """Wait until ``/readyz`` answers 200 (the store and every platform adapter connected)."""
        async with asyncio.timeout(timeout):
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(self.base_url + "/readyz",
                                           timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        if resp.status == 200:
                            return
                await asyncio.sleep(0.05)

    def log_problems(self, limit: int = 5) -> list[str]:
        """Distinct WARNING/ERROR log lines of the process (timestamps dropped), with their counts."""
        counts: dict[str, int] = {}
        with contextlib.suppress(OSError), open(self.log_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                level = next((lv for lv in (" WARNING ", " ERROR ", " CRITICAL ") if lv in line), None)
                if level is not None:
                    key = re.sub(r"\d+", "N", line[line.index(level) + 1:].strip())[:160]
                    counts[key] = counts.get(key, 0) + 1
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])
        return [f"{n}x {msg}" for msg, n in ranked[:limit]]

    def log_tail(self, lines: int = 30) -> str:
        """The end of the process's stderr (for error messages)."""
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    async def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (graceful drain), SIGKILL after ``timeout``; returns the exit code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                proc.kill()
                await asyncio.wait_for(proc.wait(), 10)
        if self._drain is not None:
            self._drain.cancel()
            await asyncio.gather(self._drain, return_exceptions=True)
        return proc.returncode


def gateway_argv(config: Path, profiler: str | None = None, profile_to: Path | None = None) -> list[str]:
    """``python -m gateway run --config ...``, optionally under a profiler that writes ``profile_to`` at exit:
    ``pyinstrument`` (a pyisession file) or ``cprofile`` (a pstats file)."""
    run = ["-m", "gateway", "run", "--config", str(config), "--log-level", "WARNING"]
    if profiler is None:
        return [sys.executable, *run]
    assert profile_to is not None
    if profiler == "pyinstrument":
        return [sys.executable, "-m", "pyinstrument", "-i", "0.002", "-r", "pyisession", "-o", str(profile_to), *run]
    if profiler == "cprofile":
        return [sys.executable, "-m", "cProfile", "-o", str(profile_to), *run]
    raise ValueError(f"unknown profiler {profiler!r}")


def webhook_platform(deliver_to: str) -> dict[str, Any]:
    """``platforms.webhook`` with the benchmark route (GitHub scheme, toolset ``file``, limits raised)."""
    return {"allowed_toolsets": ["hermes-webhook", BENCH_TOOLSET], "routes": {ROUTE: {
        "secret": WEBHOOK_SECRET, "scheme": "github", "prompt": WEBHOOK_PROMPT, "toolset": BENCH_TOOLSET,
        "deliver_to": deliver_to, "rate_limit_per_minute": 10_000_000, "max_concurrency": 512}}}


def write_gateway_config(home: Path, model_url: str, sink_url: str, *, stream: bool = True,
                         telegram: TelegramSimulator | None = None, chats: Sequence[SimulatedChat] = (),
                         overrides: Mapping[str, Any] | None = None) -> Path:
    """A gateway config for the subprocess benchmarks (route ``bench`` delivering to ``callback:sink``).

    Limits that would throttle a benchmark (route rate limit and concurrency) are raised; the rest is
    the default configuration. The route's toolset is ``file`` so the model's one tool call
    (``read_file`` of a small workspace file) is real but cheap. With ``telegram``, the Telegram
    adapter polls that simulator; each of ``chats`` adds its platform the same way. Every user of a chat
    platform configured here is allowed.
    """
    workspace = home / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / BENCH_FILE).write_text("build 42: all 118 tests passed\n", encoding="utf-8")
    cfg: dict[str, Any] = {
        "model": {"base_url": model_url, "api_key": MODEL_KEY, "name": "scripted-model", "max_retries": 0,
                  "stream": stream},
        "http": {"host": "127.0.0.1", "port": 0, "api_token": API_TOKEN},
        "store": {"url": f"sqlite:///{home}/state.db"},
        "gateway": {"workspace": str(workspace), "max_concurrent_webhook_runs": 512, "max_concurrent_runs": 512,
                    "loop_lag_warn_ms": 2000},
        "logging": {"level": "WARNING"},
        "platforms": {
            "webhook": webhook_platform("callback:sink"),
            "callback": {"targets": {"sink": {"url": sink_url, "secret": SINK_SECRET}}},
        },
    }
    sections = {chat.platform: chat.platform_config(home) for chat in chats}
    if telegram is not None:
        sections["telegram"] = telegram_platform(telegram)
    if sections:
        cfg["platforms"].update(sections)
        cfg["auth"] = {"platforms": {name: {"allow_all": True} for name in sections}}
    cfg = _merged(cfg, overrides or {})
    path = home / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def _merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra``'s keys, mappings merged key by key at every depth."""
    out = dict(base)
    for key, value in extra.items():
        old = out.get(key)
        out[key] = _merged(old, value) if isinstance(value, Mapping) and isinstance(old, Mapping) else value
    return out


# -- simulators ---------------------------------------------------------------------------------------

def webhook_responder(request: Mapping[str, Any]) -> Turn:
    """The scripted model of the webhook benchmarks: one ``read_file`` call, then a short answer."""
    messages = request.get("messages") or []
    last = messages[-1] if messages else {}
    if isinstance(last, dict) and last.get("role") == "tool":
        return text("Done: " + str(last.get("content"))[:80])
    return tool_call(BENCH_TOOL, {"path": BENCH_FILE})


class BenchSink(CallbackSink):
    """The callback sink, also timestamping each delivery by run id so a load generator can await a run."""

    def __init__(self) -> None:
        super().__init__("/results")
        self.arrivals: dict[str, float] = {}
        self.bodies: dict[str, dict[str, Any]] = {}
        self._waiters: dict[str, asyncio.Future[float]] = {}

    async def _results(self, request: web.Request) -> web.Response:
        response = await super()._results(request)
        if response.status == 200:
            body = self.received[-1]
            run_id = str(body.get("run_id"))
            now = time.perf_counter()
            self.arrivals[run_id] = now
            self.bodies[run_id] = body
            waiter = self._waiters.pop(run_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(now)
        return response

    async def arrival(self, run_id: str, timeout: float) -> float:
        """``perf_counter`` time at which the run's answer arrived (waits up to ``timeout``)."""
        if run_id in self.arrivals:
            return self.arrivals[run_id]
        waiter = self._waiters[run_id] = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.wait_for(waiter, timeout)
        finally:
            self._waiters.pop(run_id, None)

    def reset(self) -> None:
        """Forget what was received (between phases; keeps long runs flat)."""
        self.received.clear()
        self.attempts.clear()
        self.arrivals.clear()
        self.bodies.clear()


# -- load -----------------------------------------------------------------------------------------------

@dataclass(slots=True)
class WebhookRun:
    """One benchmark webhook: when it was sent, acknowledged and answered."""

    status: int
    run_id: str
    sent_at: float
    acked_at: float
    answered_at: float = float("nan")

    @property
    def ack_seconds(self) -> float:
        """Request sent to response read."""
        return self.acked_at - self.sent_at

    @property
    def e2e_seconds(self) -> float:
        """Request sent to answer delivered to the sink."""
        return self.answered_at - self.sent_at


class WebhookClient:
    """Posts signed (GitHub scheme) benchmark webhooks and waits for their answers at the sink."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, sink: BenchSink | None = None,
                 timeout: float = 60.0) -> None:
        self.session = session
        self.url = f"{base_url}/webhooks/{ROUTE}"
        self.sink = sink
        self.timeout = timeout

    async def post(self) -> WebhookRun:
        """Send one webhook; returns once it is acknowledged."""
        delivery = uuid.uuid4().hex
        body = json.dumps({"repository": {"full_name": "acme/rocket"},
                           "head_commit": {"id": delivery, "message": "fix the countdown"}}).encode()
        headers = {"Content-Type": "application/json", "X-GitHub-Event": "push",
                   **sign("github", WEBHOOK_SECRET, body, delivery_id=delivery)}
        sent = time.perf_counter()
        async with self.session.post(self.url, data=body, headers=headers,
                                     timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
            data = await resp.json(content_type=None)
        acked = time.perf_counter()
        if resp.status != 202:
            raise RuntimeError(f"webhook answered {resp.status}: {data}")
        return WebhookRun(resp.status, str(data["run_id"]), sent, acked)

    async def run(self) -> WebhookRun:
        """Send one webhook and wait for its answer at the sink."""
        assert self.sink is not None, "run() needs the sink the route delivers to"
        run = await self.post()
        run.answered_at = await self.sink.arrival(run.run_id, self.timeout)
        return run


@dataclass(slots=True)
class LoadResult(Generic[T]):
    """What a load generator saw."""

    results: list[T] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    offered_rate: float = 0.0

    @property
    def rate(self) -> float:
        """Completed operations per second."""
        return len(self.results) / self.elapsed if self.elapsed else 0.0


async def closed_loop(one: Callable[[], Awaitable[T]], concurrency: int, duration: float,
                      max_count: int | None = None) -> LoadResult[T]:
    """``concurrency`` workers each running ``one`` back to back until ``duration`` (or ``max_count`` calls).

    ``one`` must bound its own wait; the tail (calls started before the deadline) is included.
    """
    out: LoadResult[T] = LoadResult()
    started = time.perf_counter()
    deadline = started + duration
    issued = 0

    async def worker() -> None:
        nonlocal issued
        while time.perf_counter() < deadline and (max_count is None or issued < max_count):
            issued += 1
            try:
                out.results.append(await one())
            except Exception as exc:
                out.errors.append(f"{type(exc).__name__}: {exc}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    out.elapsed = time.perf_counter() - started
    return out


async def open_loop(one: Callable[[], Awaitable[T]], rate: float, duration: float) -> LoadResult[T]:
    """Start ``one`` at ``rate`` per second (evenly spaced) for ``duration`` seconds, whatever the answers take."""
    out: LoadResult[T] = LoadResult()
    count = max(1, int(rate * duration))
    started = time.perf_counter()
    tasks: list[asyncio.Task[T]] = []
    for i in range(count):
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    out.offered_rate = count / max(1e-9, time.perf_counter() - started)
    for outcome in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(outcome, BaseException):
            out.errors.append(f"{type(outcome).__name__}: {outcome}")
        else:
            out.results.append(outcome)
    out.elapsed = time.perf_counter() - started
    return out


class LagProbe:
    """Samples the running loop's lag: how late a ``interval`` sleep wakes up (a ticker task)."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.samples: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start sampling on the current loop."""
        self.samples.clear()
        self._task = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.interval)
            self.samples.append(max(0.0, time.perf_counter() - before - self.interval))

    async def stop(self) -> list[float]:
        """Stop sampling; returns the lags in seconds."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        return list(self.samples)


# -- in-process chat platform --------------------------------------------------------------------------

class ChatDouble(BasePlatformAdapter):
    """An in-process chat platform named ``telegram`` (a Telegram-like double: 4096 chars, editable).

    Benchmarks inject user messages with :meth:`say` and await the answer: the first outbox delivery
    (send or edit carrying a ``delivery_id``) to that chat. One pending message per chat.
    """

    name = "telegram"
    max_message_length = 4096
    can_edit = True

    def __init__(self) -> None:
        super().__init__()
        self.bot_username = "hermes_bench_bot"
        self._on_message: OnMessage | None = None
        self._ids = 0
        self._answers: dict[str, asyncio.Future[float]] = {}
        self.deliveries = 0

    async def connect(self, on_message: OnMessage, *, receive: bool = True) -> None:
        """Start accepting injected messages."""
        self._on_message = on_message
        self._set_state(AdapterState.CONNECTED)

    async def disconnect(self) -> None:
        """Stop accepting."""
        self._on_message = None
        self._set_state(AdapterState.DISCONNECTED)

    def _answered(self, chat_id: str, metadata: Mapping[str, str] | None) -> None:
        if metadata and metadata.get("delivery_id"):
            self.deliveries += 1
            waiter = self._answers.pop(chat_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(time.perf_counter())

    async def send(self, chat_id: str, content: str, reply_to: str | None = None,
                   metadata: Mapping[str, str] | None = None) -> SendResult:
        """Record an answer (or a streamed preview)."""
        self._ids += 1
        self._answered(chat_id, metadata)
        return SendResult(success=True, message_id=str(self._ids))

    async def edit_message(self, chat_id: str, message_id: str, content: str,
                           metadata: Mapping[str, str] | None = None) -> SendResult:
        """Record an edit (the final answer replaces the streamed preview)."""
        self._answered(chat_id, metadata)
        return SendResult(success=True, message_id=message_id)

    async def send_typing(self, chat_id: str, metadata: Mapping[str, str] | None = None) -> None:
        """Typing indicators cost nothing here."""

    async def say(self, user: int, text_: str, timeout: float = 60.0) -> tuple[float, float, float]:
        """User ``user`` sends ``text_`` in a DM; returns (sent, accepted, answered) ``perf_counter`` times."""
        assert self._on_message is not None, "not connected"
        chat_id = str(user)
        waiter = self._answers[chat_id] = asyncio.get_running_loop().create_future()
        event = MessageEvent(platform=self.name, event_id=uuid.uuid4().hex, chat_id=chat_id, chat_type="dm",
                             user_id=chat_id, user_name=f"user{user}", text=text_, message_id=uuid.uuid4().hex[:8])
        sent = time.perf_counter()
        try:
            if await self._on_message(event) is None:
                raise RuntimeError(f"message of user {user} was refused")
            accepted = time.perf_counter()
            answered = await asyncio.wait_for(waiter, timeout)
        finally:
            self._answers.pop(chat_id, None)
        return sent, accepted, answered


# -- chat platform simulators --------------------------------------------------------------------------

TELEGRAM_TOKEN = "123456:BENCH-token-0123456789abcdefghijklmnopq"
_PREVIEW_CURSOR = "▍"
# Discord users of the benchmark: ids clear of the simulator's own users, bot, guild and channels.
_DISCORD_USER_BASE = 4_000_000_000


class SimulatedChat(Protocol):
    """A platform simulator a chat benchmark drives: users write in their own DM and await the bot's answer."""

    platform: str

    async def start(self) -> None:
        """Serve on an ephemeral port."""

    async def stop(self) -> None:
        """Stop serving."""

    async def say(self, user: int, text_: str, timeout: float = 60.0) -> tuple[float, float, float]:
        """User ``user`` writes ``text_``; returns (sent, accepted or NaN, answered) ``perf_counter`` times."""
        ...

    def platform_config(self, home: Path) -> dict[str, Any]:
        """The ``platforms.<platform>`` section pointing the gateway's adapter at this simulator."""
        ...


class _FinalAnswers:
    """Per-chat waiters, resolved when the bot's final answer lands in the chat: a post or an edit whose
    text is not a streaming preview (which ends with the cursor). One pending message per chat."""

    def __init__(self) -> None:
        self._waiters: dict[str, asyncio.Future[float]] = {}

    def seen(self, chat: object, text_: str) -> None:
        """The bot posted or edited ``text_`` in ``chat``."""
        if text_ and not text_.rstrip().endswith(_PREVIEW_CURSOR):
            waiter = self._waiters.pop(str(chat), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(time.perf_counter())

    async def say(self, chat: object, send: Callable[[], object], timeout: float) -> tuple[float, float]:
        """Call ``send`` (a user's message to ``chat``; awaited if it returns an awaitable) and wait for the
        final answer; returns (sent, answered) ``perf_counter`` times."""
        key = str(chat)
        waiter = self._waiters[key] = asyncio.get_running_loop().create_future()
        sent = time.perf_counter()
        try:
            if inspect.isawaitable(outcome := send()):
                await outcome
            return sent, await asyncio.wait_for(waiter, timeout)
        finally:
            self._waiters.pop(key, None)


class BenchTelegram(TelegramSimulator):
    """The Telegram Bot API simulator, also resolving a per-chat waiter when the bot's final answer lands."""

    platform = "telegram"

    def __init__(self) -> None:
        super().__init__(token=TELEGRAM_TOKEN, bot_username="hermes_bench_bot")
        self._answers = _FinalAnswers()

    async def _send_message(self, call: Call) -> Any:
        result = await super()._send_message(call)
        self._answers.seen(call.params.get("chat_id"), str(call.params.get("text") or ""))
        return result

    async def _edit_message_text(self, call: Call) -> Any:
        result = await super()._edit_message_text(call)
        self._answers.seen(call.params.get("chat_id"), str(call.params.get("text") or ""))
        return result

    async def say(self, user: int, text_: str, timeout: float = 60.0) -> tuple[float, float, float]:
        """User ``user`` writes in their DM; returns (sent, NaN, answered) ``perf_counter`` times (the
        acknowledgement to Telegram, a later ``getUpdates`` offset, is not observed per message)."""
        sent, answered = await self._answers.say(user, lambda: self.user_sends(
            text_, user_id=user, first_name=f"user{user}", username=f"user{user}"), timeout)
        return sent, float("nan"), answered

    def platform_config(self, home: Path) -> dict[str, Any]:
        """``platforms.telegram`` polling this simulator."""
        return telegram_platform(self)

    def forget(self) -> None:
        """Drop the call logs recorded so far (keeps long runs flat; chats and messages stay)."""
        for log in (self._calls, self._sent, self._edits, self._chat_actions, self._updates):
            log.clear()


def telegram_platform(sim: TelegramSimulator) -> dict[str, Any]:
    """``platforms.telegram`` polling the simulator, PTB's rate limiter off (the simulator has no limits)."""
    return {"enabled": True, "token": TELEGRAM_TOKEN, "base_url": sim.base_url, "base_file_url": sim.base_file_url,
            "mode": "polling", "poll_timeout": 10, "rate_limit": {"overall_per_second": 0, "group_per_minute": 0}}


class BenchSlack(SlackSimulator):
    """The Slack simulator (Socket Mode; the bot's own posts echoed back as events, as Slack does), also
    resolving a per-DM waiter when the bot's final answer is posted or edited in."""

    platform = "slack"

    def __init__(self) -> None:
        super().__init__()
        self._answers = _FinalAnswers()

    def _post_message(self, call: ApiCall) -> dict[str, Any]:
        result = super()._post_message(call)
        self._answers.seen(call.params.get("channel"), str(call.params.get("text") or ""))
        return result

    def _update_message(self, call: ApiCall) -> dict[str, Any]:
        result = super()._update_message(call)
        self._answers.seen(call.params.get("channel"), str(call.params.get("text") or ""))
        return result

    async def say(self, user: int, text_: str, timeout: float = 60.0) -> tuple[float, float, float]:
        """User ``U<user>`` writes in their DM; returns (sent, NaN, answered) ``perf_counter`` times (the
        Socket Mode ack is not observed per message)."""
        member = f"U{user:07d}"
        sent, answered = await self._answers.say(self.dm_channel(member),
                                                 lambda: self.user_sends_dm(text_, user=member), timeout)
        return sent, float("nan"), answered

    def platform_config(self, home: Path) -> dict[str, Any]:
        """``platforms.slack`` in Socket Mode against this simulator."""
        return {"enabled": True, "bot_token": self.bot_token, "app_token": self.app_token,
                "signing_secret": self.signing_secret, "api_base_url": self.base_url}


class BenchDiscord(DiscordSimulator):
    """The Discord simulator with as many users as the benchmark needs, also resolving a per-DM waiter when
    the bot's final answer is created or edited in."""

    platform = "discord"

    def __init__(self) -> None:
        super().__init__()
        self._answers = _FinalAnswers()

    async def _rest_create_message(self, call: RestCall, channel_id: int) -> tuple[int, Any]:
        status, message = await super()._rest_create_message(call, channel_id)
        self._answers.seen(channel_id, str(message.get("content") or ""))
        return status, message

    async def _rest_edit_message(self, call: RestCall, channel_id: int, message_id: int) -> tuple[int, Any]:
        status, message = await super()._rest_edit_message(call, channel_id, message_id)
        self._answers.seen(channel_id, str(message.get("content") or ""))
        return status, message

    async def say(self, user: int, text_: str, timeout: float = 60.0) -> tuple[float, float, float]:
        """User ``user`` writes in their DM; returns (sent, NaN, answered) ``perf_counter`` times (gateway
        events have no acknowledgement)."""
        user_id = _DISCORD_USER_BASE + user
        self.add_user(user_id, f"user{user}")
        sent, answered = await self._answers.say(self.dm_channel_id(user_id),
                                                 lambda: self.user_sends_dm(text_, user_id=user_id), timeout)
        return sent, float("nan"), answered

    def platform_config(self, home: Path) -> dict[str, Any]:
        """``platforms.discord`` on this simulator's REST API and gateway, its state file in ``home``."""
        return {"enabled": True, "token": self.token, "api_base_url": self.api_base_url,
                "gateway_url": self.gateway_url, "guild_ready_timeout": 0.05, "reconnect_backoff": 0.05,
                "state_file": str(home / "discord-state.json")}
