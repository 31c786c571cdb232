"""The workspace: the one directory tree the file and terminal tools may touch.

Confinement is checked on real paths (symlinks resolved) at the moment a tool
resolves a path. It stops a model from wandering out of the workspace by
accident or by a crafted path; it is not a sandbox against a process that races
to swap a directory for a symlink between the check and the use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote

WORKSPACE_ENV = "HERMES_GATEWAY_WORKSPACE"
HOME_ENV = "HERMES_GATEWAY_HOME"
DEFAULT_HOME = "~/.hermes-gateway"

# Enough rounds to undo double and triple encoding (%252e -> %2e -> .).
_MAX_DECODE_ROUNDS = 4


class WorkspaceError(ValueError):
    """A path the tools refuse (outside the workspace, NUL byte, ...), or a workspace that cannot be made."""


def workspace_root(ctx: Mapping[str, Any]) -> Path:
    """The real path of the workspace for this call, created if missing.

    ``ctx["workspace"]`` wins, then ``$HERMES_GATEWAY_WORKSPACE``, then
    ``$HERMES_GATEWAY_HOME/workspace`` (home defaults to ``~/.hermes-gateway``).
    """
    configured = ctx.get("workspace") or os.environ.get(WORKSPACE_ENV)
    if configured:
        root = Path(configured).expanduser()
    else:
        root = Path(os.environ.get(HOME_ENV) or DEFAULT_HOME).expanduser() / "workspace"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WorkspaceError(f"cannot create the workspace {root}: {exc.strerror or exc}") from exc
    return Path(os.path.realpath(root))


def resolve_in_workspace(root: Path, user_path: str) -> Path:
    """The real path ``user_path`` names inside ``root``; raises WorkspaceError if it would leave it.

    Relative paths are taken from ``root``, absolute ones must land inside it, ``~``
    is expanded as a shell would. The path is also checked with its percent-escapes
    decoded, so ``%2e%2e/`` cannot smuggle a traversal past a later decoding step.
    """
    if not isinstance(user_path, str) or not user_path:
        raise WorkspaceError("path must be a non-empty string")
    decoded = _percent_decoded(user_path)
    if "\x00" in decoded:
        raise WorkspaceError("path contains a NUL byte")
    root = Path(os.path.realpath(root))
    resolved = _confined(root, user_path, user_path)
    if decoded != user_path:
        _confined(root, decoded, user_path)
    return resolved


def _percent_decoded(text: str) -> str:
    for _ in range(_MAX_DECODE_ROUNDS):
        decoded = unquote(text)
        if decoded == text:
            break
        text = decoded
    return text


def _confined(root: Path, candidate: str, shown: str) -> Path:
    # realpath resolves every existing component, so a symlink anywhere on the way
    # (the file itself, even dangling, or a parent of a file not yet created) counts.
    real = Path(os.path.realpath(root / os.path.expanduser(candidate)))
    if not real.is_relative_to(root):
        raise WorkspaceError(f"path {shown!r} is outside the workspace ({root}); use a path relative to the workspace")
    return real
