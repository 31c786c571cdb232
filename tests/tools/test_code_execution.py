"""``execute_code``: scripts in real bubblewrap workers, their limits, the generated ``hermes_tools`` module, and the
schema that lists only the tools a script may call."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import signal
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import model_tools
from tests.sandbox_support import require_bwrap, wait_until
from tools.code_execution_tool import (
    CodeExecutionSettings,
    client_module,
    configure_execute_code,
    execute_code_definition,
)
from tools.registry import ISOLATION_PROCESS, ToolEntry, registry
from tools.sandbox import Isolation, SandboxLimits, SandboxPolicy, SandboxPool, ToolSettings, detect
from tools.sandbox.policy import NOBODY

CANARY = "zq7canary-code-execution-4e1b9d0c"
HANG_GUARD = 60.0  # seconds: only a broken sandbox takes this long
# What the module's pool and this process use: small enough that the limits are quick to reach.
SETTINGS = CodeExecutionSettings(max_timeout=20.0, memory_mb=256, max_tool_calls=3)
PRIMES = """
from hermes_tools import read_file
primes = [n for n in range(2, 10_000) if all(n % d for d in range(2, int(n ** 0.5) + 1))]
print(sum(primes))
print(read_file("notes.txt")["content"])
"""


@dataclass
class Box:
    pool: SandboxPool
    workspace: Path

    def run(self, args: dict[str, Any], enabled: set[str] | None = None, **ctx: Any) -> dict[str, Any]:
        """One call as a run makes it: through ``handle_function_call`` (so the run's allowance travels with it),
        into a worker."""
        allowed = frozenset(enabled) if enabled is not None else None
        return json.loads(model_tools.handle_function_call("execute_code", args, enabled_tools=allowed,
                                                           workspace=str(self.workspace), **ctx))

    def here(self, args: dict[str, Any], **ctx: Any) -> dict[str, Any]:
        """The handler in this process (no sandbox): what the sandbox adds is then what differs."""
        entry = registry.get("execute_code")
        assert entry is not None
        return json.loads(registry.run_here(entry, args, {"workspace": str(self.workspace), **ctx}))


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    require_bwrap()
    registry.discover_builtin_tools()
    workspace = tmp_path_factory.mktemp("code") / "workspace"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("the answer is 42\n")
    policy = SandboxPolicy(workspace)
    isolation = detect("bwrap", policy)
    assert isolation.level == "bwrap", isolation.reason
    # A short pool limit: execute_code's own default timeout (30 s) must extend it, as the tool enforces its own.
    pool = SandboxPool(isolation, policy, SandboxLimits(timeout=2), settings=ToolSettings(execute_code=SETTINGS),
                       max_workers=2)
    pool.start()
    previous = registry.sandbox
    registry.sandbox = pool
    configure_execute_code(SETTINGS)  # as the gateway applies its tool settings
    try:
        yield Box(pool, workspace)
    finally:
        registry.sandbox = previous
        configure_execute_code(CodeExecutionSettings())
        pool.close()


@pytest.fixture(autouse=True)
def _fresh_plans() -> None:
    model_tools.clear_definition_cache()


def _description(toolsets: list[str]) -> str:
    [definition] = [d for d in model_tools.get_tool_plan(toolsets).definitions
                    if d["function"]["name"] == "execute_code"]
    return str(definition["function"]["description"])


# -- what a script does, in the sandbox -------------------------------------------------------------------------

def test_a_script_computes_and_reads_a_workspace_file_through_the_generated_module(box: Box) -> None:
    result = box.run({"code": PRIMES + "import os\nprint(os.getuid())"})
    assert result["exit_code"] == 0, result
    total, notes, uid = result["stdout"].splitlines()
    assert total == "5736396" and notes.endswith("|the answer is 42"), result
    assert result["tool_calls"] == 1 and result["stderr"] == ""
    if os.geteuid() == 0:  # it ran in the sandbox, as the sandbox's user
        assert uid == str(NOBODY)
    # The handler's own default timeout (30 s) outlasts the pool's 2 s: the pool waits for it.
    slow = box.run({"code": "import time\ntime.sleep(3)\nprint('awake')"})
    assert slow["stdout"] == "awake\n", slow
    assert box.pool.stats()["killed"] == 0


def test_a_script_may_call_only_the_runs_sandboxed_tools(box: Box) -> None:
    code = textwrap.dedent("""
        import hermes_tools
        print(json.dumps(hermes_tools.__all__))
        print(json.dumps(hermes_tools._call("search_files", {"pattern": "answer"})))
        print(json.dumps(hermes_tools._call("memory", {"action": "read"})))
        print(json.dumps(hermes_tools.read_file("notes.txt", limit=1)["total_lines"]))
    """)
    result = box.run({"code": "import json\n" + code}, {"execute_code", "read_file", "memory", "terminal"})
    offered, search, memory, lines = (json.loads(line) for line in result["stdout"].splitlines())
    # Not memory (the gateway's own state), nor execute_code itself; search_files is not the run's to use.
    assert offered == ["read_file", "terminal"], result
    assert search["error"] == ("search_files cannot be called from this script (the tools it may call: read_file, "
                               "terminal)")
    assert memory["error"].startswith("memory cannot be called"), memory
    assert lines == 1 and result["tool_calls"] == 1
    # Without an allowance (a caller with no plan), every available sandboxed tool, still not the process ones.
    everything = json.loads(box.run({"code": "import hermes_tools, json\nprint(json.dumps(hermes_tools.__all__))"})
                            ["stdout"])
    assert {"read_file", "search_files", "terminal", "write_file", "patch"} <= set(everything)
    assert not {"memory", "todo", "execute_code", "web_extract", "send_file"} & set(everything), everything


def test_a_script_makes_at_most_its_share_of_tool_calls(box: Box) -> None:
    code = "from hermes_tools import read_file\nfor _ in range(5):\n    print(json.dumps(read_file('notes.txt')))"
    result = box.run({"code": "import json\n" + code})
    answers = [json.loads(line) for line in result["stdout"].splitlines()]
    assert [("error" in a) for a in answers] == [False, False, False, True, True], answers
    assert answers[3]["error"] == "this script already made 3 tool calls, the most one script may make"
    assert result["tool_calls"] == 3


def test_a_script_lowering_its_workers_limits_retires_that_worker(box: Box) -> None:
    """A script is the worker's child and the same user: it can lower the worker's limits (prlimit), which would
    break every later call in that worker, maybe another user's. The worker notices after the call and is replaced."""
    before = box.pool.stats()
    lowered = box.run({"code": "import os, resource\n"
                               "resource.prlimit(os.getppid(), resource.RLIMIT_FSIZE, (1024, 1024))\nprint('done')"})
    assert lowered["stdout"] == "done\n", lowered
    assert box.pool.stats()["killed"] == before["killed"] + 1  # retired and replaced, not reused
    write = "import pathlib\np = pathlib.Path('/tmp/big')\np.write_bytes(bytes(100_000))\nprint(p.stat().st_size)"
    for _ in range(3):  # whichever worker takes them, later calls may write files past 1 KB
        assert box.run({"code": write})["stdout"] == "100000\n"


def test_a_script_cannot_read_its_workers_memory(box: Box) -> None:
    """The worker is not dumpable: its /proc/<pid>/mem (where code serving later calls could be planted) is closed
    to the processes its calls start. (As root, the switch to the sandbox's user already clears it; the worker's
    explicit prctl covers a gateway that does not run as root.)"""
    result = box.run({"code": "import os\ntry:\n    open(f'/proc/{os.getppid()}/mem', 'rb')\n"
                              "except OSError as exc:\n    print(type(exc).__name__)\nelse:\n    print('opened')"})
    assert result["stdout"] == "PermissionError\n", result


def test_an_endless_script_is_killed_at_its_timeout_and_the_worker_lives_on(box: Box) -> None:
    before = box.pool.stats()
    result = box.run({"code": "print('spinning', flush=True)\nwhile True:\n    pass", "timeout": 1})
    assert result["error"] == ("execute_code: timed out after 1 s; the script was killed (its timeout argument "
                               "allows up to 20 s)"), result
    assert result["stdout"] == "spinning\n"
    # The script was killed, not its worker: no worker killed or dead (workers the pool starts meanwhile for its
    # idle reserve do not count), and the next script runs.
    after = box.pool.stats()
    assert (after["killed"], after["calls"].get("died", 0)) == (before["killed"], before["calls"].get("died", 0))
    assert after["calls"].get("timeout", 0) == before["calls"].get("timeout", 0)
    assert box.run({"code": "print(6 * 7)"})["stdout"] == "42\n"
    # The timeout argument is capped by the settings.
    configure_execute_code(dataclasses.replace(SETTINGS, max_timeout=1))
    try:
        capped = box.here({"code": "import time\ntime.sleep(60)", "timeout": 1000})
    finally:
        configure_execute_code(SETTINGS)
    assert capped["error"].startswith("execute_code: timed out after 1 s"), capped


def test_what_a_timed_out_script_started_is_killed_with_it(box: Box) -> None:
    code = textwrap.dedent("""
        import pathlib, subprocess
        child = subprocess.Popen(["sleep", "300"])
        pathlib.Path("child.pid").write_text(str(child.pid))
        while True:
            pass
    """)
    assert "timed out after 1 s" in box.here({"code": code, "timeout": 1})["error"]
    pid = int((box.workspace / "child.pid").read_text())

    def gone() -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
        except OSError:
            return True

    wait_until(gone, HANG_GUARD, f"process {pid}, the script's child, is gone")


def test_a_script_past_its_memory_limit_gets_a_clear_error(box: Box) -> None:
    killed = box.pool.stats()["killed"]
    result = box.run({"code": "print('before', flush=True)\nblock = bytearray(400 * 1024 ** 2)\nprint('after')"})
    assert result["error"] == "execute_code: the script ran out of memory (its limit is 256 MB)", result
    assert result["stdout"] == "before\n" and result["stderr"].rstrip().endswith("MemoryError")
    # Below the limit, memory is there to use: the limit is the script's, not lower.
    assert box.run({"code": "block = bytearray(100 * 1024 ** 2)\nprint(len(block))"})["stdout"] == "104857600\n"
    assert box.pool.stats()["killed"] == killed


def test_the_gateways_environment_does_not_reach_a_script(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMES_CANARY_CODE", CANARY)
    code = textwrap.dedent("""
        import os, pathlib
        print(dict(os.environ))
        for path in ("/proc/self/environ", "/proc/1/environ", "/proc/2/environ"):
            try:
                print(path, pathlib.Path(path).read_bytes())
            except OSError as exc:
                print(path, type(exc).__name__)
    """)
    sandboxed = box.run({"code": code})
    assert sandboxed["exit_code"] == 0 and "HERMES_WORKSPACE" in sandboxed["stdout"], sandboxed
    assert CANARY not in json.dumps(sandboxed)
    # In this process too, the script's environment is an allowlist (the sandbox's worker has none to pass on).
    here = box.here({"code": "import os\nprint(sorted(os.environ))"})
    assert CANARY not in json.dumps(here) and "HERMES_CANARY_CODE" not in here["stdout"]
    assert os.environ["HERMES_CANARY_CODE"] == CANARY


def test_exits_and_signals_are_reported(box: Box) -> None:
    failed = box.here({"code": "print('partial')\nraise ValueError('no such thing')"})
    assert failed["exit_code"] == 1 and "error" not in failed  # the script's own failure is a result, as terminal's
    assert failed["stdout"] == "partial\n" and "ValueError: no such thing" in failed["stderr"]
    crashed = box.here({"code": f"import os\nos.kill(os.getpid(), {int(signal.SIGSEGV)})"})
    assert crashed["error"] == "execute_code: the script was killed by SIGSEGV", crashed
    assert box.here({"code": "import sys\nsys.exit(3)"})["exit_code"] == 3


def test_long_output_keeps_its_start_and_end(box: Box) -> None:
    result = box.here({"code": "print('START' + 'x' * 100_000 + 'END')"})
    out = result["stdout"]
    assert out.startswith("START") and out.endswith("END\n") and len(out) < 41_000, len(out)
    assert "[... 60009 bytes omitted ...]" in out


@pytest.mark.parametrize(("args", "error"), [
    ({}, "code must be a non-empty string of Python source"),
    ({"code": "  \n"}, "code must be a non-empty string of Python source"),
    ({"code": "print(1)", "timeout": -1}, "timeout must be a positive number of seconds (at most 20)"),
    ({"code": "print(1)", "timeout": True}, "timeout must be a positive number of seconds (at most 20)"),
    ({"code": "print(1)", "timeout": "soon"}, "timeout must be a positive number of seconds (at most 20)"),
])
def test_bad_arguments_are_refused_before_anything_runs(box: Box, args: dict[str, Any], error: str) -> None:
    assert box.here(args) == {"error": error}


# -- the schema and the generated module ---------------------------------------------------------------------------

def test_the_schema_lists_only_the_tools_a_script_may_call(box: Box) -> None:
    with_files = _description(["code_execution", "file"])
    assert "from hermes_tools import patch, read_file, search_files, write_file" in with_files
    assert "- read_file(path, offset=None, limit=None): Read a text file from the workspace." in with_files
    assert "at most 256 MB of memory" in with_files and "(default 20, at most 20)" in with_files
    assert "At most 3 calls a script" in with_files
    # A toolset without search_files: not mentioned at all.
    terminal_only = _description(["code_execution", "terminal"])
    assert "(from hermes_tools import terminal)" in terminal_only
    assert "search_files" not in terminal_only and "read_file" not in terminal_only
    # The gateway's own state and the network tools (execute_code has no network) are never offered.
    core = _description(["hermes-core"])
    for absent in ("memory", "todo", "cronjob", "clarify", "web_search", "web_extract", "send_file"):
        assert f"{absent}(" not in core, absent
    assert "It cannot call any tool in this session." in _description(["code_execution", "memory", "web"])


def test_with_network_the_web_tools_are_offered_too(box: Box) -> None:
    configure_execute_code(CodeExecutionSettings(network=True))
    try:
        description = execute_code_definition(["web_extract", "read_file", "memory"])["function"]["description"]
    finally:
        configure_execute_code(SETTINGS)
    assert "(from hermes_tools import read_file, web_extract)" in description
    assert "with network access" in description


def test_without_a_sandbox_execute_code_is_not_offered(box: Box) -> None:
    registry.sandbox = None
    registry.invalidate_check_fn_cache()
    try:
        names = {d["function"]["name"] for d in model_tools.get_tool_plan(["code_execution", "file"]).definitions}
    finally:
        registry.sandbox = box.pool
        registry.invalidate_check_fn_cache()
    assert "read_file" in names and "execute_code" not in names


def test_the_generated_module_is_python_with_one_function_per_tool(box: Box) -> None:
    odd = {"type": "object", "properties": {"from": {"type": "string"}, "a-b": {"type": "integer"}}}
    assert registry.register("odd_params", "test", {"description": "Odd names. More.", "parameters": odd},
                             lambda args, **ctx: json.dumps(args))
    assert registry.register("gateway_state", "test", {"description": "x"}, lambda args, **ctx: "",
                             isolation=ISOLATION_PROCESS)
    try:
        source = client_module(["read_file", "odd_params"])
        tree = ast.parse(source)
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert set(functions) == {"_receive", "_call", "read_file", "odd_params"}
        assert ast.get_docstring(functions["odd_params"]) == "Odd names."
        assert [a.arg for a in functions["read_file"].args.args] == ["path", "offset", "limit"]
        assert functions["odd_params"].args.kwarg is not None  # names Python cannot take: keyword arguments
        code = "import json, hermes_tools\nprint(json.dumps(hermes_tools.odd_params(**{'from': 1, 'a-b': 2})))"
        result = box.here({"code": code}, enabled_tools=["odd_params", "gateway_state"])
        assert json.loads(result["stdout"]) == {"from": 1, "a-b": 2}, result
        definition = execute_code_definition(["odd_params", "gateway_state", "execute_code"])
        assert "odd_params(**kwargs): Odd names." in definition["function"]["description"]
        assert "gateway_state" not in definition["function"]["description"]
    finally:
        registry.deregister("odd_params")
        registry.deregister("gateway_state")


def test_the_pool_takes_a_tools_default_timeout_as_its_own() -> None:
    """The pool waits for a tool that enforces its own timeout (execute_code's default: 30 s) even when its
    argument is left out; the tool then reports its own timeout, and its worker lives on."""
    pool = SandboxPool(Isolation("none", "test"), SandboxPolicy(Path("/nonexistent")), SandboxLimits(timeout=2))
    entry = ToolEntry("t", "test", {"parameters": {"properties": {"timeout": {"type": "number", "default": 30}}}},
                      lambda args, **ctx: "")
    assert pool._timeout_for(entry, {}) == 35
    assert pool._timeout_for(entry, {"timeout": 10}) == 15
    assert pool._timeout_for(entry, {"timeout": None}) == 2  # given, but not a number: the pool's own
    assert pool._timeout_for(registry.get("execute_code") or entry, {}) == 35
