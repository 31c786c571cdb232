"""The model's Markdown rendered for each platform, through markdown-it-py (CommonMark + GFM tables and
strike-through, plus ``||spoiler||``).

- Telegram: HTML for ``parse_mode="HTML"`` with only the tags Telegram accepts (:func:`to_telegram_html`);
  :func:`telegram_text` is what the user sees of it (and the plain-text fallback), :func:`telegram_length`
  its length in UTF-16 units, the unit of Telegram's 4096 limit.
- Slack: mrkdwn with ``&<>`` escaped everywhere outside the links made here (:func:`to_mrkdwn`).
- Discord: the Markdown itself, which Discord renders, except that tables become code blocks
  (:func:`to_discord`).

Headings become bold lines, lists get bullets or numbers (nested ones indented), tables become monospace
blocks with aligned columns. The gateway splits the Markdown before an adapter renders a part, so each
adapter measures a part by its rendering (its ``length_fn``).
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Sequence

from markdown_it import MarkdownIt
from markdown_it.rules_inline import StateInline
from markdown_it.tree import SyntaxTreeNode

from platforms.base import utf16_len

__all__ = ["discord_length", "mrkdwn_length", "telegram_length", "telegram_text", "to_discord", "to_mrkdwn",
           "to_telegram_html"]

_BULLETS = ("•", "◦", "▪")
_INDENT = "  "
_RULE = "———"
_LANG = re.compile(r"[A-Za-z0-9_+\-.#]{1,32}")
_LINKABLE = re.compile(r"(?:https?|tg|mailto):", re.IGNORECASE)  # relative links lead nowhere in a chat
_TG_TAGS = {"strong": "b", "em": "i", "s": "s", "spoiler": "tg-spoiler"}
_SLACK_MARKS = {"strong": "*", "em": "_", "s": "~", "spoiler": "||"}
_FENCE_END = re.compile(r" {0,3}(`{3,}|~{3,})[ \t]*")
_TAG = re.compile(r"<[^>]*>")
_ROW = re.compile(r" {0,3}\|(?!\|).*\|[ \t]*")  # not "||": a spoiler opening a message is no table row
_DELIMITER_ROW = re.compile(r" {0,3}\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*")
_PIPE = re.compile(r"(?<!\\)\|")
# A quote longer than this shows collapsed on Telegram (<blockquote expandable>).
_EXPANDABLE_LINES = 8
_EXPANDABLE_CHARS = 600


_BACKTICKS = re.compile(r"`+")


def _spoiler_end(src: str, pos: int) -> int:
    """Where the ``||`` closing a spoiler is, from ``pos``, or -1. Code spans bind tighter (as CommonMark has them
    bind tighter than emphasis): a ``||`` inside one (``||`a||b` c||``) does not close the spoiler."""
    while (end := src.find("||", pos)) >= 0:
        tick = src.find("`", pos, end)
        if tick < 0:
            return end
        run = _BACKTICKS.match(src, tick)
        assert run is not None
        closing = re.compile(f"(?<!`){run.group()}(?!`)").search(src, run.end())
        pos = closing.end() if closing else run.end()  # an unclosed run of backticks is literal text
    return -1


def _spoiler(state: StateInline, silent: bool) -> bool:
    """``||hidden text||`` on one paragraph: a spoiler wrapping the inline Markdown inside it."""
    src, start = state.src, state.pos
    if not src.startswith("||", start):
        return False
    end = _spoiler_end(src, start + 2)
    if end < 0 or end == start + 2 or src[start + 2].isspace() or src[end - 1].isspace():
        return False
    inner = src[start + 2:end]
    if inner.count("[") != inner.count("]"):  # "||[||](url)": the "||" closes inside a link's text; links first
        return False
    if not silent:
        old_max = state.posMax
        state.push("spoiler_open", "tg-spoiler", 1)
        state.pos, state.posMax = start + 2, end
        state.md.inline.tokenize(state)
        state.push("spoiler_close", "tg-spoiler", -1)
        state.posMax = old_max
    state.pos = end + 2
    return True


_PARSER = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
_PARSER.inline.ruler.before("emphasis", "spoiler", _spoiler)
_PARSER.inline.add_terminator_char("|")  # else a text run swallows the "||" before the rule sees it


def _parse(markdown: str) -> SyntaxTreeNode:
    return SyntaxTreeNode(_PARSER.parse(markdown))


def _width(text: str) -> int:
    """Columns ``text`` takes in a monospace font (wide East Asian characters take two)."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
               for c in text)


def _pad(text: str, width: int, align: str) -> str:
    gap = width - _width(text)
    if align == "right":
        return " " * gap + text
    if align == "center":
        return " " * (gap // 2) + text + " " * (gap - gap // 2)
    return text + " " * gap


def _plain(node: SyntaxTreeNode) -> str:
    """The text of an inline node without any markup (link and image labels, code as written)."""
    if node.type in ("text", "code_inline"):
        return node.content
    if node.type in ("softbreak", "hardbreak"):
        return " "
    return "".join(_plain(child) for child in node.children)


def _cells(row: str) -> int:
    """How many cells a table row has (the pipes between them, less a leading and a trailing one)."""
    row = row.strip()
    return len(_PIPE.findall(row)) + 1 - row.startswith("|") - (row.endswith("|") and not row.endswith("\\|"))


def _with_header(markdown: str) -> tuple[str, bool]:
    """``markdown`` and False; or, when it starts with table rows but no header (a part the splitter cut from
    a long table), those rows under a blank header for the parser to see a table, and True."""
    lines = markdown.split("\n")
    if not _ROW.fullmatch(lines[0]) or (len(lines) > 1 and _DELIMITER_ROW.fullmatch(lines[1])):
        return markdown, False
    rows = lines[: next((i for i, line in enumerate(lines) if not line.strip()), len(lines))]
    columns = max(_cells(row) for row in rows)
    return f"{'|  ' * columns}|\n{'| - ' * columns}|\n{markdown}", True


def _table_text(table: SyntaxTreeNode, header: bool = True) -> str:
    """A GFM table as monospace text: columns aligned as the delimiter row asks, a rule under the header
    (no header: only the body rows, for a table continued from the previous part)."""
    rows: list[list[str]] = []
    aligns: list[str] = []
    for section in table.children:
        for tr in section.children:
            rows.append([_plain(cell) for cell in tr.children])
            if not aligns:
                aligns = [str(cell.attrs.get("style", "")).removeprefix("text-align:") for cell in tr.children]
    if not header:
        rows = rows[1:]
    widths = [max([1, *(_width(row[c]) for row in rows if c < len(row))]) for c in range(len(aligns))]

    def line(row: Sequence[str]) -> str:
        return " | ".join(_pad(cell, w, a) for cell, w, a in zip(row, widths, aligns, strict=False)).rstrip()

    if not header:
        return "\n".join(map(line, rows))
    return "\n".join([line(rows[0]), "-+-".join("-" * w for w in widths), *map(line, rows[1:])])


def _fence_body(node: SyntaxTreeNode, source_lines: Sequence[str]) -> str:
    """A code block's text. The splitter closes a part cut inside a block with ``` right after its last
    character, maybe mid-line; that marker is dropped so it does not show as code."""
    code = node.content.removesuffix("\n")
    if node.type == "fence" and node.map is not None and node.map[1] == len(source_lines):
        last = source_lines[-1]
        if not _FENCE_END.fullmatch(last) or len(last.strip()) < len(node.markup):  # never closed
            code = code.removesuffix("```")
    return code


class _Source:
    """One Markdown text parsed, with what rendering needs of its source lines."""

    def __init__(self, markdown: str) -> None:
        self.markdown, self._headless = _with_header(markdown)
        self.lines = self.markdown.split("\n")
        self.tree = _parse(self.markdown)

    def table(self, node: SyntaxTreeNode) -> str:
        """A table as monospace text; a table the part starts in continues the previous part's (no header)."""
        return _table_text(node, header=not (self._headless and node.map is not None and node.map[0] == 0))


class _Renderer:
    """Renders one Markdown text by walking markdown-it's syntax tree; subclasses say how each construct
    looks on their platform."""

    def __init__(self, markdown: str) -> None:
        self._source = _Source(markdown)

    def render(self) -> str:
        return self.blocks(self._source.tree.children, 0, quoted=False)

    # -- per platform
    def escape(self, text: str) -> str:
        raise NotImplementedError

    def code_block(self, code: str, language: str) -> str:
        raise NotImplementedError

    def heading(self, inner: str) -> str:
        raise NotImplementedError

    def quote(self, inner: str) -> str:
        raise NotImplementedError

    def emphasis(self, kind: str, inner: str) -> str:
        """``kind`` is strong, em, s or spoiler."""
        raise NotImplementedError

    def code_span(self, code: str) -> str:
        raise NotImplementedError

    def link(self, url: str, label: SyntaxTreeNode, autolink: bool) -> str:
        raise NotImplementedError

    # -- shared structure
    def blocks(self, nodes: Sequence[SyntaxTreeNode], depth: int, quoted: bool, sep: str = "\n\n") -> str:
        return sep.join(text for node in nodes if (text := self.block(node, depth, quoted)))

    def block(self, node: SyntaxTreeNode, depth: int, quoted: bool) -> str:
        kind = node.type
        if kind == "paragraph":
            return self.inline(node.children[0])
        if kind == "heading":
            return self.heading(self.inline(node.children[0]))
        if kind in ("bullet_list", "ordered_list"):
            return self.list(node, depth, quoted)
        if kind == "blockquote":
            inner = self.blocks(node.children, depth, quoted=True)
            return inner if quoted else self.quote(inner)  # quotes in quotes flatten: Telegram has no nesting
        if kind in ("fence", "code_block"):
            words = node.info.split()
            language = words[0] if words and _LANG.fullmatch(words[0]) else ""
            return self.code_block(_fence_body(node, self._source.lines), language)
        if kind == "table":
            return self.code_block(self._source.table(node), "")
        if kind == "hr":
            return _RULE
        return self.escape(node.content)

    def list(self, node: SyntaxTreeNode, depth: int, quoted: bool) -> str:
        start = int(str(node.attrs.get("start", 1))) if node.type == "ordered_list" else None
        items = []
        for i, item in enumerate(node.children):
            marker = _BULLETS[min(depth, len(_BULLETS) - 1)] if start is None else f"{start + i}."
            body = self.blocks(item.children, depth + 1, quoted, sep="\n")
            items.append(f"{_INDENT * depth}{marker} {body}")
        return "\n".join(items)

    def inline(self, node: SyntaxTreeNode) -> str:
        kind = node.type
        if kind == "text":
            return self.escape(node.content)
        if kind in ("softbreak", "hardbreak"):
            return "\n"
        if kind == "code_inline":
            return self.code_span(node.content)
        if kind == "link":
            return self.link(str(node.attrs["href"]), node, node.markup == "autolink")
        if kind == "image":
            return self.link(str(node.attrs["src"]), node, False)
        inner = "".join(self.inline(child) for child in node.children)
        return self.emphasis(kind, inner) if kind in ("strong", "em", "s", "spoiler") else inner


class _TelegramHTML(_Renderer):
    def escape(self, text: str) -> str:
        return html.escape(text, quote=False)

    def code_block(self, code: str, language: str) -> str:
        if language:
            return f'<pre><code class="language-{language}">{self.escape(code)}</code></pre>'
        return f"<pre>{self.escape(code)}</pre>"

    def heading(self, inner: str) -> str:
        return f"<b>{inner}</b>"

    def quote(self, inner: str) -> str:
        visible = telegram_text(inner)
        long = visible.count("\n") >= _EXPANDABLE_LINES or len(visible) > _EXPANDABLE_CHARS
        return f"<blockquote{' expandable' if long else ''}>{inner}</blockquote>"

    def emphasis(self, kind: str, inner: str) -> str:
        tag = _TG_TAGS[kind]
        return f"<{tag}>{inner}</{tag}>"

    def code_span(self, code: str) -> str:
        return f"<code>{self.escape(code)}</code>"

    def link(self, url: str, label: SyntaxTreeNode, autolink: bool) -> str:
        text = "".join(self.inline(child) for child in label.children) if label.type == "link" else (
            self.escape(_plain(label)) or "🖼")
        if not _LINKABLE.match(url) or "<a " in text:  # links never nest
            return text
        return f'<a href="{html.escape(url)}">{text}</a>'


class _SlackMrkdwn(_Renderer):
    def escape(self, text: str) -> str:
        """Slack's three control characters as entities, so text never forms ``<!channel>`` or a link."""
        return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    def code_block(self, code: str, language: str) -> str:
        return f"```\n{self.escape(code)}\n```"  # Slack would show the language as code

    def heading(self, inner: str) -> str:
        return f"*{inner.replace('*', '')}*" if inner else ""  # bold inside bold would end it early

    def quote(self, inner: str) -> str:
        return "\n".join(f"> {line}".rstrip() for line in inner.split("\n"))

    def emphasis(self, kind: str, inner: str) -> str:
        mark = _SLACK_MARKS[kind]
        return f"{mark}{inner}{mark}" if inner else ""

    def code_span(self, code: str) -> str:
        return f"`{self.escape(code)}`"

    def link(self, url: str, label: SyntaxTreeNode, autolink: bool) -> str:
        target = url.replace("&", "&amp;").replace("|", "%7C").replace("<", "%3C").replace(">", "%3E")
        text = self.escape(_plain(label))
        if not _LINKABLE.match(url):
            return text
        return f"<{target}>" if autolink or not text else f"<{target}|{text}>"


def _tables_as_code(markdown: str) -> str:
    """``markdown`` as written, except that each GFM table is a fenced block of aligned text."""
    source = _Source(markdown)
    lines = source.lines[:]
    tables = [node for node in source.tree.walk() if node.type == "table" and node.map is not None]
    for table in reversed(tables):
        begin, end = table.map  # type: ignore[misc]
        first = lines[begin]
        prefix = first[: len(first) - len(first.lstrip(" \t>"))]  # the list or quote the table sits in
        lines[begin:end] = [prefix + line for line in ["```", *source.table(table).split("\n"), "```"]]
    return "\n".join(lines)


def to_telegram_html(markdown: str) -> str:
    """Telegram HTML (``parse_mode="HTML"``) for ``markdown``; never raises."""
    return _TelegramHTML(markdown).render()


def telegram_text(rendered: str) -> str:
    """The text Telegram shows for HTML made by :func:`to_telegram_html` (tags removed, entities decoded)."""
    return html.unescape(_TAG.sub("", rendered))


def telegram_length(markdown: str) -> int:
    """Length of ``markdown`` as Telegram counts it once rendered: UTF-16 units of the visible text."""
    return utf16_len(telegram_text(to_telegram_html(markdown)))


def to_mrkdwn(markdown: str) -> str:
    """Slack mrkdwn for ``markdown``: ``*bold*``, ``_italic_``, ``~strike~``, ``<url|label>``, bold headings,
    bulleted lists, ``>`` quotes, code blocks without their language, tables as code blocks; ``&<>`` escaped
    outside the links made here, so the model's text never forms a control sequence such as ``<!channel>``."""
    return _SlackMrkdwn(markdown).render()


def to_discord(markdown: str) -> str:
    """Discord renders Markdown itself; only tables, which it shows raw, become code blocks."""
    return _tables_as_code(markdown) if "|" in markdown else markdown


def mrkdwn_length(markdown: str) -> int:
    """Length of ``markdown`` once rendered for Slack (characters of the mrkdwn posted)."""
    return len(to_mrkdwn(markdown))


def discord_length(markdown: str) -> int:
    """Length of ``markdown`` once rendered for Discord (UTF-16 units never undercount its characters)."""
    return utf16_len(to_discord(markdown))
