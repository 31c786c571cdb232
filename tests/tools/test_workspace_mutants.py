"""Workspace refusals in words (the model is told them as the file tools' errors, and relays them): each test names
the mutants of ``tools/workspace.py`` it kills."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.workspace import WorkspaceError, resolve_in_workspace, workspace_root


@pytest.mark.parametrize(("path", "message"), [
    ("", "path must be a non-empty string"),
    ("notes\x00.txt", "path contains a NUL byte"),
    ("notes%00.txt", "path contains a NUL byte"),
])
def test_a_path_that_is_not_one_is_refused_in_words(tmp_path: Path, path: str, message: str) -> None:
    """Kills resolve_in_workspace's wording mutants of both refusals (``"XX..XX"``, upper case)."""
    with pytest.raises(WorkspaceError) as refused:
        resolve_in_workspace(tmp_path, path)
    assert str(refused.value) == message


@pytest.mark.parametrize("path", ["../secrets.txt", "%2e%2e/secrets.txt"])
def test_a_path_outside_is_refused_as_the_model_wrote_it(tmp_path: Path, path: str) -> None:
    """The refusal quotes the path as given, also when only its percent-decoded form leaves the workspace.
    Kills resolve_in_workspace's ``_confined(root, user_path, None)`` and ``_confined(root, decoded, None)``."""
    root = tmp_path / "ws"
    root.mkdir()
    with pytest.raises(WorkspaceError) as refused:
        resolve_in_workspace(root, path)
    assert str(refused.value) == (f"path {path!r} is outside the workspace ({root.resolve()}); "
                                  "use a path relative to the workspace")


def test_a_workspace_that_cannot_be_created_says_why(tmp_path: Path) -> None:
    """The operator is told the directory and the system's reason. Kills workspace_root's
    ``exc.strerror and exc`` (the whole exception, errno and path again, instead of the reason)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(WorkspaceError) as refused:
        workspace_root({"workspace": str(blocker / "ws")})
    assert str(refused.value) == f"cannot create the workspace {blocker / 'ws'}: Not a directory"
