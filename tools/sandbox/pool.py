"""The gateway's side of the tool sandbox: a pool of long-lived workers, one call at a time each.

Calls come from the gateway's tool threads (``registry.dispatch`` runs there), so this module is
synchronous: a thread takes an idle worker, writes the request, and waits on the answer pipe with the
call's wall-clock deadline, polling the run's cancel event. A worker that overruns, is cancelled, or
dies is killed (its whole process tree: bubblewrap's PID namespace ends with it) and replaced in the
background; the call returns a tool error saying which limit ended it, and is not retried.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tools.registry import ToolEntry, tool_error
from tools.sandbox.policy import (
    Isolation,
    SandboxPolicy,
    bwrap_argv,
    program_argv,
    sandbox_env,
    unshare_argv,
    worker_command,
)
from tools.sandbox.protocol import ProtocolError, read_frame, write_frame
from tools.sandbox.settings import ToolSettings

logger = logging.getLogger(__name__)

START_TIMEOUT_SECONDS = 30.0
IDLE_SECONDS = 120.0  # an idle worker beyond the first of its kind is stopped after this long
_POLL_SECONDS = 0.1  # how often a waiting call checks whether its run was stopped
_TIMEOUT_GRACE_SECONDS = 5.0  # a tool's own timeout argument plus this, so the tool reports its own timeout
_MAX_CALL_SECONDS = 3600.0
_MAX_STDERR_LINES = 200  # per worker: a chatty tool cannot flood the log
_EXIT_BY_SIGNAL = 128  # bubblewrap exits with 128 + N when the worker is killed by signal N
_NAMESPACED = ("bwrap", "unshare")  # levels whose workers have their own PID and mount namespaces
_LEVELS = (*_NAMESPACED, "uid")  # levels that run sandboxed tools


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Per-call limits (``tools.limits`` in the config)."""

    timeout: float = 30.0  # wall clock per call; a tool's own ``timeout`` argument extends it
    cpu_seconds: float = 20.0
    memory_mb: int = 1024  # address space of each process
    open_files: int = 256
    processes: int = 128  # processes and threads of the sandbox's user (a fork bomb stops here)
    file_size_mb: int = 1024  # largest file a tool may write


class SandboxError(Exception):
    """A worker could not be started."""


class _Cancelled(SandboxError):
    """The run was stopped while its call waited for a worker."""


class _Worker:
    """One sandboxed interpreter serving calls over its stdin/stdout."""

    def __init__(self, proc: subprocess.Popen[bytes], network: bool) -> None:
        self.proc = proc
        self.network = network
        self.pid = proc.pid
        self.idle_since = time.monotonic()
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self._requests = proc.stdin.fileno()
        self._answers = proc.stdout.fileno()
        self._stderr = threading.Thread(target=self._log_stderr, name=f"sandbox-stderr-{proc.pid}", daemon=True)
        self._stderr.start()

    def _log_stderr(self) -> None:
        assert self.proc.stderr is not None
        logged = 0
        for raw in self.proc.stderr:
            if logged < _MAX_STDERR_LINES:
                logger.info("sandbox worker %d: %s", self.pid, raw.decode("utf-8", "replace").rstrip())
                logged += 1

    def handshake(self, setup: dict[str, Any]) -> None:
        """Send the setup and wait for ``ready``; SandboxError when it does not come."""
        try:
            write_frame(self._requests, setup)
            answer = self._wait(time.monotonic() + START_TIMEOUT_SECONDS, None)
        except (OSError, ProtocolError) as exc:
            raise SandboxError(f"the sandbox worker did not start: {self._exit_text()} ({exc})") from exc
        if not isinstance(answer, dict) or not answer.get("ready"):
            raise SandboxError(f"the sandbox worker did not start: {self._exit_text()}")

    def _wait(self, deadline: float, cancel: threading.Event | None) -> Any:
        """The next answer; None when the deadline passed or ``cancel`` was set first."""
        poller = select.poll()  # not select(): a busy gateway's descriptors pass FD_SETSIZE
        poller.register(self._answers, select.POLLIN)
        while (remaining := deadline - time.monotonic()) > 0:
            if cancel is not None and cancel.is_set():
                return None
            if poller.poll(min(remaining, _POLL_SECONDS) * 1000):
                return read_frame(self._answers)  # data, or end of file (ProtocolError)
        return None

    def call(self, request: dict[str, Any], deadline: float, cancel: threading.Event | None) -> Any:
        """Send one request and wait for its answer (None on deadline or cancel); ProtocolError if it died."""
        try:
            write_frame(self._requests, request)
        except OSError as exc:
            raise ProtocolError(f"the worker is gone ({exc})") from exc
        return self._wait(deadline, cancel)

    def kill(self) -> None:
        """Kill the worker's process group and reap it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]

    def _exit_text(self) -> str:
        self.kill()
        return exit_text(self.proc.returncode)


def exit_text(returncode: int | None) -> str:
    """What a worker's exit status means, for the model and the log."""
    if returncode is None:
        return "still running"
    number = -returncode if returncode < 0 else returncode - _EXIT_BY_SIGNAL
    if returncode < 0 or returncode > _EXIT_BY_SIGNAL:
        if number == signal.SIGXCPU:
            return "stopped at its CPU time limit"
        if number == signal.SIGKILL:
            return "killed (out of memory, or by a limit)"
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(number).name}"
    return f"exited with status {returncode}"


def _plain(value: Any) -> bool:
    return isinstance(value, str | int | float | bool) or value is None


def _plain_ctx(ctx: Mapping[str, Any]) -> dict[str, Any]:
    """The run's context as the worker gets it: plain values and lists of them only (no events, no objects)."""
    return {k: list(v) if isinstance(v, list | tuple) else v for k, v in ctx.items()
            if _plain(v) or (isinstance(v, list | tuple) and all(map(_plain, v)))}


class SandboxPool:
    """Runs sandboxed tools' handlers in workers (the registry's ``SandboxRunner``)."""

    def __init__(self, isolation: Isolation, policy: SandboxPolicy, limits: SandboxLimits | None = None, *,
                 settings: ToolSettings | None = None, plugins_dir: Path | None = None,
                 plugin_entry_points: bool = True, plugin_allow_override: tuple[str, ...] = (), max_workers: int = 8,
                 network: Mapping[str, bool] | None = None) -> None:
        self.isolation = isolation
        self.policy = policy
        self.limits = limits or SandboxLimits()
        self.settings = settings or ToolSettings()
        self.plugins_dir = plugins_dir
        self.plugin_entry_points = plugin_entry_points
        self.plugin_allow_override = plugin_allow_override  # workers load the plugins the gateway loads
        self.max_workers = max_workers
        self.network = dict(network or {})
        self._as_root = os.geteuid() == 0
        self._cond = threading.Condition()
        self._idle: dict[bool, list[_Worker]] = {False: [], True: []}
        self._live: dict[bool, int] = {False: 0, True: 0}  # idle, busy and starting
        self._busy: set[_Worker] = set()
        self._closed = False
        self._workspace_ready = False
        self._prepare_lock = threading.Lock()
        self._launcher = ThreadPoolExecutor(1, thread_name_prefix="sandbox-launcher")
        self._staging_dir: tempfile.TemporaryDirectory[str] | None = None
        self._spawners: set[threading.Thread] = set()
        self.started_workers = 0
        self.killed_workers = 0
        self._outcomes: collections.Counter[str] = collections.Counter()

    # -- SandboxRunner --------------------------------------------------------

    def unavailable_reason(self, entry: ToolEntry) -> str | None:
        """None when the sandbox can run tools; else why not (the tool is then not offered)."""
        if self.isolation.level in _LEVELS:
            return None
        return f"no tool sandbox on this machine ({self.isolation.reason})"

    def run(self, entry: ToolEntry, args: dict[str, Any], ctx: Mapping[str, Any]) -> str:
        """Run ``entry``'s handler in a worker; limits end it with a tool error (never retried)."""
        network = self.network.get(entry.name, entry.network)
        timeout = self._timeout_for(entry, args)
        cancel = ctx.get("cancel_event")
        try:
            worker = self._acquire(network, cancel)
        except _Cancelled:
            self._count("cancelled")
            return tool_error(f"{entry.name}: cancelled (the run was stopped) while waiting for a sandbox")
        except SandboxError as exc:
            self._count("no_worker")
            return tool_error(f"{entry.name}: {exc}")
        request = {"tool": entry.name, "args": args, "ctx": _plain_ctx(ctx), "cpu_seconds": self.limits.cpu_seconds}
        alive = False
        try:
            answer = worker.call(request, time.monotonic() + timeout, cancel)
            if answer is None:
                if cancel is not None and cancel.is_set():
                    self._count("cancelled")
                    return tool_error(f"{entry.name}: cancelled (the run was stopped); its sandbox was killed")
                self._count("timeout")
                return tool_error(f"{entry.name}: timed out after {timeout:g} s; its sandbox was killed")
            # A worker the call damaged (its limits lowered) says so with its answer and is replaced.
            alive = not (isinstance(answer, dict) and answer.get("retire"))
            if not alive:
                logger.warning("sandbox worker %d retires after %s: %s", worker.pid, entry.name, answer["retire"])
            self._count("ok")
            return str(answer.get("result", "")) if isinstance(answer, dict) else tool_error(
                f"{entry.name}: the sandbox answered something that is not a result")
        except ProtocolError:
            worker.kill()
            what = exit_text(worker.proc.returncode)
            if "CPU" in what:
                what = f"{what} ({self.limits.cpu_seconds:g} s)"
            self._count("cpu_limit" if "CPU" in what else "died")
            logger.warning("sandbox worker %d running %s: %s", worker.pid, entry.name, what)
            return tool_error(f"{entry.name}: {what}; the sandbox was replaced")
        finally:
            self._release(worker, alive)

    def _count(self, outcome: str) -> None:
        with self._cond:
            self._outcomes[outcome] += 1

    def _timeout_for(self, entry: ToolEntry, args: Mapping[str, Any]) -> float:
        timeout = self.limits.timeout
        params = (entry.schema.get("parameters") or {}).get("properties") or {}
        spec = params.get("timeout")
        # Absent, the tool's own timeout is its schema's default (execute_code's, which its handler enforces).
        own = args.get("timeout", spec.get("default") if isinstance(spec, Mapping) else None)
        if "timeout" in params and isinstance(own, int | float) and not isinstance(own, bool) and own > 0:
            timeout = max(timeout, float(own) + _TIMEOUT_GRACE_SECONDS)
        return min(timeout, _MAX_CALL_SECONDS)

    def program_launcher(self) -> Callable[[str, Sequence[str]], list[str]] | None:
        """How to start an operator's program (a stdio MCP server) under the same rules; None without
        bubblewrap (it then runs as the gateway's user, with the minimal environment its launcher gives)."""
        return functools.partial(program_argv, self.policy) if self.isolation.level == "bwrap" else None

    # -- workers ----------------------------------------------------------------

    def start(self) -> None:
        """Start one worker of each kind in the background, so the first calls need not wait for one."""
        if self.isolation.level in _LEVELS:
            self._prepare_workspace()  # before anything sandboxed starts (stdio MCP servers write there too)
            for network in (False, True):
                self._spawn_soon(network)

    def _prepare_workspace(self) -> None:
        """Create the workspace; as root, hand it to the sandbox's user (the one place its tools may write)."""
        with self._prepare_lock:
            if not self._workspace_ready:
                self.policy.workspace.mkdir(parents=True, exist_ok=True)
                if self._as_root:
                    self._chown_workspace()
                self._workspace_ready = True

    def _chown_workspace(self) -> None:
        uid = self.policy.uid
        for directory, dirs, files in os.walk(self.policy.workspace):
            for name in (directory, *(os.path.join(directory, n) for n in dirs + files)):
                with contextlib.suppress(OSError):
                    if os.lstat(name).st_uid != uid:
                        os.lchown(name, uid, uid)

    def _setup(self) -> dict[str, Any]:
        namespaces = self.isolation.level in _NAMESPACED
        drop = self._as_root and namespaces  # in uid mode Popen already switched
        return {"uid": self.policy.uid if drop else None, "gid": self.policy.uid if drop else None,
                "own_pid_namespace": namespaces,
                "limits": asdict(self.limits), "settings": self.settings.to_dict(),
                "plugins": {"dir": str(self.plugins_dir) if self.plugins_dir else None,
                            "entry_points": self.plugin_entry_points,
                            "allow_override": list(self.plugin_allow_override)}}

    def _new_worker(self, network: bool) -> _Worker:
        self._prepare_workspace()
        common: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE,
                                  "start_new_session": True, "close_fds": True,
                                  "env": sandbox_env(self.policy.workspace)}
        if self.isolation.level == "bwrap":
            argv = bwrap_argv(self.policy, network=network, as_root=self._as_root, command=worker_command())
            launch = functools.partial(subprocess.Popen, argv, **common)
        elif self.isolation.level == "unshare":
            argv = unshare_argv(self.policy, network=network, as_root=self._as_root, command=worker_command(),
                                staging=self._staging())
            launch = functools.partial(subprocess.Popen, argv, **common)
        else:  # uid: a separate user, no namespaces
            uid = self.policy.uid
            launch = functools.partial(subprocess.Popen, worker_command(), cwd=self.policy.workspace, user=uid,
                                       group=uid, extra_groups=[], **common)
        # bubblewrap's --die-with-parent fires when the *thread* that started it exits, so every worker is
        # started from one thread that lives as long as the pool.
        try:
            proc = self._launcher.submit(launch).result()
        except RuntimeError as exc:  # the launcher was shut down: the pool is closing
            raise SandboxError("the sandbox is shut down") from exc
        worker = _Worker(proc, network)
        try:
            worker.handshake(self._setup())
        except SandboxError:
            worker.kill()
            raise
        with self._cond:
            self.started_workers += 1
        return worker

    def _staging(self) -> Path:
        """An empty directory where unshare's workers mount their roots (each in its own mount namespace)."""
        with self._prepare_lock:
            if self._staging_dir is None:
                self._staging_dir = tempfile.TemporaryDirectory(prefix="hermes-sandbox-")
            return Path(self._staging_dir.name)

    def _acquire(self, network: bool, cancel: threading.Event | None = None) -> _Worker:
        """An idle worker, a new one while under ``max_workers``, or the next one released; _Cancelled when
        ``cancel`` is set first."""
        with self._cond:
            while True:
                if self._closed:
                    raise SandboxError("the sandbox is shut down")
                if cancel is not None and cancel.is_set():
                    raise _Cancelled
                if self._idle[network]:
                    worker = self._idle[network].pop()
                    self._busy.add(worker)
                    return worker
                if self._live[network] < self.max_workers:
                    self._live[network] += 1
                    break
                self._cond.wait(_POLL_SECONDS if cancel is not None else None)
        try:
            worker = self._new_worker(network)
        except (OSError, SandboxError) as exc:
            with self._cond:
                self._live[network] -= 1
                self._cond.notify()
            raise SandboxError(str(exc)) from exc
        with self._cond:
            self._busy.add(worker)
        return worker

    def _release(self, worker: _Worker, alive: bool) -> None:
        surplus: list[_Worker] = []
        if not alive:
            worker.kill()
        with self._cond:
            self.killed_workers += not alive
            self._busy.discard(worker)
            if alive and not self._closed:
                self._idle[worker.network].append(worker)
                worker.idle_since = time.monotonic()
                surplus = self._surplus(worker.network)
            else:
                self._live[worker.network] -= 1
                if not alive and not self._closed:
                    self._spawn_soon(worker.network)
            self._cond.notify()
        if alive and self._closed:
            worker.kill()
        for idle in surplus:
            idle.kill()

    def _surplus(self, network: bool) -> list[_Worker]:
        """Idle workers beyond the first that nothing needed for ``IDLE_SECONDS`` (taken out; the caller kills
        them): a burst of slow calls grows the pool, and the quiet after it gives the memory back."""
        idle = self._idle[network]  # the longest idle first (calls take the last)
        cutoff = time.monotonic() - IDLE_SECONDS
        surplus = [w for w in idle[:-1] if w.idle_since < cutoff]
        for worker in surplus:
            idle.remove(worker)
            self._live[network] -= 1
        return surplus

    def _spawn_soon(self, network: bool) -> None:
        """Start a worker in the background (a replacement, or the first one) unless one is idle."""
        def spawn() -> None:
            try:
                worker = self._new_worker(network)
            except (OSError, SandboxError) as exc:
                logger.error("sandbox: starting a worker failed: %s", exc)
                with self._cond:
                    self._live[network] -= 1
                    self._cond.notify()
                return
            finally:
                with self._cond:
                    self._spawners.discard(threading.current_thread())
            with self._cond:
                if not self._closed:
                    self._idle[network].append(worker)
                    self._cond.notify()
                    return
            worker.kill()

        with self._cond:
            if self._closed or self._idle[network] or self._live[network] >= self.max_workers:
                return
            self._live[network] += 1
            thread = threading.Thread(target=spawn, name="sandbox-spawn", daemon=True)
            self._spawners.add(thread)
        thread.start()

    def close(self) -> None:
        """Kill every worker; calls still running end with a tool error."""
        with self._cond:
            self._closed = True
            workers = [*self._idle[False], *self._idle[True], *self._busy]
            self._idle = {False: [], True: []}
            spawners = list(self._spawners)
            self._cond.notify_all()
        for worker in workers:
            worker.kill()
        for thread in spawners:
            thread.join(timeout=START_TIMEOUT_SECONDS)
        self._launcher.shutdown(wait=False)
        if self._staging_dir is not None:
            self._staging_dir.cleanup()

    def stats(self) -> dict[str, Any]:
        """Workers started, killed and idle now, and calls by outcome (ok, timeout, cpu_limit, died, cancelled,
        no_worker)."""
        with self._cond:
            idle = len(self._idle[False]) + len(self._idle[True])
            return {"started": self.started_workers, "killed": self.killed_workers, "idle": idle,
                    "calls": dict(self._outcomes)}
