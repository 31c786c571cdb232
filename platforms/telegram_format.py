"""The assistant's Markdown-ish output as Telegram HTML (``parse_mode="HTML"``).

Handles ``**bold**`` / ``__bold__``, ``*italic*`` / ``_italic_``, ``~~strike~~``, `` `code` ``, fenced
code blocks with a language, and ``[text](https://url)``. Everything else is text with ``&``, ``<`` and
``>`` escaped. Markers that do not pair up stay literal; an unclosed fence runs to the end (as a
streamed answer looks mid-way). Only markers are removed, so the visible text is never longer than
the input: the gateway's split at 4096 UTF-16 units still fits after Telegram parses the markup.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html import escape

__all__ = ["markdown_to_html"]

# The splitter's fence rules (platforms/base.py): up to three spaces, three or more backticks.
_FENCE_LINE = re.compile(r" {0,3}(`{3,})([^`]*)")
_LANG = re.compile(r"[A-Za-z0-9_+\-.#]+")
_LINK_URL = re.compile(r"(?:https?://|tg://|mailto:)[^\s()<>]+", re.IGNORECASE)
_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_TAGS = {"**": "b", "__": "b", "*": "i", "_": "i", "~~": "s"}
_MAX_LABEL = 512  # longer "[...]" is not a link label; bounds the scan on text full of brackets
_SPLIT_MARKER = "```"  # split_message ends a part cut inside a code block with this, maybe mid-line


def markdown_to_html(text: str) -> str:
    """Telegram HTML for ``text``; never raises, and never adds visible characters."""
    out: list[str] = []
    lines = text.split("\n")
    prose: list[str] = []
    i = 0
    while i < len(lines):
        fence = _FENCE_LINE.fullmatch(lines[i])
        if fence is None:
            prose.append(lines[i])
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if _closes(lines[j], fence.group(1))), len(lines))
        if prose:
            out.append(_inline("\n".join(prose)) + "\n")
            prose = []
        body = lines[i + 1 : end]
        if end == len(lines) and body and body[-1].endswith(_SPLIT_MARKER):
            body[-1] = body[-1].removesuffix(_SPLIT_MARKER)
        out.append(_code_block(body, _language(fence.group(2))))
        i = end + 1
        if i < len(lines):
            out.append("\n")
    if prose:
        out.append(_inline("\n".join(prose)))
    return "".join(out)


def _closes(line: str, opener: str) -> bool:
    m = _FENCE_LINE.fullmatch(line)
    return m is not None and len(m.group(1)) >= len(opener) and not m.group(2).strip()


def _language(info: str) -> str:
    words = info.split()
    return words[0] if words and _LANG.fullmatch(words[0]) else ""


def _code_block(lines: list[str], language: str) -> str:
    body = escape("\n".join(lines), quote=False)
    if language:
        return f'<pre><code class="language-{escape(language)}">{body}</code></pre>'
    return f"<pre>{body}</pre>"


@dataclass(slots=True)
class _Token:
    """Rendered HTML, or an emphasis delimiter run that may pair with another."""

    html: str
    marker: str = ""
    can_open: bool = False
    can_close: bool = False


def _inline(text: str) -> str:
    """Inline Markdown of one prose block as HTML."""
    tokens: list[_Token] = []
    buf: list[str] = []

    def flush() -> None:
        if buf:
            tokens.append(_Token(escape("".join(buf), quote=False)))
            buf.clear()

    i, n = 0, len(text)
    last_link_end = text.rfind("](")
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in _PUNCTUATION:
            buf.append(text[i + 1])
            i += 2
        elif c == "`":
            run = _run_length(text, i, "`")
            close = _find_run(text, i + run, "`", run)
            if close < 0:
                buf.append(text[i : i + run])
                i += run
                continue
            flush()
            tokens.append(_Token(f"<code>{escape(text[i + run : close], quote=False)}</code>"))
            i = close + run
        elif c == "[" and i < last_link_end and (link := _link(text, i)) is not None:
            flush()
            label, url, i = link
            tokens.append(_Token(f'<a href="{escape(url)}">{_inline(label)}</a>'))
        elif c in "*_~":
            run = _run_length(text, i, c)
            if (c == "~" and run != 2) or run > 3:
                buf.append(text[i : i + run])
                i += run
                continue
            flush()
            tokens.extend(_delimiters(text, i, c, run))
            i += run
        else:
            buf.append(c)
            i += 1
    flush()
    _pair(tokens)
    return "".join(t.html for t in tokens)


def _run_length(text: str, i: int, ch: str) -> int:
    j = i
    while j < len(text) and text[j] == ch:
        j += 1
    return j - i


def _find_run(text: str, start: int, ch: str, length: int) -> int:
    """Start of the next run of exactly ``length`` ``ch`` characters at or after ``start`` (-1: none)."""
    i = text.find(ch * length, start)
    while i >= 0:
        run = _run_length(text, i, ch)
        if run == length:
            return i
        i = text.find(ch * length, i + run)
    return -1


def _link(text: str, i: int) -> tuple[str, str, int] | None:
    """``[label](url)`` at ``i``: (label, url, index after it), or None if there is none."""
    depth, j, stop = 0, i, min(len(text), i + _MAX_LABEL)
    while j < stop:
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == "[":
            depth += 1
        elif text[j] == "]":
            depth -= 1
            if depth == 0:
                break
        elif text[j] == "\n":
            return None  # labels stay on one line
        j += 1
    else:
        return None
    label = text[i + 1 : j]
    m = _LINK_URL.match(text, j + 2) if text.startswith("](", j) else None
    if not label.strip() or m is None or not text.startswith(")", m.end()):
        return None
    return label, m.group(0), m.end() + 1


def _delimiters(text: str, i: int, ch: str, run: int) -> list[_Token]:
    before = text[i - 1] if i > 0 else " "
    after = text[i + run] if i + run < len(text) else " "
    can_open = not after.isspace()
    can_close = not before.isspace()
    if ch == "_":  # snake_case_names are not emphasis
        can_open = can_open and not before.isalnum()
        can_close = can_close and not after.isalnum()
    parts = [ch * run]
    if run == 3:  # ***both***: bold outside, italic inside
        parts = [ch, ch * 2] if can_close and not can_open else [ch * 2, ch]
    return [_Token(escape(p, quote=False), p, can_open, can_close) for p in parts]


def _pair(tokens: list[_Token]) -> None:
    """Turn matching delimiter pairs into tags, innermost first; unmatched ones stay literal.

    Openers between a closer and its opener are dropped from the stack, so tags always nest.
    """
    stack: list[int] = []
    for k, tok in enumerate(tokens):
        if not tok.marker:
            continue
        opener = next((s for s in reversed(range(len(stack))) if tokens[stack[s]].marker == tok.marker), None)
        if tok.can_close and opener is not None and stack[opener] < k - 1:
            tag = _TAGS[tok.marker]
            tokens[stack[opener]].html = f"<{tag}>"
            tok.html = f"</{tag}>"
            del stack[opener:]
        elif tok.can_open:
            stack.append(k)
