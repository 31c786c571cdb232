"""Workspace root selection and path confinement."""

import os
from pathlib import Path

import pytest

from tools.workspace import WorkspaceError, resolve_in_workspace, workspace_root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("hello\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("top secret\n")
    return Path(os.path.realpath(ws))


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("HERMES_GATEWAY_WORKSPACE", raising=False)
    monkeypatch.delenv("HERMES_GATEWAY_HOME", raising=False)
    return monkeypatch


# -- workspace_root --------------------------------------------------------


def test_root_from_ctx_is_created_and_realpathed(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    root = workspace_root({"workspace": str(tmp_path / "alias" / "new" / "ws")})
    assert root == Path(os.path.realpath(tmp_path / "real" / "new" / "ws"))
    assert root.is_dir()


def test_ctx_wins_over_env(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("HERMES_GATEWAY_WORKSPACE", str(tmp_path / "from-env"))
    assert workspace_root({"workspace": str(tmp_path / "from-ctx")}).name == "from-ctx"
    assert workspace_root({"session_key": "x"}).name == "from-env"


def test_root_under_gateway_home(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("HERMES_GATEWAY_HOME", str(tmp_path / "home"))
    root = workspace_root({"workspace": None})
    assert root == Path(os.path.realpath(tmp_path / "home" / "workspace"))
    assert root.is_dir()


def test_default_root_under_user_home(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("HOME", str(tmp_path))
    assert workspace_root({}) == Path(os.path.realpath(tmp_path / ".hermes-gateway" / "workspace"))


def test_root_that_cannot_be_created(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(WorkspaceError, match="cannot create the workspace"):
        workspace_root({"workspace": str(tmp_path / "file" / "ws")})


# -- resolve_in_workspace: allowed -------------------------------------------


@pytest.mark.parametrize(
    ("user_path", "expected"),
    [
        ("notes.txt", "notes.txt"),
        ("./sub/../notes.txt", "notes.txt"),
        ("new/dir/file.txt", "new/dir/file.txt"),
        (".", "."),
        ("a%20b.txt", "a%20b.txt"),  # escapes are only decoded for the check, never applied
    ],
)
def test_relative_paths_resolve_under_root(root: Path, user_path: str, expected: str) -> None:
    assert resolve_in_workspace(root, user_path) == root / expected


def test_absolute_path_inside_root_is_allowed(root: Path) -> None:
    assert resolve_in_workspace(root, str(root / "notes.txt")) == root / "notes.txt"


def test_symlink_staying_inside_resolves_to_its_target(root: Path) -> None:
    (root / "alias.txt").symlink_to(root / "notes.txt")
    assert resolve_in_workspace(root, "alias.txt") == root / "notes.txt"


# -- resolve_in_workspace: refused -------------------------------------------


@pytest.mark.parametrize(
    "user_path",
    [
        "../../etc/passwd",
        "../outside/secret.txt",
        "sub/../../outside/secret.txt",
        "/etc/passwd",
        "%2e%2e/%2e%2e/etc/passwd",
        "..%2f..%2fetc",
        "%2E%2E%2Foutside",
        "%252e%252e/%252e%252e/etc/passwd",  # double-encoded
        "~/.ssh/id_rsa",
    ],
)
def test_escapes_are_refused(root: Path, user_path: str) -> None:
    with pytest.raises(WorkspaceError, match="outside the workspace"):
        resolve_in_workspace(root, user_path)


def test_sibling_directory_sharing_the_prefix_is_refused(root: Path) -> None:
    sibling = root.parent / (root.name + "2")
    sibling.mkdir()
    with pytest.raises(WorkspaceError, match="outside the workspace"):
        resolve_in_workspace(root, str(sibling / "x"))


@pytest.mark.parametrize("user_path", ["notes\x00.txt", "notes%00.txt"])
def test_nul_bytes_are_refused(root: Path, user_path: str) -> None:
    with pytest.raises(WorkspaceError, match="NUL"):
        resolve_in_workspace(root, user_path)


@pytest.mark.parametrize("user_path", ["", None, 42])
def test_non_paths_are_refused(root: Path, user_path: object) -> None:
    with pytest.raises(WorkspaceError, match="non-empty string"):
        resolve_in_workspace(root, user_path)  # type: ignore[arg-type]


@pytest.mark.parametrize("user_path", ["etc", "etc/passwd", "etc/not-yet-created"])
def test_symlink_to_etc_is_refused(root: Path, user_path: str) -> None:
    (root / "etc").symlink_to("/etc")
    with pytest.raises(WorkspaceError, match="outside the workspace"):
        resolve_in_workspace(root, user_path)


def test_symlinked_parent_escaping_is_refused_for_new_files(root: Path) -> None:
    (root / "data").mkdir()
    (root / "data" / "link").symlink_to(root.parent / "outside")
    with pytest.raises(WorkspaceError, match="outside the workspace"):
        resolve_in_workspace(root, "data/link/new-dir/new.txt")


def test_dangling_symlink_pointing_outside_is_refused(root: Path) -> None:
    (root / "trap.txt").symlink_to(root.parent / "outside" / "does-not-exist.txt")
    with pytest.raises(WorkspaceError, match="outside the workspace"):
        resolve_in_workspace(root, "trap.txt")


def test_unresolved_root_argument_is_realpathed(root: Path, tmp_path: Path) -> None:
    alias = tmp_path / "ws-alias"
    alias.symlink_to(root)
    assert resolve_in_workspace(alias, "notes.txt") == root / "notes.txt"
    with pytest.raises(WorkspaceError):
        resolve_in_workspace(alias, "../outside/secret.txt")
