"""Runs one model-written Python script as a child process with its own limits, answering its tool calls.

The script runs in a fresh interpreter in its own session (so a deadline kills its whole process group), under an
address-space limit set before its first line runs, with an environment built from an allowlist. Its stdout and
stderr are captured and capped. The tools it calls reach ``on_call`` over a socket pair: 4-byte big-endian length,
then UTF-8 JSON, ``{"tool", "args"}`` one way and ``{"result"}`` the other (the client is
``tools.code_execution_tool.client_module``).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_FRAME_BYTES = 16 * 1024 * 1024
STDOUT_HEAD_BYTES = 20_000
STDOUT_TAIL_BYTES = 20_000
STDERR_TAIL_BYTES = 10_000
TOOLS_FD_ENV = "HERMES_TOOLS_FD"

_MB = 1024 * 1024
_POLL_SECONDS = 0.1  # how often a running script checks its deadline, whether it exited and the run's cancel event
_DRAIN_SECONDS = 1.0  # how long to collect what an ended script had already written
_READ_CHUNK = 65536
_ENV_PASSED = frozenset({"PATH", "HOME", "TMPDIR", "LANG", "LANGUAGE", "TZ"})
# Sets the limit, then execs the script's interpreter: the limit holds from its first line, and no preexec_fn
# (unsafe in a threaded parent) is needed. -E -s: no PYTHON* variables, no user site; the script's directory (with
# the generated module) is sys.path[0].
_BOOTSTRAP = (
    "import os, resource, sys\n"
    "limit = int(sys.argv[1])\n"
    "resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
    "os.execv(sys.executable, [sys.executable, '-E', '-s', '-B', sys.argv[2]])\n"
)

OnCall = Callable[[str, dict[str, Any]], str]


@dataclass(frozen=True, slots=True)
class ScriptRun:
    """How a script ended: ``returncode`` as ``subprocess`` reports it (negative: killed by that signal), None
    when it was killed at its deadline (``timed_out``) or because its run was stopped (``cancelled``)."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    cancelled: bool = False


class _Capped:
    """The first ``head`` and the last ``tail`` bytes of a stream, and how many fell in between."""

    __slots__ = ("_head", "_head_cap", "_tail", "_tail_cap", "_total")

    def __init__(self, head: int, tail: int) -> None:
        self._head, self._tail = bytearray(), bytearray()
        self._head_cap, self._tail_cap = head, tail
        self._total = 0

    def add(self, chunk: bytes) -> None:
        self._total += len(chunk)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        self._tail += chunk
        if len(self._tail) > 2 * self._tail_cap:  # trimmed in batches, not on every chunk
            del self._tail[:-self._tail_cap]

    def text(self) -> str:
        tail = self._tail[-self._tail_cap:] if self._tail_cap else b""
        omitted = self._total - len(self._head) - len(tail)
        marker = f"\n[... {omitted} bytes omitted ...]\n" if omitted else ""
        return self._head.decode("utf-8", "replace") + marker + bytes(tail).decode("utf-8", "replace")


def memory_limit_mb(wanted: int) -> int:
    """``wanted`` MB, or less when this process's own address-space limit (a sandbox worker's) is lower."""
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard // _MB)


def script_env(workspace: Path) -> dict[str, str]:
    """The script's whole environment: a few harmless variables of this process and the workspace."""
    env = {k: v for k, v in os.environ.items() if k in _ENV_PASSED or k.startswith("LC_")}
    env.setdefault("PATH", os.defpath)
    env.update({"HERMES_WORKSPACE": str(workspace), "PYTHONIOENCODING": "utf-8"})
    return env


def run_script(script: Path, *, cwd: Path, timeout: float, memory_mb: int, on_call: OnCall,
               cancel: threading.Event | None = None) -> ScriptRun:
    """Run ``script`` (its directory holds the generated client module) in ``cwd`` until it exits, ``timeout``
    seconds pass or ``cancel`` is set; its tool calls go to ``on_call`` (tool name, arguments) -> result string."""
    ours, theirs = socket.socketpair()
    env = {**script_env(cwd), TOOLS_FD_ENV: str(theirs.fileno())}
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _BOOTSTRAP, str(memory_mb * _MB), str(script)], cwd=cwd, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=[theirs.fileno()],
            start_new_session=True)
    finally:
        theirs.close()
    with ours, proc:
        return _Supervisor(proc, ours, time.monotonic() + timeout, on_call, cancel).run()


class _Supervisor:
    """Pumps one script's output and tool calls until it ends, then makes sure its process group is gone."""

    def __init__(self, proc: subprocess.Popen[bytes], channel: socket.socket, deadline: float, on_call: OnCall,
                 cancel: threading.Event | None) -> None:
        self.proc = proc
        self.channel = channel
        self.deadline = deadline
        self.on_call = on_call
        self.cancel = cancel
        self.stdout = _Capped(STDOUT_HEAD_BYTES, STDOUT_TAIL_BYTES)
        self.stderr = _Capped(0, STDERR_TAIL_BYTES)
        self.pending = bytearray()  # the start of a request not complete yet
        self.selector = selectors.DefaultSelector()

    def run(self) -> ScriptRun:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.selector.register(self.proc.stdout, selectors.EVENT_READ, self.stdout)
        self.selector.register(self.proc.stderr, selectors.EVENT_READ, self.stderr)
        self.selector.register(self.channel, selectors.EVENT_READ, None)
        timed_out = cancelled = False
        with self.selector:
            while True:
                if self.cancel is not None and self.cancel.is_set():
                    cancelled = True
                    break
                remaining = self.deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                if self._exited():
                    break  # its output may still be open in a process it left behind: what is there is read below
                for key, _ in self.selector.select(min(remaining, _POLL_SECONDS)):
                    self._ready(key)
            self._kill_group()
            self._drain(time.monotonic() + _DRAIN_SECONDS)
        self.proc.wait()
        returncode = None if timed_out or cancelled else self.proc.returncode
        return ScriptRun(returncode, self.stdout.text(), self.stderr.text(), timed_out, cancelled)

    def _exited(self) -> bool:
        """Whether the script has exited, leaving it unreaped: its pid, the group's id, stays taken until
        ``_kill_group`` has ended what it left behind."""
        return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

    def _ready(self, key: selectors.SelectorKey) -> None:
        if key.data is None:
            self._serve()
            return
        chunk = os.read(key.fd, _READ_CHUNK)
        if chunk:
            key.data.add(chunk)
        else:
            self.selector.unregister(key.fileobj)

    def _drain(self, until: float) -> None:
        """Read what the pipes still hold (end of file comes once every process writing to them is gone)."""
        with contextlib.suppress(KeyError):
            self.selector.unregister(self.channel)
        while self.selector.get_map() and (remaining := until - time.monotonic()) > 0:
            for key, _ in self.selector.select(remaining):
                self._ready(key)

    def _serve(self) -> None:
        """Answer every complete request received; a broken channel is closed (the script's next call fails)."""
        try:
            data = self.channel.recv(_READ_CHUNK)
        except OSError:
            data = b""
        self.pending += data
        while data and len(self.pending) >= 4:
            size = int.from_bytes(self.pending[:4], "big")
            if size > MAX_FRAME_BYTES:
                data = b""
                break
            if len(self.pending) < 4 + size:
                return
            body = bytes(self.pending[4:4 + size])
            del self.pending[:4 + size]
            if not self._answer(body):
                data = b""
        if not data:
            self.selector.unregister(self.channel)
            with contextlib.suppress(OSError):
                self.channel.shutdown(socket.SHUT_RDWR)

    def _answer(self, body: bytes) -> bool:
        """Run one request and send its result; False when the script stopped reading before its deadline."""
        try:
            request = json.loads(body)
            tool, args = request["tool"], request.get("args") or {}
            if not isinstance(tool, str) or not isinstance(args, dict):
                raise TypeError("tool must be a string and args an object")
        except (ValueError, KeyError, TypeError) as exc:
            result = json.dumps({"error": f"not a tool call: {exc}"})
        else:
            result = self.on_call(tool, args)
        answer = json.dumps({"result": result}, ensure_ascii=False).encode("utf-8")
        self.channel.settimeout(max(self.deadline - time.monotonic(), 0.001))
        try:
            self.channel.sendall(len(answer).to_bytes(4, "big") + answer)
        except OSError:  # timed out or closed: the deadline check ends the script
            return False
        finally:
            self.channel.settimeout(None)
        return True

    def _kill_group(self) -> None:
        # The script leads its own session, so its pid is the group's id; the group cannot be reused while
        # a process of it (even the script, unreaped) is there.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
