"""The terminal tool: run a shell command in the workspace with a timeout and a scrubbed environment.

The command runs through ``/bin/sh -c`` in its own session (so a timeout can kill
the whole process group) on the worker thread the tool is called on. Its
environment is an allowlist: the gateway's API keys and tokens never reach it.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tools.registry import EFFECT_RUNS_COMMANDS, registry, tool_error, tool_result
from tools.workspace import WorkspaceError, resolve_in_workspace, workspace_root

SHELL = "/bin/sh"
DEFAULT_TIMEOUT_SECONDS = 60.0
MAX_TIMEOUT_SECONDS = 600.0
OUTPUT_HEAD_BYTES = 20_000
OUTPUT_TAIL_BYTES = 30_000

_ENV_ALLOWLIST = frozenset({"PATH", "HOME", "LANG", "TZ", "TERM", "USER", "LOGNAME", "SHELL", "TMPDIR"})
_ENV_ALLOWED_PREFIX = "LC_"
_KILL_DRAIN_SECONDS = 1.0  # how long to collect what a killed group had already written
_CANCEL_POLL_SECONDS = 0.1  # how often a running command checks whether its run was stopped
_READ_CHUNK = 65536

# A safety net against the classic host-wrecking one-liners, not a sandbox: it is
# trivially bypassed (variables, eval, scripts) and only catches honest mistakes.
# Patterns run on the normalised command (see _normalise): lower case, quotes and
# backslashes removed, newlines turned into ';', whitespace collapsed.
_SEGMENT = r"[^;&|`]*?"  # the rest of one simple command
_WORD_END = r"(?=[\s;&|)`]|$)"
_RECURSIVE_FLAG = rf"(?={_SEGMENT}\s(?:-[a-z]*r[a-z]*|--recursive){_WORD_END})"
_ROOT_OR_HOME = r"(?:/\*?|~/?\*?|\$\{?home\}?/?\*?)"
_DISK = r"/dev/(?:sd|nvme|hd|vd|xvd|mmcblk)"
_COMMAND_START = r"(?:^|[;&|(`]\s?)(?:sudo\s)?"
_BLOCKLIST: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(rf"\brm{_RECURSIVE_FLAG}{_SEGMENT}\s{_ROOT_OR_HOME}{_WORD_END}"), "recursive rm of / or ~"),
    (re.compile(rf"\bchmod{_RECURSIVE_FLAG}(?={_SEGMENT}\s0?777\s){_SEGMENT}\s/{_WORD_END}"), "chmod -R 777 /"),
    (re.compile(r"\bmkfs"), "mkfs (formats a filesystem)"),
    (re.compile(rf"\bdd\s{_SEGMENT}\bof={_DISK}"), "dd onto a disk device"),
    (re.compile(rf">\s?{_DISK}"), "writing to a disk device"),
    (re.compile(r"([\w:]+)\s?\(\)\s?\{\s?\1\s?\|\s?\1\s?&\s?\}\s?;\s?\1"), "fork bomb"),
    (
        re.compile(rf"{_COMMAND_START}(?:systemctl\s)?(?:\S*/)?(?:shutdown|reboot|halt|poweroff)\b"),
        "shutting down or rebooting the host",
    ),
)


def blocked_reason(command: str) -> str | None:
    """Why ``command`` is refused by the destructive-command blocklist, or None when it may run."""
    normalised = _normalise(command)
    return next((reason for pattern, reason in _BLOCKLIST if pattern.search(normalised)), None)


def _normalise(command: str) -> str:
    text = re.sub(r"[\"'\\]", "", command.lower()).replace("\n", ";")
    return " ".join(text.split())


def terminal(args: dict[str, Any], **ctx: Any) -> str:
    """Run ``args["command"]`` with ``/bin/sh -c`` in the workspace; return JSON {exit_code, output}."""
    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        return tool_error("command must be a non-empty string")
    timeout = _timeout(args.get("timeout"))
    if timeout is None:
        return tool_error(f"timeout must be a positive number of seconds (capped at {MAX_TIMEOUT_SECONDS:g})")
    try:
        root = workspace_root(ctx)
        workdir = resolve_in_workspace(root, args.get("workdir") or ".")
    except WorkspaceError as exc:
        return tool_error(str(exc))
    if not workdir.is_dir():
        return tool_error(f"workdir {workdir.relative_to(root).as_posix()} is not a directory")
    reason = blocked_reason(command)
    if reason is not None:
        return tool_error(f"refused by the safety blocklist ({reason}); the command was not run")
    cancel: threading.Event | None = ctx.get("cancel_event")
    exit_code, output = _run(command, workdir, _child_env(root), timeout, cancel)
    if exit_code is None and cancel is not None and cancel.is_set():
        return tool_error("command cancelled (the run was stopped); its process group was killed", output=output)
    if exit_code is None:
        return tool_error(f"command timed out after {timeout:g}s; its process group was killed", output=output)
    return tool_result(exit_code=exit_code, output=output)


def _timeout(value: Any) -> float | None:
    """The timeout in seconds (default 60, capped at 600), or None when ``value`` is not usable."""
    if value is None or value == "":
        return DEFAULT_TIMEOUT_SECONDS
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    if isinstance(value, bool) or not seconds > 0:  # `not >` also rejects NaN
        return None
    return min(seconds, MAX_TIMEOUT_SECONDS)


def _child_env(root: Path) -> dict[str, str]:
    env = {
        key: value for key, value in os.environ.items() if key in _ENV_ALLOWLIST or key.startswith(_ENV_ALLOWED_PREFIX)
    }
    env.setdefault("PATH", os.defpath)
    env["HERMES_WORKSPACE"] = str(root)
    return env


@dataclass(slots=True)
class _Capture:
    """Keeps the head and the tail of a byte stream and counts what falls in between."""

    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = OUTPUT_HEAD_BYTES - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > 2 * OUTPUT_TAIL_BYTES:  # trim in batches, not on every chunk
            del self.tail[:-OUTPUT_TAIL_BYTES]

    def text(self) -> str:
        tail = self.tail[-OUTPUT_TAIL_BYTES:]
        omitted = self.total - len(self.head) - len(tail)
        marker = f"\n[... {omitted} bytes of output omitted ...]\n" if omitted else ""
        return self.head.decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace")


def _run(command: str, workdir: Path, env: dict[str, str], timeout: float,
         cancel: threading.Event | None = None) -> tuple[int | None, str]:
    """Run the command; (exit code, merged output), exit code None when it timed out or was cancelled."""
    capture = _Capture()
    deadline = time.monotonic() + timeout
    with subprocess.Popen(
        [SHELL, "-c", command],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    ) as proc:
        stdout: IO[bytes] = proc.stdout  # type: ignore[assignment]  # always set: stdout=PIPE
        exit_code: int | None = None
        if _pump(stdout, capture, deadline, cancel):
            # EOF; the shell may still run if it closed its output, so the deadline still holds.
            with contextlib.suppress(subprocess.TimeoutExpired):
                exit_code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        if exit_code is None:
            _kill_group(proc.pid)
            _pump(stdout, capture, time.monotonic() + _KILL_DRAIN_SECONDS)
    return exit_code, capture.text()


def _pump(stream: IO[bytes], capture: _Capture, deadline: float, cancel: threading.Event | None = None) -> bool:
    """Read ``stream`` into ``capture`` until EOF (True), or ``deadline`` or ``cancel`` (False)."""
    fd = stream.fileno()
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while (remaining := deadline - time.monotonic()) > 0:
            if cancel is not None and cancel.is_set():
                return False
            if selector.select(min(remaining, _CANCEL_POLL_SECONDS)):
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    return True
                capture.add(chunk)
    return False


def _kill_group(pgid: int) -> None:
    # The shell leads its own session (start_new_session), so its pid is the group id;
    # it is not reaped yet, so the id cannot have been reused.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _shell_available() -> bool:
    return os.access(SHELL, os.X_OK)


registry.register(
    name="terminal",
    toolset="terminal",
    schema={
        "name": "terminal",
        "description": (
            "Run a shell command (/bin/sh -c) in the workspace and return its exit code and combined "
            "stdout/stderr (long output keeps its head and tail). Non-interactive: stdin is empty. "
            "The environment holds no credentials. Killed when the timeout passes."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The shell command line to run."},
                "timeout": {
                    "type": "number",
                    "description": (
                        f"Seconds before the command is killed (default {DEFAULT_TIMEOUT_SECONDS:g}, "
                        f"max {MAX_TIMEOUT_SECONDS:g})."
                    ),
                },
                "workdir": {
                    "type": "string",
                    "description": "Working directory relative to the workspace (default: the workspace).",
                },
            },
            "required": ["command"],
        },
    },
    handler=terminal,
    check_fn=_shell_available,
    effects=[EFFECT_RUNS_COMMANDS],
    emoji="💻",
    max_result_size_chars=120_000,
)
