"""Telegram Bot API simulator: the real wire protocol on aiohttp, for tests and the offline demo.

Point python-telegram-bot at it with ``Bot(token, base_url=sim.base_url,
base_file_url=sim.base_file_url)``. Driver methods (``user_sends`` ...) play the user; readers
(``calls``, ``sent_messages`` ...) show what the bot did; ``fail_next`` / ``drop_next`` /
``slow_next`` inject faults. Updates are kept until confirmed by a ``getUpdates`` offset or a 2xx
webhook answer, like Telegram does, so at-least-once delivery can be tested. Inline keyboards, button
presses and command menus are the interactive part (``telegram_interactive``, ``sim.interactive``); files
(getFile, downloads, uploads, their limits and faults) are ``telegram_files``, mixed in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Literal, NamedTuple, TypedDict, TypeVar, Unpack

import aiohttp
from aiohttp import web

from gateway.sim.telegram_files import Download, FilesMixin, UploadedFile
from gateway.sim.telegram_interactive import (
    ApiCall,
    InteractiveApi,
    Refused,
    button_data,
    check_inline_keyboard,
    keyboard_of,
)
from platforms.reaction_rules import TELEGRAM_REACTION_EMOJI

__all__ = [
    "ANONYMOUS_ADMIN_ID",
    "CHANNEL_BOT_ID",
    "DEFAULT_CHANNEL_ID",
    "DEFAULT_GROUP_ID",
    "DEFAULT_SUPERGROUP_ID",
    "DEFAULT_TOKEN",
    "DEFAULT_USER_ID",
    "TELEGRAM_SERVICE_ID",
    "Call",
    "Download",
    "EntityParseError",
    "Origin",
    "Sent",
    "TelegramSimulator",
    "UploadedFile",
    "WebhookDelivery",
    "parse_entities",
]

_log = logging.getLogger(__name__)

JSON = dict[str, Any]
T = TypeVar("T")

DEFAULT_TOKEN = "123456:TEST-token"
DEFAULT_USER_ID = 1001
DEFAULT_GROUP_ID = -4001
DEFAULT_SUPERGROUP_ID = -1001234567890
DEFAULT_CHANNEL_ID = -1009876543210
# Telegram's stand-in senders for messages written on behalf of a chat (the chat is the message's sender_chat).
ANONYMOUS_ADMIN_ID = 1087968824  # @GroupAnonymousBot: an anonymous admin of the group
CHANNEL_BOT_ID = 136817688  # @Channel_Bot: someone writing in a group as their channel
TELEGRAM_SERVICE_ID = 777000  # "Telegram": a channel post automatically forwarded into its discussion group
_STAND_INS: dict[str, JSON] = {
    "group": {"id": ANONYMOUS_ADMIN_ID, "is_bot": True, "first_name": "Group", "username": "GroupAnonymousBot"},
    "channel": {"id": CHANNEL_BOT_ID, "is_bot": True, "first_name": "Channel", "username": "Channel_Bot"},
    "linked_channel": {"id": TELEGRAM_SERVICE_ID, "is_bot": False, "first_name": "Telegram"},
}
MAX_TEXT_LENGTH = 4096

# Telegram's default when allowed_updates is empty: everything except these.
_DEFAULT_EXCLUDED_UPDATES = frozenset({"chat_member", "message_reaction", "message_reaction_count"})
_CHAT_ACTIONS = frozenset(
    {
        "typing", "upload_photo", "record_video", "upload_video", "record_voice", "upload_voice",
        "upload_document", "choose_sticker", "find_location", "record_video_note", "upload_video_note",
    }
)  # fmt: skip
# Form values are JSON-encoded unless they are strings; these are strings even when they look
# like JSON ("123", "true", "[x]"), so they are never decoded.
_STRING_PARAMS = frozenset(
    {
        "text", "caption", "parse_mode", "caption_parse_mode", "url", "secret_token", "ip_address",
        "action", "file_id", "callback_query_id", "inline_message_id", "photo", "document", "audio",
        "video", "voice", "animation", "sticker", "thumbnail", "title", "description", "filename",
        "language_code", "emoji", "business_connection_id", "message_effect_id", "query", "name",
    }
)  # fmt: skip
# Object-valued parameters some clients send as JSON strings even inside a JSON body.
_OBJECT_PARAMS = frozenset(
    {"reply_markup", "entities", "caption_entities", "reply_parameters", "link_preview_options",
     "allowed_updates", "commands", "scope", "reaction"}
)  # fmt: skip
_SECRET_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{1,256}")
_COMMAND_RE = re.compile(r"(?<![\w/])/[A-Za-z0-9_]{1,64}(?:@[A-Za-z0-9_]{3,32})?")
_MENTION_RE = re.compile(r"(?<![\w@/])@[A-Za-z0-9_]{4,32}")
_URL_RE = re.compile(r"https?://[^\s<>\"']+")

_WEBHOOK_CONFLICT = (
    "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete "
    "the webhook first"
)
_POLL_CONFLICT = (
    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
)
_NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup are "
    "exactly the same as a current content and reply markup of the message"
)


# --------------------------------------------------------------------------- records


@dataclass(slots=True, eq=False)
class Call:
    """One request to the Bot API, recorded on arrival and completed when answered.

    ``outcome`` is ``pending``, ``ok``, ``error``, ``dropped`` (connection closed, no effect),
    ``applied_dropped`` (took effect, then connection closed) or ``cancelled`` (client left).
    Unpacks as ``(method, params)``.
    """

    method: str
    params: JSON
    t: float
    http_method: str = "POST"
    files: dict[str, UploadedFile] = field(default_factory=dict)
    status: int | None = None
    outcome: str = "pending"
    response: JSON | None = None
    done_t: float | None = None

    def __iter__(self) -> Iterator[Any]:
        return iter((self.method, self.params))


@dataclass(slots=True, eq=False)
class Sent:
    """A message the bot sent or edited: the API call and the Message Telegram returned."""

    call: Call
    result: JSON

    @property
    def method(self) -> str:
        return self.call.method

    @property
    def params(self) -> JSON:
        return self.call.params

    @property
    def t(self) -> float:
        return self.call.t

    @property
    def chat_id(self) -> int | None:
        return self.result.get("chat", {}).get("id")

    @property
    def message_id(self) -> int | None:
        return self.result.get("message_id")

    @property
    def text(self) -> str | None:
        """What the user sees: the text (or caption) with markup already parsed away."""
        return self.result.get("text", self.result.get("caption"))

    @property
    def raw_text(self) -> str | None:
        """The text (or caption) exactly as the bot sent it, markup included."""
        return self.params.get("text", self.params.get("caption"))

    @property
    def parse_mode(self) -> str | None:
        return self.params.get("parse_mode")

    @property
    def reply_markup(self) -> JSON | None:
        return self.params.get("reply_markup")

    @property
    def message_thread_id(self) -> int | None:
        return self.result.get("message_thread_id")

    @property
    def files(self) -> dict[str, UploadedFile]:
        return self.call.files


@dataclass(slots=True, frozen=True)
class WebhookDelivery:
    """One POST of an update to the webhook: ``status`` is None on a connection error."""

    update_id: int
    url: str
    attempt: int
    t: float
    status: int | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class Origin(TypedDict, total=False):
    """Who a simulated user action comes from (keyword arguments of the ``user_*`` drivers).

    Defaults: user ``DEFAULT_USER_ID`` "Alice" (@alice); ``chat_id`` is the user's private chat,
    ``DEFAULT_GROUP_ID`` or ``DEFAULT_SUPERGROUP_ID`` by ``chat_type``. A ``message_thread_id``
    in a supergroup makes it a forum. ``is_bot`` makes the user a bot account.

    ``on_behalf_of`` (groups only) sends the message on behalf of a chat, as Telegram does: ``"group"`` for
    an anonymous admin (from @GroupAnonymousBot, sender_chat the group), ``"channel"`` for someone writing
    as their channel (from @Channel_Bot), ``"linked_channel"`` for a post of the group's linked channel
    automatically forwarded into it (from "Telegram", 777000); the channel is ``channel_id``
    (``DEFAULT_CHANNEL_ID``) titled ``channel_title``.
    """

    chat_id: int
    user_id: int
    chat_type: Literal["private", "group", "supergroup"]
    message_thread_id: int | None
    username: str | None
    first_name: str
    chat_title: str | None
    language_code: str
    is_bot: bool
    on_behalf_of: Literal["group", "channel", "linked_channel"]
    channel_id: int
    channel_title: str


@dataclass(slots=True)
class _Fault:
    kind: Literal["error", "drop", "drop_after", "slow"]
    error_code: int = 0
    body: JSON | None = None
    seconds: float = 0.0


@dataclass(slots=True)
class _Webhook:
    url: str
    secret_token: str | None
    max_connections: int
    ip_address: str | None
    last_error_date: int | None = None
    last_error_message: str | None = None


class _Described(NamedTuple):
    """A result with the ``description`` Telegram adds to some successful answers."""

    result: Any
    description: str


class _ApiError(Exception):
    def __init__(self, code: int, description: str, parameters: JSON | None = None) -> None:
        super().__init__(description)
        self.code = code
        self.description = description
        self.parameters = parameters

    def body(self) -> JSON:
        return _error_body(self.code, self.description, self.parameters)


def _error_body(code: int, description: str, parameters: JSON | None = None) -> JSON:
    body: JSON = {"ok": False, "error_code": code, "description": description}
    if parameters:
        body["parameters"] = parameters
    return body


# --------------------------------------------------------------------------- formatted text


class EntityParseError(ValueError):
    """Formatted text the Bot API rejects; the message is what follows "can't parse entities: "."""


def _u16(s: str) -> int:
    """Length in UTF-16 code units, the unit of Telegram's lengths and entity offsets."""
    return len(s) + sum(1 for ch in s if ord(ch) > 0xFFFF)


def _byte_offset(text: str, i: int) -> int:
    return len(text[:i].encode("utf-8"))


class _Out:
    """Plain-text accumulator tracking the UTF-16 offset."""

    __slots__ = ("chars", "u16")

    def __init__(self) -> None:
        self.chars: list[str] = []
        self.u16 = 0

    def add(self, s: str) -> None:
        self.chars.append(s)
        self.u16 += _u16(s)

    def since(self, index: int) -> str:
        return "".join(self.chars[index:])

    def text(self) -> str:
        return "".join(self.chars)


@dataclass(slots=True)
class _Open:
    """An entity whose start was seen and whose end is awaited."""

    kind: str
    offset: int  # UTF-16 offset in the output
    byte_offset: int  # UTF-8 offset in the input, for error messages
    begin: int  # index into _Out.chars
    attrs: dict[str, str] = field(default_factory=dict)


def _entity(kind: str, offset: int, length: int, **extra: Any) -> JSON:
    return {"type": kind, "offset": offset, "length": length, **extra}


def _link_entity(url: str, offset: int, length: int) -> JSON:
    if m := re.fullmatch(r"tg://user\?id=(\d+)", url):
        user = {"id": int(m.group(1)), "is_bot": False, "first_name": ""}
        return _entity("text_mention", offset, length, user=user)
    return _entity("text_link", offset, length, url=url)


def _sorted(entities: list[JSON]) -> list[JSON]:
    return sorted(entities, key=lambda e: (e["offset"], -e["length"]))


_MDV2_RESERVED = "_*[]()~`>#+-=|{}.!"
_MDV2_NAMES = {
    "bold": "Bold", "italic": "Italic", "underline": "Underline", "strikethrough": "Strikethrough",
    "spoiler": "Spoiler", "code": "Code", "pre": "Pre", "text_link": "TextUrl",
    "custom_emoji": "CustomEmoji",
}  # fmt: skip


def _parse_markdown_v2(text: str) -> tuple[str, list[JSON]]:
    """A port of tdlib's MarkdownV2 parser (plus line-start '>' block quotes)."""
    out = _Out()
    entities: list[JSON] = []
    stack: list[_Open] = []
    quote: _Open | None = None
    n = len(text)
    i = 0

    def at(k: int) -> str:
        return text[k] if k < n else ""

    def reserved_error(ch: str) -> EntityParseError:
        return EntityParseError(f"Character '{ch}' is reserved and must be escaped with the preceding '\\'")

    def close_quote(end: int) -> None:
        nonlocal quote
        if quote is not None and end > quote.offset:
            entities.append(_entity(quote.kind, quote.offset, end - quote.offset))
        quote = None

    while i < n:
        in_code = bool(stack) and stack[-1].kind in ("code", "pre")
        if not in_code and (i == 0 or text[i - 1] == "\n"):
            expandable = text.startswith("**>", i)
            if expandable or at(i) == ">":
                if quote is None:
                    kind = "expandable_blockquote" if expandable else "blockquote"
                    quote = _Open(kind, out.u16, _byte_offset(text, i), len(out.chars))
                i += 3 if expandable else 1
                continue
            if quote is not None:
                close_quote(out.u16 - 1)  # the quote ended before the newline just emitted
        c = text[i]
        if c == "\\" and i + 1 < n and 0 < ord(text[i + 1]) <= 126:
            out.add(text[i + 1])
            i += 2
            continue
        if (
            quote is not None
            and quote.kind == "expandable_blockquote"
            and text.startswith("||", i)
            and at(i + 2) in ("", "\n")
            and not (stack and stack[-1].kind == "spoiler")
        ):
            i += 2  # "||" at the end of a line closes an expandable block quote
            close_quote(out.u16)
            continue
        reserved = "`" if in_code else _MDV2_RESERVED
        if c not in reserved:
            out.add(c)
            i += 1
            continue

        top = stack[-1].kind if stack else None
        is_end = (
            (top == "bold" and c == "*")
            or (top == "italic" and c == "_" and at(i + 1) != "_")
            or (top == "code" and c == "`")
            or (top == "pre" and text.startswith("```", i))
            or (top in ("text_link", "custom_emoji") and c == "]")
            or (top == "underline" and text.startswith("__", i))
            or (top == "strikethrough" and c == "~")
            or (top == "spoiler" and text.startswith("||", i))
        )
        if not is_end:
            start = i
            attrs: dict[str, str] = {}
            if c == "_":
                kind = "underline" if at(i + 1) == "_" else "italic"
                i += 2 if kind == "underline" else 1
            elif c == "*":
                kind, i = "bold", i + 1
            elif c == "~":
                kind, i = "strikethrough", i + 1
            elif c == "|" and at(i + 1) == "|":
                kind, i = "spoiler", i + 2
            elif c == "[":
                kind, i = "text_link", i + 1
            elif c == "!" and at(i + 1) == "[":
                kind, i = "custom_emoji", i + 2
            elif c == "`" and text.startswith("```", i):
                kind, i = "pre", i + 3
                j = i
                while j < n and not text[j].isspace() and text[j] != "`":
                    j += 1
                if j != i and j < n and text[j] != "`":
                    attrs["language"] = text[i:j]
                    i = j
                if at(i) in ("\n", "\r"):  # one newline after the opening fence is dropped
                    i += 2 if at(i + 1) in ("\n", "\r") and at(i + 1) != at(i) else 1
            elif c == "`":
                kind, i = "code", i + 1
            else:
                raise reserved_error(c)
            stack.append(_Open(kind, out.u16, _byte_offset(text, start), len(out.chars), attrs))
            continue

        op = stack.pop()
        extra: JSON = {}
        link = ""
        if op.kind in ("underline", "spoiler"):
            i += 2
        elif op.kind == "pre":
            i += 3
            if "language" in op.attrs:
                extra["language"] = op.attrs["language"]
        elif op.kind in ("text_link", "custom_emoji"):
            i += 1
            if at(i) == "(":
                i += 1
                url_begin = i
                url: list[str] = []
                while i < n and text[i] != ")":
                    if text[i] == "\\" and i + 1 < n and 0 < ord(text[i + 1]) <= 126:
                        url.append(text[i + 1])
                        i += 2
                        continue
                    url.append(text[i])
                    i += 1
                if i >= n:
                    raise EntityParseError(f"Can't find end of a URL at byte offset {_byte_offset(text, url_begin)}")
                i += 1
                link = "".join(url)
            else:
                link = out.since(op.begin)
            if op.kind == "custom_emoji":
                m = re.fullmatch(r"tg://emoji\?id=(\d+)", link)
                if not m:
                    raise EntityParseError("Custom emoji URL must have scheme tg")
                extra["custom_emoji_id"] = m.group(1)
        else:
            i += 1
        length = out.u16 - op.offset
        if length:
            if op.kind == "text_link":
                if link:
                    entities.append(_link_entity(link, op.offset, length))
            else:
                entities.append(_entity(op.kind, op.offset, length, **extra))

    if stack:
        op = stack[-1]
        raise EntityParseError(f"Can't find end of {_MDV2_NAMES[op.kind]} entity at byte offset {op.byte_offset}")
    close_quote(out.u16)
    return out.text(), _sorted(entities)


def _parse_markdown(text: str) -> tuple[str, list[JSON]]:
    """A port of tdlib's legacy Markdown parser."""
    out = _Out()
    entities: list[JSON] = []
    n = len(text)
    i = 0
    kinds = {"*": "bold", "_": "italic", "`": "code", "[": "text_link"}
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in "_*`[":
            out.add(text[i + 1])
            i += 2
            continue
        if c not in kinds:
            out.add(c)
            i += 1
            continue
        begin = i
        end_char = "]" if c == "[" else c
        kind = kinds[c]
        language = ""
        i += 1
        if text.startswith("``", i) and c == "`":
            kind = "pre"
            i += 2
            j = i
            while j < n and not text[j].isspace() and text[j] != "`":
                j += 1
            if j != i and j < n and text[j] != "`":
                language, i = text[i:j], j
            if i < n and text[i] in "\r\n":
                i += 1
        offset = out.u16
        while i < n and (text[i] != end_char or (kind == "pre" and not text.startswith("```", i))):
            out.add(text[i])
            i += 1
        if i >= n:
            raise EntityParseError(
                f"Can't find end of the entity starting at byte offset {_byte_offset(text, begin)}"
            )
        i += 3 if kind == "pre" else 1
        length = out.u16 - offset
        if kind == "text_link":
            url = ""
            if i < n and text[i] == "(":
                close = text.find(")", i)
                if close < 0:
                    raise EntityParseError(
                        f"Can't find end of a URL at byte offset {_byte_offset(text, i + 1)}"
                    )
                url, i = text[i + 1 : close], close + 1
            if url and length:
                entities.append(_link_entity(url, offset, length))
        elif length:
            extra = {"language": language} if language else {}
            entities.append(_entity(kind, offset, length, **extra))
    return out.text(), _sorted(entities)


_HTML_TAGS = {
    "b": "bold", "strong": "bold", "i": "italic", "em": "italic", "u": "underline", "ins": "underline",
    "s": "strikethrough", "strike": "strikethrough", "del": "strikethrough", "span": "spoiler",
    "tg-spoiler": "spoiler", "a": "text_link", "code": "code", "pre": "pre",
    "blockquote": "blockquote", "tg-emoji": "custom_emoji",
}  # fmt: skip
_HTML_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}
_HTML_ENTITY_RE = re.compile(r"&(?:#(\d{1,7})|#[xX]([0-9a-fA-F]{1,6})|([a-zA-Z]{2,6}));")


def _html_entity(text: str, i: int) -> tuple[str, int] | None:
    """Decode the character reference at ``text[i] == '&'``: (char, next index) or None."""
    m = _HTML_ENTITY_RE.match(text, i)
    if not m:
        return None
    if m.group(3):
        ch = _HTML_NAMED.get(m.group(3))
        return (ch, m.end()) if ch else None
    cp = int(m.group(1)) if m.group(1) else int(m.group(2), 16)
    if cp == 0 or cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
        return None
    return chr(cp), m.end()


def _html_unescape(s: str) -> str:
    parts: list[str] = []
    i = 0
    while i < len(s):
        if s[i] == "&" and (dec := _html_entity(s, i)):
            parts.append(dec[0])
            i = dec[1]
        else:
            parts.append(s[i])
            i += 1
    return "".join(parts)


def _is_tag_char(ch: str) -> bool:
    return ch.isascii() and (ch.isalnum() or ch in "-_")


def _parse_html(text: str) -> tuple[str, list[JSON]]:
    """A port of tdlib's HTML parser: the supported tags only, balanced, with their attributes."""
    out = _Out()
    entities: list[JSON] = []
    stack: list[_Open] = []
    n = len(text)
    i = 0

    def skip_spaces(k: int) -> int:
        while k < n and text[k].isspace():
            k += 1
        return k

    while i < n:
        c = text[i]
        if c == "&":
            dec = _html_entity(text, i)
            out.add(dec[0] if dec else "&")
            i = dec[1] if dec else i + 1
            continue
        if c != "<":
            out.add(c)
            i += 1
            continue
        begin = i
        where = f"at byte offset {_byte_offset(text, begin)}"
        i += 1
        if i < n and text[i] == "/":
            i += 1
            j = i
            while j < n and _is_tag_char(text[j]):
                j += 1
            tag, i = text[i:j].lower(), skip_spaces(j)
            if i >= n or text[i] != ">":
                raise EntityParseError(f"Unclosed end tag {where}")
            i += 1
            if not stack:
                raise EntityParseError(f"Unexpected end tag {where}")
            if stack[-1].kind != tag:
                raise EntityParseError(
                    f'Unmatched end tag {where}, expected "</{stack[-1].kind}>", found "</{tag}>"'
                )
            op = stack.pop()
            length = out.u16 - op.offset
            kind = _HTML_TAGS[tag]
            language = op.attrs.get("class", "")
            if tag == "code" and stack and stack[-1].kind == "pre" and language.startswith("language-"):
                stack[-1].attrs["language"] = language.removeprefix("language-")
                continue
            if not length:
                continue
            if tag == "a":
                if href := op.attrs.get("href"):
                    entities.append(_link_entity(href, op.offset, length))
            elif tag == "pre" and op.attrs.get("language"):
                entities.append(_entity("pre", op.offset, length, language=op.attrs["language"]))
            elif tag == "blockquote" and "expandable" in op.attrs:
                entities.append(_entity("expandable_blockquote", op.offset, length))
            elif tag == "tg-emoji":
                entities.append(_entity(kind, op.offset, length, custom_emoji_id=op.attrs["emoji-id"]))
            else:
                entities.append(_entity(kind, op.offset, length))
            continue

        j = i
        while j < n and _is_tag_char(text[j]):
            j += 1
        tag, i = text[i:j].lower(), j
        if tag not in _HTML_TAGS:
            raise EntityParseError(f'Unsupported start tag "{tag}" {where}')
        attrs: dict[str, str] = {}
        while True:
            i = skip_spaces(i)
            if i >= n:
                raise EntityParseError(f"Unclosed start tag {where}")
            if text[i] == ">":
                i += 1
                break
            j = i
            while j < n and _is_tag_char(text[j]):
                j += 1
            if j == i:
                raise EntityParseError(f'Empty attribute name in the tag "{tag}" {where}')
            name, i = text[i:j].lower(), skip_spaces(j)
            if i < n and text[i] == "=":
                i = skip_spaces(i + 1)
                if i >= n:
                    raise EntityParseError(f"Unclosed start tag {where}")
                if text[i] in "'\"":
                    close = text.find(text[i], i + 1)
                    if close < 0:
                        raise EntityParseError(f"Unclosed start tag {where}")
                    value, i = text[i + 1 : close], close + 1
                else:
                    j = i
                    while j < n and not text[j].isspace() and text[j] != ">":
                        j += 1
                    value, i = text[i:j], j
                attrs[name] = _html_unescape(value)
            else:
                attrs[name] = ""
        if tag == "span" and attrs.get("class") != "tg-spoiler":
            raise EntityParseError(f'Tag "span" must have class "tg-spoiler" {where}')
        if tag == "tg-emoji" and not attrs.get("emoji-id", "").isdigit():
            raise EntityParseError(f'Tag "tg-emoji" must have attribute "emoji-id" {where}')
        stack.append(_Open(tag, out.u16, _byte_offset(text, begin), len(out.chars), attrs))

    if stack:
        raise EntityParseError(f'Can\'t find end tag corresponding to start tag "{stack[-1].kind}"')
    return out.text(), _sorted(entities)


def parse_entities(text: str, parse_mode: str | None) -> tuple[str, list[JSON]]:
    """Render ``text`` as Telegram does: (plain text, entities with UTF-16 offsets).

    Raises EntityParseError where the Bot API answers "can't parse entities", ValueError for an
    unknown parse mode.
    """
    mode = (parse_mode or "").lower()
    if not mode:
        return text, []
    if mode == "markdownv2":
        return _parse_markdown_v2(text)
    if mode == "markdown":
        return _parse_markdown(text)
    if mode == "html":
        return _parse_html(text)
    raise ValueError(f"unsupported parse_mode {parse_mode!r}")


def _auto_entities(text: str) -> list[JSON]:
    """The entities Telegram detects in a user's text: /commands, @mentions and URLs."""
    found: list[tuple[int, int, str]] = []
    for regex, kind in ((_COMMAND_RE, "bot_command"), (_URL_RE, "url"), (_MENTION_RE, "mention")):
        for m in regex.finditer(text):
            if not any(s < m.end() and m.start() < e for s, e, _ in found):
                found.append((m.start(), m.end(), kind))
    return _sorted([_entity(kind, _u16(text[:s]), _u16(text[s:e])) for s, e, kind in found])


# --------------------------------------------------------------------------- wire helpers


def _decode_form_value(key: str, value: str) -> Any:
    if key in _STRING_PARAMS:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _normalize_json_value(key: str, value: Any) -> Any:
    if key in _OBJECT_PARAMS and isinstance(value, str):
        with contextlib.suppress(ValueError):
            return json.loads(value)
    return value


def _as_int(value: Any, default: int) -> int:
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise _ApiError(400, f"Bad Request: invalid integer value {value!r}") from None


def _update_type(update: JSON) -> str:
    return next((k for k in update if k != "update_id"), "")


def _inline_markup(markup: Any) -> JSON | None:
    """Telegram echoes only inline keyboards back in the Message (refused when malformed)."""
    if isinstance(markup, dict) and "inline_keyboard" in markup:
        check_inline_keyboard(markup)
        return markup
    return None


def _phrase(code: int) -> str:
    try:
        return HTTPStatus(code).phrase
    except ValueError:
        return ""


def _default_description(code: int) -> str:
    if code == 403:
        return "Forbidden: bot was blocked by the user"
    if code == 409:
        return _POLL_CONFLICT
    return _phrase(code) or f"Error {code}"


# --------------------------------------------------------------------------- the simulator


_Handler = Callable[[Call], Awaitable[Any]]


class TelegramSimulator(FilesMixin):
    """A Telegram Bot API server on an ephemeral local port, with drivers, readers and faults.

    Chats must be known before the bot writes to them (``strict_chats``): a ``user_*`` driver or
    ``add_chat`` registers them, as a user writing to the bot first does on real Telegram.
    Webhook retries back off from ``webhook_retry_initial`` doubling up to ``webhook_retry_max``.
    """

    def __init__(
        self,
        token: str = DEFAULT_TOKEN,
        bot_username: str = "hermes_bot",
        bot_id: int | None = None,
        *,
        bot_first_name: str = "Hermes",
        strict_chats: bool = True,
        webhook_retry_initial: float = 0.05,
        webhook_retry_max: float = 1.0,
        webhook_timeout: float = 5.0,
    ) -> None:
        super().__init__()
        prefix = token.split(":", 1)[0]
        self.token = token
        self.bot_id = bot_id if bot_id is not None else (int(prefix) if prefix.isdigit() else 123456)
        self.bot_user: JSON = {
            "id": self.bot_id,
            "is_bot": True,
            "first_name": bot_first_name,
            "username": bot_username,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
            "can_connect_to_business": False,
            "has_main_web_app": False,
        }
        self.strict_chats = strict_chats
        self.webhook_retry_initial = webhook_retry_initial
        self.webhook_retry_max = webhook_retry_max
        self.webhook_timeout = webhook_timeout

        self.interactive = InteractiveApi(self.bot_id)
        """Callback queries and command menus (telegram_interactive.py)."""
        self._handlers: dict[str, _Handler] = {
            "getMe": self._get_me,
            "deleteWebhook": self._delete_webhook,
            "setWebhook": self._set_webhook,
            "getWebhookInfo": self._get_webhook_info,
            "getUpdates": self._get_updates,
            "sendMessage": self._send_message,
            "editMessageText": self._edit_message_text,
            "sendChatAction": self._send_chat_action,
            "sendPhoto": self._send_photo,
            "sendDocument": self._send_document,
            "sendVoice": self._send_voice,
            "sendAudio": self._send_audio,
            "getFile": self._get_file,
            "getChat": self._get_chat,
            "deleteMessage": self._delete_message,
            "setMessageReaction": self._set_message_reaction,
            **self.interactive.handlers(),
        }
        self._canonical = {name.lower(): name for name in self._handlers}

        self._calls: list[Call] = []
        self._sent: list[Sent] = []
        self._edits: list[Sent] = []
        self._chat_actions: list[Call] = []
        self._deleted: list[tuple[int, int]] = []
        self._reactions: list[Call] = []
        self._bot_reactions: dict[tuple[int, int], list[str]] = {}
        self._deliveries: list[WebhookDelivery] = []
        self._faults: dict[str, deque[_Fault]] = defaultdict(deque)

        self._updates: list[JSON] = []  # every update ever pushed
        self._pending: list[JSON] = []  # not yet confirmed
        self._next_update_id = 10001
        self._allowed_updates: list[str] | None = None
        self._chats: dict[int, JSON] = {}
        self._blocked: set[int] = set()
        self._messages: dict[tuple[int, int], JSON] = {}
        self._last_message_id: dict[int, int] = defaultdict(int)
        self._webhook: _Webhook | None = None

        self._poll_generation = 0
        self._poll_event = asyncio.Event()
        self._change_event = asyncio.Event()
        self._webhook_wake = asyncio.Event()
        self._stop_event = asyncio.Event()
        self._stopping = False
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._webhook_task: asyncio.Task[None] | None = None
        self._host = "127.0.0.1"
        self._port = 0

    # ----------------------------------------------------------------- lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on ``host:port`` (0 = ephemeral). State survives stop() and a new start()."""
        if self._runner is not None:
            raise RuntimeError("TelegramSimulator is already running")
        self._stopping = False
        self._stop_event = asyncio.Event()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._handle_api)
        app.router.add_route("GET", "/file/bot{token}/{path:.+}", self._handle_file)
        app.router.add_route("*", "/{tail:.*}", self._handle_unknown_path)
        # handler_cancellation: a long poll whose client went away ends at once.
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        self._runner = runner
        self._host = host
        self._port = runner.addresses[0][1]
        if self._webhook is not None:
            self._ensure_webhook_task()

    async def stop(self) -> None:
        """Wake pending long polls (they answer ``[]``), stop webhook delivery, close the server."""
        if self._runner is None:
            return
        self._stopping = True
        self._stop_event.set()
        self._kick_pollers()
        self._webhook_wake.set()
        if self._webhook_task is not None:
            self._webhook_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._webhook_task
            self._webhook_task = None
        runner, self._runner = self._runner, None
        await runner.cleanup()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> TelegramSimulator:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """Root URL of the server, e.g. ``http://127.0.0.1:PORT``."""
        return f"http://{self._host}:{self._port}"

    @property
    def base_url(self) -> str:
        """For ``Bot(base_url=...)``: the library appends the token."""
        return f"{self.url}/bot"

    @property
    def base_file_url(self) -> str:
        """For ``Bot(base_file_url=...)``: the library appends the token."""
        return f"{self.url}/file/bot"

    def api_url(self, method: str) -> str:
        """Full URL of one method, for raw HTTP clients."""
        return f"{self.base_url}{self.token}/{method}"

    @property
    def open_connections(self) -> int:
        """TCP connections clients hold open to the simulator now (busy or idle keep-alive)."""
        server = self._runner.server if self._runner is not None else None
        return len(server.connections) if server is not None else 0

    # ----------------------------------------------------------------- readers

    @property
    def calls(self) -> list[Call]:
        """Every request in arrival order, in flight ones included; each unpacks as (method, params)."""
        return list(self._calls)

    def calls_of(self, method: str) -> list[Call]:
        return [c for c in self._calls if c.method == method]

    def sent_messages(self, chat_id: int | None = None) -> list[Sent]:
        """Messages that sendMessage created (including ones whose response was dropped)."""
        return [s for s in self._sent if s.method == "sendMessage" and chat_id in (None, s.chat_id)]

    def edits(self, chat_id: int | None = None) -> list[Sent]:
        """Successful editMessageText calls (``result`` is True for inline messages)."""
        return [s for s in self._edits if chat_id in (None, s.chat_id)]

    def chat_actions(self, chat_id: int | None = None) -> list[Call]:
        return [c for c in self._chat_actions if chat_id is None or c.params.get("chat_id") in (chat_id, str(chat_id))]

    def chat_history(self, chat_id: int) -> list[JSON]:
        """The chat as users see it now: every live message (both sides) in order, edits applied."""
        return [m for (cid, _), m in sorted(self._messages.items()) if cid == chat_id]

    @property
    def deleted_messages(self) -> list[tuple[int, int]]:
        """(chat_id, message_id) pairs deleted by the bot."""
        return list(self._deleted)

    def reaction_calls(self, chat_id: int | None = None) -> list[Call]:
        """Successful setMessageReaction calls, in order."""
        return [c for c in self._reactions
                if chat_id is None or c.params.get("chat_id") in (chat_id, str(chat_id))]

    def reactions_shown(self, chat_id: int | None = None) -> list[list[str]]:
        """The emoji the bot's reaction showed after each successful setMessageReaction ([] = removed)."""
        return [[r["emoji"] for r in c.params.get("reaction") or []] for c in self.reaction_calls(chat_id)]

    def bot_reaction(self, chat_id: int, message_id: int) -> list[str]:
        """The emoji the bot reacts with on a message now."""
        return list(self._bot_reactions.get((chat_id, message_id), []))

    @property
    def callback_answers(self) -> list[ApiCall]:
        """Successful answerCallbackQuery calls (the ``Call`` objects), in order."""
        return self.interactive.answers

    def keyboard(self, chat_id: int, message_id: int) -> list[list[JSON]]:
        """The inline keyboard a live message shows now, row by row ([] when none)."""
        return keyboard_of(self._messages.get((chat_id, message_id)))

    @property
    def updates(self) -> list[JSON]:
        """Every update pushed, confirmed or not."""
        return list(self._updates)

    @property
    def pending_updates(self) -> list[JSON]:
        """Updates not yet confirmed by an offset or a 2xx webhook answer."""
        return list(self._pending)

    @property
    def deliveries(self) -> list[WebhookDelivery]:
        return list(self._deliveries)

    @property
    def webhook_url(self) -> str:
        return self._webhook.url if self._webhook else ""

    @property
    def commands(self) -> dict[str, list[JSON]]:
        """setMyCommands state keyed by ``json(scope)|language_code`` (see ``interactive.commands_for``)."""
        return self.interactive.commands

    async def wait_for(self, predicate: Callable[[], T | None], timeout: float = 5.0) -> T:
        """Return the first truthy ``predicate()``, re-checked on every change; TimeoutError after ``timeout``."""

        async def _wait() -> T:
            while True:
                event = self._change_event
                if value := predicate():
                    return value
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), 0.05)

        return await asyncio.wait_for(_wait(), timeout)

    async def wait_for_messages(self, n: int = 1, chat_id: int | None = None, timeout: float = 5.0) -> list[Sent]:
        """Wait until sendMessage created at least ``n`` messages (in ``chat_id``); return them all."""

        def ready() -> list[Sent] | None:
            sent = self.sent_messages(chat_id)
            return sent if len(sent) >= n else None

        return await self.wait_for(ready, timeout)

    async def wait_for_call(self, method: str, n: int = 1, timeout: float = 5.0) -> Call:
        """Wait until ``method`` was called ``n`` times (the call may still be in flight); return that call."""

        def ready() -> Call | None:
            calls = self.calls_of(method)
            return calls[n - 1] if len(calls) >= n else None

        return await self.wait_for(ready, timeout)

    # ----------------------------------------------------------------- faults

    def _fault_key(self, method: str) -> str:
        if method == "*":
            return method
        key = method.lower()
        if key not in self._canonical:
            raise ValueError(f"unknown Bot API method {method!r}")
        return key

    def fail_next(
        self,
        method: str,
        n: int = 1,
        *,
        error_code: int = 429,
        retry_after: int | None = None,
        description: str | None = None,
        parameters: JSON | None = None,
    ) -> None:
        """Answer the next ``n`` calls of ``method`` ("*" = any) with an error, without effect.

        429 defaults to ``retry_after=2`` and Telegram's "Too Many Requests: retry after N".
        """
        params = dict(parameters or {})
        if error_code == 429 and retry_after is None:
            retry_after = 2
        if retry_after is not None:
            params["retry_after"] = retry_after
        if description is None:
            description = (
                f"Too Many Requests: retry after {retry_after}"
                if error_code == 429
                else _default_description(error_code)
            )
        body = _error_body(error_code, description, params or None)
        for _ in range(n):
            self._faults[self._fault_key(method)].append(_Fault("error", error_code, body))

    def drop_next(self, method: str, n: int = 1, *, after_apply: bool = False) -> None:
        """Close the connection without answering the next ``n`` calls of ``method``.

        ``after_apply=False``: the call has no effect. ``after_apply=True``: it takes effect (the
        message is sent, the offset confirmed) and only the response is lost.
        """
        kind: Literal["drop", "drop_after"] = "drop_after" if after_apply else "drop"
        for _ in range(n):
            self._faults[self._fault_key(method)].append(_Fault(kind))

    def slow_next(self, method: str, seconds: float, n: int = 1) -> None:
        """Delay the next ``n`` calls of ``method`` by ``seconds`` before handling them normally."""
        for _ in range(n):
            self._faults[self._fault_key(method)].append(_Fault("slow", seconds=seconds))

    def clear_faults(self) -> None:
        self._faults.clear()

    def _take_fault(self, method: str) -> _Fault | None:
        for key in (method.lower(), "*"):
            queue = self._faults.get(key)
            if queue:
                return queue.popleft()
        return None

    # ----------------------------------------------------------------- drivers

    def add_chat(
        self,
        chat_id: int,
        chat_type: Literal["private", "group", "supergroup", "channel"] | None = None,
        *,
        title: str | None = None,
        username: str | None = None,
        first_name: str | None = None,
        is_forum: bool = False,
    ) -> JSON:
        """Register (or update) a chat the bot may write to; returns the Chat object."""
        if chat_type is None:
            chat_type = "private" if chat_id > 0 else "supergroup" if str(chat_id).startswith("-100") else "group"
        chat: JSON = {"id": chat_id, "type": chat_type}
        if chat_type == "private":
            chat["first_name"] = first_name or "User"
        else:
            chat["title"] = title or f"Chat {chat_id}"
        if username:
            chat["username"] = username
        if is_forum or self._chats.get(chat_id, {}).get("is_forum"):
            chat["is_forum"] = True
        self._chats[chat_id] = chat
        return dict(chat)

    def user_blocks_bot(self, chat_id: int) -> None:
        """From now on the bot gets 403 "Forbidden: bot was blocked by the user" in this chat."""
        self._blocked.add(chat_id)

    def push_update(self, update: JSON) -> JSON:
        """Queue a raw Update (``update_id`` assigned when missing) for getUpdates or the webhook."""
        update = dict(update)
        if "update_id" not in update:
            update["update_id"] = self._next_update_id
        self._next_update_id = max(self._next_update_id, int(update["update_id"]) + 1)
        self._updates.append(update)
        self._pending.append(update)
        self._kick_pollers()
        self._webhook_wake.set()
        self._changed()
        return update

    def user_sends(
        self,
        text: str,
        *,
        entities: list[JSON] | None = None,
        reply_to_bot_message_id: int | None = None,
        **origin: Unpack[Origin],
    ) -> JSON:
        """A user writes ``text``; /commands, @mentions and URLs get entities unless given.

        ``reply_to_bot_message_id`` names a message in the same chat (usually one the bot sent).
        """
        user, chat = self._origin(origin)
        fields: JSON = {"text": text}
        ents = _auto_entities(text) if entities is None else entities
        if ents:
            fields["entities"] = ents
        msg = self._user_message(user, chat, origin, reply_to_bot_message_id, fields)
        return self.push_update({"message": msg})

    def user_edits(
        self, message_id: int, text: str, *, entities: list[JSON] | None = None, **origin: Unpack[Origin]
    ) -> JSON:
        """A user edits an earlier message of theirs: an ``edited_message`` update."""
        _, chat = self._origin(origin)
        old = self._messages.get((chat["id"], message_id))
        if old is None:
            raise KeyError(f"no message {message_id} in chat {chat['id']}")
        msg = dict(old, text=text, edit_date=int(time.time()))
        msg.pop("entities", None)
        if ents := (_auto_entities(text) if entities is None else entities):
            msg["entities"] = ents
        self._messages[(chat["id"], message_id)] = msg
        return self.push_update({"edited_message": msg})

    def user_clicks(self, message_id: int, data: str, *, inaccessible: bool = False, **origin: Unpack[Origin]) -> JSON:
        """A user presses the inline button carrying ``callback_data`` ``data`` on a message the bot sent: a
        ``callback_query`` update (ValueError when the message shows no such button). ``inaccessible``: the query
        carries only the message's chat and id, as Telegram does for a message the bot can no longer see."""
        user, chat = self._origin(origin)
        msg = self._messages.get((chat["id"], message_id))
        if msg is None:
            raise KeyError(f"no message {message_id} in chat {chat['id']}")
        query = self.interactive.callback_query(msg, user, data, inaccessible=inaccessible)
        return self.push_update({"callback_query": query})

    def user_presses(self, message_id: int, label: str, *, inaccessible: bool = False,
                     **origin: Unpack[Origin]) -> JSON:
        """``user_clicks`` on the button labelled ``label`` (whatever callback_data it carries)."""
        _, chat = self._origin(origin)
        msg = self._messages.get((chat["id"], message_id))
        if msg is None:
            raise KeyError(f"no message {message_id} in chat {chat['id']}")
        return self.user_clicks(message_id, button_data(msg, label), inaccessible=inaccessible, **origin)

    # ----------------------------------------------------------------- driver internals

    def _origin(self, origin: Origin) -> tuple[JSON, JSON]:
        user_id = origin.get("user_id", DEFAULT_USER_ID)
        first_name = origin.get("first_name", "Alice")
        username = origin.get("username", "alice")
        chat_type = origin.get("chat_type", "private")
        user: JSON = {"id": user_id, "is_bot": origin.get("is_bot", False), "first_name": first_name}
        if username:
            user["username"] = username
        user["language_code"] = origin.get("language_code", "en")
        default_chat = {"private": user_id, "group": DEFAULT_GROUP_ID, "supergroup": DEFAULT_SUPERGROUP_ID}
        chat_id = origin.get("chat_id", default_chat[chat_type])
        forum = chat_type == "supergroup" and origin.get("message_thread_id") is not None
        if chat_type == "private":
            chat = self.add_chat(chat_id, "private", first_name=first_name, username=username)
        else:
            title = origin.get("chat_title") or self._chats.get(chat_id, {}).get("title")
            chat = self.add_chat(chat_id, chat_type, title=title, is_forum=forum)
        return user, chat

    def _user_message(
        self, user: JSON, chat: JSON, origin: Origin, reply_to_id: int | None, fields: JSON
    ) -> JSON:
        reply_to = None
        if reply_to_id is not None:
            reply_to = self._messages.get((chat["id"], reply_to_id))
            if reply_to is None:
                raise KeyError(f"no message {reply_to_id} in chat {chat['id']}")
        sender, sent_as = self._sender(user, chat, origin)
        return self._new_message(
            chat, sender, thread_id=origin.get("message_thread_id"), reply_to=reply_to, fields={**sent_as, **fields}
        )

    def _sender(self, user: JSON, chat: JSON, origin: Origin) -> tuple[JSON, JSON]:
        """The message's ``from`` and, on behalf of a chat, its ``sender_chat`` (and forward) fields."""
        on_behalf_of = origin.get("on_behalf_of")
        if on_behalf_of is None:
            return user, {}
        if chat["type"] == "private":
            raise ValueError("only group messages are sent on behalf of a chat")
        stand_in = dict(_STAND_INS[on_behalf_of])
        if on_behalf_of == "group":
            return stand_in, {"sender_chat": dict(chat)}
        channel = self.add_chat(origin.get("channel_id", DEFAULT_CHANNEL_ID), "channel",
                                title=origin.get("channel_title"))
        if on_behalf_of == "channel":
            return stand_in, {"sender_chat": channel}
        self._last_message_id[channel["id"]] += 1
        post = {"type": "channel", "chat": channel, "message_id": self._last_message_id[channel["id"]],
                "date": int(time.time())}
        return stand_in, {"sender_chat": channel, "is_automatic_forward": True, "forward_origin": post}

    def _caption_fields(self, caption: str | None) -> JSON:
        if not caption:
            return {}
        fields: JSON = {"caption": caption}
        if ents := _auto_entities(caption):
            fields["caption_entities"] = ents
        return fields

    def _new_message(
        self,
        chat: JSON,
        sender: JSON,
        *,
        thread_id: int | None = None,
        reply_to: JSON | None = None,
        fields: JSON,
    ) -> JSON:
        chat_id = chat["id"]
        self._last_message_id[chat_id] += 1
        message_id = self._last_message_id[chat_id]
        msg: JSON = {"message_id": message_id, "from": dict(sender), "chat": dict(chat), "date": int(time.time())}
        if thread_id is not None:
            msg["message_thread_id"] = thread_id
            if chat.get("is_forum"):
                msg["is_topic_message"] = True
        if reply_to is not None:
            msg["reply_to_message"] = {k: v for k, v in reply_to.items() if k != "reply_to_message"}
        msg.update(fields)
        self._messages[(chat_id, message_id)] = msg
        return msg

    # ----------------------------------------------------------------- plumbing

    def _changed(self) -> None:
        self._change_event.set()
        self._change_event = asyncio.Event()

    def _kick_pollers(self) -> None:
        self._poll_event.set()
        self._poll_event = asyncio.Event()

    async def _sleep(self, seconds: float) -> None:
        """Sleep, cut short by stop()."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_event.wait(), seconds)

    def _is_allowed(self, update: JSON) -> bool:
        kind = _update_type(update)
        if self._allowed_updates is None:
            return kind not in _DEFAULT_EXCLUDED_UPDATES
        return kind in self._allowed_updates

    def _set_allowed_updates(self, value: Any) -> None:
        if value is None:
            return
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _ApiError(400, "Bad Request: can't parse allowed updates")
        self._allowed_updates = list(value) or None

    def _deliverable(self, limit: int) -> list[JSON]:
        """Pending updates of allowed types; others are discarded, as Telegram never delivers them."""
        self._pending = [u for u in self._pending if self._is_allowed(u)]
        return self._pending[:limit]

    def _confirm(self, offset: int) -> None:
        if offset > 0:
            before = len(self._pending)
            self._pending = [u for u in self._pending if u["update_id"] >= offset]
            if len(self._pending) != before:
                self._changed()
        elif offset < 0:
            self._pending = self._pending[offset:]
            self._changed()

    def _resolve_chat(self, params: JSON, key: str = "chat_id") -> JSON:
        raw = params.get(key)
        if raw is None or raw == "":
            raise _ApiError(400, "Bad Request: chat_id is empty")
        chat: JSON | None = None
        if isinstance(raw, str) and raw.startswith("@"):
            chat = next((c for c in self._chats.values() if c.get("username") == raw[1:]), None)
        else:
            try:
                chat_id = int(raw)
            except (TypeError, ValueError):
                raise _ApiError(400, "Bad Request: chat not found") from None
            chat = self._chats.get(chat_id)
            if chat is None and not self.strict_chats:
                chat = self.add_chat(chat_id)
        if chat is None:
            raise _ApiError(400, "Bad Request: chat not found")
        if chat["id"] in self._blocked:
            raise _ApiError(403, "Forbidden: bot was blocked by the user")
        return chat

    def _format(
        self, raw: Any, parse_mode: Any, entities: Any, *, limit: int, what: Literal["text", "caption"]
    ) -> tuple[str, list[JSON]]:
        """Validate and render a text or caption as Telegram does."""
        empty = "Bad Request: message text is empty"
        if raw is None or raw == "":
            if what == "caption":
                return "", []
            raise _ApiError(400, empty)
        text = str(raw)
        if isinstance(entities, list):
            ents = entities
        elif parse_mode:
            try:
                text, ents = parse_entities(text, str(parse_mode))
            except EntityParseError as exc:
                raise _ApiError(400, f"Bad Request: can't parse entities: {exc}") from None
            except ValueError:
                raise _ApiError(400, "Bad Request: unsupported parse_mode") from None
        else:
            ents = []
        if what == "text" and not text.strip():
            raise _ApiError(400, empty)
        if _u16(text) > limit:
            too_long = "message is too long" if what == "text" else "message caption is too long"
            raise _ApiError(400, f"Bad Request: {too_long}")
        return text, ents

    def _bot_message(self, call: Call, chat: JSON, fields: JSON) -> JSON:
        """The bot's message in ``chat`` with ``fields``, replying, in the topic and with the inline keyboard that
        ``call`` asks for; recorded as sent."""
        p = call.params
        reply_to = self._reply_target(chat, p)
        if markup := _inline_markup(p.get("reply_markup")):
            fields["reply_markup"] = markup
        msg = self._new_message(chat, self.bot_user, thread_id=self._thread_id(p), reply_to=reply_to, fields=fields)
        self._sent.append(Sent(call, msg))
        return msg

    def _reply_target(self, chat: JSON, params: JSON) -> JSON | None:
        rp = params.get("reply_parameters")
        allow = bool(params.get("allow_sending_without_reply"))
        message_id: Any = None
        target_chat = chat
        if isinstance(rp, dict):
            message_id = rp.get("message_id")
            allow = allow or bool(rp.get("allow_sending_without_reply"))
            if rp.get("chat_id") is not None:
                target_chat = self._resolve_chat(rp)
        elif params.get("reply_to_message_id") is not None:
            message_id = params["reply_to_message_id"]
        if message_id is None:
            return None
        msg = self._messages.get((target_chat["id"], _as_int(message_id, 0)))
        if msg is None and not allow:
            raise _ApiError(400, "Bad Request: message to be replied not found")
        return msg

    def _thread_id(self, params: JSON) -> int | None:
        value = params.get("message_thread_id")
        return None if value is None else _as_int(value, 0)

    # ----------------------------------------------------------------- HTTP

    @staticmethod
    def _api_error(code: int, description: str) -> Exception:
        return _ApiError(code, description)

    @staticmethod
    def _json_response(status: int, body: JSON) -> web.Response:
        headers = {}
        if retry := (body.get("parameters") or {}).get("retry_after"):
            headers["Retry-After"] = str(retry)
        return web.Response(
            text=json.dumps(body, ensure_ascii=False), status=status, content_type="application/json", headers=headers
        )

    def _finish(self, call: Call, status: int, body: JSON) -> web.Response:
        call.status = status
        call.outcome = "ok" if status == 200 else "error"
        call.response = body
        call.done_t = time.monotonic()
        self._changed()
        return self._json_response(status, body)

    async def _drop(self, request: web.Request, call: Call, *, applied: bool) -> web.Response:
        call.outcome = "applied_dropped" if applied else "dropped"
        call.done_t = time.monotonic()
        self._changed()
        if request.transport is not None:
            request.transport.abort()
        await asyncio.sleep(1)  # handler_cancellation ends the handler here
        return web.Response(status=500)

    async def _read_params(self, request: web.Request) -> tuple[JSON, dict[str, UploadedFile]]:
        params: JSON = {k: _decode_form_value(k, v) for k, v in request.query.items()}
        files: dict[str, UploadedFile] = {}
        if request.method != "POST" or not request.can_read_body:
            return params, files
        if request.content_type == "application/json":
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("JSON body must be an object")
            params.update({k: _normalize_json_value(k, v) for k, v in body.items()})
        elif request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
            form = await request.post()
            for key, value in form.items():
                if isinstance(value, web.FileField):
                    files[key] = UploadedFile(key, value.filename, value.content_type, value.file.read())
                    params[key] = f"attach://{key}"
                else:
                    params[key] = _decode_form_value(key, str(value))
        return params, files

    async def _handle_api(self, request: web.Request) -> web.StreamResponse:
        raw_method = request.match_info["method"]
        canonical = self._canonical.get(raw_method.lower())
        call = Call(method=canonical or raw_method, params={}, t=time.monotonic(), http_method=request.method)
        self._calls.append(call)
        try:
            try:
                call.params, call.files = await self._read_params(request)
            except ValueError:
                return self._finish(call, 400, _error_body(400, "Bad Request: can't parse request body"))
            self._changed()
            if request.match_info["token"] != self.token:
                return self._finish(call, 401, _error_body(401, "Unauthorized"))
            if canonical is None:
                return self._finish(call, 404, _error_body(404, "Not Found"))
            fault = self._take_fault(canonical)
            if fault is not None and fault.kind == "slow":
                await self._sleep(fault.seconds)
            if fault is not None and fault.kind == "error":
                assert fault.body is not None
                return self._finish(call, fault.error_code, fault.body)
            if fault is not None and fault.kind == "drop":
                return await self._drop(request, call, applied=False)
            try:
                result = await self._handlers[canonical](call)
            except _ApiError as exc:
                return self._finish(call, exc.code, exc.body())
            except Refused as exc:
                return self._finish(call, 400, _error_body(400, exc.description))
            except Exception:
                _log.exception("simulator failed handling %s", canonical)
                return self._finish(call, 500, _error_body(500, "Internal Server Error"))
            if fault is not None and fault.kind == "drop_after":
                return await self._drop(request, call, applied=True)
            body: JSON = {"ok": True, "result": result}
            if isinstance(result, _Described):
                body = {"ok": True, "result": result.result, "description": result.description}
            return self._finish(call, 200, body)
        except asyncio.CancelledError:
            if call.outcome == "pending":
                call.outcome = "cancelled"
                call.done_t = time.monotonic()
                self._changed()
            raise

    async def _handle_unknown_path(self, request: web.Request) -> web.Response:
        return self._json_response(404, _error_body(404, "Not Found"))

    # ----------------------------------------------------------------- methods

    async def _get_me(self, call: Call) -> JSON:
        return dict(self.bot_user)

    def _drop_webhook(self, drop_pending: bool) -> bool:
        had = self._webhook is not None
        self._webhook = None
        if drop_pending:
            self._pending.clear()
        self._webhook_wake.set()
        return had

    async def _delete_webhook(self, call: Call) -> _Described:
        had = self._drop_webhook(bool(call.params.get("drop_pending_updates")))
        return _Described(True, "Webhook was deleted" if had else "Webhook is already deleted")

    async def _set_webhook(self, call: Call) -> _Described:
        p = call.params
        url = str(p.get("url") or "")
        if not url:
            had = self._drop_webhook(bool(p.get("drop_pending_updates")))
            return _Described(True, "Webhook was deleted" if had else "Webhook is already deleted")
        if not url.startswith(("http://", "https://")):
            raise _ApiError(400, "Bad Request: bad webhook: An HTTPS URL must be provided for webhook")
        secret = p.get("secret_token")
        if secret is not None and not _SECRET_TOKEN_RE.fullmatch(str(secret)):
            raise _ApiError(400, "Bad Request: secret token contains unallowed characters")
        max_connections = _as_int(p.get("max_connections"), 40)
        if not 1 <= max_connections <= 100:
            raise _ApiError(400, "Bad Request: bad webhook: max_connections must be between 1 and 100")
        self._set_allowed_updates(p.get("allowed_updates"))
        if p.get("drop_pending_updates"):
            self._pending.clear()
        same = self._webhook is not None and self._webhook.url == url
        self._webhook = _Webhook(url, str(secret) if secret else None, max_connections, p.get("ip_address"))
        self._kick_pollers()
        self._webhook_wake.set()
        self._ensure_webhook_task()
        return _Described(True, "Webhook is already set" if same else "Webhook was set")

    async def _get_webhook_info(self, call: Call) -> JSON:
        info: JSON = {"url": "", "has_custom_certificate": False, "pending_update_count": len(self._pending)}
        hook = self._webhook
        if hook is not None:
            info.update(url=hook.url, max_connections=hook.max_connections)
            if hook.ip_address:
                info["ip_address"] = hook.ip_address
            if hook.last_error_date is not None:
                info.update(last_error_date=hook.last_error_date, last_error_message=hook.last_error_message)
        if self._allowed_updates is not None:
            info["allowed_updates"] = list(self._allowed_updates)
        return info

    async def _get_updates(self, call: Call) -> list[JSON]:
        p = call.params
        if self._webhook is not None:
            raise _ApiError(409, _WEBHOOK_CONFLICT)
        offset = _as_int(p.get("offset"), 0)
        limit = min(max(_as_int(p.get("limit"), 100), 1), 100)
        try:
            timeout = max(float(p.get("timeout") or 0), 0.0)
        except (TypeError, ValueError):
            raise _ApiError(400, "Bad Request: invalid timeout") from None
        self._set_allowed_updates(p.get("allowed_updates"))
        self._confirm(offset)
        # A newer getUpdates ends any older one with 409, as on Telegram.
        self._poll_generation += 1
        generation = self._poll_generation
        self._kick_pollers()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if generation != self._poll_generation:
                raise _ApiError(409, _POLL_CONFLICT)
            if self._webhook is not None:
                raise _ApiError(409, _WEBHOOK_CONFLICT)
            updates = self._deliverable(limit)
            remaining = deadline - loop.time()
            if updates or remaining <= 0 or self._stopping:
                return updates
            event = self._poll_event
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)

    async def _send_message(self, call: Call) -> JSON:
        p = call.params
        chat = self._resolve_chat(p)
        text, entities = self._format(
            p.get("text"), p.get("parse_mode"), p.get("entities"), limit=MAX_TEXT_LENGTH, what="text"
        )
        fields: JSON = {"text": text}
        if entities:
            fields["entities"] = entities
        return self._bot_message(call, chat, fields)

    async def _edit_message_text(self, call: Call) -> JSON | bool:
        p = call.params
        text, entities = self._format(
            p.get("text"), p.get("parse_mode"), p.get("entities"), limit=MAX_TEXT_LENGTH, what="text"
        )
        if p.get("inline_message_id"):
            self._edits.append(Sent(call, {}))
            return True
        chat = self._resolve_chat(p)
        if p.get("message_id") is None:
            raise _ApiError(400, "Bad Request: message identifier is not specified")
        key = (chat["id"], _as_int(p["message_id"], 0))
        old = self._messages.get(key)
        if old is None:
            raise _ApiError(400, "Bad Request: message to edit not found")
        if old["from"]["id"] != self.bot_id:
            raise _ApiError(400, "Bad Request: message can't be edited")
        if "text" not in old:
            raise _ApiError(400, "Bad Request: there is no text in the message to edit")
        markup = _inline_markup(p.get("reply_markup"))
        if text == old["text"] and entities == old.get("entities", []) and markup == old.get("reply_markup"):
            raise _ApiError(400, _NOT_MODIFIED)
        new = {k: v for k, v in old.items() if k not in ("entities", "reply_markup")}
        new.update(text=text, edit_date=int(time.time()))
        if entities:
            new["entities"] = entities
        if markup:
            new["reply_markup"] = markup
        self._messages[key] = new
        self._edits.append(Sent(call, new))
        return new

    async def _send_chat_action(self, call: Call) -> bool:
        self._resolve_chat(call.params)
        if call.params.get("action") not in _CHAT_ACTIONS:
            raise _ApiError(400, "Bad Request: wrong parameter action in request")
        self._chat_actions.append(call)
        return True

    async def _get_chat(self, call: Call) -> JSON:
        chat = self._resolve_chat(call.params)
        gifts = dict.fromkeys(("unlimited_gifts", "limited_gifts", "unique_gifts", "premium_subscription"), False)
        return {**chat, "accent_color_id": 0, "max_reaction_count": 11, "accepted_gift_types": gifts}

    async def _delete_message(self, call: Call) -> bool:
        chat = self._resolve_chat(call.params)
        key = (chat["id"], _as_int(call.params.get("message_id"), 0))
        if self._messages.pop(key, None) is None:
            raise _ApiError(400, "Bad Request: message to delete not found")
        self._deleted.append(key)
        return True

    async def _set_message_reaction(self, call: Call) -> bool:
        """A bot's reactions replace its previous ones; it may use Telegram's fixed emoji set only, one at a time
        (no custom emoji, no paid reactions)."""
        p = call.params
        chat = self._resolve_chat(p)
        if p.get("message_id") is None:
            raise _ApiError(400, "Bad Request: message identifier is not specified")
        key = (chat["id"], _as_int(p["message_id"], 0))
        if key not in self._messages:
            raise _ApiError(400, "Bad Request: message to react not found")
        reaction = p.get("reaction", [])
        if not isinstance(reaction, list):
            raise _ApiError(400, "Bad Request: can't parse reaction types JSON object")
        if len(reaction) > 1:
            raise _ApiError(400, "Bad Request: REACTIONS_TOO_MANY")
        for item in reaction:
            if not (isinstance(item, dict) and item.get("type") == "emoji"
                    and item.get("emoji") in TELEGRAM_REACTION_EMOJI):
                raise _ApiError(400, "Bad Request: REACTION_INVALID")
        self._bot_reactions[key] = [item["emoji"] for item in reaction]
        self._reactions.append(call)
        return True

    # ----------------------------------------------------------------- webhook delivery

    def _ensure_webhook_task(self) -> None:
        if self._runner is None or (self._webhook_task is not None and not self._webhook_task.done()):
            return
        self._webhook_task = asyncio.get_running_loop().create_task(
            self._webhook_loop(), name="TelegramSimulator:webhook"
        )

    async def _webhook_loop(self) -> None:
        """Deliver pending updates one at a time, in order, retrying each until a 2xx answer."""
        delay = self.webhook_retry_initial
        attempts: dict[int, int] = defaultdict(int)
        try:
            while not self._stopping and self._webhook is not None:
                hook = self._webhook
                batch = self._deliverable(1)
                if not batch:
                    await self._webhook_wake.wait()
                    self._webhook_wake.clear()
                    continue
                update = batch[0]
                attempts[update["update_id"]] += 1
                status, error = await self._post_update(hook, update)
                self._deliveries.append(
                    WebhookDelivery(update["update_id"], hook.url, attempts[update["update_id"]], time.monotonic(),
                                    status, error)
                )  # fmt: skip
                if status is not None and 200 <= status < 300:
                    self._pending = [u for u in self._pending if u is not update]
                    delay = self.webhook_retry_initial
                    self._changed()
                    continue
                hook.last_error_date = int(time.time())
                if status is not None:
                    hook.last_error_message = f"Wrong response from the webhook: {status} {_phrase(status)}".rstrip()
                else:
                    hook.last_error_message = error or "Connection refused"
                self._changed()
                await self._sleep(delay)
                delay = min(delay * 2, self.webhook_retry_max)
        except Exception:
            _log.exception("webhook delivery loop failed")

    async def _post_update(self, hook: _Webhook, update: JSON) -> tuple[int | None, str | None]:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        headers = {"Content-Type": "application/json"}
        if hook.secret_token:
            headers["X-Telegram-Bot-Api-Secret-Token"] = hook.secret_token
        try:
            async with self._session.post(
                hook.url,
                data=json.dumps(update, ensure_ascii=False).encode(),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.webhook_timeout),
            ) as resp:
                await resp.read()
                return resp.status, None
        except (aiohttp.ClientError, TimeoutError) as exc:
            return None, f"{type(exc).__name__}: {exc}"
