"""An agent worker process: runs agent loops (gateway/agent_loop.py) for the gateway over a socket.

Started by the gateway (gateway/agent_workers.py) as ``python -m gateway.agent_worker FD``, FD being its end of a
socket pair. The first frame is the model's settings; then ``run`` frames start loops, each loop asks the gateway
for its part of the run (``ask`` frames, answered by ``reply``) and ends with ``done``, ``model_error`` or
``failed``. Frames are a 4-byte length and a pickle: both ends are the gateway's own code, and the socket pair is
reachable from nothing else. The worker exits when the gateway's end closes (the gateway stopped or died).
"""

from __future__ import annotations

import asyncio
import gc
import os
import pickle
import signal
import socket
import struct
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any

import openai

from gateway.agent_loop import (
    Acted,
    LoopRequest,
    ModelCaller,
    TurnReport,
    build_client,
    load_sdk_modules,
    run_loop,
)
from gateway.config import ModelSettings
from gateway.model_errors import ModelError

_HEADER = struct.Struct("!I")
TEXT_EVERY = 0.02
"""Seconds between two texts of one streaming answer sent to the gateway (its preview edits far less often)."""
HEALTH_EVERY = 0.25
"""Seconds between two health reports (this process's event-loop lag)."""
_LAG_SAMPLE = 0.005


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """The first frame a worker reads: the model's settings and how many model calls it may have open at once."""

    model: ModelSettings
    max_connections: int


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next message (asyncio.IncompleteReadError at the end of the stream)."""
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    return pickle.loads(await reader.readexactly(size))


class FrameWriter:
    """Writes messages (plain data and the gateway's own dataclasses only) to the socket, those of one event-loop
    iteration together: a socket write is a system call, and under load a loop iteration has many frames."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._queued: list[bytes] = []

    def send(self, message: Any) -> None:
        """Queue one message; it is written at the end of this loop iteration."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if not self._queued:
            asyncio.get_running_loop().call_soon(self._flush)
        self._queued += (_HEADER.pack(len(data)), data)

    def _flush(self) -> None:
        queued, self._queued = self._queued, []
        if not self.writer.is_closing():
            self.writer.write(b"".join(queued))

    def close(self) -> None:
        """Close the connection (what is queued is dropped)."""
        self._queued.clear()
        self.writer.close()


class _RemoteSide:
    """``agent_loop.RunSide`` of a loop running here: the gateway's part, asked over the socket."""

    def __init__(self, worker: _Worker, rid: int) -> None:
        self.worker = worker
        self.rid = rid
        self._sent_at = 0.0
        self._latest: str | None = None
        self._flush: asyncio.TimerHandle | None = None

    async def prepare(self, convo: list[dict[str, Any]]) -> tuple[list[str], str | None]:
        return await self.worker.ask(self.rid, "prepare", convo)

    async def turn(self, report: TurnReport, calls: list[dict[str, Any]]) -> Acted:
        self._send_text()  # the answer's last text before its tool calls run
        if not calls:  # accounting only: no answer to wait for (frames are handled in order)
            self.worker.send(("note", self.rid, report))
            return Acted()
        return await self.worker.ask(self.rid, "turn", report, calls)

    async def approved(self, calls: list[dict[str, Any]]) -> Acted:
        return await self.worker.ask(self.rid, "approved", calls)

    async def text(self, text: str) -> None:
        self._latest = text
        wait = self._sent_at + TEXT_EVERY - time.monotonic()
        if wait <= 0:
            self._send_text()
        elif self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(wait, self._send_text)

    def _send_text(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if self._latest is not None:
            self.worker.send(("text", self.rid, self._latest))
            self._latest, self._sent_at = None, time.monotonic()

    def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()


class _Worker:
    """Serves the gateway's frames: starts and cancels loops, routes replies to the loops that asked."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, settings: ModelSettings,
                 client: openai.AsyncOpenAI) -> None:
        self.reader = reader
        self.frames = FrameWriter(writer)
        self.caller = ModelCaller(settings, client, lambda error: self.send(("model_error_seen", error)))
        self.runs: dict[int, asyncio.Task[None]] = {}
        self._asks: dict[int, asyncio.Future[Any]] = {}
        self._seq = 0
        self._lags: deque[float] = deque(maxlen=int(HEALTH_EVERY / _LAG_SAMPLE) + 1)

    def send(self, message: Any) -> None:
        self.frames.send(message)

    async def ask(self, rid: int, op: str, *args: Any) -> Any:
        self._seq += 1
        seq = self._seq
        future = self._asks[seq] = asyncio.get_running_loop().create_future()
        self.send(("ask", rid, seq, op, args))
        try:
            return await future
        finally:
            self._asks.pop(seq, None)

    async def serve(self) -> None:
        health = asyncio.create_task(self._health())
        try:
            while True:
                try:
                    message = await read_frame(self.reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the gateway closed its end
                kind = message[0]
                if kind == "run":
                    _, rid, req = message
                    self.runs[rid] = asyncio.create_task(self._run(rid, req))
                elif kind == "reply":
                    _, seq, value = message
                    future = self._asks.get(seq)
                    if future is not None and not future.done():
                        future.set_result(value)
                elif kind == "cancel" and (task := self.runs.get(message[1])) is not None:
                    task.cancel()
        finally:
            health.cancel()
            for task in self.runs.values():
                task.cancel()

    async def _run(self, rid: int, req: LoopRequest) -> None:
        side = _RemoteSide(self, rid)
        try:
            outcome = await run_loop(side, self.caller, req)
        except ModelError as exc:
            self.send(("model_error", rid, exc.user_message, str(exc)))
        except asyncio.CancelledError:
            pass  # the gateway cancelled it: it expects nothing more
        except Exception:
            self.send(("failed", rid, traceback.format_exc()))
        else:
            self.send(("done", rid, outcome))
        finally:
            side.close()
            self.runs.pop(rid, None)

    async def _health(self) -> None:
        """Sample this loop's lag and report its worst over each period with the number of loops running."""
        loop = asyncio.get_running_loop()
        reported = loop.time()
        while True:
            due = loop.time() + _LAG_SAMPLE
            await asyncio.sleep(_LAG_SAMPLE)
            self._lags.append(max(0.0, loop.time() - due))
            if loop.time() - reported >= HEALTH_EVERY:
                ordered = sorted(self._lags)
                self.send(("health", ordered[int(len(ordered) * 0.99)], len(self.runs)))
                self._lags.clear()
                reported = loop.time()


async def _main(fd: int) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=socket.socket(fileno=fd))
    settings: WorkerSettings = await read_frame(reader)
    client = build_client(settings.model, settings.max_connections)
    worker = _Worker(reader, writer, settings.model, client)
    await load_sdk_modules()
    gc.collect()
    gc.freeze()  # what is loaded now lives as long as the process: out of the full collections' scans
    worker.send(("ready", os.getpid()))
    try:
        await worker.serve()
    finally:
        await client.close()


def main() -> None:
    """Entry point of ``python -m gateway.agent_worker FD``."""
    # Ctrl-C on a terminal reaches the whole process group: the gateway stops its workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_main(int(sys.argv[1])))


if __name__ == "__main__":
    main()
