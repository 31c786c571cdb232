"""The ``execute_code`` tool: run a Python script the model writes, which may call the session's sandboxed tools.

The handler runs in a sandbox worker like any sandboxed tool; the script runs as that worker's child with its own
wall clock and memory limit (``tools.code_runner``). A module generated for the call, ``hermes_tools``, gives the
script one function per tool it may call: the sandboxed tools the run may use (``enabled_tools`` in the call's
context), never ``execute_code`` itself nor a tool of the gateway's own state. Their calls come back to this
handler, which runs them here, in the same worker: same confinement, same workspace. The schema the model sees
lists exactly those tools (``execute_code_definition``, called when a run's tool plan is built).
"""

from __future__ import annotations

import keyword
import os
import re
import signal
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.code_runner import MAX_FRAME_BYTES, TOOLS_FD_ENV, ScriptRun, memory_limit_mb, run_script
from tools.registry import (
    EFFECT_RUNS_COMMANDS,
    EFFECT_SENDS_MESSAGES,
    EFFECT_WRITES_FILES,
    ISOLATION_SANDBOX,
    ToolEntry,
    registry,
    tool_error,
    tool_result,
)
from tools.workspace import WorkspaceError, workspace_root

NAME = "execute_code"
CLIENT_MODULE = "hermes_tools"
DEFAULT_TIMEOUT_SECONDS = 30.0
_SUMMARY_CHARS = 160
_FIRST_SENTENCE = re.compile(r"(?<=[.!?])\s")


@dataclass(frozen=True, slots=True)
class CodeExecutionSettings:
    """``tools.execute_code`` in the config, and whether the tool's sandbox has the network
    (``tools.network.execute_code``): tools that need it are not offered to the script otherwise."""

    max_timeout: float = 300.0
    memory_mb: int = 512  # address space of the script (at most the sandbox's own limit)
    max_tool_calls: int = 50
    network: bool = False


_settings = CodeExecutionSettings()


def configure_execute_code(settings: CodeExecutionSettings) -> None:
    """Use ``settings`` in this process (the gateway, and each sandbox worker)."""
    global _settings
    if settings != _settings:
        _settings = settings
        registry.invalidate_check_fn_cache()  # cached definitions quote the settings


# -- what a script may call -----------------------------------------------------------------------------------

def _is_function_name(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("_")


def callable_tools(names: Iterable[str]) -> list[str]:
    """The tools among ``names`` a script may call, sorted: sandboxed ones (they run in the script's own sandbox),
    without those needing the network unless ``execute_code`` has it, named as a Python function can be. Not
    those that send messages: they act through their result (``send_file``'s attachment), which only the agent
    reads."""
    out = []
    for name in sorted(set(names)):
        entry = registry.get(name)
        if (entry is not None and name != NAME and entry.isolation == ISOLATION_SANDBOX and _is_function_name(name)
                and (_settings.network or not entry.network) and EFFECT_SENDS_MESSAGES not in entry.effects):
            out.append(name)
    return out


def _parameters(entry: ToolEntry) -> tuple[list[str], list[str]] | None:
    """(required, optional) parameter names of a tool, or None when they cannot all be Python parameters."""
    params = entry.schema.get("parameters") or {}
    properties = list(params.get("properties") or {})
    required = [p for p in params.get("required") or () if p in properties]
    if not all(isinstance(p, str) and p.isidentifier() and not keyword.iskeyword(p) for p in properties):
        return None
    return required, [p for p in properties if p not in required]


def _signature(entry: ToolEntry) -> str:
    params = _parameters(entry)
    if params is None:
        return "**kwargs"
    required, optional = params
    return ", ".join([*required, *(f"{p}=None" for p in optional)])


def _summary(entry: ToolEntry) -> str:
    text = " ".join(entry.description.split())
    first = _FIRST_SENTENCE.split(text, maxsplit=1)[0]
    return first if len(first) <= _SUMMARY_CHARS else first[:_SUMMARY_CHARS - 1] + "…"


# -- the schema -----------------------------------------------------------------------------------------------

def execute_code_schema(tools: Sequence[str] | None) -> dict[str, Any]:
    """The tool's schema; ``tools`` are the ones a script may call (None: not known yet, described generally)."""
    settings = _settings
    network = "with network access" if settings.network else "without network"
    default = min(DEFAULT_TIMEOUT_SECONDS, settings.max_timeout)
    description = (
        "Run a Python 3 script and get its exit code, stdout and stderr. Use it to compute, to process data, or to "
        "chain several tool calls with logic between them in one step; print what you need to see (long output "
        "keeps its start and end). The script runs in the sandbox, in the workspace (its current directory), "
        f"{network}, with no credentials, at most {settings.memory_mb} MB of memory and the timeout argument's "
        f"seconds (default {default:g}, at most {settings.max_timeout:g}).")
    if tools is None:
        description += (f" It may call the session's other sandboxed tools as functions of the {CLIENT_MODULE} "
                        f"module, at most {settings.max_tool_calls} calls a script.")
    elif tools:
        listing = "\n".join(f"- {name}({_signature(entry)}): {_summary(entry)}"
                            for name in tools if (entry := registry.get(name)) is not None)
        description += (
            f" It may call these tools as functions (from {CLIENT_MODULE} import {', '.join(tools)}); each returns "
            "the tool's JSON result decoded (a failure is a dict with an 'error' key). At most "
            f"{settings.max_tool_calls} calls a script:\n{listing}")
    else:
        description += " It cannot call any tool in this session."
    return {
        "name": NAME,
        "description": description,
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The Python 3 source of the script."},
                "timeout": {"type": "number", "default": default, "description": (
                    f"Seconds before the script is killed (default {default:g}, "
                    f"at most {settings.max_timeout:g}).")},
            },
            "required": ["code"],
        },
    }


def execute_code_definition(available: Iterable[str]) -> dict[str, Any]:
    """The OpenAI tool definition for a run whose available tools are ``available``."""
    return {"type": "function", "function": execute_code_schema(callable_tools(available))}


# -- the generated module -------------------------------------------------------------------------------------

_CLIENT_HEADER = f'''"""The session's tools as functions, generated by execute_code for this script.

Each returns the tool's result: its JSON decoded (a failure is a dict with an "error" key), else its text.
"""

import json as _json
import os as _os
import socket as _socket
import threading as _threading

_CHANNEL = _socket.socket(fileno=int(_os.environ["{TOOLS_FD_ENV}"]))
_LOCK = _threading.Lock()


def _receive(size):
    data = bytearray()
    while len(data) < size:
        chunk = _CHANNEL.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise ConnectionError("execute_code closed the tool channel")
        data += chunk
    return bytes(data)


def _call(tool, args):
    body = _json.dumps({{"tool": tool, "args": {{k: v for k, v in args.items() if v is not None}}}},
                       default=str).encode()
    if len(body) > {MAX_FRAME_BYTES}:
        raise ValueError(f"the arguments of {{tool}} take {{len(body)}} bytes, over {MAX_FRAME_BYTES}")
    with _LOCK:
        _CHANNEL.sendall(len(body).to_bytes(4, "big") + body)
        result = _json.loads(_receive(int.from_bytes(_receive(4), "big")))["result"]
    try:
        return _json.loads(result)
    except ValueError:
        return result
'''


def _client_function(entry: ToolEntry) -> str:
    params = _parameters(entry)
    if params is None:
        signature, payload = "**kwargs", "kwargs"
    else:
        names = [*params[0], *params[1]]
        signature = _signature(entry)
        payload = "{" + ", ".join(f"{p!r}: {p}" for p in names) + "}"
    return (f"\n\ndef {entry.name}({signature}):\n"
            f"    {_summary(entry)!r}\n"
            f"    return _call({entry.name!r}, {payload})\n")


def client_module(tools: Sequence[str]) -> str:
    """The source of ``hermes_tools`` for a script that may call ``tools`` (names from ``callable_tools``)."""
    entries = [entry for name in tools if (entry := registry.get(name)) is not None]
    return (_CLIENT_HEADER + "".join(_client_function(e) for e in entries)
            + f"\n\n__all__ = {[e.name for e in entries]!r}\n")


# -- the handler ----------------------------------------------------------------------------------------------

class _ToolCalls:
    """Answers a script's tool calls: only ``allowed`` tools, at most ``limit`` of them, in this process."""

    def __init__(self, allowed: Sequence[str], ctx: Mapping[str, Any], limit: int) -> None:
        self.allowed = frozenset(allowed)
        self.ctx = ctx
        self.limit = limit
        self.made = 0

    def __call__(self, tool: str, args: dict[str, Any]) -> str:
        entry = registry.get(tool)
        if tool not in self.allowed or entry is None:
            offered = ", ".join(sorted(self.allowed)) or "none"
            return tool_error(f"{tool} cannot be called from this script (the tools it may call: {offered})")
        if self.made >= self.limit:
            return tool_error(f"this script already made {self.limit} tool calls, the most one script may make")
        self.made += 1
        return registry.run_here(entry, args, self.ctx)


def _timeout(value: Any) -> float | None:
    """The script's timeout in seconds (default 30, capped by the settings), or None when ``value`` is not one."""
    if value is None or value == "":
        return min(DEFAULT_TIMEOUT_SECONDS, _settings.max_timeout)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:  # `not >` rejects NaN too
        return None
    return min(float(value), _settings.max_timeout)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _report(run: ScriptRun, timeout: float, memory_mb: int, calls: int) -> str:
    fields = {"stdout": run.stdout, "stderr": run.stderr, "tool_calls": calls}
    if run.cancelled:
        return tool_error(f"{NAME}: cancelled (the run was stopped); the script was killed", **fields)
    if run.returncode is None:
        return tool_error(f"{NAME}: timed out after {timeout:g} s; the script was killed (its timeout argument "
                          f"allows up to {_settings.max_timeout:g} s)", **fields)
    code = run.returncode
    if code != 0 and _last_line(run.stderr).startswith("MemoryError"):
        return tool_error(f"{NAME}: the script ran out of memory (its limit is {memory_mb} MB)", exit_code=code,
                          **fields)
    if code < 0:
        return tool_error(f"{NAME}: the script was {_signal_text(-code)}", **fields)
    return tool_result(exit_code=code, **fields)


def _signal_text(number: int) -> str:
    if number == signal.SIGXCPU:
        return "stopped at the sandbox's CPU time limit"
    if number == signal.SIGXFSZ:
        return "stopped at the sandbox's file size limit"
    if number == signal.SIGKILL:
        return "killed (out of memory, or by a limit)"
    try:
        return f"killed by {signal.Signals(number).name}"
    except ValueError:
        return f"killed by signal {number}"


def execute_code(args: dict[str, Any], **ctx: Any) -> str:
    """Run ``args["code"]`` with its limits; JSON {exit_code, stdout, stderr, tool_calls}, or a tool error."""
    code = args.get("code")
    if not isinstance(code, str) or not code.strip():
        return tool_error("code must be a non-empty string of Python source")
    timeout = _timeout(args.get("timeout"))
    if timeout is None:
        return tool_error(f"timeout must be a positive number of seconds (at most {_settings.max_timeout:g})")
    try:
        root = workspace_root(ctx)
    except WorkspaceError as exc:
        return tool_error(str(exc))
    enabled = ctx.get("enabled_tools")
    tools = callable_tools(registry.available(registry.tool_names()) if enabled is None else enabled)
    calls = _ToolCalls(tools, ctx, _settings.max_tool_calls)
    memory_mb = memory_limit_mb(_settings.memory_mb)
    with tempfile.TemporaryDirectory(prefix="hermes-code-") as directory:
        script = Path(directory, "script.py")
        script.write_text(code, encoding="utf-8")
        Path(directory, f"{CLIENT_MODULE}.py").write_text(client_module(tools), encoding="utf-8")
        run = run_script(script, cwd=root, timeout=timeout, memory_mb=memory_mb, on_call=calls,
                         cancel=ctx.get("cancel_event"))
    return _report(run, timeout, memory_mb, calls.made)


def _runnable() -> bool:
    """Offered only where a sandbox runs it (a script is arbitrary code) and the interpreter is there."""
    return registry.sandbox is not None and os.access(sys.executable, os.X_OK)


registry.register(
    name=NAME,
    toolset="code_execution",
    schema=execute_code_schema(None),
    handler=execute_code,
    check_fn=_runnable,
    effects=[EFFECT_RUNS_COMMANDS, EFFECT_WRITES_FILES],
    emoji="🐍",
)
