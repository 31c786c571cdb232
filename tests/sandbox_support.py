"""Helpers shared by the tool sandbox tests: plugin sources, process accounting, and leak detection."""

from __future__ import annotations

import base64
import os
import re
import shutil
import textwrap
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

# A plugin that marks in the workspace that it started (so a test knows the call is under way), then
# holds its worker for an hour: only the pool's wall clock or the run's cancel event ends it.
HANG = '''
import time
from pathlib import Path

def _hang(args, **ctx):
    Path(ctx["workspace"], args.get("marker") or "hang-started").touch()
    time.sleep(3600)
    return "woke up"

def register(registry):
    registry.register("hang", "plugin-hang", {
        "description": "Sleeps for an hour.",
        "parameters": {"type": "object", "properties": {"marker": {"type": "string"}}},
    }, _hang)
'''
# Catastrophic backtracking in Python's re: C code that holds the GIL for as long as it runs (2**40 steps).
BACKTRACK = '''
import re
from pathlib import Path

def _backtrack(args, **ctx):
    Path(ctx["workspace"], args.get("marker") or "backtrack-started").touch()
    return "matched" if re.match(r"(a+)+$", "a" * 40 + "!") else "no match"

def register(registry):
    registry.register("backtrack", "plugin-backtrack", {
        "description": "Tries a regex that backtracks for hours.",
        "parameters": {"type": "object", "properties": {"marker": {"type": "string"}}},
    }, _backtrack)
'''


def write_plugin(directory: Path, name: str, source: str) -> Path:
    """A ``<name>.py`` plugin file, readable by the sandbox's user (workers load it before dropping root)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    path.chmod(0o644)
    return path


def require_bwrap() -> None:
    """These tests exercise bubblewrap itself: skip where it is not installed (never in CI)."""
    if shutil.which("bwrap") is None and not os.environ.get("CI"):
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")


# -- processes -------------------------------------------------------------------------------------------

def _status(pid: str) -> tuple[int, int] | None:
    """(parent pid, real uid) of a process, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return int(fields["PPid"]), int(fields["Uid"].split()[0])


def descendant_processes(uid: int, ancestor: int | None = None) -> list[int]:
    """Processes running as ``uid`` that descend from ``ancestor`` (this process by default).

    Sandboxed processes stay descendants even when orphaned: they are re-parented to their PID namespace's
    init, a child of the worker's bubblewrap, which is ours. Other test runs' sandboxes are not counted.
    """
    ancestor = os.getpid() if ancestor is None else ancestor
    table: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (status := _status(name)) is not None:
            table[int(name)] = status
    found = []
    for pid, (_, owner) in table.items():
        if owner != uid:
            continue
        seen, cursor = 0, pid
        while cursor in table and cursor not in (0, 1, ancestor) and seen < 10_000:
            cursor, seen = table[cursor][0], seen + 1
        if cursor == ancestor:
            found.append(pid)
    return found


def wait_until(condition: Callable[[], bool], timeout: float, what: str | Callable[[], str]) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` (text, or a function giving it when it fails)
    after ``timeout`` seconds (a hang guard)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting until {what() if callable(what) else what}")
        time.sleep(0.05)


# -- leaks -----------------------------------------------------------------------------------------------

def _b64_fragments(secret: bytes) -> set[str]:
    """The part of base64 text that encodes ``secret`` whatever its offset in the encoded data is."""
    fragments = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + secret).decode()
        # Only the characters whose 6 bits all come from the secret: the others also hold bits of
        # whatever comes before or after it.
        fragments.add(encoded[-(-8 * offset // 6):8 * (offset + len(secret)) // 6])
    return {f for f in fragments if len(f) >= 8}


def leak_forms(secret: str) -> dict[str, set[str]]:
    """Ways a secret could show up in text a tool produced: as is, hex, base64 (any alignment)."""
    raw = secret.encode()
    return {"plain": {secret}, "hex": {raw.hex(), raw.hex().upper()},
            "base64": _b64_fragments(raw) | {base64.b64encode(raw).decode().rstrip("=")},
            "base64url": {base64.urlsafe_b64encode(raw).decode().rstrip("=")}}


_SPACE = re.compile(r"\s+|\\n|\\r|\\t")


def leaks(secret: str, texts: Iterable[str]) -> list[str]:
    """Which forms of ``secret`` appear in ``texts`` (whitespace and escaped newlines ignored, as
    ``base64`` and ``xxd`` wrap their output)."""
    joined = "\n".join(texts)
    squeezed = _SPACE.sub("", joined)
    return sorted(f"{kind}: {form}" for kind, forms in leak_forms(secret).items() for form in forms
                  if form in joined or form in squeezed)
