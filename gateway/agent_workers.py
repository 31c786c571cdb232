"""Agent worker processes: the agent loops of runs (model requests, stream parsing, tool orchestration) run in
``gateway.agent_workers`` processes (gateway/agent_worker.py), off the main process's event loop and its GIL.

The main process keeps everything else: a loop asks it for the run's part (``agent.GatewaySide``: steering,
hooks, budget, the approval gate, the tools, media) and its result comes back as a ``RunOutcome`` that the run
commits as before. A worker that dies takes its loops with it: each of their runs gets ``AgentWorkerLost``, which
the run executor treats as a crash of that run (started again from the beginning, delivered once), and the worker
is replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.agent import GatewaySide
from gateway.agent_loop import LoopRequest, RunOutcome
from gateway.agent_worker import FrameWriter, WorkerSettings, read_frame
from gateway.config import ModelSettings
from gateway.metrics import Metrics
from gateway.model_errors import ModelError

logger = logging.getLogger(__name__)

RESTART_DELAY = 0.1
"""Seconds before a worker that died is replaced; doubled (up to ``MAX_RESTART_DELAY``) while they die young."""
MAX_RESTART_DELAY = 5.0
_YOUNG = 10.0  # seconds: a worker dying sooner than this after its start counts towards the backoff
_STOP_TIMEOUT = 3.0
HANG_AFTER = 15.0
"""Seconds a ready worker may send nothing (it reports its health 4 times a second) before it is taken for hung,
killed and replaced."""
START_TIMEOUT = 60.0
"""Seconds a new worker has to become ready."""


class AgentWorkerLost(Exception):
    """The worker process running a run's loop died: for that run, a crash."""


@dataclass(slots=True)
class _Loop:
    """A loop running in a worker: the run's side in this process, and its outcome to come."""

    side: GatewaySide
    outcome: asyncio.Future[RunOutcome]
    answering: set[asyncio.Task[None]] = field(default_factory=set)


@dataclass(slots=True)
class _Process:
    """One started worker process and its connection."""

    proc: asyncio.subprocess.Process
    reader: asyncio.StreamReader
    frames: FrameWriter
    loops: dict[int, _Loop] = field(default_factory=dict)
    ready: bool = False
    lag: float = 0.0
    running: int = 0  # loops the worker says it runs (its last health report)
    started: float = field(default_factory=time.monotonic)
    heard: float = field(default_factory=time.monotonic)  # when its last frame came


class AgentWorkers:
    """A fixed number of agent worker processes, each kept alive; runs' loops go to the least busy one
    (``agent.LoopRunner``)."""

    def __init__(self, size: int, model: ModelSettings, max_connections: int, metrics: Metrics) -> None:
        self.size = size
        self.settings = WorkerSettings(model, max(1, max_connections // size))
        self.metrics = metrics
        self._slots: list[_Process | None] = [None] * size
        self._keepers: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()  # set whenever a worker becomes ready (or the pool stops)
        self._stopping = False
        self._ids = itertools.count(1)  # loop ids (a uuid would cost a getrandom system call per run)
        self.restarts = 0
        """Workers replaced after they died."""
        self.hang_after = HANG_AFTER
        """Seconds a ready worker may stay silent before it is killed as hung."""

    async def start(self) -> None:
        """Start the workers in the background (runs wait for the first to be ready)."""
        self._keepers = [asyncio.create_task(self._keep(i), name=f"agent-worker-{i}") for i in range(self.size)]

    async def stop(self) -> None:
        """Close every worker's connection (they exit), wait for them, kill those that do not."""
        self._stopping = True
        self._changed.set()
        for keeper in self._keepers:
            keeper.cancel()
        await asyncio.gather(*self._keepers, return_exceptions=True)

    async def wait_ready(self, timeout: float) -> None:
        """Wait until a worker is ready for loops (at most ``timeout`` seconds: a warning then)."""
        try:
            async with asyncio.timeout(timeout):
                await self._pick()
        except TimeoutError:
            logger.warning("no agent worker ready after %.0f s; runs wait for one", timeout)

    def pids(self) -> list[int]:
        """Process ids of the workers running now."""
        return [p.proc.pid for p in self._slots if p is not None and p.proc.returncode is None]

    def ready(self) -> int:
        """Workers ready for loops."""
        return sum(1 for p in self._slots if p is not None and p.ready)

    def status(self) -> dict[str, int]:
        """For /readyz: workers configured, ready, and replaced since start."""
        return {"configured": self.size, "ready": self.ready(), "restarts": self.restarts}

    def loops(self) -> int:
        """Loops this process waits for, and loops the workers last said they run (the larger of each)."""
        return sum(max(len(p.loops), p.running) for p in self._slots if p is not None)

    def worst_lag(self) -> float | None:
        """The largest event-loop lag (seconds, p99 of its last report) among the workers; None without any."""
        lags = [p.lag for p in self._slots if p is not None and p.ready]
        return max(lags) if lags else None

    async def run(self, side: GatewaySide, req: LoopRequest) -> RunOutcome:
        """Run one loop in the least busy worker, answering its questions with ``side``."""
        proc = await self._pick()
        lid = next(self._ids)
        loop = _Loop(side, asyncio.get_running_loop().create_future())
        proc.loops[lid] = loop
        try:
            proc.frames.send(("run", lid, req))
            return await loop.outcome
        except asyncio.CancelledError:
            if proc.ready:
                proc.frames.send(("cancel", lid))
            raise
        finally:
            proc.loops.pop(lid, None)
            for task in loop.answering:
                task.cancel()

    async def _pick(self) -> _Process:
        while True:
            if self._stopping:
                raise RuntimeError("the agent workers are stopping")
            ready = [p for p in self._slots if p is not None and p.ready]
            if ready:
                return min(ready, key=lambda p: len(p.loops))
            self._changed.clear()
            await self._changed.wait()

    async def _keep(self, slot: int) -> None:
        """Keep a worker running in ``slot``: start it, serve it, replace it when it dies."""
        delay = RESTART_DELAY
        while True:
            proc = await self._spawn()
            self._slots[slot] = proc
            watch = asyncio.create_task(self._watch(proc))
            try:
                await self._serve(proc)
            finally:
                watch.cancel()
                self._slots[slot] = None
                await self._end(proc)
            if self._stopping:
                return
            self.restarts += 1
            self.metrics.agent_worker_restarts.inc()
            delay = min(delay * 2, MAX_RESTART_DELAY) if time.monotonic() - proc.started < _YOUNG else RESTART_DELAY
            logger.error("agent worker %s (pid %s) exited with %s; %d loop(s) lost, replacing it in %.1f s",
                         slot, proc.proc.pid, proc.proc.returncode, len(proc.loops), delay)
            await asyncio.sleep(delay)

    async def _spawn(self) -> _Process:
        ours, theirs = socket.socketpair()
        try:
            child = await asyncio.create_subprocess_exec(sys.executable, "-m", "gateway.agent_worker",
                                                         str(theirs.fileno()), pass_fds=(theirs.fileno(),),
                                                         stdin=asyncio.subprocess.DEVNULL)
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        frames = FrameWriter(writer)
        frames.send(self.settings)
        return _Process(child, reader, frames)

    async def _serve(self, proc: _Process) -> None:
        """Handle a worker's frames until its connection ends."""
        while True:
            try:
                message = await read_frame(proc.reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            proc.heard = time.monotonic()
            kind = message[0]
            if kind == "ask":
                _, lid, seq, op, args = message
                if (loop := proc.loops.get(lid)) is not None:
                    task = asyncio.create_task(self._answer(proc, loop, lid, seq, op, args))
                    loop.answering.add(task)
                    task.add_done_callback(loop.answering.discard)
            elif kind == "note":
                if (loop := proc.loops.get(message[1])) is not None:
                    loop.side.account(message[2])
            elif kind == "text":
                if (loop := proc.loops.get(message[1])) is not None:
                    await loop.side.text(message[2])
            elif kind in ("done", "model_error", "failed"):
                if (loop := proc.loops.get(message[1])) is not None and not loop.outcome.done():
                    loop.outcome.set_result(message[2]) if kind == "done" else \
                        loop.outcome.set_exception(_failure(kind, message))
            elif kind == "health":
                proc.lag, proc.running = message[1], message[2]
            elif kind == "model_error_seen":
                self.metrics.model_errors.labels(message[1]).inc()
            elif kind == "ready":
                proc.ready = True
                self.metrics.agent_workers.set(self.ready())
                self._changed.set()

    async def _watch(self, proc: _Process) -> None:
        """Kill the worker once it has sent nothing for too long (hung); its connection then ends. (One timer per
        worker: a timeout around each frame's read cost ten times the read.)"""
        while True:
            limit = self.hang_after if proc.ready else START_TIMEOUT
            silent = time.monotonic() - proc.heard
            if silent >= limit:
                logger.error("agent worker pid %s sent nothing for %.0f s: killing it", proc.proc.pid, silent)
                with contextlib.suppress(ProcessLookupError):
                    proc.proc.kill()
                return
            await asyncio.sleep(min(limit - silent, 1.0))

    async def _answer(self, proc: _Process, loop: _Loop, lid: int, seq: int, op: str, args: tuple[Any, ...]) -> None:
        """Answer one question of a loop; when the gateway's part fails, the run fails with that error here."""
        try:
            value = await getattr(loop.side, op)(*args)
        except Exception as exc:
            if not loop.outcome.done():
                loop.outcome.set_exception(exc)
            proc.frames.send(("cancel", lid))
            return
        proc.frames.send(("reply", seq, value))

    async def _end(self, proc: _Process) -> None:
        """After a worker's connection ended: its loops are lost; the process is gone (or killed)."""
        proc.ready = False
        self.metrics.agent_workers.set(self.ready())
        for lid, loop in list(proc.loops.items()):
            if not loop.outcome.done():
                loop.outcome.set_exception(AgentWorkerLost(f"agent worker {proc.proc.pid} died running loop {lid}"))
        proc.frames.close()
        try:
            await asyncio.wait_for(proc.proc.wait(), _STOP_TIMEOUT)
        except (TimeoutError, asyncio.CancelledError):
            with contextlib.suppress(ProcessLookupError):
                proc.proc.kill()
            await proc.proc.wait()


def _failure(kind: str, message: tuple[Any, ...]) -> Exception:
    """The exception a loop ended by (a model error as the agent raises it in this process)."""
    if kind == "model_error":
        return ModelError(message[2], message[3])
    trace = message[2]
    logger.error("agent loop failed in its worker:\n%s", trace)
    return RuntimeError(f"the agent worker failed: {trace.strip().splitlines()[-1]}")
