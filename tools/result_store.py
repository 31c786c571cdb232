"""Tool results too long to show the model: stored whole in the run's workspace, a preview shown instead.

A result goes to ``.hermes/tool_results/<run id>/<call id>.txt`` in the workspace, a path ``read_file`` takes, and
the model gets ``stored_notice``: that path, the result's size and its first characters. The workspace is
the sandboxed tools' to change, so the gateway never follows a link there: each directory on the way is opened
without following symlinks, relative to the one before, and the file is always a new one. Stdlib only (besides
the registry's result helper).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

from tools.registry import tool_result

RESULTS_DIR = (".hermes", "tool_results")
PREVIEW_CHARS = 2_000
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_MAX_NAME = 64
_DIR_MODE = 0o755  # readable by the sandbox's user, which may differ from the gateway's (it runs as root)
_FILE_MODE = 0o644


def store_result(workspace: str | os.PathLike[str], run_id: str, call_id: str, text: str) -> str:
    """Write ``text`` to a new file under the workspace's results directory; its path relative to the workspace.

    Raises OSError when it cannot (a symlink on the way, no space).
    """
    parts = (*RESULTS_DIR, _safe(run_id, "run"))
    root = Path(workspace).expanduser()
    root.mkdir(parents=True, exist_ok=True)  # the configured workspace itself is trusted (a first run makes it)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            child = _enter(fd, part)
            os.close(fd)
            fd = child
        stem = _safe(call_id, "result")
        for attempt in range(1000):  # call ids repeat across turns with some servers: never overwrite
            name = f"{stem}.txt" if attempt == 0 else f"{stem}-{attempt}.txt"
            try:
                out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _FILE_MODE,
                              dir_fd=fd)
            except FileExistsError:
                continue
            break
        else:
            raise FileExistsError(f"no free file name for {stem} in {'/'.join(parts)}")
    finally:
        os.close(fd)
    with os.fdopen(out, "w", encoding="utf-8", errors="replace", newline="") as file:
        os.fchmod(file.fileno(), _FILE_MODE)  # the umask may have taken the sandbox's read permission
        file.write(text)
    return "/".join((*parts, name))


def _enter(parent: int, name: str) -> int:
    """The directory ``name`` in ``parent`` (created if missing), opened without following a symlink."""
    try:
        os.mkdir(name, _DIR_MODE, dir_fd=parent)
        created = True
    except FileExistsError:
        created = False
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    if created:
        try:
            os.fchmod(fd, _DIR_MODE)
        except OSError:
            os.close(fd)
            raise
    return fd


def prune_results(workspace: str | os.PathLike[str], older_than: float, now: float | None = None) -> int:
    """Remove the runs' result directories last changed more than ``older_than`` seconds before ``now``; how many.

    Nothing on the way is followed if it is a symlink (the sandboxed tools may have planted one), and what is in
    a run's directory goes with it whatever it is (``shutil.rmtree`` works through file descriptors here).
    """
    cutoff = (time.time() if now is None else now) - older_than
    try:
        fd = os.open(Path(workspace).expanduser(), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    removed = 0
    try:
        for part in RESULTS_DIR:
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                return 0  # never stored anything, or not ours to walk (a symlink)
            os.close(fd)
            fd = child
        for entry in os.scandir(fd):
            if entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                try:
                    shutil.rmtree(entry.name, dir_fd=fd)
                except FileNotFoundError:
                    continue  # another replica sharing the workspace took it first
                removed += 1
    finally:
        os.close(fd)
    return removed


def _safe(text: str, fallback: str) -> str:
    """A file name made of ``text`` (ids come from the model server): letters, digits, ``_`` and ``-`` only."""
    return _UNSAFE.sub("_", text)[:_MAX_NAME] or fallback


def preview(text: str, chars: int = PREVIEW_CHARS) -> str:
    """The start of ``text``, at most ``chars`` characters, ending at a line break when one is past the middle."""
    if len(text) <= chars:
        return text
    head = text[:chars]
    cut = head.rfind("\n")
    return head[:cut] if cut > chars // 2 else head


def stored_notice(text: str, path: str, chars: int = PREVIEW_CHARS) -> str:
    """What the model sees of a stored result: where it is, how long, and how it starts."""
    lines = text.count("\n") + (not text.endswith("\n"))
    return tool_result(
        saved_to=path, characters=len(text), lines=lines, preview=preview(text, chars),
        note=f"The result was too long to show whole: it is saved in full in {path} (in the workspace). "
             "Read the rest with read_file (offset and limit count lines; it cuts lines over 2,000 characters, "
             "so read very long lines with the terminal or execute_code), or search it with search_files.")
