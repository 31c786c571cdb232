"""A sandbox worker: ``python -I -m tools.sandbox.worker``, started inside the sandbox by the pool.

It reads a setup frame (limits, who to run as, tool settings, plugins), drops privileges, sets its
resource limits, loads the tools, answers ``ready``, then serves one call at a time: each request
names a tool, its (already coerced) arguments and the run's context; the answer is the result
string the registry's in-process dispatch returns. Anything the handler or its children print goes
to stderr: stdout is moved to a private descriptor that only carries frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import resource
import shutil
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from tools.plugins import load_plugins
from tools.registry import registry, tool_error
from tools.sandbox.protocol import ProtocolError, read_frame, write_frame
from tools.sandbox.settings import ToolSettings

_MB = 1024 * 1024
_PR_SET_DUMPABLE = 4  # <linux/prctl.h>


def _private_pipes() -> tuple[int, int]:
    """(request fd, answer fd): the pipes, moved off 0 and 1 so children cannot read or write them."""
    requests, answers = os.dup(0), os.dup(1)  # os.dup makes non-inheritable descriptors
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return requests, answers


def drop_privileges(uid: int | None, gid: int | None) -> None:
    """Become ``uid``/``gid`` with no supplementary groups (only when started as root); every capability
    goes with the switch, and no_new_privs (set by bubblewrap) keeps them from coming back."""
    if uid is None or os.getuid() != 0:
        return
    os.setgroups([])
    os.setgid(gid if gid is not None else uid)
    os.setuid(uid)


def _set_limits(limits: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """Per-process limits, inherited by every command a tool starts; returns them as set."""
    pairs = {
        resource.RLIMIT_AS: int(limits["memory_mb"]) * _MB,
        resource.RLIMIT_NOFILE: int(limits["open_files"]),
        resource.RLIMIT_NPROC: int(limits["processes"]),
        resource.RLIMIT_FSIZE: int(limits["file_size_mb"]) * _MB,
        resource.RLIMIT_CORE: 0,
    }
    for which, value in pairs.items():
        resource.setrlimit(which, (value, value))
    return {which: resource.getrlimit(which) for which in pairs}


def _limits_changed(expected: dict[int, tuple[int, int]]) -> bool:
    """Whether a call's process changed this worker's limits (``prlimit`` on its parent can, as the same user):
    a worker with lowered limits would fail the next calls, maybe other users', so it retires instead."""
    return any(resource.getrlimit(which) != limits for which, limits in expected.items())


def _not_dumpable() -> None:
    """No core dumps, and no ptrace or /proc/<pid>/mem access to this worker from the processes its calls start
    (the same user): a call must not plant code in the worker that serves the next ones."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _limit_cpu(seconds: float) -> None:
    """Allow this call ``seconds`` more CPU time: past it the kernel sends SIGXCPU, which ends the worker."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(used + seconds) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


class _Loop:
    """The worker's one persistent event loop for async handlers (clients they cache stay bound to it)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def __call__(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)


def _reap_leftovers(own_pid_namespace: bool) -> None:
    """End every process a call left behind (``cmd &``, ``setsid``, a daemon): a worker serves many runs, and
    the next call, maybe another user's, must not share its namespace with them. In its own PID namespace
    that is everything but this worker and the namespace's init (bubblewrap's, or the jail's under
    unshare); otherwise this worker's descendants."""
    me = os.getpid()
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (me, 1):
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                parents[int(name)] = int(stat.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # already gone
    if own_pid_namespace:
        doomed = list(parents)
    else:
        family, grew = {me}, True
        while grew:
            grown = {pid for pid, parent in parents.items() if parent in family} - family
            family |= grown
            grew = bool(grown)
        doomed = sorted(family - {me})
    for pid in doomed:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in doomed:  # reap our own children; the rest are init's to reap
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)



def _mount_holders() -> frozenset[str]:
    """The entries of /tmp that hold a mount point (a workspace or plugins directory under /tmp)."""
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mountinfo:
        return frozenset(Path(fields[4]).parts[2] for line in mountinfo
                         if len(fields := line.split()) > 4 and fields[4].startswith("/tmp/"))


def _clear_tmp(holders: frozenset[str]) -> None:
    """Empty the private /tmp (and so HOME): what one call leaves there is not the next call's to read.
    ``holders`` (entries holding a mount point) are left alone: deleting in them would reach the host."""
    for entry in os.scandir("/tmp"):
        if entry.name in holders:
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)


def _call(request: dict[str, Any]) -> str:
    entry = registry.get(str(request.get("tool")))
    if entry is None:  # registered in the gateway at run time, where no worker can see it
        return tool_error(f"{request.get('tool')} is not known to the sandbox: a sandboxed tool must come from a "
                          "tools module or a plugin, or register with isolation='process'")
    _limit_cpu(float(request["cpu_seconds"]))
    return registry.run_here(entry, request.get("args") or {}, request.get("ctx") or {})


def serve() -> int:
    """Set up, then answer calls until the pool closes the pipe."""
    requests, answers = _private_pipes()
    try:
        setup = read_frame(requests)
    except ProtocolError:
        return 1
    limits = _set_limits(setup["limits"])
    registry.async_runner = _Loop()
    # The operator's code loads before the switch to the sandbox's user, which may not be able to read
    # it (a plugins directory private to the gateway's user); no call from a model runs before it.
    registry.discover_builtin_tools()
    plugins = setup.get("plugins") or {}
    directory = plugins.get("dir")
    load_plugins(Path(directory) if directory else None, entry_points=bool(plugins.get("entry_points")),
                 allow_override=plugins.get("allow_override") or ())
    drop_privileges(setup.get("uid"), setup.get("gid"))
    _not_dumpable()
    ToolSettings.from_dict(setup.get("settings") or {}).apply()
    isolated = bool(setup.get("own_pid_namespace"))  # bubblewrap: its own PID namespace and /tmp
    holders = _mount_holders() if isolated else frozenset()  # the mounts never change
    write_frame(answers, {"ready": True, "pid": os.getpid(), "tools": registry.tool_names()})
    while True:
        try:
            request = read_frame(requests)
        except ProtocolError:
            return 0
        try:
            result = _call(request)
        except MemoryError:
            result = tool_error(f"{request.get('tool')}: out of memory (the sandbox's limit)")
        _reap_leftovers(isolated)
        if isolated:
            _clear_tmp(holders)
        if _limits_changed(limits):
            write_frame(answers, {"result": result, "retire": "its limits were changed by the call"})
            return 0
        write_frame(answers, {"result": result})


if __name__ == "__main__":
    sys.exit(serve())
