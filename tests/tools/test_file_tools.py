"""read_file, write_file, patch and search_files, called through the registry."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tools.file_tools
from tools.registry import EFFECT_WRITES_FILES, registry


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOPSECRET\n")
    return Path(os.path.realpath(root))


def call(name: str, ws: Path, **args: Any) -> dict[str, Any]:
    raw = registry.dispatch(
        name, args, workspace=str(ws), session_key="telegram:dm:1", run_id="r1", unknown_ctx=object()
    )
    return json.loads(raw)


def outside(ws: Path) -> Path:
    return ws.parent / "outside"


def test_registered_in_file_toolset_with_effects() -> None:
    expected = {
        "read_file": set(),
        "search_files": set(),
        "write_file": {EFFECT_WRITES_FILES},
        "patch": {EFFECT_WRITES_FILES},
    }
    for name, effects in expected.items():
        entry = registry.get(name)
        assert entry is not None and entry.toolset == "file"
        assert entry.effects == effects
        assert entry.schema["name"] == name
        assert entry.schema["parameters"]["type"] == "object"
    assert registry.tools_in_toolset("file") == sorted(expected)


# -- read_file -------------------------------------------------------------


def test_read_numbers_lines_and_reports_totals(ws: Path) -> None:
    (ws / "a.txt").write_text("alpha\nbeta\r\ngamma\n")
    out = call("read_file", ws, path="a.txt")
    assert out["content"] == "    1|alpha\n    2|beta\n    3|gamma"
    assert out["total_lines"] == 3
    assert out["truncated"] is False
    assert "next_offset" not in out


def test_read_offset_and_limit(ws: Path) -> None:
    (ws / "n.txt").write_text("".join(f"line {i}\n" for i in range(1, 21)))
    out = call("read_file", ws, path="n.txt", offset=12, limit=3)
    assert out["content"].splitlines() == ["   12|line 12", "   13|line 13", "   14|line 14"]
    assert out["total_lines"] == 20
    assert out["truncated"] is True
    assert out["next_offset"] == 15
    tail = call("read_file", ws, path="n.txt", offset="19", limit=50)
    assert tail["content"].splitlines() == ["   19|line 19", "   20|line 20"]
    assert tail["truncated"] is False


def test_read_default_limit_is_500_lines(ws: Path) -> None:
    (ws / "big.txt").write_text("x\n" * 600)
    out = call("read_file", ws, path="big.txt")
    assert len(out["content"].splitlines()) == 500
    assert out["next_offset"] == 501


def test_read_offset_past_end_and_bad_numbers(ws: Path) -> None:
    (ws / "a.txt").write_text("one\n")
    assert "past the end" in call("read_file", ws, path="a.txt", offset=5)["error"]
    assert "positive integer" in call("read_file", ws, path="a.txt", limit=0)["error"]
    assert "positive integer" in call("read_file", ws, path="a.txt", offset="two")["error"]


def test_read_empty_file(ws: Path) -> None:
    (ws / "empty.txt").write_text("")
    out = call("read_file", ws, path="empty.txt")
    assert (out["content"], out["total_lines"], out["truncated"]) == ("", 0, False)


def test_read_refuses_binary_missing_and_directories(ws: Path) -> None:
    (ws / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (ws / "dir").mkdir()
    assert "binary" in call("read_file", ws, path="img.png")["error"]
    assert "does not exist" in call("read_file", ws, path="nope.txt")["error"]
    assert "not a regular file" in call("read_file", ws, path="dir")["error"]


def test_read_refuses_files_over_the_size_cap(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tools.file_tools, "MAX_FILE_BYTES", 100)
    (ws / "big.txt").write_text("x" * 101)
    assert "byte limit" in call("read_file", ws, path="big.txt")["error"]


def test_read_clips_very_long_lines(ws: Path) -> None:
    (ws / "min.js").write_text("y" * 10_000 + "\n")
    content = call("read_file", ws, path="min.js")["content"]
    assert len(content) < 2_100
    assert content.endswith("[8000 more chars]")


@pytest.mark.parametrize("path", ["../outside/secret.txt", "/etc/passwd", "%2e%2e/outside/secret.txt"])
def test_read_outside_workspace_is_refused(ws: Path, path: str) -> None:
    assert "outside the workspace" in call("read_file", ws, path=path)["error"]


def test_read_through_symlink_to_etc_is_refused(ws: Path) -> None:
    (ws / "etc").symlink_to("/etc")
    out = call("read_file", ws, path="etc/passwd")
    assert "outside the workspace" in out["error"]
    assert "root:" not in json.dumps(out)


# -- write_file --------------------------------------------------------------


def test_write_creates_parent_dirs_and_reports_bytes(ws: Path) -> None:
    out = call("write_file", ws, path="deep/er/note.txt", content="héllo\n")
    assert out == {"path": "deep/er/note.txt", "bytes_written": 7, "created": True}
    assert (ws / "deep" / "er" / "note.txt").read_text(encoding="utf-8") == "héllo\n"


def test_write_overwrites_and_keeps_content_exact(ws: Path) -> None:
    (ws / "a.txt").write_text("old")
    out = call("write_file", ws, path=str(ws / "a.txt"), content="x\r\ny\n")
    assert out["created"] is False
    assert (ws / "a.txt").read_bytes() == b"x\r\ny\n"


def test_write_refuses_non_regular_files_and_missing_content(ws: Path) -> None:
    (ws / "dir").mkdir()
    os.mkfifo(ws / "fifo")
    assert "not a regular file" in call("write_file", ws, path="dir", content="x")["error"]
    assert "not a regular file" in call("write_file", ws, path="fifo", content="x")["error"]
    assert "content must be a string" in call("write_file", ws, path="a.txt")["error"]
    assert not (ws / "a.txt").exists()


def test_write_through_symlink_to_etc_is_refused(ws: Path) -> None:
    (ws / "etc").symlink_to("/etc")
    out = call("write_file", ws, path="etc/hermes-test-should-not-exist", content="x")
    assert "outside the workspace" in out["error"]
    assert not Path("/etc/hermes-test-should-not-exist").exists()


def test_write_through_escaping_parent_symlink_is_refused(ws: Path) -> None:
    (ws / "out").symlink_to(outside(ws))
    out = call("write_file", ws, path="out/sub/new.txt", content="x")
    assert "outside the workspace" in out["error"]
    assert not (outside(ws) / "sub").exists()


@pytest.mark.parametrize("path", ["../outside/new.txt", "..%2foutside%2fnew.txt"])
def test_write_traversal_is_refused(ws: Path, path: str) -> None:
    assert "outside the workspace" in call("write_file", ws, path=path, content="x")["error"]
    assert not (outside(ws) / "new.txt").exists()


def test_write_through_dangling_symlink_is_refused(ws: Path) -> None:
    (ws / "trap.txt").symlink_to(outside(ws) / "planted.txt")
    assert "outside the workspace" in call("write_file", ws, path="trap.txt", content="x")["error"]
    assert not (outside(ws) / "planted.txt").exists()


# -- patch -------------------------------------------------------------------


def test_patch_replaces_a_unique_match(ws: Path) -> None:
    (ws / "app.py").write_text("def f():\n    return 1\n\nprint(f())\n")
    out = call("patch", ws, path="app.py", old_string="return 1", new_string="return 2")
    assert out["replacements"] == 1
    assert "-    return 1" in out["diff"] and "+    return 2" in out["diff"]
    assert (ws / "app.py").read_text() == "def f():\n    return 2\n\nprint(f())\n"


def test_patch_missing_old_string(ws: Path) -> None:
    (ws / "a.txt").write_text("hello\n")
    out = call("patch", ws, path="a.txt", old_string="goodbye", new_string="x")
    assert "not found" in out["error"]
    assert (ws / "a.txt").read_text() == "hello\n"


def test_patch_ambiguous_match_names_the_count(ws: Path) -> None:
    (ws / "a.txt").write_text("x = 1\nx = 1\nx = 1\n")
    out = call("patch", ws, path="a.txt", old_string="x = 1", new_string="x = 2")
    assert "appears 3 times" in out["error"] and "replace_all" in out["error"]
    assert (ws / "a.txt").read_text() == "x = 1\nx = 1\nx = 1\n"


@pytest.mark.parametrize("flag", [True, "true"])
def test_patch_replace_all(ws: Path, flag: object) -> None:
    (ws / "a.txt").write_text("x = 1\nx = 1\nx = 1\n")
    out = call("patch", ws, path="a.txt", old_string="1", new_string="2", replace_all=flag)
    assert out["replacements"] == 3
    assert (ws / "a.txt").read_text() == "x = 2\nx = 2\nx = 2\n"


def test_patch_keeps_other_bytes_exact(ws: Path) -> None:
    (ws / "a.txt").write_bytes(b"caf\xe9\r\nold\r\n")  # Latin-1 byte and CRLF endings
    call("patch", ws, path="a.txt", old_string="old", new_string="new")
    assert (ws / "a.txt").read_bytes() == b"caf\xe9\r\nnew\r\n"


def test_patch_argument_errors(ws: Path) -> None:
    (ws / "a.txt").write_text("a\n")
    assert "identical" in call("patch", ws, path="a.txt", old_string="a", new_string="a")["error"]
    assert "non-empty" in call("patch", ws, path="a.txt", old_string="", new_string="b")["error"]
    assert (
        "true or false" in call("patch", ws, path="a.txt", old_string="a", new_string="b", replace_all="maybe")["error"]
    )
    assert "does not exist" in call("patch", ws, path="b.txt", old_string="a", new_string="b")["error"]


def test_patch_outside_workspace_is_refused(ws: Path) -> None:
    (ws / "out").symlink_to(outside(ws))
    out = call("patch", ws, path="out/secret.txt", old_string="TOPSECRET", new_string="pwned")
    assert "outside the workspace" in out["error"]
    assert (outside(ws) / "secret.txt").read_text() == "TOPSECRET\n"


# -- search_files ------------------------------------------------------------


@pytest.fixture
def tree(ws: Path) -> Path:
    (ws / "src").mkdir()
    (ws / "src" / "main.py").write_text("import os\n\ndef main():\n    return os.getcwd()\n")
    (ws / "src" / "util.py").write_text("def helper():\n    pass\n")
    (ws / "README.md").write_text("# main project\n")
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text("def main in git\n")
    (ws / "blob.bin").write_bytes(b"def main\x00\x01")
    return ws


def test_search_content_returns_relative_matches(tree: Path) -> None:
    out = call("search_files", tree, pattern=r"def \w+\(")
    assert out["results"] == [
        {"path": "src/main.py", "line": 3, "text": "def main():"},
        {"path": "src/util.py", "line": 1, "text": "def helper():"},
    ]
    assert out["truncated"] is False


def test_search_skips_git_and_binary_files(tree: Path) -> None:
    paths = {r["path"] for r in call("search_files", tree, pattern="main")["results"]}
    assert paths == {"src/main.py", "README.md"}


def test_search_skips_large_files(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tools.file_tools, "_SEARCH_MAX_FILE_BYTES", 20)
    paths = {r["path"] for r in call("search_files", tree, pattern="main")["results"]}
    assert paths == {"README.md"}


def test_search_with_glob_and_subdir(tree: Path) -> None:
    assert {r["path"] for r in call("search_files", tree, pattern="main", file_glob="*.md")["results"]} == {"README.md"}
    assert [r["path"] for r in call("search_files", tree, pattern="def", path="src")["results"]] == [
        "src/main.py",
        "src/util.py",
    ]


def test_search_file_names(tree: Path) -> None:
    out = call("search_files", tree, pattern=r"\.py$", target="files")
    assert out["results"] == ["src/main.py", "src/util.py"]


def test_search_limit_truncates(ws: Path) -> None:
    (ws / "many.txt").write_text("hit\n" * 10)
    out = call("search_files", ws, pattern="hit", limit=3)
    assert [r["line"] for r in out["results"]] == [1, 2, 3]
    assert out["truncated"] is True
    assert len(call("search_files", ws, pattern="hit")["results"]) == 10


def test_search_errors(tree: Path) -> None:
    assert "invalid regex" in call("search_files", tree, pattern="def (")["error"]
    assert "target must be" in call("search_files", tree, pattern="x", target="dirs")["error"]
    assert "does not exist" in call("search_files", tree, pattern="x", path="nope")["error"]
    assert "outside the workspace" in call("search_files", tree, pattern="x", path="..")["error"]


def test_search_does_not_follow_symlinks_out(ws: Path) -> None:
    (ws / "out").symlink_to(outside(ws))
    (ws / "secret-link.txt").symlink_to(outside(ws) / "secret.txt")
    (ws / "mine.txt").write_text("TOPSECRET copy\n")
    out = call("search_files", ws, pattern="TOPSECRET")
    assert out["results"] == [{"path": "mine.txt", "line": 1, "text": "TOPSECRET copy"}]


# -- search_files: RE2 patterns ------------------------------------------------

# Runs search_files in a fresh interpreter, so a pattern that backtracks for ever fails the test by
# timing out instead of hanging the test run.
_SEARCH_IN_SUBPROCESS = """
import json, sys
import tools.file_tools
from tools.registry import registry
args = json.loads(sys.argv[1])
print(registry.dispatch("search_files", args, workspace=sys.argv[2]))
"""


def _search_in_subprocess(ws: Path, **args: Any) -> dict[str, Any]:
    repo = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run([sys.executable, "-c", _SEARCH_IN_SUBPROCESS, json.dumps(args), str(ws)], cwd=repo,
                              capture_output=True, text=True, timeout=60, check=True)
    except subprocess.TimeoutExpired:
        pytest.fail(f"search_files with {args} did not finish in 60 s (backtracking regex engine?)")
    return json.loads(done.stdout.splitlines()[-1])


def test_search_catastrophic_pattern_finishes_with_no_match(ws: Path) -> None:
    (ws / "a.txt").write_text("a" * 40 + "!\n")
    (ws / ("a" * 40 + "!")).write_text("")
    assert _search_in_subprocess(ws, pattern="(a+)+$") == {"results": [], "truncated": False}
    assert _search_in_subprocess(ws, pattern="(a+)+$", target="files") == {"results": [], "truncated": False}


@pytest.mark.parametrize(("pattern", "construct"), [
    (r"(\w+) \1", r"a backreference \1"),
    (r"(?P<w>\w+) (?P=w)", "a backreference (?P=name)"),
    ("foo(?=bar)", "lookaround (?=...)"),
    ("foo(?!bar)", "lookaround (?!...)"),
    ("(?<=x)foo", "lookaround (?<=...)"),
    ("(?<!x)foo", "lookaround (?<!...)"),
])
def test_search_unsupported_construct_is_a_clear_error(tree: Path, pattern: str, construct: str) -> None:
    for target in ("content", "files"):
        error = call("search_files", tree, pattern=pattern, target=target)["error"]
        assert error.startswith(f"search_files: this pattern uses {construct}, which RE2 does not support")
        assert "RE2 syntax" in error and "rewrite it without them" in error


def test_search_escaped_backslash_is_not_a_backreference(ws: Path) -> None:
    (ws / "paths.txt").write_text("C:\\1dir\nplain\n")
    assert call("search_files", ws, pattern=r"C:\\1")["results"] == [{"path": "paths.txt", "line": 1,
                                                                      "text": "C:\\1dir"}]
    error = call("search_files", ws, pattern=r"\\1(")["error"]
    assert error.startswith("invalid regex") and "missing )" in error


def test_search_pattern_length_is_capped(ws: Path) -> None:
    limit = tools.file_tools.MAX_PATTERN_CHARS
    assert "over the" in call("search_files", ws, pattern="x" * (limit + 1))["error"]
    assert call("search_files", ws, pattern="x" * limit)["results"] == []


def test_search_schema_says_re2() -> None:
    entry = registry.get("search_files")
    assert entry is not None
    description = entry.schema["parameters"]["properties"]["pattern"]["description"]
    assert description == "RE2 regular expression (Python syntax without backreferences or lookaround)."


def test_search_python_syntax_still_works(ws: Path) -> None:
    (ws / "code.py").write_text("def main():\r\n    return 42\r\nclass Foo:\n    pass\nend")
    assert [r["line"] for r in call("search_files", ws, pattern=r"(?P<kw>def|class) \w+")["results"]] == [1, 3]
    assert [r["line"] for r in call("search_files", ws, pattern=r"(?i)^CLASS")["results"]] == [3]
    assert [r["line"] for r in call("search_files", ws, pattern=r":$")["results"]] == [1, 3]  # CRLF lines too
    assert [r["line"] for r in call("search_files", ws, pattern=r"\d+\Z")["results"]] == [2]  # Python's \Z
    assert [r["line"] for r in call("search_files", ws, pattern=r"\Aend\z")["results"]] == [5]
    assert [r["line"] for r in call("search_files", ws, pattern=r"\bpass\b")["results"]] == [4]


def test_search_file_names_that_are_not_utf8(ws: Path) -> None:
    (ws / os.fsdecode(b"caf\xe9.txt")).write_text("x\n")
    (ws / "other.txt").write_text("x\n")
    assert len(call("search_files", ws, pattern=r"^caf", target="files")["results"]) == 1
    assert call("search_files", ws, pattern="\ud800")["error"].startswith("invalid regex")


_LINE_PATTERNS = [r"^a", r"a$", r"^$", r"\bab\b", r"a\s*b", r"(?s)a.b", r"[^x]+", r"a\nb", r"b\r", r"\Ab", r"b\z",
                  r"(?-m)^b", r"(?i)^B$"]


@given(text=st.text(alphabet="ab x\r\n", max_size=30), pattern=st.sampled_from(_LINE_PATTERNS))
def test_whole_file_prefilter_never_hides_a_matching_line(text: str, pattern: str) -> None:
    matcher = tools.file_tools._compile_pattern(pattern)
    lines = tools.file_tools._lines(text)
    if any(matcher.line.search(line) for line in lines):
        assert matcher.may_match(text)
