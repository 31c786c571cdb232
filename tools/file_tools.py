"""File tools confined to the workspace: read_file, write_file, patch, search_files."""

from __future__ import annotations

import difflib
import fnmatch
import functools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import re2

from tools.registry import EFFECT_WRITES_FILES, registry, tool_error, tool_result
from tools.workspace import WorkspaceError, resolve_in_workspace, workspace_root

MAX_FILE_BYTES = 10 * 1024 * 1024
DEFAULT_READ_LIMIT = 500
DEFAULT_SEARCH_LIMIT = 50
MAX_SEARCH_LIMIT = 1000

_MAX_READ_CHARS = 80_000  # stays under the registry's result cap, so the JSON is never cut
_MAX_LINE_CHARS = 2000
_MAX_MATCH_CHARS = 300
_MAX_DIFF_LINES = 40
_SEARCH_MAX_FILE_BYTES = 1024 * 1024
_BINARY_SNIFF_BYTES = 8192
_SKIP_DIRS = frozenset({".git"})
# The pattern is chosen by the model: RE2 matches in time linear in the text (no catastrophic
# backtracking), and these bound what compiling it may cost.
MAX_PATTERN_CHARS = 2000
_RE2_MAX_MEM = 8 << 20
# An escape (a backslash and the character after it), or a group opener RE2 rejects: lookaround, (?P=name).
_ESCAPE_OR_GROUP = re2.compile(r"(?s)\\(.)|(\(\?<?[=!]|\(\?P=)")
_ESCAPE = re2.compile(r"(?s)\\.")
# An escape, or an inline flag group that turns a flag off (it could turn off multi-line mode).
_ESCAPE_OR_FLAGS_OFF = re2.compile(r"(?s)\\(.)|\(\?[a-zA-Z]*-")

_Regex = re2._Regexp  # google-re2 has no public name for a compiled pattern

Handler = Callable[..., str]


class _FileToolError(Exception):
    """A user error reported to the model as a tool error."""


def _reports_errors(handler: Handler) -> Handler:
    @functools.wraps(handler)
    def wrapper(args: dict[str, Any], **ctx: Any) -> str:
        try:
            return handler(args, **ctx)
        except (WorkspaceError, _FileToolError) as exc:
            return tool_error(str(exc))

    return wrapper


# -- argument helpers ----------------------------------------------------


def _str_arg(args: Mapping[str, Any], key: str, *, allow_empty: bool = False) -> str:
    value = args.get(key)
    if not isinstance(value, str) or (not value and not allow_empty):
        raise _FileToolError(f"{key} must be a{'' if allow_empty else ' non-empty'} string")
    return value


def _int_arg(args: Mapping[str, Any], key: str, default: int) -> int:
    value = args.get(key)
    if value is None:
        return default
    text = str(value).strip() if isinstance(value, int | str) and not isinstance(value, bool) else ""
    if not text.isdecimal() or int(text) < 1:
        raise _FileToolError(f"{key} must be a positive integer, got {value!r}")
    return int(text)


def _bool_arg(args: Mapping[str, Any], key: str) -> bool:
    value = args.get(key, False)
    if isinstance(value, str):
        value = {"true": True, "false": False}.get(value.strip().lower(), value)
    if not isinstance(value, bool):
        raise _FileToolError(f"{key} must be true or false, got {value!r}")
    return value


# -- file helpers --------------------------------------------------------


def _locate(args: Mapping[str, Any], ctx: Mapping[str, Any], default: str = "") -> tuple[Path, Path]:
    """(workspace root, confined real path of ``args["path"]``)."""
    root = workspace_root(ctx)
    return root, resolve_in_workspace(root, args.get("path") or default)


def _rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def _load_bytes(path: Path, shown: str, max_bytes: int) -> bytes:
    """The bytes of a text file; refuses missing, directory, oversized and binary files."""
    if not path.exists():
        raise _FileToolError(f"{shown} does not exist")
    if not path.is_file():
        raise _FileToolError(f"{shown} is not a regular file")
    size = path.stat().st_size
    if size > max_bytes:
        raise _FileToolError(
            f"{shown} is {size} bytes, over the {max_bytes} byte limit; use the terminal (head, sed, grep)"
        )
    data = path.read_bytes()
    # Git's heuristic: a NUL byte near the start means binary.
    if b"\x00" in data[:_BINARY_SNIFF_BYTES]:
        raise _FileToolError(f"{shown} looks like a binary file; only text files can be read or patched")
    return data


def _lines(text: str) -> list[str]:
    """Lines split on ``\\n`` (as grep and sed count them), without their line endings."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit} more chars]"


# -- read_file -----------------------------------------------------------


@_reports_errors
def read_file(args: dict[str, Any], **ctx: Any) -> str:
    """Return a window of a text file with line numbers, total line count and truncation flag."""
    root, path = _locate(args, ctx)
    shown = _rel(root, path)
    offset = _int_arg(args, "offset", 1)
    limit = _int_arg(args, "limit", DEFAULT_READ_LIMIT)
    lines = _lines(_load_bytes(path, shown, MAX_FILE_BYTES).decode("utf-8", errors="replace"))
    total = len(lines)
    if offset > max(total, 1):
        raise _FileToolError(f"offset {offset} is past the end of {shown} ({total} lines)")
    numbered: list[str] = []
    size = 0
    for number in range(offset, min(total, offset + limit - 1) + 1):
        entry = f"{number:>5}|{_clip(lines[number - 1], _MAX_LINE_CHARS)}"
        size += len(entry) + 1
        if size > _MAX_READ_CHARS and numbered:
            break
        numbered.append(entry)
    last = offset + len(numbered) - 1
    result: dict[str, Any] = {
        "path": shown,
        "content": "\n".join(numbered),
        "total_lines": total,
        "truncated": last < total,
    }
    if last < total:
        result["next_offset"] = last + 1
    return tool_result(result)


# -- write_file ----------------------------------------------------------


@_reports_errors
def write_file(args: dict[str, Any], **ctx: Any) -> str:
    """Write ``content`` to a file (replacing it), creating parent directories; return bytes written."""
    root, path = _locate(args, ctx)
    content = _str_arg(args, "content", allow_empty=True)
    shown = _rel(root, path)
    created = not path.exists()
    if not created and not path.is_file():  # a directory, or a FIFO that would block the write
        raise _FileToolError(f"{shown} is not a regular file")
    data = content.encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return tool_result(path=shown, bytes_written=len(data), created=created)


# -- patch ---------------------------------------------------------------


@_reports_errors
def patch(args: dict[str, Any], **ctx: Any) -> str:
    """Replace an exact ``old_string`` with ``new_string`` (once, unless ``replace_all``)."""
    root, path = _locate(args, ctx)
    old = _str_arg(args, "old_string")
    new = _str_arg(args, "new_string", allow_empty=True)
    replace_all = _bool_arg(args, "replace_all")
    shown = _rel(root, path)
    if old == new:
        raise _FileToolError("old_string and new_string are identical; nothing to change")
    # surrogateescape round-trips bytes that are not UTF-8, so patching never corrupts them.
    text = _load_bytes(path, shown, MAX_FILE_BYTES).decode("utf-8", errors="surrogateescape")
    count = text.count(old)
    if count == 0:
        raise _FileToolError(
            f"old_string not found in {shown}; read the file and copy the text exactly (whitespace included)"
        )
    if count > 1 and not replace_all:
        raise _FileToolError(
            f"old_string appears {count} times in {shown}; add surrounding lines to make it unique, "
            "or pass replace_all=true"
        )
    updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
    path.write_bytes(updated.encode("utf-8", errors="surrogateescape"))
    return tool_result(path=shown, replacements=count if replace_all else 1, diff=_diff(text, updated, shown))


def _diff(before: str, after: str, shown: str) -> str:
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), f"a/{shown}", f"b/{shown}", n=1, lineterm="")
    lines = [_clip(line, _MAX_MATCH_CHARS) for line in islice(diff, _MAX_DIFF_LINES + 1)]
    if len(lines) > _MAX_DIFF_LINES:
        lines[-1] = "[... diff truncated]"
    # Bytes kept by surrogateescape cannot go into a JSON result; show them as "?".
    return "\n".join(lines).encode("utf-8", errors="replace").decode("utf-8")


# -- search_files --------------------------------------------------------


@_reports_errors
def search_files(args: dict[str, Any], **ctx: Any) -> str:
    """Search file contents (or file names) under a workspace directory with a regex."""
    pattern = _str_arg(args, "pattern")
    target = args.get("target") or "content"
    if target not in ("content", "files"):
        raise _FileToolError(f"target must be 'content' or 'files', got {target!r}")
    limit = min(_int_arg(args, "limit", DEFAULT_SEARCH_LIMIT), MAX_SEARCH_LIMIT)
    file_glob = args.get("file_glob") or None
    if file_glob is not None and not isinstance(file_glob, str):
        raise _FileToolError("file_glob must be a string such as '*.py'")
    matcher = _compile_pattern(pattern)
    root, start = _locate(args, ctx, default=".")
    if not start.exists():
        raise _FileToolError(f"{_rel(root, start)} does not exist")
    files = _walk(start, file_glob)
    found: Iterable[Any]
    if target == "files":
        found = (_rel(root, path) for path in files if matcher.line.search(_display_name(path)))
    else:
        found = _content_matches(root, files, matcher)
    results = list(islice(found, limit + 1))
    return tool_result(results=results[:limit], truncated=len(results) > limit)


@dataclass(frozen=True, slots=True)
class _Matcher:
    """The model's pattern, applied to one line (or file name) at a time."""

    line: _Regex
    any_line: _Regex | None
    """The pattern in multi-line mode, never matching a newline, over a whole file: one RE2 pass instead of
    one call per line (each costs about a microsecond). No match there means no line matches."""

    def may_match(self, text: str) -> bool:
        """False only when no line of ``text`` can match."""
        if self.any_line is None:
            return True
        # Lines are matched without their \r, so that ``$`` matches before a CRLF too.
        return self.any_line.search(text.replace("\r\n", "\n").removesuffix("\r")) is not None


def _compile_pattern(pattern: str) -> _Matcher:
    """The model's pattern compiled with RE2; unsupported constructs get an error saying what to do."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise _FileToolError(f"pattern is {len(pattern)} characters, over the {MAX_PATTERN_CHARS} limit; shorten it")
    options = re2.Options()
    options.max_mem = _RE2_MAX_MEM
    options.log_errors = False  # the error goes back to the model, not to stderr
    try:
        translated = _ESCAPE.sub(_to_re2_escape, pattern)
        line = re2.compile(translated, options)
    except UnicodeEncodeError as exc:  # a lone surrogate from the JSON arguments
        raise _FileToolError(f"invalid regex {pattern!r}: not valid Unicode text") from exc
    except re2.error as exc:
        construct = _unsupported_construct(pattern)
        if construct is not None:
            raise _FileToolError(
                f"search_files: this pattern uses {construct}, which RE2 does not support; search_files uses RE2 "
                f"syntax (Python syntax without backreferences or lookaround): rewrite it without them, "
                f"spelling out the repeated text or matching the context as part of the pattern"
            ) from exc
        # google-re2 raises with RE2's message as bytes.
        detail = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else exc
        raise _FileToolError(f"invalid regex {pattern!r}: {detail} (search_files uses RE2 syntax)") from exc
    if not _line_local(translated):
        return _Matcher(line, None)
    options.never_nl = True
    try:
        return _Matcher(line, re2.compile("(?m)" + translated, options))
    except re2.error:  # e.g. over max_mem: fall back to matching line by line
        return _Matcher(line, None)


def _line_local(pattern: str) -> bool:
    """Whether ``pattern`` means the same in multi-line mode over a whole file: every anchor it has then
    matches at line ends (no \\A, \\z, no flag group that could turn multi-line mode off, no \\C byte)."""
    for match in _ESCAPE_OR_FLAGS_OFF.finditer(pattern):
        if match.group(1) is None or match.group(1) in "AzC":
            return False
    return True


def _to_re2_escape(match: re2._Match) -> str:
    # Python's \Z (end of text) is spelled \z in RE2; every other escape is kept as is.
    return r"\z" if match.group(0) == r"\Z" else match.group(0)


def _unsupported_construct(pattern: str) -> str | None:
    """Names the first backreference or lookaround in ``pattern`` (escapes are skipped pairwise)."""
    for match in _ESCAPE_OR_GROUP.finditer(pattern):
        escaped, group = match.group(1), match.group(2)
        if group == "(?P=":
            return "a backreference (?P=name)"
        if group is not None:
            return f"lookaround {group}...)"
        if escaped in "123456789":
            return f"a backreference \\{escaped}"
    return None


def _display_name(path: Path) -> str:
    # Names that are not UTF-8 hold surrogate escapes, which RE2 (matching UTF-8) cannot take.
    return os.fsencode(path.name).decode("utf-8", errors="replace")


def _walk(start: Path, file_glob: str | None) -> Iterator[Path]:
    """Regular files under ``start`` in a stable order, skipping .git and every symlink."""
    if start.is_file():
        candidates: Iterable[Path] = [start]
    else:
        candidates = _tree(start)
    for path in candidates:
        if not path.is_symlink() and (file_glob is None or fnmatch.fnmatch(path.name, file_glob)):
            yield path


def _tree(start: Path) -> Iterator[Path]:
    # os.walk does not descend into symlinked directories, so the walk stays in the workspace.
    for dirpath, dirnames, filenames in os.walk(start):
        dirnames[:] = sorted(name for name in dirnames if name not in _SKIP_DIRS)
        for name in sorted(filenames):
            yield Path(dirpath, name)


def _content_matches(root: Path, files: Iterable[Path], matcher: _Matcher) -> Iterator[dict[str, Any]]:
    for path in files:
        shown = _rel(root, path)
        try:
            data = _load_bytes(path, shown, _SEARCH_MAX_FILE_BYTES)
        except (_FileToolError, OSError):
            continue  # binary, too large or unreadable: not searched
        text = data.decode("utf-8", errors="replace")
        if not matcher.may_match(text):
            continue
        for number, line in enumerate(_lines(text), start=1):
            if matcher.line.search(line):
                yield {"path": shown, "line": number, "text": _clip(line, _MAX_MATCH_CHARS)}


# -- registration --------------------------------------------------------

_PATH_PROPERTY = {
    "type": "string",
    "description": "File path, relative to the workspace (absolute paths must be inside it).",
}

registry.register(
    name="read_file",
    toolset="file",
    schema={
        "name": "read_file",
        "description": (
            "Read a text file from the workspace. Returns numbered lines ('   12|text'), the total "
            "line count and whether more lines follow (continue with next_offset)."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "path": _PATH_PROPERTY,
                "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based)."},
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "description": f"Maximum number of lines (default {DEFAULT_READ_LIMIT}).",
                },
            },
            "required": ["path"],
        },
    },
    handler=read_file,
    emoji="📖",
)

registry.register(
    name="write_file",
    toolset="file",
    schema={
        "name": "write_file",
        "description": (
            "Create or overwrite a file in the workspace with the given content, creating parent "
            "directories. Prefer patch for small edits to existing files."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "path": _PATH_PROPERTY,
                "content": {"type": "string", "description": "The complete new file content."},
            },
            "required": ["path", "content"],
        },
    },
    handler=write_file,
    effects=[EFFECT_WRITES_FILES],
    emoji="✍️",
)

registry.register(
    name="patch",
    toolset="file",
    schema={
        "name": "patch",
        "description": (
            "Edit a workspace file by replacing an exact string. old_string must match exactly once "
            "(include surrounding lines to make it unique) unless replace_all is true."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "path": _PATH_PROPERTY,
                "old_string": {"type": "string", "description": "Exact text to replace (whitespace counts)."},
                "new_string": {"type": "string", "description": "Replacement text (may be empty)."},
                "replace_all": {
                    "type": "boolean",
                    "description": "Replace every occurrence instead of requiring a unique match.",
                    "default": False,
                },
            },
            "required": ["path", "old_string", "new_string"],
        },
    },
    handler=patch,
    effects=[EFFECT_WRITES_FILES],
    emoji="🩹",
)

registry.register(
    name="search_files",
    toolset="file",
    schema={
        "name": "search_files",
        "description": (
            "Search the workspace with a regular expression: inside text files (target 'content', "
            "returns path, line and text) or in file names (target 'files', returns paths). "
            "Skips .git, binary and very large files."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "pattern": {
                    "type": "string",
                    "description": "RE2 regular expression (Python syntax without backreferences or lookaround).",
                },
                "target": {"type": "string", "enum": ["content", "files"], "default": "content"},
                "path": {"type": "string", "description": "Directory or file to search (default: all)."},
                "file_glob": {"type": "string", "description": "Only files whose name matches, e.g. '*.py'."},
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "description": f"Max results (default {DEFAULT_SEARCH_LIMIT}, up to {MAX_SEARCH_LIMIT}).",
                },
            },
            "required": ["pattern"],
        },
    },
    handler=search_files,
    emoji="🔎",
)
