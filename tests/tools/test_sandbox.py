"""The tool sandbox against real bubblewrap workers: what a sandboxed tool sees, and how limits end it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.sandbox_support import HANG, descendant_processes, require_bwrap, wait_until, write_plugin
from tools.plugins import LoadedPlugins, load_plugins
from tools.registry import ISOLATION_PROCESS, ToolRegistry, registry
from tools.sandbox import Isolation, SandboxLimits, SandboxPolicy, SandboxPool, ToolSettings, detect
from tools.sandbox import pool as pool_module
from tools.sandbox.policy import NOBODY, python_paths

CANARY = "canary-env-5c1f0d7e9b2a4c68"
HANG_GUARD = 60.0  # seconds: only a broken sandbox takes this long

SHOUT = '''
def _shout(args, **ctx):
    return {"text": args["text"].upper() + "!", "n": len(args["text"]), "tags": sorted(args.get("tags") or [])}

def register(registry):
    registry.register("shout", "plugin-shout", {
        "description": "Upper-cases a text.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"},
                                                         "tags": {"type": "array", "items": {"type": "string"}}}},
    }, _shout)
'''
WHOAMI = '''
import os

def _whoami(args, **ctx):
    return {"pid": os.getpid(), "uid": os.getuid(), "euid": os.geteuid(), "env": dict(os.environ)}

def register(registry):
    registry.register("whoami", "plugin-whoami", {"description": "Who runs this handler."}, _whoami)
'''
SPIN = '''
def _spin(args, **ctx):
    while True:
        pass

def register(registry):
    registry.register("spin", "plugin-spin", {"description": "Burns CPU forever."}, _spin)
'''
HOG = '''
def _hog(args, **ctx):
    block = bytearray(8 * 1024 ** 3)
    return f"allocated {len(block)} bytes"

def register(registry):
    registry.register("hog", "plugin-hog", {"description": "Allocates 8 GiB."}, _hog)
'''
PLUGINS = {"shout": SHOUT, "whoami": WHOAMI, "spin": SPIN, "hog": HOG, "hang": HANG}
# Written to a file so the terminal tool's blocklist (which matches the classic one-liner) never sees it.
FORK_BOMB = "bomb() {\n  bomb | bomb &\n}\nbomb\n"


@dataclass
class Sandboxes:
    """Builds real pools (bubblewrap, or util-linux unshare and the jail) on a per-test workspace and installs
    the latest as the registry's."""

    tmp: Path
    mode: str = "bwrap"
    pools: list[SandboxPool] = field(default_factory=list)
    plugins: LoadedPlugins | None = None

    @property
    def workspace(self) -> Path:
        return self.tmp / "workspace"

    @property
    def plugins_dir(self) -> Path:
        return self.tmp / "plugins"

    def start(self, limits: SandboxLimits | None = None, *, max_workers: int = 2, **kwargs: Any) -> SandboxPool:
        if self.plugins is None:
            for name, source in PLUGINS.items():
                write_plugin(self.plugins_dir, name, source)
            # The gateway's own registry must know them too: it routes each call by its entry.
            self.plugins = load_plugins(self.plugins_dir, entry_points=False)
            assert all(s.ok for s in self.plugins.statuses), self.plugins.statuses
        policy = SandboxPolicy(self.workspace, (self.plugins_dir,))
        isolation = detect(self.mode, policy)
        assert isolation.level == self.mode, isolation.reason
        pool = SandboxPool(isolation, policy, limits or SandboxLimits(timeout=30), plugins_dir=self.plugins_dir,
                           plugin_entry_points=False, max_workers=max_workers, **kwargs)
        self.pools.append(pool)
        pool.start()
        registry.sandbox = pool
        registry.invalidate_check_fn_cache()
        return pool

    def call(self, name: str, args: dict[str, Any] | None = None, **ctx: Any) -> str:
        """One tool call as a run makes it: through the registry, with the run's workspace."""
        return registry.dispatch(name, args or {}, workspace=str(self.workspace), **ctx)

    def terminal(self, command: str, **args: Any) -> dict[str, Any]:
        result = json.loads(self.call("terminal", {"command": command, **args}))
        assert "error" not in result, result
        return result


@pytest.fixture(params=["bwrap", "unshare"])
def sandboxes(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sandboxes]:
    """Every pool test runs at both namespace levels: bubblewrap, and unshare where bubblewrap is missing."""
    if request.param == "bwrap":
        require_bwrap()
    registry.discover_builtin_tools()
    previous = registry.sandbox
    box = Sandboxes(tmp_path, request.param)
    try:
        yield box
    finally:
        registry.sandbox = previous
        registry.invalidate_check_fn_cache()
        for pool in box.pools:
            pool.close()
        if box.plugins is not None:
            box.plugins.unload()


def _commands(pids: list[int]) -> list[str]:
    names = []
    for pid in pids:
        with contextlib.suppress(OSError):
            names.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:60].strip())
    return names


def _error(result: str) -> str:
    payload = json.loads(result)
    assert isinstance(payload, dict) and "error" in payload, result
    return str(payload["error"])


# -- the same tools, elsewhere ------------------------------------------------------------------------------

def test_a_sandboxed_plugin_gives_the_result_it_gives_in_process(sandboxes: Sandboxes) -> None:
    sandboxes.start()
    args = {"text": "héllo wörld", "tags": ["b", "a"]}
    sandboxed = sandboxes.call("shout", args)
    entry = registry.get("shout")
    assert entry is not None and entry.isolation == "sandbox"
    assert sandboxed == registry.run_here(entry, args, {"workspace": str(sandboxes.workspace)})
    assert json.loads(sandboxed) == {"text": "HÉLLO WÖRLD!", "n": 11, "tags": ["a", "b"]}
    # ... and it really ran elsewhere: another process, as the sandbox's user.
    who = json.loads(sandboxes.call("whoami"))
    assert who["pid"] != os.getpid()
    if os.geteuid() == 0:
        assert who["uid"] == who["euid"] == NOBODY


# -- what a sandboxed tool sees -----------------------------------------------------------------------------

def test_no_variable_of_the_gateway_environment_reaches_the_sandbox(sandboxes: Sandboxes,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMES_CANARY_ENV", CANARY)
    monkeypatch.setenv("OPENAI_API_KEY", CANARY + "-openai")
    sandboxes.start()
    env = sandboxes.terminal("env -0")
    names = {item.split("=", 1)[0] for item in env["output"].split("\0") if "=" in item}
    # The worker's environment is built from scratch: a fixed set, plus what sh itself sets.
    assert names <= {"PATH", "HOME", "TMPDIR", "TERM", "USER", "LOGNAME", "SHELL", "LC_ALL", "LANG", "LANGUAGE",
                     "TZ", "PYTHONDONTWRITEBYTECODE", "HERMES_WORKSPACE", "PWD", "SHLVL", "OLDPWD", "_"}, names
    assert env["exit_code"] == 0 and "HERMES_WORKSPACE" in names
    for command in ("cat /proc/1/environ", "cat /proc/$PPID/environ", "cat /proc/*/environ",
                    "cat /proc/*/cmdline", "tr '\\0' '\\n' < /proc/self/environ"):
        output = sandboxes.terminal(f"{command} 2>&1")["output"]
        assert CANARY not in output, (command, output)
    # A plugin's Python code sees the same scrubbed environment.
    plugin_env = json.loads(sandboxes.call("whoami"))["env"]
    assert not {k: v for k, v in plugin_env.items() if CANARY in v or k in ("HERMES_CANARY_ENV", "OPENAI_API_KEY")}


def test_the_sandbox_cannot_see_the_gateway_process(sandboxes: Sandboxes) -> None:
    sandboxes.start()
    listing = sandboxes.terminal("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done")["output"]
    ours = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    assert ours not in listing and str(os.getpid()) not in listing.split(), listing
    # What is there: the sandbox's own init (bubblewrap's, or the jail's under unshare), its worker, and this
    # command's shell.
    assert {line.split()[0] for line in listing.splitlines() if line.strip()} <= {
        "/usr/bin/bwrap", "bwrap", sys.executable, "/bin/sh", "sh", "tr"}, listing
    # Its own PID namespace: a handful of processes, the shell's parent a small number.
    assert int(sandboxes.terminal("echo $PPID")["output"]) < 100


def test_files_outside_the_workspace_are_not_there(sandboxes: Sandboxes, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"model:\n  api_key: {CANARY}\n")
    config.chmod(0o644)  # even world-readable: not mounted, so not there
    sandboxes.start()
    (sandboxes.workspace / "link.yaml").symlink_to(config)  # a link planted in the workspace points nowhere
    for command in (f"cat {config}", "cat ../config.yaml", "cat link.yaml"):
        result = sandboxes.terminal(f"{command} 2>&1")
        assert result["exit_code"] != 0 and CANARY not in result["output"], (command, result)
    # Its directory is there only as the mount points' parent: the workspace and the plugins, nothing else.
    assert sandboxes.terminal(f"ls -A {tmp_path}")["output"].split() == ["plugins", "workspace"]
    found = sandboxes.terminal("find / -name config.yaml 2>/dev/null; echo done")
    assert str(tmp_path) not in found["output"] and found["output"].strip().endswith("done")
    grep = sandboxes.terminal(f"grep -rls {CANARY} /tmp /etc /root {tmp_path.parent}; echo done")
    assert grep["output"].strip() == "done", grep
    # The file tools are confined to the workspace before they get that far.
    for path in (str(config), "../config.yaml"):
        assert "outside the workspace" in _error(sandboxes.call("read_file", {"path": path}))
    assert CANARY not in sandboxes.call("read_file", {"path": "link.yaml"})


def test_the_workspace_is_writable_and_the_system_read_only(sandboxes: Sandboxes) -> None:
    sandboxes.start()
    wrote = sandboxes.terminal("echo made in the sandbox > made.txt && mkdir -p sub && cp made.txt sub/")
    assert wrote["exit_code"] == 0, wrote
    made = sandboxes.workspace / "sub" / "made.txt"
    assert made.read_text() == "made in the sandbox\n"
    for command in ("touch /usr/sandbox-was-here", "touch /etc/sandbox-was-here", "touch /sandbox-was-here",
                    f"touch {sandboxes.plugins_dir}/evil.py"):
        result = sandboxes.terminal(f"{command} 2>&1")
        assert result["exit_code"] != 0, (command, result)
    assert not Path("/usr/sandbox-was-here").exists() and not (sandboxes.plugins_dir / "evil.py").exists()
    if os.geteuid() == 0:
        assert made.stat().st_uid == NOBODY
    # /tmp is private to each worker and writable.
    assert sandboxes.terminal("echo x > /tmp/scratch && cat /tmp/scratch")["output"] == "x\n"


def test_commands_do_not_run_as_root(sandboxes: Sandboxes) -> None:
    if os.geteuid() != 0:
        pytest.skip("the switch to the sandbox's user happens when the gateway runs as root")
    sandboxes.start()
    ids = sandboxes.terminal("id -u; id -g; id -G; grep Cap /proc/self/status")["output"].splitlines()
    assert ids[:3] == [str(NOBODY)] * 3
    caps = dict(line.split(":\t") for line in ids[3:])
    assert int(caps["CapEff"], 16) == 0 and int(caps["CapPrm"], 16) == 0, caps


# -- network ---------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _listener() -> Iterator[socket.socket]:
    """A TCP socket listening on 127.0.0.1 (the kernel completes handshakes without accept())."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        yield server


def _accepted(server: socket.socket) -> int:
    count = 0
    while True:
        try:
            conn, _ = server.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def _connect_command(port: int) -> str:
    return (f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5); "
            f"print('connected')\" 2>&1")


def test_terminal_has_no_network(sandboxes: Sandboxes) -> None:
    sandboxes.start()
    with _listener() as server:
        port = server.getsockname()[1]
        result = sandboxes.terminal(_connect_command(port))
        assert result["exit_code"] != 0 and "connected\n" not in result["output"], result
        assert _accepted(server) == 0
        # The control: with the network granted (tools.network: {terminal: true}) the same command connects,
        # so the refusal above is the namespace, not the command.
        sandboxes.start(network={"terminal": True})
        granted = sandboxes.terminal(_connect_command(port))
        assert granted == {"exit_code": 0, "output": "connected\n"}
        assert _accepted(server) == 1


async def test_a_network_tool_reaches_a_server_while_terminal_does_not(sandboxes: Sandboxes) -> None:
    seen: list[str] = []

    async def page(request: web.Request) -> web.Response:
        seen.append(request.headers.get("User-Agent", ""))
        return web.Response(text="<html><title>Local page</title><body><p>reached from the sandbox</p></body></html>",
                            content_type="text/html")

    app = web.Application()
    app.router.add_get("/page", page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        sandboxes.start(settings=ToolSettings(allow_private_networks=("127.0.0.1/32",)))
        # The pool blocks its caller (a tool thread in the gateway): keep this loop free to serve the page.
        result = json.loads(await asyncio.to_thread(sandboxes.call, "web_extract",
                                                    {"urls": [f"http://127.0.0.1:{port}/page"]}))
        [fetched] = result  # one result per URL
        assert fetched["status"] == 200 and fetched["title"] == "Local page", fetched
        assert "reached from the sandbox" in fetched["content"]
        assert len(seen) == 1
        terminal = json.loads(await asyncio.to_thread(
            sandboxes.call, "terminal", {"command": f"python3 -c \"import urllib.request; urllib.request.urlopen("
                                                    f"'http://127.0.0.1:{port}/page', timeout=5)\""}))
        assert terminal["exit_code"] != 0 and len(seen) == 1
    finally:
        await runner.cleanup()


# -- limits ------------------------------------------------------------------------------------------------

def test_a_hanging_handler_is_killed_at_the_timeout_and_replaced(sandboxes: Sandboxes) -> None:
    pool = sandboxes.start(SandboxLimits(timeout=2))
    assert "HÉ" in sandboxes.call("shout", {"text": "hé"})
    error = _error(sandboxes.call("hang"))
    assert "hang: timed out after 2 s" in error and "killed" in error
    assert (sandboxes.workspace / "hang-started").exists()
    assert pool.stats()["killed"] == 1 and pool.stats()["calls"].get("timeout") == 1
    assert json.loads(sandboxes.call("shout", {"text": "again"}))["text"] == "AGAIN!"
    if os.geteuid() == 0:
        wait_until(lambda: len(descendant_processes(NOBODY)) == pool.stats()["idle"], HANG_GUARD,
                   "the killed worker is gone")


def test_a_cpu_spinning_handler_ends_at_the_cpu_limit(sandboxes: Sandboxes) -> None:
    pool = sandboxes.start(SandboxLimits(timeout=30, cpu_seconds=1))
    error = _error(sandboxes.call("spin"))
    assert "spin:" in error and "CPU time limit" in error and "(1 s)" in error, error
    assert pool.stats()["killed"] == 1 and pool.stats()["calls"].get("cpu_limit") == 1
    assert json.loads(sandboxes.call("shout", {"text": "alive"}))["text"] == "ALIVE!"


def test_memory_bombs_end_in_errors(sandboxes: Sandboxes) -> None:
    pool = sandboxes.start(SandboxLimits(timeout=30, memory_mb=512))
    bomb = sandboxes.terminal("python3 -c \"b = bytearray(8 * 1024 ** 3); print('allocated')\" 2>&1")
    assert bomb["exit_code"] != 0 and "allocated" not in bomb["output"], bomb
    assert "MemoryError" in bomb["output"] or bomb["exit_code"] in (137, -9), bomb
    error = _error(sandboxes.call("hog"))
    assert "hog" in error and ("MemoryError" in error or "out of memory" in error or "killed" in error), error
    assert json.loads(sandboxes.call("shout", {"text": "still here"}))["text"] == "STILL HERE!"
    assert pool.stats()["started"] >= 1


def test_a_fork_bomb_is_contained_and_leaves_nothing_behind(sandboxes: Sandboxes) -> None:
    pool = sandboxes.start(SandboxLimits(timeout=30))  # the default process limit (128)
    written = json.loads(sandboxes.call("write_file", {"path": "bomb.sh", "content": FORK_BOMB}))
    assert "error" not in written, written
    result = json.loads(sandboxes.call("terminal", {"command": "sh bomb.sh; wait", "timeout": 5}))
    # It ran (not refused by the blocklist) and was stopped: by the process limit (forks fail, the bomb dies
    # out) or, if it outlives the terminal's timeout, by the kill of its process group.
    if "error" in result:
        assert "timed out" in result["error"], result
    else:
        assert result["exit_code"] != 0 or "Cannot fork" in result["output"], result
    if os.geteuid() == 0:
        # Every process of the bomb is gone: only the pool's idle workers run as the sandbox's user.
        wait_until(lambda: len(descendant_processes(NOBODY)) == pool.stats()["idle"] > 0, HANG_GUARD,
                   "only idle workers are left")
    assert sandboxes.terminal("echo after the bomb") == {"exit_code": 0, "output": "after the bomb\n"}


def test_processes_a_call_leaves_behind_do_not_outlive_it(sandboxes: Sandboxes) -> None:
    """Workers are long-lived and serve every session: whatever one call starts must end with it, or a later
    call (another user's) shares its PID namespace with it (same uid: its /proc, its pipes)."""
    if os.geteuid() != 0:
        pytest.skip("counts the processes of the sandbox's user, which it has only when the gateway runs as root")
    pool = sandboxes.start(SandboxLimits(timeout=30), max_workers=1)
    detached = sandboxes.terminal("sleep 300 > /dev/null 2>&1 & echo detached")
    assert detached == {"exit_code": 0, "output": "detached\n"}
    escaped = json.loads(sandboxes.call("terminal", {"command": "setsid sleep 301 > /dev/null 2>&1 & sleep 60",
                                                     "timeout": 1}))
    assert "timed out" in escaped["error"]
    wait_until(lambda: len(descendant_processes(NOBODY)) == pool.stats()["idle"], 10,
               lambda: f"only idle workers are left ({_commands(descendant_processes(NOBODY))} for "
                       f"{pool.stats()['idle']} idle workers)")
    assert "sleep" not in sandboxes.terminal("ps -eo comm")["output"]


def test_the_runs_cancel_event_ends_a_call(sandboxes: Sandboxes) -> None:
    pool = sandboxes.start(SandboxLimits(timeout=600))
    cancel = threading.Event()
    results: list[str] = []
    caller = threading.Thread(target=lambda: results.append(sandboxes.call("hang", cancel_event=cancel)))
    caller.start()
    try:
        wait_until((sandboxes.workspace / "hang-started").exists, HANG_GUARD, "the hanging tool started")
        cancel.set()
        caller.join(HANG_GUARD)
        assert not caller.is_alive(), "the call did not end when its run was cancelled"
    finally:
        cancel.set()
        caller.join(HANG_GUARD)
    [result] = results
    assert "hang: cancelled" in _error(result)
    assert pool.stats()["killed"] == 1 and pool.stats()["calls"].get("cancelled") == 1


def test_a_call_waiting_for_a_busy_worker_ends_when_its_run_is_cancelled(sandboxes: Sandboxes) -> None:
    """/stop must not wait for another run's tool: a call queued behind a busy pool ends on its cancel event."""
    pool = sandboxes.start(SandboxLimits(timeout=30), max_workers=1)
    first_cancel, second_cancel = threading.Event(), threading.Event()
    results: dict[str, str] = {}

    def call(name: str, marker: str, cancel: threading.Event) -> None:
        results[name] = sandboxes.call("hang", {"marker": marker}, cancel_event=cancel)

    first = threading.Thread(target=call, args=("first", "first-started", first_cancel))
    second = threading.Thread(target=call, args=("second", "second-started", second_cancel))
    first.start()
    try:
        wait_until((sandboxes.workspace / "first-started").exists, HANG_GUARD, "the first call holds the worker")
        second.start()
        second_cancel.set()  # its run is stopped while it waits for the only worker
        second.join(10)
        assert not second.is_alive(), "the cancelled call kept waiting for the busy worker"
        assert "cancelled" in _error(results["second"])
        assert first.is_alive() and not (sandboxes.workspace / "second-started").exists()
    finally:
        first_cancel.set()
        second_cancel.set()
        first.join(HANG_GUARD)
        second.join(HANG_GUARD)
    assert pool.stats()["calls"].get("cancelled") == 2


def test_a_tools_own_timeout_extends_the_wall_clock(sandboxes: Sandboxes) -> None:
    pool = sandboxes.start(SandboxLimits(timeout=1))
    # The terminal's own timeout (3 s) wins over the pool's 1 s: the tool reports it, and its worker lives on.
    result = json.loads(sandboxes.call("terminal", {"command": "sleep 60", "timeout": 3}))
    assert result["error"].startswith("command timed out after 3s"), result
    assert pool.stats()["killed"] == 0
    # A tool without a timeout parameter gets the pool's limit whatever it is passed.
    assert "hang: timed out after 1 s" in _error(sandboxes.call("hang", {"timeout": 60}))


def test_file_size_and_open_file_limits(sandboxes: Sandboxes) -> None:
    sandboxes.start(SandboxLimits(timeout=30, file_size_mb=1, open_files=32))
    big = sandboxes.terminal("head -c 3000000 /dev/zero > big.bin; echo status $?")
    assert "status 0" not in big["output"], big
    assert (sandboxes.workspace / "big.bin").stat().st_size <= 1024 * 1024
    files = sandboxes.terminal("python3 -c \"import tempfile; [tempfile.TemporaryFile() for _ in range(64)]\" 2>&1")
    assert files["exit_code"] != 0 and "Too many open files" in files["output"], files


# -- detection and refusal -----------------------------------------------------------------------------------

def test_detect_names_the_missing_bubblewrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    isolation = detect("bwrap", SandboxPolicy(tmp_path / "workspace"))
    assert isolation.level == "unavailable" and not isolation.available
    assert "bubblewrap" in isolation.reason and isolation.requested == "bwrap"


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid level needs root, and says so first")
def test_the_uid_level_refuses_only_files_other_users_can_reach() -> None:
    """A 0644 config in a 0700 directory is not readable by the sandbox's user: no refusal for it (the probe then
    goes on to start the interpreter as that user); in a directory others may enter it is refused, by name."""
    with tempfile.TemporaryDirectory(dir="/tmp") as base:  # pytest's tmp_path sits in a 0700 directory
        root = Path(base)
        root.chmod(0o755)
        private, shared = root / "private", root / "shared"
        for directory, mode in ((private, 0o700), (shared, 0o755)):
            directory.mkdir()
            (directory / "config.yaml").write_text("model: {}\n")
            (directory / "config.yaml").chmod(0o644)
            directory.chmod(mode)
        hidden = detect("uid", SandboxPolicy(root / "workspace", sensitive=(private / "config.yaml",)))
        assert "readable by other users" not in hidden.reason, hidden.reason
        reachable = detect("uid", SandboxPolicy(root / "workspace", sensitive=(shared / "config.yaml",)))
    assert reachable.level == "unavailable"
    assert f"the gateway's files are readable by other users: chmod o-r {shared / 'config.yaml'}" in reachable.reason


def test_detect_none_is_a_choice() -> None:
    isolation = detect("none", SandboxPolicy(Path("/nonexistent/workspace")))
    assert isolation.level == "none" and isolation.available
    assert isolation.describe().startswith("none: ")


def test_an_unavailable_sandbox_refuses_sandboxed_tools_without_running_them(tmp_path: Path) -> None:
    ran: list[str] = []

    def handler(name: str) -> Callable[..., str]:
        return lambda args, **ctx: ran.append(name) or f"{name} ran"

    tools = ToolRegistry()
    schema = {"description": "x", "parameters": {"type": "object", "properties": {}}}
    tools.register("run_command", "custom", schema, handler("run_command"))
    tools.register("own_state", "custom", schema, handler("own_state"), isolation=ISOLATION_PROCESS)
    tools.sandbox = SandboxPool(Isolation("unavailable", "bubblewrap is not installed", "bwrap"),
                                SandboxPolicy(tmp_path / "workspace"))
    assert tools.available(["run_command", "own_state"]) == ["own_state"]
    assert "bubblewrap is not installed" in (tools.unavailable_reason("run_command") or "")
    assert [d["function"]["name"] for d in tools.get_definitions(["run_command", "own_state"])] == ["own_state"]
    error = _error(tools.dispatch("run_command", {}))
    assert error.startswith("run_command is unavailable") and "bubblewrap is not installed" in error
    assert tools.dispatch("own_state", {}) == "own_state ran"
    assert ran == ["own_state"]
    assert not (tmp_path / "workspace").exists()  # nothing was started for it


def test_private_tmp_is_emptied_between_calls(sandboxes: Sandboxes) -> None:
    """Workers serve every session: what one call leaves in /tmp (HOME) is gone before the next call."""
    sandboxes.start(SandboxLimits(timeout=30), max_workers=1)
    assert sandboxes.terminal("echo from-session-a > /tmp/left.txt && mkdir -p ~/.cache/x && echo ok")["output"] \
        == "ok\n"
    assert sandboxes.terminal("cat /tmp/left.txt") == {"exit_code": 1,
                                                       "output": "cat: /tmp/left.txt: No such file or directory\n"}
    mounted = [sandboxes.workspace, sandboxes.plugins_dir, *python_paths()]  # a checkout under /tmp too (CI's)
    holders = {path.parts[2] for path in mounted if path.is_relative_to("/tmp")}
    assert set(sandboxes.terminal("ls -A /tmp")["output"].split()) == holders  # HOME is /tmp: no ~/.cache
    # The workspace survives (here it sits under /tmp: the directory holding its mount point is kept).
    assert (sandboxes.workspace / "kept.txt").write_text("kept") and sandboxes.terminal("cat kept.txt")["output"] \
        == "kept"


def test_a_burst_grows_the_pool_and_the_quiet_after_it_shrinks_it(sandboxes: Sandboxes,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Slow calls each hold a worker, so a burst starts more of them (up to max_workers); idle ones beyond the
    first are stopped once they have been idle for IDLE_SECONDS (here 0: at the next release)."""
    pool = sandboxes.start(SandboxLimits(timeout=30), max_workers=3)
    callers = [threading.Thread(target=sandboxes.terminal, args=("sleep 1",)) for _ in range(3)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(HANG_GUARD)
    wait_until(lambda: pool.stats()["idle"] >= 3, HANG_GUARD, "the burst left three idle workers of its kind")
    monkeypatch.setattr(pool_module, "IDLE_SECONDS", 0.0)
    assert sandboxes.terminal("echo still here") == {"exit_code": 0, "output": "still here\n"}
    stats = pool.stats()
    assert stats["idle"] == 2 and stats["killed"] == 0  # one of each kind: the web kind's prestarted worker
