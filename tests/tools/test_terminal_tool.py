"""The terminal tool: exit codes, timeouts killing the process group, env allowlist, blocklist."""

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

import tools.terminal_tool
from tools.registry import EFFECT_RUNS_COMMANDS, registry
from tools.terminal_tool import blocked_reason


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return Path(os.path.realpath(root))


def run(ws: Path, command: str, **args: Any) -> dict[str, Any]:
    raw = registry.dispatch("terminal", {"command": command, **args}, workspace=str(ws), chat_id="c1")
    return json.loads(raw)


def wait_gone(pid: int, within: float = 3.0) -> bool:
    """Whether ``pid`` is dead (gone or a zombie waiting for init) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def test_registered_in_terminal_toolset_with_effect() -> None:
    entry = registry.get("terminal")
    assert entry is not None
    assert entry.toolset == "terminal"
    assert entry.effects == {EFFECT_RUNS_COMMANDS}
    assert registry.is_available("terminal")


def test_echo_and_stderr_are_merged(ws: Path) -> None:
    assert run(ws, "echo hello; echo oops >&2") == {"exit_code": 0, "output": "hello\noops\n"}


def test_non_zero_exit_code_is_reported_not_an_error(ws: Path) -> None:
    assert run(ws, "echo partial; exit 3") == {"exit_code": 3, "output": "partial\n"}


def test_runs_in_the_workspace_with_hermes_workspace_set(ws: Path) -> None:
    out = run(ws, 'pwd; echo "$HERMES_WORKSPACE"; touch made-here')
    assert out["output"].splitlines() == [str(ws), str(ws)]
    assert (ws / "made-here").exists()


def test_stdin_is_empty(ws: Path) -> None:
    assert run(ws, "cat; echo done", timeout=5)["output"] == "done\n"


def test_workdir_inside_workspace(ws: Path) -> None:
    (ws / "sub" / "dir").mkdir(parents=True)
    assert run(ws, "pwd", workdir="sub/dir")["output"].strip() == str(ws / "sub" / "dir")


@pytest.mark.parametrize("workdir", ["..", "/tmp", "%2e%2e", "escape"])
def test_workdir_outside_workspace_is_refused(ws: Path, workdir: str) -> None:
    (ws / "escape").symlink_to(ws.parent)
    out = run(ws, "touch escaped", workdir=workdir)
    assert "outside the workspace" in out["error"]
    assert not (ws.parent / "escaped").exists()


def test_workdir_must_be_a_directory(ws: Path) -> None:
    (ws / "f.txt").write_text("")
    assert "not a directory" in run(ws, "pwd", workdir="f.txt")["error"]
    assert "not a directory" in run(ws, "pwd", workdir="missing")["error"]


@pytest.mark.parametrize("bad", [{"command": ""}, {"command": "  "}, {}, {"command": 5}])
def test_command_is_required(ws: Path, bad: dict[str, Any]) -> None:
    out = json.loads(registry.dispatch("terminal", bad, workspace=str(ws)))
    assert "command must be a non-empty string" in out["error"]


@pytest.mark.parametrize("timeout", ["soon", 0, -1, True, float("nan")])
def test_bad_timeouts_are_refused(ws: Path, timeout: object) -> None:
    assert "timeout must be" in run(ws, "echo hi", timeout=timeout)["error"]


def test_timeout_kills_quickly_and_keeps_partial_output(ws: Path) -> None:
    started = time.monotonic()
    out = run(ws, "echo started; sleep 30", timeout=0.5)
    assert time.monotonic() - started < 5
    assert "timed out after 0.5s" in out["error"]
    assert out["output"] == "started\n"


def test_timeout_kills_the_whole_process_group(ws: Path) -> None:
    out = run(ws, "echo $$ > shell.pid; sleep 30 & echo $! > child.pid; sleep 30", timeout=0.5)
    assert "timed out" in out["error"]
    shell_pid = int((ws / "shell.pid").read_text())
    child_pid = int((ws / "child.pid").read_text())
    assert wait_gone(shell_pid)
    assert wait_gone(child_pid)


def test_background_child_holding_output_cannot_outlive_the_timeout(ws: Path) -> None:
    started = time.monotonic()
    out = run(ws, "sleep 30 & echo $! > child.pid", timeout=0.5)
    assert time.monotonic() - started < 5
    assert "timed out" in out["error"]
    assert wait_gone(int((ws / "child.pid").read_text()))


def test_timeout_is_capped(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tools.terminal_tool, "MAX_TIMEOUT_SECONDS", 0.3)
    assert "timed out after 0.3s" in run(ws, "sleep 30", timeout=10_000)["error"]


def test_environment_is_an_allowlist(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-leak-1")
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123:leak-2")
    monkeypatch.setenv("SOME_SECRET", "leak-3")
    monkeypatch.setenv("LC_ALL", "C")
    monkeypatch.setenv("TZ", "UTC")
    output = run(ws, "env")["output"]
    names = {line.split("=", 1)[0] for line in output.splitlines() if "=" in line}
    for leaked in ("OPENAI_API_KEY", "TELEGRAM_BOT_TOKEN", "SOME_SECRET", "leak"):
        assert leaked not in output
    assert {"PATH", "LC_ALL", "TZ", "HERMES_WORKSPACE"} <= names
    allowed = {"PATH", "HOME", "LANG", "TZ", "TERM", "USER", "LOGNAME", "SHELL", "TMPDIR", "HERMES_WORKSPACE"}
    set_by_sh = {"PWD", "SHLVL", "OLDPWD", "_"}
    assert {name for name in names - allowed - set_by_sh if not name.startswith("LC_")} == set()


def test_output_is_capped_keeping_head_and_tail(ws: Path) -> None:
    out = run(ws, "echo START; head -c 200000 /dev/zero | tr '\\0' x; echo; echo END")
    output = out["output"]
    assert out["exit_code"] == 0
    assert output.startswith("START\nxxx")
    assert output.endswith("xxx\nEND\n")
    assert "bytes of output omitted" in output
    assert len(output) < 51_000


# -- blocklist ---------------------------------------------------------------

BLOCKED = [
    "rm -rf /",
    "rm -rf /*",
    "rm -fr --no-preserve-root /",
    "rm  -r   -f\t/",
    "rm -rf ~",
    'sudo rm -Rf "$HOME"',
    "cd /tmp && rm --recursive --force / ",
    "mkfs.ext4 /dev/sda1",
    "dd if=/dev/zero of=/dev/sda bs=1M",
    "dd if=/dev/urandom of=/dev/nvme0n1",
    ":(){ :|:& };:",
    ":() { : | : & } ; :",
    "shutdown -h now",
    "echo bye; reboot",
    "sudo halt",
    "poweroff",
    "systemctl reboot",
    "chmod -R 777 /",
    "echo x > /dev/sda",
]


@pytest.mark.parametrize("command", BLOCKED)
def test_blocked_commands_are_refused_without_running(ws: Path, monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    started: list[Any] = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))
    out = run(ws, command)
    assert "refused by the safety blocklist" in out["error"]
    assert started == []


@pytest.mark.parametrize(
    "command",
    [
        "rm -rf ./build",
        "rm -rf /tmp/some-dir",
        "rm -rf ~/project/build",
        "chmod -R 755 ./site",
        "echo shutdown is a word",
        "git commit -m 'fix reboot loop'",
        "dd if=/dev/zero of=disk.img count=1",
        "cat /dev/sda1.log",
    ],
)
def test_ordinary_commands_pass_the_blocklist(command: str) -> None:
    assert blocked_reason(command) is None


def test_blocked_command_does_not_run(ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in rm that only records its call: harmless even if the blocklist failed.
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    fake_rm = stubs / "rm"
    fake_rm.write_text('#!/bin/sh\necho "$@" > "$HERMES_WORKSPACE/rm-ran"\n')
    fake_rm.chmod(0o755)
    monkeypatch.setenv("PATH", str(stubs))
    assert "blocklist" in run(ws, "rm -rf /*")["error"]
    assert not (ws / "rm-ran").exists()
    assert run(ws, "rm -rf ./junk")["exit_code"] == 0  # the stub works when allowed
    assert (ws / "rm-ran").read_text() == "-rf ./junk\n"


def test_cancel_event_kills_the_running_command(tmp_path: Path) -> None:
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    out = json.loads(registry.dispatch("terminal", {"command": "sleep 30", "timeout": 60},
                                       workspace=str(tmp_path), cancel_event=cancel))
    assert time.monotonic() - started < 5
    assert out["error"].startswith("command cancelled")
