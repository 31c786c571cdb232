"""Sandbox limits that ``make mutate`` found unpinned, pinned fast: each test names the mutants of
``tools/sandbox/pool.py`` or ``tools/sandbox/worker.py`` it kills. The worker test starts one bubblewrap worker."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sandbox_support import require_bwrap, write_plugin
from tools.plugins import load_plugins
from tools.registry import ToolEntry, registry
from tools.sandbox import Isolation, SandboxLimits, SandboxPolicy, SandboxPool, detect
from tools.sandbox.policy import NOBODY
from tools.sandbox.pool import exit_text

LIMITS_PLUGIN = '''
import os
import resource

def _limits(args, **ctx):
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "as": resource.getrlimit(resource.RLIMIT_AS), "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
        "nproc": resource.getrlimit(resource.RLIMIT_NPROC), "fsize": resource.getrlimit(resource.RLIMIT_FSIZE),
        "core": resource.getrlimit(resource.RLIMIT_CORE), "cpu": resource.getrlimit(resource.RLIMIT_CPU),
        "used": usage.ru_utime + usage.ru_stime, "uid": os.getuid(), "gid": os.getgid(),
        "groups": os.getgroups(),
    }

def register(registry):
    registry.register("sandbox_limits", "plugin-limits", {"description": "The worker's limits."}, _limits)
'''


def test_exit_statuses_say_what_ended_the_worker() -> None:
    """Kills exit_text's mutants: the signal arithmetic (``-returncode``, ``returncode - _EXIT_BY_SIGNAL``),
    the ``< 0`` / ``> _EXIT_BY_SIGNAL`` conditions and the SIGXCPU and SIGKILL cases."""
    assert exit_text(None) == "still running"
    assert exit_text(-signal.SIGXCPU) == "stopped at its CPU time limit"
    assert exit_text(128 + signal.SIGXCPU) == "stopped at its CPU time limit"
    assert exit_text(-signal.SIGKILL) == "killed (out of memory, or by a limit)"
    assert exit_text(128 + signal.SIGKILL) == "killed (out of memory, or by a limit)"
    assert exit_text(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert exit_text(128 + signal.SIGTERM) == "killed by SIGTERM"
    assert exit_text(128) == "exited with status 128"
    assert exit_text(1) == "exited with status 1"
    assert exit_text(0) == "exited with status 0"


def _entry(name: str, properties: dict[str, Any]) -> ToolEntry:
    return ToolEntry(name, "test", {"name": name, "description": "t",
                                    "parameters": {"type": "object", "properties": properties}}, lambda a, **c: "")


def test_a_calls_deadline_is_the_pools_unless_the_tool_asks_for_longer(tmp_path: Path) -> None:
    """Kills _timeout_for's mutants: the default, the ``timeout`` parameter check, the argument's type checks
    (a bool, a non-positive or a non-number ignored), ``max`` / the 5 s grace, and the one-hour cap."""
    pool = SandboxPool(Isolation("none", "test"), SandboxPolicy(tmp_path), SandboxLimits(timeout=30))
    with_timeout = _entry("term", {"timeout": {"type": "integer"}})
    without = _entry("read", {"path": {"type": "string"}})
    assert pool._timeout_for(without, {}) == 30
    assert pool._timeout_for(without, {"timeout": 600}) == 30  # only a tool that takes a timeout may extend it
    assert pool._timeout_for(with_timeout, {}) == 30
    assert pool._timeout_for(with_timeout, {"timeout": 600}) == 605
    assert pool._timeout_for(with_timeout, {"timeout": 2.5}) == 30  # never shorter than the pool's
    assert pool._timeout_for(with_timeout, {"timeout": 100.5}) == 105.5
    for ignored in (True, 0, -5, "900", None):
        assert pool._timeout_for(with_timeout, {"timeout": ignored}) == 30
    assert pool._timeout_for(with_timeout, {"timeout": 10**6}) == 3600


@pytest.fixture
def limits_pool(tmp_path: Path) -> Iterator[tuple[SandboxPool, SandboxLimits]]:
    require_bwrap()
    plugins = tmp_path / "plugins"
    write_plugin(plugins, "limits", LIMITS_PLUGIN)
    assert all(s.ok for s in load_plugins(plugins, entry_points=False).statuses)
    limits = SandboxLimits(timeout=30, cpu_seconds=7, memory_mb=700, open_files=77, processes=55, file_size_mb=33)
    policy = SandboxPolicy(tmp_path / "workspace", (plugins,))
    isolation = detect("bwrap", policy)
    assert isolation.level == "bwrap", isolation.reason
    pool = SandboxPool(isolation, policy, limits, plugins_dir=plugins, plugin_entry_points=False, max_workers=1)
    previous = registry.sandbox
    registry.sandbox = pool
    try:
        yield pool, limits
    finally:
        registry.sandbox = previous
        pool.close()
        registry.deregister("sandbox_limits")


def test_a_worker_runs_under_its_limits_as_the_sandboxs_user(limits_pool: tuple[SandboxPool, SandboxLimits],
                                                              tmp_path: Path) -> None:
    """Kills worker._set_limits' mutants (each rlimit's value or unit, ``RLIMIT_CORE: 1``), _limit_cpu's
    (``used`` miscounted, the soft limit ``- 1`` / ``+ 2`` off, the hard limit lost) and drop_privileges'
    (root kept, supplementary groups kept, the gid not switched)."""
    _pool, limits = limits_pool
    answer = json.loads(registry.dispatch("sandbox_limits", {}, workspace=str(tmp_path / "workspace")))
    mb = 1024 * 1024
    assert answer["as"] == [limits.memory_mb * mb] * 2
    assert answer["nofile"] == [limits.open_files] * 2
    assert answer["nproc"] == [limits.processes] * 2
    assert answer["fsize"] == [limits.file_size_mb * mb] * 2
    assert answer["core"] == [0, 0]
    soft, hard = answer["cpu"]
    assert int(answer["used"]) + limits.cpu_seconds <= soft <= int(answer["used"] + limits.cpu_seconds) + 1
    assert hard == -1  # RLIM_INFINITY: the next call can be given its own budget
    if os.geteuid() == 0:
        assert (answer["uid"], answer["gid"], answer["groups"]) == (NOBODY, NOBODY, [])


def test_an_exit_status_above_128_that_names_no_signal_is_a_plain_exit() -> None:
    """A worker that exits with 227 (128 + 99, no signal has that number) exited; it was not killed.

    Kills exit_text's ``contextlib.suppress(None)`` (the ValueError of ``signal.Signals(99)`` escapes)."""
    assert exit_text(128 + 99) == "exited with status 227"
